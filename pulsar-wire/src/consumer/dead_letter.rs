//! The dead-letter policy: a message (or an undecodable entry) delivered too often is
//! published to a dead-letter topic, then acknowledged, instead of looping forever.

use bytes::Bytes;

use crate::pool::Pool;
use crate::{Error, MessageId, OutgoingMessage, Producer, ProducerOptions};

/// The property naming the topic a dead-lettered message came from (the Java client's
/// `REAL_TOPIC`).
pub const REAL_TOPIC: &str = "REAL_TOPIC";

/// The property holding the original message id of a dead-lettered message, as the Java
/// client writes it (`ledger:entry:partition`, then `:batch_index` for a batched message).
pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";

/// The property this crate adds to an undecodable entry it dead-letters: what was wrong. The
/// payload of such a message is the entry's payload as stored (possibly compressed, possibly
/// a whole batch), not a decoded message.
pub const UNDECODABLE_REASON: &str = "UNDECODABLE_REASON";

/// When a consumer gives up on a message and moves it to a dead-letter topic, as the Java
/// client's `DeadLetterPolicy`.
///
/// A message (or an entry that cannot be decoded) that arrives with a `redelivery_count`
/// above [`DeadLetterPolicy::max_redeliver_count`] is not handed to the application (as with
/// the Java client, the application sees `max_redeliver_count + 1` deliveries): the
/// consumer publishes it to the dead-letter topic with its own producer (payload, key and
/// properties, plus [`REAL_TOPIC`] and [`ORIGIN_MESSAGE_ID`]) and acknowledges the original
/// only once that send succeeded. The redelivery count grows when the application nacks
/// ([`crate::Consumer::nack`], [`crate::Consumer::nack_id`]) on a Shared or Key_Shared
/// subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPolicy {
    max_redeliver_count: u32,
    dead_letter_topic: Option<String>,
    retry_letter_topic: Option<String>,
    initial_subscription_name: Option<String>,
}

impl DeadLetterPolicy {
    /// A policy that dead-letters messages arriving with `redelivery_count >
    /// max_redeliver_count` (at least 1) to `{topic}-{subscription}-DLQ`.
    pub fn new(max_redeliver_count: u32) -> Self {
        Self {
            max_redeliver_count,
            dead_letter_topic: None,
            retry_letter_topic: None,
            initial_subscription_name: None,
        }
    }

    /// The dead-letter topic (default `{topic}-{subscription}-DLQ`, the consumer's full topic
    /// name, not a partition's).
    #[must_use]
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// The retry-letter topic of a consumer with
    /// [`ConsumerOptions::enable_retry`](crate::ConsumerOptions::enable_retry) (default
    /// `{topic}-{subscription}-RETRY`, as the Java client's).
    #[must_use]
    pub fn retry_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.retry_letter_topic = Some(topic.into());
        self
    }

    /// A subscription created on the dead-letter topic before its first message is
    /// published, so that the dead letters are kept until someone reads them.
    #[must_use]
    pub fn initial_subscription_name(mut self, name: impl Into<String>) -> Self {
        self.initial_subscription_name = Some(name.into());
        self
    }

    /// See [`DeadLetterPolicy::new`].
    pub fn max_redeliver_count(&self) -> u32 {
        self.max_redeliver_count
    }

    /// See [`DeadLetterPolicy::initial_subscription_name`].
    pub fn initial_subscription(&self) -> Option<&str> {
        self.initial_subscription_name.as_deref()
    }

    /// The dead-letter topic of a consumer of `topic` on `subscription`.
    pub fn topic_for(&self, topic: &str, subscription: &str) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{topic}-{subscription}-DLQ"))
    }

    /// The retry-letter topic of a consumer of `topic` on `subscription`.
    pub fn retry_topic_for(&self, topic: &str, subscription: &str) -> String {
        self.retry_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{topic}-{subscription}-RETRY"))
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self
            .retry_letter_topic
            .as_deref()
            .is_some_and(|t| t.is_empty())
        {
            return Err(Error::Invalid {
                what: "retry_letter_topic",
                reason: "the name is empty".into(),
            });
        }
        if self.max_redeliver_count == 0 {
            return Err(Error::Invalid {
                what: "dead_letter max_redeliver_count",
                reason: "must be at least 1".into(),
            });
        }
        if self
            .dead_letter_topic
            .as_deref()
            .is_some_and(|t| t.is_empty())
        {
            return Err(Error::Invalid {
                what: "dead_letter_topic",
                reason: "the name is empty".into(),
            });
        }
        if self
            .initial_subscription_name
            .as_deref()
            .is_some_and(|s| s.is_empty())
        {
            return Err(Error::Invalid {
                what: "dead_letter initial_subscription_name",
                reason: "the name is empty".into(),
            });
        }
        Ok(())
    }
}

