//! The broker's state and its answer to each command. Synchronous: the connection tasks
//! call in with a decoded frame under one lock and get frames queued to their writers.

mod clients;
mod commands;
mod namespaces;
mod seek;
mod unmodelled;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use txn_ack::TxnId;

use super::EmulatorConfig;
use super::delays::Clock;
use super::dispatch::Subscription;
use super::entries::{TopicView, Visibility};
use super::faults::{Faults, chance};
use super::names::{TC_ASSIGN_TOPIC, normalize, split_partition};
use super::outgoing::{Kind, Outgoing, command};
use super::schemas::Schemas;
use super::stats::{ConnectionStats, FaultStats, Stats, TopicStats};
use super::topics::Topic;
use super::txn::Coordinator;
use pulsar_wire::Error;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{BaseCommand, CommandError, CommandPing, CommandSuccess, ServerError};
use pulsar_wire::wire::Frame;

/// What a connection's writer receives.
#[derive(Debug)]
pub(super) enum Out {
    /// Write this frame, after `delay`, with a wrong checksum if `corrupt`.
    Frame {
        frame: Box<Frame>,
        delay: Duration,
        corrupt: bool,
    },
    /// Flush what was written and close the connection.
    Close,
}

/// What the connection task must do after a frame.
#[derive(Debug, Default)]
pub(super) struct Effects {
    /// Close the connection at once, writing nothing more.
    pub(super) close_now: bool,
    /// Abort this transaction after this long unless it ends first.
    pub(super) txn_timeout: Option<(TxnId, Duration)>,
    /// Wake the subscriptions at this time (milliseconds since the epoch) with this
    /// generation: a delayed entry comes due ([`Broker::wake`]).
    pub(super) wake: Option<(i64, u64)>,
}

#[derive(Debug)]
struct Conn {
    tx: Option<mpsc::UnboundedSender<Out>>,
    token: CancellationToken,
    stats: ConnectionStats,
}

#[derive(Debug)]
struct ProducerInfo {
    topic: String,
    name: String,
    /// The version of its schema, when it declared one.
    schema_version: Option<Vec<u8>>,
}

#[derive(Debug, Clone)]
struct ConsumerRef {
    topic: String,
    subscription: String,
    key: u64,
}

/// The whole broker.
#[derive(Debug)]
pub(super) struct Broker {
    config: EmulatorConfig,
    endpoint: String,
    faults: Faults,
    rng: fastrand::Rng,
    fault_stats: FaultStats,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    topics: BTreeMap<String, Topic>,
    partitioned: BTreeMap<String, u32>,
    /// `maxUnackedMessagesOnConsumer` by topic (a partitioned topic's base name covers its
    /// partitions).
    policies: BTreeMap<String, u32>,
    next_ledger: u64,
    producers: HashMap<(u64, u64), ProducerInfo>,
    consumers: HashMap<(u64, u64), ConsumerRef>,
    next_key: u64,
    tc: Coordinator,
    received: BTreeMap<i32, u64>,
    sent: BTreeMap<i32, u64>,
    unmodelled: BTreeMap<i32, u64>,
    out: Vec<Outgoing>,
    closing: Vec<u64>,
    /// Bumped by every restart: connections accepted in an earlier epoch are refused.
    epoch: u64,
    /// The wall clock delayed entries wait by.
    clock: Clock,
    /// The wake-up scheduled for the next delayed entry due: its time and generation (a
    /// wake-up of an older generation ends: an earlier one replaced it).
    wake: Option<(i64, u64)>,
    wake_generation: u64,
    /// The schema registry.
    schemas: Schemas,
}

type Refusal = (ServerError, String);

/// A subscription with its topic's ledger id.
struct SubRef<'a> {
    ledger_id: u64,
    subscription: &'a mut Subscription,
}

fn txn_of(most: Option<u64>, least: Option<u64>) -> Option<TxnId> {
    Some(TxnId {
        most_bits: most?,
        least_bits: least?,
    })
}

impl Broker {
    pub(super) fn new(config: EmulatorConfig, endpoint: String) -> Self {
        let mut partitioned = BTreeMap::new();
        partitioned.insert(TC_ASSIGN_TOPIC.to_string(), 1);
        Self {
            faults: config.faults.clone(),
            rng: fastrand::Rng::with_seed(config.seed),
            config,
            endpoint,
            fault_stats: FaultStats::default(),
            conns: BTreeMap::new(),
            next_conn: 0,
            topics: BTreeMap::new(),
            partitioned,
            policies: BTreeMap::new(),
            next_ledger: 100,
            producers: HashMap::new(),
            consumers: HashMap::new(),
            next_key: 0,
            tc: Coordinator::default(),
            received: BTreeMap::new(),
            unmodelled: BTreeMap::new(),
            sent: BTreeMap::new(),
            out: Vec::new(),
            closing: Vec::new(),
            epoch: 0,
            clock: Clock::new(),
            wake: None,
            wake_generation: 0,
            schemas: Schemas::default(),
        }
    }

