//! Received messages, and decoding a `MESSAGE` frame into them.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use txn_ack::{EntryId, MessagePosition};

use super::chunks::{Assembled, Chunk, is_chunk};
use crate::batch::split_batch;
use crate::compression::decompress_payload;
use crate::pb::KeyValue;
use crate::pb::command_ack::ValidationError;
use crate::{Frame, MessageId};

/// A message delivered to a consumer.
#[derive(Debug, Clone)]
pub struct Message {
    payload: Bytes,
    key: Option<String>,
    ordering_key: Option<Bytes>,
    properties: Vec<(String, String)>,
    position: MessagePosition,
    redelivery_count: u32,
    publish_time: u64,
    event_time: Option<u64>,
    deliver_at: Option<u64>,
    producer_name: Arc<str>,
    sequence_id: Option<u64>,
    topic: Arc<str>,
    schema_version: Option<Bytes>,
    /// A chunked message's other entries (its earlier chunks), acknowledged with it.
    pub(crate) chunks: Arc<[MessagePosition]>,
    /// Which consumer delivered it, and which of its partitions.
    pub(crate) origin: Origin,
    /// Handed over again by the consumer itself (its flow permit came back the first time).
    pub(crate) handed_again: bool,
    /// The registration (link generation) of its partition consumer that delivered it.
    pub(crate) link: u64,
}

/// The consumer and partition slot a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) consumer: u64,
    pub(crate) slot: usize,
}

impl Message {
    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The key (`partition_key`), if the producer set one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The ordering key (`ordering_key`), if the producer set one: on a Key_Shared
    /// subscription it, not [`Message::key`], decides the consumer.
    pub fn ordering_key(&self) -> Option<&Bytes> {
        self.ordering_key.as_ref()
    }

    /// The properties.
    pub fn properties(&self) -> &[(String, String)] {
        &self.properties
    }

    /// A property's value.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Where the message sits: entry, partition, index and size of its batch, and whether the
    /// entry is a batch at all (`num_messages_in_batch` present).
    pub fn position(&self) -> &MessagePosition {
        &self.position
    }

    /// The message's id (a chunked message's is its last chunk's).
    pub fn id(&self) -> MessageId {
        id_of(&self.position)
    }

    /// A chunked message's entries, its earlier chunks first and then the last, whose id
    /// is the message's ([`Message::id`]); empty for a message that was not chunked.
    /// Acknowledging the message acknowledges them all.
    pub fn chunk_ids(&self) -> Vec<MessageId> {
        if self.chunks.is_empty() {
            return Vec::new();
        }
        self.chunks
            .iter()
            .map(id_of)
            .chain(std::iter::once(self.id()))
            .collect()
    }

    /// How often it was delivered before: by the broker, or by the consumer itself when it
    /// hands a message over again (after an abort or a negative ack of a message whose batch
    /// the application still holds part of).
    pub fn redelivery_count(&self) -> u32 {
        self.redelivery_count
    }

    /// The same message, delivered once more.
    pub(crate) fn delivered_again(mut self) -> Self {
        self.redelivery_count = self.redelivery_count.saturating_add(1);
        self.handed_again = true;
        self
    }

    /// When the producer published it (the metadata's `publish_time`, to the millisecond; the
    /// producer's clock, as in every Pulsar client).
    ///
    /// Never panics on what the network sends: a 0 reads as
    /// [`UNIX_EPOCH`](std::time::UNIX_EPOCH), and a value past the latest time this platform's
    /// [`SystemTime`] holds (none on Linux and macOS) as that latest time.
    pub fn publish_time(&self) -> SystemTime {
        crate::time::from_millis(self.publish_time)
    }

    /// The event time the producer set
    /// ([`OutgoingMessage::event_time`](crate::OutgoingMessage::event_time), to the
    /// millisecond); `None` when it set none. The protocol reads 0 as none; a value past the
    /// latest time [`SystemTime`] holds reads as that latest time, as in
    /// [`Message::publish_time`].
    pub fn event_time(&self) -> Option<SystemTime> {
        self.event_time_millis().map(crate::time::from_millis)
    }

