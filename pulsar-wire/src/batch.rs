//! Batches: several messages in one entry's payload.
//!
//! Layout (uncompressed): for each message, `[u32 size][SingleMessageMetadata][payload]`, with
//! `payload_size` in the metadata. A compressed batch is that whole region compressed as one
//! unit.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::Error;
use crate::compression::{DEFAULT_MAX_MESSAGE_SIZE, decompress_payload};
use crate::pb::{MessageMetadata, SingleMessageMetadata};

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

/// Splits a batch payload into its messages, decompressing it first when the entry's
/// metadata names a codec (`compression`, `uncompressed_size`), with a limit of
/// [`DEFAULT_MAX_MESSAGE_SIZE`] bytes for the decompressed batch.
///
/// # Errors
/// [`Error::MalformedBatch`] for a batch that does not split into `num_messages_in_batch`
/// messages; the errors of [`decompress_payload`] for a compressed one.
pub fn decode_batch(metadata: &MessageMetadata, data: Bytes) -> Result<Vec<BatchedMessage>, Error> {
    decode_batch_with_limit(metadata, data, DEFAULT_MAX_MESSAGE_SIZE)
}

/// [`decode_batch`] with another limit for the decompressed batch (a consumer takes the
/// broker's `max_message_size`).
///
/// # Errors
/// As [`decode_batch`].
pub fn decode_batch_with_limit(
    metadata: &MessageMetadata,
    data: Bytes,
    max_uncompressed: usize,
) -> Result<Vec<BatchedMessage>, Error> {
    let data = decompress_payload(metadata, data, max_uncompressed)?;
    split_batch(metadata, data)
}

/// Splits an uncompressed batch payload into the `num_messages_in_batch` messages of
/// `metadata` (whose `compression` it does not read).
pub(crate) fn split_batch(
    metadata: &MessageMetadata,
    mut data: Bytes,
) -> Result<Vec<BatchedMessage>, Error> {
    let bad = |reason: String| Error::MalformedBatch { reason };
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

/// Builds an uncompressed batch payload from messages (their `payload_size` is set from the
/// payload); [`crate::compress`] compresses it as one unit.
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
    use crate::pb::CompressionType;
    use crate::{Compression, compress};

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

    /// A batch of `n` messages compressed with `codec` as one unit, and its metadata.
    fn compressed_batch(n: usize, codec: Compression) -> (MessageMetadata, Bytes) {
        let messages: Vec<_> = (0..n)
            .map(|i| BatchedMessage {
                metadata: SingleMessageMetadata {
                    partition_key: Some(format!("k{i}")),
                    sequence_id: Some(i as u64),
                    ..SingleMessageMetadata::default()
                },
                payload: Bytes::from(
                    format!("{{\"order\": {i}, \"item\": \"widget\"}}").repeat(i % 7),
                ),
            })
            .collect();
        let plain = encode_batch(&messages);
        let data = compress(codec, &plain).unwrap();
        let metadata = MessageMetadata {
            compression: (codec != Compression::None).then_some(codec.wire() as i32),
            uncompressed_size: Some(plain.len() as u32),
            ..metadata(n as i32)
        };
        (metadata, data)
    }

    #[test]
    fn compressed_batches_decode_into_their_messages() {
        for codec in Compression::ALL.into_iter().filter(|c| c.is_available()) {
            for n in [1, 2, 100, 1000] {
                let (metadata, data) = compressed_batch(n, codec);
                let decoded =
                    decode_batch(&metadata, data).unwrap_or_else(|e| panic!("{codec} {n}: {e}"));
                assert_eq!(decoded.len(), n, "{codec}");
                for (i, m) in decoded.iter().enumerate() {
                    assert_eq!(m.metadata.sequence_id, Some(i as u64), "{codec}");
                    assert_eq!(
                        m.payload.len(),
                        format!("{{\"order\": {i}, \"item\": \"widget\"}}").len() * (i % 7)
                    );
                }
            }
        }
    }

    #[test]
    fn a_compressed_batch_above_the_limit_is_refused() {
        for codec in Compression::ALL[1..].iter().filter(|c| c.is_available()) {
            let (metadata, data) = compressed_batch(100, *codec);
            let size = metadata.uncompressed_size.unwrap_or_default() as usize;
            assert!(decode_batch_with_limit(&metadata, data.clone(), size).is_ok());
            let error = decode_batch_with_limit(&metadata, data, size - 1).unwrap_err();
            assert!(matches!(error, Error::Compression { .. }), "{error}");
            assert!(error.to_string().contains("above the limit"), "{error}");
        }
    }

    #[test]
    fn bad_batches_are_errors() {
        assert!(decode_batch(&metadata(0), Bytes::new()).is_err());
        assert!(decode_batch(&metadata(1_000_000), Bytes::from(vec![0; 16])).is_err());
        assert!(decode_batch(&metadata(2), Bytes::from(vec![0, 0, 0, 200, 1])).is_err());
        // LZ4 without uncompressed_size, and a declared size the block does not fill.
        let mut compressed = MessageMetadata {
            compression: Some(CompressionType::Lz4 as i32),
            ..metadata(1)
        };
        let error = decode_batch(&compressed, Bytes::from(vec![0; 8])).unwrap_err();
        let expected = if cfg!(feature = "lz4") {
            "uncompressed_size"
        } else {
            "`lz4` feature"
        };
        assert!(error.to_string().contains(expected), "{error}");
        compressed.uncompressed_size = Some(100);
        assert!(decode_batch(&compressed, Bytes::from(vec![0; 8])).is_err());
        let unknown = MessageMetadata {
            compression: Some(99),
            ..metadata(1)
        };
        let error = decode_batch(&unknown, Bytes::from(vec![0; 8])).unwrap_err();
        assert!(error.to_string().contains("code 99"), "{error}");
    }
}
