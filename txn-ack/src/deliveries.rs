//! [`Deliveries`]: duplicate deliveries and the drift of a 4.0.x broker's unacked count.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::recent::{Recall, Recent};
use crate::{EntryId, MessagePosition, TxnId};

/// What a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The first delivery since the message was last released: hand it to the application.
    New,
    /// A message the application already has or has acknowledged: do not hand it over again.
    Duplicate(DuplicateOf),
}

impl Delivery {
    /// Whether it is a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}

/// What a duplicate delivery repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicateOf {
    /// A message the application holds and has not acknowledged yet.
    Held,
    /// A message acknowledged in this open transaction.
    PendingIn(TxnId),
    /// A message acknowledged in this committed transaction.
    CommittedIn(TxnId),
    /// A message acknowledged outside any transaction.
    Acknowledged,
}

/// Where one index stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never delivered to this consumer.
    Unseen,
    /// Delivered here, then given back by an abort or a negative ack: the broker owes it.
    Released,
    /// Left out of a dispatch because the broker had it acknowledged or pending in a
    /// transaction (not by this consumer, as far as it knows).
    Skipped,
    /// With the application, unacknowledged. `counted`: the broker counts it (false between a
    /// count reset and its replay).
    Held { counted: bool },
    /// Acknowledged (in `txn`, if any). `counted`: false when the ack went out between a
    /// count reset and the replay, so it took one off a count that did not hold it.
    Acked {
        txn: Option<TxnId>,
        committed: bool,
        counted: bool,
    },
}

/// The states of one entry's indexes.
#[derive(Debug, Clone)]
struct Entry {
    states: Vec<State>,
}

/// A settled entry as remembered: one state for every index when they are all alike (the
/// usual case, and no allocation), or each.
#[derive(Debug, Clone)]
enum Settled {
    Alike { size: u32, state: State },
    Each(Entry),
}

impl Settled {
    fn of(entry: Entry) -> Self {
        match entry.states.first() {
            Some(first) if entry.states.iter().all(|state| state == first) => Self::Alike {
                size: u32::try_from(entry.states.len()).unwrap_or(u32::MAX),
                state: *first,
            },
            _ => Self::Each(entry),
        }
    }

    fn entry(self) -> Entry {
        match self {
            Self::Alike { size, state } => Entry {
                states: vec![state; size as usize],
            },
            Self::Each(entry) => entry,
        }
    }
}

impl Entry {
    /// Nothing of it is held or acknowledged here.
    fn is_released(&self) -> bool {
        self.states
            .iter()
            .all(|state| matches!(state, State::Unseen | State::Released | State::Skipped))
    }

    fn is_settled(&self) -> bool {
        self.states.iter().all(|state| {
            matches!(
                state,
                State::Skipped
                    | State::Acked {
                        txn: None,
                        counted: true,
                        ..
                    }
                    | State::Acked {
                        committed: true,
                        counted: true,
                        ..
                    }
            )
        })
    }
}

