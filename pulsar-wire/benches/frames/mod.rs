//! The frames the codec benchmarks encode and decode. `benches/codec.rs` and the comparison
//! with the `pulsar` crate (`pulsar-wire/codec-compare`, which includes this file) use the
//! same ones.

use bytes::{Bytes, BytesMut};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_ack::AckType;
use pulsar_wire::pb::{
    BaseCommand, CommandAck, CommandMessage, KeyValue, MessageIdData, MessageMetadata,
    SingleMessageMetadata,
};
use pulsar_wire::wire::{BatchedMessage, Frame, encode_batch, encode_frame};

/// Messages in the batch of the `MESSAGE` frame.
pub(crate) const BATCH_MESSAGES: usize = 100;
/// Payload bytes of each of them.
pub(crate) const PAYLOAD_BYTES: usize = 100;
/// Message ids in the `ACK` frame.
pub(crate) const ACK_IDS: usize = 1_000;

/// 100 messages of 100 bytes, each with two properties, a partition key, an event time and a
/// sequence id.
pub(crate) fn batch_messages() -> Vec<BatchedMessage> {
    (0..BATCH_MESSAGES)
        .map(|i| BatchedMessage {
            metadata: SingleMessageMetadata {
                properties: vec![
                    KeyValue {
                        key: "trace-id".into(),
                        value: format!("{:016x}", 0x5eed_0000_u64 + i as u64),
                    },
                    KeyValue {
                        key: "origin".into(),
                        value: "bench".into(),
                    },
                ],
                partition_key: Some(format!("key-{}", i % 16)),
                payload_size: PAYLOAD_BYTES as i32,
                event_time: Some(1_764_000_000_000 + i as u64),
                sequence_id: Some(1_000 + i as u64),
                ..SingleMessageMetadata::default()
            },
            payload: Bytes::from(
                (0..PAYLOAD_BYTES)
                    .map(|j| (i * 31 + j) as u8)
                    .collect::<Vec<_>>(),
            ),
        })
        .collect()
}

/// The metadata of the entry holding that batch.
pub(crate) fn batch_metadata() -> MessageMetadata {
    MessageMetadata {
        producer_name: "standalone-0-42".into(),
        sequence_id: 1_000,
        publish_time: 1_764_000_000_123,
        properties: vec![KeyValue {
            key: "app".into(),
            value: "bench".into(),
        }],
        num_messages_in_batch: Some(BATCH_MESSAGES as i32),
        uncompressed_size: None,
        highest_sequence_id: Some(1_000 + BATCH_MESSAGES as u64 - 1),
        ..MessageMetadata::default()
    }
}

/// The `MESSAGE` command delivering that entry.
pub(crate) fn message_command() -> BaseCommand {
    BaseCommand {
        r#type: Type::Message as i32,
        message: Some(CommandMessage {
            consumer_id: 7,
            message_id: MessageIdData {
                ledger_id: 123_456,
                entry_id: 789,
                partition: Some(3),
                ..MessageIdData::default()
            },
            redelivery_count: Some(0),
            ..CommandMessage::default()
        }),
        ..BaseCommand::default()
    }
}

/// A `MESSAGE` frame carrying a batch of [`BATCH_MESSAGES`] messages of [`PAYLOAD_BYTES`]
/// bytes.
pub(crate) fn message_frame() -> Frame {
    Frame::with_payload(
        message_command(),
        batch_metadata(),
        encode_batch(&batch_messages()),
    )
}

/// An `ACK` frame with [`ACK_IDS`] ids over 10 ledgers; every 4th id is a batch-index ack
/// (ack set of 2 words, batch size 100), the others whole entries.
pub(crate) fn ack_frame() -> Frame {
    let message_id = (0..ACK_IDS)
        .map(|i| {
            let partial = i % 4 == 0;
            MessageIdData {
                ledger_id: 1_000_000 + (i / 100) as u64,
                entry_id: (i % 100) as u64 * 7,
                partition: Some(3),
                batch_index: None,
                ack_set: if partial {
                    vec![!(1_i64 << (i % 64)), (1_i64 << 36) - 1]
                } else {
                    Vec::new()
                },
                batch_size: partial.then_some(100),
            }
        })
        .collect();
    Frame::command(BaseCommand {
        r#type: Type::Ack as i32,
        ack: Some(CommandAck {
            consumer_id: 7,
            ack_type: AckType::Individual as i32,
            message_id,
            ..CommandAck::default()
        }),
        ..BaseCommand::default()
    })
}

/// The wire bytes of `frame` (length prefix included).
pub(crate) fn wire_bytes(frame: &Frame) -> Bytes {
    let mut buf = BytesMut::new();
    encode_frame(frame, &mut buf);
    buf.freeze()
}
