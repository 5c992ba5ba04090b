//! The bounds the gate's documentation states, as properties: the deliveries between two of a
//! level's own under delivery shares, the wait of a level under strict with aging, and key
//! order across a growth with the growth hold.

use std::time::{Duration, Instant};

use mq_priority::{
    Gate, GateConfig, LayoutSpec, Level, NoControl, PriorityPolicy, RecordingControl,
    Strategy as GateStrategy,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A message arrives on this partition (modulo the partition count).
    Arrive(u32),
    /// The application takes one message.
    Poll,
    /// The topic grows by this many partitions.
    Grow(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u32..64).prop_map(Op::Arrive),
        8 => Just(Op::Poll),
        1 => (1u32..4).prop_map(Op::Grow),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under delivery shares, while a level has buffered messages, at most
    /// `Gate::delivery_bound(level)` deliveries of other levels come between two of its own,
    /// whatever arrives, when, and across growth.
    #[test]
    fn delivery_shares_bound_the_deliveries_between_two_of_a_level(
        shares in proptest::collection::vec(1u32..12, 1..6),
        extra in 0u32..8,
        ops in proptest::collection::vec(op(), 1..600),
    ) {
        let levels = shares.len();
        let policy = PriorityPolicy::new(levels).unwrap();
        let config = GateConfig::default().with_strategy(GateStrategy::DeliveryShares(shares.clone()));
        let partitions = levels as u32 + extra;
        let mut gate = Gate::new(policy.clone(), LayoutSpec::even(&policy), partitions, config).unwrap();
        let bounds: Vec<u64> = policy
            .all_levels()
            .map(|l| gate.delivery_bound(l).unwrap())
            .collect();
        let now = Instant::now();
        // Other levels' deliveries since the level's last delivery, counted while it has
        // buffered messages (None: it had none at some point since).
        let mut others: Vec<Option<u64>> = vec![None; levels];
        for op in ops {
            match op {
                Op::Arrive(p) => {
                    let p = p % gate.partitions();
                    let level = gate.on_arrival(p, None, now, &mut NoControl).unwrap();
                    others[level.index()].get_or_insert(0);
                }
                Op::Poll => {
                    let Some(p) = gate.poll(now, &mut NoControl) else { continue };
                    let served = gate.level_of(p).unwrap().index();
                    for (k, count) in others.iter_mut().enumerate() {
                        if k == served {
                            *count = Some(0);
                        } else if let Some(c) = count {
                            *c += 1;
                            prop_assert!(
                                *c <= bounds[k],
                                "level {} waited {} deliveries, bound {} (shares {:?})",
                                k, c, bounds[k], shares
                            );
                        }
                    }
                    for (k, count) in others.iter_mut().enumerate() {
                        if gate.buffered_at(Level::new(k as u8)) == 0 {
                            *count = None;
                        }
                    }
                }
                Op::Grow(by) => {
                    let to = gate.partitions() + by;
                    gate.set_partitions(to, now, &mut NoControl).unwrap();
                }
            }
        }
    }

    /// Under strict with aging, ticked every millisecond with one delivery per level per tick,
    /// a level with buffered messages waits at most `max_wait` plus one tick between its
    /// deliveries (or since its messages arrived).
    #[test]
    fn aging_serves_a_waiting_level_within_one_tick_of_its_bound(
        levels in 2usize..5,
        max_wait_ms in 1u64..40,
        arrivals in proptest::collection::vec(proptest::collection::vec(0u32..16, 0..6), 1..300),
    ) {
        let policy = PriorityPolicy::new(levels).unwrap();
        let max_wait = Duration::from_millis(max_wait_ms);
        let tick = Duration::from_millis(1);
        let config = GateConfig::default().with_strategy(GateStrategy::StrictAging { max_wait });
        let partitions = levels as u32 * 2;
        let mut gate = Gate::new(policy.clone(), LayoutSpec::even(&policy), partitions, config).unwrap();
        let start = Instant::now();
        let mut control = RecordingControl::new();
        // Since when each level has waited: its last delivery, or its first arrival since.
        let mut since: Vec<Option<Instant>> = vec![None; levels];
        let check = |gate: &Gate, now: Instant, since: &[Option<Instant>]| {
            for (k, s) in since.iter().enumerate() {
                if let Some(s) = s
                    && gate.buffered_at(Level::new(k as u8)) > 0
                {
                    let waited = now - *s;
                    assert!(
                        waited <= max_wait + tick,
                        "level {k} waited {waited:?} with messages buffered, bound {max_wait:?} + 1 ms"
                    );
                }
            }
        };
        let mut step = |gate: &mut Gate, now: Instant, since: &mut Vec<Option<Instant>>, arrive: &[u32], feed: bool| {
            for &p in arrive {
                let level = gate.on_arrival(p % partitions, None, now, &mut control).unwrap();
                since[level.index()].get_or_insert(now);
            }
            gate.tick(now, &mut control);
            // A strict level 0 that always has messages: one arrives before each poll.
            for _ in 0..levels {
                if feed {
                    gate.on_arrival(0, None, now, &mut control).unwrap();
                    since[0].get_or_insert(now);
                }
                if let Some(p) = gate.poll(now, &mut control) {
                    let k = gate.level_of(p).unwrap().index();
                    since[k] = Some(now);
                }
            }
            for (k, s) in since.iter_mut().enumerate() {
                if gate.buffered_at(Level::new(k as u8)) == 0 {
                    *s = None;
                }
            }
        };
        let mut now = start;
        for arrive in &arrivals {
            step(&mut gate, now, &mut since, arrive, true);
            check(&gate, now, &since);
            now += tick;
        }
        // Then nothing arrives any more, until everything drained.
        for _ in 0..10_000 {
            if (1..levels).all(|k| gate.buffered_at(Level::new(k as u8)) == 0) {
                break;
            }
            step(&mut gate, now, &mut since, &[], false);
            check(&gate, now, &since);
            now += tick;
        }
        prop_assert!((1..levels).all(|k| gate.buffered_at(Level::new(k as u8)) == 0));
    }

    /// With the growth hold, a key moved to a new partition of its level has its earlier
    /// messages (on the old partition, buffered or at the broker when the growth is seen)
    /// delivered before any of the new partition's, whatever the strategy and the arrival
    /// order after the growth; without it, the new partition's messages can come first.
    #[test]
    fn the_growth_hold_delivers_the_old_partitions_first(
        strategy in prop_oneof![
            Just(GateStrategy::Strict),
            Just(GateStrategy::delivery_shares()),
            Just(GateStrategy::StrictAging { max_wait: Duration::from_millis(5) }),
        ],
        buffered_before in 0u64..20,
        backlog_before in 0u64..20,
        known_backlog in any::<bool>(),
        later in proptest::collection::vec(any::<bool>(), 1..60),
    ) {
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0])], mq_priority::Unlisted::DefaultLevel);
        let config = GateConfig::default().with_strategy(strategy).with_growth_hold(Some(Duration::from_secs(60)));
        let mut gate = Gate::new(policy, spec, 2, config).unwrap();
        let mut control = RecordingControl::new();
        let mut now = Instant::now();
        for _ in 0..buffered_before {
            gate.on_arrival(1, None, now, &mut control).unwrap();
        }
        let backlog = known_backlog.then_some(backlog_before);
        gate.set_backlog(1, backlog, now, &mut control).unwrap();
        gate.set_partitions(3, now, &mut control).unwrap();
        if buffered_before + backlog.unwrap_or(0) > 0 || !known_backlog {
            prop_assert!(control.is_paused(2), "a held partition is paused");
            prop_assert_eq!(gate.stats().levels[1].held, 1);
        }
        // What the broker still has of partition 1 arrives after the growth, interleaved with
        // the new partition 2's messages.
        let mut old_left = if known_backlog { backlog_before } else { 0 };
        let old_total = buffered_before + old_left;
        let mut delivered_old = 0;
        let mut seen_new = false;
        for new in later {
            if new {
                gate.on_arrival(2, None, now, &mut control).unwrap();
            } else if old_left > 0 {
                gate.on_arrival(1, None, now, &mut control).unwrap();
                old_left -= 1;
            }
            now += Duration::from_millis(1);
            gate.tick(now, &mut control);
            while let Some(p) = gate.poll(now, &mut control) {
                if p == 2 {
                    seen_new = true;
                } else if p == 1 {
                    prop_assert!(!seen_new || delivered_old >= old_total,
                        "an old message came after a new one");
                    delivered_old += 1;
                }
            }
        }
        if delivered_old < old_total {
            prop_assert!(!seen_new, "new partition delivered before the old one drained");
        }
    }
}

