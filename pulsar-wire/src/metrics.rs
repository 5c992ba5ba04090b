//! Every metric of the crate, emitted here and only here, through the `metrics` facade
//! (feature `metrics`). Without the feature each function is empty and inlined away, so the
//! call sites need no `cfg`.
//!
//! The names are shared with `rocketmq-grpc` (`mq_client_*`, label `client`); the README's
//! "Metrics" section is the reference (names, labels, units, what each counts). The `topic`
//! label is the topic's full name without a partition suffix: a partitioned topic is one
//! series, however many partitions it has.

#[cfg(feature = "metrics")]
use std::time::Duration;

/// The `client` label of every metric of this crate.
#[cfg(feature = "metrics")]
const CLIENT: &str = "pulsar";

/// The operations of `mq_client_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retried {
    /// A message sent again after its producer registered again (a reconnection).
    Send,
}

/// The roles of `mq_client_reconnects_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

/// What a client waited for, in `mq_client_blocked_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A send waiting for a place in the producer's pending queue
    /// (`ProducerOptions::max_pending_messages` with `QueueFull::Block`).
    PendingQueue,
}

#[cfg(feature = "metrics")]
impl Retried {
    fn label(self) -> &'static str {
        match self {
            Self::Send => "send",
        }
    }
}

#[cfg(feature = "metrics")]
impl Role {
    fn label(self) -> &'static str {
        match self {
            Self::Producer => "producer",
            Self::Consumer => "consumer",
        }
    }
}

#[cfg(feature = "metrics")]
impl Blocked {
    fn label(self) -> &'static str {
        match self {
            Self::PendingQueue => "pending_queue",
        }
    }
}

/// The `topic` label of `topic`: without a partition suffix (`-partition-<n>`).
#[cfg(feature = "metrics")]
fn topic_label(topic: &str) -> String {
    match topic.rsplit_once("-partition-") {
        Some((base, index))
            if !base.is_empty()
                && !index.is_empty()
                && index.bytes().all(|b| b.is_ascii_digit()) =>
        {
            base.to_owned()
        }
        _ => topic.to_owned(),
    }
}

/// A priority level as a label value, without an allocation for the usual levels.
#[cfg(feature = "metrics")]
fn level_label(level: u8) -> ::metrics::SharedString {
    const LEVELS: [&str; 16] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
    ];
    match LEVELS.get(usize::from(level)) {
        Some(label) => ::metrics::SharedString::const_str(label),
        None => ::metrics::SharedString::from(level.to_string()),
    }
}

/// A send being measured: its start and size with the feature, nothing without (so that a
/// send's future does not grow).
#[derive(Debug)]
pub(crate) struct SendMeter {
    #[cfg(feature = "metrics")]
    started: tokio::time::Instant,
    #[cfg(feature = "metrics")]
    bytes: usize,
}

impl SendMeter {
    /// A send of `bytes` payload bytes starts now.
    #[inline]
    pub(crate) fn start(bytes: usize) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = bytes;
        Self {
            #[cfg(feature = "metrics")]
            started: tokio::time::Instant::now(),
            #[cfg(feature = "metrics")]
            bytes,
        }
    }

    /// The send to `topic` ended: receipted (`ok`) or failed.
    #[inline]
    pub(crate) fn finish(self, topic: &str, ok: bool) {
        #[cfg(feature = "metrics")]
        if ok {
            sent(topic, 1, self.bytes, self.started.elapsed());
        } else {
            send_failed(topic, 1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self, topic, ok);
    }
}

/// `messages` of `bytes` payload bytes were sent to `topic` and receipted `elapsed` after the
/// send was called (waits for room and reconnections included).
#[cfg(feature = "metrics")]
fn sent(topic: &str, messages: usize, bytes: usize, elapsed: Duration) {
    let topic = topic_label(topic);
    ::metrics::counter!("mq_client_messages_sent_total", "client" => CLIENT, "topic" => topic.clone())
        .increment(messages as u64);
    ::metrics::counter!("mq_client_bytes_sent_total", "client" => CLIENT, "topic" => topic.clone())
        .increment(bytes as u64);
    ::metrics::histogram!("mq_client_send_duration_seconds", "client" => CLIENT, "topic" => topic)
        .record(elapsed);
}

/// A send of `messages` to `topic` failed (too large, refused, timed out, queue full, closed).
#[cfg(feature = "metrics")]
fn send_failed(topic: &str, messages: usize) {
    ::metrics::counter!("mq_client_send_failures_total", "client" => CLIENT, "topic" => topic_label(topic))
        .increment(messages as u64);
}

/// `messages` of `topic` (or one of its partitions) were received from the broker.
#[inline]
pub(crate) fn received(topic: &str, messages: usize) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("mq_client_messages_received_total", "client" => CLIENT, "topic" => topic_label(topic))
        .increment(messages as u64);
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, messages);
}

