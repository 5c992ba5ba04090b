//! The priority gate of a push consumer on level topics: one gate "partition" per level
//! topic (partition `k` = the topic of level `k`), whose pauses stop that topic's receive
//! loops.
//!
//! A push consumer hands every received message to its handler at once (its concurrency
//! bounds what it holds), so what the gate counts as *buffered* on a partition is what the
//! consumer holds of that topic: received and not yet finished by the handler. An arrival is
//! a received message, a delivery the end of its handling (then its ack or nack). A receive
//! that came back full sets the level's backlog to its receiver queue (more is waiting), a
//! short one to zero. A level is under pressure when what it holds plus that backlog reaches
//! the gate's high watermark of its receiver queue, and the less important topics' loops then
//! stop receiving, which leaves the concurrency to it.

use std::time::Duration;

use mq_priority::{Gate, GateConfig, GateStats, LayoutSpec, PartitionControl};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::priority::PriorityTopics;
use crate::{Error, ReceivedMessage};

/// How often the gate re-evaluates time-dependent decisions (cold start, aging).
pub(super) const TICK: Duration = Duration::from_millis(100);

/// The gate of a push consumer and the paused flags of its level topics.
pub(super) struct PushGate {
    topics: PriorityTopics,
    gate: Mutex<Gate>,
    /// Per partition (level topic): whether its loops are paused.
    paused: Vec<watch::Sender<bool>>,
    /// Per partition: its level (the metrics' label).
    levels: Vec<Option<u8>>,
}

/// Sets the paused flags the gate asks for.
struct Flags<'a> {
    paused: &'a [watch::Sender<bool>],
    levels: &'a [Option<u8>],
}

impl<'a> Flags<'a> {
    fn of(gate: &'a PushGate) -> Self {
        Self {
            paused: &gate.paused,
            levels: &gate.levels,
        }
    }
}