/// The deliveries of one consumer on one topic or partition.
///
/// A 4.0.x broker counts a consumer's unacked messages **per delivery**, not per message
/// (`Consumer.sendMessages` adds every index a dispatch carries, even for an entry already in
/// the consumer's `pendingAcks`), and an abort gives no count back: it only restores the
/// aborted indexes and queues the entries for replay **to any consumer** of the
/// subscription. So after an abort a consumer can receive again, and be counted again for,
/// indexes it still holds; on a Shared subscription with several consumers, *another*
/// consumer receives them, while this one's application still holds them.
///
/// [`Deliveries`] follows every index through delivery, acknowledgement and the end of its
/// transaction; it recognises the duplicates (which must not reach the application a second
/// time: it has them, or has acknowledged them), says which indexes of an entry the
/// application holds ([`Deliveries::held_indexes`]: a client that acknowledges part of such
/// an entry in a transaction holds the ack back, since the transaction's abort would replay
/// the rest of the entry to any consumer), keeps the copies that a transaction's abort sent
/// before the client knew of it ([`Deliveries::ended`] returns them), and keeps
/// [`Deliveries::drift`], the broker's count minus what the application's future acks will
/// take off. A positive drift (another client's abort, a replay after a restart) can leave
/// the consumer blocked for good; the repair that replays nothing is a redelivery request
/// naming an entry no consumer holds (the broker then unblocks the consumer and reads with
/// the permits it kept aside). A redelivery request *without* ids must not be used for it:
/// it sets the count to 0 but hands every message the application holds to the other
/// consumers.
///
/// # The broker's rules behind it
/// Read in the Apache Pulsar 4.0.8 sources (`pulsar-broker`, `managed-ledger`; paths under
/// `org/apache/pulsar/broker/`), unchanged in these places since 4.0.0, and checked on a real
/// 4.0.8 standalone (`acknowledgmentAtBatchIndexLevelEnabled=true`) by this workspace's
/// real-broker suites (`tests/tests/pulsar_real.rs` for one consumer, `pulsar_shared.rs` for
/// several; the conformance harness compares the model step by step):
///
/// | rule | where | seen on 4.0.8 |
/// |---|---|---|
/// | a dispatch adds the indexes its ack set carries (cursor's batch-deleted set AND the pending-ack set), also for an entry still in `pendingAcks`, whose slot is overwritten | `service/Consumer.sendMessages`, `PendingAcksMap.addPendingAckIfAllowed` | the steady shape stalls without this ledger |
/// | a transactional ack subtracts `batch_size - card(ack_set)` at once, before the pending-ack handle checks it, and never gives it back (not on `TransactionConflict`, not on abort) | `Consumer.individualAckWithTransaction` | after an aborted ack of 1 of 10 held: unacked 9 |
/// | the pending-ack handle records a transactional ack only after persisting it; a replay read meanwhile carries the index, which the transaction then commits | `transaction/pendingack/impl/PendingAckHandleImpl.internalIndividualAcknowledgeMessage`, `service/AbstractBaseDispatcher.filterEntriesForConsumer` | committed indexes redelivered after aborts |
/// | an abort restores the indexes and queues the entries for replay to **any** consumer with permits, carrying every index neither acknowledged nor pending in another transaction; no consumer's count changes | `PendingAckHandleImpl.internalAbortTxn`, `PersistentDispatcherMultipleConsumers.redeliverUnacknowledgedMessages` | A held a batch of 10, aborted an ack of 1: B received all 10 (3 of 3) |
/// | an ordinary ack with an ack set subtracts only indexes still outstanding in the cursor, so nothing for an index a committed transaction acknowledged | `Consumer.individualAckNormal`, `getAckedCountForBatchIndexLevelEnabled` | |
/// | an ack counts for whichever consumer of the subscription has the entry in its `pendingAcks` (this one first, then the others) | `Consumer.getAckOwnerConsumerAndBatchSize` | |
/// | the consumer unblocks only when an entry leaves `pendingAcks` with the count at most half the limit, or on a redelivery request; a `FLOW` while the count is at the limit blocks it again, and its permits wait for the unblock | `Consumer.updateBlockedConsumerOnUnackedMsgs`, `removePendingAcks`, `flowPermits` | |
/// | `REDELIVER_UNACKNOWLEDGED_MESSAGES` without ids clears this consumer's count and `pendingAcks`, unblocks and replays them to any consumer | `Consumer.redeliverUnacknowledgedMessages(long)` | B received all 10 that A held |
/// | with ids, only entries in this consumer's `pendingAcks` are taken off (their unacked indexes) and replayed, whole (ledger and entry only), to any consumer; then the consumer is unblocked and the permits it sent while blocked are applied, which is the only read it triggers | `Consumer.redeliverUnacknowledgedMessages(List)` | an id no one holds on a blocked consumer: unblocked, nothing replayed, nothing read; with a permit sent before, 1 message read |
/// | a `FLOW` of 0 permits is refused (`checkArgument`) and the connection ends | `Consumer.flowPermits` | the consumer subscribed again and was sent everything again |
///
/// So the count drifts up by one for every copy of a held message a replay brings to the
/// same consumer, and for every index replayed while its transactional ack was being
/// persisted. The Java client 4.0.8 works its way out by acknowledging those copies in its
/// transactions: the acks conflict, still take one off each, and the transactions fail to
/// commit. A client built on this ledger sends no conflicting ack and no redelivery request
/// without ids: it avoids the replays it would cause (held-back acks), hides the copies it
/// still gets, and unblocks a drifted consumer without a replay.
///
/// ```
/// use txn_ack::{Deliveries, Delivery, EntryId, MessagePosition, TxnId};
///
/// let txn = TxnId { most_bits: 0, least_bits: 1 };
/// let at = |i| MessagePosition::in_batch(1, 2, -1, i, 2).unwrap();
/// let mut deliveries = Deliveries::default();
/// assert_eq!(deliveries.delivered(&at(0)), Delivery::New);
/// assert_eq!(deliveries.delivered(&at(1)), Delivery::New);
/// let entry = EntryId { ledger_id: 1, entry_id: 2 };
/// // Both held: a transactional ack of index 0 would be held back.
/// assert_eq!(deliveries.held_indexes(&entry).collect::<Vec<_>>(), [0, 1]);
/// deliveries.acked(&at(0), Some(txn));
/// // Its abort replays the entry, here to this consumer, before the client knows of it:
/// assert!(deliveries.delivered(&at(0)).is_duplicate()); // pending in the transaction
/// assert!(deliveries.delivered(&at(1)).is_duplicate()); // the application still holds it
/// assert_eq!(deliveries.drift(), 2);
/// // The abort is answered: the copy of index 0 is new to the application after all.
/// assert_eq!(deliveries.ended(txn, false), [at(0)]);
/// assert_eq!(deliveries.drift(), 1); // index 1 is counted twice, and acknowledged once
/// ```
#[derive(Debug, Clone)]
pub struct Deliveries {
    entries: HashMap<EntryId, Entry, FxBuildHasher>,
    /// Entries whose every message is acknowledged for good or was left out by the broker,
    /// with their states, so that a late copy is recognised (and a message the broker had
    /// left out is delivered when it comes after all), as long as the [`Recall`] keeps them.
    settled: Recent<Settled>,
    /// Copies that arrived of messages acknowledged in a transaction not ended yet, by
    /// transaction: an abort (or its timeout) sent them again.
    copies: HashMap<TxnId, Vec<MessagePosition>, FxBuildHasher>,
    drift: i64,
    duplicates: u64,
}