/// The hold ends at its deadline even if the old partitions never drain, and the held
/// messages are delivered then; without the hold the new partition is served at once.
#[test]
fn the_growth_hold_ends_at_its_deadline_and_is_off_by_default() {
    let policy = PriorityPolicy::new(1).unwrap();
    let spec = LayoutSpec::even(&policy);
    let t0 = Instant::now();
    for hold in [None, Some(Duration::from_millis(100))] {
        let config = GateConfig::default().with_growth_hold(hold);
        let mut gate = Gate::new(policy.clone(), spec.clone(), 1, config).unwrap();
        let mut c = RecordingControl::new();
        gate.set_backlog(0, Some(1_000), t0, &mut c).unwrap();
        gate.set_partitions(2, t0, &mut c).unwrap();
        gate.on_arrival(1, None, t0, &mut c).unwrap();
        if hold.is_none() {
            assert_eq!(gate.poll(t0, &mut c), Some(1));
            continue;
        }
        assert_eq!(
            gate.poll(t0, &mut c),
            None,
            "held: the old partition has not drained"
        );
        let late = t0 + Duration::from_millis(99);
        gate.tick(late, &mut c);
        assert_eq!(gate.poll(late, &mut c), None);
        let due = t0 + Duration::from_millis(100);
        gate.tick(due, &mut c);
        assert_eq!(gate.poll(due, &mut c), Some(1));
        assert!(!c.is_paused(1));
        assert_eq!(gate.stats().levels[0].held, 0);
    }
}

