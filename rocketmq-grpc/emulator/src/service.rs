//! The shared emulator state and the tonic `MessagingService` implementation.
//!
//! Every RPC goes through [`Service::admit`] first (counters, injected connection drops, the
//! signature, the client id, injected delays and flow limits), then validates its request the
//! way the proxy does and answers with the proxy's codes in the response `status` (the gRPC
//! status stays OK except for injected `UNAVAILABLE`).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use sha1::{Digest as _, Sha1};
use tokio::sync::{Notify, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Streaming};

use super::auth;
use super::clock::{Clock, duration_ms, ms_to_proto, proto_duration_ms};
use super::config::{Config, ProxyMode};
use super::counters::{Counters, Rpc, add, inc};
use super::faults::{FaultConfig, FaultState, ScriptedFailure};
use super::filter::Filter;
use super::handle::ReceiptHandle;
use super::lite::{
    LITE_SUBSCRIPTION_QUOTA, LiteRegistry, MAX_LITE_TOPIC_SIZE, check_name as check_lite_name,
};
use super::state::{
    AckApplied, ChangeApplied, Delivery, PopOutcome, PopRequest, StoredMessage, TopicInner,
    TopicKind, Verdict,
};
use super::validate;
use crate::server::messaging_service_server::MessagingService;
use rocketmq_grpc::pb::{
    self, Code, receive_message_response, retry_policy, settings, telemetry_command,
};

/// A topic: its queues behind one lock, and what wakes long polls.
#[derive(Debug)]
pub(crate) struct Topic {
    pub(crate) kind: TopicKind,
    /// Wakes every waiting long poll (without a suspension gap).
    pub(crate) notify: Notify,
    /// The suspended long polls (with a suspension gap): when each expires, and its waker.
    suspended: Mutex<Vec<(u64, tokio::sync::oneshot::Sender<()>)>>,
    rr: AtomicUsize,
    pub(crate) inner: Mutex<TopicInner>,
}

impl Topic {
    pub(crate) fn new(kind: TopicKind, queues: usize) -> Self {
        Self {
            kind,
            notify: Notify::new(),
            suspended: Mutex::new(Vec::new()),
            rr: AtomicUsize::new(0),
            inner: Mutex::new(TopicInner::new(queues)),
        }
    }

    /// A message arrived, became visible or was unblocked: every waiting long poll is woken;
    /// with a suspension gap (`one`), as the broker, only the suspended one that expires
    /// first.
    pub(crate) fn wake(&self, one: bool) {
        if !one {
            self.notify.notify_waiters();
            return;
        }
        let mut suspended = self.suspended.lock();
        suspended.sort_by_key(|(expires, _)| *expires);
        while !suspended.is_empty() {
            let (_, waker) = suspended.remove(0);
            if waker.send(()).is_ok() {
                break;
            }
        }
    }

    /// Wakes every long poll, suspended or waiting (the clock moved, shutdown).
    fn wake_every_poll(&self) {
        self.notify.notify_waiters();
        for (_, waker) in self.suspended.lock().drain(..) {
            let _ = waker.send(());
        }
    }

    /// Suspends a long poll until `expires_ms`: the returned receiver fires when an arrival
    /// wakes it.
    fn suspend(&self, expires_ms: u64) -> tokio::sync::oneshot::Receiver<()> {
        let (waker, woken) = tokio::sync::oneshot::channel();
        let mut suspended = self.suspended.lock();
        // Polls that ended (long poll over, cancelled) leave their wakers behind.
        suspended.retain(|(_, waker)| !waker.is_closed());
        suspended.push((expires_ms, waker));
        woken
    }

    pub(crate) fn queue_count(&self) -> usize {
        self.inner.lock().queues.len()
    }

    fn next_rr(&self) -> usize {
        self.rr.fetch_add(1, Ordering::Relaxed)
    }
}

/// Everything the service and the [`Emulator`](super::Emulator) handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) clock: Clock,
    pub(crate) topics: RwLock<HashMap<String, Arc<Topic>>>,
    /// Consumer group → FIFO (`consumeMessageOrderly`).
    pub(crate) groups: RwLock<HashMap<String, bool>>,
    /// Clients with a channel (seen in Heartbeat or Telemetry, not terminated).
    pub(crate) clients: Mutex<BTreeSet<String>>,
    /// Clients that announced their settings on the telemetry stream.
    pub(crate) settings_seen: Mutex<BTreeSet<String>>,
    /// What [`Emulator::forget_clients`](super::Emulator::forget_clients) left behind.
    pub(crate) forgotten: Mutex<Forgotten>,
    pub(crate) counters: Counters,
    pub(crate) faults: Mutex<FaultState>,
    pub(crate) seq: AtomicU64,
    message_ids: AtomicU64,
    pub(crate) shutdown: CancellationToken,
    /// The token of the current serving period (a child of `shutdown`), cancelled when the
    /// service is taken down with [`Emulator::stop_serving`](super::Emulator::stop_serving).
    pub(crate) serving: Mutex<CancellationToken>,
    /// What clients asked of `SendMessage` (most recent last, at most [`SEND_LOG_MAX`]).
    pub(crate) send_log: Mutex<std::collections::VecDeque<SendRecord>>,
    /// The address routes advertise; set once the listener is bound.
    pub(crate) advertised: OnceLock<SocketAddr>,
    /// Half messages of open transactions: transaction id → (topic, message).
    pub(crate) halves: Mutex<HashMap<String, (String, StoredMessage)>>,
    /// Lite groups, clients and subscriptions.
    pub(crate) lite: LiteRegistry,
    /// The light queue of each lite topic, by (parent, lite topic): one queue each.
    pub(crate) light_queues: RwLock<HashMap<(String, String), Arc<Topic>>>,
    /// Topic → the only queues `QueryAssignment` assigns ([`Emulator::assign_only`]).
    ///
    /// [`Emulator::assign_only`]: super::Emulator::assign_only
    pub(crate) assigned: Mutex<HashMap<String, Vec<u32>>>,
}

/// The most `SendMessage` calls [`Emulator::send_log`](super::Emulator::send_log) keeps.
pub(crate) const SEND_LOG_MAX: usize = 10_000;

/// One `SendMessage` call as the emulator saw it ([`Emulator::send_log`](super::Emulator::send_log)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendRecord {
    /// The message ids of the request, in order.
    pub message_ids: Vec<String>,
    /// The queue the client chose (`SystemProperties.queue_id` of the first message). Like the
    /// open-source proxy, the emulator picks the queue itself; this is what the client asked.
    pub queue_id: i32,
    /// The answer's top-level code (`UNSPECIFIED` for a call aborted at the gRPC level).
    pub code: Code,
}

/// The clients forgotten by [`Emulator::forget_clients`](super::Emulator::forget_clients)
/// (as a restarted proxy forgets them), and what each did since.
#[derive(Debug, Default)]
pub(crate) struct Forgotten {
    /// Forgotten clients that have not announced their settings again: their
    /// `QueryAssignment` is answered `INTERNAL_SERVER_ERROR` `"settings" is null`, as the
    /// proxy's `ClusterTopicRouteService` after a restart.
    pub(crate) without_settings: BTreeSet<String>,
    /// Per forgotten client, its control-plane calls since (at most [`CONTROL_LOG_CAP`]):
    /// the RPC and whether it was answered OK.
    pub(crate) log: HashMap<String, Vec<(Rpc, bool)>>,
    /// Cancelled to end the telemetry streams open at the time.
    pub(crate) streams: CancellationToken,
}

/// The most calls [`Forgotten::log`] keeps per client.
pub(crate) const CONTROL_LOG_CAP: usize = 256;

impl Shared {
    /// Logs a control-plane call of a forgotten client.
    fn log_control(&self, client_id: &str, rpc: Rpc, ok: bool) {
        let mut forgotten = self.forgotten.lock();
        if let Some(log) = forgotten.log.get_mut(client_id)
            && log.len() < CONTROL_LOG_CAP
        {
            log.push((rpc, ok));
        }
    }
}

/// Outcome of storing messages.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) queue_id: usize,
    pub(crate) offsets: Vec<u64>,
}

impl Shared {
    pub(crate) fn new(config: Config, faults: FaultConfig, seed: u64) -> Self {
        let shutdown = CancellationToken::new();
        Self {
            config,
            clock: Clock::new(),
            topics: RwLock::new(HashMap::new()),
            groups: RwLock::new(HashMap::new()),
            clients: Mutex::new(BTreeSet::new()),
            settings_seen: Mutex::new(BTreeSet::new()),
            forgotten: Mutex::new(Forgotten::default()),
            counters: Counters::default(),
            faults: Mutex::new(FaultState::new(faults, seed)),
            seq: AtomicU64::new(0),
            message_ids: AtomicU64::new(0),
            serving: Mutex::new(shutdown.child_token()),
            shutdown,
            send_log: Mutex::new(std::collections::VecDeque::new()),
            advertised: OnceLock::new(),
            halves: Mutex::new(HashMap::new()),
            lite: LiteRegistry::default(),
            light_queues: RwLock::new(HashMap::new()),
            assigned: Mutex::new(HashMap::new()),
        }
    }

