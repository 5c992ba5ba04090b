//! [`SimpleConsumer`]: the application asks for messages, then acknowledges each one (through
//! `ack-batcher`) or changes its invisible duration, as with the Java client's
//! `SimpleConsumer`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use ack_batcher::{Batcher, CloseReport};
use mq_priority::{Gate, NoControl};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ack_settings::AckSettings;
use super::counters::Counters;
use super::receive::receive;
use super::registration::{Registration, registration_lost};
use super::state::{self, Subscription};
use super::telemetry::{self, Announcer};
use super::unacked::{UNACKED_CAP, Unacked};
use crate::backoff;
use crate::pb::{self, ClientType, Code};
use crate::priority::{GateConfig, GateStats, PriorityTopics};
use crate::producer::routes::Routes;
use crate::{
    AckEntry, AckFlusher, AckKey, ClientConfig, Endpoint, Error, FilterExpression, LinkState,
    ReceivedMessage, Session,
};

/// The most messages one [`SimpleConsumer::receive`] asks for: the 5.3.3 proxy serves at most
/// 32 per receive (asked for 64 with 100 waiting, it sent 32) and nothing for 0 (a
/// `MESSAGE_NOT_FOUND` "no new message" with messages waiting), so both are refused here.
pub const MAX_RECEIVE_MESSAGES: u32 = 32;
/// The shortest invisible duration of a received message: the proxy's
/// `minInvisibleTimeMillsForRecv` (10 s); shorter ones are refused with
/// `ILLEGAL_INVISIBLE_TIME`.
pub const MIN_INVISIBLE_DURATION: Duration = Duration::from_secs(10);
/// The longest invisible duration: the proxy's `maxInvisibleTimeMills` (12 h), for receives
/// and for [`SimpleConsumer::change_invisible_duration`].
pub const MAX_INVISIBLE_DURATION: Duration = Duration::from_secs(12 * 3600);
/// The default of [`SimpleConsumerBuilder::await_duration`] (30 s, the value of the Java
/// client's examples; the Java builder has no default).
pub const DEFAULT_AWAIT_DURATION: Duration = Duration::from_secs(30);

/// The default of [`SimpleConsumerBuilder::receive_batch_size`].
const DEFAULT_RECEIVE_BATCH_SIZE: u32 = 16;
/// The default of [`SimpleConsumerBuilder::invisible_duration`].
const DEFAULT_INVISIBLE_DURATION: Duration = Duration::from_secs(60);

/// Refuses a receive count outside 1..=[`MAX_RECEIVE_MESSAGES`] or an invisible duration
/// outside the proxy's limits, naming the setting.
fn check_receive(
    count_name: &'static str,
    count: u32,
    duration_name: &'static str,
    duration: Duration,
) -> Result<(), Error> {
    if !(1..=MAX_RECEIVE_MESSAGES).contains(&count) {
        return Err(Error::invalid(
            count_name,
            format!(
                "{count} is not in 1..={MAX_RECEIVE_MESSAGES} (the broker pops at most \
                 {MAX_RECEIVE_MESSAGES} messages at a time)"
            ),
        ));
    }
    if !(MIN_INVISIBLE_DURATION..=MAX_INVISIBLE_DURATION).contains(&duration) {
        return Err(Error::invalid(
            duration_name,
            format!(
                "{duration:?} is not between {MIN_INVISIBLE_DURATION:?} and \
                 {MAX_INVISIBLE_DURATION:?} (the proxy's limits)"
            ),
        ));
    }
    Ok(())
}

const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const HEARTBEAT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));
/// Above this many remembered handle changes, the expired ones are forgotten.
const RENEWED_PRUNE_AT: usize = 4096;

/// Counters of a [`SimpleConsumer`], from [`SimpleConsumer::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimpleConsumerStats {
    /// Messages received.
    pub received: u64,
    /// Acks confirmed by the proxy.
    pub acked: u64,
    /// Acks that failed for good (invalid receipt handle, retries exhausted).
    pub ack_failed: u64,
    /// Acks refused or abandoned because the consumer was closing.
    pub ack_abandoned: u64,
    /// Successful [`SimpleConsumer::change_invisible_duration`] calls.
    pub invisible_changed: u64,
    /// The ack batcher's counters: [`ack_batcher::Stats::total_batches`] is the number of
    /// `AckMessage` requests sent (retries included).
    pub acks: ack_batcher::Stats,
}

/// What [`SimpleConsumer::close`] did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SimpleCloseReport {
    /// What happened to the acks pending at close.
    pub acks: CloseReport,
    /// Ids of messages whose ack failed for good or was refused, and that no later delivery
    /// acknowledged (at most the 10,000 most recent): the proxy will deliver them again.
    pub unacknowledged: Vec<String>,
    /// How many ids left `unacknowledged` because it was full.
    pub unacknowledged_dropped: u64,
}

/// Builds a [`SimpleConsumer`]; from [`SimpleConsumer::builder`].
pub struct SimpleConsumerBuilder {
    config: ClientConfig,
    group: String,
    subscriptions: Vec<Subscription>,
    await_duration: Duration,
    receive_batch_size: u32,
    invisible_duration: Duration,
    acks: AckSettings,
    /// Level topics (or a native topic) and the gate's settings.
    priority: Option<(PriorityTopics, GateConfig)>,
}

