//! Faults: a lost connection fails what waits on it; corrupted messages are reported.

use std::time::{Duration, Instant};

use pulsar_wire::emulator::{EmulatorConfig, Faults};
use pulsar_wire::{ConsumerOptions, Error, OutgoingMessage};

use crate::support::{Setup, assert_quiet, receive, send_all, within};

#[tokio::test]
async fn connection_loss_fails_pending_requests_instead_of_hanging() {
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
    let send = within(Duration::from_secs(5), send)
        .await
        .expect("the send does not hang")
        .expect("joined");
    assert!(
        matches!(send, Err(Error::ConnectionLost { .. })),
        "{send:?}"
    );
    let txn = within(Duration::from_secs(5), txn)
        .await
        .expect("NEW_TXN does not hang")
        .expect("joined");
    assert!(matches!(txn, Err(Error::ConnectionLost { .. })), "{txn:?}");
    let received = within(Duration::from_secs(5), consumer.receive())
        .await
        .expect("receive does not hang");
    assert!(
        matches!(received, Err(Error::ConnectionLost { .. })),
        "{received:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // Later calls on the lost connection fail at once too.
    assert!(producer.send(OutgoingMessage::new("late")).await.is_err());
    assert!(consumer.receive().await.is_err());
}

#[tokio::test]
async fn a_connection_dropped_mid_stream_surfaces_on_every_side() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("dropped", ConsumerOptions::default()).await;
    let producer = setup.producer("dropped", 5).await;
    send_all(&producer, 10).await;
    setup
        .emulator
        .set_faults(Faults::none().drop_after_frames(Some(3)));
    let mut outcome = Ok(());
    for _ in 0..100 {
        match within(Duration::from_secs(5), consumer.receive()).await {
            Some(Ok(message)) => {
                let _ = consumer.ack(&message).await;
            }
            Some(Err(error)) => {
                outcome = Err(error);
                break;
            }
            None => panic!("receive hung after the connection dropped"),
        }
        let _ = producer.send(OutgoingMessage::new("more")).await;
    }
    assert!(
        matches!(outcome, Err(Error::ConnectionLost { .. })),
        "{outcome:?}"
    );
    assert!(setup.stats().faults.dropped_connections > 0);
}

#[tokio::test]
async fn corrupted_messages_are_acknowledged_with_the_validation_error_and_reported() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("corrupt", 3).await;
    send_all(&producer, 6).await;
    setup.emulator.set_faults(Faults::none().corrupt_rate(1.0));
    let consumer = setup.shared("corrupt", ConsumerOptions::default()).await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    let stats = consumer.stats();
    assert_eq!(stats.checksum_mismatches, 2, "{stats:?}");
    assert_eq!(stats.discarded, 2);
    let emulator = setup.stats();
    let validation_errors: u64 = emulator.consumers().map(|c| c.validation_errors).sum();
    assert_eq!(validation_errors, 2);
    // Clean messages afterwards are delivered as usual.
    setup.emulator.set_faults(Faults::none());
    send_all(&producer, 3).await;
    for message in receive(&consumer, 3).await {
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("corrupt").await;
}