    /// The light queue of `lite` under `parent`, if a message made it.
    pub(crate) fn light_queue(&self, parent: &str, lite: &str) -> Option<Arc<Topic>> {
        self.light_queues
            .read()
            .get(&(parent.to_owned(), lite.to_owned()))
            .cloned()
    }

    /// The topic a request about a message of `topic` acts on: the light queue of its lite
    /// topic when it names one (`TOPIC_NOT_FOUND` when no message made it), else the topic.
    fn topic_or_light(&self, topic: &str, lite: Option<&str>) -> Result<Arc<Topic>, pb::Status> {
        let parent = topic_of(self, topic)?;
        match lite.filter(|l| !l.is_empty()) {
            Some(lite) => self.light_queue(topic, lite).ok_or_else(|| {
                status(
                    Code::TopicNotFound,
                    format!("lite topic [{lite}] of [{topic}] does not exist"),
                )
            }),
            None => Ok(parent),
        }
    }

    /// Stores lite messages as the broker does: on the parent's queue the lite topic hashes
    /// to (as the proxy selects it) and on the lite topic's light queue (made on the first
    /// message); wakes the parent's long polls (lite receives wait there).
    fn store_lite(&self, parent_name: &str, parent: &Topic, msgs: Vec<StoredMessage>) -> Stored {
        let lite = msgs
            .first()
            .and_then(|m| m.lite_topic.clone())
            .unwrap_or_default();
        let queue = self.select_queue(parent, Some(&lite), parent.queue_count());
        let light = {
            let key = (parent_name.to_owned(), lite);
            let existing = self.light_queues.read().get(&key).cloned();
            existing.unwrap_or_else(|| {
                Arc::clone(
                    self.light_queues
                        .write()
                        .entry(key)
                        .or_insert_with(|| Arc::new(Topic::new(TopicKind::Lite, 1))),
                )
            })
        };
        light.inner.lock().append(0, msgs.clone());
        self.store(parent, Some(queue), msgs)
    }

    /// The token of the current serving period.
    pub(crate) fn serving(&self) -> CancellationToken {
        self.serving.lock().clone()
    }

    fn log_send(&self, record: SendRecord) {
        let mut log = self.send_log.lock();
        if log.len() >= SEND_LOG_MAX {
            log.pop_front();
        }
        log.push_back(record);
    }

    pub(crate) fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().get(name).cloned()
    }

    /// Whether the group exists (creating it when auto-creation is on); `Some(fifo)`.
    fn group_fifo(&self, name: &str) -> Option<bool> {
        if let Some(fifo) = self.groups.read().get(name) {
            return Some(*fifo);
        }
        if self.config.auto_create_groups {
            return Some(*self.groups.write().entry(name.to_owned()).or_insert(false));
        }
        None
    }

    /// Wakes every long poll (clock moved, shutdown).
    pub(crate) fn wake_all(&self) {
        for t in self.topics.read().values() {
            t.wake_every_poll();
        }
    }

    /// A new id for a batch send: upper-case hex, as the proxy's (`MessageClientIDSetter`).
    pub(crate) fn next_batch_id(&self) -> String {
        let n = self.message_ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{:08X}{n:024X}", std::process::id())
    }

    pub(crate) fn next_message_id(&self) -> String {
        let n = self.message_ids.fetch_add(1, Ordering::Relaxed) + 1;
        format!("EMU{n:029X}")
    }

    fn advertised(&self) -> SocketAddr {
        self.advertised
            .get()
            .copied()
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    fn endpoints(&self) -> pb::Endpoints {
        let addr = self.advertised();
        let scheme = if addr.is_ipv6() {
            pb::AddressScheme::IPv6
        } else {
            pb::AddressScheme::IPv4
        };
        pb::Endpoints {
            scheme: scheme as i32,
            addresses: vec![pb::Address {
                host: addr.ip().to_string(),
                port: i32::from(addr.port()),
            }],
        }
    }

    fn broker(&self) -> pb::Broker {
        pb::Broker {
            name: self.config.broker_name.clone(),
            id: 0,
            endpoints: Some(self.endpoints()),
        }
    }

    /// Picks the queue for a send as the proxy does: the hash of the message group when a
    /// single message has one, round robin otherwise.
    fn select_queue(&self, topic: &Topic, group: Option<&str>, queues: usize) -> usize {
        if queues == 0 {
            return 0;
        }
        match group {
            Some(g) if !g.is_empty() => {
                // FNV-1a: stable across runs and platforms.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in g.bytes() {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
                usize::try_from(h % queues as u64).unwrap_or(0)
            }
            _ => topic.next_rr() % queues,
        }
    }

    /// Stores messages in one queue (chosen unless `queue` is given) and wakes long polls.
    pub(crate) fn store(
        &self,
        topic: &Topic,
        queue: Option<usize>,
        msgs: Vec<StoredMessage>,
    ) -> Stored {
        let n = msgs.len() as u64;
        let group = if msgs.len() == 1 {
            msgs[0].message_group.as_deref().map(str::to_owned)
        } else {
            None
        };
        let stored = {
            let mut inner = topic.inner.lock();
            let queues = inner.queues.len();
            let queue_id =
                queue.unwrap_or_else(|| self.select_queue(topic, group.as_deref(), queues));
            let offsets = inner.append(queue_id, msgs);
            Stored { queue_id, offsets }
        };
        add(&self.counters.messages_stored, n);
        topic.wake(!self.config.pop_suspension_gap.is_zero());
        stored
    }

    fn register_client(&self, client_id: &str) {
        let mut clients = self.clients.lock();
        if !clients.contains(client_id) {
            clients.insert(client_id.to_owned());
        }
    }

    fn client_connected(&self, client_id: &str) -> bool {
        self.clients.lock().contains(client_id)
    }
}

/// Builds a stored message (SHA-1 digest, store time).
#[allow(clippy::too_many_arguments)]
pub(crate) fn stored_message(
    message_id: String,
    body: Bytes,
    tag: Option<String>,
    keys: Vec<String>,
    user_properties: HashMap<String, String>,
    message_group: Option<String>,
    born_timestamp: Option<prost_types::Timestamp>,
    born_host: String,
) -> StoredMessage {
    let body_sha1 = hex::encode_upper(Sha1::digest(&body));
    StoredMessage {
        message_id,
        body,
        tag,
        keys,
        user_properties,
        message_group: message_group.filter(|g| !g.is_empty()).map(Arc::from),
        born_timestamp,
        born_host,
        store_timestamp: prost_types::Timestamp::from(SystemTime::now()),
        body_sha1,
        delivery_timestamp: None,
        due_ms: None,
        priority: None,
        lite_topic: None,
    }
}

/// A status.
pub(crate) fn status(code: Code, message: impl Into<String>) -> pb::Status {
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

fn ok() -> pb::Status {
    status(Code::Ok, "OK")
}

/// The name of an optional resource ("" when absent).
fn name(r: Option<&pb::Resource>) -> &str {
    r.map_or("", |r| r.name.as_str())
}

/// The top-level status of a multi-entry answer: one distinct code → that code (with its
/// message when there is one entry), several → MULTIPLE_RESULTS, none → `empty`.
fn top_level<'a>(statuses: impl Iterator<Item = &'a pb::Status>, empty: &str) -> pb::Status {
    let mut codes = BTreeSet::new();
    let mut first: Option<&pb::Status> = None;
    let mut n = 0usize;
    for st in statuses {
        codes.insert(st.code);
        first.get_or_insert(st);
        n += 1;
    }
    match (codes.len(), first) {
        (0, _) | (_, None) => status(Code::InternalServerError, empty),
        (1, Some(st)) if n == 1 => st.clone(),
        (1, Some(st)) => {
            let code = Code::try_from(st.code).unwrap_or(Code::Unspecified);
            status(code, code.as_str_name())
        }
        _ => status(Code::MultipleResults, "MULTIPLE_RESULTS"),
    }
}

/// Why a call stopped before processing.
#[derive(Debug)]
enum Reject {
    /// A gRPC error status (injected connection drop).
    Grpc(tonic::Status),
    /// A proxy code in the response status.
    Code(pb::Status),
}

/// What a call carries besides its message.
#[derive(Debug)]
struct Ctx {
    client_id: String,
    client_version: Option<String>,
    remaining_ms: Option<u64>,
}

/// Response types that carry a top-level status.
trait WithStatus: Default {
    fn set_status(&mut self, st: pb::Status);

