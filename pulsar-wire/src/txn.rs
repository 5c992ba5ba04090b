//! Transactions: the coordinator client ([`TransactionCoordinator`]) and [`Transaction`].
//!
//! A transaction registers what it touches before touching it: `ADD_PARTITION_TO_TXN` before
//! the first transactional send to a partition, `ADD_SUBSCRIPTION_TO_TXN` before the first
//! transactional ack of a subscription. Its commit first has the consumers send the acks they
//! held back ([`Participant`]), its abort has them stop sending acks to the partitions it
//! acknowledged on; both wait for the sends and acks still in flight, then send `END_TXN` and
//! tell the consumers the outcome.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use txn_ack::TxnId;

use futures_util::future::BoxFuture;

use crate::pb::base_command::Type;
use crate::pb::{self, ServerError, TxnAction};
use crate::pool::Pool;
use crate::{Connection, Error, command_frame};

/// The topic whose partition `N` is served by the broker that runs transaction coordinator `N`.
pub const TRANSACTION_COORDINATOR_ASSIGN: &str =
    "persistent://pulsar/system/transaction_coordinator_assign";

/// The client of the transaction coordinators: opens transactions, spread over every
/// coordinator the cluster runs. Cheap to clone.
///
/// Coordinator `N` is served by the broker that serves partition `N` of
/// [`TRANSACTION_COORDINATOR_ASSIGN`]; each is looked up when first used and again after its
/// connection is lost (a broker restarted, the assignment moved), so transactions opened
/// before an outage can still be ended after it.
#[derive(Debug, Clone)]
pub struct TransactionCoordinator {
    inner: Arc<CoordinatorInner>,
}

#[derive(Debug)]
struct CoordinatorInner {
    pool: Pool,
    /// The connection to each coordinator, by id, once looked up.
    connections: Vec<tokio::sync::Mutex<Option<Connection>>>,
    /// The coordinator of the next transaction (round robin).
    next: AtomicUsize,
}

impl TransactionCoordinator {
    /// Reads how many coordinators the cluster runs (the partitions of
    /// [`TRANSACTION_COORDINATOR_ASSIGN`]) and connects to coordinator 0, so that a
    /// cluster without transactions is reported at once.
    ///
    /// # Errors
    /// [`Error::Server`] (`TransactionCoordinatorNotFound`) when the assignment topic has no
    /// partitions (transactions are not enabled), or as the lookup and
    /// `TC_CLIENT_CONNECT_REQUEST` fail.
    pub(crate) async fn connect(pool: &Pool) -> Result<Self, Error> {
        let count = pool.partitions(TRANSACTION_COORDINATOR_ASSIGN).await?;
        if count == 0 {
            return Err(Error::Server {
                operation: "PARTITIONED_METADATA",
                code: ServerError::TransactionCoordinatorNotFound as i32,
                message: format!(
                    "{TRANSACTION_COORDINATOR_ASSIGN} has no partitions: the cluster runs no \
                     transaction coordinator (enable transactionCoordinatorEnabled on the brokers)"
                ),
            });
        }
        let coordinator = Self {
            inner: Arc::new(CoordinatorInner {
                pool: pool.clone(),
                connections: (0..count).map(|_| tokio::sync::Mutex::new(None)).collect(),
                next: AtomicUsize::new(0),
            }),
        };
        coordinator.connection_to(0).await?;
        Ok(coordinator)
    }

    /// How many coordinators transactions are spread over.
    pub fn coordinators(&self) -> usize {
        self.inner.connections.len()
    }

