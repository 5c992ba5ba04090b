//! [`PushConsumer`]: receives from every assigned queue, runs a handler with bounded
//! concurrency, acknowledges through `ack-batcher`, and negatively acknowledges failures with
//! `ChangeInvisibleDuration`.

mod ack_settings;
mod acks;
mod control;
mod counters;
mod gated;
mod handler;
mod lite;
mod lite_state;
mod receive;
mod registration;
mod simple;
mod state;
mod stream;
mod telemetry;
mod unacked;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ack_batcher::CloseReport;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use counters::Counters;
use registration::Registration;
use state::{Inner, Subscription};
use unacked::Unacked;

use crate::priority::{GateConfig, GateStats, PriorityTopics};
use crate::{AckFlusher, ClientConfig, Error, FilterExpression, LinkState, Session};

pub use ack_settings::{AckObserver, AckSettings};
pub use handler::{ConsumeResult, MessageHandler};
pub use lite_state::LiteOffset;
pub use simple::{
    DEFAULT_AWAIT_DURATION, MAX_INVISIBLE_DURATION, MAX_RECEIVE_MESSAGES, MIN_INVISIBLE_DURATION,
    PRIORITY_RECEIVE_GRACE, SimpleCloseReport, SimpleConsumer, SimpleConsumerBuilder,
    SimpleConsumerStats,
};
pub use stream::Messages;

/// Counters of a consumer, from [`PushConsumer::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Messages received.
    pub received: u64,
    /// Messages the handler processed successfully.
    pub consumed: u64,
    /// Handler failures (a FIFO message retried here counts once per failed attempt).
    pub failed: u64,
    /// FIFO messages forwarded to the dead-letter queue after failing every attempt of the
    /// retry policy.
    pub dead_lettered: u64,
    /// Invisibility renewals of messages whose handler was still running (see
    /// [`PushConsumerBuilder::renewal`]).
    pub renewed: u64,
    /// Acks confirmed by the proxy.
    pub acked: u64,
    /// Acks that failed for good (invalid receipt handle, retries exhausted).
    pub ack_failed: u64,
    /// Acks abandoned at shutdown.
    pub ack_abandoned: u64,
    /// Failed messages made visible again with `ChangeInvisibleDuration`.
    pub nacked: u64,
    /// The ack batcher's own counters (batches per flush reason, sizes, retries).
    pub acks: ack_batcher::Stats,
}

/// What [`PushConsumer::close`] did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PushCloseReport {
    /// Whether every handler finished within the timeout.
    pub handlers_finished: bool,
    /// What happened to the acks pending at shutdown.
    pub acks: CloseReport,
    /// Ids of messages consumed successfully whose ack failed for good or was refused at
    /// shutdown, and that no later delivery of the same message acknowledged: the proxy
    /// will redeliver them. Oldest first; at most the 10,000 most recent such ids (see
    /// `unacknowledged_dropped`). An id whose ack failed and whose redelivery was acked later
    /// is not listed.
    pub unacknowledged: Vec<String>,
    /// How many ids left the `unacknowledged` list because it was full (some of them may
    /// have been acknowledged later on redelivery; the list cannot tell any more).
    pub unacknowledged_dropped: u64,
}

/// How far a renewal extends the invisibility of a message whose handler still runs, by
/// default.
const DEFAULT_RENEWAL: Duration = Duration::from_secs(60);
/// The proxy's shortest invisible duration (`minInvisibleTimeMillsForRecv`).
const MIN_RENEWAL: Duration = Duration::from_secs(10);
/// The proxy's longest invisible duration (`maxInvisibleTimeMills`).
const MAX_RENEWAL: Duration = Duration::from_secs(12 * 3600);

/// Builds a [`PushConsumer`].
pub struct PushConsumerBuilder {
    config: ClientConfig,
    group: String,
    subscriptions: Vec<Subscription>,
    concurrency: usize,
    receive_batch_size: u32,
    long_polling: Duration,
    acks: AckSettings,
    renewal: Duration,
    /// The bind topic, for a lite push consumer.
    lite_bind_topic: Option<String>,
    /// Level topics (or a native topic) and the gate's settings.
    priority: Option<(PriorityTopics, GateConfig)>,
    /// What handles each message ([`PushConsumerBuilder::handler`]).
    handler: Option<Arc<dyn MessageHandler>>,
}

