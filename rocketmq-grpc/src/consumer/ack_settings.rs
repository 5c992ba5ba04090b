//! How a consumer acknowledges: [`AckSettings`] and the ack batcher built from them.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{
    BatchInfo, Batcher, ItemOptions, ItemReply, ItemView, Next, Observer, RetryPolicy,
};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::counters::Counters;
use super::unacked::Unacked;
use crate::{AckEntry, AckFlusher, AckKey, Error};

/// The observer type of the consumer's acks: it sees every ack with its own result.
pub type AckObserver = Arc<dyn Observer<AckKey, AckEntry, (), Error>>;

/// How a consumer acknowledges.
#[derive(Clone)]
pub struct AckSettings {
    pub(crate) batching: bool,
    pub(crate) max_items: usize,
    pub(crate) max_delay: Duration,
    pub(crate) late_after: Duration,
    pub(crate) deadline_margin: Duration,
    pub(crate) follow_deadlines: bool,
    pub(crate) retry_backoff: Duration,
    pub(crate) max_retry_backoff: Duration,
    pub(crate) observer: Option<AckObserver>,
}

impl std::fmt::Debug for AckSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckSettings")
            .field("batching", &self.batching)
            .field("max_items", &self.max_items)
            .field("max_delay", &self.max_delay)
            .field("late_after", &self.late_after)
            .field("deadline_margin", &self.deadline_margin)
            .field("follow_deadlines", &self.follow_deadlines)
            .field("retry_backoff", &self.retry_backoff)
            .field("max_retry_backoff", &self.max_retry_backoff)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Default for AckSettings {
    /// Batched per (endpoint, topic): 1,024 entries or 5 s; messages consumed more than 25 s
    /// after receipt and FIFO messages are acknowledged at once; retryable failures (see
    /// [`Error::is_retryable`]) retried with exponential backoff from 100 ms doubling to 5 s,
    /// with jitter, within the ack batcher's retry budget, until the receipt handle's
    /// invisibility ends.
    fn default() -> Self {
        Self {
            batching: true,
            max_items: 1024,
            max_delay: Duration::from_secs(5),
            late_after: Duration::from_secs(25),
            deadline_margin: Duration::from_secs(1),
            follow_deadlines: false,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            max_retry_backoff: DEFAULT_MAX_RETRY_BACKOFF,
            observer: None,
        }
    }
}

impl AckSettings {
    /// One entry per `AckMessage` request, sent at once (what the official clients do), for
    /// comparisons.
    pub fn immediate() -> Self {
        Self {
            batching: false,
            ..Self::default()
        }
    }

    /// The most entries in one request (default 1,024).
    #[must_use]
    pub fn max_items(mut self, max_items: usize) -> Self {
        self.max_items = max_items;
        self
    }

    /// The longest an ack waits for its batch (default 5 s).
    #[must_use]
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// Messages consumed later than this after receipt are acknowledged at once (default 25 s).
    #[must_use]
    pub fn late_after(mut self, late_after: Duration) -> Self {
        self.late_after = late_after;
        self
    }

    /// How long before a receipt handle's invisibility ends its batch is flushed at the latest
    /// (default 1 s).
    #[must_use]
    pub fn deadline_margin(mut self, margin: Duration) -> Self {
        self.deadline_margin = margin;
        self
    }

