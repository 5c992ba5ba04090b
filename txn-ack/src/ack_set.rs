//! [`AckSet`]: which messages of a batch are still outstanding, in Java `BitSet` layout.

use std::fmt;

use crate::{Error, MAX_BATCH_SIZE};

/// The outstanding (not yet acknowledged) messages of one batch.
///
/// The layout is the one Pulsar puts on the wire, `java.util.BitSet.toLongArray()`: message `i`
/// is bit `i % 64` of word `i / 64`, least significant bit first; **a set bit means the message
/// is still outstanding**. [`AckSet::words`] trims trailing zero words, so a fully acknowledged
/// set has no words at all, which on the wire means "no `ack_set`", a whole-entry ack.
///
/// Batches of up to 64 messages live inline: creating, acknowledging and reading such a set
/// never allocates.
///
/// ```
/// use txn_ack::AckSet;
/// let mut set = AckSet::outstanding(3)?;   // {0, 1, 2}
/// set.ack(0)?;
/// assert_eq!(set.words(), [6]);           // {1, 2}
/// set.ack(1)?;
/// assert_eq!(set.words(), [4]);           // {2}
/// set.ack(2)?;
/// assert!(set.words().is_empty() && set.is_complete());
/// # Ok::<(), txn_ack::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct AckSet {
    batch_size: u32,
    words: Words,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Words {
    Inline(u64),
    Heap(Box<[u64]>),
}

fn word_count(batch_size: u32) -> usize {
    batch_size.div_ceil(64) as usize
}

/// The bits of word `w` that belong to a batch of `batch_size`.
fn valid_mask(batch_size: u32, w: usize) -> u64 {
    let start = w as u64 * 64;
    let end = u64::from(batch_size);
    if end >= start + 64 {
        u64::MAX
    } else if end <= start {
        0
    } else {
        (1u64 << (end - start)) - 1
    }
}

impl AckSet {
    fn check_size(batch_size: u32) -> Result<(), Error> {
        if batch_size == 0 || batch_size > MAX_BATCH_SIZE {
            return Err(Error::InvalidBatchSize {
                size: i64::from(batch_size),
            });
        }
        Ok(())
    }

    fn filled(batch_size: u32, outstanding: bool) -> Result<Self, Error> {
        Self::check_size(batch_size)?;
        let fill = |w| {
            if outstanding {
                valid_mask(batch_size, w)
            } else {
                0
            }
        };
        let words = if batch_size <= 64 {
            Words::Inline(fill(0))
        } else {
            Words::Heap((0..word_count(batch_size)).map(fill).collect())
        };
        Ok(Self { batch_size, words })
    }

    /// A batch of `batch_size` messages, none acknowledged yet.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] unless `1 <= batch_size <= MAX_BATCH_SIZE`.
    pub fn outstanding(batch_size: u32) -> Result<Self, Error> {
        Self::filled(batch_size, true)
    }

    /// A batch of `batch_size` messages, all acknowledged.
    ///
    /// # Errors
    /// As [`AckSet::outstanding`].
    pub fn acknowledged(batch_size: u32) -> Result<Self, Error> {
        Self::filled(batch_size, false)
    }

    /// Reads the wire's signed words for a batch of `batch_size` messages. Missing trailing
    /// words count as zero (acknowledged), as in Java.
    ///
    /// # Errors
    /// [`Error::InvalidBatchSize`] for a bad size; [`Error::BitsBeyondBatch`] if a word has a
    /// bit set at or beyond `batch_size`.
    pub fn from_wire(batch_size: u32, words: &[i64]) -> Result<Self, Error> {
        let mut set = Self::acknowledged(batch_size)?;
        for (w, word) in words.iter().enumerate() {
            let word = *word as u64;
            let stray = word & !valid_mask(batch_size, w);
            if stray != 0 {
                return Err(Error::BitsBeyondBatch {
                    bit: w as u64 * 64 + u64::from(stray.trailing_zeros()),
                    batch_size,
                });
            }
            // Words past the batch are zero here (checked above): Go sends trailing zeros.
            if let Some(slot) = set.raw_mut().get_mut(w) {
                *slot = word;
            }
        }
        Ok(set)
    }

