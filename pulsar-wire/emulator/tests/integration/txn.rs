//! Transactions: acks that keep the batch size drain; the legacy ack stalls.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use pulsar_wire::ServerError;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::{
    Consumer, ConsumerOptions, Error, Message, OutgoingMessage, Transaction, TxnState,
};
use pulsar_wire_emulator::{EmulatorConfig, Faults};

use crate::support::{PATIENCE, Setup, assert_quiet, receive, send_all, within};

const TXN_TIMEOUT: Duration = Duration::from_secs(60);

async fn new_txn(setup: &Setup) -> Transaction {
    setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator")
        .new_transaction(TXN_TIMEOUT)
        .await
        .expect("transaction")
}

/// What Go v0.21.0 sends for a completed batch in a transaction: one whole-entry ack
/// without `batch_size`. Test-only; the library never sends this.
async fn legacy_txn_ack(consumer: &Consumer, txn: &Transaction, message: &Message) {
    pulsar_wire_emulator::legacy::txn_ack_without_batch_size(consumer, txn, message)
        .await
        .expect("the broker accepts the legacy ack");
}

async fn limited(setup: &Setup, topic: &str) -> Consumer {
    setup.emulator.create_topic(topic, 0).expect("created");
    setup
        .emulator
        .set_max_unacked_messages(topic, 20)
        .expect("limit set");
    setup.shared(topic, ConsumerOptions::default()).await
}

/// Produces a batch of 3, receives it, acknowledges it in its own transaction (with
/// `ack` for each batch) and commits; returns the number of batches that arrived before
/// dispatch stopped, or `batches` when all did.
async fn batch_by_batch<A, F>(setup: &Setup, topic: &str, batches: usize, ack: A) -> usize
where
    A: Fn(Consumer, Transaction, Vec<Message>) -> F,
    F: std::future::Future<Output = Consumer>,
{
    let mut consumer = limited(setup, topic).await;
    let producer = setup.producer(topic, 3).await;
    for batch in 0..batches {
        send_all(&producer, 3).await;
        let Some(first) = within(Duration::from_millis(500), consumer.receive()).await else {
            return batch;
        };
        let mut messages = vec![first.expect("received")];
        messages.extend(receive(&consumer, 2).await);
        let txn = new_txn(setup).await;
        consumer = ack(consumer, txn.clone(), messages).await;
        txn.commit().await.expect("committed");
        assert_eq!(txn.state(), TxnState::Committed);
    }
    batches
}

#[tokio::test]
async fn each_batch_acked_in_its_own_transaction_drains_under_the_limit() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let arrived = batch_by_batch(
        &setup,
        "stall-fixed",
        30,
        |consumer, txn, batch| async move {
            for message in &batch {
                consumer.ack_in(&txn, message).await.expect("acked");
            }
            consumer
        },
    )
    .await;
    assert_eq!(arrived, 30);
    setup.assert_drained("stall-fixed").await;
    setup.assert_never_blocked();
    assert_eq!(setup.stats().transactions.committed, 30);
}

/// The check that is meant to fail: whole-entry transactional acks without `batch_size`
/// (Go v0.21.0) leak 2 per batch of 3 until dispatch stops at batch 11.
#[tokio::test]
async fn legacy_whole_entry_txn_acks_stall_the_consumer() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let arrived = batch_by_batch(
        &setup,
        "stall-legacy",
        30,
        |consumer, txn, batch| async move {
            legacy_txn_ack(&consumer, &txn, &batch[2]).await;
            consumer
        },
    )
    .await;
    let stats = setup.stats();
    let stalled = stats.consumers().next().expect("a consumer");
    assert_eq!(arrived, 10, "batch 11 is never delivered: {stalled:#?}");
    assert!(stalled.blocked, "{stalled:#?}");
    assert_eq!(stalled.unacked, 20, "{stalled:#?}");
}

