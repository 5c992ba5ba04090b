//! The builders of the client types: `Thing::builder(..)` → setters → `build().await`, one
//! construction path per type ([`Client::builder`], [`Producer::builder`],
//! [`Consumer::builder`], [`Reader::builder`], [`PatternConsumer::builder`],
//! [`TypedProducer::builder`], [`TypedConsumer::builder`], [`PriorityConsumer::builder`]).
//!
//! Each builder holds the options value of its type ([`ConnectOptions`], [`ProducerOptions`],
//! [`ConsumerOptions`], …) and forwards that type's setters, so a setting is documented once,
//! on the options type. `options(..)` takes a whole options value at once (options kept in a
//! program's configuration, or shared by several consumers).

use std::sync::Arc;
use std::time::Duration;

use ::mq_priority::{GateConfig, LayoutSpec, PriorityPolicy};

use crate::auth::TokenProvider;
use crate::consumer::{
    ChunkLimits, ConsumerOptions, DeadLetterPolicy, InitialPosition, KeySharedPolicy, NackBackoff,
    SubType,
};
use crate::prioritized::{PriorityConsumer, PriorityConsumerOptions};
use crate::producer::{BatchingOptions, PartitionRouter, ProducerOptions, QueueFull};
use crate::schema::{Schema, SchemaCodec};
use crate::{
    Client, Compression, ConnectOptions, Consumer, Error, PartialBatches, PatternConsumer,
    PatternOptions, Producer, Reader, ReaderOptions, StartAt, TopicsMode, TypedConsumer,
    TypedProducer,
};

