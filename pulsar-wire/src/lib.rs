//! A Pulsar binary-protocol client whose acknowledgements are always right.
//!
//! Pulsar entries often hold batches of messages, and acknowledging them takes care: an ack
//! carries an `ack_set` of the messages still outstanding, a transactional ack must carry
//! the batch's `batch_size` (a 4.0.x broker otherwise takes 1 off the consumer's unacked count
//! instead of N, and Shared consumers stall at `maxUnackedMessagesPerConsumer`) and an
//! independent set per ack (a reused one is a `TransactionConflict`). This crate speaks the
//! binary protocol directly and builds every ack with `txn-ack`: ordinary acks accumulate per
//! entry and are grouped through `ack-batcher` (one `CommandAck` frame carries many ids),
//! transactional acks keep the batch size and their own set, with a request id and the
//! broker's answer.
//!
//! ```no_run
//! use std::time::Duration;
//! use pulsar_wire::{
//!     BatchingOptions, Client, Consumer, InitialPosition, OutgoingMessage, Producer, SubType,
//! };
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! let consumer = Consumer::builder(&client, "orders", "billing")
//!     .sub_type(SubType::Shared)
//!     .initial_position(InitialPosition::Earliest)
//!     .build()
//!     .await?;
//! let producer = Producer::builder(&client, "orders")
//!     .batching(BatchingOptions::default().max_messages(3))
//!     .build()
//!     .await?;
//! let (a, b, c) = tokio::join!(
//!     producer.send(OutgoingMessage::new("a").key("k1")),
//!     producer.send(OutgoingMessage::new("b")),
//!     producer.send(OutgoingMessage::new("c")),
//! );
//! assert_eq!(a?.batch_size(), Some(3)); // one entry, three messages
//! # let _ = (b?, c?);
//!
//! // Acknowledge the batch inside a transaction: three per-index acks, each with
//! // batch_size = 3 and an independent ack set, then commit.
//! let txn = client
//!     .transaction_coordinator()
//!     .await?
//!     .new_transaction(Duration::from_secs(30))
//!     .await?;
//! for _ in 0..3 {
//!     let message = consumer.receive().await?;
//!     consumer.ack_in(&txn, &message).await?;
//! }
//! txn.commit().await?;
//! // Close within 5 s each; the reports count what was flushed and what was given up.
//! let acks = consumer.close(Duration::from_secs(5)).await?;
//! let sends = producer.close(Duration::from_secs(5)).await?;
//! assert_eq!((acks.acks_abandoned, sends.abandoned), (0, 0));
//! # Ok(()) }
//! ```
//!
//! # Delayed delivery, streams, batches, backoff, growing topics
//! [`OutgoingMessage::deliver_after`] and [`OutgoingMessage::deliver_at`] ask the broker to
//! hold a message back from Shared and Key_Shared subscriptions until its time (sent on its
//! own, as the Java client sends it). [`Consumer::stream`] is a `futures` `Stream` of the
//! messages; [`Consumer::batch_receive`] gathers up to a count, a size or a wait
//! ([`BatchReceive`]). [`ConsumerOptions::nack_backoff`] delays a nacked message by its
//! redelivery count ([`NackBackoff`]), and [`ConsumerOptions::ack_timeout`] asks again for
//! a message held too long without an ack; with [`ConsumerOptions::enable_retry`],
//! [`Consumer::reconsume_later`] hands a message back after a delay through a retry-letter
//! topic (the Java client's properties; the dead-letter topic past the maximum).
//! [`PatternConsumer::builder`] subscribes to every topic of a namespace matching a regular
//! expression and to those created later ([`PatternConsumer`]). Producers
//! and consumers of a partitioned topic follow
//! its growth every [`DEFAULT_PARTITIONS_REFRESH`] (`partitions_refresh` on their options).
//!
//! ```no_run
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use pulsar_wire::{
//!     BatchReceive, Client, Consumer, NackBackoff, OutgoingMessage, Producer, SubType,
//! };
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! let consumer = Consumer::builder(&client, "reminders", "mailer")
//!     .sub_type(SubType::Shared)
//!     .nack_backoff(NackBackoff::exponential(
//!         Duration::from_secs(1),
//!         Duration::from_secs(60),
//!         2.0,
//!     ))
//!     .build()
//!     .await?;
//! let producer = Producer::builder(&client, "reminders").build().await?;
//! producer
//!     .send(OutgoingMessage::new("call back").deliver_after(Duration::from_secs(600)))
//!     .await?;
//! // Up to 100 messages or 10 MiB, waiting at most a second.
//! let batch = consumer
//!     .batch_receive(BatchReceive::default().timeout(Duration::from_secs(1)))
//!     .await?;
//! # let _ = batch;
//! // Or one by one, eight handled at once.
//! consumer
//!     .stream()
//!     .for_each_concurrent(8, |message| async {
//!         if let Ok(message) = message {
//!             let _ = consumer.ack(&message).await;
//!         }
//!     })
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # Reading from a position, seeking
//! [`Reader::builder`] reads a topic in order from the earliest, the latest or a message id
//! ([`StartAt`]), without a durable subscription. [`Consumer::seek`] moves a subscription to
//! the earliest, the latest, just after a message id, or a publish time ([`SeekTo`];
//! [`Consumer::seek_to_time`]); [`Consumer::last_message_id`] says where the topic ends.
//!
//! ```no_run
//! use std::time::{Duration, SystemTime};
//! use pulsar_wire::{Client, Consumer, Reader, SeekTo, StartAt};
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! let reader = Reader::builder(&client, "audit", StartAt::Earliest).build().await?;
//! while reader.has_message_available().await? {
//!     let message = reader.read_next().await?;
//!     # let _ = message;
//! }
//! let consumer = Consumer::builder(&client, "audit", "replay").build()
//!     .await?;
//! // Everything published in the last hour comes again.
//! consumer
//!     .seek_to_time(SystemTime::now() - Duration::from_secs(3600))
//!     .await?;
//! consumer.seek(SeekTo::Latest).await?;
//! # Ok(()) }
//! ```
//!
//! # TLS and token authentication
//! A `pulsar+ssl://` service URL connects over TLS (rustls). The broker's certificate must be
//! signed by a CA the client trusts ([`ConnectOptions::tls_ca_file`] or
//! [`ConnectOptions::tls_ca_pem`]; without one, the public roots of `webpki-roots`) and must
//! name the host of the URL, an IP address included (the opt-out,
//! [`ConnectOptions::tls_verify_hostname`]`(false)`, still checks the CA).
//! [`ConnectOptions::tls_client_cert_files`] presents a client certificate (mutual TLS).
//! Lookups follow the brokers' `brokerServiceUrlTls`.
//!
//! A token authenticates every connection (`auth_method_name = "token"`): a fixed one
//! ([`ConnectOptions::auth_token`]), a file read anew for each connection and refresh
//! ([`ConnectOptions::auth_token_file`]), or any [`TokenProvider`] (a closure returning a
//! future of the token is one). When the broker finds the
//! token of a connection expired it sends `AUTH_CHALLENGE`, and the connection answers with
//! `AUTH_RESPONSE` carrying a token fetched anew from the provider, without reconnecting. A
//! token the broker refuses fails [`ClientBuilder::build`] at once with
//! [`Error::Authentication`], naming the broker; TLS failures are [`Error::Tls`], each with
//! what to fix.
//!
//! ```no_run
//! use pulsar_wire::{Client, Error};
//!
//! # async fn run() -> Result<(), Error> {
//! let connected = Client::builder("pulsar+ssl://broker.example:6651")
//!     .tls_ca_file("/etc/pulsar/ca.pem")
//!     .auth_token(std::env::var("PULSAR_TOKEN").unwrap_or_default())
//!     .build()
//!     .await;
//! match connected {
//!     Ok(client) => client.close().await,
//!     Err(error @ Error::Authentication { .. }) => eprintln!("fix the token: {error}"),
//!     Err(error) => return Err(error),
//! }
//! # Ok(()) }
//! ```
//!
//! # What is here
//! - [`Client`]: connections per broker over [`Connection`] (TCP or TLS, `CONNECT` with
//!   token authentication and `AUTH_CHALLENGE` answered, request-id correlation, keep-alive,
//!   every pending request failed when the connection is lost), lookups, partitioned
//!   metadata.
//! - [`Producer`]: single messages and batches (by count, bytes and delay; a partition's
//!   batches go out in order, many on the wire at once; each message's future resolves to
//!   its own [`MessageId`]), a [`PartitionRouter`] for
//!   partitioned topics, transactional sends, a bounded pending queue
//!   ([`ProducerOptions::max_pending_messages`], [`QueueFull`]).
//! - [`Consumer`]: Exclusive, Shared, Failover and Key_Shared subscriptions (see
//!   [Key_Shared](#key_shared)), flow permits refilled at half the receiver queue, batch
//!   decoding (messages acknowledged before are skipped; a checksum mismatch is acknowledged
//!   with its validation error, reported and not delivered), grouped acks with or without
//!   receipts, cumulative acks, negative acks, and transactional acks.
//! - [`MessageConsumer`]: the object-safe trait of what [`Consumer`] and
//!   [`prioritized::PriorityConsumer`] share (receive, ack, nack, refresh the partitions,
//!   close), for code that holds either as a `Box<dyn MessageConsumer>`.
//! - [`TransactionCoordinator`] and [`Transaction`]: `TC_CLIENT_CONNECT`, `NEW_TXN` (its
//!   timeout in milliseconds, as the reference clients send it), partitions and subscriptions
//!   registered before first use, commit and abort.
//! - [`prioritized`]: message priority on partitioned topics: [`prioritized::PriorityRouter`] (the
//!   producer's router, by each message's priority property) and
//!   [`prioritized::PriorityConsumer`] (per-partition consumers whose `FLOW` permits a gate
//!   withholds and grants, merged with the most important level first).
//! - Compression ([`Compression`]: LZ4, ZLIB, ZSTD, SNAPPY, in the formats the Java client
//!   writes): consumers decompress every entry whose metadata names a codec, up to the
//!   broker's `max_message_size` ([`ConsumerOptions::max_uncompressed_size`]; the declared
//!   size is checked before anything is allocated); producers compress with
//!   [`ProducerOptions::compression`], batched or not. [`compress`] and [`decompress`] are
//!   the codecs on their own.
//! - Chunking: consumers reassemble chunked messages (a message split by its producer into
//!   entries of at most `max_message_size`: Java, C++/Python and this crate's producers
//!   with chunking), bounded by [`ChunkLimits`] ([`ConsumerOptions::chunk_limits`]); the
//!   message's id is its last chunk's ([`Message::chunk_ids`] lists every chunk), and an ack,
//!   nack or transactional ack of it covers every chunk. Producers split a message too large
//!   for one entry with [`ProducerOptions::chunking`] (not with batching).
//! - Low-level protocol access, with the `unstable-wire` feature: `wire` (the frame codec,
//!   batch payloads, hand-built commands, a connection's raw requests) and `pb` (the
//!   generated protocol types). They follow `prost` and the protocol, outside the crate's
//!   semver promise: a minor release may change them.
//!
//! # Modules
//!
//! The modules form no cycle: each uses only modules below it, which
//! `scripts/check-module-cycles` checks (a child's `super::` items count as a use of its
//! parent, a parent's `use child::…` as a use of the child; re-exports and test modules do
//! not). From the bottom up: the leaves (`pb`, the generated types; `error`, with the mapping
//! of `ack-batcher`'s errors; `auth`, `backoff`, `link`, the frame `codec`, `batch` payloads,
//! `compression`, `id` with [`MessageId`]);
//! `tls` under `connection`, one broker connection (`CONNECT`, request ids, keep-alive);
//! `pool`, the connections per broker with lookups, partitioned metadata and topic names,
//! which is what producers, consumers and transactions hold; `txn` on the pool, `producer` on
//! the pool and `txn`, `consumer` on those and the producer (for dead letters); `consume`, the
//! [`MessageConsumer`] trait, on `consumer`; the
//! [`Client`] facade (`client`) that creates them; and [`prioritized`] on top. `wire`
//! re-exports the low-level items and adds the raw requests of a connection; no other module
//! depends on it.
//!
//! # Reconnection
//!
//! Producers and consumers register (subscribe) again by themselves after a lost connection,
//! a broker restart or an unload, with backoff (100 ms doubling up to 5 s, with jitter): sends wait within
//! [`ProducerOptions::send_timeout`] and go out again in order, `receive` waits for the
//! messages. [`Producer::state`] and [`Consumer::state`] watch it happen: a
//! [`tokio::sync::watch`] receiver of [`LinkStates`], a [`LinkState`] per partition
//! (`Connected`, `Reconnecting { attempt, cause }`, `Closed`, `Failed { cause }`) with
//! [`LinkStates::overall`] for the whole; every change is also logged (`tracing`, info, or
//! warn for a failure). While a producer reconnects, sends pile up:
//! [`ProducerOptions::max_pending_messages`] bounds them (no limit by default), and
//! [`ProducerOptions::on_queue_full`] says whether the next send fails at once with
//! [`Error::ProducerQueueFull`] ([`QueueFull::Fail`], the default) or waits for a place
//! within the send timeout ([`QueueFull::Block`]).
//!
//! ```no_run
//! use pulsar_wire::{Client, LinkState, Producer, QueueFull};
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! let producer = Producer::builder(&client, "orders")
//!     .max_pending_messages(Some(10_000))
//!     .on_queue_full(QueueFull::Block)
//!     .build()
//!     .await?;
//! let mut state = producer.state();
//! tokio::spawn(async move {
//!     while state.changed().await.is_ok() {
//!         if let LinkState::Reconnecting { attempt, cause } = state.borrow().overall() {
//!             eprintln!("orders: reconnecting (attempt {attempt}): {cause}");
//!         }
//!     }
//! });
//! # Ok(()) }
//! ```
//!
//! # Key_Shared
//!
//! A Key_Shared subscription gives each key to one consumer at a time, in order. The broker
//! dispatches a whole entry by the entry's *sticky key* — its `ordering_key`, else its
//! `partition_key`, else the bytes [`NONE_KEY`] — hashed with [`sticky_key_hash`] (Murmur3
//! x86 32-bit, masked with `i32::MAX`, modulo 65,536; a 4.0.x broker takes 0 as 1).
//! - Consumers: [`SubType::KeyShared`] sends a `KeySharedMeta` on `SUBSCRIBE`, AUTO_SPLIT by
//!   default (the broker spreads the hash space over the consumers), or
//!   [`KeySharedPolicy::sticky`] with this consumer's [`HashRange`]s (checked before
//!   subscribing: non-empty, `start <= end`, within `0..=65535`, not overlapping; the broker
//!   refuses a range that overlaps another consumer's with `ConsumerAssignError`), and
//!   [`KeySharedPolicy::allow_out_of_order_delivery`]. The first consumer fixes the mode and
//!   the out-of-order setting; a 4.0.8 broker refuses a consumer that differs with
//!   `ConsumerBusy` ("Subscription is of different type").
//! - Producers: **batch by key** ([`BatchingOptions::key_based`]) or not at all. A batch of
//!   mixed keys has no key of its own, so the broker sends all of it to the consumer of the
//!   `NONE_KEY` hash, and a key whose other batches go elsewhere reaches two consumers. With
//!   key-based batching a batch holds one key (the ordering key takes precedence over the
//!   partition key; messages without a key are batched together) and its entry carries that
//!   key. A key's batches go out in order; batches of different keys of one partition may be
//!   flushed at the same time, and the partition producer numbers them and queues their
//!   frames under one lock, so sequence ids grow in wire order (a broker with deduplication
//!   refuses or drops a lower id after a higher one).
//! - Messages: [`OutgoingMessage::key`] (also routes between partitions) and
//!   [`OutgoingMessage::ordering_key`] (Key_Shared only); received, [`Message::key`] and
//!   [`Message::ordering_key`].
//!
//! ```no_run
//! use pulsar_wire::{
//!     BatchingOptions, Client, Consumer, HashRange, KeySharedPolicy, OutgoingMessage, Producer,
//!     SubType,
//! };
//!
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! // This consumer serves the lower half of the hash space; another one takes the rest.
//! let consumer = Consumer::builder(&client, "orders", "per-customer")
//!     .sub_type(SubType::KeyShared)
//!     .key_shared_policy(KeySharedPolicy::sticky([HashRange::new(0, 32767)]))
//!     .build()
//!     .await?;
//! let producer = Producer::builder(&client, "orders")
//!     .batching(BatchingOptions::default().key_based(true))
//!     .build()
//!     .await?;
//! producer
//!     .send(OutgoingMessage::new("paid").key("customer-17"))
//!     .await?;
//! let message = consumer.receive().await?;
//! assert_eq!(message.key(), Some("customer-17"));
//! # Ok(()) }
//! ```
//!
//! # Schemas
//!
//! A producer or consumer may declare a [`Schema`] ([`ProducerOptions::schema`],
//! [`ConsumerOptions::schema`]), sent in `PRODUCER` and `SUBSCRIBE`: the broker registers it
//! for the topic or checks it against the topic's schema, and refuses an incompatible one
//! with [`Error::IncompatibleSchema`] (not retryable; the message says what to do). A
//! producer records the version the broker answers ([`Producer::schema_version`]) and every
//! message carries it ([`Message::schema_version`]). Bytes stay the default: without a
//! schema nothing changes. [`Schema::builder`] checks the kind and definition before
//! anything is sent ([`Error::Invalid`] for an empty or malformed definition;
//! [`SchemaKind::from_code`] and its `FromStr` refuse unknown and unsupported kinds).
//!
//! [`TypedProducer::builder`] and [`TypedConsumer::builder`] send and receive values
//! through a [`SchemaCodec`]: `JsonSchema` (serde values, feature `json`), `AvroSchema`
//! (serde values as Avro datums with `apache-avro`, feature `avro`) and `ProtobufSchema`
//! (prost messages, feature `protobuf`), written as the Java client's `JSONSchema`,
//! `AvroSchema` and `ProtobufSchema` write them. JSON and Avro schemas carry an Avro record
//! definition: give the one the Java client registers (`pulsar-admin schemas get`) to share
//! a topic with it byte for byte, or derive one from `apache_avro::AvroSchema` (`derived`,
//! feature `avro`); Protobuf schemas need the definition given (prost has no descriptors).
//! A payload the codec cannot read is [`Error::SchemaDecode`] with the message's id, never a
//! panic or a silent drop.
//!
//! ```no_run
//! # #[cfg(feature = "json")]
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! use pulsar_wire::{Client, JsonSchema, TypedConsumer, TypedProducer};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order {
//!     id: i64,
//!     item: Option<String>,
//! }
//! const ORDER: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},
//!     {"name":"item","type":["null","string"],"default":null}]}"#;
//!
//! let client = Client::builder("pulsar://127.0.0.1:6650").build().await?;
//! let consumer = TypedConsumer::builder(&client, "orders", "billing", JsonSchema::<Order>::new(ORDER)?)
//!     .build()
//!     .await?;
//! let producer = TypedProducer::builder(&client, "orders", JsonSchema::<Order>::new(ORDER)?)
//!     .build()
//!     .await?;
//! producer.send(&Order { id: 1, item: Some("pen".into()) }).await?;
//! let message = consumer.receive().await?;
//! println!("order {} (schema version {:?})", message.value().id, message.message().schema_version());
//! consumer.ack(&message).await?;
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//! - `json`, `avro`, `protobuf` (off by default): the schema codecs `JsonSchema` (`serde`,
//!   `serde_json`), `AvroSchema` (`serde`, `apache-avro`; it also parses the definitions of
//!   every JSON, Avro and Protobuf [`Schema`] before they are sent) and `ProtobufSchema`
//!   (`prost`, already a dependency). [`Schema`], [`SchemaCodec`] and the typed producer and
//!   consumer need none of them.
//! - `tls` (on by default): `pulsar+ssl://` service URLs, with `rustls` on its `ring`
//!   provider (pure Rust and assembly built by `cc`: no cmake or NASM) and the Mozilla roots
//!   of `webpki-roots`. Without it, a `pulsar+ssl://` URL is refused with an
//!   [`Error::Invalid`] naming the feature; the `tls_*` options stay available (and unused).
//! - `lz4`, `zlib`, `zstd`, `snappy` (all on by default): the compression codecs, with
//!   `lz4_flex`, `flate2` (on `miniz_oxide`), `zstd` (the C library, built from source by
//!   `zstd-sys`) and `snap`. An entry compressed with a codec left out is not delivered: it
//!   is reported as an [`Error::CodecDisabled`] naming the feature (acknowledged with a
//!   `DecompressionError`, as every entry that cannot be read), and a producer asking for it
//!   fails to start with that error.
//! - `metrics` (off by default): counters and histograms through the `metrics` facade (see
//!   "Metrics" below).
//!
//! # Metrics
//! With the feature `metrics`, counters and histograms go through the
//! [`metrics`](https://docs.rs/metrics) facade, each emitted from one crate-private module.
//! A facade, not OpenTelemetry: with no recorder installed a call costs a lookup in the no-op
//! recorder, the crate imposes no exporter or SDK version, and exporters exist for both
//! Prometheus (`metrics-exporter-prometheus`) and OpenTelemetry
//! (`metrics-exporter-opentelemetry`). Names are shared with `rocketmq-grpc`
//! (`mq_client_messages_sent_total`, `mq_client_send_duration_seconds`, …, with
//! `client="pulsar"`), units are in the names (seconds, bytes, counts), and labels are bounded:
//! `topic` (the full name, a partitioned topic as one series), and small fixed sets
//! (`operation`, `role`, `reason`, `level`); never message ids, keys, names, partitions or
//! brokers. The README's "Metrics" section lists every metric; `describe_metrics` registers
//! their units and help.
//!
//! An embedded broker on 127.0.0.1 speaking the same protocol, with the 4.0.x unacked
//! accounting, transactions, stats and fault injection, for examples and tests, is the crate
//! [`pulsar-wire-emulator`](https://docs.rs/pulsar-wire-emulator) (in `pulsar-wire/emulator`).

// Unsafe code is forbidden in the library; a test build only denies it, for the allocation
// probe of the decompression tests (see `compression`).
#![cfg_attr(not(test), forbid(unsafe_code))]
#![cfg_attr(test, deny(unsafe_code))]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod auth;
mod backoff;
// Items that only `wire` (`unstable-wire`) makes public.
#[cfg_attr(not(feature = "unstable-wire"), allow(unreachable_pub, dead_code))]
mod batch;
mod builders;
mod client;
mod close;
// Items that only `wire` (`unstable-wire`) makes public.
#[cfg_attr(not(feature = "unstable-wire"), allow(unreachable_pub, dead_code))]
mod codec;
#[cfg(test)]
mod codec_fuzz_tests;
mod compression;
// Items that only `wire` (`unstable-wire`) makes public.
#[cfg_attr(not(feature = "unstable-wire"), allow(unreachable_pub, dead_code))]
mod connection;
mod consume;
mod consumer;
mod error;
mod frame_writer;
mod id;
mod link;
mod metrics;
mod pool;

pub mod prioritized;

mod pattern;
mod producer;
mod reader;
mod receiving;
pub mod schema;
mod server_error;
mod time;
mod tls;
mod txn;
mod typed;
#[cfg(feature = "unstable-wire")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-wire")))]
pub mod wire;

#[cfg(feature = "metrics")]
pub use crate::metrics::describe_metrics;
/// The attribute macro for implementing [`TokenProvider`] (re-exported from `async-trait`,
/// so that no extra dependency is needed).
pub use async_trait::async_trait;
pub use auth::{TOKEN_AUTH_METHOD, TokenProvider};
pub use batch::MAX_BATCH_MESSAGES;
#[cfg(test)]
pub(crate) use batch::{BatchedMessage, encode_batch};
pub use builders::{
    ClientBuilder, ConsumerBuilder, PatternConsumerBuilder, ProducerBuilder, ReaderBuilder,
    TypedConsumerBuilder, TypedProducerBuilder,
};
pub use client::Client;
pub use close::{ConsumerCloseReport, DEFAULT_CLOSE_DEADLINE, ProducerCloseReport};
pub(crate) use codec::Frame;
pub use compression::{Compression, DEFAULT_MAX_MESSAGE_SIZE, compress, decompress};
pub use connection::{
    ConnectOptions, Connection, MAX_FRAME_SIZE, MIN_FRAME_SIZE, MIN_KEEP_ALIVE,
    MIN_OPERATION_TIMEOUT,
};
pub(crate) use connection::{ConsumerEvent, command_frame};
pub use consume::MessageConsumer;
pub use consumer::{
    ChunkLimits, Consumer, ConsumerOptions, ConsumerStats, DELAY_TIME, DeadLetterPolicy, HashRange,
    InitialPosition, KEY_HASH_RANGE_SIZE, KeySharedMode, KeySharedPolicy, MAX_NACK_DELAY,
    MAX_RECEIVER_QUEUE_SIZE, MAX_RECONSUME_TIMES, MIN_ACK_TIMEOUT, Message, NONE_KEY, NackBackoff,
    ORIGIN_MESSAGE_ID, REAL_SUBSCRIPTION, REAL_TOPIC, RECONSUME_TIMES, SeekTo, SubType,
    UNDECODABLE_REASON, sticky_key_hash,
};
pub use error::Error;
pub use id::MessageId;
pub use link::{LinkState, LinkStates};
pub use pattern::{
    DEFAULT_DISCOVERY_INTERVAL, MIN_DISCOVERY_INTERVAL, PatternConsumer, PatternOptions, TopicsMode,
};
pub use pool::{partition_topic, topic_name};
pub use producer::{
    BatchingOptions, DEFAULT_PARTITIONS_REFRESH, DEFAULT_SEND_TIMEOUT, MAX_PARTITIONS_REFRESH,
    MIN_PARTITIONS_REFRESH, OutgoingMessage, PartitionRouter, Producer, ProducerOptions, QueueFull,
    RoundRobin, key_partition,
};
pub use reader::{Reader, ReaderOptions, StartAt};
pub use receiving::{BatchReceive, MAX_BATCH_RECEIVE_MESSAGES, Messages};
#[cfg(feature = "avro")]
pub use schema::AvroSchema;
#[cfg(feature = "json")]
pub use schema::JsonSchema;
#[cfg(feature = "protobuf")]
pub use schema::ProtobufSchema;
pub use schema::{Schema, SchemaBuilder, SchemaCodec, SchemaKind};
pub use server_error::ServerError;
pub use txn::{TRANSACTION_COORDINATOR_ASSIGN, Transaction, TransactionCoordinator, TxnState};
pub use txn_ack::{PartialBatches, TxnId};
pub use typed::{TypedConsumer, TypedMessage, TypedMessages, TypedProducer};

/// Declares the generated protocol types as `pb`: public with `unstable-wire`, crate-private
/// without it.
macro_rules! proto_module {
    ($vis:vis, $($attr:meta),*) => {
        /// The generated protocol types (`pulsar.proto`), as `prost` generates them. Outside
        /// the crate's semver promise: they change with `prost` and the protocol.
        #[allow(
            missing_docs,
            unreachable_pub,
            clippy::all,
            clippy::pedantic,
            rust_2018_idioms
        )]
        $(#[$attr])*
        $vis mod pb {
            include!(concat!(env!("OUT_DIR"), "/pulsar.proto.rs"));
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