impl Default for Deliveries {
    fn default() -> Self {
        Self::with_recall(Recall::default())
    }
}

impl Deliveries {
    /// Remembers at least the last `recent_capacity` settled entries (every message
    /// acknowledged for good), so that their late redeliveries are recognised; otherwise as
    /// [`Recall::default`].
    pub fn with_capacity(recent_capacity: usize) -> Self {
        Self::with_recall(Recall::default().at_least(recent_capacity))
    }

    /// Remembers settled entries as `recall` says.
    pub fn with_recall(recall: Recall) -> Self {
        Self {
            entries: HashMap::with_hasher(FxBuildHasher),
            settled: Recent::new(recall),
            copies: HashMap::with_hasher(FxBuildHasher),
            drift: 0,
            duplicates: 0,
        }
    }

    /// The time now, on any monotonic clock of the caller's: settled entries are
    /// remembered by the [`Recall`] on it (its count bounds without a clock).
    pub fn set_clock(&mut self, now: std::time::Duration) {
        self.settled.set_clock(now);
    }

    /// Settled entries remembered now.
    pub fn settled(&self) -> usize {
        self.settled.len()
    }

    fn state(&mut self, position: &MessagePosition) -> Option<&mut State> {
        let size = position.batch_size().max(1) as usize;
        let index = usize::try_from(position.batch_index().max(0)).ok()?;
        if let Some(settled) = self.settled.remove(&position.entry()) {
            self.entries.insert(position.entry(), settled.entry());
        }
        let entry = self
            .entries
            .entry(position.entry())
            .or_insert_with(|| Entry {
                states: vec![State::Unseen; size],
            });
        if entry.states.len() < size {
            entry.states.resize(size, State::Unseen);
        }
        entry.states.get_mut(index)
    }

    /// A message arrived from the broker (the broker counts it once more).
    pub fn delivered(&mut self, position: &MessagePosition) -> Delivery {
        let entry = position.entry();
        let verdict = self.classify(position);
        self.settle(entry);
        verdict
    }

