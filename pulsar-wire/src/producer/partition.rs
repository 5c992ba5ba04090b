//! One producer on one topic or partition: `PRODUCER`, the `SEND` frames, `CLOSE_PRODUCER`.

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use txn_ack::TxnId;

use super::{MessageId, OutgoingMessage};
use crate::batch::{BatchedMessage, encode_batch};
use crate::pb::base_command::Type;
use crate::pb::{self, MessageMetadata, SingleMessageMetadata};
use crate::{Client, Compression, Connection, Error, Frame, command_frame, compress};

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

/// A producer attached to one topic (or one partition of a partitioned topic).
#[derive(Debug)]
pub(crate) struct PartitionProducer {
    pub(crate) topic: String,
    /// The partition index, -1 for a topic that is not partitioned.
    pub(crate) partition: i32,
    pub(crate) connection: Connection,
    pub(crate) producer_id: u64,
    pub(crate) name: String,
    /// The next sequence id. Held while an entry is numbered and its frame queued, so that
    /// frames reach the connection in sequence-id order whoever sends them.
    sequence: Mutex<u64>,
    pub(crate) max_message_size: usize,
    /// The codec of every entry it sends.
    compression: Compression,
    /// With chunking, the most bytes of one chunk's entry (its payload and metadata).
    chunk_size: Option<usize>,
    /// With chunking, keeps a chunked message's chunks together on the wire (and sequence
    /// ids in order): held while a message's chunks go out, and by every other send while it
    /// writes its frame.
    send_order: tokio::sync::Mutex<()>,
}

