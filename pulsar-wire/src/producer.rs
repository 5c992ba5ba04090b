//! [`Producer`]: sends single messages or batches, routes them over the
//! partitions of a partitioned topic, and joins transactions.

mod batching;
mod message;
mod partition;
mod queue;
mod router;
mod spare_buffers;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

pub use batching::BatchingOptions;
use batching::ProducerBatcher;
pub use message::OutgoingMessage;
use partition::{PartitionProducer, PartitionSet, PartitionSpec};
pub use queue::QueueFull;
use queue::{PendingQueue, Slot};
pub use router::{PartitionRouter, RoundRobin, key_partition};

use crate::id::MessageId;
use crate::link::LinkHub;
use crate::metrics;
use crate::pb;
use crate::pool::Pool;
use crate::schema::Schema;
use crate::{Compression, Error, LinkStates, Transaction};

/// How a producer behaves.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    name: Option<String>,
    batching: Option<BatchingOptions>,
    router: Arc<dyn PartitionRouter>,
    transactional: bool,
    partitions_refresh: Option<Duration>,
    compression: Compression,
    chunking: bool,
    chunk_size: Option<usize>,
    send_timeout: Duration,
    max_pending_messages: Option<usize>,
    on_queue_full: QueueFull,
    schema: Option<Schema>,
}

/// The wait of a send without timeout (`send_timeout(Duration::ZERO)`): about 136 years.
const NO_SEND_TIMEOUT: Duration = Duration::from_secs(u32::MAX as u64);

/// How long a send waits for its receipt by default, reconnections included (the Java
/// client's `sendTimeout`).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a producer re-reads a partitioned topic's partition count by default (the Java
/// client's `autoUpdatePartitionsInterval`).
pub const DEFAULT_PARTITIONS_REFRESH: Duration = Duration::from_secs(60);

/// The shortest `partitions_refresh` accepted (of [`ProducerOptions`],
/// [`crate::ConsumerOptions`] and [`crate::prioritized::PriorityConsumerOptions`]): 100 ms,
/// as [`crate::MIN_DISCOVERY_INTERVAL`]. Each refresh is a `PARTITIONED_METADATA` request;
/// a shorter period only loads the broker (and zero would be a busy loop).
pub const MIN_PARTITIONS_REFRESH: Duration = Duration::from_millis(100);

/// The longest `partitions_refresh` accepted: one day. For rarer refreshes, turn the periodic
/// one off (`None`) and call `refresh_partitions` when the topic grew.
pub const MAX_PARTITIONS_REFRESH: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks a `partitions_refresh` option: `None`, or a period in
/// [`MIN_PARTITIONS_REFRESH`]`..=`[`MAX_PARTITIONS_REFRESH`].
pub(crate) fn check_partitions_refresh(every: Option<Duration>) -> Result<(), Error> {
    match every {
        Some(every) if !(MIN_PARTITIONS_REFRESH..=MAX_PARTITIONS_REFRESH).contains(&every) => {
            Err(Error::Invalid {
                what: "partitions_refresh",
                reason: format!(
                    "{every:?} is outside {MIN_PARTITIONS_REFRESH:?}..={MAX_PARTITIONS_REFRESH:?} \
                     (default {DEFAULT_PARTITIONS_REFRESH:?}): give a period in that range, or \
                     None to re-read the partition count only on refresh_partitions"
                ),
            })
        }
        _ => Ok(()),
    }
}

impl Default for ProducerOptions {
    /// A broker-assigned name, batching with [`BatchingOptions::default`], the
    /// [`RoundRobin`] router, not transactional, partitions re-read every
    /// [`DEFAULT_PARTITIONS_REFRESH`], no compression, sends waiting at most
    /// [`DEFAULT_SEND_TIMEOUT`], no limit on pending messages.
    fn default() -> Self {
        Self {
            name: None,
            batching: Some(BatchingOptions::default()),
            router: Arc::new(RoundRobin::default()),
            transactional: false,
            partitions_refresh: Some(DEFAULT_PARTITIONS_REFRESH),
            compression: Compression::None,
            chunking: false,
            chunk_size: None,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_pending_messages: None,
            on_queue_full: QueueFull::Fail,
            schema: None,
        }
    }
}

