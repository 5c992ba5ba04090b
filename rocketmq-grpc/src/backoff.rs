//! Exponential backoff with jitter for every retry loop of the crate: the consumer's control
//! plane, receives and nacks, and the producer's telemetry stream and send retries. The series
//! is `ack_batcher`'s [`Backoff`], the rule the ack batcher's own retries follow.

use std::time::Duration;

use ack_batcher::Backoff;

/// Every wait is drawn uniformly from the upper half of its step ("equal jitter"), so that
/// clients that failed together (a proxy restart) do not come back together, and no wait is
/// shorter than half a step.
const JITTER: f64 = 0.5;

/// Waits doubling from `initial` (at least 1 ms) up to `max`, with equal jitter.
pub(crate) fn exponential(initial: Duration, max: Duration) -> Backoff {
    let initial = initial.max(Duration::from_millis(1));
    Backoff::exponential(initial, max.max(initial), JITTER)
}

/// `delay` with equal jitter: a draw from `[delay / 2, delay]`.
pub(crate) fn jitter(delay: Duration) -> Duration {
    ack_batcher::jittered(delay, JITTER)
}