/// Setters that replace `self.$field` with `self.$field.$name(..)`, each documented as the
/// options type's setter of that name.
macro_rules! forward {
    ($field:ident, $options:ident; $($(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[doc = concat!("As [`", stringify!($options), "::", stringify!($name), "`].")]
            $(#[$attr])*
            pub fn $name(mut self, $($arg: $ty),*) -> Self {
                self.$field = self.$field.$name($($arg),*);
                self
            }
        )*
    };
}

/// Calls `$then!($($prefix)* <the connection setters>)`.
macro_rules! connect_setters {
    ($then:ident!($($prefix:tt)*)) => {
        $then!($($prefix)*
            auth_token(token: impl Into<String>);
            auth_token_file(path: impl Into<std::path::PathBuf>);
            auth_token_provider(provider: impl TokenProvider + 'static);
            tls_ca_file(path: impl Into<std::path::PathBuf>);
            tls_ca_pem(pem: impl AsRef<[u8]>);
            tls_client_cert_files(
                cert_chain: impl Into<std::path::PathBuf>,
                private_key: impl Into<std::path::PathBuf>
            );
            tls_client_cert_pem(cert_chain: impl AsRef<[u8]>, private_key: impl AsRef<[u8]>);
            tls_webpki_roots(trust: bool);
            tls_verify_hostname(verify: bool);
            operation_timeout(timeout: Duration);
            keep_alive(interval: Duration);
            max_frame_size(bytes: usize);
        );
    };
}

/// Calls `$then!($($prefix)* <the producer setters but schema>)`.
macro_rules! producer_setters {
    ($then:ident!($($prefix:tt)*)) => {
        $then!($($prefix)*
            send_timeout(timeout: Duration);
            max_pending_messages(limit: Option<usize>);
            on_queue_full(when_full: QueueFull);
            name(name: impl Into<String>);
            batching(batching: BatchingOptions);
            no_batching();
            router(router: Arc<dyn PartitionRouter>);
            transactional(transactional: bool);
            compression(codec: Compression);
            chunking(enabled: bool);
            chunk_size(bytes: usize);
            partitions_refresh(every: Option<Duration>);
        );
    };
}

/// Calls `$then!($($prefix)* <the consumer setters but schema>)`.
macro_rules! consumer_setters {
    ($then:ident!($($prefix:tt)*)) => {
        $then!($($prefix)*
            sub_type(sub_type: SubType);
            initial_position(position: InitialPosition);
            receiver_queue_size(size: u32);
            name(name: impl Into<String>);
            ack_group_time(time: Duration);
            ack_group_max(max: usize);
            partial_batches(mode: PartialBatches);
            ack_receipts(receipts: bool);
            max_uncompressed_size(bytes: usize);
            dead_letter(policy: DeadLetterPolicy);
            key_shared_policy(policy: KeySharedPolicy);
            chunk_limits(limits: ChunkLimits);
            #[doc(hidden)]
            legacy_committed_redeliveries(legacy: bool);
            partitions_refresh(every: Option<Duration>);
            enable_retry(enabled: bool);
            ack_timeout(timeout: Duration);
            nack_backoff(backoff: NackBackoff);
        );
    };
}

/// Builds a [`Client`]: [`Client::builder`], the [`ConnectOptions`] setters, then
/// [`ClientBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct ClientBuilder {
    /// The options, or why the service URL was refused (reported by `build`).
    options: Result<ConnectOptions, Error>,
}

/// Setters on the options unless the service URL was refused.
macro_rules! forward_connect {
    ($($(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[doc = concat!("As [`ConnectOptions::", stringify!($name), "`].")]
            $(#[$attr])*
            pub fn $name(mut self, $($arg: $ty),*) -> Self {
                self.options = self.options.map(|options| options.$name($($arg),*));
                self
            }
        )*
    };
}

impl Client {
    /// A builder of a client of the service at `url` (`pulsar://host:port` or
    /// `pulsar+ssl://host:port`, as [`ConnectOptions::new`]).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), pulsar_wire::Error> {
    /// use std::time::Duration;
    ///
    /// let client = pulsar_wire::Client::builder("pulsar://127.0.0.1:6650")
    ///     .operation_timeout(Duration::from_secs(10))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            options: ConnectOptions::new(url),
        }
    }
}

impl From<ConnectOptions> for ClientBuilder {
    /// A builder that starts from `options` (kept in a program's configuration, for example).
    fn from(options: ConnectOptions) -> Self {
        Self {
            options: Ok(options),
        }
    }
}

impl ClientBuilder {
    connect_setters!(forward_connect!());

    /// Connects (the `CONNECT` handshake happens here, so an unreachable broker is reported
    /// at once).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a service URL that is not one ([`ConnectOptions::new`]) or an
    /// option out of its range ([`ConnectOptions::validate`]); [`Error::ConnectionLost`] when
    /// nothing answers at the address, [`Error::Tls`], [`Error::Authentication`] when the
    /// broker refuses the token, [`Error::Server`], [`Error::Timeout`].
    pub async fn build(self) -> Result<Client, Error> {
        Client::open(self.options?).await
    }
}

/// Builds a [`Producer`]: [`Producer::builder`], the [`ProducerOptions`] setters, then
/// [`ProducerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct ProducerBuilder {
    client: Client,
    topic: String,
    options: ProducerOptions,
}

impl Producer {
    /// A builder of a producer on `topic` (every partition of a partitioned topic), with
    /// [`ProducerOptions::default`].
    ///
    /// ```no_run
    /// # async fn run(client: &pulsar_wire::Client) -> Result<(), pulsar_wire::Error> {
    /// let producer = pulsar_wire::Producer::builder(client, "orders")
    ///     .name("orders-writer")
    ///     .build()
    ///     .await?;
    /// producer.send(pulsar_wire::OutgoingMessage::new("hello")).await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: &Client, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder {
            client: client.clone(),
            topic: topic.into(),
            options: ProducerOptions::default(),
        }
    }
}

impl ProducerBuilder {
    /// Every option at once, replacing those set before (options shared by several
    /// producers).
    pub fn options(mut self, options: ProducerOptions) -> Self {
        self.options = options;
        self
    }

    producer_setters!(forward!(options, ProducerOptions;));
    forward!(options, ProducerOptions; schema(schema: Schema););

