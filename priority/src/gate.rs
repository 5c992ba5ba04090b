//! The consumer side: which partitions fetch, and which buffered message goes to the
//! application next.

use std::time::{Duration, Instant};

use crate::{Error, LayoutSpec, Level, PartitionControl, PartitionLayout, PriorityPolicy};

/// How levels share the consumer when more than one has messages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// The most important level with a buffered message always goes first. Lower levels stop
    /// fetching while a more important level is under pressure. Lower levels can starve.
    Strict,
    /// **Delivery shares**: levels with buffered messages share deliveries in proportion to
    /// their shares (one per level, most important first; an empty list means each level's
    /// share is four times the next one's, so 4:1 for two levels and 16:4:1 for three; see
    /// [`Strategy::delivery_shares`]). Not to be confused with the
    /// partition shares of [`crate::LayoutSpec::Shares`].
    ///
    /// Stride scheduling. **The bound, proven by a property test**: while level `k` has
    /// buffered messages, at most [`Gate::delivery_bound`]`(k)` =
    /// `Σ_{j≠k} (⌊s_j / s_k⌋ + 1)` deliveries of other levels come between two of its own
    /// (for shares 6/3/1: 11 for the last level, 2 for the first), so in time at most that many
    /// of the application's service times. A level under that bound is never paused for a more
    /// important level's sake unless its own buffer is full; the bound covers buffered
    /// messages, so it needs receiver queues that refill faster than the level's share drains
    /// them (at the defaults, a refill is requested at half a queue).
    DeliveryShares(Vec<u32>),
    /// Strict, except that a level that has waited `max_wait` without a delivery while it had
    /// messages (buffered, or a backlog when known, or possibly a backlog while paused) is
    /// served next. A paused level is resumed once it has waited half of `max_wait`, so its
    /// messages are buffered by the time it is due.
    ///
    /// **The bound, proven by a property test**: with [`Gate::tick`] (or another event) at
    /// least every `tick` and at least one delivery per level per tick, a level with buffered
    /// messages waits at most `max_wait + tick` for its next delivery. For a paused level the
    /// bound also needs its fetch round trip to be under `max_wait / 2`, and a tick of at most
    /// `max_wait / 4` so that the resume is not late.
    StrictAging {
        /// The starvation bound.
        max_wait: Duration,
    },
}

impl Strategy {
    /// Delivery shares with each level's share four times the next one's (4:1 for two levels,
    /// 16:4:1 for three; shares stop growing at [`crate::MAX_SHARE`]).
    ///
    /// Why four: a level whose share of deliveries is `s` of the total delivers a burst of `n`
    /// urgent messages behind a backlog `B` in about `n / s` deliveries, against `B + n`
    /// without priority. With 16:4:1 the most important of three levels gets 16/21 of the
    /// deliveries while all three are busy, so its p99 stays near `1.3 × n / (B + n)` of no
    /// priority's (2,000 urgent behind 50,000: about 5 %, measured 3.7–9 % on the emulator
    /// with start-up costs, `pulsar_priority_growth --defaults-only`); 2:1 steps (4:2:1) give
    /// `1.75 ×` and missed 10 % on that shape. The price is a longer wait for the least
    /// important level: at most [`Gate::delivery_bound`] = 22 other deliveries between two of
    /// its own for three levels (8 with 4:2:1).
    pub fn delivery_shares() -> Strategy {
        Strategy::DeliveryShares(Vec::new())
    }
}

/// How big each level's receiver queue (prefetch window) should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueSizing {
    /// Every partition gets `receiver_queue_size`.
    Uniform,
    /// Level 0 gets `receiver_queue_size`, each next level half of the previous one, never
    /// less than `min_queue_size` (which must not be above `receiver_queue_size`). A paused partition can still receive what the broker
    /// already has permits for, so smaller windows for lower levels bound how many lower-level
    /// messages can sit ahead of a high one.
    Halving,
    /// One size per level, most important first (each at least 1).
    PerLevel(Vec<u32>),
}

/// Gate settings; [`Gate::new`] validates them.
///
/// Start from [`GateConfig::default`] and change what differs with the `with_*` setters; each
/// setting is read back by the method of its name (whose documentation describes it):
///
/// ```
/// use std::time::Duration;
/// use mq_priority::{GateConfig, Strategy};
///
/// let config = GateConfig::default()
///     .with_strategy(Strategy::Strict)
///     .with_receiver_queue_size(500);
/// assert_eq!(config.receiver_queue_size(), 500);
/// assert_eq!(config.cold_start(), Some(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GateConfig {
    strategy: Strategy,
    receiver_queue_size: u32,
    queue_sizing: QueueSizing,
    min_queue_size: u32,
    growth_hold: Option<Duration>,
    cold_start: Option<Duration>,
    high_watermark: f64,
    low_watermark: f64,
}

impl GateConfig {
    /// How levels share the consumer (default [`Strategy::delivery_shares`]).
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// The receiver queue size of the most important level (default 1,000, Pulsar's default).
    pub fn receiver_queue_size(&self) -> u32 {
        self.receiver_queue_size
    }

    /// How the lower levels' queues are sized (default [`QueueSizing::Halving`]).
    pub fn queue_sizing(&self) -> &QueueSizing {
        &self.queue_sizing
    }

    /// The smallest queue [`QueueSizing::Halving`] gives (default 10). Under
    /// [`QueueSizing::Halving`] it must be in `1..=receiver_queue_size` ([`Gate::new`] refuses
    /// others with [`Error::InvalidQueueSize`], naming both values): with a receiver queue
    /// below 10, lower it too. The other sizings do not read it.
    pub fn min_queue_size(&self) -> u32 {
        self.min_queue_size
    }

    /// **Key order across a growth the gate observes** (default `None`: off). With
    /// `Some(max)`, when [`Gate::set_partitions`] adds partitions to a level, the new ones are
    /// held (paused, and never picked) until the level's old partitions have delivered what
    /// they held when the growth was seen: their buffered messages plus their backlog if known
    /// ([`Gate::set_backlog`]); an old partition with an unknown backlog counts as drained
    /// once the gate has seen it empty while fetching (after a delivery, or at a tick). The
    /// hold ends after `max` in any case. A key that the producers' router moves to a new
    /// partition then has its earlier messages delivered before its later ones, **provided
    /// every producer switched to the new layout before the consumer saw the growth**; a
    /// producer that refreshes its partition count later keeps sending moved keys to the old
    /// partitions after the drain point, and those messages can come after newer ones. **It
    /// covers keys moved to new partitions only**: with
    /// [`KeyPlacement::Jump`](crate::KeyPlacement::Jump) every moved key moves to a new
    /// partition (the router's default), but with
    /// [`KeyPlacement::Modulo`](crate::KeyPlacement::Modulo) a growth also moves keys between
    /// old partitions (10 → 16: most keys), and those can be reordered: keep `Jump` where key
    /// order across growth matters. The cost: the new partitions add no throughput until the
    /// hold ends. `max` must be longer than zero and at most [`MAX_GROWTH_HOLD`] (one day);
    /// [`Gate::new`] refuses others with [`Error::InvalidGrowthHold`].
    pub fn growth_hold(&self) -> Option<Duration> {
        self.growth_hold
    }

    /// **Cold start** (default 1 s at most): after the gate's first event, under
    /// [`Strategy::Strict`] and [`Strategy::StrictAging`] (there at most half its `max_wait`;
    /// never under delivery shares, which promise every level its share from the start), the
    /// levels below a more important level stay paused until that level has had its first
    /// arrival, or is known to have nothing to read ([`Gate::set_known_empty`], or a known
    /// backlog of 0), or this long has passed. So the first receiver queues the broker fills
    /// are the important levels' (a consumer that starts on a backlog otherwise gets a whole
    /// receiver queue of every lower partition before it can know that urgent messages wait;
    /// on a broker whose cache is cold the first read can take longer than 100 ms). Messages
    /// that arrive meanwhile are still delivered. `None`: no cold start. An adapter creates its
    /// partition consumers paused when [`Gate::is_paused`] says so after a first
    /// [`Gate::tick`].
    pub fn cold_start(&self) -> Option<Duration> {
        self.cold_start
    }

    /// A level is under pressure once its buffered messages plus its known backlog reach this
    /// fraction of its receiver queues (the sum over its partitions), rounded up, at least 1
    /// message (default 0.5).
    pub fn high_watermark(&self) -> f64 {
        self.high_watermark
    }

