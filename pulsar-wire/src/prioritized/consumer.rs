//! [`PriorityConsumer`]: per-partition consumers whose `FLOW` permits the gate withholds and
//! grants, merged into one stream in the gate's order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::mq_priority::{
    Gate, GateConfig, GateStats, LayoutSpec, PartitionControl, PriorityPolicy, Strategy,
};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::consumer::{Delivery, EndPosition, QueueSizing};
use crate::{
    Client, Consumer, ConsumerOptions, ConsumerStats, Error, Message, MessageConsumer, Transaction,
};

/// How often the consumer re-evaluates time-based decisions (aging) by default.
///
/// Under [`Strategy::StrictAging`] the consumer ticks at least every `max_wait / 4` (at least
/// 1 ms) whatever the configured tick, so that a paused level is resumed before it is due
/// (see [`PriorityConsumerOptions::tick`]).
pub const DEFAULT_TICK: Duration = Duration::from_millis(100);

/// The smallest tick period.
const MIN_TICK: Duration = Duration::from_millis(1);

/// The longest tick period (a longer one is taken as this).
const MAX_TICK: Duration = Duration::from_secs(3600);

/// The tick period the maintenance task uses: the configured one, capped at `max_wait / 4`
/// (at least [`MIN_TICK`]) under [`Strategy::StrictAging`].
fn tick_period(configured: Duration, strategy: &Strategy) -> Duration {
    match strategy {
        Strategy::StrictAging { max_wait } => configured.min((*max_wait / 4).max(MIN_TICK)),
        _ => configured,
    }
    .clamp(MIN_TICK, MAX_TICK)
}

/// How a [`PriorityConsumer`] subscribes and decides.
#[derive(Debug, Clone)]
pub struct PriorityConsumerOptions {
    consumer: ConsumerOptions,
    policy: PriorityPolicy,
    layout: LayoutSpec,
    gate: GateConfig,
    partitions_refresh: Option<Duration>,
    tick: Duration,
}

impl PriorityConsumerOptions {
    /// The policy and layout the producers use; [`ConsumerOptions::default`],
    /// [`GateConfig::default`], partitions re-read every
    /// [`crate::DEFAULT_PARTITIONS_REFRESH`], ticks every [`DEFAULT_TICK`].
    pub fn new(policy: PriorityPolicy, layout: LayoutSpec) -> Self {
        Self {
            consumer: ConsumerOptions::default(),
            policy,
            layout,
            gate: GateConfig::default(),
            partitions_refresh: Some(crate::DEFAULT_PARTITIONS_REFRESH),
            tick: DEFAULT_TICK,
        }
    }

    /// The options of the per-partition consumers. Two of them are replaced: the receiver
    /// queue size (each partition gets [`Gate::suggested_queue_size`], from the gate settings)
    /// and [`ConsumerOptions::partitions_refresh`] (the priority consumer re-reads the
    /// partition count itself, every [`PriorityConsumerOptions::partitions_refresh`], so that
    /// the gate learns of new partitions before their consumers start).
    #[must_use]
    pub fn consumer(mut self, options: ConsumerOptions) -> Self {
        self.consumer = options;
        self
    }

    /// The gate's settings: strategy, receiver queue of the most important level, queue
    /// sizing of the others, watermarks.
    #[must_use]
    pub fn gate(mut self, config: GateConfig) -> Self {
        self.gate = config;
        self
    }

    /// How often the partition count is re-read (`PARTITIONED_METADATA`) to subscribe to new
    /// partitions (default [`crate::DEFAULT_PARTITIONS_REFRESH`]; `None`: only on
    /// [`PriorityConsumer::refresh_partitions`]). A period must be in
    /// [`crate::MIN_PARTITIONS_REFRESH`]`..=`[`crate::MAX_PARTITIONS_REFRESH`]:
    /// [`PriorityConsumerBuilder::build`](crate::prioritized::PriorityConsumerBuilder::build) refuses others (zero included) with [`Error::Invalid`]
    /// naming `partitions_refresh`.
    #[must_use]
    pub fn partitions_refresh(mut self, every: Option<Duration>) -> Self {
        self.partitions_refresh = every;
        self
    }

