//! Retries and dead letters on a real proxy (`scripts/brokers/rocketmq start`: the FIFO topic
//! `it-fifo` and the FIFO group `it-fifo-dlq`, the normal topic `it-normal-2` and the group
//! `it-normal-dlq`, each group with 2 retries, so 3 attempts).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set; otherwise every test returns at once.

use integration_tests::real_rocketmq::{endpoint, wait_for};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::real_pulsar::java_peer;
use parking_lot::Mutex;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage,
};

/// Fails the body `poison`; records every attempt at a body of this run: (body, delivery
/// attempt, when).
struct Poisoned {
    start: Instant,
    poison: String,
    run: String,
    seen: Mutex<Vec<(String, i32, Duration)>>,
}

#[async_trait::async_trait]
impl MessageHandler for Poisoned {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let body = String::from_utf8_lossy(message.body()).into_owned();
        if !body.ends_with(&self.run) {
            return ConsumeResult::Success;
        }
        let failed = body == self.poison;
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

/// A FIFO message whose handler always fails is retried at the policy's delays (±20 %)
/// while the next message of its group waits, then forwarded to `%DLQ%it-fifo-dlq` after its
/// 3 attempts, where another group reads it, and a Java consumer too; the next message
/// follows it.
///
/// Run it twice within 20 s and the second run's first attempt is missing (attempts 2 and 3
/// come 20 s late): the first run's consumer, shut down, left long polls suspended at the
/// broker, which pop the new message for a client that is gone (invisible for 20 s). CI runs
/// it once per broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fifo_message_is_retried_in_order_then_dead_lettered() {
    retried_then_dead_lettered("it-fifo", "it-fifo-dlq", true).await;
}

/// A normal message whose handler always fails is retried at the policy's delays (±20 %:
/// +1 s, +5 s; a nack alone brought it back only after the receive's 20 s invisibility on this
/// proxy), then forwarded to `%DLQ%it-normal-dlq` after its 3 attempts, where another group and
/// a Java consumer read it; the message sent after it is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_normal_message_is_retried_at_the_policy_delays_then_dead_lettered() {
    retried_then_dead_lettered("it-normal-2", "it-normal-dlq", false).await;
}

/// Sends a poison message and a next one to `topic`, consumes them with `group` (2 retries),
/// and checks the attempts, their delays, the dead letter and who reads it.
async fn retried_then_dead_lettered(topic: &str, group: &str, fifo: bool) {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let config = ClientConfig::new(&endpoint).unwrap();
    let run = format!("-{}", std::process::id());
    let poison = format!("poison{run}");
    let next = format!("next{run}");
    let dead_letters = format!("%DLQ%{group}");
    let handler = Arc::new(Poisoned {
        start: Instant::now(),
        poison: poison.clone(),
        run: run.clone(),
        seen: Mutex::new(Vec::new()),
    });
    let consumer = PushConsumer::builder(config.clone(), group)
        .subscribe(topic, "*")
        .handler(Arc::clone(&handler))
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::builder(config.clone()).build().unwrap();
    for body in [&poison, &next] {
        let mut message = OutgoingMessage::new(topic, body.clone());
        if fifo {
            message = message.message_group(format!("g{run}"));
        }
        producer.send(message).await.expect("send");
    }
    wait_for("the dead letter", Duration::from_secs(120), || {
        consumer.stats().dead_lettered == 1
            && handler.seen.lock().iter().any(|(body, _, _)| *body == next)
    })
    .await;
    let seen = handler.seen.lock().clone();
    eprintln!("attempts: {seen:?}");
    let attempts: Vec<(i32, Duration)> = seen
        .iter()
        .filter(|(body, _, _)| *body == poison)
        .map(|(_, attempt, at)| (*attempt, *at))
        .collect();
    assert_eq!(
        attempts
            .iter()
            .map(|(attempt, _)| *attempt)
            .collect::<Vec<_>>(),
        [1, 2, 3],
        "{seen:?}"
    );
    let policy = consumer
        .retry_policy()
        .expect("the proxy announced a retry policy");
    for pair in attempts.windows(2) {
        let waited = pair[1].1 - pair[0].1;
        let due = policy.backoff_delay(u32::try_from(pair[0].0).unwrap());
        let (low, high) = (
            due.mul_f64(0.8),
            due.mul_f64(1.2) + Duration::from_millis(200),
        );
        assert!(
            (low..=high).contains(&waited),
            "attempt {} came {waited:?} after the previous one; the policy says {due:?}",
            pair[1].0
        );
    }
    let next_at = seen
        .iter()
        .find(|(body, _, _)| *body == next)
        .map(|(_, _, at)| *at)
        .unwrap();
    if fifo {
        assert_eq!(
            seen.last().map(|(body, _, _)| body),
            Some(&next),
            "next after the poison"
        );
    } else {
        assert!(
            next_at < attempts[1].1,
            "the next message is not held up by the poison's retries: {seen:?}"
        );
    }
    let reader = Arc::new(Poisoned {
        start: Instant::now(),
        poison: String::new(),
        run: run.clone(),
        seen: Mutex::new(Vec::new()),
    });
    let dlq = PushConsumer::builder(config, format!("{group}-reader").as_str())
        .subscribe(dead_letters.as_str(), "*")
        .handler(Arc::clone(&reader))
        .build()
        .await
        .expect("a consumer of the dead-letter topic");
    wait_for("the dead letter", Duration::from_secs(60), || {
        reader
            .seen
            .lock()
            .iter()
            .any(|(body, _, _)| *body == poison)
    })
    .await;
    dlq.close(Duration::from_secs(5)).await;
    // The official Java client's push consumer reads it there too (a group of its own).
    let printed = java_peer(
        "RocketMqPushConsume",
        &[
            &endpoint,
            &dead_letters,
            &format!("{group}-java"),
            &poison,
            "1",
        ],
    )
    .await;
    assert!(printed.contains("consumed=1"), "{printed}");
    consumer.close(Duration::from_secs(5)).await;
}
