//! [`PriorityTopics`]: where each priority level lives, and routing a message there.

use std::collections::HashSet;

use mq_priority::{Level, PriorityPolicy};

use crate::{Error, OutgoingMessage, ReceivedMessage};

/// The longest topic name the proxy accepts (`ILLEGAL_TOPIC` beyond).
pub const MAX_TOPIC_LEN: usize = 127;

/// Where the levels of a [`PriorityPolicy`] live on RocketMQ: one topic per level ("level
/// topics", any 5.x broker), one priority topic with the broker's native priorities (5.4+),
/// or both: several priority topics ("native tiers", 5.4+), each holding a run of levels at
/// native priorities, with the tiers gated like level topics. See the
/// [module docs](crate::priority) for why levels cannot share the queues of one normal topic.
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
    /// Most important first; together they hold every level once, in order.
    tiers: Vec<Tier>,
    /// Whether the tiers are priority topics whose messages carry native priorities.
    native: bool,
}

/// One topic and the run of levels it holds.
#[derive(Debug, Clone)]
struct Tier {
    topic: String,
    /// Its most important level.
    first: usize,
    /// How many levels it holds (at least one).
    levels: usize,
}

impl Tier {
    fn holds(&self, level: usize) -> bool {
        (self.first..self.first + self.levels).contains(&level)
    }

    /// The native priority of `level` here: `levels - 1 - (level - first)`, so the tier's
    /// first level has the highest.
    fn native_priority(&self, level: usize) -> u32 {
        let rank = level.saturating_sub(self.first).min(self.levels - 1);
        u32::try_from(self.levels - 1 - rank).unwrap_or(0)
    }

    /// The level of native priority `priority` here (clamped to the tier's run).
    fn level_of_priority(&self, priority: i32) -> usize {
        let highest = self.levels - 1;
        let p = usize::try_from(priority.max(0)).unwrap_or(0).min(highest);
        self.first + (highest - p)
    }
}

/// Builds a [`PriorityTopics`]; exactly one of [`level_topics`](Self::level_topics),
/// [`native`](Self::native) and [`native_tiers`](Self::native_tiers) must be given.
#[derive(Debug, Clone)]
pub struct PriorityTopicsBuilder {
    policy: PriorityPolicy,
    level_topics: Option<Vec<String>>,
    native: Option<String>,
    native_tiers: Option<Vec<(String, usize)>>,
}

