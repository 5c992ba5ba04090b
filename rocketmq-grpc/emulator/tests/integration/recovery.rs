//! The consumer through the proxy's bad days: messages as large as the proxy accepts, a proxy
//! that forgot the client's settings (restart), a dropped consumer, and the shutdown report
//! of acks that failed and then succeeded on redelivery.
//!
//! Timing-dependent tests run on a current-thread runtime with tokio's clock paused: the
//! outage, the backoffs and the long polls pass in virtual time (the emulator's clock is tokio
//! time too).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::pb::Code;
use rocketmq_grpc::{
    AckSettings, ConsumeResult, DEFAULT_MAX_BODY, MessageHandler, OutgoingMessage, Producer,
    PushConsumer, ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, FaultConfig, PublishMessage, Rpc, TopicKind};

use crate::support::{self, GROUP, Handler};

/// Records the body size of every message it handles.
#[derive(Default)]
struct Sizes(Mutex<Vec<usize>>);

#[async_trait::async_trait]
impl MessageHandler for Sizes {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.0.lock().push(message.body().len());
        ConsumeResult::Success
    }
}

async fn one_queue_emulator() -> Emulator {
    Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        .seed(11)
        .start()
        .await
        .expect("the emulator starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_the_largest_body_the_proxy_accepts_is_received() {
    let emulator = one_queue_emulator().await;
    let producer = Producer::builder(support::config(&emulator))
        .build()
        .unwrap();
    // Small messages around the large one share its receive.
    producer
        .send(OutgoingMessage::new("orders", "before"))
        .await
        .unwrap();
    let large: Vec<u8> = (0..DEFAULT_MAX_BODY).map(|i| (i % 251) as u8).collect();
    producer
        .send(OutgoingMessage::new("orders", large.clone()).property("k", "v"))
        .await
        .expect("the proxy accepts a body of exactly 4 MiB");
    producer
        .send(OutgoingMessage::new("orders", "after"))
        .await
        .unwrap();
    let sizes = Arc::new(Sizes::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::default().max_delay(Duration::from_millis(50)))
        .handler(Arc::clone(&sizes))
        .build()
        .await
        .unwrap();
    support::wait_for("all three messages", Duration::from_secs(30), || {
        consumer.stats().acked == 3
    })
    .await;
    let mut seen = sizes.0.lock().clone();
    seen.sort_unstable();
    assert_eq!(seen, [5, 6, DEFAULT_MAX_BODY]);
    let report = consumer.close(Duration::from_secs(5)).await;
    assert!(report.unacknowledged.is_empty());
    assert!(
        emulator
            .ledger("orders", GROUP)
            .iter()
            .all(|m| m.acked_exactly_once())
    );
}

/// Whether `log` (a forgotten client's control calls) shows the settings announced before
/// any heartbeat or assignment succeeded, a heartbeat before the first assignment of each
/// registration, and no heartbeat or assignment after a refused one without new settings
/// in between.
fn settings_come_first(log: &[(Rpc, bool)]) -> Result<(), String> {
    let mut registered = false;
    let mut heartbeat_since_settings = false;
    for (i, (rpc, ok)) in log.iter().enumerate() {
        match (rpc, ok) {
            (Rpc::Telemetry, true) => {
                registered = true;
                heartbeat_since_settings = false;
            }
            (Rpc::Heartbeat | Rpc::QueryAssignment, false) => {
                if !registered && i > 0 {
                    return Err(format!(
                        "call {i}: {rpc} again without new settings: {log:?}"
                    ));
                }
                registered = false;
            }
            (Rpc::Heartbeat, true) => {
                if !registered {
                    return Err(format!("call {i}: heartbeat before settings: {log:?}"));
                }
                heartbeat_since_settings = true;
            }
            (Rpc::QueryAssignment, true) => {
                if !registered || !heartbeat_since_settings {
                    return Err(format!(
                        "call {i}: assignment before settings and heartbeat: {log:?}"
                    ));
                }
            }
            _ => return Err(format!("call {i}: unexpected {rpc} {ok}: {log:?}")),
        }
    }
    if !registered {
        return Err(format!("no settings announced: {log:?}"));
    }
    Ok(())
}

/// A proxy that lost its client table while the telemetry stream stayed open: heartbeats
/// are refused ("cannot find client settings"), assignments fail with `"settings" is null`
/// and receives with "client is disconnected". The consumer announces its settings again
/// first, then heartbeats and queries, and receives again.
#[tokio::test(start_paused = true)]
async fn a_consumer_announces_its_settings_again_when_the_proxy_forgot_them() {
    let emulator = one_queue_emulator().await;
    let handled = Arc::new(AtomicU64::new(0));
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Handler {
            handled: Arc::clone(&handled),
            pause: Duration::ZERO,
        })
        .build()
        .await
        .unwrap();
    support::publish(&emulator, "orders", 1);
    support::wait_handled(&consumer, 1, Duration::from_secs(30)).await;
    emulator.forget_clients(false);
    // The receive in flight may still take one; the ones after need the settings again.
    support::publish(&emulator, "orders", 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    support::publish(&emulator, "orders", 3);
    support::wait_handled(&consumer, 5, Duration::from_secs(120)).await;
    let log = emulator.control_log(consumer.client_id());
    settings_come_first(&log).unwrap();
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert_eq!(report.acks.abandoned, 0);
    assert!(
        emulator
            .ledger("orders", GROUP)
            .iter()
            .all(|m| m.acked_exactly_once())
    );
}

/// A 34 s proxy restart: every call fails (`UNAVAILABLE`), the telemetry stream ends and the
/// proxy forgets the client. The consumer backs off (it does not try every second), and
/// once the proxy is back it announces its settings before its first heartbeat and
/// assignment query, which both succeed, and consumes again.
#[tokio::test(start_paused = true)]
async fn after_a_proxy_restart_settings_precede_heartbeats_and_assignments() {
    let emulator = one_queue_emulator().await;
    let handled = Arc::new(AtomicU64::new(0));
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Handler {
            handled: Arc::clone(&handled),
            pause: Duration::ZERO,
        })
        .build()
        .await
        .unwrap();
    support::publish(&emulator, "orders", 1);
    support::wait_handled(&consumer, 1, Duration::from_secs(30)).await;
    // Half-way between two assignment queries and heartbeats.
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    emulator.set_faults(FaultConfig::none().on_rpcs(Rpc::ALL).unavailable(1.0));
    emulator.forget_clients(true);
    let before = emulator.stats();
    tokio::time::sleep(Duration::from_secs(34)).await;
    let during = emulator.stats();
    emulator.set_faults(FaultConfig::none());
    let attempts = |rpc| during.calls(rpc) - before.calls(rpc);
    // 1 s constant retries would make 34 telemetry and 34 receive attempts, 7 assignment
    // queries and 3 heartbeats, all doomed.
    assert!(
        attempts(Rpc::Telemetry) <= 14,
        "{} telemetry attempts in 34 s",
        attempts(Rpc::Telemetry)
    );
    assert!(
        attempts(Rpc::ReceiveMessage) <= 14,
        "{} receive attempts in 34 s",
        attempts(Rpc::ReceiveMessage)
    );
    assert_eq!(
        attempts(Rpc::Heartbeat) + attempts(Rpc::QueryAssignment),
        0,
        "no heartbeat or assignment while unregistered"
    );

    support::publish(&emulator, "orders", 3);
    support::wait_handled(&consumer, 4, Duration::from_secs(60)).await;
    let log = emulator.control_log(consumer.client_id());
    settings_come_first(&log).unwrap();
    assert_eq!(log.first(), Some(&(Rpc::Telemetry, true)), "{log:?}");
    assert!(log.iter().all(|(_, ok)| *ok), "nothing refused: {log:?}");
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

/// A consumer dropped without `shutdown` stops receiving at once and still flushes the acks
/// it had pending.
#[tokio::test(start_paused = true)]
async fn a_dropped_consumer_stops_receiving_and_flushes_its_acks() {
    let emulator = one_queue_emulator().await;
    let handled = Arc::new(AtomicU64::new(0));
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        // Acks wait up to 5 s for their batch: still pending at the drop.
        .handler(Handler {
            handled: Arc::clone(&handled),
            pause: Duration::ZERO,
        })
        .build()
        .await
        .unwrap();
    support::publish(&emulator, "orders", 3);
    support::wait_handled(&consumer, 3, Duration::from_secs(30)).await;
    assert_eq!(consumer.stats().acked, 0, "the acks are still batched");
    drop(consumer);
    // Let the background stop run.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let receives = emulator.stats().calls(Rpc::ReceiveMessage);
    support::publish(&emulator, "orders", 5);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        handled.load(Ordering::Relaxed),
        3,
        "nothing handled after the drop"
    );
    assert_eq!(
        emulator.stats().calls(Rpc::ReceiveMessage),
        receives,
        "no receive after the drop"
    );
    let ledger = emulator.ledger("orders", GROUP);
    let acked = ledger.iter().filter(|m| m.acked).count();
    assert_eq!(acked, 3, "the pending acks were flushed: {ledger:?}");
    assert!(
        emulator.clients().is_empty(),
        "the proxy was told the client left"
    );
}

