//! Transactions through outages: a transaction open across an unload or a broker restart
//! commits; a commit while the broker is down fails with a retryable error and leaves the
//! transaction open, to be committed or aborted once the broker is back; and a property test
//! of random sends, transactional sends, plain and transactional acks, commits, aborts,
//! dropped connections, unloads and restarts.
//!
//! The property test checks: every message sent plainly or in a committed transaction is
//! delivered (at least once); none sent only in aborted transactions ever is, nor one of a
//! transaction before it commits; nothing acknowledged plainly or in a committed
//! transaction comes again by id; the emulator counts no ack of an entry already deleted
//! and no transactional conflict (no message acknowledged twice); it ends with nothing
//! unacknowledged, no open transaction, no pending transactional entry and no consumer kept
//! for its pending acks. What the client guarantees about failures, and the test holds it
//! to: an operation of a transaction that fails because of an outage fails with a retryable
//! error ([`Error::is_retryable`]); any failed `send_in` or `ack_in` makes the commit refuse
//! ([`Error::TransactionFailed`]) so that the transaction is aborted, and then everything it
//! acknowledged comes again and nothing it sent is delivered; a commit or abort that fails
//! retryably leaves the transaction open in the client ([`TxnState::Open`]), and may be
//! repeated (a repeated commit of a committed transaction succeeds) or followed by an abort
//! (refused with `InvalidTxnStatus` when the commit went through, which the test reads as
//! committed).
//!
//! All of it runs on a current-thread runtime with tokio's clock paused: the restarts' down
//! times, the clients' backoffs and the receive windows pass in virtual time.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use proptest::prelude::*;
use pulsar_wire::ServerError;
use pulsar_wire::{
    Consumer, ConsumerOptions, Error, Message, MessageId, OutgoingMessage, Producer, Transaction,
    TxnState,
};
use pulsar_wire_emulator::EmulatorConfig;
use tokio::task::JoinHandle;

use crate::support::{PATIENCE, Setup, producer_options, receive, within};

/// Long enough never to time out in a test, virtual time included.
const TXN_TIMEOUT: Duration = Duration::from_secs(3600);

/// Runs `test` on a current-thread runtime whose clock is paused.
fn paused<F: Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(test);
}

/// The emulator configured as the real-broker scripts configure 4.0.8: batch-index
/// acknowledgement on. Without it a 4.0.x broker with transactions on keeps a partial ack's
/// set in its pending-ack state (`syncBatchPositionAckSetForTransaction`), dispatches the
/// entry again with it, and then takes the whole batch off for the whole-entry ack: the
/// consumer's count ends below 0 (the earlier consumer's resync without ids hid that).
fn broker_config() -> EmulatorConfig {
    EmulatorConfig::default().batch_index_ack(true)
}

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

