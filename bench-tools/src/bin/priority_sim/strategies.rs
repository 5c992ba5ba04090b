//! The compared strategies, each a producer-side router and a consumer:
//!
//! - **no priority**: Pulsar's default round-robin router over all partitions (per message,
//!   or switching partition every 10 ms when batching) and a plain partitioned consumer that
//!   merges partitions in arrival order;
//! - **replica**: the published design ([`crate::replica`]) on a level-per-partition layout,
//!   with the same plain merged consumer;
//! - **ours**: the `priority` crate's [`Router`] and [`Gate`] on the same layout, in each
//!   [`mq_priority::Strategy`]: one consumer per partition, the application takes the partition
//!   the gate picks, the gate pauses and resumes partitions, lower levels get smaller queues.
//!   Levels are laid out by equal weights; where the topic grows, one more row uses an
//!   explicit layout whose added partitions go to the least important level.
//!
//! Approximation: Pulsar's parent consumer re-polls its parked partition consumers one by
//! one; the model lets it take their messages in global arrival order.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mq_priority::{
    Gate, GateConfig, LayoutSpec, Level, PartitionControl, PriorityPolicy, QueueSizing, Router,
    RouterConfig, StickyWindow, Strategy, Unlisted,
};

use crate::model::{Batching, MsgId, Topic};
use crate::replica::{ReplicaInterceptor, ReplicaRouter};
use crate::rng::SplitMix64;

/// Which consumer design a run uses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// No priority at all.
    NoPriority,
    /// The published design.
    Replica,
    /// The `priority` crate with this strategy, levels laid out by equal weights (recomputed
    /// when the topic grows, so existing partitions can change level).
    Ours(Strategy),
    /// The `priority` crate with this strategy, the initial partitions listed explicitly and
    /// partitions added later given to the least important level.
    OursExplicit(Strategy),
}

/// A named strategy.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    /// Its row label.
    pub(crate) name: &'static str,
    /// What it runs.
    pub(crate) kind: Kind,
}

/// The aging bound of "ours, strict with aging".
pub(crate) const AGING_BOUND: Duration = Duration::from_millis(50);

/// Every compared strategy, in table order.
pub(crate) fn all() -> Vec<Spec> {
    vec![
        Spec {
            name: "no priority",
            kind: Kind::NoPriority,
        },
        Spec {
            name: "replica (PR #20)",
            kind: Kind::Replica,
        },
        Spec {
            name: "ours: strict",
            kind: Kind::Ours(Strategy::Strict),
        },
        Spec {
            name: "ours: delivery shares",
            kind: Kind::Ours(Strategy::delivery_shares()),
        },
        Spec {
            name: "ours: strict+aging 50 ms",
            kind: Kind::Ours(Strategy::StrictAging {
                max_wait: AGING_BOUND,
            }),
        },
    ]
}

/// The extra row of scenarios where the topic grows: strict with an explicit layout.
pub(crate) fn explicit_layout() -> Spec {
    Spec {
        name: "ours: strict, explicit layout",
        kind: Kind::OursExplicit(Strategy::Strict),
    }
}

/// What the topology of a run looks like, for building routers and consumers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    /// Priority levels.
    pub(crate) levels: usize,
    /// Partitions at the start.
    pub(crate) partitions: u32,
    /// The receiver queue size (of the most important level, for ours).
    pub(crate) queue: u32,
    /// Producer batching.
    pub(crate) batching: Option<Batching>,
    /// The instant of tick 0.
    pub(crate) start: Instant,
}

fn policy(levels: usize) -> Result<PriorityPolicy, String> {
    PriorityPolicy::new(levels).map_err(|e| e.to_string())
}

fn spec(levels: usize) -> LayoutSpec {
    LayoutSpec::partition_shares(vec![1; levels])
}

/// The layout of `kind`: equal weights, or the equal-weights layout of the initial partitions
/// written out explicitly with later partitions on the least important level.
fn layout_of(kind: &Kind, setup: &Setup) -> Result<LayoutSpec, String> {
    if !matches!(kind, Kind::OursExplicit(_)) {
        return Ok(spec(setup.levels));
    }
    let levels = setup.levels;
    let lowest = Level::new(levels.saturating_sub(1) as u8);
    let layout = spec(levels)
        .layout(&policy(levels)?, setup.partitions)
        .map_err(|e| e.to_string())?;
    let sets = (0..levels).map(|k| {
        let level = Level::new(k as u8);
        (level, layout.partitions_of(level).to_vec())
    });
    Ok(LayoutSpec::explicit_with(sets, Unlisted::Level(lowest)))
}

