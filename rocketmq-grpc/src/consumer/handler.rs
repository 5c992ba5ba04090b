//! The application's side: [`MessageHandler`] and what it decides, [`ConsumeResult`].

use std::sync::Arc;

use crate::ReceivedMessage;

/// What a handler decided about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumeResult {
    /// Processed: the message is acknowledged.
    Success,
    /// Not processed: the message is made visible again after the retry policy's delay.
    Failure,
}

/// The application's message handler. Called concurrently (up to the consumer's concurrency),
/// except for FIFO messages, which are handled one at a time per queue, in order.
///
/// Implement it with [`async_trait`](crate::async_trait) (re-exported here) when the handler
/// keeps state:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use rocketmq_grpc::{async_trait, ConsumeResult, MessageHandler, ReceivedMessage};
///
/// #[derive(Default)]
/// struct Orders {
///     handled: AtomicU64,
/// }
///
/// #[async_trait]
/// impl MessageHandler for Orders {
///     async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
///         println!("order {}: {} bytes", message.message_id(), message.body().len());
///         self.handled.fetch_add(1, Ordering::Relaxed);
///         ConsumeResult::Success
///     }
/// }
/// # fn takes(_: impl MessageHandler) {}
/// # takes(Orders::default());
/// ```
///
/// or pass a closure taking the message (a copy: the consumer keeps its own to acknowledge)
/// and returning a future of the [`ConsumeResult`]:
///
/// ```
/// use rocketmq_grpc::{ConsumeResult, ReceivedMessage};
///
/// let handler = |message: ReceivedMessage| async move {
///     if message.body().is_empty() {
///         ConsumeResult::Failure
///     } else {
///         ConsumeResult::Success
///     }
/// };
/// # fn takes(_: impl rocketmq_grpc::MessageHandler) {}
/// # takes(handler);
/// ```
#[async_trait::async_trait]
pub trait MessageHandler: Send + Sync + 'static {
    /// Handles one message.
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult;
}

#[async_trait::async_trait]
impl<F, Fut> MessageHandler for F
where
    F: Fn(ReceivedMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ConsumeResult> + Send + 'static,
{
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self(message.clone()).await
    }
}

/// A shared handler: keep an `Arc` to read its state while the consumer runs.
#[async_trait::async_trait]
impl<H: MessageHandler + ?Sized> MessageHandler for Arc<H> {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        (**self).handle(message).await
    }
}
