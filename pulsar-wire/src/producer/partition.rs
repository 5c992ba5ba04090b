//! One producer on one topic or partition: `PRODUCER`, the `SEND` frames, `CLOSE_PRODUCER`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use prost::Message as _;
use tokio::sync::oneshot;
use txn_ack::TxnId;

use super::message::OutgoingMessage;
use super::queue::Slot;
use super::spare_buffers::SpareBuffers;
use crate::backoff::Retries;
use crate::codec::{OutgoingFrame, payload_checksum};
use crate::connection::ProducerGone;
use crate::id::MessageId;
use crate::link::{LinkSlot, LinkState};
use crate::pb::ServerError;
use crate::pb::base_command::Type;
use crate::pb::{self, MessageMetadata, SingleMessageMetadata};
use crate::pool::Pool;
use crate::{Compression, Connection, Error, Frame, command_frame, compress};

/// The partition producers of one producer, in partition order; it grows when the topic gains
/// partitions (Pulsar never removes any).
#[derive(Debug)]
pub(crate) struct PartitionSet {
    list: RwLock<Arc<[Arc<PartitionProducer>]>>,
}

impl PartitionSet {
    pub(crate) fn new(list: Vec<Arc<PartitionProducer>>) -> Self {
        Self {
            list: RwLock::new(list.into()),
        }
    }

    /// The producer of partition `index` (or of the topic, at 0, when not partitioned).
    pub(crate) fn get(&self, index: usize) -> Option<Arc<PartitionProducer>> {
        self.list.read().get(index).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.list.read().len()
    }

    /// Every partition producer now.
    pub(crate) fn all(&self) -> Arc<[Arc<PartitionProducer>]> {
        Arc::clone(&self.list.read())
    }

    /// Appends the producers of new partitions (the next indexes, in order).
    pub(crate) fn extend(&self, more: Vec<Arc<PartitionProducer>>) {
        if more.is_empty() {
            return;
        }
        let mut list = self.list.write();
        let grown: Vec<Arc<PartitionProducer>> = list.iter().cloned().chain(more).collect();
        *list = grown.into();
    }
}

/// The wait for an entry's receipt.
type Receipt = std::pin::Pin<Box<dyn Future<Output = Result<pb::MessageIdData, Error>> + Send>>;

/// The wait for the receipt of a batch entry: the entry's id (`batch_size` set, batch index
/// to be filled in per message).
pub(crate) type BatchReceipt =
    std::pin::Pin<Box<dyn Future<Output = Result<MessageId, Error>> + Send + 'static>>;

/// The wait for the end of a registration, set up before `PRODUCER` is sent.
type Ending = std::pin::Pin<Box<dyn Future<Output = ProducerGone> + Send>>;

/// Where a partition producer is registered now.
#[derive(Debug, Clone)]
struct Link {
    connection: Connection,
    producer_id: u64,
    /// Counts registrations: what an older one reports is stale.
    generation: u64,
    /// False from the loss of the connection (or `CLOSE_PRODUCER`) until registered again.
    up: bool,
}

/// The sequence ids, and the entries sent that have no receipt yet, in sequence-id order:
/// after a reconnection they are sent again in that order.
#[derive(Debug, Default)]
struct Sequencer {
    next: u64,
    awaiting: BTreeMap<u64, Awaiting>,
}

/// An entry sent (or to send once registered again) and the wait for its receipt.
#[derive(Debug)]
struct Awaiting {
    frame: OutgoingFrame,
    done: oneshot::Sender<Result<pb::MessageIdData, Error>>,
    /// The message's place in the producer's pending queue (none for a batch, whose
    /// messages' places the batcher holds, or a chunk, whose message's place its send
    /// holds).
    slot: Option<Slot>,
}

impl Awaiting {
    /// Gives the place back, then completes the wait: a sender that sends again at once
    /// finds the place free. Returns the entry's frame.
    fn resolve(self, result: Result<pb::MessageIdData, Error>) -> OutgoingFrame {
        drop(self.slot);
        let _ = self.done.send(result);
        self.frame
    }
}

/// Why a registration ended.
#[derive(Debug)]
enum Gone {
    /// The connection ended or the broker closed the producer.
    Link(ProducerGone),
    /// The broker refused a send in a way that registering again repairs.
    Refused(Error),
}

