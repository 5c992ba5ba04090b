//! The transport side: the [`Flush`] trait, per-item replies and flush reasons.

use std::fmt;
use std::future::Future;

use crate::Retryable;

/// The answer for one item of a flushed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemReply<O, E> {
    /// The item was processed; its output goes to the item's future.
    Ok(O),
    /// The item failed; retried if [`Retryable::is_retryable`] says so and the retry policy allows.
    Err(E),
    /// The server's answer carried no result for this item. Treated as retryable; if retries run
    /// out the item resolves to [`crate::Error::Missing`].
    Missing,
}

/// What a transport returns for one batch: one reply per item, in the batch's order, or one
/// error for the whole batch (which then reaches every item).
///
/// If the vector is shorter than the batch, the items without a reply count as
/// [`ItemReply::Missing`]; replies beyond the batch's length are ignored and counted in
/// [`crate::Stats::extra_replies`].
pub type FlushResult<O, E> = Result<Vec<ItemReply<O, E>>, E>;

/// The sink a transport implements: sends one batch of items that share a key.
///
/// The batcher calls `flush` once per batch, never with an empty batch and never with more
/// than `max_items` items. Several batches of the same key may be in flight at once, up to
/// `max_in_flight_per_key`. Items are borrowed, so retries never need to clone them.
///
/// A whole-batch `Err` reaches every item of the batch: a retryable one
/// ([`Retryable::is_retryable`]) sends them again after the backoff (together, with the
/// other retries of the key that fall due then), a terminal one fails them at once. An item
/// whose next attempt would start after its deadline is not sent again: it resolves to its
/// last failure ([`crate::Error::Failed`] or [`crate::Error::Missing`]).
///
/// # Panics
/// A panic inside `flush` (or while creating its future) is caught: every item of that
/// batch fails with [`crate::Error::Panicked`] and is not retried, the key's other batches go
/// on, and [`crate::Stats::flush_panics`] counts it. Nothing else is affected.
///
/// # Cancellation
/// The returned future may be dropped before it completes: when it runs past the builder's
/// `flush_timeout` (its items then count as [`ItemReply::Missing`]) and when
/// [`crate::Batcher::close`] runs out of time (its items resolve to
/// [`crate::Error::Abandoned`]). Close does not wait even for a future that never yields;
/// whatever such a flush returns later is ignored. A transport must therefore cope with a
/// request whose answer nobody reads: for acks, sending one again is harmless.
///
/// ```
/// use ack_batcher::{Flush, FlushResult, ItemReply, Retryable};
///
/// #[derive(Debug, Clone)]
/// struct Unavailable;
/// impl Retryable for Unavailable {
///     fn is_retryable(&self) -> bool { true }
/// }
///
/// /// Acknowledges message ids; the "server" accepts everything.
/// struct AckAll;
/// impl Flush<String, u64> for AckAll {
///     type Output = ();
///     type Error = Unavailable;
///     async fn flush(&self, _topic: &String, ids: &[u64]) -> FlushResult<(), Unavailable> {
///         Ok(ids.iter().map(|_| ItemReply::Ok(())).collect())
///     }
/// }
/// ```
pub trait Flush<K, T>: Send + Sync + 'static {
    /// What a successful item resolves to.
    type Output: Send + 'static;
    /// The transport's failure. It is cloned when a whole-batch error reaches every item.
    type Error: Retryable + Clone + Send + 'static;

    /// Sends `items`, all of key `key`, as one request.
    fn flush(
        &self,
        key: &K,
        items: &[T],
    ) -> impl Future<Output = FlushResult<Self::Output, Self::Error>> + Send;
}

/// Why a batch was flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FlushReason {
    /// The batch reached `max_items`.
    Size,
    /// `max_delay` passed since the batch's first item.
    Delay,
    /// An item's deadline minus the margin came before `max_delay`.
    Deadline,
    /// An explicit [`crate::Batcher::flush`] or [`crate::Batcher::flush_all`].
    Explicit,
    /// The batcher was closing (or dropped).
    Close,
    /// An item sent on the immediate path, as a batch of one.
    Immediate,
    /// Items retried after a retryable failure (those of one key that fell due together).
    Retry,
}

impl FlushReason {
    /// Every reason, in the order used by [`crate::Stats`].
    pub const ALL: [FlushReason; 7] = [
        Self::Size,
        Self::Delay,
        Self::Deadline,
        Self::Explicit,
        Self::Close,
        Self::Immediate,
        Self::Retry,
    ];

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Size => 0,
            Self::Delay => 1,
            Self::Deadline => 2,
            Self::Explicit => 3,
            Self::Close => 4,
            Self::Immediate => 5,
            Self::Retry => 6,
        }
    }

    /// A short lower-case name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Size => "size",
            Self::Delay => "delay",
            Self::Deadline => "deadline",
            Self::Explicit => "explicit",
            Self::Close => "close",
            Self::Immediate => "immediate",
            Self::Retry => "retry",
        }
    }
}

impl fmt::Display for FlushReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
