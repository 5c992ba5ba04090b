//! PIP-307: a `CLOSE_PRODUCER` / `CLOSE_CONSUMER` naming the broker that serves the topic now
//! (`assignedBrokerServiceUrl`) sends the producer and the consumer there directly, without
//! a lookup. Two emulators stand for two brokers: the topic is "moved" from the first to the
//! second (each has its own data, so what is published after the move is on the second).

use pulsar_wire::pb::base_command::Type;
use pulsar_wire::{ConsumerOptions, OutgoingMessage};
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

use crate::support::{Setup, receive, send_all};

#[tokio::test]
async fn a_close_naming_the_new_broker_is_followed_without_a_lookup() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let second = Emulator::start(EmulatorConfig::default())
        .await
        .expect("the second emulator starts");
    // Ledger ids are unique in a real cluster; each emulator counts its own from 1: topics
    // made first on the second one keep the moved topic's ids apart from the first one's.
    for i in 0..4 {
        second
            .create_topic(&format!("filler-{i}"), 0)
            .expect("created");
    }
    let producer = setup.producer("moving", 0).await;
    let consumer = setup.consumer("moving", ConsumerOptions::default()).await;
    send_all(&producer, 3).await;
    for message in receive(&consumer, 3).await {
        consumer.ack(&message).await.expect("acked");
    }
    consumer.flush_acks().await;
    let lookups = setup.stats().received(Type::Lookup);
    assert_eq!(
        setup.emulator.unload_to("moving", second.endpoint()),
        (1, 1)
    );
    // The producer registers on the second broker and sends there.
    let id = producer
        .send(OutgoingMessage::new("after the move"))
        .await
        .expect("sent to the new broker");
    let moved = receive(&consumer, 1).await.remove(0);
    assert_eq!(moved.payload().as_ref(), b"after the move");
    assert_eq!(moved.id(), id);
    let stats = second.stats();
    assert_eq!(
        stats.received(Type::Lookup),
        0,
        "no lookup on the new broker"
    );
    assert_eq!(stats.received(Type::Producer), 1);
    assert_eq!(stats.received(Type::Subscribe), 1);
    assert_eq!(
        setup.stats().received(Type::Lookup),
        lookups,
        "no lookup on the old broker either"
    );
    assert_eq!(consumer.stats().moved, 1);
    assert_eq!(consumer.stats().reconnects, 1);
}

/// A close naming a broker that cannot be reached: the client looks the topic up, as after
/// any close, and goes on where the lookup says.
#[tokio::test]
async fn an_unreachable_assigned_broker_falls_back_to_a_lookup() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("moving-nowhere", 0).await;
    let consumer = setup
        .consumer("moving-nowhere", ConsumerOptions::default())
        .await;
    let lookups = setup.stats().received(Type::Lookup);
    // A port nothing listens on.
    setup
        .emulator
        .unload_to("moving-nowhere", "pulsar://127.0.0.1:1");
    producer
        .send(OutgoingMessage::new("still here"))
        .await
        .expect("sent");
    assert_eq!(
        receive(&consumer, 1).await.remove(0).payload().as_ref(),
        b"still here"
    );
    assert!(setup.stats().received(Type::Lookup) >= lookups + 2);
}
