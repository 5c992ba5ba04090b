//! Faults: a lost connection fails what waits on it (a producer registers again and sends
//! again instead); corrupted messages are reported.

use std::time::{Duration, Instant};

use pulsar_wire::{Consumer, ConsumerOptions, Error, MessageId, OutgoingMessage, Producer};
use pulsar_wire_emulator::{EmulatorConfig, Faults};

use crate::support::{PATIENCE, Setup, assert_quiet, producer_options, receive, send_all, within};

#[tokio::test]
async fn connection_loss_fails_pending_requests_and_producers_and_consumers_come_back() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("lossy", ConsumerOptions::default()).await;
    let producer = setup.producer("lossy", 0).await;
    let coordinator = setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator");
    // Every answer is held back for longer than the test waits.
    setup
        .emulator
        .set_faults(Faults::none().response_delay(Duration::from_secs(60)));
    let send = tokio::spawn({
        let producer = producer.clone();
        async move { producer.send(OutgoingMessage::new("stuck")).await }
    });
    let txn = tokio::spawn({
        let coordinator = coordinator.clone();
        async move { coordinator.new_transaction(Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !send.is_finished() && !txn.is_finished(),
        "the answers are delayed"
    );
    let started = Instant::now();
    assert!(setup.emulator.disconnect_all() > 0);
    setup.emulator.set_faults(Faults::none());
    // The producer registers again and sends the message again: the send succeeds.
    let send = within(Duration::from_secs(5), send)
        .await
        .expect("the send does not hang")
        .expect("joined");
    assert!(send.is_ok(), "{send:?}");
    assert_eq!(producer.reconnects(), 1);
    assert!(producer.is_connected());
    let txn = within(Duration::from_secs(5), txn)
        .await
        .expect("NEW_TXN does not hang")
        .expect("joined");
    // NEW_TXN lost with its connection is asked again on a new one (a transaction opened by
    // the lost request, if any, times out on the coordinator).
    assert!(txn.is_ok(), "{txn:?}");
    // The consumer subscribes again and gets the message sent again.
    let received = within(Duration::from_secs(5), consumer.receive())
        .await
        .expect("receive does not hang")
        .expect("the message");
    assert_eq!(received.payload().as_ref(), b"stuck");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(consumer.stats().reconnects, 1);
    assert!(producer.send(OutgoingMessage::new("late")).await.is_ok());
}

/// A broker that drops every connection as soon as it is used: the consumer hands over what
/// it had queued, then `receive` waits (no error, no spin); sends wait within their timeout
/// and fail with `Timeout`; the client asks again with backoff, not in a tight loop.
#[tokio::test]
async fn a_broker_that_drops_every_connection_costs_waits_not_errors_or_a_tight_loop() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("dropped", ConsumerOptions::default()).await;
    let producer = Producer::builder(&setup.client, "dropped")
        .options(producer_options(5).send_timeout(Duration::from_millis(500)))
        .build()
        .await
        .expect("producer created");
    send_all(&producer, 10).await;
    receive(&consumer, 1).await;
    setup
        .emulator
        .set_faults(Faults::none().drop_after_frames(Some(3)));
    let started = Instant::now();
    let sent = producer.send(OutgoingMessage::new("more")).await;
    assert!(matches!(sent, Err(Error::Timeout { .. })), "{sent:?}");
    // The timeout names the broker it lost and why (before: "SEND timed out after 500ms").
    let text = sent.expect_err("timed out").to_string();
    let broker = setup.emulator.endpoint().trim_start_matches("pulsar://");
    assert!(text.contains(broker), "{text}");
    assert!(text.contains("registering again"), "{text}");
    assert!(!producer.is_connected());
    // What was queued is handed over, then nothing.
    for _ in 1..10 {
        within(Duration::from_secs(1), consumer.receive())
            .await
            .expect("a queued message")
            .expect("received");
    }
    assert_quiet(&consumer, Duration::from_secs(2)).await;
    let dropped = setup.stats().faults.dropped_connections;
    // Backoff from 100 ms doubling: a handful of attempts per party in about 3 s.
    assert!(
        dropped <= 20,
        "{dropped} connections in {:?}",
        started.elapsed()
    );
    // Once the broker behaves, both come back by themselves.
    setup.emulator.set_faults(Faults::none());
    let deadline = Instant::now() + PATIENCE;
    while !producer.is_connected() || consumer.stats().reconnects == 0 {
        assert!(
            Instant::now() < deadline,
            "not back: {:?}",
            consumer.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    producer
        .send(OutgoingMessage::new("back"))
        .await
        .expect("sent once back");
    let mut payloads = Vec::new();
    while !payloads.iter().any(|p| p == "back") {
        let message = within(PATIENCE, consumer.receive())
            .await
            .expect("a delivery once back")
            .expect("received");
        payloads.push(String::from_utf8_lossy(message.payload()).into_owned());
    }
}

/// The next delivery, which must be an undecodable entry: its id and redelivery count.
async fn undecodable(consumer: &Consumer) -> (MessageId, u32) {
    match within(PATIENCE, consumer.receive()).await {
        Some(Err(Error::Undecodable {
            id,
            redelivery_count,
            reason,
        })) => {
            assert!(reason.contains("checksum"), "{reason}");
            assert_eq!((id.batch_index(), id.batch_size()), (-1, None), "{id}");
            (id, redelivery_count)
        }
        other => panic!(
            "expected an undecodable entry, got {:?}",
            other.map(|r| r.map(|m| m.id()))
        ),
    }
}

/// Regression: entries with a bad checksum used to be acknowledged with a validation error
/// and never reach the application (data loss). They now reach it as errors with their ids,
/// stay in the backlog (a redelivery brings them again), and go only when acked by id.
#[tokio::test]
async fn corrupted_entries_reach_the_application_as_errors_and_are_not_acknowledged() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("corrupt", 3).await;
    send_all(&producer, 6).await;
    setup.emulator.set_faults(Faults::none().corrupt_rate(1.0));
    let consumer = setup.shared("corrupt", ConsumerOptions::default()).await;
    let (first, count) = undecodable(&consumer).await;
    assert_eq!(count, 0);
    let (second, _) = undecodable(&consumer).await;
    assert_ne!(first, second);
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    let stats = consumer.stats();
    assert_eq!(stats.checksum_mismatches, 2, "{stats:?}");
    assert_eq!(stats.undecodable, 2);
    assert_eq!(stats.ack_frames, 0, "{stats:?}");
    let emulator = setup.stats();
    let validation_errors: u64 = emulator.consumers().map(|c| c.validation_errors).sum();
    assert_eq!(validation_errors, 0, "nothing was acknowledged");
    assert_eq!(emulator.backlog("corrupt"), 6, "the backlog keeps them");
    // A nack brings the entry again, its redelivery count grown; still corrupt in transit.
    consumer.nack_id(&first).expect("nacked");
    let (again, count) = undecodable(&consumer).await;
    assert_eq!((again, count), (first, 1));
    // Acked by id, it is gone; the other, nacked once the corruption stopped, arrives intact.
    consumer.ack_id(&first).await.expect("ack queued");
    consumer.flush_acks().await;
    setup.emulator.set_faults(Faults::none());
    consumer.nack_id(&second).expect("nacked");
    let messages = receive(&consumer, 3).await;
    for message in &messages {
        assert_eq!(message.id().entry_id(), second.entry_id());
        assert_eq!(message.redelivery_count(), 1);
        consumer.ack(message).await.expect("ack queued");
    }
    // Clean messages afterwards are delivered as usual.
    send_all(&producer, 3).await;
    for message in receive(&consumer, 3).await {
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("corrupt").await;
    assert_eq!(consumer.stats().undecodable, 3);
}

/// An undecodable entry the application neither acks nor nacks goes to the next consumer
/// when its consumer closes.
#[tokio::test]
async fn an_undecodable_entry_left_alone_goes_to_the_next_consumer() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("corrupt-left", 0).await;
    send_all(&producer, 1).await;
    setup.emulator.set_faults(Faults::none().corrupt_rate(1.0));
    let consumer = setup
        .shared("corrupt-left", ConsumerOptions::default())
        .await;
    let (id, _) = undecodable(&consumer).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let next = setup
        .shared("corrupt-left", ConsumerOptions::default().name("next"))
        .await;
    let (again, _) = undecodable(&next).await;
    assert_eq!(again, id);
    next.ack_id(&again).await.expect("ack queued");
    next.flush_acks().await;
    setup.assert_drained("corrupt-left").await;
}

/// A producer whose connection drops while its sends are in flight registers again and
/// sends what has no receipt, in order: every send succeeds, and a consumer that subscribes
/// afterwards finds every payload, in the order sent (copies of an entry persisted before
/// its receipt was lost may follow it; the emulator does not deduplicate).
#[tokio::test]
async fn a_producer_survives_its_connection_dropping_mid_stream() {
    for per_batch in [0, 7] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("survivor-{per_batch}");
        let producer = setup.producer(&topic, per_batch).await;
        let mut sends = Vec::new();
        for i in 0..300 {
            sends.push(tokio::spawn({
                let producer = producer.clone();
                async move { producer.send(OutgoingMessage::new(format!("m{i}"))).await }
            }));
            if i % 60 == 59 {
                tokio::task::yield_now().await;
                assert!(setup.emulator.disconnect_all() > 0);
                let deadline = Instant::now() + PATIENCE;
                while producer.reconnects() < (i as u64 + 1) / 60 || !producer.is_connected() {
                    assert!(Instant::now() < deadline, "the producer did not reconnect");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        for (i, send) in sends.into_iter().enumerate() {
            let sent = within(PATIENCE, send)
                .await
                .unwrap_or_else(|| panic!("send {i} hung"))
                .expect("joined");
            assert!(sent.is_ok(), "send {i}: {sent:?}");
        }
        assert!(producer.reconnects() >= 5, "{}", producer.reconnects());
        assert!(producer.is_connected());
        let consumer = setup.shared(&topic, ConsumerOptions::default()).await;
        let mut next = 0;
        while next < 300 {
            let message = within(PATIENCE, consumer.receive())
                .await
                .unwrap_or_else(|| panic!("m{next} did not arrive"))
                .expect("received");
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            let index: usize = payload[1..].parse().expect("a payload of ours");
            assert!(index <= next, "m{index} arrived before m{next}");
            if index == next {
                next += 1;
            }
            consumer.ack(&message).await.expect("acked");
        }
    }
}

/// A producer and a Shared consumer running while every connection drops five times: both
/// come back by themselves, every payload is received, and once everything is acknowledged
/// nothing is left unacknowledged or in the backlog (acks lost with a connection are sent
/// again when their messages come back).
#[tokio::test]
async fn a_consumer_survives_its_connection_dropping_mid_stream() {
    for per_batch in [0, 7] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("survivors-{per_batch}");
        let consumer = std::sync::Arc::new(setup.shared(&topic, ConsumerOptions::default()).await);
        let producer = setup.producer(&topic, per_batch).await;
        let receiving = tokio::spawn({
            let consumer = std::sync::Arc::clone(&consumer);
            async move {
                let mut seen = std::collections::HashSet::new();
                let mut copies = 0;
                while seen.len() < 300 {
                    let message = within(PATIENCE, consumer.receive())
                        .await
                        .unwrap_or_else(|| panic!("stuck at {} of 300", seen.len()))
                        .expect("received");
                    if !seen.insert(String::from_utf8_lossy(message.payload()).into_owned()) {
                        copies += 1;
                    }
                    consumer.ack(&message).await.expect("acked");
                }
                copies
            }
        });
        for round in 0..5u64 {
            let sends = (0..60).map(|i| {
                let producer = producer.clone();
                tokio::spawn(async move {
                    producer
                        .send(OutgoingMessage::new(format!("m{}", round * 60 + i)))
                        .await
                })
            });
            let sends: Vec<_> = sends.collect();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(setup.emulator.disconnect_all() > 0);
            for send in sends {
                let sent = within(PATIENCE, send).await.expect("a send hung");
                assert!(sent.expect("joined").is_ok());
            }
            let deadline = Instant::now() + PATIENCE;
            while consumer.stats().reconnects <= round || producer.reconnects() <= round {
                assert!(Instant::now() < deadline, "no reconnection");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let copies = within(PATIENCE, receiving)
            .await
            .expect("every payload arrives")
            .expect("joined");
        consumer.flush_acks().await;
        setup.assert_drained(&topic).await;
        let stats = consumer.stats();
        println!("batches of {per_batch}: {copies} copies, {stats:?}");
    }
}
