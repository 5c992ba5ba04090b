//! Messages as the application sends and receives them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::time::Instant;

use crate::pb;
use crate::{Endpoint, Error};

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub(crate) topic: String,
    pub(crate) body: Bytes,
    pub(crate) tag: Option<String>,
    pub(crate) keys: Vec<String>,
    pub(crate) message_group: Option<String>,
    pub(crate) properties: HashMap<String, String>,
    pub(crate) deliver_at: Option<SystemTime>,
    pub(crate) priority: Option<u32>,
    pub(crate) lite_topic: Option<String>,
}

impl OutgoingMessage {
    /// A normal message for `topic` with this body.
    ///
    /// The body is a [`Bytes`]: anything that converts into one is taken (`Vec<u8>`, `String`,
    /// `&'static [u8]`, `&'static str`, `Bytes`; copy a borrowed slice with
    /// [`Bytes::copy_from_slice`]). Zero-copy: the message shares the body's memory, and so do
    /// its clones and the send's retries; it is written out once, by the gRPC encoder.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use rocketmq_grpc::OutgoingMessage;
    ///
    /// let from_vec = OutgoingMessage::new("orders", vec![1, 2, 3]);
    /// assert_eq!(from_vec.body(), &[1_u8, 2, 3][..]);
    ///
    /// let from_str = OutgoingMessage::new("orders", "hello");
    /// assert_eq!(from_str.body(), "hello");
    ///
    /// let shared = Bytes::from(vec![0_u8; 1024]);
    /// let from_bytes = OutgoingMessage::new("orders", shared.clone());
    /// // The same memory, not a copy.
    /// assert_eq!(from_bytes.body().as_ptr(), shared.as_ptr());
    /// ```
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            body: body.into(),
            ..Self::default()
        }
    }

    /// Sets the tag (consumers can filter on it).
    #[must_use]
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Adds an index key.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Makes this a FIFO message of `group`: messages of one group are consumed in order.
    #[must_use]
    pub fn message_group(mut self, group: impl Into<String>) -> Self {
        self.message_group = Some(group.into());
        self
    }

    /// Adds a user property.
    #[must_use]
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Delivers it no earlier than `delay` from now (the Java client's
    /// `setDeliveryTimestamp(now + delay)`): the time is taken now, from this machine's clock,
    /// and sent as [`OutgoingMessage::deliver_at`] sends it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rocketmq_grpc::OutgoingMessage;
    ///
    /// let reminder = OutgoingMessage::new("reminders", "pay the bill")
    ///     .deliver_after(Duration::from_secs(30 * 60));
    /// assert!(reminder.delivery_time().is_some());
    /// ```
    #[must_use]
    pub fn deliver_after(self, delay: Duration) -> Self {
        let now = SystemTime::now();
        // A delay past what the clock holds: a century ahead, which the proxy refuses too.
        let at = now
            .checked_add(delay)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
            .unwrap_or(now);
        self.deliver_at(at)
    }

    /// Makes this a delay (timed) message: the broker keeps it from consumers until `time`
    /// (message type `DELAY`, `SystemProperties.delivery_timestamp`, as the Java client's
    /// `setDeliveryTimestamp`).
    ///
    /// - The topic must accept delay messages: a topic created with `message.type=DELAY` (or
    ///   `MIXED`); the proxy refuses it on a `NORMAL` topic with
    ///   `MESSAGE_PROPERTY_CONFLICT_WITH_TYPE`.
    /// - It cannot be FIFO: with a [`message_group`](Self::message_group) too,
    ///   [`Producer::send`](crate::Producer::send) fails before sending with
    ///   [`Error::Invalid`] naming `deliver_at` (the Java client refuses both at once).
    /// - A time more than a second in the past is refused before sending with
    ///   [`Error::Invalid`] naming `deliver_at` (the Java client sends it and the broker
    ///   delivers it at once, which hides a scheduling bug; send without a delivery time to
    ///   deliver now). Up to a second late is sent as it is (the broker's timer precision).
    /// - The proxy refuses a time further ahead than its `maxDelayTimeMills` (1 day by
    ///   default in 5.3.3; the broker's own `timerMaxDelaySec`, 3 days, is not reached) with
    ///   `ILLEGAL_DELIVERY_TIME`: the send fails at once with [`Error::Server`], not retried
    ///   ([`Error::is_retryable`] is false), its message naming the limit.
    /// - Precision is the millisecond; the broker's timer wheel ticks every second
    ///   (`timerPrecisionMs`, 1 s), so a message may arrive up to about a second after `time`.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use rocketmq_grpc::OutgoingMessage;
    ///
    /// let at = SystemTime::now() + Duration::from_secs(10);
    /// let message = OutgoingMessage::new("it-delay", "later").deliver_at(at);
    /// assert_eq!(message.delivery_time(), Some(at));
    /// ```
    #[must_use]
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        self.deliver_at = Some(time);
        self
    }

    /// The delivery time set by [`deliver_at`](Self::deliver_at) or
    /// [`deliver_after`](Self::deliver_after).
    pub fn delivery_time(&self) -> Option<SystemTime> {
        self.deliver_at
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Moves it to `topic` (the priority router's level topics).
    pub(crate) fn set_topic(&mut self, topic: &str) {
        topic.clone_into(&mut self.topic);
    }

    /// The value of the user property `key`, if set.
    pub fn property_value(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Makes this a priority message of level `priority` (RocketMQ 5.4+, RIP-80; message type
    /// `PRIORITY`, `SystemProperties.priority`, as the Java client's `setPriority`).
    ///
    /// - **Higher is more urgent.** The broker stores a message of priority `p` on queue
    ///   `min(p, queues - 1)` of the topic and, for a consumer that pops every queue (push and
    ///   simple consumers), takes the highest queue first: a backlog of low-priority messages
    ///   waits while higher ones are there. So a topic of 8 queues has the levels 0 to 7 and
    ///   every priority above 7 is 7.
    /// - The topic must be a priority topic (`message.type=PRIORITY`); a 5.4+ proxy refuses
    ///   the message on any other topic with `MESSAGE_PROPERTY_CONFLICT_WITH_TYPE`.
    /// - A RocketMQ 5.3 proxy does not know the field: it stores the message as a normal one on
    ///   whatever queue it picks (on a normal topic) and the level is lost.
    /// - It cannot be combined with [`message_group`](Self::message_group),
    ///   [`deliver_at`](Self::deliver_at), [`lite_topic`](Self::lite_topic) or a transaction,
    ///   and it must be at most `i32::MAX` (the protocol's `int32`): otherwise
    ///   [`Producer::send`](crate::Producer::send) fails before sending with
    ///   [`Error::Invalid`] naming `priority`.
    ///
    /// ```
    /// use rocketmq_grpc::OutgoingMessage;
    ///
    /// let urgent = OutgoingMessage::new("it-priority", "page the on-call").priority(7);
    /// assert_eq!(urgent.priority_level(), Some(7));
    /// ```
    #[must_use]
    pub fn priority(mut self, priority: u32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The level set by [`priority`](Self::priority).
    pub fn priority_level(&self) -> Option<u32> {
        self.priority
    }

    /// Sends it to the lite topic `lite_topic` under its (parent) topic (RocketMQ 5.4+,
    /// RIP-83; message type `LITE`, `SystemProperties.lite_topic`, as the Java client's
    /// `setLiteTopic`). A [`LitePushConsumer`](crate::LitePushConsumer) that subscribed to it
    /// receives it.
    ///
    /// - The topic must be a lite topic (`message.type=LITE`); a 5.4+ proxy refuses the message
    ///   on any other topic with `MESSAGE_PROPERTY_CONFLICT_WITH_TYPE`. The broker keeps one
    ///   light queue per lite topic (`%LMQ%$parent$lite`); messages of one lite topic also go to
    ///   one queue of the parent (the proxy hashes the lite topic like a message group).
    /// - A name is made of ASCII letters, digits, `-` and `_`, and the proxy takes at most
    ///   `maxLiteTopicSize` bytes (64 by default; `ILLEGAL_LITE_TOPIC` beyond).
    /// - A RocketMQ 5.3 proxy does not know the field and stores a normal message.
    /// - It cannot be combined with [`message_group`](Self::message_group),
    ///   [`deliver_at`](Self::deliver_at), [`priority`](Self::priority) or a transaction; an
    ///   empty name or another character fails the send before sending with
    ///   [`Error::Invalid`] naming `lite_topic`.
    ///
    /// ```
    /// use rocketmq_grpc::OutgoingMessage;
    ///
    /// let reply = OutgoingMessage::new("it-lite", "your answer").lite_topic("session-42");
    /// assert_eq!(reply.lite_topic_name(), Some("session-42"));
    /// ```
    #[must_use]
    pub fn lite_topic(mut self, lite_topic: impl Into<String>) -> Self {
        self.lite_topic = Some(lite_topic.into());
        self
    }

    /// The lite topic set by [`lite_topic`](Self::lite_topic).
    pub fn lite_topic_name(&self) -> Option<&str> {
        self.lite_topic.as_deref()
    }

    /// Refuses a delivery time more than [`PAST_DELIVERY_GRACE`] before `now`.
    pub(crate) fn check_delivery_time(&self, now: SystemTime) -> Result<(), Error> {
        let Some(at) = self.deliver_at else {
            return Ok(());
        };
        match now.duration_since(at) {
            Ok(late) if late > PAST_DELIVERY_GRACE => Err(Error::invalid(
                "deliver_at",
                format!(
                    "the delivery time is {:.3} s in the past; send the message without a \
                     delivery time to deliver it now, or give a time ahead",
                    late.as_secs_f64()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The message type the Java client gives it: `DELAY` with a delivery time, `FIFO` with a
    /// message group, `NORMAL` otherwise; an error for both (the Java client's builder refuses
    /// "deliveryTimestamp and messageGroup should not be set at same time").
    pub(crate) fn message_type(&self, transactional: bool) -> Result<pb::MessageType, Error> {
        if let Some(kind) = self.priority_or_lite_type(transactional)? {
            return Ok(kind);
        }
        if transactional {
            return match (&self.deliver_at, &self.message_group) {
                (None, None) => Ok(pb::MessageType::Transaction),
                (Some(_), _) => Err(Error::invalid(
                    "deliver_at",
                    "a transactional message cannot have a delivery time: the proxy refuses \
                     it; send it without deliver_at, or outside the transaction",
                )),
                (None, Some(group)) => Err(Error::invalid(
                    "message_group",
                    format!(
                        "a transactional message cannot have a message group ({group:?}): the \
                         proxy refuses it; send it without one"
                    ),
                )),
            };
        }
        match (&self.deliver_at, &self.message_group) {
            (Some(_), Some(group)) => Err(Error::invalid(
                "deliver_at",
                format!(
                    "a message cannot have both a delivery time and a message group ({group:?}): \
                     delay messages cannot be FIFO; send it without one of them"
                ),
            )),
            (Some(_), None) => Ok(pb::MessageType::Delay),
            (None, Some(_)) => Ok(pb::MessageType::Fifo),
            (None, None) => Ok(pb::MessageType::Normal),
        }
    }
}

impl OutgoingMessage {
    /// `PRIORITY` or `LITE` for a message with a priority or a lite topic (checked: valid and
    /// alone among the typed options); `None` for the other messages.
    fn priority_or_lite_type(&self, transactional: bool) -> Result<Option<pb::MessageType>, Error> {
        let (setting, kind) = match (self.priority, &self.lite_topic) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "priority",
                    "a message cannot have both a priority and a lite topic: send it with one \
                     of them",
                ));
            }
            (Some(_), None) => ("priority", pb::MessageType::Priority),
            (None, Some(_)) => ("lite_topic", pb::MessageType::Lite),
        };
        let other = if transactional {
            Some("a transaction")
        } else if self.message_group.is_some() {
            Some("a message group (FIFO)")
        } else if self.deliver_at.is_some() {
            Some("a delivery time")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(Error::invalid(
                setting,
                format!(
                    "a message with a {} cannot also have {other}: the broker takes one message \
                     type per message; send it without one of them",
                    setting.replace('_', " ")
                ),
            ));
        }
        if let Some(priority) = self.priority
            && i32::try_from(priority).is_err()
        {
            return Err(Error::invalid(
                "priority",
                format!("{priority} is not in 0..=2147483647 (the protocol's int32)"),
            ));
        }
        if let Some(name) = &self.lite_topic {
            check_lite_topic(name)?;
        }
        Ok(Some(kind))
    }
}

/// A lite topic name as the proxy takes it: not empty, ASCII letters, digits, `-` and `_`
/// (its length limit is the proxy's `maxLiteTopicSize`, left to it).
pub(crate) fn check_lite_topic(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid("lite_topic", "the lite topic name is empty"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(Error::invalid(
            "lite_topic",
            format!(
                "{name:?} has {bad:?}: a lite topic name takes only ASCII letters, digits, '-' \
                 and '_'"
            ),
        ));
    }
    Ok(())
}

/// How late a delivery time may be at the send and still go out (the broker's timer ticks
/// every second).
pub(crate) const PAST_DELIVERY_GRACE: Duration = Duration::from_secs(1);

static MESSAGE_SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique message id: process, time and a sequence, upper-case hex.
pub(crate) fn new_message_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // The process id, read once: `std::process::id` is a system call each time (one per
    // message was a tenth of a producer's system calls).
    static PROCESS_ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    format!(
        "{:08X}{:016X}{:08X}",
        PROCESS_ID.get_or_init(std::process::id),
        nanos,
        MESSAGE_SEQ.fetch_add(1, Ordering::Relaxed) as u32
    )
}

/// A message received by a consumer.
///
/// Read it with its accessors ([`body`](Self::body), [`topic`](Self::topic),
/// [`message_id`](Self::message_id), [`tag`](Self::tag), [`keys`](Self::keys),
/// [`properties`](Self::properties), ...); [`into_body`](Self::into_body) takes the body
/// without copying. Only consumers make one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReceivedMessage {
    pub(crate) topic: String,
    pub(crate) message_id: String,
    pub(crate) body: Bytes,
    pub(crate) tag: Option<String>,
    pub(crate) keys: Vec<String>,
    pub(crate) properties: HashMap<String, String>,
    pub(crate) message_group: Option<String>,
    pub(crate) delivery_attempt: i32,
    pub(crate) queue_id: i32,
    pub(crate) deliver_at: Option<SystemTime>,
    pub(crate) priority: Option<i32>,
    pub(crate) lite_topic: Option<String>,
    pub(crate) receipt_handle: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) received_at: Instant,
    pub(crate) invisible_until: Instant,
}

/// The invisibility the proxy gives auto-renewed pops by default (`defaultInvisibleTimeMills`),
/// assumed when neither the message nor its receipt handle says.
pub(crate) const DEFAULT_INVISIBLE: Duration = Duration::from_secs(60);

/// The invisible time a receipt handle was issued with: its third space-separated field, in
/// milliseconds (`startOffset retrieveTime invisibleTime reviveQueueId topicType brokerName
/// queueId offset [commitLogOffset]`, the broker's format). The 5.3.3 proxy does not set the
/// message's `invisible_duration`, and its auto-renewed receives take the proxy's configured
/// `defaultInvisibleTimeMills` (60 s unless configured; 20 s in this project's broker script),
/// so the handle is the only place the client learns it. `None` for a handle of another shape:
/// the format is the broker's, not the protocol's.
fn invisible_in_handle(handle: &str) -> Option<Duration> {
    let mut fields = handle.split(' ');
    let invisible_ms: u64 = fields.nth(2)?.parse().ok()?;
    // The broker's decoder needs at least 8 fields.
    if fields.count() < 5 || invisible_ms == 0 {
        return None;
    }
    Some(Duration::from_millis(invisible_ms))
}

impl ReceivedMessage {
    /// Reads a received `Message`; an error when it lacks what an ack needs.
    pub(crate) fn from_pb(message: pb::Message, endpoint: &Endpoint) -> Result<Self, Error> {
        Self::decode(message, endpoint, true)
    }

    /// Reads the message of a transaction check (it has no receipt handle: it is not
    /// acknowledged).
    pub(crate) fn from_check(message: pb::Message, endpoint: &Endpoint) -> Result<Self, Error> {
        Self::decode(message, endpoint, false)
    }

    fn decode(message: pb::Message, endpoint: &Endpoint, with_handle: bool) -> Result<Self, Error> {
        let received_at = Instant::now();
        let malformed = |what: &str| Error::Server {
            rpc: "ReceiveMessage",
            code: pb::Code::MessageCorrupted as i32,
            message: format!("a received message has no {what}"),
        };
        let system = message
            .system_properties
            .ok_or_else(|| malformed("system properties"))?;
        let receipt_handle = system.receipt_handle.filter(|handle| !handle.is_empty());
        let receipt_handle = match receipt_handle {
            Some(handle) => handle,
            None if !with_handle => String::new(),
            None => return Err(malformed("receipt handle")),
        };
        if system.message_id.is_empty() {
            return Err(malformed("message id"));
        }
        let invisible = system
            .invisible_duration
            .and_then(|d| Duration::try_from(d).ok())
            .or_else(|| invisible_in_handle(&receipt_handle))
            .unwrap_or(DEFAULT_INVISIBLE);
        Ok(Self {
            topic: message.topic.map(|t| t.name).unwrap_or_default(),
            message_id: system.message_id,
            body: message.body,
            tag: system.tag,
            keys: system.keys,
            properties: message.user_properties,
            message_group: system.message_group,
            delivery_attempt: system.delivery_attempt.unwrap_or(1),
            queue_id: system.queue_id,
            deliver_at: system
                .delivery_timestamp
                .and_then(|t| SystemTime::try_from(t).ok()),
            priority: system.priority,
            lite_topic: system.lite_topic.filter(|name| !name.is_empty()),
            receipt_handle,
            endpoint: endpoint.clone(),
            received_at,
            invisible_until: received_at + invisible,
        })
    }

    /// The topic it was received from (without the namespace).
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The message id (given by the producer's client).
    #[must_use]
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The body. Zero-copy: a slice of the buffer the gRPC message was decoded from, shared by
    /// clones; a body kept long after its message keeps that buffer alive, so copy a small one
    /// ([`Bytes::copy_from_slice`]) to keep it alone.
    #[must_use]
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body, by value (no copy; see [`body`](Self::body)).
    #[must_use]
    pub fn into_body(self) -> Bytes {
        self.body
    }

    /// The tag, if any.
    #[must_use]
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The index keys.
    #[must_use]
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The user properties.
    #[must_use]
    pub fn properties(&self) -> &HashMap<String, String> {
        &self.properties
    }

    /// The user property `key`, if set.
    #[must_use]
    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// The FIFO message group, for FIFO messages.
    #[must_use]
    pub fn message_group(&self) -> Option<&str> {
        self.message_group.as_deref()
    }

    /// How many times it was delivered (1 the first time).
    #[must_use]
    pub fn delivery_attempt(&self) -> i32 {
        self.delivery_attempt
    }

    /// The queue it came from.
    #[must_use]
    pub fn queue_id(&self) -> i32 {
        self.queue_id
    }

    /// Whether this is a FIFO message (it has a message group).
    pub fn is_fifo(&self) -> bool {
        self.message_group.is_some()
    }

    /// When the producer asked for it to be delivered, for a delay message
    /// ([`OutgoingMessage::deliver_at`], to the millisecond, as the proxy returns it in
    /// `SystemProperties.delivery_timestamp`); `None` for other messages.
    ///
    /// ```no_run
    /// # fn demo(message: &rocketmq_grpc::ReceivedMessage) {
    /// if let Some(due) = message.deliver_at() {
    ///     let late = std::time::SystemTime::now().duration_since(due).unwrap_or_default();
    ///     println!("{} arrived {late:?} after its delivery time", message.message_id());
    /// }
    /// # }
    /// ```
    pub fn deliver_at(&self) -> Option<SystemTime> {
        self.deliver_at
    }

    /// The priority the producer gave it ([`OutgoingMessage::priority`], as the proxy returns
    /// it in `SystemProperties.priority`), for a message of a priority topic on RocketMQ 5.4+;
    /// `None` otherwise (a 5.3 proxy never sets it, and a 5.4+ broker drops the level of a
    /// message sent to a topic of another type).
    ///
    /// ```no_run
    /// # fn demo(message: &rocketmq_grpc::ReceivedMessage) {
    /// if message.priority().is_some_and(|level| level >= 5) {
    ///     println!("urgent: {}", message.message_id());
    /// }
    /// # }
    /// ```
    pub fn priority(&self) -> Option<i32> {
        self.priority
    }

    /// The lite topic it was sent to ([`OutgoingMessage::lite_topic`]), for a message of a lite
    /// topic on RocketMQ 5.4+; `None` otherwise.
    ///
    /// ```no_run
    /// # fn demo(message: &rocketmq_grpc::ReceivedMessage) {
    /// if let Some(session) = message.lite_topic() {
    ///     println!("a reply for {session}");
    /// }
    /// # }
    /// ```
    pub fn lite_topic(&self) -> Option<&str> {
        self.lite_topic.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invisible_time_is_read_from_a_broker_handle_and_nothing_else() {
        let broker = "7 1796410169007 20000 2 0 broker-a 3 7 123456";
        assert_eq!(invisible_in_handle(broker), Some(Duration::from_secs(20)));
        // Eight fields (no commit log offset) are a broker handle too.
        assert_eq!(
            invisible_in_handle("7 1796410169007 60000 2 0 broker-a 3 7"),
            Some(Duration::from_secs(60))
        );
        for other in [
            "",
            "opaque-handle",
            "7 1796410169007 20000 2 0 broker-a 3",
            "7 1796410169007 soon 2 0 broker-a 3 7",
            "7 1796410169007 -5 2 0 broker-a 3 7",
            "7 1796410169007 0 2 0 broker-a 3 7",
        ] {
            assert_eq!(invisible_in_handle(other), None, "{other:?}");
        }
    }

    fn message(handle: &str, invisible: Option<Duration>) -> pb::Message {
        pb::Message {
            system_properties: Some(pb::SystemProperties {
                receipt_handle: Some(handle.to_owned()),
                message_id: "id".to_owned(),
                invisible_duration: invisible.and_then(|d| d.try_into().ok()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_received_body_is_a_slice_of_the_decoded_buffer_not_a_copy() {
        use prost::Message as _;

        let body = Bytes::from(vec![7_u8; 64 * 1024]);
        let wire = pb::Message {
            body: body.clone(),
            ..message("h", None)
        }
        .encode_to_vec();
        // As tonic decodes a gRPC message: from a `Bytes`-backed buffer.
        let frame = Bytes::from(wire);
        let decoded = pb::Message::decode(frame.clone()).unwrap();
        let endpoint = Endpoint::parse("127.0.0.1:8081").unwrap();
        let received = ReceivedMessage::from_pb(decoded, &endpoint).unwrap();
        assert_eq!(received.body, body);
        let inside = frame.as_ptr_range();
        assert!(
            inside.contains(&received.body.as_ptr()),
            "the body was copied"
        );
        // And a sent body is shared with the message, not copied.
        let outgoing = OutgoingMessage::new("t", body.clone());
        assert_eq!(outgoing.clone().body().as_ptr(), body.as_ptr());
    }

    #[test]
    fn a_received_message_is_invisible_for_what_the_message_then_the_handle_says() {
        let endpoint = Endpoint::parse("127.0.0.1:8081").unwrap();
        let handle = "7 1796410169007 20000 2 0 broker-a 3 7 123456";
        let invisible = |m: ReceivedMessage| m.invisible_until - m.received_at;
        let m = ReceivedMessage::from_pb(message(handle, None), &endpoint).unwrap();
        assert_eq!(invisible(m), Duration::from_secs(20));
        let explicit = Some(Duration::from_secs(30));
        let m = ReceivedMessage::from_pb(message(handle, explicit), &endpoint).unwrap();
        assert_eq!(invisible(m), Duration::from_secs(30));
        let m = ReceivedMessage::from_pb(message("opaque", None), &endpoint).unwrap();
        assert_eq!(invisible(m), DEFAULT_INVISIBLE);
    }
}

#[cfg(test)]
mod typed_tests {
    use super::*;

    fn setting(result: Result<pb::MessageType, Error>) -> &'static str {
        match result {
            Err(Error::Invalid { what, .. }) => what,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn priority_and_lite_messages_take_their_type_alone() {
        let m = OutgoingMessage::new("t", "b");
        assert_eq!(
            m.clone().priority(0).message_type(false).unwrap(),
            pb::MessageType::Priority
        );
        assert_eq!(
            m.clone()
                .priority(i32::MAX as u32)
                .message_type(false)
                .unwrap(),
            pb::MessageType::Priority
        );
        assert_eq!(
            m.clone().lite_topic("a-b_C9").message_type(false).unwrap(),
            pb::MessageType::Lite
        );
        let at = SystemTime::now() + Duration::from_secs(60);
        for (message, expected) in [
            (m.clone().priority(1 << 31), "priority"),
            (m.clone().priority(1).lite_topic("x"), "priority"),
            (m.clone().priority(1).message_group("g"), "priority"),
            (m.clone().priority(1).deliver_at(at), "priority"),
            (m.clone().lite_topic("x").message_group("g"), "lite_topic"),
            (m.clone().lite_topic("x").deliver_at(at), "lite_topic"),
            (m.clone().lite_topic(""), "lite_topic"),
            (m.clone().lite_topic("a b"), "lite_topic"),
            (m.clone().lite_topic("é"), "lite_topic"),
        ] {
            assert_eq!(
                setting(message.message_type(false)),
                expected,
                "{message:?}"
            );
        }
        assert_eq!(
            setting(m.clone().priority(1).message_type(true)),
            "priority"
        );
        assert_eq!(setting(m.lite_topic("x").message_type(true)), "lite_topic");
    }

    #[test]
    fn received_priority_and_lite_topic_are_read() {
        let endpoint = Endpoint::parse("127.0.0.1:8081").unwrap();
        let message = pb::Message {
            system_properties: Some(pb::SystemProperties {
                receipt_handle: Some("h".into()),
                message_id: "id".into(),
                priority: Some(5),
                lite_topic: Some("session-1".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = ReceivedMessage::from_pb(message, &endpoint).unwrap();
        assert_eq!(m.priority(), Some(5));
        assert_eq!(m.lite_topic(), Some("session-1"));
    }
}
