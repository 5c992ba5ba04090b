//! What the model answers: outcomes of acks, dispatches and transaction ends, and views of
//! its state.

use std::fmt;

use super::TRANSACTION_CONFLICT;
use crate::{AckSet, EntryId};

/// What an accepted ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckEffect {
    /// How the unacked count changed (negative: it went down). A transactional ack with a set
    /// but no `batch_size` makes it go up (§5.3).
    pub unacked_delta: i64,
    /// Whether the entry left `pendingAcks`.
    pub removed_from_pending_acks: bool,
    /// Whether the consumer was unblocked.
    pub unblocked: bool,
    /// Whether the cursor now holds the whole entry as acknowledged (ordinary acks; a
    /// transactional ack reaches the cursor at commit).
    pub entry_deleted: bool,
}

/// Why an ack was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IgnoredReason {
    /// "Received cumulative ack on shared subscription, ignoring" (§5.4), with or without a
    /// transaction.
    CumulativeOnShared,
}

/// Why the pending-ack handle rejected a transactional ack (§6). The broker answers
/// [`TRANSACTION_CONFLICT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConflictReason {
    /// Step 1: the cursor already deleted the entry ("already acked before").
    AlreadyAcknowledged,
    /// Step 2: the padded set overlaps the cursor's batch-deleted indexes ("already acked
    /// before").
    AckedInCursor,
    /// Step 2: the padded set overlaps the entry's pending transactional acks ("in pending
    /// ack status"), whichever transaction holds them.
    OverlapsPending,
    /// Step 3: a whole-entry ack (no set) on an entry with pending transactional acks ("in
    /// pending ack status").
    EntryPending,
    /// A per-index ack on an entry pending as a whole entry. The 4.0.x check reads the missing
    /// set as "no overlap" and then fails merging into it; the model refuses it instead.
    PendingAsWholeEntry,
}

impl fmt::Display for ConflictReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AlreadyAcknowledged => "the entry is already acked before",
            Self::AckedInCursor => "an index is already acked before (cursor batch-deleted set)",
            Self::OverlapsPending => "an index is in pending ack status",
            Self::EntryPending => "the entry is in pending ack status",
            Self::PendingAsWholeEntry => "the entry is in pending ack status as a whole entry",
        })
    }
}

/// A rejected transactional ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    /// Why.
    pub reason: ConflictReason,
    /// What the broker did before rejecting it: nothing with [`ConflictEffects::None`](super::ConflictEffects::None).
    pub effect: AckEffect,
}

/// The model's answer to an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Accepted (including acks of entries already gone, which simply count nothing).
    Acked(AckEffect),
    /// Ignored by the broker.
    Ignored(IgnoredReason),
    /// Rejected: `ACK_RESPONSE` with `error = TransactionConflict`.
    Conflict(Conflict),
}

impl AckOutcome {
    /// Whether the ack was accepted.
    pub fn is_acked(&self) -> bool {
        matches!(self, Self::Acked(_))
    }

    /// Whether the ack was rejected as a conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }

    /// The `ServerError` an `ACK_RESPONSE` would carry, if any.
    pub fn server_error(&self) -> Option<i32> {
        self.is_conflict().then_some(TRANSACTION_CONFLICT)
    }

    /// What the ack did to the accounting (a conflict's effect per [`ConflictEffects`](super::ConflictEffects)).
    pub fn effect(&self) -> AckEffect {
        match self {
            Self::Acked(effect) => *effect,
            Self::Ignored(_) => AckEffect::default(),
            Self::Conflict(conflict) => conflict.effect,
        }
    }
}

/// Why the dispatcher did not send an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The cursor already deleted the entry.
    AlreadyAcknowledged,
    /// Every message of the entry is acknowledged in the cursor or pending in a transaction.
    PendingInTransaction,
}

/// The model's answer to a dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Sent to the consumer and added to `pendingAcks`.
    Dispatched {
        /// How many messages were added to the unacked count.
        counted: i64,
        /// `CommandMessage.ack_set` (empty: absent): a cleared bit is a message the client
        /// must skip, already acknowledged or pending in a transaction.
        ack_set: Vec<i64>,
        /// Whether the consumer is blocked after this dispatch.
        blocked: bool,
    },
    /// Not sent: the consumer is blocked. Nothing changed; offer the entry again later.
    Blocked,
    /// Not sent, and there is nothing left to send.
    Skipped(SkipReason),
}

