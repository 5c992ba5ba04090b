//! Where a message sits, and the id an ack puts on the wire.

use crate::ids::EntryId;
use crate::{AckSet, Error, MAX_BATCH_SIZE};

/// A message's position: its entry, its partition and its place in the entry's batch.
///
/// Whether the entry is a batch is an explicit flag, taken from whether the entry's metadata
/// carries `num_messages_in_batch` (a batch of one is still a batch); it is never inferred from
/// the size. An entry-level position (the whole entry) has batch index -1 and keeps the batch
/// size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessagePosition {
    entry: EntryId,
    partition: i32,
    batch_index: i32,
    batch_size: u32,
    batched: bool,
}

impl MessagePosition {
    /// A message that is not in a batch (its entry's metadata has no `num_messages_in_batch`).
    pub fn single(ledger_id: u64, entry_id: u64, partition: i32) -> Self {
        Self {
            entry: EntryId {
                ledger_id,
                entry_id,
            },
            partition,
            batch_index: -1,
            batch_size: 1,
            batched: false,
        }
    }

    /// Message `batch_index` of an entry holding a batch of `batch_size` messages.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= batch_size <= MAX_BATCH_SIZE`;
    /// [`Error::IndexOutOfRange`] unless `0 <= batch_index < batch_size`.
    pub fn in_batch(
        ledger_id: u64,
        entry_id: u64,
        partition: i32,
        batch_index: i32,
        batch_size: i32,
    ) -> Result<Self, Error> {
        let size = u32::try_from(batch_size)
            .ok()
            .filter(|size| (1..=MAX_BATCH_SIZE).contains(size))
            .ok_or(Error::InvalidBatchSize {
                size: i64::from(batch_size),
            })?;
        if !(0..batch_size).contains(&batch_index) {
            return Err(Error::IndexOutOfRange {
                index: i64::from(batch_index),
                batch_size: size,
            });
        }
        Ok(Self {
            entry: EntryId {
                ledger_id,
                entry_id,
            },
            partition,
            batch_index,
            batch_size: size,
            batched: true,
        })
    }

    /// A position from what a received message carries: `num_messages_in_batch` as the entry's
    /// metadata has it (`None` when absent) and the message's index in the batch.
    ///
    /// # Errors
    /// As [`MessagePosition::in_batch`] when the entry is a batch.
    pub fn received(
        entry: EntryId,
        partition: i32,
        num_messages_in_batch: Option<i32>,
        batch_index: i32,
    ) -> Result<Self, Error> {
        match num_messages_in_batch {
            None => Ok(Self::single(entry.ledger_id, entry.entry_id, partition)),
            Some(size) => Self::in_batch(
                entry.ledger_id,
                entry.entry_id,
                partition,
                batch_index,
                size,
            ),
        }
    }

    /// The whole entry: batch index -1, same batch size and flag.
    #[must_use]
    pub fn entry_level(&self) -> Self {
        Self {
            batch_index: -1,
            ..*self
        }
    }

    /// The entry.
    pub fn entry(&self) -> EntryId {
        self.entry
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.entry.ledger_id
    }

    /// The entry within the ledger.
    pub fn entry_id(&self) -> u64 {
        self.entry.entry_id
    }

    /// The partition (-1 for a non-partitioned topic).
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The index in the batch; -1 for a whole entry or a message that is not in a batch.
    pub fn batch_index(&self) -> i32 {
        self.batch_index
    }

    /// The number of messages in the entry (1 for a message that is not in a batch).
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    /// Whether the entry is a batch.
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    /// The batch index as an unsigned index, for batched positions that name one message.
    pub(crate) fn index_in_batch(&self, what: &'static str) -> Result<u32, Error> {
        if !self.batched {
            return Err(self.wrong(what, "is not in a batch"));
        }
        u32::try_from(self.batch_index)
            .map_err(|_| self.wrong(what, "is a whole entry, not one message"))
    }

    pub(crate) fn wrong(&self, what: &'static str, reason: &'static str) -> Error {
        Error::WrongPositionKind {
            what,
            ledger_id: self.entry.ledger_id,
            entry_id: self.entry.entry_id,
            reason,
        }
    }
}

/// How an ack applies: to the messages named, or to everything up to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckKind {
    /// Only the messages named (`CommandAck.AckType.Individual`).
    Individual,
    /// Everything up to and including the message named (`AckType.Cumulative`).
    Cumulative,
}

/// One message id of an ack as it goes on the wire (`MessageIdData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckId {
    pub(crate) entry: EntryId,
    pub(crate) partition: i32,
    pub(crate) batch_index: i32,
    /// Never an empty set.
    pub(crate) ack_set: Option<AckSet>,
    pub(crate) batch_size: Option<u32>,
}

impl AckId {
    /// A whole-entry id: batch index -1, no ack set, the batch size kept for batched entries.
    pub(crate) fn whole_entry(position: &MessagePosition) -> Self {
        Self {
            entry: position.entry,
            partition: position.partition,
            batch_index: -1,
            ack_set: None,
            batch_size: position.batched.then_some(position.batch_size),
        }
    }

    /// An id for a batched position carrying `set` (whole entry if `set` is complete).
    pub(crate) fn with_set(position: &MessagePosition, batch_index: i32, set: AckSet) -> Self {
        if set.is_complete() {
            return Self::whole_entry(position);
        }
        Self {
            entry: position.entry,
            partition: position.partition,
            batch_index,
            ack_set: Some(set),
            batch_size: Some(position.batch_size),
        }
    }

    /// The entry.
    pub fn entry(&self) -> EntryId {
        self.entry
    }