impl ProducerOptions {
    /// How long a send waits for the broker's receipt, reconnections included (default
    /// [`DEFAULT_SEND_TIMEOUT`]): a broker restarted or a topic moved within it costs the
    /// sender only the wait. When it passes the send fails with [`Error::Timeout`] (the
    /// entry may still be persisted if it was on the wire). `Duration::ZERO` means no
    /// timeout, as the Java client's `sendTimeout(0)`: a send waits as long as it takes
    /// (bound the sends that pile up with [`ProducerOptions::max_pending_messages`]).
    #[must_use]
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = if timeout.is_zero() {
            NO_SEND_TIMEOUT
        } else {
            timeout
        };
        self
    }

    /// The most messages the producer holds sent and not receipted yet, over all its
    /// partitions (the Java client's `maxPendingMessages`, which a partitioned producer there
    /// splits over its partitions; here it stays one limit however many partitions the topic
    /// has or gains). A message counts from [`Producer::send`] until it is receipted,
    /// refused, or fails (its send timeout included), also when the sender dropped its
    /// future meanwhile, since the message still goes out (but for a chunked message, whose
    /// chunks stop with its send's future). While the producer reconnects
    /// ([`Producer::state`]), sends pile up; when `limit` of them wait, the next send does
    /// what [`ProducerOptions::on_queue_full`] says. [`Producer::pending_messages`] counts
    /// them.
    ///
    /// Default `None`: no limit of the producer's own, as the Java client 4.x
    /// (`maxPendingMessages = 0`): every send is already bounded in time by the send
    /// timeout, so what a producer holds is bounded by its send rate times the timeout; and
    /// the right limit depends on the messages' size and the application's concurrency,
    /// which only the application knows, while a default limit that fails sends would turn a
    /// short reconnection into errors for applications that never asked for one. (A batching
    /// producer's batcher still holds at most the larger of 65,536 messages and 64 batches,
    /// and makes further sends wait for room.) `Some(0)` is refused by
    /// [`ProducerBuilder::build`](crate::ProducerBuilder::build) with [`Error::Invalid`].
    #[must_use]
    pub fn max_pending_messages(mut self, limit: Option<usize>) -> Self {
        self.max_pending_messages = limit;
        self
    }

    /// What a send does when the pending queue is full
    /// ([`ProducerOptions::max_pending_messages`]): fail at once with
    /// [`Error::ProducerQueueFull`] ([`QueueFull::Fail`], the default, as the Java client's
    /// `blockIfQueueFull(false)`), or wait for a place within the send timeout
    /// ([`QueueFull::Block`]). Without a limit it never applies.
    #[must_use]
    pub fn on_queue_full(mut self, when_full: QueueFull) -> Self {
        self.on_queue_full = when_full;
        self
    }

    /// The producer's name (the broker assigns one by default). On a partitioned topic every
    /// partition gets `<name>-<partition>`.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Batches messages with these limits.
    #[must_use]
    pub fn batching(mut self, batching: BatchingOptions) -> Self {
        self.batching = Some(batching);
        self
    }

    /// Sends every message on its own (no `num_messages_in_batch`).
    #[must_use]
    pub fn no_batching(mut self) -> Self {
        self.batching = None;
        self
    }

    /// The partition router for partitioned topics.
    #[must_use]
    pub fn router(mut self, router: Arc<dyn PartitionRouter>) -> Self {
        self.router = router;
        self
    }

    /// Tells the broker the producer sends in transactions (`txn_enabled`).
    #[must_use]
    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    /// Compresses every entry with this codec (default [`Compression::None`]): a message's
    /// payload when it is sent on its own, a batch's whole payload otherwise. The entry's
    /// metadata carries the codec and `uncompressed_size`. As in the Java client, the size
    /// checked against the broker's `max_message_size` is the compressed one: with a codec, a
    /// message is not refused for its uncompressed size, and a batch (or message) whose
    /// compressed payload is too large fails as a whole with [`Error::Invalid`] when it is
    /// sent. A codec this build lacks makes [`ProducerBuilder::build`](crate::ProducerBuilder::build) fail with
    /// [`Error::CodecDisabled`].
    #[must_use]
    pub fn compression(mut self, codec: Compression) -> Self {
        self.compression = codec;
        self
    }

    /// Splits a message whose payload (compressed, with a codec) does not fit in one entry
    /// into chunks, each an entry of its own, instead of refusing it (default off). The
    /// consumers reassemble them (this crate's, and the Java, C++ and Python clients'). As in
    /// the Java client, chunking cannot be combined with batching: add
    /// [`ProducerOptions::no_batching`], or [`ProducerBuilder::build`](crate::ProducerBuilder::build) fails with
    /// [`Error::Invalid`]. A chunked message's chunks go out one after another, and the
    /// producer's other messages wait for them, so that each message stays contiguous and
    /// in order; [`Producer::send`] returns the last chunk's id (the consumer's
    /// [`crate::Message::id`] of the message). Consumers on a Shared subscription may get
    /// the chunks of one message on different consumers: use Exclusive, Failover or
    /// Key_Shared subscriptions for chunked topics.
    #[must_use]
    pub fn chunking(mut self, enabled: bool) -> Self {
        self.chunking = enabled;
        self
    }

    /// With chunking, the most bytes of one chunk's entry (default, and at most, the
    /// broker's `max_message_size`).
    #[must_use]
    pub fn chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = Some(bytes);
        self
    }

    /// The schema sent in `PRODUCER` (none by default: bytes). The broker registers it for
    /// the topic, or checks it against the topic's schema and refuses an incompatible one
    /// ([`Error::IncompatibleSchema`] from [`crate::ProducerBuilder::build`]); every
    /// message then carries the version the broker answered ([`Producer::schema_version`]).
    /// Payloads are sent as given: [`crate::TypedProducer`] encodes values with the
    /// schema's codec.
    #[must_use]
    pub fn schema(mut self, schema: Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// How often the producer of a partitioned topic re-reads the partition count
    /// (`PARTITIONED_METADATA`) and attaches to partitions added since, so that its router
    /// sends to them too (default [`DEFAULT_PARTITIONS_REFRESH`]; `None`: only on
    /// [`Producer::refresh_partitions`]). A period must be in
    /// [`MIN_PARTITIONS_REFRESH`]`..=`[`MAX_PARTITIONS_REFRESH`]: creating the producer
    /// refuses others (zero included) with [`Error::Invalid`] naming `partitions_refresh`.
    #[must_use]
    pub fn partitions_refresh(mut self, every: Option<Duration>) -> Self {
        self.partitions_refresh = every;
        self
    }
}

