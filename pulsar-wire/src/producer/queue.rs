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
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

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

/// A message's place in the pending queue, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    given_back: Arc<Notify>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, given_back: &Arc<Notify>) -> Self {
        Self {
            permit: Some(permit),
            given_back: Arc::clone(given_back),
        }
    }
}

impl Drop for Slot {
    /// Gives the place back, then wakes [`PendingQueue::drained`].
    fn drop(&mut self) {
        drop(self.permit.take());
        self.given_back.notify_waiters();
    }
}

/// The places of one producer's messages, across its partitions.
#[derive(Debug)]
pub(crate) struct PendingQueue {
    room: Arc<Semaphore>,
    /// `None`: as many places as a semaphore holds, so that the count is kept anyway.
    limit: Option<usize>,
    when_full: QueueFull,
    /// The longest a blocking send waits for a place.
    wait: Duration,
    topic: String,
    /// Notified whenever a place is given back.
    given_back: Arc<Notify>,
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
            room: Arc::new(Semaphore::new(limit.unwrap_or(Semaphore::MAX_PERMITS))),
            limit,
            when_full,
            wait,
            topic: topic.to_owned(),
            given_back: Arc::new(Notify::new()),
        })
    }

    /// A place for one message: at once when there is one, else per [`QueueFull`].
    ///
    /// # Errors
    /// [`Error::ProducerQueueFull`] when the queue is full (after waiting, with
    /// [`QueueFull::Block`]); [`Error::Closed`] once the producer is closing.
    pub(crate) async fn admit(&self) -> Result<Slot, Error> {
        let full = |waited| Error::ProducerQueueFull {
            topic: self.topic.clone(),
            limit: self.limit.unwrap_or(Semaphore::MAX_PERMITS),
            waited,
        };
        match Arc::clone(&self.room).try_acquire_owned() {
            Ok(permit) => return Ok(Slot::new(permit, &self.given_back)),
            Err(TryAcquireError::Closed) => return Err(Error::Closed("the producer")),
            Err(TryAcquireError::NoPermits) if self.when_full == QueueFull::Fail => {
                return Err(full(None));
            }
            Err(TryAcquireError::NoPermits) => {}
        }
        // Boxed: the wait is rare, and its timer would make every send's future larger.
        let since = crate::metrics::Stopwatch::start();
        let waited = Box::pin(tokio::time::timeout(
            self.wait,
            Arc::clone(&self.room).acquire_owned(),
        ));
        let waited = waited.await;
        since.blocked(crate::metrics::Blocked::PendingQueue);
        match waited {
            Ok(Ok(permit)) => Ok(Slot::new(permit, &self.given_back)),
            Ok(Err(_)) => Err(Error::Closed("the producer")),
            Err(_) => Err(full(Some(self.wait))),
        }
    }

    /// How many messages hold a place now.
    pub(crate) fn pending(&self) -> usize {
        self.limit
            .unwrap_or(Semaphore::MAX_PERMITS)
            .saturating_sub(self.room.available_permits())
    }

    /// The limit, `None` when unbounded.
    /// Returns once every place is given back (at once when none is taken).
    pub(crate) async fn drained(&self) {
        loop {
            let given_back = self.given_back.notified();
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
        self.room.close();
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
