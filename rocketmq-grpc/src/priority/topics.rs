//! [`PriorityTopics`]: where each priority level lives, and routing a message there.

use std::collections::HashSet;

use mq_priority::{Level, PriorityPolicy};

use crate::{Error, OutgoingMessage, ReceivedMessage};

/// The longest topic name the proxy accepts (`ILLEGAL_TOPIC` beyond).
pub const MAX_TOPIC_LEN: usize = 127;

/// Where the levels of a [`PriorityPolicy`] live on RocketMQ: one topic per level ("level
/// topics", any 5.x broker) or one priority topic with the broker's native priorities (5.4+).
/// See the [module docs](crate::priority) for why levels cannot share the queues of one
/// normal topic.
///
/// The name says what it holds: the topics a prioritised application sends to and consumes
/// from, with the policy that maps a message to one of them. Producers route with
/// [`route`](Self::route); consumers read a message's level with [`level_of`](Self::level_of)
/// and gate their receives with
/// [`PushConsumerBuilder::priority`](crate::PushConsumerBuilder::priority).
///
/// Cheap to clone; clones share the policy's parse counters ([`PriorityPolicy::stats`]).
///
/// ```
/// use rocketmq_grpc::OutgoingMessage;
/// use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
///
/// let policy = PriorityPolicy::new(3).unwrap();
/// // RocketMQ 5.4+: one PRIORITY topic of at least 3 queues.
/// let native = PriorityTopics::builder(policy.clone()).native("alerts").build()?;
/// let urgent = OutgoingMessage::new("alerts", "disk full").property(policy.property(), "0");
/// assert_eq!(native.route(urgent)?.priority_level(), Some(2));
/// # Ok::<(), rocketmq_grpc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PriorityTopics {
    policy: PriorityPolicy,
    place: Place,
}

#[derive(Debug, Clone)]
enum Place {
    /// One topic per level, most important first.
    Levels(Vec<String>),
    /// One priority topic.
    Native(String),
}

/// Builds a [`PriorityTopics`]; exactly one of [`level_topics`](Self::level_topics) and
/// [`native`](Self::native) must be given.
#[derive(Debug, Clone)]
pub struct PriorityTopicsBuilder {
    policy: PriorityPolicy,
    level_topics: Option<Vec<String>>,
    native: Option<String>,
}

