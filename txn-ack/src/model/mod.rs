//! A pure model of the broker side of **one** Shared-subscription consumer, following the
//! Apache Pulsar 4.0.x rules (feature `model`).
//!
//! [`ConsumerModel`] takes what a client actually puts on the wire ([`WireAck`]: ack type,
//! ledger and entry, `ack_set` words, `batch_size` present or absent, transaction id) and what
//! the dispatcher sends ([`ConsumerModel::dispatch`]), and keeps the state the broker keeps:
//! the consumer's unacked count and blocked flag, its `pendingAcks`, the cursor's deleted
//! entries and batch-deleted indexes, and the subscription's transactional pending-ack state.
//! It is deterministic, does no I/O and has no clock; every input, however broken, gets an
//! answer ([`AckOutcome`], [`Dispatch`]) or an [`Error`](crate::Error), never a panic.
//!
//! It is the test oracle of this crate and the accounting core of a broker emulator: feed it
//! a correct client and the count returns to zero; feed it a client that drops `batch_size`
//! and it stalls the way a 4.0.x broker does.
//!
//! Section numbers (§) refer to `reference/pulsar-wire.md` of this project; the rules are the
//! ones it records from the broker's `Consumer`, `PendingAckHandleImpl` and `ManagedCursorImpl`.
//!
//! | rule | where |
//! |---|---|
//! | dispatch adds the batch size minus the indexes already acknowledged; blocks at the limit | §7.1, [`ConsumerModel::dispatch`] |
//! | one `sendMessages` call checks the blocked flag once, before its entries | [`ConsumerModel::dispatch_all`] |
//! | ordinary acks count with the broker's own batch size; only whole-entry acks leave `pendingAcks` | §5.1, [`ConsumerModel::ack`] |
//! | cumulative acks are ignored on Shared | §5.4 |
//! | transactional acks count the client's `batch_size` (or 1) minus the set's cardinality, at ack time | §5.2 |
//! | conflicts: already deleted, overlap with the cursor, overlap with pending acks, whole entry while pending | §6 |
//! | commit acknowledges the merged positions; abort gives the indexes back and redelivers | §6, [`ConsumerModel::commit`], [`ConsumerModel::abort`] |
//! | unblock only when an entry leaves `pendingAcks` with unacked ≤ max/2; redelivery unblocks | §7.1 |
//!
//! ```
//! use txn_ack::model::{ConsumerModel, ModelConfig, WireAck, Dispatch};
//! use txn_ack::{AckKind, EntryId, MessagePosition, TxnAckTracker, TxnId};
//!
//! let mut broker = ConsumerModel::new(ModelConfig::new(20));
//! let entry = EntryId { ledger_id: 1, entry_id: 0 };
//! assert!(matches!(broker.dispatch(entry, 3)?, Dispatch::Dispatched { .. }));
//! assert_eq!(broker.unacked(), 3);
//!
//! // A correct client: one independent set per message, the batch size always set.
//! let txn = TxnId { most_bits: 0, least_bits: 1 };
//! let mut client = TxnAckTracker::default();
//! for index in 0..3 {
//!     let at = MessagePosition::in_batch(1, 0, -1, index, 3)?;
//!     let ack = client.ack(txn, AckKind::Individual, &at)?;
//!     assert!(broker.ack(&WireAck::from(&ack))?.is_acked());
//! }
//! assert_eq!(broker.unacked(), 0);
//! broker.commit(txn)?;
//! assert!(broker.entry(&entry).is_some_and(|e| e.cursor.is_deleted()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the model decides where the broker is silent or the reference is ambiguous
//! - **Invalid input is refused, not miscounted.** The broker accepts `ack_set` bits beyond
//!   the batch, a `batch_size` of 0 or a negative one, and acks of entries it never sent, and
//!   then miscounts. The model answers an [`Error`](crate::Error) for input that no message id of a real
//!   entry can produce (see [`ConsumerModel::ack`]) and changes nothing. Input a real but
//!   broken client sends (no `batch_size`, an accumulated set, a whole-entry ack after
//!   per-index ones, a `batch_size` that differs from the entry's) is accepted and handled as
//!   the broker handles it.
//! - **A conflict changes nothing** by default. The 4.0.x broker applies the §5.2 decrement
//!   (and removes a whole-entry ack from `pendingAcks`) *before* the pending-ack handle rejects
//!   the ack; [`ConflictEffects::AsBroker`] reproduces that.
//! - **An abort does not touch the consumer's count.** Its redelivery goes to the dispatcher,
//!   which sends the entries again ([`ConsumerModel::dispatch`]); `pendingAcks` keeps one
//!   slot per entry, so an entry that is still there when it is sent again is counted twice
//!   ([`Counters::recounted_on_redispatch`]). A client's REDELIVER_UNACKNOWLEDGED_MESSAGES is
//!   [`ConsumerModel::redeliver_unacknowledged`]; that one clears the blocked flag (§7.1).
//! - **Commit with broker batch-index acks disabled**: a merged set that acknowledges every
//!   index deletes the entry like a whole-entry ack (§4.1: an all-cleared set is a whole-entry
//!   ack); a partial one leaves the cursor unchanged, since the cursor keeps no batch-deleted
//!   indexes then.
//!
//! # Rules taken from the broker sources beyond the reference
//! Read in the 4.0-era `Consumer`, `PendingAckHandleImpl`, `ManagedCursorImpl`,
//! `PersistentSubscription` and the dispatcher's `filterEntriesForConsumer`; marked
//! *derived* where the effect was worked out, not read. Worth checking on a real broker.
//! - A dispatch's ack set is the cursor's batch-deleted set ANDed with the pending-ack set;
//!   an entry wholly acknowledged or pending in a transaction is not sent.
//! - An ordinary batch-index ack is also merged into the pending-ack state (transactions
//!   enabled), which is how a batch acknowledged partly ordinarily and partly in a
//!   transaction leaves `pendingAcks`.
//! - An ordinary whole-entry ack checks the unblock condition when the entry leaves
//!   `pendingAcks` (before it decrements) and again after the decrement: 4.0.3 added the
//!   second `updateBlockedConsumerOnUnackedMsgs` call to `Consumer.individualAckNormal`
//!   (apache/pulsar#23796; `Consumer.java` of 4.0.8, l.567-630). A 4.0.8 broker unblocks a
//!   consumer whose whole-entry ack takes the count from above half the limit to half or
//!   below (seen by `integration_tests::conformance`); before 4.0.3 it stayed blocked.
//! - A transactional ack of an entry no longer in `pendingAcks` still decrements
//!   (apache/pulsar#25049).
//! - A commit leaves its indexes in the pending-ack state until the cursor deletes the entry.
//! - *Derived*: the overlap check compares within each set's own `size()`, so when the last
//!   index of a batch of 64k+1 messages is alone in a word that Java's `toLongArray()` trims,
//!   acknowledging it twice goes unnoticed.