    /// Creates the producer.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` when topic
    /// auto-creation is off, [`Error::IncompatibleSchema`] for a schema it refuses);
    /// [`Error::Invalid`] for bad options; connection errors.
    pub async fn build(self) -> Result<Producer, Error> {
        Producer::create(self.client.pool(), &self.topic, self.options).await
    }
}

/// Builds a [`Consumer`]: [`Consumer::builder`], the [`ConsumerOptions`] setters, then
/// [`ConsumerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct ConsumerBuilder {
    client: Client,
    topic: String,
    subscription: String,
    options: ConsumerOptions,
}

impl Consumer {
    /// A builder of a consumer of `topic` (every partition of a partitioned topic) as
    /// `subscription`, with [`ConsumerOptions::default`].
    ///
    /// ```no_run
    /// # async fn run(client: &pulsar_wire::Client) -> Result<(), pulsar_wire::Error> {
    /// use pulsar_wire::{Consumer, SubType};
    ///
    /// let consumer = Consumer::builder(client, "orders", "billing")
    ///     .sub_type(SubType::Shared)
    ///     .build()
    ///     .await?;
    /// let message = consumer.receive().await?;
    /// consumer.ack(&message).await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(
        client: &Client,
        topic: impl Into<String>,
        subscription: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder {
            client: client.clone(),
            topic: topic.into(),
            subscription: subscription.into(),
            options: ConsumerOptions::default(),
        }
    }
}

impl ConsumerBuilder {
    /// Every option at once, replacing those set before (options shared by several
    /// consumers).
    pub fn options(mut self, options: ConsumerOptions) -> Self {
        self.options = options;
        self
    }

    consumer_setters!(forward!(options, ConsumerOptions;));
    forward!(options, ConsumerOptions; schema(schema: Schema););

    /// Subscribes.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` or
    /// `ConsumerBusy`; [`Error::IncompatibleSchema`] for a schema it refuses);
    /// [`Error::Invalid`] for bad options; connection errors.
    pub async fn build(self) -> Result<Consumer, Error> {
        Consumer::subscribe(
            self.client.pool(),
            &self.topic,
            &self.subscription,
            self.options,
        )
        .await
    }
}

/// Builds a [`Reader`]: [`Reader::builder`], the [`ReaderOptions`] setters, then
/// [`ReaderBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct ReaderBuilder {
    client: Client,
    topic: String,
    options: ReaderOptions,
}

impl Reader {
    /// A builder of a reader of `topic` from `start` ([`ReaderOptions::new`]).
    ///
    /// ```no_run
    /// # async fn run(client: &pulsar_wire::Client) -> Result<(), pulsar_wire::Error> {
    /// use pulsar_wire::{Reader, StartAt};
    ///
    /// let reader = Reader::builder(client, "orders", StartAt::Earliest).build().await?;
    /// let first = reader.read_next().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: &Client, topic: impl Into<String>, start: StartAt) -> ReaderBuilder {
        ReaderBuilder {
            client: client.clone(),
            topic: topic.into(),
            options: ReaderOptions::new(start),
        }
    }
}

impl ReaderBuilder {
    /// Every option at once, the start included, replacing those set before.
    pub fn options(mut self, options: ReaderOptions) -> Self {
        self.options = options;
        self
    }

    forward!(options, ReaderOptions;
        inclusive(inclusive: bool);
        receiver_queue_size(size: u32);
        name(name: impl Into<String>);
    );

    /// Creates the reader.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a [`StartAt::Id`] start on a partitioned topic; the errors of
    /// [`ConsumerBuilder::build`].
    pub async fn build(self) -> Result<Reader, Error> {
        Reader::create(self.client.pool(), &self.topic, self.options).await
    }
}

/// Builds a [`PatternConsumer`]: [`PatternConsumer::builder`], the [`PatternOptions`]
/// setters, then [`PatternConsumerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct PatternConsumerBuilder {
    client: Client,
    pattern: String,
    subscription: String,
    options: PatternOptions,
}

