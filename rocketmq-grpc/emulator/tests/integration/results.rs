//! Per-message ack results: mixed answers, missing results, terminal and transient errors.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ack_batcher::FlushReason;
use rocketmq_grpc::pb::Code;
use rocketmq_grpc::{AckSettings, PushConsumer};
use rocketmq_grpc_emulator::FaultConfig;

use crate::support::{self, Acks, GROUP, Handler};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_results_reach_the_right_messages_and_invalid_handles_are_not_retried() {
    let emulator = support::emulator(&["orders"]).await;
    emulator.set_faults(FaultConfig::none().ack_entry_errors(0.3, Code::InvalidReceiptHandle));
    support::publish(&emulator, "orders", 500);
    let acks = Arc::new(Acks::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(
            AckSettings::default()
                .max_delay(Duration::from_secs(120))
                .observer(acks.clone()),
        )
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 500, Duration::from_secs(30)).await;
    let report = consumer.close(Duration::from_secs(10)).await;
    let finals = acks.finals.lock().clone();
    assert_eq!(finals.len(), 500, "every ack resolved once");
    let ledger = emulator.ledger("orders", GROUP);
    let mut refused = 0;
    for record in &ledger {
        match &finals[&record.message_id] {
            Ok(()) => assert!(record.acked_exactly_once(), "{record:?}"),
            Err(code) => {
                refused += 1;
                assert_eq!(*code, Some(Code::InvalidReceiptHandle as i32));
                assert!(!record.acked, "{record:?}");
                assert!(report.unacknowledged.contains(&record.message_id));
            }
        }
    }
    assert!(
        (100..=200).contains(&refused),
        "about 30% refused: {refused}"
    );
    assert_eq!(report.unacknowledged.len(), refused);
    let stats = emulator.stats();
    assert_eq!(
        stats.ack_requests(),
        1,
        "no retries: one request of 500 entries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_results_and_transient_errors_are_retried_together() {
    let emulator = support::emulator(&["orders"]).await;
    emulator.set_faults(
        FaultConfig::none()
            .ack_missing_results(0.1)
            .ack_entry_errors(0.1, Code::InternalServerError),
    );
    support::publish(&emulator, "orders", 500);
    let acks = Arc::new(Acks::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(
            AckSettings::default()
                .max_delay(Duration::from_millis(100))
                .retry_backoff(Duration::from_millis(20))
                .observer(acks.clone()),
        )
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 500, Duration::from_secs(30)).await;
    support::wait_for("all acks confirmed", Duration::from_secs(30), || {
        consumer.stats().acked == 500
    })
    .await;
    let stats = consumer.stats();
    assert!(stats.acks.retries > 0);
    // The entries of one failed request that are retried go out again in one request.
    assert!(
        stats.acks.batches(FlushReason::Retry) < stats.acks.retries,
        "retry requests {} for {} retried entries",
        stats.acks.batches(FlushReason::Retry),
        stats.acks.retries
    );
    assert!(acks.missing_seen.load(Ordering::Relaxed) > 0);
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty());
    let ledger = emulator.ledger("orders", GROUP);
    assert!(ledger.iter().all(|m| m.acked_exactly_once()), "{ledger:?}");
    assert_eq!(emulator.stats().redelivered, 0);
}

/// A closure handler: its results decide the acks (failures come back) as a trait handler's do.
#[tokio::test(start_paused = true)]
async fn a_closure_handler_is_called_for_every_message_and_its_results_count() {
    let emulator = support::emulator(&["orders"]).await;
    let sent = support::publish(&emulator, "orders", 50);
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |message: rocketmq_grpc::ReceivedMessage| {
            let seen = Arc::clone(&seen);
            async move {
                let first = {
                    let mut seen = seen.lock();
                    let first = !seen.iter().any(|id| id == message.message_id());
                    seen.push(message.message_id().to_owned());
                    first
                };
                // Every message fails once, then succeeds.
                if first {
                    rocketmq_grpc::ConsumeResult::Failure
                } else {
                    rocketmq_grpc::ConsumeResult::Success
                }
            }
        }
    };
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(handler)
        .build()
        .await
        .unwrap();
    support::wait_for("two deliveries of each", Duration::from_secs(600), || {
        seen.lock().len() >= 100
    })
    .await;
    support::wait_for("the acks", Duration::from_secs(60), || {
        consumer.stats().acked == 50
    })
    .await;
    consumer.close(Duration::from_secs(5)).await;
    let seen = seen.lock().clone();
    for id in &sent {
        assert_eq!(seen.iter().filter(|s| *s == id).count(), 2, "{id}");
    }
}