impl std::fmt::Debug for PushConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConsumerBuilder")
            .field("group", &self.group)
            .field("subscriptions", &self.subscriptions)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl PushConsumerBuilder {
    /// Subscribes to `topic` with a filter: a tag expression as a string (`"*"` for every
    /// message, `"a || b"` for either tag) or a [`FilterExpression`] (such as
    /// [`FilterExpression::sql92`], which needs the broker's `enablePropertyFilter=true`).
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     config: rocketmq_grpc::ClientConfig,
    /// #     handler: impl rocketmq_grpc::MessageHandler,
    /// # ) -> Result<(), rocketmq_grpc::Error> {
    /// use rocketmq_grpc::{FilterExpression, PushConsumer};
    ///
    /// let consumer = PushConsumer::builder(config, "billing")
    ///     .subscribe("orders", "paid || refunded")
    ///     .subscribe("payments", FilterExpression::sql92("region = 'eu' AND amount > 100"))
    ///     .handler(handler)
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

    /// How many messages are handled at once, and held at most (default 64).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How many messages one receive asks for (default 32, 1 to 1,024; the proxy serves at
    /// most 32 at once).
    #[must_use]
    pub fn receive_batch_size(mut self, size: u32) -> Self {
        self.receive_batch_size = size;
        self
    }

    /// How long one receive waits for messages (default 20 s; the proxy clamps it to 5–20 s).
    #[must_use]
    pub fn long_polling(mut self, timeout: Duration) -> Self {
        self.long_polling = timeout;
        self
    }

    /// How acks are sent (default: batched, 1,024 entries or 5 s).
    #[must_use]
    pub fn acks(mut self, acks: AckSettings) -> Self {
        self.acks = acks;
        self
    }

    /// While a handler runs, extend its message's invisibility by `renewal` whenever the end
    /// of the invisibility comes near (a fifth of it, and at least 3 s, before), with
    /// `ChangeInvisibleDuration`; the ack or nack then uses the newest receipt handle.
    /// Default 60 s; `Duration::ZERO` turns renewal off. Otherwise between 10 s and 12 h
    /// (the proxy's bounds for an invisible duration).
    ///
    /// Without renewal a handler that runs longer than the invisibility (20 s to 60 s on
    /// the proxy, whatever its own auto-renewal does) gets its message delivered again, and
    /// its ack is refused as expired: a duplicate. The official clients do not renew.
    #[must_use]
    pub fn renewal(mut self, renewal: Duration) -> Self {
        self.renewal = renewal;
        self
    }

    /// Consumes the priority levels of `topics`, the more important first.
    ///
    /// - **Level topics**: subscribes to every level topic (with `"*"`, unless it is
    ///   subscribed already) in this one group, and a [`Gate`](crate::priority::Gate) with
    ///   `gate`'s settings decides which topics receive. The consumer holds at most its
    ///   [`concurrency`](Self::concurrency) messages; what it holds of each level (received,
    ///   handler not finished) is that level's *buffered* count, and a level whose last
    ///   receive came back full is presumed to have a backlog of its receiver queue (one that
    ///   came back short, none). While a level holds its high watermark of its receiver queue
    ///   ([`GateConfig::receiver_queue_size`], sized per level by
    ///   [`GateConfig::queue_sizing`]) the receive loops of the less important topics wait
    ///   (before taking any of the concurrency, so it goes to the pressed level), as the
    ///   [`Strategy`](crate::priority::Strategy) says:
    ///   [`Strict`](crate::priority::Strategy::Strict) (or `StrictAging`) pauses them whenever
    ///   a more important level is pressed, while delivery shares pause a level only while it
    ///   is itself full. On the emulator a burst of 500 urgent messages behind a backlog of
    ///   20,000 had its p99 at 3-5 % of no priority's (every message on one topic), and at
    ///   46-53 % (strict) or 72-85 % (the default shares) of level topics without a gate. A
    ///   failed message comes back through its own topic, so it keeps its level. A level can
    ///   never hold more than the concurrency, so a receiver queue size above it (as
    ///   [`GateConfig::default`]'s 1,000 against the default concurrency of 64) is taken as
    ///   the concurrency, and the smallest queue of
    ///   [`QueueSizing::Halving`](crate::priority::QueueSizing::Halving) as at most that.
    /// - **Native** (5.4+): subscribes to the priority topic, which the broker serves highest
    ///   priority first; `gate` is not used. A failed message with a priority above 0 is
    ///   retried in the consumer (held, its invisibility renewed, for each delay of the retry
    ///   policy), as a FIFO message is, and never nacked: a nacked priority message comes back
    ///   through the group's retry topic, after every fresh message of the topic (by default
    ///   on 5.5.0 also 65-80 s late, apache/rocketmq#10350), so a failed urgent message would
    ///   come after the whole low backlog. The price: a message held for a retry keeps its
    ///   share of the [`concurrency`](Self::concurrency) during the delay. With renewal off
    ///   ([`renewal`](Self::renewal) zero) failed messages are nacked as usual.
    /// - **Native tiers** (5.4+,
    ///   [`native_tiers`](crate::priority::PriorityTopicsBuilder::native_tiers)): both. The
    ///   broker serves each tier's levels by native priority, the gate works across the tiers
    ///   as across level topics (its levels are the tiers: [`PushConsumer::gate_stats`] counts
    ///   per tier), and failed messages above priority 0 are retried in place as natively.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     config: rocketmq_grpc::ClientConfig,
    /// #     handler: impl rocketmq_grpc::MessageHandler,
    /// # ) -> Result<(), rocketmq_grpc::Error> {
    /// use rocketmq_grpc::PushConsumer;
    /// use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics};
    ///
    /// let topics = PriorityTopics::builder(PriorityPolicy::new(3).unwrap())
    ///     .level_topics(["orders-urgent", "orders", "orders-bulk"])
    ///     .build()?;
    /// let consumer = PushConsumer::builder(config, "billing")
    ///     .concurrency(64)
    ///     .priority(topics, GateConfig::default())
    ///     .handler(handler)
    ///     .build()
    ///     .await?;
    /// # drop(consumer);
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
        if let Some((topics, gate)) = &self.priority
            && topics.is_gated()
        {
            gated::fit_to_concurrency(gate.clone(), self.concurrency)
                .validate(&topics.gate_policy()?)
                .map_err(|e| gated::invalid(&e))?;
        }
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
        if !(1..=65_536).contains(&self.concurrency) {
            return Err(Error::invalid(
                "concurrency",
                format!("{} is not in 1..=65536", self.concurrency),
            ));
        }
        if !(1..=1024).contains(&self.receive_batch_size) {
            return Err(Error::invalid(
                "receive_batch_size",
                format!("{} is not in 1..=1024", self.receive_batch_size),
            ));
        }
        if !self.renewal.is_zero() && !(MIN_RENEWAL..=MAX_RENEWAL).contains(&self.renewal) {
            return Err(Error::invalid(
                "renewal",
                format!(
                    "{:?} is neither zero (no renewal) nor between 10 s and 12 h",
                    self.renewal
                ),
            ));
        }
        if self.long_polling.is_zero() || self.long_polling > Duration::from_secs(60) {
            return Err(Error::invalid(
                "long_polling",
                format!("{:?} is not between 1 ns and 60 s", self.long_polling),
            ));
        }
        Ok(())
    }

    /// [`handler`](Self::handler), then [`build`](Self::build).
    ///
    /// # Errors
    /// As [`build`](Self::build).
    #[deprecated(
        since = "0.2.0",
        note = "set the handler with `.handler(..)`, then `.build()`"
    )]
    pub async fn start(self, handler: impl MessageHandler) -> Result<PushConsumer, Error> {
        self.handler(handler).build().await
    }

    /// What handles each message: a [`MessageHandler`], or a closure
    /// `Fn(ReceivedMessage) -> impl Future<Output = ConsumeResult>`. Required: [`build`](
    /// Self::build) refuses a builder without one.
    #[must_use]
    pub fn handler(mut self, handler: impl MessageHandler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Connects, checks the group and every topic with the proxy, and starts consuming with
    /// the [`handler`](Self::handler).
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad settings (naming `handler` when none was set);
    /// [`Error::Unreachable`] when the proxy cannot be reached; [`Error::Server`] when it
    /// refuses the group or a topic (unknown, not authorised).
    pub async fn build(mut self) -> Result<PushConsumer, Error> {
        let Some(handler) = self.handler.take() else {
            return Err(Error::invalid(
                "handler",
                "no handler: set one with `.handler(..)` before `build()`",
            ));
        };
        if let Some((topics, _)) = &self.priority {
            state::subscribe_levels(&mut self.subscriptions, topics);
        }
        self.validate()?;
        let retry_in_place = !self.renewal.is_zero()
            && self
                .priority
                .as_ref()
                .is_some_and(|(topics, _)| topics.is_native());
        let gate = match self.priority.take() {
            Some((topics, config)) => {
                gated::PushGate::new(topics, gated::fit_to_concurrency(config, self.concurrency))?
                    .map(Arc::new)
            }
            None => None,
        };
        let session = Session::new(self.config.clone())?;
        let counters = Arc::new(Counters::default());
        let unacknowledged = Arc::new(Mutex::new(Unacked::new(unacked::UNACKED_CAP)));
        let acks = self.acks.build(
            AckFlusher::new(Arc::clone(&session), &self.group),
            Arc::clone(&counters),
            Arc::clone(&unacknowledged),
        )?;
        let inner = Arc::new(Inner {
            session,
            group: self.group,
            subscriptions: self.subscriptions,
            handler,
            acks,
            ack_settings: self.acks,
            permits: Arc::new(Semaphore::new(self.concurrency)),
            concurrency: self.concurrency,
            // Checked above: at most 1,024.
            receive_batch_size: i32::try_from(self.receive_batch_size).unwrap_or(1024),
            long_polling: Mutex::new(self.long_polling),
            renewal: self.renewal,
            backoff: Mutex::new(None),
            registration: Registration::new(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            counters,
            unacknowledged,
            queues: Mutex::new(Default::default()),
            shut_down: std::sync::atomic::AtomicBool::new(false),
            lite: self
                .lite_bind_topic
                .map(|topic| Arc::new(lite_state::LiteState::new(topic))),
            gate,
            retry_in_place,
        });
        if let Err(error) = control::start(&inner).await {
            // Receive loops of the queues assigned before the failure stop too.
            inner.stop.cancel();
            inner.tasks.close();
            return Err(error);
        }
        if let Some(gate) = inner.gate.clone() {
            let stop = inner.stop.clone();
            inner.tasks.spawn(async move {
                let mut every = tokio::time::interval(gated::TICK);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = every.tick() => gate.tick(),
                    }
                }
            });
        }
        inner.session.link().attach();
        Ok(PushConsumer { inner })
    }
}