    /// How often [`Gate::tick`] runs (for [`Strategy::StrictAging`]; default
    /// [`DEFAULT_TICK`]). A period below 1 ms is taken as 1 ms, one above an hour as an hour.
    ///
    /// Under [`Strategy::StrictAging`]` { max_wait }` the consumer ticks at the smaller of
    /// this and `max_wait / 4` (at least 1 ms), whatever is configured here: the gate resumes
    /// a paused level once it has waited `max_wait / 2`, and a tick of at most `max_wait / 4`
    /// is what keeps that resume early enough for the level's messages to be buffered by the
    /// time it is due (the bound of [`Strategy::StrictAging`]). The cap follows the live
    /// strategy, also after [`PriorityConsumer::set_strategy`]; see
    /// [`PriorityConsumer::tick_period`].
    #[must_use]
    pub fn tick(mut self, every: Duration) -> Self {
        self.tick = every.clamp(MIN_TICK, MAX_TICK);
        self
    }

    /// Checks every option before anything is asked of the broker.
    fn validate(&self) -> Result<(), Error> {
        if self.consumer.ack_timeout.is_some() {
            return Err(Error::Invalid {
                what: "ack_timeout",
                reason: "the priority consumer does not apply an ack timeout: leave it unset \
                         (nack what the application gives up on)"
                    .into(),
            });
        }
        if self.consumer.retry {
            return Err(Error::Invalid {
                what: "enable_retry",
                reason: "the priority consumer does not read a retry-letter topic: leave retry \
                         off (nack, or publish to a topic of the priority you want)"
                    .into(),
            });
        }
        crate::producer::check_partitions_refresh(self.partitions_refresh)?;
        self.layout.validate(&self.policy)?;
        self.gate.validate(&self.policy)?;
        Ok(())
    }
}

/// A consumer of a partitioned topic that hands out messages of more important levels first.
///
/// One consumer per partition is subscribed with the receiver queue the [`Gate`] suggests for
/// the partition's level. Each message a partition's consumer buffers is an arrival at the
/// gate; [`PriorityConsumer::receive`] takes the next message from the partition the gate
/// picks (by its [`::mq_priority::Strategy`]) and counts the delivery; the permit of a delivered
/// message goes back to its partition, unless the gate paused the partition, whose `FLOW`
/// permits are then withheld until it resumes. Acks and nacks pass through to the partition's
/// consumer and are only counted by the gate: no decision waits for them.
///
/// When the topic gains partitions (re-read every
/// [`PriorityConsumerOptions::partitions_refresh`] or on
/// [`PriorityConsumer::refresh_partitions`]; [`super::follow_growth`] refreshes a producer
/// first), the gate's layout is extended and the new partitions are subscribed; an existing
/// partition never changes level. Under [`GateConfig::growth_hold`] the consumer asks each old
/// partition where it ends (`GET_LAST_MESSAGE_ID`) and holds the new partitions of a grown
/// level until every old partition of that level has handed out its message at that point
/// (or the hold's time is up), so a key the producers moved keeps its order; producers that
/// refresh after the consumer saw the growth are not covered.
///
/// At subscription the lower levels start paused (the gate's cold start) until the more
/// important levels had their first arrival or are known to have nothing to read (the
/// partitions' last message ids), so a consumer starting on a backlog gets the urgent
/// messages' receiver queues first.
#[derive(Debug)]
pub struct PriorityConsumer {
    inner: Arc<Inner>,
    receiving: tokio::sync::Mutex<()>,
    tasks: Vec<JoinHandle<()>>,
    /// The error a batch receive met after gathering messages, for the next one.
    deferred: Mutex<Option<Error>>,
}

#[derive(Debug)]
struct Inner {
    consumer: Consumer,
    /// The level of each partition of the gate, for the metrics.
    levels: Levels,
    state: Mutex<State>,
    /// Signalled when something arrives (a message, an error, the end), or when the
    /// decisions may have changed (a new strategy).
    arrived: Notify,
    closed: AtomicBool,
    /// The configured tick ([`PriorityConsumerOptions::tick`]), before the aging cap.
    tick: Duration,
    /// Wakes the maintenance task to re-read its tick period (after a strategy change).
    retick: Arc<Notify>,
}

#[derive(Debug)]
struct State {
    gate: Gate,
    /// Buffered messages per partition.
    buffers: Vec<VecDeque<Message>>,
    /// Messages of partitions the gate does not know (none unless the gate and the consumer
    /// disagree on the partition count); delivered first.
    strays: VecDeque<Message>,
    /// Errors of partitions (connection lost, consumer closed by the broker), reported once.
    errors: VecDeque<Error>,
    /// Every partition's deliveries ended.
    finished: bool,
    /// Per partition, the (ledger, entry) it ended at when a growth was seen, while the
    /// growth hold waits for it to be delivered.
    drain_points: Vec<Option<(u64, u64)>>,
    /// Per partition, the (ledger, entry) of the last entry handed to the application whole.
    last_delivered: Vec<Option<(u64, u64)>>,
}

