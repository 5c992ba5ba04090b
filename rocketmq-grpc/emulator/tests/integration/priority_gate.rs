//! The priority gate of a push consumer on level topics, against the emulator: while a
//! backlog of low messages is being consumed, a burst of urgent ones is handled sooner with
//! the gate than without, and every message is handled exactly once either way.
//!
//! Virtual time (`start_paused`): the handler's work is a sleep, so the latencies are those of
//! the handler-bound consumer, the same on any machine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics, Strategy};
use rocketmq_grpc::{ConsumeResult, PushConsumer, ReceivedMessage};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};
use tokio::time::Instant;

use crate::support::{self, GROUP};

const LEVELS: [&str; 3] = ["gate-0", "gate-1", "gate-2"];
const LOW: usize = 20_000;
const URGENT: usize = 500;
const CONCURRENCY: usize = 64;
/// The handler's work per message.
const WORK: Duration = Duration::from_millis(2);

async fn emulator() -> Emulator {
    let mut builder = Emulator::builder().group(GROUP, false);
    // One queue per topic: the 5.3 proxy assigns a normal group one queue per broker, so a
    // consumer runs one receive loop per level topic.
    for topic in LEVELS {
        builder = builder.topic(topic, TopicKind::Normal, 1);
    }
    builder.start().await.expect("the emulator starts")
}

fn topics() -> PriorityTopics {
    PriorityTopics::builder(PriorityPolicy::new(3).unwrap())
        .level_topics(LEVELS)
        .build()
        .unwrap()
}

struct Run {
    /// Urgent messages' enqueue-to-handled times, sorted.
    urgent: Vec<Duration>,
    /// Times each message id was handled.
    handled: HashMap<String, u32>,
    paused_seen: bool,
}

impl Run {
    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.urgent.len() as f64 * p).ceil() as usize).clamp(1, self.urgent.len());
        self.urgent[i - 1]
    }
}

async fn run(gate: Option<GateConfig>) -> Run {
    let emulator = emulator().await;
    for i in 0..LOW {
        emulator
            .publish(LEVELS[2], PublishMessage::new(format!("low-{i}")))
            .unwrap();
    }
    let handled_at: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let seen = Arc::clone(&handled_at);
    let mut builder = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(CONCURRENCY)
        .long_polling(Duration::from_secs(5));
    builder = match gate {
        Some(gate) => builder.priority(topics(), gate),
        None => LEVELS.iter().fold(builder, |b, t| b.subscribe(*t, "*")),
    };
    let consumer = builder
        .start(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            async move {
                tokio::time::sleep(WORK).await;
                seen.lock()
                    .push((message.message_id.clone(), Instant::now()));
                ConsumeResult::Success
            }
        })
        .await
        .unwrap();
    // The burst comes while the backlog is being consumed.
    support::wait_handled(&consumer, 2_000, Duration::from_secs(600)).await;
    let mut enqueued = HashMap::new();
    for i in 0..URGENT {
        let id = emulator
            .publish(LEVELS[0], PublishMessage::new(format!("urgent-{i}")))
            .unwrap()
            .message_id;
        enqueued.insert(id, Instant::now());
    }
    let mut paused_seen = false;
    support::wait_for("every message", Duration::from_secs(600), || {
        paused_seen |= consumer.paused_topics().contains(&LEVELS[2].to_owned());
        consumer.stats().consumed >= (LOW + URGENT) as u64
    })
    .await;
    // Anything handled twice would show up after the count is reached: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    let mut handled = HashMap::new();
    let mut urgent = Vec::new();
    for (id, at) in handled_at.lock().iter() {
        *handled.entry(id.clone()).or_insert(0) += 1;
        if let Some(sent) = enqueued.get(id) {
            urgent.push(at.duration_since(*sent));
        }
    }
    urgent.sort_unstable();
    for topic in LEVELS {
        let ledger = emulator.ledger(topic, GROUP);
        assert!(
            ledger.iter().all(|r| r.acked),
            "{topic}: unacknowledged messages"
        );
    }
    Run {
        urgent,
        handled,
        paused_seen,
    }
}

fn check_exactly_once(run: &Run, label: &str) {
    assert_eq!(run.handled.len(), LOW + URGENT, "{label}: messages handled");
    let twice: Vec<_> = run.handled.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "{label}: handled more than once: {twice:?}"
    );
    assert_eq!(run.urgent.len(), URGENT, "{label}: urgent messages handled");
}

fn gate(strategy: Strategy) -> GateConfig {
    GateConfig {
        strategy,
        receiver_queue_size: CONCURRENCY as u32,
        ..GateConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_urgent_messages_overtakes_a_low_backlog_with_the_gate() {
    let without = run(None).await;
    check_exactly_once(&without, "without the gate");
    for (label, strategy) in [
        ("strict", Strategy::Strict),
        ("delivery shares", Strategy::delivery_shares()),
    ] {
        let with = run(Some(gate(strategy))).await;
        check_exactly_once(&with, label);
        assert!(with.paused_seen, "{label}: the low topic was never paused");
        let (p50_with, p99_with) = (with.percentile(0.5), with.percentile(0.99));
        let (p50_without, p99_without) = (without.percentile(0.5), without.percentile(0.99));
        println!(
            "{label}: urgent p50 {p50_with:?} p99 {p99_with:?} with the gate, p50 \
             {p50_without:?} p99 {p99_without:?} without ({:.1} % of it at p99)",
            100.0 * p99_with.as_secs_f64() / p99_without.as_secs_f64()
        );
        assert!(
            p99_with.as_secs_f64() <= 0.8 * p99_without.as_secs_f64(),
            "{label}: p99 {p99_with:?} with the gate, {p99_without:?} without"
        );
    }
}