    /// The event time as received, in milliseconds since the epoch (0 is none).
    pub(crate) fn event_time_millis(&self) -> Option<u64> {
        self.event_time.filter(|t| *t > 0)
    }

    /// When the producer asked for it to be delivered
    /// ([`OutgoingMessage::deliver_at`](crate::OutgoingMessage::deliver_at), to the
    /// millisecond); `None` for a message sent without a delay (or with a negative
    /// `deliver_at_time`). A value past the latest time [`SystemTime`] holds reads as that
    /// latest time, as in [`Message::publish_time`].
    pub fn deliver_at(&self) -> Option<SystemTime> {
        self.deliver_at.map(crate::time::from_millis)
    }

    /// The producer's name.
    pub fn producer_name(&self) -> &str {
        &self.producer_name
    }

    /// The producer's sequence id of the message, when known.
    pub fn sequence_id(&self) -> Option<u64> {
        self.sequence_id
    }

    /// The full name of the topic (the partition's, on a partitioned topic) it came from.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The version of the schema its producer registered (`schema_version` of its metadata;
    /// 8 bytes, a big-endian counter from 0, on a 4.0 broker), or `None` for a producer
    /// without a schema.
    pub fn schema_version(&self) -> Option<&Bytes> {
        self.schema_version.as_ref()
    }
}

/// The id of a message at `position`.
pub(crate) fn id_of(position: &MessagePosition) -> MessageId {
    MessageId {
        ledger_id: position.ledger_id(),
        entry_id: position.entry_id(),
        partition: position.partition(),
        batch_index: position.batch_index(),
        batch_size: position.is_batched().then_some(position.batch_size()),
    }
}

/// What one `MESSAGE` frame holds for the application.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    /// The messages to deliver.
    pub(crate) messages: Vec<Message>,
    /// Messages of the entry that were acknowledged before (cleared in the frame's
    /// `ack_set`) or compacted out: not delivered.
    pub(crate) skipped: Vec<MessagePosition>,
    /// The entry cannot be decoded: what was wrong (handed to the application as
    /// [`crate::Error::Undecodable`], never acknowledged here).
    pub(crate) invalid: Option<(ValidationError, String)>,
    /// How often the broker delivered the entry before (`redelivery_count`).
    pub(crate) redelivery_count: u32,
    /// An undecodable entry's payload as stored, with its key and properties (for the
    /// dead-letter topic).
    pub(crate) raw: Option<RawEntry>,
    /// The entry, when the frame names one.
    pub(crate) entry: Option<(EntryId, i32)>,
    /// The flow permits the entry took.
    pub(crate) permits: u32,
    /// The entry is one chunk of a larger message (nothing else is set but `entry`).
    pub(crate) chunk: Option<Chunk>,
}

/// An entry's payload as the broker sent it, with the key and properties of its metadata.
#[derive(Debug, Clone)]
pub(crate) struct RawEntry {
    pub(crate) payload: Bytes,
    pub(crate) key: Option<String>,
    pub(crate) properties: Vec<(String, String)>,
}

impl RawEntry {
    fn of(metadata: &crate::pb::MessageMetadata, payload: Bytes) -> Self {
        Self {
            payload,
            key: metadata.partition_key.clone(),
            properties: properties(metadata.properties.clone()),
        }
    }
}

/// Whether bit `index` is set in a wire ack set; bits past the last word are clear (Java).
fn bit_is_set(words: &[i64], index: u32) -> bool {
    words
        .get((index / 64) as usize)
        .is_some_and(|word| (*word as u64 >> (index % 64)) & 1 == 1)
}

