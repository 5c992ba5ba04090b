//! [`ConsumerModel`]: the consumer's unacked accounting, `pendingAcks`, the cursor and the
//! transactional pending-ack state, driven by dispatches and wire acks.

use std::collections::BTreeMap;

use super::java_bits::JavaBits;
use super::pending_ack::PendingAcks;
use super::{
    Counters, CursorState, Dispatch, EntryView, ModelConfig, Redelivered, SkipReason, TxnStatus,
};
use crate::Error;
use crate::{AckSet, EntryId, MAX_BATCH_SIZE, TxnId};

/// The cursor's state of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cursor {
    Outstanding,
    /// `batchDeletedIndexes`: only with broker batch-index acks enabled.
    Partial(AckSet),
    Deleted,
}

#[derive(Debug, Clone)]
pub(super) struct EntryState {
    pub(super) batch_size: u32,
    pub(super) in_pending_acks: bool,
    pub(super) cursor: Cursor,
    pub(super) counted: i64,
    /// How much of `counted` was already reported as recounted.
    pub(super) recounted: i64,
}

impl EntryState {
    /// `getBatchPositionAckSet` / `getDeletedBatchIndexesAsLongArray`.
    pub(super) fn cursor_set(&self) -> Option<JavaBits> {
        match &self.cursor {
            Cursor::Partial(set) => Some(JavaBits::from_words(set.words())),
            _ => None,
        }
    }
}

/// The broker side of one Shared-subscription consumer on a 4.0.x broker; see the
/// [module documentation](super) for the rules and the sources.
///
/// Drive it with what happens on the wire, in order: [`dispatch`](Self::dispatch) for each
/// entry the dispatcher sends, [`ack`](Self::ack) for each acknowledged message id,
/// [`commit`](Self::commit) and [`abort`](Self::abort) for transactions ending, and
/// [`redeliver_unacknowledged`](Self::redeliver_unacknowledged) for a client's redelivery
/// request. Read the state with [`unacked`](Self::unacked), [`is_blocked`](Self::is_blocked),
/// [`entries`](Self::entries) and [`counters`](Self::counters).
///
/// Transactions are always enabled (`transactionCoordinatorEnabled=true`), so ordinary
/// batch-index acks are also merged into the pending-ack state, as on such a broker. The
/// unacked count is an `i64` (the broker's is an `int`) and may go negative, as the broker's
/// does with broken clients. Every entry dispatched once is remembered for good, so that late
/// acks of it are recognised.
#[derive(Debug, Clone)]
pub struct ConsumerModel {
    pub(super) config: ModelConfig,
    pub(super) unacked: i64,
    pub(super) blocked: bool,
    pub(super) entries: BTreeMap<EntryId, EntryState>,
    pub(super) pending: PendingAcks,
    /// Ended transactions: whether each committed.
    pub(super) ended: BTreeMap<TxnId, bool>,
    pub(super) counters: Counters,
}

impl Default for ConsumerModel {
    fn default() -> Self {
        Self::new(ModelConfig::default())
    }
}

/// Checks `num_messages_in_batch` or a transactional `batch_size`.
pub(super) fn batch_size(size: i32) -> Result<u32, Error> {
    u32::try_from(size)
        .ok()
        .filter(|size| (1..=MAX_BATCH_SIZE).contains(size))
        .ok_or(Error::InvalidBatchSize {
            size: i64::from(size),
        })
}

impl ConsumerModel {
    /// A consumer with nothing dispatched yet.
    pub fn new(config: ModelConfig) -> Self {
        Self {
            config,
            unacked: 0,
            blocked: false,
            entries: BTreeMap::new(),
            pending: PendingAcks::default(),
            ended: BTreeMap::new(),
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Changes the limit of a connected consumer, as a topic-policy update of
    /// `maxUnackedMessagesOnConsumer` does on the broker: the count and the blocked flag stay
    /// as they are; the next dispatch blocks at the new limit and the next removed pending ack
    /// unblocks at half of it (at once when the new limit is 0, unlimited).
    pub fn set_max_unacked_messages(&mut self, max: u32) {
        self.config.max_unacked_messages = max;
    }

    /// The consumer's unacked count (`Consumer.unackedMessages`).
    pub fn unacked(&self) -> i64 {
        self.unacked
    }

    /// Whether dispatch to the consumer is blocked (`blockedConsumerOnUnackedMsgs`).
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// What happened so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The consumer's `pendingAcks`: each entry with its batch size, in order.
    pub fn pending_acks(&self) -> impl Iterator<Item = (EntryId, u32)> + '_ {
        self.entries
            .iter()
            .filter(|(_, state)| state.in_pending_acks)
            .map(|(entry, state)| (*entry, state.batch_size))
    }

    /// Everything known of one entry, if it was ever dispatched.
    pub fn entry(&self, entry: &EntryId) -> Option<EntryView<'_>> {
        self.entries
            .get(entry)
            .map(|state| self.view(*entry, state))
    }

