//! The consumer's counters and their snapshot, [`ConsumerStats`].

use std::sync::atomic::{AtomicBool, AtomicU64};

/// The consumer's counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) undecodable: AtomicU64,
    pub(super) checksum_mismatches: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    pub(super) chunked: AtomicU64,
    pub(super) chunks_dropped: AtomicU64,
    pub(super) flow_frames: AtomicU64,
    pub(super) ack_frames: AtomicU64,
    pub(super) acked_ids: AtomicU64,
    pub(super) txn_acks: AtomicU64,
    pub(super) nacks: AtomicU64,
    pub(super) committed_redeliveries: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) unblocks: AtomicU64,
    pub(super) redelivery_requests: AtomicU64,
    pub(super) acks_held_back: AtomicU64,
    pub(super) handed_again: AtomicU64,
    pub(super) ack_timeouts: AtomicU64,
    pub(super) held_at_link_loss: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    /// `CLOSE_CONSUMER`s that named the broker to subscribe on (PIP-307).
    pub(super) moved: AtomicU64,
    pub(crate) acks_resent: AtomicU64,
    pub(super) closed_by_broker: AtomicBool,
    pub(super) reached_end_of_topic: AtomicBool,
}

/// A snapshot of a consumer's counters, from [`Consumer::stats`](super::Consumer::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Messages decoded for delivery.
    pub received: u64,
    /// Messages of redelivered batches skipped because the broker had them acknowledged.
    pub skipped: u64,
    /// Entries that could not be decoded (checksum, decompression or batch errors): handed
    /// to the application as [`Error::Undecodable`](crate::Error::Undecodable), not acknowledged.
    pub undecodable: u64,
    /// Of those, entries whose checksum did not match.
    pub checksum_mismatches: u64,
    /// Messages and undecodable entries published to the dead-letter topic (and then
    /// acknowledged) instead of being handed over.
    pub dead_lettered: u64,
    /// Chunked messages reassembled from their chunks (each counts once in `received`).
    pub chunked: u64,
    /// Incomplete chunked messages dropped (by [`ChunkLimits`](crate::ChunkLimits) or a chunk out of order):
    /// their chunks were redelivered, not acknowledged.
    pub chunks_dropped: u64,
    /// `FLOW` frames sent after the first.
    pub flow_frames: u64,
    /// `ACK` frames sent for ordinary acks (by message or by id).
    pub ack_frames: u64,
    /// Ids those ack frames carried.
    pub acked_ids: u64,
    /// Transactional acks sent (one frame each).
    pub txn_acks: u64,
    /// Negative acks sent.
    pub nacks: u64,
    /// Redelivered messages that a committed transaction of this consumer had acknowledged:
    /// not delivered again (the application has them), handled for the broker's count.
    pub committed_redeliveries: u64,
    /// Duplicate deliveries not handed over again: messages held by the application or
    /// acknowledged (those of committed transactions included).
    pub duplicates: u64,
    /// `REDELIVER_UNACKNOWLEDGED_MESSAGES` requests sent, of every kind (negative acks of
    /// messages not in a batch, undecodable entries, chunks dropped, unblocks, and
    /// [`Consumer::redeliver_unacknowledged`](super::Consumer::redeliver_unacknowledged)).
    pub redelivery_requests: u64,
    /// Of those, requests that named only an entry no consumer holds, to unblock a consumer
    /// whose unacked count on the broker drifted above what the application holds: they
    /// replay nothing.
    pub unblocks: u64,
    /// Transactional acks held back because other messages of their batch were still held
    /// by the application (sent later, or with the commit).
    pub acks_held_back: u64,
    /// Messages handed to the application again by the consumer itself: those of aborted
    /// transactions whose acks were held back, and negative acks of messages in a batch.
    pub handed_again: u64,
    /// Messages asked for again because they went unacknowledged for
    /// [`ConsumerOptions::ack_timeout`](super::ConsumerOptions::ack_timeout).
    pub ack_timeouts: u64,
    /// Messages the application held when a partition consumer's link was lost or closed:
    /// the broker gives them to any consumer of the subscription (a copy that comes back
    /// here is not handed over again; see
    /// [`Consumer::held_elsewhere`](super::Consumer::held_elsewhere)).
    pub held_at_link_loss: u64,
    /// Times a partition consumer subscribed again after its connection was lost or the
    /// broker closed it.
    pub reconnects: u64,
    /// Times the broker closed a partition's consumer naming the broker that serves it now
    /// (PIP-307, `assignedBrokerServiceUrl`): it subscribed there directly, without a lookup.
    pub moved: u64,
    /// Acks sent again for redelivered messages the application had acknowledged (outside
    /// a transaction) whose acks the broker did not get, in entries the consumer still
    /// tracks (an entry with messages held or in an open transaction): the copies are not
    /// handed over. A copy of an entry already settled is handed over again.
    pub acks_resent: u64,
    /// Whether the broker closed the consumer (`CLOSE_CONSUMER`).
    pub closed_by_broker: bool,
    /// Whether the topic reached its end.
    pub reached_end_of_topic: bool,
}

/// Adds the counters of `other` to `into`, field by field (saturating); `fields` must name
/// every counter, and the destructuring fails to compile when a field is left out.
macro_rules! add_counters {
    ($into:expr, $other:expr, [$($field:ident),* $(,)?], [$($flag:ident),* $(,)?]) => {{
        let ConsumerStats { $($field,)* $($flag: _,)* } = $other;
        $( $into.$field = $into.$field.saturating_add(*$field); )*
    }};
}

impl ConsumerStats {
    /// Adds the counters of `other` (saturating at `u64::MAX`); the flags
    /// (`closed_by_broker`, `reached_end_of_topic`) are left as they are: they say something
    /// of one consumer, not of a sum.
    pub(crate) fn add_counters(&mut self, other: &ConsumerStats) {
        add_counters!(
            self,
            other,
            [
                received,
                skipped,
                undecodable,
                checksum_mismatches,
                dead_lettered,
                chunked,
                chunks_dropped,
                flow_frames,
                ack_frames,
                acked_ids,
                txn_acks,
                nacks,
                committed_redeliveries,
                duplicates,
                redelivery_requests,
                unblocks,
                acks_held_back,
                handed_again,
                ack_timeouts,
                held_at_link_loss,
                reconnects,
                moved,
                acks_resent,
            ],
            [closed_by_broker, reached_end_of_topic]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_and_saturate_and_flags_stay() {
        let mut sum = ConsumerStats {
            received: 2,
            reconnects: u64::MAX - 1,
            ..ConsumerStats::default()
        };
        let other = ConsumerStats {
            received: 3,
            acks_resent: 4,
            reconnects: 5,
            closed_by_broker: true,
            reached_end_of_topic: true,
            ..ConsumerStats::default()
        };
        sum.add_counters(&other);
        assert_eq!(
            sum,
            ConsumerStats {
                received: 5,
                acks_resent: 4,
                reconnects: u64::MAX,
                ..ConsumerStats::default()
            }
        );
    }
}
