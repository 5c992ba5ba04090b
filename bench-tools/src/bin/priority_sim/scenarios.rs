//! The scenarios: what is published when, on which topology, and how the consumer behaves.
//!
//! Time is in ticks of 1 ms; the application takes up to `service` messages per tick
//! (10 per tick = 10,000 msg/s in every scenario). Every scenario exists at full size (for
//! the table) and at a test size (same ratios, fewer messages, for the acceptance tests).

use crate::model::{Batching, Tick};

/// Messages of one level published at a mean rate over a time window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stream {
    /// The level (0 = most important).
    pub(crate) level: u8,
    /// Mean messages per tick.
    pub(crate) per_tick: f64,
    /// First tick.
    pub(crate) from: Tick,
    /// Tick after the last.
    pub(crate) until: Tick,
}

/// Messages of one level published all at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Burst {
    /// When.
    pub(crate) at: Tick,
    /// The level.
    pub(crate) level: u8,
    /// How many.
    pub(crate) count: u64,
}

/// The topic grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Growth {
    /// When the partitions are added (producers see them at once).
    pub(crate) at: Tick,
    /// The new partition count.
    pub(crate) to: u32,
    /// How much later the consumer discovers and subscribes them (Pulsar's partition
    /// auto-update runs on a timer).
    pub(crate) consumer_lag: Tick,
}

/// One scenario.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scenario {
    /// Short name (command-line filter, table heading).
    pub(crate) name: &'static str,
    /// One sentence on what happens.
    pub(crate) about: String,
    /// Priority levels.
    pub(crate) levels: usize,
    /// Partitions at the start (spread evenly over the levels).
    pub(crate) partitions: u32,
    /// Receiver queue size (of the top level for ours; every partition for the others).
    pub(crate) queue: u32,
    /// Messages the application takes per tick at most.
    pub(crate) service: u64,
    /// Producer batching.
    pub(crate) batching: Option<Batching>,
    /// Whether the application acknowledges each message.
    pub(crate) acks: bool,
    /// When the consumer subscribes (messages published earlier wait at the broker).
    pub(crate) consumer_start: Tick,
    /// One-off publications (at tick 0: a backlog already there when the consumer starts).
    pub(crate) bursts: Vec<Burst>,
    /// Steady publications.
    pub(crate) streams: Vec<Stream>,
    /// A partition count change.
    pub(crate) growth: Option<Growth>,
    /// The run stops here even if messages are left.
    pub(crate) max_ticks: Tick,
    /// Seed of the pseudo-random arrivals and start indexes.
    pub(crate) seed: u64,
}

/// Full size (`1`) or shrunk by this divisor for tests.
pub(crate) type Shrink = u64;

/// The full-size scenarios.
pub(crate) const FULL: Shrink = 1;

/// The test-size scenarios.
pub(crate) const TEST: Shrink = 10;

fn base(name: &'static str, about: String) -> Scenario {
    Scenario {
        name,
        about,
        levels: 2,
        partitions: 4,
        queue: 100,
        service: 10,
        batching: None,
        acks: true,
        consumer_start: 0,
        bursts: Vec::new(),
        streams: Vec::new(),
        growth: None,
        max_ticks: 60_000,
        seed: 0x5EED,
    }
}

/// A: a 100:1 low backlog, then a high burst (`100,000` low, `1,000` high at full size).
/// The backlog is produced at 100 msg/ms before the consumer starts.
pub(crate) fn backlog_burst(shrink: Shrink) -> Scenario {
    let (low, high) = (100_000 / shrink, 1_000 / shrink);
    let start = low / 100;
    let burst = start + 100 / shrink;
    let mut s = base(
        "backlog-burst",
        format!(
            "{low} low messages produced before the consumer starts at {start} ms, then {high} \
             high ones at once at {burst} ms (100:1); consumed at 10 msg/ms until drained."
        ),
    );
    s.streams = vec![Stream {
        level: 1,
        per_tick: 100.0,
        from: 0,
        until: start,
    }];
    s.consumer_start = start;
    s.bursts = vec![Burst {
        at: burst,
        level: 0,
        count: high,
    }];
    s
}