    /// Every entry ever dispatched, in order.
    pub fn entries(&self) -> impl Iterator<Item = EntryView<'_>> + '_ {
        self.entries
            .iter()
            .map(|(entry, state)| self.view(*entry, state))
    }

    /// Gives the consumer the cursor's batch-deleted indexes of an entry it never received:
    /// `outstanding` holds the indexes the subscription's cursor still has to deliver (the
    /// others were acknowledged at batch-index level through a consumer of the subscription
    /// that has gone). The next [`dispatch`](Self::dispatch) of the entry then sends the
    /// cursor's ack set and counts only the outstanding indexes, as the dispatcher does with
    /// the cursor's `batchDeletedIndexes`; a set with nothing outstanding makes the entry
    /// deleted. An entry the consumer already knows keeps its state (its own is newer), and so
    /// does every entry when batch-index acks are disabled (the cursor then keeps no such
    /// sets). Returns whether the state was taken.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= num_messages <= MAX_BATCH_SIZE`;
    /// [`Error::InconsistentBatchSize`] if `outstanding` is a set of another size.
    pub fn restore_cursor(
        &mut self,
        entry: EntryId,
        num_messages: i32,
        outstanding: &AckSet,
    ) -> Result<bool, Error> {
        let size = batch_size(num_messages)?;
        if outstanding.batch_size() != size {
            return Err(Error::InconsistentBatchSize {
                entry,
                known: size,
                given: i64::from(outstanding.batch_size()),
            });
        }
        if !self.config.batch_index_ack || self.entries.contains_key(&entry) {
            return Ok(false);
        }
        let cursor = if outstanding.is_complete() {
            Cursor::Deleted
        } else {
            Cursor::Partial(outstanding.clone())
        };
        self.entries.insert(
            entry,
            EntryState {
                batch_size: size,
                in_pending_acks: false,
                cursor,
                counted: 0,
                recounted: 0,
            },
        );
        Ok(true)
    }

    fn view<'a>(&'a self, entry: EntryId, state: &'a EntryState) -> EntryView<'a> {
        EntryView {
            entry,
            batch_size: state.batch_size,
            in_pending_acks: state.in_pending_acks,
            cursor: match &state.cursor {
                Cursor::Outstanding => CursorState::Outstanding,
                Cursor::Partial(set) => CursorState::Partial(set),
                Cursor::Deleted => CursorState::Deleted,
            },
            counted: state.counted,
            pending: self.pending.position(&entry).map(|p| p.view()),
        }
    }

    /// The unacked count held by entries that left `pendingAcks`: what no correct ack can take
    /// back any more. A client that drops `batch_size` leaves `batch_size - 1` per entry here.
    pub fn leaked_unacked(&self) -> i64 {
        self.entries
            .values()
            .filter(|state| !state.in_pending_acks)
            .map(|state| state.counted)
            .sum()
    }

    /// Where a transaction stands.
    pub fn transaction_status(&self, txn: &TxnId) -> TxnStatus {
        match self.ended.get(txn) {
            Some(true) => TxnStatus::Committed,
            Some(false) => TxnStatus::Aborted,
            None if self.pending.txn_entries(txn).is_some() => TxnStatus::Open,
            None => TxnStatus::NotStarted,
        }
    }