/// One ack request (`ACK` command) of `topic` (or one of its partitions) for `entries`
/// acknowledged messages was sent (and receipted, with ack receipts), or failed (`ok` false:
/// the broker delivers those messages again).
#[inline]
pub(crate) fn acks(topic: &str, entries: usize, ok: bool) {
    #[cfg(feature = "metrics")]
    {
        let topic = topic_label(topic);
        if ok {
            ::metrics::counter!("mq_client_ack_requests_total", "client" => CLIENT, "topic" => topic.clone())
                .increment(1);
            ::metrics::counter!("mq_client_ack_entries_total", "client" => CLIENT, "topic" => topic)
                .increment(entries as u64);
        } else {
            ::metrics::counter!("mq_client_ack_failures_total", "client" => CLIENT, "topic" => topic)
                .increment(entries as u64);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, entries, ok);
}

/// `count` retries of `operation`.
#[inline]
pub(crate) fn retries(operation: Retried, count: usize) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("mq_client_retries_total", "client" => CLIENT, "operation" => operation.label())
        .increment(count as u64);
    #[cfg(not(feature = "metrics"))]
    let _ = (operation, count);
}

/// A producer or consumer (`role`) of a partition registered again after its connection was
/// lost, the broker closed it or its topic moved.
#[inline]
pub(crate) fn reconnected(role: Role) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("mq_client_reconnects_total", "client" => CLIENT, "role" => role.label())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = role;
}

/// The start of a wait, for `mq_client_blocked_seconds`: nothing without the feature.
#[derive(Debug)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    started: tokio::time::Instant,
}

impl Stopwatch {
    /// A wait starts now.
    #[inline]
    pub(crate) fn start() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            started: tokio::time::Instant::now(),
        }
    }

    /// The wait for `what` ended.
    #[inline]
    pub(crate) fn blocked(&self, what: Blocked) {
        #[cfg(feature = "metrics")]
        ::metrics::histogram!("mq_client_blocked_seconds", "client" => CLIENT, "reason" => what.label())
            .record(self.started.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = (self, what);
    }
}

/// The priority gate handed `messages` of `level` to the application.
#[inline]
pub(crate) fn priority_delivered(level: Option<u8>, messages: usize) {
    #[cfg(feature = "metrics")]
    if let Some(level) = level {
        ::metrics::counter!("mq_client_priority_delivered_total", "client" => CLIENT, "level" => level_label(level))
            .increment(messages as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (level, messages);
}

/// The priority gate held `level` back: it paused a partition of the level (withheld its
/// `FLOW` permits).
#[inline]
pub(crate) fn priority_held(level: Option<u8>) {
    #[cfg(feature = "metrics")]
    if let Some(level) = level {
        ::metrics::counter!("mq_client_priority_held_total", "client" => CLIENT, "level" => level_label(level))
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = level;
}

/// Registers the description and unit of every metric of the crate with the installed
/// recorder (a Prometheus exporter prints them as `# HELP` lines).
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use ::metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        "mq_client_messages_sent_total",
        Unit::Count,
        "Messages the broker receipted"
    );
    describe_counter!(
        "mq_client_bytes_sent_total",
        Unit::Bytes,
        "Body (payload) bytes of the messages the broker receipted"
    );
    describe_counter!(
        "mq_client_send_failures_total",
        Unit::Count,
        "Messages whose send failed for good (after its retries)"
    );
    describe_histogram!(
        "mq_client_send_duration_seconds",
        Unit::Seconds,
        "From a send's call to its receipt, retries included"
    );
    describe_counter!(
        "mq_client_messages_received_total",
        Unit::Count,
        "Messages received from the broker"
    );
    describe_counter!(
        "mq_client_ack_requests_total",
        Unit::Count,
        "Ack requests sent (RocketMQ AckMessage RPCs, Pulsar ACK commands)"
    );
    describe_counter!(
        "mq_client_ack_entries_total",
        Unit::Count,
        "Messages acknowledged"
    );
    describe_counter!(
        "mq_client_ack_failures_total",
        Unit::Count,
        "Messages whose ack failed for good"
    );
    describe_counter!(
        "mq_client_retries_total",
        Unit::Count,
        "Retries, per operation"
    );
    describe_counter!(
        "mq_client_reconnects_total",
        Unit::Count,
        "Producers and consumers registered again after a lost connection or stream"
    );
    describe_histogram!(
        "mq_client_blocked_seconds",
        Unit::Seconds,
        "Time a call waited for room (queue space, retry budget), per reason"
    );
    describe_counter!(
        "mq_client_priority_delivered_total",
        Unit::Count,
        "Messages the priority gate handed to the application, per level"
    );
    describe_counter!(
        "mq_client_priority_held_total",
        Unit::Count,
        "Times the priority gate held a level back, per level"
    );
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::topic_label;

    #[test]
    fn a_partition_is_labelled_with_its_topic() {
        let topic = "persistent://public/default/orders";
        assert_eq!(topic_label(&format!("{topic}-partition-11")), topic);
        assert_eq!(topic_label(topic), topic);
        assert_eq!(topic_label("t-partition-x"), "t-partition-x");
        assert_eq!(topic_label("t-partition-"), "t-partition-");
        assert_eq!(topic_label("-partition-3"), "-partition-3");
    }
}