    /// A level under pressure is relieved once that count is at or below this fraction,
    /// rounded down (default 0.25). The gap between the two is the hysteresis that stops
    /// pause/resume from flapping.
    pub fn low_watermark(&self) -> f64 {
        self.low_watermark
    }

    /// Sets [`GateConfig::strategy`].
    #[must_use]
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets [`GateConfig::receiver_queue_size`].
    #[must_use]
    pub fn with_receiver_queue_size(mut self, receiver_queue_size: u32) -> Self {
        self.receiver_queue_size = receiver_queue_size;
        self
    }

    /// Sets [`GateConfig::queue_sizing`].
    #[must_use]
    pub fn with_queue_sizing(mut self, queue_sizing: QueueSizing) -> Self {
        self.queue_sizing = queue_sizing;
        self
    }

    /// Sets [`GateConfig::min_queue_size`].
    #[must_use]
    pub fn with_min_queue_size(mut self, min_queue_size: u32) -> Self {
        self.min_queue_size = min_queue_size;
        self
    }

    /// Sets [`GateConfig::growth_hold`].
    #[must_use]
    pub fn with_growth_hold(mut self, growth_hold: Option<Duration>) -> Self {
        self.growth_hold = growth_hold;
        self
    }

    /// Sets [`GateConfig::cold_start`].
    #[must_use]
    pub fn with_cold_start(mut self, cold_start: Option<Duration>) -> Self {
        self.cold_start = cold_start;
        self
    }

    /// Sets [`GateConfig::high_watermark`].
    #[must_use]
    pub fn with_high_watermark(mut self, high_watermark: f64) -> Self {
        self.high_watermark = high_watermark;
        self
    }

    /// Sets [`GateConfig::low_watermark`].
    #[must_use]
    pub fn with_low_watermark(mut self, low_watermark: f64) -> Self {
        self.low_watermark = low_watermark;
        self
    }

    /// Checks the settings against `policy`, as [`Gate::new`] does before it lays out the
    /// partitions, so that an adapter can refuse bad settings before it reads the topic's
    /// partition count.
    ///
    /// # Errors
    /// [`Error::InvalidWatermarks`], [`Error::InvalidShares`], [`Error::InvalidGrowthHold`],
    /// [`Error::InvalidMaxWait`] or [`Error::InvalidQueueSize`], naming what is wrong.
    pub fn validate(&self, policy: &PriorityPolicy) -> Result<(), Error> {
        validate(policy, self).map(|_| ())
    }
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            strategy: Strategy::delivery_shares(),
            receiver_queue_size: 1000,
            queue_sizing: QueueSizing::Halving,
            min_queue_size: 10,
            growth_hold: None,
            cold_start: Some(Duration::from_secs(1)),
            high_watermark: 0.5,
            low_watermark: 0.25,
        }
    }
}

/// A snapshot of one level's state and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LevelStats {
    /// The level.
    pub level: Level,
    /// Its partitions.
    pub partitions: usize,
    /// Messages buffered (arrived, not yet delivered), saturating at `u64::MAX`.
    pub buffered: u64,
    /// Known backlog at the broker (partitions with an unknown backlog count 0), saturating
    /// at `u64::MAX`.
    pub backlog: u64,
    /// Whether the level is under pressure (above its high watermark, not yet relieved).
    pub pressured: bool,
    /// Whether the level's partitions are paused.
    pub paused: bool,
    /// Messages that arrived.
    pub arrivals: u64,
    /// Messages handed to the application.
    pub delivered: u64,
    /// Acknowledged messages.
    pub acked: u64,
    /// Negatively acknowledged messages.
    pub nacked: u64,
    /// Arrivals whose priority property named another level than their partition's.
    pub mismatches: u64,
    /// Partitions held after a growth ([`GateConfig::growth_hold`]).
    pub held: usize,
    /// Since when the level has had messages waiting without a delivery.
    pub waiting_since: Option<Instant>,
}

/// A snapshot of the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// One entry per level, most important first.
    pub levels: Vec<LevelStats>,
    /// Calls that named a partition outside the layout (ignored).
    pub unknown_partitions: u64,
    /// Pause calls made.
    pub pauses: u64,
    /// Resume calls made.
    pub resumes: u64,
}

#[derive(Debug, Clone)]
struct Part {
    level: u8,
    /// Index of this partition in its level's partition list.
    slot: u32,
    buffered: u64,
    backlog: Option<u64>,
    paused: bool,
    queue: u32,
    /// Held after a growth: paused and never picked until the level's hold ends.
    held: bool,
    /// Messages still to deliver before the hold of a growth can end (old partitions).
    drain: u64,
    /// The backlog was unknown at the growth: drained once seen empty.
    drain_until_empty: bool,
    /// The adapter tells when the partition reached its drain point ([`Gate::drained`]).
    drain_until_told: bool,
    /// Known to have had nothing to read when the consumer started ([`Gate::set_known_empty`]).
    known_empty: bool,
}

#[derive(Debug, Clone)]
struct LevelState {
    partitions: Vec<u32>,
    cursor: usize,
    buffered: u64,
    backlog: u64,
    unknown_backlog: u32,
    queue: u32,
    high: u64,
    low: u64,
    pressured: bool,
    full: bool,
    blocked: bool,
    waiting_since: Option<Instant>,
    /// When the hold of the level's new partitions ends at the latest.
    hold_until: Option<Instant>,
    /// When the level was last resumed.
    resumed_at: Option<Instant>,
    /// Messages buffered on held partitions.
    held_buffered: u64,
    stride: u64,
    pass: u64,
    arrivals: u64,
    delivered: u64,
    acked: u64,
    nacked: u64,
    mismatches: u64,
}

impl LevelState {
    /// Whether a sum over the level's partitions reached `u64::MAX` (it may then be below the
    /// exact sum, so it is recomputed instead of decremented: [`Gate::resum`]).
    fn saturated(&self) -> bool {
        [self.buffered, self.held_buffered, self.backlog].contains(&u64::MAX)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Shares,
    Aging {
        max_wait: Duration,
        resume_after: Duration,
    },
}

/// The longest [`GateConfig::growth_hold`] a gate accepts: one day. A hold ends earlier once
/// the old partitions have drained; a deadline further out would only keep new partitions
/// idle, and would overflow the platform's `Instant` for values near `Duration::MAX`.
pub const MAX_GROWTH_HOLD: Duration = Duration::from_secs(24 * 60 * 60);

/// `now + by`, saturating: when the platform's `Instant` cannot reach that far, the furthest
/// instant it reaches on the way (within a factor of two). Never panics.
fn later_by(now: Instant, by: Duration) -> Instant {
    let mut by = by;
    loop {
        // Terminates: `now + 0` is always representable.
        if let Some(later) = now.checked_add(by) {
            return later;
        }
        by /= 2;
    }
}

/// Passes are renormalised before they can overflow.
const PASS_LIMIT: u64 = 1 << 62;
/// Stride of a level with delivery share 1.
const STRIDE_ONE: u64 = 1 << 32;

/// The consumption gate: from per-partition buffered counts (and backlogs when known) it
/// decides which partitions fetch and which buffered message the application gets next.
///
/// A partition's level comes from its index through the layout, so prioritisation works from
/// the first message (no learning round) and redelivered messages keep their level. Decisions
/// are made on every arrival, delivery, backlog update and [`Gate::tick`], never only on acks,
/// so a consumer that never acknowledges is still prioritised. Time is always passed in.
///
/// Two ways to use it, together or apart:
/// - **Selection** (an adapter that merges partitions itself): [`Gate::next_partition`] /
///   [`Gate::poll`] say which partition's buffered message the application takes next, by
///   the [`Strategy`].
/// - **Flow control** (also for clients whose merged queue cannot be reordered): the gate
///   pauses lower levels' partitions through [`PartitionControl`] while a more important level
///   is under pressure, with hysteresis between the watermarks; the smaller queues of
///   [`Gate::suggested_queue_size`] bound what still leaks in.
///
/// ```
/// use std::time::Instant;
/// use mq_priority::{Gate, GateConfig, LayoutSpec, Level, PriorityPolicy, RecordingControl, Strategy};
///
/// let policy = PriorityPolicy::new(2)?;
/// let config = GateConfig::default().with_strategy(Strategy::Strict);
/// let mut gate = Gate::new(policy, LayoutSpec::partition_shares([1, 1]), 2, config)?;
/// let mut control = RecordingControl::new();
/// let now = Instant::now();
///
/// gate.on_arrival(1, None, now, &mut control)?; // a low message first
/// gate.on_arrival(0, None, now, &mut control)?; // then a high one
/// assert_eq!(gate.poll(now, &mut control), Some(0)); // the high one goes first
/// assert_eq!(gate.poll(now, &mut control), Some(1));
/// assert_eq!(gate.poll(now, &mut control), None);
/// # Ok::<(), mq_priority::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Gate {
    policy: PriorityPolicy,
    spec: LayoutSpec,
    config: GateConfig,
    mode: Mode,
    weights: Vec<u32>,
    queues: Vec<u32>,
    layout: PartitionLayout,
    parts: Vec<Part>,
    levels: Vec<LevelState>,
    vtime: u64,
    /// The first event's instant (the start of the cold start).
    started: Option<Instant>,
    unknown_partitions: u64,
    pauses: u64,
    resumes: u64,
}

