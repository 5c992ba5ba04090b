//! The producer's pending queue: a place per message sent and not receipted yet, bounded by
//! [`super::ProducerOptions::max_pending_messages`].
//!
//! A send takes its place before it is batched or written ([`PendingQueue::admit`]) and keeps
//! it, in the batcher's item or the partition producer's entry, until the message is resolved
//! (receipted, refused, timed out, failed with the producer): a send whose future is dropped
//! while its message waits for its receipt still holds its place, since the message still
//! goes out (again after a reconnection). A chunked message's place stays with its send's
//! future, which sends its chunks one after another. The place is given back before the
//! sender learns the result, so a sender that sends again at once finds it free.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, TryAcquireError};

use crate::Error;

/// What [`crate::Producer::send`] does when the producer's pending queue is full
/// ([`super::ProducerOptions::max_pending_messages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueFull {
    /// Fails at once with [`Error::ProducerQueueFull`] (the default, as the Java client's
    /// `blockIfQueueFull(false)`): the application decides whether to retry, drop or slow
    /// down.
    #[default]
    Fail,
    /// Waits for a place, at most the send timeout
    /// ([`super::ProducerOptions::send_timeout`]); fails with [`Error::ProducerQueueFull`]
    /// when none comes in time. Waiting senders get places in the order they came. A waiting
    /// send that is dropped takes no place. A send that got its place then waits for its
    /// receipt within the send timeout too, counted from then.
    Block,
}

/// A message's place in the pending queue (or, merged, the places of a batch's messages),
/// given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    /// How many places: the semaphore's permits taken and forgotten, added back on drop.
    places: usize,
    room: Arc<Room>,
}

impl Slot {
    /// Holds one place, taken from `room` (its permit forgotten).
    fn one(room: &Arc<Room>) -> Self {
        Self {
            places: 1,
            room: Arc::clone(room),
        }
    }
}

impl Drop for Slot {
    /// Gives the places back, then wakes [`PendingQueue::drained`] when it waits.
    fn drop(&mut self) {
        self.room.give_back(self.places);
    }
}

/// A place taken for one message and held by no [`Slot`] yet: it borrows the queue instead
/// of counting a reference to it, so that a message added to a batch that has a slot
/// already costs the queue one semaphore update and nothing else. Given back when dropped.
#[derive(Debug)]
#[must_use = "a place is given back when dropped"]
pub(crate) struct Place<'a> {
    room: &'a Arc<Room>,
}

impl Place<'_> {
    /// The place as a slot of its own.
    pub(crate) fn into_slot(self) -> Slot {
        let slot = Slot::one(self.room);
        std::mem::forget(self);
        slot
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.room.give_back(1);
    }
}

/// A message's place, however it is held, moved into the slot of its batch.
pub(crate) trait IntoSlot {
    /// Adds these places to `held` (all are given back together, at one time), or makes
    /// them `held`'s slot when it has none. The places of one producer share its queue.
    fn merge_into(self, held: &mut Option<Slot>);
}

impl IntoSlot for Slot {
    fn merge_into(mut self, held: &mut Option<Slot>) {
        match held {
            Some(slot) => {
                debug_assert!(Arc::ptr_eq(&slot.room, &self.room), "slots of two queues");
                // Taken, so that dropping this slot gives nothing back.
                slot.places += std::mem::take(&mut self.places);
            }
            None => *held = Some(self),
        }
    }
}

impl IntoSlot for Place<'_> {
    fn merge_into(self, held: &mut Option<Slot>) {
        match held {
            Some(slot) => {
                debug_assert!(
                    Arc::ptr_eq(&slot.room, self.room),
                    "a place of another queue"
                );
                slot.places += 1;
                std::mem::forget(self);
            }
            None => *held = Some(self.into_slot()),
        }
    }
}

/// The places of a queue and who waits for them to be given back, behind the one `Arc`
/// that each [`Slot`] holds (a [`Place`] borrows it).
#[derive(Debug)]
struct Room {
    places: Semaphore,
    given_back: GivenBack,
}

impl Room {
    /// Gives `places` back, then wakes [`PendingQueue::drained`] when it waits.
    fn give_back(&self, places: usize) {
        if places > 0 {
            self.places.add_permits(places);
            self.given_back.wake();
        }
    }
}

