//! The acks, commits and aborts of [`SubscriptionModel`] (reference §5, §6).

use super::java_bits::JavaBits;
use super::subscription::{ConsumerId, Cursor, SubscriptionModel, batch_size};
use super::{
    Aborted, AckEffect, AckOutcome, Committed, Conflict, ConflictEffects, ConflictReason,
    IgnoredReason, WireAck,
};
use crate::Error;
use crate::{AckKind, AckSet, EntryId, TxnId};

impl SubscriptionModel {
    /// Handles one acknowledged message id that consumer `acker` sent, as the broker does.
    ///
    /// The ack changes the count of its owner ([`ack_owner`](Self::ack_owner),
    /// `getAckOwnerConsumerAndBatchSize`): the acker if the entry is in its `pendingAcks`,
    /// else the first consumer holding it there, else the acker. "In `pendingAcks`" below
    /// means the owner's.
    ///
    /// - Cumulative acks, with or without a transaction: [`AckOutcome::Ignored`] (§5.4),
    ///   before anything else is read.
    /// - Ordinary individual acks (§5.1): counted with the batch size the consumer was sent,
    ///   never the client's `batch_size` (which is not read). With an ack set, the count goes
    ///   down by the newly acknowledged indexes only with broker batch-index acks enabled and
    ///   the entry in `pendingAcks`; the cursor ANDs the set into its batch-deleted indexes
    ///   (batch-index acks enabled) and deletes the entry once none is left; the entry leaves
    ///   `pendingAcks` when the pending-ack state holds nothing outstanding for it. Without an
    ///   ack set, the entry leaves `pendingAcks` (checking the unblock condition), the count
    ///   goes down by its outstanding messages and the unblock condition is checked again
    ///   (4.0.3 and later, apache/pulsar#23796: `individualAckNormal` calls
    ///   `updateBlockedConsumerOnUnackedMsgs` after the decrement, `Consumer.java` of 4.0.8,
    ///   l.567-630; confirmed on a 4.0.8 broker by the conformance harness); the cursor
    ///   deletes it.
    /// - Transactional individual acks (§5.2, §6): the conflict checks run first; a conflict
    ///   is [`AckOutcome::Conflict`] (see [`ConflictEffects`]). Otherwise the count goes down
    ///   at once by `batch_size` (or 1 when absent) minus the set's cardinality, whether or
    ///   not the entry is in `pendingAcks`; without a set the entry leaves `pendingAcks` now,
    ///   with one when the pending-ack state says it is wholly acknowledged.
    ///
    /// # Errors
    /// Nothing changes when one is returned.
    /// - [`Error::UnknownConsumer`]: `acker` is not connected.
    /// - [`Error::UnknownEntry`]: the entry was never dispatched.
    /// - [`Error::BitsBeyondBatch`]: the ack set has a bit at or beyond the entry's batch
    ///   size.
    /// - [`Error::InvalidBatchSize`]: a transactional ack's `batch_size` is present but
    ///   not in `1..=MAX_BATCH_SIZE`.
    /// - [`Error::TransactionEnded`]: the transaction already committed or aborted.
    pub fn ack(&mut self, acker: ConsumerId, ack: &WireAck) -> Result<AckOutcome, Error> {
        let acker = self.index(acker)?;
        if ack.kind == AckKind::Cumulative {
            self.tally(acker, |k| k.ignored += 1);
            return Ok(AckOutcome::Ignored(IgnoredReason::CumulativeOnShared));
        }
        let entry = ack.entry;
        let state = self
            .entries
            .get(&entry)
            .ok_or(Error::UnknownEntry { entry })?;
        // Zero words beyond the batch are fine (Go keeps trailing zero words).
        AckSet::from_wire(state.batch_size, &ack.ack_set)?;
        match ack.txn {
            None => self.ordinary_ack(acker, entry, &ack.ack_set),
            Some(txn) => self.txn_ack(acker, txn, entry, &ack.ack_set, ack.batch_size),
        }
    }