    fn from_status(st: pb::Status) -> Self {
        let mut r = Self::default();
        r.set_status(st);
        r
    }
}

macro_rules! with_status {
    ($($t:ty),* $(,)?) => {
        $(impl WithStatus for $t {
            fn set_status(&mut self, st: pb::Status) {
                self.status = Some(st);
            }
        })*
    };
}

with_status!(
    pb::QueryRouteResponse,
    pb::HeartbeatResponse,
    pb::SendMessageResponse,
    pb::QueryAssignmentResponse,
    pb::AckMessageResponse,
    pb::NotifyClientTerminationResponse,
    pb::ChangeInvisibleDurationResponse,
    pb::EndTransactionResponse,
    pb::ForwardMessageToDeadLetterQueueResponse,
    pb::SyncLiteSubscriptionResponse,
);

fn unary<T: WithStatus>(r: Result<T, pb::Status>) -> Result<Response<T>, tonic::Status> {
    Ok(Response::new(r.unwrap_or_else(T::from_status)))
}

fn reject_unary<T: WithStatus>(r: Reject) -> Result<Response<T>, tonic::Status> {
    match r {
        Reject::Grpc(st) => Err(st),
        Reject::Code(st) => Ok(Response::new(T::from_status(st))),
    }
}

/// A lite client's pop: the light queues of the lite topics it subscribed to, in name order,
/// until `pop.max` messages.
fn pop_light_queues(
    s: &Shared,
    parent: &str,
    client_id: &str,
    mut pop: PopRequest<'_>,
) -> PopOutcome {
    let mut out = PopOutcome::default();
    let max = pop.max;
    pop.queues = vec![0];
    for lite in s.lite.subscribed(pop.group, client_id) {
        let want = max.saturating_sub(out.deliveries.len());
        if want == 0 {
            break;
        }
        let Some(light) = s.light_queue(parent, &lite) else {
            continue;
        };
        pop.max = want;
        let got = light.inner.lock().pop(&pop, &s.seq, &s.counters);
        out.deliveries.extend(got.deliveries);
        if let Some(d) = got.next_deadline_ms {
            out.next_deadline_ms = Some(out.next_deadline_ms.map_or(d, |x| x.min(d)));
        }
    }
    out
}

/// Validates a topic name and finds the topic.
fn topic_of(shared: &Shared, topic: &str) -> Result<Arc<Topic>, pb::Status> {
    validate::topic(topic).map_err(|m| status(Code::IllegalTopic, m))?;
    shared.topic(topic).ok_or_else(|| {
        status(
            Code::TopicNotFound,
            format!("topic [{topic}] does not exist"),
        )
    })
}

/// Validates a group name and finds the group; `Ok(fifo)`.
fn group_of(shared: &Shared, group: &str) -> Result<bool, pb::Status> {
    validate::group(group).map_err(|m| status(Code::IllegalConsumerGroup, m))?;
    shared.group_fifo(group).ok_or_else(|| {
        status(
            Code::ConsumerGroupNotFound,
            format!("consumer group [{group}] does not exist"),
        )
    })
}

/// The property the proxy keeps a FIFO message's group in.
const SHARDING_KEY: &str = "__SHARDINGKEY";

/// The tonic service.
#[derive(Debug, Clone)]
pub(crate) struct Service {
    pub(crate) shared: Arc<Shared>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

impl Service {
    /// Header checks and request-level faults, in the proxy's order.
    async fn admit(&self, md: &MetadataMap, rpc: Rpc) -> Result<Ctx, Reject> {
        let s = &self.shared;
        s.counters.call(rpc);
        let scripted = s.faults.lock().take_scripted(rpc);
        match scripted {
            Some(ScriptedFailure::Unavailable) => {
                inc(&s.counters.injected_unavailable);
                return Err(Reject::Grpc(tonic::Status::unavailable(
                    "injected fault: connection dropped",
                )));
            }
            Some(ScriptedFailure::Code(code)) => {
                return Err(Reject::Code(status(code, "injected fault")));
            }
            None => {}
        }
        let (drop, delay, too_many) = {
            let mut f = s.faults.lock();
            if f.config.applies_to(rpc) {
                let drop = f.roll(|c| c.unavailable_rate);
                let delay = if f.roll(|c| c.delay_rate) {
                    let (min, max) = (f.config.delay_min, f.config.delay_max);
                    Some(f.prng.duration_between(min, max))
                } else {
                    None
                };
                let too_many = f.roll(|c| c.too_many_requests_rate);
                (drop, delay, too_many)
            } else {
                (false, None, false)
            }
        };
        if drop {
            inc(&s.counters.injected_unavailable);
            return Err(Reject::Grpc(tonic::Status::unavailable(
                "injected fault: connection dropped",
            )));
        }
        if let Err(m) = auth::verify(md, &s.config.credentials) {
            inc(&s.counters.rejected_requests);
            return Err(Reject::Code(status(Code::Unauthorized, m)));
        }
        let Some(client_id) = auth::client_id(md) else {
            inc(&s.counters.rejected_requests);
            return Err(Reject::Code(status(
                Code::ClientIdRequired,
                "header x-mq-client-id is required",
            )));
        };
        if let Some(d) = delay {
            inc(&s.counters.injected_delays);
            let serving = s.serving();
            tokio::select! {
                () = tokio::time::sleep(d) => {}
                () = serving.cancelled() => {}
            }
        }
        if too_many {
            inc(&s.counters.injected_too_many_requests);
            return Err(Reject::Code(status(Code::TooManyRequests, "flow limit")));
        }
        Ok(Ctx {
            client_id,
            client_version: auth::header(md, auth::CLIENT_VERSION).map(str::to_owned),
            remaining_ms: auth::grpc_timeout_ms(md),
        })
    }

    fn query_route_inner(
        &self,
        req: &pb::QueryRouteRequest,
    ) -> Result<pb::QueryRouteResponse, pb::Status> {
        let s = &self.shared;
        let topic = topic_of(s, name(req.topic.as_ref()))?;
        let resource = req.topic.clone().unwrap_or_default();
        let message_queues = (0..topic.queue_count())
            .map(|id| self.message_queue(&resource, topic.kind, id))
            .collect();
        Ok(pb::QueryRouteResponse {
            status: Some(ok()),
            message_queues,
        })
    }

    fn message_queue(&self, topic: &pb::Resource, kind: TopicKind, id: usize) -> pb::MessageQueue {
        pb::MessageQueue {
            topic: Some(topic.clone()),
            id: i32::try_from(id).unwrap_or(i32::MAX),
            permission: pb::Permission::ReadWrite as i32,
            broker: Some(self.shared.broker()),
            accept_message_types: vec![kind.message_type() as i32],
        }
    }

    fn query_assignment_inner(
        &self,
        req: &pb::QueryAssignmentRequest,
    ) -> Result<pb::QueryAssignmentResponse, pb::Status> {
        let s = &self.shared;
        let topic_name = name(req.topic.as_ref());
        validate::topic(topic_name).map_err(|m| status(Code::IllegalTopic, m))?;
        validate::group(name(req.group.as_ref()))
            .map_err(|m| status(Code::IllegalConsumerGroup, m))?;
        let topic = topic_of(s, topic_name)?;
        group_of(s, name(req.group.as_ref()))?;
        let resource = req.topic.clone().unwrap_or_default();
        let only = s.assigned.lock().get(topic_name).cloned();
        let assignments = (0..topic.queue_count())
            .filter(|id| {
                only.as_ref()
                    .is_none_or(|only| u32::try_from(*id).is_ok_and(|id| only.contains(&id)))
            })
            .map(|id| pb::Assignment {
                message_queue: Some(self.message_queue(&resource, topic.kind, id)),
            })
            .collect();
        Ok(pb::QueryAssignmentResponse {
            status: Some(ok()),
            assignments,
        })
    }