impl State {
    /// `partition` handed out the message `id`: a drain point it reached is reported to the
    /// gate. The point is an entry; a batch entry is reached with its last message.
    fn delivered_at(
        &mut self,
        partition: u32,
        id: &crate::MessageId,
        now: std::time::Instant,
        control: &mut dyn PartitionControl,
    ) {
        let slot = partition as usize;
        let position = (id.ledger_id, id.entry_id);
        let whole = id
            .batch_size
            .is_none_or(|size| i64::from(id.batch_index) + 1 >= i64::from(size));
        if self.last_delivered.len() <= slot {
            self.last_delivered.resize(slot + 1, None);
        }
        if whole {
            self.last_delivered[slot] = Some(position);
        }
        if let Some(point) = self.drain_points.get_mut(slot)
            && point.is_some_and(|p| position > p || (position == p && whole))
        {
            *point = None;
            self.gate.drained(partition, now, control);
        }
    }
}

/// Per partition, its level as the metrics name it, beside the gate: a pause names the level
/// while the gate, which knows it, is borrowed by the call that paused.
#[derive(Debug, Default)]
struct Levels(parking_lot::RwLock<Vec<Option<u8>>>);

impl Levels {
    /// Takes the levels of every partition of `gate` (after its partition count changed).
    fn update(&self, gate: &Gate) {
        *self.0.write() = (0..gate.partitions())
            .map(|p| gate.level_of(p).map(|level| level.get()))
            .collect();
    }

    fn get(&self, partition: u32) -> Option<u8> {
        self.0.read().get(partition as usize).copied().flatten()
    }
}

/// Pauses and resumes partitions by withholding and granting their `FLOW` permits.
struct Permits<'a> {
    consumer: &'a Consumer,
    levels: &'a Levels,
}

impl<'a> Permits<'a> {
    fn new(consumer: &'a Consumer, levels: &'a Levels) -> Self {
        Self { consumer, levels }
    }
}

impl PartitionControl for Permits<'_> {
    fn pause(&mut self, partition: u32) {
        // A partition not subscribed yet starts in the gate's state when it is.
        if let Some(p) = self.consumer.partition_at(partition as usize)
            && p.pause()
        {
            crate::metrics::priority_held(self.levels.get(partition));
        }
    }

    fn resume(&mut self, partition: u32) {
        if let Some(p) = self.consumer.partition_at(partition as usize) {
            p.resume(self.consumer.counters());
        }
    }
}

