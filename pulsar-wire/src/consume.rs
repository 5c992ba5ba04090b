//! [`MessageConsumer`]: what a plain [`Consumer`](crate::Consumer) and a
//! [`crate::prioritized::PriorityConsumer`] have in common, as one object-safe trait.

use crate::{Error, Message};

/// Receiving, acknowledging and following partition growth, whatever the consumer's kind.
///
/// Implemented by [`Consumer`](crate::Consumer) and [`crate::prioritized::PriorityConsumer`]; each method
/// delegates to the inherent method of the same name, with its semantics and errors. The
/// trait is object safe (its async methods come from [`crate::async_trait`]), so code that
/// should not care whether priority is on can hold a `Box<dyn MessageConsumer>` or an
/// `Arc<dyn MessageConsumer>`:
///
/// ```no_run
/// use pulsar_wire::{Error, MessageConsumer};
///
/// async fn drain(consumer: &dyn MessageConsumer, count: usize) -> Result<(), Error> {
///     for _ in 0..count {
///         let message = consumer.receive().await?;
///         consumer.ack(&message).await?;
///     }
///     Ok(())
/// }
/// ```
#[async_trait::async_trait]
pub trait MessageConsumer: Send + Sync {
    /// Waits for the next message (see [`Consumer::receive`](crate::Consumer::receive) and
    /// [`crate::prioritized::PriorityConsumer::receive`], which picks it by priority).
    ///
    /// # Errors
    /// As the implementation's inherent `receive`.
    async fn receive(&self) -> Result<Message, Error>;

    /// Queues the ack of a message without waiting for it to be sent (see [`Consumer::ack`](crate::Consumer::ack)).
    ///
    /// # Errors
    /// As the implementation's inherent `ack`.
    async fn ack(&self, message: &Message) -> Result<(), Error>;

    /// Asks for the message's redelivery (see [`Consumer::nack`](crate::Consumer::nack)).
    ///
    /// # Errors
    /// As the implementation's inherent `nack`.
    fn nack(&self, message: &Message) -> Result<(), Error>;

    /// Re-reads the partition count and subscribes the partitions added since; returns the
    /// partition count (0 for a topic that is not partitioned). See
    /// [`Consumer::refresh_partitions`](crate::Consumer::refresh_partitions) and
    /// [`crate::prioritized::PriorityConsumer::refresh_partitions`]; to follow a growth on
    /// the producer's side too, in the right order, use
    /// [`crate::prioritized::follow_growth`].
    ///
    /// # Errors
    /// As the implementation's inherent `refresh_partitions`.
    async fn refresh_partitions(&self) -> Result<usize, Error>;

    /// Sends the pending acks within `deadline` and closes the consumer (see
    /// [`Consumer::close`](crate::Consumer::close)).
    ///
    /// # Errors
    /// As the implementation's inherent `close`.
    async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error>;

    /// Whether the consumer gets nothing more: closed, or its deliveries ended (its receive
    /// says why). Ends [`crate::Messages`] after that error.
    fn has_ended(&self) -> bool {
        false
    }

    /// The topic's full name.
    fn topic(&self) -> &str;
}
