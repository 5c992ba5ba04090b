//! The `pulsar-wire` scenarios against a real broker (`scripts/brokers/pulsar start`: 4.0.x
//! standalone with `acknowledgmentAtBatchIndexLevelEnabled=true` and transactions on).
//!
//! Runs when `PULSAR_SERVICE_URL` and `PULSAR_ADMIN_URL` are set (the script prints both);
//! otherwise every test returns at once.
//!
//! Each test makes its own topic, sets its `maxUnackedMessagesOnConsumer` to 20 through the
//! admin API (and waits until the broker reports it), runs one scenario of the emulator
//! suite (`pulsar-wire/emulator/tests/integration`) with the `pulsar-wire` client, and reads the admin
//! stats: per consumer `unackedMessages` and `blockedConsumerOnUnackedMsgs`, per subscription
//! `msgBacklog` (entries, not messages). Every message must arrive although the limit is far
//! below what is sent, and the counters must be back at 0 at the end, with the consumer still
//! connected.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use broker_tools::pulsar_admin::{PulsarAdmin, SubscriptionStats, TopicStats};
use integration_tests::real_pulsar::{RealPulsar, java_peer, python_peer, var};
use pulsar_wire::wire::ConnectionExt;
use pulsar_wire::{
    BatchingOptions, Client, ClientBuilder, ConnectOptions, Consumer, ConsumerOptions, Error,
    HashRange, InitialPosition, KeySharedPolicy, Message, MessageId, OutgoingMessage, Producer,
    ProducerOptions, SubType, Transaction, TxnState, sticky_key_hash,
};

/// `maxUnackedMessagesOnConsumer` of every test topic.
const LIMIT: u32 = 20;
/// The subscription every test uses.
const SUB: &str = "sub";
/// How long a test waits for something that should happen soon.
const PATIENCE: Duration = Duration::from_secs(15);
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// A client and the admin API of the real broker, and this test's topic.
struct RealBroker {
    client: Client,
    admin: PulsarAdmin,
    topic: String,
    scenario: &'static str,
    started: Instant,
}

/// The broker, with a fresh topic limited to [`LIMIT`] unacked messages per consumer; `None`
/// (the test is skipped) unless both variables are set.
async fn real_broker(scenario: &'static str) -> Option<RealBroker> {
    let RealPulsar {
        client,
        admin,
        topic,
        started,
        ..
    } = RealPulsar::new(scenario, 0).await?;
    admin
        .set_max_unacked_on_consumer(&topic, LIMIT, Duration::from_secs(60))
        .await
        .expect("the per-topic limit is set");
    println!(
        "{scenario}: topic {topic} ready with limit {LIMIT} in {:?}",
        started.elapsed()
    );
    Some(RealBroker {
        client,
        admin,
        topic,
        scenario,
        started,
    })
}

impl RealBroker {
    async fn consumer(&self, options: ConsumerOptions) -> Consumer {
        Consumer::builder(&self.client, &self.topic, SUB)
            .options(options.initial_position(InitialPosition::Earliest))
            .build()
            .await
            .expect("subscribed")
    }

    /// A Shared consumer from the earliest message.
    async fn shared(&self, options: ConsumerOptions) -> Consumer {
        self.consumer(options.sub_type(SubType::Shared)).await
    }

    /// A transactional producer batching `per_batch` messages (0: no batching).
    async fn producer(&self, per_batch: usize) -> Producer {
        let options = if per_batch == 0 {
            ProducerOptions::default().no_batching()
        } else {
            ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(per_batch)
                    .max_delay(Duration::from_millis(50)),
            )
        };
        Producer::builder(&self.client, &self.topic)
            .options(options.transactional(true))
            .build()
            .await
            .expect("producer created")
    }

    async fn new_txn(&self) -> Transaction {
        self.client
            .transaction_coordinator()
            .await
            .expect("the transaction coordinator")
            .new_transaction(TXN_TIMEOUT)
            .await
            .expect("a transaction")
    }

    async fn stats(&self) -> TopicStats {
        self.admin
            .topic_stats(&self.topic)
            .await
            .expect("topic stats")
    }

    /// Polls the subscription's stats until `done` holds; panics with the last stats.
    async fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&SubscriptionStats) -> bool,
    ) -> SubscriptionStats {
        let stats = self
            .admin
            .wait_for_stats(&self.topic, PATIENCE, |stats| {
                stats.subscription(SUB).is_some_and(&done)
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {what}: {e}", self.scenario));
        stats.subscription(SUB).cloned().expect("the subscription")
    }

    /// Waits until the connected consumer has no unacked messages and is not blocked, and
    /// the backlog is empty.
    async fn assert_drained(&self) -> SubscriptionStats {
        self.wait_for("drained with the consumer connected", |s| {
            !s.consumers.is_empty() && s.is_drained()
        })
        .await
    }

    fn done(&self) {
        println!("{}: passed in {:?}", self.scenario, self.started.elapsed());
    }
}

/// The only consumer's stats.
fn only_consumer(stats: &SubscriptionStats) -> &broker_tools::pulsar_admin::ConsumerStats {
    assert_eq!(stats.consumers.len(), 1, "{stats:#?}");
    &stats.consumers[0]
}

/// Sends `count` messages `m0`, `m1`, … concurrently (so that batches fill) and returns
/// their ids in order.
async fn send_all(producer: &Producer, count: usize) -> Vec<MessageId> {
    let sends = (0..count).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, Error>>()
        .expect("every send succeeds")
}

async fn within<F: std::future::Future>(limit: Duration, future: F) -> Option<F::Output> {
    tokio::time::timeout(limit, future).await.ok()
}

/// Receives `count` messages, each within [`PATIENCE`].
async fn receive(consumer: &Consumer, count: usize) -> Vec<Message> {
    let mut messages = Vec::with_capacity(count);
    for i in 0..count {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("message {i} of {count} did not arrive within {PATIENCE:?}"))
            .expect("received");
        messages.push(message);
    }
    messages
}

/// Receives `count` messages and queues the ack of each as it arrives: with a limit of 20,
/// nothing gets through unless the acks do.
async fn receive_and_ack(consumer: &Consumer, count: usize) -> Vec<Message> {
    let mut messages = Vec::with_capacity(count);
    for i in 0..count {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| {
                panic!(
                    "message {i} of {count} did not arrive within {PATIENCE:?} \
                     (delivery stopped)"
                )
            })
            .expect("received");
        consumer.ack(&message).await.expect("ack queued");
        messages.push(message);
    }
    messages
}

/// Receives until nothing arrives for `quiet`.
async fn receive_until_quiet(consumer: &Consumer, quiet: Duration) -> Vec<Message> {
    let mut messages = Vec::new();
    while let Some(message) = within(quiet, consumer.receive()).await {
        messages.push(message.expect("received"));
    }
    messages
}