impl PriorityConsumer {
    /// Subscribes to every partition of `topic` as `subscription`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad options (checked first, before any request:
    /// `partitions_refresh` out of range, an ack timeout, retry) or when the topic is not
    /// partitioned; [`Error::Priority`] for bad gate settings or layout (also checked first:
    /// [`GateConfig::validate`], [`LayoutSpec::validate`]) or a layout that does not fit the
    /// partition count; the errors of [`crate::ConsumerBuilder::build`].
    #[deprecated(
        since = "0.2.0",
        note = "use `PriorityConsumer::builder(&client, topic, subscription, policy, layout)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn subscribe(
        client: &Client,
        topic: &str,
        subscription: &str,
        options: PriorityConsumerOptions,
    ) -> Result<Self, Error> {
        Self::open(client, topic, subscription, options).await
    }

    /// Subscribes: what [`crate::PriorityConsumerBuilder::build`] does.
    pub(crate) async fn open(
        client: &Client,
        topic: &str,
        subscription: &str,
        options: PriorityConsumerOptions,
    ) -> Result<Self, Error> {
        options.validate()?;
        let topic = crate::topic_name(topic)?;
        let partitions = client.partitions(&topic).await?;
        if partitions == 0 {
            return Err(Error::Invalid {
                what: "topic",
                reason: format!(
                    "{topic} is not partitioned; priority levels live on partitions, so \
                     create a partitioned topic with at least one partition per level"
                ),
            });
        }
        let mut gate = Gate::new(options.policy, options.layout, partitions, options.gate)?;
        let levels = Levels::default();
        levels.update(&gate);
        // The first event starts the gate's cold start: lower levels are subscribed paused.
        gate.tick(super::clock::now(), &mut ::mq_priority::NoControl);
        let fallback = gate.config().receiver_queue_size();
        let consumer = {
            let gate = &gate;
            let sizing = move |p: u32| {
                (
                    gate.suggested_queue_size(p).unwrap_or(fallback),
                    gate.is_paused(p).unwrap_or(false),
                )
            };
            // The priority consumer follows the partition count itself (its gate learns of
            // each partition first).
            Consumer::subscribe_sized(
                client.pool(),
                &topic,
                subscription,
                options.consumer.partitions_refresh(None),
                &sizing,
            )
            .await?
        };
        // The topic may have grown between the two reads of its partition count.
        let subscribed = consumer.partitions() as u32;
        if subscribed > gate.partitions() {
            let mut control = Permits::new(&consumer, &levels);
            gate.set_partitions(subscribed, super::clock::now(), &mut control)?;
            levels.update(&gate);
        }
        // The cold start need not wait for partitions above the lowest level that have
        // nothing to read.
        let lowest = gate.policy().lowest();
        let ends = end_positions(&consumer, 0..gate.partitions()).await;
        let mut control = Permits::new(&consumer, &levels);
        for (p, end) in (0..gate.partitions()).zip(ends) {
            match end {
                Ok(end) if !end.readable && gate.level_of(p) != Some(lowest) => {
                    gate.set_known_empty(p, super::clock::now(), &mut control);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(partition = p, %error, "where the partition ends is unknown")
                }
            }
        }
        let state = State {
            buffers: (0..gate.partitions()).map(|_| VecDeque::new()).collect(),
            gate,
            strays: VecDeque::new(),
            errors: VecDeque::new(),
            finished: false,
            drain_points: Vec::new(),
            last_delivered: Vec::new(),
        };
        let inner = Arc::new(Inner {
            consumer,
            levels,
            state: Mutex::new(state),
            arrived: Notify::new(),
            closed: AtomicBool::new(false),
            tick: options.tick,
            retick: Arc::new(Notify::new()),
        });
        let tasks = vec![
            tokio::spawn(forward(Arc::clone(&inner))),
            tokio::spawn(maintain(
                Arc::downgrade(&inner),
                Arc::clone(&inner.retick),
                options.partitions_refresh,
            )),
        ];
        Ok(Self {
            inner,
            receiving: tokio::sync::Mutex::new(()),
            tasks,
            deferred: Mutex::new(None),
        })
    }

    /// The topic's full name.
    pub fn topic(&self) -> &str {
        self.inner.consumer.topic()
    }

    /// The number of partitions subscribed.
    pub fn partitions(&self) -> usize {
        self.inner.consumer.partitions()
    }

    /// The messages in the gate's order as a [`futures_util::Stream`], each item what
    /// [`PriorityConsumer::receive`] returns; it ends once the consumer is closed
    /// ([`crate::Messages`]).
    pub fn stream(&self) -> crate::Messages<'_> {
        crate::Messages::new(self)
    }

    /// Receives a batch in the gate's order, as [`crate::Consumer::batch_receive`] does.
    ///
    /// # Errors
    /// [`Error::Invalid`] for limits that allow nothing; what
    /// [`PriorityConsumer::receive`] returns.
    pub async fn batch_receive(&self, limits: crate::BatchReceive) -> Result<Vec<Message>, Error> {
        crate::receiving::batch_receive(self, limits, &self.deferred).await
    }

    /// Waits for the next message: the one the gate picks among the buffered messages of
    /// every partition (the most important level first, by the strategy).
    ///
    /// # Errors
    /// A partition's [`Error::ConnectionLost`] or [`Error::Closed`] (broker-closed consumer),
    /// once each, its messages stopping; [`Error::Closed`] after [`PriorityConsumer::close`]
    /// or once every partition ended and nothing is buffered.
    pub async fn receive(&self) -> Result<Message, Error> {
        let _one = self.receiving.lock().await;
        loop {
            if let Some(result) = self.inner.take_next() {
                return result;
            }
            self.inner.arrived.notified().await;
        }
    }

    /// A buffered message if there is one now, without waiting.
    ///
    /// # Errors
    /// As [`PriorityConsumer::receive`].
    pub fn try_receive(&self) -> Option<Result<Message, Error>> {
        self.inner.take_next()
    }

    /// Queues the ack of a message (see [`Consumer::ack`]).
    ///
    /// # Errors
    /// As [`Consumer::ack`].
    pub async fn ack(&self, message: &Message) -> Result<(), Error> {
        self.inner.consumer.ack(message).await?;
        self.inner.counted(message, Gate::on_ack);
        Ok(())
    }

    /// Acks a message and waits until its group was sent (see [`Consumer::ack_and_wait`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_and_wait`].
    pub async fn ack_and_wait(&self, message: &Message) -> Result<(), Error> {
        self.inner.consumer.ack_and_wait(message).await?;
        self.inner.counted(message, Gate::on_ack);
        Ok(())
    }

    /// Acknowledges every message of the message's partition up to and including it
    /// (Exclusive and Failover subscriptions; see [`Consumer::ack_cumulative`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_cumulative`].
    pub async fn ack_cumulative(&self, message: &Message) -> Result<(), Error> {
        self.inner.consumer.ack_cumulative(message).await?;
        self.inner.counted(message, Gate::on_ack);
        Ok(())
    }

    /// Acknowledges a message in a transaction (see [`Consumer::ack_in`]).
    ///
    /// # Errors
    /// As [`Consumer::ack_in`].
    pub async fn ack_in(&self, txn: &Transaction, message: &Message) -> Result<(), Error> {
        self.inner.consumer.ack_in(txn, message).await?;
        self.inner.counted(message, Gate::on_ack);
        Ok(())
    }

    /// Asks for the message's redelivery (see [`Consumer::nack`]). It comes back on its
    /// partition, so at its level.
    ///
    /// # Errors
    /// As [`Consumer::nack`].
    pub fn nack(&self, message: &Message) -> Result<(), Error> {
        self.inner.consumer.nack(message)?;
        self.inner.counted(message, Gate::on_nack);
        Ok(())
    }

    /// Sends the grouped acks now and waits until they are sent.
    pub async fn flush_acks(&self) {
        self.inner.consumer.flush_acks().await;
    }

    /// Re-reads the partition count, recomputes the gate's layout and subscribes the new
    /// partitions (each with its level's receiver queue, paused if its level is). Returns the
    /// partition count.
    ///
    /// # Errors
    /// [`Error::Priority`] when the layout does not cover the new count (nothing is
    /// subscribed then; the producers' router refuses those partitions too); the errors of
    /// [`Consumer::refresh_partitions`].
    pub async fn refresh_partitions(&self) -> Result<usize, Error> {
        self.inner.refresh_partitions().await
    }

    /// Changes the strategy of the live gate (see [`Gate::set_strategy`]): buffered messages
    /// and counters stay, the next [`PriorityConsumer::receive`] decides by the new strategy,
    /// and partitions are paused or resumed (their `FLOW` permits withheld or granted) as it
    /// requires. A waiting `receive` is woken, since a message the old strategy held back may
    /// now be due, and the maintenance tick follows the new strategy (see
    /// [`PriorityConsumerOptions::tick`]).
    ///
    /// # Errors
    /// [`Error::Priority`] for a strategy the gate refuses (shares of the wrong length or
    /// zero, a zero `max_wait`); nothing changes then.
    pub fn set_strategy(&self, strategy: Strategy) -> Result<(), Error> {
        {
            let mut state = self.inner.state.lock();
            let mut control = Permits::new(&self.inner.consumer, &self.inner.levels);
            state
                .gate
                .set_strategy(strategy, super::clock::now(), &mut control)?;
        }
        self.inner.arrived.notify_one();
        self.inner.retick.notify_one();
        Ok(())
    }

    /// The gate's settings now (the strategy included, as [`PriorityConsumer::set_strategy`]
    /// last set it).
    pub fn gate_config(&self) -> GateConfig {
        self.inner.state.lock().gate.config().clone()
    }

    /// How often the gate is ticked now: [`PriorityConsumerOptions::tick`], capped at
    /// `max_wait / 4` (at least 1 ms) under [`Strategy::StrictAging`].
    pub fn tick_period(&self) -> Duration {
        self.inner.tick_period()
    }

    /// The gate's counters and per-level state.
    pub fn gate_stats(&self) -> GateStats {
        self.inner.state.lock().gate.stats()
    }

    /// The partitions whose permits the gate withholds now.
    pub fn paused_partitions(&self) -> Vec<u32> {
        let state = self.inner.state.lock();
        (0..state.gate.partitions())
            .filter(|&p| state.gate.is_paused(p) == Some(true))
            .collect()
    }

    /// The receiver queue (permits granted at subscription) of every partition's consumer.
    pub fn queue_sizes(&self) -> Vec<u32> {
        self.inner.consumer.queue_sizes()
    }

    /// Messages buffered per partition, not yet received.
    pub fn buffered(&self) -> Vec<usize> {
        let state = self.inner.state.lock();
        state.buffers.iter().map(VecDeque::len).collect()
    }

    /// The counters of the per-partition consumers (see [`Consumer::stats`]).
    pub fn stats(&self) -> ConsumerStats {
        self.inner.consumer.stats()
    }

    /// The link state of every partition's consumer, by partition (see [`Consumer::state`]).
    pub fn state(&self) -> tokio::sync::watch::Receiver<crate::LinkStates> {
        self.inner.consumer.state()
    }

    /// Closes every partition's consumer (sending pending acks first, within `deadline`);
    /// buffered messages are dropped and redelivered by the broker to the next consumer.
    /// The report is [`Consumer::close`]'s.
    ///
    /// # Errors
    /// As [`Consumer::close`].
    pub async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        self.inner.closed.store(true, Ordering::Release);
        for task in &self.tasks {
            task.abort();
        }
        let result = self.inner.consumer.close(deadline).await;
        self.inner.arrived.notify_one();
        result
    }
}

