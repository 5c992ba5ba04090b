//! The growth table: a keyed topic of 3 levels grows mid-run, and each layout kind and key
//! option is measured against no priority in the same run.
//!
//! The scenario (issue 16's shape): shares 60/30/10 over 10 partitions, 200 keys; a first
//! wave of 25,000 low, 5,000 mid and 500 high messages is waiting when the consumer starts
//! (10 msg/ms); halfway through it the topic grows to 16 partitions (the producers switch at
//! once, the consumer subscribes the new partitions 100 ms later) and a second wave of the same
//! size is published. Every message has a key; a key keeps to one partition of its level for a
//! given layout.
//!
//! Per row: the high level's p99 latency of each wave and its ratio to no priority's; **key
//! order violations**: messages delivered after a later message of the same key and level
//! (per (level, key), so no priority and ours are counted alike); messages that arrived on a
//! partition of another level than their own (a layout that moved partitions); the longest
//! run of other deliveries while low messages were buffered in the client, next to the
//! delivery-share bound the gate states; and the longest time low messages waited without a
//! delivery (ms).

use std::time::{Duration, Instant};

use mq_priority::{
    Gate, GateConfig, KeyHash, KeyPlacement, LayoutSpec, Level, PriorityPolicy, QueueSizing,
    Router, RouterConfig, StickyWindow, Strategy, Unlisted,
};

use crate::model::{Producer, Tick, Topic};
use crate::rng::SplitMix64;
use crate::scenarios::Shrink;
use crate::strategies::{Consumer, Kind, Setup};

/// The number of levels.
const LEVELS: usize = 3;

/// The growth scenario's size and timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrowthScenario {
    /// Its name (command line and heading).
    pub(crate) name: &'static str,
    /// The levels' partition shares.
    pub(crate) shares: [u32; LEVELS],
    /// Partitions before and after.
    pub(crate) partitions: (u32, u32),
    /// Keys (`key-0` … ).
    pub(crate) keys: u64,
    /// Messages of each wave: low, mid, high.
    pub(crate) wave: [u64; 3],
    /// When the topic grows and the second wave is published.
    pub(crate) grow_at: Tick,
    /// How much later the consumer subscribes the new partitions.
    pub(crate) consumer_lag: Tick,
    /// Messages the application takes per tick.
    pub(crate) service: u64,
    /// The top level's receiver queue.
    pub(crate) queue: u32,
    /// The run stops here at the latest.
    pub(crate) max_ticks: Tick,
}

/// The scenarios at full size, or shrunk (fewer messages, same ratios): issue 16's shape
/// (shares 60/30/10, 10 → 16 partitions: only levels 0 and 1 gain partitions), and even
/// shares on 6 → 12 partitions (every level doubles, so every level's keys move).
pub(crate) fn scenarios(shrink: Shrink) -> [GrowthScenario; 2] {
    let wave = [25_000 / shrink, 5_000 / shrink, 500 / shrink];
    let first: u64 = wave.iter().sum();
    let issue = GrowthScenario {
        name: "growth-keys",
        shares: [60, 30, 10],
        partitions: (10, 16),
        keys: 200,
        wave,
        // Halfway through the first wave at 10 msg/ms.
        grow_at: first / 20,
        consumer_lag: 100 / shrink,
        service: 10,
        queue: 100,
        max_ticks: 60_000,
    };
    let even = GrowthScenario {
        name: "growth-keys-even",
        shares: [1, 1, 1],
        partitions: (6, 12),
        ..issue
    };
    [issue, even]
}

/// How partitions are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayoutKind {
    /// `LayoutSpec::Shares(60/30/10)`.
    Shares,
    /// The first layout's sets written out, added partitions to the default (lowest) level.
    Explicit,
}

/// How keys are kept in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyOption {
    /// `hash % n` (the Java client's placement).
    Modulo,
    /// Jump consistent hashing.
    Jump,
    /// Jump, and the consumer's growth hold with the old partitions' backlogs known.
    JumpHold,
    /// Jump, and the growth hold with backlogs unknown (drained once seen empty).
    JumpHoldBlind,
}

/// One row's configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// `None`: no priority (Pulsar's key router over all partitions, a merged consumer).
    pub(crate) layout: Option<LayoutKind>,
    /// The key option.
    pub(crate) keys: KeyOption,
    /// The gate's strategy (ours only).
    pub(crate) strategy: Strategy,
}

