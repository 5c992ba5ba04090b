//! Splits arbitrary bytes into the entry metadata fields that `decode_batch` reads
//! (`num_messages_in_batch`, `compression`) and a batch payload. Every batch it accepts must
//! hold the declared number of messages and re-encode to a batch that decodes the same.
//!
//! Input: `[flags][i32 num_messages_in_batch, big-endian][i32 compression][payload…]`;
//! flag bit 0 makes `num_messages_in_batch` present, bit 1 `compression`.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pulsar_wire::pb::MessageMetadata;
use pulsar_wire::{decode_batch, encode_batch};

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let flags = data[0];
    let count = i32::from_be_bytes(data[1..5].try_into().unwrap());
    let compression = i32::from_be_bytes(data[5..9].try_into().unwrap());
    let metadata = MessageMetadata {
        num_messages_in_batch: (flags & 1 != 0).then_some(count),
        compression: (flags & 2 != 0).then_some(compression),
        ..MessageMetadata::default()
    };
    let payload = Bytes::copy_from_slice(&data[9..]);
    let Ok(messages) = decode_batch(&metadata, payload) else {
        return;
    };
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
    assert!(
        used <= data.len() - 9,
        "decoded more bytes than the payload held"
    );
    let again = decode_batch(&metadata, encode_batch(&messages)).expect("a re-encoded batch");
    assert_eq!(again, messages);
});
