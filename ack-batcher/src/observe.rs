//! Observability: the [`Observer`] hook, the [`Stats`] snapshot and the [`CloseReport`].

use std::time::Duration;

use crate::{FlushReason, ItemReply};

/// The observer as the batcher stores it.
pub(crate) type SharedObserver<K, T, F> = std::sync::Arc<
    dyn Observer<K, T, <F as crate::Flush<K, T>>::Output, <F as crate::Flush<K, T>>::Error>,
>;

/// One batch as an observer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchInfo {
    /// Unique per batcher. A batch that fills over time gets its id when its first item
    /// arrives; immediate and retry batches get theirs when they are created. Ids therefore
    /// follow the order batches were started, not the order they were flushed.
    pub id: u64,
    /// Why the batch was flushed.
    pub reason: FlushReason,
    /// How many items it holds.
    pub len: usize,
}

/// What happens next to an item after a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Next {
    /// Its outcome was delivered to its future.
    Resolved,
    /// It will be sent again, alone, after this wait.
    Retry {
        /// The backoff before the retry.
        after: Duration,
    },
}

/// One item of a flushed batch with its own reply.
#[derive(Debug)]
#[non_exhaustive]
pub struct ItemView<'a, T, O, E> {
    /// The item as submitted.
    pub item: &'a T,
    /// What the transport answered for it (a whole-batch error appears as `Err` on every item).
    pub reply: &'a ItemReply<O, E>,
    /// Which attempt this was (1 for the first).
    pub attempt: u32,
    /// What the batcher does with it now.
    pub next: Next,
}

/// Hooks that see every item of every batch. Called on the flushing task, outside the
/// batcher's locks, so an observer may call back into the batcher; keep them cheap.
pub trait Observer<K, T, O, E>: Send + Sync + 'static {
    /// Called right before the transport is asked to flush `items`.
    fn before_flush(&self, key: &K, batch: &BatchInfo, items: &[T]) {
        let _ = (key, batch, items);
    }

    /// Called after the transport answered, with one view per item, before the items' futures
    /// are resolved.
    fn after_flush(&self, key: &K, batch: &BatchInfo, items: &[ItemView<'_, T, O, E>]) {
        let _ = (key, batch, items);
    }

    /// The retry budget ([`crate::RetryBudget`]) held these `items` of `key` back until their
    /// next attempt would have started after their deadline; they resolve to their last
    /// failure.
    fn on_given_up(&self, key: &K, items: &[T]) {
        let _ = (key, items);
    }

    /// The transport panicked on `batch`; its `items` fail with
    /// [`crate::Error::Panicked`] carrying `message` and are not retried.
    fn on_panicked(&self, key: &K, batch: &BatchInfo, items: &[T], message: &str) {
        let _ = (key, batch, items, message);
    }

    /// Called when `count` items of `key` were abandoned by a `close` that ran out of time.
    fn on_abandoned(&self, key: &K, count: usize) {
        let _ = (key, count);
    }
}

/// Batch sizes in power-of-two buckets: bucket `i` counts batches of `2^i ..= 2^(i+1) - 1`
/// items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchSizeHistogram {
    buckets: [u64; 21],
}

impl BatchSizeHistogram {
    pub(crate) fn record(&mut self, len: usize) {
        let bucket = (usize::BITS - 1 - len.max(1).leading_zeros()) as usize;
        self.buckets[bucket.min(self.buckets.len() - 1)] += 1;
    }