#[tokio::test]
async fn abort_then_redelivery_then_commit() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("abort", ConsumerOptions::default()).await;
    let producer = setup.producer("abort", 3).await;
    send_all(&producer, 3).await;
    let first = receive(&consumer, 3).await;
    let txn = new_txn(&setup).await;
    for message in &first {
        consumer.ack_in(&txn, message).await.expect("acked");
    }
    txn.abort().await.expect("aborted");
    let again = receive(&consumer, 3).await;
    assert_eq!(
        again.iter().map(Message::id).collect::<Vec<_>>(),
        first.iter().map(Message::id).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|m| m.redelivery_count() >= 1));
    let txn = new_txn(&setup).await;
    for message in &again {
        consumer.ack_in(&txn, message).await.expect("acked again");
    }
    txn.commit().await.expect("committed");
    setup.assert_drained("abort").await;
    assert_quiet(&consumer, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn separate_transactions_ack_messages_of_one_batch() {
    // Per-index acks from separate transactions reach the cursor only with the broker's
    // batch-index acknowledgement (as on a real broker).
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let consumer = setup.shared("split", ConsumerOptions::default()).await;
    let producer = setup.producer("split", 3).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    let mut txns = Vec::new();
    for message in &messages {
        let txn = new_txn(&setup).await;
        consumer.ack_in(&txn, message).await.expect("acked");
        txns.push(txn);
    }
    // Acknowledging a message again, in any transaction, is refused before it reaches the
    // broker (which would answer TransactionConflict).
    assert!(matches!(
        consumer.ack_in(&txns[0], &messages[1]).await,
        Err(Error::Ack(_))
    ));
    for txn in txns.iter().rev() {
        txn.commit().await.expect("committed");
    }
    setup.assert_drained("split").await;
}

#[tokio::test]
async fn a_message_acknowledged_outside_a_transaction_is_refused_in_one() {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let consumer = setup
        .shared("acked-first", ConsumerOptions::default())
        .await;
    let producer = setup.producer("acked-first", 3).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    consumer.ack_and_wait(&messages[0]).await.expect("acked");
    let txn = new_txn(&setup).await;
    let error = consumer
        .ack_in(&txn, &messages[0])
        .await
        .expect_err("refused by the client");
    assert!(
        matches!(error, Error::Ack(txn_ack::Error::AlreadyAcked { .. })),
        "{error}"
    );
    txn.abort().await.expect("aborted");
}

/// Acknowledges `message` outside the client's trackers (a raw `ACK` frame), as another
/// client or an application bypassing this crate would: the broker knows, the client does not.
async fn raw_ack(consumer: &Consumer, message: &Message) {
    use pulsar_wire::wire::{ConnectionExt, ConsumerExt, command_frame};
    let (connection, consumer_id) = consumer.wire_of(message).expect("wire");
    let id = message.id();
    connection
        .request("ACK", |request_id| {
            command_frame(Type::Ack, |c| {
                c.ack = Some(pulsar_wire::pb::CommandAck {
                    consumer_id,
                    ack_type: pulsar_wire::pb::command_ack::AckType::Individual as i32,
                    message_id: vec![pulsar_wire::pb::MessageIdData {
                        ledger_id: id.ledger_id(),
                        entry_id: id.entry_id(),
                        ..Default::default()
                    }],
                    request_id: Some(request_id),
                    ..Default::default()
                });
            })
        })
        .await
        .expect("the raw ack is answered");
}

#[tokio::test]
async fn broker_conflicts_surface_as_server_errors() {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    // A message not in a batch: its transactional ack goes out at once and is refused.
    let consumer = setup.shared("conflict", ConsumerOptions::default()).await;
    let producer = setup.producer("conflict", 0).await;
    send_all(&producer, 1).await;
    let message = receive(&consumer, 1).await.remove(0);
    raw_ack(&consumer, &message).await;
    let txn = new_txn(&setup).await;
    let error = consumer
        .ack_in(&txn, &message)
        .await
        .expect_err("a conflict");
    assert_eq!(error.server_error(), Some(ServerError::TransactionConflict));
    assert!(error.to_string().contains("TransactionConflict"), "{error}");
    txn.abort().await.expect("aborted");
    assert!(matches!(
        consumer.ack_in(&txn, &message).await,
        Err(Error::Invalid { .. })
    ));
}

#[tokio::test]
async fn a_held_back_ack_refused_at_commit_fails_the_commit_and_its_abort_hands_the_message_over_again()
 {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let consumer = setup
        .shared("conflict-late", ConsumerOptions::default())
        .await;
    let producer = setup.producer("conflict-late", 3).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    // The whole entry acknowledged behind the client's back.
    raw_ack(&consumer, &messages[0]).await;
    let txn = new_txn(&setup).await;
    // Its batch has two more messages the application holds: held back, nothing sent yet.
    consumer
        .ack_in(&txn, &messages[0])
        .await
        .expect("held back");
    assert_eq!(consumer.stats().acks_held_back, 1);
    assert_eq!(consumer.stats().txn_acks, 0);
    let error = txn
        .commit()
        .await
        .expect_err("the held-back ack is refused at commit");
    assert!(matches!(error, Error::TransactionFailed { .. }), "{error}");
    assert!(error.to_string().contains("TransactionConflict"), "{error}");
    txn.abort().await.expect("aborted");
    let again = receive(&consumer, 1).await.remove(0);
    assert_eq!(again.id(), messages[0].id());
    assert_eq!(again.redelivery_count(), messages[0].redelivery_count() + 1);
}

#[tokio::test]
async fn transactional_sends_appear_on_commit_only() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("txn-send", ConsumerOptions::default()).await;
    let producer = setup.producer("txn-send", 3).await;
    let aborted = new_txn(&setup).await;
    let sends = (0..3).map(|i| producer.send_in(&aborted, OutgoingMessage::new(format!("x{i}"))));
    for id in futures_util::future::join_all(sends).await {
        assert_eq!(id.expect("sent").batch_size(), Some(3));
    }
    aborted.abort().await.expect("aborted");

    let committed = new_txn(&setup).await;
    let sends = (0..3).map(|i| producer.send_in(&committed, OutgoingMessage::new(format!("y{i}"))));
    for id in futures_util::future::join_all(sends).await {
        id.expect("sent");
    }
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    committed.commit().await.expect("committed");
    let messages = receive(&consumer, 3).await;
    for message in &messages {
        assert!(message.payload().starts_with(b"y"));
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    assert_quiet(&consumer, Duration::from_millis(200)).await;
    setup.assert_drained("txn-send").await;
    let stats = setup.stats();
    assert_eq!(stats.received(Type::AddPartitionToTxn), 2);
    assert_eq!(stats.transactions.aborted, 1);
}

/// A transactional ack the broker refuses says which message, which transaction and what to
/// do; the transaction then refuses to commit, naming that ack, and can still be aborted.
#[tokio::test]
async fn a_refused_txn_ack_names_the_message_and_the_transaction_and_blocks_the_commit() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("refused", ConsumerOptions::default()).await;
    let producer = setup.producer("refused", 0).await;
    send_all(&producer, 2).await;
    let messages = receive(&consumer, 2).await;
    raw_ack(&consumer, &messages[0]).await;
    let txn = new_txn(&setup).await;
    // Acknowledged already, behind the client's back: the broker answers TransactionConflict.
    let refused = consumer
        .ack_in(&txn, &messages[0])
        .await
        .expect_err("the broker refuses a second ack");
    assert_eq!(
        refused.server_error(),
        Some(ServerError::TransactionConflict),
        "{refused}"
    );
    let text = refused.to_string();
    assert!(text.contains(&messages[0].id().to_string()), "{text}");
    assert!(text.contains(&txn.id().to_string()), "{text}");
    assert!(text.contains("abort"), "{text}");
    consumer.ack_in(&txn, &messages[1]).await.expect("acked");
    let commit = txn.commit().await.expect_err("the commit is refused");
    let Error::TransactionFailed { failed, first, .. } = &commit else {
        panic!("{commit:?}");
    };
    assert_eq!(*failed, 1);
    assert!(first.contains(&messages[0].id().to_string()), "{commit}");
    assert_eq!(txn.state(), TxnState::Open);
    txn.abort().await.expect("aborted");
    assert_eq!(setup.stats().transactions.committed, 0);
}

