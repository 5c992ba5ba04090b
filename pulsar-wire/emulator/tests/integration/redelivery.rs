//! Redelivery policies: the negative-ack backoff.

use std::time::Duration;

use pulsar_wire::{Consumer, ConsumerOptions, Error, NackBackoff};
use pulsar_wire_emulator::EmulatorConfig;
use tokio::time::Instant;

use crate::support::{Setup, assert_quiet, receive, send_all};

fn exponential() -> NackBackoff {
    NackBackoff::exponential(Duration::from_secs(1), Duration::from_secs(6), 2.0)
}

/// A message nacked four times comes back after 1, 2, 4 and 6 s (capped), each time with
/// its redelivery count one higher; batched or not.
#[tokio::test(start_paused = true)]
async fn a_nacked_message_comes_back_after_the_backoff_of_its_redelivery_count() {
    for per_batch in [0, 3] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("nack-backoff-{per_batch}");
        let consumer = setup
            .shared(
                &topic,
                ConsumerOptions::default().nack_backoff(exponential()),
            )
            .await;
        send_all(&setup.producer(&topic, per_batch).await, per_batch.max(1)).await;
        let mut messages = receive(&consumer, per_batch.max(1)).await;
        let mut message = messages.remove(0);
        for (n, expected) in [1, 2, 4, 6].into_iter().enumerate() {
            let nacked = Instant::now();
            consumer.nack(&message).expect("nacked");
            message = receive(&consumer, 1).await.remove(0);
            let waited = nacked.elapsed();
            let expected = Duration::from_secs(expected);
            assert!(
                waited >= expected && waited <= expected.mul_f64(1.2),
                "batch {per_batch}, nack {n}: {waited:?} (expected {expected:?})"
            );
            assert_eq!(message.redelivery_count(), n as u32 + 1);
        }
        consumer.ack(&message).await.expect("acked");
        for other in &messages {
            consumer.ack(other).await.expect("acked");
        }
        consumer.flush_acks().await;
        setup.assert_drained(&topic).await;
        assert_quiet(&consumer, Duration::from_secs(10)).await;
    }
}

/// Nacked by id (its count unknown): the minimum.
#[tokio::test(start_paused = true)]
async fn a_message_nacked_by_id_waits_the_minimum() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared(
            "nack-id-backoff",
            ConsumerOptions::default().nack_backoff(exponential()),
        )
        .await;
    send_all(&setup.producer("nack-id-backoff", 0).await, 1).await;
    let first = receive(&consumer, 1).await.remove(0);
    let nacked = Instant::now();
    consumer.nack_id(&first.id()).expect("nacked");
    let again = receive(&consumer, 1).await.remove(0);
    assert_eq!(again.id(), first.id());
    let waited = nacked.elapsed();
    assert!(
        (Duration::from_secs(1)..Duration::from_millis(1_200)).contains(&waited),
        "{waited:?}"
    );
}

#[tokio::test]
async fn impossible_backoffs_are_refused_at_subscribe() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let second = Duration::from_secs(1);
    let backoff = NackBackoff::exponential(second * 2, second, 2.0);
    let error = Consumer::builder(&setup.client, "nack-bad", "sub")
        .nack_backoff(backoff)
        .build()
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "nack_backoff",
                ..
            }
        ),
        "{error}"
    );
}

/// With an ack timeout of 3 s, a message the application holds without acking comes back
/// after 3 s (to the tick), once per timeout, its count one higher; acked, nacked or acked in
/// a transaction messages do not; a bad timeout is refused.
#[tokio::test(start_paused = true)]
async fn an_unacked_message_comes_back_after_the_ack_timeout() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ack-timeout";
    let consumer = setup
        .shared(
            topic,
            ConsumerOptions::default().ack_timeout(Duration::from_secs(3)),
        )
        .await;
    send_all(&setup.producer(topic, 0).await, 3).await;
    let received_at = Instant::now();
    let messages = receive(&consumer, 3).await;
    consumer.ack(&messages[1]).await.expect("acked");
    let txn = setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator")
        .new_transaction(Duration::from_secs(60))
        .await
        .expect("transaction");
    consumer
        .ack_in(&txn, &messages[2])
        .await
        .expect("acked in it");
    txn.commit().await.expect("committed");
    let again = receive(&consumer, 1).await.remove(0);
    let waited = received_at.elapsed();
    assert_eq!(again.id(), messages[0].id());
    assert_eq!(again.redelivery_count(), 1);
    assert!(
        (Duration::from_secs(3)..Duration::from_millis(3_800)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(consumer.stats().ack_timeouts, 1);
    consumer.ack(&again).await.expect("acked");
    consumer.flush_acks().await;
    assert_quiet(&consumer, Duration::from_secs(10)).await;
    setup.assert_drained(topic).await;

    let error = Consumer::builder(&setup.client, topic, "other")
        .ack_timeout(Duration::from_millis(10))
        .build()
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "ack_timeout",
                ..
            }
        ),
        "{error}"
    );
}