impl PatternConsumer {
    /// A builder of a consumer of every topic matching `pattern` (for example
    /// `persistent://public/default/orders-.*`) as `subscription`, and of those that come
    /// later; each topic subscribed with [`ConsumerOptions::default`]
    /// ([`PatternConsumerBuilder::consumer`] sets others).
    pub fn builder(
        client: &Client,
        pattern: impl Into<String>,
        subscription: impl Into<String>,
    ) -> PatternConsumerBuilder {
        PatternConsumerBuilder {
            client: client.clone(),
            pattern: pattern.into(),
            subscription: subscription.into(),
            options: PatternOptions::new(ConsumerOptions::default()),
        }
    }
}

impl PatternConsumerBuilder {
    /// Every option at once, replacing those set before.
    pub fn options(mut self, options: PatternOptions) -> Self {
        self.options = options;
        self
    }

    forward!(options, PatternOptions;
        consumer(options: ConsumerOptions);
        topics_mode(mode: TopicsMode);
        discovery_interval(every: Option<Duration>);
    );

    /// Lists the namespace and subscribes to every matching topic.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a pattern that names no namespace or is not a regular
    /// expression, and for bad options; the namespace listing's or a subscription's errors.
    pub async fn build(self) -> Result<PatternConsumer, Error> {
        PatternConsumer::subscribe(
            self.client.pool(),
            &self.pattern,
            &self.subscription,
            self.options,
        )
        .await
    }
}

/// Builds a [`TypedProducer`]: [`TypedProducer::builder`], the [`ProducerOptions`] setters
/// (the schema is the codec's), then [`TypedProducerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct TypedProducerBuilder<S> {
    producer: ProducerBuilder,
    codec: S,
}

impl<S: SchemaCodec> TypedProducer<S> {
    /// A builder of a producer of values on `topic`, each encoded by `codec` and sent with
    /// its schema.
    pub fn builder(client: &Client, topic: impl Into<String>, codec: S) -> TypedProducerBuilder<S> {
        TypedProducerBuilder {
            producer: Producer::builder(client, topic),
            codec,
        }
    }
}

impl<S: SchemaCodec> TypedProducerBuilder<S> {
    /// Every option at once, replacing those set before (the schema is the codec's whatever
    /// `options` says).
    pub fn options(mut self, options: ProducerOptions) -> Self {
        self.producer = self.producer.options(options);
        self
    }

    producer_setters!(forward!(producer, ProducerOptions;));

    /// Creates the producer, with the codec's schema.
    ///
    /// # Errors
    /// [`Error::IncompatibleSchema`] when the broker refuses the schema; the errors of
    /// [`ProducerBuilder::build`].
    pub async fn build(self) -> Result<TypedProducer<S>, Error> {
        let producer = self
            .producer
            .schema(self.codec.schema().clone())
            .build()
            .await?;
        Ok(TypedProducer::new(producer, Arc::new(self.codec)))
    }
}

/// Builds a [`TypedConsumer`]: [`TypedConsumer::builder`], the [`ConsumerOptions`] setters
/// (the schema is the codec's), then [`TypedConsumerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct TypedConsumerBuilder<S> {
    consumer: ConsumerBuilder,
    codec: S,
}

impl<S: SchemaCodec> TypedConsumer<S> {
    /// A builder of a consumer of values of `topic` as `subscription`, each payload decoded
    /// by `codec`, subscribed with its schema.
    pub fn builder(
        client: &Client,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        codec: S,
    ) -> TypedConsumerBuilder<S> {
        TypedConsumerBuilder {
            consumer: Consumer::builder(client, topic, subscription),
            codec,
        }
    }
}

impl<S: SchemaCodec> TypedConsumerBuilder<S> {
    /// Every option at once, replacing those set before (the schema is the codec's whatever
    /// `options` says).
    pub fn options(mut self, options: ConsumerOptions) -> Self {
        self.consumer = self.consumer.options(options);
        self
    }

    consumer_setters!(forward!(consumer, ConsumerOptions;));