impl std::fmt::Debug for SimpleConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleConsumerBuilder")
            .field("group", &self.group)
            .field("subscriptions", &self.subscriptions)
            .field("await_duration", &self.await_duration)
            .field("receive_batch_size", &self.receive_batch_size)
            .field("invisible_duration", &self.invisible_duration)
            .finish_non_exhaustive()
    }
}

impl SimpleConsumerBuilder {
    /// Subscribes to `topic` with a filter: a tag expression as a string (`"*"` for every
    /// message, `"a || b"` for either tag) or a [`FilterExpression`] (such as
    /// [`FilterExpression::sql92`], which needs the broker's `enablePropertyFilter=true`).
    /// Receives take the subscribed topics in turn.
    ///
    /// ```no_run
    /// # async fn demo(config: rocketmq_grpc::ClientConfig) -> Result<(), rocketmq_grpc::Error> {
    /// use rocketmq_grpc::{FilterExpression, SimpleConsumer};
    ///
    /// let consumer = SimpleConsumer::builder(config, "audit")
    ///     .subscribe("orders", FilterExpression::sql92("amount BETWEEN 100 AND 500"))
    ///     .build()
    ///     .await?;
    /// # drop(consumer);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn subscribe(
        mut self,
        topic: impl Into<String>,
        filter: impl Into<FilterExpression>,
    ) -> Self {
        self.subscriptions.push(Subscription {
            topic: topic.into(),
            filter: filter.into(),
        });
        self
    }

    /// How long one [`receive`](SimpleConsumer::receive) waits for messages when there are
    /// none (long polling; default [`DEFAULT_AWAIT_DURATION`], 30 s; 1 ms to 1 h). The proxy
    /// holds a receive 5 to 20 s (`grpcClientConsumerMin/MaxLongPollingTimeoutMillis`)
    /// whatever is asked; the client waits for this plus the request timeout.
    #[must_use]
    pub fn await_duration(mut self, duration: Duration) -> Self {
        self.await_duration = duration;
        self
    }

    /// How many messages each receive of [`stream`](SimpleConsumer::stream) asks for
    /// (default 16; 1..=[`MAX_RECEIVE_MESSAGES`]). [`receive`](SimpleConsumer::receive)
    /// takes its own count.
    #[must_use]
    pub fn receive_batch_size(mut self, size: u32) -> Self {
        self.receive_batch_size = size;
        self
    }

    /// How long the messages that [`stream`](SimpleConsumer::stream) yields stay invisible
    /// to the group's other consumers unless acknowledged before (default 60 s; within
    /// [`MIN_INVISIBLE_DURATION`] ..= [`MAX_INVISIBLE_DURATION`]).
    /// [`receive`](SimpleConsumer::receive) takes its own duration.
    #[must_use]
    pub fn invisible_duration(mut self, duration: Duration) -> Self {
        self.invisible_duration = duration;
        self
    }

    /// How acks are sent (default: batched per (endpoint, topic), 1,024 entries or 5 s, and
    /// before the receipt handle expires; see [`AckSettings`]).
    #[must_use]
    pub fn acks(mut self, acks: AckSettings) -> Self {
        self.acks = acks;
        self
    }

    /// Receives the priority levels of `topics`, the more important first.
    ///
    /// - **Level topics**: subscribes to every level topic (with `"*"`, unless it is
    ///   subscribed already), and each [`receive`](SimpleConsumer::receive) asks, at once,
    ///   every level topic that a [`Gate`](crate::priority::Gate) with `gate`'s settings does
    ///   not hold back, returning what came **sorted by level** (most important first), **up
    ///   to `max_messages` per level asked**. A level whose receive came back full is
    ///   presumed to have a backlog of its receiver queue
    ///   ([`GateConfig::receiver_queue_size`], sized per level by
    ///   [`GateConfig::queue_sizing`]), one that came back short to have none; under
    ///   [`Strategy::Strict`](crate::priority::Strategy::Strict) a level with a backlog then
    ///   holds back every less important one until it runs short (and at the start, for
    ///   [`GateConfig::cold_start`], until the most important level has answered). Once one
    ///   level has answered with messages, the others get
    ///   [`PRIORITY_RECEIVE_GRACE`] to answer too; the receives still waiting then keep
    ///   running, and a later `receive` returns what they bring (cancelled, they would stay
    ///   open at the proxy and take the next message of their topic out of sight for
    ///   `invisible_duration`). Priority receives run one at a time.
    /// - **Native** (5.4+): subscribes to the priority topic, which the broker serves highest
    ///   priority first; `gate` is not used.
    /// - **Native tiers** (5.4+,
    ///   [`native_tiers`](crate::priority::PriorityTopicsBuilder::native_tiers)): as level
    ///   topics, with the tiers in place of the levels; the broker serves each tier's levels
    ///   by native priority, and what came is sorted by level.
    ///
    /// ```no_run
    /// # async fn demo(config: rocketmq_grpc::ClientConfig) -> Result<(), rocketmq_grpc::Error> {
    /// use std::time::Duration;
    /// use rocketmq_grpc::SimpleConsumer;
    /// use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics, Strategy};
    ///
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
    ///     .level_topics(["jobs-high", "jobs-low"])
    ///     .build()?;
    /// let gate = GateConfig::default()
    ///     .with_strategy(Strategy::Strict)
    ///     .with_receiver_queue_size(32);
    /// let consumer = SimpleConsumer::builder(config, "workers")
    ///     .priority(topics, gate)
    ///     .build()
    ///     .await?;
    /// for message in consumer.receive(16, Duration::from_secs(60)).await? {
    ///     consumer.ack(&message).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// [`build`](Self::build) refuses, naming `priority`, gate settings that
    /// [`GateConfig::validate`] refuses.
    #[must_use]
    pub fn priority(mut self, topics: PriorityTopics, gate: GateConfig) -> Self {
        self.priority = Some((topics, gate));
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.group.is_empty() {
            return Err(Error::invalid("group", "the consumer group name is empty"));
        }
        if self.subscriptions.is_empty() {
            return Err(Error::invalid(
                "subscribe",
                "subscribe to at least one topic",
            ));
        }
        if let Some(s) = self.subscriptions.iter().find(|s| s.topic.is_empty()) {
            return Err(Error::invalid(
                "subscribe",
                format!("an empty topic name (filter {})", s.filter),
            ));
        }
        for s in &self.subscriptions {
            s.filter.validate(&s.topic)?;
        }
        if self.await_duration < Duration::from_millis(1)
            || self.await_duration > Duration::from_secs(3600)
        {
            return Err(Error::invalid(
                "await_duration",
                format!("{:?} is not between 1 ms and 1 h", self.await_duration),
            ));
        }
        check_receive(
            "receive_batch_size",
            self.receive_batch_size,
            "invisible_duration",
            self.invisible_duration,
        )
    }

    /// Connects, announces the consumer's settings on the telemetry stream (the proxy
    /// refuses receives from a client it has not seen there), heartbeats, and returns the
    /// consumer. Routes are looked up at the first receive of each topic.
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad settings (naming the setting); [`Error::Unreachable`]
    /// when the proxy cannot be reached; [`Error::Server`] when it refuses the client.
    pub async fn build(mut self) -> Result<SimpleConsumer, Error> {
        if let Some((topics, _)) = &self.priority {
            state::subscribe_levels(&mut self.subscriptions, topics);
        }
        self.validate()?;
        let priority = match self.priority.take() {
            Some((topics, config)) => {
                let subscriptions: Vec<usize> = topics
                    .topics()
                    .iter()
                    .filter_map(|t| self.subscriptions.iter().position(|s| s.topic == *t))
                    .collect();
                SimpleGate::new(topics, config, subscriptions)?
            }
            None => None,
        };
        let session = Session::new(self.config.clone())?;
        let counters = Arc::new(Counters::default());
        let unacknowledged = Arc::new(Mutex::new(Unacked::new(UNACKED_CAP)));
        let acks = self.acks.build(
            AckFlusher::new(Arc::clone(&session), &self.group),
            Arc::clone(&counters),
            Arc::clone(&unacknowledged),
        )?;
        let next_queue = self
            .subscriptions
            .iter()
            .map(|_| AtomicUsize::new(0))
            .collect();
        let inner = Arc::new(Inner {
            session,
            group: self.group,
            subscriptions: self.subscriptions,
            next_topic: AtomicUsize::new(0),
            next_queue,
            routes: Routes::readable(),
            await_duration: self.await_duration,
            receive_batch_size: self.receive_batch_size,
            invisible_duration: self.invisible_duration,
            acks,
            ack_settings: self.acks,
            renewed: Mutex::new(HashMap::new()),
            registration: Registration::new(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            counters,
            unacknowledged,
            closed: AtomicBool::new(false),
            priority,
        });
        let stream = telemetry::open(inner.as_ref())
            .await
            .map_err(|error| telemetry::unreachable_if_down(&inner.session, error))?;
        inner.heartbeat().await?;
        inner.registration.state.send_replace(Some(1));
        inner
            .tasks
            .spawn(telemetry::run(Arc::clone(&inner), stream));
        inner.tasks.spawn(heartbeats(Arc::clone(&inner)));
        inner.session.link().attach();
        Ok(SimpleConsumer { inner })
    }
}