    fn send_inner(
        &self,
        req: pb::SendMessageRequest,
    ) -> Result<pb::SendMessageResponse, pb::Status> {
        let s = &self.shared;
        let cfg = &s.config;
        let Some(first) = req.messages.first() else {
            return Err(status(Code::MessageCorrupted, "no message to send"));
        };
        let topic_res = first.topic.clone().unwrap_or_default();
        validate::topic(&topic_res.name).map_err(|m| status(Code::IllegalTopic, m))?;
        let mut msgs = Vec::with_capacity(req.messages.len());
        let mut actual_types = Vec::with_capacity(req.messages.len());
        for m in req.messages {
            if m.topic.clone().unwrap_or_default() != topic_res {
                return Err(status(
                    Code::MessageCorrupted,
                    "topic in message is not same",
                ));
            }
            if cfg.reject_empty_body && m.body.is_empty() {
                return Err(status(
                    Code::MessageBodyEmpty,
                    "message body cannot be empty",
                ));
            }
            if cfg.max_body_size > 0 && m.body.len() > cfg.max_body_size {
                return Err(status(
                    Code::MessageBodyTooLarge,
                    format!("message body cannot exceed the max {}", cfg.max_body_size),
                ));
            }
            let sp = m.system_properties.unwrap_or_default();
            if sp.message_id.trim().is_empty() {
                return Err(status(Code::IllegalMessageId, "message id cannot be empty"));
            }
            let group = sp.message_group.clone().filter(|g| !g.is_empty());
            if let Some(g) = &group
                && g.trim().is_empty()
            {
                return Err(status(
                    Code::IllegalMessageGroup,
                    "message group cannot be the char sequence of whitespace",
                ));
            }
            let lite_topic = sp.lite_topic.clone().filter(|l| !l.is_empty());
            if let Some(lite) = &lite_topic {
                check_lite_name(lite).map_err(|m| status(Code::IllegalLiteTopic, m))?;
            }
            let actual = if group.is_some() {
                "FIFO"
            } else if sp.delivery_timestamp.is_some() {
                "DELAY"
            } else if sp.message_type == pb::MessageType::Transaction as i32 {
                "TRANSACTION"
            } else if sp.priority.is_some_and(|p| p >= 0) {
                "PRIORITY"
            } else if lite_topic.is_some() {
                "LITE"
            } else {
                "NORMAL"
            };
            actual_types.push(actual);
            let due_ms = match sp.delivery_timestamp {
                Some(at) => Some(self.due_ms(&at)?),
                None => None,
            };
            let mut stored = stored_message(
                sp.message_id,
                // Copied once: the decoded body is a slice of the request's decode buffer
                // (8 KiB at least), which a stored message would otherwise keep alive. Every
                // delivery then shares this copy.
                Bytes::copy_from_slice(&m.body),
                sp.tag,
                sp.keys,
                m.user_properties,
                group,
                sp.born_timestamp,
                sp.born_host,
            );
            stored.delivery_timestamp = sp.delivery_timestamp;
            stored.due_ms = due_ms;
            stored.priority = sp.priority.filter(|p| *p >= 0);
            stored.lite_topic = lite_topic;
            msgs.push(stored);
        }
        let topic = s.topic(&topic_res.name).ok_or_else(|| {
            status(
                Code::TopicNotFound,
                format!("topic [{}] does not exist", topic_res.name),
            )
        })?;
        let expected = match topic.kind {
            TopicKind::Normal => "NORMAL",
            TopicKind::Fifo => "FIFO",
            TopicKind::Transaction => "TRANSACTION",
            TopicKind::Delay => "DELAY",
            TopicKind::Priority => "PRIORITY",
            TopicKind::Lite => "LITE",
        };
        if let Some(actual) = actual_types.iter().find(|a| **a != expected) {
            return Err(status(
                Code::MessagePropertyConflictWithType,
                format!(
                    "TopicMessageType validate failed, the expected type is {expected}, but actual type is {actual}"
                ),
            ));
        }
        let ids: Vec<String> = msgs.iter().map(|m| m.message_id.clone()).collect();
        if topic.kind == TopicKind::Transaction {
            // Held until EndTransaction; the proxy answers the message id as the
            // transaction id.
            let mut halves = s.halves.lock();
            let mut entries = Vec::with_capacity(msgs.len());
            for message in msgs {
                let id = message.message_id.clone();
                halves.insert(id.clone(), (topic_res.name.clone(), message));
                entries.push(pb::SendResultEntry {
                    status: Some(ok()),
                    message_id: id.clone(),
                    transaction_id: id,
                    offset: 0,
                });
            }
            return Ok(pb::SendMessageResponse {
                status: Some(ok()),
                entries,
            });
        }
        // The proxy hands a request of several messages to the broker as one batch message.
        // A 5.3.3 broker stores every message with the first one's id, tag and user
        // properties (each keeps its own body and keys); a 5.5.0 broker keeps each message's
        // own. The proxy converts the one `SendResult` it gets back into one entry: the first
        // message's id as transaction id, the first message's queue offset, and as message id
        // a new id for the batch (local mode) or the messages' ids joined by commas (cluster
        // mode; seen on 5.3.3 and 5.5.0). A single message's entry carries its id as both.
        let batch = msgs.len() > 1;
        if batch
            && !cfg.batch_messages_apart
            && let Some((first, rest)) = msgs.split_first_mut()
        {
            for m in rest {
                m.message_id.clone_from(&first.message_id);
                m.tag.clone_from(&first.tag);
                m.user_properties.clone_from(&first.user_properties);
                m.message_group.clone_from(&first.message_group);
            }
        }
        let stored = match topic.kind {
            // As the 5.5.0 broker: priority p goes to queue min(p, queues - 1).
            TopicKind::Priority => {
                let last = topic.queue_count().saturating_sub(1);
                let level = msgs.first().and_then(|m| m.priority).unwrap_or(0);
                let queue = usize::try_from(level).unwrap_or(0).min(last);
                s.store(&topic, Some(queue), msgs)
            }
            TopicKind::Lite => s.store_lite(&topic_res.name, &topic, msgs),
            _ => s.store(&topic, None, msgs),
        };
        let entries = vec![pb::SendResultEntry {
            status: Some(ok()),
            message_id: if batch && cfg.proxy_mode == ProxyMode::Cluster {
                ids.join(",")
            } else if batch {
                s.next_batch_id()
            } else {
                ids[0].clone()
            },
            transaction_id: ids[0].clone(),
            offset: stored
                .offsets
                .first()
                .map_or(0, |o| i64::try_from(*o).unwrap_or(i64::MAX)),
        }];
        let st = top_level(
            entries.iter().filter_map(|e| e.status.as_ref()),
            "send status is empty",
        );
        Ok(pb::SendMessageResponse {
            status: Some(st),
            entries,
        })
    }

    /// The emulator time at which a message with delivery time `at` is due, or the proxy's
    /// `ILLEGAL_DELIVERY_TIME` for a time further ahead than `maxDelayTimeMills`
    /// (`validateDelayTime`). A time in the past is due at once, as on the real broker.
    fn due_ms(&self, at: &prost_types::Timestamp) -> Result<u64, pb::Status> {
        let s = &self.shared;
        let at_ms = i128::from(at.seconds) * 1000 + i128::from(at.nanos) / 1_000_000;
        let now_wall_ms = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i128);
        let ahead_ms = at_ms - now_wall_ms;
        let max_ms = i128::from(duration_ms(s.config.max_delay).min(i64::MAX as u64));
        if max_ms > 0 && ahead_ms > max_ms {
            return Err(status(
                Code::IllegalDeliveryTime,
                format!("the max delay time of message is too large, max is {max_ms}"),
            ));
        }
        let ahead = u64::try_from(ahead_ms.max(0)).unwrap_or(u64::MAX);
        Ok(s.clock.now_ms().saturating_add(ahead))
    }

    /// Long polling time after the proxy's clamps, or the status to answer with.
    fn polling_ms(&self, ctx: &Ctx, req: &pb::ReceiveMessageRequest) -> Result<u64, pb::Status> {
        let cfg = &self.shared.config;
        let min = duration_ms(cfg.min_long_polling);
        let max = duration_ms(cfg.max_long_polling);
        let requested = match req.long_polling_timeout.as_ref() {
            Some(d) => proto_duration_ms(d).map_or(max, |ms| u64::try_from(ms).unwrap_or(0)),
            // The proxy uses the remaining deadline minus half the request timeout (3 s).
            None => ctx.remaining_ms.map_or(max, |r| r.saturating_sub(1_500)),
        };
        let mut polling = requested.clamp(min, max.max(min));
        if let Some(remaining) = ctx.remaining_ms
            && polling > remaining
        {
            if remaining < min {
                let modern = ctx.client_version.as_deref().is_some_and(|v| v >= "5.0.3");
                let code = if modern {
                    Code::IllegalPollingTime
                } else {
                    Code::BadRequest
                };
                return Err(status(
                    code,
                    "The deadline time remaining is not enough for polling, please check network condition",
                ));
            }
            polling = remaining;
        }
        Ok(polling)
    }

    async fn receive_inner(
        &self,
        ctx: &Ctx,
        req: pb::ReceiveMessageRequest,
    ) -> Vec<pb::ReceiveMessageResponse> {
        let frame = |st: pb::Status| pb::ReceiveMessageResponse {
            content: Some(receive_message_response::Content::Status(st)),
        };
        match self.receive_messages(ctx, &req).await {
            Ok((topic_res, kind, deliveries)) => {
                let mut frames = Vec::with_capacity(deliveries.len() + 1);
                frames.push(frame(ok()));
                for d in &deliveries {
                    frames.push(pb::ReceiveMessageResponse {
                        content: Some(receive_message_response::Content::Message(
                            self.to_proto(&topic_res, kind, d),
                        )),
                    });
                }
                frames
            }
            Err(st) => vec![frame(st)],
        }
    }