    fn ordinary_ack(
        &mut self,
        acker: usize,
        entry: EntryId,
        words: &[i64],
    ) -> Result<AckOutcome, Error> {
        let owner = self.owner(acker, &entry);
        let Some(state) = self.entries.get(&entry) else {
            return Err(Error::UnknownEntry { entry });
        };
        let size = state.batch_size;
        let batch_index_ack = self.config.batch_index_ack;
        let mut effect = AckEffect::default();
        if words.is_empty() {
            // getAckedCountForMsgIdNoAckSets: the broker's batch size, or what the cursor still
            // holds outstanding.
            let acked = match &state.cursor {
                Cursor::Partial(cursor) if batch_index_ack => i64::from(cursor.outstanding_count()),
                _ => i64::from(size),
            };
            let (removed, mut unblocked) = self.remove_pending_ack(owner, &entry);
            if removed {
                self.count(owner, &entry, -acked);
                effect.unacked_delta = -acked;
                // Since 4.0.3 (apache/pulsar#23796) `individualAckNormal` checks again after
                // the decrement: `addAndGetUnAckedMsgs(owner, -ackedCount);
                // updateBlockedConsumerOnUnackedMsgs(owner);` (Consumer.java, 4.0.8, l.567-630).
                unblocked |= self.update_blocked(owner);
            }
            effect.removed_from_pending_acks = removed;
            effect.unblocked = unblocked;
            if let Some(state) = self.entries.get_mut(&entry) {
                state.cursor = Cursor::Deleted;
            }
            self.pending.clear(&entry);
            effect.entry_deleted = true;
        } else {
            let given = AckSet::from_wire(size, words)?;
            let acked = if batch_index_ack && self.in_pending_acks(owner, &entry) {
                match &state.cursor {
                    Cursor::Partial(cursor) => {
                        let mut merged = cursor.clone();
                        merged
                            .merge_acks(&given)
                            .map_err(|_| Error::InconsistentBatchSize {
                                entry,
                                known: cursor.batch_size(),
                                given: i64::from(given.batch_size()),
                            })?;
                        i64::from(cursor.outstanding_count())
                            - i64::from(merged.outstanding_count())
                    }
                    _ => i64::from(size) - i64::from(given.outstanding_count()),
                }
            } else {
                0
            };
            self.pending
                .sync_ordinary(entry, &JavaBits::value_of(words));
            self.count(owner, &entry, -acked);
            effect.unacked_delta = -acked;
            if let Some(state) = self.entries.get_mut(&entry)
                && batch_index_ack
            {
                let next = match &state.cursor {
                    Cursor::Deleted => Cursor::Deleted,
                    Cursor::Outstanding => Cursor::Partial(given),
                    Cursor::Partial(cursor) => {
                        let mut merged = cursor.clone();
                        // Same size: both are sets of this entry.
                        let _ = merged.merge_acks(&given);
                        Cursor::Partial(merged)
                    }
                };
                state.cursor = match next {
                    Cursor::Partial(set) if set.is_complete() => Cursor::Deleted,
                    other => other,
                };
            }
            if self
                .entries
                .get(&entry)
                .is_some_and(|state| state.cursor == Cursor::Deleted)
            {
                self.pending.clear(&entry);
                effect.entry_deleted = true;
            }
            if self.pending.can_delete_consumer_pending_ack(&entry) {
                let (removed, unblocked) = self.remove_pending_ack(owner, &entry);
                effect.removed_from_pending_acks = removed;
                effect.unblocked = unblocked;
            }
        }
        self.tally(acker, |k| k.acks += 1);
        Ok(AckOutcome::Acked(effect))
    }

    fn txn_ack(
        &mut self,
        acker: usize,
        txn: TxnId,
        entry: EntryId,
        words: &[i64],
        client_batch_size: Option<i32>,
    ) -> Result<AckOutcome, Error> {
        if let Some(&committed) = self.ended.get(&txn) {
            return Err(Error::TransactionEnded { txn, committed });
        }
        let client_batch_size = client_batch_size.map(batch_size).transpose()?;
        let owner = self.owner(acker, &entry);
        let Some(state) = self.entries.get(&entry) else {
            return Err(Error::UnknownEntry { entry });
        };
        // §5.2: batchSize = hasBatchSize ? batch_size : 0; ackedCount = hasBatchSize ?
        // batch_size : 1, or batchSize - cardinality(ackSet) with a set.
        let stored_batch_size = client_batch_size.unwrap_or(0);
        let set = (!words.is_empty()).then(|| JavaBits::value_of(words));
        let acked = match &set {
            Some(set) => i64::from(stored_batch_size) - set.cardinality() as i64,
            None => client_batch_size.map_or(1, i64::from),
        };
        let conflict = if state.cursor == Cursor::Deleted {
            Some(ConflictReason::AlreadyAcknowledged)
        } else {
            self.pending
                .check(
                    &entry,
                    set.as_ref(),
                    stored_batch_size,
                    state.cursor_set().as_ref(),
                )
                .err()
        };
        if let Some(reason) = conflict {
            self.tally(acker, |k| k.conflicts += 1);
            let effect = match self.config.conflict_effects {
                ConflictEffects::None => AckEffect::default(),
                ConflictEffects::AsBroker => {
                    let mut effect = self.txn_accounting(owner, entry, acked, set.is_none());
                    if set.is_some() && self.pending.can_delete_consumer_pending_ack(&entry) {
                        let (removed, unblocked) = self.remove_pending_ack(owner, &entry);
                        effect.removed_from_pending_acks |= removed;
                        effect.unblocked |= unblocked;
                    }
                    effect
                }
            };
            return Ok(AckOutcome::Conflict(Conflict { reason, effect }));
        }
        let mut effect = self.txn_accounting(owner, entry, acked, set.is_none());
        let has_set = set.is_some();
        self.pending.acknowledge(txn, entry, set, stored_batch_size);
        if has_set && self.pending.can_delete_consumer_pending_ack(&entry) {
            let (removed, unblocked) = self.remove_pending_ack(owner, &entry);
            effect.removed_from_pending_acks = removed;
            effect.unblocked = unblocked;
        }
        self.tally(acker, |k| k.txn_acks += 1);
        Ok(AckOutcome::Acked(effect))
    }