/// An ack that failed for good, then succeeded for the redelivered message: the message is
/// not reported as unacknowledged.
#[tokio::test(start_paused = true)]
async fn an_ack_that_succeeds_on_redelivery_is_not_reported_unacknowledged() {
    let emulator = Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        // Renewed for 60 s only, so that an unacknowledged message comes back after 60 s.
        .auto_renew(Duration::from_secs(60), Duration::from_secs(60))
        .faults(FaultConfig::none().ack_entry_errors(1.0, Code::InvalidReceiptHandle))
        .start()
        .await
        .unwrap();
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::default().max_delay(Duration::from_millis(100)))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    let first = emulator
        .publish("orders", PublishMessage::new("once"))
        .unwrap()
        .message_id;
    let second = emulator
        .publish("orders", PublishMessage::new("twice"))
        .unwrap()
        .message_id;
    support::wait_for("both acks refused", Duration::from_secs(30), || {
        consumer.stats().ack_failed == 2
    })
    .await;
    // Both come back after 60 s, and their acks go through this time.
    emulator.set_faults(FaultConfig::none());
    emulator.advance(Duration::from_secs(61));
    support::wait_for("the redeliveries acked", Duration::from_secs(30), || {
        consumer.stats().acked == 2
    })
    .await;
    let ledger = emulator.ledger("orders", GROUP);
    assert!(ledger.iter().all(|m| m.acked), "{ledger:?}");
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(
        report.unacknowledged.is_empty(),
        "acked on redelivery: {:?} (ids {first}, {second})",
        report.unacknowledged
    );
    assert_eq!(report.unacknowledged_dropped, 0);
}

