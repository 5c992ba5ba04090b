//! The few `java.util.BitSet` operations the broker applies to ack sets, with Java's sizes.
//!
//! The broker never checks an ack set against a batch size: it turns the wire's words into a
//! `BitSet` (`BitSet.valueOf`, which drops trailing zero words) and works on whatever bits are
//! there. A set's `size()` is then `64 * words`, which is what the pending-ack padding of §6
//! and `isAckSetOverlap` depend on. The model keeps such sets as [`JavaBits`] so that legacy
//! input (a set without a batch size, or with another batch size than the entry's) behaves as
//! on the broker.

/// A `BitSet` as `BitSet.valueOf(long[])` builds it: the words with trailing zero words
/// dropped. `size()` is `64 * words().len()`.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct JavaBits {
    words: Vec<u64>,
}

impl std::fmt::Debug for JavaBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.words.iter().map(|w| format!("{w:#x}")))
            .finish()
    }
}

impl JavaBits {
    /// `BitSet.valueOf(words)`.
    pub(crate) fn value_of(words: &[i64]) -> Self {
        let mut bits = Self {
            words: words.iter().map(|w| *w as u64).collect(),
        };
        bits.trim();
        bits
    }

    /// From unsigned words (trailing zero words dropped).
    pub(crate) fn from_words(words: &[u64]) -> Self {
        let mut bits = Self {
            words: words.to_vec(),
        };
        bits.trim();
        bits
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// The words, trailing zero words dropped (`toLongArray()` as unsigned words).
    #[cfg(test)]
    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    /// `toLongArray()`.
    pub(crate) fn to_long_array(&self) -> Vec<i64> {
        self.words.iter().map(|w| *w as i64).collect()
    }

    /// `cardinality()`.
    pub(crate) fn cardinality(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// `isEmpty()`.
    pub(crate) fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// `and(other)`: words beyond `other`'s are cleared.
    pub(crate) fn and(&mut self, other: &JavaBits) {
        self.words.truncate(other.words.len());
        for (mine, theirs) in self.words.iter_mut().zip(&other.words) {
            *mine &= theirs;
        }
        self.trim();
    }

    /// `or(other)`.
    pub(crate) fn or(&mut self, other: &JavaBits) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (mine, theirs) in self.words.iter_mut().zip(&other.words) {
            *mine |= theirs;
        }
        self.trim();
    }

    /// Applies `op` to every word that holds a bit of `[from, to)`, with the mask of those bits.
    fn apply_range(&mut self, from: u64, to: u64, op: impl Fn(&mut u64, u64)) {
        if from >= to {
            return;
        }
        let last_word = ((to - 1) / 64) as usize;
        if self.words.len() <= last_word {
            self.words.resize(last_word + 1, 0);
        }
        for (w, word) in self.words.iter_mut().enumerate().skip((from / 64) as usize) {
            let start = w as u64 * 64;
            if start >= to {
                break;
            }
            let low = from.saturating_sub(start);
            let high = (to - start).min(64);
            let mask = if high - low == 64 {
                u64::MAX
            } else {
                ((1u64 << (high - low)) - 1) << low
            };
            op(word, mask);
        }
        self.trim();
    }

    /// `flip(from, to)`.
    pub(crate) fn flip(&mut self, from: u64, to: u64) {
        self.apply_range(from, to, |word, mask| *word ^= mask);
    }

    /// `set(from, to)`.
    fn set_range(&mut self, from: u64, to: u64) {
        self.apply_range(from, to, |word, mask| *word |= mask);
    }
}

/// The probe `PendingAckHandleImpl` builds from a transactional ack's set before its overlap
/// checks (§6 step 2): `valueOf(ackSet)`, then `set(batchSize)` if `batchSize > size()` (which
/// grows the word array to `max(2 * words, batchSize / 64 + 1)`), then `set(batchSize, size())`.
/// With `batch_size` 0 (no `batch_size` on the wire) every bit up to `size()` is set, so the
/// probe overlaps nothing: conflict detection is off.
pub(crate) fn overlap_probe(words: &JavaBits, batch_size: u32) -> JavaBits {
    let mut probe = words.clone();
    let mut capacity = probe.words.len() as u64;
    let batch_size = u64::from(batch_size);
    if batch_size > capacity * 64 {
        let required = batch_size / 64 + 1;
        capacity = capacity.saturating_mul(2).max(required);
    }
    probe.set_range(batch_size, capacity * 64);
    probe
}

/// `PositionAckSetUtil.isAckSetOverlap(a, b)`: some bit is 0 in both, within the smaller of
/// the two sizes (each set is flipped over its own `size()` only). A missing set overlaps
/// nothing.
pub(crate) fn is_ack_set_overlap(a: Option<&JavaBits>, b: Option<&JavaBits>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.words.iter().zip(&b.words).any(|(x, y)| !x & !y != 0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_of_trims_and_and_clears_beyond_the_other() {
        let bits = JavaBits::value_of(&[6, 0, 0]);
        assert_eq!(bits.words(), [6]);
        let mut wide = JavaBits::value_of(&[-1, 1]);
        wide.and(&JavaBits::value_of(&[5]));
        assert_eq!(wide.words(), [5], "words beyond the other set are cleared");
        wide.or(&JavaBits::value_of(&[0, 2]));
        assert_eq!(wide.words(), [5, 2]);
        assert_eq!(wide.cardinality(), 3);
    }

    #[test]
    fn flip_and_set_ranges_across_words() {
        let mut bits = JavaBits::default();
        bits.flip(0, 3);
        assert_eq!(bits.words(), [7]);
        bits.flip(1, 2);
        assert_eq!(bits.words(), [5]);
        bits.flip(60, 70);
        assert_eq!(bits.words(), [5 | (0xf << 60), 0x3f]);
        bits.flip(0, 0);
        bits.flip(5, 3);
        assert_eq!(bits.cardinality(), 12);
        let mut full = JavaBits::default();
        full.set_range(0, 128);
        assert_eq!(full.words(), [u64::MAX, u64::MAX]);
    }

    #[test]
    fn the_probe_pads_from_the_batch_size() {
        // [6] for a batch of 3: only index 0 acked; bits 3..64 padded to 1.
        let probe = overlap_probe(&JavaBits::value_of(&[6]), 3);
        assert_eq!(probe.words(), [!1u64]);
        // Without a batch size everything up to size() is set: nothing can overlap.
        let probe = overlap_probe(&JavaBits::value_of(&[6]), 0);
        assert_eq!(probe.words(), [u64::MAX]);
        assert!(!is_ack_set_overlap(
            Some(&probe),
            Some(&JavaBits::value_of(&[0, 0]))
        ));
        // A 65-message batch whose last index is acked trims to one word; the probe grows.
        let probe = overlap_probe(&JavaBits::value_of(&[-1]), 65);
        assert_eq!(probe.words(), [u64::MAX, !1u64]);
        // An all-zero set grows to one word.
        let probe = overlap_probe(&JavaBits::value_of(&[0]), 3);
        assert_eq!(probe.words(), [!7u64]);
    }

    #[test]
    fn overlap_is_a_zero_in_both_within_the_smaller_size() {
        let a = JavaBits::value_of(&[6]); // 0 acked (and 3..64 "acked")
        let b = JavaBits::value_of(&[5]); // 1 acked
        assert!(
            is_ack_set_overlap(Some(&a), Some(&b)),
            "bits 3..64 are zero in both"
        );
        let pa = overlap_probe(&a, 3);
        let pb = overlap_probe(&b, 3);
        assert!(!is_ack_set_overlap(Some(&pa), Some(&pb)));
        assert!(is_ack_set_overlap(Some(&pa), Some(&pa)));
        assert!(!is_ack_set_overlap(None, Some(&pa)));
        // The empty set has size 0: it overlaps nothing.
        assert!(!is_ack_set_overlap(Some(&JavaBits::default()), Some(&pa)));
    }
}