/// A producer attached to one topic (or one partition of a partitioned topic).
///
/// When its connection is lost or the broker closes it (`CLOSE_PRODUCER`: an unload, a
/// bundle moving to another broker), it looks the topic up again and registers under the
/// same name with the next epoch, with backoff ([`crate::backoff`]), and sends the entries
/// that have no receipt again, in sequence-id order with their sequence ids (a broker with
/// deduplication drops the copies it already has). Sends wait meanwhile, each within the
/// send timeout.
#[derive(Debug)]
pub(crate) struct PartitionProducer {
    pub(crate) topic: String,
    /// The partition index, -1 for a topic that is not partitioned.
    pub(crate) partition: i32,
    pool: Pool,
    link: RwLock<Link>,
    pub(crate) name: String,
    /// Whether the name was the user's (else the broker assigned it at the first
    /// registration; it is kept for the next ones).
    user_named: bool,
    txn_enabled: bool,
    /// The schema sent in `PRODUCER`, if any.
    schema: Option<pb::Schema>,
    /// The broker's version of the schema (`PRODUCER_SUCCESS`), carried by every message.
    schema_version: Mutex<Option<Vec<u8>>>,
    /// The epoch of the last registration.
    epoch: AtomicU64,
    /// Held while an entry is numbered and its frame queued, so that frames reach the
    /// connection in sequence-id order whoever sends them.
    sequencer: Mutex<Sequencer>,
    /// Receipted batches' buffers, for the next batches.
    spare: SpareBuffers,
    pub(crate) max_message_size: usize,
    /// The codec of every entry it sends.
    compression: Compression,
    /// With chunking, the most bytes of one chunk's entry (its payload and metadata).
    chunk_size: Option<usize>,
    /// With chunking, keeps a chunked message's chunks together on the wire (and sequence
    /// ids in order): held while a message's chunks go out, and by every other send while it
    /// writes its frame.
    send_order: tokio::sync::Mutex<()>,
    /// How long a send waits for its receipt, reconnections included.
    send_timeout: Duration,
    /// Set by [`PartitionProducer::close`].
    closing: AtomicBool,
    /// The broker the last `CLOSE_PRODUCER` named (PIP-307): the next registration tries it
    /// first, without a lookup.
    assigned: Mutex<Option<String>>,
    /// Why registering again was refused for good (the topic was deleted or terminated,
    /// the producer fenced): every send fails with it.
    failed: Mutex<Option<Error>>,
    /// Registrations after the first.
    pub(crate) reconnects: AtomicU64,
    /// The backoff of registering again.
    retries: Mutex<Retries>,
    /// Its entry in the producer's link states.
    state: LinkSlot,
}

/// What a partition producer is created with.
#[derive(Debug, Clone)]
pub(crate) struct PartitionSpec {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) name: Option<String>,
    pub(crate) txn_enabled: bool,
    pub(crate) schema: Option<pb::Schema>,
    pub(crate) compression: Compression,
    pub(crate) chunk_size: Option<usize>,
    pub(crate) send_timeout: Duration,
    /// Its entry in the producer's link states, attached once registered.
    pub(crate) link: LinkSlot,
}

impl PartitionProducer {
    /// Looks the topic up and registers a producer on its broker.
    pub(crate) async fn create(pool: &Pool, spec: PartitionSpec) -> Result<Arc<Self>, Error> {
        let user_named = spec.name.is_some();
        let (connection, producer_id, success, ending) = register(
            pool,
            &spec.topic,
            None,
            Declaration {
                name: spec.name.clone(),
                user_named,
                epoch: 0,
                txn_enabled: spec.txn_enabled,
                schema: spec.schema.clone(),
            },
        )
        .await?;
        let max_message_size = connection
            .max_message_size()
            .and_then(|size| usize::try_from(size).ok())
            .filter(|size| *size > 0)
            .unwrap_or(crate::DEFAULT_MAX_MESSAGE_SIZE);
        let next_sequence =
            u64::try_from(success.last_sequence_id().saturating_add(1)).unwrap_or(0);
        let link = Link {
            connection,
            producer_id,
            generation: 0,
            up: true,
        };
        let producer = Arc::new(Self {
            topic: spec.topic,
            partition: spec.partition,
            pool: pool.clone(),
            link: RwLock::new(link.clone()),
            name: success.producer_name,
            user_named,
            txn_enabled: spec.txn_enabled,
            schema: spec.schema,
            schema_version: Mutex::new(success.schema_version),
            epoch: AtomicU64::new(0),
            sequencer: Mutex::new(Sequencer {
                next: next_sequence,
                awaiting: BTreeMap::new(),
            }),
            spare: SpareBuffers::default(),
            max_message_size,
            compression: spec.compression,
            chunk_size: spec.chunk_size.map(|size| size.clamp(1, max_message_size)),
            send_order: tokio::sync::Mutex::new(()),
            send_timeout: spec.send_timeout,
            closing: AtomicBool::new(false),
            assigned: Mutex::new(None),
            failed: Mutex::new(None),
            reconnects: AtomicU64::new(0),
            retries: Mutex::new(Retries::new()),
            state: spec.link,
        });
        producer.state.attach();
        producer.watch(&link, ending);
        Ok(producer)
    }

    /// Whether the producer is registered on a live connection now.
    pub(crate) fn is_connected(&self) -> bool {
        self.link.read().up
    }

