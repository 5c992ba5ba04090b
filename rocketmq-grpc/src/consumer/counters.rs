//! The consumer's own counters (those of its stats that are not the ack batcher's).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by the consumer's tasks.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) consumed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) ack_failed: AtomicU64,
    pub(super) ack_abandoned: AtomicU64,
    pub(super) nacked: AtomicU64,
    pub(super) renewed: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    /// Successful `ChangeInvisibleDuration` calls of a simple consumer.
    pub(super) invisible_changed: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