impl PriorityTopics {
    /// Starts describing where the levels of `policy` live.
    ///
    /// ```
    /// use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    ///
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
    ///     .level_topics(["jobs-high", "jobs-low"])
    ///     .build()?;
    /// assert_eq!(topics.topics(), ["jobs-high", "jobs-low"]);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn builder(policy: PriorityPolicy) -> PriorityTopicsBuilder {
        PriorityTopicsBuilder {
            policy,
            level_topics: None,
            native: None,
        }
    }

    /// The policy (its property name, levels and parse counters).
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap()).native("t").build()?;
    /// assert_eq!(topics.policy().levels(), 2);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn policy(&self) -> &PriorityPolicy {
        &self.policy
    }

    /// Whether the levels are the native priorities of one topic (RocketMQ 5.4+).
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap()).native("t").build()?;
    /// assert!(topics.is_native());
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn is_native(&self) -> bool {
        matches!(self.place, Place::Native(_))
    }

    /// Every topic, most important level first: the level topics, or the one native topic.
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap()).native("t").build()?;
    /// assert_eq!(topics.topics(), ["t"]);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn topics(&self) -> Vec<&str> {
        match &self.place {
            Place::Levels(topics) => topics.iter().map(String::as_str).collect(),
            Place::Native(topic) => vec![topic.as_str()],
        }
    }

    /// The topic of `level` (a level outside the policy is the default level).
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{Level, PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
    ///     .level_topics(["hi", "lo"])
    ///     .build()?;
    /// assert_eq!(topics.topic_of(Level::new(1)), "lo");
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn topic_of(&self, level: Level) -> &str {
        let level = self.policy.clamp(level);
        match &self.place {
            Place::Levels(topics) => topics
                .get(level.index())
                .or_else(|| topics.first())
                .map_or("", String::as_str),
            Place::Native(topic) => topic,
        }
    }

    /// The level whose topic is `topic` (level topics only; `None` for the native topic and
    /// for any other topic).
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{Level, PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
    ///     .level_topics(["hi", "lo"])
    ///     .build()?;
    /// assert_eq!(topics.level_of_topic("lo"), Some(Level::new(1)));
    /// assert_eq!(topics.level_of_topic("other"), None);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn level_of_topic(&self, topic: &str) -> Option<Level> {
        match &self.place {
            Place::Levels(topics) => topics
                .iter()
                .position(|t| t == topic)
                .and_then(|i| u8::try_from(i).ok())
                .map(Level::new),
            Place::Native(_) => None,
        }
    }

    /// The native priority of `level` (native only): `levels - 1 - level`, so level 0 has the
    /// highest. A level outside the policy is the default level.
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{Level, PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(3).unwrap()).native("t").build()?;
    /// assert_eq!(topics.native_priority(Level::new(0)), Some(2));
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn native_priority(&self, level: Level) -> Option<u32> {
        match self.place {
            Place::Levels(_) => None,
            Place::Native(_) => {
                let level = self.policy.clamp(level);
                let levels = u32::try_from(self.policy.levels()).unwrap_or(u32::MAX);
                Some(
                    levels
                        .saturating_sub(1)
                        .saturating_sub(u32::from(level.get())),
                )
            }
        }
    }

    /// The level of `message`, read from its priority property (counted in
    /// [`PriorityPolicy::stats`]; a missing or invalid value is the policy's default level).
    ///
    /// ```
    /// # use rocketmq_grpc::OutgoingMessage;
    /// # use rocketmq_grpc::priority::{Level, PriorityPolicy, PriorityTopics};
    /// let policy = PriorityPolicy::new(2).unwrap();
    /// let topics = PriorityTopics::builder(policy.clone()).native("t").build()?;
    /// let message = OutgoingMessage::new("t", "b").property(policy.property(), "1");
    /// assert_eq!(topics.level_of_outgoing(&message), Level::new(1));
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn level_of_outgoing(&self, message: &OutgoingMessage) -> Level {
        self.policy
            .level_of(message.property_value(self.policy.property()))
    }

    /// Puts `message` where its level lives: the level is read from the policy's property
    /// (missing, invalid or out of range: the policy's default level, counted in
    /// [`PriorityPolicy::stats`]); the message goes to its level's topic (level topics; the
    /// topic it was created with is replaced) or to the native topic with the native priority
    /// `levels - 1 - level` (native). The property stays; a missing or unusable one is set to
    /// the level the message was given, so that consumers (also those of other clients) and
    /// retries see the level it was sent at.
    ///
    /// ```
    /// # use rocketmq_grpc::OutgoingMessage;
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let policy = PriorityPolicy::builder().levels(2).default_level(1).build().unwrap();
    /// let topics = PriorityTopics::builder(policy.clone())
    ///     .level_topics(["hi", "lo"])
    ///     .build()?;
    /// let routed = topics.route(OutgoingMessage::new("any", "no property"))?;
    /// assert_eq!(routed.topic(), "lo");
    /// assert_eq!(routed.property_value(policy.property()), Some("1"));
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `priority`: on level topics, a message that already
    /// has a native priority (a level topic is a normal topic, which refuses it); natively,
    /// a message with a message group, a delivery time or a lite topic (a priority message
    /// can have none of them).
    pub fn route(&self, mut message: OutgoingMessage) -> Result<OutgoingMessage, Error> {
        let property = self.policy.property();
        let parsed = self.policy.parse(message.property_value(property));
        if parsed.outcome != mq_priority::ParseOutcome::Valid {
            message = message.property(property, self.policy.property_value(parsed.level));
        }
        match &self.place {
            Place::Levels(topics) => {
                if let Some(priority) = message.priority_level() {
                    return Err(Error::invalid(
                        "priority",
                        format!(
                            "the message has the native priority {priority}, but the levels \
                             are level topics (normal topics, which refuse priority \
                             messages): set the level in the property {property:?} only"
                        ),
                    ));
                }
                let topic = topics.get(parsed.level.index()).map_or("", String::as_str);
                message.set_topic(topic);
                Ok(message)
            }
            Place::Native(topic) => {
                let conflict = if message.message_group.is_some() {
                    Some("a message group")
                } else if message.deliver_at.is_some() {
                    Some("a delivery time")
                } else if message.lite_topic.is_some() {
                    Some("a lite topic")
                } else {
                    None
                };
                if let Some(conflict) = conflict {
                    return Err(Error::invalid(
                        "priority",
                        format!(
                            "the message has {conflict}, which a priority message (RocketMQ \
                             5.4+ native priority) cannot have: send it without, or use level \
                             topics"
                        ),
                    ));
                }
                let priority = self.native_priority(parsed.level).unwrap_or(0);
                message.set_topic(topic);
                Ok(message.priority(priority))
            }
        }
    }

    /// The level of a received message: its priority property if it holds a valid level;
    /// otherwise, natively, its native priority mapped back (`levels - 1 - min(p, levels - 1)`:
    /// a Java producer's `setPriority(p)` sets no property); otherwise, on level topics, the
    /// level of the topic it came from; otherwise the policy's default level. Not counted in
    /// [`PriorityPolicy::stats`] (those count what producers routed).
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// # fn demo(topics: &PriorityTopics, message: &rocketmq_grpc::ReceivedMessage) {
    /// if topics.level_of(message).get() == 0 {
    ///     // the most important level
    /// }
    /// # }
    /// ```
    pub fn level_of(&self, message: &ReceivedMessage) -> Level {
        let property = message
            .properties
            .get(self.policy.property())
            .map(String::as_str);
        let parsed = self.policy.classify(property);
        if parsed.outcome == mq_priority::ParseOutcome::Valid {
            return parsed.level;
        }
        match &self.place {
            Place::Native(_) => match message.priority() {
                Some(p) => {
                    let last = self.policy.levels().saturating_sub(1);
                    let p = usize::try_from(p.max(0)).unwrap_or(0).min(last);
                    Level::new(u8::try_from(last - p).unwrap_or(0))
                }
                None => self.policy.default_level(),
            },
            Place::Levels(_) => self
                .level_of_topic(&message.topic)
                .unwrap_or_else(|| self.policy.default_level()),
        }
    }
}

