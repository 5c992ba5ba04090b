//! The broker's rules for Shared and Key_Shared subscriptions with several consumers, driven
//! with raw frames (no client logic in between): where replays go, whose count an ack or a
//! request changes, and when the dispatcher reads. Each test names the 4.0.8 source or the
//! observation on a real 4.0.8 broker it follows.

use super::*;
use crate::ConsumerStats;

/// Consumer `consumer_id` of subscription `s` of `topic`.
fn consumer(emulator: &Emulator, topic: &str, consumer_id: u64) -> ConsumerStats {
    emulator
        .stats()
        .subscription(topic, "s")
        .and_then(|s| s.consumers.iter().find(|c| c.consumer_id == consumer_id))
        .cloned()
        .unwrap_or_else(|| panic!("consumer {consumer_id} of {topic}"))
}

/// (unacked, blocked, entries in pendingAcks) of a consumer.
fn accounting(emulator: &Emulator, topic: &str, consumer_id: u64) -> (i64, bool, usize) {
    let c = consumer(emulator, topic, consumer_id);
    (c.unacked, c.blocked, c.pending_acks)
}

impl Client {
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES from `consumer_id`, with `ids` (none: all).
    async fn redeliver(&mut self, consumer_id: u64, ids: Vec<MessageIdData>) {
        let mut c = cmd(Type::RedeliverUnacknowledgedMessages);
        c.redeliver_unacknowledged_messages = Some(CommandRedeliverUnacknowledgedMessages {
            consumer_id,
            message_ids: ids,
            ..Default::default()
        });
        self.send(Frame::command(c)).await;
    }

    /// A Key_Shared subscription (AUTO_SPLIT, no `KeySharedMeta`).
    async fn subscribe_key_shared(&mut self, topic: &str, consumer_id: u64) -> BaseCommand {
        self.subscribe(topic, "s", SubType::KeyShared, consumer_id)
            .await
    }
}

/// (consumer, entry, redelivery count, ack set) of a MESSAGE.
fn delivery(message: &Frame) -> (u64, u64, u32, Vec<i64>) {
    let m = message.command.message.as_ref().expect("a MESSAGE");
    (
        m.consumer_id,
        m.message_id.entry_id,
        m.redelivery_count.unwrap_or(0),
        m.ack_set.clone(),
    )
}