    fn classify(&mut self, position: &MessagePosition) -> Delivery {
        let Some(state) = self.state(position) else {
            return Delivery::New;
        };
        let (next, verdict, drift) = match *state {
            State::Unseen | State::Released | State::Skipped => {
                (State::Held { counted: true }, Delivery::New, 0)
            }
            State::Held { counted } => (
                State::Held { counted: true },
                Delivery::Duplicate(DuplicateOf::Held),
                i64::from(counted),
            ),
            State::Acked {
                txn,
                committed,
                counted: _,
            } => {
                let of = match txn {
                    Some(txn) if committed => DuplicateOf::CommittedIn(txn),
                    Some(txn) => DuplicateOf::PendingIn(txn),
                    None => DuplicateOf::Acknowledged,
                };
                // A committed index sent again stays counted for good (and an ack sent
                // uncounted took one off, which this delivery puts back); an ordinary ack not
                // yet applied when the entry was sent takes this copy off when it arrives.
                let next = State::Acked {
                    txn,
                    committed,
                    counted: true,
                };
                (next, Delivery::Duplicate(of), i64::from(txn.is_some()))
            }
        };
        *state = next;
        if let Delivery::Duplicate(DuplicateOf::PendingIn(txn)) = verdict {
            // Sent again because the transaction is aborting (or timed out), or read while
            // its ack was persisted: its end tells which.
            self.copies.entry(txn).or_default().push(*position);
        }
        self.drift += drift;
        if verdict.is_duplicate() {
            self.duplicates += 1;
        }
        verdict
    }

    /// The broker already had this message acknowledged when it sent the entry (its bit was
    /// cleared in the dispatch's ack set): it was not counted.
    pub fn skipped(&mut self, position: &MessagePosition) {
        // A released message left out is pending in a transaction elsewhere or acknowledged
        // by a dispatch read before its abort: it stays owed.
        if let Some(state) = self.state(position)
            && matches!(*state, State::Unseen)
        {
            *state = State::Skipped;
        }
        self.settle(position.entry());
    }

    /// An ack of this message went out (in `txn`, or outside any transaction).
    pub fn acked(&mut self, position: &MessagePosition, txn: Option<TxnId>) {
        let Some(state) = self.state(position) else {
            return;
        };
        let counted = match *state {
            State::Held { counted } => counted,
            // Acknowledged without being delivered here (another consumer's message, or one
            // the broker redelivered elsewhere): the broker takes one off all the same.
            State::Unseen | State::Released | State::Skipped => false,
            State::Acked { .. } => return,
        };
        *state = State::Acked {
            txn,
            committed: txn.is_none(),
            counted,
        };
        if !counted {
            self.drift -= 1;
        }
        self.settle(position.entry());
    }

    /// The broker refused the transactional ack of this message (for example
    /// `TransactionConflict`): the message is held again. A 4.0.x broker took the ack's count
    /// off before it refused it, so the held message is no longer counted.
    pub fn ack_refused(&mut self, position: &MessagePosition) {
        let Some(state) = self.state(position) else {
            return;
        };
        if let State::Acked {
            txn: Some(_),
            committed: false,
            ..
        } = *state
        {
            *state = State::Held { counted: false };
        }
    }

    /// Whether the application holds this message and the broker counts it for the
    /// consumer's current registration: false after [`Deliveries::count_reset`] until a copy
    /// of it arrives (the broker hands what an old registration held to any consumer), and
    /// after [`Deliveries::ack_refused`].
    pub fn held_and_counted(&self, position: &MessagePosition) -> bool {
        let index = usize::try_from(position.batch_index().max(0)).unwrap_or(usize::MAX);
        self.entries
            .get(&position.entry())
            .and_then(|found| found.states.get(index))
            .is_some_and(|state| matches!(state, State::Held { counted: true }))
    }

