//! A RocketMQ 5 gRPC client adapter whose acknowledgements are batched with `ack-batcher`.
//!
//! Every official RocketMQ 5 client sends one `AckMessage` RPC per consumed message although
//! the request carries repeated entries and the proxy answers per entry. This crate batches
//! acks per (endpoint, topic), maps the proxy's answer back to each message by id, retries what
//! failed one message at a time, and never blocks one ack behind another.
//!
//! - [`Session`]: connections, the headers the proxy reads and HMAC-SHA1 request signing.
//! - [`Producer`] ([`Producer::builder`]): sends normal, FIFO and delay messages
//!   ([`OutgoingMessage::deliver_after`], [`OutgoingMessage::deliver_at`]). It announces its settings on the telemetry
//!   stream and follows the retry policy the proxy answers with ([`SendRetryPolicy`]; 3
//!   attempts, exponential 10 ms to 1 s until then); retryable failures
//!   ([`Error::is_retryable`]) are retried with jitter on another queue and broker (FIFO
//!   messages keep their queue), and beyond the policy's attempts within
//!   [`ProducerBuilder::retry_window`] (default 10 s), so that a send outlives a short proxy outage;
//!   then [`Error::SendFailed`] names the attempts and the last error. Routes are refreshed
//!   after failures and every 30 s.
//!
//!   ```no_run
//!   # async fn demo() -> Result<(), rocketmq_grpc::Error> {
//!   use std::time::Duration;
//!   use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer};
//!
//!   let producer = Producer::builder(ClientConfig::new("127.0.0.1:8081")?)
//!       // Ride out a proxy restart of up to a minute.
//!       .retry_window(Duration::from_secs(60))
//!       .start() // or build(): the proxy's retry policy comes with the first send
//!       .await?;
//!   let receipt = producer.send(OutgoingMessage::new("orders", "hello")).await?;
//!   println!("sent {}", receipt.message_id());
//!   // Delivered in half an hour (to a topic of type DELAY).
//!   producer
//!       .send(OutgoingMessage::new("reminders", "pay").deliver_after(Duration::from_secs(1800)))
//!       .await?;
//!   # Ok(()) }
//!   ```
//! - [`Transaction`]s: [`Producer::begin_transaction`], [`Producer::send_in`] (a half
//!   message, invisible until the end), [`Transaction::commit`] or
//!   [`Transaction::rollback`]; a [`TransactionChecker`] answers the broker's check of a
//!   transaction left open (a producer that crashed before its end), which the proxy sends to
//!   a producer that announced the topic. As in the Java client: one message per transaction
//!   and a checker required.
//! - [`PushConsumer`]: receives from every assigned queue, runs a [`MessageHandler`] (a trait
//!   implementation or a closure) with
//!   bounded concurrency (FIFO messages in order), acknowledges through `ack-batcher` keyed by
//!   (endpoint, topic) — FIFO and late messages at once — and nacks failures with
//!   `ChangeInvisibleDuration`; while a handler runs longer than its message's
//!   invisibility, renews it ([`PushConsumerBuilder::renewal`]) so that the message is not
//!   delivered twice. A failed FIFO message is retried in place at the proxy's retry policy
//!   delays (its queue waits, so the order holds) and forwarded to the dead-letter queue
//!   after the policy's attempts, as the Java client does. Batches flush at 1,024 entries, 5 s, or before their earliest
//!   receipt handle expires; [`AckSettings::follow_deadlines`] lets them wait longer (25 s,
//!   say) for many quiet topics, trading more entries per request for more acks lost (and
//!   messages redelivered) if the process crashes.
//! - [`SimpleConsumer`]: the application receives when it wants
//!   ([`SimpleConsumer::receive`]: up to 32 messages, invisible for 10 s to 12 h, taking the
//!   subscribed topics and their readable queues in turn, as the Java client's
//!   `SimpleConsumer`), then acknowledges each message with [`SimpleConsumer::ack`], which
//!   joins a batch per (endpoint, topic) — flushed at 1,024 entries, after 5 s, or before the
//!   receipt handle expires — and returns that message's own result (the Java client sends
//!   one `AckMessage` per message; against a real proxy, 10,000 messages took 10 requests).
//!   [`SimpleConsumer::change_invisible_duration`] returns the message with its new receipt
//!   handle, which later acks use; [`SimpleConsumer::close`] flushes the pending acks.
//!
//!   ```no_run
//!   # async fn demo() -> Result<(), rocketmq_grpc::Error> {
//!   use std::sync::Arc;
//!   use std::time::Duration;
//!   use rocketmq_grpc::{ClientConfig, SimpleConsumer};
//!
//!   let consumer = Arc::new(
//!       SimpleConsumer::builder(ClientConfig::new("127.0.0.1:8081")?, "billing")
//!           .subscribe("orders", "*")
//!           .await_duration(Duration::from_secs(20))
//!           .build()
//!           .await?,
//!   );
//!   for message in consumer.receive(16, Duration::from_secs(30)).await? {
//!       println!("{}", String::from_utf8_lossy(message.body()));
//!       // Acks wait for their batch: acknowledge concurrently.
//!       let consumer = Arc::clone(&consumer);
//!       tokio::spawn(async move { consumer.ack(&message).await });
//!   }
//!   let report = consumer.close(Duration::from_secs(10)).await;
//!   println!("{} acks flushed at close", report.acks.succeeded);
//!   # Ok(()) }
//!   ```
//! - **RocketMQ 5.4+** (checked on 5.5.0): priority messages
//!   ([`OutgoingMessage::priority`]: on a `PRIORITY` topic a backlog of lower levels waits
//!   behind higher ones) and lite topics ([`OutgoingMessage::lite_topic`], received by a
//!   [`LitePushConsumer`] that subscribes to lite topics one by one; the proxy must run in
//!   cluster mode). A 5.3 proxy stores both as normal messages without their level or lite
//!   topic, and refuses a lite push consumer.
//! - **Bodies** are [`bytes::Bytes`] in and out, as `pulsar-wire`'s payloads:
//!   [`OutgoingMessage::new`] takes anything that converts into one (`Vec<u8>`, `String`,
//!   `&'static str`, …) and [`ReceivedMessage::body`] is one, sliced from the decoded gRPC
//!   message without a copy.
//! - [`AckFlusher`]: the `ack-batcher` transport that sends one `AckMessage` per batch and
//!   applies the proxy's result rules to each entry.
//!
//! # Failures and recovery
//! - **Retries.** [`Error::is_retryable`] classifies every proxy code by its documented
//!   meaning (the table is in its docs): throttling, timeouts and server errors are retried,
//!   bad requests, authorisation failures, missing resources and expired receipt handles are
//!   not. Acks are retried with exponential backoff (100 ms doubling to 5 s, with jitter;
//!   [`AckSettings::retry_backoff`], [`AckSettings::max_retry_backoff`]) under the ack
//!   batcher's retry budget until the receipt handle's deadline; nacks likewise.
//! - **Large messages.** Every message the proxy accepts can be received: the client decodes
//!   gRPC messages up to [`ClientConfig::max_message_size`] (default the proxy's 4 MiB body
//!   limit plus 1 MiB for properties and handles).
//! - **Proxy restarts.** The proxy refuses heartbeats, assignment queries and receives of a
//!   client whose settings it has not seen on a telemetry stream, and a restarted proxy has
//!   forgotten them. The consumer reopens the stream and announces its settings first, then
//!   heartbeats and queries its assignment; telemetry, heartbeats, assignments and receives
//!   back off exponentially with jitter (capped) while they fail.
//! - **Several proxies.** `ClientConfig::new("p1:8081,p2:8081")` gives access points tried in
//!   turn: when the one in use is unavailable (connection refused or lost), routes,
//!   heartbeats, telemetry and assignments go to the next ([`ClientConfig::endpoints`]). The
//!   telemetry command `ReconnectEndpointsCommand` (protocol v2.1.0) is not handled: the 5.3.3
//!   proxy does not send it and the Java client 5.0.8 logs it as unrecognized.
//! - **Drop.** A [`PushConsumer`] dropped without [`PushConsumer::close`] stops receiving
//!   at once and, in the background, waits for its handlers, flushes its pending acks and
//!   tells the proxy it left (10 s each at most).
//! - **Shutdown report.** [`PushCloseReport::unacknowledged`] lists the messages whose ack
//!   failed for good and that no later delivery acknowledged: at most the 10,000 most recent,
//!   with [`PushCloseReport::unacknowledged_dropped`] counting the others.
//!
//! # Low level
//! With the `unstable-wire` feature, `wire` gives the raw gRPC client of a [`Session`],
//! requests with its headers and signature, and the conversions to the wire types of `pb` (the
//! `prost` and `tonic` types of the proto subset), for emulators, benchmarks and protocol
//! tests; an application needs neither. They follow `prost` and `tonic`, so they are outside
//! the crate's semver promise: a minor release may change them. The proxy emulator the examples and tests
//! run against is the crate [`rocketmq-grpc-emulator`](https://docs.rs/rocketmq-grpc-emulator)
//! (in `rocketmq-grpc/emulator`).
//!
//! # Module structure
//! The crate's modules form no cycle: each file uses only modules below it (a parent may use
//! its children, a child never uses what its parent defines; the shared state of the consumer
//! and of the producer has a module of its own). `scripts/check-module-cycles` checks it.
//!
//! # TLS and namespaces
//! With the feature `tls` (on by default), `https://host:port` (or [`ClientConfig::tls`]) connects with TLS:
//! [`ClientConfig::tls_ca_file`] / [`ClientConfig::tls_ca_pem`] give a private CA,
//! [`ClientConfig::tls_client_cert_files`] / [`ClientConfig::tls_client_cert_pem`] a client
//! certificate, [`ClientConfig::tls_verify_hostname`] and [`ClientConfig::tls_webpki_roots`]
//! switch the host name check and the public roots (the same names as `pulsar-wire`'s
//! `ConnectOptions`). Unusable files or PEM are [`Error::Invalid`] naming the setting when
//! the [`Session`] is built; a refused certificate is [`Error::Tls`], not retryable, at once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rocketmq_grpc::Error> {
//! use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer, Session};
//!
//! let config = ClientConfig::new("https://localhost:8081")?
//!     .tls_ca_file("/etc/rocketmq/ca.pem")
//!     .namespace("tenant-a"); // topic "orders" is the broker's "tenant-a%orders"
//! let producer = Producer::builder(config).build()?;
//! producer.send(OutgoingMessage::new("orders", "hello")).await?;
//! # Ok(()) }
//! ```
//!
//! [`ClientConfig::namespace`] names every topic and group as the broker stores them
//! (`namespace%name`), which the 5.3.3 proxy needs: it reads neither
//! `Resource.resource_namespace` nor the `x-mq-namespace` header, both of which are sent too.
//!
//! # Metrics
//! With the feature `metrics`, counters and histograms go through the
//! [`metrics`](https://docs.rs/metrics) facade, each emitted from one crate-private module.
//! A facade, not OpenTelemetry: with no recorder installed a call costs a lookup in the no-op
//! recorder, the crate imposes no exporter or SDK version, and exporters exist for both
//! Prometheus (`metrics-exporter-prometheus`) and OpenTelemetry
//! (`metrics-exporter-opentelemetry`). Names are shared with `pulsar-wire`
//! (`mq_client_messages_sent_total`, `mq_client_send_duration_seconds`, …, with
//! `client="rocketmq"`), units are in the names (seconds, bytes, counts), and labels are
//! bounded: `topic` as the application names it, and small fixed sets (`operation`, `role`,
//! `reason`, `level`); never message ids, keys, lite topics, queues or endpoints. The README's
//! "Metrics" section lists every metric; `describe_metrics` registers their units and help.
//!
//! # Feature flags
//! - `tls` (on by default, as in `pulsar-wire`): TLS connections to the proxy (`rustls` on
//!   `ring`, `webpki-roots`). Without it (`default-features = false`), an `https://` endpoint
//!   or `tls(true)` is refused with [`Error::Invalid`] naming the feature.
//! - `unstable-wire` (off by default): the `pb` and `wire` modules (see "Low level"), outside
//!   the semver promise.
//! - `metrics` (off by default): counters and histograms through the `metrics` facade.

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod ack;
mod backoff;
mod code;
mod consumer;
mod error;
mod filter;
mod link;
mod message;
mod metrics;
pub mod priority;
mod producer;
mod session;
mod telemetry;
mod tls;
#[cfg(feature = "unstable-wire")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-wire")))]
pub mod wire;

