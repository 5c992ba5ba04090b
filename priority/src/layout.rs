//! Which partitions hold which level: the specification (explicit sets or partition shares)
//! and the layout computed from it for a live partition count.
//!
//! # How a layout is derived
//!
//! A layout is a pure function of the [`LayoutSpec`], the policy's level count and the
//! partition count, so every producer and consumer that shares the spec and reads the same
//! partition count computes the same layout, with no coordination. Both kinds are **stable
//! under growth**: the layout of `n + k` partitions gives partitions `0..n` the levels the
//! layout of `n` gave them, whatever `n` and `k` (a partitioned topic never shrinks).
//!
//! - [`LayoutSpec::Explicit`]: a listed partition has the level its set names; an unlisted one
//!   has the level [`Unlisted`] names (or the layout is refused).
//! - [`LayoutSpec::Shares`]: partition `p < levels` has level `p` (every level has a
//!   partition); each next partition `p` goes to the level furthest below its share of the
//!   first `p + 1` partitions, that is the level `k` with the largest
//!   `s_k × (p + 1) − count_k × Σs` (`count_k`: partitions `0..p` of level `k`), ties to the
//!   more important level. Levels are therefore interleaved, not contiguous ranges, and each
//!   level's count stays within `levels` partitions of its exact share `s_k × n / Σs`.
//!   Example, shares 60/30/10: 10 partitions give level 0 `{0, 3, 4, 6, 7, 9}`, level 1
//!   `{1, 5, 8}`, level 2 `{2}`; growing to 16 adds 10, 12, 13, 15 to level 0 and 11, 14 to
//!   level 1.

use crate::{Error, Level, MAX_LEVELS, PriorityPolicy};

/// The largest share accepted (keeps the arithmetic of shares and strides exact).
pub const MAX_SHARE: u32 = 1 << 16;

/// The most partitions a layout covers (65,536): far beyond what a Pulsar topic is given in
/// practice, and small enough that a layout and a gate are computed in milliseconds.
pub const MAX_PARTITIONS: u32 = 1 << 16;

/// Where the partitions an explicit specification does not list go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unlisted {
    /// Unlisted partitions are a configuration error ([`Error::UnassignedPartitions`]), also
    /// after the partition count grows.
    #[default]
    Reject,
    /// Unlisted partitions, including those added later, belong to the policy's default level
    /// (the published recipe's rule).
    DefaultLevel,
    /// Unlisted partitions, including those added later, belong to this level.
    Level(Level),
}

/// How partitions are given to levels. Share it between producers and consumers, with the
/// [`PriorityPolicy`]; [`LayoutSpec::layout`] computes the [`PartitionLayout`] for a live
/// partition count (see the module documentation for the exact rule; growing a topic never
/// moves an existing partition to another level).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutSpec {
    /// Explicit partition sets per level (the published design's map priority → partitions).
    Explicit {
        /// `(level, partitions)` pairs: each level at most once ([`Error::DuplicateLevel`]
        /// otherwise), each partition in at most one set and at most once
        /// ([`Error::OverlappingPartition`] otherwise).
        sets: Vec<(Level, Vec<u32>)>,
        /// Where partitions that no set lists go.
        unlisted: Unlisted,
    },
    /// **Partition shares**: a share of the partitions per level (one per level, most
    /// important first). Not to be confused with the delivery shares of
    /// [`crate::Strategy::DeliveryShares`], which say how often each level is served. Every
    /// level gets at least one partition; partitions are handed out one by one, in index
    /// order, to the level furthest below its share, so the layout of a grown topic extends
    /// the old one and the shares converge to the given ones as partitions are added.
    Shares(Vec<u32>),
}

impl LayoutSpec {
    /// Explicit sets; unlisted partitions are an error.
    pub fn explicit(sets: impl IntoIterator<Item = (Level, Vec<u32>)>) -> LayoutSpec {
        LayoutSpec::Explicit {
            sets: sets.into_iter().collect(),
            unlisted: Unlisted::Reject,
        }
    }

    /// Explicit sets; unlisted partitions go where `unlisted` says.
    pub fn explicit_with(
        sets: impl IntoIterator<Item = (Level, Vec<u32>)>,
        unlisted: Unlisted,
    ) -> LayoutSpec {
        LayoutSpec::Explicit {
            sets: sets.into_iter().collect(),
            unlisted,
        }
    }

