//! Fault injection: what to break, and the seeded generator that decides when.

use std::time::Duration;

/// SplitMix64 (Steele, Lea and Flood): a tiny, fast, seedable generator. Good enough to decide
/// when to inject a fault; not for anything else.
#[derive(Debug, Clone)]
pub(super) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p` (0 never draws a number, so a fault-free run stays
    /// reproducible whatever else draws).
    pub(super) fn chance(&mut self, p: f64) -> bool {
        if p.is_nan() || p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        // 53 random bits as a float in [0, 1).
        ((self.next_u64() >> 11) as f64) / ((1u64 << 53) as f64) < p
    }
}

/// The faults the emulator injects. Everything is off by default; change them at run time
/// with [`Emulator::set_faults`](super::Emulator::set_faults). Random decisions come from a
/// generator seeded with [`EmulatorConfig::seed`](super::EmulatorConfig::seed), so a run with
/// the same inputs injects the same faults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    drop_after_frames: Option<u64>,
    drop_rate: f64,
    response_delay: Duration,
    corrupt_rate: f64,
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every connection is closed abruptly when it receives its `frames`-th frame (counting
    /// from CONNECT), without handling that frame: the request it carries never gets an
    /// answer. `None` turns it off.
    pub fn drop_after_frames(mut self, frames: Option<u64>) -> Self {
        self.drop_after_frames = frames;
        self
    }

    /// Each received frame closes its connection abruptly, unhandled, with probability
    /// `rate` (0 to 1).
    pub fn drop_rate(mut self, rate: f64) -> Self {
        self.drop_rate = rate;
        self
    }

    /// Every response to a request (not MESSAGE, PING or PONG frames) is held for `delay`
    /// before it is written. A connection writes in order, so what follows a delayed response
    /// waits too.
    pub fn response_delay(mut self, delay: Duration) -> Self {
        self.response_delay = delay;
        self
    }

    /// Each dispatched MESSAGE frame goes out with a wrong CRC32C with probability `rate`
    /// (0 to 1). The entry itself stays intact.
    pub fn corrupt_rate(mut self, rate: f64) -> Self {
        self.corrupt_rate = rate;
        self
    }

    /// See [`Faults::drop_after_frames`].
    pub fn dropped_after_frames(&self) -> Option<u64> {
        self.drop_after_frames
    }

    /// See [`Faults::drop_rate`].
    pub fn dropped_rate(&self) -> f64 {
        self.drop_rate
    }

    /// See [`Faults::response_delay`].
    pub fn delay(&self) -> Duration {
        self.response_delay
    }

    /// See [`Faults::corrupt_rate`].
    pub fn corrupted_rate(&self) -> f64 {
        self.corrupt_rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_deterministic_and_rates_hold() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert!(!a.chance(0.0) && a.chance(1.0) && !a.chance(f64::NAN));
    }
}
