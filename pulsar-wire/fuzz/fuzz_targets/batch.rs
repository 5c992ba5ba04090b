//! Splits arbitrary bytes into the entry metadata fields that `decode_batch` reads
//! (`num_messages_in_batch`, `compression`, `uncompressed_size`) and a batch payload. Every
//! batch it accepts must hold the declared number of messages, fit in the (decompressed)
//! payload, and re-encode to a batch that decodes the same.
//!
//! Input: `[flags][i32 num_messages_in_batch, big-endian][i32 compression]
//! [u32 uncompressed_size][payload…]`; flag bit 0 makes `num_messages_in_batch` present, bit 1
//! `compression`, bit 2 `uncompressed_size`.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pulsar_wire::pb::MessageMetadata;
use pulsar_wire::{DEFAULT_MAX_MESSAGE_SIZE, decompress_payload};
use pulsar_wire::wire::{decode_batch, encode_batch};

fuzz_target!(|data: &[u8]| {
    if data.len() < 13 {
        return;
    }
    let flags = data[0];
    let count = i32::from_be_bytes(data[1..5].try_into().unwrap());
    let compression = i32::from_be_bytes(data[5..9].try_into().unwrap());
    let uncompressed_size = u32::from_be_bytes(data[9..13].try_into().unwrap());
    let metadata = MessageMetadata {
        num_messages_in_batch: (flags & 1 != 0).then_some(count),
        compression: (flags & 2 != 0).then_some(compression),
        uncompressed_size: (flags & 4 != 0).then_some(uncompressed_size),
        ..MessageMetadata::default()
    };
    let payload = Bytes::copy_from_slice(&data[13..]);
    let Ok(messages) = decode_batch(&metadata, payload.clone()) else {
        return;
    };
    let plain = decompress_payload(&metadata, payload, DEFAULT_MAX_MESSAGE_SIZE)
        .expect("a batch that decoded decompresses");
    assert!(plain.len() <= DEFAULT_MAX_MESSAGE_SIZE);
    if let Some(declared) = metadata.uncompressed_size
        && metadata.compression.is_some_and(|c| c != 0)
    {
        assert_eq!(plain.len(), declared as usize);
    }
    assert_eq!(
        messages.len(),
        metadata.num_messages_in_batch.unwrap_or(1) as usize
    );
    let mut used = 0;
    for message in &messages {
        assert_eq!(
            message.payload.len() as i64,
            i64::from(message.metadata.payload_size)
        );
        used += 4 + message.payload.len();
    }
    assert!(used <= plain.len(), "decoded more bytes than the payload held");
    let uncompressed = MessageMetadata {
        compression: None,
        ..metadata
    };
    let again = decode_batch(&uncompressed, encode_batch(&messages)).expect("a re-encoded batch");
    assert_eq!(again, messages);
});