    /// The connection to coordinator `tc_id`, looked up (and `TC_CLIENT_CONNECT_REQUEST`
    /// sent, from protocol v19) when there is none or it was lost.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a coordinator the cluster does not run; the lookup's and the
    /// request's errors.
    pub async fn connection_to(&self, tc_id: u64) -> Result<Connection, Error> {
        let slot = usize::try_from(tc_id)
            .ok()
            .and_then(|index| self.inner.connections.get(index))
            .ok_or_else(|| Error::Invalid {
                what: "transaction coordinator",
                reason: format!(
                    "coordinator {tc_id} does not exist: the cluster runs {}",
                    self.inner.connections.len()
                ),
            })?;
        let mut slot = slot.lock().await;
        if let Some(connection) = slot.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        let assign = crate::pool::partition_topic(TRANSACTION_COORDINATOR_ASSIGN, tc_id as u32);
        let connection = self.inner.pool.lookup(&assign).await?;
        if connection.protocol_version() > 18 {
            connection
                .request("TC_CLIENT_CONNECT_REQUEST", |request_id| {
                    command_frame(Type::TcClientConnectRequest, |c| {
                        c.tc_client_connect_request =
                            Some(pb::CommandTcClientConnectRequest { request_id, tc_id });
                    })
                })
                .await?;
        }
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Opens a transaction that the coordinator aborts if it is not ended within `timeout`,
    /// on the next coordinator in turn; when that one cannot be reached, on the next ones
    /// (each tried once).
    ///
    /// `NEW_TXN` carries the timeout in **milliseconds** in its `txn_ttl_seconds` field, as the
    /// Java and Go clients send it.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a zero timeout; [`Error::Server`] when the coordinator refuses;
    /// connection errors (retryable: [`Error::is_retryable`]) when no coordinator can be
    /// reached.
    pub async fn new_transaction(&self, timeout: Duration) -> Result<Transaction, Error> {
        if timeout.is_zero() {
            return Err(Error::Invalid {
                what: "transaction timeout",
                reason: "must be positive".into(),
            });
        }
        let ttl_millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let count = self.inner.connections.len();
        let first = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let mut last_error = None;
        for attempt in 0..count.min(3) {
            let tc_id = ((first + attempt) % count) as u64;
            match self.new_transaction_on(tc_id, ttl_millis).await {
                Err(error) if error.is_retryable() => {
                    tracing::debug!(tc_id, %error, "NEW_TXN failed: trying the next coordinator");
                    last_error = Some(error);
                }
                other => return other,
            }
        }
        Err(last_error.unwrap_or(Error::Closed("the transaction coordinators")))
    }

    async fn new_transaction_on(&self, tc_id: u64, ttl_millis: u64) -> Result<Transaction, Error> {
        let answer = self
            .connection_to(tc_id)
            .await?
            .request("NEW_TXN", |request_id| {
                command_frame(Type::NewTxn, |c| {
                    c.new_txn = Some(pb::CommandNewTxn {
                        request_id,
                        txn_ttl_seconds: Some(ttl_millis),
                        tc_id: Some(tc_id),
                    });
                })
            })
            .await?;
        let response = answer.new_txn_response.unwrap_or_default();
        let id = TxnId {
            most_bits: response.txnid_most_bits.unwrap_or(tc_id),
            least_bits: response.txnid_least_bits.unwrap_or(0),
        };
        Ok(Transaction {
            inner: Arc::new(TxnInner {
                id,
                coordinator: self.clone(),
                partitions: tokio::sync::Mutex::new(HashSet::new()),
                subscriptions: tokio::sync::Mutex::new(HashSet::new()),
                participants: Mutex::new(Vec::new()),
                state: Mutex::new(TxnState::Open),
                failed: Mutex::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
        })
    }
}

/// A lost connection to the coordinator, said in terms of the transaction: whether
/// `END_TXN` may have reached it, and what to do (the error stays retryable).
fn outcome_unknown(error: Error, id: TxnId, action: TxnAction, sent: bool) -> Error {
    let Error::ConnectionLost { addr, reason } = error else {
        return error;
    };
    let verb = match action {
        TxnAction::Commit => "commit",
        TxnAction::Abort => "abort",
    };
    let reached = if sent {
        "END_TXN may or may not have reached the coordinator"
    } else {
        "END_TXN was not sent"
    };
    Error::ConnectionLost {
        addr,
        reason: format!(
            "{reason} (the {verb} of transaction {id}: {reached}; the transaction stays open \
             here: commit or abort it again once the coordinator is reachable; if it already \
             ended, the coordinator answers InvalidTxnStatus or TransactionNotFound)"
        ),
    }
}

/// Where a transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    /// Sends and acks may join it.
    Open,
    /// `END_TXN` is on its way.
    Ending,
    /// Committed.
    Committed,
    /// Aborted.
    Aborted,
}

/// An open transaction. Cheap to clone; pass it to [`crate::Producer::send_in`] and
/// [`crate::Consumer::ack_in`], then [`Transaction::commit`] or [`Transaction::abort`] it.
#[derive(Clone)]
pub struct Transaction {
    inner: Arc<TxnInner>,
}

struct TxnInner {
    id: TxnId,
    /// Its coordinator is `id.most_bits`; the connection is looked up again if lost.
    coordinator: TransactionCoordinator,
    partitions: tokio::sync::Mutex<HashSet<String>>,
    subscriptions: tokio::sync::Mutex<HashSet<(String, String)>>,
    /// The consumers (partition consumers) that acknowledged in it: kept until it ends, so
    /// that its commit can still send what a consumer dropped meanwhile held back.
    participants: Mutex<Vec<Arc<dyn Participant>>>,
    state: Mutex<TxnState>,
    /// Operations that failed, described: a transaction with any cannot commit.
    failed: Mutex<Vec<String>>,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Drop for TxnInner {
    /// A transaction dropped while open: the coordinator aborts it when it times out; its
    /// participants give back what they held for it.
    fn drop(&mut self) {
        if matches!(*self.state.get_mut(), TxnState::Open | TxnState::Ending) {
            for participant in self.participants.get_mut().iter() {
                participant.ended(self.id, Outcome::Abandoned);
            }
        }
    }
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("id", &self.inner.id)
            .field("state", &*self.inner.state.lock())
            .finish_non_exhaustive()
    }
}

/// How a transaction ended, as its participants are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Committed: its acks are acknowledgements for good.
    Committed,
    /// Aborted: its acks are undone.
    Aborted,
    /// `END_TXN(ABORT)` failed: the transaction stays open in the client.
    AbortFailed,
    /// Dropped without an end: the coordinator aborts it once it times out.
    Abandoned,
}

/// A consumer (one partition's) that acknowledged in a transaction: what the transaction asks
/// of it around `END_TXN`.
pub(crate) trait Participant: Send + Sync {
    /// Before `END_TXN(COMMIT)`: sends the acks of `txn` it still holds back and waits for
    /// their answers (a refused one is recorded with [`TxnRef::failed`], so the commit is
    /// refused).
    fn before_commit<'a>(&'a self, txn: &'a TxnRef) -> BoxFuture<'a, ()>;
    /// Before `END_TXN(ABORT)`: stops sending transactional acks until
    /// [`Participant::ended`], and waits for those in flight (a replay that the abort
    /// triggers must not find one half persisted).
    fn before_abort<'a>(&'a self, txn: &'a TxnRef) -> BoxFuture<'a, ()>;
    /// `END_TXN` was answered (or the transaction was dropped): `outcome`. Called once per
    /// [`Participant::before_commit`] or [`Participant::before_abort`], and once at the end.
    fn ended(&self, txn: TxnId, outcome: Outcome);
}

/// A transaction as its participants hold it: it does not keep the transaction alive.
#[derive(Clone)]
pub(crate) struct TxnRef {
    id: TxnId,
    inner: Weak<TxnInner>,
}

impl std::fmt::Debug for TxnRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TxnRef").field(&self.id).finish()
    }
}

