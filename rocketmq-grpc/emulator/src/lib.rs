//! An embedded, in-memory RocketMQ 5 proxy emulator for `rocketmq-grpc`'s tests and examples.
//!
//! A tonic `MessagingService` server on `127.0.0.1` that follows the documented behaviour of the
//! open-source proxy closely enough to test a real client against it: topics with several
//! queues (normal or FIFO), consumer groups, long-polling receives with opaque receipt handles
//! and invisibility deadlines, redelivery when invisibility ends, per-entry ack results with the
//! proxy's top-level status rules (and its "batch ack" mode), `ChangeInvisibleDuration`, the
//! required `x-mq-client-id` header and the HMAC-SHA1 signature check. Counters, a per-message
//! ledger and seeded fault injection make client behaviour measurable.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rocketmq_grpc_emulator::Error> {
//! use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};
//!
//! let emulator = Emulator::builder()
//!     .topic("orders", TopicKind::Normal, 4)
//!     .group("order-consumers", false)
//!     .start()
//!     .await?;
//! emulator.publish("orders", PublishMessage::new("hello"))?;
//! println!("proxy at {}", emulator.endpoint()); // "127.0.0.1:PORT"
//! // ... run a client against it, then:
//! let stats = emulator.stats();
//! println!("{} acked, {} ack RPCs", stats.acked, stats.ack_requests());
//! emulator.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! # What is modelled
//!
//! - **Headers.** Every RPC first checks, in the proxy's order: the signature when credentials
//!   are configured (`authorization` per §3.3 of the reference: HMAC-SHA1 of the raw
//!   `x-mq-date-time` with the secret, hex, `Credential=AK[/...]`; absent or wrong →
//!   `UNAUTHORIZED`), then a non-blank `x-mq-client-id` (→ `CLIENT_ID_REQUIRED`). Like the
//!   proxy, these codes come in the response `status` with gRPC status OK (a single status
//!   frame for `ReceiveMessage`, a single command with that status for `Telemetry`).
//! - **Routes and assignments.** `QueryRoute` lists every queue of the topic with the
//!   emulator's broker name and its own address as endpoints; `QueryAssignment` assigns every
//!   queue to the group. Unknown topic → `TOPIC_NOT_FOUND`, unknown group →
//!   `CONSUMER_GROUP_NOT_FOUND`, illegal names → `ILLEGAL_TOPIC` / `ILLEGAL_CONSUMER_GROUP`.
//! - **Send.** One request goes to one queue (hash of the message group for a single FIFO
//!   message, round robin otherwise). Whole-request failures, as the proxy's exceptions:
//!   no messages or mixed topics → `MESSAGE_CORRUPTED`, empty body → `MESSAGE_BODY_EMPTY`, body
//!   above 4 MiB (configurable) → `MESSAGE_BODY_TOO_LARGE`, blank message id →
//!   `ILLEGAL_MESSAGE_ID`, message type not matching the topic (a FIFO topic needs a message
//!   group, a normal topic must not have one, a delay topic takes only messages with a
//!   `delivery_timestamp`) → `MESSAGE_PROPERTY_CONFLICT_WITH_TYPE`, a delivery time more than
//!   `maxDelayTimeMills` ahead (1 day, [`EmulatorBuilder::max_delay`]) →
//!   `ILLEGAL_DELIVERY_TIME`.
//! - **Delay messages.** A message with a `delivery_timestamp` is kept from receives until
//!   then, on the emulator's clock (the delivery time minus the wall clock at the send, added
//!   to the emulator's time, so paused tokio time and [`Emulator::advance`] move it); a long
//!   poll wakes when it is due. A time in the past is delivered at once. Deliveries carry the
//!   `delivery_timestamp` as sent and message type `DELAY`.
//!   Success: like the 5.3.3 proxy, which hands a request of several messages to the broker as
//!   one batch message and converts the single `SendResult`, **one** `SendResultEntry` for the
//!   whole request: for one message its id as `message_id` and as `transaction_id`; for a
//!   batch a new upper-case hex id as `message_id`, the first message's id as
//!   `transaction_id`, and the first message's queue offset. The batch's messages go to one
//!   queue at consecutive offsets, and are stored (and delivered) with the **first message's
//!   id, tag, user properties and message group**; each keeps its own body and keys.
//! - **Filters.** Receives apply the subscription's filter as the broker's pop does: a tag
//!   expression (`*`, `a`, `a || b`) or a SQL92 expression over the user properties and
//!   `TAGS` (comparisons, `AND`/`OR`/`NOT`, `IN`, `BETWEEN`, `IS [NOT] NULL`, string and
//!   number literals; a missing property makes a comparison unknown, which does not match). A
//!   message the filter rejects is passed over for that group for good (the ledger shows it
//!   acknowledged). A SQL92 expression outside that subset does not parse and the receive gets
//!   the proxy's `INTERNAL_SERVER_ERROR` "parse the consumer's subscription failed".
//! - **FIFO properties.** A FIFO message is delivered with the user property `__SHARDINGKEY`
//!   holding its message group, as the proxy delivers it.
//! - **Telemetry settings.** A producer's settings come back with the proxy's producer retry
//!   policy (`backoff_policy`: 3 attempts, exponential 10 ms to 1 s, multiplier 2, as
//!   `GrpcClientSettingsManager.mergeProducerData` sets from `ProxyConfig`), `max_body_size`
//!   and `validate_message_type`; a consumer's with `fifo`, `receive_batch_size` 32, the
//!   group's customized redelivery back-off and `long_polling_timeout` = the long-polling
//!   maximum, 20 s (`grpcClientConsumerMaxLongPollingTimeoutMillis`: the proxy pushes that
//!   value, not the 30 s of the Java client or the 40 s default of the official Rust client).
//! - **Transactions.** A topic of [`TopicKind::Transaction`] takes only transactional
//!   messages and holds each as a half message (the message id is its transaction id) until
//!   `EndTransaction` commits it (stored, then delivered) or rolls it back (dropped); an
//!   unknown transaction gets `INVALID_TRANSACTION_ID`. The broker's checks of transactions
//!   left open (`RecoverOrphanedTransactionCommand` on the telemetry stream) are not
//!   emulated: the real-proxy tests cover them.
//! - **Dead letters.** `ForwardMessageToDeadLetterQueue` acknowledges the message for the
//!   group and stores a copy in `%DLQ%<group>` (created on first use, one queue).
//! - **Receive.** A receive pops from every queue of the topic, starting with the one asked
//!   for (the proxy pops from every queue of the queue's broker). An OK status frame then one
//!   frame per message, or a single
//!   `MESSAGE_NOT_FOUND` after long polling. Long polling is clamped to 5–20 s (configurable)
//!   and to the `grpc-timeout` deadline; an arrival wakes every waiting receive, or, with
//!   [`EmulatorBuilder::pop_suspension_gap`], as the broker: one suspended receive, and none
//!   that is between its scan and its suspension; `auto_renew` receives get the proxy's 60 s invisible
//!   time and are renewed by the "proxy" for their client for up to 3 h; other receives must
//!   ask for 10 s–12 h (`ILLEGAL_INVISIBLE_TIME`). A message whose invisibility ends without
//!   an ack is redelivered with `delivery_attempt + 1` and a new handle. A consumer group
//!   created as FIFO consumes orderly: a message group's next message is delivered only after
//!   the previous one is acknowledged (or after its invisibility ends, redelivering it).
//! - **Ack.** Per §4.2/§4.3: topic and group validated first (whole request); per entry an
//!   expired handle → `INVALID_RECEIPT_HANDLE` "receipt handle is expired", a malformed one →
//!   `INTERNAL_SERVER_ERROR`, a handle superseded by a redelivery or a
//!   `ChangeInvisibleDuration` → `INVALID_RECEIPT_HANDLE`; top level: one distinct code → that
//!   code, several → `MULTIPLE_RESULTS`, no entries → `INTERNAL_SERVER_ERROR`. Results come in
//!   request order; in batch-ack mode ([`EmulatorBuilder::batch_ack`]) a malformed handle
//!   fails the whole request with no entries and results come expired first, then the rest.
//!   For auto-renewed deliveries the client that received the message can ack with its
//!   original handle after 60 s (the proxy maps it to the renewed one).
//! - **Outages.** [`Emulator::stop_serving`] takes the service down (connections refused, a
//!   proxy's forgotten client settings) and [`Emulator::resume_serving`] brings it back on the
//!   same port; [`Emulator::fail_next`] scripts failures of the next calls of one RPC, and
//!   [`Emulator::send_log`] shows which queue each `SendMessage` asked for.
//! - **Time.** Deadlines use tokio time (paused test time works) plus a manual offset moved
//!   by [`Emulator::advance`], which also wakes long polls, so redelivery tests need no real
//!   waiting.
//!
//! # What is not modelled
//!
//! Namespaces (names are used as sent, so a client in namespace `ns` needs the topic
//! `ns%orders`, as on the 5.3.3 proxy, which reads neither `resource_namespace` nor
//! `x-mq-namespace`; unlike the proxy, the emulator does not take the namespace off the
//! topics it answers with), delay and
//! transactional messages, dead-letter queues and `max_attempts`, retry topics, stored consumer
//! offsets (every group starts at offset 0, which is also where a new group starts on a real
//! 5.3.3 broker: it consumes what the topic already holds), several brokers, the proxy's
//! permissive TLS mode (TLS and plain on one port: with [`EmulatorBuilder::tls`] the emulator
//! serves TLS only), and the RPCs outside the crate's proto subset.
//!
//! # Feature flags
//! - `tls` (on by default): [`EmulatorBuilder::tls`] and [`EmulatorBuilder::tls_client_ca`].
//!
//! # The binary
//! `rocketmq_emulator` runs the emulator as a process (for load runs and for trying a client
//! by hand): `cargo run --release -p examples --bin rocketmq_emulator -- --help`.
//!
//! The crate's modules form no cycle (`scripts/check-module-cycles` checks it).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod auth;
mod clock;
mod config;
mod counters;
mod error;
mod faults;
mod filter;
mod handle;
mod lite;
mod server;
mod service;
mod state;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;