/// Aborts `z` in the background with every answer of the broker delayed 300 ms; returns once
/// the abort is under way (its `END_TXN` waiting for its answer).
async fn abort_slowly(setup: &Setup, z: &Transaction) -> JoinHandle<Result<(), Error>> {
    setup
        .emulator
        .set_faults(Faults::none().response_delay(Duration::from_millis(300)));
    let aborting = tokio::spawn({
        let z = z.clone();
        async move { z.abort().await }
    });
    while z.state() != TxnState::Ending {
        tokio::task::yield_now().await;
    }
    aborting
}

/// Acknowledges `message` in `txn` in the background, and lets the ack run until it waits
/// (the runtime has one thread): for an abort under way on the partition.
async fn ack_until_it_waits(
    consumer: &Arc<Consumer>,
    txn: &Transaction,
    message: &Message,
) -> JoinHandle<Result<(), Error>> {
    let acking = tokio::spawn({
        let (consumer, txn, message) = (Arc::clone(consumer), txn.clone(), message.clone());
        async move { consumer.ack_in(&txn, &message).await }
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    acking
}

/// Where the issue-27 steady shape hung in CI for an hour (a consumer's loop: acks of the next
/// transaction while the previous one aborts in the background). Transaction A holds back its
/// ack of `m0` (the application still holds `m1` of the batch); B's ack of `m1` frees the
/// entry and takes A's ack along, and both wait for the abort of Z, under way on the partition
/// (its answer delayed). Then A aborts: the abort waited for A's ack in flight, the ack waited
/// for the aborts to end, and neither ever did. Now A's ack gives up waiting when A begins to
/// abort: it stays held back and its message comes back when the abort ends; B's ack waits
/// again, its entry no longer free, and goes out with B's commit.
#[tokio::test]
async fn an_abort_does_not_wait_for_its_held_back_ack_waiting_for_another_abort() {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let topic = "parked-behind-an-abort";
    let consumer = Arc::new(setup.shared(topic, ConsumerOptions::default()).await);
    send_all(&setup.producer(topic, 2).await, 2).await;
    let batch = receive(&consumer, 2).await;
    send_all(&setup.producer(topic, 0).await, 1).await;
    let single = receive(&consumer, 1).await.remove(0);

    let z = new_txn(&setup).await;
    consumer
        .ack_in(&z, &single)
        .await
        .expect("sent: its entry is free");
    let a = new_txn(&setup).await;
    consumer.ack_in(&a, &batch[0]).await.expect("held back");
    assert_eq!(consumer.stats().acks_held_back, 1);
    let b = new_txn(&setup).await;
    b.add_subscription(consumer.topic(), "sub")
        .await
        .expect("registered");

    let z_abort = abort_slowly(&setup, &z).await;
    let b_ack = ack_until_it_waits(&consumer, &b, &batch[1]).await;
    within(PATIENCE, a.abort())
        .await
        .expect("the abort of A ends")
        .expect("A aborted");
    z_abort.await.expect("joined").expect("Z aborted");
    within(PATIENCE, b_ack)
        .await
        .expect("B's ack is answered")
        .expect("joined")
        .expect("B's ack is held back again");
    setup.emulator.set_faults(Faults::none());
    b.commit().await.expect("B committed");

    let mut again: Vec<_> = receive(&consumer, 2)
        .await
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    again.sort();
    let mut expected = vec![batch[0].id().to_string(), single.id().to_string()];
    expected.sort();
    assert_eq!(again, expected, "A's and Z's messages, once each");
    assert_quiet(&consumer, Duration::from_millis(300)).await;
}

/// An ack whose own transaction begins to abort while the ack waits for another abort on its
/// partition is not sent and does not hold that abort up: it fails, naming the abort, and its
/// message comes back once.
#[tokio::test]
async fn an_ack_waiting_for_another_abort_gives_way_to_its_own_abort() {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let topic = "own-abort-while-parked";
    let consumer = Arc::new(setup.shared(topic, ConsumerOptions::default()).await);
    send_all(&setup.producer(topic, 0).await, 2).await;
    let messages = receive(&consumer, 2).await;

    let z = new_txn(&setup).await;
    consumer.ack_in(&z, &messages[0]).await.expect("sent");
    let a = new_txn(&setup).await;
    a.add_subscription(consumer.topic(), "sub")
        .await
        .expect("registered");
    let z_abort = abort_slowly(&setup, &z).await;
    let a_ack = ack_until_it_waits(&consumer, &a, &messages[1]).await;
    within(PATIENCE, a.abort())
        .await
        .expect("the abort of A ends")
        .expect("A aborted");
    let error = a_ack
        .await
        .expect("joined")
        .expect_err("A's ack was not sent");
    assert!(error.to_string().contains("began to abort"), "{error}");
    z_abort.await.expect("joined").expect("Z aborted");
    setup.emulator.set_faults(Faults::none());

    let mut again: Vec<_> = receive(&consumer, 2)
        .await
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    again.sort();
    let mut expected: Vec<_> = messages.iter().map(|m| m.id().to_string()).collect();
    expected.sort();
    assert_eq!(again, expected, "Z's and A's messages, once each");
    assert_quiet(&consumer, Duration::from_millis(300)).await;
}