/// The strategy changes on a live gate: buffered messages stay, the new strategy decides the
/// next poll, and lower levels paused by strict pressure resume under delivery shares.
#[test]
fn the_strategy_changes_on_a_live_gate() {
    let policy = PriorityPolicy::new(2).unwrap();
    let spec = LayoutSpec::even(&policy);
    let config = GateConfig::default()
        .with_strategy(GateStrategy::Strict)
        .with_receiver_queue_size(100)
        .with_cold_start(None);
    let mut gate = Gate::new(policy, spec, 2, config).unwrap();
    let mut c = RecordingControl::new();
    let t = Instant::now();
    // Level 0 under pressure (60 of a 100 queue); level 1 holds 10 of its 50.
    for i in 0..60 {
        gate.on_arrival(0, None, t, &mut c).unwrap();
        if i < 10 {
            gate.on_arrival(1, None, t, &mut c).unwrap();
        }
    }
    assert!(c.is_paused(1), "strict pauses the low level under pressure");
    assert_eq!(gate.poll(t, &mut c), Some(0));
    gate.set_strategy(GateStrategy::DeliveryShares(vec![1, 1]), t, &mut c)
        .unwrap();
    assert!(
        !c.is_paused(1),
        "delivery shares do not pause a level that is not full"
    );
    let polled: Vec<u32> = (0..4).filter_map(|_| gate.poll(t, &mut c)).collect();
    assert_eq!(polled.iter().filter(|&&p| p == 1).count(), 2, "{polled:?}");
    assert_eq!(gate.delivery_bound(Level::new(1)), Some(2));
    assert!(matches!(
        gate.set_strategy(GateStrategy::DeliveryShares(vec![0, 1]), t, &mut c),
        Err(mq_priority::Error::InvalidShares { of: "delivery", .. })
    ));
    assert_eq!(
        gate.delivery_bound(Level::new(1)),
        Some(2),
        "unchanged on error"
    );
    let total: u64 = (0..2).map(|p| gate.buffered(p).unwrap()).sum();
    assert_eq!(total, 65);
}

