//! [`Consumer`]: subscribes, keeps the broker supplied with flow permits, decodes batches, and
//! acknowledges correctly: ordinary acks grouped through `ack-batcher` with `txn-ack`'s
//! [`txn_ack::AckTracker`], transactional acks built only by [`txn_ack::TxnAckTracker`].

mod ack_timeout;
mod acks;
mod again;
mod chunks;
mod dead_letter;
mod growth;
pub(crate) use growth::QueueSizing;
mod key_shared;
mod ledger;
mod message;
mod nack_backoff;
mod options;
mod partition;
mod retry;
mod seek;
mod stats;
mod txn_frame;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ack_batcher::{Batcher, ItemOptions};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use txn_ack::{AckId, AckKind, EntryId, MessagePosition};

use acks::{AckFlusher, AckKey};
use again::Again;
pub use chunks::ChunkLimits;
use dead_letter::DeadLetters;
pub use dead_letter::{DeadLetterPolicy, ORIGIN_MESSAGE_ID, REAL_TOPIC, UNDECODABLE_REASON};
pub use key_shared::{
    HashRange, KEY_HASH_RANGE_SIZE, KeySharedMode, KeySharedPolicy, NONE_KEY, sticky_key_hash,
};
use ledger::{HeldBackAck, Outgoing};
pub use message::Message;
use message::Origin;
pub use nack_backoff::{MAX_NACK_DELAY, NackBackoff};
pub use options::{
    ConsumerOptions, InitialPosition, MAX_RECEIVER_QUEUE_SIZE, MIN_ACK_TIMEOUT, SubType,
};
use partition::PartitionList;
use partition::Parts;
use partition::Undecodable;
pub(crate) use partition::{Delivery, EndPosition, PartitionConsumer};
pub use retry::{DELAY_TIME, MAX_RECONSUME_TIMES, REAL_SUBSCRIPTION, RECONSUME_TIMES};
use seek::SeekRequest;
pub use seek::SeekTo;
pub use stats::ConsumerStats;
use stats::Counters;

use crate::link::LinkHub;
use crate::pool::Pool;
use crate::txn::Participant;
use crate::{Connection, ConsumerCloseReport, Error, LinkStates, MessageId, Transaction};

/// The deliveries waiting for [`Consumer::receive`]: a receiver queue's worth, and room for
/// the messages of a batch beyond it.
fn delivery_capacity(options: &ConsumerOptions) -> usize {
    options.receiver_queue_size as usize + crate::MAX_BATCH_MESSAGES as usize
}

/// Tells consumers apart, so that a message is acknowledged only through its own consumer.
static NEXT_CONSUMER: AtomicU64 = AtomicU64::new(1);

/// A subscription's consumer on a topic, or on every partition of a partitioned topic.
///
/// Acknowledgements:
/// - [`Consumer::ack`] queues an ordinary ack: `txn-ack`'s [`txn_ack::AckTracker`]
///   accumulates batches (a completed batch becomes a whole-entry ack keeping its batch size;
///   a partial one sends its accumulated set or waits, per [`PartialBatches`](crate::PartialBatches)) and the acks are
///   grouped: one `CommandAck` carries every id of a group.
/// - [`Consumer::ack_in`] acknowledges in a transaction: `txn-ack`'s
///   [`txn_ack::TxnAckTracker`] builds an independent set with the batch size for each message;
///   the ack is sent with a request id and its `ACK_RESPONSE` awaited, at once, or, on a
///   Shared or Key_Shared subscription while other messages of its batch are still held,
///   when the batch is free or the transaction commits (see [`Consumer::ack_in`]).
/// - [`Consumer::nack`] gives a message back for a new delivery.
/// - [`Consumer::ack_id`] and [`Consumer::nack_id`] do the same by id, for the entries that
///   [`Consumer::receive`] reports as [`Error::Undecodable`]: an entry that cannot be decoded
///   is never acknowledged behind the application's back.
///
/// Several consumers on one subscription: on a Shared or Key_Shared subscription a 4.0.x
/// broker sends a replayed entry to *any* consumer, with every message of it neither
/// acknowledged nor pending in another transaction. This consumer never makes a request that
/// replays a message its application holds: no redelivery request without ids (unless the
/// application asks for one, [`Consumer::redeliver_unacknowledged`]), transactional acks
/// held back while their batch is partly held (so an abort has nothing on the broker to undo),
/// and negative acks of batched messages handed over again by the consumer itself. An idle
/// consumer sends nothing but flow permits.
///
/// Redeliveries: a 4.0.x broker counts a Shared consumer's unacked messages per delivery and
/// gives nothing back when a transaction aborts, so after aborts, restarts or another
/// client's requests it may send again (and count again) messages the application holds or
/// has acknowledged. The consumer follows every delivery with `txn-ack`'s
/// [`txn_ack::Deliveries`]: such duplicates are not handed over a second time (they show in
/// [`ConsumerStats::duplicates`] and [`ConsumerStats::committed_redeliveries`]); copies sent
/// by an abort before its answer arrived are handed over once it did. When the broker's
/// count has drifted above what the application holds and nothing arrives, the consumer
/// asks the broker to unblock it without a replay ([`ConsumerStats::unblocks`]); no
/// conflicting ack is ever sent.
#[derive(Debug)]
pub struct Consumer {
    pool: Pool,
    options: ConsumerOptions,
    topic: String,
    partitioned: bool,
    subscription: String,
    sub_type: SubType,
    key: u64,
    partitions: Arc<PartitionList>,
    deliveries: tokio::sync::Mutex<mpsc::Receiver<Delivery>>,
    /// Why the deliveries ended, once they did.
    ended: Mutex<Option<Error>>,
    acks: Batcher<AckKey, AckId, AckFlusher>,
    counters: Arc<Counters>,
    /// Its partitions' subscriptions, tasks and closed flag, shared with the background
    /// partition refresh.
    growth: Arc<growth::Growth>,
    /// The dead-letter topic and its producer, with a policy.
    dead_letters: Option<DeadLetters>,
    /// The link state of every partition consumer.
    links: Arc<LinkHub>,
    /// Messages the consumer hands over again itself.
    again: Arc<Again>,
    /// The error a batch receive met after gathering messages, for the next one.
    deferred: Mutex<Option<Error>>,
    /// With [`ConsumerOptions::ack_timeout`]: the messages received and not settled.
    timeouts: Option<Arc<ack_timeout::AckTimeouts>>,
    /// Held by a seek: one at a time.
    seeking: tokio::sync::Mutex<()>,
    /// With [`ConsumerOptions::enable_retry`]: the consumer of the retry-letter topic.
    retry: Option<Retry>,
}

/// The retry-letter topic's consumer of a consumer with retry enabled, its messages, and the
/// producer of retry letters.
#[derive(Debug)]
struct Retry {
    consumer: Arc<Consumer>,
    /// What the retry consumer received, forwarded by `task` (one at a time).
    messages: tokio::sync::Mutex<mpsc::Receiver<Result<Message, Error>>>,
    task: tokio::task::JoinHandle<()>,
    letters: DeadLetters,
}

