//! Key_Shared subscriptions: the `KeySharedMeta` a consumer sends on `SUBSCRIBE`, and the
//! broker's sticky-key hash.
//!
//! The broker (4.0.x) dispatches each entry by its *sticky key*: the entry metadata's
//! `ordering_key`, else its `partition_key` (UTF-8 bytes), else the bytes `NONE_KEY`. The key's
//! hash is Murmur3 x86 32-bit (seed 0) masked with `i32::MAX`, modulo 65,536; a result of 0 is
//! taken as 1 (0 means "no hash" inside the 4.0 dispatcher). In [`KeySharedMode::AutoSplit`]
//! the broker spreads the hash space over the connected consumers itself; in
//! [`KeySharedMode::Sticky`] each consumer names the ranges it serves, and an entry whose hash
//! no consumer covers waits until one does.

use crate::Error;
use crate::pb;

/// The size of the broker's sticky-key hash space: hashes are in `0..KEY_HASH_RANGE_SIZE`.
pub const KEY_HASH_RANGE_SIZE: u32 = 1 << 16;

/// The sticky key of an entry or message without `ordering_key` and `partition_key`.
pub const NONE_KEY: &[u8] = b"NONE_KEY";

/// The broker's sticky-key hash of `key` (an ordering key, or a partition key's UTF-8 bytes):
/// `(murmur3_32(key) & i32::MAX) % 65536`, with 0 taken as 1, as a 4.0.x broker computes it.
/// A [`HashRange`] of a [`KeySharedMode::Sticky`] consumer covers the keys whose hash it holds.
pub fn sticky_key_hash(key: &[u8]) -> u32 {
    let hash = (::mq_priority::murmur3_32(key, 0) & i32::MAX as u32) % KEY_HASH_RANGE_SIZE;
    hash.max(1)
}

/// An inclusive range of sticky-key hashes, `start..=end`, within `0..=65535`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashRange {
    /// The first hash of the range.
    pub start: u32,
    /// The last hash of the range (inclusive).
    pub end: u32,
}

impl HashRange {
    /// The hashes `start..=end` (checked when the consumer subscribes).
    pub fn new(start: u32, end: u32) -> Self {
        Self { start, end }
    }

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u32) -> bool {
        (self.start..=self.end).contains(&hash)
    }

    fn overlaps(&self, other: &HashRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl std::fmt::Display for HashRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.start, self.end)
    }
}

/// How the broker spreads the keys of a Key_Shared subscription over its consumers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeySharedMode {
    /// The broker splits the hash space over the connected consumers and moves hashes when
    /// consumers come and go (`AUTO_SPLIT`, the default).
    #[default]
    AutoSplit,
    /// This consumer serves exactly these hash ranges (`STICKY`): non-empty, each within
    /// `0..=65535`, not overlapping each other nor, on the broker, another consumer's. Entries
    /// whose hash no consumer covers are not dispatched until one does.
    Sticky(Vec<HashRange>),
}

/// The `KeySharedMeta` of a Key_Shared consumer ([`crate::ConsumerOptions::key_shared_policy`]).
///
/// Every consumer of a subscription must agree on the mode and on
/// [`KeySharedPolicy::allow_out_of_order_delivery`]: the first consumer fixes both, and a
/// broker that checks (newer 4.0.x) refuses a consumer that differs with `ConsumerBusy`
/// ("Subscription is of different type").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeySharedPolicy {
    mode: KeySharedMode,
    allow_out_of_order_delivery: bool,
}

impl KeySharedPolicy {
    /// `AUTO_SPLIT`: the broker assigns the hashes (the default).
    pub fn auto_split() -> Self {
        Self::default()
    }

    /// `STICKY`: this consumer serves `ranges` (checked when the consumer subscribes).
    pub fn sticky(ranges: impl IntoIterator<Item = HashRange>) -> Self {
        Self {
            mode: KeySharedMode::Sticky(ranges.into_iter().collect()),
            allow_out_of_order_delivery: false,
        }
    }

    /// Lets the broker deliver a key to a consumer it has just moved to before the previous
    /// consumer acknowledged that key's earlier messages (`allowOutOfOrderDelivery`, default
    /// false): faster rebalancing, no per-key order across the move.
    #[must_use]
    pub fn allow_out_of_order_delivery(mut self, allow: bool) -> Self {
        self.allow_out_of_order_delivery = allow;
        self
    }

    /// The mode.
    pub fn mode(&self) -> &KeySharedMode {
        &self.mode
    }

    /// Whether out-of-order delivery is allowed.
    pub fn allows_out_of_order_delivery(&self) -> bool {
        self.allow_out_of_order_delivery
    }

    /// Checks the sticky ranges as the broker and the Java client do.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the offending range: an empty list, a range that starts after
    /// it ends or ends above 65535, two ranges that overlap.
    pub fn validate(&self) -> Result<(), Error> {
        let KeySharedMode::Sticky(ranges) = &self.mode else {
            return Ok(());
        };
        let invalid = |reason: String| Error::Invalid {
            what: "key_shared_policy",
            reason,
        };
        if ranges.is_empty() {
            return Err(invalid(
                "a sticky policy needs at least one hash range (the hashes this consumer \
                 serves, within 0..=65535)"
                    .into(),
            ));
        }
        for range in ranges {
            if range.start > range.end {
                return Err(invalid(format!(
                    "hash range {range} starts after it ends: give start <= end"
                )));
            }
            if range.end >= KEY_HASH_RANGE_SIZE {
                return Err(invalid(format!(
                    "hash range {range} ends above 65535: sticky-key hashes are in 0..=65535"
                )));
            }
        }
        let mut sorted: Vec<&HashRange> = ranges.iter().collect();
        sorted.sort_by_key(|r| (r.start, r.end));
        for pair in sorted.windows(2) {
            if pair[0].overlaps(pair[1]) {
                return Err(invalid(format!(
                    "hash ranges {} and {} overlap: each hash belongs to one range",
                    pair[0], pair[1]
                )));
            }
        }
        Ok(())
    }

