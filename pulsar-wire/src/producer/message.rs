//! [`OutgoingMessage`]: a message to send, with its key, properties and event time.

use bytes::Bytes;

use crate::pb::KeyValue;

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutgoingMessage {
    pub(crate) payload: Bytes,
    pub(crate) key: Option<String>,
    pub(crate) ordering_key: Option<Bytes>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) event_time: Option<u64>,
}

impl OutgoingMessage {
    /// A message with this payload.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            ..Self::default()
        }
    }

    /// Its key (`partition_key`): routes it on a partitioned topic and groups it on a
    /// Key_Shared subscription (unless it has an ordering key).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Its ordering key (`ordering_key`): on a Key_Shared subscription it decides the
    /// consumer instead of the partition key, and key-based batching groups by it
    /// ([`BatchingOptions::key_based`](crate::BatchingOptions::key_based)). It does not route between partitions.
    pub fn ordering_key(mut self, key: impl Into<Bytes>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Its event time, in milliseconds since the epoch.
    pub fn event_time(mut self, millis: u64) -> Self {
        self.event_time = Some(millis);
        self
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Its key, if it has one.
    pub fn partition_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The key a Key_Shared subscription dispatches it by: the ordering key when it has one,
    /// else the partition key's bytes ([`crate::sticky_key_hash`] gives its hash).
    pub fn sticky_key(&self) -> Option<&[u8]> {
        self.ordering_key
            .as_deref()
            .or_else(|| self.key.as_deref().map(str::as_bytes))
    }

    /// Its properties, in the order they were added.
    pub fn properties(&self) -> &[(String, String)] {
        &self.properties
    }

    /// The value of property `name` (the first one added with that name).
    pub fn property_value(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn key_values(&self) -> Vec<KeyValue> {
        self.properties
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// Roughly what the message takes in a batch (payload, key, properties, framing).
    pub(crate) fn encoded_size(&self) -> usize {
        let properties: usize = self
            .properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum();
        self.payload.len()
            + self.key.as_ref().map_or(0, |k| k.len() + 2)
            + self.ordering_key.as_ref().map_or(0, |k| k.len() + 2)
            + properties
            + 16
    }
}
