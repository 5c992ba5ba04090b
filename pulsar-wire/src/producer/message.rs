//! [`OutgoingMessage`]: a message to send, with its key, properties and event time.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::pb::KeyValue;

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutgoingMessage {
    pub(crate) payload: Bytes,
    /// All but the payload, boxed, and `None` until one of them is set (every setter sets a
    /// value that is not the default, so equal messages have equal `extras`): a send moves
    /// the message several times (into its future, the batcher, the batch), and a plain
    /// message is 40 bytes instead of 176.
    extras: Option<Box<Extras>>,
}

/// What a message may carry besides its payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Extras {
    pub(crate) key: Option<String>,
    pub(crate) ordering_key: Option<Bytes>,
    pub(crate) properties: Vec<(String, String)>,
    /// Its event time, in milliseconds since the epoch, or why the time asked for cannot be
    /// sent.
    pub(crate) event_time: Option<Result<u64, String>>,
    /// When to deliver it, in milliseconds since the epoch, or why the time asked for cannot
    /// be sent.
    pub(crate) deliver_at: Option<Result<u64, String>>,
}

/// The extras of a message that has none.
static NO_EXTRAS: Extras = Extras {
    key: None,
    ordering_key: None,
    properties: Vec::new(),
    event_time: None,
    deliver_at: None,
};