impl Drop for Retry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Retry {
    /// Subscribes `subscription` to the retry-letter topic of `topic`, with `options`
    /// (retry off).
    async fn subscribe(
        pool: &Pool,
        topic: &str,
        subscription: &str,
        options: &ConsumerOptions,
        policy: &DeadLetterPolicy,
    ) -> Result<Self, Error> {
        let retry_topic = crate::pool::topic_name(&policy.retry_topic_for(topic, subscription))?;
        // Its dead letters go where the topic's go (`{topic}-{subscription}-DLQ`, as with
        // the Java client), not to a dead-letter topic named after the retry topic.
        let options = options.clone().enable_retry(false).dead_letter(
            policy
                .clone()
                .dead_letter_topic(policy.topic_for(topic, subscription)),
        );
        let consumer = subscribe_boxed(pool, &retry_topic, subscription, options).await?;
        let consumer = Arc::new(consumer);
        let (tx, rx) = mpsc::channel(1);
        let task = forward(Arc::clone(&consumer), tx);
        Ok(Self {
            consumer,
            messages: tokio::sync::Mutex::new(rx),
            task,
            letters: DeadLetters::to(policy.clone(), retry_topic),
        })
    }
}

/// [`Consumer::subscribe`] boxed as `Send` (a consumer subscribes its retry consumer: see
/// [`call_retry`]).
fn subscribe_boxed<'a>(
    pool: &'a Pool,
    topic: &'a str,
    subscription: &'a str,
    options: ConsumerOptions,
) -> futures_util::future::BoxFuture<'a, Result<Consumer, Error>> {
    Box::pin(Consumer::subscribe(pool, topic, subscription, options))
}

/// Receives from `consumer` in the background and hands what it gets to `tx` (one at a
/// time: the channel's room), until the consumer ends or nobody takes them (a retry
/// consumer's messages to its consumer, a pattern consumer's topics' to it).
pub(crate) fn forward(
    consumer: Arc<Consumer>,
    tx: mpsc::Sender<Result<Message, Error>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let received = consumer.receive().await;
            if received.is_err() && consumer.has_ended() {
                return;
            }
            if tx.send(received).await.is_err() {
                return;
            }
        }
    })
}

/// A call to the consumer of the retry-letter topic from one of the consumer's own.
enum RetryCall<'a> {
    Ack(&'a Message),
    AckAndWait(&'a Message),
    AckCumulative(&'a Message),
    AckIn(&'a Transaction, &'a Message),
    AckCumulativeIn(&'a Transaction, &'a Message),
}

/// Runs `call` on `retry` as a boxed `Send` future: the retry consumer is a consumer too, and
/// its calls made inside the consumer's own would otherwise make their futures recursive
/// (this function, outside them, is where their types are checked).
fn call_retry<'a>(
    retry: &'a Consumer,
    call: RetryCall<'a>,
) -> futures_util::future::BoxFuture<'a, Result<(), Error>> {
    match call {
        RetryCall::Ack(message) => Box::pin(retry.ack(message)),
        RetryCall::AckAndWait(message) => Box::pin(retry.ack_and_wait(message)),
        RetryCall::AckCumulative(message) => Box::pin(retry.ack_cumulative(message)),
        RetryCall::AckIn(txn, message) => Box::pin(retry.ack_in(txn, message)),
        RetryCall::AckCumulativeIn(txn, message) => Box::pin(retry.ack_cumulative_in(txn, message)),
    }
}

/// Closes `retry` as a boxed `Send` future, for the reason of [`call_retry`].
fn close_retry(
    retry: &Consumer,
    deadline: Duration,
) -> futures_util::future::BoxFuture<'_, Result<ConsumerCloseReport, Error>> {
    Box::pin(retry.close(deadline))
}

/// The next message of the retry-letter topic (never, without one).
async fn next_retried(retry: Option<&Retry>) -> Option<Result<Message, Error>> {
    match retry {
        Some(retry) => retry.messages.lock().await.recv().await,
        None => std::future::pending().await,
    }
}

impl Consumer {
    pub(crate) async fn subscribe(
        pool: &Pool,
        topic: &str,
        subscription: &str,
        options: ConsumerOptions,
    ) -> Result<Self, Error> {
        let size = options.receiver_queue_size;
        Self::subscribe_sized(pool, topic, subscription, options, &move |_| (size, false)).await
    }

