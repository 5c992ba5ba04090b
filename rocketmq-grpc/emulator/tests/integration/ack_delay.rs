//! `AckSettings::follow_deadlines`: a batch waits longer than 5 s on a quiet topic, and is
//! still flushed before the earliest receipt handle's deadline minus the margin (the longer
//! of `deadline_margin` and a tenth of the invisible duration).
//!
//! Virtual time (current-thread runtime, tokio's clock paused): the waits pass at once, and
//! the emulator's deadlines follow the same clock.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{BatchInfo, FlushReason, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ConsumeResult, Error, MessageHandler, PushConsumer,
    ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};
use tokio::time::Instant;

use crate::support::{self, GROUP, Handler};

/// When each ack batch was flushed, why, and with how many entries.
#[derive(Default)]
struct Flushes(Mutex<Vec<(Instant, FlushReason, usize)>>);

impl Observer<AckKey, AckEntry, (), Error> for Flushes {
    fn before_flush(&self, _: &AckKey, batch: &BatchInfo, _: &[AckEntry]) {
        self.0
            .lock()
            .push((Instant::now(), batch.reason, batch.len));
    }
}

impl Flushes {
    fn all(&self) -> Vec<(Instant, FlushReason, usize)> {
        self.0.lock().clone()
    }
}

/// One topic of one queue whose auto-renewed receives are invisible for `invisible`.
async fn emulator(invisible: Duration) -> Emulator {
    Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        .auto_renew(invisible, Duration::from_secs(3600))
        .seed(5)
        .start()
        .await
        .expect("the emulator starts")
}

/// Starts a consumer with `acks` (observed by `flushes`), publishes one message and returns
/// the moment it was handled (received, in virtual time).
async fn consume_one(
    emulator: &Emulator,
    acks: AckSettings,
    flushes: &Arc<Flushes>,
) -> (PushConsumer, Instant) {
    let consumer = PushConsumer::builder(support::config(emulator), GROUP)
        .subscribe("orders", "*")
        .acks(acks.observer(Arc::clone(flushes) as _))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::publish(emulator, "orders", 1);
    support::wait_handled(&consumer, 1, Duration::from_secs(30)).await;
    (consumer, Instant::now())
}

/// The one flush seen, `offset` after `from`.
fn single_flush(flushes: &Flushes, from: Instant) -> (Duration, FlushReason, usize) {
    let all = flushes.all();
    assert_eq!(all.len(), 1, "one ack request: {all:?}");
    let (at, reason, len) = all[0];
    (at.saturating_duration_since(from), reason, len)
}

fn assert_between(what: &str, value: Duration, low: f64, high: f64) {
    let secs = value.as_secs_f64();
    assert!(
        (low..=high).contains(&secs),
        "{what}: {secs:.3} s, expected {low}..={high} s"
    );
}

/// 20 s handles: the default batches wait 5 s; `follow_deadlines(25 s)` waits past 5 s
/// and flushes 2 s (a tenth) before the handle expires, at 18 s, not at 19 s (the 1 s
/// `deadline_margin` alone) nor at 25 s (`max_delay`).
#[tokio::test(start_paused = true)]
async fn a_quiet_topic_waits_past_5_s_and_flushes_a_tenth_before_the_deadline() {
    let emulator = emulator(Duration::from_secs(20)).await;
    let flushes = Arc::new(Flushes::default());
    let acks = AckSettings::default().follow_deadlines(Duration::from_secs(25));
    let (consumer, handled) = consume_one(&emulator, acks, &flushes).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(flushes.all().is_empty(), "still batched after 6 s");
    assert_eq!(emulator.stats().acked, 0);
    support::wait_for("the ack", Duration::from_secs(30), || {
        emulator.stats().acked == 1
    })
    .await;
    let (after, reason, len) = single_flush(&flushes, handled);
    assert_between("flushed after", after, 17.9, 18.05);
    assert_eq!((reason, len), (FlushReason::Deadline, 1));
    let report = consumer.close(Duration::from_secs(5)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert_eq!(emulator.stats().expired_handles, 0);
}

/// The same 20 s handles with the default settings: flushed by the 5 s `max_delay`.
#[tokio::test(start_paused = true)]
async fn default_settings_still_flush_at_5_s() {
    let emulator = emulator(Duration::from_secs(20)).await;
    let flushes = Arc::new(Flushes::default());
    let (consumer, handled) = consume_one(&emulator, AckSettings::default(), &flushes).await;
    support::wait_for("the ack", Duration::from_secs(30), || {
        emulator.stats().acked == 1
    })
    .await;
    let (after, reason, len) = single_flush(&flushes, handled);
    assert_between("flushed after", after, 4.95, 5.05);
    assert_eq!((reason, len), (FlushReason::Delay, 1));
    consumer.close(Duration::from_secs(5)).await;
}

/// Regression: an 8 s handle with `max_delay` 25 s must be acknowledged before it expires
/// (at 7 s: the 1 s margin is longer than a tenth of 8 s), not at 25 s when the proxy has
/// redelivered the message and refuses the expired handle.
#[tokio::test(start_paused = true)]
async fn a_short_invisibility_bounds_a_long_max_delay() {
    let emulator = emulator(Duration::from_secs(8)).await;
    let flushes = Arc::new(Flushes::default());
    let acks = AckSettings::default().follow_deadlines(Duration::from_secs(25));
    let (consumer, handled) = consume_one(&emulator, acks, &flushes).await;
    support::wait_for("the ack", Duration::from_secs(30), || {
        emulator.stats().acked == 1
    })
    .await;
    let (after, reason, _) = single_flush(&flushes, handled);
    assert_between("flushed after", after, 6.9, 7.2);
    assert_eq!(reason, FlushReason::Deadline);
    let stats = emulator.stats();
    assert_eq!(
        (stats.expired_handles, stats.redelivered),
        (0, 0),
        "{stats:?}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

/// Handles `slow` messages 10 s after receipt and the others at once.
struct SlowOnBody;

#[async_trait::async_trait]
impl MessageHandler for SlowOnBody {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        if message.body() == "slow" {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        ConsumeResult::Success
    }
}

/// A message received early joins a batch opened later: its nearer deadline flushes the
/// whole batch early. 20 s handles: `slow` is received at 0 s and handled at 10 s, `fast`
/// is received and handled at 5 s; `fast` alone would wait until 23 s, but the batch goes at
/// 18 s, `slow`'s deadline minus its margin, with both entries.
#[tokio::test(start_paused = true)]
async fn a_near_deadline_flushes_the_batch_early() {
    let emulator = emulator(Duration::from_secs(20)).await;
    let flushes = Arc::new(Flushes::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(
            AckSettings::default()
                .follow_deadlines(Duration::from_secs(25))
                .observer(Arc::clone(&flushes) as _),
        )
        .handler(SlowOnBody)
        .build()
        .await
        .unwrap();
    emulator
        .publish("orders", PublishMessage::new("slow"))
        .unwrap();
    support::wait_for("the slow receive", Duration::from_secs(30), || {
        consumer.stats().received == 1
    })
    .await;
    let received = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    emulator
        .publish("orders", PublishMessage::new("fast"))
        .unwrap();
    support::wait_for("both acks", Duration::from_secs(60), || {
        emulator.stats().acked == 2
    })
    .await;
    let (after, reason, len) = single_flush(&flushes, received);
    assert_between("flushed after", after, 17.9, 18.05);
    assert_eq!((reason, len), (FlushReason::Deadline, 2));
    assert_eq!(emulator.stats().ack_requests_with_entries(2), 1);
    consumer.close(Duration::from_secs(5)).await;
}