/// A receipt handle that [`SimpleConsumer::change_invisible_duration`] replaced: its
/// successor and when the successor expires.
#[derive(Debug)]
struct Renewed {
    handle: String,
    until: Instant,
}

struct Inner {
    session: Arc<Session>,
    group: String,
    subscriptions: Vec<Subscription>,
    /// Which subscription the next receive takes.
    next_topic: AtomicUsize,
    /// Per subscription, which queue of its route the next receive takes.
    next_queue: Vec<AtomicUsize>,
    routes: Routes,
    await_duration: Duration,
    /// What each receive of [`SimpleConsumer::stream`] asks for.
    receive_batch_size: u32,
    invisible_duration: Duration,
    acks: Batcher<AckKey, AckEntry, AckFlusher>,
    ack_settings: AckSettings,
    /// Replaced receipt handle → its successor, so that an ack of the message as first
    /// received uses the latest handle.
    renewed: Mutex<HashMap<String, Renewed>>,
    registration: Registration,
    stop: CancellationToken,
    tasks: TaskTracker,
    counters: Arc<Counters>,
    unacknowledged: Arc<Mutex<Unacked>>,
    closed: AtomicBool,
    /// The priority gate over level topics ([`SimpleConsumerBuilder::priority`]).
    priority: Option<SimpleGate>,
}

