//! [`follow_growth`]: one call that takes a grown topic's new partition count to the
//! producer and then to the consumer, in the order key order needs.

use crate::{Error, MessageConsumer, Producer};

/// Follows a growth of the topic's partition count on both sides: first
/// [`Producer::refresh_partitions`], then the consumer's
/// [`MessageConsumer::refresh_partitions`]. Returns the consumer's partition count (the
/// producer's is at most that: the topic may grow again between the two reads, never shrink).
///
/// **Why the producer goes first.** With [`crate::prioritized::GateConfig::growth_hold`], a
/// [`crate::prioritized::PriorityConsumer`] that sees the growth holds the new partitions until
/// the old ones have delivered what they held at that moment; a key the router moves to a new
/// partition then has its earlier messages (on the old partition) delivered before its later
/// ones (on the new partition). That holds only if the producers switched to the new layout
/// before the consumer saw the growth: a producer still on the old count keeps sending moved
/// keys to the old partitions after the consumer's drain point, and those messages can be
/// delivered after newer ones of the same key. Refreshing the producer first, and the
/// consumer only once the producer's router has the new count, keeps that order for this
/// producer (other producers of the topic must have refreshed too). With a plain
/// [`crate::Consumer`] the order makes no difference, and the call is just both refreshes.
///
/// The periodic refreshes ([`crate::ProducerOptions::partitions_refresh`],
/// [`crate::prioritized::PriorityConsumerOptions::partitions_refresh`]) run independently and
/// give no such order; turn the consumer's off (`None`) when the order matters and call this
/// instead.
///
/// # Errors
/// The errors of [`Producer::refresh_partitions`] (the consumer is not refreshed then), then
/// those of the consumer's `refresh_partitions`.
pub async fn follow_growth(
    producer: &Producer,
    consumer: &dyn MessageConsumer,
) -> Result<usize, Error> {
    producer.refresh_partitions().await?;
    consumer.refresh_partitions().await
}