#[cfg(feature = "metrics")]
pub use crate::metrics::describe_metrics;
pub use ack::{AckEntry, AckFlusher, AckKey, is_invalid_receipt_handle};
/// The attribute macro for implementing [`MessageHandler`] and [`TransactionChecker`]
/// (re-exported from `async-trait`, so that no extra dependency is needed).
pub use async_trait::async_trait;
pub use code::Code;
pub use consumer::{
    AckObserver, AckSettings, ConsumeResult, ConsumerStats, DEFAULT_AWAIT_DURATION, LiteOffset,
    LitePushConsumer, LitePushConsumerBuilder, MAX_INVISIBLE_DURATION, MAX_RECEIVE_MESSAGES,
    MIN_INVISIBLE_DURATION, MessageHandler, Messages, PRIORITY_RECEIVE_GRACE, PushCloseReport,
    PushConsumer, PushConsumerBuilder, SimpleCloseReport, SimpleConsumer, SimpleConsumerBuilder,
    SimpleConsumerStats,
};
pub use error::{Error, RpcStatus};
pub use filter::{FilterExpression, FilterKind};
pub use link::LinkState;
pub use message::{OutgoingMessage, ReceivedMessage};
pub use producer::{
    Backoff, BatchReceipt, DEFAULT_RETRY_WINDOW, Producer, ProducerBuilder, ProducerCloseReport,
    SendReceipt, SendRetryPolicy, Transaction, TransactionChecker, TransactionResolution,
};
pub use session::{
    ClientConfig, Credentials, DEFAULT_MAX_BODY, DEFAULT_MAX_MESSAGE_SIZE, Endpoint,
    MAX_NAMESPACE_LEN, MESSAGE_OVERHEAD, PROXY_MAX_INBOUND, Session,
};

/// Declares the generated proto subset as `pb`: public with `unstable-wire`, crate-private
/// without it.
macro_rules! proto_module {
    ($vis:vis, $($attr:meta),*) => {
        /// The wire types: the messages and enums of the proto subset (`apache.rocketmq.v2`)
        /// and the generated `MessagingService` client, as `prost` and `tonic` generate them
        /// (a `bytes` field, such as `Message::body`, is a [`bytes::Bytes`]). Outside the
        /// crate's semver promise: they change with `prost`, `tonic` and the proto.
        ///
        /// The crate's API takes and returns its own types; these are for code that speaks
        /// the protocol directly, with [`wire`] (the emulator crate serves these same types).
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            rust_2018_idioms
        )]
        $(#[$attr])*
        $vis mod pb {
            tonic::include_proto!("apache.rocketmq.v2");
        }
    };
}
#[cfg(feature = "unstable-wire")]
proto_module!(pub, cfg_attr(docsrs, doc(cfg(feature = "unstable-wire"))));
#[cfg(not(feature = "unstable-wire"))]
proto_module!(pub(crate), allow(dead_code));

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
