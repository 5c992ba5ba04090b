//! Retry letters: `reconsume_later` through the retry-letter topic, with the Java client's
//! properties, until the dead-letter topic.

use std::time::{Duration, Instant};

use pulsar_wire::{
    Consumer, ConsumerOptions, DELAY_TIME, DeadLetterPolicy, Error, InitialPosition,
    ORIGIN_MESSAGE_ID, OutgoingMessage, REAL_SUBSCRIPTION, REAL_TOPIC, RECONSUME_TIMES,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, assert_quiet, receive};

/// A message reconsumed twice comes back each time from the retry topic after the delay,
/// with its count; the third time, past the maximum of 2, it lands in the dead-letter topic
/// with the properties; both subscriptions drain.
#[tokio::test]
async fn a_message_reconsumed_past_the_maximum_lands_in_the_dead_letter_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared(
            "retry",
            ConsumerOptions::default()
                .enable_retry(true)
                .dead_letter(DeadLetterPolicy::new(2)),
        )
        .await;
    let id = setup
        .producer("retry", 0)
        .await
        .send(
            OutgoingMessage::new("later")
                .key("k")
                .property("app", "yes"),
        )
        .await
        .expect("sent");
    let topic = consumer.topic().to_owned();
    let mut message = receive(&consumer, 1).await.remove(0);
    for times in 1..=2 {
        let asked = Instant::now();
        consumer
            .reconsume_later(&message, Duration::from_millis(300))
            .await
            .expect("reconsumed");
        message = receive(&consumer, 1).await.remove(0);
        assert!(
            asked.elapsed() >= Duration::from_millis(300),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(message.topic(), format!("{topic}-sub-RETRY"));
        assert_eq!(message.payload().as_ref(), b"later");
        assert_eq!(message.key(), Some("k"));
        assert_eq!(message.property("app"), Some("yes"));
        assert_eq!(
            message.property(RECONSUME_TIMES),
            Some(times.to_string().as_str())
        );
        assert_eq!(message.property(DELAY_TIME), Some("300"));
        assert_eq!(message.property(REAL_TOPIC), Some(topic.as_str()));
        assert_eq!(message.property(REAL_SUBSCRIPTION), Some("sub"));
        assert_eq!(
            message.property(ORIGIN_MESSAGE_ID),
            Some(format!("{}:{}:-1", id.ledger_id(), id.entry_id()).as_str())
        );
    }
    consumer
        .reconsume_later(&message, Duration::from_millis(300))
        .await
        .expect("dead-lettered");
    assert_quiet(&consumer, Duration::from_millis(600)).await;
    consumer.flush_acks().await;
    setup.assert_drained("retry").await;
    setup.assert_drained(&format!("{topic}-sub-RETRY")).await;
    let dlq = Consumer::builder(&setup.client, format!("{topic}-sub-DLQ"), "reader")
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed to the DLQ");
    let letter = receive(&dlq, 1).await.remove(0);
    assert_eq!(letter.payload().as_ref(), b"later");
    assert_eq!(letter.property(RECONSUME_TIMES), Some("3"));
    assert_eq!(letter.property(REAL_TOPIC), Some(topic.as_str()));
    assert_eq!(consumer.stats().dead_lettered, 1);
}

/// Messages of the topic and of the retry topic come through one receive, acknowledged and
/// nacked through the consumer that got them.
#[tokio::test]
async fn the_topic_and_the_retry_topic_come_through_one_consumer() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("retry-mix", ConsumerOptions::default().enable_retry(true))
        .await;
    let producer = setup.producer("retry-mix", 0).await;
    for i in 0..10 {
        producer
            .send(OutgoingMessage::new(format!("m{i}")))
            .await
            .expect("sent");
    }
    let first = receive(&consumer, 10).await;
    // A delay no delivery time can say is refused, and the message stays.
    assert!(matches!(
        consumer.reconsume_later(&first[0], Duration::MAX).await,
        Err(Error::Invalid {
            what: "deliver_at",
            ..
        })
    ));
    for message in &first[..5] {
        consumer
            .reconsume_later(message, Duration::ZERO)
            .await
            .expect("reconsumed");
    }
    for message in &first[5..] {
        consumer.ack(message).await.expect("acked");
    }
    let again = receive(&consumer, 5).await;
    assert!(again.iter().all(|m| m.topic().ends_with("-sub-RETRY")));
    consumer.nack(&again[0]).expect("nacked");
    let back = receive(&consumer, 1).await.remove(0);
    assert_eq!(back.id(), again[0].id());
    consumer.ack(&back).await.expect("acked");
    for message in &again[1..] {
        consumer.ack(message).await.expect("acked");
    }
    consumer.flush_acks().await;
    setup.assert_drained("retry-mix").await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
}

#[tokio::test]
async fn reconsume_later_needs_retry_enabled() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("retry-off", ConsumerOptions::default()).await;
    setup
        .producer("retry-off", 0)
        .await
        .send(OutgoingMessage::new("x"))
        .await
        .expect("sent");
    let message = receive(&consumer, 1).await.remove(0);
    assert!(matches!(
        consumer
            .reconsume_later(&message, Duration::from_secs(1))
            .await,
        Err(Error::Invalid {
            what: "reconsume_later",
            ..
        })
    ));
    // An empty retry topic name is refused at subscription.
    let empty = Consumer::builder(&setup.client, "retry-off", "other")
        .enable_retry(true)
        .dead_letter(DeadLetterPolicy::new(1).retry_letter_topic(""))
        .build()
        .await;
    assert!(matches!(
        empty,
        Err(Error::Invalid {
            what: "retry_letter_topic",
            ..
        })
    ));
}

/// A message of the retry topic nacked past the maximum goes to the topic's dead-letter
/// topic (`{topic}-{subscription}-DLQ`, as with the Java client), not to one named after the
/// retry topic.
#[tokio::test]
async fn a_retry_letter_nacked_past_the_maximum_lands_in_the_topics_dead_letter_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared(
            "retry-nack",
            ConsumerOptions::default()
                .enable_retry(true)
                .dead_letter(DeadLetterPolicy::new(1)),
        )
        .await;
    setup
        .producer("retry-nack", 0)
        .await
        .send(OutgoingMessage::new("x"))
        .await
        .expect("sent");
    let topic = consumer.topic().to_owned();
    let message = receive(&consumer, 1).await.remove(0);
    consumer
        .reconsume_later(&message, Duration::ZERO)
        .await
        .expect("reconsumed");
    for _ in 0..2 {
        let again = receive(&consumer, 1).await.remove(0);
        assert!(again.topic().ends_with("-sub-RETRY"));
        consumer.nack(&again).expect("nacked");
    }
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    let dlq = Consumer::builder(&setup.client, format!("{topic}-sub-DLQ"), "reader")
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed to the DLQ");
    let letter = receive(&dlq, 1).await.remove(0);
    assert_eq!(letter.payload().as_ref(), b"x");
}
