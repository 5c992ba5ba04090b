//! A series of retry waits under a [`RetryPolicy`], for retry loops outside the batcher.
//!
//! The batcher's own retries and the adapters' loops (reconnections, receives, heartbeats,
//! telemetry streams) draw their waits from one rule: the policy's exponential backoff,
//! capped, shortened by a random share of itself.

use std::time::Duration;

use crate::RetryPolicy;

/// The waits of one series of retries under a [`RetryPolicy`]: the `n`-th call to
/// [`next_delay`](Self::next_delay) gives the policy's wait before retry `n`
/// ([`RetryPolicy::jittered_delay`]) with a fresh jitter draw, and [`reset`](Self::reset)
/// starts the series again (after a success). The policy's `max_attempts` is not consulted:
/// the loop decides when to stop.
///
/// ```
/// use std::time::Duration;
/// use ack_batcher::Backoff;
///
/// // 100 ms doubling up to 5 s, each wait drawn from the upper half of its step.
/// let mut backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(5), 0.5);
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    retries: u32,
}

impl Backoff {
    /// The series of `policy`'s waits.
    #[must_use]
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy, retries: 0 }
    }

    /// Waits from `initial` doubling up to `max`, each shortened by a random share of up to
    /// `jitter` (`0.0..=1.0`) of itself.
    #[must_use]
    pub fn exponential(initial: Duration, max: Duration, jitter: f64) -> Self {
        Self::new(
            RetryPolicy::default()
                .backoff(initial)
                .max_backoff(max)
                .multiplier(2.0)
                .jitter(jitter),
        )
    }

    /// The wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        self.retries = self.retries.saturating_add(1);
        self.policy.jittered_delay(self.retries, self.policy.draw())
    }

    /// Back to the first wait, after a success.
    pub fn reset(&mut self) {
        self.retries = 0;
    }
}

/// `delay` shortened by a random share of up to `jitter` (`0.0..=1.0`, clamped) of itself:
/// with 0.5 ("equal jitter") a uniform draw from half of `delay` to all of it.
#[must_use]
pub fn jittered(delay: Duration, jitter: f64) -> Duration {
    let cut = (jitter * fastrand::f64()).clamp(0.0, 1.0);
    delay.mul_f64(1.0 - cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn doubles_to_the_cap_within_the_jitter_and_resets() {
        let mut backoff = Backoff::exponential(MS(100), Duration::from_secs(5), 0.5);
        for step in [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000] {
            let wait = backoff.next_delay();
            assert!(
                wait >= MS(step / 2) && wait <= MS(step),
                "{wait:?} for {step} ms"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= MS(100));
    }

    #[test]
    fn without_jitter_the_waits_are_exact() {
        let mut backoff = Backoff::exponential(MS(10), MS(35), 0.0);
        let waits: Vec<_> = (0..4).map(|_| backoff.next_delay()).collect();
        assert_eq!(waits, [MS(10), MS(20), MS(35), MS(35)]);
    }

    #[test]
    fn two_series_do_not_wait_in_lockstep() {
        let mut a = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(30), 0.25);
        let mut b = a.clone();
        let a: Vec<_> = (0..5).map(|_| a.next_delay()).collect();
        let b: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn jittered_stays_within_its_share() {
        for _ in 0..1_000 {
            let d = jittered(MS(100), 0.5);
            assert!(d >= MS(50) && d <= MS(100), "{d:?}");
            let d = jittered(MS(100), 0.25);
            assert!(d >= MS(75) && d <= MS(100), "{d:?}");
        }
        assert_eq!(jittered(Duration::ZERO, 0.5), Duration::ZERO);
        assert_eq!(jittered(MS(100), 0.0), MS(100));
    }
}