pub use counters::{InjectedFaults, Rpc, Stats};
pub use error::Error;
pub use faults::{FaultConfig, ScriptedFailure};
pub use service::SendRecord;
pub use state::{MessageRecord, TopicKind};

pub use config::ProxyMode;

use config::Config;
use service::{Service, Shared, Topic, stored_message};

use server::messaging_service_server::MessagingServiceServer;

/// An argument of the emulator's admin API was rejected.
fn invalid(reason: String) -> Error {
    Error::Invalid {
        what: "emulator",
        reason,
    }
}

/// A message for [`Emulator::publish`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishMessage {
    /// The body, stored as it is: every delivery shares it, none copies it.
    pub body: Bytes,
    /// The message id; generated when `None`.
    pub message_id: Option<String>,
    /// The FIFO message group (required on FIFO topics, refused on normal ones).
    pub message_group: Option<String>,
    /// The tag.
    pub tag: Option<String>,
    /// The keys.
    pub keys: Vec<String>,
    /// User properties.
    pub user_properties: HashMap<String, String>,
    /// The queue; chosen as for `SendMessage` when `None`.
    pub queue_id: Option<u32>,
}

impl PublishMessage {
    /// A message with this body: anything that converts into [`Bytes`] (`Vec<u8>`, `String`,
    /// `&'static [u8]`, `&'static str`, `Bytes`), as `rocketmq_grpc::OutgoingMessage::new`.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    /// Sets the message id.
    #[must_use]
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Sets the FIFO message group.
    #[must_use]
    pub fn message_group(mut self, group: impl Into<String>) -> Self {
        self.message_group = Some(group.into());
        self
    }