    async fn receive_messages(
        &self,
        ctx: &Ctx,
        req: &pb::ReceiveMessageRequest,
    ) -> Result<(pb::Resource, TopicKind, Vec<Delivery>), pb::Status> {
        let s = &self.shared;
        let cfg = &s.config;
        let serving = s.serving();
        let polling = self.polling_ms(ctx, req)?;
        let group = name(req.group.as_ref());
        let mq = req.message_queue.clone().unwrap_or_default();
        let topic_res = mq.topic.clone().unwrap_or_default();
        validate::topic(&topic_res.name).map_err(|m| status(Code::IllegalTopic, m))?;
        validate::group(group).map_err(|m| status(Code::IllegalConsumerGroup, m))?;
        let renew = cfg.proxy_auto_renew && req.auto_renew;
        let invisible_ms = if renew {
            duration_ms(cfg.auto_renew_invisible)
        } else {
            let ms = req
                .invisible_duration
                .as_ref()
                .map_or(Some(0), proto_duration_ms);
            check_invisible(
                ms,
                duration_ms(cfg.min_invisible_recv),
                duration_ms(cfg.max_invisible),
            )?
        };
        let topic = topic_of(s, &topic_res.name)?;
        let orderly = group_of(s, group)?;
        if renew && cfg.require_client_channel && !s.client_connected(&ctx.client_id) {
            return Err(status(
                Code::MessageNotFound,
                format!("The client [{}] is disconnected.", ctx.client_id),
            ));
        }
        let filter = match req.filter_expression.as_ref() {
            Some(f) if f.r#type == pb::FilterType::Sql as i32 => Filter::sql(&f.expression)
                .map_err(|_| {
                    status(
                        Code::InternalServerError,
                        "org.apache.rocketmq.proxy.common.ProxyException: parse the consumer's \
                         subscription failed",
                    )
                })?,
            Some(f) => Filter::tags(&f.expression),
            None => Filter::All,
        };
        // As the 5.3.3 proxy: a receive pops from every queue of the broker, starting with the
        // one asked for (a receive on queue 0 got messages of queues 3 and 1).
        let n = topic.queue_count();
        let queues: Vec<usize> = if topic.kind == TopicKind::Priority {
            // The 5.5.0 proxy pops every queue of a priority topic, the highest first.
            (0..n).rev().collect()
        } else {
            let start = match usize::try_from(mq.id) {
                Ok(id) if id < n => id,
                _ => topic.next_rr(),
            };
            (0..n).map(|i| (start + i) % n.max(1)).collect()
        };
        // As the 5.3.3 proxy: more than 32 gets 32 (the broker's pop limit), and 0 (or less)
        // gets nothing: the poll ends with MESSAGE_NOT_FOUND "no new message" even with
        // messages waiting (tests/tests/rocketmq_simple.rs,
        // the_proxy_serves_at_most_32_messages_per_receive).
        let max = usize::try_from(req.batch_size)
            .unwrap_or(0)
            .min(cfg.max_receive_batch.max(1));
        let renew_client: Option<Arc<str>> = renew.then(|| Arc::from(ctx.client_id.as_str()));
        let end_ms = s.clock.now_ms().saturating_add(polling);
        let lite_client = s.lite.is_lite_client(&ctx.client_id);
        loop {
            let notified = topic.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now_ms = s.clock.now_ms();
            let out = {
                let pop = PopRequest {
                    group,
                    orderly,
                    queues: queues.clone(),
                    max,
                    invisible_ms,
                    renew: renew_client
                        .clone()
                        .map(|c| (c, duration_ms(cfg.renew_max))),
                    now_ms,
                    broker_name: &cfg.broker_name,
                    filter: &filter,
                };
                if lite_client {
                    pop_light_queues(s, &topic_res.name, &ctx.client_id, pop)
                } else {
                    topic.inner.lock().pop(&pop, &s.seq, &s.counters)
                }
            };
            if !out.deliveries.is_empty() {
                return Ok((topic_res, topic.kind, out.deliveries));
            }
            if now_ms >= end_ms || serving.is_cancelled() {
                inc(&s.counters.receives_empty);
                return Err(status(Code::MessageNotFound, "no new message"));
            }
            let wake = out.next_deadline_ms.map_or(end_ms, |d| d.min(end_ms));
            let wait = Duration::from_millis(wake.saturating_sub(now_ms).max(1));
            if cfg.pop_suspension_gap.is_zero() {
                tokio::select! {
                    () = &mut notified => {}
                    () = tokio::time::sleep(wait) => {}
                    () = serving.cancelled() => {}
                }
                continue;
            }
            // As the broker: suspended only after the gap; what arrives meanwhile wakes
            // nobody, and an arrival wakes one suspended receive.
            tokio::select! {
                () = tokio::time::sleep(cfg.pop_suspension_gap.min(wait)) => {}
                () = serving.cancelled() => continue,
            }
            let now_ms = s.clock.now_ms();
            if now_ms >= wake {
                continue;
            }
            let woken = topic.suspend(end_ms);
            let wait = Duration::from_millis(wake.saturating_sub(now_ms).max(1));
            tokio::select! {
                _ = woken => {}
                () = tokio::time::sleep(wait) => {}
                () = serving.cancelled() => {}
            }
        }
    }

    fn to_proto(&self, topic: &pb::Resource, kind: TopicKind, d: &Delivery) -> pb::Message {
        let m = &d.message;
        let mut user_properties = m.user_properties.clone();
        // The proxy stores the message group as the property __SHARDINGKEY and hands it back
        // among the user properties (seen on 5.3.3).
        if let Some(group) = &m.message_group {
            user_properties.insert(SHARDING_KEY.to_owned(), group.to_string());
        }
        pb::Message {
            topic: Some(topic.clone()),
            user_properties,
            system_properties: Some(pb::SystemProperties {
                tag: m.tag.clone(),
                keys: m.keys.clone(),
                message_id: m.message_id.clone(),
                body_digest: Some(pb::Digest {
                    r#type: pb::DigestType::Sha1 as i32,
                    checksum: m.body_sha1.clone(),
                }),
                body_encoding: pb::Encoding::Identity as i32,
                message_type: if m.delivery_timestamp.is_some() {
                    pb::MessageType::Delay as i32
                } else {
                    kind.message_type() as i32
                },
                priority: m.priority,
                lite_topic: m.lite_topic.clone(),
                born_timestamp: m.born_timestamp,
                born_host: m.born_host.clone(),
                store_timestamp: Some(m.store_timestamp),
                store_host: self.shared.advertised().to_string(),
                delivery_timestamp: m.delivery_timestamp,
                orphaned_transaction_recovery_duration: None,

                receipt_handle: Some(d.handle.clone()),
                queue_id: i32::try_from(d.queue_id).unwrap_or(i32::MAX),
                queue_offset: Some(i64::try_from(d.offset).unwrap_or(i64::MAX)),
                // The 5.3.3 proxy never sets it: the invisible time is only in the handle.
                invisible_duration: None,
                delivery_attempt: Some(i32::try_from(d.attempt).unwrap_or(i32::MAX)),
                message_group: m.message_group.as_deref().map(str::to_owned),
            }),
            body: m.body.clone(),
        }
    }