    /// Reconnects once `link` is gone (`gone` resolves).
    fn watch(self: &Arc<Self>, link: &Link, gone: Ending) {
        let generation = link.generation;
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let why = gone.await;
            if let Some(this) = weak.upgrade() {
                this.gone(generation, Gone::Link(why));
            }
        });
    }

    /// The registration of `generation` is gone: registers again in the background.
    fn gone(self: &Arc<Self>, generation: u64, why: Gone) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let cause = {
            let mut link = self.link.write();
            if link.generation != generation || !link.up {
                return;
            }
            link.up = false;
            match why {
                Gone::Link(ProducerGone::Lost) => link.connection.lost_error(),
                Gone::Link(ProducerGone::Closed) => {
                    Error::Closed("the producer's registration (CLOSE_PRODUCER from the broker)")
                }
                Gone::Link(ProducerGone::Moved(address)) => {
                    *self.assigned.lock() = Some(address);
                    Error::Closed(
                        "the producer's registration (CLOSE_PRODUCER naming its new broker)",
                    )
                }
                Gone::Refused(error) => error,
            }
        };
        tracing::debug!(topic = %self.topic, producer = %self.name, %cause, "producer disconnected: reconnecting");
        self.state
            .set(&self.topic, LinkState::Reconnecting { attempt: 1, cause });
        tokio::spawn(reconnect(Arc::downgrade(self)));
    }

    /// Registers again and sends what has no receipt; `Err` when the registration was
    /// refused for good.
    async fn register_again(self: &Arc<Self>) -> Result<Again, Error> {
        // A registration the broker still has (the producer gave it up after a refused
        // send) is closed first, or registering the name again would be `ProducerBusy`.
        let old = self.link.read().clone();
        if !old.connection.is_closed() {
            let _ = close_on(&old).await;
        }
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let assigned = self.assigned.lock().take();
        let registered = register(
            &self.pool,
            &self.topic,
            assigned.as_deref(),
            Declaration {
                name: Some(self.name.clone()),
                user_named: self.user_named,
                epoch,
                txn_enabled: self.txn_enabled,
                schema: self.schema.clone(),
            },
        )
        .await;
        let (connection, producer_id, success, ending) = match registered {
            Ok(registered) => registered,
            Err(error) if error.may_link_again(ServerError::ProducerBusy) => {
                return Ok(Again::NotYet(error));
            }
            Err(error) => return Err(error),
        };
        if self.schema.is_some() {
            *self.schema_version.lock() = success.schema_version;
        }
        let sequencer = self.sequencer.lock();
        let link = {
            let mut link = self.link.write();
            link.connection.forget_producer(link.producer_id);
            *link = Link {
                connection,
                producer_id,
                generation: link.generation + 1,
                up: true,
            };
            // Under the link's lock, so that a loss of the new link is told after it.
            self.state.set(&self.topic, LinkState::Connected);
            link.clone()
        };
        for (first, awaiting) in &sequencer.awaiting {
            self.transmit(&link, *first, awaiting.frame.clone());
        }
        let resent = sequencer.awaiting.len();
        drop(sequencer);
        self.watch(&link, ending);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        crate::metrics::reconnected(crate::metrics::Role::Producer);
        crate::metrics::retries(crate::metrics::Retried::Send, resent);
        tracing::debug!(topic = %self.topic, producer = %self.name, epoch, resent, "producer reconnected");
        Ok(Again::Linked)
    }

    /// Refused for good: every waiting send and every later one fails with `error`.
    fn fail(&self, error: Error) {
        let mut sequencer = self.sequencer.lock();
        *self.failed.lock() = Some(error.clone());
        for (_, awaiting) in std::mem::take(&mut sequencer.awaiting) {
            awaiting.resolve(Err(error.clone()));
        }
        drop(sequencer);
        self.state
            .set(&self.topic, LinkState::Failed { cause: error });
    }

    /// Writes `frame` on `link` and completes its wait when the receipt comes; when the
    /// connection is gone the frame waits for the next registration.
    fn transmit(self: &Arc<Self>, link: &Link, first: u64, mut frame: OutgoingFrame) {
        if let Some(send) = frame.frame.command.send.as_mut() {
            send.producer_id = link.producer_id;
        }
        let Ok(receipt) = link.connection.start_send(link.producer_id, first, frame) else {
            // The connection ended: the watcher registers again and sends it then.
            return;
        };
        let weak = Arc::downgrade(self);
        let generation = link.generation;
        tokio::spawn(async move {
            let result = receipt.await;
            if let Some(this) = weak.upgrade() {
                this.received(generation, first, result);
            }
        });
    }

    /// The broker answered the entry numbered from `first` (on whichever registration).
    /// A `SEND_ERROR` that may succeed later (`PersistenceError` while the broker's storage
    /// stops or fails over, `ServiceNotReady`) keeps the entry: the producer registers again
    /// and sends it again, as the Java client does by closing the connection.
    fn received(
        self: &Arc<Self>,
        generation: u64,
        first: u64,
        result: Result<pb::MessageIdData, Error>,
    ) {
        if let Err(error) = &result
            && matches!(
                error,
                Error::ConnectionLost { .. } | Error::Closed(_) | Error::Timeout { .. }
            )
        {
            // Sent again once registered again; the send's own timeout bounds the wait.
            return;
        }
        if let Err(error @ Error::Server { .. }) = &result
            && self.superseded(generation)
        {
            // Refused because the broker closed this registration (a SEND written after
            // `CLOSE_PRODUCER` crossed it): sent again on the next one.
            tracing::debug!(topic = %self.topic, %error, "a send refused by a closed registration: sending it again");
            self.gone(generation, Gone::Link(ProducerGone::Closed));
            return;
        }
        if let Err(error @ Error::Server { .. }) = &result
            && error.is_retryable()
        {
            tracing::info!(topic = %self.topic, %error, "a send refused for now: registering again to send it again");
            self.gone(generation, Gone::Refused(error.clone()));
            return;
        }
        let awaiting = self.sequencer.lock().awaiting.remove(&first);
        if let Some(awaiting) = awaiting {
            let frame = awaiting.resolve(result).frame;
            // A batch's buffer is free once the writer has sent it: the next batch's.
            if let Some(payload) = frame.payload
                && payload.metadata.num_messages_in_batch.is_some()
            {
                self.spare.give_back(payload.data);
            }
        }
    }

    /// Whether the registration of `generation` is over: replaced, down, or closed by the
    /// broker.
    fn superseded(&self, generation: u64) -> bool {
        let link = self.link.read();
        link.generation != generation
            || !link.up
            || !link.connection.watches_producer(link.producer_id)
    }

    /// Queues `frame`, numbered from `first`, under the sequencer's lock; returns the wait
    /// for its receipt, within the send timeout. The entry holds `slot` until it is resolved.
    fn submit(
        self: &Arc<Self>,
        sequencer: &mut Sequencer,
        first: u64,
        frame: OutgoingFrame,
        slot: Option<Slot>,
    ) -> Result<impl Future<Output = Result<pb::MessageIdData, Error>> + Send + use<>, Error> {
        if let Some(error) = self.failed.lock().clone() {
            return Err(error);
        }
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::Closed("the producer"));
        }
        let (done, wait) = oneshot::channel();
        {
            let link = self.link.read();
            if link.up {
                self.transmit(&link, first, frame.clone());
            }
        }
        sequencer
            .awaiting
            .insert(first, Awaiting { frame, done, slot });
        let weak = Arc::downgrade(self);
        let timeout = self.send_timeout;
        Ok(async move {
            match tokio::time::timeout(timeout, wait).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(Error::Closed("the producer")),
                Err(_) => {
                    let mut cause = "the producer is gone".to_owned();
                    if let Some(this) = weak.upgrade() {
                        // Gives its place back.
                        drop(this.sequencer.lock().awaiting.remove(&first));
                        cause = this.waiting_on();
                    }
                    Err(Error::Timeout {
                        operation: "SEND",
                        after: timeout,
                        cause,
                    })
                }
            }
        })
    }

    /// What a send that timed out waited on: the broker it is registered with, or the
    /// reason it is not registered now.
    fn waiting_on(&self) -> String {
        let link = self.link.read();
        let broker = link.connection.address().to_owned();
        if link.up {
            return format!("the broker at {broker} sent no receipt");
        }
        drop(link);
        match self.state.current() {
            Some(crate::LinkState::Reconnecting { attempt, cause }) => format!(
                "the producer lost the broker at {broker} and is registering again (attempt \
                 {attempt}: {cause})"
            ),
            _ => format!("the producer lost the broker at {broker} and is registering again"),
        }
    }

    /// Refuses a message larger than the broker takes. With compression the compressed size
    /// counts, which is known only when the entry is built ([`Self::compressed`]).
    /// With chunking nothing is refused: a large message is split.
    pub(crate) fn check_size(&self, message: &OutgoingMessage) -> Result<(), Error> {
        if self.compression != Compression::None || self.chunk_size.is_some() {
            return Ok(());
        }
        let size = message.encoded_size();
        if size > self.max_message_size {
            return Err(Error::Invalid {
                what: "message",
                reason: format!(
                    "{size} bytes (payload, key and properties) exceed the broker's \
                     max_message_size of {} bytes on {}",
                    self.max_message_size, self.topic
                ),
            });
        }
        Ok(())
    }

    /// Sends one message that is not in a batch (no `num_messages_in_batch`); with chunking,
    /// in chunks when it is too large for one entry. The message holds `slot` until it is
    /// resolved.
    pub(crate) async fn send_single(
        self: &Arc<Self>,
        message: &OutgoingMessage,
        txn: Option<TxnId>,
        slot: Slot,
    ) -> Result<MessageId, Error> {
        if let Some(chunk_size) = self.chunk_size {
            let sent = self.send_chunked(message, txn, chunk_size).await;
            drop(slot);
            return sent;
        }
        let (data, compression, uncompressed_size) =
            self.compressed(&message.payload, "message")?;
        let sent = self.write(1, Some(slot), |sequence_id| {
            let metadata =
                self.single_metadata(message, sequence_id, txn, compression, uncompressed_size);
            Ok(self
                .send_frame(sequence_id, None, txn, metadata, data, false)
                .into())
        })?;
        Ok(self.id_of(sent.await?))
    }

    /// Sends a message of a chunking producer: as one entry when it fits in `chunk_size`,
    /// otherwise as consecutive chunk entries sharing its sequence id (`uuid`
    /// `<producer>-<sequence id>`, `chunk_id`, `num_chunks_from_msg`,
    /// `total_chunk_msg_size`, and the message's metadata on each, as the Java client
    /// sends them); returns the last chunk's id. The whole payload is compressed first.
    async fn send_chunked(
        self: &Arc<Self>,
        message: &OutgoingMessage,
        txn: Option<TxnId>,
        chunk_size: usize,
    ) -> Result<MessageId, Error> {
        let (data, compression, uncompressed_size) =
            self.compressed_unchecked(&message.payload, "message")?;
        // Every send of a chunking producer comes here (chunking excludes batching) and holds
        // this lock until its last chunk is written, so its chunks stay together and the
        // sequence id taken under it is the highest on the wire so far.
        let order = self.send_order.lock().await;
        let sequence_id = {
            let mut sequencer = self.sequencer.lock();
            let id = sequencer.next;
            sequencer.next += 1;
            id
        };
        let metadata =
            self.single_metadata(message, sequence_id, txn, compression, uncompressed_size);
        let uuid = format!("{}-{sequence_id}", self.name);
        // Room for the chunk fields, the command and the frame's header.
        let overhead = prost::Message::encoded_len(&metadata) + uuid.len() + 128;
        let room = chunk_size.saturating_sub(overhead).max(1);
        if data.len() <= room {
            let frame = self.send_frame(sequence_id, None, txn, metadata, data, false);
            let receipt =
                self.submit(&mut self.sequencer.lock(), sequence_id, frame.into(), None)?;
            drop(order);
            return Ok(self.id_of(receipt.await?));
        }
        let total = data.len();
        let count = total.div_ceil(room);
        let (Ok(total_i32), Ok(count_i32)) = (i32::try_from(total), i32::try_from(count)) else {
            return Err(Error::Invalid {
                what: "message",
                reason: format!(
                    "{total} bytes in {count} chunks cannot be described by the protocol's \
                     total_chunk_msg_size (i32)"
                ),
            });
        };
        let mut last = None;
        for (index, start) in (0..count_i32).zip((0..total).step_by(room)) {
            let piece = data.slice(start..(start + room).min(total));
            let chunk = MessageMetadata {
                uuid: Some(uuid.clone()),
                num_chunks_from_msg: Some(count_i32),
                total_chunk_msg_size: Some(total_i32),
                chunk_id: Some(index),
                ..metadata.clone()
            };
            let frame = self.send_frame(sequence_id, None, txn, chunk, piece, true);
            // The chunks share the sequence id: one receipt at a time.
            let receipt =
                self.submit(&mut self.sequencer.lock(), sequence_id, frame.into(), None)?;
            last = Some(receipt.await?);
        }
        drop(order);
        Ok(self.id_of(last.unwrap_or_default()))
    }

    fn id_of(&self, id: pb::MessageIdData) -> MessageId {
        MessageId {
            ledger_id: id.ledger_id,
            entry_id: id.entry_id,
            partition: self.partition,
            batch_index: -1,
            batch_size: None,
        }
    }

    /// Numbers `messages` and queues them as one batch entry (`num_messages_in_batch` set,
    /// even for one message) before it returns; returns the wait for the entry's receipt,
    /// the entry's id with `batch_size` set (the batch index is each message's own).
    pub(crate) fn start_batch(
        self: &Arc<Self>,
        messages: &[OutgoingMessage],
        txn: Option<TxnId>,
    ) -> Result<BatchReceipt, Error> {
        let count = i32::try_from(messages.len())
            .ok()
            .filter(|n| (1..=crate::MAX_BATCH_MESSAGES).contains(n))
            .ok_or_else(|| Error::Invalid {
                what: "batch",
                reason: format!(
                    "{} messages is not in 1..={}",
                    messages.len(),
                    crate::MAX_BATCH_MESSAGES
                ),
            })?;
        let receipt = self.write(messages.len() as u64, None, |first| {
            self.batch_frame(messages, count, first, txn)
        })?;
        let partition = self.partition;
        Ok(Box::pin(async move {
            let id = receipt.await?;
            Ok(MessageId {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
                partition,
                batch_index: -1,
                batch_size: Some(count as u32),
            })
        }))
    }

    /// Numbers `count` messages from the next sequence id, has `build` make the frame of
    /// their entry (given the first id) and queues it on the connection, all under the
    /// sequence lock: the frames of one producer reach the wire in sequence-id order, however
    /// many tasks send at once. The ids are used up only when the frame is queued. The entry
    /// holds `slot` until it is resolved.
    fn write(
        self: &Arc<Self>,
        count: u64,
        slot: Option<Slot>,
        build: impl FnOnce(u64) -> Result<OutgoingFrame, Error>,
    ) -> Result<Receipt, Error> {
        let mut sequencer = self.sequencer.lock();
        let first = sequencer.next;
        let frame = build(first)?;
        let receipt = self.submit(&mut sequencer, first, frame, slot)?;
        sequencer.next = first + count;
        Ok(Box::pin(receipt))
    }

    /// The `SEND` frame of a batch entry whose messages are numbered from `first`.
    fn batch_frame(
        &self,
        messages: &[OutgoingMessage],
        count: i32,
        first: u64,
        txn: Option<TxnId>,
    ) -> Result<OutgoingFrame, Error> {
        let plain = encode_messages(messages, first, |size| self.spare.take(size));
        if self.compression == Compression::None && plain.len() > self.max_message_size {
            return Err(Error::Invalid {
                what: "batch",
                reason: format!(
                    "a batch of {count} messages takes {} bytes, above the broker's \
                     max_message_size of {}; lower the batching max_bytes",
                    plain.len(),
                    self.max_message_size
                ),
            });
        }
        let uncompressed_size = u32::try_from(plain.len()).ok();
        let (data, compression, _) = self.compressed(&plain, "batch")?;
        if compression.is_some() {
            // Compressed into a buffer of its own: the plain one is free now.
            self.spare.give_back(plain);
        }
        // The entry's keys, when every message shares them: Key_Shared dispatch reads the
        // entry's ordering_key, else its partition_key (key-based batching makes them shared).
        let partition_key = shared_key(messages, |m| m.extras().key.as_deref().map(str::as_bytes))
            .and_then(|key| String::from_utf8(key).ok());
        let ordering_key = shared_key(messages, |m| m.extras().ordering_key.as_deref());
        let metadata = MessageMetadata {
            num_messages_in_batch: Some(count),
            compression,
            uncompressed_size,
            partition_key,
            ordering_key,
            ..self.metadata(first, txn)
        };
        // Now, while the batch just written is in cache: the writer reads it only to send it.
        let checksum = payload_checksum(&metadata, &data);
        let frame = self.send_frame(first, Some(count), txn, metadata, data, false);
        Ok(OutgoingFrame {
            frame,
            checksum: Some(checksum),
        })
    }

    /// `payload` compressed with the producer's codec, with the metadata's `compression` and
    /// `uncompressed_size` (both unset without a codec); refuses a compressed payload larger
    /// than the broker takes, as the Java client does.
    fn compressed(
        &self,
        payload: &Bytes,
        what: &'static str,
    ) -> Result<(Bytes, Option<i32>, Option<u32>), Error> {
        let (data, compression, uncompressed_size) = self.compressed_unchecked(payload, what)?;
        if compression.is_some() && data.len() > self.max_message_size {
            return Err(Error::Invalid {
                what,
                reason: format!(
                    "{} bytes, {} once compressed with {}, exceed the broker's max_message_size \
                     of {} bytes on {}",
                    payload.len(),
                    data.len(),
                    self.compression,
                    self.max_message_size,
                    self.topic
                ),
            });
        }
        Ok((data, compression, uncompressed_size))
    }

    /// As [`Self::compressed`], whatever the size.
    fn compressed_unchecked(
        &self,
        payload: &Bytes,
        what: &'static str,
    ) -> Result<(Bytes, Option<i32>, Option<u32>), Error> {
        if self.compression == Compression::None {
            return Ok((payload.clone(), None, None));
        }
        let uncompressed_size = u32::try_from(payload.len()).map_err(|_| Error::Invalid {
            what,
            reason: format!(
                "{} bytes cannot be described by the protocol's uncompressed_size (u32)",
                payload.len()
            ),
        })?;
        let data = compress(self.compression, payload)?;
        Ok((
            data,
            Some(self.compression.wire() as i32),
            Some(uncompressed_size),
        ))
    }

    /// The metadata of a message sent on its own (not in a batch).
    fn single_metadata(
        &self,
        message: &OutgoingMessage,
        sequence_id: u64,
        txn: Option<TxnId>,
        compression: Option<i32>,
        uncompressed_size: Option<u32>,
    ) -> MessageMetadata {
        MessageMetadata {
            properties: message.key_values(),
            partition_key: message.extras().key.clone(),
            ordering_key: message.extras().ordering_key.as_ref().map(|k| k.to_vec()),
            event_time: message.event_time_wire(),
            deliver_at_time: message.deliver_at_time().ok().flatten(),
            compression,
            uncompressed_size,
            ..self.metadata(sequence_id, txn)
        }
    }

    fn metadata(&self, sequence_id: u64, txn: Option<TxnId>) -> MessageMetadata {
        MessageMetadata {
            producer_name: self.name.clone(),
            sequence_id,
            publish_time: now_millis(),
            txnid_least_bits: txn.map(|t| t.least_bits),
            txnid_most_bits: txn.map(|t| t.most_bits),
            schema_version: self.schema_version(),
            ..MessageMetadata::default()
        }
    }

    /// The broker's version of the producer's schema, from its last registration.
    pub(crate) fn schema_version(&self) -> Option<Vec<u8>> {
        // No lock for a producer without a schema.
        self.schema.as_ref()?;
        self.schema_version.lock().clone()
    }

    fn send_frame(
        &self,
        sequence_id: u64,
        num_messages: Option<i32>,
        txn: Option<TxnId>,
        metadata: MessageMetadata,
        data: Bytes,
        is_chunk: bool,
    ) -> Frame {
        let command = command_frame(Type::Send, |c| {
            c.send = Some(pb::CommandSend {
                // Set by `transmit` to the registration it goes out on.
                producer_id: 0,
                sequence_id,
                num_messages,
                txnid_least_bits: txn.map(|t| t.least_bits),
                txnid_most_bits: txn.map(|t| t.most_bits),
                highest_sequence_id: None,
                is_chunk: is_chunk.then_some(true),
            });
        })
        .command;
        Frame::with_payload(command, metadata, data)
    }

    /// `CLOSE_PRODUCER` (when registered now); sends still waiting fail with
    /// [`Error::Closed`].
    pub(crate) async fn close(&self) -> Result<(), Error> {
        self.closing.store(true, Ordering::Release);
        let link = self.link.read().clone();
        link.connection.forget_producer(link.producer_id);
        for (_, awaiting) in std::mem::take(&mut self.sequencer.lock().awaiting) {
            awaiting.resolve(Err(Error::Closed("the producer")));
        }
        if !link.up {
            return Ok(());
        }
        close_on(&link).await
    }
}

