//! Exponential backoff with jitter, for every retry loop of the crate: the consumer's control
//! plane, receives and nacks, and the producer's telemetry stream and send retries.

use std::time::Duration;

/// Doubles from `initial` up to `max`; every wait is drawn uniformly from the upper half of
/// the current step ("equal jitter", [`jitter`]), so that clients that failed together (a
/// proxy restart) do not come back together, and no wait is shorter than half a step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            step: initial,
        }
    }

    /// The wait before the next attempt; each call doubles the step (up to `max`).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        jitter(step)
    }

    /// Back to `initial` after a success.
    pub(crate) fn reset(&mut self) {
        self.step = self.initial;
    }
}

/// "Equal jitter": a delay drawn uniformly from `[delay / 2, delay]`.
pub(crate) fn jitter(delay: Duration) -> Duration {
    let half = delay / 2;
    half + (delay - half).mul_f64(fastrand::f64())
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
    fn jitter_stays_between_half_and_all() {
        let ms = Duration::from_millis;
        for _ in 0..1_000 {
            let d = jitter(ms(100));
            assert!(d >= ms(50) && d <= ms(100), "{d:?}");
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
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