impl Drop for PriorityConsumer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Inner {
    /// The next message by the gate, an error to report, or `None` when nothing is buffered.
    fn take_next(&self) -> Option<Result<Message, Error>> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(Error::Closed("the consumer")));
        }
        let mut state = self.state.lock();
        if let Some(error) = state.errors.pop_front() {
            return Some(Err(error));
        }
        if let Some(message) = state.strays.pop_front() {
            return Some(Ok(message));
        }
        let now = super::clock::now();
        let mut control = Permits::new(&self.consumer, &self.levels);
        // Bounded: each round either returns or corrects one count the gate had wrong.
        for _ in 0..=state.buffers.len() {
            let Some(partition) = state.gate.next_partition(now) else {
                break;
            };
            let message = state
                .buffers
                .get_mut(partition as usize)
                .and_then(VecDeque::pop_front);
            let _ = state.gate.on_delivered(partition, now, &mut control);
            if let Some(message) = message {
                crate::metrics::priority_delivered(
                    state.gate.level_of(partition).map(|level| level.get()),
                    1,
                );
                state.delivered_at(partition, &message.id(), now, &mut control);
                if !message.handed_again
                    && let Some(p) = self.consumer.partition_at(partition as usize)
                {
                    p.consumed(1, self.consumer.counters());
                }
                return Some(Ok(message));
            }
        }
        if state.finished {
            return Some(Err(self.consumer.ended_error()));
        }
        None
    }

    /// Buffers what the partitions delivered and tells the gate.
    fn arrived(&self, deliveries: Vec<Delivery>) {
        let now = super::clock::now();
        let mut state = self.state.lock();
        let state = &mut *state;
        let mut control = Permits::new(&self.consumer, &self.levels);
        for delivery in deliveries {
            let message = match delivery {
                Delivery::Message(message) => *message,
                other => {
                    let error = self.consumer.delivery_error(other);
                    state.errors.push_back(error);
                    continue;
                }
            };
            let partition = message.origin.slot as u32;
            let policy = state.gate.policy();
            let claimed = policy.parse(message.property(policy.property())).level;
            match state
                .gate
                .on_arrival(partition, Some(claimed), now, &mut control)
            {
                Ok(_) => {
                    let slot = partition as usize;
                    if state.buffers.len() <= slot {
                        state.buffers.resize_with(slot + 1, VecDeque::new);
                    }
                    state.buffers[slot].push_back(message);
                }
                Err(error) => {
                    tracing::warn!(partition, %error, "a message of a partition the gate does not know; delivered first");
                    state.strays.push_back(message);
                }
            }
        }
    }

    /// Reports an ack or nack of `message` to the gate.
    fn counted(
        &self,
        message: &Message,
        event: fn(&mut Gate, u32, std::time::Instant, &mut dyn PartitionControl),
    ) {
        let mut state = self.state.lock();
        let mut control = Permits::new(&self.consumer, &self.levels);
        event(
            &mut state.gate,
            message.origin.slot as u32,
            super::clock::now(),
            &mut control,
        );
    }

    /// The maintenance task's tick period for the live strategy.
    fn tick_period(&self) -> Duration {
        tick_period(self.tick, self.state.lock().gate.config().strategy())
    }

    fn tick(&self) {
        let mut state = self.state.lock();
        let mut control = Permits::new(&self.consumer, &self.levels);
        state.gate.tick(super::clock::now(), &mut control);
    }

    async fn refresh_partitions(&self) -> Result<usize, Error> {
        let count = self
            .consumer
            .pool()
            .partitions(self.consumer.topic())
            .await?;
        let (old, hold) = {
            let state = self.state.lock();
            (
                state.gate.partitions(),
                state.gate.config().growth_hold().is_some(),
            )
        };
        // Under the growth hold, where each old partition ends now is its drain point.
        let ends = if hold && count > old {
            Some(end_positions(&self.consumer, 0..old).await)
        } else {
            None
        };
        {
            let mut state = self.state.lock();
            let state = &mut *state;
            if count > state.gate.partitions() {
                let mut control = Permits::new(&self.consumer, &self.levels);
                let now = super::clock::now();
                match &ends {
                    Some(ends) => {
                        state
                            .gate
                            .set_partitions_with_drain_points(count, now, &mut control)?;
                        state.drain_points = vec![None; old as usize];
                        for (p, end) in (0..old).zip(ends) {
                            let delivered = state.last_delivered.get(p as usize).copied().flatten();
                            match end {
                                Ok(end) if end.readable => match (end.last, delivered) {
                                    (Some(last), Some(seen)) if seen >= last => {
                                        state.gate.drained(p, now, &mut control);
                                    }
                                    (Some(last), _) => state.drain_points[p as usize] = Some(last),
                                    (None, _) => state.gate.drained(p, now, &mut control),
                                },
                                Ok(_) => state.gate.drained(p, now, &mut control),
                                Err(error) => tracing::warn!(
                                    partition = p,
                                    %error,
                                    "where the partition ends is unknown; its growth hold lasts until its deadline"
                                ),
                            }
                        }
                    }
                    None => state.gate.set_partitions(count, now, &mut control)?,
                }
                self.levels.update(&state.gate);
                let partitions = state.gate.partitions() as usize;
                state.buffers.resize_with(partitions, VecDeque::new);
            }
        }
        let sizing = |p: u32| {
            let state = self.state.lock();
            let size = state
                .gate
                .suggested_queue_size(p)
                .unwrap_or(state.gate.config().receiver_queue_size());
            (size, state.gate.is_paused(p).unwrap_or(false))
        };
        let sizing: QueueSizing<'_> = &sizing;
        let result = self.consumer.grow_to(count, sizing).await;
        // A partition subscribed while the gate changed its state gets the current one.
        let mut state = self.state.lock();
        let mut control = Permits::new(&self.consumer, &self.levels);
        state.gate.sync(&mut control);
        result
    }
}

