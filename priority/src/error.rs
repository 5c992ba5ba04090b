//! The crate's error type.

use std::time::Duration;

/// Everything that can be wrong with a priority configuration or with a call into the crate.
///
/// None of these is retryable as such: every variant is a configuration or calling mistake that
/// stays wrong until the configuration or the call changes. The one exception is
/// [`Error::UnassignedPartitions`] after a partition count change: it goes away once the
/// layout lists the new partitions (or assigns unlisted partitions to a level).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A policy needs between 1 and [`crate::MAX_LEVELS`] levels.
    #[error(
        "a priority policy needs between 1 and {max} levels, got {levels}: change the level count"
    )]
    InvalidLevelCount {
        /// The level count asked for.
        levels: usize,
        /// The largest level count supported.
        max: usize,
    },

    /// A level number is not below the policy's level count.
    #[error(
        "level {level} does not exist: the policy has levels 0..{levels} (0 is the most important)"
    )]
    LevelOutOfRange {
        /// The level asked for.
        level: u32,
        /// The policy's level count.
        levels: usize,
    },

    /// The message property name is empty.
    #[error(
        "the priority property name is empty: give the name of the message property that carries the priority"
    )]
    EmptyPropertyName,

    /// A topic needs at least one partition per level.
    #[error(
        "{partitions} partition(s) cannot hold {levels} priority level(s): every level needs at least one partition; add partitions or use fewer levels"
    )]
    TooFewPartitions {
        /// The partition count.
        partitions: u32,
        /// The policy's level count.
        levels: usize,
    },

    /// More partitions than the crate lays out ([`crate::MAX_PARTITIONS`]).
    #[error(
        "{partitions} partitions is more than the {max} a priority layout supports: use fewer partitions"
    )]
    TooManyPartitions {
        /// The partition count asked for.
        partitions: u32,
        /// The largest partition count supported.
        max: u32,
    },

    /// A gate or a router was asked to follow a topic to fewer partitions. A Pulsar topic's
    /// partition count never shrinks: a smaller count is a stale or wrong read. The gate would
    /// forget the messages buffered on the partitions that went away, and the router would
    /// move keys to other partitions, so both refuse and keep their state.
    #[error(
        "the partition count cannot go down from {from} to {to}: partitioned topics never shrink, and the messages buffered or routed on partitions {to}..{from} would be lost or moved; check the partition count the client read, or create a new consumer or producer"
    )]
    PartitionsShrunk {
        /// The gate's or router's partition count.
        from: u32,
        /// The smaller count asked for.
        to: u32,
    },

    /// Shares (of partitions in a layout, or of deliveries in a strategy) must be given once
    /// per level and be positive.
    #[error(
        "invalid {of} shares {shares:?} for {levels} level(s): give one share per level, each at least 1 and at most {max}"
    )]
    InvalidShares {
        /// Which shares: `"partition"` ([`crate::LayoutSpec::Shares`]) or `"delivery"`
        /// ([`crate::Strategy::DeliveryShares`]).
        of: &'static str,
        /// The shares given.
        shares: Vec<u32>,
        /// The policy's level count.
        levels: usize,
        /// The largest share accepted.
        max: u32,
    },

    /// An explicit layout names a partition that the topic does not have.
    #[error(
        "level {level} lists partition {partition} but the topic has {partitions} partition(s) (0..{partitions}): remove it or add partitions"
    )]
    PartitionOutOfRange {
        /// The level whose set names the partition.
        level: u8,
        /// The partition named.
        partition: u32,
        /// The partition count.
        partitions: u32,
    },

    /// An explicit layout names a partition in two levels (or twice in one).
    #[error(
        "partition {partition} is listed for level {first} and again for level {second}: a partition belongs to exactly one level"
    )]
    OverlappingPartition {
        /// The partition listed twice.
        partition: u32,
        /// The level that listed it first.
        first: u8,
        /// The level that listed it again.
        second: u8,
    },

    /// An explicit layout gives one level two sets of partitions. They are not merged: the
    /// second set is more likely a typo for another level than a continuation.
    #[error(
        "level {level} is given two partition sets in the explicit layout: give each level one set (join the two lists, or correct the level of the second)"
    )]
    DuplicateLevel {
        /// The level listed twice.
        level: u8,
    },

    /// An explicit layout leaves partitions without a level and does not say where they go.
    #[error(
        "partitions {missing:?} of {partitions} are in no level: list them, or assign unlisted partitions to a level (Unlisted::DefaultLevel or Unlisted::Level)"
    )]
    UnassignedPartitions {
        /// The partitions in no level (at most the first 16).
        missing: Vec<u32>,
        /// The partition count.
        partitions: u32,
    },

    /// An explicit layout leaves a level without partitions, so the router would have nowhere
    /// to send that level's messages.
    #[error("level {level} has no partition among {partitions}: give it at least one partition")]
    EmptyLevel {
        /// The level without partitions.
        level: u8,
        /// The partition count.
        partitions: u32,
    },

    /// Watermarks must satisfy `0 <= low < high <= 1`.
    #[error(
        "watermarks must satisfy 0 <= low < high <= 1 (fractions of a level's receiver queues), got low {low} and high {high}"
    )]
    InvalidWatermarks {
        /// The low watermark given.
        low: f64,
        /// The high watermark given.
        high: f64,
    },

    /// A receiver queue size must be at least 1.
    #[error("invalid receiver queue sizing: {reason}")]
    InvalidQueueSize {
        /// What was wrong.
        reason: String,
    },

    /// [`crate::GateConfig::growth_hold`] must be longer than zero and at most
    /// [`crate::MAX_GROWTH_HOLD`].
    #[error(
        "growth_hold must last longer than zero and at most {limit:?}, got {max:?}: give a hold in that range, or None to turn it off"
    )]
    InvalidGrowthHold {
        /// The longest hold given.
        max: Duration,
        /// The longest hold accepted ([`crate::MAX_GROWTH_HOLD`]).
        limit: Duration,
    },

    /// The aging bound must be positive.
    #[error("the aging bound must be longer than zero, got {max_wait:?}")]
    InvalidMaxWait {
        /// The bound given.
        max_wait: Duration,
    },

    /// The sticky round-robin window must allow at least one message and last longer than zero.
    #[error(
        "the sticky window must allow at least one message and last longer than zero, got {max_messages} message(s) and {max_duration:?}"
    )]
    InvalidStickyWindow {
        /// Messages per window given.
        max_messages: u32,
        /// Window duration given.
        max_duration: Duration,
    },

    /// A partition index that the current layout does not have was passed to the gate.
    #[error(
        "partition {partition} is not in the layout of {partitions} partition(s): update the partition count first"
    )]
    UnknownPartition {
        /// The partition passed.
        partition: u32,
        /// The layout's partition count.
        partitions: u32,
    },
}