    /// Sets the tag.
    #[must_use]
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Adds a key.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Adds a user property.
    #[must_use]
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.user_properties.insert(key.into(), value.into());
        self
    }

    /// Puts the message in this queue.
    #[must_use]
    pub fn queue(mut self, queue_id: u32) -> Self {
        self.queue_id = Some(queue_id);
        self
    }
}

/// Where [`Emulator::publish`] stored a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The queue.
    pub queue_id: u32,
    /// The offset in the queue.
    pub offset: u64,
    /// The message id (given or generated).
    pub message_id: String,
}

/// A topic as the emulator holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicInfo {
    /// The kind.
    pub kind: TopicKind,
    /// Messages stored per queue (index = queue id).
    pub messages_per_queue: Vec<u64>,
}

/// The PEM texts of the emulator's TLS: its certificate chain and key, and the CA its
/// clients' certificates must come from (when it requires them).
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
struct TlsPem {
    cert_chain: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsPem")
            .field(
                "cert_chain",
                &format_args!("<{} bytes>", self.cert_chain.len()),
            )
            .field("client_ca", &self.client_ca.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// Configures and starts an [`Emulator`].
#[derive(Debug, Clone)]
pub struct EmulatorBuilder {
    bind: SocketAddr,
    config: Config,
    faults: FaultConfig,
    seed: u64,
    topics: Vec<(String, TopicKind, u32)>,
    groups: Vec<(String, bool)>,
    #[cfg(feature = "tls")]
    tls: Option<TlsPem>,
    lite_groups: Vec<(String, String)>,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: Config::default(),
            faults: FaultConfig::default(),
            seed: 0x5EED_0FE1_1A70_1234,
            topics: Vec::new(),
            groups: Vec::new(),
            #[cfg(feature = "tls")]
            tls: None,
            lite_groups: Vec::new(),
        }
    }
}