impl PriorityTopicsBuilder {
    /// One topic per level, most important first: `topics[k]` holds level `k`. Each must be a
    /// topic of the cluster (a normal topic, or a FIFO or delay one if the messages are).
    #[must_use]
    pub fn level_topics<T: Into<String>>(mut self, topics: impl IntoIterator<Item = T>) -> Self {
        self.level_topics = Some(topics.into_iter().map(Into::into).collect());
        self
    }

    /// One priority topic (RocketMQ 5.4+, `message.type=PRIORITY`) with at least as many
    /// queues as the policy has levels (the broker keeps priority `p` on queue
    /// `min(p, queues - 1)`: fewer queues merge the most important levels).
    #[must_use]
    pub fn native(mut self, topic: impl Into<String>) -> Self {
        self.native = Some(topic.into());
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming `level_topics` when it does not give exactly one topic
    /// per level, repeats a topic or has a name the proxy refuses (empty, longer than
    /// [`MAX_TOPIC_LEN`], characters other than ASCII letters, digits, `%`, `|`, `_` and `-`,
    /// or a system topic); naming `native` for such a name; naming `level_topics` when both
    /// or neither of the two are given.
    pub fn build(self) -> Result<PriorityTopics, Error> {
        let place = match (self.level_topics, self.native) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "level_topics",
                    "give either level topics or a native topic, not both",
                ));
            }
            (None, None) => {
                return Err(Error::invalid(
                    "level_topics",
                    "give the level topics (one per level) or a native priority topic",
                ));
            }
            (Some(topics), None) => {
                let levels = self.policy.levels();
                if topics.len() != levels {
                    return Err(Error::invalid(
                        "level_topics",
                        format!(
                            "{} topics for {levels} levels: give exactly one topic per level, \
                             most important first",
                            topics.len()
                        ),
                    ));
                }
                let mut seen = HashSet::new();
                for topic in &topics {
                    check_topic("level_topics", topic)?;
                    if !seen.insert(topic.as_str()) {
                        return Err(Error::invalid(
                            "level_topics",
                            format!("{topic:?} is given twice: each level needs its own topic"),
                        ));
                    }
                }
                Place::Levels(topics)
            }
            (None, Some(topic)) => {
                check_topic("native", &topic)?;
                Place::Native(topic)
            }
        };
        Ok(PriorityTopics {
            policy: self.policy,
            place,
        })
    }
}