/// A running push consumer.
///
/// Stop it with [`close`](Self::close), which waits for handlers and acks and reports
/// what could not be acknowledged. Dropping it without `close` stops it too: receiving
/// stops at once (in-flight long polls are cancelled; no new messages reach the handler),
/// and a background task (when a Tokio runtime is still running) waits up to 10 s for the
/// running handlers, flushes the pending acks (up to another 10 s, the ack batcher's
/// `drop_timeout` behaviour) and tells the proxy the client left. What it cannot
/// acknowledge in time is redelivered by the proxy; nothing reports it.
pub struct PushConsumer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PushConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConsumer")
            .field("group", &self.inner.group)
            .field("client_id", &self.inner.session.client_id())
            .finish_non_exhaustive()
    }
}

impl PushConsumer {
    /// The priority gate's counters per level (arrivals, deliveries, acks, pauses), for a
    /// consumer of level topics ([`PushConsumerBuilder::priority`]), or per tier for native
    /// tiers; `None` otherwise.
    ///
    /// ```no_run
    /// # fn demo(consumer: &rocketmq_grpc::PushConsumer) {
    /// if let Some(stats) = consumer.gate_stats() {
    ///     println!("level 0 handled {}", stats.levels[0].delivered);
    /// }
    /// # }
    /// ```
    pub fn gate_stats(&self) -> Option<GateStats> {
        self.inner.gate.as_ref().map(|gate| gate.stats())
    }