/// Where each of `partitions` of `consumer` ends now (`GET_LAST_MESSAGE_ID`, all at once).
async fn end_positions(
    consumer: &Consumer,
    partitions: std::ops::Range<u32>,
) -> Vec<Result<EndPosition, Error>> {
    let asks = partitions.map(|p| async move {
        match consumer.partition_at(p as usize) {
            Some(partition) => partition.end_position().await,
            None => Err(Error::Closed("the partition's consumer")),
        }
    });
    futures_util::future::join_all(asks).await
}

/// Moves every partition's deliveries into the buffers, telling the gate of each arrival.
async fn forward(inner: Arc<Inner>) {
    let mut deliveries = inner.consumer.deliveries().lock().await;
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            received = deliveries.recv_many(&mut batch, 256) => {
                if received == 0 {
                    break;
                }
            }
            // Messages the consumer hands over again itself (aborts, negative acks).
            () = inner.consumer.again_ready() => {}
        }
        while let Some(message) = inner.consumer.take_again() {
            batch.push(Delivery::Message(Box::new(message)));
        }
        inner.arrived(std::mem::take(&mut batch));
        inner.arrived.notify_one();
    }
    inner.state.lock().finished = true;
    inner.arrived.notify_one();
}

/// Ticks the gate and re-reads the partition count, until the consumer is gone.
///
/// The tick period is re-read from the live strategy before every wait (and at once when
/// `retick` is signalled by a strategy change), so that an aging strategy set on a live
/// consumer gets its `max_wait / 4` tick.
async fn maintain(inner: Weak<Inner>, retick: Arc<Notify>, refresh: Option<Duration>) {
    let mut last_tick = tokio::time::Instant::now();
    let mut next_refresh = refresh.map(|every| last_tick + every);
    loop {
        let period = match inner.upgrade() {
            Some(inner) => inner.tick_period(),
            None => return,
        };
        // A strategy change cuts the wait short; the period is then re-read. A refresh that
        // is due before the next tick is not kept waiting for it.
        let tick_due = last_tick + period;
        let wake = next_refresh.map_or(tick_due, |due| due.min(tick_due));
        let _ = tokio::time::timeout_at(wake, retick.notified()).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        last_tick = tokio::time::Instant::now();
        inner.tick();
        if let (Some(due), Some(every)) = (next_refresh, refresh)
            && tokio::time::Instant::now() >= due
        {
            if let Err(error) = inner.refresh_partitions().await {
                tracing::warn!(topic = %inner.consumer.topic(), %error, "re-reading the partition count failed");
            }
            next_refresh = Some(tokio::time::Instant::now() + every);
        }
    }
}