/// Sends messages to a topic, or to the partitions of a partitioned topic. Cheap to clone.
///
/// With batching (the default), messages to the same partition (and transaction) are grouped
/// by count, bytes and delay; each batch is one `SEND` whose entry carries
/// `num_messages_in_batch` (also for a batch of one), and each message's future resolves to
/// its own [`MessageId`] (batch index and size included). A partition's batches go out in
/// the order they are sealed, and many of them may wait for their receipts at once (bounded
/// by [`ProducerOptions::max_pending_messages`], and by the batcher's own bound). With [`BatchingOptions::key_based`] (which Key_Shared consumers
/// need), batches are formed per key: a key's batches go out in order, batches of different
/// keys may be sealed concurrently and go out in the order they are sealed.
///
/// Sequence ids: each partition producer numbers its messages from the broker's
/// `last_sequence_id` + 1, and its frames reach the connection in sequence-id order (the ids
/// are assigned and the frame queued under one lock), so a broker with deduplication never
/// sees a lower id after a higher one.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ProducerInner>,
}

struct ProducerInner {
    pool: Pool,
    topic: String,
    name: Option<String>,
    transactional: bool,
    schema: Option<pb::Schema>,
    compression: Compression,
    chunk_size: Option<usize>,
    send_timeout: Duration,
    partitions: Arc<PartitionSet>,
    partitioned: bool,
    /// The producer of a topic that is not partitioned (`None` for a partitioned one).
    single: Option<Arc<PartitionProducer>>,
    router: Arc<dyn PartitionRouter>,
    batcher: Option<ProducerBatcher>,
    /// A place per message sent and not receipted yet.
    queue: PendingQueue,
    /// The link state of every partition producer.
    links: Arc<LinkHub>,
    closed: AtomicBool,
    /// Serialises partition refreshes, so that a partition is attached once.
    refresh: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.inner.topic)
            .field("partitions", &self.inner.partitions.len())
            .field("batching", &self.inner.batcher.is_some())
            .finish_non_exhaustive()
    }
}