/// Waits (in tokio time) until every consumer's unacked count is 0 and nothing is blocked,
/// and the backlog of `topic` is 0; panics with the stats and `failures` otherwise.
async fn drained(setup: &Setup, topic: &str, failures: &[String]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let stats = setup.stats();
        if stats.consumers().all(|c| c.unacked == 0 && !c.blocked) && stats.backlog(topic) == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{topic} did not drain: {:#?}; failures {failures:#?}",
            stats.topic(topic)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn text(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

/// What happens to the broker while the transaction is open.
#[derive(Debug, Clone, Copy)]
enum Outage {
    None,
    Unload,
    Restart,
}

/// A transaction acks three messages and sends two, the outage happens, it acks a fourth
/// and sends a third, and commits: its sends arrive, its acks never come again, messages
/// acked plainly before and after the outage do not come again, and the emulator drains.
/// With `per_batch` 3, m0..m2 are one batch and m3, m4 another; m5 is an entry of its own.
/// The transaction acknowledges m0..m2 before the outage and m5 after it; m3 is acknowledged
/// plainly before, m4 after. (The indexes of one batch acknowledged in a transaction through
/// two registrations of the consumer, before and after an outage, are left alone: see the
/// emulator's "What is not modelled".)
async fn open_across(outage: Outage, per_batch: usize) {
    let topic = "txn-across";
    let setup = Setup::new(broker_config()).await;
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, per_batch).await;
    let sends = (0..5).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
    producer
        .send(OutgoingMessage::new("m5"))
        .await
        .expect("sent");
    let before = receive(&consumer, 6).await;
    if per_batch == 3 {
        let entry = |m: &Message| (m.id().ledger_id(), m.id().entry_id());
        assert!(before[..3].iter().all(|m| entry(m) == entry(&before[0])));
        assert_eq!(entry(&before[3]), entry(&before[4]));
        assert_ne!(entry(&before[0]), entry(&before[3]));
        assert_ne!(entry(&before[5]), entry(&before[3]));
    }
    let txn = new_txn(&setup).await;
    for message in &before[..3] {
        consumer.ack_in(&txn, message).await.expect("acked in");
    }
    producer
        .send_in(&txn, OutgoingMessage::new("t0"))
        .await
        .expect("sent in");
    producer
        .send_in(&txn, OutgoingMessage::new("t1"))
        .await
        .expect("sent in");
    consumer.ack(&before[3]).await.expect("acked");
    consumer.flush_acks().await;

    match outage {
        Outage::None => {}
        Outage::Unload => {
            let (producers, consumers) = setup.emulator.unload(topic);
            assert_eq!((producers, consumers), (1, 1));
        }
        Outage::Restart => {
            let dropped = setup
                .emulator
                .restart(Duration::from_secs(3))
                .await
                .expect("restarted");
            assert!(dropped >= 1, "the client's connection was dropped");
        }
    }

    // The same transaction goes on: a send and an ack after the outage (the ack of a message
    // received before it, which the broker delivered again to the consumer's new
    // registration: the client holds the copy, the application still has the message).
    producer
        .send_in(&txn, OutgoingMessage::new("t2"))
        .await
        .expect("sent in after the outage");
    consumer
        .ack_in(&txn, &before[5])
        .await
        .expect("acked in after the outage");
    consumer.ack(&before[4]).await.expect("acked");
    txn.commit().await.expect("committed after the outage");
    assert_eq!(txn.state(), TxnState::Committed);

    let mut expected: HashSet<String> = ["t0", "t1", "t2"].map(String::from).into();
    let mut settled: HashSet<MessageId> = before.iter().map(Message::id).collect();
    while !expected.is_empty() {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("never received {expected:?}"))
            .expect("received");
        let payload = text(&message);
        assert!(
            !settled.contains(&message.id()),
            "{payload} ({}) was acknowledged and came again",
            message.id()
        );
        assert!(
            payload.starts_with('t'),
            "{payload} was acknowledged and came again"
        );
        expected.remove(&payload);
        consumer.ack(&message).await.expect("acked");
        settled.insert(message.id());
    }
    consumer.flush_acks().await;
    drained(&setup, topic, &[]).await;
    if let Some(message) = within(Duration::from_secs(2), consumer.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| text(&m)));
    }
    let stats = setup.stats();
    assert_eq!(stats.transactions.open, 0);
    assert_eq!(stats.transactions.committed, 1);
    let subscription = stats.subscription(topic, "sub").expect("the subscription");
    assert_no_ack_but_resends_twice(subscription.acks_of_deleted, &consumer);
    assert_eq!(subscription.conflicts, 0, "{subscription:#?}");
    match outage {
        Outage::None | Outage::Unload => assert_eq!(stats.faults.restarts, 0),
        Outage::Restart => assert_eq!(stats.faults.restarts, 1),
    }
}

#[test]
fn a_transaction_open_without_an_outage_commits() {
    paused(open_across(Outage::None, 0));
    paused(open_across(Outage::None, 3));
}

#[test]
fn a_transaction_open_across_an_unload_commits() {
    paused(open_across(Outage::Unload, 0));
    paused(open_across(Outage::Unload, 3));
}

#[test]
fn a_transaction_open_across_a_restart_commits() {
    paused(open_across(Outage::Restart, 0));
    paused(open_across(Outage::Restart, 3));
}