    /// The owner's part of `individualAckWithTransaction`: the decrement, then for a
    /// whole-entry ack the removal from `pendingAcks`.
    fn txn_accounting(
        &mut self,
        owner: usize,
        entry: EntryId,
        acked: i64,
        whole_entry: bool,
    ) -> AckEffect {
        self.count(owner, &entry, -acked);
        let mut effect = AckEffect {
            unacked_delta: -acked,
            ..AckEffect::default()
        };
        if whole_entry {
            let (removed, unblocked) = self.remove_pending_ack(owner, &entry);
            effect.removed_from_pending_acks = removed;
            effect.unblocked = unblocked;
        }
        effect
    }

    /// Commits `txn`: each entry it acknowledged goes to the cursor with the transaction's
    /// merged set (§6). A whole-entry ack, or a merged set that acknowledges every index,
    /// deletes the entry; a partial set is ANDed into the batch-deleted indexes (broker
    /// batch-index acks enabled) or changes nothing (disabled). No consumer's count or
    /// `pendingAcks` is touched: they changed at ack time. A transaction with no acks
    /// commits as a no-op.
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] if `txn` already ended; nothing changes.
    pub fn commit(&mut self, txn: TxnId) -> Result<Committed, Error> {
        if let Some(&committed) = self.ended.get(&txn) {
            return Err(Error::TransactionEnded { txn, committed });
        }
        self.ended.insert(txn, true);
        self.counters.commits += 1;
        let mut committed = Committed::default();
        for (entry, merged) in self.pending.commit(&txn) {
            committed.entries.push(entry);
            let Some(state) = self.entries.get_mut(&entry) else {
                continue;
            };
            let next = match (&state.cursor, merged) {
                (Cursor::Deleted, _) => Cursor::Deleted,
                (_, None) => Cursor::Deleted,
                (_, Some(merged)) if merged.is_empty() => Cursor::Deleted,
                (cursor, Some(_)) if !self.config.batch_index_ack => cursor.clone(),
                (cursor, Some(merged)) => {
                    match AckSet::from_wire(state.batch_size, &merged.to_long_array()) {
                        Ok(given) => {
                            let set = match cursor {
                                Cursor::Partial(set) => {
                                    let mut set = set.clone();
                                    let _ = set.merge_acks(&given);
                                    set
                                }
                                _ => given,
                            };
                            if set.is_complete() {
                                Cursor::Deleted
                            } else {
                                Cursor::Partial(set)
                            }
                        }
                        // Unreachable: every set was checked against the entry at ack time.
                        Err(_) => cursor.clone(),
                    }
                }
            };
            state.cursor = next;
            if state.cursor == Cursor::Deleted {
                self.pending.clear(&entry);
                committed.deleted.push(entry);
            }
        }
        Ok(committed)
    }

    /// Aborts `txn`: the pending-ack state gets its indexes back (OR with the transaction's
    /// set flipped over the stored batch size; a whole-entry ack is dropped) and the entries
    /// are returned for redelivery (§6; `PendingAckHandleImpl` calls
    /// `redeliverUnacknowledgedMessages(consumer, positions)` on the subscription, which adds
    /// them to the dispatcher's replay set). No consumer's count, blocked flag or
    /// `pendingAcks` is touched: the replay goes through the dispatcher to **any** consumer
    /// with permits, so send the entries with [`dispatch`](Self::dispatch) to the consumer
    /// the dispatcher picks. The consumer that holds an entry keeps it in `pendingAcks` and
    /// keeps counting it; if the replay goes to it, the entry is counted again (see
    /// [`Counters::recounted_on_redispatch`](super::Counters::recounted_on_redispatch)), and
    /// if it goes to another consumer, both hold it.
    ///
    /// # Errors
    /// [`Error::TransactionEnded`] if `txn` already ended; nothing changes.
    pub fn abort(&mut self, txn: TxnId) -> Result<Aborted, Error> {
        if let Some(&committed) = self.ended.get(&txn) {
            return Err(Error::TransactionEnded { txn, committed });
        }
        self.ended.insert(txn, false);
        self.counters.aborts += 1;
        Ok(Aborted {
            redeliver: self.pending.abort(&txn),
        })
    }
}