/// A committed transaction's effect on the cursor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Committed {
    /// The entries the transaction acknowledged, in order.
    pub entries: Vec<EntryId>,
    /// Those the cursor now holds as wholly acknowledged.
    pub deleted: Vec<EntryId>,
}

/// An aborted transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Aborted {
    /// The entries the subscription redelivers, in order. Send them with
    /// [`ConsumerModel::dispatch`](super::ConsumerModel::dispatch).
    pub redeliver: Vec<EntryId>,
}

/// A redelivery request's effect.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Redelivered {
    /// The entries taken out of `pendingAcks`, to send again, in order.
    pub entries: Vec<EntryId>,
    /// How much the unacked count went down.
    pub messages: i64,
}

/// Where a transaction stands, as far as this subscription knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    /// No accepted ack in it, and not ended.
    NotStarted,
    /// Holds pending acks.
    Open,
    /// Committed.
    Committed,
    /// Aborted.
    Aborted,
}

/// The cursor's view of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorState<'a> {
    /// Nothing acknowledged.
    Outstanding,
    /// Some indexes acknowledged (the batch-deleted set; set bits are outstanding).
    Partial(&'a AckSet),
    /// The whole entry acknowledged.
    Deleted,
}

impl CursorState<'_> {
    /// Whether the whole entry is acknowledged.
    pub fn is_deleted(&self) -> bool {
        matches!(self, Self::Deleted)
    }
}

/// The subscription's pending transactional acks of one entry (`individualAckPositions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAckView {
    /// The merged set of all pending acks (a cleared bit is acknowledged); `None` for a
    /// whole-entry ack.
    pub ack_set: Option<Vec<i64>>,
    /// The batch size of the latest transactional ack (0 if it had none).
    pub batch_size: u32,
}

/// Everything the model knows of one dispatched entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryView<'a> {
    /// The entry.
    pub entry: EntryId,
    /// Its `num_messages_in_batch` as dispatched.
    pub batch_size: u32,
    /// Whether it is in the consumer's `pendingAcks`.
    pub in_pending_acks: bool,
    /// The cursor's state.
    pub cursor: CursorState<'a>,
    /// The part of the unacked count this entry's dispatches and acks account for. The sum
    /// over all entries is [`ConsumerModel::unacked`](super::ConsumerModel::unacked); an entry out of `pendingAcks` with a
    /// non-zero value is a leak.
    pub counted: i64,
    /// The subscription's pending transactional acks of the entry.
    pub pending: Option<PendingAckView>,
}

/// What happened so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Counters {
    /// Entries sent.
    pub dispatched_entries: u64,
    /// Messages added to the unacked count by dispatches.
    pub dispatched_messages: i64,
    /// Dispatches refused because the consumer was blocked.
    pub refused_while_blocked: u64,
    /// Dispatches skipped (nothing left to send).
    pub skipped: u64,
    /// Accepted ordinary acks.
    pub acks: u64,
    /// Accepted transactional acks.
    pub txn_acks: u64,
    /// Ignored acks.
    pub ignored: u64,
    /// Transactional acks rejected as conflicts.
    pub conflicts: u64,
    /// Commits.
    pub commits: u64,
    /// Aborts.
    pub aborts: u64,
    /// Entries taken out of `pendingAcks` by redelivery requests.
    pub redelivered_entries: u64,
    /// Times the consumer became blocked.
    pub blocked: u64,
    /// Times it was unblocked.
    pub unblocked: u64,
    /// Messages counted twice because their entry was dispatched again while still in
    /// `pendingAcks`: what the entry still counted from its earlier dispatch (and had not been
    /// reported by an earlier re-dispatch) stays counted, and the new dispatch counts its
    /// outstanding messages again. With a correct client nothing else is ever left over.
    pub recounted_on_redispatch: i64,
}