/// `CLOSE_PRODUCER` for the registration of `link`.
async fn close_on(link: &Link) -> Result<(), Error> {
    let producer_id = link.producer_id;
    let answer = link
        .connection
        .request("CLOSE_PRODUCER", |request_id| {
            command_frame(Type::CloseProducer, |c| {
                c.close_producer = Some(pb::CommandCloseProducer {
                    producer_id,
                    request_id,
                    ..Default::default()
                });
            })
        })
        .await;
    match answer {
        // The broker forgets a connection's producers when it ends: nothing to close.
        Ok(_) | Err(Error::ConnectionLost { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// How an attempt to register again went, when not refused for good.
#[derive(Debug)]
enum Again {
    Linked,
    /// Failed in a way that may succeed later.
    NotYet(Error),
}

/// Registers again (in the background) until registered, refused for good, or the producer
/// is gone or closing.
async fn reconnect(weak: Weak<PartitionProducer>) {
    let Some(first) = weak.upgrade().map(|this| this.retries.lock().after_loss()) else {
        return;
    };
    tokio::time::sleep(first).await;
    let mut attempt = 1u32;
    loop {
        let Some(this) = weak.upgrade() else {
            return;
        };
        if this.closing.load(Ordering::Acquire) {
            return;
        }
        match this.register_again().await {
            Ok(Again::Linked) => {
                this.retries.lock().linked();
                return;
            }
            Ok(Again::NotYet(cause)) => {
                attempt = attempt.saturating_add(1);
                this.state
                    .set(&this.topic, LinkState::Reconnecting { attempt, cause });
            }
            Err(error) => {
                this.fail(error);
                return;
            }
        }
        let delay = this.retries.lock().next_delay();
        drop(this);
        tokio::time::sleep(delay).await;
    }
}

/// Looks `topic` up and registers a producer on its broker (`PRODUCER`); returns the
/// connection, the producer id on it, the broker's answer and the wait for the end of the
/// registration. That wait is set up before `PRODUCER` goes out: a `CLOSE_PRODUCER` that
/// follows `PRODUCER_SUCCESS` at once (an unload meanwhile) is not missed.
async fn register(
    pool: &Pool,
    topic: &str,
    assigned: Option<&str>,
    declaration: Declaration,
) -> Result<(Connection, u64, pb::CommandProducerSuccess, Ending), Error> {
    let connection = pool.connection_for(topic, assigned).await?;
    let producer_id = connection.next_id();
    let ending: Ending = Box::pin(connection.watch_producer(producer_id));
    let answered = registered(&connection, topic, producer_id, declaration).await;
    match answered {
        Ok(success) => Ok((connection, producer_id, success, ending)),
        Err(error) => {
            connection.forget_producer(producer_id);
            Err(error)
        }
    }
}

/// What a `PRODUCER` declares besides the topic and ids.
struct Declaration {
    name: Option<String>,
    user_named: bool,
    epoch: u64,
    txn_enabled: bool,
    schema: Option<pb::Schema>,
}

/// `PRODUCER` for `producer_id` on `connection`, and the broker's success; a refused schema
/// is [`Error::IncompatibleSchema`].
async fn registered(
    connection: &Connection,
    topic: &str,
    producer_id: u64,
    declaration: Declaration,
) -> Result<pb::CommandProducerSuccess, Error> {
    let answer = connection
        .request("PRODUCER", |request_id| {
            command_frame(Type::Producer, |c| {
                c.producer = Some(pb::CommandProducer {
                    topic: topic.to_owned(),
                    producer_id,
                    request_id,
                    user_provided_producer_name: Some(declaration.user_named),
                    producer_name: declaration.name,
                    metadata: Vec::new(),
                    schema: declaration.schema,
                    epoch: Some(declaration.epoch),
                    txn_enabled: Some(declaration.txn_enabled),
                });
            })
        })
        .await
        .map_err(|error| error.schema_refused(topic))?;
    answer.producer_success.ok_or_else(|| {
        Error::malformed(format!(
            "PRODUCER was answered by a frame of type {} instead of PRODUCER_SUCCESS",
            answer.r#type
        ))
    })
}

/// The uncompressed payload of a batch of `messages` numbered from `first`: each message's
/// size, [`SingleMessageMetadata`] and payload, written in one pass into one buffer, asked of
/// `buffer` with the most bytes it takes.
fn encode_messages(
    messages: &[OutgoingMessage],
    first: u64,
    buffer: impl FnOnce(usize) -> BytesMut,
) -> Bytes {
    let size: usize = messages.iter().map(|m| m.encoded_size() + 32).sum();
    let mut out = buffer(size);
    for (message, sequence_id) in messages.iter().zip(first..) {
        if message.has_metadata() {
            let single = single_message_metadata(message, sequence_id);
            out.put_u32(single.encoded_len() as u32);
            // Writing into a growable buffer cannot fail.
            let _ = single.encode(&mut out);
        } else {
            put_bare_metadata(&mut out, payload_size(message), sequence_id);
        }
        out.put_slice(&message.payload);
    }
    out.freeze()
}

/// A message's metadata in its batch.
fn single_message_metadata(message: &OutgoingMessage, sequence_id: u64) -> SingleMessageMetadata {
    SingleMessageMetadata {
        properties: message.key_values(),
        partition_key: message.extras().key.clone(),
        ordering_key: message.extras().ordering_key.as_ref().map(|k| k.to_vec()),
        event_time: message.event_time_wire(),
        sequence_id: Some(sequence_id),
        payload_size: payload_size(message),
        ..SingleMessageMetadata::default()
    }
}

/// The protocol's `payload_size` (an int32) of `message`.
fn payload_size(message: &OutgoingMessage) -> i32 {
    i32::try_from(message.payload.len()).unwrap_or(i32::MAX)
}

/// The size-prefixed `SingleMessageMetadata` of a message with only a payload size and a
/// sequence id, as prost encodes it (fields in number order), without building the struct:
/// put together on the stack and written with one copy (prost's varints, written into the
/// buffer a byte at a time, were 3 % of a producer's CPU at 500,000 messages a second).
fn put_bare_metadata(out: &mut BytesMut, payload_size: i32, sequence_id: u64) {
    // The size (4 bytes), two tags and two varints of at most 10 bytes each.
    let mut head = [0u8; 26];
    let mut at = 4;
    head[at] = 3 << 3; // payload_size = 3, varint
    // An int32 is encoded as its sign-extended 64-bit value.
    at = put_varint(&mut head, at + 1, payload_size as i64 as u64);
    head[at] = 8 << 3; // sequence_id = 8, varint
    at = put_varint(&mut head, at + 1, sequence_id);
    head[..4].copy_from_slice(&((at - 4) as u32).to_be_bytes());
    out.put_slice(&head[..at]);
}

/// Writes `value` as a protobuf varint into `dst` from `at` (room for 10 bytes there);
/// returns where it ends.
fn put_varint(dst: &mut [u8; 26], mut at: usize, mut value: u64) -> usize {
    while value >= 0x80 {
        dst[at] = value as u8 | 0x80;
        value >>= 7;
        at += 1;
    }
    dst[at] = value as u8;
    at + 1
}

/// The key `of` every message, when all have the same one.
fn shared_key<'a>(
    messages: &'a [OutgoingMessage],
    of: impl Fn(&'a OutgoingMessage) -> Option<&'a [u8]>,
) -> Option<Vec<u8>> {
    let first = of(messages.first()?)?;
    messages
        .iter()
        .all(|m| of(m) == Some(first))
        .then(|| first.to_vec())
}

pub(crate) fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What prost writes for a message's metadata: the size, then the metadata.
    fn prost_encoded(message: &OutgoingMessage, sequence_id: u64) -> Vec<u8> {
        let single = single_message_metadata(message, sequence_id);
        let mut out = (single.encoded_len() as u32).to_be_bytes().to_vec();
        out.extend(single.encode_to_vec());
        out.extend_from_slice(&message.payload);
        out
    }

    proptest! {
        /// A batch is the messages as prost encodes them, whichever take the short path.
        #[test]
        fn a_batch_is_what_prost_encodes(
            sizes in prop::collection::vec(0usize..3000, 1..20),
            keyed in prop::collection::vec(any::<bool>(), 20),
            first in prop_oneof![Just(0u64), Just(u64::MAX - 40), any::<u64>().prop_map(|n| n / 2)],
        ) {
            let messages: Vec<OutgoingMessage> = sizes
                .iter()
                .zip(&keyed)
                .map(|(&size, &keyed)| {
                    let message = OutgoingMessage::new(vec![7u8; size]);
                    if keyed { message.key("k").property("a", "b") } else { message }
                })
                .collect();
            let batch = encode_messages(&messages, first, BytesMut::with_capacity);
            let expected: Vec<u8> = messages
                .iter()
                .zip(first..)
                .flat_map(|(m, id)| prost_encoded(m, id))
                .collect();
            prop_assert_eq!(&batch[..], &expected[..]);
        }
    }
}
