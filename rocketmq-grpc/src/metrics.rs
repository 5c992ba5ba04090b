//! Every metric of the crate, emitted here and only here, through the `metrics` facade
//! (feature `metrics`). Without the feature each function is empty and inlined away, so the
//! call sites need no `cfg`.
//!
//! The names are shared with `pulsar-wire` (`mq_client_*`, label `client`); the README's
//! "Metrics" section is the reference (names, labels, units, what each counts).

/// The `client` label of every metric of this crate.
#[cfg(feature = "metrics")]
const CLIENT: &str = "rocketmq";

/// The operations of `mq_client_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retried {
    /// A `SendMessage` attempt after a failed one.
    Send,
    /// An ack entry flushed again after a failed or missing result.
    Ack,
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
    /// A send retry held back by the producer's retry budget.
    RetryBudget,
}

#[cfg(feature = "metrics")]
impl Retried {
    fn label(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::Ack => "ack",
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
            Self::RetryBudget => "retry_budget",
        }
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

/// A send being measured: its start, messages and size with the feature, nothing without.
#[derive(Debug)]
pub(crate) struct SendMeter {
    #[cfg(feature = "metrics")]
    started: tokio::time::Instant,
    #[cfg(feature = "metrics")]
    messages: usize,
    #[cfg(feature = "metrics")]
    bytes: usize,
}

impl SendMeter {
    /// A send of `messages` (one request: a message or a batch) of `bytes` body bytes starts
    /// now.
    #[inline]
    pub(crate) fn start(messages: usize, bytes: impl FnOnce() -> usize) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (messages, bytes);
        Self {
            #[cfg(feature = "metrics")]
            started: tokio::time::Instant::now(),
            #[cfg(feature = "metrics")]
            messages,
            #[cfg(feature = "metrics")]
            bytes: bytes(),
        }
    }

    /// The send to `topic` ended: receipted (`ok`, its latency counted from the start,
    /// retries included) or failed for good (after its retries).
    #[inline]
    pub(crate) fn finish(self, topic: &str, ok: bool) {
        #[cfg(feature = "metrics")]
        {
            let topic = topic.to_owned();
            if ok {
                ::metrics::counter!("mq_client_messages_sent_total", "client" => CLIENT, "topic" => topic.clone())
                    .increment(self.messages as u64);
                ::metrics::counter!("mq_client_bytes_sent_total", "client" => CLIENT, "topic" => topic.clone())
                    .increment(self.bytes as u64);
                ::metrics::histogram!("mq_client_send_duration_seconds", "client" => CLIENT, "topic" => topic)
                    .record(self.started.elapsed());
            } else {
                ::metrics::counter!("mq_client_send_failures_total", "client" => CLIENT, "topic" => topic)
                    .increment(self.messages as u64);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self, topic, ok);
    }
}

/// `messages` of `topic` were received from the proxy.
#[inline]
pub(crate) fn received(topic: &str, messages: usize) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("mq_client_messages_received_total", "client" => CLIENT, "topic" => topic.to_owned())
        .increment(messages as u64);
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, messages);
}

/// One ack request (`AckMessage`) of `topic` was answered: `acked` entries acknowledged for
/// good, `failed` entries failed for good (not retried any more); `retried` go again.
#[inline]
pub(crate) fn acks(topic: &str, acked: usize, failed: usize, retried: usize) {
    #[cfg(feature = "metrics")]
    {
        let topic = topic.to_owned();
        ::metrics::counter!("mq_client_ack_requests_total", "client" => CLIENT, "topic" => topic.clone())
            .increment(1);
        ::metrics::counter!("mq_client_ack_entries_total", "client" => CLIENT, "topic" => topic.clone())
            .increment(acked as u64);
        if failed > 0 {
            ::metrics::counter!("mq_client_ack_failures_total", "client" => CLIENT, "topic" => topic)
                .increment(failed as u64);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (topic, acked, failed);
    if retried > 0 {
        retries(Retried::Ack, retried);
    }
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

/// A producer or consumer (`role`) opened its telemetry stream again after it broke, and
/// announced its settings again.
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

/// The priority gate held `level` back: it paused the level's topic (push consumer), or a
/// receive left it out (simple consumer).
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
