//! Exponential backoff with jitter, for retries of lookups and (re)connections.
//!
//! The first retry waits about [`INITIAL`] (100 ms, the Java client's initial backoff: a
//! broker that is unloading a bundle or starting usually answers within a few hundred
//! milliseconds), each next one twice as long, up to [`MAX`] (30 s: long enough not to load a
//! broker that is down, short enough that a client notices one that is back within half a
//! minute). Every delay is drawn from [75 %, 100 %] of its step, so that clients that lost
//! the same broker do not come back in lockstep.

use std::time::Duration;

/// The first delay.
pub const INITIAL: Duration = Duration::from_millis(100);

/// The longest delay.
pub const MAX: Duration = Duration::from_secs(30);

/// The longest delay between two attempts of a producer or consumer to register again
/// after losing its broker: 5 s, so that once the broker is back (a restart takes 10 to 25 s)
/// the client notices within 5 s and the sends that waited still make their 30 s send
/// timeout; an attempt while the broker is down is a refused TCP connect, cheap for both.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The delays of one series of retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    step: Duration,
    max: Duration,
    /// The jitter, from a generator of its own (seeded from the thread's), so that clients
    /// do not draw alike.
    rng: fastrand::Rng,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX)
    }
}

impl Backoff {
    /// Delays from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            step: initial.min(max),
            max,
            rng: fastrand::Rng::new(),
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let fraction = 0.75 + 0.25 * self.rng.f64();
        let delay = self.step.mul_f64(fraction);
        self.step = (self.step * 2).min(self.max);
        delay
    }
}

/// A link (a registration, a subscription) that ends sooner than this after it was made
/// counts as one more failed attempt.
pub(crate) const SHORT_LIVED: Duration = Duration::from_secs(1);

/// The backoff of reconnections, kept across links that end at once: a broker that closes
/// a producer or consumer right after each registration is not asked again in a tight loop.
#[derive(Debug)]
pub(crate) struct Retries {
    backoff: Backoff,
    linked_at: tokio::time::Instant,
}

impl Retries {
    /// Linked now.
    pub(crate) fn new() -> Self {
        Self {
            backoff: Backoff::new(INITIAL, RECONNECT_MAX),
            linked_at: tokio::time::Instant::now(),
        }
    }

    /// The link was lost: how long to wait before the first attempt (none after a link that
    /// lasted, which starts a new series).
    pub(crate) fn after_loss(&mut self) -> Duration {
        if self.linked_at.elapsed() >= SHORT_LIVED {
            self.backoff = Backoff::new(INITIAL, RECONNECT_MAX);
            Duration::ZERO
        } else {
            self.backoff.next_delay()
        }
    }

    /// An attempt failed: how long to wait before the next.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.backoff.next_delay()
    }

    /// A new link was made.
    pub(crate) fn linked(&mut self) {
        self.linked_at = tokio::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_maximum_with_jitter_below_each_step() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let steps = [100, 200, 400, 800, 1000, 1000];
        for step in steps {
            let step = Duration::from_millis(step);
            let delay = backoff.next_delay();
            assert!(
                delay <= step && delay >= step.mul_f64(0.75),
                "{delay:?} for {step:?}"
            );
        }
    }

    #[test]
    fn two_clients_do_not_wait_alike() {
        let mut a = Backoff::new(INITIAL, MAX);
        let mut b = Backoff {
            rng: fastrand::Rng::with_seed(a.rng.get_seed() ^ 0xdead_beef),
            ..a.clone()
        };
        let a: Vec<_> = (0..5).map(|_| a.next_delay()).collect();
        let b: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_ne!(a, b);
    }
}