    /// The partition (-1 for a non-partitioned topic).
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The batch index, -1 for a whole entry. The broker does not read it in acks.
    pub fn batch_index(&self) -> i32 {
        self.batch_index
    }

    /// The outstanding messages of the batch after this ack; `None` for a whole-entry ack
    /// (no `ack_set` on the wire). Never an empty set.
    pub fn ack_set(&self) -> Option<&AckSet> {
        self.ack_set.as_ref()
    }

    /// The batch size; `None` for a message that is not in a batch.
    pub fn batch_size(&self) -> Option<u32> {
        self.batch_size
    }

    /// Merges `other`, an ack of the same entry, into this id, as acks grouped into one
    /// request are: a message stays outstanding only if both leave it outstanding, and a
    /// whole-entry ack (or a set that becomes complete) makes this a whole-entry id. The
    /// partition stays this id's.
    ///
    /// # Errors
    /// [`Error::WrongPositionKind`] if `other` names another entry, and
    /// [`Error::BatchSizeMismatch`] if both carry sets of different batch sizes (they cannot
    /// come from one entry; send both as they are). This id is unchanged on an error.
    pub fn merge(&mut self, other: &AckId) -> Result<(), Error> {
        if other.entry != self.entry {
            return Err(Error::WrongPositionKind {
                what: "AckId::merge",
                ledger_id: other.entry.ledger_id,
                entry_id: other.entry.entry_id,
                reason: "is another entry than the id merged into",
            });
        }
        match &other.ack_set {
            None => {
                self.ack_set = None;
                self.batch_index = -1;
                self.batch_size = self.batch_size.or(other.batch_size);
            }
            Some(theirs) => {
                if let Some(mine) = &mut self.ack_set {
                    mine.merge_acks(theirs)?;
                    if mine.is_complete() {
                        self.ack_set = None;
                        self.batch_index = -1;
                    }
                }
            }
        }
        Ok(())
    }

    /// The `ack_set` words as the wire carries them (empty for a whole-entry ack).
    pub fn wire_ack_set(&self) -> impl Iterator<Item = i64> + '_ {
        self.ack_set.iter().flat_map(AckSet::wire_words)
    }

    /// Whether this acks the whole entry.
    pub fn is_whole_entry(&self) -> bool {
        self.ack_set.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_comes_from_the_metadata_not_the_size() {
        let entry = EntryId {
            ledger_id: 1,
            entry_id: 2,
        };
        let one_of_one = MessagePosition::received(entry, 0, Some(1), 0).unwrap();
        assert!(one_of_one.is_batched());
        let single = MessagePosition::received(entry, 0, None, 0).unwrap();
        assert!(!single.is_batched());
        assert_eq!(single.batch_index(), -1);
        let whole = MessagePosition::in_batch(1, 2, 0, 2, 3)
            .unwrap()
            .entry_level();
        assert_eq!((whole.batch_index(), whole.batch_size()), (-1, 3));
        assert!(whole.is_batched());
    }

    #[test]
    fn merged_ids_keep_what_both_leave_outstanding() {
        let at = |index| MessagePosition::in_batch(1, 2, 0, index, 3).unwrap();
        let with = |index: i32, acked: &[u32]| {
            let mut set = AckSet::outstanding(3).unwrap();
            for &i in acked {
                set.ack(i).unwrap();
            }
            AckId::with_set(&at(index), index, set)
        };
        let mut id = with(0, &[0]);
        id.merge(&with(1, &[1])).unwrap();
        assert_eq!(id.wire_ack_set().collect::<Vec<_>>(), [0b100]);
        assert_eq!((id.batch_index(), id.batch_size()), (0, Some(3)));
        // The last index completes the set: a whole-entry id, the batch size kept.
        id.merge(&with(2, &[2])).unwrap();
        assert!(id.is_whole_entry());
        assert_eq!((id.batch_index(), id.batch_size()), (-1, Some(3)));
        // A whole-entry ack covers everything.
        let mut id = with(0, &[0]);
        id.merge(&AckId::whole_entry(&at(1))).unwrap();
        assert!(id.is_whole_entry() && id.batch_index() == -1);
        // Another entry, or another batch size, leaves the id as it was.
        let mut id = with(0, &[0]);
        let other = MessagePosition::in_batch(1, 3, 0, 0, 3).unwrap();
        assert!(matches!(
            id.merge(&AckId::whole_entry(&other)),
            Err(Error::WrongPositionKind { entry_id: 3, .. })
        ));
        let bigger = MessagePosition::in_batch(1, 2, 0, 1, 4).unwrap();
        let mut set = AckSet::outstanding(4).unwrap();
        set.ack(1).unwrap();
        assert_eq!(
            id.merge(&AckId::with_set(&bigger, 1, set)),
            Err(Error::BatchSizeMismatch { left: 3, right: 4 })
        );
        assert_eq!(id, with(0, &[0]));
    }

    #[test]
    fn bad_positions_are_errors() {
        assert_eq!(
            MessagePosition::in_batch(1, 2, 0, 3, 3),
            Err(Error::IndexOutOfRange {
                index: 3,
                batch_size: 3
            })
        );
        assert!(MessagePosition::in_batch(1, 2, 0, -1, 3).is_err());
        assert_eq!(
            MessagePosition::in_batch(1, 2, 0, 0, 0),
            Err(Error::InvalidBatchSize { size: 0 })
        );
        assert!(MessagePosition::in_batch(1, 2, 0, 0, -5).is_err());
        assert!(MessagePosition::in_batch(1, 2, 0, 0, i32::MAX).is_err());
    }
}