/// A commit while the broker is down fails with a retryable error and leaves the
/// transaction open; once the broker is back, committing again commits (`commit`) or
/// aborting aborts it, with nothing half-acknowledged either way.
async fn commit_while_down(then_commit: bool) {
    let topic = "txn-down";
    let setup = Setup::new(broker_config()).await;
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    producer
        .send(OutgoingMessage::new("m0"))
        .await
        .expect("sent");
    let m0 = receive(&consumer, 1).await.remove(0);
    let txn = new_txn(&setup).await;
    consumer.ack_in(&txn, &m0).await.expect("acked in");
    producer
        .send_in(&txn, OutgoingMessage::new("t0"))
        .await
        .expect("sent in");

    setup.emulator.take_down().await;
    let error = txn.commit().await.expect_err("the broker is down");
    assert!(error.is_retryable(), "not retryable: {error}");
    assert!(
        error.to_string().contains("stays open"),
        "the error says what became of the transaction: {error}"
    );
    assert_eq!(txn.state(), TxnState::Open, "{error}");
    let stats = setup.stats();
    assert_eq!(stats.transactions.open, 1, "the coordinator keeps it");
    setup.emulator.bring_up().await.expect("up again");

    if then_commit {
        txn.commit()
            .await
            .expect("committed once the broker is back");
        let t0 = within(PATIENCE, consumer.receive())
            .await
            .expect("t0 arrives")
            .expect("received");
        assert_eq!(text(&t0), "t0");
        consumer.ack(&t0).await.expect("acked");
    } else {
        txn.abort().await.expect("aborted once the broker is back");
        // m0 comes again (its transactional ack was rolled back); t0 never.
        let again = within(PATIENCE, consumer.receive())
            .await
            .expect("m0 comes again")
            .expect("received");
        assert_eq!(text(&again), "m0");
        consumer.ack(&again).await.expect("acked");
    }
    consumer.flush_acks().await;
    drained(&setup, topic, &[]).await;
    if let Some(message) = within(Duration::from_secs(2), consumer.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| text(&m)));
    }
    let stats = setup.stats();
    assert_eq!(stats.transactions.open, 0);
    let topic_stats = stats.topic(topic).expect("the topic");
    assert_eq!(topic_stats.pending_txn_entries, 0);
    assert_eq!(
        topic_stats.aborted_entries,
        u64::from(!then_commit),
        "{topic_stats:#?}"
    );
    let subscription = stats.subscription(topic, "sub").expect("the subscription");
    assert_no_ack_but_resends_twice(subscription.acks_of_deleted, &consumer);
    assert_eq!(subscription.conflicts, 0, "{subscription:#?}");
}

/// Entries acknowledged again after they were deleted come only from the consumer's resent
/// acks: a redelivered copy of a message the application acknowledged outside a transaction
/// is acknowledged again whatever was sent before, because the client cannot know whether
/// its first ack reached the broker, and a lost one would leave the message unacknowledged
/// for good; the broker ignores an ack of a deleted entry.
///
/// Widened in c6673b4 (2026-12-02) from 0 acks of deleted entries, when the client stopped
/// skipping the ack of such a copy whose first ack had gone out on the same link or was still
/// grouped. The bound is not a tolerance measured on a broker: it is the consumer's own count
/// of acks it sent again (`ConsumerStats::acks_resent`), so an ack of a deleted entry the
/// client did not count as resent still fails. No counts from runs are recorded in the
/// history; the failure message prints both.
fn assert_no_ack_but_resends_twice(acks_of_deleted: u64, consumer: &pulsar_wire::Consumer) {
    let resent = consumer.stats().acks_resent;
    assert!(
        acks_of_deleted <= resent,
        "{acks_of_deleted} acks of deleted entries, {resent} acks resent by the consumer"
    );
}

#[test]
fn a_commit_while_the_broker_is_down_fails_retryably_then_commits() {
    paused(commit_while_down(true));
}

#[test]
fn a_commit_while_the_broker_is_down_fails_retryably_then_aborts() {
    paused(commit_while_down(false));
}

/// What happens between the last consumer's close and the abort.
#[derive(Debug, Clone, Copy)]
enum WhileAlone {
    Nothing,
    Unload,
    Restart,
}

