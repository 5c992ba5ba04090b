//! [`Growth`]: a consumer's partitions, and subscribing the ones its topic gains: on request
//! ([`Consumer::refresh_partitions`](super::Consumer::refresh_partitions)), and every
//! [`ConsumerOptions::partitions_refresh`] in the background ([`follow`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::again::Again;
use super::message::Origin;
use super::options::ConsumerOptions;
use super::partition::{self, Delivery, PartitionConsumer, PartitionList, Parts};
use super::stats::Counters;
use crate::Error;
use crate::link::LinkHub;
use crate::pool::Pool;

/// The receiver queue of a partition (by index; 0 for a topic that is not partitioned) and
/// whether it starts paused.
pub(crate) type QueueSizing<'a> = &'a (dyn Fn(u32) -> (u32, bool) + Sync);

/// What subscribing a partition takes, shared by a consumer and its background refresh.
#[derive(Debug)]
pub(crate) struct Growth {
    pub(crate) pool: Pool,
    pub(crate) topic: String,
    pub(crate) subscription: String,
    pub(crate) options: ConsumerOptions,
    /// The consumer's key (messages' [`Origin::consumer`]).
    pub(crate) key: u64,
    pub(crate) partitions: Arc<PartitionList>,
    /// Where new partitions' tasks deliver (weak, so that the channel ends with the tasks).
    pub(crate) delivery_sender: mpsc::WeakSender<Delivery>,
    pub(crate) links: Arc<LinkHub>,
    pub(crate) again: Arc<Again>,
    pub(crate) counters: Arc<Counters>,
    /// Each partition's task, pumping its messages to the consumer.
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Serialises refreshes (and a close), so that a partition is subscribed once and none
    /// after the consumer closed.
    pub(crate) refresh: tokio::sync::Mutex<()>,
    pub(crate) closed: AtomicBool,
}

impl Growth {
    /// Subscribes the partitions below `count` not subscribed yet; returns the partition
    /// count.
    pub(crate) async fn grow_to(
        &self,
        count: u32,
        sizing: QueueSizing<'_>,
    ) -> Result<usize, Error> {
        let _serial = self.refresh.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the consumer"));
        }
        self.pool.check_open()?;
        let have = self.partitions.len();
        for index in have..count as usize {
            let Some(tx) = self.delivery_sender.upgrade() else {
                return Err(Error::Closed("the consumer (its deliveries ended)"));
            };
            let (consumer, events) = PartitionConsumer::subscribe(
                &self.pool,
                crate::pool::partition_topic(&self.topic, index as u32),
                index as i32,
                &self.subscription,
                &self.options,
                sizing(index as u32),
                Parts {
                    state: self.links.slot(index as i32),
                    again: Arc::clone(&self.again),
                    counters: Arc::clone(&self.counters),
                },
            )
            .await?;
            let consumer = Arc::new(consumer);
            self.partitions.extend(vec![Arc::clone(&consumer)]);
            let task = tokio::spawn(partition::pump(
                consumer,
                Origin {
                    consumer: self.key,
                    slot: index,
                },
                events,
                tx,
                Arc::clone(&self.counters),
            ));
            self.tasks.lock().push(task);
            tracing::info!(topic = %self.topic, partition = index, "subscribed to a new partition");
        }
        Ok(self.partitions.len())
    }

    /// Re-reads the partition count and subscribes what was added, with the consumer's
    /// receiver queue, paused if the consumer is.
    pub(crate) async fn refresh(&self) -> Result<usize, Error> {
        let count = self.pool.partitions(&self.topic).await?;
        let size = self.options.receiver_queue_size;
        let paused = self.is_paused();
        self.grow_to(count, &move |_| (size, paused)).await
    }

    /// Whether the consumer is paused (any partition is).
    pub(crate) fn is_paused(&self) -> bool {
        self.partitions.all().iter().any(|p| p.is_paused())
    }
}

/// Refreshes the partitions every `every` while the consumer lives and is open; a failed
/// refresh is tried again at the next turn.
pub(crate) async fn follow(growth: Weak<Growth>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(growth) = growth.upgrade() else {
            return;
        };
        if growth.closed.load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = growth.refresh().await {
            if growth.closed.load(Ordering::Acquire) {
                return;
            }
            tracing::debug!(topic = %growth.topic, %error, "the partition count could not be refreshed");
        }
    }
}
