//! [`AckTracker`]: ordinary (non-transactional) acks accumulated per entry.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::recent::{Recall, Recent};
use crate::{AckId, AckKind, AckSet, EntryId, Error, MessagePosition};

/// What to do with acks of a batch that is not complete yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartialBatches {
    /// Send the accumulated remaining set with every ack (batch-index acknowledgement; needs
    /// the broker's `acknowledgmentAtBatchIndexLevelEnabled`).
    #[default]
    SendAckSet,
    /// Send nothing until the whole batch is acknowledged, then one whole-entry ack (for brokers
    /// without batch-index acknowledgement). A partial cumulative ack then acknowledges up to
    /// the previous entry.
    HoldUntilComplete,
}

/// One ack to send: an individual or cumulative ack of one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Individual or cumulative.
    pub kind: AckKind,
    /// The id to put in `CommandAck.message_id`.
    pub id: AckId,
}

/// Accumulates ordinary acks per entry and says what to send.
///
/// - A message that is not in a batch is acknowledged as a whole entry at once.
/// - While a batch is partial, [`PartialBatches::SendAckSet`] yields the **accumulated**
///   remaining set; [`PartialBatches::HoldUntilComplete`] yields nothing.
/// - When the batch completes, it yields a whole-entry ack with batch index -1 and the batch
///   size kept.
/// - Acking a message again is idempotent: nothing new is sent. Completed entries are
///   remembered (the last `recent_capacity`, default 4,096) to recognise late duplicates.
///
/// After warm-up (or with [`AckTracker::with_capacity`]), tracking batches of up to 64
/// messages does not allocate.
///
/// ```
/// use txn_ack::{AckTracker, MessagePosition, PartialBatches};
/// let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
/// let at = |i| MessagePosition::in_batch(7, 1, -1, i, 3);
/// let first = tracker.ack(&at(0)?)?.expect("a partial ack");
/// assert_eq!(first.id.wire_ack_set().collect::<Vec<_>>(), [6]);
/// assert!(tracker.ack(&at(0)?)?.is_none(), "duplicates send nothing");
/// tracker.ack(&at(1)?)?;
/// let last = tracker.ack(&at(2)?)?.expect("the whole entry");
/// assert!(last.id.is_whole_entry());
/// assert_eq!((last.id.batch_index(), last.id.batch_size()), (-1, Some(3)));
/// # Ok::<(), txn_ack::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AckTracker {
    mode: PartialBatches,
    partial: HashMap<EntryId, AckSet, FxBuildHasher>,
    completed: Recent<()>,
    last_cumulative: Option<(EntryId, i32)>,
}

impl AckTracker {
    /// A tracker with default capacities.
    pub fn new(mode: PartialBatches) -> Self {
        Self::with_capacity(mode, 64, 4096)
    }

    /// A tracker that holds `partial_entries` partial batches and remembers `recent_capacity`
    /// completed entries without allocating.
    pub fn with_capacity(
        mode: PartialBatches,
        partial_entries: usize,
        recent_capacity: usize,
    ) -> Self {
        Self {
            mode,
            partial: HashMap::with_capacity_and_hasher(partial_entries, FxBuildHasher),
            completed: Recent::new(Recall::default().at_least(recent_capacity)),
            last_cumulative: None,
        }
    }

    /// The time now, on any monotonic clock of the caller's: completed entries are
    /// remembered by the [`Recall`](crate::Recall) on it (its count bounds without a clock).
    pub fn set_clock(&mut self, now: std::time::Duration) {
        self.completed.set_clock(now);
    }

    /// How many batches are partially acknowledged.
    pub fn partial_entries(&self) -> usize {
        self.partial.len()
    }

    /// The remaining set of a partially acknowledged entry.
    pub fn remaining(&self, entry: &EntryId) -> Option<&AckSet> {
        self.partial.get(entry)
    }