impl Row {
    fn label(&self) -> String {
        let keys = match self.keys {
            KeyOption::Modulo => "modulo",
            KeyOption::Jump => "jump",
            KeyOption::JumpHold => "jump + hold",
            KeyOption::JumpHoldBlind => "jump + hold, backlog unknown",
        };
        let Some(layout) = self.layout else {
            return format!("no priority, {keys}");
        };
        let layout = match layout {
            LayoutKind::Shares => "shares",
            LayoutKind::Explicit => "explicit",
        };
        let strategy = match &self.strategy {
            Strategy::DeliveryShares(_) => "delivery shares".to_string(),
            Strategy::StrictAging { max_wait } => format!("aging {} ms", max_wait.as_millis()),
            Strategy::Strict => "strict".to_string(),
            // A strategy added to mq-priority later: its debug form until it gets a label.
            other => format!("{other:?}"),
        };
        format!("{layout}, {keys}, {strategy}")
    }
}

/// Every row of the table, no priority first.
pub(crate) fn rows() -> Vec<Row> {
    let mut rows = vec![
        Row {
            layout: None,
            keys: KeyOption::Modulo,
            strategy: Strategy::Strict,
        },
        Row {
            layout: None,
            keys: KeyOption::Jump,
            strategy: Strategy::Strict,
        },
    ];
    let strategies = [
        Strategy::delivery_shares(),
        Strategy::StrictAging {
            max_wait: Duration::from_millis(50),
        },
    ];
    for layout in [LayoutKind::Shares, LayoutKind::Explicit] {
        for keys in [
            KeyOption::Modulo,
            KeyOption::Jump,
            KeyOption::JumpHold,
            KeyOption::JumpHoldBlind,
        ] {
            for strategy in &strategies {
                rows.push(Row {
                    layout: Some(layout),
                    keys,
                    strategy: strategy.clone(),
                });
            }
        }
    }
    rows
}

/// One row's results.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GrowthReport {
    /// The row's label.
    pub(crate) label: String,
    /// High p99 latency (ms) of the first and the second wave.
    pub(crate) high_p99: [u64; 2],
    /// Mid p99 latency (ms) of the second wave.
    pub(crate) mid_p99: u64,
    /// Messages delivered after a later message of their key and level.
    pub(crate) key_violations: u64,
    /// (level, key) pairs with at least one violation, and (level, key) pairs whose partition
    /// changed with the growth.
    pub(crate) keys_reordered: (u64, u64),
    /// Reordered (level, key) pairs whose partition did not change (none expected).
    pub(crate) reordered_unmoved: u64,
    /// Arrivals on a partition of another level than the message's.
    pub(crate) mismatches: u64,
    /// Most deliveries of other levels in a row while low messages were buffered.
    pub(crate) low_gap_deliveries: Option<u64>,
    /// The gate's stated bound for that (delivery shares only).
    pub(crate) low_bound: Option<u64>,
    /// Longest time (ms) low messages waited without a low delivery.
    pub(crate) low_gap_ms: u64,
    /// Messages delivered, and published.
    pub(crate) delivered: (u64, u64),
    /// The last delivery's tick.
    pub(crate) last_delivery: Tick,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    level: u8,
    key: u32,
    /// Publication order within (level, key).
    seq: u32,
    wave: u8,
    at: Tick,
}

fn policy() -> Result<PriorityPolicy, String> {
    PriorityPolicy::new(LEVELS).map_err(|e| e.to_string())
}

fn layout_spec(
    kind: LayoutKind,
    shares: [u32; LEVELS],
    partitions: u32,
) -> Result<LayoutSpec, String> {
    let shares = LayoutSpec::partition_shares(shares);
    match kind {
        LayoutKind::Shares => Ok(shares),
        LayoutKind::Explicit => {
            let first = shares
                .layout(&policy()?, partitions)
                .map_err(|e| e.to_string())?;
            let sets = policy()?
                .all_levels()
                .map(|l| (l, first.partitions_of(l).to_vec()))
                .collect::<Vec<_>>();
            Ok(LayoutSpec::explicit_with(sets, Unlisted::DefaultLevel))
        }
    }
}

fn placement(keys: KeyOption) -> KeyPlacement {
    match keys {
        KeyOption::Modulo => KeyPlacement::Modulo,
        _ => KeyPlacement::Jump,
    }
}