impl TxnRef {
    /// The transaction id.
    pub(crate) fn id(&self) -> TxnId {
        self.id
    }

    /// Marks an ack of it in flight, whatever its state (an ack it held back, sent while it
    /// is still open or while its commit waits); `None` once the transaction is gone.
    pub(crate) fn op(&self) -> Option<TxnOp> {
        let txn = self.inner.upgrade()?;
        txn.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(TxnOp { txn })
    }

    /// Whether it is still open (neither ending nor ended).
    pub(crate) fn is_open(&self) -> bool {
        self.inner
            .upgrade()
            .is_some_and(|txn| *txn.state.lock() == TxnState::Open)
    }

    /// Whether it ended (committed, aborted, or dropped).
    pub(crate) fn has_ended(&self) -> bool {
        self.inner
            .upgrade()
            .is_none_or(|txn| matches!(*txn.state.lock(), TxnState::Committed | TxnState::Aborted))
    }

    /// Records a failed operation: the transaction can then only be aborted.
    pub(crate) fn failed(&self, what: String) {
        if let Some(txn) = self.inner.upgrade() {
            txn.failed.lock().push(what);
        }
    }
}

/// Marks one send or ack in flight in a transaction; its end lets a waiting commit go on.
pub(crate) struct TxnOp {
    txn: Arc<TxnInner>,
}