    /// Acknowledges one message; returns the ack to send, if any.
    ///
    /// # Errors
    /// [`Error::WrongPositionKind`] for an entry-level position of a batch (use
    /// [`AckTracker::ack_entry`]); [`Error::InconsistentBatchSize`] if the entry was tracked
    /// with another size.
    pub fn ack(&mut self, position: &MessagePosition) -> Result<Option<Ack>, Error> {
        let entry = position.entry();
        if self.completed.contains(&entry) || self.covered_by_cumulative(position) {
            return Ok(None);
        }
        if !position.is_batched() {
            self.completed.insert(entry, ());
            return Ok(Some(individual(AckId::whole_entry(position))));
        }
        let index = position.index_in_batch("an individual ack")?;
        if position.batch_size() == 1 {
            // A batch of one completes at once: no partial state to keep.
            self.completed.insert(entry, ());
            return Ok(Some(individual(AckId::whole_entry(position))));
        }
        let mode = self.mode;
        let set = self.partial_set(position)?;
        if !set.ack(index)? {
            return Ok(None);
        }
        if set.is_complete() {
            self.partial.remove(&entry);
            self.completed.insert(entry, ());
            return Ok(Some(individual(AckId::whole_entry(position))));
        }
        Ok(match mode {
            PartialBatches::SendAckSet => Some(individual(AckId::with_set(
                position,
                position.batch_index(),
                set.clone(),
            ))),
            PartialBatches::HoldUntilComplete => None,
        })
    }

    /// Acknowledges a whole entry at once (every message of its batch).
    pub fn ack_entry(&mut self, position: &MessagePosition) -> Option<Ack> {
        let entry = position.entry();
        if self.completed.contains(&entry) || self.covered_by_cumulative(&position.entry_level()) {
            return None;
        }
        self.partial.remove(&entry);
        self.completed.insert(entry, ());
        Some(individual(AckId::whole_entry(position)))
    }

    /// The ack that says again what this tracker already acknowledged of `position`'s
    /// entry, when `position` is among it: for a redelivery of a message whose ack the
    /// broker did not get (sent on a connection that was lost). `None` when `position` is
    /// not acknowledged here (or the completed entry was forgotten since).
    ///
    /// With [`PartialBatches::HoldUntilComplete`], a message of a batch not complete yet has
    /// nothing to say again (no ack of it went out): `None`, though [`is_acked`](Self::is_acked)
    /// is true for it.
    pub fn acked_again(&self, position: &MessagePosition) -> Option<Ack> {
        let entry = position.entry();
        if self.completed.contains(&entry) || self.covered_by_cumulative(position) {
            return Some(individual(AckId::whole_entry(position)));
        }
        if self.mode == PartialBatches::HoldUntilComplete || !self.is_acked(position) {
            return None;
        }
        let set = self.partial.get(&entry)?;
        Some(individual(AckId::with_set(
            position,
            position.batch_index(),
            set.clone(),
        )))
    }

    /// Whether this tracker acknowledged `position` (alone, with its whole entry, or under a
    /// cumulative ack), whether or not an ack of it went out.
    #[must_use]
    pub fn is_acked(&self, position: &MessagePosition) -> bool {
        let entry = position.entry();
        if self.completed.contains(&entry) || self.covered_by_cumulative(position) {
            return true;
        }
        let Some(set) = self.partial.get(&entry) else {
            return false;
        };
        position
            .index_in_batch("an acknowledged message")
            .is_ok_and(|index| set.is_outstanding(index) == Ok(false))
    }

    /// Whether a cumulative ack already covers `position`.
    fn covered_by_cumulative(&self, position: &MessagePosition) -> bool {
        self.last_cumulative
            .is_some_and(|last| !is_after((position.entry(), position.batch_index()), last))
    }

    /// Acknowledges everything up to and including `position`; returns the cumulative ack to
    /// send, if it moves the acknowledged point forward.
    ///
    /// # Errors
    /// As [`AckTracker::ack`].
    pub fn ack_cumulative(&mut self, position: &MessagePosition) -> Result<Option<Ack>, Error> {
        let entry = position.entry();
        let point = (entry, position.batch_index());
        if let Some(last) = self.last_cumulative
            && !is_after(point, last)
        {
            return Ok(None);
        }
        self.last_cumulative = Some(point);
        // Everything before this entry is covered by the cumulative ack.
        self.partial.retain(|tracked, _| *tracked >= entry);
        if !position.is_batched() || position.batch_index() < 0 {
            self.partial.remove(&entry);
            return Ok(Some(cumulative(AckId::whole_entry(position))));
        }
        let index = position.index_in_batch("a cumulative ack")?;
        let mode = self.mode;
        let set = self.partial_set(position)?;
        set.ack_up_to(index)?;
        if set.is_complete() {
            self.partial.remove(&entry);
            self.completed.insert(entry, ());
            return Ok(Some(cumulative(AckId::whole_entry(position))));
        }
        Ok(match mode {
            PartialBatches::SendAckSet => Some(cumulative(AckId::with_set(
                position,
                position.batch_index(),
                set.clone(),
            ))),
            // Everything before this entry is acknowledged; this one is not complete yet.
            PartialBatches::HoldUntilComplete => entry.entry_id.checked_sub(1).map(|previous| {
                cumulative(AckId {
                    entry: EntryId {
                        entry_id: previous,
                        ..entry
                    },
                    partition: position.partition(),
                    batch_index: -1,
                    ack_set: None,
                    batch_size: None,
                })
            }),
        })
    }

