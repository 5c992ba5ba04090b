//! Settings: the builder, the retry policy and the backpressure choice, all validated on build.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::observe::SharedObserver;
use crate::{Error, Flush, Observer, RetryBudget};

/// What happens when a new item arrives while the batcher already holds `max_pending` items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backpressure {
    /// [`Batcher::submit`](crate::Batcher::submit) and [`Batcher::enqueue`](crate::Batcher::enqueue) wait (first come, first served) until
    /// earlier items resolve. This is the default: nothing is refused, callers slow down.
    #[default]
    Wait,
    /// The item is refused at once with [`Error::Full`], which hands it back.
    Reject,
}

/// How items that failed retryably are sent again.
///
/// A retry waits a backoff that grows exponentially with the item's attempts, capped at
/// `max_backoff`, and shortened by a random share of up to `jitter` of itself, so that clients
/// that failed together do not come back together. Retries of one key that are due together
/// go out as one batch (up to `max_items`); they never hold up fresh items or other keys. An
/// item stops being retried when it has been sent `max_attempts` times, or when the next
/// attempt would start after the item's deadline.
///
/// The items of one failed batch draw one jitter together, so their retries stay due together
/// and are sent again as one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(crate) backoff: Duration,
    pub(crate) multiplier: f64,
    pub(crate) max_backoff: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) jitter: f64,
}

impl Default for RetryPolicy {
    /// Exponential backoff with jitter: 100 ms doubling per retry up to 10 s, each wait
    /// shortened by a random share of up to half of itself; at most 3 attempts in all.
    fn default() -> Self {
        Self {
            backoff: Duration::from_millis(100),
            multiplier: 2.0,
            max_backoff: Duration::from_secs(10),
            max_attempts: 3,
            jitter: 0.5,
        }
    }
}

impl RetryPolicy {
    /// Never retry: every failure is final.
    pub fn never() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The wait before the first retry, before jitter (default 100 ms).
    #[must_use]
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// Growth of the backoff per retry (default 2.0: doubling). 1.0 keeps it constant.
    #[must_use]
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The longest backoff that growth can reach (default 10 s).
    #[must_use]
    pub fn max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// How many times an item is sent at most, the first attempt included (default 3; 1 means
    /// no retries). Items with a deadline also stop at their deadline.
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The share of each wait that is random, in `0.0..=1.0` (default 0.5): a wait of `d` becomes
    /// a uniform draw from `d * (1 - jitter)` to `d`. 0.0 turns jitter off (every wait exactly
    /// [`delay_for`](Self::delay_for)); 1.0 is "full jitter", from 0 to `d`.
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The longest wait before retry number `retry` (1 for the first retry): the backoff grown
    /// by the multiplier and capped, before jitter shortens it.
    pub fn delay_for(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(64) as i32;
        let secs = self.backoff.as_secs_f64() * self.multiplier.powi(exponent);
        if secs.is_finite() && secs < self.max_backoff.as_secs_f64() {
            Duration::from_secs_f64(secs)
        } else {
            self.max_backoff
        }
    }

    /// The wait before retry number `retry` for a jitter draw `unit` in `0.0..1.0`:
    /// [`delay_for`](Self::delay_for) shortened by `jitter * unit` of itself.
    pub fn jittered_delay(&self, retry: u32, unit: f64) -> Duration {
        let cut = (self.jitter * unit.clamp(0.0, 1.0)).clamp(0.0, 1.0);
        self.delay_for(retry).mul_f64(1.0 - cut)
    }

    /// A jitter draw for [`jittered_delay`](Self::jittered_delay): 0.0 when jitter is off.
    pub(crate) fn draw(&self) -> f64 {
        if self.jitter > 0.0 {
            fastrand::f64()
        } else {
            0.0
        }
    }

    fn validate<E, T>(&self) -> Result<(), Error<E, T>> {
        if !(self.jitter.is_finite() && (0.0..=1.0).contains(&self.jitter)) {
            return Err(Error::invalid(
                "retry.jitter",
                format!("{} is not in 0.0..=1.0", self.jitter),
            ));
        }
        check_duration("retry.backoff", self.backoff)?;
        check_duration("retry.max_backoff", self.max_backoff)?;
        if !(self.multiplier.is_finite() && (1.0..=10.0).contains(&self.multiplier)) {
            return Err(Error::invalid(
                "retry.multiplier",
                format!("{} is not in 1.0..=10.0", self.multiplier),
            ));
        }
        if self.max_backoff < self.backoff {
            return Err(Error::invalid(
                "retry.max_backoff",
                format!(
                    "{:?} is shorter than the backoff {:?}",
                    self.max_backoff, self.backoff
                ),
            ));
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(Error::invalid(
                "retry.max_attempts",
                format!("{} is not in 1..={MAX_ATTEMPTS}", self.max_attempts),
            ));
        }
        Ok(())
    }
}

const MAX_ATTEMPTS: u32 = 10_000;
const MAX_ITEMS: usize = 1 << 20;
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

