//! The application's side: [`MessageHandler`] and what it decides, [`ConsumeResult`].

use std::sync::Arc;

use crate::ReceivedMessage;

/// What a handler decided about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeResult {
    /// Processed: the message is acknowledged.
    Success,
    /// Not processed: the message is made visible again after the retry policy's delay.
    Failure,
}

/// The application's message handler. Called concurrently (up to the consumer's concurrency),
/// except for FIFO messages, which are handled one at a time per queue, in order.
#[async_trait::async_trait]
pub trait MessageHandler: Send + Sync + 'static {
    /// Handles one message.
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult;
}

/// A shared handler: keep an `Arc` to read its state while the consumer runs.
#[async_trait::async_trait]
impl<H: MessageHandler + ?Sized> MessageHandler for Arc<H> {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        (**self).handle(message).await
    }
}