impl Announcer for Inner {
    fn session(&self) -> &Session {
        &self.session
    }

    fn settings(&self) -> pb::TelemetryCommand {
        telemetry::settings_command(
            &self.session,
            ClientType::SimpleConsumer,
            &self.group,
            &self.subscriptions,
            None,
            None,
        )
    }

    fn take_settings(&self, _command: pb::TelemetryCommand) {}

    fn registration(&self) -> &Registration {
        &self.registration
    }

    fn stop(&self) -> &CancellationToken {
        &self.stop
    }
}

impl Inner {
    async fn heartbeat(&self) -> Result<(), Error> {
        self.session
            .heartbeat(Some(&self.group), ClientType::SimpleConsumer)
            .await
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::Closed("the simple consumer"))
        } else {
            Ok(())
        }
    }

    /// The latest receipt handle of `message` and when it expires.
    fn current_handle(&self, message: &ReceivedMessage) -> (String, Instant) {
        let renewed = self.renewed.lock();
        let mut handle = &message.receipt_handle;
        let mut until = message.invisible_until;
        // Each change replaces one handle; the chain is as long as the changes.
        for _ in 0..=renewed.len() {
            match renewed.get(handle) {
                Some(next) => {
                    handle = &next.handle;
                    until = next.until;
                }
                None => break,
            }
        }
        (handle.clone(), until)
    }

    /// Forgets the handle changes of `message` (it was acknowledged).
    fn forget_changes(&self, message: &ReceivedMessage) {
        let mut renewed = self.renewed.lock();
        let mut handle = message.receipt_handle.clone();
        while let Some(next) = renewed.remove(&handle) {
            handle = next.handle;
        }
    }

    fn record_change(&self, old: String, handle: String, until: Instant) {
        let mut renewed = self.renewed.lock();
        if renewed.len() >= RENEWED_PRUNE_AT {
            let now = Instant::now();
            renewed.retain(|_, r| r.until > now);
        }
        renewed.insert(old, Renewed { handle, until });
    }
}

/// Heartbeats every 10 s while the consumer is registered; a failure that says the proxy
/// lost the consumer makes the telemetry task announce the settings again.
async fn heartbeats(inner: Arc<Inner>) {
    let mut backoff = backoff::exponential(HEARTBEAT_BACKOFF.0, HEARTBEAT_BACKOFF.1);
    let mut wait = HEARTBEAT_EVERY;
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let Some(generation) = inner.registration.current() else {
            wait = backoff.next_delay();
            continue;
        };
        match inner.heartbeat().await {
            Ok(()) => {
                backoff.reset();
                wait = HEARTBEAT_EVERY;
            }
            Err(error) => {
                wait = backoff.next_delay();
                tracing::warn!(%error, ?wait, "heartbeat failed");
                if registration_lost(&error) {
                    inner.registration.lost(generation);
                }
            }
        }
    }
}

/// One receive from the queue of subscription `index` that comes next.
async fn receive_from(
    inner: &Inner,
    index: usize,
    max_messages: u32,
    invisible_duration: Duration,
) -> Result<Vec<ReceivedMessage>, Error> {
    let Some(subscription) = inner.subscriptions.get(index) else {
        return Err(Error::invalid(
            "subscribe",
            format!("no subscription {index} (of {})", inner.subscriptions.len()),
        ));
    };
    let route = tokio::select! {
        () = inner.stop.cancelled() => return Err(Error::Closed("the simple consumer")),
        route = inner.routes.get(&inner.session, &subscription.topic) => route?,
    };
    let queue =
        route[inner.next_queue[index].fetch_add(1, Ordering::Relaxed) % route.len()].clone();
    let endpoint = queue
        .broker
        .as_ref()
        .and_then(|b| b.endpoints.as_ref())
        .and_then(Endpoint::from_pb)
        .unwrap_or_else(|| inner.session.access_point());
    let request = pb::ReceiveMessageRequest {
        group: Some(inner.session.resource(&inner.group)),
        message_queue: Some(inner.session.queue(queue)),
        filter_expression: Some(subscription.filter.to_pb()),
        batch_size: i32::try_from(max_messages).unwrap_or(i32::MAX),
        invisible_duration: prost_types::Duration::try_from(invisible_duration).ok(),
        auto_renew: false,
        long_polling_timeout: prost_types::Duration::try_from(inner.await_duration).ok(),
        attempt_id: None,
    };
    let generation = inner.registration.current();
    let received = tokio::select! {
        () = inner.stop.cancelled() => return Err(Error::Closed("the simple consumer")),
        received = receive(&inner.session, &endpoint, request, inner.await_duration) => received,
    };
    match received {
        Ok(messages) => {
            Counters::add(&inner.counters.received, messages.len() as u64);
            Ok(messages)
        }
        Err(error) => {
            if registration_lost(&error)
                && let Some(generation) = generation
            {
                inner.registration.lost(generation);
            }
            if error.is_retryable() {
                inner.routes.mark_stale(&subscription.topic);
            }
            Err(crate::filter::explain_filter_error(
                error,
                &subscription.topic,
                &subscription.filter,
            ))
        }
    }
}