/// The producer-side router of a strategy.
#[derive(Debug)]
pub(crate) enum Routing {
    /// Pulsar's `RoundRobinPartitionMessageRouterImpl`.
    RoundRobin {
        /// The next index (starts at a random partition).
        counter: u64,
        /// With batching: switch partition every this many ticks.
        switch: Option<u64>,
    },
    /// The published design's router.
    Replica(ReplicaRouter),
    /// The `priority` crate's router.
    Ours(Router),
}

impl Routing {
    /// The router of `kind` for `setup`.
    pub(crate) fn new(kind: &Kind, setup: &Setup, rng: &mut SplitMix64) -> Result<Routing, String> {
        match kind {
            Kind::NoPriority => Ok(Routing::RoundRobin {
                counter: rng.below(u64::from(setup.partitions)),
                switch: setup.batching.map(|_| 10),
            }),
            Kind::Replica => {
                // The same partitions per level as ours, registered explicitly; the last level
                // is the design's default.
                let layout = spec(setup.levels)
                    .layout(&policy(setup.levels)?, setup.partitions)
                    .map_err(|e| e.to_string())?;
                let registered: Vec<Vec<u32>> = (0..setup.levels.saturating_sub(1))
                    .map(|k| layout.partitions_of(Level::new(k as u8)).to_vec())
                    .collect();
                Ok(Routing::Replica(ReplicaRouter::new(
                    setup.levels,
                    setup.partitions,
                    &registered,
                )))
            }
            Kind::Ours(_) | Kind::OursExplicit(_) => {
                let sticky = match setup.batching {
                    Some(b) => StickyWindow {
                        max_messages: b.max_messages as u32,
                        max_duration: Duration::from_millis(b.max_delay.max(1)),
                    },
                    None => StickyWindow::per_message(),
                };
                let config = RouterConfig {
                    sticky,
                    ..RouterConfig::default()
                };
                Router::new(
                    policy(setup.levels)?,
                    layout_of(kind, setup)?,
                    setup.partitions,
                    config,
                    setup.start,
                )
                .map(Routing::Ours)
                .map_err(|e| e.to_string())
            }
        }
    }

    /// The partition for a message of `level` sent at `tick` while the producer knows of
    /// `partitions` partitions.
    pub(crate) fn route(&mut self, level: u8, partitions: u32, tick: u64, now: Instant) -> u32 {
        let n = u64::from(partitions.max(1));
        match self {
            Routing::RoundRobin { counter, switch } => match switch {
                Some(every) => ((tick / *every + *counter) % n) as u32,
                None => {
                    let p = *counter % n;
                    *counter += 1;
                    p as u32
                }
            },
            Routing::Replica(router) => router.choose(level).unwrap_or(0),
            Routing::Ours(router) => router
                .route(Level::new(level), None, partitions, now)
                .unwrap_or(0),
        }
    }
}

/// The pause/resume of the gate, applied to the simulated partitions.
struct Control<'a>(&'a mut Topic);

impl PartitionControl for Control<'_> {
    fn pause(&mut self, partition: u32) {
        self.0.pause(partition);
    }
    fn resume(&mut self, partition: u32) {
        self.0.resume(partition);
    }
}

/// Pulsar's partitioned consumer (`MultiTopicsConsumerImpl`) as 2.10 has it: each partition
/// consumer's receiver queue feeds one parent queue of the receiver queue size in arrival
/// order; when the parent is full the partition consumers are parked until it drains to half.
/// A message leaves its partition consumer's queue (and returns a permit) when the parent
/// takes it, which is also when the 2.10 interceptor saw it.
#[derive(Debug)]
pub(crate) struct Merged {
    incoming: Vec<VecDeque<MsgId>>,
    order: VecDeque<u32>,
    parent: VecDeque<(u32, MsgId)>,
    capacity: usize,
    parked: bool,
    replica: Option<ReplicaInterceptor>,
}

