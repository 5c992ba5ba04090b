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

    /// Forgets the connection to coordinator `tc_id`: its next request looks it up again.
    async fn forget(&self, tc_id: u64) {
        if let Some(slot) = usize::try_from(tc_id)
            .ok()
            .and_then(|index| self.inner.connections.get(index))
        {
            *slot.lock().await = None;
        }
    }

    /// Sends a request to coordinator `tc_id` and returns its answer. While the coordinator
    /// is not where the client last found it (`TransactionCoordinatorNotFound`: its partition
    /// of [`TRANSACTION_COORDINATOR_ASSIGN`] moved to another broker, by an unload, load
    /// shedding or a bundle split, while the old broker stays up) it is looked up again and
    /// asked again, after a backoff, within the operation timeout; so is a request whose
    /// connection was lost, when `resend` says sending it twice is harmless (every request
    /// but `END_TXN`, whose first attempt may have gone through).
    ///
    /// # Errors
    /// The last answer's error at the operation timeout; [`Error::Server`] for any other
    /// refusal; the lookup's errors.
    async fn request<B>(
        &self,
        tc_id: u64,
        operation: &'static str,
        resend: bool,
        build: B,
    ) -> Result<pb::BaseCommand, Error>
    where
        B: Fn(u64) -> crate::Frame + Send + Sync,
    {
        let deadline = tokio::time::Instant::now() + self.inner.pool.operation_timeout();
        let mut backoff = crate::backoff::lookups();
        loop {
            let answer = self
                .connection_to(tc_id)
                .await?
                .request(operation, &build)
                .await;
            let moved = matches!(&answer, Err(error)
                if error.server_error() == Some(crate::ServerError::TransactionCoordinatorNotFound));
            let lost = resend && matches!(&answer, Err(Error::ConnectionLost { .. }));
            if !(moved || lost) {
                return answer;
            }
            self.forget(tc_id).await;
            let delay = backoff.next_delay();
            if tokio::time::Instant::now() + delay >= deadline {
                return answer;
            }
            tracing::debug!(
                tc_id,
                operation,
                ?delay,
                "the transaction coordinator moved or went away: looking it up again"
            );
            tokio::time::sleep(delay).await;
        }
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
            .request(tc_id, "NEW_TXN", true, |request_id| {
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
#[non_exhaustive]
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
        self.inner
            .coordinator
            .request(id.most_bits, "ADD_PARTITION_TO_TXN", true, |request_id| {
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
        self.inner
            .coordinator
            .request(
                id.most_bits,
                "ADD_SUBSCRIPTION_TO_TXN",
                true,
                |request_id| {
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
                },
            )
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
        let result = self.end_txn_request(action).await;
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

    /// `END_TXN` to its coordinator, asked again where the coordinator moved
    /// (`TransactionCoordinatorNotFound`), within the operation timeout. A request whose
    /// connection was lost is not sent again here (it may have gone through): the error says
    /// so, and the caller commits or aborts again.
    async fn end_txn_request(&self, action: TxnAction) -> Result<(), Error> {
        let id = self.inner.id;
        self.inner
            .coordinator
            .request(id.most_bits, "END_TXN", false, |request_id| {
                command_frame(Type::EndTxn, |c| {
                    c.end_txn = Some(pb::CommandEndTxn {
                        request_id,
                        txnid_least_bits: Some(id.least_bits),
                        txnid_most_bits: Some(id.most_bits),
                        txn_action: Some(action as i32),
                    });
                })
            })
            .await
            .map(drop)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::StreamExt;

    use crate::connection::fake_broker::{Peer, listen};
    use crate::pb::base_command::Type;
    use crate::pb::command_lookup_topic_response::LookupType;
    use crate::pb::{self, ServerError};
    use crate::{Client, ConnectOptions, Error, command_frame};

    /// What the fake coordinator broker counted.
    #[derive(Default)]
    struct Counts {
        lookups: AtomicUsize,
        new_txns: AtomicUsize,
        end_txns: AtomicUsize,
    }

    /// A broker that runs coordinator 0 (one partition of the assignment topic) and refuses
    /// the first `refusals` NEW_TXN and END_TXN with `TransactionCoordinatorNotFound`, as a
    /// broker does once the coordinator's partition moved away from it.
    async fn coordinator_broker(refusals: usize, counts: Arc<Counts>) -> String {
        let (listener, address) = listen().await;
        let own = address.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (own, counts) = (own.clone(), Arc::clone(&counts));
                tokio::spawn(async move {
                    let mut peer = Peer::new(tcp);
                    peer.accept_connect().await;
                    while let Some(Ok(frame)) = peer.0.next().await {
                        let c = frame.command;
                        let refuse = |n: usize, request_id: u64, kind: Type| {
                            (n < refusals).then(|| {
                                command_frame(kind, |answer| {
                                    let error =
                                        Some(ServerError::TransactionCoordinatorNotFound as i32);
                                    let message = Some("not the coordinator here".to_owned());
                                    if kind == Type::NewTxnResponse {
                                        answer.new_txn_response = Some(pb::CommandNewTxnResponse {
                                            request_id,
                                            error,
                                            message,
                                            ..Default::default()
                                        });
                                    } else {
                                        answer.end_txn_response = Some(pb::CommandEndTxnResponse {
                                            request_id,
                                            error,
                                            message,
                                            ..Default::default()
                                        });
                                    }
                                })
                            })
                        };
                        let answer = if let Some(m) = c.partition_metadata {
                            command_frame(Type::PartitionedMetadataResponse, |a| {
                                a.partition_metadata_response =
                                    Some(pb::CommandPartitionedTopicMetadataResponse {
                                        request_id: m.request_id,
                                        partitions: Some(1),
                                        ..Default::default()
                                    });
                            })
                        } else if let Some(l) = c.lookup_topic {
                            counts.lookups.fetch_add(1, Ordering::SeqCst);
                            command_frame(Type::LookupResponse, |a| {
                                a.lookup_topic_response = Some(pb::CommandLookupTopicResponse {
                                    request_id: l.request_id,
                                    broker_service_url: Some(format!("pulsar://{own}")),
                                    response: Some(LookupType::Connect as i32),
                                    authoritative: Some(true),
                                    ..Default::default()
                                });
                            })
                        } else if let Some(t) = c.tc_client_connect_request {
                            command_frame(Type::TcClientConnectResponse, |a| {
                                a.tc_client_connect_response =
                                    Some(pb::CommandTcClientConnectResponse {
                                        request_id: t.request_id,
                                        ..Default::default()
                                    });
                            })
                        } else if let Some(n) = c.new_txn {
                            let seen = counts.new_txns.fetch_add(1, Ordering::SeqCst);
                            refuse(seen, n.request_id, Type::NewTxnResponse).unwrap_or_else(|| {
                                command_frame(Type::NewTxnResponse, |a| {
                                    a.new_txn_response = Some(pb::CommandNewTxnResponse {
                                        request_id: n.request_id,
                                        txnid_least_bits: Some(seen as u64),
                                        txnid_most_bits: Some(0),
                                        ..Default::default()
                                    });
                                })
                            })
                        } else if let Some(e) = c.end_txn {
                            let seen = counts.end_txns.fetch_add(1, Ordering::SeqCst);
                            refuse(seen, e.request_id, Type::EndTxnResponse).unwrap_or_else(|| {
                                command_frame(Type::EndTxnResponse, |a| {
                                    a.end_txn_response = Some(pb::CommandEndTxnResponse {
                                        request_id: e.request_id,
                                        ..Default::default()
                                    });
                                })
                            })
                        } else {
                            continue;
                        };
                        peer.send(answer).await;
                    }
                });
            }
        });
        address
    }

    async fn client(address: &str, timeout: Duration) -> Client {
        let options = ConnectOptions::new(&format!("pulsar://{address}"))
            .expect("valid")
            .operation_timeout(timeout);
        crate::ClientBuilder::from(options)
            .build()
            .await
            .expect("connected")
    }

    /// A coordinator whose partition moved answers `TransactionCoordinatorNotFound` where the
    /// client last found it: the client looks it up again and asks again, within the
    /// operation timeout, for a new transaction and for its commit. (Before, it kept the old
    /// connection, and every attempt was refused until the application gave up.)
    #[tokio::test(start_paused = true)]
    async fn a_coordinator_that_moved_is_looked_up_again_and_asked_again() {
        let counts = Arc::new(Counts::default());
        let address = coordinator_broker(2, Arc::clone(&counts)).await;
        let client = client(&address, Duration::from_secs(30)).await;
        let coordinator = client.transaction_coordinator().await.expect("coordinator");
        let lookups_before = counts.lookups.load(Ordering::SeqCst);
        let txn = coordinator
            .new_transaction(Duration::from_secs(60))
            .await
            .expect("opened after two refusals");
        assert_eq!(counts.new_txns.load(Ordering::SeqCst), 3);
        assert_eq!(
            counts.lookups.load(Ordering::SeqCst),
            lookups_before + 2,
            "looked up again after each refusal"
        );
        txn.commit().await.expect("committed after two refusals");
        assert_eq!(counts.end_txns.load(Ordering::SeqCst), 3);
    }

    /// A coordinator that stays not found is given up at the operation timeout, with its
    /// error.
    #[tokio::test(start_paused = true)]
    async fn a_coordinator_not_found_for_good_fails_at_the_operation_timeout() {
        let counts = Arc::new(Counts::default());
        let address = coordinator_broker(usize::MAX, Arc::clone(&counts)).await;
        let client = client(&address, Duration::from_secs(5)).await;
        let coordinator = client.transaction_coordinator().await.expect("coordinator");
        let error = coordinator
            .new_transaction(Duration::from_secs(60))
            .await
            .expect_err("never found");
        assert_eq!(
            error.server_error(),
            Some(crate::ServerError::TransactionCoordinatorNotFound),
            "{error}"
        );
        assert!(counts.new_txns.load(Ordering::SeqCst) > 2);
    }

    /// After `Client::close`, a new transaction is refused with `Closed`.
    #[tokio::test]
    async fn a_closed_client_opens_no_transaction() {
        let counts = Arc::new(Counts::default());
        let address = coordinator_broker(0, counts).await;
        let client = client(&address, Duration::from_secs(5)).await;
        let coordinator = client
            .transaction_coordinator()
            .await
            .expect("coordinator")
            .clone();
        client.close().await;
        let error = coordinator
            .new_transaction(Duration::from_secs(60))
            .await
            .expect_err("closed");
        assert!(matches!(error, Error::Closed(_)), "{error}");
    }
}