/// Fact 1 of issue 27, seen on a real 4.0.8 broker (batch-index acks enabled): A holds a
/// batch of 10, acknowledges index 0 in a transaction and aborts it. The abort
/// (`PendingAckHandleImpl.internalAbortTxn` → `redeliverUnacknowledgedMessages(consumer,
/// positions)`) puts the entry in the dispatcher's replay set; the replay goes to the
/// consumer whose turn it is, B, with all 10 indexes and redelivery count 1; A keeps the
/// entry in its `pendingAcks` and its count of 9 (the transactional ack took 1 off at ack
/// time; the abort gives nothing back). The broker showed A 9 and B 10 in 3 of 3 rounds.
#[tokio::test]
async fn an_abort_replays_the_batch_to_another_consumer_while_the_holder_keeps_counting_it() {
    let emulator = emulator(EmulatorConfig::default().batch_index_ack(true)).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("abort", 1).await;
    client.subscribe("abort", "s", SubType::Shared, 1).await;
    client.subscribe("abort", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    client.flow(2, 100).await;
    client.send_batch(1, 0, 10, None).await;
    let first = client.sync().await;
    assert_eq!(first.len(), 1);
    assert_eq!(delivery(&first[0]), (1, 0, 0, vec![]), "A's turn");

    let txn = client.new_txn(0).await;
    let index_0 = MessageIdData {
        ack_set: vec![0b11_1111_1110],
        batch_size: Some(10),
        ..entry_of(&first[0])
    };
    let error = client
        .ack(1, AckType::Individual, vec![index_0], Some(txn), true)
        .await;
    assert_eq!(error, None);
    assert_eq!(accounting(&emulator, "abort", 1), (9, false, 1));
    assert_eq!(client.end_txn(txn, TxnAction::Abort).await, None);
    let replayed = client.sync().await;
    assert_eq!(replayed.len(), 1, "{replayed:?}");
    assert_eq!(
        delivery(&replayed[0]),
        (2, 0, 1, vec![]),
        "B gets every index again"
    );
    assert_eq!(accounting(&emulator, "abort", 1), (9, false, 1));
    assert_eq!(accounting(&emulator, "abort", 2), (10, false, 1));

    // B acknowledges the whole entry: its own `pendingAcks` first, so B's count goes to 0.
    // The cursor deletes the entry and the next read drops it from A's `pendingAcks`
    // (`readMoreEntries` → `removeAllUpTo(markDeletePosition)`, no decrement in 4.0.8): A's
    // 9 stay, and A's own ack of the entry later finds no owner and takes nothing off.
    let whole = entry_of(&first[0]);
    let error = client
        .ack(2, AckType::Individual, vec![whole.clone()], None, true)
        .await;
    assert_eq!(error, None);
    assert_eq!(accounting(&emulator, "abort", 2), (0, false, 0));
    assert_eq!(accounting(&emulator, "abort", 1), (9, false, 0));
    let error = client
        .ack(1, AckType::Individual, vec![whole], None, true)
        .await;
    assert_eq!(error, None);
    assert_eq!(accounting(&emulator, "abort", 1), (9, false, 0));
    assert_eq!(
        emulator.stats().subscription("abort", "s").unwrap().backlog,
        0
    );
}

/// Fact 2 of issue 27: REDELIVER_UNACKNOWLEDGED_MESSAGES without ids from A clears A's count
/// and `pendingAcks` (`Consumer.redeliverUnacknowledgedMessages(epoch)`) and the dispatcher
/// replays the entries to any consumer: here B, whose turn it is, in one batch.
#[tokio::test]
async fn a_request_without_ids_replays_what_the_consumer_holds_to_another_consumer() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("all", 1).await;
    client.subscribe("all", "s", SubType::Shared, 1).await;
    client.subscribe("all", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    for sequence in 0..3 {
        client.send_batch(1, sequence, 1, None).await;
    }
    assert_eq!(client.sync().await.len(), 3);
    assert_eq!(accounting(&emulator, "all", 1), (3, false, 3));
    client.flow(2, 100).await;
    assert!(client.sync().await.is_empty());

    client.redeliver(1, Vec::new()).await;
    let replayed: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(
        replayed,
        [(2, 0, 1, vec![]), (2, 1, 1, vec![]), (2, 2, 1, vec![])]
    );
    assert_eq!(accounting(&emulator, "all", 1), (0, false, 0));
    assert_eq!(accounting(&emulator, "all", 2), (3, false, 3));
    let a = consumer(&emulator, "all", 1);
    assert_eq!((a.redeliver_all_commands, a.redeliver_ids_commands), (1, 0));
    let sub = emulator.stats().subscription("all", "s").cloned().unwrap();
    assert_eq!(
        (sub.redeliver_all_commands, sub.redeliver_ids_commands),
        (1, 0)
    );
}

/// `Consumer.redeliverUnacknowledgedMessages(List)`: only the named entries that are in the
/// sender's own `pendingAcks` are taken off its count and replayed; an entry another
/// consumer holds is passed over (its holder keeps it and its count).
#[tokio::test]
async fn a_request_with_ids_touches_only_the_senders_pending_acks() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("ids", 1).await;
    client.subscribe("ids", "s", SubType::Shared, 1).await;
    client.subscribe("ids", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    client.flow(2, 100).await;
    client.send_batch(1, 0, 1, None).await;
    client.send_batch(1, 1, 1, None).await;
    let sent: Vec<_> = client.sync().await;
    let owners: Vec<_> = sent.iter().map(|m| delivery(m).0).collect();
    assert_eq!(owners, [1, 2]);

    // A names B's entry: nothing moves, and A, which was not blocked, is served as before.
    client.redeliver(1, vec![entry_of(&sent[1])]).await;
    assert!(client.sync().await.is_empty());
    assert_eq!(accounting(&emulator, "ids", 1), (1, false, 1));
    assert_eq!(accounting(&emulator, "ids", 2), (1, false, 1));
    assert!(!consumer(&emulator, "ids", 1).idle);
    // A names its own entry: it leaves A and is replayed (A's turn again: 1, 2, then 1).
    client.redeliver(1, vec![entry_of(&sent[0])]).await;
    let replayed: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(replayed, [(1, 0, 1, vec![])]);
    assert_eq!(accounting(&emulator, "ids", 2), (1, false, 1));
    let a = consumer(&emulator, "ids", 1);
    assert_eq!((a.redeliver_all_commands, a.redeliver_ids_commands), (0, 2));
}

/// Fact 3 of issue 27, seen on a real 4.0.8 broker: a blocked consumer (limit 20, 20
/// unacked, 40 more in the backlog) sends REDELIVER_UNACKNOWLEDGED_MESSAGES with one id in
/// no consumer's `pendingAcks`: it is unblocked, its count stays 20, nothing is replayed,
/// and nothing new is dispatched: the request adds nothing to the replay set and no permits
/// came while it was blocked, so the dispatcher does not read. A FLOW does not help (at 20
/// `flowPermits` blocks it again); a publish makes the dispatcher read, and the consumer takes
/// one entry (`getMaxEntriesInThisBatch`: at least one) and is blocked again.
#[tokio::test]
async fn a_request_naming_nothing_of_its_own_unblocks_without_a_read() {
    let emulator = emulator(EmulatorConfig::default()).await;
    emulator.set_max_unacked_messages("poke", 20).unwrap();
    let mut client = Client::connect(&emulator).await;
    client.producer("poke", 1).await;
    client.subscribe("poke", "s", SubType::Shared, 1).await;
    client.flow(1, 1000).await;
    for sequence in 0..60 {
        client.send_batch(1, sequence, 1, None).await;
    }
    assert_eq!(client.sync().await.len(), 20);
    assert_eq!(accounting(&emulator, "poke", 1), (20, true, 20));

    let unknown = MessageIdData {
        ledger_id: u64::MAX,
        entry_id: u64::MAX,
        ..MessageIdData::default()
    };
    client.redeliver(1, vec![unknown.clone()]).await;
    assert!(client.sync().await.is_empty(), "no replay and no read");
    assert_eq!(accounting(&emulator, "poke", 1), (20, false, 20));
    assert!(consumer(&emulator, "poke", 1).idle);
    // An ack of nothing makes no read either.
    client
        .ack(1, AckType::Individual, vec![unknown], None, true)
        .await;
    assert!(client.sync().await.is_empty(), "still no read");
    // A FLOW at the limit blocks the consumer again.
    client.flow(1, 1).await;
    assert!(client.sync().await.is_empty());
    assert_eq!(accounting(&emulator, "poke", 1), (20, true, 20));

    // Without ids the request replays everything it holds, and the dispatcher reads at once.
    client.redeliver(1, vec![]).await;
    let replayed = client.sync().await;
    assert_eq!(
        replayed.len(),
        20,
        "without ids: everything replayed, read at once"
    );
    assert_eq!(accounting(&emulator, "poke", 1), (20, true, 20));
}

/// After the request above, a publish makes the dispatcher read: the consumer takes one
/// entry and is blocked again.
#[tokio::test]
async fn after_such_a_request_a_publish_makes_the_dispatcher_read() {
    let emulator = emulator(EmulatorConfig::default()).await;
    emulator.set_max_unacked_messages("poke1", 20).unwrap();
    let mut client = Client::connect(&emulator).await;
    client.producer("poke1", 1).await;
    client.subscribe("poke1", "s", SubType::Shared, 1).await;
    client.flow(1, 1000).await;
    for sequence in 0..60 {
        client.send_batch(1, sequence, 1, None).await;
    }
    assert_eq!(client.sync().await.len(), 20);
    let unknown = MessageIdData {
        ledger_id: u64::MAX,
        entry_id: u64::MAX,
        ..MessageIdData::default()
    };
    client.redeliver(1, vec![unknown]).await;
    assert!(client.sync().await.is_empty());
    client.send_batch(1, 60, 1, None).await;
    let after: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(after, [(1, 20, 0, vec![])], "the next entry of the backlog");
    assert_eq!(accounting(&emulator, "poke1", 1), (21, true, 21));
}

/// The same request when permits came while the consumer was blocked
/// (`permitsReceivedWhileConsumerBlocked > 0`): the request hands them to the dispatcher,
/// which reads, so the consumer is served at once.
#[tokio::test]
async fn a_request_naming_nothing_reads_when_permits_came_while_blocked() {
    let emulator = emulator(EmulatorConfig::default()).await;
    emulator.set_max_unacked_messages("poke2", 20).unwrap();
    let mut client = Client::connect(&emulator).await;
    client.producer("poke2", 1).await;
    client.subscribe("poke2", "s", SubType::Shared, 1).await;
    client.flow(1, 20).await;
    for sequence in 0..60 {
        client.send_batch(1, sequence, 1, None).await;
    }
    assert_eq!(client.sync().await.len(), 20);
    client.flow(1, 20).await;
    assert!(client.sync().await.is_empty(), "blocked");
    let unknown = MessageIdData {
        ledger_id: u64::MAX,
        entry_id: u64::MAX,
        ..MessageIdData::default()
    };
    client.redeliver(1, vec![unknown]).await;
    assert_eq!(client.sync().await.len(), 1);
    assert_eq!(accounting(&emulator, "poke2", 1), (21, true, 21));
}

/// `getAckOwnerConsumerAndBatchSize`: an ack sent through B of an entry in A's
/// `pendingAcks` takes it off A's count.
#[tokio::test]
async fn an_ack_through_another_consumer_counts_for_the_holder() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("owner", 1).await;
    client.subscribe("owner", "s", SubType::Shared, 1).await;
    client.subscribe("owner", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    client.send_batch(1, 0, 4, None).await;
    let held = client.sync().await;
    assert_eq!(accounting(&emulator, "owner", 1), (4, false, 1));
    let error = client
        .ack(2, AckType::Individual, vec![entry_of(&held[0])], None, true)
        .await;
    assert_eq!(error, None);
    assert_eq!(accounting(&emulator, "owner", 1), (0, false, 0));
    assert_eq!(accounting(&emulator, "owner", 2), (0, false, 0));
    assert_eq!(consumer(&emulator, "owner", 2).acked_messages, 4);
}

/// `PersistentDispatcherMultipleConsumers.removeConsumer`: a consumer closing with pending
/// acks hands them to the replay set (without counting a redelivery) and the others get
/// them.
#[tokio::test]
async fn a_consumer_closing_hands_its_pending_acks_to_the_others_uncounted() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("gone", 1).await;
    client.subscribe("gone", "s", SubType::Shared, 1).await;
    client.subscribe("gone", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    client.send_batch(1, 0, 1, None).await;
    client.send_batch(1, 1, 2, None).await;
    assert_eq!(client.sync().await.len(), 2);
    client.flow(2, 100).await;
    let mut close = cmd(Type::CloseConsumer);
    close.close_consumer = Some(CommandCloseConsumer {
        consumer_id: 1,
        request_id: client.id(),
        ..Default::default()
    });
    client.request(close).await;
    let replayed: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(replayed, [(2, 0, 0, vec![]), (2, 1, 0, vec![])]);
    assert_eq!(accounting(&emulator, "gone", 2), (3, false, 2));
}

/// Key_Shared keeps key affinity for replays (`PersistentStickyKeyDispatcherMultipleConsumers`
/// sends a replayed entry to the consumer of its sticky key's hash): a redelivery request
/// replays the entries to the same consumer, never to the other.
#[tokio::test]
async fn key_shared_replays_go_to_the_keys_consumer() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("keys", 1).await;
    client.subscribe_key_shared("keys", 1).await;
    client.subscribe_key_shared("keys", 2).await;
    client.flow(1, 100).await;
    client.flow(2, 100).await;
    for sequence in 0..3 {
        client.send_batch(1, sequence, 1, None).await;
    }
    let first: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(first.len(), 3);
    let owner = first[0].0;
    assert!(first.iter().all(|d| d.0 == owner), "one key, one consumer");
    client.redeliver(owner, Vec::new()).await;
    let replayed: Vec<_> = client.sync().await.iter().map(delivery).collect();
    assert_eq!(
        replayed,
        [
            (owner, 0, 1, vec![]),
            (owner, 1, 1, vec![]),
            (owner, 2, 1, vec![])
        ]
    );
}