/// B: sustained overload in which the high level alone exceeds the service rate.
pub(crate) fn overload(shrink: Shrink) -> Scenario {
    let until = 5_000 / shrink;
    let mut s = base(
        "overload",
        format!(
            "High at 11 msg/ms and low at 5 msg/ms against 10 msg/ms of service for {until} ms \
             (the high level alone overloads the consumer); not drained."
        ),
    );
    s.streams = vec![
        Stream {
            level: 0,
            per_tick: 11.0,
            from: 0,
            until,
        },
        Stream {
            level: 1,
            per_tick: 5.0,
            from: 0,
            until,
        },
    ];
    s.max_ticks = until;
    s
}

/// C: four levels under overload, then drained.
pub(crate) fn four_levels(shrink: Shrink) -> Scenario {
    let until = 3_000 / shrink;
    let mut s = base(
        "four-levels",
        format!(
            "4 levels on 8 partitions, each level at 3.5 msg/ms (1.4x the service rate) for \
             {until} ms, then drained."
        ),
    );
    s.levels = 4;
    s.partitions = 8;
    s.streams = (0..4)
        .map(|level| Stream {
            level,
            per_tick: 3.5,
            from: 0,
            until,
        })
        .collect();
    s
}

/// D: the topic grows from 4 to 6 partitions mid-run.
pub(crate) fn partition_growth(shrink: Shrink) -> Scenario {
    let until = 3_000 / shrink;
    let at = 1_000 / shrink;
    let mut s = base(
        "partition-growth",
        format!(
            "High and low at 6 msg/ms each for {until} ms; at {at} ms the topic grows from 4 \
             to 6 partitions, the consumer subscribes the new ones 100 ms later; drained."
        ),
    );
    s.streams = vec![
        Stream {
            level: 0,
            per_tick: 6.0,
            from: 0,
            until,
        },
        Stream {
            level: 1,
            per_tick: 6.0,
            from: 0,
            until,
        },
    ];
    s.growth = Some(Growth {
        at,
        to: 6,
        consumer_lag: 100,
    });
    s
}

/// E: the backlog-burst scenario with producer batching.
pub(crate) fn batching(shrink: Shrink) -> Scenario {
    let mut s = backlog_burst(shrink);
    s.name = "batching";
    s.about = format!(
        "As backlog-burst, with producer batching (entries of up to 20 messages or 10 ms, one \
         entry dispatched as a unit): {}",
        s.about
    );
    s.batching = Some(Batching {
        max_messages: 20,
        max_delay: 10,
    });
    s
}

/// F: the overload scenario with a consumer that never acknowledges.
pub(crate) fn never_ack(shrink: Shrink) -> Scenario {
    let mut s = overload(shrink);
    s.name = "never-ack";
    s.about = format!(
        "As overload, but the application never acknowledges (no unacked limit): {}",
        s.about
    );
    s.acks = false;
    s
}

/// G: cold start: the consumer starts on a low backlog and a high burst follows at once.
pub(crate) fn cold_start(shrink: Shrink) -> Scenario {
    let low = 20_000 / shrink;
    let start = low / 100;
    let mut s = base(
        "cold-start",
        format!(
            "{low} low messages produced before the consumer starts at {start} ms; 100 high \
             ones are published 5 ms after the start, before anything could be learnt; drained."
        ),
    );
    s.streams = vec![Stream {
        level: 1,
        per_tick: 100.0,
        from: 0,
        until: start,
    }];
    s.consumer_start = start;
    s.bursts = vec![Burst {
        at: start + 5,
        level: 0,
        count: 100,
    }];
    s
}

/// Every scenario, in table order.
pub(crate) fn all(shrink: Shrink) -> Vec<Scenario> {
    vec![
        backlog_burst(shrink),
        overload(shrink),
        four_levels(shrink),
        partition_growth(shrink),
        batching(shrink),
        never_ack(shrink),
        cold_start(shrink),
    ]
}

impl Scenario {
    /// The last tick at which something is published.
    pub(crate) fn last_publication(&self) -> Tick {
        let bursts = self.bursts.iter().map(|b| b.at);
        let streams = self.streams.iter().map(|s| s.until.saturating_sub(1));
        bursts.chain(streams).max().unwrap_or(0)
    }
}