    /// The number of messages in the batch.
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    fn raw(&self) -> &[u64] {
        match &self.words {
            Words::Inline(word) => std::slice::from_ref(word),
            Words::Heap(words) => words,
        }
    }

    fn raw_mut(&mut self) -> &mut [u64] {
        match &mut self.words {
            Words::Inline(word) => std::slice::from_mut(word),
            Words::Heap(words) => words,
        }
    }

    fn check_index(&self, index: u32) -> Result<(), Error> {
        if index >= self.batch_size {
            return Err(Error::IndexOutOfRange {
                index: i64::from(index),
                batch_size: self.batch_size,
            });
        }
        Ok(())
    }

    /// Whether message `index` is still outstanding.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] unless `index < batch_size`.
    pub fn is_outstanding(&self, index: u32) -> Result<bool, Error> {
        self.check_index(index)?;
        Ok(self.raw()[index as usize / 64] & (1 << (index % 64)) != 0)
    }

    /// Acknowledges message `index`; returns whether it was outstanding until now.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] unless `index < batch_size`.
    pub fn ack(&mut self, index: u32) -> Result<bool, Error> {
        self.check_index(index)?;
        let word = &mut self.raw_mut()[index as usize / 64];
        let bit = 1 << (index % 64);
        let was = *word & bit != 0;
        *word &= !bit;
        Ok(was)
    }

    /// Acknowledges messages `0..=index` (a cumulative ack); returns how many of them were
    /// outstanding until now.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] unless `index < batch_size`.
    pub fn ack_up_to(&mut self, index: u32) -> Result<u32, Error> {
        self.check_index(index)?;
        let through = index as usize;
        let mut newly = 0;
        for (w, word) in self.raw_mut().iter_mut().enumerate() {
            let first = w * 64;
            if first > through {
                break;
            }
            let mask = if through >= first + 63 {
                u64::MAX
            } else {
                (1u64 << (through - first + 1)) - 1
            };
            newly += (*word & mask).count_ones();
            *word &= !mask;
        }
        Ok(newly)
    }

    /// How many messages are still outstanding.
    pub fn outstanding_count(&self) -> u32 {
        self.raw().iter().map(|w| w.count_ones()).sum()
    }

    /// How many messages are acknowledged.
    pub fn acknowledged_count(&self) -> u32 {
        self.batch_size - self.outstanding_count()
    }

    /// Whether every message is acknowledged.
    pub fn is_complete(&self) -> bool {
        self.raw().iter().all(|w| *w == 0)
    }

