//! [`Batcher`]: the public handle.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::TryAcquireError;
use tokio::time::Instant;

use crate::config::{Builder, Settings};
use crate::observe::SharedObserver;
use crate::shared::Shared;
use crate::{Backpressure, CloseReport, Error, Flush, Stats, Ticket};

/// Per-item options for [`Batcher::enqueue`] and [`Batcher::try_enqueue`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemOptions {
    deadline: Option<Instant>,
    immediate: bool,
}

impl ItemOptions {
    /// No deadline, batched as usual.
    pub fn new() -> Self {
        Self::default()
    }

    /// The item must be flushed before `deadline` (minus the batcher's deadline margin), and is
    /// not retried past it: an attempt that would start after it is not made, and the item
    /// resolves to its last failure. A receipt handle's expiry is a typical deadline.
    ///
    /// `deadline` is a [`tokio::time::Instant`] (not [`std::time::Instant`]), so that it
    /// follows Tokio's clock, paused time in tests included.
    #[must_use]
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Send the item now, as a batch of one, without waiting for a batch to fill (for FIFO,
    /// late or otherwise ineligible items). It still honours the key's in-flight limit.
    #[must_use]
    pub fn immediate(mut self) -> Self {
        self.immediate = true;
        self
    }
}

/// A keyed time/size batcher that gives every item its own result.
///
/// Items submitted under the same key are grouped into batches; a batch is handed to the
/// transport ([`Flush`]) when it reaches `max_items`, when `max_delay` has passed since its
/// first item, before the earliest item deadline minus a margin, on [`Batcher::flush`] /
/// [`Batcher::flush_all`], or on [`Batcher::close`]. The transport answers per item; retryable
/// failures are retried after a backoff, those of one key that fall due together in one batch,
/// without holding up anything else.
///
/// # Guarantees
/// - Every accepted item resolves exactly once: success, failure, or
///   [`Error::Abandoned`] if `close` runs out of time.
/// - A batch never mixes keys and never exceeds `max_items`. Within a batch, items keep their
///   submission order. With `max_in_flight_per_key(1)` a key's batches are flushed strictly
///   one after another in the order they were sealed; with a higher limit, up to that many
///   run concurrently and may be answered in any order. Retries and immediate items are
///   batches of their own and leave the key's order.
/// - Memory is bounded by `max_pending` items; keys that go idle hold no memory.
///
/// # Cancellation
/// Dropping the future returned by [`Batcher::submit`] (or a [`Ticket`]) **does not** remove
/// the item from its batch once it was accepted: it is flushed and retried as usual and its
/// outcome discarded. Before acceptance (while waiting for room under
/// [`Backpressure::Wait`]) dropping the future drops the item unsent.
///
/// # Shutdown
/// Call [`Batcher::close`] to flush and get a report. Cloned handles share one batcher; when
/// the last handle is dropped without `close`, the batcher closes itself in the background
/// with the builder's `drop_timeout`, so no item's future stays pending forever.
pub struct Batcher<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    handle: Arc<Handle<K, T, F>>,
}

/// Closes the batcher when the last [`Batcher`] clone goes away.
struct Handle<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    shared: Arc<Shared<K, T, F>>,
}

impl<K, T, F> Drop for Handle<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    fn drop(&mut self) {
        let shared = Arc::clone(&self.shared);
        let timeout = shared.settings.drop_timeout;
        // If the runtime is shutting down the task is dropped at once; the items' futures then
        // resolve to `Abandoned` when the last reference to the state goes away.
        self.shared.runtime.spawn(async move {
            shared.close(timeout).await;
        });
    }
}

impl<K, T, F> Clone for Batcher<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    fn clone(&self) -> Self {
        Self {
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<K, T, F> fmt::Debug for Batcher<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("settings", &self.handle.shared.settings)
            .finish_non_exhaustive()
    }
}

impl<K, T, F> Builder<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    /// Checks the settings and starts the batcher. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] names the first setting out of range; [`Error::NoRuntime`] if
    /// there is no current Tokio runtime.
    pub fn build(self, flusher: F) -> Result<Batcher<K, T, F>, Error<F::Error>> {
        self.settings.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(Batcher::start(
            flusher,
            self.settings,
            self.observer,
            runtime,
        ))
    }
}

type Outcome<K, T, F> = Result<<F as Flush<K, T>>::Output, Error<<F as Flush<K, T>>::Error, T>>;
type Admission<K, T, F> = Result<
    Ticket<<F as Flush<K, T>>::Output, <F as Flush<K, T>>::Error>,
    Error<<F as Flush<K, T>>::Error, T>,
>;