/// A consumer's dead-letter topic and its producer, created at the first dead letter.
#[derive(Debug)]
pub(crate) struct DeadLetters {
    pub(crate) policy: DeadLetterPolicy,
    pub(crate) topic: String,
    producer: tokio::sync::Mutex<Option<Producer>>,
}

impl DeadLetters {
    pub(crate) fn new(policy: DeadLetterPolicy, topic: &str, subscription: &str) -> Self {
        let topic = policy.topic_for(topic, subscription);
        Self::to(policy, topic)
    }

    /// Letters to `topic` (the retry-letter topic, say).
    pub(crate) fn to(policy: DeadLetterPolicy, topic: String) -> Self {
        Self {
            policy,
            topic,
            producer: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether a delivery with this redelivery count goes to the dead-letter topic.
    pub(crate) fn is_due(&self, redelivery_count: u32) -> bool {
        redelivery_count > self.policy.max_redeliver_count
    }

    /// Publishes one dead letter and waits until the broker stored it; `subscribe` creates
    /// the policy's initial subscription on the dead-letter topic (given the topic and the
    /// subscription's name) before the first one.
    pub(crate) async fn publish<S, F>(
        &self,
        pool: &Pool,
        message: OutgoingMessage,
        subscribe: S,
    ) -> Result<MessageId, Error>
    where
        S: FnOnce(String, String) -> F,
        F: Future<Output = Result<(), Error>>,
    {
        let producer = {
            let mut producer = self.producer.lock().await;
            match &*producer {
                Some(existing) => existing.clone(),
                None => {
                    if let Some(name) = self.policy.initial_subscription() {
                        // Subscribing creates the durable subscription; it stays after the
                        // consumer closes.
                        subscribe(self.topic.clone(), name.to_owned()).await?;
                    }
                    let created = Producer::create(
                        pool,
                        &self.topic,
                        ProducerOptions::default().no_batching(),
                    )
                    .await?;
                    producer.insert(created).clone()
                }
            }
        };
        producer.send(message).await
    }
}

/// The message to publish for a dead letter: `payload`, `key` and `properties` as received,
/// plus where it came from.
pub(crate) fn dead_letter(
    payload: Bytes,
    key: Option<&str>,
    properties: &[(String, String)],
    topic: &str,
    id: &MessageId,
) -> OutgoingMessage {
    let mut message = OutgoingMessage::new(payload);
    if let Some(key) = key {
        message = message.key(key);
    }
    for (name, value) in properties {
        if name != REAL_TOPIC && name != ORIGIN_MESSAGE_ID {
            message = message.property(name.clone(), value.clone());
        }
    }
    message
        .property(REAL_TOPIC, topic)
        .property(ORIGIN_MESSAGE_ID, origin_id(id))
}

/// A message id as the Java client prints it.
pub(crate) fn origin_id(id: &MessageId) -> String {
    if id.batch_size.is_some() && id.batch_index >= 0 {
        format!(
            "{}:{}:{}:{}",
            id.ledger_id, id.entry_id, id.partition, id.batch_index
        )
    } else {
        format!("{}:{}:{}", id.ledger_id, id.entry_id, id.partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_ids_print_as_the_java_client_does() {
        let mut id = MessageId {
            ledger_id: 3,
            entry_id: 9,
            partition: -1,
            batch_index: -1,
            batch_size: None,
        };
        assert_eq!(origin_id(&id), "3:9:-1");
        id.batch_index = 2;
        id.batch_size = Some(4);
        id.partition = 1;
        assert_eq!(origin_id(&id), "3:9:1:2");
    }

    #[test]
    fn the_default_topic_and_validation() {
        let policy = DeadLetterPolicy::new(2);
        assert_eq!(
            policy.topic_for("persistent://public/default/t", "s"),
            "persistent://public/default/t-s-DLQ"
        );
        assert!(policy.validate().is_ok());
        assert!(DeadLetterPolicy::new(0).validate().is_err());
        assert!(
            DeadLetterPolicy::new(1)
                .dead_letter_topic("")
                .validate()
                .is_err()
        );
        let named = DeadLetterPolicy::new(1).dead_letter_topic("dlq");
        assert_eq!(named.topic_for("t", "s"), "dlq");
    }
}