    /// The level topics whose receives the priority gate holds back now (empty without a
    /// gate).
    ///
    /// ```no_run
    /// # fn demo(consumer: &rocketmq_grpc::PushConsumer) {
    /// for topic in consumer.paused_topics() {
    ///     println!("{topic} waits for more important levels");
    /// }
    /// # }
    /// ```
    pub fn paused_topics(&self) -> Vec<String> {
        self.inner
            .gate
            .as_ref()
            .map_or_else(Vec::new, |gate| gate.paused_topics())
    }

    /// Starts configuring a consumer of `group` on the proxy described by `config`.
    #[must_use]
    pub fn builder(config: ClientConfig, group: impl Into<String>) -> PushConsumerBuilder {
        PushConsumerBuilder {
            config,
            group: group.into(),
            subscriptions: Vec::new(),
            concurrency: 64,
            receive_batch_size: 32,
            long_polling: Duration::from_secs(20),
            acks: AckSettings::default(),
            renewal: DEFAULT_RENEWAL,
            lite_bind_topic: None,
            priority: None,
            handler: None,
        }
    }

    /// The redelivery policy the proxy announced for the group (its attempts and the delay
    /// after each failed one), once the consumer's settings were answered. A FIFO message is
    /// retried here at these delays and goes to the dead-letter queue after the attempts; a
    /// normal one is made visible again after the delay (see [`ConsumeResult::Failure`]).
    pub fn retry_policy(&self) -> Option<crate::SendRetryPolicy> {
        self.inner
            .backoff
            .lock()
            .as_ref()
            .and_then(crate::SendRetryPolicy::from_pb)
    }

