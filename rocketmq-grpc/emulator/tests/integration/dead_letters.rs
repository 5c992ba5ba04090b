//! A FIFO message whose handler keeps failing is retried in place at the retry policy's
//! delays (the rest of its queue waits: the order holds), then forwarded to the group's
//! dead-letter topic, where another group reads it; the next message of the queue follows.
//! A normal message too, within its invisibility. Virtual time.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::{ConsumeResult, MessageHandler, PushConsumer, ReceivedMessage};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};
use tokio::time::Instant;

use crate::support::{self, GROUP};

/// Fails `poison` and records every attempt: (body, delivery attempt, when).
struct Poisoned {
    start: Instant,
    seen: Mutex<Vec<(String, i32, Duration)>>,
}

#[async_trait::async_trait]
impl MessageHandler for Poisoned {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let body = String::from_utf8_lossy(message.body()).into_owned();
        let failed = body == "poison";
        self.seen
            .lock()
            .push((body, message.delivery_attempt(), self.start.elapsed()));
        if failed {
            ConsumeResult::Failure
        } else {
            ConsumeResult::Success
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_fifo_message_is_retried_in_order_then_dead_lettered() {
    let emulator = Emulator::builder()
        .topic("fifo", TopicKind::Fifo, 1)
        .group(GROUP, true)
        .group("dlq-reader", false)
        .max_delivery_attempts(3)
        .start()
        .await
        .unwrap();
    let handler = Arc::new(Poisoned {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    });
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("fifo", "*")
        .handler(Arc::clone(&handler))
        .build()
        .await
        .unwrap();
    for body in ["poison", "next"] {
        emulator
            .publish("fifo", PublishMessage::new(body).message_group("g"))
            .unwrap();
    }
    support::wait_for("the next message", Duration::from_secs(120), || {
        handler
            .seen
            .lock()
            .iter()
            .any(|(body, _, _)| body == "next")
    })
    .await;
    let seen = handler.seen.lock().clone();
    let attempts: Vec<(i32, u64)> = seen
        .iter()
        .filter(|(body, _, _)| body == "poison")
        .map(|(_, attempt, at)| (*attempt, at.as_secs()))
        .collect();
    let first = attempts[0].1;
    // The policy's delays: 1 s after the first attempt, 5 s after the second.
    assert_eq!(
        attempts,
        [(1, first), (2, first + 1), (3, first + 6)],
        "{seen:?}"
    );
    assert_eq!(seen.last().map(|(body, _, _)| body.as_str()), Some("next"));
    let stats = consumer.stats();
    assert_eq!((stats.failed, stats.dead_lettered), (3, 1), "{stats:?}");
    let reader = Arc::new(Poisoned {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    });
    let dlq = PushConsumer::builder(support::config(&emulator), "dlq-reader")
        .subscribe(format!("%DLQ%{GROUP}"), "*")
        .handler(Arc::clone(&reader))
        .build()
        .await
        .unwrap();
    support::wait_for("the dead letter", Duration::from_secs(60), || {
        !reader.seen.lock().is_empty()
    })
    .await;
    assert_eq!(reader.seen.lock()[0].0, "poison");
    dlq.close(Duration::from_secs(5)).await;
    consumer.close(Duration::from_secs(5)).await;
}

/// A normal message whose handler keeps failing is retried in the consumer at the policy's
/// short delays (the proxy could not make it visible before its receive's invisibility ends),
/// then forwarded to the dead-letter topic; other messages are not held up meanwhile.
#[tokio::test(start_paused = true)]
async fn a_failing_normal_message_is_retried_at_the_policy_delays_then_dead_lettered() {
    let emulator = Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        .group("dlq-reader", false)
        .max_delivery_attempts(3)
        .start()
        .await
        .unwrap();
    let handler = Arc::new(Poisoned {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    });
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Arc::clone(&handler))
        .build()
        .await
        .unwrap();
    for body in ["poison", "next"] {
        emulator
            .publish("orders", PublishMessage::new(body))
            .unwrap();
    }
    support::wait_for("the dead letter", Duration::from_secs(120), || {
        consumer.stats().dead_lettered == 1
    })
    .await;
    let seen = handler.seen.lock().clone();
    let attempts: Vec<(i32, u64)> = seen
        .iter()
        .filter(|(body, _, _)| body == "poison")
        .map(|(_, attempt, at)| (*attempt, at.as_secs()))
        .collect();
    let first = attempts[0].1;
    assert_eq!(
        attempts,
        [(1, first), (2, first + 1), (3, first + 6)],
        "{seen:?}"
    );
    let next = seen.iter().find(|(body, _, _)| body == "next").unwrap();
    assert!(next.2.as_secs() <= first + 1, "not held up: {seen:?}");
    let reader = Arc::new(Poisoned {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    });
    let dlq = PushConsumer::builder(support::config(&emulator), "dlq-reader")
        .subscribe(format!("%DLQ%{GROUP}"), "*")
        .handler(Arc::clone(&reader))
        .build()
        .await
        .unwrap();
    support::wait_for("the dead letter", Duration::from_secs(60), || {
        !reader.seen.lock().is_empty()
    })
    .await;
    assert_eq!(reader.seen.lock()[0].0, "poison");
    dlq.close(Duration::from_secs(5)).await;
    consumer.close(Duration::from_secs(5)).await;
}