impl EmulatorBuilder {
    /// Defaults: `127.0.0.1:0`, the proxy's defaults, no credentials, no faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds to this address (default `127.0.0.1:0`, an ephemeral port).
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Binds to `127.0.0.1:port`.
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.bind = SocketAddr::from(([127, 0, 0, 1], port));
        self
    }

    /// The broker name in routes and receipt handles (default `broker-emulator`; no spaces).
    #[must_use]
    pub fn broker_name(mut self, name: impl Into<String>) -> Self {
        self.config.broker_name = name.into();
        self
    }

    /// Creates a topic at start.
    #[must_use]
    pub fn topic(mut self, name: impl Into<String>, kind: TopicKind, queues: u32) -> Self {
        self.topics.push((name.into(), kind, queues));
        self
    }

    /// Creates a consumer group at start; `fifo` is the group's `consumeMessageOrderly`.
    #[must_use]
    pub fn group(mut self, name: impl Into<String>, fifo: bool) -> Self {
        self.groups.push((name.into(), fifo));
        self
    }

    /// Creates a lite consumer group at start, bound to the lite topic `bind_topic` (a group
    /// with `lite.bind.topic`, RocketMQ 5.4+): only lite push consumers may use it (see
    /// [`Emulator::create_lite_group`]).
    ///
    /// ```
    /// # async fn demo() -> Result<(), rocketmq_grpc_emulator::Error> {
    /// use rocketmq_grpc_emulator::{Emulator, TopicKind};
    ///
    /// let emulator = Emulator::builder()
    ///     .topic("replies", TopicKind::Lite, 4)
    ///     .lite_group("repliers", "replies")
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lite_group(mut self, name: impl Into<String>, bind_topic: impl Into<String>) -> Self {
        self.lite_groups.push((name.into(), bind_topic.into()));
        self
    }

    /// Requires signed requests and accepts this access key / secret key pair (may be called
    /// several times).
    #[must_use]
    pub fn credentials(
        mut self,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Self {
        self.config
            .credentials
            .insert(access_key.into(), secret_key.into());
        self
    }

    /// The proxy's `enableBatchAck` (default false): a malformed handle fails the whole ack
    /// request and results come expired first, then the rest.
    #[must_use]
    pub fn batch_ack(mut self, on: bool) -> Self {
        self.config.batch_ack = on;
        self
    }

    /// How the proxy runs beside its broker (default [`ProxyMode::Local`]); it decides the id
    /// in a batch send's receipt.
    #[must_use]
    pub fn proxy_mode(mut self, mode: ProxyMode) -> Self {
        self.config.proxy_mode = mode;
        self
    }

    /// Whether the messages of a batch send keep their own ids, tags and user properties
    /// (true: RocketMQ 5.5.0, where a consumer filtering on the second message's tag receives
    /// it alone) or all take the first message's (false, the default: 5.3.3, in both proxy
    /// modes). Bodies and keys are each message's own either way.
    #[must_use]
    pub fn batch_messages_apart(mut self, apart: bool) -> Self {
        self.config.batch_messages_apart = apart;
        self
    }

    /// The proxy's `enableProxyAutoRenew` (default true).
    #[must_use]
    pub fn proxy_auto_renew(mut self, on: bool) -> Self {
        self.config.proxy_auto_renew = on;
        self
    }

    /// The invisible time of `auto_renew` receives (default 60 s) and how long the proxy
    /// keeps renewing them (default 3 h).
    #[must_use]
    pub fn auto_renew(mut self, invisible: Duration, renew_max: Duration) -> Self {
        self.config.auto_renew_invisible = invisible;
        self.config.renew_max = renew_max;
        self
    }

    /// Valid `invisible_duration` of receives without auto-renew (default 10 s to 12 h; the
    /// maximum also bounds `ChangeInvisibleDuration`).
    #[must_use]
    pub fn invisible_duration_range(mut self, min: Duration, max: Duration) -> Self {
        self.config.min_invisible_recv = min;
        self.config.max_invisible = max.max(min);
        self
    }

    /// Models the broker's lost arrivals (`PopLongPollingService`, 5.3.3 and 5.5.0): a receive
    /// that found nothing is suspended only `gap` after its scan, and a message that arrives
    /// in between wakes nobody, so that receive waits its whole long polling; and, as the
    /// broker, an arrival wakes one suspended receive (the one that expires first), not all.
    /// Default zero: no window, and every waiting receive is woken by an arrival. The real
    /// broker's window is short (a 20 s wait for about 1 in 500 messages sent right after one
    /// a receive had just returned, on 5.3.3); a long one makes the race certain in a test.
    #[must_use]
    pub fn pop_suspension_gap(mut self, gap: Duration) -> Self {
        self.config.pop_suspension_gap = gap;
        self
    }

    /// Whether a receive the client cancels (drops the call) goes on: its long poll still
    /// waits and pops what arrives, the popped messages stay invisible for the receive's
    /// invisible time and the answer is thrown away. The 5.3.3 proxy does this (its log: "client
    /// has cancelled the request. response to write: ..." with the message), because its
    /// broker pop is not cancelled with the call. Default off: a cancelled receive ends with
    /// the call and pops nothing.
    #[must_use]
    pub fn cancelled_receives_pop(mut self, on: bool) -> Self {
        self.config.cancelled_receives_pop = on;
        self
    }

    /// Clamp of long polling (default 5 s to 20 s); shorten it for fast tests.
    #[must_use]
    pub fn long_polling_range(mut self, min: Duration, max: Duration) -> Self {
        self.config.min_long_polling = min;
        self.config.max_long_polling = max.max(min);
        self
    }

    /// The proxy's `maxDelayTimeMills` (default 1 day; zero = no limit): a send whose delivery
    /// time is further ahead is refused with `ILLEGAL_DELIVERY_TIME` "the max delay time of
    /// message is too large, max is {ms}", as by the 5.3.3 proxy.
    #[must_use]
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.config.max_delay = max;
        self
    }

    /// Largest accepted message body (default 4 MiB; 0 = no limit).
    #[must_use]
    pub fn max_body_size(mut self, bytes: usize) -> Self {
        self.config.max_body_size = bytes;
        self
    }

    /// Reject empty bodies with `MESSAGE_BODY_EMPTY` (default true).
    #[must_use]
    pub fn reject_empty_body(mut self, on: bool) -> Self {
        self.config.reject_empty_body = on;
        self
    }

    /// Whether `Heartbeat` requires the client to have announced its settings on the telemetry
    /// stream first (default `true`, as the real proxy answers `UNRECOGNIZED_CLIENT_TYPE` "cannot
    /// find client settings for this client"; seen against RocketMQ 5.3.3).
    #[must_use]
    pub fn require_client_settings(mut self, on: bool) -> Self {
        self.config.require_client_settings = on;
        self
    }

    /// Whether `auto_renew` receives need the client's channel, created by a Heartbeat or a
    /// Telemetry settings command (default true, as the proxy: otherwise `MESSAGE_NOT_FOUND`
    /// "The client [...] is disconnected.").
    #[must_use]
    pub fn require_client_channel(mut self, on: bool) -> Self {
        self.config.require_client_channel = on;
        self
    }

    /// Create unknown consumer groups on first use (default false: unknown groups are
    /// `CONSUMER_GROUP_NOT_FOUND`).
    #[must_use]
    pub fn auto_create_groups(mut self, on: bool) -> Self {
        self.config.auto_create_groups = on;
        self
    }

    /// `receive_batch_size` pushed in telemetry settings (default 32) and the upper bound
    /// applied to a request's `batch_size` (default 32).
    #[must_use]
    pub fn receive_batch_size(mut self, pushed: i32, max: usize) -> Self {
        self.config.receive_batch_size = pushed;
        self.config.max_receive_batch = max.max(1);
        self
    }

    /// `RetryPolicy.max_attempts` pushed to consumers in telemetry settings (default 17).
    #[must_use]
    pub fn max_delivery_attempts(mut self, attempts: i32) -> Self {
        self.config.max_delivery_attempts = attempts;
        self
    }

    /// The producer retry policy pushed in telemetry settings (default: the proxy's 3
    /// attempts, exponential back-off from 10 ms to 1 s with multiplier 2).
    #[must_use]
    pub fn producer_backoff(
        mut self,
        max_attempts: i32,
        initial: Duration,
        max: Duration,
        multiplier: f32,
    ) -> Self {
        self.config.producer_max_attempts = max_attempts;
        self.config.producer_backoff_initial = initial;
        self.config.producer_backoff_max = max.max(initial);
        self.config.producer_backoff_multiplier = multiplier;
        self
    }

    /// Seed of the fault-injection PRNG.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Initial faults (adjustable later with [`Emulator::set_faults`]).
    #[must_use]
    pub fn faults(mut self, faults: FaultConfig) -> Self {
        self.faults = faults;
        self
    }

    /// Serves TLS only (unlike the proxy's permissive mode, a plain connection fails), with
    /// this certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, PKCS#1 or
    /// SEC1). Needs the crate feature `tls` (on by default). [`start`](Self::start) refuses
    /// PEM it cannot use with [`Error::Invalid`] (setting `tls`).
    ///
    /// ```no_run
    /// # async fn demo(cert: String, key: String, ca: String) -> Result<(), Box<dyn std::error::Error>> {
    /// use rocketmq_grpc::{ClientConfig, Session};
    /// use rocketmq_grpc_emulator::Emulator;
    ///
    /// let emulator = Emulator::builder().tls(cert, key).start().await?;
    /// let config = ClientConfig::new(&emulator.url())?.tls_ca_pem(ca); // https://127.0.0.1:PORT
    /// let session = Session::new(config)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls(mut self, cert_chain_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        let tls = self.tls.get_or_insert_with(TlsPem::default);
        tls.cert_chain = cert_chain_pem.as_ref().to_vec();
        tls.key = key_pem.as_ref().to_vec();
        self
    }

    /// Requires every client to present a certificate signed by a CA of this PEM (mutual
    /// TLS); a client without one fails its handshake. Needs [`tls`](Self::tls) as well.
    ///
    /// ```no_run
    /// # async fn demo(cert: String, key: String, client_ca: String) -> Result<(), rocketmq_grpc_emulator::Error> {
    /// use rocketmq_grpc_emulator::Emulator;
    ///
    /// let emulator = Emulator::builder()
    ///     .tls(cert, key)
    ///     .tls_client_ca(client_ca)
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_client_ca(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
        self.tls.get_or_insert_with(TlsPem::default).client_ca = Some(ca_pem.as_ref().to_vec());
        self
    }

    /// The server's TLS settings, checked.
    #[cfg(feature = "tls")]
    fn server_tls(&self) -> Result<Option<tonic::transport::ServerTlsConfig>, Error> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let Some(pem) = &self.tls else {
            return Ok(None);
        };
        let bad = |reason: String| Error::Invalid {
            what: "tls",
            reason,
        };
        if pem.cert_chain.is_empty() || pem.key.is_empty() {
            return Err(bad(
                "a client CA needs the server's certificate and key too: call \
                 EmulatorBuilder::tls(cert_chain_pem, key_pem)"
                    .into(),
            ));
        }
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&pem.cert_chain, &pem.key))
            .timeout(Duration::from_secs(10));
        if let Some(ca) = &pem.client_ca {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        // tonic parses the PEM here: unusable PEM fails the start, not the first connection.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| {
                bad(format!(
                    "the certificate, key or client CA is unusable: {e}"
                ))
            })?;
        Ok(Some(config))
    }

    #[cfg(not(feature = "tls"))]
    fn server_tls(&self) -> Result<Option<ServerTls>, Error> {
        Ok(None)
    }

    fn build_shared(self) -> Result<(Arc<Shared>, SocketAddr), Error> {
        if self.config.broker_name.is_empty()
            || self.config.broker_name.contains(char::is_whitespace)
        {
            return Err(invalid(format!(
                "broker name {:?} must be non-empty without spaces",
                self.config.broker_name
            )));
        }
        let shared = Arc::new(Shared::new(self.config, self.faults, self.seed));
        for (name, kind, queues) in &self.topics {
            create_topic(&shared, name, *kind, *queues)?;
        }
        for (name, fifo) in &self.groups {
            create_group(&shared, name, *fifo)?;
        }
        for (name, bind_topic) in &self.lite_groups {
            create_lite_group(&shared, name, bind_topic)?;
        }
        Ok((shared, self.bind))
    }

    /// Binds and starts serving in a background task.
    pub async fn start(self) -> Result<Emulator, Error> {
        let tls = self.server_tls()?;
        let (shared, bind) = self.build_shared()?;
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|source| Error::Bind {
                addr: bind,
                source: Arc::new(source),
            })?;
        let local = listener.local_addr().map_err(|source| Error::Bind {
            addr: bind,
            source: Arc::new(source),
        })?;
        let advertised = if local.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], local.port()))
        } else {
            local
        };
        let _ = shared.advertised.set(advertised);
        let task = tokio::spawn(serve(shared.clone(), listener, tls.clone()));
        Ok(Emulator {
            shared,
            addr: advertised,
            task: Some(task),
            tls,
        })
    }

    /// Runs the emulator in the foreground until `signal` completes (for a separate process:
    /// pass `tokio::signal::ctrl_c()` mapped to `()`), then shuts it down gracefully. `ready`
    /// is called once with the started emulator, e.g. to print its endpoint or create topics.
    pub async fn run_until<S, R>(self, signal: S, ready: R) -> Result<(), Error>
    where
        S: Future<Output = ()> + Send,
        R: FnOnce(&Emulator),
    {
        let mut emulator = self.start().await?;
        ready(&emulator);
        let Some(mut task) = emulator.task.take() else {
            return Ok(());
        };
        tokio::select! {
            () = signal => {
                emulator.shared.shutdown.cancel();
                emulator.shared.wake_all();
                finish(&mut task).await
            }
            res = &mut task => join_result(res),
        }
    }
}