/// Nothing more arrives within `wait`.
async fn assert_quiet(consumer: &Consumer, wait: Duration) {
    if let Some(message) = within(wait, consumer.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| m.id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_and_unbatched_messages_drain() {
    let Some(broker) = real_broker("mixed").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let batched = broker.producer(3).await;
    let single = broker.producer(0).await;
    let ids = send_all(&batched, 30).await;
    assert!(ids.iter().all(|id| id.batch_size() == Some(3)), "{ids:?}");
    assert_eq!(ids[4].batch_index(), 1);
    let plain = send_all(&single, 10).await;
    assert!(
        plain
            .iter()
            .all(|id| id.batch_size().is_none() && id.batch_index() == -1),
        "{plain:?}"
    );

    // 40 messages through a limit of 20: only the acks let them through.
    let messages = receive_and_ack(&consumer, 40).await;
    let (in_batches, alone): (Vec<_>, Vec<_>) =
        messages.iter().partition(|m| m.position().is_batched());
    assert_eq!((in_batches.len(), alone.len()), (30, 10));
    assert!(in_batches.iter().all(|m| m.position().batch_size() == 3));
    consumer.flush_acks().await;
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    let stats = consumer.stats();
    assert_eq!(stats.received, 40);
    println!("mixed: {stats:?}");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_message_batches_are_batches_and_drain() {
    let Some(broker) = real_broker("ones").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(1).await;
    let ids = send_all(&producer, 30).await;
    assert!(
        ids.iter()
            .all(|id| id.batch_size() == Some(1) && id.batch_index() == 0),
        "{ids:?}"
    );
    let messages = receive_and_ack(&consumer, 30).await;
    for message in &messages {
        assert!(
            message.position().is_batched(),
            "num_messages_in_batch is present"
        );
        assert_eq!(message.id().batch_size(), Some(1));
    }
    consumer.flush_acks().await;
    broker.assert_drained().await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("close");
    let after = broker.stats().await;
    assert_eq!(after.subscription(SUB).expect("kept").msg_backlog, 0);
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_acks_get_past_the_unacked_limit() {
    let Some(broker) = real_broker("limited").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(3).await;
    send_all(&producer, 90).await;
    // Without acks, dispatch stops once the consumer holds 20 unacknowledged messages: 7
    // batches of 3 (the count reaches 21 with the 7th).
    let held = receive_until_quiet(&consumer, Duration::from_secs(2)).await;
    let blocked = broker
        .wait_for("the consumer blocked at the limit", |s| {
            s.consumers
                .iter()
                .any(|c| c.blocked_consumer_on_unacked_msgs)
        })
        .await;
    let unacked = only_consumer(&blocked).unacked_messages;
    println!(
        "limited: blocked after {} messages, unackedMessages {unacked}",
        held.len()
    );
    assert_eq!(held.len(), 21, "7 batches of 3 before the block");
    assert_eq!(unacked, 21, "{blocked:#?}");
    // Acknowledging brings the count to 10 or less and dispatch resumes.
    for message in &held {
        consumer.ack(message).await.expect("ack queued");
    }
    receive_and_ack(&consumer, 90 - held.len()).await;
    consumer.flush_acks().await;
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// The default (`PartialBatches::HoldUntilComplete`, as the Java client of 4.0): acks of a
/// partly acknowledged batch stay in the client, so the broker still counts the whole batch;
/// the last one goes out as one ack of the entry, and the subscription drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_partly_acknowledged_batch_is_acknowledged_once_complete() {
    let Some(broker) = real_broker("hold-partial").await else {
        return;
    };
    let consumer = broker.shared(ConsumerOptions::default()).await;
    let producer = broker.producer(4).await;
    send_all(&producer, 4).await;
    let messages = receive(&consumer, 4).await;
    consumer.ack_and_wait(&messages[0]).await.expect("held");
    consumer.ack_and_wait(&messages[2]).await.expect("held");
    assert_eq!(
        consumer.stats().acked_ids,
        0,
        "nothing sent for a partial batch"
    );
    let partial = broker
        .wait_for("unacked 4 with the acks held", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 4
        })
        .await;
    assert_eq!(partial.msg_backlog, 1, "one entry: {partial:#?}");
    consumer.ack_and_wait(&messages[1]).await.expect("held");
    consumer.ack_and_wait(&messages[3]).await.expect("acked");
    assert_eq!(consumer.stats().acked_ids, 1, "one whole-entry id");
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_index_acks_count_and_skip_on_redelivery() {
    let Some(broker) = real_broker("indexes").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(4).await;
    send_all(&producer, 4).await;
    let messages = receive(&consumer, 4).await;
    consumer.ack_and_wait(&messages[0]).await.expect("acked");
    consumer.ack_and_wait(&messages[2]).await.expect("acked");
    // Two of the entry's four messages are acknowledged: the count is 2, the entry stays in
    // the backlog.
    let partial = broker
        .wait_for("unacked 2 after two batch-index acks", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 2
        })
        .await;
    assert_eq!(partial.msg_backlog, 1, "one entry: {partial:#?}");
    // The entry comes back with indexes 0 and 2 acknowledged: only 1 and 3 are delivered.
    consumer.redeliver_unacknowledged().expect("sent");
    let again = receive(&consumer, 2).await;
    let indexes: Vec<_> = again.iter().map(|m| m.position().batch_index()).collect();
    assert_eq!(indexes, [1, 3]);
    assert_eq!(consumer.stats().skipped, 2);
    let redelivered = broker
        .wait_for("unacked 2 after the redelivery", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 2
        })
        .await;
    assert!(
        !only_consumer(&redelivered).blocked_consumer_on_unacked_msgs,
        "{redelivered:#?}"
    );
    for message in &again {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// The scenario of pulsar-client-go#1534: each batch of 3 acknowledged in its own
/// transaction and committed, 30 times, under the limit of 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_batch_acked_in_its_own_transaction_drains_under_the_limit() {
    let Some(broker) = real_broker("txn-batches").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(3).await;
    let mut max_unacked = 0;
    for batch in 0..30 {
        send_all(&producer, 3).await;
        let messages = receive(&consumer, 3).await;
        assert!(messages.iter().all(|m| m.position().batch_size() == 3));
        let txn = broker.new_txn().await;
        for message in &messages {
            consumer.ack_in(&txn, message).await.expect("acked");
        }
        txn.commit().await.expect("committed");
        assert_eq!(txn.state(), TxnState::Committed);
        if batch % 10 == 9 {
            let stats = broker.stats().await;
            let sub = stats.subscription(SUB).expect("the subscription");
            let consumer = only_consumer(sub);
            max_unacked = max_unacked.max(consumer.unacked_messages);
            assert!(!consumer.blocked_consumer_on_unacked_msgs, "{sub:#?}");
        }
    }
    assert!(max_unacked < 3, "no leak: {max_unacked}");
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_then_redelivery_then_commit() {
    let Some(broker) = real_broker("abort").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(3).await;
    send_all(&producer, 3).await;
    let first = receive(&consumer, 3).await;
    let txn = broker.new_txn().await;
    for message in &first {
        consumer.ack_in(&txn, message).await.expect("acked");
    }
    // A 4.0 broker takes transactional acks off the count when they arrive, not at commit.
    let pending = broker
        .wait_for("unacked 0 with the acks pending in the transaction", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 0
        })
        .await;
    assert_eq!(pending.msg_backlog, 1, "not yet committed: {pending:#?}");
    txn.abort().await.expect("aborted");
    let again = receive(&consumer, 3).await;
    assert_eq!(
        again.iter().map(Message::id).collect::<Vec<_>>(),
        first.iter().map(Message::id).collect::<Vec<_>>()
    );
    let counts: Vec<_> = again.iter().map(Message::redelivery_count).collect();
    println!("abort: redelivery counts after the abort {counts:?}");
    assert!(counts.iter().all(|&c| c >= 1), "{counts:?}");
    broker
        .wait_for("unacked 3 after the redelivery", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 3
        })
        .await;
    let txn = broker.new_txn().await;
    for message in &again {
        consumer.ack_in(&txn, message).await.expect("acked again");
    }
    txn.commit().await.expect("committed");
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// How long the new consumer waits for m0's first copy after the abort in
/// [`abort_while_no_consumer_is_connected`] (3 s of quiet follow it for further copies).
///
/// Why: after a broker restart the broker loads the subscription's pending-ack store (and the
/// aborted transaction's marker) before it dispatches m0; that this is the wait is likely, not
/// confirmed. One CI run (f245db1, 2026-12-05: after two restarts, on a broker holding some 700
/// ledgers) got nothing within the 3 s the test then waited, and failed; locally, alone and
/// after the same two restarts, the copy came at once.
///
/// Measured: no duration has been recorded. The CI failure only shows it can exceed 3 s; the
/// local runs' "at once" was not timed. The test now prints how long the first copy took, so
/// that CI runs measure it.
///
/// Bound: 60 s is a guess (20x the 3 s that failed), kept until those printed times give a
/// measured bound; a longer wait costs nothing when the copy comes at once.
///
/// Another likely cause, seen in a broker log since: a restarted broker dispatches nothing on
/// a topic until that topic's transaction buffer recovered, and the recovery of all topics
/// runs on one thread that one stuck snapshot read held for 30 s
/// ([`DISPATCH_AFTER_RESTART`]).
const FIRST_COPY_AFTER_ABORT: Duration = Duration::from_secs(60);

/// What happens between the last consumer's close and the abort.
#[derive(Debug, Clone, Copy)]
enum WhileAlone {
    Nothing,
    Unload,
    Restart,
}

/// m0 is acknowledged in a transaction by a Shared consumer that then closes (and the topic
/// is unloaded or the broker restarted, as `between` says); the transaction is aborted while
/// no consumer is connected; a new consumer subscribes. Returns the redelivery counts of
/// what the new consumer received until nothing came for 3 s, after checking that it was m0,
/// sent once (the client saw no duplicate), and that the subscription drains once it is
/// acknowledged. (The abort adds m0 to the dispatcher's replay set, if the subscription has a
/// dispatcher; the first consumer's `addConsumer` clears that set and rewinds the cursor, and
/// m0, no longer pending, is read from it once.)
async fn abort_while_no_consumer_is_connected(
    broker: &RealBroker,
    between: WhileAlone,
) -> Vec<u32> {
    let first = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(0).await;
    send_all(&producer, 1).await;
    let m0 = receive(&first, 1).await.remove(0);
    let txn = broker.new_txn().await;
    first.ack_in(&txn, &m0).await.expect("acked in");
    broker
        .wait_for("unacked 0 with the ack pending in the transaction", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 0
        })
        .await;
    first
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    match between {
        WhileAlone::Nothing => {}
        WhileAlone::Unload => broker.admin.unload(&broker.topic).await.expect("unloaded"),
        WhileAlone::Restart => {
            let (down, _) = restart_broker(false).await;
            println!("{}: the restart took {down:?}", broker.scenario);
        }
    }
    let mut tries = 0;
    loop {
        match txn.abort().await {
            Ok(()) => break,
            Err(error) if error.is_retryable() && tries < 30 => {
                tries += 1;
                println!("{}: abort: {error} (retrying)", broker.scenario);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => panic!("abort: {error}"),
        }
    }
    let second = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    // The first copy may take a while after a restart (see [`FIRST_COPY_AFTER_ABORT`]); copies
    // after it would come within the quiet period.
    let mut again = Vec::new();
    let asked = Instant::now();
    if let Some(first) = within(FIRST_COPY_AFTER_ABORT, second.receive()).await {
        again.push(first.expect("received"));
        println!(
            "{}: the first copy came {:?} after the new consumer asked",
            broker.scenario,
            asked.elapsed()
        );
    }
    again.extend(receive_until_quiet(&second, Duration::from_secs(3)).await);
    let ids: Vec<MessageId> = again.iter().map(Message::id).collect();
    let counts: Vec<u32> = again.iter().map(Message::redelivery_count).collect();
    println!(
        "{}: after the abort the new consumer received {ids:?} with redelivery counts \
         {counts:?}",
        broker.scenario
    );
    assert_eq!(ids, vec![m0.id()], "m0 once: {counts:?}");
    assert_eq!(second.stats().duplicates, 0, "{:?}", second.stats());
    second.ack(&again[0]).await.expect("acked");
    second.flush_acks().await;
    broker.assert_drained().await;
    second
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    counts
}

/// The abort of a transaction whose ack was pending while no consumer is connected: the next
/// consumer gets the message once (not replayed and read again), counted as redelivered
/// once (the dispatcher outlives its consumers and its redelivery tracker counted the abort's
/// replay, which the new consumer's `addConsumer` does not clear).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_while_no_consumer_is_connected_delivers_the_message_once() {
    let Some(broker) = real_broker("abort-alone").await else {
        return;
    };
    let counts = abort_while_no_consumer_is_connected(&broker, WhileAlone::Nothing).await;
    assert_eq!(counts, vec![1]);
    broker.done();
}

/// The same after an unload: the topic is loaded again without a dispatcher (the
/// subscription makes one for its first consumer), so the abort replays nothing and counts
/// nothing; the next consumer gets the message once, read from the rewound cursor, with a
/// redelivery count of 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_after_an_unload_while_no_consumer_is_connected_delivers_the_message_once() {
    let Some(broker) = real_broker("abort-alone-unload").await else {
        return;
    };
    let counts = abort_while_no_consumer_is_connected(&broker, WhileAlone::Unload).await;
    assert_eq!(counts, vec![0]);
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_transactions_ack_messages_of_one_batch() {
    let Some(broker) = real_broker("split").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(3).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    let mut txns = Vec::new();
    for message in &messages {
        let txn = broker.new_txn().await;
        consumer.ack_in(&txn, message).await.expect("acked");
        txns.push(txn);
    }
    // Acknowledging a message again, in any transaction, is refused before it reaches the
    // broker (which would answer TransactionConflict).
    assert!(matches!(
        consumer.ack_in(&txns[0], &messages[1]).await,
        Err(Error::Ack(_))
    ));
    let pending = broker
        .wait_for("unacked 0 with three transactions pending", |s| {
            s.consumers.len() == 1 && s.consumers[0].unacked_messages == 0
        })
        .await;
    assert_eq!(pending.msg_backlog, 1, "{pending:#?}");
    for txn in txns.iter().rev() {
        txn.commit().await.expect("committed");
    }
    broker.assert_drained().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cumulative_acks_on_an_exclusive_subscription() {
    let Some(broker) = real_broker("cumulative").await else {
        return;
    };
    let consumer = broker
        .consumer(integration_tests::real_pulsar::consumer_options().sub_type(SubType::Exclusive))
        .await;
    let batched = broker.producer(3).await;
    let single = broker.producer(0).await;
    send_all(&batched, 30).await;
    send_all(&single, 5).await;
    // Exclusive subscriptions do not count unacked messages: the limit does not apply.
    let messages = receive(&consumer, 35).await;
    // Half way, in the middle of a batch (entry 4, index 1)...
    consumer
        .ack_cumulative(&messages[13])
        .await
        .expect("ack queued");
    consumer.flush_acks().await;
    // ... leaves entries 4 to 14 in the backlog.
    let half = broker
        .wait_for("the backlog after the first cumulative ack", |s| {
            s.msg_backlog < 15
        })
        .await;
    assert_eq!(half.msg_backlog, 11, "entries, not messages: {half:#?}");
    consumer
        .ack_cumulative(&messages[34])
        .await
        .expect("ack queued");
    consumer.flush_acks().await;
    let drained = broker.assert_drained().await;
    assert_eq!(drained.sub_type, "Exclusive");
    assert_eq!(consumer.stats().ack_frames, 2);
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// 10,000 messages in batches of 10, each acknowledged on its own as it arrives, grouped.
///
/// With a limit of 20 the broker stops after two batches until the count is back at 10, so
/// a group can never cover more than about 20 messages: groups are capped at 20 ids (a frame
/// as soon as two batches are acknowledged) instead of waiting out the 100 ms group time
/// while dispatch is blocked. The admin stats are sampled meanwhile: the count never exceeds
/// the limit by more than one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_with_grouped_acks() {
    const MESSAGES: usize = 10_000;
    let Some(broker) = real_broker("load").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options().ack_group_max(LIMIT as usize))
        .await;
    let producer = broker.producer(10).await;
    let stop = Arc::new(AtomicBool::new(false));
    let max_unacked = Arc::new(AtomicI64::new(0));
    let blocked_samples = Arc::new(AtomicU64::new(0));
    let sampler = tokio::spawn({
        let admin = broker.admin.clone();
        let topic = broker.topic.clone();
        let (stop, max_unacked, blocked_samples) = (
            Arc::clone(&stop),
            Arc::clone(&max_unacked),
            Arc::clone(&blocked_samples),
        );
        async move {
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(stats) = admin.topic_stats(&topic).await
                    && let Some(sub) = stats.subscription(SUB)
                {
                    samples += 1;
                    for c in &sub.consumers {
                        max_unacked.fetch_max(c.unacked_messages, Ordering::Relaxed);
                        if c.blocked_consumer_on_unacked_msgs {
                            blocked_samples.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        }
    });
    let started = Instant::now();
    let send = tokio::spawn({
        let producer = producer.clone();
        async move { send_all(&producer, MESSAGES).await }
    });
    let mut first = None;
    for i in 0..MESSAGES {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("message {i} did not arrive (delivery stopped)"))
            .expect("received");
        first.get_or_insert_with(Instant::now);
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    let acked_in = first.map(|t| t.elapsed()).unwrap_or_default();
    let ids = send.await.expect("sender");
    assert!(ids.iter().all(|id| id.batch_size() == Some(10)));
    broker.assert_drained().await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.expect("sampler");
    let stats = consumer.stats();
    let ratio = stats.ack_frames as f64 / MESSAGES as f64;
    let max_unacked = max_unacked.load(Ordering::Relaxed);
    println!(
        "load: 10,000 messages in {:?} (acks at {:.0}/s): {} ACK frames ({ratio:.4} per \
         message) carrying {} ids, {} FLOW frames; {samples} stats samples, max unacked \
         {max_unacked}, blocked in {} samples",
        started.elapsed(),
        MESSAGES as f64 / acked_in.as_secs_f64(),
        stats.ack_frames,
        stats.acked_ids,
        stats.flow_frames,
        blocked_samples.load(Ordering::Relaxed),
    );
    assert_eq!(stats.received, MESSAGES as u64);
    // One frame per 20 messages when every group fills (0.05); groups cut short by the
    // group time add a few. Acks sent one by one would be 1 per message.
    assert!(
        ratio <= 0.1,
        "{} ACK frames for {MESSAGES} messages",
        stats.ack_frames
    );
    assert!(
        max_unacked < i64::from(LIMIT) + 10,
        "the limit applies: max unacked {max_unacked}"
    );
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_the_official_java_client_are_consumed_and_acked() {
    let Some(broker) = real_broker("java-batches").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    // 600 messages in batches of 30 by pulsar-client 4.0.8: each batch alone exceeds the
    // consumer's limit of 20 unacked messages.
    let produced = java_peer("PulsarProduce", &[&service_url, &broker.topic, "600", "30"]).await;
    assert!(
        produced.contains("produced=600 entries=20 batched=600"),
        "the Java client batched as asked: {produced}"
    );
    let mut seen = std::collections::HashSet::new();
    let mut batch = Vec::new();
    let mut entries = 0;
    while seen.len() < 600 {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("delivery stopped after {} messages", seen.len()))
            .expect("received");
        assert_eq!(message.position().batch_size(), 30, "{:?}", message.id());
        let index: usize = message
            .property("i")
            .and_then(|i| i.parse().ok())
            .expect("the Java producer's index property");
        assert_eq!(
            std::str::from_utf8(message.payload()).ok(),
            Some(format!("j{index}").as_str())
        );
        assert!(seen.insert(index), "message {index} delivered twice");
        batch.push(message);
        if batch.len() == 30 {
            // Even entries: one ack per message; odd entries: all in one transaction.
            if entries % 2 == 0 {
                for message in &batch {
                    consumer.ack(message).await.expect("ack queued");
                }
            } else {
                let txn = broker.new_txn().await;
                for message in &batch {
                    consumer.ack_in(&txn, message).await.expect("acked");
                }
                txn.commit().await.expect("committed");
            }
            batch.clear();
            entries += 1;
        }
    }
    assert_eq!(entries, 20);
    consumer.flush_acks().await;
    let sub = broker.assert_drained().await;
    assert_eq!(only_consumer(&sub).unacked_messages, 0, "{sub:#?}");
    assert_quiet(&consumer, Duration::from_millis(500)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// The payload the compression peers send: a tag, the index and a compressible filler.
fn codec_payload(tag: &str, index: usize) -> String {
    format!("{tag}-{index}{}", "payload ".repeat(index % 200))
}

/// Receives the 480 payloads a compression peer sent (`prefix` before each codec's tag: 60
/// per codec, batched and not), each intact and once, acks them, and checks that nothing was
/// discarded and the subscription drains.
async fn assert_every_codec_arrives(broker: &RealBroker, consumer: &Consumer, prefix: &str) {
    let mut expected: std::collections::HashSet<String> = ["LZ4", "ZLIB", "ZSTD", "SNAPPY"]
        .iter()
        .flat_map(|codec| ["b", "u"].map(|b| format!("{prefix}{codec}-{b}")))
        .flat_map(|tag| (0..60).map(move |i| codec_payload(&tag, i)))
        .collect();
    assert_eq!(expected.len(), 480);
    while !expected.is_empty() {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("delivery stopped with {} to go", expected.len()))
            .expect("received");
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        let tag = message
            .property("codec")
            .expect("the codec property")
            .to_owned();
        assert!(payload.starts_with(&tag), "{payload:.40} tagged {tag}");
        assert!(
            expected.remove(&payload),
            "unexpected or twice: {payload:.40}"
        );
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    assert_eq!(consumer.stats().undecodable, 0);
    broker.assert_drained().await;
    assert_quiet(consumer, Duration::from_millis(500)).await;
}

/// The official Java client produces 60 messages with each of LZ4, ZLIB, ZSTD and SNAPPY,
/// batched and not (`PulsarProduceCodecs`): our consumer gets every payload intact, nothing
/// discarded, and the subscription drains. (Before decompression, these entries were
/// acknowledged as undecodable and never delivered: with it mutated away, "delivery stopped
/// with 480 to go".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_of_the_java_client_reaches_our_consumer_intact() {
    let Some(broker) = real_broker("java-codecs").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let produced = java_peer("PulsarProduceCodecs", &[&service_url, &broker.topic, "60"]).await;
    assert!(produced.contains("produced=480"), "{produced}");
    assert_every_codec_arrives(&broker, &consumer, "").await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// The same with the official Python client (`pulsar-client` 3.13.0 from PyPI, a C++ client
/// underneath: `scripts/python-peers/produce_codecs.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_of_the_python_client_reaches_our_consumer_intact() {
    let Some(broker) = real_broker("python-codecs").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let produced = python_peer("produce_codecs", &[&service_url, &broker.topic, "60"]).await;
    assert!(produced.contains("produced=480"), "{produced}");
    assert_every_codec_arrives(&broker, &consumer, "py-").await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// Chunked message `i` of the chunking peers (`PulsarChunks`, `produce_chunked.py`): bytes
/// that do not compress (so that a codec does not make them fit in one entry), byte `j`
/// being bits 24..31 of the `j + 1`-th step of xorshift64 (13, 7, 17) from
/// `(i + 1) * 0x9E3779B97F4A7C15`.
fn chunked_payload(i: u64, size: usize) -> Vec<u8> {
    let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

const TEN_MIB: usize = 10 * 1024 * 1024;

/// Receives `count` chunked messages of [`TEN_MIB`] on `consumer`, each with property `i`:
/// every payload intact, in 3 chunks (the broker's 5 MiB `max_message_size`), acked; then
/// the subscription drains, with `total` chunked messages reassembled by the consumer.
async fn assert_chunked_arrive(broker: &RealBroker, consumer: &Consumer, count: u64, total: u64) {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..count {
        let message = tokio::time::timeout(Duration::from_secs(60), consumer.receive())
            .await
            .expect("a chunked message within 60 s")
            .expect("received");
        let i: u64 = message
            .property("i")
            .and_then(|i| i.parse().ok())
            .expect("property i");
        assert_eq!(message.payload().len(), TEN_MIB, "message {i}");
        assert!(
            message.payload()[..] == chunked_payload(i, TEN_MIB)[..],
            "message {i}: the payload differs"
        );
        let chunks = message.chunk_ids();
        assert_eq!(chunks.len(), 3, "message {i}: {chunks:?}");
        assert_eq!(chunks.last(), Some(&message.id()));
        assert!(seen.insert(i), "message {i} twice");
        consumer.ack(&message).await.expect("acked");
    }
    consumer.flush_acks().await;
    let stats = consumer.stats();
    assert_eq!(stats.chunked, total, "{stats:?}");
    assert_eq!(stats.undecodable, 0, "{stats:?}");
    let drained = broker.assert_drained().await;
    assert_eq!(drained.msg_backlog, 0);
}

/// Two 10 MiB chunked messages from the official Java client 4.0.8, and one more with LZ4
/// (compressed whole, then chunked): reassembled, intact, acked with all their chunks,
/// backlog 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_messages_of_the_java_client_are_reassembled_and_acked() {
    let Some(broker) = real_broker("java-chunks").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let consumer = broker
        .consumer(integration_tests::real_pulsar::consumer_options().sub_type(SubType::Exclusive))
        .await;
    let size = TEN_MIB.to_string();
    let produced = java_peer(
        "PulsarChunks",
        &["produce", &service_url, &broker.topic, "2", &size, "NONE"],
    )
    .await;
    assert!(produced.contains("produced=2"), "{produced}");
    assert_chunked_arrive(&broker, &consumer, 2, 2).await;
    let produced = java_peer(
        "PulsarChunks",
        &["produce", &service_url, &broker.topic, "1", &size, "LZ4"],
    )
    .await;
    assert!(produced.contains("produced=1"), "{produced}");
    assert_chunked_arrive(&broker, &consumer, 1, 3).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// Two 10 MiB chunked messages from the official Python client (`pulsar-client` 3.13.0):
/// reassembled, intact, acked, backlog 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_messages_of_the_python_client_are_reassembled_and_acked() {
    let Some(broker) = real_broker("python-chunks").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let consumer = broker
        .consumer(integration_tests::real_pulsar::consumer_options().sub_type(SubType::Exclusive))
        .await;
    let size = TEN_MIB.to_string();
    let produced = python_peer(
        "produce_chunked",
        &[&service_url, &broker.topic, "2", &size, "NONE"],
    )
    .await;
    assert!(produced.contains("produced=2"), "{produced}");
    assert_chunked_arrive(&broker, &consumer, 2, 2).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// Our producer with chunking: two 10 MiB messages, read by the official Java client
/// (`PulsarChunks consume`) intact (size and CRC-32C), and its subscription drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_chunked_messages_are_read_by_the_java_client() {
    let Some(broker) = real_broker("chunks-to-java").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let producer = Producer::builder(&broker.client, &broker.topic)
        .no_batching()
        .chunking(true)
        .build()
        .await
        .expect("producer created");
    for i in 0..2u64 {
        producer
            .send(OutgoingMessage::new(chunked_payload(i, TEN_MIB)).property("i", i.to_string()))
            .await
            .expect("sent in chunks");
    }
    let consumed = java_peer(
        "PulsarChunks",
        &["consume", &service_url, &broker.topic, "java", "2"],
    )
    .await;
    for i in 0..2u64 {
        let crc = crc32c::crc32c(&chunked_payload(i, TEN_MIB));
        let line = format!("message i={i} size={TEN_MIB} crc32c={crc:x}");
        assert!(consumed.contains(&line), "{line} not in {consumed}");
    }
    assert!(consumed.contains("consumed=2"), "{consumed}");
    let stats = broker.stats().await;
    let java = stats.subscription("java").expect("the Java subscription");
    assert_eq!(java.msg_backlog, 0, "{java:?}");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// An entry that claims LZ4 but holds bytes that are not an LZ4 block (stored as sent: the
/// broker does not decompress) on the real broker: our consumer hands it to the application as
/// `Error::Undecodable` with its id and does not acknowledge it (the backlog keeps it while the
/// good message after it is acked); nacked by id, it comes back with its redelivery count
/// growing, and past the dead-letter maximum of 2 it is published, as stored, to the
/// dead-letter topic, whose initial subscription keeps it, and the subscription drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_message_is_surfaced_not_acked_then_dead_lettered() {
    use pulsar_wire::pb::{self, MessageMetadata, base_command::Type};
    use pulsar_wire::wire::{Frame, command_frame};
    use pulsar_wire::{DeadLetterPolicy, UNDECODABLE_REASON};
    let Some(broker) = real_broker("undecodable").await else {
        return;
    };
    let dead = format!("{}-DLQ", broker.topic);
    let consumer = broker
        .shared(
            integration_tests::real_pulsar::consumer_options().dead_letter(
                DeadLetterPolicy::new(2)
                    .dead_letter_topic(dead.clone())
                    .initial_subscription_name("keep"),
            ),
        )
        .await;
    // A raw producer: the entry goes out exactly as built here.
    let connection = broker
        .client
        .lookup(&broker.topic)
        .await
        .expect("looked up");
    let producer_id = connection.next_id();
    let registered = connection
        .request("PRODUCER", |request_id| {
            command_frame(Type::Producer, |c| {
                c.producer = Some(pb::CommandProducer {
                    topic: broker.topic.clone(),
                    producer_id,
                    request_id,
                    ..pb::CommandProducer::default()
                });
            })
        })
        .await
        .expect("producer registered");
    let producer_name = registered
        .producer_success
        .expect("PRODUCER_SUCCESS")
        .producer_name;
    let garbage = bytes::Bytes::from_static(b"these bytes are not an LZ4 block at all, sorry");
    let send = command_frame(Type::Send, |c| {
        c.send = Some(pb::CommandSend {
            producer_id,
            sequence_id: 0,
            ..pb::CommandSend::default()
        });
    })
    .command;
    let metadata = MessageMetadata {
        producer_name,
        sequence_id: 0,
        publish_time: 1,
        compression: Some(pb::CompressionType::Lz4 as i32),
        uncompressed_size: Some(1_000),
        ..MessageMetadata::default()
    };
    let stored = connection
        .send_message(
            producer_id,
            0,
            Frame::with_payload(send, metadata, garbage.clone()),
        )
        .await
        .expect("the broker stores it as sent");
    let good = broker.producer(0).await;
    good.send(OutgoingMessage::new("good")).await.expect("sent");

    let mut undecodable = None;
    let mut good_seen = false;
    while undecodable.is_none() || !good_seen {
        match within(PATIENCE, consumer.receive())
            .await
            .expect("a delivery in time")
        {
            Ok(message) => {
                assert_eq!(message.payload().as_ref(), b"good");
                consumer.ack(&message).await.expect("ack queued");
                good_seen = true;
            }
            Err(Error::Undecodable {
                id,
                redelivery_count,
                reason,
            }) => {
                assert_eq!(
                    (id.ledger_id(), id.entry_id()),
                    (stored.ledger_id, stored.entry_id)
                );
                assert_eq!(redelivery_count, 0);
                assert!(reason.contains("LZ4"), "{reason}");
                undecodable = Some(id);
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    consumer.flush_acks().await;
    // Not acknowledged behind the application's back: the broker still has it.
    let kept = broker
        .wait_for("the good message acked, the undecodable one kept", |s| {
            s.msg_backlog == 1
        })
        .await;
    assert_eq!(only_consumer(&kept).unacked_messages, 1, "{kept:#?}");
    let id = undecodable.expect("seen");
    consumer.nack_id(&id).expect("nacked");
    for count in 1..=2 {
        match within(PATIENCE, consumer.receive())
            .await
            .expect("redelivered")
        {
            Err(Error::Undecodable {
                id: again,
                redelivery_count,
                ..
            }) => {
                assert_eq!((again, redelivery_count), (id, count));
                consumer.nack_id(&again).expect("nacked");
            }
            other => panic!(
                "expected the undecodable entry again: {:?}",
                other.map(|m| m.id())
            ),
        }
    }
    // Its fourth delivery (redelivery count 3) goes to the dead-letter topic, while the
    // application waits in `receive` (dead-lettering runs there) and gets nothing.
    assert_quiet(&consumer, Duration::from_secs(1)).await;
    consumer.flush_acks().await;
    broker.assert_drained().await;
    assert_eq!(consumer.stats().dead_lettered, 1);
    assert_eq!(consumer.stats().undecodable, 4);
    let reader = Consumer::builder(&broker.client, &dead, "keep")
        .options(integration_tests::real_pulsar::consumer_options())
        .build()
        .await
        .expect("subscribed to the dead-letter topic");
    let letter = within(PATIENCE, reader.receive())
        .await
        .expect("the dead letter")
        .expect("received");
    assert_eq!(letter.payload(), &garbage);
    assert!(letter.property(UNDECODABLE_REASON).is_some(), "{letter:?}");
    reader.ack(&letter).await.expect("acked");
    reader
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    broker.done();
}

/// Our producer with each codec, batched and not, read by the official Java client
/// (`PulsarConsumePayloads`): every payload intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_of_our_producer_is_read_by_the_java_client() {
    use pulsar_wire::Compression;
    let Some(broker) = real_broker("ours-codecs").await else {
        return;
    };
    let service_url = var("PULSAR_SERVICE_URL").expect("set with the broker");
    let mut expected = Vec::new();
    for codec in [
        Compression::Lz4,
        Compression::Zlib,
        Compression::Zstd,
        Compression::Snappy,
    ] {
        for batched in [true, false] {
            let options = ProducerOptions::default().compression(codec);
            let options = if batched {
                options.batching(BatchingOptions::default().max_messages(10))
            } else {
                options.no_batching()
            };
            let producer = Producer::builder(&broker.client, &broker.topic)
                .options(options)
                .build()
                .await
                .expect("producer");
            let tag = format!("ours-{}-{}", codec.name(), if batched { "b" } else { "u" });
            let payloads: Vec<String> = (0..60).map(|i| codec_payload(&tag, i)).collect();
            let sends = payloads
                .iter()
                .map(|payload| producer.send(OutgoingMessage::new(payload.clone())));
            for sent in futures_util::future::join_all(sends).await {
                sent.expect("sent");
            }
            producer
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await
                .expect("closed");
            expected.extend(payloads);
        }
    }
    let consumed = java_peer(
        "PulsarConsumePayloads",
        &[&service_url, &broker.topic, "java", "480"],
    )
    .await;
    let mut read: Vec<&str> = consumed
        .lines()
        .filter_map(|line| line.strip_prefix("payload="))
        .collect();
    read.sort_unstable();
    expected.sort_unstable();
    assert_eq!(read.len(), 480, "{consumed:.300}");
    assert!(read.iter().eq(expected.iter()), "payloads differ");
    broker.done();
}

/// Issue 7's end-to-end scenario on a fresh 4-partition topic: low messages queued, then high
/// ones; a `PriorityConsumer` attaches and drains, never waiting for acks, while the topic is
/// raised to 8 partitions through the admin API. Partition 0 carries the high level, every
/// other partition (also the added ones) the low level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_high_messages_overtake_the_low_backlog_while_partitions_grow() {
    use std::collections::HashSet;

    use mq_priority::{
        GateConfig, LayoutSpec, Level, PriorityPolicy, RouterConfig, StickyWindow, Strategy,
        Unlisted,
    };
    use pulsar_wire::prioritized::{PriorityConsumer, PriorityRouter};

    const LOW: usize = 10_000;
    const HIGH: usize = 1_000;
    const QUEUE: u32 = 1_000;
    let (Some(service_url), Some(admin_url)) = (var("PULSAR_SERVICE_URL"), var("PULSAR_ADMIN_URL"))
    else {
        eprintln!("PULSAR_SERVICE_URL and PULSAR_ADMIN_URL are not both set; skipping");
        return;
    };
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!(
        "persistent://public/default/it-priority-{}-{millis}",
        std::process::id()
    );
    let admin = PulsarAdmin::new(&admin_url).expect("PULSAR_ADMIN_URL is http://host:port");
    admin
        .create_partitioned_topic(&topic, 4)
        .await
        .expect("partitioned topic created");
    let options = ConnectOptions::new(&service_url)
        .expect("PULSAR_SERVICE_URL is a pulsar:// URL")
        .operation_timeout(Duration::from_secs(30));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("connected");

    let policy = PriorityPolicy::builder()
        .levels(2)
        .property("priority")
        .build()
        .unwrap();
    let layout = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
    let consumer_options = integration_tests::real_pulsar::consumer_options()
        .initial_position(InitialPosition::Earliest);
    // The subscription exists before the first message.
    Consumer::builder(&client, &topic, SUB)
        .options(consumer_options.clone())
        .build()
        .await
        .expect("subscribed")
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let router = PriorityRouter::for_topic(
        &client,
        &topic,
        policy.clone(),
        layout.clone(),
        RouterConfig {
            sticky: StickyWindow {
                max_messages: 100,
                max_duration: Duration::from_millis(10),
            },
            ..RouterConfig::default()
        },
    )
    .await
    .expect("router");
    let producer = Producer::builder(&client, &topic)
        .batching(
            BatchingOptions::default()
                .max_messages(100)
                .max_delay(Duration::from_millis(5)),
        )
        .router(Arc::new(router))
        .partitions_refresh(None)
        .build()
        .await
        .expect("producer");
    let send = |prefix: &'static str, level: &'static str, count: usize| {
        let producer = producer.clone();
        async move {
            let sends = (0..count).map(|i| {
                producer
                    .send(OutgoingMessage::new(format!("{prefix}{i}")).property("priority", level))
            });
            for result in futures_util::future::join_all(sends).await {
                result.expect("sent");
            }
        }
    };
    send("l", "1", LOW).await;
    send("h", "0", HIGH).await;

    let gate = GateConfig::default()
        .with_strategy(Strategy::Strict)
        .with_receiver_queue_size(QUEUE);
    let consumer = PriorityConsumer::builder(&client, &topic, SUB, policy, layout)
        .consumer(consumer_options)
        .gate(gate)
        .partitions_refresh(Some(Duration::from_secs(1)))
        .build()
        .await
        .expect("priority consumer");
    assert_eq!(
        consumer.queue_sizes(),
        [QUEUE, QUEUE / 2, QUEUE / 2, QUEUE / 2]
    );
    let next = || async {
        within(PATIENCE, consumer.receive())
            .await
            .expect("a message in time")
            .expect("received")
    };
    let mut payloads = Vec::new();
    let mut order = Vec::new();
    for _ in 0..(LOW + HIGH) / 2 {
        let m = next().await;
        order.push(m.payload().starts_with(b"h"));
        payloads.push(String::from_utf8_lossy(m.payload()).into_owned());
    }
    let last_high = order.iter().rposition(|&h| h).expect("high messages");
    let bypass = order[..last_high].iter().filter(|&&h| !h).count();
    println!("priority: {bypass} low messages before the last high one");
    assert!(
        bypass <= (QUEUE / 2) as usize,
        "{bypass} low messages before the last high one"
    );

    // 4 → 8 partitions mid-run, through the admin API.
    admin
        .update_partitions(&topic, 8)
        .await
        .expect("partitions raised");
    assert_eq!(producer.refresh_partitions().await.expect("refreshed"), 8);
    send("xl", "1", 800).await;
    send("xh", "0", 200).await;
    let total = LOW + HIGH + 1_000;
    let mut new_partitions = HashSet::new();
    while payloads.len() < total {
        let m = next().await;
        let partition = m.id().partition();
        assert_eq!(
            m.payload().starts_with(b"h") || m.payload().starts_with(b"xh"),
            partition == 0,
            "{} on partition {partition}",
            String::from_utf8_lossy(m.payload())
        );
        if partition >= 4 {
            new_partitions.insert(partition);
        }
        payloads.push(String::from_utf8_lossy(m.payload()).into_owned());
    }
    assert_eq!(consumer.partitions(), 8);
    assert!(new_partitions.len() >= 2, "{new_partitions:?}");
    let unique: HashSet<&String> = payloads.iter().collect();
    assert_eq!(unique.len(), total, "duplicates");
    assert_quiet_priority(&consumer).await;
    let stats = consumer.gate_stats();
    assert_eq!(stats.levels[0].delivered, (HIGH + 200) as u64);
    assert_eq!(stats.levels[1].delivered, (LOW + 800) as u64);
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
}

async fn assert_quiet_priority(consumer: &pulsar_wire::prioritized::PriorityConsumer) {
    if let Some(message) = within(Duration::from_millis(500), consumer.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| m.id()));
    }
}

/// The steady transactional shape of the issue on a topic limited to 50 unacked messages per
/// consumer: 140 msg/s in batches of 7, every 5 received messages acknowledged at once in a
/// transaction that then ends, every third aborted. Returns the client's report,
/// the blocked periods seen in the admin stats and the settled unacked count and backlog.
async fn txn_steady_run(
    scenario: &'static str,
    shape: broker_tools::txn_steady::Shape,
    legacy: bool,
) -> Option<(
    broker_tools::txn_steady::ClientReport,
    broker_tools::txn_steady::BlockedPeriods,
    i64,
    i64,
)> {
    txn_steady_run_limited(scenario, shape, legacy, 50).await
}

/// [`txn_steady_run`] with `limit` unacked messages per consumer.
async fn txn_steady_run_limited(
    scenario: &'static str,
    shape: broker_tools::txn_steady::Shape,
    legacy: bool,
    limit: u32,
) -> Option<(
    broker_tools::txn_steady::ClientReport,
    broker_tools::txn_steady::BlockedPeriods,
    i64,
    i64,
)> {
    use broker_tools::txn_steady;
    let broker = real_broker(scenario).await?;
    broker
        .admin
        .set_max_unacked_on_consumer(&broker.topic, limit, Duration::from_secs(60))
        .await
        .expect("the limit is set");
    // On a broker just started, transactional round trips are slow enough that no consumer
    // keeps up with 140 msg/s for its first half minute (ours on a fresh 4.0.8 standalone:
    // blocked 37.8 s of 60, longest 15.2 s; 0 s once warm). The shape needs a consumer that
    // keeps up, so the broker is warmed once with 30 s of it on another topic.
    static WARMED: AtomicBool = AtomicBool::new(false);
    if !WARMED.swap(true, Ordering::AcqRel) {
        let warm_up = format!("{}-warm-up", broker.topic);
        let shape = txn_steady::Shape::steady(Duration::from_secs(30));
        let bound = shape.timeout + Duration::from_secs(120);
        let report = tokio::time::timeout(
            bound,
            txn_steady::run(&broker.client, &warm_up, SUB, &shape, false, None),
        )
        .await
        .unwrap_or_else(|_| panic!("{scenario}: the warm-up hung: no end {bound:?} after it began"))
        .expect("the warm-up run");
        println!("{scenario}: warm-up {report:?}");
    }
    let watcher = txn_steady::watch(
        broker.admin.clone(),
        broker.topic.clone(),
        SUB.into(),
        Duration::from_millis(250),
    );
    // The run ends by itself at its deadline; past that plus two minutes it hung (as it did
    // once for an hour in CI: an abort and an ack waiting for each other), and the test fails
    // instead of waiting for CI's limit.
    let bound = shape.timeout + Duration::from_secs(120);
    let report = tokio::time::timeout(
        bound,
        txn_steady::run(
            &broker.client,
            &broker.topic,
            SUB,
            &shape,
            legacy,
            Some(&broker.admin),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("{scenario}: the run hung: no end {bound:?} after it began"))
    .expect("the run");
    let blocked = watcher.finish().await;
    let unacked = report.final_unacked.expect("measured");
    let backlog = report.final_backlog.expect("measured");
    println!(
        "{scenario}: {report:?} {blocked:?} final unacked {unacked}, backlog {backlog} \
         in {:?}",
        broker.started.elapsed()
    );
    Some((report, blocked, unacked, backlog))
}

/// What keeps a steady run from meeting issue 11's bar: everything committed exactly once,
/// unacked and backlog back at 0, never blocked for more than 5 s, no ack or commit refused.
fn steady_shortfalls(
    report: &broker_tools::txn_steady::ClientReport,
    blocked: &broker_tools::txn_steady::BlockedPeriods,
    unacked: i64,
    backlog: i64,
) -> Vec<String> {
    let mut missed = Vec::new();
    if !report.drained {
        missed.push("did not drain".to_owned());
    }
    if report.committed != report.produced {
        missed.push(format!(
            "committed {} of {}",
            report.committed, report.produced
        ));
    }
    if report.duplicates != 0 {
        missed.push(format!("{} committed twice", report.duplicates));
    }
    if report.acks_refused + report.acks_refused_by_client != 0 {
        missed.push(format!(
            "{} acks refused",
            report.acks_refused + report.acks_refused_by_client
        ));
    }
    if report.commits_refused != 0 {
        missed.push(format!("{} commits refused", report.commits_refused));
    }
    if blocked.longest > Duration::from_secs(5) {
        missed.push(format!("blocked for {:?} at a time", blocked.longest));
    }
    if (unacked, backlog) != (0, 0) {
        missed.push(format!("ended with unacked {unacked}, backlog {backlog}"));
    }
    missed
}

/// Issue 11's steady shape for 60 s meets the bar of [`steady_shortfalls`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_with_aborted_transactions_drains() {
    use broker_tools::txn_steady::Shape;
    let Some((report, blocked, unacked, backlog)) =
        txn_steady_run("steady", Shape::steady(Duration::from_secs(60)), false).await
    else {
        return;
    };
    assert_eq!(report.produced, 8_400, "{report:?}");
    assert!(report.txns_aborted > 500, "{report:?}");
    let missed = steady_shortfalls(&report, &blocked, unacked, backlog);
    assert!(missed.is_empty(), "{missed:?}: {report:?} {blocked:?}");
}

/// Issue 27's shape: `consumers` Shared consumers on one subscription, 300 msg/s in batches
/// of 13 for 60 s, 6 acks per transaction, every fourth aborted, 37 unacked messages per
/// consumer: every payload committed exactly once across the consumers, no ack refused
/// (no `TransactionConflict` from a copy of a message another consumer holds), never blocked
/// for more than 5 s, unacked and backlog 0. (Before issue 27: 50 to 246 payloads committed
/// twice in 60 s with two consumers.)
async fn shared_steady(scenario: &'static str, consumers: usize) {
    use broker_tools::txn_steady::{SHARED_LIMIT, Shape};
    let Some((report, blocked, unacked, backlog)) = txn_steady_run_limited(
        scenario,
        Shape::shared(consumers, Duration::from_secs(60)),
        false,
        SHARED_LIMIT,
    )
    .await
    else {
        return;
    };
    assert!(report.txns_aborted > 500, "{report:?}");
    assert_eq!(report.committed_again, 0, "{:?}", report.double_commits);
    assert!(
        report.committed_by.iter().filter(|n| **n > 0).count() == consumers,
        "every consumer committed: {:?}",
        report.committed_by
    );
    let missed = steady_shortfalls(&report, &blocked, unacked, backlog);
    assert!(missed.is_empty(), "{missed:?}: {report:?} {blocked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_steady_shape_commits_each_payload_once_with_two_consumers() {
    shared_steady("shared-steady-2", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_steady_shape_commits_each_payload_once_with_three_consumers() {
    shared_steady("shared-steady-3", 3).await;
}

/// The steady shape for 40 s with the application paused for 2 s after 15 s (a long GC, a
/// slow downstream call): the broker blocks the consumer at the limit meanwhile, and once the
/// application is back the consumer catches up with the 280 messages it fell behind, so it is
/// never blocked for more than 5 s at a time, the pause included. (With one ack at a time
/// instead of a transaction's acks at once, a 3 s pause left it blocked 5.2 s and then 9.5 s
/// while it caught up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_with_aborted_transactions_catches_up_after_the_application_pauses() {
    use broker_tools::txn_steady::Shape;
    let shape = Shape {
        pause: Some((Duration::from_secs(15), Duration::from_secs(2))),
        ..Shape::steady(Duration::from_secs(40))
    };
    let Some((report, blocked, unacked, backlog)) =
        txn_steady_run("steady-paused", shape, false).await
    else {
        return;
    };
    assert!(report.drained, "{report:?}");
    assert_eq!(report.committed, report.produced, "{report:?}");
    assert_eq!(report.duplicates, 0, "committed twice: {report:?}");
    assert_eq!(report.commits_refused, 0, "{report:?}");
    assert!(blocked.longest <= Duration::from_secs(5), "{blocked:?}");
    assert_eq!((unacked, backlog), (0, 0));
}

/// The same shape with the behaviour before the fix (duplicates handed over, nothing sent for
/// them) misses the bar of [`steady_shortfalls`], so the test above can fail. How it misses
/// depends on timing: mostly the consumer stalls for good (only a fraction committed, the
/// backlog growing); on a slower machine it drained with long blocked periods and 10
/// unacked left behind for good, which a longer run accumulates into the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_with_aborted_transactions_stalls_the_legacy_consumer() {
    use broker_tools::txn_steady::Shape;
    let shape = Shape {
        timeout: Duration::from_secs(45),
        ..Shape::steady(Duration::from_secs(20))
    };
    let Some((report, blocked, unacked, backlog)) =
        txn_steady_run("steady-legacy", shape, true).await
    else {
        return;
    };
    let missed = steady_shortfalls(&report, &blocked, unacked, backlog);
    println!("steady-legacy: missed {missed:?}");
    assert!(
        !missed.is_empty(),
        "the legacy consumer met the bar: {report:?} {blocked:?}"
    );
}

/// The bulk shape: 2,100 messages produced first, then consumed as above; unacked ends at
/// exactly 0 (it ended at 1 to 12 before the fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_shape_ends_with_nothing_unacked() {
    use broker_tools::txn_steady::Shape;
    let Some((report, _, unacked, backlog)) =
        txn_steady_run("bulk", Shape::bulk(2_100), false).await
    else {
        return;
    };
    assert!(report.drained, "{report:?}");
    assert_eq!(report.committed, 2_100, "{report:?}");
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(report.commits_refused, 0, "{report:?}");
    assert_eq!((unacked, backlog), (0, 0));
}

// ----- Key_Shared ---------------------------------------------------------------------------

/// Messages of key `key-K` carry `key-K/i`.
fn keyed_payload(k: usize, i: usize) -> String {
    format!("key-{k}/{i}")
}

/// A Key_Shared consumer named `name` with `policy`, acks grouped for 10 ms.
async fn key_shared_consumer(
    broker: &RealBroker,
    name: &str,
    policy: KeySharedPolicy,
) -> Result<Consumer, Error> {
    Consumer::builder(&broker.client, &broker.topic, SUB)
        .options(
            integration_tests::real_pulsar::consumer_options()
                .sub_type(SubType::KeyShared)
                .key_shared_policy(policy)
                .name(name)
                .ack_group_time(Duration::from_millis(10))
                .initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
}

/// A key-based batching producer (10 messages or 20 ms a batch).
async fn key_based_producer(broker: &RealBroker) -> Producer {
    let batching = BatchingOptions::default()
        .max_messages(10)
        .max_delay(Duration::from_millis(20))
        .key_based(true);
    Producer::builder(&broker.client, &broker.topic)
        .batching(batching)
        .build()
        .await
        .expect("producer created")
}

/// Sends `per_key` messages of each of `keys` keys interleaved, all at once.
async fn send_keyed(producer: &Producer, keys: usize, per_key: usize) -> Vec<MessageId> {
    let sends = (0..per_key).flat_map(|i| {
        (0..keys).map(move |k| {
            producer.send(OutgoingMessage::new(keyed_payload(k, i)).key(format!("key-{k}")))
        })
    });
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, Error>>()
        .expect("every send succeeds")
}

/// Receives from both consumers, acking each message, until `expected` arrived and then
/// nothing more for 1 s; panics when delivery stops for [`PATIENCE`] before that.
async fn receive_key_shared(a: &Consumer, b: &Consumer, expected: usize) -> [Vec<Message>; 2] {
    let mut received = [Vec::new(), Vec::new()];
    loop {
        let total = received[0].len() + received[1].len();
        let wait = if total >= expected {
            Duration::from_secs(1)
        } else {
            PATIENCE
        };
        let (slot, message) = tokio::select! {
            message = a.receive() => (0, message),
            message = b.receive() => (1, message),
            () = tokio::time::sleep(wait) => {
                assert!(total >= expected, "delivery stopped at {total} of {expected}");
                break;
            }
        };
        let message = message.expect("received");
        let consumer = if slot == 0 { a } else { b };
        consumer.ack(&message).await.expect("ack queued");
        received[slot].push(message);
    }
    received
}

/// Each key reached one consumer, in order, every message once; no entry holds two keys.
/// Returns the keys of each consumer and the number of entries that held more than one
/// message.
fn check_key_shared(
    received: &[Vec<Message>; 2],
    keys: usize,
    per_key: usize,
) -> ([Vec<String>; 2], usize) {
    let mut owner: std::collections::BTreeMap<String, usize> = Default::default();
    let mut next: std::collections::HashMap<String, usize> = Default::default();
    let mut entries: std::collections::HashMap<(u64, u64), (String, u32)> = Default::default();
    for (consumer, messages) in received.iter().enumerate() {
        for message in messages {
            let key = message.key().expect("a key").to_owned();
            let at = *owner.entry(key.clone()).or_insert(consumer);
            assert_eq!(at, consumer, "{key} reached both consumers");
            let expected = next.entry(key.clone()).or_default();
            let payload = std::str::from_utf8(message.payload()).expect("text");
            assert_eq!(
                payload,
                format!("{key}/{expected}"),
                "{key}: out of order or duplicated"
            );
            *expected += 1;
            let id = message.id();
            let entry = entries
                .entry((id.ledger_id(), id.entry_id()))
                .or_insert_with(|| (key.clone(), id.batch_size().unwrap_or(1)));
            assert_eq!(entry.0, key, "entry {id} holds two keys");
        }
    }
    assert_eq!(owner.len(), keys, "every key arrived: {owner:?}");
    assert!(next.values().all(|n| *n == per_key), "{next:?}");
    let mut per_consumer = [Vec::new(), Vec::new()];
    for (key, consumer) in owner {
        per_consumer[consumer].push(key);
    }
    let batches = entries.values().filter(|(_, size)| *size > 1).count();
    (per_consumer, batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_shared_consumers_get_whole_keys_in_order_from_key_based_batches() {
    let Some(broker) = real_broker("key_shared").await else {
        return;
    };
    // A message whose sequence id is not above the last stored one would be dropped.
    broker
        .admin
        .set_deduplication(&broker.topic, true, Duration::from_secs(60))
        .await
        .expect("deduplication on");
    let a = key_shared_consumer(&broker, "ks-a", KeySharedPolicy::auto_split())
        .await
        .expect("a subscribed");
    let b = key_shared_consumer(&broker, "ks-b", KeySharedPolicy::auto_split())
        .await
        .expect("b subscribed");
    let producer = key_based_producer(&broker).await;
    let (keys, per_key) = (20, 50);
    let ids = send_keyed(&producer, keys, per_key).await;
    let mut by_entry: std::collections::BTreeMap<(u64, u64), Vec<usize>> = Default::default();
    for (n, id) in ids.iter().enumerate() {
        by_entry
            .entry((id.ledger_id(), id.entry_id()))
            .or_default()
            .push(n % keys);
    }
    assert!(
        by_entry.values().all(|ks| ks.iter().all(|k| *k == ks[0])),
        "the receipts put two keys in one entry"
    );
    let received = receive_key_shared(&a, &b, keys * per_key).await;
    let (per_consumer, batches) = check_key_shared(&received, keys, per_key);
    println!(
        "key_shared: {} entries ({batches} with more than one message) for {} messages; \
         a has {} keys ({} messages), b has {} keys ({} messages)",
        by_entry.len(),
        ids.len(),
        per_consumer[0].len(),
        received[0].len(),
        per_consumer[1].len(),
        received[1].len()
    );
    assert!(batches >= keys, "messages were batched");
    assert!(
        per_consumer.iter().all(|k| !k.is_empty()),
        "the broker spread the keys over both consumers: {per_consumer:?}"
    );
    a.flush_acks().await;
    b.flush_acks().await;
    broker
        .wait_for("drained with both consumers connected", |s| {
            s.consumers.len() == 2 && s.is_drained()
        })
        .await;
    a.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("a closed");
    b.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("b closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_shared_sticky_ranges_follow_the_murmur3_key_hash() {
    let Some(broker) = real_broker("key_shared_sticky").await else {
        return;
    };
    let low = HashRange::new(0, 32767);
    let a = key_shared_consumer(&broker, "ks-low", KeySharedPolicy::sticky([low]))
        .await
        .expect("low subscribed");
    let b = key_shared_consumer(
        &broker,
        "ks-high",
        KeySharedPolicy::sticky([HashRange::new(32768, 65535)]),
    )
    .await
    .expect("high subscribed");
    // What the broker refuses: an overlapping range, and another mode.
    let refusal = |result: Result<Consumer, Error>| match result {
        Err(Error::Server { code, message, .. }) => (code, message),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    };
    let (code, message) = refusal(
        key_shared_consumer(
            &broker,
            "ks-overlap",
            KeySharedPolicy::sticky([HashRange::new(100, 200)]),
        )
        .await,
    );
    println!("key_shared_sticky: an overlapping range: code {code}: {message}");
    assert_eq!(
        code,
        pulsar_wire::pb::ServerError::ConsumerAssignError as i32
    );
    let (code, message) =
        refusal(key_shared_consumer(&broker, "ks-auto", KeySharedPolicy::auto_split()).await);
    println!("key_shared_sticky: AUTO_SPLIT on a STICKY subscription: code {code}: {message}");
    assert_eq!(code, pulsar_wire::pb::ServerError::ConsumerBusy as i32);

    let producer = key_based_producer(&broker).await;
    let (keys, per_key) = (20, 5);
    send_keyed(&producer, keys, per_key).await;
    let received = receive_key_shared(&a, &b, keys * per_key).await;
    let (per_consumer, _) = check_key_shared(&received, keys, per_key);
    for (consumer, keys) in per_consumer.iter().enumerate() {
        for key in keys {
            let hash = sticky_key_hash(key.as_bytes());
            assert_eq!(
                usize::from(!low.contains(hash)),
                consumer,
                "{key} hashes to {hash}"
            );
        }
    }
    println!(
        "key_shared_sticky: low has {:?}, high has {:?}",
        per_consumer[0], per_consumer[1]
    );
    a.flush_acks().await;
    b.flush_acks().await;
    broker
        .wait_for("drained with both consumers connected", |s| {
            s.consumers.len() == 2 && s.is_drained()
        })
        .await;
    a.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("a closed");
    b.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("b closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    broker.done();
}

// ----- Outages (issue 13) -----------------------------------------------------------------

/// Runs [`integration_tests::outage`]'s stream at 100 msg/s for `seconds` with `faults`.
async fn outage_run(
    broker: &RealBroker,
    seconds: u64,
    faults: Vec<(Duration, integration_tests::outage::Fault)>,
) -> integration_tests::outage::Report {
    let stream = integration_tests::outage::Stream {
        rate: 100,
        produce_for: Duration::from_secs(seconds),
        patience: Duration::from_secs(60),
    };
    let report = integration_tests::outage::run(
        &broker.client,
        &broker.admin,
        &broker.topic,
        &stream,
        faults,
    )
    .await;
    println!("{}: {report:?}", broker.scenario);
    report
}

/// The topic unloaded 5 times through the admin API while a batching producer and a Shared
/// consumer stream at 100 msg/s: both come back by themselves after each `CLOSE_PRODUCER` /
/// `CLOSE_CONSUMER`, no send or receive fails, every payload arrives, and the broker ends
/// with nothing unacknowledged. (Before, the first unload ended the consumer for good and
/// the producer's next send hung until the operation timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_five_unloads_of_its_topic() {
    let Some(broker) = real_broker("unloads").await else {
        return;
    };
    let faults = (1..=5u64)
        .map(|k| {
            let admin = broker.admin.clone();
            let topic = broker.topic.clone();
            let fault: integration_tests::outage::Fault = Box::new(move || {
                Box::pin(async move {
                    admin.unload(&topic).await.expect("unloaded");
                })
            });
            (Duration::from_millis(1_500 * k), fault)
        })
        .collect();
    let report = outage_run(&broker, 9, faults).await;
    let missed = report.shortfalls();
    assert!(missed.is_empty(), "{missed:?}: {report:?}");
    assert_eq!(report.sent, 900, "{report:?}");
    assert!(report.producer_reconnects >= 5, "{report:?}");
    assert!(report.consumer_reconnects >= 5, "{report:?}");
}

/// Receives whatever arrives within `quiet` of the last delivery (at most `limit`), by payload.
async fn receive_while_flowing(consumer: &Consumer, quiet: Duration, limit: usize) -> Vec<Message> {
    let mut messages = Vec::new();
    while messages.len() < limit {
        match within(quiet, consumer.receive()).await {
            Some(message) => messages.push(message.expect("received")),
            None => break,
        }
    }
    messages
}

fn payload_of(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

/// A transaction open across an unload of its topic: half of the received messages are
/// acknowledged in it and half of its messages produced before the unload, the rest after;
/// then it commits. The producer and the consumer come back by themselves, every operation
/// of the transaction succeeds or fails with a retryable error (and is then done again), the
/// commit succeeds, the messages produced in the transaction arrive once it is committed,
/// the ones acknowledged in it never come again after the commit, and the subscription
/// drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_open_across_an_unload_commits() {
    let Some(broker) = real_broker("txn-unload").await else {
        return;
    };
    let consumer = broker
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = broker.producer(4).await;
    send_all(&producer, 12).await;
    let before = receive(&consumer, 12).await;
    let txn = broker.new_txn().await;
    let mut retried = 0u32;
    for message in &before[..6] {
        consumer
            .ack_in(&txn, message)
            .await
            .expect("acked in the transaction");
    }
    for i in 0..4 {
        producer
            .send_in(&txn, OutgoingMessage::new(format!("t{i}")))
            .await
            .expect("sent in the transaction");
    }
    broker.admin.unload(&broker.topic).await.expect("unloaded");
    // Whatever the broker sends again once the consumer is back: the six messages not yet
    // acknowledged may come again; none of the six acknowledged in the open transaction, nor
    // anything produced in it, may.
    let again = receive_while_flowing(&consumer, Duration::from_secs(3), 100).await;
    let again_payloads: Vec<String> = again.iter().map(payload_of).collect();
    println!("txn-unload: after the unload the broker sent {again_payloads:?}");
    for payload in &again_payloads {
        let acked_in_txn = before[..6].iter().any(|m| &payload_of(m) == payload);
        assert!(
            !acked_in_txn && !payload.starts_with('t'),
            "{payload} came while the transaction was open: {again_payloads:?}"
        );
    }
    // The rest acknowledged in the transaction, through the copies when they came again.
    for message in &before[6..] {
        let latest = again
            .iter()
            .rev()
            .find(|m| payload_of(m) == payload_of(message))
            .unwrap_or(message);
        loop {
            match consumer.ack_in(&txn, latest).await {
                Ok(()) => break,
                Err(error) if error.is_retryable() && retried < 20 => {
                    retried += 1;
                    println!(
                        "txn-unload: ack_in {}: {error} (retrying)",
                        payload_of(latest)
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("ack_in {} after the unload: {error}", payload_of(latest)),
            }
        }
    }
    for i in 4..8 {
        loop {
            match producer
                .send_in(&txn, OutgoingMessage::new(format!("t{i}")))
                .await
            {
                Ok(_) => break,
                Err(error) if error.is_retryable() && retried < 20 => {
                    retried += 1;
                    println!("txn-unload: send_in t{i}: {error} (retrying)");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("send_in t{i} after the unload: {error}"),
            }
        }
    }
    txn.commit()
        .await
        .expect("the transaction commits after the unload");
    assert_eq!(txn.state(), TxnState::Committed);
    // Everything produced in it arrives; nothing acknowledged in it comes again.
    let after = receive_while_flowing(&consumer, Duration::from_secs(5), 100).await;
    let after_payloads: Vec<String> = after.iter().map(payload_of).collect();
    println!("txn-unload: after the commit {after_payloads:?} ({retried} retries)");
    let mut produced: Vec<String> = after_payloads
        .iter()
        .filter(|p| p.starts_with('t'))
        .cloned()
        .collect();
    produced.sort();
    produced.dedup();
    assert_eq!(
        produced,
        (0..8).map(|i| format!("t{i}")).collect::<Vec<_>>(),
        "{after_payloads:?}"
    );
    assert!(
        after_payloads.iter().all(|p| p.starts_with('t')),
        "a message acknowledged in the committed transaction came again: {after_payloads:?}"
    );
    for message in &after {
        consumer.ack(message).await.expect("acked");
    }
    consumer.flush_acks().await;
    broker.assert_drained().await;
    assert!(producer.reconnects() >= 1, "the producer never reconnected");
    assert!(
        consumer.stats().reconnects >= 1,
        "the consumer never reconnected"
    );
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("consumer closed");
    broker.done();
}

/// CPU time (user + system) this process has used so far.
fn process_cpu() -> Duration {
    broker_tools::cpu::own()
}

/// Restarts the plain standalone on its data with `scripts/brokers/pulsar restart`
/// (`--kill` for kill -9); returns how long it took and the CPU this process used meanwhile.
async fn restart_broker(kill: bool) -> (Duration, Duration) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/brokers/pulsar");
    let started = Instant::now();
    let cpu = process_cpu();
    let status = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(script);
        command.arg("restart");
        if kill {
            command.arg("--kill");
        }
        command.status()
    })
    .await
    .expect("joined")
    .expect("the restart script runs");
    assert!(status.success(), "the restart failed: {status}");
    (started.elapsed(), process_cpu().saturating_sub(cpu))
}

/// The plain broker, for a test that restarts it: only when `PULSAR_RESTARTABLE` is set
/// (`scripts/test-real-brokers` sets it for the phase that may restart the broker).
///
/// First waits until the broker delivers a message on a fresh topic ([`until_dispatching`]):
/// the test before may have restarted it.
async fn restartable_broker(scenario: &'static str) -> Option<RealBroker> {
    if var("PULSAR_RESTARTABLE").is_none() {
        eprintln!("PULSAR_RESTARTABLE is not set: not restarting the broker; skipping");
        return None;
    }
    until_dispatching().await;
    real_broker(scenario).await
}

/// The longest [`until_dispatching`] waits.
///
/// Why: a restarted 4.0.8 standalone recovers each loaded topic's transaction buffer from the
/// namespace's `__transaction_buffer_snapshot` on one thread, and a topic dispatches nothing
/// until its own recovery ran. In one CI run (2026-12-07, ~650 topics loaded again after the
/// restart) one topic's snapshot read hung until its 30 s timeout (`TimeoutException` in
/// `TableView.wait`, then "Transaction buffer failed to recover snapshot!" at 03:54:35); a
/// fresh topic created at 03:54:20 got its message sent but delivered nothing until then, and
/// the next test's first receive (15 s) failed at 03:54:35.5.
///
/// Bound: that timeout is 30 s per stuck topic; 90 s leaves room for more than one.
const DISPATCH_AFTER_RESTART: Duration = Duration::from_secs(90);

/// Waits until the plain broker delivers a message sent to a fresh topic (its own scenario),
/// printing how long that took; panics after [`DISPATCH_AFTER_RESTART`].
async fn until_dispatching() {
    let Some(probe) = real_broker("ready-probe").await else {
        return;
    };
    let consumer = probe
        .shared(integration_tests::real_pulsar::consumer_options())
        .await;
    let producer = probe.producer(0).await;
    let asked = Instant::now();
    send_all(&producer, 1).await;
    let message = within(DISPATCH_AFTER_RESTART, consumer.receive())
        .await
        .unwrap_or_else(|| {
            panic!(
                "the broker delivered nothing on a fresh topic within {DISPATCH_AFTER_RESTART:?}"
            )
        })
        .expect("received");
    println!(
        "ready-probe: a fresh topic delivered in {:?}",
        asked.elapsed()
    );
    consumer.ack(&message).await.expect("acked");
    consumer.flush_acks().await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("probe consumer closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("probe producer closed");
}

/// The broker restarted mid-stream (stopped with TERM, or killed with -9, and started again
/// on the same data, 10 to 25 s down) while a batching producer and a Shared consumer stream
/// at 100 msg/s: both come back by themselves, sends made during the outage wait and
/// succeed, every payload arrives, nothing is left unacknowledged, and the client's CPU
/// stays low while the broker is down. (Before, every receive and send failed at once, for
/// good.)
async fn a_stream_survives_a_restart(scenario: &'static str, kill: bool) {
    let Some(broker) = restartable_broker(scenario).await else {
        return;
    };
    let outage = Arc::new(parking_lot::Mutex::new((Duration::ZERO, Duration::ZERO)));
    let fault: integration_tests::outage::Fault = Box::new({
        let outage = Arc::clone(&outage);
        move || {
            Box::pin(async move {
                *outage.lock() = restart_broker(kill).await;
            })
        }
    });
    let report = outage_run(&broker, 30, vec![(Duration::from_secs(5), fault)]).await;
    let (down, cpu) = *outage.lock();
    println!("{scenario}: the restart took {down:?}, the client used {cpu:?} of CPU meanwhile");
    let missed = report.shortfalls();
    assert!(missed.is_empty(), "{missed:?}: {report:?}");
    assert_eq!(report.sent, 3_000, "{report:?}");
    assert!(report.producer_reconnects >= 1, "{report:?}");
    assert!(report.consumer_reconnects >= 1, "{report:?}");
    // Producing goes on meanwhile (100 msg/s into the pending queue); no spinning.
    assert!(cpu < down / 4, "{cpu:?} of CPU in {down:?}");
}

/// The same after a restart: as after an unload, the topic is loaded again without a
/// dispatcher, and the next consumer gets the message once with a redelivery count of 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_after_a_restart_while_no_consumer_is_connected_delivers_the_message_once() {
    let Some(broker) = restartable_broker("abort-alone-restart").await else {
        return;
    };
    let counts = abort_while_no_consumer_is_connected(&broker, WhileAlone::Restart).await;
    assert_eq!(counts, vec![0]);
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_the_broker_stopped_and_started_again() {
    a_stream_survives_a_restart("restart-term", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_the_broker_killed_and_started_again() {
    a_stream_survives_a_restart("restart-kill", true).await;
}