/// Acks failing through a 34 s outage back off exponentially (under the batcher's retry
/// budget) instead of every second, and all go through once the proxy is back, before the
/// receipt handles expire.
#[tokio::test(start_paused = true)]
async fn acks_back_off_through_an_outage() {
    let emulator = one_queue_emulator().await;
    support::publish(&emulator, "orders", 200);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::default().max_delay(Duration::from_millis(100)))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    emulator.set_faults(
        FaultConfig::none()
            .on_rpcs([Rpc::AckMessage])
            .unavailable(1.0),
    );
    support::wait_handled(&consumer, 200, Duration::from_secs(30)).await;
    let before = emulator.stats().calls(Rpc::AckMessage);
    tokio::time::sleep(Duration::from_secs(34)).await;
    let during = emulator.stats().calls(Rpc::AckMessage) - before;
    emulator.set_faults(FaultConfig::none());
    support::wait_for("every ack confirmed", Duration::from_secs(30), || {
        consumer.stats().acked == 200
    })
    .await;
    // A retry every second (merged per key) would make 34 or more requests.
    assert!(during <= 16, "{during} ack requests during 34 s of outage");
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert!(
        emulator
            .ledger("orders", GROUP)
            .iter()
            .all(|m| m.acked_exactly_once())
    );
}

/// Per-entry answers that will never change (`TOPIC_NOT_FOUND`, `UNAUTHORIZED`) end the ack
/// at once: no retry until the handle's deadline.
#[tokio::test(start_paused = true)]
async fn terminal_ack_codes_are_not_retried() {
    for code in [Code::TopicNotFound, Code::Unauthorized, Code::Forbidden] {
        let emulator = one_queue_emulator().await;
        emulator.set_faults(FaultConfig::none().ack_entry_errors(1.0, code));
        support::publish(&emulator, "orders", 20);
        let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
            .subscribe("orders", "*")
            .acks(AckSettings::default().max_delay(Duration::from_millis(100)))
            .handler(Handler::default())
            .build()
            .await
            .unwrap();
        support::wait_for("every ack refused", Duration::from_secs(30), || {
            consumer.stats().ack_failed == 20
        })
        .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let stats = emulator.stats();
        assert_eq!(stats.ack_entries, 20, "{code:?}: no entry sent twice");
        assert_eq!(consumer.stats().acks.retries, 0, "{code:?}");
        let report = consumer.close(Duration::from_secs(10)).await;
        assert_eq!(report.unacknowledged.len(), 20, "{code:?}");
    }
}

/// Fails every message's first delivery.
#[derive(Default)]
struct FailFourTimes(AtomicU64);

#[async_trait::async_trait]
impl MessageHandler for FailFourTimes {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        if message.delivery_attempt() <= 4 {
            self.0.fetch_add(1, Ordering::Relaxed);
            ConsumeResult::Failure
        } else {
            ConsumeResult::Success
        }
    }
}

/// A nack (`ChangeInvisibleDuration`) that keeps failing backs off exponentially instead of
/// retrying every second, and stops when the consumer shuts down. The handler fails its first
/// four attempts: the first three are retried in the consumer (after 1, 5 and 10 s, within
/// the 60 s invisibility); the fourth's delay (30 s) would end past it, so it is nacked.
#[tokio::test(start_paused = true)]
async fn failing_nacks_back_off() {
    let emulator = Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        .seed(11)
        .auto_renew(Duration::from_secs(40), Duration::from_secs(3 * 3600))
        .start()
        .await
        .expect("the emulator starts");
    emulator.set_faults(
        FaultConfig::none()
            .on_rpcs([Rpc::ChangeInvisibleDuration])
            .unavailable(1.0),
    );
    support::publish(&emulator, "orders", 1);
    let handler = Arc::new(FailFourTimes::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Arc::clone(&handler))
        .build()
        .await
        .unwrap();
    support::wait_for("the fourth failure", Duration::from_secs(60), || {
        handler.0.load(Ordering::Relaxed) == 4
    })
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let attempts = emulator.stats().calls(Rpc::ChangeInvisibleDuration);
    // Every second would be 20.
    assert!(
        (3..=12).contains(&attempts),
        "{attempts} nack attempts in 20 s"
    );
    let report = consumer.close(Duration::from_secs(5)).await;
    assert!(
        report.handlers_finished,
        "the nack retries stop at shutdown"
    );
}
