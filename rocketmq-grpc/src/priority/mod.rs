//! Priority levels on RocketMQ: where each level of a [`PriorityPolicy`] lives, routing a
//! message to it, and a push consumer that serves the more important levels first.
//!
//! A [`PriorityPolicy`] (from `mq-priority`, re-exported here) names the levels (level 0 the
//! most important) and the user property that carries a message's level. On RocketMQ a level
//! lives in one of two places, chosen once in [`PriorityTopics`]:
//!
//! - **Level topics** (any RocketMQ 5.x, the only way on 5.3): one normal topic per level.
//!   Through the gRPC proxy a client can neither choose the queue of a normal message (the
//!   proxy picks it) nor receive from one queue of a broker (a receive pops every queue of
//!   it), so levels on the queues of one topic could neither be routed nor gated; topics can.
//!   The producer sends each message to its level's topic ([`PriorityTopics::route`]); a push
//!   consumer built with [`PushConsumerBuilder::priority`](crate::PushConsumerBuilder::priority)
//!   subscribes to every level topic in its group and a [`Gate`] pauses the receives of the
//!   less important topics while a more important level is under pressure. A retried message
//!   comes back through its own topic, so it keeps its level. A simple consumer built with
//!   [`SimpleConsumerBuilder::priority`](crate::SimpleConsumerBuilder::priority) asks the
//!   level topics the gate does not hold back and returns what came most important first.
//! - **Native** (RocketMQ 5.4+): one `PRIORITY` topic; a message of level `k` gets the native
//!   priority `levels - 1 - k` (higher is more urgent there) and the broker serves the higher
//!   priorities first by itself. A nacked priority message would come back through the
//!   group's retry topic, after every fresh message (apache/rocketmq#10350), so a push
//!   consumer built with [`PushConsumerBuilder::priority`](crate::PushConsumerBuilder::priority)
//!   retries a failed message above priority 0 in place instead (held for its retry delay,
//!   its invisibility renewed) and it keeps its rank.
//! - **Native tiers** (5.4+), both at once: several `PRIORITY` topics, each holding a run of
//!   consecutive levels at native priorities ([`PriorityTopicsBuilder::native_tiers`]), for
//!   example the most important level alone and the rest on a second topic. The broker orders
//!   each tier, and consumers gate across the tiers as across level topics, so the top tier
//!   is not queued behind what the consumer already holds of the others.
//!
//! Either way the message keeps the policy's property, so consumers in other languages and
//! retries see its level.
//!
//! ```
//! use rocketmq_grpc::OutgoingMessage;
//! use rocketmq_grpc::priority::{PriorityPolicy, PriorityTopics};
//!
//! let policy = PriorityPolicy::builder().levels(3).default_level(2).build().unwrap();
//! let topics = PriorityTopics::builder(policy.clone())
//!     .level_topics(["orders-urgent", "orders", "orders-bulk"])
//!     .build()?;
//! let message = OutgoingMessage::new("orders", "refund 42").property(policy.property(), "0");
//! assert_eq!(topics.route(message)?.topic(), "orders-urgent");
//! # Ok::<(), rocketmq_grpc::Error>(())
//! ```

mod topics;

pub use mq_priority::{
    Gate, GateConfig, GateStats, Level, LevelStats, ParseStats, PolicyBuilder, PriorityPolicy,
    QueueSizing, Strategy, ValueOrder,
};
pub use topics::{MAX_TOPIC_LEN, PriorityTopics, PriorityTopicsBuilder};
