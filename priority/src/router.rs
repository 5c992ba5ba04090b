//! The producer side: which partition a message of a given level goes to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::{Error, KeyHash, KeyPlacement, LayoutSpec, Level, PartitionLayout, PriorityPolicy};

/// How long a level's round robin stays on one partition, so that a batching producer fills
/// batches (Pulsar switches partitions on the batching-delay boundary, 10 ms by default, for the
/// same reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StickyWindow {
    /// At most this many messages per partition before moving on (1 = plain round robin).
    pub max_messages: u32,
    /// At most this long on one partition before moving on.
    pub max_duration: Duration,
}

impl Default for StickyWindow {
    /// 1,000 messages (Pulsar's `batchingMaxMessages`) or 10 ms (its default partition switch).
    fn default() -> Self {
        StickyWindow {
            max_messages: 1000,
            max_duration: Duration::from_millis(10),
        }
    }
}

impl StickyWindow {
    /// Plain per-message round robin (for producers without batching).
    pub fn per_message() -> StickyWindow {
        StickyWindow {
            max_messages: 1,
            max_duration: Duration::MAX,
        }
    }
}

/// Router settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouterConfig {
    /// The hash of message keys (default [`KeyHash::JavaStringHash`], Pulsar's default).
    pub hash: KeyHash,
    /// How the hash picks one of the level's partitions (default [`KeyPlacement::Jump`], which
    /// moves the fewest keys when the topic grows, each to a new partition, so that the
    /// consumer's growth hold keeps their order; [`KeyPlacement::Modulo`] is the Java client's
    /// rule).
    pub placement: KeyPlacement,
    /// The round robin window for messages without a key.
    pub sticky: StickyWindow,
}

/// Chooses a partition for a message from its level and key.
///
/// - A message with a key goes to `level_partitions[placement(hash(key), len)]`: the same key
///   always lands on the same partition of its level for a given layout (per-key order holds).
///   When the topic grows, a key can move to another partition of its level, so a consumer
///   may see its later messages before its earlier ones: [`KeyPlacement::Jump`] moves the
///   fewest keys, and [`crate::GateConfig::growth_hold`] keeps their order on the consumer.
/// - A message without a key goes round robin over its level's partitions, **per level** (the
///   published recipe shared one counter between levels, which skews each level's spread), and
///   stays on a partition for a [`StickyWindow`] so batches fill.
/// - The layout follows the live partition count passed to [`Router::route`]; the returned
///   index is always below that count and in the level's set.
///
/// `route` takes `&self` (atomics and a read lock), so one router can serve a producer shared
/// between threads. Time is passed in, never read, so a simulator can drive it.
///
/// ```
/// use std::time::Instant;
/// use mq_priority::{LayoutSpec, Level, PriorityPolicy, Router, RouterConfig};
///
/// let policy = PriorityPolicy::new(2)?;
/// let now = Instant::now();
/// let router = Router::new(policy, LayoutSpec::partition_shares([1, 3]), 4, RouterConfig::default(), now)?;
/// assert_eq!(router.route(Level::new(0), None, 4, now)?, 0);
/// let p = router.route(Level::new(1), Some("order-42"), 4, now)?;
/// assert!((1..4).contains(&p));
/// assert_eq!(router.route(Level::new(1), Some("order-42"), 4, now)?, p);
/// # Ok::<(), mq_priority::Error>(())
/// ```
#[derive(Debug)]
pub struct Router {
    policy: PriorityPolicy,
    spec: LayoutSpec,
    hash: KeyHash,
    placement: KeyPlacement,
    max_messages: u64,
    window_nanos: u64,
    epoch: Instant,
    layout: RwLock<Arc<PartitionLayout>>,
    sent: Box<[AtomicU64]>,
}

fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

impl Router {
    /// A router for `partitions` partitions; `now` is the origin of the time windows.
    pub fn new(
        policy: PriorityPolicy,
        spec: LayoutSpec,
        partitions: u32,
        config: RouterConfig,
        now: Instant,
    ) -> Result<Router, Error> {
        let StickyWindow {
            max_messages,
            max_duration,
        } = config.sticky;
        if max_messages == 0 || max_duration.is_zero() {
            return Err(Error::InvalidStickyWindow {
                max_messages,
                max_duration,
            });
        }
        let layout = spec.layout(&policy, partitions)?;
        let sent = (0..policy.levels()).map(|_| AtomicU64::new(0)).collect();
        Ok(Router {
            policy,
            spec,
            hash: config.hash,
            placement: config.placement,
            max_messages: u64::from(max_messages),
            window_nanos: nanos(max_duration).max(1),
            epoch: now,
            layout: RwLock::new(Arc::new(layout)),
            sent,
        })
    }