mod accounting;
mod acks;
mod java_bits;
mod outcome;
mod pending_ack;
mod subscription;

pub use accounting::ConsumerModel;
pub use outcome::{
    Aborted, AckEffect, AckOutcome, Committed, Conflict, ConflictReason, Counters, CursorState,
    Dispatch, EntryView, IgnoredReason, PendingAckView, Redelivered, SkipReason, TxnStatus,
};
pub use subscription::{ConsumerId, ConsumerView, SubscriptionModel};

use crate::{Ack, AckId, AckKind, EntryId, TxnAck, TxnId};

/// The broker's answer to a transactional ack it rejects: `ServerError.TransactionConflict`.
pub const TRANSACTION_CONFLICT: i32 = 23;

/// What a rejected transactional ack does to the consumer's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConflictEffects {
    /// Nothing: the ack is refused as a whole.
    #[default]
    None,
    /// What a 4.0.x broker does: `Consumer.individualAckWithTransaction` decrements the unacked
    /// count (and removes a whole-entry ack from `pendingAcks`, possibly unblocking) before
    /// `PendingAckHandleImpl` finds the conflict; the pending-ack state is left unchanged.
    AsBroker,
}

/// The broker configuration the model depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelConfig {
    /// `maxUnackedMessagesPerConsumer` (or the topic's `maxUnackedMessagesOnConsumer`): the
    /// consumer is blocked once its unacked count reaches it. 0 means unlimited.
    pub max_unacked_messages: u32,
    /// `acknowledgmentAtBatchIndexLevelEnabled`: whether ordinary acks with an ack set count and
    /// whether the cursor keeps batch-deleted indexes (§5.1). Off by default in 4.0.x.
    pub batch_index_ack: bool,
    /// What a rejected transactional ack does to the count.
    pub conflict_effects: ConflictEffects,
}