impl Drop for TxnOp {
    fn drop(&mut self) {
        if self.txn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.txn.idle.notify_waiters();
        }
    }
}

impl Transaction {
    /// The transaction id.
    pub fn id(&self) -> TxnId {
        self.inner.id
    }

    /// Where it stands.
    pub fn state(&self) -> TxnState {
        *self.inner.state.lock()
    }

    /// Starts a send or ack in this transaction.
    ///
    /// # Errors
    /// [`Error::Invalid`] unless the transaction is open.
    pub(crate) fn start_op(&self) -> Result<TxnOp, Error> {
        let state = self.inner.state.lock();
        if *state != TxnState::Open {
            return Err(Error::Invalid {
                what: "transaction",
                reason: format!("{} is {:?}, not open", self.inner.id, *state),
            });
        }
        self.inner.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(TxnOp {
            txn: Arc::clone(&self.inner),
        })
    }

    /// The connection to its coordinator (looked up again if it was lost).
    async fn coordinator(&self) -> Result<Connection, Error> {
        self.inner
            .coordinator
            .connection_to(self.inner.id.most_bits)
            .await
    }

    /// Registers a partition (its full topic name) with the coordinator
    /// (`ADD_PARTITION_TO_TXN`), once per transaction. Transactional sends do this themselves.
    ///
    /// # Errors
    /// [`Error::Server`] when the coordinator refuses; connection errors.
    pub async fn add_partition(&self, topic: &str) -> Result<(), Error> {
        let mut partitions = self.inner.partitions.lock().await;
        if partitions.contains(topic) {
            return Ok(());
        }
        let id = self.inner.id;
        self.coordinator()
            .await?
            .request("ADD_PARTITION_TO_TXN", |request_id| {
                command_frame(Type::AddPartitionToTxn, |c| {
                    c.add_partition_to_txn = Some(pb::CommandAddPartitionToTxn {
                        request_id,
                        txnid_least_bits: Some(id.least_bits),
                        txnid_most_bits: Some(id.most_bits),
                        partitions: vec![topic.to_owned()],
                    });
                })
            })
            .await?;
        partitions.insert(topic.to_owned());
        Ok(())
    }

    /// Registers a subscription of a topic (its full name, a partition's for a partitioned
    /// topic) with the coordinator (`ADD_SUBSCRIPTION_TO_TXN`), once per transaction.
    /// Transactional acks do this themselves.
    ///
    /// # Errors
    /// [`Error::Server`] when the coordinator refuses; connection errors.
    pub async fn add_subscription(&self, topic: &str, subscription: &str) -> Result<(), Error> {
        let key = (topic.to_owned(), subscription.to_owned());
        let mut subscriptions = self.inner.subscriptions.lock().await;
        if subscriptions.contains(&key) {
            return Ok(());
        }
        let id = self.inner.id;
        self.coordinator()
            .await?
            .request("ADD_SUBSCRIPTION_TO_TXN", |request_id| {
                command_frame(Type::AddSubscriptionToTxn, |c| {
                    c.add_subscription_to_txn = Some(pb::CommandAddSubscriptionToTxn {
                        request_id,
                        txnid_least_bits: Some(id.least_bits),
                        txnid_most_bits: Some(id.most_bits),
                        subscription: vec![pb::Subscription {
                            topic: key.0.clone(),
                            subscription: key.1.clone(),
                        }],
                    });
                })
            })
            .await?;
        subscriptions.insert(key);
        Ok(())
    }

    /// Records a failed operation: the transaction can then only be aborted.
    pub(crate) fn failed(&self, what: String) {
        self.inner.failed.lock().push(what);
    }

    /// Remembers a consumer that acknowledges in it, to involve it in the end.
    pub(crate) fn join(&self, participant: Arc<dyn Participant>) {
        let mut participants = self.inner.participants.lock();
        if !participants.iter().any(|p| Arc::ptr_eq(p, &participant)) {
            participants.push(participant);
        }
    }

    /// The transaction as its participants hold it.
    pub(crate) fn as_ref(&self) -> TxnRef {
        TxnRef {
            id: self.inner.id,
            inner: Arc::downgrade(&self.inner),
        }
    }

    fn participants(&self) -> Vec<Arc<dyn Participant>> {
        self.inner.participants.lock().clone()
    }