impl Producer {
    pub(crate) async fn create(
        pool: &Pool,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Self, Error> {
        let topic = crate::pool::topic_name(topic)?;
        options.compression.ensure_available()?;
        check_partitions_refresh(options.partitions_refresh)?;
        if let Some(batching) = &options.batching {
            batching.validate()?;
        }
        if options.chunking && options.batching.is_some() {
            return Err(Error::Invalid {
                what: "producer options",
                reason: "chunking cannot be combined with batching (as in the Java client): \
                         add ProducerOptions::no_batching()"
                    .into(),
            });
        }
        if options.chunk_size == Some(0) {
            return Err(Error::Invalid {
                what: "chunk_size",
                reason: "must be positive".into(),
            });
        }
        let chunk_size = options
            .chunking
            .then(|| options.chunk_size.unwrap_or(usize::MAX));
        let queue = PendingQueue::new(
            &topic,
            options.max_pending_messages,
            options.on_queue_full,
            options.send_timeout,
        )?;
        let schema = options.schema.as_ref().map(Schema::wire);
        let links = LinkHub::new("producer");
        let topics = pool.partition_topics(&topic).await?;
        let partitioned = topics.len() > 1 || topics[0] != topic;
        let mut partitions = Vec::with_capacity(topics.len());
        for (index, partition_topic) in topics.into_iter().enumerate() {
            let partition = if partitioned { index as i32 } else { -1 };
            let name = partition_name(options.name.as_deref(), partitioned, index);
            partitions.push(
                PartitionProducer::create(
                    pool,
                    PartitionSpec {
                        topic: partition_topic,
                        partition,
                        name,
                        txn_enabled: options.transactional,
                        schema: schema.clone(),
                        compression: options.compression,
                        chunk_size,
                        send_timeout: options.send_timeout,
                        link: links.slot(partition),
                    },
                )
                .await?,
            );
        }
        let single = (!partitioned)
            .then(|| partitions.first().cloned())
            .flatten();
        let partitions = Arc::new(PartitionSet::new(partitions));
        let batcher = options
            .batching
            .map(|batching| ProducerBatcher::new(Arc::clone(&partitions), batching, queue.limit()))
            .transpose()?;
        let inner = Arc::new(ProducerInner {
            pool: pool.clone(),
            topic,
            name: options.name,
            transactional: options.transactional,
            schema,
            compression: options.compression,
            chunk_size,
            send_timeout: options.send_timeout,
            partitions,
            partitioned,
            single,
            router: options.router,
            batcher,
            queue,
            links,
            closed: AtomicBool::new(false),
            refresh: tokio::sync::Mutex::new(()),
        });
        if partitioned && let Some(every) = options.partitions_refresh {
            tokio::spawn(refresh_partitions_every(Arc::downgrade(&inner), every));
        }
        Ok(Self { inner })
    }

    /// Re-reads the partition count (`PARTITIONED_METADATA`) and attaches to the partitions
    /// added since; from then on the router is given the new count. Returns the partition
    /// count (0 for a topic that is not partitioned, which never changes). Pulsar never
    /// removes partitions: a smaller answer changes nothing.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`Producer::close`]; the lookup's or the `PRODUCER` request's
    /// errors (partitions attached before the failure stay attached).
    pub async fn refresh_partitions(&self) -> Result<usize, Error> {
        if !self.inner.partitioned {
            return Ok(0);
        }
        let _serial = self.inner.refresh.lock().await;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the producer"));
        }
        let inner = &self.inner;
        let count = inner.pool.partitions(&inner.topic).await? as usize;
        let have = inner.partitions.len();
        let mut added = Vec::new();
        let mut result = Ok(());
        for index in have..count {
            let name = partition_name(inner.name.as_deref(), true, index);
            match PartitionProducer::create(
                &inner.pool,
                PartitionSpec {
                    topic: crate::pool::partition_topic(&inner.topic, index as u32),
                    partition: index as i32,
                    name,
                    txn_enabled: inner.transactional,
                    schema: inner.schema.clone(),
                    compression: inner.compression,
                    chunk_size: inner.chunk_size,
                    send_timeout: inner.send_timeout,
                    link: inner.links.slot(index as i32),
                },
            )
            .await
            {
                Ok(producer) => added.push(producer),
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        if !added.is_empty() {
            tracing::info!(topic = %inner.topic, from = have, to = have + added.len(), "the producer attached to new partitions");
        }
        inner.partitions.extend(added);
        result.map(|()| inner.partitions.len())
    }

    /// The topic's full name.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Whether every partition producer is registered on a live connection now (false while
    /// one reconnects after a lost connection or an unload; sends wait meanwhile).
    pub fn is_connected(&self) -> bool {
        self.inner
            .partitions
            .all()
            .iter()
            .all(|producer| producer.is_connected())
    }

    /// The link state of every partition producer, as a [`tokio::sync::watch`] receiver:
    /// [`LinkStates::partitions`] by partition (one entry for a topic that is not
    /// partitioned; more as [`Producer::refresh_partitions`] attaches new ones),
    /// [`LinkStates::overall`] for the producer as a whole.
    /// [`tokio::sync::watch::Receiver::changed`] and
    /// [`tokio::sync::watch::Receiver::wait_for`] wait for a change (a watcher that looks
    /// less often than the state changes sees the latest state, not every one; every change
    /// is also logged, at info, or warn for [`crate::LinkState::Failed`]). The states go
    /// [`crate::LinkState::Connected`] → [`crate::LinkState::Reconnecting`] (one attempt
    /// after another) → `Connected` across a lost connection or an unload, and end
    /// [`crate::LinkState::Closed`] with [`Producer::close`] (or `Failed` when the broker
    /// refuses the producer for good). The sender is dropped with the producer.
    pub fn state(&self) -> tokio::sync::watch::Receiver<LinkStates> {
        self.inner.links.subscribe()
    }

    /// The version of the producer's schema in the topic's registry, as the broker answered
    /// the last `PRODUCER` (an opaque id: 8 bytes, a big-endian counter from 0, on a 4.0
    /// broker); every message carries it (`schema_version` in its metadata). `None` without
    /// a schema ([`ProducerOptions::schema`]).
    pub fn schema_version(&self) -> Option<bytes::Bytes> {
        self.inner
            .partitions
            .get(0)?
            .schema_version()
            .map(bytes::Bytes::from)
    }

    /// How many messages are sent and not receipted yet, over every partition (the messages
    /// [`ProducerOptions::max_pending_messages`] counts).
    pub fn pending_messages(&self) -> usize {
        self.inner.queue.pending()
    }

    /// How many times a partition producer registered again after its connection was lost
    /// or the broker closed it.
    pub fn reconnects(&self) -> u64 {
        self.inner
            .partitions
            .all()
            .iter()
            .map(|producer| producer.reconnects.load(Ordering::Relaxed))
            .sum()
    }

    /// The number of partitions (0 for a topic that is not partitioned); it grows with
    /// [`Producer::refresh_partitions`].
    pub fn partitions(&self) -> usize {
        if self.inner.partitioned {
            self.inner.partitions.len()
        } else {
            0
        }
    }

    /// Sends a message and waits for the broker's receipt.
    ///
    /// The future does nothing until it is first polled; from then on the message goes out
    /// even if the future is dropped. It is small and `Unpin`: an application that keeps many
    /// sends open can hold them in a plain collection (a `VecDeque`, awaiting the oldest: a
    /// producer's receipts come in the order of its sends per partition) without boxing.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a message larger than the broker's `max_message_size`;
    /// [`Error::ProducerQueueFull`] when [`ProducerOptions::max_pending_messages`] messages
    /// wait for their receipts (at once, or after waiting for a place within the send
    /// timeout, per [`ProducerOptions::on_queue_full`]); [`Error::Server`] for a
    /// `SEND_ERROR`; [`Error::Closed`] after [`Producer::close`] (also for a send waiting
    /// for a place); [`Error::Timeout`] and connection errors.
    pub fn send(
        &self,
        message: OutgoingMessage,
    ) -> impl Future<Output = Result<MessageId, Error>> + Send + Unpin + '_ {
        self.send_with(None, message)
    }

    /// Sends a message in a transaction: it becomes visible when the transaction commits
    /// and is discarded if it aborts. Registers the partition with the coordinator
    /// (`ADD_PARTITION_TO_TXN`) before the transaction's first send to it.
    ///
    /// # Errors
    /// As [`Producer::send`]; [`Error::Invalid`] when the transaction is not open;
    /// [`Error::Server`] when the coordinator refuses the partition. After any failure (a
    /// send that timed out or whose connection was lost may still have been stored in the
    /// transaction) the transaction refuses to commit ([`Error::TransactionFailed`]) and
    /// must be aborted.
    pub async fn send_in(
        &self,
        txn: &Transaction,
        message: OutgoingMessage,
    ) -> Result<MessageId, Error> {
        let _op = txn.start_op()?;
        let sent = self.send_with(Some(txn), message).await;
        if let Err(error) = &sent {
            // The broker may have stored it in the transaction (a receipt lost with the
            // connection, a timeout): committing would publish a message the application
            // was told failed. One rule for every failure: the transaction must be aborted.
            txn.failed(format!("a send to {}: {error}", self.inner.topic));
        }
        sent
    }

    /// Sends `message` (in `txn`) and counts the outcome in the metrics: a [`SendFuture`],
    /// which does the work when first polled.
    fn send_with<'a>(
        &'a self,
        txn: Option<&'a Transaction>,
        message: OutgoingMessage,
    ) -> SendFuture<'a> {
        SendFuture {
            producer: self,
            meter: Some(metrics::SendMeter::start(message.payload.len())),
            state: SendState::Start { txn, message },
        }
    }

    /// The first step of a send: a plain batched message that finds a place in the pending
    /// queue and room in the batcher goes into its batch now and waits on the batch's
    /// [`batching::Receipt`]; every other send (in a transaction, delayed, unbatched, or one
    /// that must wait for a place) continues boxed, in [`Producer::send_prepared`].
    fn start_send<'a>(
        &'a self,
        txn: Option<&'a Transaction>,
        message: OutgoingMessage,
    ) -> Result<SendState<'a>, Error> {
        let index = self.prepare(&message)?;
        let boxed = |message, slot| -> SendState<'a> {
            SendState::Boxed(Box::pin(self.send_prepared(txn, index, message, slot)))
        };
        let batcher = match (&self.inner.batcher, txn) {
            (Some(batcher), None) if !message.is_delayed() => batcher,
            _ => return Ok(boxed(message, None)),
        };
        let Some(place) = self.inner.queue.try_take()? else {
            return Ok(boxed(message, None));
        };
        let key = batcher.key(index, None, &message);
        Ok(if batcher.try_reserve()? {
            SendState::Batched(batcher.add(key, message, place)?)
        } else {
            SendState::Boxed(Box::pin(batcher.send(key, message, place.into_slot())))
        })
    }

    /// The checks of a send before it takes a place (the producer open, the message's size
    /// and times), and its partition's index.
    fn prepare(&self, message: &OutgoingMessage) -> Result<usize, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the producer"));
        }
        self.inner.pool.check_open()?;
        let index = match &self.inner.single {
            // A topic that is not partitioned: no router, no partition list.
            Some(single) => {
                single.check_size(message)?;
                0
            }
            None => {
                let (index, producer) = self.route(message)?;
                producer.check_size(message)?;
                index
            }
        };
        message.check_times()?;
        Ok(index)
    }

    /// The partition producer of `index`.
    fn partition(&self, index: usize) -> Result<Arc<PartitionProducer>, Error> {
        match &self.inner.single {
            Some(single) => Ok(Arc::clone(single)),
            None => self
                .inner
                .partitions
                .all()
                .get(index)
                .cloned()
                .ok_or(Error::Closed("the producer")),
        }
    }

    /// The rest of a send after [`Producer::prepare`]: its place in the pending queue (`slot`,
    /// or waited for here), the transaction's partition, then the batcher or a message of
    /// its own.
    async fn send_prepared(
        &self,
        txn: Option<&Transaction>,
        index: usize,
        message: OutgoingMessage,
        slot: Option<Slot>,
    ) -> Result<MessageId, Error> {
        let producer = self.partition(index)?;
        // Held by the message until it is resolved, given back before its result is known.
        let slot = match slot {
            Some(slot) => slot,
            None => self.inner.queue.admit().await?,
        };
        if let Some(txn) = txn {
            Box::pin(txn.add_partition(&producer.topic)).await?;
        }
        let txn = txn.map(Transaction::id);
        match &self.inner.batcher {
            // A delayed message goes on its own, as the Java client sends it.
            Some(batcher) if !message.is_delayed() => {
                let key = batcher.key(index, txn, &message);
                batcher.send(key, message, slot).await
            }
            _ => producer.send_single(&message, txn, slot).await,
        }
    }

    fn route(&self, message: &OutgoingMessage) -> Result<(usize, Arc<PartitionProducer>), Error> {
        let all = self.inner.partitions.all();
        let count = all.len();
        let index = if self.inner.partitioned {
            let partitions = u32::try_from(count).unwrap_or(u32::MAX);
            self.inner.router.route_message(message, partitions)? as usize % count.max(1)
        } else {
            0
        };
        let producer = all
            .get(index)
            .cloned()
            .ok_or(Error::Closed("the producer"))?;
        Ok((index, producer))
    }

    /// Sends every open batch now and waits for the receipts.
    pub async fn flush(&self) {
        if let Some(batcher) = &self.inner.batcher {
            batcher.flush().await;
        }
    }

    /// Sends what is batched and waits at most `deadline` for the receipts of every pending
    /// send, then closes the producer on the broker (`CLOSE_PRODUCER`). Sends waiting for a
    /// place in the pending queue fail at once with [`Error::Closed`], as do the sends still
    /// unanswered at the deadline; every link state becomes [`crate::LinkState::Closed`].
    /// The report counts the pending sends, answered and abandoned
    /// ([`crate::DEFAULT_CLOSE_DEADLINE`] is a deadline for callers without one of their
    /// own). A second close returns at once with an empty report; every call after close
    /// fails with [`Error::Closed`].
    ///
    /// # Errors
    /// The first `CLOSE_PRODUCER` failure; every partition is closed anyway (the broker
    /// forgets the registration when the connection ends), and the sends were handled as
    /// the report would have said.
    pub async fn close(&self, deadline: Duration) -> Result<crate::ProducerCloseReport, Error> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(crate::ProducerCloseReport::default());
        }
        let started = tokio::time::Instant::now();
        let pending = self.inner.queue.pending();
        self.inner.queue.close();
        if let Some(batcher) = &self.inner.batcher {
            batcher.close(deadline).await;
        }
        // Every pending message holds its place in the queue until its send is answered
        // (or its future dropped): wait for the places to come back.
        let rest = crate::close::remaining(deadline, started);
        let _ = tokio::time::timeout(rest, self.inner.queue.drained()).await;
        let abandoned = self.inner.queue.pending().min(pending);
        let report = crate::ProducerCloseReport {
            pending,
            answered: pending - abandoned,
            abandoned,
        };
        let mut result = Ok(());
        for producer in self.inner.partitions.all().iter() {
            if let Err(error) = producer.close().await
                && result.is_ok()
            {
                result = Err(error);
            }
        }
        self.inner.links.close_all(&self.inner.topic);
        result.map(|()| report)
    }
}

