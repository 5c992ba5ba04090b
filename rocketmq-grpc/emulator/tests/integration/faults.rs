//! The fault run: many messages, transient errors, missing results and delays; nothing lost.

use std::time::Duration;

use rocketmq_grpc::pb::Code;
use rocketmq_grpc::{AckSettings, PushConsumer};
use rocketmq_grpc_emulator::FaultConfig;

use crate::support::{self, GROUP, Handler};

/// The fault run has 100,000 messages; `ACK_FAULT_RUN_MESSAGES` can change it.
fn messages() -> usize {
    std::env::var("ACK_FAULT_RUN_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_acknowledged_exactly_once_despite_faults() {
    let n = messages();
    let emulator = support::emulator(&["orders"]).await;
    emulator.set_faults(
        FaultConfig::none()
            .ack_entry_errors(0.05, Code::InternalServerError)
            .ack_missing_results(0.02)
            .delay(0.2, Duration::from_millis(1), Duration::from_millis(30)),
    );
    support::publish(&emulator, "orders", n);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .concurrency(512)
        .acks(
            AckSettings::default()
                .max_delay(Duration::from_millis(500))
                .retry_backoff(Duration::from_millis(100)),
        )
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, n as u64, Duration::from_secs(600)).await;
    let report = consumer.close(Duration::from_secs(30)).await;
    assert!(report.handlers_finished);
    assert!(
        report.unacknowledged.is_empty(),
        "{} consumed messages left unacknowledged",
        report.unacknowledged.len()
    );
    assert_eq!(report.acks.abandoned, 0);
    let ledger = emulator.ledger("orders", GROUP);
    assert_eq!(ledger.len(), n);
    let not_once: Vec<_> = ledger.iter().filter(|m| !m.acked_exactly_once()).collect();
    assert!(
        not_once.is_empty(),
        "{} not acked exactly once, e.g. {:?}",
        not_once.len(),
        not_once.first()
    );
    let stats = emulator.stats();
    assert_eq!(
        stats.redelivered, 0,
        "no redelivery: every ack landed within its invisibility"
    );
    assert_eq!(stats.expired_handles, 0);
    assert!(stats.injected.entry_errors > 0 && stats.injected.dropped_results > 0);
}