    /// Lets an ack wait for its batch up to `max_delay` (25 s, say, instead of 5 s), for
    /// many topics with few messages each, while still flushing before the receipt handles
    /// expire: a batch is flushed at the latest when its earliest handle's invisibility
    /// ends minus a margin of [`deadline_margin`](Self::deadline_margin) or a tenth of that
    /// message's invisible duration, whichever is longer (6 s for the proxy's 60 s; 1 s for
    /// an 8 s one). Without it (the default) the tenth does not apply and `max_delay` is 5 s.
    ///
    /// A message's invisibility is its `invisible_duration` when the proxy sends one, else
    /// the invisible time in its receipt handle, else 60 s. The 5.3.3 proxy sends only the
    /// handle's: its auto-renewed receives take its `defaultInvisibleTimeMills` (60 s unless
    /// configured). Against a real proxy configured with 20 s, a 25 s delay flushes 18 s after
    /// the receipt and every entry is accepted (the test
    /// `acks_that_follow_the_deadlines_go_out_before_the_handles_expire`); assuming 60 s, it
    /// flushed after 25 s and the proxy refused every entry as expired.
    ///
    /// The trade-off: a quiet (endpoint, topic) puts up to `max_delay` / 5 s times more
    /// entries in one `AckMessage` request, but acks spend up to `max_delay` in memory before
    /// they are sent. Acks not yet sent when the process crashes are lost: their messages are
    /// delivered again once their invisibility ends, so the redelivery exposure (messages
    /// handled but whose acks were not sent) grows with the delay, up to about `max_delay` ×
    /// the consume rate. Measured against the emulator with 1,000 topics at 2,000 msg/s
    /// (25 s): 50 entries per request instead of 10 (79 % fewer requests), and on average
    /// 25,000 messages exposed instead of 5,100 (at most 50,000 instead of 11,000). A graceful
    /// [`PushConsumer::close`](crate::PushConsumer::close) still flushes everything.
    ///
    /// The bound on acks held at once grows with the delay (65,536 per 5 s of `max_delay`,
    /// at most 1,048,576), so that a consumer of 8,000 messages per second is not throttled by
    /// its own pending acks; they take a few hundred bytes each.
    ///
    /// Do not count on the proxy's auto-renewal to extend the deadline: on the 5.3.3 proxy
    /// with 20 s invisibility, an ack sent 30 s after the receipt was refused as expired and
    /// the message delivered again, for this client and for the official Java client alike.
    /// The deadline above is the handle's first invisibility, whatever the renewal does.
    ///
    /// FIFO and late messages (see [`late_after`](Self::late_after)) are still acknowledged
    /// at once, and `max_items` still flushes full batches. Retries of a failed ack stop
    /// earlier too, by the part of the margin beyond `deadline_margin` (5 s before a 60 s
    /// handle expires: a retry in the last tenth of the invisibility races its end). This
    /// sets [`max_delay`](Self::max_delay); a later `max_delay` call changes it again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rocketmq_grpc::AckSettings;
    ///
    /// // 1,024 entries or 25 s per (endpoint, topic), and never later than 54 s after the
    /// // receipt of a message invisible for 60 s.
    /// let acks = AckSettings::default().follow_deadlines(Duration::from_secs(25));
    /// # let _ = acks;
    /// ```
    #[must_use]
    pub fn follow_deadlines(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self.follow_deadlines = true;
        self
    }

    /// The wait before the first retry of an ack or a nack (default 100 ms). Each further
    /// retry of the same message waits twice as long, up to
    /// [`max_retry_backoff`](Self::max_retry_backoff), with jitter; retries stop at the
    /// receipt handle's deadline.
    #[must_use]
    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// The longest wait between two retries of one ack or nack (default 5 s).
    #[must_use]
    pub fn max_retry_backoff(mut self, backoff: Duration) -> Self {
        self.max_retry_backoff = backoff;
        self
    }

