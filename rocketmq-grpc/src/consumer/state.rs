//! The state shared by the consumer's tasks.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ack_batcher::Batcher;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ack_settings::AckSettings;
use super::counters::Counters;
use super::handler::MessageHandler;
use super::lite_state::LiteState;
use super::registration::Registration;
use super::unacked::Unacked;
use crate::pb;
use crate::{AckEntry, AckFlusher, AckKey, Session};

/// One topic subscription with its filter.
#[derive(Debug, Clone)]
pub(super) struct Subscription {
    pub(super) topic: String,
    pub(super) filter: crate::FilterExpression,
}

/// Adds a `"*"` subscription for each topic of `topics` that `subscriptions` lacks (the level
/// topics of a priority consumer, or its native topic).
pub(super) fn subscribe_levels(
    subscriptions: &mut Vec<Subscription>,
    topics: &crate::priority::PriorityTopics,
) {
    for topic in topics.topics() {
        if !subscriptions.iter().any(|s| s.topic == topic) {
            subscriptions.push(Subscription {
                topic: topic.to_owned(),
                filter: crate::FilterExpression::from("*"),
            });
        }
    }
}

/// Identifies an assigned queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct QueueKey {
    pub(super) topic: String,
    pub(super) broker: String,
    pub(super) queue_id: i32,
}

/// State shared by the consumer's tasks.
pub(super) struct Inner {
    pub(super) session: Arc<Session>,
    pub(super) group: String,
    pub(super) subscriptions: Vec<Subscription>,
    pub(super) handler: Arc<dyn MessageHandler>,
    pub(super) acks: Batcher<AckKey, AckEntry, AckFlusher>,
    pub(super) ack_settings: AckSettings,
    pub(super) permits: Arc<Semaphore>,
    pub(super) concurrency: usize,
    pub(super) receive_batch_size: i32,
    pub(super) long_polling: Mutex<Duration>,
    /// How far each renewal extends the invisibility of a message whose handler still runs
    /// (zero: no renewal).
    pub(super) renewal: Duration,
    /// The redelivery backoff the server announced on the telemetry stream.
    pub(super) backoff: Mutex<Option<pb::RetryPolicy>>,
    /// Whether the proxy has the consumer's settings (telemetry stream open and answered).
    pub(super) registration: Registration,
    pub(super) stop: CancellationToken,
    pub(super) tasks: TaskTracker,
    pub(super) counters: Arc<Counters>,
    pub(super) unacknowledged: Arc<Mutex<Unacked>>,
    pub(super) queues: Mutex<HashMap<QueueKey, CancellationToken>>,
    /// Set by `close` or `drop`, whichever comes first.
    pub(super) shut_down: AtomicBool,
    /// The lite subscriptions, for a lite push consumer.
    pub(super) lite: Option<Arc<LiteState>>,
    /// The priority gate over level topics
    /// ([`PushConsumerBuilder::priority`](super::PushConsumerBuilder::priority)).
    pub(super) gate: Option<Arc<super::gated::PushGate>>,
    /// A consumer of a native priority topic with renewal on: a failed message with a
    /// priority above 0 is retried here, held with its invisibility renewed, as a FIFO message
    /// is, instead of being nacked. A nacked priority message comes back through the group's
    /// retry topic, after every fresh message of the topic (and 65-80 s late on 5.5.0 by
    /// default, apache/rocketmq#10350); held, it keeps its rank.
    pub(super) retry_in_place: bool,
}

impl Inner {
    /// The client type announced and heartbeated: a lite push consumer or a push consumer.
    pub(super) fn client_type(&self) -> pb::ClientType {
        if self.lite.is_some() {
            pb::ClientType::LitePushConsumer
        } else {
            pb::ClientType::PushConsumer
        }
    }
}
