//! [`SubscriptionModel`]: the broker side of a Shared (or Key_Shared) subscription with any
//! number of consumers. The cursor and the transactional pending-ack state belong to the
//! subscription; the unacked count, the blocked flag and `pendingAcks` belong to each
//! consumer.

use std::collections::BTreeMap;
use std::fmt;

use super::java_bits::JavaBits;
use super::pending_ack::PendingAcks;
use super::{
    Counters, CursorState, Dispatch, EntryView, ModelConfig, Redelivered, SkipReason, TxnStatus,
};
use crate::Error;
use crate::{AckSet, EntryId, MAX_BATCH_SIZE, TxnId};

/// A consumer of a [`SubscriptionModel`], named by the caller (the broker's consumer, however
/// the caller tells them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerId(pub u64);

impl fmt::Display for ConsumerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "consumer {}", self.0)
    }
}

/// The cursor's state of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cursor {
    Outstanding,
    /// `batchDeletedIndexes`: only with broker batch-index acks enabled.
    Partial(AckSet),
    Deleted,
}

/// The subscription's knowledge of one entry.
#[derive(Debug, Clone)]
pub(super) struct EntryState {
    pub(super) batch_size: u32,
    pub(super) cursor: Cursor,
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

/// One consumer's part of one entry.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Held {
    /// Whether the entry is in the consumer's `pendingAcks`.
    pub(super) in_pending_acks: bool,
    /// The part of the consumer's unacked count this entry's dispatches and acks account for.
    pub(super) counted: i64,
    /// How much of `counted` was already reported as recounted.
    pub(super) recounted: i64,
}

/// One consumer's accounting (`Consumer.unackedMessages`, `blockedConsumerOnUnackedMsgs`,
/// `pendingAcks`).
#[derive(Debug, Clone)]
pub(super) struct ConsumerState {
    pub(super) id: ConsumerId,
    pub(super) unacked: i64,
    pub(super) blocked: bool,
    pub(super) held: BTreeMap<EntryId, Held>,
    pub(super) counters: Counters,
}

/// One consumer as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerView<'a> {
    /// The consumer.
    pub id: ConsumerId,
    /// Its unacked count (`Consumer.unackedMessages`).
    pub unacked: i64,
    /// Whether dispatch to it is blocked (`blockedConsumerOnUnackedMsgs`).
    pub blocked: bool,
    /// What happened to it: dispatches it received, acks it sent, its blocks and unblocks,
    /// redeliveries it asked for (commits and aborts are the subscription's, in
    /// [`SubscriptionModel::counters`]).
    pub counters: &'a Counters,
}