    /// Non-empty buckets as `(smallest size, largest size, batches)`.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (1 << i, (1 << (i + 1)) - 1, *n))
    }

    /// The number of batches recorded.
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// A snapshot of the batcher's counters, from [`crate::Batcher::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Batches flushed, per reason, in the order of [`FlushReason::ALL`].
    pub batches_by_reason: [u64; 7],
    /// Items accepted.
    pub items_submitted: u64,
    /// Items whose future got a success.
    pub items_succeeded: u64,
    /// Items whose future got a failure (terminal, retries exhausted or missing).
    pub items_failed: u64,
    /// Items abandoned by a `close` that ran out of time.
    pub items_abandoned: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Of `items_failed`, the items whose last failure the transport marked not retryable
    /// (the rest ran out of attempts or deadline, or were missing).
    pub terminal_failures: u64,
    /// Replies that were missing from the transport's answer.
    pub missing_replies: u64,
    /// Replies beyond the batch's length, ignored.
    pub extra_replies: u64,
    /// Flushes during which the transport panicked (their items failed with
    /// [`crate::Error::Panicked`]).
    pub flush_panics: u64,
    /// Retry entries the retry budget held back for another backoff (an item held back
    /// twice counts twice).
    pub retries_deferred: u64,
    /// Flushes that ran past the builder's `flush_timeout` (their items counted as missing
    /// replies and were retried within the policy).
    pub flush_timeouts: u64,
    /// Items accepted and not yet resolved (open batches, queued, in flight, awaiting retry).
    pub pending: usize,
    /// Batches being flushed right now.
    pub in_flight: usize,
    /// Sealed batches waiting for a free in-flight slot of their key.
    pub queued: usize,
    /// Items waiting for a retry.
    pub awaiting_retry: usize,
    /// Keys currently holding memory (an open, queued or in-flight batch).
    pub keys: usize,
    /// Sizes of the batches flushed.
    pub batch_sizes: BatchSizeHistogram,
}

impl Stats {
    /// Batches flushed for `reason`.
    pub fn batches(&self, reason: FlushReason) -> u64 {
        self.batches_by_reason[reason.index()]
    }

    /// Batches flushed for any reason.
    pub fn total_batches(&self) -> u64 {
        self.batches_by_reason.iter().sum()
    }
}

/// One line: the batches by reason (by name, nonzero ones only), then the item counts.
///
/// ```
/// let stats = ack_batcher::Stats::default();
/// assert_eq!(
///     stats.to_string(),
///     "batches: none; items: 0 submitted, 0 succeeded, 0 failed, 0 abandoned, 0 retries, 0 pending"
/// );
/// ```
impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("batches: ")?;
        let mut any = false;
        for reason in FlushReason::ALL {
            let count = self.batches(reason);
            if count > 0 {
                write!(f, "{}{reason} {count}", if any { ", " } else { "" })?;
                any = true;
            }
        }
        if !any {
            f.write_str("none")?;
        }
        write!(
            f,
            "; items: {} submitted, {} succeeded, {} failed, {} abandoned, {} retries, {} pending",
            self.items_submitted,
            self.items_succeeded,
            self.items_failed,
            self.items_abandoned,
            self.retries,
            self.pending
        )?;
        if self.flush_panics + self.flush_timeouts + self.retries_deferred > 0 {
            write!(
                f,
                "; {} flush panics, {} flush timeouts, {} retries deferred by the budget",
                self.flush_panics, self.flush_timeouts, self.retries_deferred
            )?;
        }
        Ok(())
    }
}

/// What [`crate::Batcher::close`] did with the items that were pending when it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseReport {
    /// Items pending when close started.
    pub pending_at_close: usize,
    /// Of those, items that succeeded.
    pub succeeded: u64,
    /// Of those, items that failed.
    pub failed: u64,
    /// Of those, items abandoned because the timeout passed (their futures got
    /// [`crate::Error::Abandoned`]).
    pub abandoned: u64,
    /// Whether the timeout passed before everything resolved.
    pub timed_out: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let mut h = BatchSizeHistogram::default();
        for len in [1, 2, 3, 4, 1024, 1025, 2047, 2048] {
            h.record(len);
        }
        let buckets: Vec<_> = h.buckets().collect();
        assert_eq!(
            buckets,
            [
                (1, 1, 1),
                (2, 3, 2),
                (4, 7, 1),
                (1024, 2047, 3),
                (2048, 4095, 1)
            ]
        );
        assert_eq!(h.total(), 8);
    }
}