    /// The policy the router reads levels with.
    pub fn policy(&self) -> &PriorityPolicy {
        &self.policy
    }

    /// The current layout.
    pub fn layout(&self) -> Arc<PartitionLayout> {
        Arc::clone(&self.layout.read())
    }

    /// Recomputes the layout for `partitions` partitions. On error the previous layout stays.
    ///
    /// # Errors
    /// [`Error::PartitionsShrunk`] for fewer partitions than the router has, as
    /// [`crate::Gate::set_partitions`] (a partitioned topic never shrinks: a smaller count is
    /// a stale or wrong read, and routing by it would move keys); the layout's errors
    /// ([`Error::UnassignedPartitions`], [`Error::TooManyPartitions`], ...) otherwise.
    pub fn set_partitions(&self, partitions: u32) -> Result<Arc<PartitionLayout>, Error> {
        let mut guard = self.layout.write();
        let from = guard.partitions();
        if partitions < from {
            return Err(Error::PartitionsShrunk {
                from,
                to: partitions,
            });
        }
        if partitions != from {
            *guard = Arc::new(self.spec.layout(&self.policy, partitions)?);
        }
        Ok(Arc::clone(&guard))
    }

    /// The partition for a message of `level` with an optional `key`, on a topic that has
    /// `partitions` partitions now. A level outside the policy is routed as the default level.
    /// When `partitions` differs from the layout's count, the layout is recomputed first; if
    /// that fails (e.g. an explicit layout that does not cover new partitions, or fewer
    /// partitions than before: [`Error::PartitionsShrunk`], see [`Router::set_partitions`])
    /// the error is returned and no partition is chosen.
    pub fn route(
        &self,
        level: Level,
        key: Option<&str>,
        partitions: u32,
        now: Instant,
    ) -> Result<u32, Error> {
        let level = self.policy.clamp(level);
        {
            let layout = self.layout.read();
            if layout.partitions() == partitions {
                return Ok(self.pick(&layout, level, key, now));
            }
        }
        let layout = self.set_partitions(partitions)?;
        Ok(self.pick(&layout, level, key, now))
    }

    /// Like [`Router::route`], reading the level from the message's priority property value
    /// (missing or invalid values count in the policy's stats and go to the default level).
    pub fn route_message(
        &self,
        priority: Option<&str>,
        key: Option<&str>,
        partitions: u32,
        now: Instant,
    ) -> Result<u32, Error> {
        self.route(self.policy.level_of(priority), key, partitions, now)
    }