    /// An observer that sees every ack with its own result (not the batch's top-level code).
    #[must_use]
    pub fn observer(mut self, observer: AckObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    pub(super) fn build(
        &self,
        flusher: AckFlusher,
        counters: Arc<Counters>,
        unacknowledged: Arc<Mutex<Unacked>>,
    ) -> Result<Batcher<AckKey, AckEntry, AckFlusher>, Error> {
        let observer = Counting {
            counters,
            unacknowledged,
            user: self.observer.clone(),
        };
        Batcher::builder()
            .max_items(self.max_items)
            .max_delay(self.max_delay)
            .deadline_margin(self.deadline_margin)
            .max_pending(self.max_pending())
            // Immediate acks (one entry per request) are not limited per topic, as in the
            // official clients; batches keep a few in flight per (endpoint, topic).
            .max_in_flight_per_key(if self.batching { 4 } else { 1024 })
            // Acks retry until the receipt handle's deadline passes (the item's deadline):
            // the attempt cap is the batcher's largest, never reached before the deadline
            // with a growing backoff (a 60 s handle allows about 17 attempts). The batcher's
            // retry budget (on by default) bounds the retries of all acks together.
            .retry(ack_retry_policy(self)?)
            .observer(Arc::new(observer))
            .build(flusher)
            .map_err(|error| Error::invalid("acks", error.to_string()))
    }
}

impl AckSettings {
    /// The most acks held at once (waiting or in flight) before `ack` waits for room: 65,536
    /// (at least `max_items`); under `follow_deadlines` 65,536 per 5 s of `max_delay`, at most
    /// 1,048,576, so that waiting longer does not throttle the consumer at the same rate.
    fn max_pending(&self) -> usize {
        let mut limit = PENDING_PER_5_S;
        if self.follow_deadlines {
            let periods = self.max_delay.as_secs_f64() / 5.0;
            if periods.is_finite() && periods > 1.0 {
                let scaled = (periods.ceil().min(16.0) as usize) * PENDING_PER_5_S;
                limit = scaled.min(MAX_PENDING);
            }
        }
        limit.max(self.max_items)
    }

    /// How a message's ack goes to the batcher: by the deadline of its receipt handle
    /// ([`ack_deadline`](Self::ack_deadline)), and at once (a batch of one) when batching is
    /// off, for FIFO messages (the next message of the group waits for the ack) and for
    /// messages acknowledged later than [`late_after`](Self::late_after) after their receipt.
    pub(super) fn item_options(
        &self,
        received_at: Instant,
        invisible_until: Instant,
        fifo: bool,
    ) -> ItemOptions {
        let late = received_at.elapsed() > self.late_after;
        let options = ItemOptions::new().deadline(self.ack_deadline(received_at, invisible_until));
        if !self.batching || fifo || late {
            options.immediate()
        } else {
            options
        }
    }

    /// The deadline handed to the ack batcher with a message's ack: the handle's expiry,
    /// moved earlier under [`follow_deadlines`](Self::follow_deadlines) so that the batcher
    /// (which subtracts `deadline_margin` itself) flushes at the latest a tenth of the
    /// invisible duration before the expiry when that is longer than `deadline_margin`.
    pub(super) fn ack_deadline(&self, received_at: Instant, invisible_until: Instant) -> Instant {
        if !self.follow_deadlines {
            return invisible_until;
        }
        let invisible = invisible_until.saturating_duration_since(received_at);
        let margin = self.deadline_margin.max(invisible / DEADLINE_SHARE);
        let extra = margin.saturating_sub(self.deadline_margin);
        invisible_until.checked_sub(extra).unwrap_or(received_at)
    }
}

/// Acks held at once per 5 s of `max_delay`.
const PENDING_PER_5_S: usize = 65_536;
/// The most acks held at once under `follow_deadlines`.
const MAX_PENDING: usize = 16 * PENDING_PER_5_S;
/// Under `follow_deadlines`, the margin is at least the invisible duration divided by this.
const DEADLINE_SHARE: u32 = 10;
const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(100);
const DEFAULT_MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);
/// The random share of each ack retry's wait.
const ACK_JITTER: f64 = 0.5;
/// The ack batcher's largest `max_attempts`; deadlines end retries long before.
const ACK_MAX_ATTEMPTS: u32 = 10_000;

