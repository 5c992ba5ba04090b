//! Retry letters: what [`Consumer::reconsume_later`](super::Consumer::reconsume_later)
//! publishes to the retry-letter topic (or, past the maximum, to the dead-letter topic), with
//! the Java client's properties, so that a Java consumer of the retry topic understands ours
//! and the reverse.
//!
//! The Java client (`ConsumerImpl.doReconsumeLater`, 4.0) copies the message's properties and
//! adds, unless present: [`REAL_TOPIC`] (the topic it was first published to, without a
//! partition suffix), [`ORIGIN_MESSAGE_ID`] (and its deprecated misspelt twin
//! `ORIGIN_MESSAGE_IDY_TIME`), [`REAL_SUBSCRIPTION`]; then sets [`RECONSUME_TIMES`] (1, or
//! one more than the message carried) and [`DELAY_TIME`] (milliseconds). Above the dead-letter
//! policy's maximum the letter goes to the dead-letter topic, without a delay; otherwise to
//! the retry topic, delivered after the delay. Key, ordering key and event time are copied.

use std::time::Duration;

use super::Message;
use super::dead_letter::{ORIGIN_MESSAGE_ID, REAL_TOPIC, origin_id};
use crate::OutgoingMessage;
use crate::pool::base_topic;

/// The property counting how many times a message was reconsumed later (the Java client's
/// `RECONSUMETIMES`).
pub const RECONSUME_TIMES: &str = "RECONSUMETIMES";

/// The property holding the delay of the last reconsume, in milliseconds (`DELAY_TIME`).
pub const DELAY_TIME: &str = "DELAY_TIME";

/// The property naming the subscription that reconsumed the message (`REAL_SUBSCRIPTION`).
pub const REAL_SUBSCRIPTION: &str = "REAL_SUBSCRIPTION";

/// The Java client still writes the origin id under this misspelt name too, "for
/// compatibility with the old version".
const ORIGIN_MESSAGE_ID_OLD: &str = "ORIGIN_MESSAGE_IDY_TIME";

/// The default maximum of reconsumes when retry is enabled without a dead-letter policy (the
/// Java client's `MAX_RECONSUMETIMES`).
pub const MAX_RECONSUME_TIMES: u32 = 16;

/// A retry letter for `message`, and its reconsume count.
pub(crate) struct Letter {
    pub(crate) message: OutgoingMessage,
    pub(crate) times: u32,
}

/// The letter that reconsumes `message` (received on `subscription`) after `delay`.
pub(crate) fn letter(message: &Message, subscription: &str, delay: Duration) -> Letter {
    // Sorted by name, as the Java client's TreeMap.
    let mut properties: std::collections::BTreeMap<String, String> = message
        .properties()
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let origin = origin_id(&message.id());
    properties
        .entry(REAL_TOPIC.to_owned())
        .or_insert_with(|| base_topic(message.topic()).to_owned());
    properties
        .entry(ORIGIN_MESSAGE_ID_OLD.to_owned())
        .or_insert_with(|| origin.clone());
    properties
        .entry(ORIGIN_MESSAGE_ID.to_owned())
        .or_insert(origin);
    properties
        .entry(REAL_SUBSCRIPTION.to_owned())
        .or_insert_with(|| subscription.to_owned());
    let times = properties
        .get(RECONSUME_TIMES)
        .and_then(|times| times.parse::<u32>().ok())
        .map_or(1, |times| times.saturating_add(1));
    properties.insert(RECONSUME_TIMES.to_owned(), times.to_string());
    properties.insert(DELAY_TIME.to_owned(), delay.as_millis().to_string());
    let mut letter = OutgoingMessage::new(message.payload().clone());
    if let Some(key) = message.key() {
        letter = letter.key(key);
    }
    if let Some(key) = message.ordering_key() {
        letter = letter.ordering_key(key.clone());
    }
    if let Some(millis) = message.event_time_millis() {
        letter = letter.event_time_millis(millis);
    }
    for (name, value) in properties {
        letter = letter.property(name, value);
    }
    Letter {
        message: letter,
        times,
    }
}