    fn ack_inner(
        &self,
        ctx: &Ctx,
        req: pb::AckMessageRequest,
    ) -> Result<pb::AckMessageResponse, pb::Status> {
        let s = &self.shared;
        let cfg = &s.config;
        s.counters.ack_request(req.entries.len());
        let group = name(req.group.as_ref());
        let topic_name = name(req.topic.as_ref());
        validate::topic(topic_name).map_err(|m| status(Code::IllegalTopic, m))?;
        validate::group(group).map_err(|m| status(Code::IllegalConsumerGroup, m))?;
        // A lite consumer's entries name their lite topic (ack_message splits a request whose
        // entries name several): its light queue holds them.
        let lite = req.entries.first().and_then(|e| e.lite_topic.as_deref());
        let topic = s.topic_or_light(topic_name, lite)?;
        group_of(s, group)?;

        let decoded: Vec<Result<ReceiptHandle, String>> = req
            .entries
            .iter()
            .map(|e| ReceiptHandle::decode(&e.receipt_handle))
            .collect();
        let malformed = decoded.iter().filter(|d| d.is_err()).count();
        add(&s.counters.malformed_handles, malformed as u64);
        if cfg.batch_ack
            && let Some(Err(m)) = decoded.iter().find(|d| d.is_err())
        {
            return Err(status(Code::InternalServerError, m.clone()));
        }

        let now_ms = s.clock.now_ms();
        let mut unblocked = false;
        // (expired, result, acknowledged target)
        let mut results: Vec<(bool, pb::AckMessageResultEntry)> =
            Vec::with_capacity(req.entries.len());
        {
            let mut inner = topic.inner.lock();
            inner.reap_group(group, now_ms, &s.counters);
            let mut faults = s.faults.lock();
            let error_code = faults.config.ack_entry_error_code;
            // Batch mode: entries of one broker share one result, so one draw for all.
            let batch_fault = cfg.batch_ack && faults.roll(|c| c.ack_entry_error_rate);
            for (entry, dec) in req.entries.into_iter().zip(decoded) {
                let mut expired = false;
                let mut target = None;
                let st = match dec {
                    Err(m) => status(Code::InternalServerError, m),
                    Ok(h) => match inner.evaluate(
                        group,
                        &h,
                        &entry.message_id,
                        &ctx.client_id,
                        &cfg.broker_name,
                        now_ms,
                    ) {
                        Verdict::Expired => {
                            expired = true;
                            inc(&s.counters.expired_handles);
                            status(Code::InvalidReceiptHandle, "receipt handle is expired")
                        }
                        Verdict::Invalid(m) => {
                            inc(&s.counters.invalid_handles);
                            status(Code::InvalidReceiptHandle, m)
                        }
                        Verdict::Error(m) => status(Code::InternalServerError, m),
                        Verdict::Target { queue, offset } => {
                            let inject = if cfg.batch_ack {
                                batch_fault
                            } else {
                                faults.roll(|c| c.ack_entry_error_rate)
                            };
                            if inject {
                                inc(&s.counters.injected_entry_errors);
                                status(error_code, "injected fault: ack failed: status is abnormal")
                            } else {
                                match inner.apply_ack(group, queue, offset, &s.counters) {
                                    AckApplied::Acked { unblocked: u } => {
                                        unblocked |= u;
                                        target = Some((queue, offset));
                                        ok()
                                    }
                                    AckApplied::Duplicate => {
                                        target = Some((queue, offset));
                                        ok()
                                    }
                                    AckApplied::Expired => {
                                        expired = true;
                                        inc(&s.counters.expired_handles);
                                        status(
                                            Code::InvalidReceiptHandle,
                                            "receipt handle is expired",
                                        )
                                    }
                                }
                            }
                        }
                    },
                };
                // Missing results: the entry was processed, only its answer is lost.
                if faults.roll(|c| c.ack_missing_result_rate) {
                    inc(&s.counters.injected_dropped_results);
                    if let Some((queue, offset)) = target {
                        inner.note_dropped_result(group, queue, offset);
                    }
                    continue;
                }
                results.push((
                    expired,
                    pb::AckMessageResultEntry {
                        message_id: entry.message_id,
                        receipt_handle: entry.receipt_handle,
                        status: Some(st),
                    },
                ));
            }
        }
        if unblocked {
            topic.wake(!s.config.pop_suspension_gap.is_zero());
        }
        if cfg.batch_ack {
            // Expired handles first, then the per-broker group (one broker here).
            results.sort_by_key(|(expired, _)| !*expired);
        }
        let entries: Vec<pb::AckMessageResultEntry> = results.into_iter().map(|(_, e)| e).collect();
        let st = top_level(
            entries.iter().filter_map(|e| e.status.as_ref()),
            "ack message result is empty",
        );
        Ok(pb::AckMessageResponse {
            status: Some(st),
            entries,
        })
    }

    /// As the 5.5.0 proxy, which acks the entries of a lite consumer one by one, each on its
    /// lite topic's queue: a request whose entries name different lite topics is answered
    /// as one request per lite topic, the results together.
    fn ack_split_by_lite_topic(
        &self,
        ctx: &Ctx,
        req: pb::AckMessageRequest,
    ) -> Result<pb::AckMessageResponse, pb::Status> {
        let first = req.entries.first().map(|e| e.lite_topic.clone());
        if req
            .entries
            .iter()
            .all(|e| Some(&e.lite_topic) == first.as_ref())
        {
            return self.ack_inner(ctx, req);
        }
        let mut parts: Vec<(Option<String>, Vec<pb::AckMessageEntry>)> = Vec::new();
        for entry in req.entries {
            match parts.iter_mut().find(|(lite, _)| *lite == entry.lite_topic) {
                Some((_, entries)) => entries.push(entry),
                None => parts.push((entry.lite_topic.clone(), vec![entry])),
            }
        }
        let mut entries = Vec::new();
        for (_, part) in parts {
            let answer = self.ack_inner(
                ctx,
                pb::AckMessageRequest {
                    group: req.group.clone(),
                    topic: req.topic.clone(),
                    entries: part.clone(),
                },
            );
            match answer {
                Ok(answer) => entries.extend(answer.entries),
                // A part refused as a whole: each of its entries gets that status.
                Err(st) => entries.extend(part.into_iter().map(|e| pb::AckMessageResultEntry {
                    message_id: e.message_id,
                    receipt_handle: e.receipt_handle,
                    status: Some(st.clone()),
                })),
            }
        }
        let st = top_level(
            entries.iter().filter_map(|e| e.status.as_ref()),
            "ack message result is empty",
        );
        Ok(pb::AckMessageResponse {
            status: Some(st),
            entries,
        })
    }

    fn change_invisible_inner(
        &self,
        ctx: &Ctx,
        req: &pb::ChangeInvisibleDurationRequest,
    ) -> Result<pb::ChangeInvisibleDurationResponse, pb::Status> {
        let s = &self.shared;
        let cfg = &s.config;
        let group = name(req.group.as_ref());
        let topic_name = name(req.topic.as_ref());
        validate::topic(topic_name).map_err(|m| status(Code::IllegalTopic, m))?;
        validate::group(group).map_err(|m| status(Code::IllegalConsumerGroup, m))?;
        let ms = req
            .invisible_duration
            .as_ref()
            .map_or(Some(0), proto_duration_ms);
        let invisible_ms = check_invisible(ms, 0, duration_ms(cfg.max_invisible))?;
        let topic = s.topic_or_light(topic_name, req.lite_topic.as_deref())?;
        group_of(s, group)?;
        let handle = ReceiptHandle::decode(&req.receipt_handle).map_err(|m| {
            inc(&s.counters.malformed_handles);
            status(Code::InternalServerError, m)
        })?;
        let now_ms = s.clock.now_ms();
        let result = {
            let mut inner = topic.inner.lock();
            inner.reap_group(group, now_ms, &s.counters);
            let verdict = inner.evaluate(
                group,
                &handle,
                &req.message_id,
                &ctx.client_id,
                &cfg.broker_name,
                now_ms,
            );
            match verdict {
                Verdict::Expired => Err(expired_status(s)),
                Verdict::Invalid(m) => {
                    inc(&s.counters.invalid_handles);
                    Err(status(Code::InvalidReceiptHandle, m))
                }
                Verdict::Error(m) => Err(status(Code::InternalServerError, m)),
                Verdict::Target { queue, offset } => match inner.apply_change_invisible(
                    group,
                    queue,
                    offset,
                    invisible_ms,
                    now_ms,
                    &cfg.broker_name,
                    &s.seq,
                    &s.counters,
                ) {
                    ChangeApplied::Changed(h) => Ok(h),
                    ChangeApplied::AlreadyAcked => {
                        inc(&s.counters.invalid_handles);
                        Err(status(
                            Code::InvalidReceiptHandle,
                            "the message has already been acknowledged",
                        ))
                    }
                    ChangeApplied::Expired => Err(expired_status(s)),
                },
            }
        };
        let receipt_handle = result?;
        topic.wake(!s.config.pop_suspension_gap.is_zero());
        Ok(pb::ChangeInvisibleDurationResponse {
            status: Some(ok()),
            receipt_handle,
        })
    }

