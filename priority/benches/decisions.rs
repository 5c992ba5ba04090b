//! Cost of the per-message decisions: routing a message, and the gate's work per arrival.
//!
//! Group `router` (64 partitions, 4 levels, weights 8:4:2:1, one call per iteration):
//! - `baseline_modulo`: an atomic counter modulo 64 (what a plain round robin costs);
//! - `round_robin`: [`Router::route`] without a key (sticky window of 1,000 messages / 10 ms);
//! - `key_java_hash`, `key_murmur3`: [`Router::route`] with a 12-byte key.
//!
//! Group `gate` (64 partitions, 4 levels, receiver queue 8 so that pressure crosses the
//! watermarks and pause/resume calls happen, counted by a control that only counts):
//! - `arrival/<strategy>`: one [`Gate::on_arrival`] per iteration, partitions in turn;
//! - `arrival_and_poll/<strategy>`: one arrival and one [`Gate::poll`] per iteration (steady
//!   state: the buffered total stays constant; pressure changes only rarely, the pause and
//!   resume counts are printed after each bench).
//! - `pressure_cycle/<strategy>`: 140 arrivals on the top level's partitions, which takes the
//!   top level above its high watermark (33 partitions x queue 8 x 0.5 = 132): the 31 lower
//!   partitions are paused; then 140 polls, below the low watermark: they are resumed (under
//!   the weighted strategy the empty lower levels are never paused). Criterion reports the
//!   time of one iteration: divide by 280 events.
//!
//! Run with `cargo bench -p mq-priority --bench decisions`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mq_priority::{
    Gate, GateConfig, KeyHash, LayoutSpec, Level, PartitionControl, PriorityPolicy, Router,
    RouterConfig, Strategy,
};

const PARTITIONS: u32 = 64;
const LEVELS: usize = 4;
/// Arrivals (then polls) per `pressure_cycle` iteration.
const CYCLE: usize = 140;

fn policy() -> PriorityPolicy {
    PriorityPolicy::new(LEVELS).expect("valid policy")
}

fn spec() -> LayoutSpec {
    LayoutSpec::partition_shares([8, 4, 2, 1])
}

fn router(c: &mut Criterion) {
    let mut group = c.benchmark_group("router");
    let now = Instant::now();

    let counter = AtomicU64::new(0);
    group.bench_function("baseline_modulo", |b| {
        b.iter(|| black_box(counter.fetch_add(1, Ordering::Relaxed) % u64::from(PARTITIONS)))
    });

    let rr = Router::new(policy(), spec(), PARTITIONS, RouterConfig::default(), now)
        .expect("valid router");
    let mut level = 0u8;
    group.bench_function("round_robin", |b| {
        b.iter(|| {
            level = (level + 1) % LEVELS as u8;
            black_box(rr.route(black_box(Level::new(level)), None, PARTITIONS, now))
        })
    });

    for (name, hash) in [
        ("key_java_hash", KeyHash::JavaStringHash),
        ("key_murmur3", KeyHash::Murmur3_32Hash),
    ] {
        let config = RouterConfig {
            hash,
            ..RouterConfig::default()
        };
        let r = Router::new(policy(), spec(), PARTITIONS, config, now).expect("valid router");
        group.bench_function(name, |b| {
            b.iter(|| {
                black_box(r.route(
                    Level::new(1),
                    Some(black_box("order-123456")),
                    PARTITIONS,
                    now,
                ))
            })
        });
    }
    group.finish();
}

/// Counts calls; costs about what an adapter setting a flag costs.
#[derive(Default)]
struct Counting {
    pauses: u64,
    resumes: u64,
}

impl PartitionControl for Counting {
    fn pause(&mut self, _partition: u32) {
        self.pauses += 1;
    }
    fn resume(&mut self, _partition: u32) {
        self.resumes += 1;
    }
}

fn strategies() -> [(&'static str, Strategy); 3] {
    [
        ("strict", Strategy::Strict),
        ("weighted", Strategy::delivery_shares()),
        (
            "aging",
            Strategy::StrictAging {
                max_wait: Duration::from_millis(50),
            },
        ),
    ]
}

fn new_gate(strategy: Strategy) -> Gate {
    let config = GateConfig::default()
        .with_strategy(strategy)
        .with_receiver_queue_size(8)
        .with_min_queue_size(2);
    Gate::new(policy(), spec(), PARTITIONS, config).expect("valid gate")
}

fn gate(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate");
    let start = Instant::now();
    let tick = Duration::from_micros(1);

    for (name, strategy) in strategies() {
        let mut gate = new_gate(strategy);
        let mut control = Counting::default();
        let mut now = start;
        let mut p = 0u32;
        group.bench_function(format!("arrival/{name}"), |b| {
            b.iter(|| {
                p = (p + 1) % PARTITIONS;
                now += tick;
                black_box(gate.on_arrival(black_box(p), None, now, &mut control))
            })
        });
        black_box(&control.pauses);
    }

    for (name, strategy) in strategies() {
        let mut gate = new_gate(strategy);
        let mut control = Counting::default();
        let mut now = start;
        // Two messages buffered per partition: around the watermarks of every level.
        for p in 0..PARTITIONS {
            for _ in 0..2 {
                let _ = gate.on_arrival(p, None, now, &mut control);
            }
        }
        let mut p = 0u32;
        group.bench_function(format!("arrival_and_poll/{name}"), |b| {
            b.iter(|| {
                // Arrivals weighted towards the top level: partition (p * p) % 64 favours low
                // indices, so the levels' pressure keeps changing.
                p = p.wrapping_add(1);
                let target = (p.wrapping_mul(p) >> 3) % PARTITIONS;
                now += tick;
                let _ = gate.on_arrival(target, None, now, &mut control);
                black_box(gate.poll(now, &mut control))
            })
        });
        eprintln!(
            "gate/arrival_and_poll/{name}: {} pauses, {} resumes",
            control.pauses, control.resumes
        );
    }

    for (name, strategy) in strategies() {
        let mut gate = new_gate(strategy);
        let mut control = Counting::default();
        let mut now = start;
        let top: Vec<u32> = (0..PARTITIONS)
            .filter(|&p| gate.level_of(p) == Some(Level::HIGHEST))
            .collect();
        group.bench_function(format!("pressure_cycle/{name}"), |b| {
            b.iter(|| {
                for i in 0..CYCLE {
                    now += tick;
                    let p = top[i % top.len()];
                    let _ = gate.on_arrival(p, None, now, &mut control);
                }
                for _ in 0..CYCLE {
                    now += tick;
                    black_box(gate.poll(now, &mut control));
                }
            })
        });
        eprintln!(
            "gate/pressure_cycle/{name}: {} pauses, {} resumes",
            control.pauses, control.resumes
        );
    }
    group.finish();
}

criterion_group!(benches, router, gate);
criterion_main!(benches);
