//! The priority gate of a push consumer on level topics, against the emulator: while a
//! backlog of low messages is being consumed, a burst of urgent ones is handled far sooner
//! than without priority (every message on one topic, the burst behind the backlog), sooner
//! with the gate than with level topics alone, and every message is handled exactly once.
//!
//! Real time, on purpose: under virtual time (`start_paused`) the clock jumps to the next
//! timer whenever the runtime waits for the emulator's frames, so every round trip cost up to
//! one handler's work and the strategies could not be told apart (both 26 ms against 34 ms).
//! With a strict gate the urgent p99 was 46 to 53 % of level topics without a gate over runs
//! here, the whole suite running beside it (10 ms of work a message: 111 ms against 232 ms,
//! 118 ms against 256 ms; a burst alone needs 78 ms at this concurrency), under delivery
//! shares 72 to 85 %; against no priority, whose burst waits for the 18,000 messages of the
//! backlog ahead of it (about 2.8 s at 64 × 10 ms), it is a few percent, and the test asserts
//! the bound there: at most 10 %.
//!
//! The gated run is made three times and judged on its median p99: real time is shared with
//! whatever else the machine runs. One run under delivery shares, with two copies of the
//! whole suite and other builds beside it (load 4.5 on 2 cores), took 10.4 % of no
//! priority's p99 (p50 483 ms, against 68 to 89 ms in the runs around it, 2.9 to 4.3 % of no
//! priority's): the whole run was slowed, not its tail. Every gated run is still checked for
//! loss and duplicates.
//!
//! Why the gate gains less than level topics do: the consumer holds no queue of its own (it
//! receives only what its concurrency can take at once), so without the gate a burst of
//! urgent messages already gets the share of every receive loop that has messages (here half:
//! the low topic's and its own), and with it all of the concurrency once the low topic is
//! paused; a burst can never be handled faster than the concurrency allows, so the gate's gain
//! over level topics is at most the number of levels with a backlog.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics, Strategy};
use rocketmq_grpc::{ConsumeResult, PushConsumer, ReceivedMessage};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::support::{self, GROUP};

const LEVELS: [&str; 3] = ["gate-0", "gate-1", "gate-2"];
const LOW: usize = 20_000;
const URGENT: usize = 500;
const CONCURRENCY: usize = 64;
/// How many times the gated run is made; it is judged on the median p99.
const GATED_RUNS: usize = 3;
/// The handler's work per message.
const WORK: Duration = Duration::from_millis(10);

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
    /// The gate's pauses (0 without a gate).
    pauses: u64,
    /// The gate's counters per level: (arrivals, delivered, acked).
    levels: Vec<(u64, u64, u64)>,
}

impl Run {
    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.urgent.len() as f64 * p).ceil() as usize).clamp(1, self.urgent.len());
        self.urgent[i - 1]
    }
}

/// Waits until `count` reaches `n`. No polling: a timer of the test would be one more
/// point virtual time jumps to while the client and the emulator exchange frames.
async fn reach(count: &mut watch::Receiver<usize>, n: usize) {
    let reached = tokio::time::timeout(Duration::from_secs(600), count.wait_for(|c| *c >= n));
    assert!(
        matches!(reached.await, Ok(Ok(_))),
        "timed out waiting for {n} handled messages"
    );
}

/// How a run consumes.
#[derive(Clone)]
enum Mode {
    /// No priority: the burst goes to the low messages' topic, behind the backlog.
    OneTopic,
    /// Level topics, no gate.
    LevelTopics,
    /// Level topics and a gate.
    Gated(GateConfig),
}