#[async_trait::async_trait]
impl MessageConsumer for PriorityConsumer {
    async fn receive(&self) -> Result<Message, Error> {
        PriorityConsumer::receive(self).await
    }

    async fn ack(&self, message: &Message) -> Result<(), Error> {
        PriorityConsumer::ack(self, message).await
    }

    fn nack(&self, message: &Message) -> Result<(), Error> {
        PriorityConsumer::nack(self, message)
    }

    async fn refresh_partitions(&self) -> Result<usize, Error> {
        PriorityConsumer::refresh_partitions(self).await
    }

    async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        PriorityConsumer::close(self, deadline).await
    }

    fn topic(&self) -> &str {
        PriorityConsumer::topic(self)
    }
}

#[cfg(test)]
mod tests {
    use ::mq_priority::{Level, QueueSizing};

    use super::*;
    use crate::{MAX_PARTITIONS_REFRESH, MIN_PARTITIONS_REFRESH};

    fn options() -> PriorityConsumerOptions {
        let policy = PriorityPolicy::new(2).unwrap();
        PriorityConsumerOptions::new(policy, LayoutSpec::partition_shares([1, 1]))
    }

    #[test]
    fn partitions_refresh_out_of_range_is_refused_naming_the_option() {
        // Regression: Some(Duration::ZERO) was taken silently (as None).
        for every in [
            Duration::ZERO,
            Duration::from_millis(99),
            MAX_PARTITIONS_REFRESH + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            match options().partitions_refresh(Some(every)).validate() {
                Err(error @ Error::Invalid { what, .. }) => {
                    assert_eq!(what, "partitions_refresh");
                    let text = error.to_string();
                    assert!(
                        text.contains("partitions_refresh")
                            && text.contains("100ms..=86400s")
                            && text.contains(&format!("{every:?}")),
                        "{text}"
                    );
                }
                other => panic!("{every:?}: {other:?}"),
            }
        }
        for every in [
            None,
            Some(MIN_PARTITIONS_REFRESH),
            Some(MAX_PARTITIONS_REFRESH),
        ] {
            assert!(options().partitions_refresh(every).validate().is_ok());
        }
    }

