//! Fault injection: what to break, and how a seeded generator decides when.

use std::time::Duration;

/// True with probability `p`, drawn from `rng` (0 never draws a number, so a fault-free run
/// stays reproducible whatever else draws).
pub(super) fn chance(rng: &mut fastrand::Rng, p: f64) -> bool {
    if p.is_nan() || p <= 0.0 {
        return false;
    }
    if p >= 1.0 {
        return true;
    }
    rng.f64() < p
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
    #[must_use]
    pub fn drop_after_frames(mut self, frames: Option<u64>) -> Self {
        self.drop_after_frames = frames;
        self
    }

    /// Each received frame closes its connection abruptly, unhandled, with probability
    /// `rate` (0 to 1).
    #[must_use]
    pub fn drop_rate(mut self, rate: f64) -> Self {
        self.drop_rate = rate;
        self
    }

    /// Every response to a request (not MESSAGE, PING or PONG frames) is held for `delay`
    /// before it is written. A connection writes in order, so what follows a delayed response
    /// waits too.
    #[must_use]
    pub fn response_delay(mut self, delay: Duration) -> Self {
        self.response_delay = delay;
        self
    }

    /// Each dispatched MESSAGE frame goes out with a wrong CRC32C with probability `rate`
    /// (0 to 1). The entry itself stays intact.
    #[must_use]
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
    fn seeded_generator_is_deterministic_and_rates_hold() {
        let mut a = fastrand::Rng::with_seed(7);
        let mut b = fastrand::Rng::with_seed(7);
        assert_eq!(a.u64(..), b.u64(..));
        let hits = (0..10_000).filter(|_| chance(&mut a, 0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert!(!chance(&mut a, 0.0) && chance(&mut a, 1.0) && !chance(&mut a, f64::NAN));
    }
}