    /// Partition shares per level, most important first ([`LayoutSpec::Shares`]).
    pub fn partition_shares(shares: impl IntoIterator<Item = u32>) -> LayoutSpec {
        LayoutSpec::Shares(shares.into_iter().collect())
    }

    /// Equal partition shares for every level of `policy`.
    pub fn even(policy: &PriorityPolicy) -> LayoutSpec {
        LayoutSpec::Shares(vec![1; policy.levels()])
    }

    /// Checks the specification against `policy` without a partition count (what can be
    /// checked before the topic's metadata is known).
    ///
    /// # Errors
    /// [`Error::InvalidShares`] for shares that are not one per level in `1..=`[`MAX_SHARE`];
    /// [`Error::LevelOutOfRange`] for an explicit set or [`Unlisted::Level`] naming a level
    /// the policy does not have; [`Error::DuplicateLevel`] for a level given two sets.
    pub fn validate(&self, policy: &PriorityPolicy) -> Result<(), Error> {
        match self {
            LayoutSpec::Shares(w) => check_shares("partition", w, policy.levels()).map(|_| ()),
            LayoutSpec::Explicit { sets, unlisted } => {
                let mut seen = [false; MAX_LEVELS];
                for (level, _) in sets {
                    policy.level(u32::from(level.get()))?;
                    // The level is below the policy's count, so below MAX_LEVELS.
                    if let Some(slot) = seen.get_mut(level.index()) {
                        if *slot {
                            return Err(Error::DuplicateLevel { level: level.get() });
                        }
                        *slot = true;
                    }
                }
                if let Unlisted::Level(level) = unlisted {
                    policy.level(u32::from(level.get()))?;
                }
                Ok(())
            }
        }
    }

    /// The layout for `partitions` partitions, or the configuration error that prevents it.
    ///
    /// # Errors
    /// [`Error::TooFewPartitions`] below one partition per level,
    /// [`Error::TooManyPartitions`] above [`MAX_PARTITIONS`], and the errors of an invalid
    /// spec (shares, explicit sets).
    pub fn layout(
        &self,
        policy: &PriorityPolicy,
        partitions: u32,
    ) -> Result<PartitionLayout, Error> {
        self.validate(policy)?;
        let levels = policy.levels();
        if (partitions as usize) < levels {
            return Err(Error::TooFewPartitions { partitions, levels });
        }
        if partitions > MAX_PARTITIONS {
            return Err(Error::TooManyPartitions {
                partitions,
                max: MAX_PARTITIONS,
            });
        }
        let level_of = match self {
            LayoutSpec::Shares(w) => by_shares(w, partitions),
            LayoutSpec::Explicit { sets, unlisted } => {
                explicit(sets, *unlisted, policy, partitions)?
            }
        };
        PartitionLayout::from_levels(levels, level_of)
    }
}

/// `shares` if there is one per level, each in `1..=MAX_SHARE`.
pub(crate) fn check_shares(
    of: &'static str,
    shares: &[u32],
    levels: usize,
) -> Result<Vec<u32>, Error> {
    if shares.len() != levels || shares.iter().any(|&w| w == 0 || w > MAX_SHARE) {
        return Err(Error::InvalidShares {
            of,
            shares: shares.to_vec(),
            levels,
            max: MAX_SHARE,
        });
    }
    Ok(shares.to_vec())
}

/// One partition per level, then each next partition to the level furthest below its share
/// (ties to the more important level): the layout of `n` partitions is a prefix of the
/// layout of any larger count.
fn by_shares(shares: &[u32], partitions: u32) -> Vec<Level> {
    let levels = shares.len();
    let total: u64 = shares.iter().map(|&w| u64::from(w)).sum();
    let mut counts = vec![0u64; levels];
    let mut level_of = Vec::with_capacity(partitions as usize);
    for p in 0..u64::from(partitions) {
        let k = if (p as usize) < levels {
            p as usize
        } else {
            // The deficit s_k (p + 1) - count_k Σs, compared in i128 (both terms < 2^49).
            let mut best = 0;
            let mut best_deficit = i128::MIN;
            for (k, (&w, &c)) in shares.iter().zip(&counts).enumerate() {
                let deficit =
                    i128::from(u64::from(w) * (p + 1)) - i128::from(c) * i128::from(total);
                if deficit > best_deficit {
                    best = k;
                    best_deficit = deficit;
                }
            }
            best
        };
        counts[k] += 1;
        // k < levels <= MAX_LEVELS
        level_of.push(Level::new(k as u8));
    }
    level_of
}