    /// Subscribes, with the codec's schema.
    ///
    /// # Errors
    /// [`Error::IncompatibleSchema`] when the broker refuses the schema; the errors of
    /// [`ConsumerBuilder::build`].
    pub async fn build(self) -> Result<TypedConsumer<S>, Error> {
        let consumer = self
            .consumer
            .schema(self.codec.schema().clone())
            .build()
            .await?;
        Ok(TypedConsumer::new(consumer, Arc::new(self.codec)))
    }
}

/// Builds a [`PriorityConsumer`]: [`PriorityConsumer::builder`], the
/// [`PriorityConsumerOptions`] setters, then [`PriorityConsumerBuilder::build`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build().await`"]
pub struct PriorityConsumerBuilder {
    client: Client,
    topic: String,
    subscription: String,
    options: PriorityConsumerOptions,
}

impl PriorityConsumer {
    /// A builder of a consumer of every partition of `topic` as `subscription`, with the
    /// policy and layout the producers use ([`PriorityConsumerOptions::new`]).
    pub fn builder(
        client: &Client,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        policy: PriorityPolicy,
        layout: LayoutSpec,
    ) -> PriorityConsumerBuilder {
        PriorityConsumerBuilder {
            client: client.clone(),
            topic: topic.into(),
            subscription: subscription.into(),
            options: PriorityConsumerOptions::new(policy, layout),
        }
    }
}

impl PriorityConsumerBuilder {
    /// Every option at once, the policy and layout included, replacing those set before.
    pub fn options(mut self, options: PriorityConsumerOptions) -> Self {
        self.options = options;
        self
    }

    forward!(options, PriorityConsumerOptions;
        consumer(options: ConsumerOptions);
        gate(config: GateConfig);
        partitions_refresh(every: Option<Duration>);
        tick(every: Duration);
    );