fn create_topic(shared: &Shared, name: &str, kind: TopicKind, queues: u32) -> Result<(), Error> {
    validate::topic(name).map_err(|reason| Error::Invalid {
        what: "emulator",
        reason,
    })?;
    if queues == 0 || queues > 1024 {
        return Err(invalid(format!(
            "a topic needs 1 to 1024 queues, not {queues}"
        )));
    }
    let queues = queues as usize;
    let mut topics = shared.topics.write();
    if let Some(t) = topics.get(name) {
        if t.kind == kind && t.queue_count() == queues {
            return Ok(());
        }
        return Err(Error::AlreadyExists(format!("topic {name:?}")));
    }
    topics.insert(name.to_owned(), Arc::new(Topic::new(kind, queues)));
    Ok(())
}

fn create_group(shared: &Shared, name: &str, fifo: bool) -> Result<(), Error> {
    validate::group(name).map_err(|reason| Error::Invalid {
        what: "emulator",
        reason,
    })?;
    let mut groups = shared.groups.write();
    match groups.get(name) {
        Some(existing) if *existing == fifo => Ok(()),
        Some(_) => Err(Error::AlreadyExists(format!("consumer group {name:?}"))),
        None => {
            groups.insert(name.to_owned(), fifo);
            Ok(())
        }
    }
}