/// Cold start: the lower levels start paused while the more important level's backlog is
/// unknown, until its first arrival or 1 s (their first receiver queues would otherwise arrive
/// with the urgent messages); what arrives is still delivered; a known empty backlog above,
/// or partitions known to be empty, end it at once.
#[test]
fn lower_levels_start_paused_for_the_cold_start() {
    let policy = PriorityPolicy::new(2).unwrap();
    let spec = LayoutSpec::even(&policy);
    let t0 = Instant::now();
    let config = GateConfig::default().with_strategy(GateStrategy::Strict);
    let mut gate = Gate::new(policy.clone(), spec.clone(), 2, config.clone()).unwrap();
    let mut c = RecordingControl::new();
    gate.tick(t0, &mut c);
    assert_eq!(gate.is_paused(1), Some(true));
    assert_eq!(gate.is_paused(0), Some(false));
    gate.on_arrival(1, None, t0, &mut c).unwrap();
    assert_eq!(
        gate.poll(t0, &mut c),
        Some(1),
        "a paused level's messages are delivered"
    );
    gate.tick(t0 + Duration::from_millis(999), &mut c);
    assert!(c.is_paused(1));
    gate.tick(t0 + Duration::from_secs(1), &mut c);
    assert!(!c.is_paused(1));

    // The first arrival above ends it.
    let mut gate = Gate::new(policy.clone(), spec.clone(), 2, config.clone()).unwrap();
    let mut c = RecordingControl::new();
    gate.tick(t0, &mut c);
    assert!(c.is_paused(1));
    gate.on_arrival(0, None, t0, &mut c).unwrap();
    assert!(!c.is_paused(1));

    // So does a partition known to be empty.
    let mut gate = Gate::new(policy.clone(), spec.clone(), 2, config.clone()).unwrap();
    let mut c = RecordingControl::new();
    gate.tick(t0, &mut c);
    gate.set_known_empty(0, t0, &mut c);
    assert!(!c.is_paused(1));

    let mut gate = Gate::new(policy, spec, 2, config).unwrap();
    let mut c = RecordingControl::new();
    gate.tick(t0, &mut c);
    assert!(c.is_paused(1));
    gate.set_backlog(0, Some(0), t0, &mut c).unwrap();
    assert!(!c.is_paused(1), "nothing waits above: no cold start");
}

/// With drain points, the hold ends when the adapter says the old partitions reached them,
/// not when their buffers look empty.
#[test]
fn the_growth_hold_follows_the_drain_points_the_adapter_reports() {
    let policy = PriorityPolicy::new(1).unwrap();
    let config = GateConfig::default().with_growth_hold(Some(Duration::from_secs(10)));
    let mut gate = Gate::new(policy.clone(), LayoutSpec::even(&policy), 2, config).unwrap();
    let mut c = RecordingControl::new();
    let t = Instant::now();
    gate.set_partitions_with_drain_points(3, t, &mut c).unwrap();
    gate.on_arrival(2, None, t, &mut c).unwrap();
    // Old partitions empty and ticked: counts would call them drained; drain points do not.
    gate.tick(t + Duration::from_millis(1), &mut c);
    assert_eq!(gate.poll(t, &mut c), None);
    gate.drained(0, t, &mut c);
    assert_eq!(
        gate.poll(t, &mut c),
        None,
        "partition 1 has not reached its point"
    );
    gate.drained(1, t, &mut c);
    assert_eq!(gate.poll(t, &mut c), Some(2));
    assert!(!c.is_paused(2));
}
