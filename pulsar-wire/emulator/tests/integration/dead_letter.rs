//! The dead-letter policy: messages and undecodable entries nacked past the maximum land in
//! the dead-letter topic, and the original subscription drains.

use std::time::Duration;

use pulsar_wire::{
    Consumer, ConsumerOptions, DeadLetterPolicy, Error, InitialPosition, ORIGIN_MESSAGE_ID,
    OutgoingMessage, REAL_TOPIC, UNDECODABLE_REASON,
};
use pulsar_wire_emulator::{EmulatorConfig, Faults};

use crate::support::{PATIENCE, Setup, assert_quiet, receive, within};

#[tokio::test]
async fn a_message_nacked_past_the_maximum_lands_in_the_dead_letter_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared(
            "dl-good",
            ConsumerOptions::default().dead_letter(DeadLetterPolicy::new(2)),
        )
        .await;
    let producer = setup.producer("dl-good", 0).await;
    let id = producer
        .send(
            OutgoingMessage::new("poison")
                .key("k1")
                .property("app", "yes"),
        )
        .await
        .expect("sent");
    for count in 0..=2 {
        let message = receive(&consumer, 1).await.remove(0);
        assert_eq!((message.id(), message.redelivery_count()), (id, count));
        consumer.nack(&message).expect("nacked");
    }
    // Its fourth delivery (redelivery count 3, above the maximum of 2) goes to the
    // dead-letter topic, not here: the application saw 3, as with the Java client.
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer.flush_acks().await;
    assert_eq!(consumer.stats().dead_lettered, 1);
    setup.assert_drained("dl-good").await;
    let dlq = format!("{}-sub-DLQ", consumer.topic());
    let reader = Consumer::builder(&setup.client, &dlq, "reader")
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed to the DLQ");
    let letter = receive(&reader, 1).await.remove(0);
    assert_eq!(letter.payload().as_ref(), b"poison");
    assert_eq!(letter.key(), Some("k1"));
    assert_eq!(letter.property("app"), Some("yes"));
    assert_eq!(letter.property(REAL_TOPIC), Some(consumer.topic()));
    assert_eq!(
        letter.property(ORIGIN_MESSAGE_ID),
        Some(format!("{}:{}:-1", id.ledger_id(), id.entry_id()).as_str())
    );
    reader.ack(&letter).await.expect("ack queued");
    reader.flush_acks().await;
    setup.assert_drained(&dlq).await;
}

#[tokio::test]
async fn an_undecodable_entry_nacked_past_the_maximum_lands_in_the_dead_letter_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let policy = DeadLetterPolicy::new(2)
        .dead_letter_topic("dl-corrupt-dead")
        .initial_subscription_name("keep");
    let consumer = setup
        .shared("dl-corrupt", ConsumerOptions::default().dead_letter(policy))
        .await;
    let producer = setup.producer("dl-corrupt", 0).await;
    setup.emulator.set_faults(Faults::none().corrupt_rate(1.0));
    producer
        .send(OutgoingMessage::new("raw bytes").property("app", "yes"))
        .await
        .expect("sent");
    for count in 0..=2 {
        match within(PATIENCE, consumer.receive()).await {
            Some(Err(Error::Undecodable {
                id,
                redelivery_count,
                ..
            })) => {
                assert_eq!(redelivery_count, count);
                consumer.nack_id(&id).expect("nacked");
            }
            other => panic!(
                "expected an undecodable entry: {:?}",
                other.map(|r| r.map(|m| m.id()))
            ),
        }
    }
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer.flush_acks().await;
    let stats = consumer.stats();
    assert_eq!(
        (stats.undecodable, stats.dead_lettered),
        (4, 1),
        "{stats:?}"
    );
    setup.emulator.set_faults(Faults::none());
    setup.assert_drained("dl-corrupt").await;
    // The initial subscription kept the dead letter; its payload is the entry as stored.
    let reader = Consumer::builder(&setup.client, "dl-corrupt-dead", "keep")
        .build()
        .await
        .expect("subscribed to the DLQ");
    let letter = receive(&reader, 1).await.remove(0);
    assert_eq!(letter.payload().as_ref(), b"raw bytes");
    assert_eq!(letter.property("app"), Some("yes"));
    let reason = letter.property(UNDECODABLE_REASON).expect("the reason");
    assert!(reason.contains("checksum"), "{reason}");
    assert!(letter.property(ORIGIN_MESSAGE_ID).is_some());
    reader.ack(&letter).await.expect("ack queued");
    reader.flush_acks().await;
    setup.assert_drained("dl-corrupt-dead").await;
}