/// m0 is acknowledged in a transaction by a Shared consumer that then closes (and the topic
/// is unloaded or the broker restarted, as `between` says); the transaction is aborted while
/// no consumer is connected; a new consumer subscribes and gets m0 once, with
/// `redelivery_count`, and the subscription drains once it is acknowledged. As on a 4.0.8
/// broker (the real-broker tests of the same names): the abort adds m0 to the replay set of
/// the subscription's dispatcher, if it has one (none after an unload or a restart, and then
/// it counts no redelivery either); the first consumer's `addConsumer` clears the replay set
/// and rewinds the cursor, and m0 is read from it once. (The emulator used to keep the
/// abort's replay as well and sent m0 twice; the client handed the copy over once, and the
/// consumer's count stayed at 1.)
async fn abort_while_no_consumer_is_connected(between: WhileAlone, redelivery_count: u32) {
    let topic = "abort-alone";
    let setup = Setup::new(broker_config()).await;
    let first = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    producer
        .send(OutgoingMessage::new("m0"))
        .await
        .expect("sent");
    let m0 = receive(&first, 1).await.remove(0);
    let txn = new_txn(&setup).await;
    first.ack_in(&txn, &m0).await.expect("acked in");
    first
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    match between {
        WhileAlone::Nothing => {}
        WhileAlone::Unload => {
            assert_eq!(setup.emulator.unload(topic), (1, 0));
        }
        WhileAlone::Restart => {
            setup
                .emulator
                .restart(Duration::from_secs(1))
                .await
                .expect("restarted");
        }
    }
    txn.abort().await.expect("aborted");
    let second = setup.shared(topic, ConsumerOptions::default()).await;
    let again = within(PATIENCE, second.receive())
        .await
        .expect("m0 comes again")
        .expect("received");
    assert_eq!(again.id(), m0.id());
    assert_eq!(again.redelivery_count(), redelivery_count, "{between:?}");
    second.ack(&again).await.expect("acked");
    second.flush_acks().await;
    drained(&setup, topic, &[]).await;
    if let Some(message) = within(Duration::from_secs(2), second.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| text(&m)));
    }
    let stats = setup.stats();
    let subscription = stats.subscription(topic, "sub").expect("the subscription");
    let dispatched: Vec<u64> = subscription
        .consumers
        .iter()
        .map(|c| c.dispatched_entries)
        .collect();
    assert_eq!(dispatched, vec![1], "m0 sent once: {subscription:#?}");
    assert_eq!(second.stats().duplicates, 0, "{:?}", second.stats());
}

#[test]
fn an_abort_while_no_consumer_is_connected_delivers_the_message_once() {
    paused(abort_while_no_consumer_is_connected(WhileAlone::Nothing, 1));
}

#[test]
fn an_abort_after_an_unload_while_no_consumer_is_connected_delivers_the_message_once() {
    paused(abort_while_no_consumer_is_connected(WhileAlone::Unload, 0));
}

#[test]
fn an_abort_after_a_restart_while_no_consumer_is_connected_delivers_the_message_once() {
    paused(abort_while_no_consumer_is_connected(WhileAlone::Restart, 0));
}

// ----- the property test ---------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    /// Starts this many plain sends (not awaited).
    Send(usize),
    /// Starts this many sends in the current transaction (not awaited; its end waits).
    SendIn(usize),
    /// Receives up to this many messages; each is acknowledged in the current transaction
    /// when `in_txn`, else plainly.
    Receive { n: usize, in_txn: bool },
    /// Ends the current transaction.
    End { commit: bool },
    /// Unloads the topic.
    Unload,
    /// Drops every connection.
    Disconnect,
    /// Restarts the broker with this many milliseconds down.
    Restart(u64),
    /// Commits while the broker is down (must fail, retryably), then brings it up and
    /// commits again (`retry`) or aborts.
    CommitWhileDown { retry: bool },
    /// Commits while the broker restarts; on a retryable failure commits again (`retry`) or
    /// aborts.
    CommitDuringRestart { down_ms: u64, retry: bool },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..12).prop_map(Step::Send),
        3 => (1usize..12).prop_map(Step::SendIn),
        4 => ((1usize..15), any::<bool>()).prop_map(|(n, in_txn)| Step::Receive { n, in_txn }),
        2 => any::<bool>().prop_map(|commit| Step::End { commit }),
        1 => Just(Step::Unload),
        1 => Just(Step::Disconnect),
        1 => (0u64..3000).prop_map(Step::Restart),
        1 => any::<bool>().prop_map(|retry| Step::CommitWhileDown { retry }),
        1 => ((0u64..2000), any::<bool>())
            .prop_map(|(down_ms, retry)| Step::CommitDuringRestart { down_ms, retry }),
    ]
}

