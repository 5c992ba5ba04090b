//! Choosing a partition for each message of a partitioned topic.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use super::message::OutgoingMessage;
use crate::Error;

/// Picks the partition of a message of a partitioned topic.
///
/// `route` must return a partition in `0..partitions` (`partitions` is at least 1); a larger
/// value is reduced modulo `partitions` by the producer, so a router can never pick a
/// partition that does not exist. `partitions` is the producer's current count, which grows
/// when the topic gains partitions ([`crate::Producer::refresh_partitions`]).
///
/// The producer calls [`PartitionRouter::route_message`], which sees the whole message (its
/// properties too); its default calls [`PartitionRouter::route`] with the message's key, so
/// routers that only need the key implement `route` alone.
pub trait PartitionRouter: Send + Sync + fmt::Debug + 'static {
    /// The partition for a message with routing key `key`.
    fn route(&self, key: Option<&str>, partitions: u32) -> u32;

    /// The partition for `message`. The default routes by the message's key with
    /// [`PartitionRouter::route`]; routers that read properties (such as
    /// [`crate::prioritized::PriorityRouter`]) override it.
    ///
    /// # Errors
    /// Whatever the router cannot decide; the send fails with it and nothing is sent.
    fn route_message(&self, message: &OutgoingMessage, partitions: u32) -> Result<u32, Error> {
        Ok(self.route(message.partition_key(), partitions))
    }
}

/// The default router: the key's hash when the message has a key (the same partition as the
/// Java client's default `JavaStringHash`), round robin over the partitions otherwise.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU32,
}

impl PartitionRouter for RoundRobin {
    fn route(&self, key: Option<&str>, partitions: u32) -> u32 {
        let partitions = partitions.max(1);
        match key {
            Some(key) => key_partition(key, partitions),
            None => self.next.fetch_add(1, Ordering::Relaxed) % partitions,
        }
    }
}

/// The partition of a key: Java's `String.hashCode()` (over UTF-16 code units) masked to a
/// non-negative value, modulo `partitions`.
pub fn key_partition(key: &str, partitions: u32) -> u32 {
    let hash = key.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    (hash & i32::MAX) as u32 % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_like_java_and_the_rest_rotates() {
        // "hello".hashCode() == 99162322 in Java.
        assert_eq!(key_partition("hello", u32::MAX), 99_162_322);
        // A key whose hash is negative: "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(key_partition("polygenelubricants", 7), 0);
        let router = RoundRobin::default();
        let picks: Vec<_> = (0..6).map(|_| router.route(None, 3)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(router.route(Some("hello"), 3), 99_162_322 % 3);
        assert_eq!(router.route(None, 0), 0, "never out of range");
        let keyed = OutgoingMessage::new("x").key("hello");
        assert_eq!(router.route_message(&keyed, 3).unwrap(), 99_162_322 % 3);
    }
}
