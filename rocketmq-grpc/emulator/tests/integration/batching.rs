//! How acks are grouped into `AckMessage` requests.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::FlushReason;
use rocketmq_grpc::{AckSettings, PushConsumer};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};

use crate::support::{self, Acks, GROUP, Handler};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_take_ceil_of_n_over_1024_ack_rpcs() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 10_000);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .concurrency(256)
        // Only size and shutdown flush here, however slow the machine is.
        .acks(AckSettings::default().max_delay(Duration::from_secs(120)))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 10_000, Duration::from_secs(60)).await;
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(
        report.unacknowledged.is_empty(),
        "{:?}",
        report.unacknowledged
    );
    let stats = emulator.stats();
    assert_eq!(stats.ack_requests(), 10, "ceil(10,000 / 1,024) requests");
    assert_eq!(stats.ack_requests_with_entries(1024), 9);
    assert_eq!(
        stats.ack_requests_with_entries(10_000 - 9 * 1024),
        1,
        "the rest, flushed on shutdown"
    );
    let ledger = emulator.ledger("orders", GROUP);
    assert_eq!(ledger.len(), 10_000);
    assert!(ledger.iter().all(|m| m.acked_exactly_once()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_topics_never_share_a_request() {
    let emulator = support::emulator(&["a", "b"]).await;
    let a = support::publish(&emulator, "a", 300);
    let b = support::publish(&emulator, "b", 300);
    let acks = Arc::new(Acks::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("a", "*")
        .subscribe("b", "*")
        .acks(
            AckSettings::default()
                .max_delay(Duration::from_secs(120))
                .observer(acks.clone()),
        )
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 600, Duration::from_secs(30)).await;
    consumer.close(Duration::from_secs(10)).await;
    let batches = acks.batches.lock().clone();
    assert_eq!(batches.len(), 2, "one request per topic: {batches:?}");
    for (topic, ids) in batches {
        let own = if topic == "a" { &a } else { &b };
        assert!(
            ids.iter().all(|id| own.contains(id)),
            "a request of {topic} carries another topic's message"
        );
        assert_eq!(ids.len(), 300);
    }
    assert_eq!(emulator.stats().ack_requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_message_is_acknowledged_by_the_timer() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 1);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::default().max_delay(Duration::from_millis(200)))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    // The client counts the ack when the answer arrives, after the emulator has processed it.
    support::wait_for("the lone ack's answer", Duration::from_secs(10), || {
        consumer.stats().acked == 1
    })
    .await;
    assert_eq!(emulator.stats().acked, 1);
    let stats = consumer.stats();
    assert_eq!(stats.acks.batches(FlushReason::Delay), 1, "{stats:?}");
    assert_eq!(stats.acked, 1);
    consumer.close(Duration::from_secs(5)).await;
    assert_eq!(emulator.stats().ack_requests_with_entries(1), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_are_acknowledged_immediately_and_in_order() {
    let emulator = Emulator::builder()
        .topic("ledger", TopicKind::Fifo, 1)
        .group(GROUP, true)
        .start()
        .await
        .unwrap();
    for i in 0..20 {
        emulator
            .publish(
                "ledger",
                PublishMessage::new(format!("{i}")).message_group("account-1"),
            )
            .unwrap();
    }
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("ledger", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_for("20 FIFO acks", Duration::from_secs(20), || {
        emulator.stats().acked == 20
    })
    .await;
    let stats = consumer.stats();
    assert_eq!(stats.acks.batches(FlushReason::Immediate), 20);
    assert_eq!(stats.acks.total_batches(), 20);
    consumer.close(Duration::from_secs(5)).await;
    assert_eq!(emulator.stats().ack_requests_with_entries(1), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_messages_are_acknowledged_immediately() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 5);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::default().late_after(Duration::from_millis(50)))
        .handler(Handler {
            pause: Duration::from_millis(100),
            ..Handler::default()
        })
        .build()
        .await
        .unwrap();
    support::wait_for("5 late acks", Duration::from_secs(10), || {
        emulator.stats().acked == 5
    })
    .await;
    assert_eq!(consumer.stats().acks.batches(FlushReason::Immediate), 5);
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_mode_sends_one_entry_per_request() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 50);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::immediate())
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_for("50 acks", Duration::from_secs(10), || {
        emulator.stats().acked == 50
    })
    .await;
    consumer.close(Duration::from_secs(5)).await;
    let stats = emulator.stats();
    assert_eq!(stats.ack_requests(), 50);
    assert_eq!(stats.ack_requests_with_entries(1), 50);
}

/// A receive holds its permits while it long-polls (20 s here), so a queue with nothing to
/// deliver must not keep the other queues from receiving: 8 queues share a concurrency of 64.
/// Before each queue was held to its fair share, the first two receives (of the idle topic,
/// subscribed first) took all 64 permits for a whole long poll and the busy topic waited 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_queue_does_not_hold_up_the_others() {
    let emulator = Emulator::builder()
        .group(GROUP, false)
        .seed(7)
        .topic("idle", TopicKind::Normal, 4)
        .topic("busy", TopicKind::Normal, 4)
        .start()
        .await
        .unwrap();
    support::publish(&emulator, "busy", 500);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("idle", "*")
        .subscribe("busy", "*")
        .long_polling(Duration::from_secs(20))
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    // Well below one long poll, however loaded the machine.
    support::wait_handled(&consumer, 500, Duration::from_secs(10)).await;
    consumer.close(Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn close_takes_a_reference_and_a_second_close_returns_an_empty_report() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 20);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 20, Duration::from_secs(60)).await;
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.handlers_finished, "{report:?}");
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    let started = tokio::time::Instant::now();
    let again = consumer.close(Duration::from_secs(10)).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "the second close waited");
    assert!(
        !again.handlers_finished && again.acks.pending_at_close == 0,
        "{again:?}"
    );
    assert_eq!(consumer.stats().acked, 20);
    drop(consumer);
    let ledger = emulator.ledger("orders", GROUP);
    assert!(ledger.iter().all(|m| m.acked_exactly_once()));
}