/// Exponential (×2) from `retry_backoff` to `max_retry_backoff`, each wait shortened by a
/// random share of up to half of itself (the ack batcher's jitter: the entries of one failed
/// batch draw together, so their retries stay merged in one request).
fn ack_retry_policy(settings: &AckSettings) -> Result<RetryPolicy, Error> {
    if settings.max_retry_backoff < settings.retry_backoff {
        return Err(Error::invalid(
            "acks.max_retry_backoff",
            format!(
                "{:?} is shorter than retry_backoff {:?}",
                settings.max_retry_backoff, settings.retry_backoff
            ),
        ));
    }
    Ok(RetryPolicy::default()
        .backoff(settings.retry_backoff)
        .multiplier(2.0)
        .max_backoff(settings.max_retry_backoff)
        .jitter(ACK_JITTER)
        .max_attempts(ACK_MAX_ATTEMPTS))
}

/// Counts final ack outcomes and remembers the messages that could not be acknowledged
/// (forgetting them again when a later delivery is acknowledged), then forwards to the user's
/// observer.
struct Counting {
    counters: Arc<Counters>,
    unacknowledged: Arc<Mutex<Unacked>>,
    user: Option<AckObserver>,
}

impl Observer<AckKey, AckEntry, (), Error> for Counting {
    fn before_flush(&self, key: &AckKey, batch: &BatchInfo, items: &[AckEntry]) {
        if let Some(user) = &self.user {
            user.before_flush(key, batch, items);
        }
    }

    fn after_flush(
        &self,
        key: &AckKey,
        batch: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), Error>],
    ) {
        let mut acked = 0;
        let mut failed = 0;
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            if matches!(view.reply, ItemReply::Ok(())) {
                acked += 1;
                // A redelivered copy of a message whose earlier ack failed.
                self.unacknowledged.lock().remove(&view.item.message_id);
            } else {
                failed += 1;
                self.unacknowledged
                    .lock()
                    .insert(view.item.message_id.clone());
            }
        }
        Counters::add(&self.counters.acked, acked);
        Counters::add(&self.counters.ack_failed, failed);
        let retried = items.len() - (acked + failed) as usize;
        crate::metrics::acks(&key.topic, acked as usize, failed as usize, retried);
        if let Some(user) = &self.user {
            user.after_flush(key, batch, items);
        }
    }

    fn on_abandoned(&self, key: &AckKey, count: usize) {
        Counters::add(&self.counters.ack_abandoned, count as u64);
        if let Some(user) = &self.user {
            user.on_abandoned(key, count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_deadlines_moves_the_ack_deadline_by_a_tenth_of_the_invisibility() {
        let received = Instant::now();
        let secs = Duration::from_secs;
        let default = AckSettings::default();
        assert_eq!(
            default.ack_deadline(received, received + secs(60)),
            received + secs(60),
            "unchanged by default"
        );
        let follow = AckSettings::default().follow_deadlines(secs(25));
        assert_eq!(follow.max_delay, secs(25));
        assert_eq!(default.max_pending(), 65_536);
        assert_eq!(follow.max_pending(), 5 * 65_536);
        assert_eq!(
            AckSettings::default()
                .follow_deadlines(secs(3600))
                .max_pending(),
            16 * 65_536
        );
        assert_eq!(
            AckSettings::default().max_items(100_000).max_pending(),
            100_000
        );
        // The batcher subtracts its 1 s margin: flushed 6 s before a 60 s handle expires.
        assert_eq!(
            follow.ack_deadline(received, received + secs(60)),
            received + secs(55)
        );
        // A tenth of 8 s is less than the 1 s margin, which the batcher applies alone.
        assert_eq!(
            follow.ack_deadline(received, received + secs(8)),
            received + secs(8)
        );
        // An expiry at or before the receipt (a clock oddity) is left as it is.
        assert_eq!(follow.ack_deadline(received + secs(1), received), received);
        let wide = AckSettings::default()
            .deadline_margin(secs(10))
            .follow_deadlines(secs(25));
        assert_eq!(
            wide.ack_deadline(received, received + secs(30)),
            received + secs(30),
            "the longer deadline margin wins"
        );
    }
}