/// Runs one row of `s`.
pub(crate) fn run(s: &GrowthScenario, row: &Row) -> Result<GrowthReport, String> {
    let start = Instant::now();
    let at = |tick: Tick| start + Duration::from_millis(tick);
    let (from, to) = s.partitions;
    let mut rng = SplitMix64::new(0x6120_7717);
    let mut topic = Topic::new(from);
    let mut producer = Producer::new(None);
    let key_names: Vec<String> = (0..s.keys).map(|k| format!("key-{k}")).collect();
    let new_router = || -> Result<Option<Router>, String> {
        let Some(kind) = row.layout else {
            return Ok(None);
        };
        Router::new(
            policy()?,
            layout_spec(kind, s.shares, from)?,
            from,
            RouterConfig {
                hash: KeyHash::JavaStringHash,
                placement: placement(row.keys),
                sticky: StickyWindow::per_message(),
            },
            start,
        )
        .map(Some)
        .map_err(|e| e.to_string())
    };
    let router = new_router()?;
    // A router's partition count never goes down: the placements before and after the growth
    // come from routers of their own.
    let (before, after) = (new_router()?, new_router()?);
    let mut consumer = match row.layout {
        Some(kind) => {
            let config = GateConfig::default()
                .with_strategy(row.strategy.clone())
                .with_receiver_queue_size(s.queue)
                .with_queue_sizing(QueueSizing::Halving)
                .with_growth_hold(
                    matches!(row.keys, KeyOption::JumpHold | KeyOption::JumpHoldBlind)
                        .then_some(Duration::from_secs(30)),
                );
            let gate = Gate::new(policy()?, layout_spec(kind, s.shares, from)?, from, config)
                .map_err(|e| e.to_string())?;
            Consumer::gated(gate, row.keys == KeyOption::JumpHold, &mut topic, start)
        }
        None => {
            let setup = Setup {
                levels: LEVELS,
                partitions: from,
                queue: s.queue,
                batching: None,
                start,
            };
            Consumer::new(&Kind::NoPriority, &setup, &mut topic, start)?
        }
    };
    let mut messages: Vec<Msg> = Vec::new();
    let mut levels: Vec<u8> = Vec::new();
    let mut next_seq = vec![0u32; LEVELS * s.keys as usize];
    let mut delivered_seq = vec![None::<u32>; LEVELS * s.keys as usize];
    let mut live = from;
    // Where each (level, key) goes before and after the growth.
    let place_with = |router: &Option<Router>, lv: u8, key: &str, partitions: u32| match router {
        Some(r) => r
            .route(Level::new(lv), Some(key), partitions, start)
            .unwrap_or(0),
        None => {
            placement(row.keys).slot(KeyHash::JavaStringHash.hash(key), partitions as usize) as u32
        }
    };
    let moved: Vec<bool> = (0..LEVELS as u8)
        .flat_map(|lv| key_names.iter().map(move |k| (lv, k)))
        .map(|(lv, k)| place_with(&before, lv, k, from) != place_with(&after, lv, k, to))
        .collect();
    let mut reordered = vec![false; moved.len()];
    let mut report = GrowthReport {
        label: row.label(),
        high_p99: [0; 2],
        mid_p99: 0,
        key_violations: 0,
        reordered_unmoved: 0,
        keys_reordered: (0, moved.iter().filter(|&&m| m).count() as u64),
        mismatches: 0,
        low_gap_deliveries: row.layout.map(|_| 0),
        low_bound: consumer
            .gate()
            .and_then(|g| g.delivery_bound(Level::new(2))),
        low_gap_ms: 0,
        delivered: (0, 0),
        last_delivery: 0,
    };
    let mut high: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    let mut mid_after: Vec<u64> = Vec::new();
    let mut pending_low = 0u64;
    let mut low_waiting_since: Option<Tick> = None;
    let mut others_in_a_row = 0u64;
    let mut publish = |wave: u8,
                       tick: Tick,
                       live: u32,
                       topic: &mut Topic,
                       producer: &mut Producer,
                       messages: &mut Vec<Msg>,
                       levels: &mut Vec<u8>,
                       rng: &mut SplitMix64| {
        // The wave's messages, levels interleaved at random.
        let mut left = s.wave;
        let total: u64 = left.iter().sum();
        for _ in 0..total {
            let mut pick = rng.below(left.iter().sum());
            let mut level = 0;
            for (l, n) in left.iter().enumerate() {
                if pick < *n {
                    level = l;
                    break;
                }
                pick -= n;
            }
            left[level] -= 1;
            let key = rng.below(s.keys) as u32;
            let slot = level * s.keys as usize + key as usize;
            let seq = next_seq[slot];
            next_seq[slot] += 1;
            let id = messages.len() as u32;
            let lv = 2 - level as u8; // left is [low, mid, high]
            messages.push(Msg {
                level: lv,
                key,
                seq,
                wave,
                at: tick,
            });
            levels.push(lv);
            let p = place_with(&router, lv, &key_names[key as usize], live);
            producer.send(topic, p, id, tick);
        }
    };
    publish(
        0,
        0,
        live,
        &mut topic,
        &mut producer,
        &mut messages,
        &mut levels,
        &mut rng,
    );
    pending_low += s.wave[0];
    low_waiting_since.get_or_insert(0);
    let mut tick: Tick = 0;
    loop {
        let now = at(tick);
        if tick == s.grow_at {
            topic.grow(to);
            live = to;
            publish(
                1,
                tick,
                live,
                &mut topic,
                &mut producer,
                &mut messages,
                &mut levels,
                &mut rng,
            );
            pending_low += s.wave[0];
        }
        if tick == s.grow_at + s.consumer_lag {
            consumer.set_partitions(to, s.queue, &mut topic, now);
        }
        for (p, entry) in topic.dispatch() {
            consumer.on_arrival(p, &entry, &levels, &mut topic, now);
        }
        consumer.tick(&mut topic, now);
        for _ in 0..s.service {
            let Some((p, id)) = consumer.take(&levels, &mut topic, now) else {
                break;
            };
            consumer.on_ack(p, &mut topic, now);
            let m = messages[id as usize];
            report.delivered.0 += 1;
            report.last_delivery = tick;
            match (m.level, m.wave) {
                (0, 0) => high[0].push(tick - m.at),
                (0, _) => high[1].push(tick - m.at),
                (1, 1) => mid_after.push(tick - m.at),
                _ => {}
            }
            let slot = usize::from(m.level) * s.keys as usize + m.key as usize;
            match delivered_seq[slot] {
                Some(last) if last > m.seq => {
                    report.key_violations += 1;
                    reordered[slot] = true;
                }
                _ => delivered_seq[slot] = Some(m.seq),
            }
            if m.level == 2 {
                pending_low -= 1;
                if let Some(since) = low_waiting_since {
                    report.low_gap_ms = report.low_gap_ms.max(tick - since);
                }
                low_waiting_since = (pending_low > 0).then_some(tick);
                others_in_a_row = 0;
            } else if let Some(gate) = consumer.gate() {
                if gate.buffered_at(Level::new(2)) > 0 {
                    others_in_a_row += 1;
                    if let Some(gap) = report.low_gap_deliveries.as_mut() {
                        *gap = (*gap).max(others_in_a_row);
                    }
                } else {
                    others_in_a_row = 0;
                }
            }
        }
        let done = tick > s.grow_at && report.delivered.0 == messages.len() as u64;
        if done || tick + 1 >= s.max_ticks {
            break;
        }
        tick += 1;
    }
    report.delivered.1 = messages.len() as u64;
    report.keys_reordered.0 = reordered.iter().filter(|&&r| r).count() as u64;
    report.reordered_unmoved = reordered
        .iter()
        .zip(&moved)
        .filter(|&(&r, &m)| r && !m)
        .count() as u64;
    report.mismatches = consumer.gate().map_or(0, |g| {
        g.stats().levels.iter().map(|l| l.mismatches).sum::<u64>()
    });
    let p99 = |v: &mut Vec<u64>| {
        v.sort_unstable();
        if v.is_empty() {
            0
        } else {
            v[(v.len() * 99).div_ceil(100).max(1) - 1]
        }
    };
    report.high_p99 = [p99(&mut high[0]), p99(&mut high[1])];
    report.mid_p99 = p99(&mut mid_after);
    Ok(report)
}