    /// The link state of the client's channel to the proxy ([`LinkState`], the same names and
    /// meanings as `pulsar-wire`'s): [`LinkState::Reconnecting`] while calls find the proxy
    /// unreachable, [`LinkState::Connected`] once one is answered again,
    /// [`LinkState::Closed`] after [`close`](Self::close). The receiver marks the current state
    /// seen; `changed().await` waits for the next.
    ///
    /// ```no_run
    /// # async fn demo(client: &rocketmq_grpc::PushConsumer) {
    /// let mut state = client.state();
    /// while state.changed().await.is_ok() {
    ///     println!("link: {:?}", *state.borrow_and_update());
    /// }
    /// # }
    /// ```
    pub fn state(&self) -> tokio::sync::watch::Receiver<LinkState> {
        self.inner.session.state()
    }

    /// The counters.
    pub fn stats(&self) -> ConsumerStats {
        let c = &self.inner.counters;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        ConsumerStats {
            received: get(&c.received),
            consumed: get(&c.consumed),
            failed: get(&c.failed),
            acked: get(&c.acked),
            ack_failed: get(&c.ack_failed),
            ack_abandoned: get(&c.ack_abandoned),
            nacked: get(&c.nacked),
            renewed: get(&c.renewed),
            dead_lettered: get(&c.dead_lettered),
            acks: self.inner.acks.stats(),
        }
    }

    /// The client id every RPC of this consumer carries.
    pub fn client_id(&self) -> &str {
        self.inner.session.client_id()
    }