impl OutgoingMessage {
    /// A message with this payload.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            extras: None,
        }
    }

    /// Its key, ordering key, properties and times.
    pub(crate) fn extras(&self) -> &Extras {
        self.extras.as_deref().unwrap_or(&NO_EXTRAS)
    }

    fn extras_mut(&mut self) -> &mut Extras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// Its key (`partition_key`): routes it on a partitioned topic and groups it on a
    /// Key_Shared subscription (unless it has an ordering key).
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.extras_mut().key = Some(key.into());
        self
    }

    /// Its ordering key (`ordering_key`): on a Key_Shared subscription it decides the
    /// consumer instead of the partition key, and key-based batching groups by it
    /// ([`BatchingOptions::key_based`](crate::BatchingOptions::key_based)). It does not route between partitions.
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<Bytes>) -> Self {
        self.extras_mut().ordering_key = Some(key.into());
        self
    }

    /// Adds a property.
    #[must_use]
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extras_mut()
            .properties
            .push((key.into(), value.into()));
        self
    }

    /// Its event time (the metadata's `event_time`, sent in milliseconds since the epoch, so
    /// to the millisecond): when the event it records happened, for the application; the
    /// broker does not read it.
    ///
    /// The protocol reads an event time of 0 as none, so [`UNIX_EPOCH`](std::time::UNIX_EPOCH) arrives as no event
    /// time ([`Message::event_time`](crate::Message::event_time) gives `None`). A time before
    /// 1970 or beyond what the protocol's unsigned 64-bit milliseconds hold makes the send
    /// fail with [`Error::Invalid`](crate::Error::Invalid).
    #[must_use]
    pub fn event_time(mut self, time: SystemTime) -> Self {
        self.extras_mut().event_time = Some(crate::time::to_millis(time, "event_time"));
        self
    }

    /// Its event time in milliseconds since the epoch, as sent; copied as is from a received
    /// message (retry and dead letters), so no precision is lost.
    pub(crate) fn event_time_millis(mut self, millis: u64) -> Self {
        self.extras_mut().event_time = Some(Ok(millis));
        self
    }

    /// Delivers it no earlier than `delay` from now (the Java client's `deliverAfter`): the
    /// time is taken now, from this machine's clock, and sent as [`OutgoingMessage::deliver_at`]
    /// sends it.
    #[must_use]
    pub fn deliver_after(self, delay: Duration) -> Self {
        match SystemTime::now().checked_add(delay) {
            Some(at) => self.deliver_at(at),
            None => {
                let mut message = self;
                message.extras_mut().deliver_at = Some(Err(format!(
                    "a delay of {delay:?} from now is past what a time can hold"
                )));
                message
            }
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
        let millis = crate::time::to_millis(time, "deliver_at_time").and_then(|millis| {
            // deliver_at_time is signed on the wire.
            i64::try_from(millis).map(|_| millis).map_err(|_| {
                format!(
                    "{time:?} is past what deliver_at_time (signed 64-bit milliseconds since \
                     1970) can hold"
                )
            })
        });
        self.extras_mut().deliver_at = Some(millis);
        self
    }

    /// When it is to be delivered, to the millisecond (as it is sent), if a valid time was set
    /// ([`OutgoingMessage::deliver_at`], [`OutgoingMessage::deliver_after`]).
    pub fn delivery_time(&self) -> Option<SystemTime> {
        self.extras()
            .deliver_at
            .as_ref()
            .and_then(|at| at.as_ref().ok().copied())
            .map(crate::time::from_millis)
    }

    /// Its `event_time` as sent (`None` when none was set; a time that cannot be sent fails
    /// [`OutgoingMessage::check_times`] first).
    pub(crate) fn event_time_wire(&self) -> Option<u64> {
        self.extras()
            .event_time
            .as_ref()
            .and_then(|at| at.as_ref().ok().copied())
    }

    /// [`Error::Invalid`](crate::Error::Invalid) when a time asked for (delivery or event
    /// time) cannot be sent.
    pub(crate) fn check_times(&self) -> Result<(), crate::Error> {
        self.deliver_at_time()?;
        match &self.extras().event_time {
            Some(Err(reason)) => Err(crate::Error::Invalid {
                what: "event_time",
                reason: reason.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether it is delivered at a time of its own (and so sent on its own, not batched).
    pub(crate) fn is_delayed(&self) -> bool {
        self.extras().deliver_at.is_some()
    }

    /// Its `deliver_at_time`, or [`Error::Invalid`](crate::Error::Invalid) when the time asked
    /// for cannot be sent.
    pub(crate) fn deliver_at_time(&self) -> Result<Option<i64>, crate::Error> {
        match &self.extras().deliver_at {
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
        self.extras().key.as_deref()
    }

    /// The key a Key_Shared subscription dispatches it by: the ordering key when it has one,
    /// else the partition key's bytes ([`crate::sticky_key_hash`] gives its hash).
    pub fn sticky_key(&self) -> Option<&[u8]> {
        self.extras()
            .ordering_key
            .as_deref()
            .or_else(|| self.extras().key.as_deref().map(str::as_bytes))
    }

    /// Its properties, in the order they were added.
    pub fn properties(&self) -> &[(String, String)] {
        &self.extras().properties
    }

    /// The value of property `name` (the first one added with that name).
    pub fn property_value(&self, name: &str) -> Option<&str> {
        self.extras()
            .properties
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn key_values(&self) -> Vec<KeyValue> {
        self.extras()
            .properties
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// Whether a batch carries more of the message than its payload size and sequence id:
    /// a key, an ordering key, properties or an event time.
    pub(crate) fn has_metadata(&self) -> bool {
        let Some(extras) = &self.extras else {
            return false;
        };
        extras.key.is_some()
            || extras.ordering_key.is_some()
            || !extras.properties.is_empty()
            || self.event_time_wire().is_some()
    }

    /// Roughly what the message takes in a batch (payload, key, properties, framing).
    pub(crate) fn encoded_size(&self) -> usize {
        const FRAMING: usize = 16;
        let Some(extras) = &self.extras else {
            return self.payload.len() + FRAMING;
        };
        let properties: usize = extras
            .properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum();
        self.payload.len()
            + extras.key.as_ref().map_or(0, |k| k.len() + 2)
            + extras.ordering_key.as_ref().map_or(0, |k| k.len() + 2)
            + properties
            + FRAMING
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn a_message_is_its_payload_and_a_pointer_and_equal_by_content() {
        // A send moves the message several times: it stays small (it was 176 bytes).
        assert!(std::mem::size_of::<OutgoingMessage>() <= 40);
        let plain = OutgoingMessage::new("a");
        assert_eq!(plain, OutgoingMessage::new("a"));
        assert_ne!(plain, OutgoingMessage::new("b"));
        let keyed = OutgoingMessage::new("a").key("k").property("p", "v");
        assert_ne!(plain, keyed);
        assert_eq!(keyed, OutgoingMessage::new("a").key("k").property("p", "v"));
        assert_eq!(
            (keyed.partition_key(), keyed.property_value("p")),
            (Some("k"), Some("v"))
        );
        assert!(keyed.has_metadata() && !plain.has_metadata());
        assert_eq!(keyed.encoded_size(), 1 + 3 + 8 + 16);
        assert_eq!(plain.encoded_size(), 1 + 16);
    }

    #[test]
    fn times_are_kept_to_the_millisecond_they_are_sent_with() {
        let at = UNIX_EPOCH + Duration::from_millis(1_733_500_000_123);
        let message = OutgoingMessage::new("x")
            .event_time(at + Duration::from_micros(999))
            .deliver_at(at + Duration::from_nanos(1));
        assert_eq!(message.delivery_time(), Some(at));
        assert_eq!(message.event_time_wire(), Some(1_733_500_000_123));
        assert_eq!(
            message.deliver_at_time().ok(),
            Some(Some(1_733_500_000_123))
        );
        assert!(message.check_times().is_ok());
        assert_eq!(OutgoingMessage::new("x").delivery_time(), None);
    }

    #[test]
    fn times_that_cannot_be_sent_fail_the_check_naming_the_field() {
        let before_1970 = UNIX_EPOCH - Duration::from_millis(1);
        let message = OutgoingMessage::new("x").event_time(before_1970);
        assert_eq!(message.event_time_wire(), None);
        let error = message.check_times().expect_err("refused");
        assert!(
            matches!(&error, crate::Error::Invalid { what: "event_time", reason }
                if reason.contains("1970")),
            "{error}"
        );
        // Past the signed 64-bit milliseconds of deliver_at_time, within event_time's unsigned.
        let far = UNIX_EPOCH + Duration::from_millis(u64::MAX);
        let message = OutgoingMessage::new("x").event_time(far).deliver_at(far);
        assert_eq!(message.event_time_wire(), Some(u64::MAX));
        assert_eq!(message.delivery_time(), None);
        let error = message.check_times().expect_err("refused");
        assert!(
            matches!(
                &error,
                crate::Error::Invalid {
                    what: "deliver_at",
                    ..
                }
            ),
            "{error}"
        );
    }
}