fn properties(values: Vec<KeyValue>) -> Vec<(String, String)> {
    values.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

/// Splits a `MESSAGE` frame into the messages to deliver, decompressing its payload first
/// (into at most `max_uncompressed` bytes). Never panics: a frame that cannot be delivered
/// comes back with [`Decoded::invalid`] set.
pub(crate) fn decode(
    frame: Frame,
    partition: i32,
    origin: Origin,
    topic: &Arc<str>,
    max_uncompressed: usize,
) -> Decoded {
    let mut decoded = Decoded {
        permits: 1,
        ..Decoded::default()
    };
    let Some(command) = frame.command.message else {
        decoded.invalid = Some((
            ValidationError::BatchDeSerializeError,
            "a MESSAGE frame without its command".into(),
        ));
        return decoded;
    };
    let entry = EntryId {
        ledger_id: command.message_id.ledger_id,
        entry_id: command.message_id.entry_id,
    };
    decoded.entry = Some((entry, partition));
    decoded.redelivery_count = command.redelivery_count.unwrap_or(0);
    let Some(payload) = frame.payload else {
        decoded.invalid = Some((
            ValidationError::BatchDeSerializeError,
            format!("entry {entry}: a MESSAGE frame without payload"),
        ));
        return decoded;
    };
    let metadata = payload.metadata;
    let batch = metadata.num_messages_in_batch;
    decoded.permits = batch
        .map_or(1, |n| n.clamp(1, crate::MAX_BATCH_MESSAGES))
        .unsigned_abs();
    let stored = payload.data.clone();
    if !payload.checksum_ok {
        decoded.raw = Some(RawEntry::of(&metadata, stored));
        decoded.invalid = Some((
            ValidationError::ChecksumMismatch,
            format!("entry {entry}: the CRC32C checksum does not match"),
        ));
        return decoded;
    }
    if is_chunk(&metadata) {
        decoded.chunk = Some(Chunk {
            position: MessagePosition::single(entry.ledger_id, entry.entry_id, partition),
            metadata,
            data: payload.data,
            redelivery_count: decoded.redelivery_count,
        });
        return decoded;
    }
    // The whole payload (a batch's too) is compressed as one unit.
    let data = match decompress_payload(&metadata, payload.data, max_uncompressed) {
        Ok(data) => data,
        Err(error) => {
            decoded.raw = Some(RawEntry::of(&metadata, stored));
            decoded.invalid = Some((
                ValidationError::DecompressionError,
                format!("entry {entry}: {error}"),
            ));
            return decoded;
        }
    };
    let producer_name: Arc<str> = metadata.producer_name.as_str().into();
    let schema_version = metadata.schema_version.clone().map(Bytes::from);
    let common = |position, payload, (key, ordering_key), props, event_time, sequence_id| Message {
        payload,
        key,
        ordering_key,
        properties: props,
        position,
        redelivery_count: command.redelivery_count.unwrap_or(0),
        publish_time: metadata.publish_time,
        event_time,
        deliver_at: metadata
            .deliver_at_time
            .and_then(|at| u64::try_from(at).ok()),
        producer_name: Arc::clone(&producer_name),
        sequence_id,
        topic: Arc::clone(topic),
        schema_version: schema_version.clone(),
        chunks: Arc::new([]),
        origin,
        handed_again: false,
        link: 0,
    };
    let Some(size) = batch else {
        let position = MessagePosition::single(entry.ledger_id, entry.entry_id, partition);
        decoded.messages.push(common(
            position,
            data,
            (
                metadata.partition_key.clone(),
                metadata.ordering_key.clone().map(Bytes::from),
            ),
            properties(metadata.properties.clone()),
            metadata.event_time,
            Some(metadata.sequence_id),
        ));
        return decoded;
    };
    let singles = match split_batch(&metadata, data) {
        Ok(singles) => singles,
        Err(error) => {
            decoded.raw = Some(RawEntry::of(&metadata, stored));
            decoded.invalid = Some((
                ValidationError::BatchDeSerializeError,
                format!("entry {entry}: {error}"),
            ));
            return decoded;
        }
    };
    for (index, single) in (0..size).zip(singles) {
        let position = match MessagePosition::received(entry, partition, Some(size), index) {
            Ok(position) => position,
            Err(error) => {
                decoded.messages.clear();
                decoded.skipped.clear();
                decoded.raw = Some(RawEntry::of(&metadata, stored));
                decoded.invalid = Some((
                    ValidationError::BatchDeSerializeError,
                    format!("entry {entry}: {error}"),
                ));
                return decoded;
            }
        };
        let acked_before =
            !command.ack_set.is_empty() && !bit_is_set(&command.ack_set, index as u32);
        if acked_before || single.metadata.compacted_out() {
            decoded.skipped.push(position);
            continue;
        }
        let metadata = single.metadata;
        decoded.messages.push(common(
            position,
            single.payload,
            (
                metadata.partition_key,
                metadata.ordering_key.map(Bytes::from),
            ),
            properties(metadata.properties),
            metadata.event_time,
            metadata.sequence_id,
        ));
    }
    decoded
}

/// The message of a reassembled chunked message: its whole payload decompressed (into at
/// most `max_uncompressed` bytes). On error, what was wrong.
pub(crate) fn assembled(
    assembled: Assembled,
    origin: Origin,
    topic: &Arc<str>,
    max_uncompressed: usize,
) -> Result<Message, String> {
    let metadata = assembled.metadata;
    let payload =
        decompress_payload(&metadata, assembled.data, max_uncompressed).map_err(|error| {
            format!(
                "chunked message ending at entry {}: {error}",
                assembled.last.entry()
            )
        })?;
    Ok(Message {
        payload,
        key: metadata.partition_key.clone(),
        ordering_key: metadata.ordering_key.map(Bytes::from),
        properties: properties(metadata.properties),
        position: assembled.last,
        redelivery_count: assembled.redelivery_count,
        publish_time: metadata.publish_time,
        event_time: metadata.event_time,
        deliver_at: metadata
            .deliver_at_time
            .and_then(|at| u64::try_from(at).ok()),
        producer_name: metadata.producer_name.as_str().into(),
        sequence_id: Some(metadata.sequence_id),
        topic: Arc::clone(topic),
        schema_version: metadata.schema_version.map(Bytes::from),
        chunks: assembled.others.into(),
        origin,
        handed_again: false,
        link: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::base_command::Type;
    use crate::pb::{self, MessageMetadata, SingleMessageMetadata};
    use crate::{BatchedMessage, Compression, command_frame, encode_batch};

    const ORIGIN: Origin = Origin {
        consumer: 1,
        slot: 0,
    };

    const MAX: usize = crate::DEFAULT_MAX_MESSAGE_SIZE;

    fn frame(num: Option<i32>, ack_set: Vec<i64>, data: Bytes) -> Frame {
        let command = command_frame(Type::Message, |c| {
            c.message = Some(pb::CommandMessage {
                consumer_id: 1,
                message_id: pb::MessageIdData {
                    ledger_id: 7,
                    entry_id: 9,
                    ..pb::MessageIdData::default()
                },
                ack_set,
                ..pb::CommandMessage::default()
            });
        })
        .command;
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            num_messages_in_batch: num,
            ..MessageMetadata::default()
        };
        Frame::with_payload(command, metadata, data)
    }

    fn batch(n: usize) -> Bytes {
        let messages: Vec<_> = (0..n)
            .map(|i| BatchedMessage {
                metadata: SingleMessageMetadata {
                    partition_key: Some(format!("k{i}")),
                    ..SingleMessageMetadata::default()
                },
                payload: Bytes::from(format!("m{i}")),
            })
            .collect();
        encode_batch(&messages)
    }

    fn topic() -> Arc<str> {
        "persistent://public/default/t".into()
    }

    /// A plain entry whose metadata carries these times, decoded.
    fn with_times(publish: u64, event: Option<u64>, deliver_at: Option<i64>) -> Message {
        let mut frame = frame(None, vec![], Bytes::from("x"));
        let metadata = &mut frame.payload.as_mut().expect("a payload").metadata;
        metadata.publish_time = publish;
        metadata.event_time = event;
        metadata.deliver_at_time = deliver_at;
        decode(frame, -1, ORIGIN, &topic(), MAX).messages.remove(0)
    }

    #[test]
    fn times_from_the_wire_are_system_times_and_never_panic() {
        use std::time::{Duration, UNIX_EPOCH};
        let millis = 1_733_500_000_123;
        let m = with_times(millis, Some(millis + 1), Some(millis as i64 + 2));
        let at = |millis| UNIX_EPOCH + Duration::from_millis(millis);
        assert_eq!(m.publish_time(), at(millis));
        assert_eq!(m.event_time(), Some(at(millis + 1)));
        assert_eq!(m.deliver_at(), Some(at(millis + 2)));
        // 0: the epoch for the publish time, none for the event time (the protocol's unset).
        let zero = with_times(0, Some(0), Some(0));
        assert_eq!(zero.publish_time(), UNIX_EPOCH);
        assert_eq!(zero.event_time(), None);
        assert_eq!(zero.deliver_at(), Some(UNIX_EPOCH));
        assert_eq!(with_times(0, None, None).event_time(), None);
        // The largest values: exact where SystemTime holds them, clamped where not.
        let max = with_times(u64::MAX, Some(u64::MAX), Some(i64::MAX));
        assert_eq!(max.publish_time(), crate::time::from_millis(u64::MAX));
        assert_eq!(max.event_time(), Some(crate::time::from_millis(u64::MAX)));
        assert!(max.publish_time() > at(millis));
        assert!(max.deliver_at() > Some(at(millis)));
        // A negative deliver_at_time is none.
        assert_eq!(with_times(1, None, Some(-1)).deliver_at(), None);
    }

    #[test]
    fn batches_get_positions_and_skip_cleared_indexes() {
        let decoded = decode(frame(Some(3), vec![], batch(3)), -1, ORIGIN, &topic(), MAX);
        assert_eq!(decoded.messages.len(), 3);
        assert_eq!(decoded.permits, 3);
        for (i, m) in decoded.messages.iter().enumerate() {
            assert!(m.position().is_batched());
            assert_eq!(m.position().batch_index(), i as i32);
            assert_eq!(m.position().batch_size(), 3);
            assert_eq!(m.key(), Some(format!("k{i}").as_str()));
            assert_eq!(m.id().batch_size, Some(3));
        }
        // Index 1 was acknowledged before: bit 1 cleared ({0, 2} = 0b101).
        let redelivered = decode(
            frame(Some(3), vec![0b101], batch(3)),
            -1,
            ORIGIN,
            &topic(),
            MAX,
        );
        let indexes: Vec<_> = redelivered
            .messages
            .iter()
            .map(|m| m.position().batch_index())
            .collect();
        assert_eq!(indexes, [0, 2]);
        assert_eq!(redelivered.skipped.len(), 1);
        assert_eq!(redelivered.skipped[0].batch_index(), 1);
    }

    #[test]
    fn a_batch_of_one_is_a_batch_and_a_plain_entry_is_not() {
        let one = decode(frame(Some(1), vec![], batch(1)), 2, ORIGIN, &topic(), MAX);
        assert!(one.messages[0].position().is_batched());
        assert_eq!(one.messages[0].position().partition(), 2);
        let plain = decode(
            frame(None, vec![], Bytes::from("x")),
            -1,
            ORIGIN,
            &topic(),
            MAX,
        );
        assert_eq!(plain.messages.len(), 1);
        assert!(!plain.messages[0].position().is_batched());
        assert_eq!(plain.messages[0].id().batch_size, None);
        assert_eq!(plain.messages[0].payload(), &Bytes::from("x"));
    }

    #[test]
    fn bad_entries_are_reported_not_delivered() {
        let mut corrupt = frame(Some(3), vec![], batch(3));
        if let Some(payload) = corrupt.payload.as_mut() {
            payload.checksum_ok = false;
        }
        let decoded = decode(corrupt, -1, ORIGIN, &topic(), MAX);
        assert!(decoded.messages.is_empty());
        assert_eq!(
            decoded.invalid.map(|(e, _)| e),
            Some(ValidationError::ChecksumMismatch)
        );
        assert_eq!(decoded.permits, 3);
        let truncated = decode(
            frame(Some(3), vec![], Bytes::from_static(&[0, 0, 0, 9])),
            -1,
            ORIGIN,
            &topic(),
            MAX,
        );
        assert_eq!(
            truncated.invalid.map(|(e, _)| e),
            Some(ValidationError::BatchDeSerializeError)
        );
        let mut no_payload = frame(None, vec![], Bytes::new());
        no_payload.payload = None;
        assert!(
            decode(no_payload, -1, ORIGIN, &topic(), MAX)
                .invalid
                .is_some()
        );
    }

    /// `frame` with its payload compressed by `codec` (and the metadata saying so).
    fn compressed(mut frame: Frame, codec: Compression) -> Frame {
        if let Some(payload) = frame.payload.as_mut() {
            payload.metadata.uncompressed_size = Some(payload.data.len() as u32);
            payload.metadata.compression = Some(codec.wire() as i32);
            payload.data = crate::compress(codec, &payload.data).unwrap();
        }
        frame
    }

    #[test]
    fn compressed_entries_are_decompressed_before_they_are_split() {
        for codec in Compression::ALL[1..].iter().filter(|c| c.is_available()) {
            let decoded = decode(
                compressed(frame(Some(3), vec![], batch(3)), *codec),
                -1,
                ORIGIN,
                &topic(),
                MAX,
            );
            assert!(decoded.invalid.is_none(), "{codec}: {:?}", decoded.invalid);
            let payloads: Vec<_> = decoded
                .messages
                .iter()
                .map(|m| m.payload().clone())
                .collect();
            assert_eq!(payloads, ["m0", "m1", "m2"], "{codec}");
            assert_eq!(decoded.messages[1].key(), Some("k1"));
            let single = decode(
                compressed(frame(None, vec![], Bytes::from("plain text")), *codec),
                -1,
                ORIGIN,
                &topic(),
                MAX,
            );
            assert_eq!(single.messages.len(), 1, "{codec}: {:?}", single.invalid);
            assert_eq!(single.messages[0].payload(), &Bytes::from("plain text"));
        }
    }

    #[test]
    fn undecompressable_entries_name_the_codec_and_the_reason() {
        for codec in Compression::ALL[1..].iter().filter(|c| c.is_available()) {
            // Corrupt: the compressed bytes cut in half.
            let mut cut = compressed(frame(Some(3), vec![], batch(3)), *codec);
            if let Some(payload) = cut.payload.as_mut() {
                payload.data = payload.data.slice(..payload.data.len() / 2);
            }
            let decoded = decode(cut, -1, ORIGIN, &topic(), MAX);
            assert!(decoded.messages.is_empty());
            assert_eq!(decoded.permits, 3);
            let (error, reason) = decoded.invalid.expect("invalid");
            assert_eq!(error, ValidationError::DecompressionError);
            assert!(reason.starts_with("entry 7:9: "), "{reason}");
            assert!(reason.contains(codec.name()), "{reason}");
            // Declared above the limit.
            let big = compressed(frame(None, vec![], Bytes::from(vec![7; 1000])), *codec);
            let (_, reason) = decode(big, -1, ORIGIN, &topic(), 999)
                .invalid
                .expect("invalid");
            assert!(
                reason.contains("1000") && reason.contains("999"),
                "{reason}"
            );
            assert!(reason.contains(codec.name()), "{reason}");
        }
        // An unknown codec.
        let mut unknown = frame(None, vec![], Bytes::from("x"));
        if let Some(payload) = unknown.payload.as_mut() {
            payload.metadata.compression = Some(42);
        }
        let (_, reason) = decode(unknown, -1, ORIGIN, &topic(), MAX)
            .invalid
            .expect("invalid");
        assert!(reason.contains("code 42"), "{reason}");
    }
}