fn validate(
    policy: &PriorityPolicy,
    config: &GateConfig,
) -> Result<(Mode, Vec<u32>, Vec<u32>), Error> {
    let levels = policy.levels();
    let (low, high) = (config.low_watermark, config.high_watermark);
    if !(low.is_finite() && high.is_finite() && 0.0 <= low && low < high && high <= 1.0) {
        return Err(Error::InvalidWatermarks { low, high });
    }
    let weights = match &config.strategy {
        Strategy::DeliveryShares(w) if w.is_empty() => (0..levels)
            .map(|i| 1u32 << (2 * (levels - 1 - i)).min(16))
            .collect(),
        Strategy::DeliveryShares(w) => crate::layout::check_shares("delivery", w, levels)?,
        _ => vec![1; levels],
    };
    if let Some(max) = config.growth_hold
        && (max.is_zero() || max > MAX_GROWTH_HOLD)
    {
        return Err(Error::InvalidGrowthHold {
            max,
            limit: MAX_GROWTH_HOLD,
        });
    }
    let mode = match config.strategy {
        Strategy::Strict => Mode::Strict,
        Strategy::DeliveryShares(_) => Mode::Shares,
        Strategy::StrictAging { max_wait } => {
            if max_wait.is_zero() {
                return Err(Error::InvalidMaxWait { max_wait });
            }
            Mode::Aging {
                max_wait,
                resume_after: max_wait / 2,
            }
        }
    };
    let base = config.receiver_queue_size;
    if base == 0 {
        return Err(Error::InvalidQueueSize {
            reason: "receiver_queue_size must be at least 1".into(),
        });
    }
    let queues = match &config.queue_sizing {
        QueueSizing::Uniform => vec![base; levels],
        QueueSizing::Halving => {
            let min = config.min_queue_size;
            if min == 0 {
                return Err(Error::InvalidQueueSize {
                    reason: "min_queue_size must be at least 1".into(),
                });
            }
            if min > base {
                return Err(Error::InvalidQueueSize {
                    reason: format!(
                        "min_queue_size {min} is above receiver_queue_size {base}, and \
                         QueueSizing::Halving never gives a level a larger queue than level \
                         0's: set min_queue_size to at most {base} (or raise \
                         receiver_queue_size, or use QueueSizing::Uniform)"
                    ),
                });
            }
            (0..levels)
                .map(|i| {
                    let halved = base.checked_shr(i as u32).unwrap_or(0);
                    halved.max(min)
                })
                .collect()
        }
        QueueSizing::PerLevel(sizes) => {
            if sizes.len() != levels || sizes.contains(&0) {
                return Err(Error::InvalidQueueSize {
                    reason: format!(
                        "PerLevel needs {levels} sizes (one per level), each at least 1; got {sizes:?}"
                    ),
                });
            }
            sizes.clone()
        }
    };
    Ok((mode, weights, queues))
}

impl Gate {
    /// A gate for a consumer of `partitions` partitions laid out by `spec`. Every partition
    /// starts resumed and empty; nothing is called on a control until the first event.
    ///
    /// # Errors
    /// The errors of [`GateConfig::validate`], then those of [`LayoutSpec::layout`].
    pub fn new(
        policy: PriorityPolicy,
        spec: LayoutSpec,
        partitions: u32,
        config: GateConfig,
    ) -> Result<Gate, Error> {
        let (mode, weights, queues) = validate(&policy, &config)?;
        let layout = spec.layout(&policy, partitions)?;
        let mut gate = Gate {
            policy,
            spec,
            config,
            mode,
            weights,
            queues,
            layout: layout.clone(),
            parts: Vec::new(),
            levels: Vec::new(),
            vtime: 0,
            started: None,
            unknown_partitions: 0,
            pauses: 0,
            resumes: 0,
        };
        gate.install(layout, &[]);
        Ok(gate)
    }

    /// Builds per-partition and per-level state for `layout`, carrying over the buffered
    /// counts, backlogs and paused flags of `old` partitions that still exist.
    fn install(&mut self, layout: PartitionLayout, old: &[Part]) {
        let old_levels = std::mem::take(&mut self.levels);
        let mut levels: Vec<LevelState> = (0..layout.levels())
            .map(|i| {
                let level = Level::new(i as u8);
                let partitions = layout.partitions_of(level).to_vec();
                let queue = self.queues.get(i).copied().unwrap_or(1);
                let capacity = u64::from(queue) * partitions.len() as u64;
                let high = ((self.config.high_watermark * capacity as f64).ceil() as u64).max(1);
                let low = ((self.config.low_watermark * capacity as f64).floor() as u64)
                    .min(high.saturating_sub(1));
                let weight = self.weights.get(i).copied().unwrap_or(1).max(1);
                let prev = old_levels.get(i);
                LevelState {
                    partitions,
                    cursor: 0,
                    buffered: 0,
                    backlog: 0,
                    unknown_backlog: 0,
                    queue,
                    high,
                    low,
                    pressured: prev.is_some_and(|p| p.pressured),
                    full: prev.is_some_and(|p| p.full),
                    blocked: false,
                    waiting_since: prev.and_then(|p| p.waiting_since),
                    hold_until: prev.and_then(|p| p.hold_until),
                    resumed_at: prev.and_then(|p| p.resumed_at),
                    held_buffered: 0,
                    stride: STRIDE_ONE / u64::from(weight),
                    pass: prev.map_or(0, |p| p.pass),
                    arrivals: prev.map_or(0, |p| p.arrivals),
                    delivered: prev.map_or(0, |p| p.delivered),
                    acked: prev.map_or(0, |p| p.acked),
                    nacked: prev.map_or(0, |p| p.nacked),
                    mismatches: prev.map_or(0, |p| p.mismatches),
                }
            })
            .collect();
        let mut parts = Vec::with_capacity(layout.partitions() as usize);
        for (p, level) in layout.levels_by_partition().iter().enumerate() {
            let carried = old.get(p);
            let lv = &mut levels[level.index()];
            let slot = lv
                .partitions
                .iter()
                .position(|&q| q as usize == p)
                .unwrap_or(0);
            let buffered = carried.map_or(0, |c| c.buffered);
            let backlog = carried.and_then(|c| c.backlog);
            lv.buffered = lv.buffered.saturating_add(buffered);
            let held = carried.is_some_and(|c| c.held);
            if held {
                lv.held_buffered = lv.held_buffered.saturating_add(buffered);
            }
            match backlog {
                Some(b) => lv.backlog = lv.backlog.saturating_add(b),
                None => lv.unknown_backlog += 1,
            }
            parts.push(Part {
                level: level.get(),
                slot: slot as u32,
                buffered,
                backlog,
                paused: carried.is_some_and(|c| c.paused),
                queue: lv.queue,
                held,
                drain: carried.map_or(0, |c| c.drain),
                drain_until_empty: carried.is_some_and(|c| c.drain_until_empty),
                drain_until_told: carried.is_some_and(|c| c.drain_until_told),
                known_empty: carried.is_some_and(|c| c.known_empty),
            });
        }
        self.layout = layout;
        self.parts = parts;
        self.levels = levels;
    }

    /// The policy.
    pub fn policy(&self) -> &PriorityPolicy {
        &self.policy
    }

    /// The current layout.
    pub fn layout(&self) -> &PartitionLayout {
        &self.layout
    }

    /// The settings.
    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// The number of partitions.
    pub fn partitions(&self) -> u32 {
        self.layout.partitions()
    }

    /// The level of `partition`.
    pub fn level_of(&self, partition: u32) -> Option<Level> {
        self.layout.level_of(partition)
    }