/// Wakes [`PendingQueue::drained`] when places are given back, and only while it waits: a
/// `notify_waiters` per message would take the notifier's lock on every receipt.
#[derive(Debug, Default)]
struct GivenBack {
    notify: Notify,
    /// The waits in [`PendingQueue::drained`] now.
    waiting: AtomicUsize,
}

impl GivenBack {
    fn wake(&self) {
        // SeqCst with `drained`'s increment: either this sees the wait, or the wait's check
        // after its increment sees the places given back.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// The places of one producer's messages, across its partitions.
#[derive(Debug)]
pub(crate) struct PendingQueue {
    room: Arc<Room>,
    /// `None`: as many places as a semaphore holds, so that the count is kept anyway.
    limit: Option<usize>,
    when_full: QueueFull,
    /// The longest a blocking send waits for a place.
    wait: Duration,
    topic: String,
}

impl PendingQueue {
    /// A queue of `limit` places (`None`: unbounded) for the producer of `topic`.
    pub(crate) fn new(
        topic: &str,
        limit: Option<usize>,
        when_full: QueueFull,
        wait: Duration,
    ) -> Result<Self, Error> {
        if let Some(limit) = limit
            && !(1..=Semaphore::MAX_PERMITS).contains(&limit)
        {
            return Err(Error::Invalid {
                what: "max_pending_messages",
                reason: format!(
                    "{limit} is not in 1..={} (0 would refuse every message; None sets no \
                     limit)",
                    Semaphore::MAX_PERMITS
                ),
            });
        }
        Ok(Self {
            room: Arc::new(Room {
                places: Semaphore::new(limit.unwrap_or(Semaphore::MAX_PERMITS)),
                given_back: GivenBack::default(),
            }),
            limit,
            when_full,
            wait,
            topic: topic.to_owned(),
        })
    }

    /// A place for one message when there is one now; `None` when the queue is full and a
    /// send waits for a place ([`QueueFull::Block`]).
    ///
    /// # Errors
    /// As [`PendingQueue::admit`], without the wait.
    pub(crate) fn try_admit(&self) -> Result<Option<Slot>, Error> {
        Ok(self.try_take()?.map(Place::into_slot))
    }

    /// As [`PendingQueue::try_admit`], the place borrowing the queue.
    ///
    /// # Errors
    /// As [`PendingQueue::try_admit`].
    pub(crate) fn try_take(&self) -> Result<Option<Place<'_>>, Error> {
        match self.room.places.try_acquire() {
            Ok(permit) => {
                permit.forget();
                Ok(Some(Place { room: &self.room }))
            }
            Err(TryAcquireError::Closed) => Err(Error::Closed("the producer")),
            Err(TryAcquireError::NoPermits) if self.when_full == QueueFull::Fail => {
                Err(self.full(None))
            }
            Err(TryAcquireError::NoPermits) => Ok(None),
        }
    }

    fn full(&self, waited: Option<Duration>) -> Error {
        Error::ProducerQueueFull {
            topic: self.topic.clone(),
            limit: self.limit.unwrap_or(Semaphore::MAX_PERMITS),
            waited,
        }
    }

    /// A place for one message: at once when there is one, else per [`QueueFull`].
    ///
    /// # Errors
    /// [`Error::ProducerQueueFull`] when the queue is full (after waiting, with
    /// [`QueueFull::Block`]); [`Error::Closed`] once the producer is closing.
    pub(crate) async fn admit(&self) -> Result<Slot, Error> {
        if let Some(slot) = self.try_admit()? {
            return Ok(slot);
        }
        // Boxed: the wait is rare, and its timer would make every send's future larger.
        let since = crate::metrics::Stopwatch::start();
        let waited = Box::pin(tokio::time::timeout(self.wait, self.room.places.acquire()));
        let waited = waited.await;
        since.blocked(crate::metrics::Blocked::PendingQueue);
        match waited {
            Ok(Ok(permit)) => {
                permit.forget();
                Ok(Slot::one(&self.room))
            }
            Ok(Err(_)) => Err(Error::Closed("the producer")),
            Err(_) => Err(self.full(Some(self.wait))),
        }
    }

    /// How many messages hold a place now.
    pub(crate) fn pending(&self) -> usize {
        self.limit
            .unwrap_or(Semaphore::MAX_PERMITS)
            .saturating_sub(self.room.places.available_permits())
    }

    /// The limit, `None` when unbounded.
    /// Returns once every place is given back (at once when none is taken).
    pub(crate) async fn drained(&self) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.room.given_back.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.room.given_back.waiting);
        loop {
            let given_back = self.room.given_back.notify.notified();
            let mut given_back = std::pin::pin!(given_back);
            given_back.as_mut().enable();
            if self.pending() == 0 {
                return;
            }
            given_back.await;
        }
    }

    pub(crate) fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// Stops admitting: sends waiting for a place fail with [`Error::Closed`], and so does
    /// every later one. Places taken are still given back.
    pub(crate) fn close(&self) {
        self.room.places.close();
    }

    /// An unbounded queue, for the batcher's tests.
    #[cfg(test)]
    pub(crate) fn unbounded() -> Self {
        Self::new("test", None, QueueFull::Fail, Duration::from_secs(1)).expect("valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(limit: usize, when_full: QueueFull) -> PendingQueue {
        PendingQueue::new("t", Some(limit), when_full, Duration::from_secs(5)).expect("valid")
    }

    #[tokio::test]
    async fn a_full_queue_fails_at_once_and_a_given_back_place_is_free_again() {
        let queue = queue(2, QueueFull::Fail);
        let a = queue.admit().await.expect("room");
        let _b = queue.admit().await.expect("room");
        assert_eq!(queue.pending(), 2);
        match queue.admit().await {
            Err(Error::ProducerQueueFull {
                limit: 2,
                waited: None,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        drop(a);
        assert_eq!(queue.pending(), 1);
        assert!(queue.admit().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocking_send_waits_within_the_timeout_and_gets_a_place_given_back() {
        let queue = Arc::new(queue(1, QueueFull::Block));
        let held = queue.admit().await.expect("room");
        let started = tokio::time::Instant::now();
        match queue.admit().await {
            Err(Error::ProducerQueueFull {
                waited: Some(waited),
                ..
            }) => assert_eq!(waited, Duration::from_secs(5)),
            other => panic!("{other:?}"),
        }
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let waiting = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.admit().await.map(drop) }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        drop(held);
        assert!(waiting.await.expect("joined").is_ok());
        assert_eq!(queue.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_takes_no_place_and_closing_fails_the_waiters() {
        let queue = Arc::new(queue(1, QueueFull::Block));
        let held = queue.admit().await.expect("room");
        let spawn = |queue: &Arc<PendingQueue>| {
            let queue = Arc::clone(queue);
            tokio::spawn(async move { queue.admit().await.map(drop) })
        };
        let cancelled = spawn(&queue);
        let next = spawn(&queue);
        tokio::task::yield_now().await;
        cancelled.abort();
        drop(held);
        assert!(
            next.await.expect("joined").is_ok(),
            "the next waiter got the place"
        );
        let held = queue.admit().await.expect("room");
        let waiting = spawn(&queue);
        tokio::task::yield_now().await;
        queue.close();
        assert!(matches!(
            waiting.await.expect("joined"),
            Err(Error::Closed(_))
        ));
        assert!(matches!(queue.admit().await, Err(Error::Closed(_))));
        drop(held);
        assert_eq!(queue.pending(), 0);
    }

    #[tokio::test]
    async fn a_place_is_given_back_once_dropped_or_with_the_slot_it_joined() {
        let queue = queue(3, QueueFull::Fail);
        let take = || queue.try_take().expect("open").expect("room");
        drop(take());
        assert_eq!(queue.pending(), 0);
        let mut held = None;
        take().merge_into(&mut held);
        take().merge_into(&mut held);
        queue.admit().await.expect("room").merge_into(&mut held);
        assert_eq!(queue.pending(), 3, "each place counted once");
        assert!(matches!(
            queue.try_take(),
            Err(Error::ProducerQueueFull { limit: 3, .. })
        ));
        drop(held);
        assert_eq!(queue.pending(), 0);
        let slot = take().into_slot();
        assert_eq!(queue.pending(), 1);
        drop(slot);
        assert_eq!(queue.pending(), 0);
    }

    #[test]
    fn a_limit_of_zero_is_refused() {
        let refused = PendingQueue::new("t", Some(0), QueueFull::Fail, Duration::from_secs(1));
        assert!(matches!(
            refused,
            Err(Error::Invalid {
                what: "max_pending_messages",
                ..
            })
        ));
        let unbounded = PendingQueue::unbounded();
        assert_eq!((unbounded.pending(), unbounded.limit()), (0, None));
    }
}