/// How long the other level topics of a priority receive may still answer once one has
/// answered with messages (see [`SimpleConsumerBuilder::priority`]).
pub const PRIORITY_RECEIVE_GRACE: Duration = Duration::from_millis(50);

/// The priority gate of a simple consumer on level topics: partition `k` is level `k`'s topic.
struct SimpleGate {
    topics: PriorityTopics,
    gate: Mutex<Gate>,
    /// Per partition, the index of its topic's subscription.
    subscriptions: Vec<usize>,
    /// Per partition, its level topic's receive still running, if any (see
    /// [`receive_levels`]). The lock also makes priority receives one at a time.
    outstanding: tokio::sync::Mutex<Vec<Option<LevelTask>>>,
}

impl SimpleGate {
    /// A gate over the level topics of `topics` (`None` for a native topic).
    fn new(
        topics: PriorityTopics,
        config: GateConfig,
        subscriptions: Vec<usize>,
    ) -> Result<Option<Self>, Error> {
        let Some(gate) = super::gated::gate_over(&topics, config)? else {
            return Ok(None);
        };
        let partitions = gate.partitions();
        let outstanding = tokio::sync::Mutex::new((0..partitions).map(|_| None).collect());
        Ok(Some(Self {
            topics,
            gate: Mutex::new(gate),
            subscriptions,
            outstanding,
        }))
    }

    /// The partitions to ask now, with their subscriptions.
    fn to_ask(&self) -> Vec<(u32, usize)> {
        let mut gate = self.gate.lock();
        gate.tick(gate_now(), &mut NoControl);
        let asked: Vec<(u32, usize)> = (0..gate.partitions())
            .filter(|&p| {
                let paused = gate.is_paused(p) == Some(true);
                if paused {
                    crate::metrics::priority_held(gate.level_of(p).map(|level| level.get()));
                }
                !paused
            })
            .filter_map(|p| Some((p, *self.subscriptions.get(p as usize)?)))
            .collect();
        if asked.is_empty() {
            // Never nothing: the most important level at least.
            self.subscriptions
                .first()
                .map(|&s| vec![(0, s)])
                .unwrap_or_default()
        } else {
            asked
        }
    }

    /// A receive of `partition` that asked for `asked` brought `messages`, handed to the
    /// application at once; a full answer presumes a backlog of the level's receiver queue.
    fn received(&self, partition: u32, asked: u32, messages: &[ReceivedMessage]) {
        let now = gate_now();
        let mut gate = self.gate.lock();
        let mut delivered = 0;
        for message in messages {
            let claimed = Some(self.topics.gate_level(message));
            if gate
                .on_arrival(partition, claimed, now, &mut NoControl)
                .is_ok()
                && gate.on_delivered(partition, now, &mut NoControl).is_ok()
            {
                delivered += 1;
            }
        }
        crate::metrics::priority_delivered(
            gate.level_of(partition).map(|level| level.get()),
            delivered,
        );
        let full = messages.len() >= asked as usize;
        let backlog = if full {
            gate.suggested_queue_size(partition).map(u64::from)
        } else {
            Some(0)
        };
        let _ = gate.set_backlog(partition, backlog, now, &mut NoControl);
    }

    /// `message` was acknowledged.
    fn acked(&self, message: &ReceivedMessage) {
        if let Some(partition) = self.topics.tier_of_topic(&message.topic) {
            self.gate
                .lock()
                .on_ack(partition, gate_now(), &mut NoControl);
        }
    }
}

fn gate_now() -> std::time::Instant {
    Instant::now().into_std()
}

/// A level topic's receive, running in the background.
type LevelTask = tokio::task::JoinHandle<Result<Vec<ReceivedMessage>, Error>>;