    /// The outstanding messages' indexes, in increasing order.
    pub fn outstanding_indexes(&self) -> impl Iterator<Item = u32> + '_ {
        self.raw().iter().enumerate().flat_map(|(w, word)| {
            let mut bits = *word;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let bit = bits.trailing_zeros();
                    bits &= bits - 1;
                    w as u32 * 64 + bit
                })
            })
        })
    }

    /// The words as Java's `BitSet.toLongArray()` returns them: trailing zero words trimmed,
    /// so a complete set gives an empty slice.
    pub fn words(&self) -> &[u64] {
        let raw = self.raw();
        let used = raw.iter().rposition(|w| *w != 0).map_or(0, |last| last + 1);
        &raw[..used]
    }

    /// [`AckSet::words`] as the wire's signed 64-bit integers (`MessageIdData.ack_set`).
    pub fn wire_words(&self) -> impl ExactSizeIterator<Item = i64> + '_ {
        self.words().iter().map(|w| *w as i64)
    }

    fn check_same_size(&self, other: &AckSet) -> Result<(), Error> {
        if self.batch_size != other.batch_size {
            return Err(Error::BatchSizeMismatch {
                left: self.batch_size,
                right: other.batch_size,
            });
        }
        Ok(())
    }

    /// Merges the acknowledgements of `other` into this set: a message stays outstanding only
    /// if it is outstanding in both (bitwise AND).
    ///
    /// # Errors
    /// [`Error::BatchSizeMismatch`] if the batch sizes differ.
    pub fn merge_acks(&mut self, other: &AckSet) -> Result<(), Error> {
        self.check_same_size(other)?;
        for (mine, theirs) in self.raw_mut().iter_mut().zip(other.raw()) {
            *mine &= theirs;
        }
        Ok(())
    }

    /// Makes every message outstanding in `other` outstanding here again (bitwise OR), as an
    /// abort restores acknowledgements.
    ///
    /// # Errors
    /// [`Error::BatchSizeMismatch`] if the batch sizes differ.
    pub fn restore(&mut self, other: &AckSet) -> Result<(), Error> {
        self.check_same_size(other)?;
        for (mine, theirs) in self.raw_mut().iter_mut().zip(other.raw()) {
            *mine |= theirs;
        }
        Ok(())
    }

    /// The first message acknowledged in both sets, if any.
    ///
    /// # Errors
    /// [`Error::BatchSizeMismatch`] if the batch sizes differ.
    pub fn first_acked_in_both(&self, other: &AckSet) -> Result<Option<u32>, Error> {
        self.check_same_size(other)?;
        Ok(self
            .raw()
            .iter()
            .zip(other.raw())
            .enumerate()
            .find_map(|(w, (a, b))| {
                let both = !a & !b & valid_mask(self.batch_size, w);
                (both != 0).then(|| w as u32 * 64 + both.trailing_zeros())
            }))
    }

    /// Whether some message is acknowledged in both sets (the broker's `isAckSetOverlap`).
    ///
    /// # Errors
    /// [`Error::BatchSizeMismatch`] if the batch sizes differ.
    pub fn acked_in_both(&self, other: &AckSet) -> Result<bool, Error> {
        self.check_same_size(other)?;
        Ok(self.first_acked_in_both(other)?.is_some())
    }
}