/// A topic name as the proxy takes it (its `ILLEGAL_TOPIC` checks).
fn check_topic(setting: &'static str, name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "an empty topic name".to_owned()
    } else if name.len() > MAX_TOPIC_LEN {
        format!(
            "the topic name {:?}… has {} bytes, more than {MAX_TOPIC_LEN}",
            name.chars().take(16).collect::<String>(),
            name.len()
        )
    } else if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-')))
    {
        format!(
            "the topic name {name:?} has {bad:?}: a topic name takes only ASCII letters, \
             digits, '%', '|', '_' and '-'"
        )
    } else if name.starts_with("rmq_sys_") || name.starts_with("%RETRY%") {
        format!("{name:?} is a system topic")
    } else {
        return Ok(());
    };
    Err(Error::invalid(setting, reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, pb};

    fn policy(levels: usize) -> PriorityPolicy {
        PriorityPolicy::builder()
            .levels(levels)
            .default_level(u32::try_from(levels - 1).unwrap())
            .build()
            .unwrap()
    }

    fn three() -> PriorityTopics {
        PriorityTopics::builder(policy(3))
            .level_topics(["p0", "p1", "p2"])
            .build()
            .unwrap()
    }

    fn native(levels: usize) -> PriorityTopics {
        PriorityTopics::builder(policy(levels))
            .native("prio")
            .build()
            .unwrap()
    }

    fn setting(result: Result<PriorityTopics, Error>) -> &'static str {
        match result {
            Err(Error::InvalidConfig { setting, .. }) => setting,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    fn received(topic: &str, property: Option<&str>, priority: Option<i32>) -> ReceivedMessage {
        let endpoint = Endpoint::parse("127.0.0.1:8081").unwrap();
        let mut properties = std::collections::HashMap::new();
        if let Some(value) = property {
            properties.insert(mq_priority::DEFAULT_PROPERTY.to_owned(), value.to_owned());
        }
        let message = pb::Message {
            topic: Some(pb::Resource {
                name: topic.to_owned(),
                ..Default::default()
            }),
            user_properties: properties,
            system_properties: Some(pb::SystemProperties {
                receipt_handle: Some("h".into()),
                message_id: "id".into(),
                priority,
                ..Default::default()
            }),
            ..Default::default()
        };
        ReceivedMessage::from_pb(message, &endpoint).unwrap()
    }

    #[test]
    fn bad_settings_are_refused_naming_the_option() {
        let b = || PriorityTopics::builder(policy(3));
        assert_eq!(setting(b().build()), "level_topics");
        assert_eq!(
            setting(b().level_topics(["a", "b", "c"]).native("n").build()),
            "level_topics"
        );
        assert_eq!(
            setting(b().level_topics(["a", "b"]).build()),
            "level_topics"
        );
        assert_eq!(
            setting(b().level_topics(["a", "b", "c", "d"]).build()),
            "level_topics"
        );
        assert_eq!(
            setting(b().level_topics(["a", "b", "a"]).build()),
            "level_topics"
        );
        for bad in ["", "has space", "dot.ted", "rmq_sys_x", "%RETRY%g", "é"] {
            assert_eq!(
                setting(b().level_topics(["a", "b", bad]).build()),
                "level_topics",
                "{bad:?}"
            );
            assert_eq!(setting(b().native(bad).build()), "native", "{bad:?}");
        }
        let long = "t".repeat(MAX_TOPIC_LEN + 1);
        assert_eq!(setting(b().native(long.as_str()).build()), "native");
        assert!(b().native("t".repeat(MAX_TOPIC_LEN)).build().is_ok());
        assert!(b().level_topics(["a%b", "c|d", "e_f-9"]).build().is_ok());
    }

    #[test]
    fn messages_go_to_their_levels_topic_and_keep_the_property() {
        let topics = three();
        let key = topics.policy().property().to_owned();
        for (value, topic, kept) in [
            (Some("0"), "p0", "0"),
            (Some("1"), "p1", "1"),
            (Some("2"), "p2", "2"),
            (Some("+1"), "p1", "+1"),
            (None, "p2", "2"),
            (Some(""), "p2", "2"),
            (Some("urgent"), "p2", "2"),
            (Some("-1"), "p2", "2"),
            (Some("3"), "p2", "2"),
            (Some("99999999999999999999999"), "p2", "2"),
        ] {
            let mut message = OutgoingMessage::new("whatever", "b");
            if let Some(value) = value {
                message = message.property(&key, value);
            }
            let routed = topics.route(message).unwrap();
            assert_eq!(routed.topic(), topic, "{value:?}");
            assert_eq!(routed.property_value(&key), Some(kept), "{value:?}");
            assert_eq!(routed.priority_level(), None);
        }
        let stats = topics.policy().stats();
        assert_eq!(
            (
                stats.valid,
                stats.missing,
                stats.invalid,
                stats.out_of_range
            ),
            (4, 2, 2, 2)
        );
    }

    #[test]
    fn a_native_priority_on_level_topics_is_refused() {
        let error = three()
            .route(OutgoingMessage::new("t", "b").priority(3))
            .unwrap_err();
        assert!(matches!(
            error,
            Error::InvalidConfig {
                setting: "priority",
                ..
            }
        ));
    }

    #[test]
    fn native_levels_are_reversed_priorities_on_one_topic() {
        let topics = native(3);
        let key = topics.policy().property().to_owned();
        for (value, priority) in [(Some("0"), 2), (Some("1"), 1), (Some("2"), 0), (None, 0)] {
            let mut message = OutgoingMessage::new("other", "b");
            if let Some(value) = value {
                message = message.property(&key, value);
            }
            let routed = topics.route(message).unwrap();
            assert_eq!(routed.topic(), "prio");
            assert_eq!(routed.priority_level(), Some(priority), "{value:?}");
            assert!(routed.property_value(&key).is_some());
        }
        let at = std::time::SystemTime::now();
        for message in [
            OutgoingMessage::new("t", "b").message_group("g"),
            OutgoingMessage::new("t", "b").deliver_at(at),
            OutgoingMessage::new("t", "b").lite_topic("l"),
        ] {
            assert!(matches!(
                topics.route(message),
                Err(Error::InvalidConfig {
                    setting: "priority",
                    ..
                })
            ));
        }
    }

    #[test]
    fn received_levels_come_from_the_property_then_the_priority_then_the_topic() {
        let levels = three();
        assert_eq!(
            levels.level_of(&received("p2", Some("0"), None)),
            Level::new(0)
        );
        assert_eq!(levels.level_of(&received("p1", None, None)), Level::new(1));
        assert_eq!(
            levels.level_of(&received("p0", Some("x"), None)),
            Level::new(0)
        );
        assert_eq!(
            levels.level_of(&received("other", None, None)),
            Level::new(2)
        );
        assert_eq!(
            levels.level_of(&received("other", Some("7"), Some(9))),
            Level::new(2)
        );
        let native = native(3);
        assert_eq!(
            native.level_of(&received("prio", Some("1"), Some(2))),
            Level::new(1)
        );
        for (priority, level) in [
            (Some(2), 0),
            (Some(1), 1),
            (Some(0), 2),
            (Some(7), 0),
            (Some(i32::MAX), 0),
            (Some(-1), 2),
            (Some(i32::MIN), 2),
            (None, 2),
        ] {
            assert_eq!(
                native.level_of(&received("prio", None, priority)),
                Level::new(level),
                "{priority:?}"
            );
        }
        // Not counted: the stats count what producers routed.
        assert_eq!(native.policy().stats(), mq_priority::ParseStats::default());
    }

    #[test]
    fn lookups_by_level_and_topic() {
        let levels = three();
        assert_eq!(levels.topics(), ["p0", "p1", "p2"]);
        assert_eq!(levels.topic_of(Level::new(1)), "p1");
        assert_eq!(levels.topic_of(Level::new(200)), "p2");
        assert_eq!(levels.native_priority(Level::new(0)), None);
        assert!(!levels.is_native());
        let native = native(4);
        assert_eq!(native.topics(), ["prio"]);
        assert_eq!(native.topic_of(Level::new(3)), "prio");
        assert_eq!(native.level_of_topic("prio"), None);
        assert_eq!(native.native_priority(Level::new(0)), Some(3));
        assert_eq!(native.native_priority(Level::new(3)), Some(0));
        assert_eq!(native.native_priority(Level::new(200)), Some(0));
        let one = PriorityTopics::builder(PriorityPolicy::new(1).unwrap())
            .native("t")
            .build()
            .unwrap();
        assert_eq!(one.native_priority(Level::new(0)), Some(0));
        assert_eq!(one.level_of(&received("t", None, Some(5))), Level::new(0));
    }
}