impl ModelConfig {
    /// A limit of `max_unacked_messages` (0 = unlimited), broker batch-index acks off (the
    /// 4.0.x default), conflicts changing nothing.
    pub fn new(max_unacked_messages: u32) -> Self {
        Self {
            max_unacked_messages,
            batch_index_ack: false,
            conflict_effects: ConflictEffects::None,
        }
    }

    /// Sets `acknowledgmentAtBatchIndexLevelEnabled`.
    pub fn with_batch_index_ack(mut self, enabled: bool) -> Self {
        self.batch_index_ack = enabled;
        self
    }

    /// Sets what a rejected transactional ack does.
    pub fn with_conflict_effects(mut self, effects: ConflictEffects) -> Self {
        self.conflict_effects = effects;
        self
    }
}

impl Default for ModelConfig {
    /// The broker's default limit, 50,000.
    fn default() -> Self {
        Self::new(50_000)
    }
}

/// One acknowledged message id as a client puts it on the wire: a `CommandAck` with one
/// `MessageIdData`.
///
/// Build it from this crate's acks with `From` ([`Ack`], [`TxnAck`]), or field by field to
/// feed what another (possibly broken) client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireAck {
    /// `CommandAck.ack_type`.
    pub kind: AckKind,
    /// `MessageIdData.ledgerId` and `entryId`.
    pub entry: EntryId,
    /// `MessageIdData.ack_set`, signed words as on the wire; empty means the field is absent.
    pub ack_set: Vec<i64>,
    /// `MessageIdData.batch_size`; `None` means the field is absent.
    pub batch_size: Option<i32>,
    /// `txnid_most_bits` and `txnid_least_bits`, both present; `None` for an ordinary ack.
    pub txn: Option<TxnId>,
}

impl WireAck {
    /// An individual whole-entry ack: no set, no batch size, no transaction.
    pub fn individual(entry: EntryId) -> Self {
        Self {
            kind: AckKind::Individual,
            entry,
            ack_set: Vec::new(),
            batch_size: None,
            txn: None,
        }
    }

    /// A cumulative ack of `entry`.
    pub fn cumulative(entry: EntryId) -> Self {
        Self {
            kind: AckKind::Cumulative,
            ..Self::individual(entry)
        }
    }

    /// With these `ack_set` words.
    pub fn with_ack_set(mut self, words: &[i64]) -> Self {
        self.ack_set = words.to_vec();
        self
    }

    /// With `batch_size` present.
    pub fn with_batch_size(mut self, batch_size: i32) -> Self {
        self.batch_size = Some(batch_size);
        self
    }

    /// In transaction `txn`.
    pub fn in_txn(mut self, txn: TxnId) -> Self {
        self.txn = Some(txn);
        self
    }

    /// The wire form of `id` acknowledged as `kind`, outside any transaction.
    pub fn from_id(kind: AckKind, id: &AckId) -> Self {
        Self {
            kind,
            entry: id.entry,
            ack_set: id.wire_ack_set().collect(),
            batch_size: id
                .batch_size
                .map(|size| i32::try_from(size).unwrap_or(i32::MAX)),
            txn: None,
        }
    }
}

impl From<&Ack> for WireAck {
    fn from(ack: &Ack) -> Self {
        Self::from_id(ack.kind, &ack.id)
    }
}

impl From<&TxnAck> for WireAck {
    fn from(ack: &TxnAck) -> Self {
        Self::from_id(ack.kind, &ack.id).in_txn(ack.txn)
    }
}