/// The table of every row, as Markdown.
pub(crate) fn render(s: &GrowthScenario, reports: &[GrowthReport]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#### {}\n\n3 levels (partition shares {:?}) on {} partitions, {} keys; a \
         first wave of {} low, {} mid and {} high messages waits when the consumer starts (10 \
         msg/ms); at {} ms the topic grows to {} partitions (producers at once, the consumer \
         {} ms later) and a second wave of the same size is published; drained. Delivery \
         shares are the default 16:4:1.\n",
        s.name,
        s.shares,
        s.partitions.0,
        s.keys,
        s.wave[0],
        s.wave[1],
        s.wave[2],
        s.grow_at,
        s.partitions.1,
        s.consumer_lag,
    );
    let base = reports.first().map(|r| r.high_p99);
    out.push_str(
        "| layout, keys, strategy | high p99 ms before / after | % of no priority before / \
         after | mid p99 ms after | key-order violations | keys reordered / moved | level mismatches | longest low \
         gap (deliveries; bound) | longest low gap ms | delivered | last delivery ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        let pct = |i: usize| {
            base.filter(|b| b[i] > 0).map_or_else(
                || "–".to_string(),
                |b| format!("{:.1}", r.high_p99[i] as f64 * 100.0 / b[i] as f64),
            )
        };
        let gap = match (r.low_gap_deliveries, r.low_bound) {
            (Some(g), Some(b)) => format!("{g}; {b}"),
            (Some(g), None) => format!("{g}; –"),
            _ => "–".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} / {} | {} | {} | {} / {} | {} | {} | {} | {}/{} | {} |",
            r.label,
            r.high_p99[0],
            r.high_p99[1],
            pct(0),
            pct(1),
            r.mid_p99,
            r.key_violations,
            r.keys_reordered.0,
            r.keys_reordered.1,
            r.mismatches,
            gap,
            r.low_gap_ms,
            r.delivered.0,
            r.delivered.1,
            r.last_delivery,
        );
    }
    out
}