/// The broker side of a Shared or Key_Shared subscription with any number of consumers, on
/// a 4.0.x broker; see the [module documentation](super) for the rules and their sources.
///
/// Drive it with what happens on the wire, in order: [`add_consumer`](Self::add_consumer)
/// and [`remove_consumer`](Self::remove_consumer) as consumers come and go,
/// [`dispatch`](Self::dispatch) (or [`dispatch_all`](Self::dispatch_all)) for each entry
/// the dispatcher sends to a consumer, [`ack`](Self::ack) for each acknowledged message id
/// with the consumer that sent it, [`commit`](Self::commit) and [`abort`](Self::abort) for
/// transactions ending, and [`redeliver_unacknowledged`](Self::redeliver_unacknowledged) /
/// [`redeliver_all`](Self::redeliver_all) for a consumer's redelivery request. The model
/// does not choose which consumer gets an entry: the dispatcher does (round robin for
/// Shared, the key's consumer for Key_Shared); it only says what each dispatch, ack and
/// request does.
///
/// Transactions are always enabled (`transactionCoordinatorEnabled=true`). Unacked counts
/// are `i64` (the broker's are `int`) and may go negative, as the broker's do with broken
/// clients. Every entry dispatched once is remembered for good, so that late acks of it are
/// recognised; so is each consumer's share of its count per entry, while the consumer is
/// connected.
///
/// ```
/// use txn_ack::model::{ConsumerId, Dispatch, ModelConfig, SubscriptionModel, WireAck};
/// use txn_ack::{AckKind, EntryId, MessagePosition, TxnId, txn_ack};
///
/// let (a, b) = (ConsumerId(1), ConsumerId(2));
/// let mut broker = SubscriptionModel::new(ModelConfig::new(0).with_batch_index_ack(true));
/// broker.add_consumer(a);
/// broker.add_consumer(b);
/// let entry = EntryId { ledger_id: 1, entry_id: 0 };
/// broker.dispatch(a, entry, 10)?;
/// // A acknowledges index 0 in a transaction that then aborts.
/// let txn = TxnId { most_bits: 0, least_bits: 1 };
/// let index_0 = MessagePosition::in_batch(1, 0, -1, 0, 10)?;
/// broker.ack(a, &WireAck::from(&txn_ack(txn, AckKind::Individual, &index_0)?))?;
/// let replay = broker.abort(txn)?.redeliver;
/// // The dispatcher sends the replay to B, whose turn it is: every index again.
/// assert!(matches!(
///     broker.dispatch(b, replay[0], 10)?,
///     Dispatch::Dispatched { counted: 10, .. }
/// ));
/// assert_eq!((broker.unacked(a), broker.unacked(b)), (Some(9), Some(10)));
/// assert_eq!(broker.holders(&entry).count(), 2);
/// # Ok::<(), txn_ack::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SubscriptionModel {
    pub(super) config: ModelConfig,
    /// Connected consumers, in subscription order (the order `getAckOwnerConsumerAndBatchSize`
    /// looks through).
    pub(super) consumers: Vec<ConsumerState>,
    pub(super) entries: BTreeMap<EntryId, EntryState>,
    pub(super) pending: PendingAcks,
    /// Ended transactions: whether each committed.
    pub(super) ended: BTreeMap<TxnId, bool>,
    /// Every consumer's counters added up (consumers that left included), with commits and
    /// aborts.
    pub(super) counters: Counters,
}

impl Default for SubscriptionModel {
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

impl SubscriptionModel {
    /// A subscription with no consumer and nothing dispatched yet.
    pub fn new(config: ModelConfig) -> Self {
        Self {
            config,
            consumers: Vec::new(),
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

    /// Changes the limit of every consumer, as a topic-policy update of
    /// `maxUnackedMessagesOnConsumer` does on the broker: counts and blocked flags stay as
    /// they are; the next dispatch blocks at the new limit and the next removed pending ack
    /// unblocks at half of it (at once when the new limit is 0, unlimited).
    pub fn set_max_unacked_messages(&mut self, max: u32) {
        self.config.max_unacked_messages = max;
    }

    /// A consumer joins the subscription, last in its order, with nothing unacked. Returns
    /// `false` (and changes nothing) if it is connected already.
    pub fn add_consumer(&mut self, id: ConsumerId) -> bool {
        if self.consumers.iter().any(|c| c.id == id) {
            return false;
        }
        self.consumers.push(ConsumerState {
            id,
            unacked: 0,
            blocked: false,
            held: BTreeMap::new(),
            counters: Counters::default(),
        });
        true
    }

    /// A consumer leaves (closed, unsubscribed or its connection lost):
    /// `PersistentDispatcherMultipleConsumers.removeConsumer` takes its unacked count off the
    /// subscription and adds every entry of its `pendingAcks` to the replay set, to be sent to
    /// the other consumers. The cursor and the transactional pending acks (those of its open
    /// transactions included) stay with the subscription. Returns the entries to replay, in
    /// order, and the count it held; `None` if the consumer is not connected.
    pub fn remove_consumer(&mut self, id: ConsumerId) -> Option<Redelivered> {
        let at = self.consumers.iter().position(|c| c.id == id)?;
        let consumer = self.consumers.remove(at);
        Some(Redelivered {
            entries: consumer
                .held
                .iter()
                .filter(|(_, held)| held.in_pending_acks)
                .map(|(entry, _)| *entry)
                .collect(),
            messages: consumer.unacked,
        })
    }

    /// The connected consumers, in subscription order.
    pub fn consumers(&self) -> impl Iterator<Item = ConsumerView<'_>> + '_ {
        self.consumers.iter().map(|c| ConsumerView {
            id: c.id,
            unacked: c.unacked,
            blocked: c.blocked,
            counters: &c.counters,
        })
    }

    /// One connected consumer.
    pub fn consumer(&self, id: ConsumerId) -> Option<ConsumerView<'_>> {
        self.consumers().find(|c| c.id == id)
    }

    /// A consumer's unacked count; `None` if it is not connected.
    pub fn unacked(&self, id: ConsumerId) -> Option<i64> {
        self.consumer(id).map(|c| c.unacked)
    }

    /// Whether dispatch to a consumer is blocked; `None` if it is not connected.
    pub fn is_blocked(&self, id: ConsumerId) -> Option<bool> {
        self.consumer(id).map(|c| c.blocked)
    }

    /// Every consumer's counters added up (those of consumers that left included), with the
    /// subscription's commits and aborts.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A consumer's `pendingAcks`: each entry with its batch size, in order (none for a
    /// consumer that is not connected).
    pub fn pending_acks(&self, id: ConsumerId) -> impl Iterator<Item = (EntryId, u32)> + '_ {
        self.consumers
            .iter()
            .filter(move |c| c.id == id)
            .flat_map(|c| c.held.iter())
            .filter(|(_, held)| held.in_pending_acks)
            .map(|(entry, _)| {
                let size = self.entries.get(entry).map_or(1, |e| e.batch_size);
                (*entry, size)
            })
    }

