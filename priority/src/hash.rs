//! Key hashes that place a key on the same partition as Pulsar's Java client does.
//!
//! Pulsar's `HashingScheme` has two members: `JavaStringHash` (the default),
//! `String.hashCode() & Integer.MAX_VALUE`, and `Murmur3_32Hash`, Murmur3 x86 32-bit with seed
//! 0 over the key's UTF-8 bytes, `& Integer.MAX_VALUE`. Both results are non-negative, so a
//! plain remainder picks the slot ([`KeyPlacement::Modulo`]); [`KeyPlacement::Jump`] places
//! the same hash so that growth moves the fewest keys. (The `pulsar` Rust crate takes the unmasked Murmur3 value
//! modulo the partition count, which places keys whose hash has the top bit set elsewhere.)

/// Which hash turns a message key into a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyHash {
    /// Java's `String.hashCode` (over UTF-16 code units) masked with `i32::MAX`: Pulsar's
    /// default `HashingScheme.JavaStringHash`.
    #[default]
    JavaStringHash,
    /// Murmur3 x86 32-bit, seed 0, over UTF-8 bytes, masked with `i32::MAX`: Pulsar's
    /// `HashingScheme.Murmur3_32Hash`.
    Murmur3_32Hash,
}

impl KeyHash {
    /// The key's non-negative hash (at most `i32::MAX`).
    pub fn hash(self, key: &str) -> u32 {
        let raw = match self {
            KeyHash::JavaStringHash => java_string_hash(key) as u32,
            KeyHash::Murmur3_32Hash => murmur3_32(key.as_bytes(), 0),
        };
        raw & (i32::MAX as u32)
    }

    /// The slot in `0..slots` for `key` (0 when `slots` is 0, never a panic).
    pub fn slot(self, key: &str, slots: usize) -> usize {
        if slots == 0 {
            return 0;
        }
        // u32 always fits in usize on the platforms Rust supports with std (>= 32 bits).
        self.hash(key) as usize % slots
    }
}

/// How a key's hash picks one of a level's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyPlacement {
    /// `hash % n`, as Pulsar's Java client places keys on a topic's partitions (for producers
    /// that must agree with a plain Java producer's placement inside one level). When a level
    /// grows from `n` to `m` partitions, a key keeps its partition only if
    /// `hash % n == hash % m`: growing 3 → 5 moves about 80 % of the keys, many of them between
    /// two old partitions, where [`crate::GateConfig::growth_hold`] cannot keep their order.
    Modulo,
    /// Jump consistent hashing (Lamping and Veach, 2014) of the key's hash over the level's
    /// partitions in index order: growing a level from `n` to `m` partitions moves only the
    /// keys that must move, about `1 − n/m` of them (3 → 5: 40 %), each to a new partition.
    /// It relies on stable layouts (a grown level keeps its partitions and appends the new
    /// ones), which every [`crate::LayoutSpec`] gives. Producers of a topic must agree on the
    /// placement; a producer that is not this crate's router places keys by `Modulo`.
    ///
    /// The default: with [`crate::GateConfig::growth_hold`] on the consumer, every moved key
    /// keeps its order across a growth (a moved key always moves to a new partition, which the
    /// hold keeps back until the old ones drained).
    #[default]
    Jump,
}

impl KeyPlacement {
    /// The slot in `0..slots` for a key whose hash is `hash` (0 when `slots` is 0).
    pub fn slot(self, hash: u32, slots: usize) -> usize {
        if slots == 0 {
            return 0;
        }
        match self {
            KeyPlacement::Modulo => hash as usize % slots,
            KeyPlacement::Jump => {
                let buckets = u32::try_from(slots).unwrap_or(u32::MAX);
                jump_consistent(spread(hash), buckets) as usize
            }
        }
    }
}

