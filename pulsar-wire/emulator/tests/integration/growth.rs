//! Topics that grow: a plain producer and consumer follow a partition count that grows under
//! them, by themselves.

use std::collections::HashSet;
use std::time::Duration;

use pulsar_wire::{ConsumerOptions, OutgoingMessage, Producer};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, assert_quiet, within};

/// A topic grown 4 -> 8 partitions under a running producer and consumer (refresh every
/// 500 ms): both reach the new partitions with no call of the application, every message
/// arrives once, and the new partitions carry messages.
#[tokio::test(start_paused = true)]
async fn a_running_producer_and_consumer_follow_a_topic_grown_from_4_to_8_partitions() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "grows";
    setup.emulator.create_topic(topic, 4).expect("created");
    let every = Some(Duration::from_millis(500));
    let consumer = setup
        .shared(topic, ConsumerOptions::default().partitions_refresh(every))
        .await;
    let producer = Producer::builder(&setup.client, topic)
        .no_batching()
        .partitions_refresh(every)
        .build()
        .await
        .expect("producer");
    let mut received = HashSet::new();
    let mut partitions = HashSet::new();
    for i in 0..400 {
        if i == 100 {
            setup.emulator.update_partitions(topic, 8).expect("grown");
        }
        producer
            .send(OutgoingMessage::new(format!("m{i}")).key(format!("k{i}")))
            .await
            .expect("sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
        while let Some(Ok(message)) = within(Duration::ZERO, consumer.receive()).await {
            partitions.insert(message.id().partition());
            received.insert(String::from_utf8_lossy(message.payload()).into_owned());
            consumer.ack(&message).await.expect("acked");
        }
    }
    while received.len() < 400 {
        let message = within(Duration::from_secs(5), consumer.receive())
            .await
            .unwrap_or_else(|| panic!("only {} of 400 arrived", received.len()))
            .expect("received");
        partitions.insert(message.id().partition());
        assert!(received.insert(String::from_utf8_lossy(message.payload()).into_owned()));
        consumer.ack(&message).await.expect("acked");
    }
    assert_eq!(consumer.partitions(), 8);
    assert_eq!(partitions.len(), 8, "messages came from {partitions:?}");
    assert_quiet(&consumer, Duration::from_millis(500)).await;
}

/// `None` keeps the count until the application asks.
#[tokio::test(start_paused = true)]
async fn without_a_refresh_interval_the_consumer_waits_to_be_asked() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup
        .emulator
        .create_topic("grows-asked", 2)
        .expect("created");
    let consumer = setup
        .shared(
            "grows-asked",
            ConsumerOptions::default().partitions_refresh(None),
        )
        .await;
    setup
        .emulator
        .update_partitions("grows-asked", 3)
        .expect("grown");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(consumer.partitions(), 2);
    assert_eq!(consumer.refresh_partitions().await.expect("refreshed"), 3);
}
