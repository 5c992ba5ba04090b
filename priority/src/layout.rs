//! Which partitions hold which level: the specification (explicit sets or weights) and the
//! layout computed from it for a live partition count.

use crate::{Error, Level, PriorityPolicy};

/// The largest weight accepted (keeps the arithmetic of shares and strides exact).
pub const MAX_WEIGHT: u32 = 1 << 16;

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
/// partition count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutSpec {
    /// Explicit partition sets per level (the published design's map priority → partitions).
    Explicit {
        /// `(level, partitions)` pairs; a level may appear at most once per partition.
        sets: Vec<(Level, Vec<u32>)>,
        /// Where partitions that no set lists go.
        unlisted: Unlisted,
    },
    /// A share of the partitions per level, proportional to the weights (one per level, most
    /// important first). Levels get contiguous ranges of partitions, level 0 first; every level
    /// gets at least one partition and the rest are shared by largest remainder. Recomputed for
    /// each partition count, so a partition can change level when partitions are added: for a
    /// topic that will grow, prefer [`LayoutSpec::explicit_with`], which sends added partitions
    /// to one level and leaves the others where they are (in the `priority_sim` partition-growth
    /// scenario of BENCHMARKS.md, a low partition turned high let 1,300 low messages pass a
    /// high one under weights, none under explicit sets).
    Weights(Vec<u32>),
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

    /// Shares of partitions per level, most important first.
    pub fn weights(weights: impl IntoIterator<Item = u32>) -> LayoutSpec {
        LayoutSpec::Weights(weights.into_iter().collect())
    }

    /// Equal shares for every level of `policy`.
    pub fn even(policy: &PriorityPolicy) -> LayoutSpec {
        LayoutSpec::Weights(vec![1; policy.levels()])
    }

    /// Checks the specification against `policy` without a partition count (what can be
    /// checked before the topic's metadata is known).
    pub fn validate(&self, policy: &PriorityPolicy) -> Result<(), Error> {
        match self {
            LayoutSpec::Weights(w) => check_weights(w, policy).map(|_| ()),
            LayoutSpec::Explicit { sets, unlisted } => {
                for (level, _) in sets {
                    policy.level(u32::from(level.get()))?;
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
    /// spec (weights, explicit sets).
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
            LayoutSpec::Weights(w) => by_weights(&check_weights(w, policy)?, partitions),
            LayoutSpec::Explicit { sets, unlisted } => {
                explicit(sets, *unlisted, policy, partitions)?
            }
        };
        PartitionLayout::from_levels(levels, level_of)
    }
}

fn check_weights(weights: &[u32], policy: &PriorityPolicy) -> Result<Vec<u32>, Error> {
    if weights.len() != policy.levels() || weights.iter().any(|&w| w == 0 || w > MAX_WEIGHT) {
        return Err(Error::InvalidWeights {
            weights: weights.to_vec(),
            levels: policy.levels(),
            max: MAX_WEIGHT,
        });
    }
    Ok(weights.to_vec())
}

/// One partition per level, then the rest by largest remainder of the proportional share.
fn by_weights(weights: &[u32], partitions: u32) -> Vec<Level> {
    let levels = weights.len();
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let spare = u64::from(partitions) - levels as u64;
    let mut counts: Vec<u64> = Vec::with_capacity(levels);
    let mut remainders: Vec<(u64, usize)> = Vec::with_capacity(levels);
    for (i, &w) in weights.iter().enumerate() {
        let exact = spare * u64::from(w);
        counts.push(1 + exact / total);
        remainders.push((exact % total, i));
    }
    let assigned: u64 = counts.iter().sum();
    let mut left = u64::from(partitions) - assigned;
    // Largest remainder first; ties go to the more important level.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &remainders {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    let mut level_of = Vec::with_capacity(partitions as usize);
    for (i, &c) in counts.iter().enumerate() {
        // i < levels <= MAX_LEVELS
        level_of.extend(std::iter::repeat_n(Level::new(i as u8), c as usize));
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
    pub fn from_levels(levels: usize, level_of: Vec<Level>) -> Result<PartitionLayout, Error> {
        let partitions = u32::try_from(level_of.len()).unwrap_or(u32::MAX);
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
    fn weights_share_partitions_and_follow_the_count() {
        let p = policy(2);
        let spec = LayoutSpec::weights([3, 1]);
        let l = spec.layout(&p, 4).unwrap();
        assert_eq!(l.partitions_of(Level::new(0)), &[0, 1, 2]);
        assert_eq!(l.partitions_of(Level::new(1)), &[3]);
        let l = spec.layout(&p, 10).unwrap();
        assert_eq!(l.partitions_of(Level::new(0)).len(), 7);
        assert_eq!(l.partitions_of(Level::new(1)).len(), 3);
        // Every level keeps a partition even with a tiny weight.
        let l = LayoutSpec::weights([1000, 1]).layout(&p, 2).unwrap();
        assert_eq!(l.partitions_of(Level::new(1)), &[1]);
        for bad in [vec![1], vec![0, 1], vec![1, MAX_WEIGHT + 1]] {
            assert!(matches!(
                LayoutSpec::Weights(bad).layout(&p, 4),
                Err(Error::InvalidWeights { .. })
            ));
        }
    }

    #[test]
    fn weights_cover_every_partition_exactly_once() {
        let p = policy(3);
        for n in 3..100 {
            let l = LayoutSpec::weights([5, 3, 2]).layout(&p, n).unwrap();
            let total: usize = p.all_levels().map(|lv| l.partitions_of(lv).len()).sum();
            assert_eq!(total, n as usize);
            assert_eq!(l.partitions(), n);
            assert!(l.level_of(n).is_none());
        }
    }
}
