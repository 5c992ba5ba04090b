//! Batches: several messages in one entry's payload.
//!
//! Layout (uncompressed): for each message, `[u32 size][SingleMessageMetadata][payload]`, with
//! `payload_size` in the metadata.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::Error;
use crate::pb::{CompressionType, MessageMetadata, SingleMessageMetadata};

/// One message of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedMessage {
    /// Its metadata (properties, key, payload size).
    pub metadata: SingleMessageMetadata,
    /// Its payload.
    pub payload: Bytes,
}

/// The largest number of messages a batch may declare (as `txn-ack` accepts).
pub const MAX_BATCH_MESSAGES: i32 = txn_ack::MAX_BATCH_SIZE as i32;

/// Splits a batch payload into its messages. `metadata` is the entry's metadata; only
/// uncompressed batches are supported.
pub fn decode_batch(
    metadata: &MessageMetadata,
    mut data: Bytes,
) -> Result<Vec<BatchedMessage>, Error> {
    let bad = |reason: String| Error::MalformedBatch { reason };
    // The raw value: prost's getter would read an unknown code as NONE.
    let compression = metadata.compression.unwrap_or(CompressionType::None as i32);
    if compression != CompressionType::None as i32 {
        let name = CompressionType::try_from(compression)
            .map_or_else(|_| format!("code {compression}"), |c| format!("{c:?}"));
        return Err(bad(format!(
            "compression {name} is not supported by this client; produce without compression"
        )));
    }
    let count = metadata.num_messages_in_batch.unwrap_or(1);
    if !(1..=MAX_BATCH_MESSAGES).contains(&count) {
        return Err(bad(format!(
            "num_messages_in_batch {count} is not in 1..={MAX_BATCH_MESSAGES}"
        )));
    }
    // Each message takes at least 4 bytes: a batch cannot declare more than that allows.
    if count as usize > data.remaining() / 4 {
        return Err(bad(format!(
            "{count} messages cannot fit in {} bytes",
            data.remaining()
        )));
    }
    let mut messages = Vec::with_capacity(count as usize);
    for index in 0..count {
        if data.remaining() < 4 {
            return Err(bad(format!("message {index} is truncated before its size")));
        }
        let size = data.get_u32() as usize;
        if data.remaining() < size {
            return Err(bad(format!(
                "message {index} claims {size} bytes of metadata, {} remain",
                data.remaining()
            )));
        }
        let single = SingleMessageMetadata::decode(data.split_to(size))
            .map_err(|e| bad(format!("message {index} metadata does not decode: {e}")))?;
        let payload_size = usize::try_from(single.payload_size)
            .map_err(|_| bad(format!("message {index} has a negative payload size")))?;
        if data.remaining() < payload_size {
            return Err(bad(format!(
                "message {index} claims {payload_size} payload bytes, {} remain",
                data.remaining()
            )));
        }
        let payload = data.split_to(payload_size);
        messages.push(BatchedMessage {
            metadata: single,
            payload,
        });
    }
    Ok(messages)
}

/// Builds a batch payload from messages (their `payload_size` is set from the payload).
pub fn encode_batch(messages: &[BatchedMessage]) -> Bytes {
    let size: usize = messages
        .iter()
        .map(|m| 4 + m.metadata.encoded_len() + 10 + m.payload.len())
        .sum();
    let mut out = BytesMut::with_capacity(size);
    for message in messages {
        let mut metadata = message.metadata.clone();
        metadata.payload_size = message.payload.len() as i32;
        out.put_u32(metadata.encoded_len() as u32);
        let _ = metadata.encode(&mut out);
        out.put_slice(&message.payload);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(n: i32) -> MessageMetadata {
        MessageMetadata {
            num_messages_in_batch: Some(n),
            ..MessageMetadata::default()
        }
    }

    #[test]
    fn batches_round_trip() {
        let messages: Vec<_> = (0..3)
            .map(|i| BatchedMessage {
                metadata: SingleMessageMetadata {
                    partition_key: Some(format!("k{i}")),
                    ..SingleMessageMetadata::default()
                },
                payload: Bytes::from(vec![i as u8; i * 10]),
            })
            .collect();
        let data = encode_batch(&messages);
        let decoded = decode_batch(&metadata(3), data).unwrap();
        assert_eq!(decoded.len(), 3);
        for (i, m) in decoded.iter().enumerate() {
            assert_eq!(m.payload.len(), i * 10);
            assert_eq!(
                m.metadata.partition_key.as_deref(),
                Some(format!("k{i}").as_str())
            );
        }
    }

    #[test]
    fn bad_batches_are_errors() {
        assert!(decode_batch(&metadata(0), Bytes::new()).is_err());
        assert!(decode_batch(&metadata(1_000_000), Bytes::from(vec![0; 16])).is_err());
        assert!(decode_batch(&metadata(2), Bytes::from(vec![0, 0, 0, 200, 1])).is_err());
        let compressed = MessageMetadata {
            compression: Some(CompressionType::Lz4 as i32),
            ..metadata(1)
        };
        assert!(decode_batch(&compressed, Bytes::from(vec![0; 8])).is_err());
        let unknown = MessageMetadata {
            compression: Some(99),
            ..metadata(1)
        };
        let error = decode_batch(&unknown, Bytes::from(vec![0; 8])).unwrap_err();
        assert!(error.to_string().contains("code 99"), "{error}");
    }
}