/// A level as the crate's [`Level`] (levels are below [`mq_priority::MAX_LEVELS`]).
fn level(index: usize) -> Level {
    Level::new(u8::try_from(index).unwrap_or(u8::MAX))
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
    #[must_use]
    pub fn builder(policy: PriorityPolicy) -> PriorityTopicsBuilder {
        PriorityTopicsBuilder {
            policy,
            level_topics: None,
            native: None,
            native_tiers: None,
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

    /// Whether messages carry the broker's native priorities (RocketMQ 5.4+): one native
    /// topic or native tiers.
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap()).native("t").build()?;
    /// assert!(topics.is_native());
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn is_native(&self) -> bool {
        self.native
    }

    /// Every topic, most important first: the level topics, the one native topic, or the
    /// native tiers.
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap()).native("t").build()?;
    /// assert_eq!(topics.topics(), ["t"]);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn topics(&self) -> Vec<&str> {
        self.tiers.iter().map(|t| t.topic.as_str()).collect()
    }

    /// The tier holding `level` (a level outside the policy is the default level).
    fn tier_of_level(&self, level: Level) -> Option<(usize, &Tier)> {
        let level = self.policy.clamp(level).index();
        self.tiers.iter().enumerate().find(|(_, t)| t.holds(level))
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
        self.tier_of_level(level)
            .map_or("", |(_, tier)| tier.topic.as_str())
    }

    /// The level whose topic is `topic`, for a topic that holds exactly one level (a level
    /// topic, or a native tier of one level); `None` for a topic of several levels and for
    /// any other topic.
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
        self.tiers
            .iter()
            .find(|t| t.topic == topic && t.levels == 1)
            .map(|t| level(t.first))
    }

    /// The native priority of `level` (native topic or tiers only): within its topic,
    /// `n - 1 - k` for the `k`-th of the `n` levels the topic holds, so the most important
    /// level of each topic has the highest. A level outside the policy is the default level.
    ///
    /// ```
    /// # use rocketmq_grpc::priority::{Level, PriorityPolicy, PriorityTopics};
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(3).unwrap()).native("t").build()?;
    /// assert_eq!(topics.native_priority(Level::new(0)), Some(2));
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    pub fn native_priority(&self, level: Level) -> Option<u32> {
        if !self.native {
            return None;
        }
        let level = self.policy.clamp(level);
        self.tier_of_level(level)
            .map(|(_, tier)| tier.native_priority(level.index()))
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
    /// [`PriorityPolicy::stats`]); the message goes to its level's topic (the topic it was
    /// created with is replaced), natively with its [`native_priority`](Self::native_priority).
    /// The property stays; a missing or unusable one is set to the level the message was
    /// given, so that consumers (also those of other clients) and retries see the level it
    /// was sent at.
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
    /// [`Error::Invalid`] naming `priority`: on level topics, a message that already
    /// has a native priority (a level topic is a normal topic, which refuses it); natively,
    /// a message with a message group, a delivery time or a lite topic (a priority message
    /// can have none of them).
    pub fn route(&self, mut message: OutgoingMessage) -> Result<OutgoingMessage, Error> {
        let property = self.policy.property();
        let parsed = self.policy.parse(message.property_value(property));
        if parsed.outcome != mq_priority::ParseOutcome::Valid {
            message = message.property(property, self.policy.property_value(parsed.level));
        }
        let Some((_, tier)) = self.tier_of_level(parsed.level) else {
            return Err(Error::invalid(
                "priority",
                format!("no topic holds level {}", parsed.level.get()),
            ));
        };
        if !self.native {
            if let Some(priority) = message.priority_level() {
                return Err(Error::invalid(
                    "priority",
                    format!(
                        "the message has the native priority {priority}, but the levels are \
                         level topics (normal topics, which refuse priority messages): set \
                         the level in the property {property:?} only"
                    ),
                ));
            }
            message.set_topic(&tier.topic);
            return Ok(message);
        }
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
                    "the message has {conflict}, which a priority message (RocketMQ 5.4+ \
                     native priority) cannot have: send it without, or use level topics"
                ),
            ));
        }
        let priority = tier.native_priority(parsed.level.index());
        message.set_topic(&tier.topic);
        Ok(message.priority(priority))
    }

    /// The level of a received message: its priority property if it holds a valid level;
    /// otherwise, natively, its native priority mapped back within its topic's run of levels
    /// (a Java producer's `setPriority(p)` sets no property; with one native topic of `n`
    /// levels, `n - 1 - min(p, n - 1)`); otherwise, on level topics, the level of the topic it
    /// came from; otherwise the policy's default level. Not counted in
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
        let default = self.policy.default_level();
        // One native topic holds every level, whatever topic name the message shows.
        let tier = match self.tiers.as_slice() {
            [only] if self.native => Some(only),
            tiers => tiers.iter().find(|t| t.topic == message.topic),
        };
        let Some(tier) = tier else {
            return default;
        };
        match message.priority() {
            Some(p) if self.native => level(tier.level_of_priority(p)),
            // No native priority: the broker keeps it with priority 0's.
            _ if tier.holds(default.index()) => default,
            _ => level(tier.first + tier.levels - 1),
        }
    }

    /// Whether a consumer gates its receives across the topics: level topics and native
    /// tiers (one native topic the broker orders by itself).
    pub(crate) fn is_gated(&self) -> bool {
        !self.native || self.tiers.len() > 1
    }

    /// The policy of the gate over the topics: the policy itself for one topic per level;
    /// for native tiers, one gate level per tier (tier `k` is gate level `k`).
    pub(crate) fn gate_policy(&self) -> Result<PriorityPolicy, Error> {
        if self.tiers.iter().all(|t| t.levels == 1) {
            return Ok(self.policy.clone());
        }
        PriorityPolicy::new(self.tiers.len()).map_err(|e| Error::invalid("priority", e.to_string()))
    }

    /// The gate partition (tier index) of `topic`.
    pub(crate) fn tier_of_topic(&self, topic: &str) -> Option<u32> {
        let index = self.tiers.iter().position(|t| t.topic == topic)?;
        u32::try_from(index).ok()
    }

    /// The gate level of `message`: the tier of its level.
    pub(crate) fn gate_level(&self, message: &ReceivedMessage) -> Level {
        let index = self
            .tier_of_level(self.level_of(message))
            .map_or(0, |(index, _)| index);
        level(index)
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

    /// Several priority topics (RocketMQ 5.4+, `message.type=PRIORITY`), most important
    /// first, each with how many consecutive levels it holds: `[("alerts-now", 1), ("alerts",
    /// 7)]` puts level 0 on `alerts-now` and levels 1-7 on `alerts`. Within a topic the
    /// broker serves its levels by native priority; across the topics a consumer gates its
    /// receives as on level topics, so that the most important tier is not queued behind
    /// what the client already holds of the others. Each topic needs at least as many queues
    /// as the levels it holds.
    ///
    /// ```
    /// # use rocketmq_grpc::OutgoingMessage;
    /// # use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
    /// let policy = PriorityPolicy::new(8).unwrap();
    /// let topics = PriorityTopics::builder(policy.clone())
    ///     .native_tiers([("alerts-now", 1), ("alerts", 7)])
    ///     .build()?;
    /// let message = OutgoingMessage::new("alerts", "cpu hot").property(policy.property(), "2");
    /// let routed = topics.route(message)?;
    /// assert_eq!((routed.topic(), routed.priority_level()), ("alerts", Some(5)));
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn native_tiers<T: Into<String>>(
        mut self,
        tiers: impl IntoIterator<Item = (T, usize)>,
    ) -> Self {
        self.native_tiers = Some(
            tiers
                .into_iter()
                .map(|(topic, levels)| (topic.into(), levels))
                .collect(),
        );
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `level_topics` when it does not give exactly one topic
    /// per level, repeats a topic or has a name the proxy refuses (empty, longer than
    /// [`MAX_TOPIC_LEN`], characters other than ASCII letters, digits, `%`, `|`, `_` and `-`,
    /// or a system topic); naming `native` for such a name; naming `native_tiers` for such a
    /// name, a repeated topic, a tier of no levels, or tiers that do not hold exactly the
    /// policy's levels; naming `level_topics` when not exactly one of the three is given.
    pub fn build(self) -> Result<PriorityTopics, Error> {
        let levels = self.policy.levels();
        let given = [
            self.level_topics.is_some(),
            self.native.is_some(),
            self.native_tiers.is_some(),
        ]
        .iter()
        .filter(|given| **given)
        .count();
        if given != 1 {
            return Err(Error::invalid(
                "level_topics",
                "give exactly one of: the level topics (one per level), a native priority \
                 topic, or native tiers",
            ));
        }
        let (setting, tiers, native) = if let Some(topics) = self.level_topics {
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
            (
                "level_topics",
                topics.into_iter().map(|t| (t, 1)).collect(),
                false,
            )
        } else if let Some(topic) = self.native {
            ("native", vec![(topic, levels)], true)
        } else {
            let tiers = self.native_tiers.unwrap_or_default();
            if let Some((topic, _)) = tiers.iter().find(|(_, n)| *n == 0) {
                return Err(Error::invalid(
                    "native_tiers",
                    format!("the tier {topic:?} holds no level: give each tier at least one"),
                ));
            }
            let held = tiers
                .iter()
                .fold(0usize, |sum, (_, n)| sum.saturating_add(*n));
            if held != levels {
                return Err(Error::invalid(
                    "native_tiers",
                    format!(
                        "the tiers hold {held} levels, the policy has {levels}: together they \
                         must hold each level once"
                    ),
                ));
            }
            ("native_tiers", tiers, true)
        };
        let mut seen = HashSet::new();
        let mut first = 0;
        let mut built = Vec::with_capacity(tiers.len());
        for (topic, held) in tiers {
            check_topic(setting, &topic)?;
            if !seen.insert(topic.clone()) {
                return Err(Error::invalid(
                    setting,
                    format!("{topic:?} is given twice: each level or tier needs its own topic"),
                ));
            }
            built.push(Tier {
                topic,
                first,
                levels: held,
            });
            first += held;
        }
        Ok(PriorityTopics {
            policy: self.policy,
            tiers: built,
            native,
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
            Err(Error::Invalid { what, .. }) => what,
            other => panic!("expected Invalid, got {other:?}"),
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
            Error::Invalid {
                what: "priority",
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
                Err(Error::Invalid {
                    what: "priority",
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

    fn tiers() -> PriorityTopics {
        PriorityTopics::builder(policy(8))
            .native_tiers([("top", 1), ("rest", 7)])
            .build()
            .unwrap()
    }

    #[test]
    fn bad_tiers_are_refused_naming_the_option() {
        let b = || PriorityTopics::builder(policy(3));
        let none: [(&str, usize); 0] = [];
        assert_eq!(setting(b().native_tiers(none).build()), "native_tiers");
        assert_eq!(
            setting(b().native_tiers([("a", 1), ("b", 0), ("c", 2)]).build()),
            "native_tiers"
        );
        assert_eq!(
            setting(b().native_tiers([("a", 1), ("b", 1)]).build()),
            "native_tiers"
        );
        assert_eq!(
            setting(b().native_tiers([("a", 1), ("b", usize::MAX)]).build()),
            "native_tiers"
        );
        assert_eq!(
            setting(b().native_tiers([("a", 1), ("a", 2)]).build()),
            "native_tiers"
        );
        assert_eq!(
            setting(b().native_tiers([("a", 1), ("b c", 2)]).build()),
            "native_tiers"
        );
        assert_eq!(
            setting(b().native_tiers([("a", 3)]).native("n").build()),
            "level_topics"
        );
        assert_eq!(
            setting(
                b().native_tiers([("a", 3)])
                    .level_topics(["x", "y", "z"])
                    .build()
            ),
            "level_topics"
        );
        assert!(b().native_tiers([("a", 3)]).build().is_ok());
    }

    #[test]
    fn tiers_route_each_level_to_its_topic_at_its_rank_there() {
        let topics = tiers();
        assert!(topics.is_native());
        assert_eq!(topics.topics(), ["top", "rest"]);
        let key = topics.policy().property().to_owned();
        for (value, topic, priority) in [
            (Some("0"), "top", 0),
            (Some("1"), "rest", 6),
            (Some("4"), "rest", 3),
            (Some("7"), "rest", 0),
            (None, "rest", 0),
            (Some("9"), "rest", 0),
        ] {
            let mut message = OutgoingMessage::new("other", "b");
            if let Some(value) = value {
                message = message.property(&key, value);
            }
            let routed = topics.route(message).unwrap();
            assert_eq!(routed.topic(), topic, "{value:?}");
            assert_eq!(routed.priority_level(), Some(priority), "{value:?}");
        }
        assert_eq!(topics.topic_of(Level::new(0)), "top");
        assert_eq!(topics.topic_of(Level::new(3)), "rest");
        assert_eq!(topics.native_priority(Level::new(1)), Some(6));
        assert_eq!(topics.level_of_topic("top"), Some(Level::new(0)));
        assert_eq!(topics.level_of_topic("rest"), None);
        assert!(matches!(
            topics.route(OutgoingMessage::new("t", "b").message_group("g")),
            Err(Error::Invalid {
                what: "priority",
                ..
            })
        ));
    }

    #[test]
    fn tiers_read_levels_back_from_the_topic_and_its_native_priority() {
        let topics = tiers();
        for (topic, property, priority, level) in [
            ("rest", Some("2"), Some(0), 2),
            ("rest", None, Some(6), 1),
            ("rest", None, Some(0), 7),
            ("rest", None, Some(99), 1),
            ("rest", None, Some(-5), 7),
            // No priority: the broker keeps it with priority 0's; the default level is here.
            ("rest", None, None, 7),
            ("top", None, Some(0), 0),
            ("top", None, None, 0),
            ("elsewhere", None, Some(6), 7),
        ] {
            let message = received(topic, property, priority);
            assert_eq!(
                topics.level_of(&message),
                Level::new(level),
                "{topic} {property:?} {priority:?}"
            );
        }
        // The gate sees the tiers as its levels.
        assert!(topics.is_gated());
        assert_eq!(topics.gate_policy().unwrap().levels(), 2);
        assert_eq!(topics.tier_of_topic("rest"), Some(1));
        assert_eq!(topics.tier_of_topic("x"), None);
        assert_eq!(
            topics.gate_level(&received("rest", Some("1"), None)),
            Level::new(1)
        );
        assert_eq!(
            topics.gate_level(&received("rest", Some("0"), None)),
            Level::new(0)
        );
        // Level topics gate over the policy itself; one native topic is not gated.
        assert_eq!(three().gate_policy().unwrap().levels(), 3);
        assert!(three().is_gated());
        assert!(!native(3).is_gated());
    }
}