impl<K, T, F> Batcher<K, T, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    /// Starts configuring a batcher.
    #[must_use]
    pub fn builder() -> Builder<K, T, F> {
        Builder::default()
    }

    pub(crate) fn start(
        flusher: F,
        settings: Settings,
        observer: Option<SharedObserver<K, T, F>>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let shared = Shared::new(flusher, settings, observer, runtime);
        Self {
            handle: Arc::new(Handle { shared }),
        }
    }

    fn shared(&self) -> &Arc<Shared<K, T, F>> {
        &self.handle.shared
    }

    /// Submits an item and waits for its own outcome.
    ///
    /// The item is accepted on the first poll (waiting for room under
    /// [`Backpressure::Wait`]); from then on dropping this future does not withdraw it.
    ///
    /// # Errors
    /// [`Error::Closed`] / [`Error::Full`] hand the item back unsent; the other variants are
    /// the item's outcome.
    pub async fn submit(&self, key: K, item: T) -> Outcome<K, T, F> {
        let ticket = self.enqueue(key, item, ItemOptions::new()).await?;
        ticket.await.map_err(Error::with_item_type)
    }

    /// Like [`Batcher::submit`], but sends the item at once as a batch of one.
    ///
    /// # Errors
    /// As [`Batcher::submit`].
    pub async fn submit_immediate(&self, key: K, item: T) -> Outcome<K, T, F> {
        let ticket = self
            .enqueue(key, item, ItemOptions::new().immediate())
            .await?;
        ticket.await.map_err(Error::with_item_type)
    }

    /// Accepts an item and returns the [`Ticket`] of its outcome, waiting for room under
    /// [`Backpressure::Wait`].
    ///
    /// # Errors
    /// [`Error::Closed`] if the batcher is closed (also while waiting); [`Error::Full`] under
    /// [`Backpressure::Reject`] when `max_pending` items are pending. Both hand the item back.
    pub async fn enqueue(&self, key: K, item: T, options: ItemOptions) -> Admission<K, T, F> {
        let shared = self.shared();
        match shared.room.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::Closed) => return Err(Error::Closed(item)),
            Err(TryAcquireError::NoPermits) => match shared.settings.backpressure {
                Backpressure::Reject => return Err(self.full(item)),
                Backpressure::Wait => match shared.room.acquire().await {
                    Ok(permit) => permit.forget(),
                    Err(_) => return Err(Error::Closed(item)),
                },
            },
        }
        self.admit(key, item, options)
    }

    /// Accepts an item without ever waiting and returns the [`Ticket`] of its outcome.
    ///
    /// # Errors
    /// [`Error::Closed`] if the batcher is closed; [`Error::Full`] when `max_pending` items
    /// are pending, whatever the backpressure setting. Both hand the item back.
    pub fn try_enqueue(&self, key: K, item: T, options: ItemOptions) -> Admission<K, T, F> {
        match self.shared().room.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::Closed) => return Err(Error::Closed(item)),
            Err(TryAcquireError::NoPermits) => return Err(self.full(item)),
        }
        self.admit(key, item, options)
    }

    fn full(&self, item: T) -> Error<F::Error, T> {
        Error::Full {
            item,
            limit: self.shared().settings.max_pending,
        }
    }

    /// Places an item whose room permit is taken.
    fn admit(&self, key: K, item: T, options: ItemOptions) -> Admission<K, T, F> {
        let (reply, ticket) = Ticket::new();
        self.shared()
            .accept(key, item, reply, options.deadline, options.immediate)
            .map_err(Error::Closed)?;
        Ok(ticket)
    }

    /// Flushes `key`'s open batch now. The returned future resolves once every batch of the
    /// key sealed so far has been answered by the transport (items that failed retryably are
    /// then waiting for their retry; await their own futures for final outcomes).
    ///
    /// The flush starts when this is called, whether or not the future is awaited.
    pub fn flush(&self, key: &K) -> impl Future<Output = ()> + Send + 'static {
        let waiters = self.shared().flush(Some(key));
        async move {
            for waiter in waiters {
                let _ = waiter.await;
            }
        }
    }

    /// Flushes every key's open batch now; resolves like [`Batcher::flush`] for all keys.
    pub fn flush_all(&self) -> impl Future<Output = ()> + Send + 'static {
        let waiters = self.shared().flush(None);
        async move {
            for waiter in waiters {
                let _ = waiter.await;
            }
        }
    }

    /// Closes the batcher: refuses new items ([`Error::Closed`] hands them back), flushes
    /// every open batch, and waits up to `timeout` for in-flight batches and scheduled
    /// retries. What has not resolved by then is abandoned: in-flight flushes are cancelled
    /// and their items, like the rest, resolve to [`Error::Abandoned`]. Returns once every
    /// item has resolved, with a report of what happened to the items pending at the start.
    ///
    /// Calling it again (or from a clone) waits the same way and reports on what was still
    /// pending then.
    pub async fn close(&self, timeout: Duration) -> CloseReport {
        self.shared().close(timeout).await
    }

    /// Whether [`Batcher::close`] was called (or the last handle dropped).
    pub fn is_closed(&self) -> bool {
        self.shared().is_closed()
    }

    /// A snapshot of the counters and gauges.
    pub fn stats(&self) -> Stats {
        self.shared().stats()
    }
}