/// The name of partition `index`'s producer: `<name>-<index>` on a partitioned topic.
fn partition_name(name: Option<&str>, partitioned: bool, index: usize) -> Option<String> {
    match (name, partitioned) {
        (Some(name), true) => Some(format!("{name}-{index}")),
        (name, _) => name.map(str::to_owned),
    }
}

/// Refreshes the partitions of a producer every `every` until it is closed or dropped.
async fn refresh_partitions_every(inner: std::sync::Weak<ProducerInner>, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        let producer = Producer { inner };
        if let Err(error) = producer.refresh_partitions().await {
            tracing::warn!(topic = %producer.topic(), %error, "re-reading the partition count failed");
        }
    }
}

/// [`Producer::send`]'s future: small, so that an application holding thousands of sends
/// holds little. A batched message waits on its batch's [`batching::Receipt`] (a few words);
/// other sends run boxed.
struct SendFuture<'a> {
    producer: &'a Producer,
    /// Taken when the send ends.
    meter: Option<metrics::SendMeter>,
    state: SendState<'a>,
}

/// Where a [`SendFuture`] is.
enum SendState<'a> {
    /// Not polled yet: the work starts at the first poll, as an `async fn`'s would.
    Start {
        txn: Option<&'a Transaction>,
        message: OutgoingMessage,
    },
    /// In its batch, waiting for the batch's result.
    Batched(batching::Receipt),
    /// Every other send.
    Boxed(Pin<Box<dyn Future<Output = Result<MessageId, Error>> + Send + 'a>>),
    /// Ended.
    Done,
}