/// The next of `outstanding` to finish (taken out of it, with its partition), or `None` when
/// none is running.
async fn next_done(
    outstanding: &mut [Option<LevelTask>],
) -> Option<(u32, Result<Vec<ReceivedMessage>, Error>)> {
    std::future::poll_fn(|cx| {
        let mut left = false;
        for (partition, slot) in outstanding.iter_mut().enumerate() {
            if let Some(task) = slot {
                if let Poll::Ready(joined) = Pin::new(task).poll(cx) {
                    *slot = None;
                    let received = joined.unwrap_or_else(|error| {
                        if error.is_cancelled() {
                            Err(Error::Closed("the simple consumer"))
                        } else {
                            Err(Error::invalid(
                                "priority",
                                format!("a level topic's receive task failed: {error}"),
                            ))
                        }
                    });
                    let partition = u32::try_from(partition).unwrap_or(u32::MAX);
                    return Poll::Ready(Some((partition, received)));
                }
                left = true;
            }
        }
        if left {
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    })
    .await
}

/// A receive of every level topic the gate does not hold back, at once; see
/// [`SimpleConsumerBuilder::priority`].
///
/// A level's receive that has not answered when the call returns keeps running, and a later
/// call hands out what it brings (first, with what that call receives). Cancelling it instead
/// would not cancel it at the proxy: seen on real 5.3.3 and 5.5.0, the broker keeps the long
/// poll open until its time ends and the next message of that topic goes to it, invisible
/// for `invisible_duration` to everyone (urgent messages came 5-19 s late that way).
async fn receive_levels(
    inner: &Arc<Inner>,
    gate: &SimpleGate,
    max_messages: u32,
    invisible_duration: Duration,
) -> Result<Vec<ReceivedMessage>, Error> {
    let mut outstanding = gate.outstanding.lock().await;
    for (partition, index) in gate.to_ask() {
        if let Some(slot) = outstanding.get_mut(partition as usize)
            && slot.is_none()
        {
            let inner = Arc::clone(inner);
            *slot = Some(inner.tasks.clone().spawn(async move {
                receive_from(&inner, index, max_messages, invisible_duration).await
            }));
        }
    }
    let mut got: Vec<(u32, Vec<ReceivedMessage>)> = Vec::new();
    let mut failed = None;
    let mut deadline: Option<Instant> = None;
    loop {
        let done = match deadline {
            None => next_done(&mut outstanding).await,
            Some(deadline) => tokio::select! {
                done = next_done(&mut outstanding) => done,
                () = tokio::time::sleep_until(deadline) => break,
            },
        };
        let Some((partition, received)) = done else {
            break;
        };
        match received {
            Ok(messages) => {
                gate.received(partition, max_messages, &messages);
                if !messages.is_empty() {
                    deadline.get_or_insert_with(|| Instant::now() + PRIORITY_RECEIVE_GRACE);
                    got.push((partition, messages));
                }
            }
            Err(error @ Error::Closed(_)) => return Err(error),
            Err(error) => {
                tracing::warn!(%error, partition, "receiving a level topic failed");
                failed.get_or_insert(error);
            }
        }
    }
    match failed {
        Some(error) if got.is_empty() => Err(error),
        _ => {
            got.sort_by_key(|(partition, _)| *partition);
            let mut messages: Vec<ReceivedMessage> =
                got.into_iter().flat_map(|(_, messages)| messages).collect();
            // Native tiers: the levels within a tier too (stable: the broker's order stays).
            messages.sort_by_key(|message| gate.topics.level_of(message));
            Ok(messages)
        }
    }
}

/// A consumer that receives when asked and acknowledges message by message, like the Java
/// client's `SimpleConsumer`, with its acks batched per (endpoint, topic) through
/// `ack-batcher` (the Java client sends one `AckMessage` per message).
///
/// Every method takes `&self`: share it (in an `Arc`) between tasks that receive and tasks
/// that acknowledge. Acks wait in their batch for up to [`AckSettings::max_delay`] (5 s by
/// default), less when the receipt handle expires sooner, so acknowledge concurrently (spawn,
/// or join many acks) rather than one after the other.
///
/// End it with [`close`](Self::close). Dropping it without `close` stops it too: in the
/// background (when a Tokio runtime is still running) its pending acks are flushed (10 s at
/// most) and the proxy is told the client left.
pub struct SimpleConsumer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimpleConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleConsumer")
            .field("group", &self.inner.group)
            .field("client_id", &self.inner.session.client_id())
            .finish_non_exhaustive()
    }
}

/// How long a dropped consumer's background task waits for the pending acks.
const DROP_TIMEOUT: Duration = Duration::from_secs(10);

impl SimpleConsumer {
    /// Starts configuring a simple consumer of `group` on the proxy described by `config`.
    #[must_use]
    pub fn builder(config: ClientConfig, group: impl Into<String>) -> SimpleConsumerBuilder {
        SimpleConsumerBuilder {
            config,
            group: group.into(),
            subscriptions: Vec::new(),
            await_duration: DEFAULT_AWAIT_DURATION,
            receive_batch_size: DEFAULT_RECEIVE_BATCH_SIZE,
            invisible_duration: DEFAULT_INVISIBLE_DURATION,
            acks: AckSettings::default(),
            priority: None,
        }
    }

    /// Receives up to `max_messages` messages, invisible to other consumers of the group for
    /// `invisible_duration` unless acknowledged (or their invisibility is changed) before.
    ///
    /// Like the Java client, each call takes the next subscribed topic in turn, and the next
    /// readable queue of that topic's route (leader brokers only) in turn, and long-polls for
    /// up to the [`await_duration`](SimpleConsumerBuilder::await_duration) (the proxy pops
    /// from the queue's broker, `auto_renew` off). An empty vector means nothing came in
    /// time.
    ///
    /// The broker loses the arrival of a message that comes while a receive is between its
    /// scan (nothing found) and its long-poll suspension: that receive then waits its whole
    /// await duration and the message with it (measured on 5.3.3 with one push-consumer
    /// receive at a time: about 1 in 500 messages sent right after one that a receive had
    /// just returned). An application that needs such a message at once keeps a second
    /// receive in flight, as the push consumer keeps a standby poll beside each queue's loop.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `max_messages` (not in 1..=[`MAX_RECEIVE_MESSAGES`])
    /// or `invisible_duration` (not within [`MIN_INVISIBLE_DURATION`] ..=
    /// [`MAX_INVISIBLE_DURATION`]); [`Error::Closed`] after [`close`](Self::close);
    /// [`Error::Rpc`] / [`Error::Server`] when the route lookup or the receive fails.
    pub async fn receive(
        &self,
        max_messages: u32,
        invisible_duration: Duration,
    ) -> Result<Vec<ReceivedMessage>, Error> {
        let inner = &self.inner;
        inner.check_open()?;
        check_receive(
            "max_messages",
            max_messages,
            "invisible_duration",
            invisible_duration,
        )?;
        if let Some(gate) = &inner.priority {
            return receive_levels(inner, gate, max_messages, invisible_duration).await;
        }
        let index = inner.next_topic.fetch_add(1, Ordering::Relaxed) % inner.subscriptions.len();
        receive_from(inner, index, max_messages, invisible_duration).await
    }

