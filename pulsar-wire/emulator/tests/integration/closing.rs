//! Closing with a deadline: what a close flushes, what it gives up at the deadline, and what
//! every call after it gets.

use std::time::Duration;

use pulsar_wire::{
    BatchingOptions, ConsumerCloseReport, ConsumerOptions, Error, InitialPosition, OutgoingMessage,
    PatternConsumer, Producer, ProducerCloseReport, ProducerOptions, SubType,
};
use pulsar_wire_emulator::{EmulatorConfig, Faults};
use tokio::time::Instant;

use crate::support::{PATIENCE, Setup, receive, send_all, within};

/// Acks that wait in the ack grouping until the close sends them.
fn grouped_acks() -> ConsumerOptions {
    ConsumerOptions::default().ack_group_time(Duration::from_secs(3600))
}

#[tokio::test(start_paused = true)]
async fn a_consumer_close_flushes_the_grouped_acks_and_reports_them() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("close-acks", grouped_acks()).await;
    let producer = setup.producer("close-acks", 0).await;
    send_all(&producer, 3).await;
    for message in receive(&consumer, 3).await {
        consumer.ack(&message).await.expect("acked");
    }
    let report = consumer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(report.acks_pending, 3, "{report:?}");
    assert_eq!(report.acks_flushed, 3, "{report:?}");
    assert_eq!((report.acks_failed, report.acks_abandoned), (0, 0));
    setup.assert_drained("close-acks").await;

    let started = Instant::now();
    let again = consumer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(
        again,
        ConsumerCloseReport::default(),
        "a second close has nothing left"
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a second close returns at once"
    );
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
    producer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
}

#[tokio::test(start_paused = true)]
async fn a_consumer_close_abandons_the_acks_unanswered_at_the_deadline() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = std::sync::Arc::new(
        setup
            .shared("close-stuck", grouped_acks().ack_receipts(true))
            .await,
    );
    let producer = setup.producer("close-stuck", 0).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    // The broker answers nothing for an hour: the acks cannot be confirmed.
    setup
        .emulator
        .set_faults(Faults::none().response_delay(Duration::from_secs(3600)));
    for message in &messages {
        consumer.ack(message).await.expect("queued");
    }
    let started = Instant::now();
    let closing = tokio::spawn({
        let consumer = std::sync::Arc::clone(&consumer);
        async move { consumer.close(Duration::from_secs(2)).await }
    });
    // Past the deadline the close unregisters the consumer, which the silent broker never
    // answers either; ending the connection ends that wait (the broker forgets the consumer).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    setup.emulator.disconnect_all();
    let report = closing.await.expect("joined").expect("closed");
    assert_eq!(report.acks_pending, 3, "{report:?}");
    assert_eq!(report.acks_abandoned, 3, "{report:?}");
    assert_eq!(
        (report.acks_flushed, report.acks_failed),
        (0, 0),
        "{report:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let late = consumer.ack(&messages[0]).await;
    assert!(matches!(late, Err(Error::Closed(_))), "{late:?}");
}

#[tokio::test(start_paused = true)]
async fn a_producer_close_flushes_its_batch_and_reports_the_pending_sends() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let options = ProducerOptions::default().batching(
        BatchingOptions::default()
            .max_messages(100)
            .max_delay(Duration::from_secs(3600)),
    );
    let producer = std::sync::Arc::new(
        Producer::builder(&setup.client, "close-sends")
            .options(options)
            .build()
            .await
            .expect("producer created"),
    );
    let sends: Vec<_> = (0..3)
        .map(|i| {
            let producer = std::sync::Arc::clone(&producer);
            tokio::spawn(async move { producer.send(OutgoingMessage::new(format!("m{i}"))).await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let report = producer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(
        report.pending, 3,
        "the batched sends were pending: {report:?}"
    );
    assert_eq!((report.answered, report.abandoned), (3, 0), "{report:?}");
    for send in sends {
        send.await
            .expect("joined")
            .expect("the close flushed the batch");
    }
    assert_eq!(
        setup.stats().backlog("close-sends"),
        0,
        "no subscription keeps them"
    );

    let started = Instant::now();
    let again = producer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(again, ProducerCloseReport::default());
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a second close returns at once"
    );
    assert!(matches!(
        producer.send(OutgoingMessage::new("late")).await,
        Err(Error::Closed(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_producer_close_abandons_the_sends_unanswered_at_the_deadline() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = std::sync::Arc::new(setup.producer("close-unanswered", 0).await);
    setup.emulator.take_down().await;
    let sends: Vec<_> = (0..3)
        .map(|i| {
            let producer = std::sync::Arc::clone(&producer);
            tokio::spawn(async move { producer.send(OutgoingMessage::new(format!("m{i}"))).await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    let report = producer
        .close(Duration::from_secs(2))
        .await
        .expect("closed (the broker is down: nothing to unregister)");
    let took = started.elapsed();
    assert_eq!(report.pending, 3, "{report:?}");
    assert_eq!((report.answered, report.abandoned), (0, 3), "{report:?}");
    assert_eq!(
        took,
        Duration::from_secs(2),
        "the close waited until its deadline"
    );
    for send in sends {
        let result = send.await.expect("joined");
        assert!(matches!(result, Err(Error::Closed(_))), "{result:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_pattern_consumer_close_sums_the_reports_of_its_topics() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    for topic in ["closing-a", "closing-b"] {
        let producer = setup.producer(topic, 0).await;
        send_all(&producer, 2).await;
    }
    let consumer = PatternConsumer::builder(
        &setup.client,
        "persistent://public/default/closing-.*",
        "sub",
    )
    .consumer(
        grouped_acks()
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest),
    )
    .discovery_interval(None)
    .build()
    .await
    .expect("subscribed");
    for _ in 0..4 {
        let message = within(PATIENCE, consumer.receive())
            .await
            .expect("in time")
            .expect("received");
        consumer.ack(&message).await.expect("acked");
    }
    let report = consumer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(
        (report.acks_pending, report.acks_flushed),
        (4, 4),
        "both topics' acks: {report:?}"
    );
    setup.assert_drained("closing-a").await;
    setup.assert_drained("closing-b").await;
    let again = consumer
        .close(Duration::from_secs(5))
        .await
        .expect("closed");
    assert_eq!(again, ConsumerCloseReport::default());
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
}
