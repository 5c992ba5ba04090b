//! [`NackBackoff`]: how long a negatively acknowledged message waits before the consumer asks
//! for it again, growing with its redelivery count.

use std::time::Duration;

use crate::Error;

/// The longest delay a [`NackBackoff`] may give: one day.
pub const MAX_NACK_DELAY: Duration = Duration::from_secs(24 * 3600);

/// How long [`Consumer::nack`](crate::Consumer::nack) waits before the message is asked for
/// again (the Java client's `negativeAckRedeliveryBackoff`, `MultiplierRedeliveryBackoff`):
/// `min × multiplier^redelivery_count`, at most `max`. A message nacked by id
/// ([`Consumer::nack_id`](crate::Consumer::nack_id)), whose count the consumer does not know,
/// waits `min`.
///
/// Without one (the default here) a nack asks at once; the Java client's default is a fixed
/// minute ([`NackBackoff::fixed`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct NackBackoff {
    min: Duration,
    max: Duration,
    multiplier: f64,
}

impl NackBackoff {
    /// The same delay for every nack (the Java client's `negativeAckRedeliveryDelay`).
    pub fn fixed(delay: Duration) -> Self {
        Self {
            min: delay,
            max: delay,
            multiplier: 1.0,
        }
    }

    /// `min × multiplier^redelivery_count`, at most `max` (the Java client's
    /// `MultiplierRedeliveryBackoff`, whose defaults are 1 s, 60 s and 2).
    pub fn exponential(min: Duration, max: Duration, multiplier: f64) -> Self {
        Self {
            min,
            max,
            multiplier,
        }
    }

    /// The delay of a message nacked after `redelivery_count` redeliveries.
    pub fn delay_for(&self, redelivery_count: u32) -> Duration {
        let factor = self
            .multiplier
            .powi(i32::try_from(redelivery_count).unwrap_or(i32::MAX));
        let millis = self.min.as_secs_f64() * factor;
        if !millis.is_finite() || millis >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::from_secs_f64(millis).clamp(self.min, self.max)
    }

    /// [`Error::Invalid`] naming what is wrong: `min` above `max`, `max` above
    /// [`MAX_NACK_DELAY`], a multiplier below 1 or not finite.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::Invalid {
                what: "nack_backoff",
                reason,
            })
        };
        if self.min > self.max {
            return invalid(format!(
                "the minimum {:?} is above the maximum {:?}",
                self.min, self.max
            ));
        }
        if self.max > MAX_NACK_DELAY {
            return invalid(format!(
                "the maximum {:?} is above {MAX_NACK_DELAY:?}",
                self.max
            ));
        }
        if !self.multiplier.is_finite() || self.multiplier < 1.0 {
            return invalid(format!(
                "the multiplier {} is not a finite number of at least 1",
                self.multiplier
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_by_the_multiplier_up_to_the_maximum() {
        let backoff =
            NackBackoff::exponential(Duration::from_secs(1), Duration::from_secs(60), 2.0);
        let delays: Vec<u64> = (0..8)
            .map(|count| backoff.delay_for(count).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff.delay_for(u32::MAX), Duration::from_secs(60));
        let fixed = NackBackoff::fixed(Duration::from_millis(300));
        assert_eq!(fixed.delay_for(9), Duration::from_millis(300));
    }

    proptest::proptest! {
        /// Every valid backoff gives delays within its bounds that never shrink as the
        /// redelivery count grows.
        #[test]
        fn delays_stay_within_bounds_and_never_shrink(
            min_ms in 0u64..100_000,
            span_ms in 0u64..10_000_000,
            multiplier in 1.0f64..10.0,
            count in 0u32..200,
        ) {
            let (min, max) = (
                Duration::from_millis(min_ms),
                Duration::from_millis(min_ms + span_ms),
            );
            let backoff = NackBackoff::exponential(min, max, multiplier);
            proptest::prop_assume!(backoff.validate().is_ok());
            let (now, next) = (backoff.delay_for(count), backoff.delay_for(count + 1));
            proptest::prop_assert!(min <= now && now <= max, "{now:?}");
            proptest::prop_assert!(now <= next, "{now:?} then {next:?}");
        }
    }

    #[test]
    fn impossible_backoffs_are_refused_with_the_reason() {
        let second = Duration::from_secs(1);
        for (backoff, says) in [
            (
                NackBackoff::exponential(second * 2, second, 2.0),
                "above the maximum",
            ),
            (NackBackoff::fixed(MAX_NACK_DELAY * 2), "above"),
            (
                NackBackoff::exponential(second, second * 2, 0.5),
                "multiplier",
            ),
            (
                NackBackoff::exponential(second, second * 2, f64::NAN),
                "multiplier",
            ),
        ] {
            let error = backoff.validate().expect_err("refused");
            assert!(error.to_string().contains(says), "{error}");
        }
        assert!(NackBackoff::fixed(Duration::ZERO).validate().is_ok());
    }
}