fn explicit(
    sets: &[(Level, Vec<u32>)],
    unlisted: Unlisted,
    policy: &PriorityPolicy,
    partitions: u32,
) -> Result<Vec<Level>, Error> {
    let mut level_of: Vec<Option<Level>> = vec![None; partitions as usize];
    for (level, set) in sets {
        for &p in set {
            let Some(slot) = level_of.get_mut(p as usize) else {
                return Err(Error::PartitionOutOfRange {
                    level: level.get(),
                    partition: p,
                    partitions,
                });
            };
            if let Some(first) = slot {
                return Err(Error::OverlappingPartition {
                    partition: p,
                    first: first.get(),
                    second: level.get(),
                });
            }
            *slot = Some(*level);
        }
    }
    let fill = match unlisted {
        Unlisted::Reject => None,
        Unlisted::DefaultLevel => Some(policy.default_level()),
        Unlisted::Level(l) => Some(l),
    };
    let mut missing = Vec::new();
    let mut out = Vec::with_capacity(level_of.len());
    for (p, slot) in level_of.into_iter().enumerate() {
        match slot.or(fill) {
            Some(l) => out.push(l),
            None => {
                if missing.len() < 16 {
                    missing.push(p as u32);
                }
                out.push(Level::HIGHEST);
            }
        }
    }
    if !missing.is_empty() {
        return Err(Error::UnassignedPartitions {
            missing,
            partitions,
        });
    }
    Ok(out)
}

/// Partitions per level for one partition count. Every partition in `0..partitions` has
/// exactly one level and every level has at least one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLayout {
    level_of: Vec<Level>,
    partitions_of: Vec<Vec<u32>>,
}

impl PartitionLayout {
    /// A layout from each partition's level (index = partition). Every level in `0..levels`
    /// needs at least one partition.
    ///
    /// # Errors
    /// [`Error::InvalidLevelCount`] unless `levels` is in `1..=`[`crate::MAX_LEVELS`];
    /// [`Error::TooManyPartitions`] for more than [`MAX_PARTITIONS`] partitions (a count
    /// beyond `u32::MAX` is reported as `u32::MAX`); [`Error::LevelOutOfRange`] for a
    /// partition whose level is not below `levels`; [`Error::EmptyLevel`] for a level without
    /// a partition. The bounds are checked before anything is allocated.
    pub fn from_levels(levels: usize, level_of: Vec<Level>) -> Result<PartitionLayout, Error> {
        if !(1..=MAX_LEVELS).contains(&levels) {
            return Err(Error::InvalidLevelCount {
                levels,
                max: MAX_LEVELS,
            });
        }
        let partitions = u32::try_from(level_of.len()).unwrap_or(u32::MAX);
        if partitions > MAX_PARTITIONS {
            return Err(Error::TooManyPartitions {
                partitions,
                max: MAX_PARTITIONS,
            });
        }
        let mut partitions_of = vec![Vec::new(); levels];
        for (p, level) in level_of.iter().enumerate() {
            let Some(set) = partitions_of.get_mut(level.index()) else {
                return Err(Error::LevelOutOfRange {
                    level: u32::from(level.get()),
                    levels,
                });
            };
            set.push(p as u32);
        }
        if let Some(empty) = partitions_of.iter().position(Vec::is_empty) {
            return Err(Error::EmptyLevel {
                level: empty as u8,
                partitions,
            });
        }
        Ok(PartitionLayout {
            level_of,
            partitions_of,
        })
    }

    /// The number of partitions.
    pub fn partitions(&self) -> u32 {
        self.level_of.len() as u32
    }

    /// The number of levels.
    pub fn levels(&self) -> usize {
        self.partitions_of.len()
    }