    /// Stops receiving, waits for running handlers, flushes pending and in-flight acks, tells
    /// the proxy the client is leaving, and reports what could not be acknowledged. The whole
    /// close takes at most about `timeout` (handlers first, then acks with what is left). The
    /// same name and shape as [`SimpleConsumer::close`](crate::SimpleConsumer::close).
    ///
    /// Receives in flight are cancelled. Seen on real 5.3.3 and 5.5.0 proxies: the broker
    /// keeps a cancelled long poll open until its time ends (up to about 20 s after the
    /// close), and the first message that arrives for the group and topic within it is taken
    /// by that poll and comes back only after its invisible time (about 40 s). Nothing is
    /// lost, but a consumer of the same group started right after the close can see one
    /// message per topic that late (the official clients' long polls do the same).
    ///
    /// A second `close` (or one racing the first) returns at once with an empty report
    /// (`handlers_finished` false: it waited for nothing); dropping the consumer after `close`
    /// does nothing more.
    pub async fn close(&self, timeout: Duration) -> PushCloseReport {
        let inner = &self.inner;
        if inner.shut_down.swap(true, Ordering::AcqRel) {
            return PushCloseReport::default();
        }
        let deadline = tokio::time::Instant::now() + timeout;
        inner.stop.cancel();
        inner.tasks.close();
        inner.session.link().detach();
        let handlers_finished = tokio::time::timeout_at(deadline, inner.tasks.wait())
            .await
            .is_ok();
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let acks = inner
            .acks
            .close(remaining.max(Duration::from_millis(100)))
            .await;
        control::notify_termination(inner).await;
        let (unacknowledged, unacknowledged_dropped) = inner.unacknowledged.lock().take();
        PushCloseReport {
            handlers_finished,
            acks,
            unacknowledged,
            unacknowledged_dropped,
        }
    }
}

/// How long a dropped consumer's background task waits for running handlers, then for the
/// pending acks.
const DROP_TIMEOUT: Duration = Duration::from_secs(10);

impl Drop for PushConsumer {
    /// Stops receiving at once; waits for handlers, flushes acks and notifies the proxy in
    /// the background (see [`PushConsumer`]).
    fn drop(&mut self) {
        if self.inner.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        inner.stop.cancel();
        inner.tasks.close();
        inner.session.link().detach();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(DROP_TIMEOUT, inner.tasks.wait()).await;
                let report = inner.acks.close(DROP_TIMEOUT).await;
                control::notify_termination(&inner).await;
                tracing::debug!(?report, "a dropped consumer stopped");
            });
        }
    }
}

/// How many messages a lite push consumer handles at once by default: the proxy refuses
/// receives of a lite client holding more than `maxLiteRenewNumPerChannel` (100) unacknowledged
/// messages (`FORBIDDEN` "too many unacked messages").
const LITE_CONCURRENCY: usize = 32;

/// Builds a [`LitePushConsumer`] (see there).
#[derive(Debug)]
pub struct LitePushConsumerBuilder {
    builder: PushConsumerBuilder,
}

