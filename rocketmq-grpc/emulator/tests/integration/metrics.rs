//! The feature `metrics`: what a send, a receive and acks record, read back from a
//! `DebuggingRecorder` installed for this test's thread only (the runtime is current-thread,
//! so the client's background tasks record into it too; other tests do not).
//!
//! Virtual time (tokio's clock paused): waits pass at once.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use rocketmq_grpc::{OutgoingMessage, Producer, SimpleConsumer};
use rocketmq_grpc_emulator::{Rpc, ScriptedFailure};

use crate::support::{self, GROUP};

/// One snapshot of the recorder (taking one resets its counters and histograms, so a test
/// takes one at its end).
struct Seen(Vec<(CompositeKey, DebugValue)>);

impl Seen {
    fn of(snapshotter: &Snapshotter) -> Self {
        Self(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| (key, value))
                .collect(),
        )
    }

    /// The value of counter `name` with `labels` (and maybe others), summed over its series.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(key, _)| matches_key(key.key(), name, labels))
            .map(|(_, value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The samples of histogram `name` with `labels`.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.0
            .iter()
            .filter(|(key, _)| matches_key(key.key(), name, labels))
            .flat_map(|(_, value)| match value {
                DebugValue::Histogram(samples) => samples.iter().map(|s| s.into_inner()),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }
}

fn matches_key(key: &metrics::Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels.iter().all(|(k, v)| {
            key.labels()
                .any(|label| label.key() == *k && label.value() == *v)
        })
}

#[tokio::test(start_paused = true)]
async fn sends_receives_acks_and_retries_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let emulator = support::emulator(&["orders"]).await;
    let producer = Producer::builder(support::config(&emulator))
        .build()
        .expect("a session");
    // The first send fails once (UNAVAILABLE) and is retried.
    emulator.fail_next(Rpc::SendMessage, 1, ScriptedFailure::Unavailable);
    for i in 0..10 {
        producer
            .send(OutgoingMessage::new("orders", format!("message {i:02}")))
            .await
            .expect("sent");
    }
    let consumer = Arc::new(
        SimpleConsumer::builder(support::config(&emulator), GROUP)
            .subscribe("orders", "*")
            .await_duration(Duration::from_secs(5))
            .build()
            .await
            .expect("the simple consumer starts"),
    );
    let mut messages = Vec::new();
    while messages.len() < 10 {
        messages.extend(
            consumer
                .receive(32, Duration::from_secs(60))
                .await
                .expect("receive"),
        );
    }
    let acks: Vec<_> = messages
        .into_iter()
        .map(|message| {
            let consumer = Arc::clone(&consumer);
            tokio::spawn(async move { consumer.ack(&message).await })
        })
        .collect();
    for ack in acks {
        ack.await.unwrap().expect("ack");
    }
    consumer.close(Duration::from_secs(10)).await;

    let seen = Seen::of(&snapshotter);
    let ours = [("client", "rocketmq"), ("topic", "orders")];
    assert_eq!(seen.counter("mq_client_messages_sent_total", &ours), 10);
    // "message 00" .. "message 09": 10 bytes each.
    assert_eq!(seen.counter("mq_client_bytes_sent_total", &ours), 100);
    assert_eq!(seen.counter("mq_client_send_failures_total", &ours), 0);
    let latencies = seen.histogram("mq_client_send_duration_seconds", &ours);
    assert_eq!(latencies.len(), 10, "{latencies:?}");
    assert!(latencies.iter().all(|s| *s >= 0.0));
    assert_eq!(
        seen.counter(
            "mq_client_retries_total",
            &[("client", "rocketmq"), ("operation", "send")]
        ),
        1
    );
    assert_eq!(seen.counter("mq_client_messages_received_total", &ours), 10);
    assert_eq!(seen.counter("mq_client_ack_entries_total", &ours), 10);
    assert_eq!(seen.counter("mq_client_ack_failures_total", &ours), 0);
    // Batched: the 10 acks took fewer requests than messages.
    let requests = seen.counter("mq_client_ack_requests_total", &ours);
    assert!((1..10).contains(&requests), "{requests} ack requests");
    assert_eq!(
        emulator.stats().calls(Rpc::AckMessage),
        requests,
        "one AckMessage per counted request"
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_that_fails_for_good_is_a_failure_not_a_sent_message() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let emulator = support::emulator(&["orders"]).await;
    let producer = Producer::builder(support::config(&emulator))
        .retry_window(Duration::ZERO)
        .build()
        .expect("a session");
    // More failures than the policy's 3 attempts.
    emulator.fail_next(Rpc::SendMessage, 5, ScriptedFailure::Unavailable);
    producer
        .send(OutgoingMessage::new("orders", "lost"))
        .await
        .expect_err("fails after its attempts");
    let seen = Seen::of(&snapshotter);
    let ours = [("client", "rocketmq"), ("topic", "orders")];
    assert_eq!(seen.counter("mq_client_send_failures_total", &ours), 1);
    assert_eq!(seen.counter("mq_client_messages_sent_total", &ours), 0);
    assert_eq!(
        seen.counter(
            "mq_client_retries_total",
            &[("client", "rocketmq"), ("operation", "send")]
        ),
        2,
        "3 attempts: 2 retries"
    );
}
