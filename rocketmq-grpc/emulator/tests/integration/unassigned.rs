//! A queue taken away while its receives wait at the broker ([`Emulator::assign_only`], as
//! the proxy stops assigning the queues of a broker that left the route). The proxy pops for
//! a receive whose call the client cancelled and throws the answer away
//! ([`EmulatorBuilder::cancelled_receives_pop`]), so the push consumer finishes the receives
//! under way and handles what they bring instead of dropping them: a dropped receive's
//! messages stay invisible and come back only if the broker revives them (on a real 5.3.3
//! cluster broker short of direct memory, one of 5,000 never did).
//!
//! [`EmulatorBuilder::cancelled_receives_pop`]: rocketmq_grpc_emulator::EmulatorBuilder::cancelled_receives_pop

use std::time::Duration;

use rocketmq_grpc::PushConsumer;
use rocketmq_grpc_emulator::{Emulator, PublishMessage, Rpc, TopicKind};

use crate::support::{self, GROUP, Handler};

/// A message that reaches the waiting receives just after their queues were unassigned is
/// handled at once. When the consumer dropped the receives of an unassigned queue, the
/// emulator (as the proxy) popped it for a receive nobody listened to any more, and it was
/// not handled within 30 s (its invisible time is 60 s).
#[tokio::test(start_paused = true)]
async fn a_message_for_a_receive_under_way_when_its_queue_is_unassigned_is_handled() {
    let emulator = Emulator::builder()
        .group(GROUP, false)
        .topic("orders", TopicKind::Normal, 2)
        .cancelled_receives_pop(true)
        .start()
        .await
        .expect("the emulator starts");
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    // Every poll waiting at the emulator.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked_before = assignment_queries(&emulator);
    // Every queue taken away, as when the topic's broker left the route (the emulator's
    // receives pop from every queue of the broker, so a queue still assigned would get the
    // message).
    emulator.assign_only("orders", Some(Vec::new()));
    // The consumer asks for its assignment every 5 s.
    let asked = tokio::time::Instant::now();
    while assignment_queries(&emulator) == asked_before {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the consumer did not ask for its assignment again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Answered and applied: the queue's loops are told to stop.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = tokio::time::Instant::now();
    emulator
        .publish("orders", PublishMessage::new("late").queue(1))
        .unwrap();
    support::wait_handled(&consumer, 1, Duration::from_secs(30)).await;
    let waited = sent.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "the message came after {waited:?}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

/// `QueryAssignment` calls the emulator has had, from any client.
fn assignment_queries(emulator: &Emulator) -> u64 {
    emulator
        .stats()
        .calls
        .get(&Rpc::QueryAssignment)
        .copied()
        .unwrap_or(0)
}