    /// The consumers holding `entry` in their `pendingAcks`, in subscription order. After an
    /// abort's replay went to another consumer there can be more than one.
    pub fn holders(&self, entry: &EntryId) -> impl Iterator<Item = ConsumerId> + '_ {
        let entry = *entry;
        self.consumers
            .iter()
            .filter(move |c| c.held.get(&entry).is_some_and(|h| h.in_pending_acks))
            .map(|c| c.id)
    }

    /// The part of a consumer's unacked count that `entry` accounts for (`None` if the
    /// consumer is not connected, or the entry is not in its `pendingAcks` and accounts for
    /// nothing of its count).
    pub fn counted(&self, id: ConsumerId, entry: &EntryId) -> Option<i64> {
        self.consumers
            .iter()
            .find(|c| c.id == id)?
            .held
            .get(entry)
            .map(|h| h.counted)
    }

    /// The consumer whose count an ack of `entry` sent by `acker` changes
    /// (`Consumer.getAckOwnerConsumerAndBatchSize`): the acker if the entry is in its
    /// `pendingAcks`, else the first consumer in subscription order whose `pendingAcks` holds
    /// it, else the acker.
    pub fn ack_owner(&self, acker: ConsumerId, entry: &EntryId) -> ConsumerId {
        match self.consumers.iter().position(|c| c.id == acker) {
            Some(at) => self.consumers[self.owner(at, entry)].id,
            None => acker,
        }
    }

    /// The unacked count of a consumer held by entries that left its `pendingAcks`: what no
    /// correct ack can take back any more. A client that drops `batch_size` leaves
    /// `batch_size - 1` per entry here.
    pub fn leaked_unacked(&self, id: ConsumerId) -> i64 {
        self.consumers
            .iter()
            .filter(|c| c.id == id)
            .flat_map(|c| c.held.values())
            .filter(|held| !held.in_pending_acks)
            .map(|held| held.counted)
            .sum()
    }

    /// Everything known of one entry, if it was ever dispatched: whether any consumer holds it
    /// in `pendingAcks`, and the shares of every consumer's count added up.
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

    fn view<'a>(&'a self, entry: EntryId, state: &'a EntryState) -> EntryView<'a> {
        let (mut in_pending_acks, mut counted) = (false, 0i64);
        for consumer in &self.consumers {
            if let Some(held) = consumer.held.get(&entry) {
                in_pending_acks |= held.in_pending_acks;
                counted = counted.saturating_add(held.counted);
            }
        }
        EntryView {
            entry,
            batch_size: state.batch_size,
            in_pending_acks,
            cursor: match &state.cursor {
                Cursor::Outstanding => CursorState::Outstanding,
                Cursor::Partial(set) => CursorState::Partial(set),
                Cursor::Deleted => CursorState::Deleted,
            },
            counted,
            pending: self.pending.position(&entry).map(|p| p.view()),
        }
    }