async fn run(mode: Mode) -> Run {
    let emulator = emulator().await;
    let urgent_topic = match mode {
        Mode::OneTopic => LEVELS[2],
        _ => LEVELS[0],
    };
    for i in 0..LOW {
        emulator
            .publish(LEVELS[2], PublishMessage::new(format!("low-{i}")))
            .unwrap();
    }
    let handled_at: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let (counter, mut count) = watch::channel(0usize);
    let counter = Arc::new(counter);
    let seen = Arc::clone(&handled_at);
    let mut builder = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(CONCURRENCY)
        .long_polling(Duration::from_secs(5));
    builder = match mode {
        Mode::Gated(gate) => builder.priority(topics(), gate),
        Mode::LevelTopics => LEVELS.iter().fold(builder, |b, t| b.subscribe(*t, "*")),
        Mode::OneTopic => builder.subscribe(LEVELS[2], "*"),
    };
    let consumer = builder
        .handler(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            let counter = Arc::clone(&counter);
            async move {
                tokio::time::sleep(WORK).await;
                seen.lock()
                    .push((message.message_id().to_owned(), Instant::now()));
                counter.send_modify(|c| *c += 1);
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap();
    // The burst comes while the backlog is being consumed.
    reach(&mut count, 2_000).await;
    let mut enqueued = HashMap::new();
    for i in 0..URGENT {
        let id = emulator
            .publish(urgent_topic, PublishMessage::new(format!("urgent-{i}")))
            .unwrap()
            .message_id;
        enqueued.insert(id, Instant::now());
    }
    reach(&mut count, LOW + URGENT).await;
    // Anything handled twice would show up after the count is reached: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = consumer.gate_stats();
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
        pauses: stats.as_ref().map_or(0, |s| s.pauses),
        levels: stats.map_or_else(Vec::new, |s| {
            s.levels
                .iter()
                .map(|l| (l.arrivals, l.delivered, l.acked))
                .collect()
        }),
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
    GateConfig::default()
        .with_strategy(strategy)
        .with_receiver_queue_size(CONCURRENCY as u32)
}

/// One run without priority, one with level topics and no gate, and [`GATED_RUNS`] with
/// `strategy`: the p99 ratios of the median gated run to the first two, after checking that
/// every message was handled once in every run.
async fn measure(label: &str, strategy: Strategy) -> (f64, f64, u64) {
    let none = run(Mode::OneTopic).await;
    check_exactly_once(&none, "no priority");
    let without = run(Mode::LevelTopics).await;
    check_exactly_once(&without, "level topics without the gate");
    let mut runs = Vec::with_capacity(GATED_RUNS);
    for _ in 0..GATED_RUNS {
        let with = run(Mode::Gated(gate(strategy.clone()))).await;
        check_exactly_once(&with, label);
        // Every message went through the gate once: arrived, handled, acknowledged.
        assert_eq!(
            with.levels,
            [(500, 500, 500), (0, 0, 0), (20_000, 20_000, 20_000)],
            "{label}"
        );
        runs.push(with);
    }
    runs.sort_by_key(|run| run.percentile(0.99));
    let p99s: Vec<Duration> = runs.iter().map(|run| run.percentile(0.99)).collect();
    println!("{label}: gated urgent p99 over {GATED_RUNS} runs: {p99s:?}");
    let with = runs.swap_remove(GATED_RUNS / 2);
    let (p50_with, p99_with) = (with.percentile(0.5), with.percentile(0.99));
    let (p50_without, p99_without) = (without.percentile(0.5), without.percentile(0.99));
    let (p50_none, p99_none) = (none.percentile(0.5), none.percentile(0.99));
    let ratio = p99_with.as_secs_f64() / p99_without.as_secs_f64();
    let of_none = p99_with.as_secs_f64() / p99_none.as_secs_f64();
    println!(
        "{label}: urgent p50 {p50_with:?} p99 {p99_with:?} with the gate ({} pauses); level \
         topics alone p50 {p50_without:?} p99 {p99_without:?} ({:.1} % of it at p99); no \
         priority p50 {p50_none:?} p99 {p99_none:?} ({:.1} % of it)",
        with.pauses,
        100.0 * ratio,
        100.0 * of_none
    );
    (of_none, ratio, with.pauses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_urgent_messages_overtakes_a_low_backlog_with_a_strict_gate() {
    let (of_none, _, pauses) = measure("strict", Strategy::Strict).await;
    assert!(pauses > 0, "the gate never paused a topic");
    assert!(
        of_none <= 0.10,
        "the urgent p99 with a strict gate was {:.1} % of no priority's, above 10 %",
        100.0 * of_none
    );
}

/// Delivery shares pause a lower level only while it is full itself, and promise it its
/// share: against no priority the same 10 % bound holds (level topics do most of it); nothing
/// is lost or handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_delivery_shares_every_message_is_handled_once() {
    let (of_none, _, _) = measure("delivery shares", Strategy::delivery_shares()).await;
    assert!(
        of_none <= 0.10,
        "the urgent p99 under delivery shares was {:.1} % of no priority's, above 10 %",
        100.0 * of_none
    );
}