    fn partial_set(&mut self, position: &MessagePosition) -> Result<&mut AckSet, Error> {
        let size = position.batch_size();
        let set = match self.partial.entry(position.entry()) {
            std::collections::hash_map::Entry::Occupied(occupied) => occupied.into_mut(),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(AckSet::outstanding(size)?)
            }
        };
        if set.batch_size() != size {
            return Err(Error::InconsistentBatchSize {
                entry: position.entry(),
                known: set.batch_size(),
                given: i64::from(size),
            });
        }
        Ok(set)
    }
}

fn individual(id: AckId) -> Ack {
    Ack {
        kind: AckKind::Individual,
        id,
    }
}

fn cumulative(id: AckId) -> Ack {
    Ack {
        kind: AckKind::Cumulative,
        id,
    }
}

/// Whether a cumulative point is beyond another; an entry-level point (-1) covers the whole
/// entry, so it is beyond every index of that entry.
fn is_after((entry, index): (EntryId, i32), (last_entry, last_index): (EntryId, i32)) -> bool {
    let whole = |i: i32| if i < 0 { i32::MAX } else { i };
    (entry, whole(index)) > (last_entry, whole(last_index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(entry_id: u64, index: i32, size: i32) -> MessagePosition {
        MessagePosition::in_batch(1, entry_id, -1, index, size).unwrap()
    }

    fn words(ack: &Ack) -> Vec<i64> {
        ack.id.wire_ack_set().collect()
    }

    #[test]
    fn acks_are_said_again_only_for_what_was_acknowledged() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        tracker.ack(&at(1, 0, 3)).unwrap();
        // Index 0 of entry 1: the set acknowledged so far; index 1 is not acknowledged.
        let again = tracker.acked_again(&at(1, 0, 3)).expect("acknowledged");
        assert_eq!(words(&again), [0b110]);
        assert!(tracker.acked_again(&at(1, 1, 3)).is_none());
        // A completed entry: the whole entry.
        tracker.ack(&at(1, 1, 3)).unwrap();
        tracker.ack(&at(1, 2, 3)).unwrap();
        assert!(
            tracker
                .acked_again(&at(1, 1, 3))
                .unwrap()
                .id
                .is_whole_entry()
        );
        // Below a cumulative ack: the whole entry; an entry never acknowledged: nothing.
        tracker.ack_cumulative(&at(5, 2, 3)).unwrap();
        assert!(
            tracker
                .acked_again(&at(4, 0, 3))
                .unwrap()
                .id
                .is_whole_entry()
        );
        assert!(tracker.acked_again(&at(6, 0, 3)).is_none());
    }

    #[test]
    fn a_held_partial_batch_is_acknowledged_but_has_nothing_to_say_again() {
        let mut tracker = AckTracker::new(PartialBatches::HoldUntilComplete);
        assert!(tracker.ack(&at(1, 0, 3)).unwrap().is_none());
        // Acknowledged here, but no ack of it went out: a set said again would reach a
        // broker without batch-index acks as the very ack this mode avoids.
        assert!(tracker.is_acked(&at(1, 0, 3)));
        assert!(!tracker.is_acked(&at(1, 1, 3)));
        assert!(tracker.acked_again(&at(1, 0, 3)).is_none());
        tracker.ack(&at(1, 1, 3)).unwrap();
        tracker.ack(&at(1, 2, 3)).unwrap();
        assert!(tracker.is_acked(&at(1, 1, 3)));
        assert!(
            tracker
                .acked_again(&at(1, 1, 3))
                .unwrap()
                .id
                .is_whole_entry()
        );
    }

    #[test]
    fn partial_batches_send_the_accumulated_set() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        assert_eq!(words(&tracker.ack(&at(1, 0, 3)).unwrap().unwrap()), [6]);
        assert_eq!(words(&tracker.ack(&at(1, 1, 3)).unwrap().unwrap()), [4]);
        let done = tracker.ack(&at(1, 2, 3)).unwrap().unwrap();
        assert_eq!(done.id.batch_size, Some(3), "the batch size is kept");
        assert_eq!(done.id.batch_index, -1);
        assert!(done.id.is_whole_entry());
        assert_eq!(tracker.partial_entries(), 0);
        assert!(
            tracker.ack(&at(1, 1, 3)).unwrap().is_none(),
            "late duplicate"
        );
    }

    #[test]
    fn holding_mode_sends_only_complete_entries() {
        let mut tracker = AckTracker::new(PartialBatches::HoldUntilComplete);
        assert!(tracker.ack(&at(1, 2, 3)).unwrap().is_none());
        assert!(tracker.ack(&at(1, 0, 3)).unwrap().is_none());
        let done = tracker.ack(&at(1, 1, 3)).unwrap().unwrap();
        assert!(done.id.is_whole_entry());
        assert_eq!(done.id.batch_size, Some(3));
    }

    #[test]
    fn single_messages_and_batches_of_one() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        let single = tracker
            .ack(&MessagePosition::single(1, 9, 0))
            .unwrap()
            .unwrap();
        assert!(
            tracker
                .ack(&MessagePosition::single(1, 9, 0))
                .unwrap()
                .is_none(),
            "a duplicate of a single message sends nothing"
        );
        assert_eq!(single.id.batch_size, None);
        assert!(single.id.is_whole_entry());
        let one = tracker.ack(&at(2, 0, 1)).unwrap().unwrap();
        assert_eq!(one.id.batch_size, Some(1));
        assert!(one.id.is_whole_entry());
    }

    #[test]
    fn cumulative_acks() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        tracker.ack(&at(1, 0, 3)).unwrap();
        tracker.ack(&at(2, 2, 4)).unwrap();
        let partial = tracker.ack_cumulative(&at(2, 1, 4)).unwrap().unwrap();
        assert_eq!(partial.kind, AckKind::Cumulative);
        assert_eq!(
            words(&partial),
            [0b1000],
            "index 2 of entry 2 was acked before"
        );
        assert_eq!(
            tracker.partial_entries(),
            1,
            "entry 1 is covered, entry 2 is partial"
        );
        assert!(
            tracker.ack_cumulative(&at(2, 0, 4)).unwrap().is_none(),
            "not forward"
        );
        assert!(
            tracker.ack(&at(1, 1, 3)).unwrap().is_none(),
            "entry 1 is covered by the cumulative ack"
        );
        assert!(
            tracker.ack(&at(2, 1, 4)).unwrap().is_none(),
            "index 1 of entry 2 too"
        );
        assert!(
            tracker.ack(&at(2, 3, 4)).unwrap().is_some(),
            "index 3 of entry 2 is not"
        );
        let whole = tracker.ack_cumulative(&at(2, 3, 4)).unwrap().unwrap();
        assert!(whole.id.is_whole_entry());

        let mut holding = AckTracker::new(PartialBatches::HoldUntilComplete);
        let previous = holding.ack_cumulative(&at(5, 1, 4)).unwrap().unwrap();
        assert_eq!(previous.id.entry.entry_id, 4, "up to the previous entry");
        assert!(previous.id.is_whole_entry());
        assert!(holding.ack_cumulative(&at(0, 0, 2)).unwrap().is_none());
    }

    #[test]
    fn inconsistent_sizes_and_entry_positions_are_errors() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        tracker.ack(&at(1, 0, 3)).unwrap();
        assert!(matches!(
            tracker.ack(&at(1, 1, 4)),
            Err(Error::InconsistentBatchSize {
                known: 3,
                given: 4,
                ..
            })
        ));
        assert!(matches!(
            tracker.ack(&at(1, 1, 3).entry_level()),
            Err(Error::WrongPositionKind { .. })
        ));
        assert!(tracker.ack_entry(&at(1, 1, 3).entry_level()).is_some());
        assert_eq!(tracker.partial_entries(), 0);
    }
}