    #[test]
    fn gate_settings_and_layout_are_refused_before_any_request() {
        // A growth hold the gate could not add to an instant (it panicked the refresh task).
        let gate = GateConfig::default().with_growth_hold(Some(Duration::MAX));
        assert!(matches!(
            options().gate(gate).validate(),
            Err(Error::Priority(
                mq_priority::Error::InvalidGrowthHold { .. }
            ))
        ));
        // min_queue_size above the receiver queue (it was capped silently).
        let gate = GateConfig::default()
            .with_receiver_queue_size(20)
            .with_min_queue_size(50)
            .with_queue_sizing(QueueSizing::Halving);
        match options().gate(gate).validate() {
            Err(error @ Error::Priority(mq_priority::Error::InvalidQueueSize { .. })) => {
                let text = error.to_string();
                assert!(
                    text.contains("min_queue_size 50") && text.contains("receiver_queue_size 20"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        // An explicit layout listing a level twice (it was merged silently).
        let policy = PriorityPolicy::new(2).unwrap();
        let layout = LayoutSpec::explicit([
            (Level::new(0), vec![0]),
            (Level::new(1), vec![1]),
            (Level::new(1), vec![2]),
        ]);
        assert!(matches!(
            PriorityConsumerOptions::new(policy, layout).validate(),
            Err(Error::Priority(mq_priority::Error::DuplicateLevel {
                level: 1
            }))
        ));
        assert!(options().validate().is_ok());
    }

    #[test]
    fn a_huge_tick_is_taken_as_an_hour_so_its_deadline_never_overflows() {
        // `tick(Duration::MAX)` once made the maintenance task panic adding it to an instant.
        assert_eq!(tick_period(Duration::MAX, &Strategy::Strict), MAX_TICK);
        assert_eq!(options().tick(Duration::MAX).tick, MAX_TICK);
        assert_eq!(options().tick(Duration::ZERO).tick, MIN_TICK);
        let _deadline = tokio::time::Instant::now() + tick_period(Duration::MAX, &Strategy::Strict);
    }

    #[test]
    fn aging_caps_the_tick_at_a_quarter_of_max_wait() {
        let ms = Duration::from_millis;
        assert_eq!(tick_period(ms(100), &Strategy::Strict), ms(100));
        assert_eq!(tick_period(ms(100), &Strategy::delivery_shares()), ms(100));
        let aging = |max_wait| Strategy::StrictAging { max_wait };
        assert_eq!(tick_period(ms(100), &aging(ms(200))), ms(50));
        assert_eq!(tick_period(ms(10), &aging(ms(200))), ms(10));
        assert_eq!(tick_period(Duration::from_secs(5), &aging(ms(2))), ms(1));
        assert_eq!(
            tick_period(ms(100), &aging(Duration::from_micros(1))),
            ms(1)
        );
    }
}