impl LitePushConsumerBuilder {
    /// How many messages are handled at once, and held at most (default 32; keep it well
    /// under the proxy's 100 unacknowledged messages per lite client).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.builder = self.builder.concurrency(concurrency);
        self
    }

    /// How many messages one receive asks for (default 32), as
    /// [`PushConsumerBuilder::receive_batch_size`].
    #[must_use]
    pub fn receive_batch_size(mut self, size: u32) -> Self {
        self.builder = self.builder.receive_batch_size(size);
        self
    }

    /// How long one receive waits for messages (default 20 s), as
    /// [`PushConsumerBuilder::long_polling`].
    #[must_use]
    pub fn long_polling(mut self, timeout: Duration) -> Self {
        self.builder = self.builder.long_polling(timeout);
        self
    }

    /// How acks are sent (default: batched, 32 entries or 200 ms, so that few messages stay
    /// unacknowledged). The proxy acks the entries of a lite batch one by one on their lite
    /// topics' queues, but in one request.
    #[must_use]
    pub fn acks(mut self, acks: AckSettings) -> Self {
        self.builder = self.builder.acks(acks);
        self
    }

    /// Invisibility renewal of long-running handlers, as [`PushConsumerBuilder::renewal`].
    #[must_use]
    pub fn renewal(mut self, renewal: Duration) -> Self {
        self.builder = self.builder.renewal(renewal);
        self
    }

    /// What handles each message, as [`PushConsumerBuilder::handler`]. Required.
    #[must_use]
    pub fn handler(mut self, handler: impl MessageHandler) -> Self {
        self.builder = self.builder.handler(handler);
        self
    }

    /// Connects as a lite push consumer (`LITE_PUSH_CONSUMER`), checks the group and the bind
    /// topic with the proxy, and starts receiving with the [`handler`](Self::handler);
    /// messages come once lite topics are subscribed ([`LitePushConsumer::subscribe_lite`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad settings (an empty bind topic names `bind_topic`; no
    /// handler names `handler`); [`Error::Unreachable`] when the proxy cannot be reached;
    /// [`Error::Server`] when it refuses the group or the topic (a RocketMQ 5.3 proxy does not
    /// know the client type: `UNRECOGNIZED_CLIENT_TYPE`).
    pub async fn build(self) -> Result<LitePushConsumer, Error> {
        let bind_topic = self.builder.lite_bind_topic.clone().unwrap_or_default();
        if bind_topic.is_empty() {
            return Err(Error::invalid(
                "bind_topic",
                "the lite consumer's bind topic (the lite topics' parent) is empty",
            ));
        }
        let consumer = self.builder.build().await?;
        Ok(LitePushConsumer { consumer })
    }

    /// [`handler`](Self::handler), then [`build`](Self::build).
    ///
    /// # Errors
    /// As [`build`](Self::build).
    #[deprecated(
        since = "0.2.0",
        note = "set the handler with `.handler(..)`, then `.build()`"
    )]
    pub async fn start(self, handler: impl MessageHandler) -> Result<LitePushConsumer, Error> {
        self.handler(handler).build().await
    }
}

/// A lite push consumer (RocketMQ 5.4+, RIP-83): a push consumer of the lite topics it
/// subscribes to, one at a time, under one parent (bind) topic of type `LITE`.
///
/// A lite topic is a light queue the broker keeps per name (`%LMQ%$parent$name`), made when a
/// producer first sends to it ([`OutgoingMessage::lite_topic`](crate::OutgoingMessage::lite_topic))
/// and dropped after it expires; an application uses many (a reply queue per session, say)
/// and subscribes to those it needs with [`subscribe_lite`](Self::subscribe_lite). The group
/// must be bound to the parent topic (`lite.bind.topic`, set with `mqadmin updateSubGroup -a
/// +lite.bind.topic=PARENT`).
///
/// As the Java client's `LitePushConsumer`: subscriptions are `SyncLiteSubscription` requests
/// (the proxy passes them to the brokers), checked first against the group's quota per client
/// and the longest name the proxy announced; the whole set is announced again every 30 s and
/// after every reconnection; a lite topic the server drops (expired) leaves the set. Acks,
/// nacks, renewals and dead-lettering name each message's lite topic. Messages are handled as
/// in a [`PushConsumer`], whose [`ConsumeResult`] and handlers it takes.
///
/// ```no_run
/// # async fn demo() -> Result<(), rocketmq_grpc::Error> {
/// use std::time::Duration;
/// use rocketmq_grpc::{ClientConfig, ConsumeResult, LitePushConsumer, ReceivedMessage};
///
/// let consumer = LitePushConsumer::builder(ClientConfig::new("127.0.0.1:8081")?, "replies", "it-lite")
///     .handler(|message: ReceivedMessage| async move {
///         println!("{:?}: {}", message.lite_topic(), String::from_utf8_lossy(message.body()));
///         ConsumeResult::Success
///     })
///     .build()
///     .await?;
/// consumer.subscribe_lite("session-42").await?;
/// // ...
/// consumer.unsubscribe_lite("session-42").await?;
/// consumer.close(Duration::from_secs(10)).await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LitePushConsumer {
    consumer: PushConsumer,
}