    /// The level of `partition`, or `None` when the layout has no such partition.
    pub fn level_of(&self, partition: u32) -> Option<Level> {
        self.level_of.get(partition as usize).copied()
    }

    /// The partitions of `level`, ascending (empty for a level outside the layout).
    pub fn partitions_of(&self, level: Level) -> &[u32] {
        self.partitions_of
            .get(level.index())
            .map_or(&[], Vec::as_slice)
    }

    /// Each partition's level, index = partition.
    pub fn levels_by_partition(&self) -> &[Level] {
        &self.level_of
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(levels: usize) -> PriorityPolicy {
        PriorityPolicy::new(levels).unwrap()
    }

    #[test]
    fn recipe_sample_layout_with_default_level_for_the_rest() {
        // registerPriority(0, 0, 1) on 5 partitions; 2, 3, 4 are the default (lowest) level.
        let p = policy(2);
        let spec = LayoutSpec::explicit_with([(Level::new(0), vec![0, 1])], Unlisted::DefaultLevel);
        let l = spec.layout(&p, 5).unwrap();
        assert_eq!(l.partitions_of(Level::new(0)), &[0, 1]);
        assert_eq!(l.partitions_of(Level::new(1)), &[2, 3, 4]);
        // Partitions added later join the default level (the recipe never used them).
        let l = spec.layout(&p, 7).unwrap();
        assert_eq!(l.partitions_of(Level::new(1)), &[2, 3, 4, 5, 6]);
    }

    #[test]
    fn explicit_errors() {
        let p = policy(2);
        let e = LayoutSpec::explicit([(Level::new(0), vec![0, 5]), (Level::new(1), vec![1])])
            .layout(&p, 3)
            .unwrap_err();
        assert_eq!(
            e,
            Error::PartitionOutOfRange {
                level: 0,
                partition: 5,
                partitions: 3
            }
        );
        let e = LayoutSpec::explicit([(Level::new(0), vec![0, 1]), (Level::new(1), vec![1, 2])])
            .layout(&p, 3)
            .unwrap_err();
        assert_eq!(
            e,
            Error::OverlappingPartition {
                partition: 1,
                first: 0,
                second: 1
            }
        );
        let spec = LayoutSpec::explicit([(Level::new(0), vec![0]), (Level::new(1), vec![2])]);
        let e = spec.layout(&p, 3).unwrap_err();
        assert_eq!(
            e,
            Error::UnassignedPartitions {
                missing: vec![1],
                partitions: 3
            }
        );
        assert!(e.to_string().contains("Unlisted::DefaultLevel"));
        let e = LayoutSpec::explicit([(Level::new(0), vec![0, 1])])
            .layout(&p, 2)
            .unwrap_err();
        assert_eq!(
            e,
            Error::EmptyLevel {
                level: 1,
                partitions: 2
            }
        );
        let e = LayoutSpec::explicit([(Level::new(2), vec![0])])
            .layout(&p, 2)
            .unwrap_err();
        assert!(matches!(e, Error::LevelOutOfRange { level: 2, .. }));
        assert!(matches!(
            LayoutSpec::even(&p).layout(&p, 1),
            Err(Error::TooFewPartitions { .. })
        ));
    }

    #[test]
    fn from_levels_refuses_level_and_partition_counts_out_of_bounds_before_allocating() {
        // Regression: `from_levels(usize::MAX, ..)` panicked (capacity overflow) and
        // `from_levels(1 << 32, ..)` asked for 96 GiB and aborted the process. Keep the
        // usize::MAX case first: without the bound it panics before the larger allocation.
        let one = vec![Level::new(0)];
        for levels in [usize::MAX, 1 << 32, MAX_LEVELS + 1, 0] {
            let e = PartitionLayout::from_levels(levels, one.clone()).unwrap_err();
            assert_eq!(
                e,
                Error::InvalidLevelCount {
                    levels,
                    max: MAX_LEVELS
                }
            );
            assert!(e.to_string().contains("between 1 and 32 levels"), "{e}");
        }
        let too_many = vec![Level::new(0); MAX_PARTITIONS as usize + 1];
        assert_eq!(
            PartitionLayout::from_levels(1, too_many).unwrap_err(),
            Error::TooManyPartitions {
                partitions: MAX_PARTITIONS + 1,
                max: MAX_PARTITIONS
            }
        );
        // The bounds themselves are accepted.
        let most = vec![Level::new(0); MAX_PARTITIONS as usize];
        assert_eq!(
            PartitionLayout::from_levels(1, most).unwrap().partitions(),
            MAX_PARTITIONS
        );
        let all: Vec<Level> = (0..MAX_LEVELS as u8).map(Level::new).collect();
        assert_eq!(
            PartitionLayout::from_levels(MAX_LEVELS, all)
                .unwrap()
                .levels(),
            MAX_LEVELS
        );
    }

    #[test]
    fn an_explicit_layout_listing_a_level_twice_is_refused() {
        // Regression: the two sets of level 0 were merged silently.
        let p = policy(2);
        let spec = LayoutSpec::explicit([
            (Level::new(0), vec![0]),
            (Level::new(1), vec![1]),
            (Level::new(0), vec![2]),
        ]);
        let e = spec.validate(&p).unwrap_err();
        assert_eq!(e, Error::DuplicateLevel { level: 0 });
        assert!(e.to_string().contains("level 0"), "{e}");
        assert_eq!(spec.layout(&p, 3), Err(e));
        // Also with the unlisted partitions assigned, and with an empty second set.
        let spec = LayoutSpec::explicit_with(
            [(Level::new(1), vec![1]), (Level::new(1), vec![])],
            Unlisted::DefaultLevel,
        );
        assert_eq!(spec.layout(&p, 3), Err(Error::DuplicateLevel { level: 1 }));
        // A level given once, and named again as where unlisted partitions go, is fine.
        let spec =
            LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::Level(Level::new(0)));
        assert_eq!(spec.validate(&p), Ok(()));
        assert_eq!(
            spec.layout(&p, 2),
            Err(Error::EmptyLevel {
                level: 1,
                partitions: 2
            })
        );
    }