    /// The entries an open transaction acknowledged, in order (none for other transactions).
    pub fn transaction_entries(&self, txn: &TxnId) -> impl Iterator<Item = EntryId> + '_ {
        self.pending
            .txn_entries(txn)
            .into_iter()
            .flat_map(|e| e.keys().copied())
    }

    /// The open transactions, in order.
    pub fn open_transactions(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.pending.open_txns()
    }

    fn block_if_at_limit(&mut self) {
        let max = i64::from(self.config.max_unacked_messages);
        if max > 0 && self.unacked >= max && !self.blocked {
            self.blocked = true;
            self.counters.blocked += 1;
        }
    }

    fn unblock(&mut self) -> bool {
        if self.blocked {
            self.blocked = false;
            self.counters.unblocked += 1;
            return true;
        }
        false
    }

    /// Adds `delta` to the count and to the entry's share of it.
    pub(super) fn count(&mut self, entry: &EntryId, delta: i64) {
        self.unacked = self.unacked.saturating_add(delta);
        if let Some(state) = self.entries.get_mut(entry) {
            state.counted = state.counted.saturating_add(delta);
        }
    }

    /// `Consumer.removePendingAcks`: returns (removed, unblocked). The unblock check (§7.1)
    /// sees the count as it is at that moment.
    pub(super) fn remove_pending_ack(&mut self, entry: &EntryId) -> (bool, bool) {
        let Some(state) = self.entries.get_mut(entry) else {
            return (false, false);
        };
        if !state.in_pending_acks {
            return (false, false);
        }
        state.in_pending_acks = false;
        (true, self.update_blocked())
    }

    /// `Consumer.updateBlockedConsumerOnUnackedMsgs`: a blocked consumer is unblocked when
    /// its count is at most half the limit (at once when the limit is 0, unlimited). Returns
    /// whether it was unblocked.
    pub(super) fn update_blocked(&mut self) -> bool {
        let max = i64::from(self.config.max_unacked_messages);
        if max > 0 {
            self.blocked && self.unacked <= max / 2 && self.unblock()
        } else {
            self.unblock()
        }
    }

    /// Sends an entry holding `num_messages` messages (`num_messages_in_batch`, 1 for an entry
    /// that is not a batch) to the consumer, as the dispatcher and `Consumer.sendMessages` do
    /// (§7.1):
    /// - a blocked consumer gets nothing: [`Dispatch::Blocked`], nothing changes;
    /// - an entry the cursor deleted, or whose every message is acknowledged or pending in a
    ///   transaction, is not sent: [`Dispatch::Skipped`];
    /// - otherwise the entry goes into `pendingAcks` (replacing itself if it is there
    ///   already) and the count grows by the batch size minus the messages already
    ///   acknowledged in the cursor or pending in a transaction (the dispatcher's ack set is
    ///   the cursor's batch-deleted set AND the pending-ack set); the consumer is blocked if
    ///   the count reaches the limit.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= num_messages <= MAX_BATCH_SIZE`;
    /// [`Error::InconsistentBatchSize`] if the entry was dispatched with another size.
    pub fn dispatch(&mut self, entry: EntryId, num_messages: i32) -> Result<Dispatch, Error> {
        let dispatch = self.dispatch_one(entry, num_messages, true)?;
        self.block_if_at_limit();
        Ok(match dispatch {
            Dispatch::Dispatched {
                counted, ack_set, ..
            } => Dispatch::Dispatched {
                counted,
                ack_set,
                blocked: self.blocked,
            },
            other => other,
        })
    }

    /// Sends several entries to the consumer in one `Consumer.sendMessages` call, as the
    /// Shared dispatcher does when it picks a consumer: it checks once that the consumer is
    /// not blocked (`isConsumerAvailable`), hands it up to a batch of entries, and
    /// `sendMessages` adds them all to the count before it blocks the consumer
    /// (`incrementUnackedMessages` after the loop, `Consumer.java` of 4.0.8, l.333-447, l.428).
    /// So one call can take the count past the limit by more than one entry: a 4.0.8 broker
    /// with a limit of 12 sent a consumer whose count a redelivery request had reset two
    /// replayed batches of 6 and a new batch of 5 at once, to 17 (seen by
    /// `integration_tests::conformance`). Each entry is handled as by
    /// [`dispatch`](Self::dispatch), except that the blocked flag is checked only before the
    /// first and set only after the last; every [`Dispatch::Dispatched`] reports the flag as it
    /// is after the call. A blocked consumer gets nothing: every answer is
    /// [`Dispatch::Blocked`].
    ///
    /// # Errors
    /// As [`dispatch`](Self::dispatch), for the first entry that fails; the entries before it
    /// stay dispatched and the blocked flag is updated for them.
    pub fn dispatch_all(&mut self, entries: &[(EntryId, i32)]) -> Result<Vec<Dispatch>, Error> {
        if self.blocked {
            self.counters.refused_while_blocked += entries.len() as u64;
            return Ok(vec![Dispatch::Blocked; entries.len()]);
        }
        let mut answers = Vec::with_capacity(entries.len());
        for (entry, num_messages) in entries {
            match self.dispatch_one(*entry, *num_messages, false) {
                Ok(answer) => answers.push(answer),
                Err(error) => {
                    self.block_if_at_limit();
                    return Err(error);
                }
            }
        }
        self.block_if_at_limit();
        let blocked = self.blocked;
        for answer in &mut answers {
            if let Dispatch::Dispatched { blocked: flag, .. } = answer {
                *flag = blocked;
            }
        }
        Ok(answers)
    }

    /// One entry of a dispatch, without blocking the consumer afterwards; `check_blocked`:
    /// refuse when the consumer is blocked.
    fn dispatch_one(
        &mut self,
        entry: EntryId,
        num_messages: i32,
        check_blocked: bool,
    ) -> Result<Dispatch, Error> {
        let size = batch_size(num_messages)?;
        if let Some(state) = self.entries.get(&entry)
            && state.batch_size != size
        {
            return Err(Error::InconsistentBatchSize {
                entry,
                known: state.batch_size,
                given: i64::from(num_messages),
            });
        }
        if check_blocked && self.blocked {
            self.counters.refused_while_blocked += 1;
            return Ok(Dispatch::Blocked);
        }
        let state = self.entries.entry(entry).or_insert(EntryState {
            batch_size: size,
            in_pending_acks: false,
            cursor: Cursor::Outstanding,
            counted: 0,
            recounted: 0,
        });
        if state.cursor == Cursor::Deleted {
            self.counters.skipped += 1;
            return Ok(Dispatch::Skipped(SkipReason::AlreadyAcknowledged));
        }
        let mut ack_set = state.cursor_set();
        if let Some(pending) = self.pending.position(&entry) {
            let Some(pending_set) = &pending.set else {
                self.counters.skipped += 1;
                return Ok(Dispatch::Skipped(SkipReason::PendingInTransaction));
            };
            let combined = match ack_set {
                Some(mut cursor_set) => {
                    cursor_set.and(pending_set);
                    cursor_set
                }
                None => pending_set.clone(),
            };
            if combined.is_empty() {
                self.counters.skipped += 1;
                return Ok(Dispatch::Skipped(SkipReason::PendingInTransaction));
            }
            ack_set = Some(combined);
        }
        let counted = match &ack_set {
            // batchSize - (batchSize - cardinality)
            Some(set) => set.cardinality() as i64,
            None => i64::from(size),
        };
        if state.in_pending_acks {
            // What the entry still counts from its earlier dispatch stays counted; report only
            // what was not reported at an earlier re-dispatch.
            self.counters.recounted_on_redispatch += state.counted - state.recounted;
            state.recounted = state.counted;
        }
        state.in_pending_acks = true;
        self.count(&entry, counted);
        self.counters.dispatched_entries += 1;
        self.counters.dispatched_messages += counted;
        Ok(Dispatch::Dispatched {
            counted,
            ack_set: ack_set.map(|set| set.to_long_array()).unwrap_or_default(),
            blocked: self.blocked,
        })
    }

    /// A FLOW command (`Consumer.flowPermits`): a Shared consumer at or above the limit is
    /// blocked. Returns whether the consumer is blocked.
    pub fn flow_permits(&mut self) -> bool {
        self.block_if_at_limit();
        self.blocked
    }

    /// A client's REDELIVER_UNACKNOWLEDGED_MESSAGES with message ids
    /// (`Consumer.redeliverUnacknowledgedMessages(List)`): each named entry in `pendingAcks`
    /// leaves it and the count goes down by its outstanding messages (the cursor's
    /// batch-deleted set with batch-index acks enabled, else the batch size; pending
    /// transactional acks are not considered). The consumer is unblocked (§7.1). Entries not in
    /// `pendingAcks` are passed over.
    pub fn redeliver_unacknowledged(&mut self, entries: &[EntryId]) -> Redelivered {
        let mut redelivered = Redelivered::default();
        for entry in entries {
            let Some(state) = self.entries.get_mut(entry) else {
                continue;
            };
            if !state.in_pending_acks {
                continue;
            }
            let outstanding = match &state.cursor {
                Cursor::Partial(cursor) if self.config.batch_index_ack => {
                    i64::from(cursor.outstanding_count())
                }
                _ => i64::from(state.batch_size),
            };
            state.in_pending_acks = false;
            redelivered.entries.push(*entry);
            redelivered.messages += outstanding;
            self.count(entry, -outstanding);
            if let Some(state) = self.entries.get_mut(entry) {
                state.recounted = state.recounted.min(state.counted.max(0));
            }
        }
        self.counters.redelivered_entries += redelivered.entries.len() as u64;
        self.unblock();
        redelivered
    }

    /// A client's REDELIVER_UNACKNOWLEDGED_MESSAGES without ids: the count is reset to 0,
    /// `pendingAcks` emptied and the consumer unblocked (§7.1).
    pub fn redeliver_all(&mut self) -> Redelivered {
        let mut redelivered = Redelivered {
            entries: Vec::new(),
            messages: self.unacked,
        };
        for (entry, state) in &mut self.entries {
            if state.in_pending_acks {
                state.in_pending_acks = false;
                redelivered.entries.push(*entry);
            }
            state.counted = 0;
            state.recounted = 0;
        }
        self.unacked = 0;
        self.counters.redelivered_entries += redelivered.entries.len() as u64;
        self.unblock();
        redelivered
    }
}