    /// Gives the subscription's cursor the batch-deleted indexes of an entry the model has
    /// not seen: `outstanding` holds the indexes still to deliver (the others were
    /// acknowledged at batch-index level before the model started). The next
    /// [`dispatch`](Self::dispatch) of the entry then sends the cursor's ack set and counts
    /// only the outstanding indexes, as the dispatcher does with the cursor's
    /// `batchDeletedIndexes`; a set with nothing outstanding makes the entry deleted. A known
    /// entry keeps its state (the model's is newer), and so does every entry when batch-index
    /// acks are disabled (the cursor then keeps no such sets). Returns whether the state was
    /// taken.
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
                cursor,
            },
        );
        Ok(true)
    }

    /// The cursor was reset (a `SEEK`, after the broker disconnected every consumer): what it
    /// knew of each entry is forgotten, so every entry at or after the new position is
    /// outstanding again (the caller's cursor deletes those before it; give the start entry's
    /// ack set with [`restore_cursor`](Self::restore_cursor)). The transactional pending acks
    /// stay, as on the broker (the pending-ack store is not the cursor), and so do the
    /// entries they name. Returns `false` (and changes nothing) while a connected consumer
    /// holds something (a Failover standby, which holds nothing, may stay).
    pub fn reset_cursor(&mut self) -> bool {
        if self.consumers.iter().any(|c| !c.held.is_empty()) {
            return false;
        }
        let pending = &self.pending;
        self.entries.retain(|entry, state| {
            let keep = pending.position(entry).is_some();
            if keep {
                state.cursor = Cursor::Outstanding;
            }
            keep
        });
        true
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

    // ----- consumer-level helpers -----------------------------------------------------------

    pub(super) fn index(&self, id: ConsumerId) -> Result<usize, Error> {
        self.consumers
            .iter()
            .position(|c| c.id == id)
            .ok_or(Error::UnknownConsumer { consumer: id.0 })
    }

    /// Counts an event in consumer `c`'s counters and in the subscription's.
    pub(super) fn tally(&mut self, c: usize, event: impl Fn(&mut Counters)) {
        event(&mut self.counters);
        if let Some(consumer) = self.consumers.get_mut(c) {
            event(&mut consumer.counters);
        }
    }

    /// `Consumer.getAckOwnerConsumerAndBatchSize`, by index.
    pub(super) fn owner(&self, acker: usize, entry: &EntryId) -> usize {
        let holds = |c: &ConsumerState| c.held.get(entry).is_some_and(|h| h.in_pending_acks);
        if holds(&self.consumers[acker]) {
            return acker;
        }
        self.consumers.iter().position(holds).unwrap_or(acker)
    }

    fn block_if_at_limit(&mut self, c: usize) {
        let max = i64::from(self.config.max_unacked_messages);
        let consumer = &mut self.consumers[c];
        if max > 0 && consumer.unacked >= max && !consumer.blocked {
            consumer.blocked = true;
            self.tally(c, |k| k.blocked += 1);
        }
    }

    fn unblock(&mut self, c: usize) -> bool {
        if self.consumers[c].blocked {
            self.consumers[c].blocked = false;
            self.tally(c, |k| k.unblocked += 1);
            return true;
        }
        false
    }

    /// Adds `delta` to consumer `c`'s count and to the entry's share of it.
    pub(super) fn count(&mut self, c: usize, entry: &EntryId, delta: i64) {
        let consumer = &mut self.consumers[c];
        consumer.unacked = consumer.unacked.saturating_add(delta);
        let held = consumer.held.entry(*entry).or_default();
        held.counted = held.counted.saturating_add(delta);
        Self::forget_if_settled(&mut consumer.held, entry);
    }

    /// Drops a consumer's record of an entry that is out of its `pendingAcks` and accounts
    /// for nothing of its count, so that a long run keeps only what matters.
    fn forget_if_settled(held: &mut BTreeMap<EntryId, Held>, entry: &EntryId) {
        if held
            .get(entry)
            .is_some_and(|h| !h.in_pending_acks && h.counted == 0)
        {
            held.remove(entry);
        }
    }

    /// Whether consumer `c` holds `entry` in its `pendingAcks`.
    pub(super) fn in_pending_acks(&self, c: usize, entry: &EntryId) -> bool {
        self.consumers[c]
            .held
            .get(entry)
            .is_some_and(|h| h.in_pending_acks)
    }

    /// `Consumer.removePendingAcks` on consumer `c`: returns (removed, unblocked). The unblock
    /// check (§7.1) sees the count as it is at that moment.
    pub(super) fn remove_pending_ack(&mut self, c: usize, entry: &EntryId) -> (bool, bool) {
        let Some(held) = self.consumers[c].held.get_mut(entry) else {
            return (false, false);
        };
        if !held.in_pending_acks {
            return (false, false);
        }
        held.in_pending_acks = false;
        Self::forget_if_settled(&mut self.consumers[c].held, entry);
        (true, self.update_blocked(c))
    }

    /// `Consumer.updateBlockedConsumerOnUnackedMsgs`: a blocked consumer is unblocked when
    /// its count is at most half the limit (at once when the limit is 0, unlimited). Returns
    /// whether it was unblocked.
    pub(super) fn update_blocked(&mut self, c: usize) -> bool {
        let max = i64::from(self.config.max_unacked_messages);
        if max > 0 {
            let consumer = &self.consumers[c];
            consumer.blocked && consumer.unacked <= max / 2 && self.unblock(c)
        } else {
            self.unblock(c)
        }
    }

    // ----- dispatch -------------------------------------------------------------------------

    /// Sends an entry holding `num_messages` messages (`num_messages_in_batch`, 1 for an entry
    /// that is not a batch) to consumer `id`, as the dispatcher and `Consumer.sendMessages` do
    /// (§7.1):
    /// - a blocked consumer gets nothing: [`Dispatch::Blocked`], nothing changes;
    /// - an entry the cursor deleted, or whose every message is acknowledged or pending in a
    ///   transaction, is not sent: [`Dispatch::Skipped`];
    /// - otherwise the entry goes into the consumer's `pendingAcks` (replacing itself if it is
    ///   there already; other consumers that hold it keep it) and the consumer's count grows by
    ///   the batch size minus the messages already acknowledged in the cursor or pending in a
    ///   transaction (the dispatcher's ack set is the cursor's batch-deleted set AND the
    ///   pending-ack set); the consumer is blocked if its count reaches the limit.
    ///
    /// # Errors
    /// [`Error::UnknownConsumer`] if `id` is not connected; [`Error::InvalidBatchSize`] unless
    /// `1 <= num_messages <= MAX_BATCH_SIZE`; [`Error::InconsistentBatchSize`] if the entry was
    /// dispatched with another size.
    pub fn dispatch(
        &mut self,
        id: ConsumerId,
        entry: EntryId,
        num_messages: i32,
    ) -> Result<Dispatch, Error> {
        let c = self.index(id)?;
        let dispatch = self.dispatch_one(c, entry, num_messages, true)?;
        self.block_if_at_limit(c);
        let blocked = self.consumers[c].blocked;
        Ok(match dispatch {
            Dispatch::Dispatched {
                counted, ack_set, ..
            } => Dispatch::Dispatched {
                counted,
                ack_set,
                blocked,
            },
            other => other,
        })
    }

    /// Sends several entries to consumer `id` in one `Consumer.sendMessages` call, as the
    /// Shared dispatcher does when it picks a consumer (`trySendMessagesToConsumers` hands
    /// each consumer it picks up to `getMaxEntriesInThisBatch` entries): it checks once that
    /// the consumer is not blocked (`isConsumerAvailable`), and `sendMessages` adds them all
    /// to the count before it blocks the consumer (`incrementUnackedMessages` after the loop,
    /// `Consumer.java` of 4.0.8, l.333-447). So one call can take the count past the limit by
    /// more than one entry. Each entry is handled as by [`dispatch`](Self::dispatch), except
    /// that the blocked flag is checked only before the first and set only after the last;
    /// every [`Dispatch::Dispatched`] reports the flag as it is after the call. A blocked
    /// consumer gets nothing: every answer is [`Dispatch::Blocked`].
    ///
    /// # Errors
    /// As [`dispatch`](Self::dispatch), for the first entry that fails; the entries before it
    /// stay dispatched and the blocked flag is updated for them.
    pub fn dispatch_all(
        &mut self,
        id: ConsumerId,
        entries: &[(EntryId, i32)],
    ) -> Result<Vec<Dispatch>, Error> {
        let c = self.index(id)?;
        if self.consumers[c].blocked {
            let refused = entries.len() as u64;
            self.tally(c, |k| k.refused_while_blocked += refused);
            return Ok(vec![Dispatch::Blocked; entries.len()]);
        }
        let mut answers = Vec::with_capacity(entries.len());
        for (entry, num_messages) in entries {
            match self.dispatch_one(c, *entry, *num_messages, false) {
                Ok(answer) => answers.push(answer),
                Err(error) => {
                    self.block_if_at_limit(c);
                    return Err(error);
                }
            }
        }
        self.block_if_at_limit(c);
        let blocked = self.consumers[c].blocked;
        for answer in &mut answers {
            if let Dispatch::Dispatched { blocked: flag, .. } = answer {
                *flag = blocked;
            }
        }
        Ok(answers)
    }

    /// One entry of a dispatch to consumer `c`, without blocking the consumer afterwards;
    /// `check_blocked`: refuse when the consumer is blocked.
    fn dispatch_one(
        &mut self,
        c: usize,
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
        if check_blocked && self.consumers[c].blocked {
            self.tally(c, |k| k.refused_while_blocked += 1);
            return Ok(Dispatch::Blocked);
        }
        let state = self.entries.entry(entry).or_insert(EntryState {
            batch_size: size,
            cursor: Cursor::Outstanding,
        });
        if state.cursor == Cursor::Deleted {
            self.tally(c, |k| k.skipped += 1);
            return Ok(Dispatch::Skipped(SkipReason::AlreadyAcknowledged));
        }
        let mut ack_set = state.cursor_set();
        if let Some(pending) = self.pending.position(&entry) {
            let Some(pending_set) = &pending.set else {
                self.tally(c, |k| k.skipped += 1);
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
                self.tally(c, |k| k.skipped += 1);
                return Ok(Dispatch::Skipped(SkipReason::PendingInTransaction));
            }
            ack_set = Some(combined);
        }
        let counted = match &ack_set {
            // batchSize - (batchSize - cardinality)
            Some(set) => set.cardinality() as i64,
            None => i64::from(size),
        };
        let held = self.consumers[c].held.entry(entry).or_default();
        let mut recounted = 0;
        if held.in_pending_acks {
            // What the entry still counts from its earlier dispatch stays counted; report only
            // what was not reported at an earlier re-dispatch.
            recounted = held.counted - held.recounted;
            held.recounted = held.counted;
        }
        held.in_pending_acks = true;
        self.count(c, &entry, counted);
        self.tally(c, |k| {
            k.recounted_on_redispatch += recounted;
            k.dispatched_entries += 1;
            k.dispatched_messages += counted;
        });
        Ok(Dispatch::Dispatched {
            counted,
            ack_set: ack_set.map(|set| set.to_long_array()).unwrap_or_default(),
            blocked: self.consumers[c].blocked,
        })
    }

    /// A FLOW command from consumer `id` (`Consumer.flowPermits`): a Shared consumer at or
    /// above the limit is blocked. Returns whether the consumer is blocked.
    ///
    /// # Errors
    /// [`Error::UnknownConsumer`] if `id` is not connected.
    pub fn flow_permits(&mut self, id: ConsumerId) -> Result<bool, Error> {
        let c = self.index(id)?;
        self.block_if_at_limit(c);
        Ok(self.consumers[c].blocked)
    }

    /// Every consumer's `pendingAcks` loses the entries up to `last` (inclusive) without any
    /// change to the counts, as `readMoreEntries` does with the cursor's mark-delete position
    /// (`PendingAcksMap.removeAllUpTo` in 4.0.8; newer brokers also decrement,
    /// apache/pulsar#25581). An entry another consumer acknowledged while a consumer still
    /// held it (after an abort's replay went to another consumer) leaves that consumer's
    /// `pendingAcks` here, and its share of the count stays for good. Returns how many
    /// entries left a `pendingAcks`.
    pub fn remove_pending_acks_up_to(&mut self, last: EntryId) -> u64 {
        let mut removed = 0;
        for consumer in &mut self.consumers {
            for (_, held) in consumer.held.range_mut(..=last) {
                if held.in_pending_acks {
                    held.in_pending_acks = false;
                    removed += 1;
                }
            }
            consumer
                .held
                .retain(|entry, held| *entry > last || held.counted != 0);
        }
        removed
    }

    // ----- redelivery requests --------------------------------------------------------------

    /// Consumer `id`'s REDELIVER_UNACKNOWLEDGED_MESSAGES with message ids
    /// (`Consumer.redeliverUnacknowledgedMessages(List)`): each named entry in **this
    /// consumer's** `pendingAcks` leaves it and its count goes down by the entry's outstanding
    /// messages (the cursor's batch-deleted set with batch-index acks enabled, else the batch
    /// size; pending transactional acks are not considered); entries not in its `pendingAcks`
    /// (another consumer's, or none's) are passed over. The consumer is unblocked whatever the
    /// ids named (§7.1). The entries returned go to the dispatcher's replay set and from there
    /// to any consumer.
    ///
    /// # Errors
    /// [`Error::UnknownConsumer`] if `id` is not connected.
    pub fn redeliver_unacknowledged(
        &mut self,
        id: ConsumerId,
        entries: &[EntryId],
    ) -> Result<Redelivered, Error> {
        let c = self.index(id)?;
        let mut redelivered = Redelivered::default();
        for entry in entries {
            if !self.in_pending_acks(c, entry) {
                continue;
            }
            let outstanding = match self.entries.get(entry).map(|e| (&e.cursor, e.batch_size)) {
                Some((Cursor::Partial(cursor), _)) if self.config.batch_index_ack => {
                    i64::from(cursor.outstanding_count())
                }
                Some((_, size)) => i64::from(size),
                None => 1,
            };
            redelivered.entries.push(*entry);
            redelivered.messages += outstanding;
            self.count(c, entry, -outstanding);
            if let Some(held) = self.consumers[c].held.get_mut(entry) {
                held.in_pending_acks = false;
                held.recounted = held.recounted.min(held.counted.max(0));
            }
            Self::forget_if_settled(&mut self.consumers[c].held, entry);
        }
        let taken = redelivered.entries.len() as u64;
        self.tally(c, |k| k.redelivered_entries += taken);
        self.unblock(c);
        Ok(redelivered)
    }

    /// Consumer `id`'s REDELIVER_UNACKNOWLEDGED_MESSAGES without ids
    /// (`Consumer.redeliverUnacknowledgedMessages(epoch)`): its count is reset to 0, its
    /// `pendingAcks` emptied and it is unblocked (§7.1). The entries returned go to the
    /// dispatcher's replay set and from there to any consumer, the one that asked included.
    ///
    /// # Errors
    /// [`Error::UnknownConsumer`] if `id` is not connected.
    pub fn redeliver_all(&mut self, id: ConsumerId) -> Result<Redelivered, Error> {
        let c = self.index(id)?;
        let consumer = &mut self.consumers[c];
        let mut redelivered = Redelivered {
            entries: Vec::new(),
            messages: consumer.unacked,
        };
        for (entry, held) in &consumer.held {
            if held.in_pending_acks {
                redelivered.entries.push(*entry);
            }
        }
        // Nothing is in its pendingAcks nor counted any more: nothing to remember.
        consumer.held.clear();
        consumer.unacked = 0;
        let taken = redelivered.entries.len() as u64;
        self.tally(c, |k| k.redelivered_entries += taken);
        self.unblock(c);
        Ok(redelivered)
    }
}