    /// The receiver queue size the adapter should give `partition`'s consumer (the level's
    /// queue under [`GateConfig::queue_sizing`]); `None` outside the layout.
    pub fn suggested_queue_size(&self, partition: u32) -> Option<u32> {
        self.parts.get(partition as usize).map(|p| p.queue)
    }

    /// The receiver queue size of every partition of `level`.
    pub fn queue_size_of(&self, level: Level) -> Option<u32> {
        self.levels.get(level.index()).map(|l| l.queue)
    }

    /// Under [`Strategy::DeliveryShares`], the most deliveries of other levels that can come
    /// between two deliveries of `level` while it has buffered messages:
    /// `Σ_{j≠k} (⌊stride_k / stride_j⌋ + 1)`, where a level's stride is `2^32 / share`, which
    /// is `Σ_{j≠k} (⌊s_j / s_k⌋ + 1)` up to rounding. `None` under the other strategies or for
    /// a level outside the policy.
    pub fn delivery_bound(&self, level: Level) -> Option<u64> {
        if self.mode != Mode::Shares {
            return None;
        }
        let own = self.levels.get(level.index())?.stride;
        Some(
            self.levels
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != level.index())
                .map(|(_, l)| own / l.stride.max(1) + 1)
                .sum(),
        )
    }

    /// Changes the strategy of a live gate. Buffered messages, backlogs and counters stay;
    /// the new strategy decides from the next call on (delivery shares start even: every
    /// level's turn is reset to the same point). Pauses and resumes whatever the new strategy
    /// requires. On error nothing changes.
    ///
    /// # Errors
    /// The strategy's validation errors ([`Error::InvalidShares`], [`Error::InvalidMaxWait`]).
    pub fn set_strategy(
        &mut self,
        strategy: Strategy,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        let config = GateConfig {
            strategy,
            ..self.config.clone()
        };
        let (mode, weights, _) = validate(&self.policy, &config)?;
        self.config = config;
        self.mode = mode;
        for (lv, &w) in self.levels.iter_mut().zip(&weights) {
            lv.stride = STRIDE_ONE / u64::from(w.max(1));
            lv.pass = self.vtime;
        }
        self.weights = weights;
        self.refresh(now, control);
        self.apply_all(control);
        Ok(())
    }

    /// Whether the gate has `partition` paused.
    pub fn is_paused(&self, partition: u32) -> Option<bool> {
        self.parts.get(partition as usize).map(|p| p.paused)
    }

    /// Messages buffered on `partition`.
    pub fn buffered(&self, partition: u32) -> Option<u64> {
        self.parts.get(partition as usize).map(|p| p.buffered)
    }

    /// Messages buffered on all partitions of `level`.
    pub fn buffered_at(&self, level: Level) -> u64 {
        self.levels.get(level.index()).map_or(0, |l| l.buffered)
    }

    fn part_index(&mut self, partition: u32) -> Result<usize, Error> {
        if (partition as usize) < self.parts.len() {
            Ok(partition as usize)
        } else {
            self.unknown_partitions += 1;
            Err(Error::UnknownPartition {
                partition,
                partitions: self.layout.partitions(),
            })
        }
    }

    /// A message arrived on `partition` (it is now buffered in the client). `claimed` is the
    /// level its priority property names, if the adapter read it (a cross-check only: the
    /// partition decides the level; a difference is counted in [`LevelStats::mismatches`]).
    /// A redelivered message is an arrival on its partition and keeps that partition's level.
    /// Returns the message's level. Buffered counts saturate at `u64::MAX` (never wrap).
    pub fn on_arrival(
        &mut self,
        partition: u32,
        claimed: Option<Level>,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<Level, Error> {
        let i = self.part_index(partition)?;
        let part = &mut self.parts[i];
        part.buffered = part.buffered.saturating_add(1);
        let level = part.level;
        let saturated = self.levels[usize::from(level)].saturated();
        if part.held {
            let lv = &mut self.levels[usize::from(level)];
            lv.held_buffered = lv.held_buffered.saturating_add(1);
        }
        if let Some(b) = part.backlog.as_mut()
            && *b > 0
        {
            *b -= 1;
            let lv = &mut self.levels[usize::from(level)];
            lv.backlog = lv.backlog.saturating_sub(1);
        }
        if self.levels[usize::from(level)].buffered == 0 {
            self.join(usize::from(level));
        }
        let lv = &mut self.levels[usize::from(level)];
        lv.buffered = lv.buffered.saturating_add(1);
        lv.arrivals += 1;
        if claimed.is_some_and(|c| c.get() != level) {
            lv.mismatches += 1;
        }
        if lv.waiting_since.is_none() {
            lv.waiting_since = Some(now);
        }
        if saturated {
            self.resum(usize::from(level));
        }
        self.refresh(now, control);
        Ok(Level::new(level))
    }

    /// Recomputes `level`'s buffered, held and backlog sums from its partitions, saturating at
    /// `u64::MAX`. Called after an update of a level whose sum was saturated: a saturated sum
    /// cannot be decremented exactly, every other one can.
    fn resum(&mut self, level: usize) {
        let (mut buffered, mut held, mut backlog) = (0u64, 0u64, 0u64);
        for &p in &self.levels[level].partitions {
            if let Some(part) = self.parts.get(p as usize) {
                buffered = buffered.saturating_add(part.buffered);
                if part.held {
                    held = held.saturating_add(part.buffered);
                }
                backlog = backlog.saturating_add(part.backlog.unwrap_or(0));
            }
        }
        let lv = &mut self.levels[level];
        lv.buffered = buffered;
        lv.held_buffered = held;
        lv.backlog = backlog;
    }

    /// A level that had nothing buffered joins the delivery-share round at the smallest pass of the
    /// levels that have messages: no credit saved up while idle, no penalty either.
    fn join(&mut self, level: usize) {
        let current = self
            .levels
            .iter()
            .enumerate()
            .filter(|(i, l)| *i != level && l.buffered > l.held_buffered)
            .map(|(_, l)| l.pass)
            .min()
            .unwrap_or(self.vtime);
        if let Some(lv) = self.levels.get_mut(level) {
            lv.pass = lv.pass.max(current);
        }
    }

    /// The partition whose buffered message the application should take next, by the
    /// strategy, or `None` when nothing is buffered. Does not change the gate: report the
    /// delivery with [`Gate::on_delivered`] (or use [`Gate::poll`]).
    pub fn next_partition(&self, now: Instant) -> Option<u32> {
        let level = self.next_level(now)?;
        let lv = &self.levels[level];
        let n = lv.partitions.len();
        (0..n)
            .map(|k| lv.partitions[(lv.cursor + k) % n])
            .find(|&p| {
                self.parts
                    .get(p as usize)
                    .is_some_and(|s| s.buffered > 0 && !s.held)
            })
    }

    /// The level the next delivery should come from.
    pub fn next_level_of(&self, now: Instant) -> Option<Level> {
        self.next_level(now).map(|l| Level::new(l as u8))
    }

    fn next_level(&self, now: Instant) -> Option<usize> {
        let mut eligible = self
            .levels
            .iter()
            .enumerate()
            .filter(|(_, l)| l.buffered > l.held_buffered);
        match self.mode {
            Mode::Strict => eligible.next().map(|(i, _)| i),
            Mode::Shares => eligible.min_by_key(|(i, l)| (l.pass, *i)).map(|(i, _)| i),
            Mode::Aging { max_wait, .. } => {
                let mut first = None;
                let mut due: Option<(Instant, usize)> = None;
                for (i, l) in eligible {
                    first.get_or_insert(i);
                    if let Some(since) = l.waiting_since
                        && now.saturating_duration_since(since) >= max_wait
                        && due.is_none_or(|(s, _)| since < s)
                    {
                        due = Some((since, i));
                    }
                }
                due.map(|(_, i)| i).or(first)
            }
        }
    }

    /// The application took a message from `partition`.
    pub fn on_delivered(
        &mut self,
        partition: u32,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        let i = self.part_index(partition)?;
        let part = &mut self.parts[i];
        let had = part.buffered > 0;
        part.buffered = part.buffered.saturating_sub(1);
        part.drain = part.drain.saturating_sub(1);
        if part.buffered == 0 {
            part.drain_until_empty = false;
        }
        let slot = part.slot as usize;
        let level = usize::from(part.level);
        let lv = &mut self.levels[level];
        let saturated = lv.saturated();
        if had {
            lv.buffered = lv.buffered.saturating_sub(1);
            if part.held {
                lv.held_buffered = lv.held_buffered.saturating_sub(1);
            }
        }
        lv.delivered += 1;
        lv.cursor = slot + 1;
        self.vtime = lv.pass;
        lv.pass = lv.pass.saturating_add(lv.stride);
        lv.waiting_since = Some(now);
        if lv.pass >= PASS_LIMIT {
            let base = self.vtime;
            for l in &mut self.levels {
                l.pass = l.pass.saturating_sub(base);
            }
            self.vtime = 0;
        }
        if saturated {
            self.resum(level);
        }
        self.refresh(now, control);
        Ok(())
    }

    /// [`Gate::next_partition`] and [`Gate::on_delivered`] in one call: the partition to take
    /// the next message from, counted as delivered.
    pub fn poll(&mut self, now: Instant, control: &mut dyn PartitionControl) -> Option<u32> {
        let p = self.next_partition(now)?;
        self.on_delivered(p, now, control).ok()?;
        Some(p)
    }

    /// Sets `partition`'s buffered count (for clients that expose their queue sizes instead
    /// of arrival hooks).
    ///
    /// Any count is accepted; counts **saturate** at `u64::MAX` and never wrap: a partition
    /// set to `u64::MAX` stays there on later arrivals, and a level whose partitions hold more
    /// than `u64::MAX` in all counts `u64::MAX` (see [`LevelStats::buffered`]).
    pub fn set_buffered(
        &mut self,
        partition: u32,
        buffered: u64,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        let i = self.part_index(partition)?;
        let level = usize::from(self.parts[i].level);
        if self.levels[level].buffered == 0 && buffered > 0 {
            self.join(level);
        }
        let part = &mut self.parts[i];
        let lv = &mut self.levels[level];
        let saturated = lv.saturated();
        lv.buffered = lv
            .buffered
            .saturating_sub(part.buffered)
            .saturating_add(buffered);
        if part.held {
            lv.held_buffered = lv
                .held_buffered
                .saturating_sub(part.buffered)
                .saturating_add(buffered);
        }
        part.buffered = buffered;
        if lv.buffered > 0 && lv.waiting_since.is_none() {
            lv.waiting_since = Some(now);
        }
        if saturated {
            self.resum(level);
        }
        self.refresh(now, control);
        Ok(())
    }

    /// Sets `partition`'s backlog: messages at the broker not yet dispatched to this consumer
    /// (`None` = unknown). Do not count delivered-but-unacknowledged messages, or a consumer
    /// that never acks would look permanently backlogged. Each later arrival on the partition
    /// takes one off a known backlog. A level's backlog saturates at `u64::MAX` (never wraps).
    pub fn set_backlog(
        &mut self,
        partition: u32,
        backlog: Option<u64>,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        let i = self.part_index(partition)?;
        let part = &mut self.parts[i];
        let level = usize::from(part.level);
        let lv = &mut self.levels[level];
        let saturated = lv.saturated();
        match part.backlog {
            Some(b) => lv.backlog = lv.backlog.saturating_sub(b),
            None => lv.unknown_backlog -= 1,
        }
        match backlog {
            Some(b) => lv.backlog = lv.backlog.saturating_add(b),
            None => lv.unknown_backlog += 1,
        }
        part.backlog = backlog;
        if saturated {
            self.resum(level);
        }
        self.refresh(now, control);
        Ok(())
    }

    /// A message of `partition` was acknowledged. Counted only: no decision waits for acks.
    pub fn on_ack(&mut self, partition: u32, now: Instant, control: &mut dyn PartitionControl) {
        if let Ok(i) = self.part_index(partition) {
            let level = usize::from(self.parts[i].level);
            self.levels[level].acked += 1;
        }
        self.refresh(now, control);
    }

    /// A message of `partition` was negatively acknowledged. It will come back as an arrival
    /// on the same partition and so keep its level.
    pub fn on_nack(&mut self, partition: u32, now: Instant, control: &mut dyn PartitionControl) {
        if let Ok(i) = self.part_index(partition) {
            let level = usize::from(self.parts[i].level);
            self.levels[level].nacked += 1;
        }
        self.refresh(now, control);
    }

    /// Re-evaluates time-dependent decisions (aging). Call it periodically when no other event
    /// happens, e.g. every quarter of the aging bound.
    pub fn tick(&mut self, now: Instant, control: &mut dyn PartitionControl) {
        for part in &mut self.parts {
            if part.drain_until_empty && part.buffered == 0 && !part.paused {
                part.drain_until_empty = false;
            }
        }
        self.refresh(now, control);
    }

    /// The topic now has `partitions` partitions: extends the layout (existing partitions keep
    /// their level, see [`LayoutSpec`]), keeps the state of partitions that remain, starts new
    /// ones empty (and held, with [`GateConfig::growth_hold`]), and pauses or resumes whatever
    /// the new layout requires. On error nothing changes.
    ///
    /// # Errors
    /// [`Error::PartitionsShrunk`] for fewer partitions than the gate has (a partitioned
    /// topic never shrinks, and the messages buffered on the partitions that went away would
    /// be lost); the layout's errors ([`Error::TooManyPartitions`], ...) otherwise.
    pub fn set_partitions(
        &mut self,
        partitions: u32,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        self.grow(partitions, false, now, control)
    }

    /// As [`Gate::set_partitions`], for an adapter that knows where each old partition ended
    /// when it saw the growth (Pulsar: the partition's last message id): under
    /// [`GateConfig::growth_hold`], the old partitions of a level that gains partitions count
    /// as drained only once the adapter says so with [`Gate::drained`] (after delivering the
    /// message at that point, or at once for a partition that was empty), not by counts. The
    /// hold's deadline still applies. Without a growth hold it is `set_partitions`.
    ///
    /// # Errors
    /// As [`Gate::set_partitions`].
    pub fn set_partitions_with_drain_points(
        &mut self,
        partitions: u32,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        self.grow(partitions, true, now, control)
    }

    /// `partition` had nothing to read when the consumer started (Pulsar: its last message id
    /// is at or before the subscription's mark-delete position), so the cold start does not
    /// wait for its first arrival. It says nothing about later messages.
    pub fn set_known_empty(
        &mut self,
        partition: u32,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) {
        if let Some(part) = self.parts.get_mut(partition as usize) {
            part.known_empty = true;
        }
        self.refresh(now, control);
    }

    /// Old partition `partition` reached the drain point of the current growth hold (see
    /// [`Gate::set_partitions_with_drain_points`]); the hold of its level ends once every old
    /// partition of the level has. Unknown partitions and partitions without a pending drain
    /// point are ignored.
    pub fn drained(&mut self, partition: u32, now: Instant, control: &mut dyn PartitionControl) {
        if let Some(part) = self.parts.get_mut(partition as usize) {
            part.drain = 0;
            part.drain_until_empty = false;
            part.drain_until_told = false;
        }
        self.refresh(now, control);
    }

    fn grow(
        &mut self,
        partitions: u32,
        told: bool,
        now: Instant,
        control: &mut dyn PartitionControl,
    ) -> Result<(), Error> {
        let from = self.layout.partitions();
        if partitions == from {
            return Ok(());
        }
        if partitions < from {
            return Err(Error::PartitionsShrunk {
                from,
                to: partitions,
            });
        }
        let layout = self.spec.layout(&self.policy, partitions)?;
        let mut old = std::mem::take(&mut self.parts);
        if let Some(max) = self.config.growth_hold {
            self.start_holds(&layout, &mut old, later_by(now, max), told);
        }
        self.install(layout, &old);
        if self.config.growth_hold.is_some() {
            for p in from..partitions {
                let level = self.layout.level_of(p).map_or(0, Level::index);
                if self.levels[level].hold_until.is_some()
                    && let Some(part) = self.parts.get_mut(p as usize)
                {
                    part.held = true;
                }
            }
        }
        self.refresh(now, control);
        // Levels may have been rebuilt with partitions whose flags disagree with the level.
        self.apply_all(control);
        Ok(())
    }

    /// Marks the drain point of every old partition of a level that `layout` grows, and when
    /// the hold of those levels ends at the latest. A partition held by an earlier growth
    /// stays held (it is not an old partition: nothing of it was delivered yet).
    fn start_holds(
        &mut self,
        layout: &PartitionLayout,
        old: &mut [Part],
        until: Instant,
        told: bool,
    ) {
        for (i, lv) in self.levels.iter_mut().enumerate() {
            let level = Level::new(i as u8);
            if layout.partitions_of(level).len() == lv.partitions.len() {
                continue;
            }
            lv.hold_until = Some(until);
            for &p in &lv.partitions {
                if let Some(part) = old.get_mut(p as usize)
                    && !part.held
                {
                    if told {
                        part.drain = 0;
                        part.drain_until_empty = false;
                        part.drain_until_told = true;
                    } else {
                        part.drain = part.buffered.saturating_add(part.backlog.unwrap_or(0));
                        part.drain_until_empty = part.backlog.is_none();
                    }
                }
            }
        }
    }

    /// Ends the holds that are over: every old partition of the level drained to the growth's
    /// point, or the hold's time is up. The released partitions get their level's state.
    fn release_holds(&mut self, now: Instant, control: &mut dyn PartitionControl) {
        let mut rejoin = Vec::new();
        for (i, lv) in self.levels.iter_mut().enumerate() {
            let Some(until) = lv.hold_until else {
                continue;
            };
            let drained = lv.partitions.iter().all(|&p| {
                self.parts.get(p as usize).is_none_or(|s| {
                    s.held || (s.drain == 0 && !s.drain_until_empty && !s.drain_until_told)
                })
            });
            if !drained && now < until {
                continue;
            }
            lv.hold_until = None;
            let joins = lv.buffered > 0 && lv.buffered == lv.held_buffered;
            lv.held_buffered = 0;
            if joins {
                rejoin.push(i);
            }
            for &p in &lv.partitions {
                let Some(part) = self.parts.get_mut(p as usize) else {
                    continue;
                };
                part.held = false;
                part.drain = 0;
                part.drain_until_empty = false;
                part.drain_until_told = false;
                if part.paused != lv.blocked {
                    part.paused = lv.blocked;
                    if lv.blocked {
                        self.pauses += 1;
                        control.pause(p);
                    } else {
                        self.resumes += 1;
                        control.resume(p);
                    }
                }
            }
        }
        // A level whose only buffered messages were held takes its turn from now on.
        for i in rejoin {
            self.join(i);
        }
    }

    /// Calls `pause` or `resume` for every partition with its current state (after a
    /// reconnect, or to start a client in the gate's state).
    pub fn sync(&mut self, control: &mut dyn PartitionControl) {
        for (p, part) in self.parts.iter().enumerate() {
            if part.paused {
                control.pause(p as u32);
            } else {
                control.resume(p as u32);
            }
        }
    }

    fn apply_all(&mut self, control: &mut dyn PartitionControl) {
        for (p, part) in self.parts.iter_mut().enumerate() {
            let blocked = self.levels[usize::from(part.level)].blocked || part.held;
            if part.paused != blocked {
                part.paused = blocked;
                if blocked {
                    self.pauses += 1;
                    control.pause(p as u32);
                } else {
                    self.resumes += 1;
                    control.resume(p as u32);
                }
            }
        }
    }

    /// Pressure, blocking and waiting clocks of every level, applied to the partitions of
    /// levels whose blocking changed. O(levels) unless something changes.
    fn refresh(&mut self, now: Instant, control: &mut dyn PartitionControl) {
        self.release_holds(now, control);
        let started = *self.started.get_or_insert(now);
        let cold_for = match self.mode {
            Mode::Strict => self.config.cold_start,
            // Never longer than aging lets a level wait before it is resumed.
            Mode::Aging { resume_after, .. } => self.config.cold_start.map(|d| d.min(resume_after)),
            // Delivery shares promise every level its share from the start.
            Mode::Shares => None,
        };
        let mut cold = cold_for.is_some_and(|d| now.saturating_duration_since(started) < d);
        let mut above = false;
        for i in 0..self.levels.len() {
            let lv = &mut self.levels[i];
            let demand = lv.buffered.saturating_add(lv.backlog);
            if lv.pressured {
                lv.pressured = demand > lv.low;
            } else {
                lv.pressured = demand >= lv.high;
            }
            if lv.full {
                lv.full = lv.buffered > lv.low;
            } else {
                lv.full = lv.buffered >= lv.high;
            }
            let blocked = cold && i > 0
                || above
                    && match self.mode {
                        Mode::Strict => true,
                        Mode::Shares => lv.full,
                        Mode::Aging { resume_after, .. } => lv
                            .waiting_since
                            .is_none_or(|s| now.saturating_duration_since(s) < resume_after),
                    };
            if lv.blocked && !blocked {
                lv.resumed_at = Some(now);
            }
            // A level resumed with an unknown backlog is presumed to wait while its first
            // fetch is on the way (under aging: half the bound), so its clock keeps running
            // and it is due at the bound, not a round trip later.
            let fetching = match self.mode {
                Mode::Aging { resume_after, .. } => lv
                    .resumed_at
                    .is_some_and(|r| now.saturating_duration_since(r) < resume_after),
                _ => false,
            };
            let waiting = lv.buffered > 0
                || lv.backlog > 0
                || ((blocked || fetching) && lv.unknown_backlog > 0);
            if !waiting {
                lv.waiting_since = None;
            } else if lv.waiting_since.is_none() {
                lv.waiting_since = Some(now);
            }
            above |= lv.pressured;
            // A level that had an arrival, or is known to have nothing to read, ends the cold
            // start for the levels below it.
            let settled = lv.arrivals > 0
                || (lv.unknown_backlog == 0 && lv.backlog == 0)
                || lv
                    .partitions
                    .iter()
                    .all(|&p| self.parts.get(p as usize).is_none_or(|s| s.known_empty));
            cold &= !settled;
            if blocked != lv.blocked {
                lv.blocked = blocked;
                for &p in &lv.partitions {
                    let Some(part) = self.parts.get_mut(p as usize) else {
                        continue;
                    };
                    let paused = blocked || part.held;
                    if part.paused != paused {
                        part.paused = paused;
                        if paused {
                            self.pauses += 1;
                            control.pause(p);
                        } else {
                            self.resumes += 1;
                            control.resume(p);
                        }
                    }
                }
            }
        }
    }

    /// A snapshot of every level's state and counters.
    pub fn stats(&self) -> GateStats {
        GateStats {
            levels: self
                .levels
                .iter()
                .enumerate()
                .map(|(i, l)| LevelStats {
                    level: Level::new(i as u8),
                    partitions: l.partitions.len(),
                    buffered: l.buffered,
                    backlog: l.backlog,
                    pressured: l.pressured,
                    paused: l.blocked,
                    arrivals: l.arrivals,
                    delivered: l.delivered,
                    acked: l.acked,
                    nacked: l.nacked,
                    mismatches: l.mismatches,
                    held: l
                        .partitions
                        .iter()
                        .filter(|&&p| self.parts.get(p as usize).is_some_and(|s| s.held))
                        .count(),
                    waiting_since: l.waiting_since,
                })
                .collect(),
            unknown_partitions: self.unknown_partitions,
            pauses: self.pauses,
            resumes: self.resumes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ControlEvent, NoControl, RecordingControl, Unlisted};

    fn gate(strategy: Strategy, queue: u32) -> Gate {
        let policy = PriorityPolicy::new(2).unwrap();
        let config = GateConfig {
            strategy,
            receiver_queue_size: queue,
            cold_start: None,
            ..GateConfig::default()
        };
        // Partitions 0, 1: level 0; 2, 3: level 1.
        Gate::new(
            policy,
            LayoutSpec::explicit([(Level::new(0), vec![0, 1]), (Level::new(1), vec![2, 3])]),
            4,
            config,
        )
        .unwrap()
    }

    #[test]
    fn first_round_is_prioritised_from_the_partition_index() {
        // Regression for the recipe: it learnt a partition's level from its first message, so
        // the first receiver queue of every partition was consumed in arrival order.
        let mut g = gate(Strategy::Strict, 100);
        let mut c = NoControl;
        let t = Instant::now();
        for _ in 0..100 {
            g.on_arrival(2, None, t, &mut c).unwrap();
            g.on_arrival(3, None, t, &mut c).unwrap();
        }
        g.on_arrival(1, None, t, &mut c).unwrap();
        assert_eq!(g.poll(t, &mut c), Some(1));
        assert_eq!(g.next_level_of(t), Some(Level::new(1)));
    }

    #[test]
    fn arrivals_pause_lower_levels_without_any_ack_and_deliveries_resume_them() {
        // Regression for the recipe: it evaluated only in onAcknowledge, so a consumer that
        // never acked was never prioritised. Queue 10 per partition: level 0 holds 20, so it
        // is under pressure at 10 and relieved at 5.
        let mut g = gate(Strategy::Strict, 10);
        let mut c = RecordingControl::new();
        let t = Instant::now();
        for _ in 0..9 {
            g.on_arrival(0, None, t, &mut c).unwrap();
        }
        assert!(c.events.is_empty());
        g.on_arrival(1, None, t, &mut c).unwrap();
        assert_eq!(c.take(), [ControlEvent::Pause(2), ControlEvent::Pause(3)]);
        // Hysteresis: no resume until at most 5 are buffered.
        for _ in 0..4 {
            assert!(g.poll(t, &mut c).is_some());
            g.on_arrival(0, None, t, &mut c).unwrap();
        }
        assert!(c.events.is_empty());
        for _ in 0..5 {
            g.poll(t, &mut c);
        }
        assert_eq!(c.take(), [ControlEvent::Resume(2), ControlEvent::Resume(3)]);
        assert_eq!(g.stats().levels[0].acked, 0);
        assert_eq!((g.stats().pauses, g.stats().resumes), (2, 2));
    }

    #[test]
    fn known_backlog_pauses_lower_levels_before_messages_arrive() {
        let mut g = gate(Strategy::Strict, 10);
        let mut c = RecordingControl::new();
        let t = Instant::now();
        g.set_backlog(0, Some(500), t, &mut c).unwrap();
        assert!(c.is_paused(2) && c.is_paused(3));
        // Arrivals move messages from backlog to buffered; the demand stays.
        g.on_arrival(0, None, t, &mut c).unwrap();
        assert_eq!(g.stats().levels[0].backlog, 499);
        g.set_backlog(0, None, t, &mut c).unwrap();
        assert!(!c.is_paused(2));
    }

    #[test]
    fn weighted_shares_follow_the_weights_with_bounded_gaps() {
        let mut g = gate(Strategy::delivery_shares(), 1000);
        let mut c = NoControl;
        let t = Instant::now();
        let mut delivered = [0u32; 2];
        let mut gap = 0;
        let mut max_gap = 0;
        for _ in 0..3000 {
            // Keep both levels loaded (overload).
            for p in 0..4 {
                while g.buffered(p) < Some(5) {
                    g.on_arrival(p, None, t, &mut c).unwrap();
                }
            }
            let p = g.poll(t, &mut c).unwrap();
            let level = g.level_of(p).unwrap().index();
            delivered[level] += 1;
            if level == 1 {
                gap = 0;
            } else {
                gap += 1;
                max_gap = max_gap.max(gap);
            }
        }
        // The default shares are 4:1 for two levels.
        assert_eq!(delivered, [2400, 600]);
        assert!(max_gap <= 4, "low waited {max_gap} deliveries");
    }

    #[test]
    fn weighted_idle_level_gets_no_saved_up_credit() {
        let mut g = gate(Strategy::DeliveryShares(vec![1, 1]), 1000);
        let mut c = NoControl;
        let t = Instant::now();
        for _ in 0..100 {
            g.on_arrival(2, None, t, &mut c).unwrap();
            g.poll(t, &mut c);
        }
        for _ in 0..10 {
            g.on_arrival(0, None, t, &mut c).unwrap();
            g.on_arrival(2, None, t, &mut c).unwrap();
        }
        let levels: Vec<usize> = (0..6)
            .map(|_| {
                let p = g.poll(t, &mut c).unwrap();
                g.level_of(p).unwrap().index()
            })
            .collect();
        // Alternates (at most one extra turn for the joiner) instead of serving level 0 ten
        // times in a row on credit saved up while it was idle.
        let high = levels.iter().filter(|&&l| l == 0).count();
        assert!((3..=4).contains(&high), "{levels:?}");
    }

    #[test]
    fn aging_bounds_the_wait_of_a_starved_level() {
        let max_wait = Duration::from_millis(100);
        let mut g = gate(Strategy::StrictAging { max_wait }, 10);
        let mut c = RecordingControl::new();
        let mut t = Instant::now();
        let step = Duration::from_millis(1);
        g.on_arrival(2, None, t, &mut c).unwrap();
        let mut last_low = t;
        let mut worst = Duration::ZERO;
        let mut lows = 0;
        for _ in 0..1000 {
            while g.buffered(0) < Some(10) {
                g.on_arrival(0, None, t, &mut c).unwrap();
            }
            // The low partition refills only while resumed (one message per step).
            if !c.is_paused(2) && g.buffered(2) < Some(3) {
                g.on_arrival(2, None, t, &mut c).unwrap();
            }
            let p = g.poll(t, &mut c).unwrap();
            if g.level_of(p) == Some(Level::new(1)) {
                worst = worst.max(t - last_low);
                last_low = t;
                lows += 1;
            }
            t += step;
        }
        assert!(worst <= max_wait + step, "low waited {worst:?}");
        assert!((9..=11).contains(&lows), "{lows} low deliveries in 1 s");
    }

    #[test]
    fn aging_resumes_a_paused_empty_level_before_it_is_due() {
        let max_wait = Duration::from_millis(100);
        let mut g = gate(Strategy::StrictAging { max_wait }, 10);
        let mut c = RecordingControl::new();
        let t0 = Instant::now();
        for _ in 0..10 {
            g.on_arrival(0, None, t0, &mut c).unwrap();
        }
        assert!(c.is_paused(2));
        // Unknown backlog on the paused level: it may be starving, so it is resumed at
        // max_wait / 2 for its messages to be buffered by the time it is due.
        g.tick(t0 + Duration::from_millis(49), &mut c);
        assert!(c.is_paused(2));
        g.tick(t0 + Duration::from_millis(50), &mut c);
        assert!(!c.is_paused(2) && !c.is_paused(3));
        // With a known empty backlog nothing waits, and the level stays paused.
        let mut g = gate(Strategy::StrictAging { max_wait }, 10);
        let mut c = RecordingControl::new();
        g.set_backlog(2, Some(0), t0, &mut c).unwrap();
        g.set_backlog(3, Some(0), t0, &mut c).unwrap();
        for _ in 0..10 {
            g.on_arrival(0, None, t0, &mut c).unwrap();
        }
        g.tick(t0 + Duration::from_secs(10), &mut c);
        assert!(c.is_paused(2));
    }

    #[test]
    fn redelivered_messages_keep_their_partition_level() {
        let mut g = gate(Strategy::Strict, 10);
        let mut c = NoControl;
        let t = Instant::now();
        assert_eq!(g.on_arrival(0, None, t, &mut c).unwrap(), Level::new(0));
        g.poll(t, &mut c);
        g.on_nack(0, t, &mut c);
        // The redelivery carries a wrong property: the partition decides, the mismatch counts.
        let level = g.on_arrival(0, Some(Level::new(1)), t, &mut c).unwrap();
        assert_eq!(level, Level::new(0));
        let stats = g.stats();
        assert_eq!(stats.levels[0].mismatches, 1);
        assert_eq!(stats.levels[0].nacked, 1);
        assert_eq!(stats.levels[0].arrivals, 2);
    }

    #[test]
    fn lower_levels_get_smaller_queues() {
        let policy = PriorityPolicy::new(4).unwrap();
        let config = GateConfig {
            receiver_queue_size: 1000,
            min_queue_size: 200,
            cold_start: None,
            ..GateConfig::default()
        };
        let g = Gate::new(policy.clone(), LayoutSpec::even(&policy), 4, config).unwrap();
        let sizes: Vec<_> = (0..4).map(|p| g.suggested_queue_size(p).unwrap()).collect();
        assert_eq!(sizes, [1000, 500, 250, 200]);
        assert_eq!(g.suggested_queue_size(4), None);
        let config = GateConfig {
            queue_sizing: QueueSizing::PerLevel(vec![5, 4, 3, 2]),
            cold_start: None,
            ..GateConfig::default()
        };
        let g = Gate::new(
            policy,
            LayoutSpec::partition_shares([1, 1, 1, 1]),
            4,
            config,
        )
        .unwrap();
        assert_eq!(g.queue_size_of(Level::new(3)), Some(2));
    }

    #[test]
    fn partition_growth_keeps_state_and_applies_the_level_state_to_new_partitions() {
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
        let config = GateConfig {
            strategy: Strategy::Strict,
            receiver_queue_size: 2,
            min_queue_size: 2,
            cold_start: None,
            ..GateConfig::default()
        };
        let mut g = Gate::new(policy, spec, 2, config).unwrap();
        let mut c = RecordingControl::new();
        let t = Instant::now();
        g.on_arrival(0, None, t, &mut c).unwrap();
        g.on_arrival(1, None, t, &mut c).unwrap();
        assert_eq!(c.take(), [ControlEvent::Pause(1)]);
        g.set_partitions(4, t, &mut c).unwrap();
        let mut events = c.take();
        events.sort_by_key(|e| match e {
            ControlEvent::Pause(p) | ControlEvent::Resume(p) => *p,
        });
        assert_eq!(events, [ControlEvent::Pause(2), ControlEvent::Pause(3)]);
        assert_eq!(g.buffered(1), Some(1));
        assert_eq!(g.buffered_at(Level::new(1)), 1);
        assert!(g.on_arrival(3, None, t, &mut c).is_ok());
        assert!(matches!(
            g.on_arrival(4, None, t, &mut c),
            Err(Error::UnknownPartition {
                partition: 4,
                partitions: 4
            })
        ));
        // Shrinking below the explicit partition is refused and nothing changes.
        assert!(g.set_partitions(0, t, &mut c).is_err());
        assert_eq!(g.partitions(), 4);
    }

    #[test]
    fn growth_hold_beyond_a_day_is_refused_and_a_growth_never_overflows_its_deadline() {
        // Regression: `growth_hold: Some(Duration::MAX)` was accepted, then the first growth
        // panicked ("overflow when adding duration to instant").
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
        let config = |hold| GateConfig {
            growth_hold: Some(hold),
            cold_start: None,
            ..GateConfig::default()
        };
        for hold in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            MAX_GROWTH_HOLD + Duration::from_nanos(1),
            Duration::ZERO,
        ] {
            let e = Gate::new(policy.clone(), spec.clone(), 2, config(hold)).unwrap_err();
            assert_eq!(
                e,
                Error::InvalidGrowthHold {
                    max: hold,
                    limit: MAX_GROWTH_HOLD
                }
            );
            let text = e.to_string();
            assert!(
                text.contains("growth_hold") && text.contains("86400s"),
                "{text}"
            );
            assert_eq!(config(hold).validate(&policy), Err(e));
        }
        // The longest hold accepted holds the new partitions.
        let mut g = Gate::new(policy, spec, 2, config(MAX_GROWTH_HOLD)).unwrap();
        let mut c = RecordingControl::new();
        let t = Instant::now();
        g.on_arrival(1, None, t, &mut c).unwrap();
        g.set_partitions(4, t, &mut c).unwrap();
        assert_eq!(g.stats().levels[1].held, 2);
        // Whatever the hold, a growth cannot panic: its deadline saturates.
        g.config.growth_hold = Some(Duration::MAX);
        g.set_partitions(6, t, &mut c).unwrap();
        assert_eq!(g.partitions(), 6);
        assert!(later_by(t, Duration::MAX) >= t + MAX_GROWTH_HOLD);
    }

    #[test]
    fn buffered_and_backlog_counts_saturate_instead_of_wrapping() {
        // Regression: set_buffered(u64::MAX) then an arrival wrapped the count to 0 in release
        // builds (and overflowed in debug builds).
        let mut g = gate(Strategy::Strict, 10);
        let mut c = RecordingControl::new();
        let t = Instant::now();
        g.set_buffered(0, u64::MAX, t, &mut c).unwrap();
        g.on_arrival(0, None, t, &mut c).unwrap();
        assert_eq!(g.buffered(0), Some(u64::MAX));
        assert_eq!(g.buffered_at(Level::new(0)), u64::MAX);
        // A second partition of the level: the level's sum saturates too.
        g.on_arrival(1, None, t, &mut c).unwrap();
        g.set_buffered(1, u64::MAX, t, &mut c).unwrap();
        assert_eq!(g.buffered_at(Level::new(0)), u64::MAX);
        assert!(c.is_paused(2) && c.is_paused(3));
        assert_eq!(g.poll(t, &mut c), Some(0));
        assert_eq!(g.buffered(0), Some(u64::MAX - 1));
        assert_eq!(g.buffered_at(Level::new(0)), u64::MAX);
        // Backlogs of a level's partitions add up without wrapping either.
        g.set_backlog(2, Some(u64::MAX), t, &mut c).unwrap();
        g.set_backlog(3, Some(u64::MAX), t, &mut c).unwrap();
        assert_eq!(g.stats().levels[1].backlog, u64::MAX);
        g.on_arrival(2, None, t, &mut c).unwrap();
        g.set_backlog(3, None, t, &mut c).unwrap();
        // A saturated sum is recomputed, not decremented: partition 2's backlog remains.
        assert_eq!(g.stats().levels[1].backlog, u64::MAX - 1);
        g.set_buffered(0, 0, t, &mut c).unwrap();
        assert_eq!(g.buffered_at(Level::new(0)), u64::MAX);
        g.set_buffered(1, 0, t, &mut c).unwrap();
        assert_eq!(g.buffered_at(Level::new(0)), 0);
        assert_eq!(g.poll(t, &mut c), Some(2));
    }

    #[test]
    fn min_queue_size_above_the_receiver_queue_is_refused_not_capped() {
        // Regression: min_queue_size 50 with a receiver queue of 20 was silently capped to 20.
        let policy = PriorityPolicy::new(3).unwrap();
        let spec = LayoutSpec::even(&policy);
        let config = |receiver_queue_size, min_queue_size, queue_sizing| GateConfig {
            receiver_queue_size,
            min_queue_size,
            queue_sizing,
            cold_start: None,
            ..GateConfig::default()
        };
        let e = Gate::new(
            policy.clone(),
            spec.clone(),
            3,
            config(20, 50, QueueSizing::Halving),
        )
        .unwrap_err();
        let Error::InvalidQueueSize { reason } = &e else {
            panic!("{e:?}");
        };
        assert!(
            reason.contains("min_queue_size 50") && reason.contains("receiver_queue_size 20"),
            "{reason}"
        );
        assert!(e.to_string().contains("at most 20"), "{e}");
        assert_eq!(
            config(20, 50, QueueSizing::Halving).validate(&policy),
            Err(e)
        );
        // Equal is fine, and the other sizings do not read min_queue_size.
        let g = Gate::new(
            policy.clone(),
            spec.clone(),
            3,
            config(20, 20, QueueSizing::Halving),
        )
        .unwrap();
        assert_eq!(g.queue_size_of(Level::new(2)), Some(20));
        let g = Gate::new(policy, spec, 3, config(20, 50, QueueSizing::Uniform)).unwrap();
        assert_eq!(g.queue_size_of(Level::new(2)), Some(20));
    }

    #[test]
    fn delivery_without_arrival_never_underflows() {
        let mut g = gate(Strategy::Strict, 10);
        let mut c = NoControl;
        let t = Instant::now();
        g.on_delivered(3, t, &mut c).unwrap();
        assert_eq!(g.buffered(3), Some(0));
        assert_eq!(g.stats().levels[1].delivered, 1);
        assert!(g.on_delivered(9, t, &mut c).is_err());
        assert_eq!(g.poll(t, &mut c), None);
    }

    #[test]
    fn config_validation() {
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::partition_shares([1, 1]);
        let bad = [
            GateConfig {
                high_watermark: 0.2,
                low_watermark: 0.2,
                cold_start: None,
                ..GateConfig::default()
            },
            GateConfig {
                high_watermark: f64::NAN,
                cold_start: None,
                ..GateConfig::default()
            },
            GateConfig {
                strategy: Strategy::DeliveryShares(vec![1]),
                cold_start: None,
                ..GateConfig::default()
            },
            GateConfig {
                strategy: Strategy::StrictAging {
                    max_wait: Duration::ZERO,
                },
                cold_start: None,
                ..GateConfig::default()
            },
            GateConfig {
                receiver_queue_size: 0,
                cold_start: None,
                ..GateConfig::default()
            },
            GateConfig {
                queue_sizing: QueueSizing::PerLevel(vec![1, 0]),
                cold_start: None,
                ..GateConfig::default()
            },
        ];
        for config in bad {
            let e = Gate::new(policy.clone(), spec.clone(), 2, config.clone()).unwrap_err();
            assert!(!e.to_string().is_empty(), "{config:?}");
        }
        assert!(Gate::new(policy, spec, 1, GateConfig::default()).is_err());
    }
}