/// The open transaction and what the test did in it.
struct OpenTxn {
    number: usize,
    txn: Transaction,
    sends: Vec<(String, JoinHandle<Result<MessageId, Error>>)>,
    /// Sends that ended, with their results.
    sent: Vec<(String, Result<MessageId, Error>)>,
    /// (id, payload) acknowledged in it (or attempted, when the ack failed).
    acks: Vec<(MessageId, String)>,
    /// An operation failed: the commit must be refused and the transaction aborted.
    poisoned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Committed,
    Aborted,
}

/// The oracle.
#[derive(Default)]
struct Model {
    next: usize,
    txns: usize,
    plain_sends: Vec<(String, JoinHandle<Result<MessageId, Error>>)>,
    /// Payloads that must be received and settled: plain sends and committed sends.
    must: HashSet<String>,
    /// Payloads of transactional sends that failed in a transaction that committed: they may
    /// or may not be there.
    maybe: HashSet<String>,
    /// Transaction number → how it ended.
    fates: HashMap<usize, Fate>,
    /// Payloads acknowledged plainly or in a committed transaction.
    settled: HashSet<String>,
    /// Ids acknowledged plainly or in a committed transaction: never delivered again.
    settled_ids: HashSet<MessageId>,
    /// Violations seen.
    violations: Vec<String>,
    /// Transactional operations that failed, with their errors.
    failures: Vec<String>,
}

impl Model {
    fn check_delivery(&mut self, message: &Message) {
        let payload = text(message);
        if let Some(number) = payload
            .strip_prefix('t')
            .and_then(|rest| rest.split('-').next())
            .and_then(|n| n.parse::<usize>().ok())
            && self.fates.get(&number) != Some(&Fate::Committed)
        {
            self.violations.push(format!(
                "{payload} of transaction {number} ({:?}) was delivered",
                self.fates.get(&number)
            ));
        }
        if self.settled_ids.contains(&message.id()) {
            self.violations.push(format!(
                "{payload} ({}) was acknowledged and came again",
                message.id()
            ));
        }
    }

    fn settle(&mut self, id: MessageId, payload: String) {
        self.settled_ids.insert(id);
        self.settled.insert(payload);
    }
}

struct Run {
    setup: Setup,
    consumer: Consumer,
    producer: Producer,
    model: Model,
    open: Option<OpenTxn>,
}

const TOPIC: &str = "txn-outages";

impl Run {
    /// A new transaction; opening one may fail retryably right after an outage (the request
    /// went out on a connection that was dropped): it is tried again.
    async fn open_txn(&mut self) -> Transaction {
        for _ in 0..20 {
            let opened = match self.setup.client.transaction_coordinator().await {
                Ok(coordinator) => coordinator.new_transaction(TXN_TIMEOUT).await,
                Err(error) => Err(error),
            };
            match opened {
                Ok(txn) => return txn,
                Err(error) if error.is_retryable() => {
                    self.model
                        .failures
                        .push(format!("new transaction: {error}"));
                }
                Err(error) => panic!("no transaction: {error}"),
            }
        }
        panic!(
            "no transaction after 20 attempts: {:?}",
            self.model.failures
        );
    }

    async fn current(&mut self) -> &mut OpenTxn {
        if self.open.is_none() {
            let txn = self.open_txn().await;
            self.model.txns += 1;
            self.open = Some(OpenTxn {
                number: self.model.txns,
                txn,
                sends: Vec::new(),
                sent: Vec::new(),
                acks: Vec::new(),
                poisoned: false,
            });
        }
        self.open.as_mut().expect("just opened")
    }

