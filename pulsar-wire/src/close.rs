//! What closing a producer or a consumer did with the work it still held.

use std::time::Duration;

/// The deadline the crate's own closes use (a dead-letter or retry consumer that it closes,
/// for example), and a sensible one for callers that have no deadline of their own: the
/// 30 seconds consumers' closes waited for their acknowledgements before closes took one.
pub const DEFAULT_CLOSE_DEADLINE: Duration = Duration::from_secs(30);

/// What [`crate::Producer::close`] (and [`crate::TypedProducer::close`]) did with the
/// messages that waited for their receipts when it started. `pending = answered +
/// abandoned`; a second close reports all zeros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerCloseReport {
    /// Messages sent (or batched to be sent) whose receipts had not come when the close
    /// started: batched messages not yet flushed (the close flushes them) and sends waiting
    /// for their receipts.
    pub pending: usize,
    /// Of those, the messages whose sends ended before the deadline: with a receipt, or with
    /// the broker's refusal (each send's own future tells which).
    pub answered: usize,
    /// Of those, the messages still unanswered at the deadline: their sends fail with
    /// [`crate::Error::Closed`]; the broker may still have stored some of them.
    pub abandoned: usize,
}

/// What the close of a consumer ([`crate::Consumer`], [`crate::PatternConsumer`],
/// [`crate::prioritized::PriorityConsumer`], [`crate::Reader`], [`crate::TypedConsumer`]) did with the
/// acknowledgements that waited to be sent when it started; summed over the consumers of a
/// type that holds several. `acks_pending = acks_flushed + acks_failed + acks_abandoned`;
/// a second close reports all zeros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerCloseReport {
    /// Acknowledgements waiting in the ack grouping when the close started.
    pub acks_pending: u64,
    /// Of those, the ones the broker took (or, without ack receipts, that were written to
    /// it) before the deadline.
    pub acks_flushed: u64,
    /// Of those, the ones that failed before the deadline (their messages are delivered
    /// again to the subscription's next consumer).
    pub acks_failed: u64,
    /// Of those, the ones still unsent or unanswered at the deadline, given up (their
    /// `ack` futures fail; their messages are delivered again).
    pub acks_abandoned: u64,
}

impl ConsumerCloseReport {
    pub(crate) fn from_acks(report: &ack_batcher::CloseReport) -> Self {
        Self {
            acks_pending: u64::try_from(report.pending_at_close).unwrap_or(u64::MAX),
            acks_flushed: report.succeeded,
            acks_failed: report.failed,
            acks_abandoned: report.abandoned,
        }
    }

    /// Adds `other`'s counts (saturating), for a type that closes several consumers.
    pub(crate) fn add(&mut self, other: &Self) {
        self.acks_pending = self.acks_pending.saturating_add(other.acks_pending);
        self.acks_flushed = self.acks_flushed.saturating_add(other.acks_flushed);
        self.acks_failed = self.acks_failed.saturating_add(other.acks_failed);
        self.acks_abandoned = self.acks_abandoned.saturating_add(other.acks_abandoned);
    }
}

/// What is left of `deadline` after `started`.
pub(crate) fn remaining(deadline: Duration, started: tokio::time::Instant) -> Duration {
    deadline.saturating_sub(started.elapsed())
}