    fn pick(&self, layout: &PartitionLayout, level: Level, key: Option<&str>, now: Instant) -> u32 {
        let set = layout.partitions_of(level);
        let len = set.len();
        if len == 0 {
            // A valid layout has no empty level; stay in range regardless.
            return 0;
        }
        let slot = match key {
            Some(key) => self.placement.slot(self.hash.hash(key), len),
            None => {
                let sent = self
                    .sent
                    .get(level.index())
                    .map_or(0, |c| c.fetch_add(1, Ordering::Relaxed));
                let elapsed = nanos(now.saturating_duration_since(self.epoch));
                let turn = (sent / self.max_messages).wrapping_add(elapsed / self.window_nanos);
                (turn % len as u64) as usize
            }
        };
        set.get(slot).copied().unwrap_or(set[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Unlisted;

    fn recipe_router(window: StickyWindow, now: Instant) -> Router {
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0, 1])], Unlisted::DefaultLevel);
        // The recipe placed keys as the Java client does.
        let config = RouterConfig {
            sticky: window,
            placement: KeyPlacement::Modulo,
            ..RouterConfig::default()
        };
        Router::new(policy, spec, 5, config, now).unwrap()
    }

    #[test]
    fn per_level_round_robin_is_not_skewed_by_other_levels() {
        // Regression for the recipe's shared counter: with strictly alternating high/low
        // sends every high message went to partition 1.
        let now = Instant::now();
        let r = recipe_router(StickyWindow::per_message(), now);
        let mut high = [0u32; 5];
        for _ in 0..100 {
            high[r.route(Level::new(0), None, 5, now).unwrap() as usize] += 1;
            let low = r.route(Level::new(1), None, 5, now).unwrap();
            assert!((2..5).contains(&low));
        }
        assert_eq!(high, [50, 50, 0, 0, 0]);
    }

    #[test]
    fn sticky_window_switches_on_count_and_on_time() {
        let t0 = Instant::now();
        let window = StickyWindow {
            max_messages: 3,
            max_duration: Duration::from_millis(10),
        };
        let r = recipe_router(window, t0);
        let picks: Vec<u32> = (0..6)
            .map(|_| r.route(Level::new(1), None, 5, t0).unwrap())
            .collect();
        assert_eq!(picks, [2, 2, 2, 3, 3, 3]);
        // 10 ms later the window has moved on by one more partition.
        let later = t0 + Duration::from_millis(10);
        assert_eq!(r.route(Level::new(1), None, 5, later).unwrap(), 2);
    }

    #[test]
    fn keys_stick_to_a_partition_of_their_level() {
        let now = Instant::now();
        let r = recipe_router(StickyWindow::default(), now);
        for key in ["a", "b", "order-1", "order-2", ""] {
            let p = r.route(Level::new(1), Some(key), 5, now).unwrap();
            assert!((2..5).contains(&p));
            for _ in 0..3 {
                assert_eq!(r.route(Level::new(1), Some(key), 5, now).unwrap(), p);
            }
            // Java placement inside the level: hashCode & MAX % 3 over partitions [2, 3, 4].
            let expected = 2 + KeyHash::JavaStringHash.slot(key, 3) as u32;
            assert_eq!(p, expected);
        }
    }

    #[test]
    fn follows_the_live_partition_count_and_refuses_uncovered_growth() {
        let now = Instant::now();
        let r = recipe_router(StickyWindow::per_message(), now);
        // Grow to 8: the new partitions join the default level and get traffic.
        let seen: std::collections::BTreeSet<u32> = (0..30)
            .map(|_| r.route(Level::new(1), None, 8, now).unwrap())
            .collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [2, 3, 4, 5, 6, 7]);
        // Shrink: an error (the topic never shrinks), never an out-of-range index.
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::explicit([(Level::new(0), vec![0]), (Level::new(1), vec![1, 2])]);
        let r = Router::new(policy, spec, 3, RouterConfig::default(), now).unwrap();
        assert_eq!(
            r.route(Level::new(1), None, 2, now),
            Err(Error::PartitionsShrunk { from: 3, to: 2 })
        );
        assert!(matches!(
            r.route(Level::new(1), None, 4, now),
            Err(Error::UnassignedPartitions { .. })
        ));
        assert_eq!(r.layout().partitions(), 3);
        assert!(r.route(Level::new(9), None, 3, now).unwrap() < 3);
    }

    #[test]
    fn refuses_a_shrinking_partition_count_as_the_gate_does() {
        // Regression: the router recomputed a partition-shares layout for fewer partitions
        // (moving keys) where the gate refuses the same count.
        let now = Instant::now();
        let policy = PriorityPolicy::new(2).unwrap();
        let spec = LayoutSpec::partition_shares([1, 1]);
        let r = Router::new(
            policy.clone(),
            spec.clone(),
            6,
            RouterConfig::default(),
            now,
        )
        .unwrap();
        let mut gate = crate::Gate::new(policy, spec, 6, crate::GateConfig::default()).unwrap();
        let from_gate = gate
            .set_partitions(4, now, &mut crate::NoControl)
            .unwrap_err();
        let from_router = r.set_partitions(4).unwrap_err();
        assert_eq!(from_router, Error::PartitionsShrunk { from: 6, to: 4 });
        assert_eq!(from_router, from_gate);
        assert_eq!(from_router.to_string(), from_gate.to_string());
        assert_eq!(
            r.route(Level::new(0), Some("k"), 4, now),
            Err(Error::PartitionsShrunk { from: 6, to: 4 })
        );
        assert_eq!(r.layout().partitions(), 6);
        // Growing still works, and the same count is no change.
        assert_eq!(r.set_partitions(6).unwrap().partitions(), 6);
        assert_eq!(r.set_partitions(8).unwrap().partitions(), 8);
        assert!(r.route(Level::new(1), None, 8, now).unwrap() < 8);
    }

    #[test]
    fn rejects_an_empty_sticky_window() {
        let policy = PriorityPolicy::new(1).unwrap();
        let config = RouterConfig {
            sticky: StickyWindow {
                max_messages: 0,
                max_duration: Duration::from_millis(1),
            },
            ..RouterConfig::default()
        };
        let e = Router::new(
            policy,
            LayoutSpec::partition_shares([1]),
            1,
            config,
            Instant::now(),
        );
        assert!(matches!(e, Err(Error::InvalidStickyWindow { .. })));
    }
}