impl PartitionProducer {
    /// Looks the topic up and registers a producer on its broker.
    pub(crate) async fn create(
        client: &Client,
        topic: String,
        partition: i32,
        name: Option<String>,
        txn_enabled: bool,
        compression: Compression,
        chunk_size: Option<usize>,
    ) -> Result<Self, Error> {
        let connection = client.lookup(&topic).await?;
        let producer_id = connection.next_id();
        let answer = connection
            .request("PRODUCER", |request_id| {
                command_frame(Type::Producer, |c| {
                    c.producer = Some(pb::CommandProducer {
                        topic: topic.clone(),
                        producer_id,
                        request_id,
                        user_provided_producer_name: Some(name.is_some()),
                        producer_name: name,
                        metadata: Vec::new(),
                        epoch: Some(0),
                        txn_enabled: Some(txn_enabled),
                    });
                })
            })
            .await?;
        let success = answer.producer_success.ok_or_else(|| {
            Error::malformed(format!(
                "PRODUCER was answered by a frame of type {} instead of PRODUCER_SUCCESS",
                answer.r#type
            ))
        })?;
        let max_message_size = connection
            .max_message_size()
            .and_then(|size| usize::try_from(size).ok())
            .filter(|size| *size > 0)
            .unwrap_or(crate::DEFAULT_MAX_MESSAGE_SIZE);
        let next_sequence =
            u64::try_from(success.last_sequence_id().saturating_add(1)).unwrap_or(0);
        Ok(Self {
            topic,
            partition,
            connection,
            producer_id,
            name: success.producer_name,
            sequence: Mutex::new(next_sequence),
            max_message_size,
            compression,
            chunk_size: chunk_size.map(|size| size.clamp(1, max_message_size)),
            send_order: tokio::sync::Mutex::new(()),
        })
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
    /// in chunks when it is too large for one entry.
    pub(crate) async fn send_single(
        &self,
        message: &OutgoingMessage,
        txn: Option<TxnId>,
    ) -> Result<MessageId, Error> {
        if let Some(chunk_size) = self.chunk_size {
            return self.send_chunked(message, txn, chunk_size).await;
        }
        let (data, compression, uncompressed_size) =
            self.compressed(&message.payload, "message")?;
        let sent = self.write(1, |sequence_id| {
            let metadata =
                self.single_metadata(message, sequence_id, txn, compression, uncompressed_size);
            Ok(self.send_frame(sequence_id, None, txn, metadata, data, false))
        })?;
        Ok(self.id_of(sent.await?))
    }

    /// Sends a message of a chunking producer: as one entry when it fits in `chunk_size`,
    /// otherwise as consecutive chunk entries sharing its sequence id (`uuid`
    /// `<producer>-<sequence id>`, `chunk_id`, `num_chunks_from_msg`,
    /// `total_chunk_msg_size`, and the message's metadata on each, as the Java client
    /// sends them); returns the last chunk's id. The whole payload is compressed first.
    async fn send_chunked(
        &self,
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
            let mut next = self.sequence.lock();
            let id = *next;
            *next += 1;
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
            let receipt = self
                .connection
                .start_send(self.producer_id, sequence_id, frame)?;
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
            let receipt = self
                .connection
                .start_send(self.producer_id, sequence_id, frame)?;
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

    /// Sends messages as one batch entry (`num_messages_in_batch` set, even for one message);
    /// returns each message's id.
    pub(crate) async fn send_batch(
        &self,
        messages: &[&OutgoingMessage],
        txn: Option<TxnId>,
    ) -> Result<Vec<MessageId>, Error> {
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
        let id = self
            .write(messages.len() as u64, |first| {
                self.batch_frame(messages, count, first, txn)
            })?
            .await?;
        Ok((0..count)
            .map(|index| MessageId {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
                partition: self.partition,
                batch_index: index,
                batch_size: Some(count as u32),
            })
            .collect())
    }

    /// Numbers `count` messages from the next sequence id, has `build` make the frame of
    /// their entry (given the first id) and queues it on the connection, all under the
    /// sequence lock: the frames of one producer reach the wire in sequence-id order, however
    /// many tasks send at once. The ids are used up only when the frame is queued.
    fn write(
        &self,
        count: u64,
        build: impl FnOnce(u64) -> Result<Frame, Error>,
    ) -> Result<impl Future<Output = Result<pb::MessageIdData, Error>> + Send + '_, Error> {
        let mut next = self.sequence.lock();
        let first = *next;
        let frame = build(first)?;
        let receipt = self.connection.start_send(self.producer_id, first, frame)?;
        *next = first + count;
        Ok(receipt)
    }

    /// The `SEND` frame of a batch entry whose messages are numbered from `first`.
    fn batch_frame(
        &self,
        messages: &[&OutgoingMessage],
        count: i32,
        first: u64,
        txn: Option<TxnId>,
    ) -> Result<Frame, Error> {
        let singles: Vec<BatchedMessage> = messages
            .iter()
            .zip(first..)
            .map(|(message, sequence_id)| BatchedMessage {
                metadata: SingleMessageMetadata {
                    properties: message.key_values(),
                    partition_key: message.key.clone(),
                    ordering_key: message.ordering_key.as_ref().map(|k| k.to_vec()),
                    event_time: message.event_time,
                    sequence_id: Some(sequence_id),
                    ..SingleMessageMetadata::default()
                },
                payload: message.payload.clone(),
            })
            .collect();
        let plain = encode_batch(&singles);
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
        // The entry's keys, when every message shares them: Key_Shared dispatch reads the
        // entry's ordering_key, else its partition_key (key-based batching makes them shared).
        let partition_key = shared_key(messages, |m| m.key.as_deref().map(str::as_bytes))
            .and_then(|key| String::from_utf8(key).ok());
        let ordering_key = shared_key(messages, |m| m.ordering_key.as_deref());
        let metadata = MessageMetadata {
            num_messages_in_batch: Some(count),
            compression,
            uncompressed_size,
            partition_key,
            ordering_key,
            ..self.metadata(first, txn)
        };
        Ok(self.send_frame(first, Some(count), txn, metadata, data, false))
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
            partition_key: message.key.clone(),
            ordering_key: message.ordering_key.as_ref().map(|k| k.to_vec()),
            event_time: message.event_time,
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
            ..MessageMetadata::default()
        }
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
                producer_id: self.producer_id,
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

    /// `CLOSE_PRODUCER`.
    pub(crate) async fn close(&self) -> Result<(), Error> {
        let producer_id = self.producer_id;
        self.connection
            .request("CLOSE_PRODUCER", |request_id| {
                command_frame(Type::CloseProducer, |c| {
                    c.close_producer = Some(pb::CommandCloseProducer {
                        producer_id,
                        request_id,
                    });
                })
            })
            .await
            .map(drop)
    }
}

/// The key `of` every message, when all have the same one.
fn shared_key<'a>(
    messages: &[&'a OutgoingMessage],
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