    /// `ForwardMessageToDeadLetterQueue`: acknowledges the message for the group and stores
    /// a copy in the group's dead-letter topic `%DLQ%<group>` (created on first use, one
    /// queue), as the broker does when a client forwards it.
    fn forward_inner(
        &self,
        ctx: &Ctx,
        req: &pb::ForwardMessageToDeadLetterQueueRequest,
    ) -> Result<pb::ForwardMessageToDeadLetterQueueResponse, pb::Status> {
        let s = &self.shared;
        let cfg = &s.config;
        let group = name(req.group.as_ref());
        let topic_name = name(req.topic.as_ref());
        let topic = s.topic_or_light(topic_name, req.lite_topic.as_deref())?;
        group_of(s, group)?;
        let handle = ReceiptHandle::decode(&req.receipt_handle).map_err(|m| {
            inc(&s.counters.malformed_handles);
            status(Code::InternalServerError, m)
        })?;
        let now_ms = s.clock.now_ms();
        let message = {
            let mut inner = topic.inner.lock();
            inner.reap_group(group, now_ms, &s.counters);
            match inner.evaluate(
                group,
                &handle,
                &req.message_id,
                &ctx.client_id,
                &cfg.broker_name,
                now_ms,
            ) {
                Verdict::Expired => return Err(expired_status(s)),
                Verdict::Invalid(m) => {
                    inc(&s.counters.invalid_handles);
                    return Err(status(Code::InvalidReceiptHandle, m));
                }
                Verdict::Error(m) => return Err(status(Code::InternalServerError, m)),
                Verdict::Target { queue, offset } => {
                    let message = inner
                        .queues
                        .get(queue)
                        .and_then(|q| q.log.get(usize::try_from(offset).ok()?))
                        .map(|m| StoredMessage::clone(m));
                    match inner.apply_ack(group, queue, offset, &s.counters) {
                        AckApplied::Acked { .. } | AckApplied::Duplicate => message,
                        AckApplied::Expired => return Err(expired_status(s)),
                    }
                }
            }
        };
        topic.wake(!s.config.pop_suspension_gap.is_zero());
        if let Some(mut message) = message {
            message.message_group = None;
            let dlq_name = format!("%DLQ%{group}");
            let dlq = {
                let mut topics = s.topics.write();
                Arc::clone(
                    topics
                        .entry(dlq_name)
                        .or_insert_with(|| Arc::new(Topic::new(TopicKind::Normal, 1))),
                )
            };
            s.store(&dlq, Some(0), vec![message]);
        }
        Ok(pb::ForwardMessageToDeadLetterQueueResponse { status: Some(ok()) })
    }

    /// `EndTransaction`: commits (stores) or rolls back (drops) a half message.
    fn end_transaction_inner(
        &self,
        req: &pb::EndTransactionRequest,
    ) -> Result<pb::EndTransactionResponse, pb::Status> {
        let s = &self.shared;
        let topic_name = name(req.topic.as_ref());
        validate::topic(topic_name).map_err(|m| status(Code::IllegalTopic, m))?;
        let topic = topic_of(s, topic_name)?;
        let resolution = pb::TransactionResolution::try_from(req.resolution)
            .unwrap_or(pb::TransactionResolution::Unspecified);
        if resolution == pb::TransactionResolution::Unspecified {
            return Err(status(
                Code::BadRequest,
                "the transaction resolution is unspecified",
            ));
        }
        let half = {
            let mut halves = s.halves.lock();
            match halves.get(&req.transaction_id) {
                Some((held, message))
                    if held == topic_name && message.message_id == req.message_id =>
                {
                    halves.remove(&req.transaction_id)
                }
                _ => None,
            }
        };
        let Some((_, message)) = half else {
            return Err(status(
                Code::InvalidTransactionId,
                format!(
                    "no open transaction {} of message {} on topic {topic_name}",
                    req.transaction_id, req.message_id
                ),
            ));
        };
        if resolution == pb::TransactionResolution::Commit {
            s.store(&topic, None, vec![message]);
        }
        Ok(pb::EndTransactionResponse { status: Some(ok()) })
    }

    /// The reply to a client's telemetry command: settings echoed with server-side values.
    fn telemetry_reply(
        shared: &Shared,
        client_id: &str,
        cmd: pb::TelemetryCommand,
    ) -> Option<pb::TelemetryCommand> {
        let Some(telemetry_command::Command::Settings(mut settings)) = cmd.command else {
            return None;
        };
        shared.register_client(client_id);
        shared.settings_seen.lock().insert(client_id.to_owned());
        shared.forgotten.lock().without_settings.remove(client_id);
        shared.log_control(client_id, Rpc::Telemetry, true);
        let cfg = &shared.config;
        if let Some(settings::PubSub::Subscription(sub)) = &settings.pub_sub
            && let Err((code, message)) = shared.lite.announce(
                client_id,
                name(sub.group.as_ref()),
                settings.client_type.unwrap_or_default(),
            )
        {
            return Some(pb::TelemetryCommand {
                status: Some(status(code, message)),
                command: None,
            });
        }
        match &mut settings.pub_sub {
            Some(settings::PubSub::Subscription(sub)) => {
                if shared.lite.is_lite_client(client_id) {
                    sub.lite_subscription_quota = i32::try_from(LITE_SUBSCRIPTION_QUOTA).ok();
                    sub.max_lite_topic_size = i32::try_from(MAX_LITE_TOPIC_SIZE).ok();
                }
                let fifo = shared
                    .groups
                    .read()
                    .get(name(sub.group.as_ref()))
                    .copied()
                    .unwrap_or(false);
                sub.fifo = Some(fifo);
                sub.receive_batch_size = Some(cfg.receive_batch_size);
                sub.long_polling_timeout = Some(ms_to_proto(duration_ms(cfg.max_long_polling)));
                settings.backoff_policy = Some(consumer_backoff(cfg.max_delivery_attempts));
            }
            Some(settings::PubSub::Publishing(p)) => {
                p.max_body_size = i32::try_from(cfg.max_body_size).unwrap_or(i32::MAX);
                p.validate_message_type = true;
                settings.backoff_policy = Some(producer_backoff(cfg));
            }
            None => {}
        }
        Some(pb::TelemetryCommand {
            status: Some(ok()),
            command: Some(telemetry_command::Command::Settings(settings)),
        })
    }
}

fn expired_status(s: &Shared) -> pb::Status {
    inc(&s.counters.expired_handles);
    status(Code::InvalidReceiptHandle, "receipt handle is expired")
}

/// Validates an invisible time in milliseconds against `[min, max]`.
fn check_invisible(ms: Option<i64>, min: u64, max: u64) -> Result<u64, pb::Status> {
    let Some(ms) = ms else {
        return Err(status(
            Code::IllegalInvisibleTime,
            "the invisibleTime is too large",
        ));
    };
    let Ok(v) = u64::try_from(ms) else {
        return Err(status(
            Code::IllegalInvisibleTime,
            format!("the invisibleTime is too small. invisibleTime={ms}, min={min}"),
        ));
    };
    if v < min {
        return Err(status(
            Code::IllegalInvisibleTime,
            format!("the invisibleTime is too small. invisibleTime={v}, min={min}"),
        ));
    }
    if v > max {
        return Err(status(
            Code::IllegalInvisibleTime,
            format!("the invisibleTime is too large. invisibleTime={v}, max={max}"),
        ));
    }
    Ok(v)
}

/// The proxy's producer retry policy (`grpcClientProducerMaxAttempts` 3,
/// `grpcClientProducerBackoffInitialMillis` 10, `...MaxMillis` 1000, `...Multiplier` 2 by
/// default), which `GrpcClientSettingsManager.mergeProducerData` puts in every producer's
/// settings.
fn producer_backoff(cfg: &Config) -> pb::RetryPolicy {
    let duration = |d: Duration| prost_types::Duration::try_from(d).unwrap_or_default();
    pb::RetryPolicy {
        max_attempts: cfg.producer_max_attempts,
        strategy: Some(retry_policy::Strategy::ExponentialBackoff(
            pb::ExponentialBackoff {
                initial: Some(duration(cfg.producer_backoff_initial)),
                max: Some(duration(cfg.producer_backoff_max)),
                multiplier: cfg.producer_backoff_multiplier,
            },
        )),
    }
}

/// The broker's default consumer retry schedule (the customized back-off of the proto comment).
fn consumer_backoff(max_attempts: i32) -> pb::RetryPolicy {
    const SECS: [i64; 18] = [
        1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
    ];
    pb::RetryPolicy {
        max_attempts,
        strategy: Some(retry_policy::Strategy::CustomizedBackoff(
            pb::CustomizedBackoff {
                next: SECS
                    .iter()
                    .map(|s| prost_types::Duration {
                        seconds: *s,
                        nanos: 0,
                    })
                    .collect(),
            },
        )),
    }
}