/// The round robin hands a consumer a run of entries in one `sendMessages` call
/// (`getMaxEntriesInThisBatch`, at most 20), then moves on: 50 entries replayed in one read
/// go 20, 20, 10 to B, A, B (B's turn first).
#[tokio::test]
async fn a_read_is_handed_out_in_runs_of_up_to_twenty_entries() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("runs", 1).await;
    client.subscribe("runs", "s", SubType::Shared, 1).await;
    client.subscribe("runs", "s", SubType::Shared, 2).await;
    client.flow(1, 1000).await;
    for sequence in 0..50 {
        client.send_batch(1, sequence, 1, None).await;
    }
    assert_eq!(client.sync().await.len(), 50);
    client.flow(2, 1000).await;
    client.redeliver(1, Vec::new()).await;
    let replayed: Vec<u64> = client.sync().await.iter().map(|m| delivery(m).0).collect();
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for consumer in replayed {
        match runs.last_mut() {
            Some((last, n)) if *last == consumer => *n += 1,
            _ => runs.push((consumer, 1)),
        }
    }
    assert_eq!(runs, [(2, 20), (1, 20), (2, 10)]);
}

/// The transactional pending acks belong to the subscription (`PendingAckHandleImpl`), not
/// to a consumer: a batch acknowledged in one transaction partly through a consumer that
/// closed and partly through the one that got the rest is wholly acknowledged at commit. (The
/// emulator kept them per consumer before, and left such an entry undeleted.)
#[tokio::test]
async fn one_transaction_acknowledges_a_batch_through_two_consumers() {
    let emulator = emulator(EmulatorConfig::default().batch_index_ack(true)).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("split", 1).await;
    client.subscribe("split", "s", SubType::Shared, 1).await;
    client.subscribe("split", "s", SubType::Shared, 2).await;
    client.flow(1, 100).await;
    client.send_batch(1, 0, 4, None).await;
    let first = client.sync().await;
    assert_eq!(delivery(&first[0]).0, 1);
    let txn = client.new_txn(0).await;
    // Indexes 0 and 1 through A (set bits: still outstanding).
    for word in [0b1110, 0b1101] {
        let id = MessageIdData {
            ack_set: vec![word],
            batch_size: Some(4),
            ..entry_of(&first[0])
        };
        let error = client
            .ack(1, AckType::Individual, vec![id], Some(txn), true)
            .await;
        assert_eq!(error, None);
    }
    client.flow(2, 100).await;
    let mut close = cmd(Type::CloseConsumer);
    close.close_consumer = Some(CommandCloseConsumer {
        consumer_id: 1,
        request_id: client.id(),
        ..Default::default()
    });
    client.request(close).await;
    let replayed = client.sync().await;
    assert_eq!(
        delivery(&replayed[0]),
        (2, 0, 0, vec![0b1100]),
        "B gets indexes 2 and 3 only"
    );
    for word in [0b1011, 0b0111] {
        let id = MessageIdData {
            ack_set: vec![word],
            batch_size: Some(4),
            ..entry_of(&replayed[0])
        };
        let error = client
            .ack(2, AckType::Individual, vec![id], Some(txn), true)
            .await;
        assert_eq!(error, None);
    }
    assert_eq!(accounting(&emulator, "split", 2), (0, false, 0));
    assert_eq!(client.end_txn(txn, TxnAction::Commit).await, None);
    let sub = emulator
        .stats()
        .subscription("split", "s")
        .cloned()
        .unwrap();
    assert_eq!((sub.backlog, sub.backlog_entries), (0, 0));
}