    /// Acknowledges a received message: the proxy will not deliver it again.
    ///
    /// The ack joins the batch of its (endpoint, topic) and resolves with this message's own
    /// result once the batch's `AckMessage` is answered: when the batch is full (1,024), after
    /// [`AckSettings::max_delay`] (5 s), or before the message's receipt handle expires,
    /// whichever comes first. FIFO messages and acks made late (see
    /// [`AckSettings::late_after`]) go at once. Retryable failures are retried until the
    /// handle expires. After [`change_invisible_duration`](Self::change_invisible_duration),
    /// the latest receipt handle is used, whichever copy of the message is passed.
    ///
    /// # Errors
    /// [`Error::Server`] with `INVALID_RECEIPT_HANDLE` when the handle expired (the message
    /// will be delivered again); the last error when retries ran out; [`Error::Closed`]
    /// after [`close`](Self::close) (or when close ran out of time before the answer).
    pub async fn ack(&self, message: &ReceivedMessage) -> Result<(), Error> {
        let inner = &self.inner;
        inner.check_open()?;
        let (receipt_handle, invisible_until) = inner.current_handle(message);
        let options = inner.ack_settings.item_options(
            message.received_at,
            invisible_until,
            message.is_fifo(),
        );
        let key = AckKey {
            endpoint: message.endpoint.clone(),
            topic: message.topic.clone(),
        };
        let entry = AckEntry {
            message_id: message.message_id.clone(),
            receipt_handle,
            lite_topic: None,
        };
        let ticket = match inner.acks.enqueue(key, entry, options).await {
            Ok(ticket) => ticket,
            Err(refused) => {
                Counters::add(&inner.counters.ack_abandoned, 1);
                if let Some(entry) = refused.into_item() {
                    inner.unacknowledged.lock().insert(entry.message_id);
                }
                return Err(Error::Closed("the simple consumer"));
            }
        };
        let outcome = ticket.await.map_err(ack_error);
        if outcome.is_ok() {
            inner.forget_changes(message);
            if let Some(gate) = &inner.priority {
                gate.acked(message);
            }
        }
        outcome
    }

    /// Changes how long `message` stays invisible, from now: the proxy delivers it again
    /// after `invisible_duration` unless it is acknowledged before (a short duration is a
    /// negative acknowledgement; the proxy counts another delivery attempt).
    ///
    /// The proxy issues a new receipt handle; the returned message carries it, and so does
    /// every later [`ack`](Self::ack) or change of either copy.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `invisible_duration` when it is longer than
    /// [`MAX_INVISIBLE_DURATION`]; [`Error::Closed`] after [`close`](Self::close);
    /// [`Error::Server`] with `INVALID_RECEIPT_HANDLE` when the handle expired, or another
    /// proxy refusal; [`Error::Rpc`] on transport failures.
    pub async fn change_invisible_duration(
        &self,
        message: &ReceivedMessage,
        invisible_duration: Duration,
    ) -> Result<ReceivedMessage, Error> {
        let inner = &self.inner;
        inner.check_open()?;
        if invisible_duration > MAX_INVISIBLE_DURATION {
            return Err(Error::invalid(
                "invisible_duration",
                format!(
                    "{invisible_duration:?} is longer than {MAX_INVISIBLE_DURATION:?} (the \
                     proxy's maxInvisibleTimeMills)"
                ),
            ));
        }
        let (receipt_handle, _) = inner.current_handle(message);
        let request = pb::ChangeInvisibleDurationRequest {
            group: Some(inner.session.resource(&inner.group)),
            topic: Some(inner.session.resource(&message.topic)),
            receipt_handle: receipt_handle.clone(),
            invisible_duration: prost_types::Duration::try_from(invisible_duration).ok(),
            message_id: message.message_id.clone(),
            lite_topic: None,
            suspend: None,
        };
        let timeout = inner.session.config().request_timeout;
        let mut client = inner.session.client(&message.endpoint)?;
        let response = tokio::select! {
            () = inner.stop.cancelled() => return Err(Error::Closed("the simple consumer")),
            response = client.change_invisible_duration(inner.session.request(request, timeout)) => response,
        }
        .map_err(|status| Error::rpc("ChangeInvisibleDuration", status))?
        .into_inner();
        Error::check("ChangeInvisibleDuration", response.status.as_ref())?;
        if response.receipt_handle.is_empty() {
            return Err(Error::Server {
                rpc: "ChangeInvisibleDuration",
                code: Code::Unspecified as i32,
                message: "the answer carried no new receipt handle".into(),
            });
        }
        Counters::add(&inner.counters.invisible_changed, 1);
        let until = Instant::now() + invisible_duration;
        inner.record_change(receipt_handle, response.receipt_handle.clone(), until);
        let mut changed = message.clone();
        changed.receipt_handle = response.receipt_handle;
        changed.invisible_until = until;
        Ok(changed)
    }

