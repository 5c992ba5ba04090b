//! Message priority over partitioned topics, without a transport.
//!
//! Brokers such as Pulsar have no message priority, so urgent messages wait behind a
//! low-priority backlog. The usual fix spreads levels over partitions of one topic (a
//! producer-side router) and makes the consumer prefer the partitions of the more important
//! levels. This crate holds that logic, free of any client or protocol, so that adapters stay
//! thin and a simulator can drive it with virtual time:
//!
//! - [`PriorityPolicy`]: the one definition producers and consumers share: how many levels
//!   (level 0 is the most important), the default level, the message property and how its
//!   value parses (missing or invalid values go to the default level and are counted).
//! - [`LayoutSpec`] / [`PartitionLayout`]: which partitions hold which level, from explicit
//!   sets or from partition shares, recomputed for the live partition count and validated
//!   (overlapping, missing or out-of-range partitions are errors). Growing a topic never
//!   moves an existing partition to another level.
//! - [`Router`]: the partition for a message: a Java-compatible key hash ([`KeyHash`]) when
//!   it has a key, placed by modulo or by jump consistent hashing ([`KeyPlacement`], which
//!   moves the fewest keys when the topic grows), otherwise a per-level round robin that stays on a partition for a
//!   [`StickyWindow`] so batching works. Never an out-of-range partition.
//! - [`Gate`]: on the consumer, a partition's level comes from its index (no learning round).
//!   From buffered counts (and backlogs when known) it pauses and resumes partitions through
//!   [`PartitionControl`] with hysteresis, suggests smaller receiver queues for lower levels,
//!   and picks the partition the next message comes from by a [`Strategy`]: strict, delivery
//!   shares (stride scheduling, 4:1 per level by default, a proven bound on the deliveries between two
//!   of a level's own) or strict with aging (a starvation bound in time). The strategy can be
//!   changed on a live gate, and [`GateConfig::growth_hold`] keeps key order across a growth.
//!   It decides on arrivals and deliveries, never only on acks.
//! - [`ConsumerInterceptor`] / [`GateInterceptor`]: the gate behind before-consume, ack and
//!   nack hooks, for clients that offer interceptors.
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use mq_priority::{
//!     Gate, GateConfig, LayoutSpec, Level, NoControl, PriorityPolicy, Router, RouterConfig,
//!     Strategy,
//! };
//!
//! // Two levels, partition shares 1:2 over 6 partitions: level 0 (urgent) gets partitions
//! // 0 and 4, level 1 gets 1, 2, 3 and 5 (the rule is in `LayoutSpec`'s module docs).
//! let policy = PriorityPolicy::builder().levels(2).property("priority").build()?;
//! let spec = LayoutSpec::partition_shares([1, 2]);
//! let now = Instant::now();
//!
//! // Producer side: route by the message's priority property and key.
//! let router = Router::new(policy.clone(), spec.clone(), 6, RouterConfig::default(), now)?;
//! let urgent = router.route_message(Some("0"), Some("order-7"), 6, now)?;
//! assert!([0, 4].contains(&urgent));
//! let bulk = router.route_message(None, None, 6, now)?; // no property: default level 1
//! assert!([1, 2, 3, 5].contains(&bulk));
//!
//! // Consumer side: the gate knows each partition's level from the same policy and layout.
//! let config = GateConfig::default().with_strategy(Strategy::Strict);
//! let mut gate = Gate::new(policy, spec, 6, config)?;
//! let mut control = NoControl; // an adapter passes its pause/resume implementation
//! gate.on_arrival(bulk, None, now, &mut control)?;
//! gate.on_arrival(urgent, Some(Level::new(0)), now, &mut control)?;
//! assert_eq!(gate.poll(now, &mut control), Some(urgent));
//! assert_eq!(gate.poll(now, &mut control), Some(bulk));
//! # Ok::<(), mq_priority::Error>(())
//! ```
//!
//! # Driving the gate
//!
//! An adapter (or a simulator) reports every event with the current instant and a
//! [`PartitionControl`]: [`Gate::on_arrival`] when a partition's consumer buffers a message,
//! [`Gate::poll`] (or [`Gate::next_partition`] then [`Gate::on_delivered`]) when the
//! application takes one, [`Gate::on_ack`] / [`Gate::on_nack`], [`Gate::set_backlog`] when
//! broker stats are known, [`Gate::set_partitions`] when the topic grows, and [`Gate::tick`]
//! from a timer when aging is on. The gate calls `pause`/`resume` only on changes; each
//! partition's consumer should be created with [`Gate::suggested_queue_size`].
//!
//! The crate's modules form no cycle (`scripts/check-module-cycles` checks it).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod clock;
mod control;
mod error;
mod gate;
mod hash;
mod interceptor;
mod layout;
mod policy;
mod router;

pub use clock::{Clock, ManualClock, SystemClock};
pub use control::{ControlEvent, NoControl, PartitionControl, RecordingControl};
pub use error::Error;
pub use gate::{Gate, GateConfig, GateStats, LevelStats, MAX_GROWTH_HOLD, QueueSizing, Strategy};
pub use hash::{KeyHash, KeyPlacement, java_string_hash, jump_consistent, murmur3_32};
pub use interceptor::{ConsumerInterceptor, GateInterceptor, MessageInfo};
pub use layout::{LayoutSpec, MAX_PARTITIONS, MAX_SHARE, PartitionLayout, Unlisted};
pub use policy::{
    DEFAULT_PROPERTY, Level, MAX_LEVELS, ParseOutcome, ParseStats, Parsed, PolicyBuilder,
    PriorityPolicy, ValueOrder,
};
pub use router::{Router, RouterConfig, StickyWindow};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