fn check_duration<E, T>(setting: &'static str, value: Duration) -> Result<(), Error<E, T>> {
    if value.is_zero() || value > MAX_DURATION {
        return Err(Error::invalid(
            setting,
            format!("{value:?} is not between 1 ns and 24 h"),
        ));
    }
    Ok(())
}

/// Validated settings shared by the batcher's parts.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_items: usize,
    pub(crate) max_delay: Duration,
    pub(crate) deadline_margin: Duration,
    pub(crate) max_in_flight_per_key: usize,
    pub(crate) max_pending: usize,
    pub(crate) backpressure: Backpressure,
    pub(crate) retry: RetryPolicy,
    pub(crate) drop_timeout: Duration,
    pub(crate) flush_timeout: Option<Duration>,
    pub(crate) retry_budget: RetryBudget,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_items: 1024,
            max_delay: Duration::from_secs(5),
            deadline_margin: Duration::from_secs(1),
            max_in_flight_per_key: 4,
            max_pending: 65_536,
            backpressure: Backpressure::Wait,
            retry: RetryPolicy::default(),
            drop_timeout: Duration::from_secs(10),
            flush_timeout: None,
            retry_budget: RetryBudget::default(),
        }
    }
}

impl Settings {
    pub(crate) fn validate<E, T>(&self) -> Result<(), Error<E, T>> {
        if !(1..=MAX_ITEMS).contains(&self.max_items) {
            return Err(Error::invalid(
                "max_items",
                format!("{} is not in 1..={MAX_ITEMS}", self.max_items),
            ));
        }
        check_duration("max_delay", self.max_delay)?;
        if self.deadline_margin > MAX_DURATION {
            return Err(Error::invalid(
                "deadline_margin",
                format!("{:?} is longer than 24 h", self.deadline_margin),
            ));
        }
        if !(1..=1024).contains(&self.max_in_flight_per_key) {
            return Err(Error::invalid(
                "max_in_flight_per_key",
                format!("{} is not in 1..=1024", self.max_in_flight_per_key),
            ));
        }
        let max_pending = tokio::sync::Semaphore::MAX_PERMITS;
        if !(self.max_items..=max_pending).contains(&self.max_pending) {
            return Err(Error::invalid(
                "max_pending",
                format!(
                    "{} is not in max_items ({})..={max_pending}: a batch could never fill",
                    self.max_pending, self.max_items
                ),
            ));
        }
        check_duration("drop_timeout", self.drop_timeout)?;
        if let Some(timeout) = self.flush_timeout {
            check_duration("flush_timeout", timeout)?;
        }
        self.retry_budget.validate()?;
        self.retry.validate()
    }
}

/// Builds a [`Batcher`](crate::Batcher); every setting has a default and is checked by [`Builder::build`].
///
/// ```
/// # use std::time::Duration;
/// # use ack_batcher::{Batcher, Flush, FlushResult, ItemReply, Retryable, RetryPolicy};
/// # #[derive(Debug, Clone)] struct E;
/// # impl Retryable for E { fn is_retryable(&self) -> bool { false } }
/// # struct Sink;
/// # impl Flush<u8, u8> for Sink {
/// #     type Output = (); type Error = E;
/// #     async fn flush(&self, _: &u8, i: &[u8]) -> FlushResult<(), E> {
/// #         Ok(i.iter().map(|_| ItemReply::Ok(())).collect())
/// #     }
/// # }
/// # #[tokio::main] async fn main() {
/// let batcher = Batcher::builder()
///     .max_items(100)
///     .max_delay(Duration::from_millis(100))
///     .retry(RetryPolicy::default().multiplier(2.0).max_attempts(5))
///     .build(Sink)
///     .expect("valid settings");
/// # drop(batcher); }
/// ```
pub struct Builder<K, T, F: Flush<K, T>> {
    pub(crate) settings: Settings,
    pub(crate) observer: Option<SharedObserver<K, T, F>>,
}

impl<K, T, F: Flush<K, T>> fmt::Debug for Builder<K, T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("settings", &self.settings)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl<K, T, F: Flush<K, T>> Default for Builder<K, T, F> {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            observer: None,
        }
    }
}