impl Future for SendFuture<'_> {
    type Output = Result<MessageId, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.state = match std::mem::replace(&mut this.state, SendState::Done) {
            SendState::Start { txn, message } => match this.producer.start_send(txn, message) {
                Ok(state) => state,
                Err(error) => return Poll::Ready(this.finish(Err(error))),
            },
            waiting => waiting,
        };
        let result = match &mut this.state {
            SendState::Batched(receipt) => ready!(Pin::new(receipt).poll(cx)),
            SendState::Boxed(send) => ready!(send.as_mut().poll(cx)),
            // A `Start` was just replaced above: only a completed future gets here.
            SendState::Start { .. } | SendState::Done => Err(Error::Invalid {
                what: "send",
                reason: "its future was polled again after it completed".into(),
            }),
        };
        this.state = SendState::Done;
        Poll::Ready(this.finish(result))
    }
}

impl SendFuture<'_> {
    /// Counts the send's end in the metrics (once) and gives its result.
    fn finish(&mut self, result: Result<MessageId, Error>) -> Result<MessageId, Error> {
        if let Some(meter) = self.meter.take() {
            meter.finish(&self.producer.inner.topic, result.is_ok());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partitions_refresh_out_of_range_is_refused_by_producer_and_consumer_options() {
        // Regression: Some(Duration::ZERO) was taken as None in silence, and Duration::MAX
        // panicked the producer's refresh task (an instant overflow).
        for every in [
            Duration::ZERO,
            Duration::from_millis(99),
            MAX_PARTITIONS_REFRESH + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let refused = |error: Error| {
                let text = error.to_string();
                assert!(
                    matches!(
                        error,
                        Error::Invalid {
                            what: "partitions_refresh",
                            ..
                        }
                    ) && text.contains("100ms..=86400s")
                        && text.contains("None"),
                    "{every:?}: {text}"
                );
            };
            refused(check_partitions_refresh(Some(every)).unwrap_err());
            refused(
                crate::ConsumerOptions::default()
                    .partitions_refresh(Some(every))
                    .validate()
                    .unwrap_err(),
            );
        }
        for every in [
            None,
            Some(MIN_PARTITIONS_REFRESH),
            Some(DEFAULT_PARTITIONS_REFRESH),
            Some(MAX_PARTITIONS_REFRESH),
        ] {
            assert!(check_partitions_refresh(every).is_ok());
            assert!(
                crate::ConsumerOptions::default()
                    .partitions_refresh(every)
                    .validate()
                    .is_ok()
            );
        }
    }
}