impl fmt::Debug for AckSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckSet")
            .field("batch_size", &self.batch_size)
            .field(
                "outstanding",
                &self.outstanding_indexes().collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_vectors_for_a_batch_of_three() {
        let independent = |index| {
            let mut set = AckSet::outstanding(3).unwrap();
            set.ack(index).unwrap();
            set.wire_words().collect::<Vec<_>>()
        };
        assert_eq!(independent(0), [6]);
        assert_eq!(independent(1), [5]);
        assert_eq!(independent(2), [3]);
        let mut accumulated = AckSet::outstanding(3).unwrap();
        accumulated.ack(0).unwrap();
        accumulated.ack(1).unwrap();
        assert_eq!(accumulated.words(), [4]);
        accumulated.ack(2).unwrap();
        assert_eq!(accumulated.words(), [] as [u64; 0]);
    }

    #[test]
    fn word_boundaries_round_trip() {
        for size in [1u32, 63, 64, 65, 128, 129, 1000] {
            let full = AckSet::outstanding(size).unwrap();
            assert_eq!(full.outstanding_count(), size);
            let wire: Vec<i64> = full.wire_words().collect();
            assert_eq!(wire.len(), size.div_ceil(64) as usize);
            assert_eq!(AckSet::from_wire(size, &wire).unwrap(), full);
            // Only the last message outstanding: trailing words stay, earlier ones are zero.
            let mut last = AckSet::acknowledged(size).unwrap();
            let mut wire = vec![0i64; (size as usize - 1) / 64 + 1];
            *wire.last_mut().unwrap() = 1 << ((size - 1) % 64);
            last.restore(&AckSet::from_wire(size, &wire).unwrap())
                .unwrap();
            assert_eq!(last.outstanding_indexes().collect::<Vec<_>>(), [size - 1]);
            assert_eq!(last.wire_words().collect::<Vec<_>>(), wire);
        }
        // Bit 63 of a 64-message batch is the sign bit of the wire word.
        let mut set = AckSet::acknowledged(64).unwrap();
        set.restore(&AckSet::from_wire(64, &[i64::MIN]).unwrap())
            .unwrap();
        assert_eq!(set.outstanding_indexes().collect::<Vec<_>>(), [63]);
    }

    #[test]
    fn trailing_zero_words_are_trimmed() {
        let mut set = AckSet::outstanding(129).unwrap();
        set.ack_up_to(127).unwrap();
        assert_eq!(set.words(), [0, 0, 1]);
        set.ack(128).unwrap();
        assert!(set.words().is_empty());
        let mut set = AckSet::outstanding(129).unwrap();
        for i in 64..129 {
            set.ack(i).unwrap();
        }
        assert_eq!(set.words(), [u64::MAX]);
        assert_eq!(
            AckSet::from_wire(129, &[-1]).unwrap(),
            set,
            "missing words are zeros"
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        assert_eq!(
            AckSet::outstanding(0),
            Err(Error::InvalidBatchSize { size: 0 })
        );
        assert!(AckSet::outstanding(MAX_BATCH_SIZE).is_ok());
        assert!(AckSet::outstanding(MAX_BATCH_SIZE + 1).is_err());
        let mut set = AckSet::outstanding(3).unwrap();
        assert_eq!(
            set.ack(3),
            Err(Error::IndexOutOfRange {
                index: 3,
                batch_size: 3
            })
        );
        assert!(set.ack_up_to(7).is_err());
        assert!(set.is_outstanding(3).is_err());
        assert_eq!(
            AckSet::from_wire(3, &[0b1001]),
            Err(Error::BitsBeyondBatch {
                bit: 3,
                batch_size: 3
            })
        );
        assert_eq!(
            AckSet::from_wire(64, &[1, 1]),
            Err(Error::BitsBeyondBatch {
                bit: 64,
                batch_size: 64
            })
        );
        let other = AckSet::outstanding(4).unwrap();
        assert!(set.merge_acks(&other).is_err());
    }

    #[test]
    fn cumulative_acks_count_what_they_newly_acknowledge() {
        let mut set = AckSet::outstanding(130).unwrap();
        set.ack(5).unwrap();
        assert_eq!(set.ack_up_to(63).unwrap(), 63);
        assert_eq!(set.ack_up_to(64).unwrap(), 1);
        assert_eq!(set.ack_up_to(129).unwrap(), 65);
        assert!(set.is_complete());
        assert!(
            !set.ack(7).unwrap(),
            "acking again reports it was already acked"
        );
    }

    #[test]
    fn combining_sets() {
        let mut a = AckSet::from_wire(3, &[0b110]).unwrap(); // 0 acked
        let b = AckSet::from_wire(3, &[0b101]).unwrap(); // 1 acked
        assert!(!a.acked_in_both(&b).unwrap());
        let c = AckSet::from_wire(3, &[0b100]).unwrap(); // 0, 1 acked
        assert!(a.acked_in_both(&c).unwrap(), "index 0 is acked in both");
        assert_eq!(a.first_acked_in_both(&c).unwrap(), Some(0));
        let mut wide = AckSet::outstanding(130).unwrap();
        wide.ack(100).unwrap();
        let mut other = AckSet::outstanding(130).unwrap();
        other.ack(100).unwrap();
        other.ack(5).unwrap();
        assert_eq!(wide.first_acked_in_both(&other).unwrap(), Some(100));
        a.merge_acks(&b).unwrap();
        assert_eq!(a.words(), [0b100]);
        a.restore(&b).unwrap();
        assert_eq!(a.words(), [0b101]);
    }
}