    /// Subscribes to every partition.
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad options (checked first, before any request:
    /// `partitions_refresh` out of range, an ack timeout, retry) or when the topic is not
    /// partitioned; [`Error::Priority`] for bad gate settings or layout (also checked first)
    /// or a layout that does not fit the partition count; the errors of
    /// [`ConsumerBuilder::build`].
    pub async fn build(self) -> Result<PriorityConsumer, Error> {
        PriorityConsumer::open(&self.client, &self.topic, &self.subscription, self.options).await
    }
}

/// The construction methods from before the builders, kept one release.
impl Client {
    /// Connects to the service URL (the `CONNECT` handshake happens here, so an unreachable
    /// broker is reported at once).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an option out of its range ([`ConnectOptions::validate`]); as
    /// [`Connection::connect`](crate::Connection::connect): [`Error::ConnectionLost`] when nothing answers at the
    /// address, [`Error::Tls`], [`Error::Authentication`] when the broker refuses the token,
    /// [`Error::Server`], [`Error::Timeout`].
    #[deprecated(
        since = "0.2.0",
        note = "use `Client::builder(url)` with its setters and `.build().await` \
                (`ClientBuilder::from(options)` for a kept `ConnectOptions`)"
    )]
    pub async fn connect(options: ConnectOptions) -> Result<Self, Error> {
        crate::ClientBuilder::from(options).build().await
    }

    /// Creates a producer on `topic` (every partition of a partitioned topic).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` when topic
    /// auto-creation is off); [`Error::Invalid`] for bad options; connection errors.
    #[deprecated(
        since = "0.2.0",
        note = "use `Producer::builder(&client, topic)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn create_producer(
        &self,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Producer, Error> {
        Producer::builder(self, topic)
            .options(options)
            .build()
            .await
    }

    /// Subscribes to `topic` (every partition of a partitioned topic) as `subscription`.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` or
    /// `ConsumerBusy`); [`Error::Invalid`] for bad options; connection errors.
    #[deprecated(
        since = "0.2.0",
        note = "use `Consumer::builder(&client, topic, subscription)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn subscribe(
        &self,
        topic: &str,
        subscription: &str,
        options: ConsumerOptions,
    ) -> Result<Consumer, Error> {
        Consumer::builder(self, topic, subscription)
            .options(options)
            .build()
            .await
    }

    /// Subscribes to every topic matching `pattern` as `subscription`, and to those that
    /// come later ([`crate::PatternConsumer`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a pattern that names no namespace or is not a regular
    /// expression, and for bad options; the namespace listing's or a subscription's errors.
    #[deprecated(
        since = "0.2.0",
        note = "use `PatternConsumer::builder(&client, pattern, subscription)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn subscribe_pattern(
        &self,
        pattern: &str,
        subscription: &str,
        options: crate::PatternOptions,
    ) -> Result<crate::PatternConsumer, Error> {
        crate::PatternConsumer::builder(self, pattern, subscription)
            .options(options)
            .build()
            .await
    }

    /// Creates a producer of values on `topic`: `options` with the codec's schema
    /// ([`ProducerOptions::schema`]), each value encoded by `codec`.
    ///
    /// # Errors
    /// [`Error::IncompatibleSchema`] when the broker refuses the schema; the errors of
    /// [`Client::create_producer`].
    #[deprecated(
        since = "0.2.0",
        note = "use `TypedProducer::builder(&client, topic, codec)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn create_typed_producer<S: SchemaCodec>(
        &self,
        topic: &str,
        codec: S,
        options: ProducerOptions,
    ) -> Result<TypedProducer<S>, Error> {
        TypedProducer::builder(self, topic, codec)
            .options(options)
            .build()
            .await
    }

    /// Subscribes to `topic` as `subscription` for values: `options` with the codec's schema
    /// ([`ConsumerOptions::schema`]), each payload decoded by `codec`.
    ///
    /// # Errors
    /// [`Error::IncompatibleSchema`] when the broker refuses the schema; the errors of
    /// [`Client::subscribe`].
    #[deprecated(
        since = "0.2.0",
        note = "use `TypedConsumer::builder(&client, topic, subscription, codec)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn subscribe_typed<S: SchemaCodec>(
        &self,
        topic: &str,
        subscription: &str,
        codec: S,
        options: ConsumerOptions,
    ) -> Result<TypedConsumer<S>, Error> {
        TypedConsumer::builder(self, topic, subscription, codec)
            .options(options)
            .build()
            .await
    }

    /// A [`crate::Reader`] of `topic` from [`crate::ReaderOptions`]' start.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a [`crate::StartAt::Id`] start on a partitioned topic; the
    /// errors of [`Client::subscribe`].
    #[deprecated(
        since = "0.2.0",
        note = "use `Reader::builder(&client, topic, start)` with its setters (or `.options(..)`) and `.build().await`"
    )]
    pub async fn reader(
        &self,
        topic: &str,
        options: crate::ReaderOptions,
    ) -> Result<crate::Reader, Error> {
        crate::Reader::builder(self, topic, crate::StartAt::Earliest)
            .options(options)
            .build()
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Client, Error};

    /// A service URL that is not one is reported by `build`, naming the URL, whatever setters
    /// follow it; nothing connects.
    #[tokio::test]
    async fn a_bad_service_url_fails_the_build_with_invalid() {
        let error = Client::builder("http://127.0.0.1:6650")
            .operation_timeout(Duration::from_secs(1))
            .auth_token("t")
            .build()
            .await
            .expect_err("not a pulsar URL");
        assert!(
            matches!(&error, Error::Invalid { .. }) && error.to_string().contains("http://"),
            "{error:?}"
        );
    }

    /// An option out of its range is reported by `build`, naming the option.
    #[tokio::test]
    async fn an_option_out_of_range_fails_the_build_naming_it() {
        let error = Client::builder("pulsar://127.0.0.1:1")
            .operation_timeout(Duration::ZERO)
            .build()
            .await
            .expect_err("a zero timeout");
        assert!(
            matches!(
                &error,
                Error::Invalid {
                    what: "operation_timeout",
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