    // ----- connections -------------------------------------------------------------------

    /// Registers a connection accepted in `epoch`. One accepted before the last restart
    /// (its task ran late) is closed at once: the broker that accepted it is gone.
    pub(super) fn register(
        &mut self,
        tx: mpsc::UnboundedSender<Out>,
        token: CancellationToken,
        peer: SocketAddr,
        epoch: u64,
    ) -> u64 {
        self.next_conn += 1;
        let id = self.next_conn;
        let current = epoch == self.epoch;
        if !current {
            token.cancel();
        }
        self.conns.insert(
            id,
            Conn {
                tx: current.then_some(tx),
                token,
                stats: ConnectionStats {
                    id,
                    peer,
                    open: current,
                    connected: false,
                    frames_received: 0,
                    frames_sent: 0,
                },
            },
        );
        id
    }

    /// The epoch new connections are accepted in.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The broker process stops, keeping what a real broker keeps on disk: every
    /// connection is closed at once (nothing more is read from it; no CLOSE_PRODUCER or
    /// CLOSE_CONSUMER is sent), its producers and consumers go as on a lost connection (what
    /// the consumers had not acknowledged goes back to the subscriptions, to be delivered to
    /// whichever consumer comes next), and the state that lives only in the broker's memory
    /// is forgotten: permits (with the consumers), the subscriptions' dispatchers with their
    /// replay sets and redelivery counts. Topics and their entries (those of open
    /// transactions included), subscriptions with their cursors (mark-delete, individually
    /// deleted entries, batch-deleted indexes), the pending acks of open transactions (the
    /// pending-ack store) and the coordinator's transactions stay.
    /// Returns how many connections were closed.
    pub(super) fn restart(&mut self) -> usize {
        self.epoch += 1;
        let open: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.stats.open)
            .map(|(id, _)| *id)
            .collect();
        for &conn in &open {
            if let Some(c) = self.conns.get(&conn) {
                c.token.cancel();
            }
            self.disconnect(conn);
        }
        for topic in self.topics.values_mut() {
            for subscription in topic.subscriptions.values_mut() {
                subscription.reloaded();
            }
        }
        self.fault_stats.restarts += 1;
        open.len()
    }

    /// The connection is gone: its producers and consumers go with it; what its consumers
    /// had not acknowledged goes to the others.
    pub(super) fn disconnect(&mut self, conn: u64) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.tx = None;
        c.stats.open = false;
        let producers: Vec<(u64, u64)> = self
            .producers
            .keys()
            .filter(|k| k.0 == conn)
            .copied()
            .collect();
        for key in producers {
            self.remove_producer(key);
        }
        let consumers: Vec<(u64, u64)> = self
            .consumers
            .keys()
            .filter(|k| k.0 == conn)
            .copied()
            .collect();
        let mut touched = BTreeSet::new();
        for key in consumers {
            if let Some(topic) = self.remove_consumer(key) {
                touched.insert(topic);
            }
        }
        self.dispatch_topics(touched);
        self.flush();
    }

    pub(super) fn send_ping(&mut self, conn: u64) {
        let mut ping = command(Type::Ping);
        ping.ping = Some(CommandPing {});
        self.push(conn, ping, Kind::Other);
        self.flush();
    }

    pub(super) fn keep_alive_expired(&mut self) {
        self.fault_stats.keep_alive_timeouts += 1;
    }

    pub(super) fn malformed_frame(&mut self) {
        self.fault_stats.malformed_frames += 1;
    }

    pub(super) fn disconnect_all(&mut self) -> usize {
        let mut closed = 0;
        for conn in self.conns.values().filter(|c| c.stats.open) {
            conn.token.cancel();
            closed += 1;
        }
        self.fault_stats.disconnected_by_admin += closed as u64;
        closed
    }

    /// Unloads `topic` (and its partitions), as `pulsar-admin topics unload`: every producer
    /// and consumer on it is closed with `CLOSE_PRODUCER` / `CLOSE_CONSUMER` (their
    /// connections stay open) and what the consumers had not acknowledged goes back to the
    /// subscription; the data stays, and the topic is loaded again: its subscriptions keep
    /// their cursors and the pending acks of open transactions, and lose what the broker
    /// kept only in memory, their dispatchers with them. Returns how many producers and
    /// consumers were closed.
    pub(super) fn unload(&mut self, topic: &str, assigned: Option<String>) -> (usize, usize) {
        let Ok(base) = normalize(topic) else {
            return (0, 0);
        };
        let on_topic =
            |name: &str| name == base || split_partition(name).is_some_and(|(of, _)| of == base);
        let producers: Vec<(u64, u64)> = self
            .producers
            .iter()
            .filter(|(_, info)| on_topic(&info.topic))
            .map(|(key, _)| *key)
            .collect();
        for &(conn, producer_id) in &producers {
            let mut close = command(Type::CloseProducer);
            close.close_producer = Some(pulsar_wire::pb::CommandCloseProducer {
                producer_id,
                request_id: 0,
                assigned_broker_service_url: assigned.clone(),
                ..Default::default()
            });
            self.push(conn, close, Kind::Other);
            self.remove_producer((conn, producer_id));
        }
        let consumers: Vec<(u64, u64)> = self
            .consumers
            .iter()
            .filter(|(_, r)| on_topic(&r.topic))
            .map(|(key, _)| *key)
            .collect();
        let mut touched = BTreeSet::new();
        for &(conn, consumer_id) in &consumers {
            let mut close = command(Type::CloseConsumer);
            close.close_consumer = Some(pulsar_wire::pb::CommandCloseConsumer {
                consumer_id,
                request_id: 0,
                assigned_broker_service_url: assigned.clone(),
                ..Default::default()
            });
            self.push(conn, close, Kind::Other);
            if let Some(topic) = self.remove_consumer((conn, consumer_id)) {
                touched.insert(topic);
            }
        }
        for (_, topic) in self.topics.iter_mut().filter(|(name, _)| on_topic(name)) {
            for subscription in topic.subscriptions.values_mut() {
                subscription.reloaded();
            }
        }
        self.dispatch_topics(touched);
        self.flush();
        (producers.len(), consumers.len())
    }

    pub(super) fn faults(&self) -> &Faults {
        &self.faults
    }

    pub(super) fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    // ----- output --------------------------------------------------------------------------

    fn push(&mut self, conn: u64, command: BaseCommand, kind: Kind) {
        self.out.push(Outgoing {
            conn,
            frame: Box::new(Frame::command(command)),
            kind,
        });
    }

    fn reply(&mut self, conn: u64, command: BaseCommand) {
        self.push(conn, command, Kind::Response);
    }

    fn error(&mut self, conn: u64, request_id: u64, (code, message): Refusal) {
        let mut cmd = command(Type::Error);
        cmd.error = Some(CommandError {
            request_id,
            error: code as i32,
            message,
        });
        self.reply(conn, cmd);
    }

    fn success(&mut self, conn: u64, request_id: u64) {
        let mut cmd = command(Type::Success);
        cmd.success = Some(CommandSuccess { request_id });
        self.reply(conn, cmd);
    }

    /// Hands the queued frames to the writers, deciding the faults of each.
    fn flush(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        for item in out.drain(..) {
            let Some(conn) = self.conns.get_mut(&item.conn) else {
                continue;
            };
            let Some(tx) = &conn.tx else {
                continue;
            };
            let (mut delay, mut corrupt) = (Duration::ZERO, false);
            match item.kind {
                Kind::Response => {
                    delay = self.faults.delay();
                    if !delay.is_zero() {
                        self.fault_stats.delayed_responses += 1;
                    }
                }
                Kind::Message => {
                    corrupt = chance(&mut self.rng, self.faults.corrupted_rate());
                    if corrupt {
                        self.fault_stats.corrupted_messages += 1;
                    }
                }
                Kind::Other => {}
            }
            *self.sent.entry(item.frame.command.r#type).or_default() += 1;
            conn.stats.frames_sent += 1;
            let _ = tx.send(Out::Frame {
                frame: item.frame,
                delay,
                corrupt,
            });
        }
        self.out = out;
        for conn in std::mem::take(&mut self.closing) {
            if let Some(tx) = self.conns.get(&conn).and_then(|c| c.tx.as_ref()) {
                let _ = tx.send(Out::Close);
            }
        }
    }

    fn dispatch_topics(&mut self, topics: impl IntoIterator<Item = String>) {
        let now_ms = self.clock.now_ms();
        for name in topics {
            if let Some(topic) = self.topics.get_mut(&name) {
                topic.dispatch(&mut self.out, now_ms);
            }
        }
    }

    /// A wake-up for the next delayed entry due, when none is scheduled as early: its time
    /// (milliseconds since the epoch) and generation, for the server to schedule.
    pub(super) fn schedule_wake(&mut self) -> Option<(i64, u64)> {
        let due = self.topics.values().filter_map(Topic::next_due).min()?;
        if self.wake.is_some_and(|(at, _)| at <= due) {
            return None;
        }
        self.wake_generation += 1;
        self.wake = Some((due, self.wake_generation));
        self.wake
    }

    /// How long until `at` (milliseconds since the epoch) on the emulator's clock.
    pub(super) fn until(&self, at: i64) -> Duration {
        Duration::from_millis(u64::try_from(at - self.clock.now_ms()).unwrap_or(0))
    }

    /// The wake-up of `generation` came: the subscriptions send what came due; returns the
    /// next wake-up, unless an earlier one replaced this one.
    pub(super) fn wake(&mut self, generation: u64) -> Option<(i64, u64)> {
        if self.wake.map(|(_, current)| current) != Some(generation) {
            return None;
        }
        self.wake = None;
        let delaying: Vec<String> = self
            .topics
            .iter()
            .filter(|(_, topic)| topic.next_due().is_some())
            .map(|(name, _)| name.clone())
            .collect();
        self.dispatch_topics(delaying);
        self.flush();
        self.schedule_wake()
    }
    // ----- topics --------------------------------------------------------------------------

    fn ensure_topic(&mut self, name: &str, partition: i32) {
        if self.topics.contains_key(name) {
            return;
        }
        self.next_ledger += 1;
        let mut topic = Topic::new(name.to_string(), partition, self.next_ledger);
        topic.max_unacked = self.policies.get(name).copied().or_else(|| {
            split_partition(name).and_then(|(base, _)| self.policies.get(base).copied())
        });
        self.topics.insert(name.to_string(), topic);
    }

    /// The topic a PRODUCER or SUBSCRIBE names, created if allowed.
    fn resolve_topic(&mut self, name: &str, create: bool) -> Result<String, Refusal> {
        let full = normalize(name).map_err(|r| (ServerError::InvalidTopicName, r))?;
        if self.topics.contains_key(&full) {
            return Ok(full);
        }
        if self.partitioned.contains_key(&full) {
            return Err((
                ServerError::NotAllowedError,
                format!(
                    "{full} is a partitioned topic: produce to and consume from its partitions ({full}-partition-N)"
                ),
            ));
        }
        if let Some((base, index)) = split_partition(&full)
            && let Some(&partitions) = self.partitioned.get(base)
        {
            if index < partitions {
                self.ensure_topic(&full, index as i32);
                return Ok(full);
            }
            return Err((
                ServerError::TopicNotFound,
                format!("{base} has {partitions} partitions; {full} does not exist"),
            ));
        }
        if create && self.config.auto_topic_creation {
            self.ensure_topic(&full, -1);
            return Ok(full);
        }
        Err((
            ServerError::TopicNotFound,
            format!("topic {full} does not exist and auto-creation is off"),
        ))
    }

    fn partitions_of(&mut self, name: &str) -> Result<u32, Refusal> {
        let full = normalize(name).map_err(|r| (ServerError::InvalidTopicName, r))?;
        if let Some(&n) = self.partitioned.get(&full) {
            return Ok(n);
        }
        if self.topics.contains_key(&full)
            || split_partition(&full).is_some_and(|(base, _)| self.partitioned.contains_key(base))
        {
            return Ok(0);
        }
        if self.config.auto_topic_creation {
            let n = self.config.auto_created_partitions;
            if n > 0 {
                self.partitioned.insert(full, n);
            }
            return Ok(n);
        }
        Err((
            ServerError::TopicNotFound,
            format!("topic {full} does not exist and auto-creation is off"),
        ))
    }

    fn lookup(&self, name: &str) -> Result<(), Refusal> {
        let full = normalize(name).map_err(|r| (ServerError::InvalidTopicName, r))?;
        let base = split_partition(&full).map_or(full.as_str(), |(base, _)| base);
        if self.config.auto_topic_creation
            || self.topics.contains_key(&full)
            || self.partitioned.contains_key(base)
            || self.partitioned.contains_key(&full)
        {
            return Ok(());
        }
        Err((
            ServerError::TopicNotFound,
            format!("topic {full} does not exist and auto-creation is off"),
        ))
    }

    // ----- admin ---------------------------------------------------------------------------

    pub(super) fn create_topic(&mut self, name: &str, partitions: u32) -> Result<(), Error> {
        let invalid = |reason: String| Error::Invalid {
            what: "topic",
            reason,
        };
        let full = normalize(name).map_err(invalid)?;
        if self.partitioned.contains_key(&full) {
            return Err(invalid(format!(
                "{full} already exists as a partitioned topic"
            )));
        }
        if self.topics.contains_key(&full) {
            return Err(invalid(format!("{full} already exists")));
        }
        if split_partition(&full).is_some() {
            return Err(invalid(format!(
                "{full} names a partition; create the partitioned topic instead"
            )));
        }
        if partitions == 0 {
            self.ensure_topic(&full, -1);
        } else {
            self.partitioned.insert(full, partitions);
        }
        Ok(())
    }

    pub(super) fn update_partitions(&mut self, name: &str, partitions: u32) -> Result<(), Error> {
        let invalid = |reason: String| Error::Invalid {
            what: "partition count",
            reason,
        };
        let full = normalize(name).map_err(invalid)?;
        let Some(&current) = self.partitioned.get(&full) else {
            return Err(invalid(format!(
                "{full} is not a partitioned topic; create it with partitions first"
            )));
        };
        if partitions <= current {
            return Err(invalid(format!(
                "{full} has {current} partitions; the new count must be larger \
                 ({partitions} given), partitions cannot be removed"
            )));
        }
        // The durable subscriptions of the existing partitions, created on the new ones.
        let prefix = format!("{full}-partition-");
        let mut subscriptions = BTreeMap::new();
        for (topic_name, topic) in &self.topics {
            if topic_name.starts_with(&prefix) {
                for (sub_name, sub) in &topic.subscriptions {
                    if sub.durable {
                        subscriptions
                            .entry(sub_name.clone())
                            .or_insert(sub.sub_type);
                    }
                }
            }
        }
        self.partitioned.insert(full.clone(), partitions);
        for index in current..partitions {
            let partition_name = format!("{prefix}{index}");
            self.ensure_topic(&partition_name, index as i32);
            let topic_max = self.topics.get(&partition_name).and_then(|t| t.max_unacked);
            let configs: Vec<_> = subscriptions
                .iter()
                .map(|(name, &sub_type)| {
                    let config = self.model_config(topic_max, sub_type, true);
                    (name.clone(), sub_type, config)
                })
                .collect();
            if let Some(topic) = self.topics.get_mut(&partition_name) {
                for (sub_name, sub_type, config) in configs {
                    topic
                        .subscriptions
                        .entry(sub_name.clone())
                        .or_insert_with(|| Subscription::new(sub_name, sub_type, true, 0, config));
                }
            }
        }
        Ok(())
    }

    pub(super) fn set_max_unacked(&mut self, name: &str, max: u32) -> Result<(), Error> {
        let full = normalize(name).map_err(|reason| Error::Invalid {
            what: "topic",
            reason,
        })?;
        let prefix = format!("{full}-partition-");
        for (topic_name, topic) in &mut self.topics {
            if *topic_name == full || topic_name.starts_with(&prefix) {
                topic.max_unacked = Some(max);
                // Connected consumers of durable Shared and Key_Shared subscriptions take the
                // new limit at once, as on a real 4.0.x broker.
                let limited = topic
                    .subscriptions
                    .values_mut()
                    .filter(|s| s.durable && s.shared());
                for subscription in limited {
                    subscription.set_max_unacked_messages(max);
                }
            }
        }
        self.policies.insert(full, max);
        Ok(())
    }

    pub(super) fn stats(&self) -> Stats {
        let topics = self
            .topics
            .values()
            .map(|t| {
                let view = TopicView {
                    entries: &t.entries,
                    ledger_id: t.ledger_id,
                    partition: t.partition,
                    now_ms: self.clock.now_ms(),
                };
                let (entries, messages) = t.visible_totals();
                let count = |f: fn(&Visibility) -> bool| {
                    t.entries.iter().filter(|e| f(&e.visibility)).count() as u64
                };
                TopicStats {
                    name: t.name.clone(),
                    partition: t.partition,
                    ledger_id: t.ledger_id,
                    entries,
                    messages,
                    pending_txn_entries: count(|v| matches!(v, Visibility::Pending(_))),
                    aborted_entries: count(|v| *v == Visibility::Aborted),
                    max_unacked_messages: t.max_unacked,
                    producers: t.producers.len(),
                    subscriptions: t.subscriptions.values().map(|s| s.stats(&view)).collect(),
                }
            })
            .collect();
        Stats {
            topics,
            partitioned_topics: self.partitioned.clone(),
            commands_received: self.received.clone(),
            commands_sent: self.sent.clone(),
            unmodelled_commands: self.unmodelled.clone(),
            connections: self.conns.values().map(|c| c.stats.clone()).collect(),
            transactions: self.tc.stats,
            faults: self.fault_stats,
        }
    }
}
