//! The broker's lost arrivals (`EmulatorBuilder::pop_suspension_gap`): a message that arrives
//! while a receive is between its scan and its suspension wakes nobody, and that receive waits
//! its whole long polling. The push consumer keeps a standby poll beside each queue's loop, so
//! such a message still comes at once (on the real 5.3.3 broker: 3 of 2,000 messages sent
//! right after another waited 20 s with one poll per queue, 0 of 2,000 with the standby;
//! `tests/tests/rocketmq_real.rs` checks it there).

use std::time::Duration;

use rocketmq_grpc::PushConsumer;
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};

use crate::support::{self, GROUP, Handler};

/// A window far longer than the broker's, so that the race is certain here.
const GAP: Duration = Duration::from_secs(5);

/// A message published 1 s after the one the consumer just received, inside the window of
/// the receive that followed, comes within a second: the standby poll was suspended and the
/// arrival woke it. With one poll per queue it came when that receive's 20 s long poll ended.
#[tokio::test(start_paused = true)]
async fn a_message_right_after_another_comes_at_once_though_the_broker_loses_its_arrival() {
    let emulator = Emulator::builder()
        .group(GROUP, false)
        .topic("orders", TopicKind::Normal, 1)
        .pop_suspension_gap(GAP)
        .start()
        .await
        .expect("the emulator starts");
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    // Both polls past their windows, suspended.
    tokio::time::sleep(GAP * 2).await;
    for round in 0..5 {
        emulator
            .publish("orders", PublishMessage::new(format!("first {round}")))
            .unwrap();
        support::wait_handled(&consumer, round * 2 + 1, Duration::from_secs(30)).await;
        // Inside the window of the receive that followed the first message.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = tokio::time::Instant::now();
        emulator
            .publish("orders", PublishMessage::new(format!("second {round}")))
            .unwrap();
        support::wait_handled(&consumer, round * 2 + 2, Duration::from_secs(30)).await;
        let waited = sent.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "round {round}: the second message came after {waited:?}"
        );
        // Every poll suspended again before the next round.
        tokio::time::sleep(GAP * 2).await;
    }
    consumer.close(Duration::from_secs(5)).await;
}