impl Merged {
    fn pump(&mut self, topic: &mut Topic, levels: &[u8]) {
        if self.parked && self.parent.len() <= self.capacity / 2 {
            self.parked = false;
        }
        while !self.parked && self.parent.len() < self.capacity {
            let Some(p) = self.order.pop_front() else {
                break;
            };
            let Some(id) = self
                .incoming
                .get_mut(p as usize)
                .and_then(VecDeque::pop_front)
            else {
                continue;
            };
            if let Some(part) = topic.part(p) {
                part.processed();
            }
            if let Some(replica) = self.replica.as_mut() {
                replica.before_consume(p, levels.get(id as usize).copied().unwrap_or(0));
            }
            self.parent.push_back((p, id));
            if self.parent.len() >= self.capacity {
                self.parked = true;
            }
        }
    }
}

/// Our consumer: one receiver queue per partition, merged by the gate.
#[derive(Debug)]
pub(crate) struct Gated {
    gate: Gate,
    buffers: Vec<VecDeque<MsgId>>,
    /// The gate learns the old partitions' backlogs when the topic grows (the drain point of
    /// its growth hold); otherwise backlogs stay unknown.
    backlog_at_growth: bool,
}

/// The consumer side of a strategy.
#[derive(Debug)]
pub(crate) enum Consumer {
    /// No priority and the replica.
    Merged(Merged),
    /// Ours.
    Gated(Box<Gated>),
}

impl Consumer {
    /// The consumer of `kind`, subscribed to every partition of `topic`.
    pub(crate) fn new(
        kind: &Kind,
        setup: &Setup,
        topic: &mut Topic,
        now: Instant,
    ) -> Result<Consumer, String> {
        match kind {
            Kind::NoPriority | Kind::Replica => {
                for p in 0..topic.partitions() {
                    if let Some(part) = topic.part(p) {
                        part.subscribe(setup.queue);
                    }
                }
                Ok(Consumer::Merged(Merged {
                    incoming: vec![VecDeque::new(); topic.partitions() as usize],
                    order: VecDeque::new(),
                    parent: VecDeque::new(),
                    capacity: setup.queue.max(2) as usize,
                    parked: false,
                    replica: (*kind == Kind::Replica)
                        .then(|| ReplicaInterceptor::new(setup.levels)),
                }))
            }
            Kind::Ours(strategy) | Kind::OursExplicit(strategy) => {
                let config = GateConfig::default()
                    .with_strategy(strategy.clone())
                    .with_receiver_queue_size(setup.queue)
                    .with_queue_sizing(QueueSizing::Halving)
                    .with_min_queue_size(10);
                let gate = Gate::new(
                    policy(setup.levels)?,
                    layout_of(kind, setup)?,
                    setup.partitions,
                    config,
                )
                .map_err(|e| e.to_string())?;
                Ok(Consumer::gated(gate, false, topic, now))
            }
        }
    }

    /// Our consumer with `gate`, subscribed to every partition of `topic` (lower levels paused
    /// by the gate's cold start). With `backlog_at_growth` the gate is told the old
    /// partitions' backlogs when the topic grows.
    pub(crate) fn gated(
        mut gate: Gate,
        backlog_at_growth: bool,
        topic: &mut Topic,
        now: Instant,
    ) -> Consumer {
        // The first event starts the cold start: lower levels subscribe paused, unless the
        // levels above have nothing to read (what Pulsar's last message id tells).
        gate.tick(now, &mut Control(topic));
        for p in 0..topic.partitions() {
            if topic.part(p).is_some_and(|part| part.backlog() == 0) {
                gate.set_known_empty(p, now, &mut Control(topic));
            }
        }
        for p in 0..topic.partitions() {
            let queue = gate
                .suggested_queue_size(p)
                .unwrap_or(gate.config().receiver_queue_size());
            if let Some(part) = topic.part(p) {
                part.subscribe(queue);
            }
        }
        Consumer::Gated(Box::new(Gated {
            buffers: vec![VecDeque::new(); topic.partitions() as usize],
            gate,
            backlog_at_growth,
        }))
    }

    /// The gate, for ours.
    pub(crate) fn gate(&self) -> Option<&Gate> {
        match self {
            Consumer::Gated(g) => Some(&g.gate),
            Consumer::Merged(_) => None,
        }
    }