#[cfg(test)]
pub(crate) fn run_all(s: &GrowthScenario) -> Vec<GrowthReport> {
    rows()
        .iter()
        .map(|row| run(s, row).expect("a valid row"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::TEST;

    fn is_ours(r: &GrowthReport) -> bool {
        !r.label.starts_with("no priority")
    }

    #[test]
    fn after_growth_urgent_messages_still_overtake_and_nothing_is_lost() {
        for s in scenarios(TEST) {
            let reports = run_all(&s);
            let base = reports[0].high_p99;
            for r in &reports {
                assert_eq!(r.delivered.0, r.delivered.1, "{}: {}", s.name, r.label);
                assert_eq!(r.mismatches, 0, "{}: {} moved a partition", s.name, r.label);
                if is_ours(r) {
                    for (wave, (&ours, &none)) in r.high_p99.iter().zip(&base).enumerate() {
                        assert!(
                            ours * 10 <= none,
                            "{}: {}: high p99 {ours} ms in wave {wave}, no priority {none} ms",
                            s.name,
                            r.label,
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_growth_hold_keeps_every_key_in_order_and_only_moved_keys_are_reordered() {
        for s in scenarios(TEST) {
            let reports = run_all(&s);
            for (row, r) in rows().iter().zip(&reports) {
                if is_ours(r) {
                    assert_eq!(r.reordered_unmoved, 0, "{}: {}", s.name, r.label);
                }
                if row.layout.is_some() && row.keys == KeyOption::JumpHold {
                    assert_eq!(r.key_violations, 0, "{}: {}", s.name, r.label);
                }
            }
            // The check can fail: without the hold, the keys the growth moved are reordered.
            let without: u64 = rows()
                .iter()
                .zip(&reports)
                .filter(|(row, _)| row.layout.is_some() && row.keys == KeyOption::Jump)
                .map(|(_, r)| r.key_violations)
                .sum();
            if s.name == "growth-keys-even" {
                assert!(without > 0, "{}: no violation without the hold", s.name);
            }
        }
    }

    #[test]
    fn the_low_level_gets_its_turn_within_the_stated_bounds() {
        for s in scenarios(TEST) {
            for (row, r) in rows().iter().zip(run_all(&s)) {
                match row.strategy {
                    Strategy::DeliveryShares(_) if row.layout.is_some() => {
                        let (gap, bound) = (r.low_gap_deliveries.unwrap(), r.low_bound.unwrap());
                        assert!(gap <= bound, "{}: {}: {gap} > {bound}", s.name, r.label);
                    }
                    Strategy::StrictAging { max_wait } => {
                        let bound = max_wait.as_millis() as u64 + 1;
                        assert!(r.low_gap_ms <= bound, "{}: {}", s.name, r.label);
                    }
                    _ => {}
                }
            }
        }
    }
}