#[tonic::async_trait]
impl MessagingService for Service {
    async fn query_route(
        &self,
        request: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        if let Err(r) = self.admit(&md, Rpc::QueryRoute).await {
            return reject_unary(r);
        }
        unary(self.query_route_inner(&req))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, tonic::Status> {
        let (md, _, _req) = request.into_parts();
        let ctx = match self.admit(&md, Rpc::Heartbeat).await {
            Ok(ctx) => ctx,
            Err(r) => return reject_unary(r),
        };
        if self.shared.config.require_client_settings
            && !self.shared.settings_seen.lock().contains(&ctx.client_id)
        {
            self.shared
                .log_control(&ctx.client_id, Rpc::Heartbeat, false);
            return unary(Ok(pb::HeartbeatResponse {
                status: Some(pb::Status {
                    code: pb::Code::UnrecognizedClientType as i32,
                    message: "cannot find client settings for this client".into(),
                }),
            }));
        }
        self.shared.register_client(&ctx.client_id);
        self.shared
            .log_control(&ctx.client_id, Rpc::Heartbeat, true);
        unary(Ok(pb::HeartbeatResponse { status: Some(ok()) }))
    }

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        let requested: Vec<(String, i32)> = req
            .messages
            .iter()
            .map(|m| {
                let sp = m.system_properties.as_ref();
                (
                    sp.map(|p| p.message_id.clone()).unwrap_or_default(),
                    sp.map_or(0, |p| p.queue_id),
                )
            })
            .collect();
        let log = |code: Code| {
            self.shared.log_send(SendRecord {
                message_ids: requested.iter().map(|(id, _)| id.clone()).collect(),
                queue_id: requested.first().map_or(0, |(_, q)| *q),
                code,
            });
        };
        if let Err(r) = self.admit(&md, Rpc::SendMessage).await {
            log(match &r {
                Reject::Code(st) => Code::try_from(st.code).unwrap_or(Code::Unspecified),
                Reject::Grpc(_) => Code::Unspecified,
            });
            return reject_unary(r);
        }
        let result = self.send_inner(req);
        log(match &result {
            Ok(r) => r
                .status
                .as_ref()
                .and_then(|st| Code::try_from(st.code).ok())
                .unwrap_or(Code::Unspecified),
            Err(st) => Code::try_from(st.code).unwrap_or(Code::Unspecified),
        });
        unary(result)
    }

    async fn query_assignment(
        &self,
        request: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        let ctx = match self.admit(&md, Rpc::QueryAssignment).await {
            Ok(ctx) => ctx,
            Err(r) => return reject_unary(r),
        };
        let answer = if self
            .shared
            .forgotten
            .lock()
            .without_settings
            .contains(&ctx.client_id)
        {
            Err(status(Code::InternalServerError, "\"settings\" is null"))
        } else {
            self.query_assignment_inner(&req)
        };
        self.shared
            .log_control(&ctx.client_id, Rpc::QueryAssignment, answer.is_ok());
        unary(answer)
    }

    type ReceiveMessageStream = BoxStream<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        let frames = match self.admit(&md, Rpc::ReceiveMessage).await {
            Ok(ctx) if self.shared.config.cancelled_receives_pop => {
                // The receive goes on in a task of its own, whatever becomes of the call.
                let service = self.clone();
                tokio::spawn(async move { service.receive_inner(&ctx, req).await })
                    .await
                    .map_err(|error| tonic::Status::internal(format!("receive failed: {error}")))?
            }
            Ok(ctx) => self.receive_inner(&ctx, req).await,
            Err(Reject::Grpc(st)) => return Err(st),
            Err(Reject::Code(st)) => vec![pb::ReceiveMessageResponse {
                content: Some(receive_message_response::Content::Status(st)),
            }],
        };
        let stream: Self::ReceiveMessageStream =
            Box::pin(tokio_stream::iter(frames.into_iter().map(Ok)));
        Ok(Response::new(stream))
    }

    async fn ack_message(
        &self,
        request: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        match self.admit(&md, Rpc::AckMessage).await {
            Ok(ctx) => unary(self.ack_split_by_lite_topic(&ctx, req)),
            Err(r) => reject_unary(r),
        }
    }

    type TelemetryStream = BoxStream<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        request: Request<Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, tonic::Status> {
        let (md, _, mut inbound) = request.into_parts();
        let ctx = match self.admit(&md, Rpc::Telemetry).await {
            Ok(ctx) => ctx,
            Err(Reject::Grpc(st)) => return Err(st),
            Err(Reject::Code(st)) => {
                let cmd = pb::TelemetryCommand {
                    status: Some(st),
                    command: None,
                };
                let stream: Self::TelemetryStream = Box::pin(tokio_stream::iter([Ok(cmd)]));
                return Ok(Response::new(stream));
            }
        };
        let (tx, rx) = mpsc::channel(16);
        let shared = self.shared.clone();
        let serving = shared.serving();
        let forgotten = shared.forgotten.lock().streams.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = serving.cancelled() => break,
                    () = forgotten.cancelled() => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(cmd)) => {
                            let reply = Self::telemetry_reply(&shared, &ctx.client_id, cmd);
                            if let Some(reply) = reply
                                && tx.send(Ok(reply)).await.is_err()
                            {
                                break;
                            }
                        }
                        Ok(None) | Err(_) => break,
                    },
                }
            }
        });
        let stream: Self::TelemetryStream = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(stream))
    }

    async fn notify_client_termination(
        &self,
        request: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        let ctx = match self.admit(&md, Rpc::NotifyClientTermination).await {
            Ok(ctx) => ctx,
            Err(r) => return reject_unary(r),
        };
        let s = &self.shared;
        s.clients.lock().remove(&ctx.client_id);
        s.lite.forget(&ctx.client_id);
        let group = req.group.as_ref().map(|g| g.name.as_str());
        let now_ms = s.clock.now_ms();
        let release_ms = duration_ms(s.config.release_on_termination);
        let topics: Vec<Arc<Topic>> = s.topics.read().values().cloned().collect();
        for t in topics {
            let released =
                t.inner
                    .lock()
                    .release_client(group, &ctx.client_id, now_ms, release_ms, &s.seq);
            if released > 0 {
                t.wake(!s.config.pop_suspension_gap.is_zero());
            }
        }
        unary(Ok(pb::NotifyClientTerminationResponse {
            status: Some(ok()),
        }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        match self.admit(&md, Rpc::ChangeInvisibleDuration).await {
            Ok(ctx) => unary(self.change_invisible_inner(&ctx, &req)),
            Err(r) => reject_unary(r),
        }
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        match self.admit(&md, Rpc::ForwardMessageToDeadLetterQueue).await {
            Ok(ctx) => unary(self.forward_inner(&ctx, &req)),
            Err(r) => reject_unary(r),
        }
    }

    async fn end_transaction(
        &self,
        request: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        match self.admit(&md, Rpc::EndTransaction).await {
            Ok(_) => unary(self.end_transaction_inner(&req)),
            Err(r) => reject_unary(r),
        }
    }

    async fn sync_lite_subscription(
        &self,
        request: Request<pb::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<pb::SyncLiteSubscriptionResponse>, tonic::Status> {
        let (md, _, req) = request.into_parts();
        let ctx = match self.admit(&md, Rpc::SyncLiteSubscription).await {
            Ok(ctx) => ctx,
            Err(r) => return reject_unary(r),
        };
        let s = &self.shared;
        let exists = s.topic(name(req.topic.as_ref())).is_some();
        unary(
            s.lite
                .sync(exists, &ctx.client_id, &req)
                .map(|()| pb::SyncLiteSubscriptionResponse { status: Some(ok()) })
                .map_err(|(code, message)| status(code, message)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_rules() {
        let okst = ok();
        let exp = status(Code::InvalidReceiptHandle, "receipt handle is expired");
        let ise = status(Code::InternalServerError, "x");
        assert_eq!(
            top_level([].iter(), "empty").code,
            Code::InternalServerError as i32
        );
        assert_eq!(top_level([].iter(), "empty").message, "empty");
        assert_eq!(top_level([&exp].into_iter(), "e"), exp);
        let two_expired = top_level([&exp, &exp].into_iter(), "e");
        assert_eq!(two_expired.code, Code::InvalidReceiptHandle as i32);
        assert_eq!(
            top_level([&okst, &okst].into_iter(), "e").code,
            Code::Ok as i32
        );
        let mixed = top_level([&okst, &exp, &ise].into_iter(), "e");
        assert_eq!(mixed.code, Code::MultipleResults as i32);
    }

    #[test]
    fn invisible_time_bounds() {
        assert_eq!(check_invisible(Some(10_000), 10_000, 20_000), Ok(10_000));
        for bad in [None, Some(-1), Some(9_999), Some(20_001)] {
            let st = check_invisible(bad, 10_000, 20_000).unwrap_err();
            assert_eq!(st.code, Code::IllegalInvisibleTime as i32, "{bad:?}");
        }
    }

    #[test]
    fn queue_selection_is_stable_for_groups() {
        let shared = Shared::new(Config::default(), FaultConfig::default(), 1);
        let topic = Topic::new(TopicKind::Fifo, 8);
        let a = shared.select_queue(&topic, Some("order-42"), 8);
        for _ in 0..10 {
            assert_eq!(shared.select_queue(&topic, Some("order-42"), 8), a);
        }
        let rr: Vec<usize> = (0..4)
            .map(|_| shared.select_queue(&topic, None, 4))
            .collect();
        assert_eq!(rr, [0, 1, 2, 3]);
        assert_eq!(shared.select_queue(&topic, None, 0), 0);
    }
}
