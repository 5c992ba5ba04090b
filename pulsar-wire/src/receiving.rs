//! Two more ways to receive, for any [`MessageConsumer`]: [`Messages`], a
//! [`futures_util::Stream`] of messages, and [`BatchReceive`], a batch bounded by a count, a
//! size and a wait.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use futures_util::future::BoxFuture;

use crate::{Error, Message, MessageConsumer};

/// The messages of a consumer as a [`Stream`] ([`crate::Consumer::stream`],
/// [`crate::PatternConsumer::stream`], [`crate::Reader::stream`],
/// [`crate::prioritized::PriorityConsumer::stream`]; [`crate::TypedConsumer::stream`] gives
/// decoded values, [`crate::TypedMessages`]): each item is what
/// [`MessageConsumer::receive`] returns, in order; the stream ends once the consumer is
/// closed (the error of a consumer that ended otherwise is the last item). The consumer stays
/// usable meanwhile, to acknowledge what the stream yields:
///
/// ```no_run
/// use futures_util::StreamExt;
/// use pulsar_wire::{Consumer, Error};
///
/// async fn work(consumer: &Consumer) -> Result<(), Error> {
///     consumer
///         .stream()
///         .map(|message| async move {
///             let message = message?;
///             // ... handle it, up to 8 at once ...
///             consumer.ack(&message).await
///         })
///         .buffer_unordered(8)
///         .for_each(|acked| async move {
///             if let Err(error) = acked {
///                 eprintln!("{error}");
///             }
///         })
///         .await;
///     Ok(())
/// }
/// ```
pub struct Messages<'a> {
    consumer: &'a (dyn MessageConsumer + 'a),
    next: Option<BoxFuture<'a, Result<Message, Error>>>,
    ended: bool,
}

impl<'a> Messages<'a> {
    pub(crate) fn new(consumer: &'a (dyn MessageConsumer + 'a)) -> Self {
        Self {
            consumer,
            next: None,
            ended: false,
        }
    }
}

impl std::fmt::Debug for Messages<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messages")
            .field("topic", &self.consumer.topic())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Stream for Messages<'_> {
    type Item = Result<Message, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let consumer = this.consumer;
        let next = this.next.get_or_insert_with(|| consumer.receive());
        let Poll::Ready(received) = next.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        this.next = None;
        match received {
            Ok(message) => Poll::Ready(Some(Ok(message))),
            Err(Error::Closed(_)) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Err(error) => {
                // Errors the application can receive past (an undecodable message, a dead
                // letter not published) are items; a consumer whose deliveries ended says
                // why once, then the stream ends.
                this.ended = consumer.has_ended();
                Poll::Ready(Some(Err(error)))
            }
        }
    }
}

/// How much [`crate::Consumer::batch_receive`] gathers: it returns once the batch holds
/// `max_messages`, or its payloads reach `max_bytes` (the message that reaches it included),
/// or `timeout` passed since the call (with what it holds then, perhaps nothing). The
/// defaults are the Java client's `BatchReceivePolicy`: 100 messages, 10 MiB, 100 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReceive {
    max_messages: usize,
    max_bytes: usize,
    timeout: Duration,
}

/// The most messages one batch may be asked to hold.
pub const MAX_BATCH_RECEIVE_MESSAGES: usize = 1_000_000;

impl Default for BatchReceive {
    fn default() -> Self {
        Self {
            max_messages: 100,
            max_bytes: 10 * 1024 * 1024,
            timeout: Duration::from_millis(100),
        }
    }
}

impl BatchReceive {
    /// The most messages of a batch, 1 to [`MAX_BATCH_RECEIVE_MESSAGES`].
    #[must_use]
    pub fn max_messages(mut self, max: usize) -> Self {
        self.max_messages = max;
        self
    }

    /// The payload bytes at which a batch is complete, at least 1.
    #[must_use]
    pub fn max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max;
        self
    }

    /// How long a batch gathers at most, from the call; zero returns what is there now
    /// (waiting for nothing).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// [`Error::Invalid`] naming the option and its range, for a batch that could hold nothing.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if !(1..=MAX_BATCH_RECEIVE_MESSAGES).contains(&self.max_messages) {
            return Err(Error::Invalid {
                what: "BatchReceive::max_messages",
                reason: format!(
                    "{} is outside 1..={MAX_BATCH_RECEIVE_MESSAGES}",
                    self.max_messages
                ),
            });
        }
        if self.max_bytes == 0 {
            return Err(Error::Invalid {
                what: "BatchReceive::max_bytes",
                reason: "0 bytes: a batch must be allowed at least one byte".into(),
            });
        }
        Ok(())
    }
}

/// Receives a batch from `consumer` as `limits` says. An error after some messages were
/// gathered waits in `deferred` for the next call, which returns it at once.
pub(crate) async fn batch_receive(
    consumer: &(dyn MessageConsumer + '_),
    limits: BatchReceive,
    deferred: &parking_lot::Mutex<Option<Error>>,
) -> Result<Vec<Message>, Error> {
    limits.validate()?;
    if let Some(error) = deferred.lock().take() {
        return Err(error);
    }
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    while batch.len() < limits.max_messages && bytes < limits.max_bytes {
        let received = if limits.timeout.is_zero() {
            // What is there now: one poll.
            futures_util::FutureExt::now_or_never(consumer.receive())
        } else {
            tokio::time::timeout_at(deadline, consumer.receive())
                .await
                .ok()
        };
        match received {
            None => break,
            Some(Ok(message)) => {
                bytes = bytes.saturating_add(message.payload().len());
                batch.push(message);
            }
            Some(Err(error)) if batch.is_empty() => return Err(error),
            // What was gathered is handed over; the error comes with the next call.
            Some(Err(error)) => {
                *deferred.lock() = Some(error);
                break;
            }
        }
    }
    Ok(batch)
}
