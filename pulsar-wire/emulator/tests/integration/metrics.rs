//! The feature `metrics`: what sends, receives, acks, a full pending queue and the priority
//! gate record, read back from a `DebuggingRecorder` installed for this test's thread only
//! (the runtime is current-thread, so the client's background tasks record into it too; other
//! tests do not).

use std::sync::Arc;
use std::time::Duration;

use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use mq_priority::{
    GateConfig, LayoutSpec, Level, PriorityPolicy, RouterConfig, Strategy, Unlisted,
};
use pulsar_wire::prioritized::{PriorityConsumer, PriorityRouter};
use pulsar_wire::{ConsumerOptions, InitialPosition, OutgoingMessage, Producer, QueueFull};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{PATIENCE, Setup, receive, within};

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

#[tokio::test]
async fn sends_receives_and_acks_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.consumer("metered", ConsumerOptions::default()).await;
    let producer = Producer::builder(&setup.client, "metered")
        .build()
        .await
        .expect("producer created");
    for i in 0..10 {
        producer
            .send(OutgoingMessage::new(format!("message {i:02}")))
            .await
            .expect("sent");
    }
    let messages = receive(&consumer, 10).await;
    for message in &messages {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    let frames = consumer.stats().ack_frames;

    let seen = Seen::of(&snapshotter);
    let ours = [
        ("client", "pulsar"),
        ("topic", "persistent://public/default/metered"),
    ];
    assert_eq!(seen.counter("mq_client_messages_sent_total", &ours), 10);
    // "message 00" .. "message 09": 10 bytes each.
    assert_eq!(seen.counter("mq_client_bytes_sent_total", &ours), 100);
    assert_eq!(seen.counter("mq_client_send_failures_total", &ours), 0);
    let latencies = seen.histogram("mq_client_send_duration_seconds", &ours);
    assert_eq!(latencies.len(), 10, "{latencies:?}");
    assert!(latencies.iter().all(|s| *s > 0.0), "{latencies:?}");
    assert_eq!(seen.counter("mq_client_messages_received_total", &ours), 10);
    assert_eq!(seen.counter("mq_client_ack_entries_total", &ours), 10);
    assert_eq!(seen.counter("mq_client_ack_failures_total", &ours), 0);
    let requests = seen.counter("mq_client_ack_requests_total", &ours);
    assert!((1..=10).contains(&requests), "{requests} ack requests");
    assert_eq!(requests, frames, "one request per ACK frame");
    // No connection was lost.
    assert_eq!(seen.counter("mq_client_reconnects_total", &[]), 0);
    assert!(
        seen.histogram("mq_client_blocked_seconds", &[]).is_empty(),
        "nothing waited for room"
    );
}

#[tokio::test]
async fn sends_waiting_for_a_place_in_the_pending_queue_are_timed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = Producer::builder(&setup.client, "narrow")
        .no_batching()
        .max_pending_messages(Some(1))
        .on_queue_full(QueueFull::Block)
        .build()
        .await
        .expect("producer created");
    // One place: the first send takes it, the four others wait for it in turn.
    let sends = (0..5).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
    let seen = Seen::of(&snapshotter);
    let waits = seen.histogram(
        "mq_client_blocked_seconds",
        &[("client", "pulsar"), ("reason", "pending_queue")],
    );
    assert_eq!(waits.len(), 4, "{waits:?}");
    assert!(waits.iter().all(|s| *s > 0.0), "{waits:?}");
    assert_eq!(
        seen.counter(
            "mq_client_messages_sent_total",
            &[("topic", "persistent://public/default/narrow")]
        ),
        5
    );
}

#[tokio::test]
async fn the_priority_gate_counts_each_level_it_served_and_held_back() {
    const LOW: usize = 200;
    const HIGH: usize = 40;
    const QUEUE: u32 = 20;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "metered-prio";
    setup.emulator.create_topic(topic, 4).unwrap();
    let policy = PriorityPolicy::builder()
        .levels(2)
        .property("priority")
        .build()
        .expect("a valid policy");
    // Partition 0 is the high level, the others the low one.
    let layout = || LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
    let consumer = PriorityConsumer::builder(&setup.client, topic, "sub", policy.clone(), layout())
        .gate(
            GateConfig::default()
                .with_strategy(Strategy::Strict)
                .with_receiver_queue_size(QUEUE),
        )
        .consumer(ConsumerOptions::default().initial_position(InitialPosition::Earliest))
        .partitions_refresh(None)
        .build()
        .await
        .expect("subscribed");
    let router = PriorityRouter::for_topic(
        &setup.client,
        topic,
        policy,
        layout(),
        RouterConfig::default(),
    )
    .await
    .expect("router");
    let producer = Producer::builder(&setup.client, topic)
        .router(Arc::new(router))
        .partitions_refresh(None)
        .build()
        .await
        .expect("producer");
    let send = |high: bool, count: usize| {
        let level = if high { "0" } else { "1" };
        let sends = (0..count).map(|i| {
            producer.send(OutgoingMessage::new(format!("{level}-{i}")).property("priority", level))
        });
        futures_util::future::join_all(sends)
    };
    for sent in send(false, LOW).await {
        sent.expect("sent");
    }
    for sent in send(true, HIGH).await {
        sent.expect("sent");
    }
    // The high level's backlog presses it: the low partitions are paused.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while consumer.paused_partitions() != [1, 2, 3] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "paused {:?}, buffered {:?}",
            consumer.paused_partitions(),
            consumer.buffered()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..LOW + HIGH {
        let message = within(PATIENCE, consumer.receive())
            .await
            .expect("a message in time")
            .expect("received");
        consumer.ack(&message).await.expect("acked");
    }
    let pauses = consumer.gate_stats().pauses;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");

    let seen = Seen::of(&snapshotter);
    let level = |l: &'static str| [("client", "pulsar"), ("level", l)];
    assert_eq!(
        seen.counter("mq_client_priority_delivered_total", &level("0")),
        HIGH as u64
    );
    assert_eq!(
        seen.counter("mq_client_priority_delivered_total", &level("1")),
        LOW as u64
    );
    let held = seen.counter("mq_client_priority_held_total", &level("1"));
    assert!(
        (3..=pauses).contains(&held),
        "the low level's 3 partitions held back {held} times, {pauses} pause calls"
    );
    assert_eq!(
        seen.counter("mq_client_priority_held_total", &level("0")),
        0,
        "the high level is never held back under Strict"
    );
    assert_eq!(
        seen.counter(
            "mq_client_messages_received_total",
            &[("topic", "persistent://public/default/metered-prio")]
        ),
        (LOW + HIGH) as u64,
        "one series for the partitioned topic"
    );
}