impl LitePushConsumer {
    /// Starts configuring a lite push consumer of `group` bound to the lite topic
    /// `bind_topic` (the parent of its lite topics).
    #[must_use]
    pub fn builder(
        config: ClientConfig,
        group: impl Into<String>,
        bind_topic: impl Into<String>,
    ) -> LitePushConsumerBuilder {
        let bind_topic = bind_topic.into();
        let mut builder = PushConsumer::builder(config, group)
            .subscribe(bind_topic.clone(), "*")
            .concurrency(LITE_CONCURRENCY)
            .acks(
                AckSettings::default()
                    .max_items(32)
                    .max_delay(Duration::from_millis(200)),
            );
        builder.lite_bind_topic = Some(bind_topic);
        LitePushConsumerBuilder { builder }
    }

    /// Subscribes to the lite topic `lite_topic`, from where the group left off (a new one
    /// from its start). Nothing happens when it is already subscribed.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `lite_topic` for an empty name, a character other than
    /// ASCII letters, digits, `-` and `_`, or a name longer than the proxy allows;
    /// [`Error::Server`] with `LITE_SUBSCRIPTION_QUOTA_EXCEEDED` when the group's quota per
    /// client is reached (checked here first, as the proxy announced it; unsubscribe from
    /// another one); a transport or proxy error of the request (retryable ones may pass
    /// later); [`Error::Closed`] after [`close`](Self::close).
    pub async fn subscribe_lite(&self, lite_topic: &str) -> Result<(), Error> {
        lite::subscribe(&self.consumer.inner, lite_topic, None).await
    }

    /// Subscribes to `lite_topic` starting at `offset` (see [`LiteOffset`]); as
    /// [`subscribe_lite`](Self::subscribe_lite) otherwise.
    ///
    /// # Errors
    /// As [`subscribe_lite`](Self::subscribe_lite).
    pub async fn subscribe_lite_from(
        &self,
        lite_topic: &str,
        offset: LiteOffset,
    ) -> Result<(), Error> {
        lite::subscribe(&self.consumer.inner, lite_topic, Some(offset)).await
    }

    /// Unsubscribes from `lite_topic`; nothing happens when it is not subscribed.
    ///
    /// # Errors
    /// A transport or proxy error of the request (the topic stays in the set);
    /// [`Error::Closed`] after [`close`](Self::close).
    pub async fn unsubscribe_lite(&self, lite_topic: &str) -> Result<(), Error> {
        lite::unsubscribe(&self.consumer.inner, lite_topic).await
    }

    /// The lite topics subscribed to, in name order.
    pub fn lite_topics(&self) -> Vec<String> {
        self.consumer
            .inner
            .lite
            .as_ref()
            .map(|lite| lite.topics.lock().iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The parent topic its lite topics belong to.
    pub fn bind_topic(&self) -> &str {
        self.consumer
            .inner
            .lite
            .as_ref()
            .map_or("", |lite| lite.bind_topic.as_str())
    }

    /// The link state of the client's channel to the proxy ([`LinkState`], the same names and
    /// meanings as `pulsar-wire`'s): [`LinkState::Reconnecting`] while calls find the proxy
    /// unreachable, [`LinkState::Connected`] once one is answered again,
    /// [`LinkState::Closed`] after [`close`](Self::close). The receiver marks the current state
    /// seen; `changed().await` waits for the next.
    ///
    /// ```no_run
    /// # async fn demo(client: &rocketmq_grpc::LitePushConsumer) {
    /// let mut state = client.state();
    /// while state.changed().await.is_ok() {
    ///     println!("link: {:?}", *state.borrow_and_update());
    /// }
    /// # }
    /// ```
    pub fn state(&self) -> tokio::sync::watch::Receiver<LinkState> {
        self.consumer.state()
    }

    /// The counters, as [`PushConsumer::stats`].
    pub fn stats(&self) -> ConsumerStats {
        self.consumer.stats()
    }

    /// The client id every RPC of this consumer carries.
    pub fn client_id(&self) -> &str {
        self.consumer.client_id()
    }

    /// Stops it as [`PushConsumer::close`] does (the proxy drops the client's lite
    /// subscriptions when it leaves). Later subscription changes fail with
    /// [`Error::Closed`]; a second `close` returns at once with an empty report.
    pub async fn close(&self, timeout: Duration) -> PushCloseReport {
        self.consumer.close(timeout).await
    }
}
