//! Messages as the application sends and receives them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::pb;
use crate::{Endpoint, Error};

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub(crate) topic: String,
    pub(crate) body: Vec<u8>,
    pub(crate) tag: Option<String>,
    pub(crate) keys: Vec<String>,
    pub(crate) message_group: Option<String>,
    pub(crate) properties: HashMap<String, String>,
}

impl OutgoingMessage {
    /// A normal message for `topic`.
    pub fn new(topic: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            body: body.into(),
            ..Self::default()
        }
    }

    /// Sets the tag (consumers can filter on it).
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Adds an index key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Makes this a FIFO message of `group`: messages of one group are consumed in order.
    pub fn message_group(mut self, group: impl Into<String>) -> Self {
        self.message_group = Some(group.into());
        self
    }

    /// Adds a user property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

static MESSAGE_SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique message id: process, time and a sequence, upper-case hex.
pub(crate) fn new_message_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:08X}{:016X}{:08X}",
        std::process::id(),
        nanos,
        MESSAGE_SEQ.fetch_add(1, Ordering::Relaxed) as u32
    )
}

/// A message received by a consumer.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    /// The topic.
    pub topic: String,
    /// The message id.
    pub message_id: String,
    /// The body.
    pub body: Vec<u8>,
    /// The tag, if any.
    pub tag: Option<String>,
    /// Index keys.
    pub keys: Vec<String>,
    /// User properties.
    pub properties: HashMap<String, String>,
    /// The FIFO message group, for FIFO messages.
    pub message_group: Option<String>,
    /// How many times it was delivered (1 the first time).
    pub delivery_attempt: i32,
    /// The queue it came from.
    pub queue_id: i32,
    pub(crate) receipt_handle: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) received_at: Instant,
    pub(crate) invisible_until: Instant,
}

/// The invisibility the proxy gives auto-renewed pops when the message does not say.
pub(crate) const DEFAULT_INVISIBLE: Duration = Duration::from_secs(60);

impl ReceivedMessage {
    /// Reads a received `Message`; `None` (logged) when it lacks what an ack needs.
    pub(crate) fn from_pb(message: pb::Message, endpoint: &Endpoint) -> Result<Self, Error> {
        let received_at = Instant::now();
        let malformed = |what: &str| Error::Server {
            rpc: "ReceiveMessage",
            code: pb::Code::MessageCorrupted as i32,
            message: format!("a received message has no {what}"),
        };
        let system = message
            .system_properties
            .ok_or_else(|| malformed("system properties"))?;
        let receipt_handle = system
            .receipt_handle
            .filter(|handle| !handle.is_empty())
            .ok_or_else(|| malformed("receipt handle"))?;
        if system.message_id.is_empty() {
            return Err(malformed("message id"));
        }
        let invisible = system
            .invisible_duration
            .and_then(|d| Duration::try_from(d).ok())
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
            receipt_handle,
            endpoint: endpoint.clone(),
            received_at,
            invisible_until: received_at + invisible,
        })
    }

    /// Whether this is a FIFO message (it has a message group).
    pub fn is_fifo(&self) -> bool {
        self.message_group.is_some()
    }
}
