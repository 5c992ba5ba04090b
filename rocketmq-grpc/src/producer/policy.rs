//! The send retry policy: what the proxy announces on the telemetry stream, and the delays
//! between attempts.

use std::time::Duration;

use crate::pb;

/// Back-off between sends retries never grow beyond this past the policy's attempts (in the
/// retry window), unless the policy's own maximum is larger.
pub(crate) const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How long to wait between send attempts.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Backoff {
    /// `initial × multiplier^(n-1)` before attempt `n + 1`, at most `max`.
    Exponential {
        /// The delay after the first failed attempt.
        initial: Duration,
        /// The largest delay.
        max: Duration,
        /// The growth factor (values below 1 count as 1).
        multiplier: f32,
    },
    /// The `n`-th delay after the `n`-th failed attempt; the last one repeats.
    Customized(Vec<Duration>),
}

/// The producer's send retry policy: at most `max_attempts` attempts with `backoff` between
/// them (with jitter). The proxy announces one in answer to the producer's settings
/// (`Settings.backoff_policy`); [`SendRetryPolicy::default`] applies until it has.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SendRetryPolicy {
    /// Attempts in total, the first included (at least 1).
    pub max_attempts: u32,
    /// The delays between attempts.
    pub backoff: Backoff,
}

impl Default for SendRetryPolicy {
    /// 3 attempts, exponential back-off from 10 ms to 1 s with multiplier 2: what the
    /// open-source proxy announces by default (`ProxyConfig.grpcClientProducer*`) and the
    /// Java client's 3 attempts.
    fn default() -> Self {
        Self {
            max_attempts: 3,
            backoff: Backoff::Exponential {
                initial: Duration::from_millis(10),
                max: Duration::from_secs(1),
                multiplier: 2.0,
            },
        }
    }
}

