//! A small seeded pseudo-random generator (SplitMix64), so every run is reproducible.

/// SplitMix64: a 64-bit state advanced by a fixed odd constant and mixed on output.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform value in `0..n` (`0` when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// How many events of a stream with mean `rate` per tick happen in one tick: the integer
    /// part always, plus one with the probability of the fractional part.
    pub(crate) fn count(&mut self, rate: f64) -> u64 {
        if !(rate.is_finite() && rate > 0.0) {
            return 0;
        }
        let whole = rate.floor();
        let extra = u64::from(self.next_f64() < rate - whole);
        whole as u64 + extra
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_counts_average_the_rate() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let total: u64 = (0..10_000).map(|_| a.count(2.5)).sum();
        assert!((24_500..=25_500).contains(&total), "{total}");
        assert_eq!(a.count(f64::NAN), 0);
        assert_eq!(a.below(0), 0);
    }
}
