//! Property: whatever the order of sends, receives, unloads and dropped connections, a
//! producer and a Shared consumer come back by themselves, every send succeeds, every
//! payload is received, no message the application acknowledged comes to it again (by id),
//! and the emulator ends with nothing unacknowledged.

use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;
use pulsar_wire::{ConsumerOptions, OutgoingMessage};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{PATIENCE, Setup, within};

#[derive(Debug, Clone)]
enum Step {
    /// Starts this many sends (not awaited).
    Send(usize),
    /// Receives up to this many messages and acknowledges each.
    Receive(usize),
    /// Unloads the topic (`CLOSE_PRODUCER`, `CLOSE_CONSUMER`).
    Unload,
    /// Drops every connection.
    Disconnect,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..25).prop_map(Step::Send),
        3 => (1usize..25).prop_map(Step::Receive),
        1 => Just(Step::Unload),
        1 => Just(Step::Disconnect),
    ]
}

async fn run(steps: Vec<Step>, per_batch: usize) {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("outages", ConsumerOptions::default()).await;
    let producer = setup.producer("outages", per_batch).await;
    let mut sends = Vec::new();
    let mut next = 0usize;
    let mut acked = HashSet::new();
    // By payload: what the application got; by id: what it acknowledged (a payload may come
    // twice in two entries when a send was persisted but its receipt was lost with the
    // connection, and was sent again: the emulator does not deduplicate).
    let mut acked_ids = HashSet::new();
    let mut copies_of_acked = 0;
    let mut take = |message: &pulsar_wire::Message, acked: &mut HashSet<String>| {
        if !acked_ids.insert(message.id().to_string()) {
            copies_of_acked += 1;
        }
        acked.insert(String::from_utf8_lossy(message.payload()).into_owned());
    };
    for step in steps {
        match step {
            Step::Send(n) => {
                for _ in 0..n {
                    let producer = producer.clone();
                    let payload = format!("m{next}");
                    next += 1;
                    sends.push(tokio::spawn(async move {
                        producer.send(OutgoingMessage::new(payload)).await
                    }));
                }
                tokio::task::yield_now().await;
            }
            Step::Receive(n) => {
                for _ in 0..n {
                    let Some(received) =
                        within(Duration::from_millis(100), consumer.receive()).await
                    else {
                        break;
                    };
                    let message = received.expect("receive fails only for good");
                    consumer.ack(&message).await.expect("acked");
                    take(&message, &mut acked);
                }
            }
            Step::Unload => {
                setup.emulator.unload("outages");
            }
            Step::Disconnect => {
                setup.emulator.disconnect_all();
            }
        }
    }
    for (i, send) in sends.into_iter().enumerate() {
        let sent = within(PATIENCE, send)
            .await
            .unwrap_or_else(|| panic!("send m{i} hung"))
            .expect("joined");
        assert!(sent.is_ok(), "send m{i}: {sent:?}");
    }
    while (0..next).any(|i| !acked.contains(&format!("m{i}"))) {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| {
                let missing: Vec<usize> = (0..next)
                    .filter(|i| !acked.contains(&format!("m{i}")))
                    .collect();
                panic!("never received: {missing:?}, {:?}", consumer.stats())
            })
            .expect("received");
        consumer.ack(&message).await.expect("acked");
        take(&message, &mut acked);
    }
    consumer.flush_acks().await;
    setup.assert_drained("outages").await;
    assert_eq!(
        copies_of_acked,
        0,
        "acknowledged messages came again: {:?}",
        consumer.stats()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn nothing_is_lost_through_unloads_and_dropped_connections(
        steps in proptest::collection::vec(step(), 5..30),
        batched in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(run(steps, if batched { 7 } else { 0 }));
    }
}
