//! [`OutgoingMessage`]: a message to send, with its key, properties and event time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// When to deliver it, in milliseconds since the epoch, or why the time asked for cannot
    /// be sent.
    pub(crate) deliver_at: Option<Result<u64, String>>,
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
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Its ordering key (`ordering_key`): on a Key_Shared subscription it decides the
    /// consumer instead of the partition key, and key-based batching groups by it
    /// ([`BatchingOptions::key_based`](crate::BatchingOptions::key_based)). It does not route between partitions.
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<Bytes>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a property.
    #[must_use]
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Its event time, in milliseconds since the epoch.
    #[must_use]
    pub fn event_time(mut self, millis: u64) -> Self {
        self.event_time = Some(millis);
        self
    }

    /// Delivers it no earlier than `delay` from now (the Java client's `deliverAfter`): the
    /// time is taken now, from this machine's clock, and sent as [`OutgoingMessage::deliver_at`]
    /// sends it.
    #[must_use]
    pub fn deliver_after(self, delay: Duration) -> Self {
        match SystemTime::now().checked_add(delay) {
            Some(at) => self.deliver_at(at),
            None => Self {
                deliver_at: Some(Err(format!(
                    "a delay of {delay:?} from now is past what a time can hold"
                ))),
                ..self
            },
        }
    }

    /// Delivers it no earlier than `time` (the Java client's `deliverAt`; the metadata's
    /// `deliver_at_time`, in milliseconds since the epoch). A time already past delivers it at
    /// once.
    ///
    /// The broker holds a delayed message back from **Shared and Key_Shared** subscriptions
    /// only; Exclusive and Failover subscriptions receive it at once. It is sent on its own,
    /// never in a batch (as the Java client sends it: a batch has one delivery time), and may
    /// go out before batched messages sent earlier. A broker with `delayedDeliveryEnabled=false`
    /// delivers it at once; with its default `isDelayedDeliveryDeliverAtTimeStrict=false` it
    /// may deliver it up to `delayedDeliveryTickTimeMillis` (1 s by default) early, never early
    /// with `true`. A namespace or topic policy `maxDeliveryDelay` makes the broker refuse a
    /// longer delay ([`Producer::send`](crate::Producer::send) fails with its error). A time
    /// before 1970 or beyond what the protocol's 64-bit milliseconds hold makes the send fail
    /// with [`Error::Invalid`](crate::Error::Invalid).
    #[must_use]
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        let millis = time
            .duration_since(UNIX_EPOCH)
            .map_err(|_| format!("{time:?} is before 1970, which deliver_at_time cannot hold"))
            .and_then(|since| {
                u64::try_from(since.as_millis())
                    .ok()
                    .filter(|millis| i64::try_from(*millis).is_ok())
                    .ok_or_else(|| {
                        format!(
                            "{time:?} is past what deliver_at_time (64-bit milliseconds since \
                             1970) can hold"
                        )
                    })
            });
        self.deliver_at = Some(millis);
        self
    }

    /// When it is to be delivered, in milliseconds since the epoch, if a valid time was set
    /// ([`OutgoingMessage::deliver_at`]).
    pub fn delivery_time(&self) -> Option<u64> {
        self.deliver_at
            .as_ref()
            .and_then(|at| at.as_ref().ok().copied())
    }

    /// Whether it is delivered at a time of its own (and so sent on its own, not batched).
    pub(crate) fn is_delayed(&self) -> bool {
        self.deliver_at.is_some()
    }

    /// Its `deliver_at_time`, or [`Error::Invalid`](crate::Error::Invalid) when the time asked
    /// for cannot be sent.
    pub(crate) fn deliver_at_time(&self) -> Result<Option<i64>, crate::Error> {
        match &self.deliver_at {
            None => Ok(None),
            Some(Ok(millis)) => Ok(i64::try_from(*millis).ok()),
            Some(Err(reason)) => Err(crate::Error::Invalid {
                what: "deliver_at",
                reason: reason.clone(),
            }),
        }
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