    async fn receive(&mut self, n: usize, in_txn: bool) {
        for _ in 0..n {
            let Some(received) = within(Duration::from_millis(100), self.consumer.receive()).await
            else {
                break;
            };
            let message = received.expect("receive fails only for good");
            self.model.check_delivery(&message);
            let payload = text(&message);
            if in_txn {
                self.current().await;
                let open = self.open.as_mut().expect("open");
                let acked = self.consumer.ack_in(&open.txn, &message).await;
                open.acks.push((message.id(), payload));
                if let Err(error) = acked {
                    open.poisoned = true;
                    let failure = format!("ack_in of {}: {error}", message.id());
                    if !error.is_retryable() {
                        self.model
                            .violations
                            .push(format!("not retryable: {failure}"));
                    }
                    if matches!(error, Error::ConnectionLost { .. })
                        && !error.to_string().contains("abort it")
                    {
                        self.model
                            .violations
                            .push(format!("does not say to abort: {failure}"));
                    }
                    self.model.failures.push(failure);
                }
            } else {
                self.consumer.ack(&message).await.expect("acked");
                self.model.settle(message.id(), payload);
            }
        }
    }

    /// Ends the open transaction: `commit` first (a poisoned one must refuse), and after a
    /// retryable failure commits again (`retry`) or aborts, until the coordinator's answer
    /// says how it ended.
    async fn end(&mut self, commit: bool, retry: bool) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        self.wait_sends(&mut open).await;
        let mut first = Some(commit);
        let fate = self.settle_txn(&open, &mut first, retry).await;
        self.apply(open, fate).await;
    }

    /// Waits for the transaction's sends; a failed one poisons it (the client then refuses
    /// to commit it: the message may have been stored in it).
    async fn wait_sends(&mut self, open: &mut OpenTxn) {
        for (payload, send) in std::mem::take(&mut open.sends) {
            let sent = within(PATIENCE * 3, send)
                .await
                .unwrap_or_else(|| panic!("send of {payload} hung"))
                .expect("joined");
            if let Err(error) = &sent {
                let failure = format!("send of {payload} in {}: {error}", open.number);
                if !error.is_retryable() {
                    self.model
                        .violations
                        .push(format!("not retryable: {failure}"));
                }
                self.model.failures.push(failure);
                open.poisoned = true;
            }
            open.sent.push((payload, sent));
        }
    }

    async fn settle_txn(&mut self, open: &OpenTxn, first: &mut Option<bool>, retry: bool) -> Fate {
        for _ in 0..20 {
            let commit = first.take().unwrap_or(retry);
            let result = if commit {
                open.txn.commit().await
            } else {
                open.txn.abort().await
            };
            match result {
                Ok(()) if commit && open.poisoned => {
                    self.model.violations.push(format!(
                        "transaction {} committed though poisoned",
                        open.number
                    ));
                    return Fate::Committed;
                }
                Ok(()) => {
                    return if commit {
                        Fate::Committed
                    } else {
                        Fate::Aborted
                    };
                }
                Err(Error::TransactionFailed { .. }) if commit => {
                    if !open.poisoned {
                        self.model.violations.push(format!(
                            "transaction {} refused to commit with no failed operation",
                            open.number
                        ));
                    }
                    let aborted = open.txn.abort().await;
                    match aborted {
                        Ok(()) => return Fate::Aborted,
                        Err(error) if error.is_retryable() => {
                            self.model.failures.push(format!("abort: {error}"));
                            *first = Some(false);
                        }
                        Err(error) => panic!("abort of a poisoned transaction: {error}"),
                    }
                }
                Err(error) if error.server_error() == Some(ServerError::InvalidTxnStatus) => {
                    // An earlier END_TXN whose answer was lost went through.
                    return if commit {
                        Fate::Aborted
                    } else {
                        Fate::Committed
                    };
                }
                Err(error) if error.is_retryable() => {
                    assert_eq!(open.txn.state(), TxnState::Open, "after {error}");
                    self.model.failures.push(format!(
                        "{} of {}: {error}",
                        if commit { "commit" } else { "abort" },
                        open.number
                    ));
                }
                Err(error) => panic!(
                    "{} of transaction {} failed for good: {error}",
                    if commit { "commit" } else { "abort" },
                    open.number
                ),
            }
        }
        panic!("transaction {} could not be ended", open.number);
    }

    async fn apply(&mut self, open: OpenTxn, fate: Fate) {
        self.model.fates.insert(open.number, fate);
        assert!(open.sends.is_empty(), "sends waited for");
        for (payload, sent) in open.sent {
            match (fate, sent) {
                (Fate::Committed, Ok(_)) => {
                    self.model.must.insert(payload);
                }
                (Fate::Committed, Err(_)) => {
                    self.model.maybe.insert(payload);
                }
                (Fate::Aborted, _) => {}
            }
        }
        if fate == Fate::Committed {
            for (id, payload) in open.acks {
                self.model.settle(id, payload);
            }
        }
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Send(n) => {
                for _ in 0..n {
                    let producer = self.producer.clone();
                    let payload = format!("p{}", self.model.next);
                    self.model.next += 1;
                    let message = OutgoingMessage::new(payload.clone());
                    let send = tokio::spawn(async move { producer.send(message).await });
                    self.model.plain_sends.push((payload, send));
                }
                tokio::task::yield_now().await;
            }
            Step::SendIn(n) => {
                let producer = self.producer.clone();
                let open = self.current().await;
                for _ in 0..n {
                    let payload = format!("t{}-{}", open.number, open.sends.len());
                    let (producer, txn) = (producer.clone(), open.txn.clone());
                    let message = OutgoingMessage::new(payload.clone());
                    let send = tokio::spawn(async move { producer.send_in(&txn, message).await });
                    open.sends.push((payload, send));
                }
                tokio::task::yield_now().await;
            }
            Step::Receive { n, in_txn } => self.receive(n, in_txn).await,
            Step::End { commit } => self.end(commit, commit).await,
            Step::Unload => {
                self.setup.emulator.unload(TOPIC);
            }
            Step::Disconnect => {
                self.setup.emulator.disconnect_all();
            }
            Step::Restart(down_ms) => {
                self.setup
                    .emulator
                    .restart(Duration::from_millis(down_ms))
                    .await
                    .expect("restarted");
            }
            Step::CommitWhileDown { retry } => {
                let Some(mut open) = self.open.take() else {
                    return;
                };
                // A commit waits for the sends in flight in it, and those for the broker.
                self.wait_sends(&mut open).await;
                self.setup.emulator.take_down().await;
                let result = open.txn.commit().await;
                let mut next = match result {
                    Err(error) if error.is_retryable() => {
                        assert_eq!(open.txn.state(), TxnState::Open, "after {error}");
                        self.model
                            .failures
                            .push(format!("commit while down: {error}"));
                        Some(retry)
                    }
                    Err(Error::TransactionFailed { .. }) if open.poisoned => Some(true),
                    other => panic!("a commit while the broker is down: {other:?}"),
                };
                self.setup.emulator.bring_up().await.expect("up again");
                let fate = self.settle_txn(&open, &mut next, retry).await;
                self.apply(open, fate).await;
            }
            Step::CommitDuringRestart { down_ms, retry } => {
                let Some(mut open) = self.open.take() else {
                    return;
                };
                let emulator = &self.setup.emulator;
                let (committed, restarted) = tokio::join!(
                    open.txn.commit(),
                    emulator.restart(Duration::from_millis(down_ms))
                );
                restarted.expect("restarted");
                // The commit waited for the sends in flight in it.
                self.wait_sends(&mut open).await;
                let fate = match committed {
                    Ok(()) if open.poisoned => {
                        self.model.violations.push(format!(
                            "transaction {} committed though poisoned",
                            open.number
                        ));
                        Fate::Committed
                    }
                    Ok(()) => Fate::Committed,
                    Err(Error::TransactionFailed { .. }) if open.poisoned => {
                        self.settle_txn(&open, &mut Some(true), retry).await
                    }
                    Err(error) if error.is_retryable() => {
                        self.model
                            .failures
                            .push(format!("commit during a restart: {error}"));
                        self.settle_txn(&open, &mut Some(retry), retry).await
                    }
                    Err(error) => panic!("a commit during a restart failed for good: {error}"),
                };
                self.apply(open, fate).await;
            }
        }
    }

    /// Ends the open transaction, waits for every send, and receives until every payload
    /// that must arrive was settled.
    async fn finish(&mut self) {
        self.end(true, true).await;
        for (payload, send) in std::mem::take(&mut self.model.plain_sends) {
            let sent = within(PATIENCE, send)
                .await
                .unwrap_or_else(|| panic!("send of {payload} hung"))
                .expect("joined");
            assert!(
                sent.is_ok(),
                "send of {payload}: {sent:?}; producer connected {} reconnects {}; {:#?}; failures {:#?}",
                self.producer.is_connected(),
                self.producer.reconnects(),
                self.setup.stats().topic(TOPIC),
                self.model.failures
            );
            self.model.must.insert(payload);
        }
        // Until every payload that must arrive was settled, and then until the emulator has
        // nothing unacknowledged left: a send whose receipt was lost with a connection was
        // stored twice (the emulator does not deduplicate), and its second copy comes too.
        let deadline = tokio::time::Instant::now() + PATIENCE * 3;
        loop {
            let missing: Vec<String> = self
                .model
                .must
                .iter()
                .filter(|p| !self.model.settled.contains(*p))
                .cloned()
                .collect();
            if missing.is_empty() {
                self.consumer.flush_acks().await;
                let stats = self.setup.stats();
                if stats.backlog(TOPIC) == 0 && stats.consumers().all(|c| c.unacked == 0) {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never received: {missing:?}; failures {:?}; {:?}; {:#?}",
                self.model.failures,
                self.consumer.stats(),
                self.setup.stats().topic(TOPIC)
            );
            let Some(received) = within(Duration::from_secs(1), self.consumer.receive()).await
            else {
                continue;
            };
            let message = received.expect("received");
            self.model.check_delivery(&message);
            self.consumer.ack(&message).await.expect("acked");
            self.model.settle(message.id(), text(&message));
        }
        self.consumer.flush_acks().await;
    }
}

async fn run(steps: Vec<Step>, per_batch: usize) {
    let setup = Setup::new(broker_config()).await;
    let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
    // Sends wait through every outage of a run (a commit while the broker is down keeps it
    // down until the commit gives up, an operation timeout).
    let producer = Producer::builder(&setup.client, TOPIC)
        .options(
            producer_options(per_batch)
                .transactional(true)
                .send_timeout(Duration::from_secs(600)),
        )
        .build()
        .await
        .expect("producer created");
    let mut run = Run {
        setup,
        consumer,
        producer,
        model: Model::default(),
        open: None,
    };
    for step in steps {
        run.step(step).await;
    }
    run.finish().await;
    assert!(
        run.model.violations.is_empty(),
        "violations: {:#?}\nfailures: {:#?}",
        run.model.violations,
        run.model.failures
    );
    drained(&run.setup, TOPIC, &run.model.failures).await;
    // Nothing more comes: every message was acknowledged once.
    if let Some(message) = within(Duration::from_secs(2), run.consumer.receive()).await {
        let message = message.expect("received");
        run.model.check_delivery(&message);
        assert!(
            run.model.violations.is_empty(),
            "after the end: {:?}",
            run.model.violations
        );
    }
    let stats = run.setup.stats();
    assert_eq!(stats.transactions.open, 0, "{:?}", stats.transactions);
    let topic = stats.topic(TOPIC).expect("the topic");
    assert_eq!(topic.pending_txn_entries, 0);
    let subscription = stats.subscription(TOPIC, "sub").expect("the subscription");
    assert_no_ack_but_resends_twice(subscription.acks_of_deleted, &run.consumer);
    assert_eq!(subscription.conflicts, 0, "{subscription:#?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Without batching: the indexes of one batch acknowledged in a transaction through two
    /// registrations of the consumer are not modelled (see the emulator's docs).
    #[test]
    fn transactions_survive_unloads_dropped_connections_and_restarts(
        steps in proptest::collection::vec(step(), 5..25),
    ) {
        paused(run(steps, 0));
    }
}
