//! The retry budget: retries limited to a share of recent first attempts plus a floor, so
//! that a failing server cannot make the batcher multiply its traffic.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::Error;

/// How many retry flushes the batcher may make, in the manner of tower's retry budget: over
/// the last `window`, at most `floor_per_second × window` retries plus `ratio` times the
/// batches flushed for the first time. A retry batch over the budget is not sent: it waits
/// for the retry policy's backoff and asks again, and its items resolve to their last
/// failure once the wait would pass their deadline.
///
/// The default (10 s, 0.2, 10 per second) lets a healthy batcher retry the odd failure at
/// once, while a server that fails everything sees at most 20 % more requests than without
/// retries, plus 10 per second. [`RetryBudget::unlimited`] turns it off.
///
/// ```
/// use std::time::Duration;
/// use ack_batcher::RetryBudget;
///
/// let budget = RetryBudget::default()
///     .window(Duration::from_secs(30))
///     .ratio(0.1)
///     .floor_per_second(2.0);
/// # let _ = budget;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBudget {
    pub(crate) window: Duration,
    pub(crate) ratio: f64,
    pub(crate) floor_per_second: f64,
    pub(crate) unlimited: bool,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            ratio: 0.2,
            floor_per_second: 10.0,
            unlimited: false,
        }
    }
}

impl RetryBudget {
    /// No budget: every retry the retry policy allows is sent.
    pub fn unlimited() -> Self {
        Self {
            unlimited: true,
            ..Self::default()
        }
    }

    /// How far back the budget looks (default 10 s; 1 s to 1 h).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Retries allowed per first-attempt batch in the window (default 0.2; 0 to 10).
    #[must_use]
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// Retries allowed per second of the window whatever else is flushed (default 10; 0 to
    /// 1,000,000).
    #[must_use]
    pub fn floor_per_second(mut self, floor: f64) -> Self {
        self.floor_per_second = floor;
        self
    }

    pub(crate) fn validate<E, T>(&self) -> Result<(), Error<E, T>> {
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.window) {
            return Err(Error::invalid(
                "retry_budget.window",
                format!("{:?} is not between 1 s and 1 h", self.window),
            ));
        }
        if !(self.ratio.is_finite() && (0.0..=10.0).contains(&self.ratio)) {
            return Err(Error::invalid(
                "retry_budget.ratio",
                format!("{} is not in 0.0..=10.0", self.ratio),
            ));
        }
        if !(self.floor_per_second.is_finite()
            && (0.0..=1_000_000.0).contains(&self.floor_per_second))
        {
            return Err(Error::invalid(
                "retry_budget.floor_per_second",
                format!("{} is not in 0.0..=1000000.0", self.floor_per_second),
            ));
        }
        Ok(())
    }
}

/// What the budget has seen: first-attempt and retry flushes in buckets of a tenth of the
/// window.
#[derive(Debug, Default)]
pub(crate) struct Spending {
    buckets: VecDeque<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    start: Instant,
    first: u64,
    retries: u64,
}

impl Spending {
    fn bucket(&mut self, now: Instant, budget: &RetryBudget) -> &mut Bucket {
        while self
            .buckets
            .front()
            .is_some_and(|b| b.start + budget.window <= now)
        {
            self.buckets.pop_front();
        }
        let width = budget.window / 10;
        let fresh = self.buckets.back().is_none_or(|b| b.start + width <= now);
        if fresh {
            self.buckets.push_back(Bucket {
                start: now,
                first: 0,
                retries: 0,
            });
        }
        self.buckets.back_mut().expect("a bucket was just ensured")
    }

    /// Counts a batch flushed for the first time.
    pub(crate) fn first_attempt(&mut self, now: Instant, budget: &RetryBudget) {
        if !budget.unlimited {
            self.bucket(now, budget).first += 1;
        }
    }

    /// Whether one more retry flush fits the budget; counts it if so.
    pub(crate) fn try_retry(&mut self, now: Instant, budget: &RetryBudget) -> bool {
        if budget.unlimited {
            return true;
        }
        self.bucket(now, budget);
        let (first, retries) = self
            .buckets
            .iter()
            .fold((0, 0), |(f, r), b| (f + b.first, r + b.retries));
        let allowed =
            budget.floor_per_second * budget.window.as_secs_f64() + budget.ratio * first as f64;
        if (retries + 1) as f64 > allowed {
            return false;
        }
        // The window was rolled and the current bucket made above.
        if let Some(bucket) = self.buckets.back_mut() {
            bucket.retries += 1;
        }
        true
    }
}

/// A [`RetryBudget`] being spent, for retry loops outside a batcher that should keep to the
/// same rule (a client's send retries, say): count every first attempt with
/// [`first_attempt`](Self::first_attempt) and ask [`try_retry`](Self::try_retry) before each
/// retry. Time is [`tokio::time::Instant`], so tests can pause it. Shared by reference; the
/// lock is held only to count.
#[derive(Debug)]
pub struct RetryAccount {
    budget: RetryBudget,
    spending: parking_lot::Mutex<Spending>,
}

impl Default for RetryAccount {
    /// An account of the default budget (10 s, 0.2, 10 per second).
    fn default() -> Self {
        Self {
            budget: RetryBudget::default(),
            spending: parking_lot::Mutex::new(Spending::default()),
        }
    }
}

impl RetryAccount {
    /// An account of `budget`, with nothing spent.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the budget's settings are out of range.
    pub fn new<E, T>(budget: RetryBudget) -> Result<Self, Error<E, T>> {
        budget.validate()?;
        Ok(Self {
            budget,
            spending: parking_lot::Mutex::new(Spending::default()),
        })
    }

    /// Counts a first attempt (it earns the budget's `ratio` of a retry).
    pub fn first_attempt(&self) {
        self.spending
            .lock()
            .first_attempt(Instant::now(), &self.budget);
    }

    /// Whether one more retry fits the budget now; counts it if so.
    pub fn try_retry(&self) -> bool {
        self.spending.lock().try_retry(Instant::now(), &self.budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_are_limited_to_the_floor_plus_a_share_of_first_attempts() {
        let budget = RetryBudget::default()
            .window(Duration::from_secs(10))
            .ratio(0.5)
            .floor_per_second(1.0);
        let mut spending = Spending::default();
        let now = Instant::now();
        for _ in 0..10 {
            spending.first_attempt(now, &budget);
        }
        // 1/s over 10 s, plus half of 10 first attempts.
        let granted = (0..100)
            .filter(|_| spending.try_retry(now, &budget))
            .count();
        assert_eq!(granted, 15);
        // Once the window has passed, the floor is available again.
        let later = now + Duration::from_secs(11);
        let granted = (0..100)
            .filter(|_| spending.try_retry(later, &budget))
            .count();
        assert_eq!(granted, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn an_account_keeps_to_its_budget() {
        let budget = RetryBudget::default().ratio(0.5).floor_per_second(1.0);
        let account = RetryAccount::new::<(), ()>(budget).unwrap();
        for _ in 0..10 {
            account.first_attempt();
        }
        assert_eq!((0..100).filter(|_| account.try_retry()).count(), 15);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!((0..100).filter(|_| account.try_retry()).count(), 10);
        let bad = RetryAccount::new::<(), ()>(RetryBudget::default().ratio(-1.0));
        assert!(matches!(bad, Err(Error::InvalidConfig { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_budget_grants_everything() {
        let mut spending = Spending::default();
        let now = Instant::now();
        assert!((0..10_000).all(|_| spending.try_retry(now, &RetryBudget::unlimited())));
    }
}
