//! [`Messages`]: the messages of a [`SimpleConsumer`] as a [`Stream`], from
//! [`SimpleConsumer::stream`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ack_batcher::Backoff;
use futures_core::Stream;

use super::simple::SimpleConsumer;
use crate::backoff;
use crate::{Error, ReceivedMessage};

/// The first wait after a retryable receive error; it doubles (with jitter) after each one
/// that follows, up to [`RETRY_MAX`], and starts again after a receive that succeeds.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest wait between two receives that failed with a retryable error.
const RETRY_MAX: Duration = Duration::from_secs(10);

type Receiving<'a> = Pin<Box<dyn Future<Output = Result<Vec<ReceivedMessage>, Error>> + Send + 'a>>;

/// The messages of a [`SimpleConsumer`] as a [`Stream`] of `Result<ReceivedMessage, Error>`,
/// from [`SimpleConsumer::stream`].
///
/// Each receive long-polls with the consumer's settings: up to
/// [`receive_batch_size`](crate::SimpleConsumerBuilder::receive_batch_size) messages,
/// invisible for [`invisible_duration`](crate::SimpleConsumerBuilder::invisible_duration),
/// waiting up to [`await_duration`](crate::SimpleConsumerBuilder::await_duration), taking the
/// subscribed topics (or the priority levels) as [`SimpleConsumer::receive`] does. The stream
/// yields the messages of one receive one by one, in the order they came, and receives again
/// only once they are all taken; an empty receive yields nothing and receives again. The next
/// receive starts when the stream is polled, so an application that stops polling stops
/// receiving (the messages it holds stay invisible until acknowledged or their time runs out).
///
/// What each outcome of a receive does:
///
/// - **Messages**: yielded one by one as `Ok`.
/// - **[`Error::Closed`]** (the consumer was [closed](SimpleConsumer::close) or dropped): the
///   stream ends (`None`), without an error item. It also ends at the next poll after the
///   consumer is closed, dropping the messages of the last receive not yielded yet (they can
///   no longer be acknowledged; the proxy delivers them again after their invisible
///   duration), and a close during a receive or a wait ends it at once.
/// - **A retryable error** ([`Error::is_retryable`]: [`Error::Unreachable`], a transport
///   [`Error::Rpc`] such as `UNAVAILABLE` or a deadline, a throttling or 5xxxx
///   [`Error::Server`]): yielded as an `Err` item, and the stream goes on. The next receive
///   waits first: 100 ms after the first such error, doubling (with jitter) up to 10 s while
///   they go on, and no wait once a receive succeeds again. The session reconnects by itself
///   meanwhile.
/// - **Any other error** (a 4xxxx [`Error::Server`] such as a topic or group that does not
///   exist, a filter the broker refuses, a denied permission; [`Error::Tls`]): yielded as the
///   last item, then the stream ends, as the same receive would fail again. The consumer
///   itself stays open: [`SimpleConsumer::stream`] starts a new stream once the cause is
///   fixed.
///
/// Acknowledging stays the application's: [`SimpleConsumer::ack`] each message (the consumer
/// is borrowed, not taken, so it can be used while the stream runs). Dropping the stream
/// during a receive cancels it; the messages that receive would have brought stay invisible
/// until their invisible duration ends.
///
/// ```no_run
/// use futures_util::StreamExt;
/// use rocketmq_grpc::{Error, SimpleConsumer};
///
/// async fn work(consumer: &SimpleConsumer) {
///     consumer
///         .stream()
///         .map(|message| async move {
///             let message = message?;
///             // ... handle it, up to 8 at once ...
///             consumer.ack(&message).await
///         })
///         .buffer_unordered(8)
///         .for_each(|acked: Result<(), Error>| async move {
///             if let Err(error) = acked {
///                 eprintln!("{error}");
///             }
///         })
///         .await;
/// }
/// ```
#[must_use = "a stream does nothing unless polled"]
pub struct Messages<'a> {
    consumer: &'a SimpleConsumer,
    /// Messages of the last receive not yielded yet.
    ready: VecDeque<ReceivedMessage>,
    /// The receive under way (with its wait after an error).
    receiving: Option<Receiving<'a>>,
    /// The wait before the next receive: zero unless the last receive failed retryably.
    wait: Duration,
    backoff: Backoff,
    ended: bool,
}

impl<'a> Messages<'a> {
    fn new(consumer: &'a SimpleConsumer) -> Self {
        Self {
            consumer,
            ready: VecDeque::new(),
            receiving: None,
            wait: Duration::ZERO,
            backoff: backoff::exponential(RETRY_INITIAL, RETRY_MAX),
            ended: false,
        }
    }

    /// One receive with the consumer's settings, after `wait`; a close ends the wait.
    fn receive(&self) -> Receiving<'a> {
        let consumer = self.consumer;
        let wait = self.wait;
        let (max_messages, invisible_duration) = consumer.stream_settings();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::select! {
                    () = consumer.stop_token().cancelled() => {
                        return Err(Error::Closed("the simple consumer"));
                    }
                    () = tokio::time::sleep(wait) => {}
                }
            }
            consumer.receive(max_messages, invisible_duration).await
        })
    }

    fn end(&mut self) -> Poll<Option<Result<ReceivedMessage, Error>>> {
        self.ended = true;
        self.ready.clear();
        self.receiving = None;
        Poll::Ready(None)
    }
}

impl std::fmt::Debug for Messages<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messages")
            .field("group", &self.consumer.group())
            .field("ready", &self.ready.len())
            .field("receiving", &self.receiving.is_some())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Stream for Messages<'_> {
    type Item = Result<ReceivedMessage, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if this.consumer.is_closed() {
            return this.end();
        }
        loop {
            if let Some(message) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(message)));
            }
            if this.receiving.is_none() {
                this.receiving = Some(this.receive());
            }
            let Some(receiving) = this.receiving.as_mut() else {
                return Poll::Pending;
            };
            let Poll::Ready(received) = receiving.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            this.receiving = None;
            match received {
                Ok(messages) => {
                    this.backoff.reset();
                    this.wait = Duration::ZERO;
                    this.ready.extend(messages);
                }
                Err(Error::Closed(_)) => return this.end(),
                Err(error) if error.is_retryable() => {
                    this.wait = this.backoff.next_delay();
                    tracing::debug!(%error, wait = ?this.wait, "a receive of the message stream failed; receiving again after the wait");
                    return Poll::Ready(Some(Err(error)));
                }
                Err(error) => {
                    tracing::warn!(%error, "a receive of the message stream failed for good; the stream ends");
                    this.ended = true;
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }
}

impl SimpleConsumer {
    /// The messages as a [`Stream`] ([`Messages`]): receives with the consumer's
    /// [`receive_batch_size`](crate::SimpleConsumerBuilder::receive_batch_size),
    /// [`invisible_duration`](crate::SimpleConsumerBuilder::invisible_duration) and
    /// [`await_duration`](crate::SimpleConsumerBuilder::await_duration), yields each message
    /// once, yields retryable errors and goes on (after a backoff), yields any other error as
    /// its last item, and ends once the consumer is [closed](Self::close). Acknowledge each
    /// message with [`ack`](Self::ack). Several streams of one consumer share its topics and
    /// receive independently.
    pub fn stream(&self) -> Messages<'_> {
        Messages::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_can_move_between_tasks() {
        fn send<T: Send>() {}
        send::<Messages<'static>>();
    }
}