/// Spreads a 31-bit key hash over 64 bits (SplitMix64's finaliser), so that the generator of
/// [`jump_consistent`] starts from well-mixed state even for the small, similar hashes of
/// short strings.
fn spread(hash: u32) -> u64 {
    let mut z = u64::from(hash).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Jump consistent hash: the bucket in `0..buckets` of `key` (0 when `buckets` is 0). Going
/// from `n` to `n + 1` buckets moves a key only to the new bucket, with probability
/// `1 / (n + 1)`.
pub fn jump_consistent(mut key: u64, buckets: u32) -> u32 {
    // The key drives a linear congruential generator; each step draws the next bucket count
    // at which the key jumps, until that count exceeds `buckets`.
    let mut bucket: i64 = -1;
    let mut next: i64 = 0;
    while next < i64::from(buckets) {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        let draw = ((key >> 33) + 1) as f64;
        next = ((bucket + 1) as f64 * ((1u64 << 31) as f64 / draw)) as i64;
    }
    u32::try_from(bucket.max(0)).unwrap_or(0)
}

/// Java's `String.hashCode()`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 code units, with
/// 32-bit wrapping arithmetic.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// Murmur3 x86 32-bit of `data` with `seed` (unmasked).
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;

    fn mix(k: u32) -> u32 {
        k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
    }

    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        h ^= mix(k);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let k = tail
            .iter()
            .rev()
            .fold(0u32, |k, &b| (k << 8) | u32::from(b));
        h ^= mix(k);
    }
    // The length is mixed in modulo 2^32, as the reference implementation does.
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_string_hash_matches_java() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // Two well-known colliding strings.
        assert_eq!(java_string_hash("Aa"), java_string_hash("BB"));
        assert_eq!(java_string_hash("Aa"), 2112);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE; masked it is 0.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(KeyHash::JavaStringHash.hash("polygenelubricants"), 0);
        // Non-BMP characters count as two UTF-16 units (surrogate pair D83D DE00).
        assert_eq!(java_string_hash("\u{1F600}"), 0xD83D * 31 + 0xDE00);
    }

    #[test]
    fn murmur3_matches_reference_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"hello", 0), 0x248b_fa47);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
        assert_eq!(murmur3_32(&[0xff, 0xff, 0xff, 0xff], 0), 0x7629_3b50);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65, 0x87], 0), 0xf55b_516b);
        assert_eq!(murmur3_32(&[0x21, 0x43, 0x65], 0), 0x7e4a_8634);
        assert_eq!(murmur3_32(&[0x21, 0x43], 0), 0xa0f7_b07a);
        assert_eq!(murmur3_32(&[0x21], 0), 0x7266_1cf4);
    }

    #[test]
    fn jump_moves_only_the_keys_that_must_move() {
        assert_eq!(jump_consistent(42, 0), 0);
        assert_eq!(jump_consistent(42, 1), 0);
        let keys: Vec<u32> = (0..10_000)
            .map(|i| KeyHash::JavaStringHash.hash(&format!("key-{i}")))
            .collect();
        for (from, to) in [(3usize, 5usize), (1, 2), (6, 10), (10, 16)] {
            let mut moved = 0;
            let mut modulo_moved = 0;
            let mut per_slot = vec![0u32; to];
            for &h in &keys {
                let (a, b) = (
                    KeyPlacement::Jump.slot(h, from),
                    KeyPlacement::Jump.slot(h, to),
                );
                assert!(b < to);
                per_slot[b] += 1;
                if a != b {
                    // A moved key only ever goes to a new slot.
                    assert!(b >= from, "{from} -> {to}: {a} -> {b}");
                    moved += 1;
                }
                if KeyPlacement::Modulo.slot(h, from) != KeyPlacement::Modulo.slot(h, to) {
                    modulo_moved += 1;
                }
            }
            let expected = 10_000.0 * (1.0 - from as f64 / to as f64);
            assert!(
                (f64::from(moved) - expected).abs() < 300.0,
                "{from} -> {to}: {moved} moved, about {expected} expected"
            );
            assert!(moved < modulo_moved, "{moved} vs modulo {modulo_moved}");
            // Spread evenly: every slot within 20 % of its fair count.
            let fair = 10_000.0 / to as f64;
            assert!(
                per_slot
                    .iter()
                    .all(|&c| (f64::from(c) - fair).abs() < 0.2 * fair)
            );
        }
    }

    #[test]
    fn masked_hashes_are_non_negative_and_slots_in_range() {
        for key in ["", "a", "order-17", "polygenelubricants", "\u{1F600}"] {
            for scheme in [KeyHash::JavaStringHash, KeyHash::Murmur3_32Hash] {
                assert!(scheme.hash(key) <= i32::MAX as u32);
                assert!(scheme.slot(key, 7) < 7);
                assert_eq!(scheme.slot(key, 0), 0);
            }
        }
        // murmur3("hello") has the top bit clear; the Java mask leaves it unchanged.
        assert_eq!(KeyHash::Murmur3_32Hash.hash("hello"), 0x248b_fa47);
    }
}
