//! Message priority on partitioned topics, wired from the transport-free `mq-priority` crate.
//!
//! The module re-exports what a user of it needs from `mq-priority` (the policy, the layout,
//! the router's and the gate's settings), so that `pulsar-wire` alone is enough; the rest
//! (the layout's and the gate's internals, for simulations) is the crate
//! [`mq-priority`](https://docs.rs/mq-priority).
//!
//! Pulsar has no message priority, so an urgent message waits behind a low-priority backlog.
//! The fix spreads levels over the partitions of one topic and makes the consumer prefer the
//! partitions of the more important levels. Producer and consumer share one
//! [`mq_priority::PriorityPolicy`] (levels, default level, the message property) and one
//! [`mq_priority::LayoutSpec`] (which partitions hold which level):
//!
//! - [`PriorityRouter`]: the producer's [`crate::PartitionRouter`]. A message goes to a
//!   partition of the level its priority property names (the policy's default level when it
//!   has none, or an invalid one): by key hash when it has a key, by a per-level sticky round
//!   robin otherwise ([`RouterConfig::placement`]: `Jump` moves the fewest keys when the topic
//!   grows). The layout follows the producer's partition count, which grows with
//!   [`crate::Producer::refresh_partitions`] (also run periodically, see
//!   [`crate::ProducerOptions::partitions_refresh`]).
//! - [`PriorityConsumer`]: one consumer per partition, each with the receiver queue the
//!   [`mq_priority::Gate`] suggests for its level (smaller for lower levels), merged into one
//!   stream. Every arrival and every delivery goes through the gate, which picks the partition
//!   the next message comes from and pauses lower levels while a more important one is under
//!   pressure; pausing withholds the partition's `FLOW` permits (what the broker already has
//!   permits for still arrives, at most one receiver queue). Decisions never wait for acks,
//!   so a consumer that never acknowledges is still prioritised, and a redelivered message
//!   keeps its partition's level. New partitions are subscribed when the partition count is
//!   re-read (periodically or with [`PriorityConsumer::refresh_partitions`]), and the gate's
//!   layout is extended: growth never moves an existing partition to another level (see
//!   [`mq_priority::LayoutSpec`]), and with [`GateConfig::growth_hold`] a key moved to a new
//!   partition keeps its order (every moved key with the router's default
//!   `KeyPlacement::Jump`; `Modulo` also moves keys between old partitions, which the hold
//!   does not cover). [`PriorityConsumer::set_strategy`] changes the strategy of a live
//!   consumer.
//! - [`follow_growth`]: after the topic grew, refreshes the producer's partition count and
//!   then the consumer's, the order that [`GateConfig::growth_hold`] needs to keep key order.
//!
//! Both [`PriorityConsumer`] and the plain [`crate::Consumer`] implement
//! [`crate::MessageConsumer`], so code can hold either as a `Box<dyn MessageConsumer>`.
//!
//! ```no_run
//! use pulsar_wire::prioritized::{PriorityConsumer, PriorityRouter};
//! use pulsar_wire::{Client, ConsumerOptions, InitialPosition, OutgoingMessage, Producer};
//! use pulsar_wire::prioritized::{LayoutSpec, Level, PriorityPolicy, RouterConfig, Unlisted};
//! use std::sync::Arc;
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! // Two levels: partition 0 carries level 0; every other partition, also those added
//! // later, carries the default level 1.
//! let policy = PriorityPolicy::builder().levels(2).property("priority").build()?;
//! let layout = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
//!
//! let router = PriorityRouter::for_topic(&client, "jobs", policy.clone(), layout.clone(), RouterConfig::default()).await?;
//! let producer = Producer::builder(&client, "jobs")
//!     .router(Arc::new(router))
//!     .build()
//!     .await?;
//! producer.send(OutgoingMessage::new("urgent").property("priority", "0")).await?;
//!
//! let consumer = PriorityConsumer::builder(&client, "jobs", "workers", policy, layout)
//!     .consumer(ConsumerOptions::default().initial_position(InitialPosition::Earliest))
//!     .build()
//!     .await?;
//! // The partition the gate picks: under the default delivery shares each level in turn by
//! // its share (4:1 here), so a low message can come before a buffered urgent one;
//! // `Strategy::Strict` always takes the most important level's first.
//! let message = consumer.receive().await?;
//! consumer.ack(&message).await?;
//! # Ok(()) }
//! ```

mod clock;
mod consumer;
mod growth;
mod router;

pub use crate::builders::PriorityConsumerBuilder;
pub use consumer::{DEFAULT_TICK, PriorityConsumer, PriorityConsumerOptions};
pub use growth::follow_growth;
pub use router::PriorityRouter;

pub use mq_priority::{
    GateConfig, GateStats, KeyPlacement, LayoutSpec, Level, PriorityPolicy, RouterConfig, Strategy,
    Unlisted,
};