fn create_lite_group(shared: &Shared, name: &str, bind_topic: &str) -> Result<(), Error> {
    match shared.topic(bind_topic) {
        Some(topic) if topic.kind == TopicKind::Lite => {}
        Some(_) => {
            return Err(invalid(format!(
                "a lite group binds a LITE topic; {bind_topic:?} is of another kind"
            )));
        }
        None => return Err(Error::UnknownTopic(bind_topic.to_owned())),
    }
    if let Some(existing) = shared.lite.bind_topic(name)
        && existing != bind_topic
    {
        return Err(Error::AlreadyExists(format!(
            "lite group {name:?} (bound to {existing:?})"
        )));
    }
    create_group(shared, name, false)?;
    shared.lite.bind(name, bind_topic);
    Ok(())
}

/// The server's TLS settings (nothing without the feature `tls`).
#[cfg(feature = "tls")]
type ServerTls = tonic::transport::ServerTlsConfig;
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
enum ServerTls {}

async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    tls: Option<ServerTls>,
) -> Result<(), tonic::transport::Error> {
    let max_inbound = shared.config.max_inbound_message_size;
    let signal = shared.serving().cancelled_owned();
    let svc = MessagingServiceServer::new(Service { shared })
        .max_decoding_message_size(max_inbound)
        .max_encoding_message_size(usize::MAX);
    // Small answers (acks, status frames) must not wait for Nagle's algorithm.
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
    let mut server = tonic::transport::Server::builder();
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        server = server.tls_config(tls)?;
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    server
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, signal)
        .await
}

type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

fn join_result(
    res: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), Error> {
    match res {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::Serve(Arc::new(e))),
        Err(e) => Err(Error::Task(e.to_string())),
    }
}

/// Waits for the server task after the shutdown signal, aborting it after 5 s.
async fn finish(task: &mut ServerTask) -> Result<(), Error> {
    match tokio::time::timeout(Duration::from_secs(5), &mut *task).await {
        Ok(res) => join_result(res),
        Err(_) => {
            task.abort();
            Ok(())
        }
    }
}

/// A running emulator. Dropping it stops the server (without waiting); prefer
/// [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: Option<ServerTask>,
    tls: Option<ServerTls>,
}