    /// The `KeySharedMeta` sent on `SUBSCRIBE`.
    pub(crate) fn wire(&self) -> pb::KeySharedMeta {
        let (mode, hash_ranges) = match &self.mode {
            KeySharedMode::AutoSplit => (pb::KeySharedMode::AutoSplit, Vec::new()),
            KeySharedMode::Sticky(ranges) => (
                pb::KeySharedMode::Sticky,
                ranges
                    .iter()
                    .map(|r| pb::IntRange {
                        // Validated: both are at most 65535.
                        start: r.start as i32,
                        end: r.end as i32,
                    })
                    .collect(),
            ),
        };
        pb::KeySharedMeta {
            key_shared_mode: mode as i32,
            hash_ranges,
            allow_out_of_order_delivery: Some(self.allow_out_of_order_delivery),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reason(policy: &KeySharedPolicy) -> String {
        match policy.validate() {
            Err(Error::Invalid { what, reason }) => {
                assert_eq!(what, "key_shared_policy");
                reason
            }
            other => panic!("expected Error::Invalid, got {other:?}"),
        }
    }

    #[test]
    fn auto_split_is_the_default_and_sends_no_ranges() {
        let meta = KeySharedPolicy::default().wire();
        assert_eq!(meta.key_shared_mode, pb::KeySharedMode::AutoSplit as i32);
        assert!(meta.hash_ranges.is_empty());
        assert_eq!(meta.allow_out_of_order_delivery, Some(false));
        let meta = KeySharedPolicy::auto_split()
            .allow_out_of_order_delivery(true)
            .wire();
        assert_eq!(meta.allow_out_of_order_delivery, Some(true));
    }

    #[test]
    fn sticky_ranges_go_on_the_wire_as_given() {
        let policy = KeySharedPolicy::sticky([HashRange::new(0, 99), HashRange::new(200, 65535)]);
        policy.validate().expect("valid");
        let meta = policy.wire();
        assert_eq!(meta.key_shared_mode, pb::KeySharedMode::Sticky as i32);
        let ranges: Vec<(i32, i32)> = meta.hash_ranges.iter().map(|r| (r.start, r.end)).collect();
        assert_eq!(ranges, [(0, 99), (200, 65535)]);
    }

    #[test]
    fn bad_sticky_ranges_are_refused_with_the_range_named() {
        assert!(reason(&KeySharedPolicy::sticky([])).contains("at least one hash range"));
        assert!(reason(&KeySharedPolicy::sticky([HashRange::new(10, 5)])).contains("10..=5"));
        let above = reason(&KeySharedPolicy::sticky([HashRange::new(0, 65536)]));
        assert!(
            above.contains("0..=65536") && above.contains("65535"),
            "{above}"
        );
        let overlap = reason(&KeySharedPolicy::sticky([
            HashRange::new(500, 600),
            HashRange::new(0, 100),
            HashRange::new(100, 200),
        ]));
        assert!(
            overlap.contains("0..=100") && overlap.contains("100..=200"),
            "{overlap}"
        );
        // Touching is not overlapping; a single hash is a range.
        KeySharedPolicy::sticky([
            HashRange::new(0, 99),
            HashRange::new(100, 100),
            HashRange::new(101, 65535),
        ])
        .validate()
        .expect("adjacent ranges are fine");
    }

    #[test]
    fn the_hash_is_murmur3_of_the_key_in_the_broker_range() {
        // Murmur3 x86 32-bit (seed 0) reference values: "" is 0, "hello" is 0x248bfa47.
        assert_eq!(sticky_key_hash(b"hello"), 0x248b_fa47 % 65536);
        // A hash of 0 is taken as 1.
        assert_eq!(sticky_key_hash(b""), 1);
        // Masking with i32::MAX does not change the low 16 bits.
        let top_bit_set = (0u32..)
            .map(|i| format!("key-{i}"))
            .find(|k| ::mq_priority::murmur3_32(k.as_bytes(), 0) & 0x8000_0000 != 0)
            .expect("some key hashes with the top bit set");
        assert_eq!(
            sticky_key_hash(top_bit_set.as_bytes()),
            (::mq_priority::murmur3_32(top_bit_set.as_bytes(), 0) & 0xffff).max(1)
        );
    }

    proptest! {
        /// Validation accepts exactly the lists of well-formed, pairwise disjoint ranges.
        #[test]
        fn validation_matches_the_pairwise_rule(
            ranges in proptest::collection::vec((0u32..70_000, 0u32..70_000), 0..6)
        ) {
            let ranges: Vec<HashRange> =
                ranges.into_iter().map(|(s, e)| HashRange::new(s, e)).collect();
            let well_formed = !ranges.is_empty()
                && ranges.iter().all(|r| r.start <= r.end && r.end <= 65535);
            let disjoint = ranges.iter().enumerate().all(|(i, a)| {
                ranges.iter().enumerate().all(|(j, b)| i == j || !a.overlaps(b))
            });
            let policy = KeySharedPolicy::sticky(ranges);
            prop_assert_eq!(policy.validate().is_ok(), well_formed && disjoint);
        }

        /// Every hash is in 1..=65535.
        #[test]
        fn hashes_stay_in_range(key in proptest::collection::vec(any::<u8>(), 0..40)) {
            let hash = sticky_key_hash(&key);
            prop_assert!((1..KEY_HASH_RANGE_SIZE).contains(&hash));
        }
    }
}