    /// The indexes of `entry` that the application holds (delivered, not acknowledged).
    pub fn held_indexes(&self, entry: &EntryId) -> impl Iterator<Item = usize> + '_ {
        self.entries
            .get(entry)
            .into_iter()
            .flat_map(|found| found.states.iter().enumerate())
            .filter(|(_, state)| matches!(state, State::Held { .. }))
            .map(|(index, _)| index)
    }

    /// A negative ack of this message's entry went out (`REDELIVER_UNACKNOWLEDGED_MESSAGES`
    /// with its id): the broker takes the entry's unacknowledged messages off and sends them
    /// again, so the held ones are released.
    pub fn nacked(&mut self, entry: EntryId) {
        let Some(found) = self.entries.get_mut(&entry) else {
            return;
        };
        let mut drift = 0;
        for state in &mut found.states {
            match *state {
                State::Held { counted } => {
                    *state = State::Released;
                    drift -= i64::from(!counted);
                }
                // Pending in a transaction, so not yet deleted in the cursor: the broker takes
                // it off again.
                State::Acked {
                    txn: Some(_),
                    committed: false,
                    ..
                } => drift -= 1,
                _ => {}
            }
        }
        self.drift += drift;
    }

    /// `txn` ended: committed (its messages are acknowledged for good) or aborted (they are
    /// released; the broker sends them again, to any consumer). Returns the copies of its
    /// messages that arrived before the abort was known ([`DuplicateOf::PendingIn`]): the
    /// abort sent them, and they are new to the application now (held again, counted once).
    pub fn ended(&mut self, txn: TxnId, committed: bool) -> Vec<MessagePosition> {
        let copies = self.copies.remove(&txn).unwrap_or_default();
        let mut settled = Vec::new();
        let mut released = Vec::new();
        for (entry, found) in &mut self.entries {
            for state in &mut found.states {
                if let State::Acked {
                    txn: Some(own),
                    committed: done,
                    counted,
                } = *state
                    && own == txn
                    && !done
                {
                    *state = if committed {
                        State::Acked {
                            txn: Some(own),
                            committed: true,
                            counted,
                        }
                    } else {
                        State::Released
                    };
                }
            }
            if found.is_settled() {
                settled.push(*entry);
            } else if found.is_released() {
                released.push(*entry);
            }
        }
        for entry in settled {
            self.settle(entry);
        }
        if committed {
            return Vec::new();
        }
        // Nothing of a released entry is held or acknowledged here: another consumer may
        // get it, and if this one does, it is new.
        for entry in released {
            self.entries.remove(&entry);
        }
        let mut returned = Vec::with_capacity(copies.len());
        for position in copies {
            if let Some(state) = self.state(&position)
                && matches!(*state, State::Unseen | State::Released)
            {
                *state = State::Held { counted: true };
                // The copy was counted as a drift; the abort made it the message's only count.
                self.drift -= 1;
                returned.push(position);
            }
        }
        returned
    }

    /// The broker's count of this consumer starts over at 0: the consumer subscribed again
    /// (a new registration; the broker replays what the old one had), or asked for everything
    /// unacknowledged again. The copies of held messages that come count as their
    /// replacements, not as drift.
    pub fn count_reset(&mut self) {
        self.drift = 0;
        let mut settled = Vec::new();
        for (entry, found) in &mut self.entries {
            for state in &mut found.states {
                match state {
                    State::Held { counted } => *counted = false,
                    State::Acked { counted, .. } => *counted = true,
                    State::Unseen | State::Released | State::Skipped => {}
                }
            }
            if found.is_settled() {
                settled.push(*entry);
            }
        }
        for entry in settled {
            self.settle(entry);
        }
    }

    /// The application asked for everything unacknowledged again
    /// (`REDELIVER_UNACKNOWLEDGED_MESSAGES` without ids on its behalf): as
    /// [`Deliveries::count_reset`], but the held messages are released, so their copies are
    /// delivered again.
    pub fn redelivery_requested(&mut self) {
        self.count_reset();
        for found in self.entries.values_mut() {
            for state in &mut found.states {
                if matches!(state, State::Held { .. }) {
                    *state = State::Released;
                }
            }
        }
    }

    fn settle(&mut self, entry: EntryId) {
        if !self.entries.get(&entry).is_some_and(Entry::is_settled) {
            return;
        }
        if let Some(found) = self.entries.remove(&entry) {
            self.settled.insert(entry, Settled::of(found));
        }
    }

    /// The broker's count of this consumer minus what the application's future acks will take
    /// off: positive when deliveries were counted that no ack will ever match.
    pub fn drift(&self) -> i64 {
        self.drift
    }

    /// Duplicate deliveries recognised so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Messages with the application, not yet acknowledged.
    pub fn held(&self) -> usize {
        self.entries
            .values()
            .flat_map(|entry| &entry.states)
            .filter(|state| matches!(state, State::Held { .. }))
            .count()
    }

    /// Messages the broker owes this consumer: released by an abort or a negative ack (in an
    /// entry it delivered here) and not delivered again yet. While the broker keeps them back
    /// with nothing arriving, the consumer is blocked: a 4.0.x broker unblocks only when an
    /// entry leaves the consumer's pending acks with the count at half the limit, and an entry
    /// with released messages never does.
    pub fn owed(&self) -> usize {
        self.entries
            .values()
            .flat_map(|entry| &entry.states)
            .filter(|state| matches!(state, State::Released))
            .count()
    }

    /// Entries with messages held or acknowledged in an open transaction.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: TxnId = TxnId {
        most_bits: 0,
        least_bits: 1,
    };
    const T2: TxnId = TxnId {
        most_bits: 0,
        least_bits: 2,
    };

    fn at(index: i32) -> MessagePosition {
        MessagePosition::in_batch(3, 4, -1, index, 3).unwrap()
    }

    #[test]
    fn an_index_committed_while_its_entry_was_replayed_is_a_duplicate_with_drift() {
        let mut d = Deliveries::default();
        for i in 0..3 {
            assert_eq!(d.delivered(&at(i)), Delivery::New);
        }
        d.acked(&at(0), Some(T1));
        d.acked(&at(1), Some(T2));
        d.ended(T2, true);
        d.ended(T1, false);
        // The replay after T1's abort carries index 0 (released), 1 (committed: the replay was
        // read while T2's ack was being persisted) and 2 (held).
        assert_eq!(d.delivered(&at(0)), Delivery::New);
        assert_eq!(
            d.delivered(&at(1)),
            Delivery::Duplicate(DuplicateOf::CommittedIn(T2))
        );
        assert_eq!(d.delivered(&at(2)), Delivery::Duplicate(DuplicateOf::Held));
        assert_eq!(d.drift(), 2);
        assert_eq!(d.duplicates(), 2);
        d.count_reset();
        // The replay after the reset: 0 and 2 held (replacements), 1 not sent.
        assert!(d.delivered(&at(0)).is_duplicate());
        assert!(d.delivered(&at(2)).is_duplicate());
        assert_eq!(d.drift(), 0);
        d.acked(&at(0), Some(T1));
        d.acked(&at(2), None);
        assert_eq!(d.held(), 0);
    }

    #[test]
    fn an_ack_between_a_count_reset_and_its_replay_is_made_good_by_the_replay() {
        let mut d = Deliveries::default();
        d.delivered(&at(0));
        d.count_reset();
        d.acked(&at(0), Some(T1));
        assert_eq!(d.drift(), -1, "took one off a count of 0");
        // The replay was read before the ack was recorded: the broker counts it again.
        assert_eq!(
            d.delivered(&at(0)),
            Delivery::Duplicate(DuplicateOf::PendingIn(T1))
        );
        assert_eq!(d.drift(), 0);
    }

    /// A stream of `rate` unbatched entries a second for 30 s, each acknowledged as it
    /// arrives, on `deliveries`; then the copies of the last `replayed` entries come (a broker
    /// killed with -9 loses about a second of acknowledgements and sends them again). Returns
    /// how many copies were recognised.
    fn replay_after_a_kill(mut deliveries: Deliveries, rate: u64, replayed: u64) -> u64 {
        let at = |entry_id| MessagePosition::single(7, entry_id, -1);
        let total = rate * 30;
        for entry_id in 0..total {
            deliveries.set_clock(std::time::Duration::from_micros(
                entry_id * 1_000_000 / rate,
            ));
            deliveries.delivered(&at(entry_id));
            deliveries.acked(&at(entry_id), None);
        }
        (total - replayed..total)
            .filter(|entry_id| deliveries.delivered(&at(*entry_id)).is_duplicate())
            .count() as u64
    }

    #[test]
    fn copies_of_the_last_seconds_are_recognised_at_ten_times_the_rate_tried() {
        // The restart and kill tests stream 100 messages a second; at ten times that, the
        // copies of the last 5 s are recognised (the broker loses about 1 s).
        assert_eq!(
            replay_after_a_kill(Deliveries::default(), 1_000, 5_000),
            5_000
        );
        // A fixed memory of 4,096 entries (before the recall) misses the oldest of them.
        let fixed = Recall::default()
            .at_least(4096)
            .at_most(4096)
            .keep_for(std::time::Duration::ZERO);
        assert_eq!(
            replay_after_a_kill(Deliveries::with_recall(fixed), 1_000, 5_000),
            4096
        );
        // The bound: however fast, at most 131,072 are remembered.
        let mut d = Deliveries::default();
        for entry_id in 0..300_000 {
            let at = MessagePosition::single(8, entry_id, -1);
            d.delivered(&at);
            d.acked(&at, None);
        }
        assert_eq!(d.settled(), 1 << 17);
    }

    #[test]
    fn settled_entries_are_forgotten_but_recognised() {
        let mut d = Deliveries::default();
        for i in 0..3 {
            d.delivered(&at(i));
            d.acked(&at(i), Some(T1));
        }
        d.ended(T1, true);
        assert_eq!(d.entries(), 0);
        assert_eq!(
            d.delivered(&at(1)),
            Delivery::Duplicate(DuplicateOf::CommittedIn(T1))
        );
        assert_eq!(d.drift(), 1);
        assert_eq!(d.entries(), 0, "settled again");
    }

    #[test]
    fn an_ordinary_ack_not_yet_applied_heals_its_redelivery() {
        let mut d = Deliveries::default();
        d.delivered(&at(0));
        d.acked(&at(0), None);
        assert!(d.delivered(&at(0)).is_duplicate());
        assert_eq!(d.drift(), 0);
    }

    #[test]
    fn a_requested_redelivery_hands_the_held_messages_over_again() {
        let mut d = Deliveries::default();
        d.delivered(&at(0));
        d.delivered(&at(1));
        d.acked(&at(1), None);
        d.redelivery_requested();
        assert_eq!(d.delivered(&at(0)), Delivery::New);
        assert_eq!(d.drift(), 0);
    }

    #[test]
    fn a_released_message_left_out_of_a_stale_dispatch_is_still_owed_and_delivered_later() {
        let mut d = Deliveries::default();
        for i in 0..3 {
            d.delivered(&at(i));
        }
        d.acked(&at(0), Some(T1));
        d.acked(&at(1), Some(T2));
        d.acked(&at(2), Some(T2));
        d.ended(T2, true);
        d.ended(T1, false);
        assert_eq!(d.owed(), 1);
        // A dispatch read while T1 still held index 0 leaves it out.
        d.skipped(&at(0));
        assert_eq!(d.owed(), 1, "still owed, the entry not settled");
        assert_eq!(d.delivered(&at(0)), Delivery::New);
    }

    #[test]
    fn a_message_the_broker_left_out_is_delivered_when_it_comes_after_all() {
        let mut d = Deliveries::default();
        d.skipped(&at(0));
        d.skipped(&at(1));
        d.delivered(&at(2));
        d.acked(&at(2), None);
        assert_eq!(d.entries(), 0, "settled");
        // Another consumer's transaction that held index 0 aborted.
        assert_eq!(d.delivered(&at(0)), Delivery::New);
        assert_eq!(d.held(), 1);
    }

    #[test]
    fn skipped_indexes_settle_the_entry_with_the_acked_ones() {
        let mut d = Deliveries::default();
        d.skipped(&at(0));
        d.skipped(&at(1));
        d.delivered(&at(2));
        d.acked(&at(2), None);
        assert_eq!(d.entries(), 0);
        assert_eq!(d.drift(), 0);
    }

    #[test]
    fn a_nack_releases_the_held_messages_of_the_entry() {
        let mut d = Deliveries::default();
        d.delivered(&at(0));
        d.delivered(&at(1));
        d.acked(&at(1), Some(T1));
        d.nacked(at(0).entry());
        assert_eq!(
            d.drift(),
            -1,
            "the broker takes the pending index off again"
        );
        assert_eq!(d.owed(), 1, "index 0 released");
        assert_eq!(d.delivered(&at(0)), Delivery::New);
        assert_eq!(d.owed(), 0);
    }
}