impl Emulator {
    /// A builder with the proxy's defaults.
    #[must_use]
    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder::new()
    }

    /// The bound address (the unspecified address is reported as `127.0.0.1`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port`, e.g. `"127.0.0.1:43517"`, as an access point.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// `http://host:port`, or `https://host:port` when it serves TLS (which
    /// `rocketmq_grpc::ClientConfig::new` reads as TLS on).
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Whether it serves TLS ([`EmulatorBuilder::tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The broker name used in routes and receipt handles.
    pub fn broker_name(&self) -> &str {
        &self.shared.config.broker_name
    }

    /// Creates a topic with `queues` queues (1 to 1024). Creating an identical topic again is a
    /// no-op; other settings for an existing name are an error.
    pub fn create_topic(&self, name: &str, kind: TopicKind, queues: u32) -> Result<(), Error> {
        create_topic(&self.shared, name, kind, queues)?;
        self.shared.wake_all();
        Ok(())
    }

    /// Creates a consumer group; `fifo` makes it consume orderly. Idempotent for the same
    /// setting.
    pub fn create_group(&self, name: &str, fifo: bool) -> Result<(), Error> {
        create_group(&self.shared, name, fifo)
    }

    /// Creates a lite consumer group bound to the lite topic `bind_topic` (`lite.bind.topic`,
    /// RocketMQ 5.4+). As on the 5.5.0 proxy, a lite push consumer (`LITE_PUSH_CONSUMER`) of a
    /// regular group, and a push or simple consumer of a lite group, have their settings
    /// refused with `ILLEGAL_CONSUMER_GROUP` (the real proxy fails the telemetry stream with
    /// `INVALID_ARGUMENT` saying the same). Idempotent for the same topic.
    ///
    /// # Errors
    /// [`Error::UnknownTopic`] when `bind_topic` does not exist; [`Error::Invalid`] when
    /// it is not a [`TopicKind::Lite`] topic or the name is not a valid group name;
    /// [`Error::AlreadyExists`] for a group bound to another topic or an orderly group.
    ///
    /// ```
    /// # async fn demo() -> Result<(), rocketmq_grpc_emulator::Error> {
    /// use rocketmq_grpc_emulator::{Emulator, TopicKind};
    ///
    /// let emulator = Emulator::builder().topic("replies", TopicKind::Lite, 4).start().await?;
    /// emulator.create_lite_group("repliers", "replies")?;
    /// # Ok(()) }
    /// ```
    pub fn create_lite_group(&self, name: &str, bind_topic: &str) -> Result<(), Error> {
        create_lite_group(&self.shared, name, bind_topic)
    }

    /// Stores a message directly (no RPC, no faults), with the same type rules as `SendMessage`.
    pub fn publish(&self, topic: &str, msg: PublishMessage) -> Result<Published, Error> {
        let t = self
            .shared
            .topic(topic)
            .ok_or_else(|| Error::UnknownTopic(topic.to_owned()))?;
        let group = msg.message_group.filter(|g| !g.is_empty());
        match (t.kind, &group) {
            (TopicKind::Fifo, None) => {
                return Err(invalid(format!(
                    "topic {topic:?} is FIFO: a message group is required"
                )));
            }
            (TopicKind::Lite, _) => {
                return Err(invalid(format!(
                    "topic {topic:?} is a lite topic: its messages need a lite topic each; \
                     send them with SendMessage"
                )));
            }
            (TopicKind::Normal | TopicKind::Delay | TopicKind::Priority, Some(_)) => {
                return Err(invalid(format!(
                    "topic {topic:?} is normal: a message group is not allowed"
                )));
            }
            _ => {}
        }
        let queues = t.queue_count();
        let queue = match msg.queue_id {
            Some(q) if (q as usize) < queues => Some(q as usize),
            Some(q) => {
                return Err(invalid(format!(
                    "topic {topic:?} has {queues} queues, no queue {q}"
                )));
            }
            None => None,
        };
        let message_id = msg
            .message_id
            .filter(|id| !id.trim().is_empty())
            .unwrap_or_else(|| self.shared.next_message_id());
        let stored = stored_message(
            message_id.clone(),
            msg.body,
            msg.tag,
            msg.keys,
            msg.user_properties,
            group,
            None,
            String::new(),
        );
        let s = self.shared.store(&t, queue, vec![stored]);
        Ok(Published {
            queue_id: u32::try_from(s.queue_id).unwrap_or(u32::MAX),
            offset: s.offsets.first().copied().unwrap_or(0),
            message_id,
        })
    }

    /// Topic names.
    pub fn topics(&self) -> Vec<String> {
        let mut v: Vec<String> = self.shared.topics.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// A topic's kind and message counts.
    pub fn topic_info(&self, topic: &str) -> Option<TopicInfo> {
        let t = self.shared.topic(topic)?;
        let inner = t.inner.lock();
        Some(TopicInfo {
            kind: t.kind,
            messages_per_queue: inner.queues.iter().map(|q| q.log.len() as u64).collect(),
        })
    }

    /// Consumer groups and whether each is FIFO.
    pub fn groups(&self) -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = self
            .shared
            .groups
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort();
        v
    }

    /// Client ids with a channel (seen in Heartbeat or Telemetry and not terminated).
    pub fn clients(&self) -> Vec<String> {
        self.shared.clients.lock().iter().cloned().collect()
    }

    /// The ledger of `group` on `topic`: one record per stored message, by queue then offset
    /// (empty for an unknown topic).
    pub fn ledger(&self, topic: &str, group: &str) -> Vec<MessageRecord> {
        let Some(t) = self.shared.topic(topic) else {
            return Vec::new();
        };
        let mut inner = t.inner.lock();
        inner.reap_group(group, self.shared.clock.now_ms(), &self.shared.counters);
        inner.ledger(group)
    }

    /// Forgets every client, as a restarted proxy does: their settings (announced on the
    /// telemetry stream) and their channels. Until a client announces its settings again,
    /// its `Heartbeat` is answered `UNRECOGNIZED_CLIENT_TYPE`, its `QueryAssignment`
    /// `INTERNAL_SERVER_ERROR` `"settings" is null` and its auto-renewed receives
    /// `MESSAGE_NOT_FOUND` "The client [...] is disconnected.". With `end_streams` the open
    /// telemetry streams end too (a restart); without, they stay open (a proxy that lost its
    /// client table without the client noticing). Messages and their deliveries are kept.
    /// From then on, [`control_log`](Self::control_log) records each forgotten client's
    /// control-plane calls.
    pub fn forget_clients(&self, end_streams: bool) {
        let s = &self.shared;
        let clients: BTreeSet<String> = std::mem::take(&mut *s.clients.lock())
            .into_iter()
            .chain(std::mem::take(&mut *s.settings_seen.lock()))
            .collect();
        let mut forgotten = s.forgotten.lock();
        for client in &clients {
            forgotten.log.insert(client.clone(), Vec::new());
        }
        forgotten.without_settings.extend(clients);
        if end_streams {
            std::mem::take(&mut forgotten.streams).cancel();
        }
    }

    /// The control-plane calls of `client_id` since [`forget_clients`](Self::forget_clients)
    /// forgot it, in order (at most 256): `Telemetry` for a settings command, `Heartbeat`,
    /// `QueryAssignment`, each with whether it was answered OK. Empty for a client never
    /// forgotten.
    pub fn control_log(&self, client_id: &str) -> Vec<(Rpc, bool)> {
        self.shared
            .forgotten
            .lock()
            .log
            .get(client_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Restricts the queues `QueryAssignment` assigns for `topic` to `queues` (`None`: every
    /// queue, the default), as the proxy stops assigning the queues of a broker that left the
    /// route. Receives already under way on other queues go on.
    pub fn assign_only(&self, topic: &str, queues: Option<Vec<u32>>) {
        let mut assigned = self.shared.assigned.lock();
        match queues {
            Some(queues) => {
                assigned.insert(topic.to_owned(), queues);
            }
            None => {
                assigned.remove(topic);
            }
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The current faults.
    pub fn faults(&self) -> FaultConfig {
        self.shared.faults.lock().config.clone()
    }

    /// Replaces the faults (the PRNG keeps its position).
    pub fn set_faults(&self, faults: FaultConfig) {
        self.shared.faults.lock().config = faults;
    }

    /// Moves the emulator's clock forward without waiting: invisibility deadlines and receipt
    /// handle expiry see the jump, and long polls wake to re-check (their own timeout is
    /// measured on the same clock).
    pub fn advance(&self, by: Duration) {
        self.shared.clock.advance(by);
        self.shared.wake_all();
    }

    /// The emulator's clock: time since start plus every [`advance`](Self::advance).
    pub fn now(&self) -> Duration {
        Duration::from_millis(self.shared.clock.now_ms())
    }

    /// Scripts failures: the next `times` calls of `rpc` fail with `failure`, before any
    /// processing and whatever the [`FaultConfig`] rates say (then calls behave normally
    /// again). Calls several times to queue different failures; they are used in order.
    pub fn fail_next(&self, rpc: Rpc, times: usize, failure: ScriptedFailure) {
        let mut faults = self.shared.faults.lock();
        faults
            .scripted
            .extend(std::iter::repeat_n((rpc, failure), times));
    }

    /// The most recent `SendMessage` calls (at most 10,000), oldest first: the message ids,
    /// the queue the client chose and the answer's code.
    pub fn send_log(&self) -> Vec<SendRecord> {
        self.shared.send_log.lock().iter().cloned().collect()
    }

    /// Takes the service down, as a proxy that stops: the listener closes (new connections are
    /// refused), open connections are closed after their calls end, long polls end with
    /// `MESSAGE_NOT_FOUND`, telemetry streams end, and, as a restarted proxy forgets them, the
    /// clients' channels and settings are dropped (clients must announce their settings
    /// again). Topics, messages and groups are kept (they live in the broker). Waits up to 5 s
    /// for the server to finish. Bring it back with [`resume_serving`](Self::resume_serving);
    /// a no-op when already down.
    pub async fn stop_serving(&mut self) -> Result<(), Error> {
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        self.shared.serving().cancel();
        self.shared.wake_all();
        let result = finish(&mut task).await;
        self.shared.clients.lock().clear();
        self.shared.settings_seen.lock().clear();
        result
    }

    /// Serves again on the same address after [`stop_serving`](Self::stop_serving); a no-op
    /// when serving.
    ///
    /// # Errors
    /// [`Error::Bind`] if the address cannot be bound again.
    pub async fn resume_serving(&mut self) -> Result<(), Error> {
        if self.task.is_some() {
            return Ok(());
        }
        let listener = TcpListener::bind(self.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: self.addr,
                source: Arc::new(source),
            })?;
        *self.shared.serving.lock() = self.shared.shutdown.child_token();
        self.task = Some(tokio::spawn(serve(
            self.shared.clone(),
            listener,
            self.tls.clone(),
        )));
        Ok(())
    }

    /// Whether the service is up (started and not taken down with
    /// [`stop_serving`](Self::stop_serving)).
    pub fn is_serving(&self) -> bool {
        self.task.is_some()
    }

    /// Stops accepting calls, ends long polls (`MESSAGE_NOT_FOUND`) and telemetry streams,
    /// and waits up to 5 s for the server to finish.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.shared.shutdown.cancel();
        self.shared.wake_all();
        match self.task.take() {
            Some(mut task) => finish(&mut task).await,
            None => Ok(()),
        }
    }

    /// Serves until the server fails (for a foreground process; see also
    /// [`EmulatorBuilder::run_until`]).
    pub async fn serve_forever(mut self) -> Result<(), Error> {
        match self.task.take() {
            Some(task) => join_result(task.await),
            None => Ok(()),
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        self.shared.wake_all();
    }
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