impl<K, T, F> Builder<K, T, F>
where
    K: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    /// The most items in one batch (default 1,024). A batch that reaches it is flushed at once.
    #[must_use]
    pub fn max_items(mut self, max_items: usize) -> Self {
        self.settings.max_items = max_items;
        self
    }

    /// The longest one flush may take (default: no limit). A flush still running then is
    /// dropped (the transport's future is cancelled, see [`Flush`]'s `# Cancellation`) and
    /// its items count as answered without a result ([`crate::ItemReply::Missing`]): they are
    /// retried within the retry policy and resolve to [`Error::Missing`] once it runs out.
    #[must_use]
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.settings.flush_timeout = Some(timeout);
        self
    }

    /// The longest an item waits for its batch to fill, counted from the batch's first item
    /// (default 5 s).
    #[must_use]
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.settings.max_delay = max_delay;
        self
    }

    /// How long before an item's deadline its batch is flushed at the latest (default 1 s).
    /// An item whose deadline is already within the margin is flushed at once.
    #[must_use]
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.settings.deadline_margin = margin;
        self
    }

    /// The most batches of one key being flushed at once (default 4). Further batches of that
    /// key wait, in order. 1 keeps every key's batches strictly one after another.
    #[must_use]
    pub fn max_in_flight_per_key(mut self, limit: usize) -> Self {
        self.settings.max_in_flight_per_key = limit;
        self
    }

    /// The most items the batcher holds at once across all keys, from acceptance until their
    /// outcome is delivered, retries included (default 65,536). It bounds memory.
    #[must_use]
    pub fn max_pending(mut self, limit: usize) -> Self {
        self.settings.max_pending = limit;
        self
    }

    /// What a new item meets when `max_pending` is reached (default [`Backpressure::Wait`]).
    #[must_use]
    pub fn backpressure(mut self, backpressure: Backpressure) -> Self {
        self.settings.backpressure = backpressure;
        self
    }

    /// How retryable failures are retried (default [`RetryPolicy::default`]).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.settings.retry = retry;
        self
    }

    /// Limits retries to a share of recent first attempts plus a floor (default
    /// [`RetryBudget::default`]: over 10 s, 20 % of first-attempt batches plus 10 per second);
    /// [`RetryBudget::unlimited`] turns it off.
    #[must_use]
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.settings.retry_budget = budget;
        self
    }

    /// How long a batcher dropped without [`Batcher::close`](crate::Batcher::close) keeps flushing and retrying in
    /// the background before it abandons what is left (default 10 s).
    #[must_use]
    pub fn drop_timeout(mut self, timeout: Duration) -> Self {
        self.settings.drop_timeout = timeout;
        self
    }

    /// Adds an observer that sees every item of every batch with its own reply.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn Observer<K, T, F::Output, F::Error>>) -> Self {
        self.observer = Some(observer);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy::default()
            .backoff(Duration::from_millis(100))
            .multiplier(2.0)
            .max_backoff(Duration::from_millis(500));
        let delays: Vec<_> = (1..=5).map(|r| p.delay_for(r).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        let default = RetryPolicy::default();
        let delays: Vec<_> = (1..=9).map(|r| default.delay_for(r).as_millis()).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000],
            "the default backoff doubles from 100 ms up to 10 s"
        );
    }

    #[test]
    fn jitter_shortens_each_wait_by_at_most_its_share() {
        let p = RetryPolicy::default();
        assert_eq!(p.jittered_delay(3, 0.0), Duration::from_millis(400));
        assert_eq!(p.jittered_delay(3, 0.5), Duration::from_millis(300));
        assert_eq!(p.jittered_delay(3, 0.999_999).as_millis(), 200);
        let off = p.clone().jitter(0.0);
        assert_eq!(off.jittered_delay(3, 0.9), Duration::from_millis(400));
        assert_eq!(off.draw(), 0.0);
        let full = p.clone().jitter(1.0);
        assert_eq!(full.jittered_delay(3, 0.5), Duration::from_millis(200));
        let draws: Vec<f64> = (0..1000).map(|_| p.draw()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let low = draws.iter().filter(|u| **u < 0.5).count();
        assert!((350..650).contains(&low), "{low} of 1000 draws below 0.5");
    }

    #[test]
    fn invalid_settings_name_the_setting() {
        let bad: [(Settings, &str); 8] = [
            (
                Settings {
                    max_items: 0,
                    ..Settings::default()
                },
                "max_items",
            ),
            (
                Settings {
                    max_delay: Duration::ZERO,
                    ..Settings::default()
                },
                "max_delay",
            ),
            (
                Settings {
                    max_delay: Duration::from_secs(365 * 24 * 3600),
                    ..Settings::default()
                },
                "max_delay",
            ),
            (
                Settings {
                    max_in_flight_per_key: 0,
                    ..Settings::default()
                },
                "max_in_flight_per_key",
            ),
            (
                Settings {
                    max_pending: 10,
                    ..Settings::default()
                },
                "max_pending",
            ),
            (
                Settings {
                    retry: RetryPolicy::default().max_attempts(0),
                    ..Settings::default()
                },
                "retry.max_attempts",
            ),
            (
                Settings {
                    retry: RetryPolicy::default().multiplier(f64::NAN),
                    ..Settings::default()
                },
                "retry.multiplier",
            ),
            (
                Settings {
                    retry: RetryPolicy::default().jitter(1.5),
                    ..Settings::default()
                },
                "retry.jitter",
            ),
        ];
        for (settings, expected) in bad {
            match settings.validate::<(), ()>() {
                Err(Error::InvalidConfig { setting, reason }) => {
                    assert_eq!(setting, expected, "{reason}");
                    assert!(!reason.is_empty());
                }
                other => panic!("{expected}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(Settings::default().validate::<(), ()>().is_ok());
    }
}