    /// An entry arrived from the broker on partition `p`.
    pub(crate) fn on_arrival(
        &mut self,
        p: u32,
        entry: &[MsgId],
        levels: &[u8],
        topic: &mut Topic,
        now: Instant,
    ) {
        match self {
            Consumer::Merged(m) => {
                if let Some(queue) = m.incoming.get_mut(p as usize) {
                    queue.extend(entry.iter().copied());
                    m.order.extend(std::iter::repeat_n(p, entry.len()));
                }
                m.pump(topic, levels);
            }
            Consumer::Gated(g) => {
                let Some(buffer) = g.buffers.get_mut(p as usize) else {
                    return;
                };
                for &id in entry {
                    buffer.push_back(id);
                    let claimed = levels.get(id as usize).map(|&l| Level::new(l));
                    // A partition outside the gate's layout cannot arrive: only subscribed
                    // partitions are dispatched.
                    let _ = g.gate.on_arrival(p, claimed, now, &mut Control(topic));
                }
            }
        }
    }

    /// The application takes the next message: its partition and id.
    pub(crate) fn take(
        &mut self,
        levels: &[u8],
        topic: &mut Topic,
        now: Instant,
    ) -> Option<(u32, MsgId)> {
        match self {
            Consumer::Merged(m) => {
                let next = m.parent.pop_front();
                m.pump(topic, levels);
                next
            }
            Consumer::Gated(g) => {
                let p = g.gate.poll(now, &mut Control(topic))?;
                let id = g.buffers.get_mut(p as usize)?.pop_front()?;
                if let Some(part) = topic.part(p) {
                    part.processed();
                }
                Some((p, id))
            }
        }
    }

    /// The application acknowledged a message of partition `p`.
    pub(crate) fn on_ack(&mut self, p: u32, topic: &mut Topic, now: Instant) {
        match self {
            Consumer::Merged(m) => {
                if let Some(replica) = m.replica.as_mut() {
                    replica.on_acknowledge(&m.incoming, topic);
                }
            }
            Consumer::Gated(g) => g.gate.on_ack(p, now, &mut Control(topic)),
        }
    }

    /// A timer tick (the gate's aging needs one).
    pub(crate) fn tick(&mut self, topic: &mut Topic, now: Instant) {
        if let Consumer::Gated(g) = self {
            g.gate.tick(now, &mut Control(topic));
        }
    }

    /// The consumer discovered that the topic has `partitions` partitions and subscribes
    /// to the new ones.
    pub(crate) fn set_partitions(
        &mut self,
        partitions: u32,
        queue: u32,
        topic: &mut Topic,
        now: Instant,
    ) {
        let old = match self {
            Consumer::Merged(m) => {
                let old = m.incoming.len() as u32;
                m.incoming.resize_with(partitions as usize, VecDeque::new);
                old
            }
            Consumer::Gated(g) => {
                let old = g.buffers.len() as u32;
                if g.backlog_at_growth {
                    for p in 0..old {
                        let backlog = topic.part(p).map(|part| part.backlog() as u64);
                        let _ = g.gate.set_backlog(p, backlog, now, &mut Control(topic));
                    }
                }
                // The gate pauses new partitions of a blocked level before they subscribe.
                let _ = g.gate.set_partitions(partitions, now, &mut Control(topic));
                if g.backlog_at_growth {
                    for p in 0..old {
                        let _ = g.gate.set_backlog(p, None, now, &mut Control(topic));
                    }
                }
                g.buffers.resize_with(partitions as usize, VecDeque::new);
                old
            }
        };
        for p in old..partitions {
            let queue = match self {
                Consumer::Gated(g) => g.gate.suggested_queue_size(p).unwrap_or(queue),
                Consumer::Merged(_) => queue,
            };
            if let Some(part) = topic.part(p) {
                part.subscribe(queue);
            }
        }
    }

    /// Messages held by the client (receiver queues and parent queue).
    pub(crate) fn buffered(&self) -> usize {
        match self {
            Consumer::Merged(m) => {
                m.parent.len() + m.incoming.iter().map(VecDeque::len).sum::<usize>()
            }
            Consumer::Gated(g) => g.buffers.iter().map(VecDeque::len).sum(),
        }
    }
}
