//! The application's side of a transaction left open: [`TransactionChecker`] and its answer,
//! [`TransactionResolution`].

use std::sync::Arc;

use parking_lot::Mutex;

use crate::ReceivedMessage;

/// What a transaction's message becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionResolution {
    /// Deliver the message to consumers.
    Commit,
    /// Discard the message.
    Rollback,
    /// Not known yet: the broker asks again later (and gives up after its check limit, 15
    /// checks by default, discarding the message).
    Unknown,
}

/// Answers the broker's check of a transaction that was left open: did the local transaction
/// the message belongs to commit? Called with the half message as the broker stored it.
///
/// Implement it, or pass a closure taking the message and returning a future of the
/// [`TransactionResolution`]:
///
/// ```
/// use rocketmq_grpc::{ReceivedMessage, TransactionResolution};
/// let checker = |message: ReceivedMessage| async move {
///     // Look the order up in the database by the message's key, say.
///     if message.keys().is_empty() {
///         TransactionResolution::Rollback
///     } else {
///         TransactionResolution::Commit
///     }
/// };
/// # fn takes(_: impl rocketmq_grpc::TransactionChecker) {}
/// # takes(checker);
/// ```
#[async_trait::async_trait]
pub trait TransactionChecker: Send + Sync + 'static {
    /// Decides the open transaction of `message`.
    async fn check(&self, message: ReceivedMessage) -> TransactionResolution;
}

#[async_trait::async_trait]
impl<F, Fut> TransactionChecker for F
where
    F: Fn(ReceivedMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = TransactionResolution> + Send + 'static,
{
    async fn check(&self, message: ReceivedMessage) -> TransactionResolution {
        self(message).await
    }
}

/// A shared checker.
#[async_trait::async_trait]
impl<C: TransactionChecker + ?Sized> TransactionChecker for Arc<C> {
    async fn check(&self, message: ReceivedMessage) -> TransactionResolution {
        (**self).check(message).await
    }
}

/// The producer's checker, if any.
#[derive(Default)]
pub(super) struct CheckerSlot(pub(super) Mutex<Option<Arc<dyn TransactionChecker>>>);

impl std::fmt::Debug for CheckerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.lock().is_some();
        f.debug_tuple("CheckerSlot").field(&set).finish()
    }
}