    #[test]
    fn shares_interleave_levels_as_the_module_docs_say() {
        let p = policy(3);
        let spec = LayoutSpec::partition_shares([60, 30, 10]);
        let l = spec.layout(&p, 10).unwrap();
        assert_eq!(l.partitions_of(Level::new(0)), &[0, 3, 4, 6, 7, 9]);
        assert_eq!(l.partitions_of(Level::new(1)), &[1, 5, 8]);
        assert_eq!(l.partitions_of(Level::new(2)), &[2]);
        let l = spec.layout(&p, 16).unwrap();
        assert_eq!(
            l.partitions_of(Level::new(0)),
            &[0, 3, 4, 6, 7, 9, 10, 12, 13, 15]
        );
        assert_eq!(l.partitions_of(Level::new(1)), &[1, 5, 8, 11, 14]);
        assert_eq!(l.partitions_of(Level::new(2)), &[2]);
        // Every level keeps a partition even with a tiny share.
        let l = LayoutSpec::partition_shares([1000, 1])
            .layout(&policy(2), 2)
            .unwrap();
        assert_eq!(l.partitions_of(Level::new(1)), &[1]);
        for bad in [vec![1], vec![0, 1], vec![1, MAX_SHARE + 1]] {
            assert!(matches!(
                LayoutSpec::Shares(bad).layout(&policy(2), 4),
                Err(Error::InvalidShares {
                    of: "partition",
                    ..
                })
            ));
        }
    }

    #[test]
    fn shares_cover_every_partition_exactly_once_and_stay_near_the_share() {
        let p = policy(3);
        for n in 3..200 {
            let l = LayoutSpec::partition_shares([5, 3, 2])
                .layout(&p, n)
                .unwrap();
            let total: usize = p.all_levels().map(|lv| l.partitions_of(lv).len()).sum();
            assert_eq!(total, n as usize);
            assert_eq!(l.partitions(), n);
            assert!(l.level_of(n).is_none());
            for (k, share) in [5.0, 3.0, 2.0].into_iter().enumerate() {
                let exact = share * f64::from(n) / 10.0;
                let got = l.partitions_of(Level::new(k as u8)).len() as f64;
                assert!(
                    (got - exact).abs() <= 3.0,
                    "n {n} level {k}: {got} vs {exact}"
                );
            }
        }
    }
}