    /// Subscribes with a receiver queue per partition.
    pub(crate) async fn subscribe_sized(
        pool: &Pool,
        topic: &str,
        subscription: &str,
        mut options: ConsumerOptions,
        sizing: QueueSizing<'_>,
    ) -> Result<Self, Error> {
        options.validate()?;
        if subscription.is_empty() {
            return Err(Error::Invalid {
                what: "subscription",
                reason: "the name is empty".into(),
            });
        }
        let topic = crate::pool::topic_name(topic)?;
        let retry = if options.retry {
            // As the Java client: retry without a policy takes the default one.
            let policy = options
                .dead_letter
                .get_or_insert_with(|| DeadLetterPolicy::new(MAX_RECONSUME_TIMES))
                .clone();
            Some(Retry::subscribe(pool, &topic, subscription, &options, &policy).await?)
        } else {
            None
        };
        let topics = pool.partition_topics(&topic).await?;
        let partitioned = topics.len() > 1 || topics[0] != topic;
        let links = LinkHub::new("consumer");
        let counters = Arc::new(Counters::default());
        let again = Arc::new(Again::default());
        let mut partitions = Vec::with_capacity(topics.len());
        let mut receivers = Vec::with_capacity(topics.len());
        for (index, partition_topic) in topics.into_iter().enumerate() {
            let partition = if partitioned { index as i32 } else { -1 };
            match PartitionConsumer::subscribe(
                pool,
                partition_topic,
                partition,
                subscription,
                &options,
                sizing(index as u32),
                Parts {
                    state: links.slot(partition),
                    again: Arc::clone(&again),
                    counters: Arc::clone(&counters),
                },
            )
            .await
            {
                Ok((consumer, events)) => {
                    partitions.push(Arc::new(consumer));
                    receivers.push(events);
                }
                Err(error) => {
                    for consumer in &partitions {
                        let _ = consumer.close().await;
                    }
                    return Err(error);
                }
            }
        }
        let key = NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed);
        // Bounded: a partition's task waits while the application is behind (the broker is
        // out of permits by then anyway).
        let (tx, rx) = mpsc::channel(delivery_capacity(&options));
        let tasks = receivers
            .into_iter()
            .zip(&partitions)
            .enumerate()
            .map(|(slot, (events, partition))| {
                tokio::spawn(partition::pump(
                    Arc::clone(partition),
                    Origin {
                        consumer: key,
                        slot,
                    },
                    events,
                    tx.clone(),
                    Arc::clone(&counters),
                ))
            })
            .collect();
        let partitions = Arc::new(PartitionList::new(partitions));
        let acks = acks::batcher(
            AckFlusher {
                partitions: Arc::clone(&partitions),
                receipts: options.ack_receipts,
                counters: Arc::clone(&counters),
            },
            options.ack_group_time,
            options.ack_group_max,
        )?;
        let dead_letters = options
            .dead_letter
            .clone()
            .map(|policy| DeadLetters::new(policy, &topic, subscription));
        let growth = Arc::new(growth::Growth {
            pool: pool.clone(),
            topic: topic.clone(),
            subscription: subscription.to_owned(),
            options: options.clone(),
            key,
            partitions: Arc::clone(&partitions),
            delivery_sender: tx.downgrade(),
            links: Arc::clone(&links),
            again: Arc::clone(&again),
            counters: Arc::clone(&counters),
            tasks: Mutex::new(tasks),
            refresh: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
        });
        if partitioned && let Some(every) = options.partitions_refresh {
            tokio::spawn(growth::follow(Arc::downgrade(&growth), every));
        }
        let timeouts = options.ack_timeout.map(|timeout| {
            let timeouts = Arc::new(ack_timeout::AckTimeouts::new(timeout));
            tokio::spawn(ack_timeout::watch(
                Arc::downgrade(&growth),
                Arc::clone(&timeouts),
            ));
            timeouts
        });
        Ok(Self {
            pool: pool.clone(),
            sub_type: options.sub_type,
            options,
            topic,
            partitioned,
            subscription: subscription.to_owned(),
            key,
            partitions,
            deliveries: tokio::sync::Mutex::new(rx),
            ended: Mutex::new(None),
            acks,
            counters,
            growth,
            dead_letters,
            links,
            again,
            deferred: Mutex::new(None),
            timeouts,
            seeking: tokio::sync::Mutex::new(()),
            retry,
        })
    }

    /// Re-reads the partition count (`PARTITIONED_METADATA`) and subscribes to the partitions
    /// added since, with the same options; their messages join [`Consumer::receive`]. Returns
    /// the partition count (0 for a topic that is not partitioned, which never changes). Pulsar
    /// never removes partitions: a smaller answer changes nothing. A paused consumer subscribes
    /// new partitions paused.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Consumer::close`] or once its deliveries ended; the
    /// lookup's or the `SUBSCRIBE` request's errors (partitions subscribed before the failure
    /// stay subscribed).
    pub async fn refresh_partitions(&self) -> Result<usize, Error> {
        if !self.partitioned {
            return Ok(0);
        }
        self.growth.refresh().await
    }

    /// Subscribes the partitions below `count` not subscribed yet; returns the partition count.
    pub(crate) async fn grow_to(
        &self,
        count: u32,
        sizing: QueueSizing<'_>,
    ) -> Result<usize, Error> {
        if !self.partitioned {
            return Ok(0);
        }
        self.growth.grow_to(count, sizing).await
    }

    /// Every partition's consumer (the one of a topic that is not partitioned).
    pub(crate) fn partition_consumers(&self) -> Arc<[Arc<PartitionConsumer>]> {
        self.partitions.all()
    }

    /// The client the consumer was created by.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The number of partitions the consumer is subscribed to (0 for a topic that is not
    /// partitioned).
    pub fn partitions(&self) -> usize {
        if self.partitioned {
            self.partitions.len()
        } else {
            0
        }
    }

    /// Stops granting flow permits on every partition (as the Java client's `pause`): the
    /// broker still sends what it already has permits for (at most one receiver queue per
    /// partition), then nothing more until [`Consumer::resume`]. Buffered messages stay
    /// receivable. Partitions subscribed while paused start paused.
    pub fn pause(&self) {
        for partition in self.partitions.all().iter() {
            partition.pause();
        }
        if let Some(retry) = &self.retry {
            retry.consumer.pause();
        }
    }

    /// Grants flow permits again on every partition, the ones withheld while paused at once.
    pub fn resume(&self) {
        for partition in self.partitions.all().iter() {
            partition.resume(&self.counters);
        }
        if let Some(retry) = &self.retry {
            retry.consumer.resume();
        }
    }

    /// Whether any partition is paused.
    pub fn is_paused(&self) -> bool {
        self.growth.is_paused()
    }

    /// The receiver queue of every partition's consumer, by partition.
    pub(crate) fn queue_sizes(&self) -> Vec<u32> {
        self.partitions.all().iter().map(|p| p.queue_size).collect()
    }

    /// The partition consumer of `slot`.
    pub(crate) fn partition_at(&self, slot: usize) -> Option<Arc<PartitionConsumer>> {
        self.partitions.get(slot)
    }

    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The topic's full name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The subscription's name.
    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// The link state of every partition consumer, as a [`tokio::sync::watch`] receiver:
    /// [`LinkStates::partitions`] by partition (one entry for a topic that is not
    /// partitioned; more as [`Consumer::refresh_partitions`] subscribes new ones),
    /// [`LinkStates::overall`] for the consumer as a whole.
    /// [`tokio::sync::watch::Receiver::changed`] and
    /// [`tokio::sync::watch::Receiver::wait_for`] wait for a change (a watcher that looks
    /// less often than the state changes sees the latest state, not every one; every change
    /// is also logged, at info, or warn for [`crate::LinkState::Failed`]). The states go
    /// [`crate::LinkState::Connected`] → [`crate::LinkState::Reconnecting`] (one attempt
    /// after another) → `Connected` across a lost connection or an unload (`receive` waits
    /// meanwhile), and end [`crate::LinkState::Closed`] with [`Consumer::close`] (or
    /// `Failed` when the broker refuses the subscription for good, which
    /// [`Consumer::receive`] reports once). The sender is dropped with the consumer.
    pub fn state(&self) -> tokio::sync::watch::Receiver<LinkStates> {
        self.links.subscribe()
    }

    /// Waits for the next message.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when a partition's connection is lost (its messages stop);
    /// [`Error::Closed`] when the broker closed the consumer (`CLOSE_CONSUMER`, also in
    /// [`ConsumerStats::closed_by_broker`]) or after [`Consumer::close`];
    /// [`Error::Undecodable`] for an entry that cannot be decoded (it stays unacknowledged:
    /// [`Consumer::ack_id`] or [`Consumer::nack_id`] it, then receive again); with
    /// [`ConsumerOptions::dead_letter`], the error of a dead letter that could not be
    /// published (the message was nacked and comes again; receive again).
    pub async fn receive(&self) -> Result<Message, Error> {
        loop {
            self.check_open()?;
            let delivery = match self.again.pop() {
                Some(message) => Some(Delivery::Message(Box::new(message))),
                None => {
                    let mut deliveries = self.deliveries.lock().await;
                    tokio::select! {
                        biased;
                        () = self.again.ready() => continue,
                        delivery = deliveries.recv() => delivery,
                        Some(retried) = next_retried(self.retry.as_ref()) => return retried,
                    }
                }
            };
            match delivery {
                Some(Delivery::Message(message))
                    if self
                        .partitions
                        .get(message.origin.slot)
                        .is_some_and(|partition| partition.is_stale(message.link)) =>
                {
                    // Received before a seek moved the cursor.
                    continue;
                }
                Some(Delivery::Message(message)) => {
                    if !message.handed_again
                        && let Some(partition) = self.partitions.get(message.origin.slot)
                    {
                        partition.consumed(1, &self.counters);
                    }
                    if let Some(dead) = &self.dead_letters
                        && dead.is_due(message.redelivery_count())
                    {
                        // Boxed: inlined, the rarely taken dead-letter path made every
                        // `receive` future about 20 KB.
                        Box::pin(self.dead_letter_message(dead, &message)).await?;
                        continue;
                    }
                    if let Some(timeouts) = &self.timeouts {
                        timeouts.track(&message);
                    }
                    return Ok(*message);
                }
                Some(Delivery::Undecodable(entry)) => {
                    let error = self.undecodable(&entry);
                    if let Some(dead) = &self.dead_letters
                        && dead.is_due(entry.redelivery_count)
                    {
                        Box::pin(self.dead_letter_entry(dead, &entry)).await?;
                        continue;
                    }
                    return Err(error);
                }
                Some(other) => return Err(self.delivery_error(other)),
                None => return Err(self.ended_error()),
            }
        }
    }

    /// Moves the subscription ([`SeekTo`]; a [`MessageId`] or a [`std::time::SystemTime`]
    /// converts): the next messages received follow the new position, whether it is before
    /// or after where the subscription stood; what was acknowledged after it comes again.
    /// A message id moves its own partition only (on a partitioned topic, the partition the
    /// id names); the other positions move every partition. As the Java client's
    /// `Consumer.seek`: the broker disconnects the subscription's consumers (those of other
    /// clients too; on Exclusive and Failover subscriptions the active one), which subscribe
    /// again.
    ///
    /// Before the request, the acks queued go out and transactional acks held back are
    /// sent; messages received before the seek and not returned yet are dropped. Messages
    /// the application holds from before stay valid to acknowledge.
    ///
    /// Other consumers of this crate on the same subscription remember what they
    /// acknowledged for a while (`txn_ack::Recall`, 10 s or the last 4,096 entries) and
    /// acknowledge such messages again instead of handing them over when a seek by another
    /// client replays them.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a time before the epoch, or an id naming a partition the topic
    /// does not have; [`Error::Closed`]; the broker's refusal (for instance a subscription
    /// busy with another reset) or connection errors: the seek may then have been applied
    /// or not, and messages may come again.
    pub async fn seek(&self, to: impl Into<SeekTo>) -> Result<(), Error> {
        self.check_open()?;
        let to = to.into();
        let request = SeekRequest::new(&to)?;
        let partitions = self.partitions.all();
        let targets: Vec<Arc<PartitionConsumer>> = match to {
            SeekTo::After(id) if self.partitioned => {
                let one = partitions
                    .iter()
                    .find(|partition| partition.partition == id.partition)
                    .ok_or_else(|| Error::Invalid {
                        what: "SeekTo::After",
                        reason: format!(
                            "{id} names partition {} and {} has {} partitions: seek with an \
                             id of a message received from it",
                            id.partition,
                            self.topic,
                            partitions.len()
                        ),
                    })?;
                vec![Arc::clone(one)]
            }
            _ => partitions.to_vec(),
        };
        let _one = self.seeking.lock().await;
        self.flush_acks().await;
        let results =
            futures_util::future::join_all(targets.iter().map(|p| p.seek(&request))).await;
        results.into_iter().collect::<Result<Vec<()>, Error>>()?;
        Ok(())
    }

    /// [`Consumer::seek`] to the first message published at or after `time` (every
    /// partition).
    ///
    /// # Errors
    /// As [`Consumer::seek`].
    pub async fn seek_to_time(&self, time: std::time::SystemTime) -> Result<(), Error> {
        self.seek(SeekTo::Time(time)).await
    }

    /// The id of the last message of the topic (`GET_LAST_MESSAGE_ID`), `None` when it is
    /// empty; for a partitioned topic, see [`Consumer::last_message_ids`].
    ///
    /// # Errors
    /// [`Error::Invalid`] on a partitioned topic; [`Error::Closed`]; connection errors.
    pub async fn last_message_id(&self) -> Result<Option<MessageId>, Error> {
        if self.partitioned {
            return Err(Error::Invalid {
                what: "last_message_id",
                reason: format!(
                    "{} is partitioned and each partition has a last message: use \
                     last_message_ids",
                    self.topic
                ),
            });
        }
        Ok(self.last_message_ids().await?.into_iter().next().flatten())
    }

    /// The id of the last message of every partition, in partition order (one for a topic
    /// that is not partitioned), `None` for an empty one.
    ///
    /// # Errors
    /// [`Error::Closed`]; connection errors.
    pub async fn last_message_ids(&self) -> Result<Vec<Option<MessageId>>, Error> {
        self.check_open()?;
        let partitions = self.partitions.all();
        let ends =
            futures_util::future::join_all(partitions.iter().map(|p| p.end_position())).await;
        ends.into_iter()
            .map(|end| end.map(|end| end.last_id))
            .collect()
    }

    /// The messages as a [`futures_util::Stream`], each item what [`Consumer::receive`]
    /// returns; it ends once the consumer is closed ([`crate::Messages`]).
    pub fn stream(&self) -> crate::Messages<'_> {
        crate::Messages::new(self)
    }

    /// Receives a batch: returns once it holds [`crate::BatchReceive::max_messages`], or its
    /// payloads reach [`crate::BatchReceive::max_bytes`], or the timeout passed (with what it
    /// holds then, perhaps nothing). An error after some messages were gathered comes with the
    /// next call (at once); each message is acknowledged as one received alone.
    ///
    /// # Errors
    /// [`Error::Invalid`] for limits that allow nothing; what [`Consumer::receive`] returns.
    pub async fn batch_receive(&self, limits: crate::BatchReceive) -> Result<Vec<Message>, Error> {
        crate::receiving::batch_receive(self, limits, &self.deferred).await
    }

    /// The message at `position` of partition `slot` is settled (acknowledged, negatively
    /// or in a transaction): its ack timeout no longer runs.
    fn settled(&self, slot: usize, position: &MessagePosition, cumulative: bool) {
        if let Some(timeouts) = &self.timeouts {
            timeouts.settled(slot, position, cumulative);
        }
    }

    /// Whether the consumer gets nothing more: closed, or its deliveries ended
    /// ([`Consumer::receive`] says why).
    pub fn has_ended(&self) -> bool {
        self.growth.closed.load(Ordering::Acquire) || self.ended.lock().is_some()
    }

    /// Publishes a message to the dead-letter topic, then acknowledges it; when the publish
    /// fails, nacks it (it comes again, and the dead-lettering is tried again) and returns
    /// why.
    async fn dead_letter_message(
        &self,
        dead: &DeadLetters,
        message: &Message,
    ) -> Result<(), Error> {
        let letter = dead_letter::dead_letter(
            message.payload().clone(),
            message.key(),
            message.properties(),
            message.topic(),
            &message.id(),
        );
        if let Err(error) = dead
            .publish(&self.pool, letter, |topic, name| {
                let pool = self.pool.clone();
                async move { initial_subscription(&pool, &topic, &name).await }
            })
            .await
        {
            tracing::warn!(id = %message.id(), topic = %dead.topic, %error, "dead-lettering failed: nacked");
            let _ = self.nack(message);
            return Err(error);
        }
        self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        tracing::info!(id = %message.id(), topic = %dead.topic, "dead-lettered");
        self.ack(message).await
    }

    /// As `dead_letter_message`, for an undecodable entry: its payload as stored.
    async fn dead_letter_entry(
        &self,
        dead: &DeadLetters,
        entry: &Undecodable,
    ) -> Result<(), Error> {
        let (payload, key, mut properties) = match &entry.raw {
            Some(raw) => (
                raw.payload.clone(),
                raw.key.as_deref(),
                raw.properties.clone(),
            ),
            None => (bytes::Bytes::new(), None, Vec::new()),
        };
        properties.retain(|(name, _)| name != UNDECODABLE_REASON);
        properties.push((UNDECODABLE_REASON.to_owned(), entry.reason.clone()));
        let topic = self
            .partitions
            .get(entry.slot)
            .map_or_else(|| self.topic.clone(), |p| p.topic.clone());
        let letter = dead_letter::dead_letter(payload, key, &properties, &topic, &entry.id);
        if let Err(error) = dead
            .publish(&self.pool, letter, |topic, name| {
                let pool = self.pool.clone();
                async move { initial_subscription(&pool, &topic, &name).await }
            })
            .await
        {
            tracing::warn!(id = %entry.id, topic = %dead.topic, %error, "dead-lettering failed: nacked");
            let _ = self.nack_id(&entry.id);
            return Err(error);
        }
        self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        tracing::info!(id = %entry.id, topic = %dead.topic, "dead-lettered an undecodable entry");
        self.ack_id(&entry.id).await
    }

    /// The error of an undecodable entry taken by the application; its permits come back.
    fn undecodable(&self, entry: &Undecodable) -> Error {
        if let Some(partition) = self.partitions.get(entry.slot) {
            partition.consumed(entry.permits, &self.counters);
        }
        entry.error()
    }

    /// The error of a delivery that is not a message, remembered as why the deliveries
    /// ended.
    /// An undecodable entry's error does not end the deliveries.
    pub(crate) fn delivery_error(&self, delivery: Delivery) -> Error {
        let error = match delivery {
            Delivery::Undecodable(entry) => return self.undecodable(&entry),
            Delivery::Lost(error) => error,
            Delivery::Message(message) => Error::Invalid {
                what: "delivery",
                reason: format!("{} is a message, not an error", message.id()),
            },
        };
        self.ended.lock().get_or_insert(error.clone());
        error
    }

    /// Why the deliveries ended.
    pub(crate) fn ended_error(&self) -> Error {
        self.ended
            .lock()
            .clone()
            .unwrap_or(Error::Closed("the consumer"))
    }

    /// The next message the consumer hands over again itself, if any (for a consumer that
    /// orders the deliveries itself).
    pub(crate) fn take_again(&self) -> Option<Message> {
        self.again.pop()
    }

    /// Waits until a message is there for [`Consumer::take_again`].
    pub(crate) async fn again_ready(&self) {
        self.again.ready().await;
    }

    /// The receiver of the partitions' deliveries (for a consumer that orders them itself).
    pub(crate) fn deliveries(&self) -> &tokio::sync::Mutex<mpsc::Receiver<Delivery>> {
        &self.deliveries
    }

    /// The key its messages carry ([`Message`]'s origin).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    fn partition(&self, message: &Message) -> Result<Arc<PartitionConsumer>, Error> {
        if message.origin.consumer != self.key {
            return Err(Error::Invalid {
                what: "message",
                reason: format!(
                    "{} was delivered by another consumer; acknowledge it through that one",
                    message.id()
                ),
            });
        }
        self.partitions
            .get(message.origin.slot)
            .ok_or(Error::Closed("the consumer's partition"))
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.growth.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the consumer"));
        }
        self.pool.check_open()
    }

    /// Queues the ack of one message and returns without waiting for it to be sent; the
    /// group it joins goes out within the ack group time.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Consumer::close`]; [`Error::Invalid`] for a message of another
    /// consumer; [`Error::Ack`] when the message's batch size disagrees with an earlier one.
    pub async fn ack(&self, message: &Message) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return call_retry(retry, RetryCall::Ack(message)).await;
        }
        self.enqueue(message, false).await.map(drop)
    }

    /// The retry-letter topic's consumer, when it delivered `message`.
    fn retry_of(&self, message: &Message) -> Option<&Consumer> {
        self.retry
            .as_ref()
            .map(|retry| &*retry.consumer)
            .filter(|retry| message.origin.consumer == retry.key)
    }

    /// Acks one message and waits until its group was sent (with
    /// [`ConsumerOptions::ack_receipts`], until the broker confirmed it).
    ///
    /// # Errors
    /// As [`Consumer::ack`]; the broker's error for the ack frame ([`Error::Server`]) with
    /// receipts; connection errors.
    pub async fn ack_and_wait(&self, message: &Message) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return call_retry(retry, RetryCall::AckAndWait(message)).await;
        }
        for ticket in self.enqueue(message, false).await? {
            ticket
                .await
                .map_err(|e| crate::error::batcher_error(e, "the consumer's acks"))?;
        }
        Ok(())
    }

    /// Acknowledges every message up to and including this one (Exclusive and Failover
    /// subscriptions only), and returns without waiting for the ack to be sent.
    ///
    /// # Errors
    /// [`Error::Invalid`] on a Shared or Key_Shared subscription (the broker ignores
    /// cumulative acks there); as [`Consumer::ack`].
    pub async fn ack_cumulative(&self, message: &Message) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return call_retry(retry, RetryCall::AckCumulative(message)).await;
        }
        self.check_cumulative()?;
        self.enqueue(message, true).await.map(drop)
    }

    fn check_cumulative(&self) -> Result<(), Error> {
        if matches!(self.sub_type, SubType::Shared | SubType::KeyShared) {
            return Err(Error::Invalid {
                what: "cumulative ack",
                reason: format!(
                    "the broker ignores cumulative acks on a {:?} subscription",
                    self.sub_type
                ),
            });
        }
        Ok(())
    }

    /// Queues the acks of a message: a chunked message's earlier chunks too (a cumulative
    /// ack of its last chunk covers them).
    async fn enqueue(
        &self,
        message: &Message,
        cumulative: bool,
    ) -> Result<Vec<ack_batcher::Ticket<(), Error>>, Error> {
        self.check_open()?;
        let partition = self.partition(message)?;
        let slot = message.origin.slot;
        let mut tickets = Vec::new();
        if !cumulative {
            for chunk in message.chunks.iter() {
                tickets.extend(self.enqueue_at(slot, &partition, chunk, false).await?);
            }
        }
        tickets.extend(
            self.enqueue_at(slot, &partition, message.position(), cumulative)
                .await?,
        );
        Ok(tickets)
    }

    async fn enqueue_at(
        &self,
        slot: usize,
        partition: &Arc<PartitionConsumer>,
        position: &MessagePosition,
        cumulative: bool,
    ) -> Result<Option<ack_batcher::Ticket<(), Error>>, Error> {
        self.settled(slot, position, cumulative);
        let ack = {
            let mut tracker = partition.acks.lock();
            if cumulative {
                tracker.ack_cumulative(position)?
            } else {
                tracker.ack(position)?
            }
        };
        partition.acked_plainly(position);
        let Some(ack) = ack else {
            return Ok(None);
        };
        let key = AckKey { slot, cumulative };
        self.acks
            .enqueue(key, ack.id, ItemOptions::new())
            .await
            .map(Some)
            .map_err(|e| crate::error::batcher_error(e, "the consumer's acks"))
    }

    /// Acknowledges a message in a transaction: an independent set with the batch size (from
    /// [`txn_ack::TxnAckTracker`]), the transaction's bits and a request id. Registers the
    /// subscription with the coordinator (`ADD_SUBSCRIPTION_TO_TXN`) before the transaction's
    /// first ack on it.
    ///
    /// On a Shared or Key_Shared subscription, the ack of a message whose batch still has
    /// messages the application holds (received, or waiting to be, and not acknowledged) is
    /// **held back**: it goes out as soon as every other message of the batch is acknowledged
    /// (in a transaction or not), or with [`Transaction::commit`], and this call returns
    /// without waiting for it. So are the acks of a chunked message (until the commit), and of
    /// a message the broker may have given to another consumer ([`Consumer::held_elsewhere`]:
    /// until its copy comes back here; if none has by the commit, the commit fails). A 4.0.x broker would answer the abort of a transaction that
    /// acknowledged part of a batch by sending the whole batch again to any consumer, the
    /// messages this application still holds included; a held-back ack is never on the
    /// broker when its transaction aborts, and its message is handed to this consumer's
    /// application again ([`Message::redelivery_count`] one higher). Every other ack is sent
    /// at once and its `ACK_RESPONSE` awaited.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses the ack (for example `TransactionConflict`),
    /// naming the message and the transaction: the transaction then refuses to commit
    /// ([`Error::TransactionFailed`]) and must be aborted (a held-back ack refused at commit
    /// time fails the commit the same way); [`Error::Ack`] when the message is already
    /// acknowledged in this or another open or committed transaction (the broker would
    /// answer `TransactionConflict`); [`Error::Invalid`] when the transaction is not open;
    /// connection errors (retryable: the ack may or may not have reached the broker). After
    /// any error the transaction refuses to commit and must be aborted; after the abort the
    /// message is delivered again. A transactional ack waits for the consumer's new
    /// registration while it subscribes again after a lost connection or an unload (up to
    /// the operation timeout).
    pub async fn ack_in(&self, txn: &Transaction, message: &Message) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return call_retry(retry, RetryCall::AckIn(txn, message)).await;
        }
        self.txn_ack(txn, AckKind::Individual, message).await
    }

    /// Acknowledges every message up to and including this one in a transaction (Exclusive
    /// and Failover subscriptions only).
    ///
    /// # Errors
    /// As [`Consumer::ack_in`] and [`Consumer::ack_cumulative`].
    pub async fn ack_cumulative_in(
        &self,
        txn: &Transaction,
        message: &Message,
    ) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return call_retry(retry, RetryCall::AckCumulativeIn(txn, message)).await;
        }
        self.check_cumulative()?;
        self.txn_ack(txn, AckKind::Cumulative, message).await
    }

    async fn txn_ack(
        &self,
        txn: &Transaction,
        kind: AckKind,
        message: &Message,
    ) -> Result<(), Error> {
        self.check_open()?;
        let partition = self.partition(message)?;
        let op = txn.start_op()?;
        txn.join(Arc::clone(&partition) as Arc<dyn Participant>);
        let chunks = message.chunks.iter().map(|chunk| (chunk, false));
        let positions: Vec<(&MessagePosition, bool)> =
            chunks.chain([(message.position(), true)]).collect();
        if let Err(error) = txn
            .add_subscription(&partition.topic, &self.subscription)
            .await
        {
            // Nothing of the ack was sent; the transaction refuses to commit all the same,
            // and its abort hands the message over again.
            {
                let mut ledger = partition.ledger.lock();
                for (position, hand_over) in positions {
                    if let Ok(ack) = ledger.txn_acks.ack(txn.id(), kind, position) {
                        ledger.refused(HeldBackAck {
                            txn: txn.as_ref(),
                            ack,
                            message: message.clone(),
                            hand_over,
                        });
                    }
                }
            }
            let error = partition::refused_txn_ack(error, message.id(), txn.id());
            txn.failed(format!("the ack of message {}: {error}", message.id()));
            return Err(error);
        }
        // Each entry's ack is held back or taken to go out (with the acks held back for its
        // entry), counted in flight in the transaction; the count of this call is given up
        // before the acks wait to go out, so an abort of the transaction begun meanwhile
        // neither waits for them nor lets them out.
        let mut taken = Vec::with_capacity(positions.len());
        let mut refused = None;
        for (position, hand_over) in positions {
            match self.take_txn_ack(txn, kind, &partition, position, message, hand_over) {
                Ok(Some(outgoing)) => taken.push(outgoing),
                Ok(None) => {}
                Err(error) => {
                    refused.get_or_insert(error);
                }
            }
        }
        drop(op);
        let sent = taken
            .into_iter()
            .map(|outgoing| partition.send_txn_acks(outgoing));
        for answers in futures_util::future::join_all(sent).await {
            // The first answer is this ack's; the others are of acks held back for its entry.
            if let Some(Err(error)) = answers.into_iter().next() {
                refused.get_or_insert(error);
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Acknowledges one entry's message (`position`) of `message` in `txn`: holds the ack back
    /// (`None`), or takes it to go out with the acks held back for its entry, which it frees.
    fn take_txn_ack(
        &self,
        txn: &Transaction,
        kind: AckKind,
        partition: &PartitionConsumer,
        position: &MessagePosition,
        message: &Message,
        hand_over: bool,
    ) -> Result<Option<Vec<Outgoing>>, Error> {
        if partition.acks.lock().is_acked(position) {
            return Err(txn_ack::Error::AlreadyAcked {
                ledger_id: position.ledger_id(),
                entry_id: position.entry_id(),
                index: position.batch_index(),
            }
            .into());
        }
        self.settled(message.origin.slot, position, kind == AckKind::Cumulative);
        let mut ledger = partition.ledger.lock();
        let ack = ledger.txn_acks.ack(txn.id(), kind, position)?;
        let held = HeldBackAck {
            txn: txn.as_ref(),
            ack,
            message: message.clone(),
            hand_over,
        };
        // A transaction whose commit has begun sends at once: its commit may already have
        // taken what was held back. A message that may be with another consumer now waits
        // for its copy to come back here (or fails at the commit). A chunked message's acks
        // wait for the commit: an abort's copies of its chunks, arriving before the abort is
        // answered, cannot be kept for a new delivery as whole messages can.
        if partition.holds_back
            && kind == AckKind::Individual
            && txn.as_ref().is_open()
            && (!ledger.entry_is_free(position)
                || !message.chunks.is_empty()
                || partition.held_elsewhere(&ledger, message))
        {
            ledger.hold_back(held);
            self.counters.acks_held_back.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let others = ledger.take_entry(&position.entry());
        Ok(Some(
            std::iter::once(Outgoing::new(held)).chain(others).collect(),
        ))
    }

    /// Whether the broker may have handed `message` to another consumer of the subscription
    /// since this one delivered it: this consumer's link was lost or closed since (a broker
    /// restart, an unload, a network fault), the broker then gives everything the lost
    /// registration held to any consumer, and no copy of the message came back here. No
    /// client request can prevent that; on a Shared or Key_Shared subscription the
    /// application should treat such a message as possibly processed elsewhere: a
    /// transactional ack of it waits for its copy to come back and fails the commit if none
    /// did ([`Consumer::ack_in`]). Counted in [`ConsumerStats::held_at_link_loss`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for a message of another consumer.
    pub fn held_elsewhere(&self, message: &Message) -> Result<bool, Error> {
        if let Some(retry) = self.retry_of(message) {
            return retry.held_elsewhere(message);
        }
        let partition = self.partition(message)?;
        let ledger = partition.ledger.lock();
        Ok(partition.held_elsewhere(&ledger, message))
    }

    /// Gives a message back for a new delivery: asks the broker to deliver its entry again
    /// (`REDELIVER_UNACKNOWLEDGED_MESSAGES` with its id; messages of the entry acknowledged
    /// before are skipped on redelivery), which on a Shared or Key_Shared subscription may be
    /// to any consumer. A message in a batch of more than one on a Shared or Key_Shared
    /// subscription is handed to this consumer's application again instead
    /// ([`Message::redelivery_count`] one higher), since the broker would send the whole
    /// batch again to any consumer, the messages of it this application still holds
    /// included.
    ///
    /// # Errors
    /// As [`Consumer::ack`]; connection errors.
    pub fn nack(&self, message: &Message) -> Result<(), Error> {
        if let Some(retry) = self.retry_of(message) {
            return retry.nack(message);
        }
        self.check_open()?;
        let partition = self.partition(message)?;
        self.settled(message.origin.slot, message.position(), false);
        self.counters.nacks.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::clone(&self.counters);
        let message = message.clone();
        self.nack_after(message.redelivery_count(), &partition, move |partition| {
            partition.nack_message(&message, &counters)
        })
    }

    /// Hands `message` back after `delay` through the retry-letter topic (the Java client's
    /// `reconsumeLater`; needs [`ConsumerOptions::enable_retry`]): publishes it there, to be
    /// delivered after `delay` (Shared and Key_Shared subscriptions), with the Java client's
    /// properties ([`RECONSUME_TIMES`], [`DELAY_TIME`], [`REAL_TOPIC`], [`ORIGIN_MESSAGE_ID`],
    /// [`REAL_SUBSCRIPTION`]), then acknowledges it. Once it was reconsumed more times than
    /// the dead-letter policy's maximum, it goes to the dead-letter topic instead. The
    /// message comes back through [`Consumer::receive`] (from the retry topic) with its
    /// properties; a Java consumer with `enableRetry` on the same subscription reads it too.
    ///
    /// # Errors
    /// [`Error::Invalid`] without retry enabled, for a message of another consumer, or a
    /// delay beyond what a delivery time can say; the producer's errors (nothing was
    /// acknowledged then: the message stays with the application, which may try again).
    pub async fn reconsume_later(&self, message: &Message, delay: Duration) -> Result<(), Error> {
        self.check_open()?;
        let (Some(retry), Some(dead)) = (&self.retry, &self.dead_letters) else {
            return Err(Error::Invalid {
                what: "reconsume_later",
                reason: "retry is not enabled: subscribe with ConsumerOptions::enable_retry(true)"
                    .into(),
            });
        };
        if message.origin.consumer != self.key && self.retry_of(message).is_none() {
            return Err(Error::Invalid {
                what: "message",
                reason: format!(
                    "{} was delivered by another consumer; reconsume it through that one",
                    message.id()
                ),
            });
        }
        let letter = retry::letter(message, &self.subscription, delay);
        let subscribe = |topic: String, name: String| {
            let pool = self.pool.clone();
            async move { initial_subscription(&pool, &topic, &name).await }
        };
        if dead.is_due(letter.times) {
            dead.publish(&self.pool, letter.message, subscribe).await?;
            self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        } else {
            let mut outgoing = letter.message;
            if !delay.is_zero() {
                outgoing = outgoing.deliver_after(delay);
                outgoing.deliver_at_time()?;
            }
            retry
                .letters
                .publish(&self.pool, outgoing, subscribe)
                .await?;
        }
        self.ack(message).await
    }

    /// Runs `nack` on `partition` after the nack backoff of `redelivery_count` (at once
    /// without one); a delayed nack's failure is logged (the partition may be gone).
    fn nack_after(
        &self,
        redelivery_count: u32,
        partition: &Arc<PartitionConsumer>,
        nack: impl FnOnce(&PartitionConsumer) -> Result<(), Error> + Send + 'static,
    ) -> Result<(), Error> {
        let delay = self.options.nack_backoff.map_or(Duration::ZERO, |backoff| {
            backoff.delay_for(redelivery_count)
        });
        if delay.is_zero() {
            return nack(partition);
        }
        let partition = Arc::downgrade(partition);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(partition) = partition.upgrade()
                && let Err(error) = nack(&partition)
            {
                tracing::debug!(%error, "a delayed nack could not be sent");
            }
        });
        Ok(())
    }

    /// The partition slot and position of a message id of this consumer's topic.
    fn locate(
        &self,
        id: &MessageId,
    ) -> Result<(usize, Arc<PartitionConsumer>, MessagePosition), Error> {
        let slot = if self.partitioned {
            usize::try_from(id.partition).map_err(|_| Error::Invalid {
                what: "message id",
                reason: format!(
                    "{id} names no partition of the partitioned topic {}",
                    self.topic
                ),
            })?
        } else {
            0
        };
        let partition = self.partitions.get(slot).ok_or_else(|| Error::Invalid {
            what: "message id",
            reason: format!("{id}: the topic {} has no partition {slot}", self.topic),
        })?;
        let entry = EntryId {
            ledger_id: id.ledger_id,
            entry_id: id.entry_id,
        };
        let size = match id.batch_size {
            Some(size) => Some(i32::try_from(size).map_err(|_| Error::Invalid {
                what: "message id",
                reason: format!("{id}: batch size {size} is out of range"),
            })?),
            None => None,
        };
        let position = MessagePosition::received(entry, partition.partition, size, id.batch_index)?;
        Ok((slot, partition, position))
    }

    /// Queues the ack of a message by its id (for example the id of an
    /// [`Error::Undecodable`] entry, which acknowledges the whole entry) and returns without
    /// waiting for it to be sent.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Consumer::close`]; [`Error::Invalid`] for an id that names no
    /// partition of this consumer; [`Error::Ack`] as [`Consumer::ack`].
    pub async fn ack_id(&self, id: &MessageId) -> Result<(), Error> {
        self.check_open()?;
        let (slot, partition, position) = self.locate(id)?;
        for other in partition.entries_with(&position) {
            self.enqueue_at(slot, &partition, &other, false).await?;
        }
        self.enqueue_at(slot, &partition, &position, false)
            .await
            .map(drop)
    }

    /// Asks the broker to deliver the entry of this id again, as [`Consumer::nack`] (for
    /// example an [`Error::Undecodable`] entry: its redelivery count grows).
    ///
    /// # Errors
    /// As [`Consumer::ack_id`]; connection errors.
    pub fn nack_id(&self, id: &MessageId) -> Result<(), Error> {
        self.check_open()?;
        let (slot, partition, position) = self.locate(id)?;
        self.settled(slot, &position, false);
        self.counters.nacks.fetch_add(1, Ordering::Relaxed);
        let mut positions = partition.entries_with(&position);
        positions.push(position);
        // Its count is not known here: the backoff's first delay.
        self.nack_after(0, &partition, move |partition| {
            positions
                .iter()
                .try_for_each(|position| partition.nack_at(position))
        })
    }

    /// Asks the broker to deliver everything unacknowledged again, on every partition
    /// (`REDELIVER_UNACKNOWLEDGED_MESSAGES` without ids). On a Shared or Key_Shared
    /// subscription the broker sends them to *any* consumer: call it only for messages the
    /// application no longer works on. Transactional acks still held back (of messages in
    /// partly held batches) are given up with their messages: their transactions fail to
    /// commit (abort them), since another consumer may commit the same messages.
    ///
    /// # Errors
    /// [`Error::Closed`]; connection errors.
    pub fn redeliver_unacknowledged(&self) -> Result<(), Error> {
        self.check_open()?;
        if let Some(timeouts) = &self.timeouts {
            timeouts.clear();
        }
        for partition in self.partitions.all().iter() {
            let mut ledger = partition.ledger.lock();
            partition.redeliver(Vec::new())?;
            ledger.deliveries.redelivery_requested();
            for Outgoing { mut held, .. } in ledger.take_all() {
                held.txn.failed(format!(
                    "the ack of message {}: the application asked for everything \
                     unacknowledged again before it went out",
                    held.message.id()
                ));
                held.hand_over = false;
                ledger.refused(held);
            }
        }
        Ok(())
    }

    /// Sends the grouped acks now and waits until they are sent.
    pub async fn flush_acks(&self) {
        self.acks.flush_all().await;
    }

    /// The connection and consumer id behind a message (for users:
    /// [`crate::wire::ConsumerExt::wire_of`]).
    #[cfg_attr(not(feature = "unstable-wire"), allow(dead_code))]
    pub(crate) fn wire_of(&self, message: &Message) -> Result<(Connection, u64), Error> {
        let partition = self.partition(message)?;
        let link = partition.link();
        Ok((link.connection, link.consumer_id))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ConsumerStats {
        let c = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConsumerStats {
            received: load(&c.received),
            skipped: load(&c.skipped),
            undecodable: load(&c.undecodable),
            checksum_mismatches: load(&c.checksum_mismatches),
            dead_lettered: load(&c.dead_lettered),
            chunked: load(&c.chunked),
            chunks_dropped: load(&c.chunks_dropped),
            flow_frames: load(&c.flow_frames),
            ack_frames: load(&c.ack_frames),
            acked_ids: load(&c.acked_ids),
            txn_acks: load(&c.txn_acks),
            nacks: load(&c.nacks),
            committed_redeliveries: load(&c.committed_redeliveries),
            duplicates: load(&c.duplicates),
            unblocks: load(&c.unblocks),
            redelivery_requests: load(&c.redelivery_requests),
            acks_held_back: load(&c.acks_held_back),
            handed_again: load(&c.handed_again),
            ack_timeouts: load(&c.ack_timeouts),
            held_at_link_loss: load(&c.held_at_link_loss),
            reconnects: load(&c.reconnects),
            moved: load(&c.moved),
            acks_resent: load(&c.acks_resent),
            closed_by_broker: c.closed_by_broker.load(Ordering::Relaxed),
            reached_end_of_topic: c.reached_end_of_topic.load(Ordering::Relaxed),
        }
    }

    /// Sends the pending acks (closing the ack batcher), waiting for them at most
    /// `deadline`, then closes the consumer on the broker (`CLOSE_CONSUMER`) and stops
    /// delivering. Returns what became of the acks that were pending
    /// ([`crate::DEFAULT_CLOSE_DEADLINE`] is a deadline for callers without one of their
    /// own). A second close returns at once with an empty report; every call after close
    /// fails with [`Error::Closed`].
    ///
    /// # Errors
    /// The first `CLOSE_CONSUMER` failure (none when the broker had closed it already); every
    /// partition is closed anyway (the broker forgets the subscription's consumer when the
    /// connection ends), and the acks were handled as the report would have said.
    pub async fn close(&self, deadline: Duration) -> Result<ConsumerCloseReport, Error> {
        if self.growth.closed.swap(true, Ordering::AcqRel) {
            return Ok(ConsumerCloseReport::default());
        }
        let started = tokio::time::Instant::now();
        // A refresh under way subscribes its partition before the partitions are closed.
        drop(self.growth.refresh.lock().await);
        let acks = self
            .acks
            .close(crate::close::remaining(deadline, started))
            .await;
        let mut report = ConsumerCloseReport::from_acks(&acks);
        let closed_by_broker = self.counters.closed_by_broker.load(Ordering::Relaxed);
        let mut result = Ok(());
        for partition in self.partitions.all().iter() {
            if let Err(error) = partition.close().await
                && result.is_ok()
                && !closed_by_broker
            {
                result = Err(error);
            }
        }
        for task in self.growth.tasks.lock().iter() {
            task.abort();
        }
        self.links.close_all(&self.topic);
        if let Some(retry) = &self.retry {
            match close_retry(&retry.consumer, crate::close::remaining(deadline, started)).await {
                Ok(retried) => report.add(&retried),
                Err(error) if result.is_ok() => result = Err(error),
                Err(_) => {}
            }
        }
        result.map(|()| report)
    }
}

/// Creates the durable subscription `name` on the dead-letter `topic`, from the earliest
/// message: subscribing creates it, and it stays after the consumer closes.
async fn initial_subscription(pool: &Pool, topic: &str, name: &str) -> Result<(), Error> {
    let consumer = Consumer::subscribe(
        pool,
        topic,
        name,
        ConsumerOptions::default().initial_position(InitialPosition::Earliest),
    )
    .await?;
    consumer
        .close(crate::DEFAULT_CLOSE_DEADLINE)
        .await
        .map(drop)
}

impl Drop for Consumer {
    fn drop(&mut self) {
        for task in self.growth.tasks.lock().iter() {
            task.abort();
        }
        for partition in self.partitions.all().iter() {
            partition.unregister();
        }
    }
}

#[async_trait::async_trait]
impl crate::MessageConsumer for Consumer {
    async fn receive(&self) -> Result<Message, Error> {
        Consumer::receive(self).await
    }

    async fn ack(&self, message: &Message) -> Result<(), Error> {
        Consumer::ack(self, message).await
    }

    fn nack(&self, message: &Message) -> Result<(), Error> {
        Consumer::nack(self, message)
    }

    async fn refresh_partitions(&self) -> Result<usize, Error> {
        Consumer::refresh_partitions(self).await
    }

    async fn close(&self, deadline: Duration) -> Result<ConsumerCloseReport, Error> {
        Consumer::close(self, deadline).await
    }

    fn has_ended(&self) -> bool {
        Consumer::has_ended(self)
    }

    fn topic(&self) -> &str {
        Consumer::topic(self)
    }
}
