//! A pure model of the broker side of a Shared (or Key_Shared) subscription, following the
//! Apache Pulsar 4.0.x rules (feature `model`): [`SubscriptionModel`] for any number of
//! consumers, [`ConsumerModel`] for exactly one.
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
//! # Several consumers
//! [`SubscriptionModel`] splits the state as the broker does: the cursor (deleted entries,
//! batch-deleted indexes), the transactional pending-ack state and the ended transactions
//! belong to the subscription; the unacked count, the blocked flag and `pendingAcks` belong
//! to each consumer ([`ConsumerId`]). The model does not choose which consumer an entry goes
//! to: the caller (a dispatcher, such as the `pulsar-wire` emulator's) does, and tells the
//! model with [`SubscriptionModel::dispatch`]. The single-consumer rules above hold for each
//! consumer; these are the rules between consumers, from the 4.0.8 sources (*read*) and, where
//! marked, confirmed on a real 4.0.8 standalone with `acknowledgmentAtBatchIndexLevelEnabled`
//! (*observed*).
//!
//! | rule | source | where |
//! |---|---|---|
//! | the dispatcher sends a replay (an entry to send again) to **any** consumer: the replay set is read first, and `getNextConsumer` picks round robin among consumers with permits that are not blocked, each taking up to `getMaxEntriesInThisBatch` entries (at most 20) in one `sendMessages` call | `PersistentDispatcherMultipleConsumers.readMoreEntries`, `trySendMessagesToConsumers`; `AbstractDispatcherMultipleConsumers.getNextConsumer`; *observed*: replays after an abort and after a redelivery request reached the other consumer | the caller; [`SubscriptionModel::dispatch_all`] |
//! | Key_Shared replays go to the consumer of the entry's sticky-key hash, so a key keeps its consumer | `PersistentStickyKeyDispatcherMultipleConsumers` (the hash of a replayed entry is computed when it is read) | the caller |
//! | a dispatch adds the entry to the target's `pendingAcks` and counts it there; other consumers that hold the entry keep it | `Consumer.sendMessages`, `PendingAcksMap.addPendingAckIfAllowed` | [`SubscriptionModel::dispatch`] |
//! | a replay's ack set is the cursor's batch-deleted set AND the pending-ack set; an entry wholly acknowledged or pending is not sent | `AbstractBaseDispatcher.filterEntriesForConsumer` | [`SubscriptionModel::dispatch`] |
//! | an ack, ordinary or transactional, changes the count of the **owner**: the acker if the entry is in its `pendingAcks`, else the first consumer (subscription order) holding it, else the acker | `Consumer.getAckOwnerConsumerAndBatchSize`, `individualAckNormal`, `individualAckWithTransaction` | [`SubscriptionModel::ack_owner`], [`SubscriptionModel::ack`] |
//! | an abort touches no consumer: the pending-ack state gets the indexes back and the entries join the replay set; the holder keeps the entry in `pendingAcks` and its count (the transactional ack's decrement is not given back), so after the replay two consumers hold it | `PendingAckHandleImpl` abort → `PersistentSubscription.redeliverUnacknowledgedMessages(consumer, positions)`; *observed* (fact 1 of issue 27): A held a batch of 10, acked index 0 in a transaction and aborted: B received all 10 with redelivery count 1, in 3 of 3 rounds; A unacked 9, B 10 | [`SubscriptionModel::abort`] |
//! | REDELIVER_UNACKNOWLEDGED_MESSAGES without ids: the sender's count goes to 0, its `pendingAcks` empty, it is unblocked; the entries join the replay set (redelivery count +1) and the dispatcher reads | `Consumer.redeliverUnacknowledgedMessages(long)`, `PersistentDispatcherMultipleConsumers.redeliverUnacknowledgedMessages(consumer, positions)`; *observed* (fact 2): B received everything A held | [`SubscriptionModel::redeliver_all`] |
//! | REDELIVER_UNACKNOWLEDGED_MESSAGES with ids: only ids in the **sender's** `pendingAcks` leave it (count down by their outstanding messages) and join the replay set; another consumer's entry is passed over; the sender is unblocked whatever the ids named | `Consumer.redeliverUnacknowledgedMessages(List)` | [`SubscriptionModel::redeliver_unacknowledged`] |
//! | such a request that adds nothing to the replay set makes the dispatcher read only if permits arrived while the sender was blocked; otherwise the sender, unblocked, gets nothing until something else makes the dispatcher read (a publish, another consumer's FLOW, a replay, an unblocking ack); its own FLOW at the limit blocks it again | `Consumer.redeliverUnacknowledgedMessages(List)` (`permitsReceivedWhileConsumerBlocked`), `Consumer.flowPermits`; *observed* (fact 3): limit 20, 20 unacked, an id in no `pendingAcks`: unblocked, count 20, nothing replayed, 0 messages in 2 s with 40 in the backlog | the caller |
//! | a consumer that leaves hands its `pendingAcks` to the replay set without counting a redelivery, and its count leaves with it; when the last consumer leaves, the replay set and the redelivery counts are cleared and the next consumer's cursor is rewound to the mark-delete position | `PersistentDispatcherMultipleConsumers.removeConsumer`, `clearComponentsAfterRemovedAllConsumers`, `addConsumer` | [`SubscriptionModel::remove_consumer`] (the rest: the caller) |
//! | every read drops the entries up to the mark-delete position from every consumer's `pendingAcks` **without** a decrement (4.0.8; newer brokers decrement, apache/pulsar#25581): a holder whose entry another consumer acknowledged keeps that share of its count for good | `PersistentDispatcherMultipleConsumers.readMoreEntries` (`PendingAcksMap.removeAllUpTo`) | [`SubscriptionModel::remove_pending_acks_up_to`] |
//!
//! Which requests reset a drifted count without replaying anything an application holds
//! (*read*, derived from the rules above): a request with ids takes off exactly the
//! outstanding messages of the named entries that are in the sender's `pendingAcks`, and their
//! replay sends nothing when the cursor has deleted them (`addMessageToReplay` skips entries
//! up to the mark-delete position, the replay read drops the others); so naming entries that
//! are deleted but still in `pendingAcks` repairs their share without a replay, while naming
//! an entry that is not deleted replays it to any consumer. Nothing repairs a share whose
//! entry has left `pendingAcks` (the mark-delete pruning, a transactional ack without
//! `batch_size`) except a request without ids, which replays everything the sender holds.
//! A request naming nothing of the sender's only unblocks it.
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
//! - **Acks are taken one after the other.** A 4.0.8 broker that gets two transactional acks
//!   of the same message from two consumers close together can accept both (its conflict
//!   check and the recording of the first are not atomic; seen in issue 27: payloads
//!   committed in two transactions). The model checks each ack against everything before it,
//!   so the second is always a conflict.
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
    #[must_use]
    pub fn with_batch_index_ack(mut self, enabled: bool) -> Self {
        self.batch_index_ack = enabled;
        self
    }

    /// Sets what a rejected transactional ack does.
    #[must_use]
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
    #[must_use]
    pub fn with_ack_set(mut self, words: &[i64]) -> Self {
        self.ack_set = words.to_vec();
        self
    }

    /// With `batch_size` present.
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: i32) -> Self {
        self.batch_size = Some(batch_size);
        self
    }

    /// In transaction `txn`.
    #[must_use]
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