    /// Commits: waits for the sends and acks in flight in it, then `END_TXN(COMMIT)`.
    ///
    /// # Errors
    /// [`Error::TransactionFailed`], naming the first failed operation, when a transactional
    /// ack or send of it failed (refused by the broker, or lost with a connection or timed
    /// out, so that the broker may or may not hold it; nothing is sent, the transaction stays
    /// open for [`Transaction::abort`]); [`Error::Invalid`] unless the transaction is open; [`Error::Server`] when the
    /// coordinator refuses (for example `TransactionNotFound` after a timeout, or
    /// `InvalidTxnStatus`); connection errors ([`Error::ConnectionLost`], retryable, saying
    /// whether `END_TXN` may have reached the coordinator). After an error the transaction is
    /// left open in the client: commit or abort it again (a commit that went through before
    /// its answer was lost makes a later abort fail with `InvalidTxnStatus`), or let it time
    /// out.
    pub async fn commit(&self) -> Result<(), Error> {
        self.end(TxnAction::Commit).await
    }

    /// Aborts: waits for the sends and acks in flight in it, then `END_TXN(ABORT)`. Its
    /// messages are discarded and its acknowledged messages delivered again.
    ///
    /// # Errors
    /// As [`Transaction::commit`].
    pub async fn abort(&self) -> Result<(), Error> {
        self.end(TxnAction::Abort).await
    }

    async fn end(&self, action: TxnAction) -> Result<(), Error> {
        {
            let mut state = self.inner.state.lock();
            if *state != TxnState::Open {
                return Err(Error::Invalid {
                    what: "transaction",
                    reason: format!("{} is {:?}, not open", self.inner.id, *state),
                });
            }
            *state = TxnState::Ending;
        }
        let id = self.inner.id;
        // A commit that cannot succeed sends nothing more: no held-back ack goes out for it.
        if action == TxnAction::Commit
            && let Err(error) = self.refuse_if_failed()
        {
            *self.inner.state.lock() = TxnState::Open;
            return Err(error);
        }
        let txn = self.as_ref();
        let participants = self.participants();
        for participant in &participants {
            match action {
                TxnAction::Commit => participant.before_commit(&txn).await,
                TxnAction::Abort => participant.before_abort(&txn).await,
            }
        }
        self.wait_idle().await;
        // What the participants hear when the abort does not go through: they send acks again.
        let not_ended = |participants: &[Arc<dyn Participant>]| {
            if action == TxnAction::Abort {
                for participant in participants {
                    participant.ended(id, Outcome::AbortFailed);
                }
            }
        };
        if action == TxnAction::Commit
            && let Err(error) = self.refuse_if_failed()
        {
            *self.inner.state.lock() = TxnState::Open;
            return Err(error);
        }
        let result = match self.coordinator().await {
            Ok(connection) => connection,
            Err(error) => {
                *self.inner.state.lock() = TxnState::Open;
                not_ended(&participants);
                return Err(outcome_unknown(error, id, action, false));
            }
        }
        .request("END_TXN", |request_id| {
            command_frame(Type::EndTxn, |c| {
                c.end_txn = Some(pb::CommandEndTxn {
                    request_id,
                    txnid_least_bits: Some(id.least_bits),
                    txnid_most_bits: Some(id.most_bits),
                    txn_action: Some(action as i32),
                });
            })
        })
        .await;
        if let Err(error) = result {
            *self.inner.state.lock() = TxnState::Open;
            not_ended(&participants);
            return Err(outcome_unknown(error, id, action, true));
        }
        let outcome = match action {
            TxnAction::Commit => Outcome::Committed,
            TxnAction::Abort => Outcome::Aborted,
        };
        *self.inner.state.lock() = match action {
            TxnAction::Commit => TxnState::Committed,
            TxnAction::Abort => TxnState::Aborted,
        };
        self.inner.participants.lock().clear();
        for participant in &participants {
            participant.ended(id, outcome);
        }
        Ok(())
    }

    /// [`Error::TransactionFailed`] when an operation of it failed.
    fn refuse_if_failed(&self) -> Result<(), Error> {
        let failed = self.inner.failed.lock();
        match failed.first() {
            Some(first) => Err(Error::TransactionFailed {
                txn: self.inner.id.to_string(),
                failed: failed.len(),
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    async fn wait_idle(&self) {
        loop {
            let idle = self.inner.idle.notified();
            if self.inner.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}