impl PartitionControl for Flags<'_> {
    fn pause(&mut self, partition: u32) {
        if let Some(flag) = self.paused.get(partition as usize)
            && !flag.send_replace(true)
        {
            crate::metrics::priority_held(self.levels.get(partition as usize).copied().flatten());
        }
    }

    fn resume(&mut self, partition: u32) {
        if let Some(flag) = self.paused.get(partition as usize) {
            flag.send_replace(false);
        }
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A gate error as the crate's: a setting of `priority`.
pub(super) fn invalid(error: &mq_priority::Error) -> Error {
    Error::invalid("priority", error.to_string())
}

/// `config` with its receiver queue size at most `concurrency` (what a level of a push
/// consumer can hold at most) and its smallest halved queue at most that.
pub(super) fn fit_to_concurrency(config: GateConfig, concurrency: usize) -> GateConfig {
    let most = u32::try_from(concurrency).unwrap_or(u32::MAX).max(1);
    let receiver_queue_size = config.receiver_queue_size().min(most);
    let min_queue_size = config.min_queue_size().min(receiver_queue_size);
    config
        .with_receiver_queue_size(receiver_queue_size)
        .with_min_queue_size(min_queue_size)
}

/// A gate over the topics of `topics`, partition `k` being its `k`-th topic (`None` for one
/// native topic, which the broker serves in priority order itself).
pub(super) fn gate_over(
    topics: &PriorityTopics,
    config: GateConfig,
) -> Result<Option<Gate>, Error> {
    if !topics.is_gated() {
        return Ok(None);
    }
    let policy = topics.gate_policy()?;
    let levels = policy.levels();
    let partitions = u32::try_from(levels)
        .map_err(|_| Error::invalid("priority", format!("{levels} levels do not fit a u32")))?;
    let layout = LayoutSpec::explicit(
        policy
            .all_levels()
            .map(|level| (level, vec![u32::from(level.get())])),
    );
    let mut gate = Gate::new(policy, layout, partitions, config).map_err(|e| invalid(&e))?;
    gate.tick(now(), &mut mq_priority::NoControl);
    Ok(Some(gate))
}

impl PushGate {
    /// A gate over the level topics or native tiers of `topics` (`None` for one native
    /// topic).
    pub(super) fn new(topics: PriorityTopics, config: GateConfig) -> Result<Option<Self>, Error> {
        let Some(gate) = gate_over(&topics, config)? else {
            return Ok(None);
        };
        let paused = (0..gate.partitions())
            .map(|p| watch::Sender::new(gate.is_paused(p).unwrap_or(false)))
            .collect();
        let levels = (0..gate.partitions())
            .map(|p| gate.level_of(p).map(|level| level.get()))
            .collect();
        Ok(Some(Self {
            topics,
            gate: Mutex::new(gate),
            paused,
            levels,
        }))
    }

    /// The gate partition of `topic`, if it is one of the gated topics.
    pub(super) fn partition_of(&self, topic: &str) -> Option<u32> {
        self.topics.tier_of_topic(topic)
    }

    /// The paused flag of `partition`.
    pub(super) fn paused(&self, partition: u32) -> Option<watch::Receiver<bool>> {
        self.paused
            .get(partition as usize)
            .map(watch::Sender::subscribe)
    }

    /// `messages` arrived on `partition`.
    pub(super) fn arrived(&self, partition: u32, messages: &[ReceivedMessage]) {
        let now = now();
        let mut gate = self.gate.lock();
        for message in messages {
            let claimed = Some(self.topics.gate_level(message));
            if let Err(error) = gate.on_arrival(partition, claimed, now, &mut Flags::of(self)) {
                tracing::warn!(%error, partition, "the priority gate refused an arrival");
            }
        }
    }

    /// A receive of `partition` that asked for `asked` messages brought `got`: a full answer
    /// presumes a backlog of the level's receiver queue (more is waiting), a short one none.
    /// So a level whose topic has a backlog stays under pressure between its receives, not
    /// only while it holds many messages.
    pub(super) fn answered(&self, partition: u32, asked: usize, got: usize) {
        let mut gate = self.gate.lock();
        let backlog = if got >= asked {
            gate.suggested_queue_size(partition).map(u64::from)
        } else {
            Some(0)
        };
        let _ = gate.set_backlog(partition, backlog, now(), &mut Flags::of(self));
    }

    /// A message of `partition` was handled: acknowledged (`acked`) or left to come back.
    pub(super) fn finished(&self, partition: u32, acked: bool) {
        let now = now();
        let mut gate = self.gate.lock();
        let mut flags = Flags::of(self);
        match gate.on_delivered(partition, now, &mut flags) {
            Ok(()) => crate::metrics::priority_delivered(
                self.levels.get(partition as usize).copied().flatten(),
                1,
            ),
            Err(error) => {
                tracing::warn!(%error, partition, "the priority gate refused a delivery");
            }
        }
        if acked {
            gate.on_ack(partition, now, &mut flags);
        } else {
            gate.on_nack(partition, now, &mut flags);
        }
    }

    /// Re-evaluates the gate's time-dependent decisions.
    pub(super) fn tick(&self) {
        self.gate.lock().tick(now(), &mut Flags::of(self));
    }

    /// The gate's counters.
    pub(super) fn stats(&self) -> GateStats {
        self.gate.lock().stats()
    }

    /// The level topics whose loops are paused now.
    pub(super) fn paused_topics(&self) -> Vec<String> {
        let gate = self.gate.lock();
        let topics = self.topics.topics();
        (0..gate.partitions())
            .filter(|&p| gate.is_paused(p) == Some(true))
            .filter_map(|p| topics.get(p as usize).map(|t| (*t).to_owned()))
            .collect()
    }

    /// The level of the topic of `partition`.
    #[cfg(test)]
    fn level(&self, partition: u32) -> Option<mq_priority::Level> {
        self.gate.lock().level_of(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::{Level, PriorityPolicy, Strategy};

    fn gate(strategy: Strategy) -> PushGate {
        let topics = PriorityTopics::builder(PriorityPolicy::new(3).unwrap())
            .level_topics(["a", "b", "c"])
            .build()
            .unwrap();
        let config = GateConfig::default()
            .with_strategy(strategy)
            .with_receiver_queue_size(8)
            .with_min_queue_size(2)
            .with_cold_start(None);
        PushGate::new(topics, config).unwrap().unwrap()
    }

    fn message(topic: &str) -> ReceivedMessage {
        let endpoint = crate::Endpoint::parse("127.0.0.1:8081").unwrap();
        let message = crate::pb::Message {
            topic: Some(crate::pb::Resource {
                name: topic.to_owned(),
                ..Default::default()
            }),
            system_properties: Some(crate::pb::SystemProperties {
                receipt_handle: Some("h".into()),
                message_id: "id".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        ReceivedMessage::from_pb(message, &endpoint).unwrap()
    }

    #[test]
    fn a_pressed_level_pauses_the_less_important_topics_until_it_is_relieved() {
        let gate = gate(Strategy::Strict);
        assert_eq!(gate.partition_of("b"), Some(1));
        assert_eq!(gate.partition_of("z"), None);
        assert_eq!(gate.level(2), Some(Level::new(2)));
        let low = gate.paused(2).unwrap();
        gate.arrived(2, &[message("c"), message("c")]);
        assert!(!*low.borrow());
        // Level 0's queue is 8: under pressure at 4 held.
        gate.arrived(0, &vec![message("a"); 4]);
        assert!(*low.borrow());
        assert_eq!(gate.paused_topics(), ["b", "c"]);
        // Relieved at 2 held or fewer.
        gate.finished(0, true);
        assert!(*low.borrow());
        gate.finished(0, false);
        assert!(!*low.borrow());
        assert!(gate.paused_topics().is_empty());
        let stats = gate.stats();
        assert_eq!(stats.levels[0].acked, 1);
        assert_eq!(stats.levels[0].nacked, 1);
    }

    #[test]
    fn a_full_answer_keeps_the_level_pressed_until_a_short_one() {
        let gate = gate(Strategy::Strict);
        let low = gate.paused(2).unwrap();
        // One message asked, one came: more is presumed waiting.
        gate.arrived(0, &[message("a")]);
        gate.answered(0, 1, 1);
        assert!(*low.borrow());
        // Handled: nothing held, but the backlog is still presumed.
        gate.finished(0, true);
        assert!(*low.borrow());
        gate.answered(0, 4, 0);
        assert!(!*low.borrow());
        gate.answered(9, 1, 1);
    }

    #[test]
    fn unknown_partitions_and_native_topics_do_not_panic() {
        let gate = gate(Strategy::delivery_shares());
        gate.arrived(9, &[message("x")]);
        gate.finished(9, true);
        gate.tick();
        assert!(gate.paused(9).is_none());
        let native = PriorityTopics::builder(PriorityPolicy::new(3).unwrap())
            .native("n")
            .build()
            .unwrap();
        assert!(
            PushGate::new(native, GateConfig::default())
                .unwrap()
                .is_none()
        );
        let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
            .level_topics(["a", "b"])
            .build()
            .unwrap();
        let bad = GateConfig::default().with_high_watermark(2.0);
        assert!(matches!(
            PushGate::new(topics, bad),
            Err(Error::Invalid {
                what: "priority",
                ..
            })
        ));
    }

    #[test]
    fn native_tiers_are_gated_as_level_topics_are() {
        let topics = PriorityTopics::builder(PriorityPolicy::new(8).unwrap())
            .native_tiers([("top", 1), ("rest", 7)])
            .build()
            .unwrap();
        let config = GateConfig::default()
            .with_strategy(Strategy::Strict)
            .with_receiver_queue_size(8)
            .with_min_queue_size(2)
            .with_cold_start(None);
        let gate = PushGate::new(topics, config).unwrap().unwrap();
        assert_eq!(gate.partition_of("top"), Some(0));
        assert_eq!(gate.partition_of("rest"), Some(1));
        assert_eq!(gate.level(1), Some(Level::new(1)));
        let rest = gate.paused(1).unwrap();
        gate.arrived(1, &vec![message("rest"); 6]);
        assert!(!*rest.borrow());
        gate.arrived(0, &vec![message("top"); 4]);
        assert!(*rest.borrow());
        assert_eq!(gate.paused_topics(), ["rest"]);
        assert_eq!(gate.stats().levels.len(), 2);
    }
}