impl SendRetryPolicy {
    /// A policy of `max_attempts` attempts (at least 1) with this back-off.
    pub fn new(max_attempts: u32, backoff: Backoff) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            backoff,
        }
    }

    /// The policy the proxy announced, or `None` when it is unusable (no strategy, no
    /// positive attempt count, or an out-of-range duration).
    pub(crate) fn from_pb(policy: &pb::RetryPolicy) -> Option<Self> {
        let max_attempts = u32::try_from(policy.max_attempts).ok().filter(|n| *n > 0)?;
        let duration = |d: &Option<prost_types::Duration>| -> Option<Duration> {
            d.map_or(Some(Duration::ZERO), |d| Duration::try_from(d).ok())
        };
        let backoff = match policy.strategy.as_ref()? {
            pb::retry_policy::Strategy::ExponentialBackoff(e) => {
                let initial = duration(&e.initial)?;
                let max = duration(&e.max)?.max(initial);
                let multiplier = if e.multiplier.is_finite() {
                    e.multiplier
                } else {
                    1.0
                };
                Backoff::Exponential {
                    initial,
                    max,
                    multiplier,
                }
            }
            pb::retry_policy::Strategy::CustomizedBackoff(c) => {
                let next: Option<Vec<Duration>> =
                    c.next.iter().map(|d| Duration::try_from(*d).ok()).collect();
                let next = next?;
                if next.is_empty() {
                    return None;
                }
                Backoff::Customized(next)
            }
        };
        Some(Self {
            max_attempts,
            backoff,
        })
    }

    /// This policy as the protocol's `RetryPolicy`.
    pub(crate) fn to_pb(&self) -> pb::RetryPolicy {
        let duration = |d: Duration| prost_types::Duration::try_from(d).ok();
        let strategy = match &self.backoff {
            Backoff::Exponential {
                initial,
                max,
                multiplier,
            } => pb::retry_policy::Strategy::ExponentialBackoff(pb::ExponentialBackoff {
                initial: duration(*initial),
                max: duration(*max),
                multiplier: *multiplier,
            }),
            Backoff::Customized(next) => {
                pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
                    next: next.iter().filter_map(|d| duration(*d)).collect(),
                })
            }
        };
        pb::RetryPolicy {
            max_attempts: i32::try_from(self.max_attempts).unwrap_or(i32::MAX),
            strategy: Some(strategy),
        }
    }

    /// The delay (before jitter) after failed attempt `attempt` (1-based). Within the
    /// policy's attempts it follows the back-off; past them (in the retry window) it keeps
    /// growing up to the larger of the policy's maximum and [`OUTAGE_BACKOFF_MAX`].
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let floor = if attempt.max(1) >= self.max_attempts {
            OUTAGE_BACKOFF_MAX
        } else {
            Duration::ZERO
        };
        self.grown(attempt, floor)
    }

    /// The policy's own delay after failed attempt `attempt` (1-based), capped at its maximum;
    /// also the consumer's redelivery delay after a delivery attempt, from the policy the
    /// proxy announces to consumers ([`PushConsumer::retry_policy`](crate::PushConsumer::retry_policy)).
    pub fn backoff_delay(&self, attempt: u32) -> Duration {
        self.grown(attempt, Duration::ZERO)
    }

    /// The back-off after `attempt`, its cap raised to at least `cap_floor`.
    fn grown(&self, attempt: u32, cap_floor: Duration) -> Duration {
        let attempt = attempt.max(1);
        match &self.backoff {
            Backoff::Exponential {
                initial,
                max,
                multiplier,
            } => {
                let cap = (*max).max(cap_floor);
                let factor = f64::from(multiplier.max(1.0))
                    .powi(i32::try_from(attempt - 1).unwrap_or(i32::MAX).min(1_000));
                let nanos = initial.as_secs_f64() * factor;
                if !nanos.is_finite() || nanos >= cap.as_secs_f64() {
                    cap
                } else {
                    Duration::from_secs_f64(nanos).min(cap)
                }
            }
            Backoff::Customized(next) => {
                let index = usize::try_from(attempt - 1)
                    .unwrap_or(usize::MAX)
                    .min(next.len().saturating_sub(1));
                next.get(index).copied().unwrap_or(Duration::ZERO)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_default_is_the_proxys_policy() {
        let policy = SendRetryPolicy::default();
        assert_eq!(policy.max_attempts, 3);
        assert_eq!(policy.delay(1), ms(10));
        assert_eq!(policy.delay(2), ms(20));
        // Past the attempts (in the retry window) it grows to the outage cap.
        assert_eq!(policy.delay(3), ms(40));
        assert_eq!(policy.delay(8), ms(1280));
        assert_eq!(policy.delay(9), OUTAGE_BACKOFF_MAX);
        assert_eq!(policy.delay(u32::MAX), OUTAGE_BACKOFF_MAX);
        let round = SendRetryPolicy::from_pb(&policy.to_pb()).unwrap();
        assert_eq!(round, policy);
    }

    #[test]
    fn within_the_attempts_the_policy_maximum_caps() {
        let policy = SendRetryPolicy::new(
            10,
            Backoff::Exponential {
                initial: ms(100),
                max: ms(300),
                multiplier: 2.0,
            },
        );
        assert_eq!(
            (1..=4).map(|n| policy.delay(n)).collect::<Vec<_>>(),
            [ms(100), ms(200), ms(300), ms(300)]
        );
    }

    #[test]
    fn customized_repeats_its_last_delay() {
        let policy = SendRetryPolicy::new(5, Backoff::Customized(vec![ms(1), ms(5)]));
        assert_eq!(policy.delay(1), ms(1));
        assert_eq!(policy.delay(2), ms(5));
        assert_eq!(policy.delay(7), ms(5));
    }

    #[test]
    fn unusable_announcements_are_ignored() {
        let mut pb = SendRetryPolicy::default().to_pb();
        pb.max_attempts = 0;
        assert!(SendRetryPolicy::from_pb(&pb).is_none());
        pb.max_attempts = 2;
        pb.strategy = None;
        assert!(SendRetryPolicy::from_pb(&pb).is_none());
        pb.strategy = Some(pb::retry_policy::Strategy::CustomizedBackoff(
            pb::CustomizedBackoff { next: vec![] },
        ));
        assert!(SendRetryPolicy::from_pb(&pb).is_none());
        pb.strategy = Some(pb::retry_policy::Strategy::CustomizedBackoff(
            pb::CustomizedBackoff {
                next: vec![prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }],
            },
        ));
        assert!(SendRetryPolicy::from_pb(&pb).is_none());
        let nan = pb::RetryPolicy {
            max_attempts: 2,
            strategy: Some(pb::retry_policy::Strategy::ExponentialBackoff(
                pb::ExponentialBackoff {
                    initial: None,
                    max: None,
                    multiplier: f32::NAN,
                },
            )),
        };
        let policy = SendRetryPolicy::from_pb(&nan).unwrap();
        assert_eq!(policy.delay(1), Duration::ZERO);
    }
}
