//! Exponential backoff with jitter for the consumer's loops (control plane, receives, nacks).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Doubles from `initial` up to `max`; every wait is drawn uniformly from the upper half of
/// the current step ("equal jitter"), so that clients that failed together (a proxy restart)
/// do not come back together, and no wait is shorter than half a step.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
    rng: u64,
}

static SEEDS: AtomicU64 = AtomicU64::new(0);

impl Backoff {
    pub(super) fn new(initial: Duration, max: Duration) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let seed = u64::from(nanos) ^ SEEDS.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            step: initial,
            rng: seed,
        }
    }

    /// The wait before the next attempt; each call doubles the step (up to `max`).
    pub(super) fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(self.uniform())
    }

    /// Back to `initial` after a success.
    pub(super) fn reset(&mut self) {
        self.step = self.initial;
    }

    /// splitmix64, as a uniform float in `[0, 1)`.
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // 53 random bits; the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        let v = (z >> 11) as f64;
        v / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut steps = Vec::new();
        for _ in 0..10 {
            steps.push(backoff.step);
            let delay = backoff.next_delay();
            let step = *steps.last().unwrap();
            assert!(delay >= step / 2 && delay <= step, "{delay:?} for {step:?}");
        }
        assert_eq!(steps[0], Duration::from_millis(100));
        assert_eq!(steps[3], Duration::from_millis(800));
        assert_eq!(steps[9], Duration::from_secs(5));
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn two_backoffs_do_not_wait_in_lockstep() {
        let mut a = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let a: Vec<_> = (0..5).map(|_| a.next_delay()).collect();
        let b: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_ne!(a, b);
    }
}