    /// The priority gate's counters per level, for a consumer of level topics
    /// ([`SimpleConsumerBuilder::priority`]); `None` otherwise.
    ///
    /// ```no_run
    /// # fn demo(consumer: &rocketmq_grpc::SimpleConsumer) {
    /// if let Some(stats) = consumer.gate_stats() {
    ///     println!("level 0 received {}", stats.levels[0].arrivals);
    /// }
    /// # }
    /// ```
    pub fn gate_stats(&self) -> Option<GateStats> {
        self.inner
            .priority
            .as_ref()
            .map(|gate| gate.gate.lock().stats())
    }

    /// The link state of the client's channel to the proxy ([`LinkState`], the same names and
    /// meanings as `pulsar-wire`'s): [`LinkState::Reconnecting`] while calls find the proxy
    /// unreachable, [`LinkState::Connected`] once one is answered again,
    /// [`LinkState::Closed`] after [`close`](Self::close). The receiver marks the current state
    /// seen; `changed().await` waits for the next.
    ///
    /// ```no_run
    /// # async fn demo(client: &rocketmq_grpc::SimpleConsumer) {
    /// let mut state = client.state();
    /// while state.changed().await.is_ok() {
    ///     println!("link: {:?}", *state.borrow_and_update());
    /// }
    /// # }
    /// ```
    pub fn state(&self) -> tokio::sync::watch::Receiver<LinkState> {
        self.inner.session.state()
    }

    /// The counters; `stats().acks.total_batches()` is the number of `AckMessage` requests.
    pub fn stats(&self) -> SimpleConsumerStats {
        let c = &self.inner.counters;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        SimpleConsumerStats {
            received: get(&c.received),
            acked: get(&c.acked),
            ack_failed: get(&c.ack_failed),
            ack_abandoned: get(&c.ack_abandoned),
            invisible_changed: get(&c.invisible_changed),
            acks: self.inner.acks.stats(),
        }
    }

    /// What each receive of [`stream`](Self::stream) asks for: the count and the invisible
    /// duration.
    pub(super) fn stream_settings(&self) -> (u32, Duration) {
        (self.inner.receive_batch_size, self.inner.invisible_duration)
    }

    /// Whether [`close`](Self::close) ran (or the consumer is being dropped).
    pub(super) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Cancelled when the consumer closes.
    pub(super) fn stop_token(&self) -> &CancellationToken {
        &self.inner.stop
    }

    /// The client id every RPC of this consumer carries.
    pub fn client_id(&self) -> &str {
        self.inner.session.client_id()
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// Closes the consumer: receives in progress end with [`Error::Closed`], pending and
    /// in-flight acks are flushed within `timeout` (each waiting [`ack`](Self::ack) gets its
    /// own result once; what is not answered in time gets [`Error::Closed`]), the proxy is
    /// told the client left, and every later call fails with [`Error::Closed`]. A second
    /// `close` returns an empty report.
    pub async fn close(&self, timeout: Duration) -> SimpleCloseReport {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return SimpleCloseReport::default();
        }
        inner.stop.cancel();
        inner.tasks.close();
        let acks = inner.acks.close(timeout).await;
        telemetry::notify_termination(&inner.session, &inner.group).await;
        inner.session.link().detach();
        let (unacknowledged, unacknowledged_dropped) = inner.unacknowledged.lock().take();
        SimpleCloseReport {
            acks,
            unacknowledged,
            unacknowledged_dropped,
        }
    }
}

impl Drop for SimpleConsumer {
    /// Stops the background tasks; flushes acks and notifies the proxy in the background
    /// (see [`SimpleConsumer`]).
    fn drop(&mut self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        inner.stop.cancel();
        inner.tasks.close();
        inner.session.link().detach();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let report = inner.acks.close(DROP_TIMEOUT).await;
                telemetry::notify_termination(&inner.session, &inner.group).await;
                tracing::debug!(?report, "a dropped simple consumer stopped");
            });
        }
    }
}

/// The error of one ack from the batcher's outcome.
fn ack_error(error: ack_batcher::Error<Error>) -> Error {
    match error {
        ack_batcher::Error::Failed { source, .. } => source,
        ack_batcher::Error::Missing { attempts } => Error::Server {
            rpc: "AckMessage",
            code: Code::Unspecified as i32,
            message: format!(
                "the proxy's answers had no result for this message ({attempts} attempts)"
            ),
        },
        ack_batcher::Error::Closed(()) | ack_batcher::Error::Abandoned => {
            Error::Closed("the simple consumer")
        }
        other => Error::Server {
            rpc: "AckMessage",
            code: Code::Unspecified as i32,
            message: other.to_string(),
        },
    }
}
