//! The emulator's clock: tokio time (so paused test time works) plus a manual offset that
//! [`Emulator::advance`](super::Emulator::advance) moves forward.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Milliseconds since the emulator started, as seen by invisibility deadlines and receipt
/// handles. Never goes backwards.
#[derive(Debug)]
pub(crate) struct Clock {
    epoch: Instant,
    offset_ms: AtomicU64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            offset_ms: AtomicU64::new(0),
        }
    }

    /// Current emulator time in milliseconds.
    pub(crate) fn now_ms(&self) -> u64 {
        let real = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        real.saturating_add(self.offset_ms.load(Ordering::Acquire))
    }

    /// Moves the clock forward by `by` without waiting.
    pub(crate) fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .offset_ms
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_add(ms))
            });
    }
}

/// Saturating conversion of a duration to milliseconds.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Converts a protobuf duration to milliseconds; `None` when it is negative or out of range.
pub(crate) fn proto_duration_ms(d: &prost_types::Duration) -> Option<i64> {
    let secs = d.seconds.checked_mul(1000)?;
    secs.checked_add(i64::from(d.nanos) / 1_000_000)
}

/// A protobuf duration from milliseconds.
pub(crate) fn ms_to_proto(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_tokio_time_and_manual_advance() {
        let clock = Clock::new();
        assert_eq!(clock.now_ms(), 0);
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now_ms(), 1500);
        clock.advance(Duration::from_secs(10));
        assert_eq!(clock.now_ms(), 11_500);
    }

    #[test]
    fn proto_duration_conversions() {
        let d = ms_to_proto(61_250);
        assert_eq!((d.seconds, d.nanos), (61, 250_000_000));
        assert_eq!(proto_duration_ms(&d), Some(61_250));
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(proto_duration_ms(&huge), None);
        let neg = prost_types::Duration {
            seconds: -5,
            nanos: 0,
        };
        assert_eq!(proto_duration_ms(&neg), Some(-5000));
    }
}
