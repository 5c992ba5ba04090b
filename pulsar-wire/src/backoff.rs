//! Exponential backoff with jitter, for retries of lookups and (re)connections.
//!
//! The first retry waits about [`INITIAL`] (100 ms, the Java client's initial backoff: a
//! broker that is unloading a bundle or starting usually answers within a few hundred
//! milliseconds), each next one twice as long, up to [`MAX`] (30 s: long enough not to load a
//! broker that is down, short enough that a client notices one that is back within half a
//! minute). Every delay is drawn from [75 %, 100 %] of its step, so that clients that lost
//! the same broker do not come back in lockstep.

use std::time::Duration;

use ack_batcher::Backoff;

/// The first delay.
pub(crate) const INITIAL: Duration = Duration::from_millis(100);

/// The longest delay.
pub(crate) const MAX: Duration = Duration::from_secs(30);

/// The longest delay between two attempts of a producer or consumer to register again
/// after losing its broker: 5 s, so that once the broker is back (a restart takes 10 to 25 s)
/// the client notices within 5 s and the sends that waited still make their 30 s send
/// timeout; an attempt while the broker is down is a refused TCP connect, cheap for both.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The random share of each delay: delays are drawn from [75 %, 100 %] of their step.
const JITTER: f64 = 0.25;

/// Delays from `initial` doubling up to `max`, with jitter: `ack_batcher`'s [`Backoff`], the
/// rule the ack batcher's own retries follow.
pub(crate) fn exponential(initial: Duration, max: Duration) -> Backoff {
    Backoff::exponential(initial.min(max), max, JITTER)
}

/// Lookups and connections: from [`INITIAL`] up to [`MAX`].
pub(crate) fn lookups() -> Backoff {
    exponential(INITIAL, MAX)
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
            backoff: exponential(INITIAL, RECONNECT_MAX),
            linked_at: tokio::time::Instant::now(),
        }
    }

    /// The link was lost: how long to wait before the first attempt (none after a link that
    /// lasted, which starts a new series).
    pub(crate) fn after_loss(&mut self) -> Duration {
        if self.linked_at.elapsed() >= SHORT_LIVED {
            self.backoff = exponential(INITIAL, RECONNECT_MAX);
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
        let mut backoff = exponential(Duration::from_millis(100), Duration::from_secs(1));
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
}
