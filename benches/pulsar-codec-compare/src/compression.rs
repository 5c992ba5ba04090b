//! What the `pulsar` crate (6.9.1) does to compress and decompress a payload, for the
//! compression comparison (`benches/compression.rs`), and the payloads both codecs get.
//!
//! `pulsar` has no public compression or decompression function. A producer compresses in
//! `src/producer.rs`, `fn compress_message` (private), the whole payload of a message or of a
//! batch, with the settings of `ProducerOptions::compression`; a consumer decompresses in
//! `src/consumer/engine.rs`, `ConsumerEngine::process_payload` (private), before splitting a
//! batch. [`pulsar_compress`] and [`pulsar_decompress`] make the same calls of the same crates
//! (`lz4` 1.28, `flate2` 1.1 on `miniz_oxide`, `zstd` 0.13, `snap` 1.1, the versions `pulsar`
//! resolves to) with the same arguments; the settings come from `pulsar`'s public defaults
//! ([`pulsar::compression`]). This is not `pulsar`'s code, only the same library calls.
//!
//! | codec | `pulsar` compresses with | and decompresses with |
//! |---|---|---|
//! | LZ4 | `lz4::block::compress(data, Some(mode), false)` (liblz4 1.10, C), mode `DEFAULT` | `lz4::block::decompress(data, uncompressed_size)` |
//! | ZLIB | `flate2::write::ZlibEncoder::new(Vec::new(), level)`, `write_all`, `finish`; level 6 | `flate2::read::ZlibDecoder::new(data).read_to_end(&mut Vec::new())` |
//! | ZSTD | `zstd::encode_all(data, level)` (streaming), level 3 | `zstd::decode_all(data)` (streaming) |
//! | SNAPPY | `snap::write::FrameEncoder` (the *framed* snappy format), `write_all`, `flush` | `snap::read::FrameDecoder`, `read_to_end` |
//!
//! SNAPPY differs in format, not only in code: the protocol's SNAPPY payload is a raw snappy
//! block (the Java client's `CompressionCodecSnappy`, pulsar-wire), while `pulsar` writes and
//! reads the framed format (stream identifier, chunks with a masked CRC32C each). Neither
//! decodes the other's payloads ([`snappy_formats_differ`]).

use std::io::{Read, Write};

use bytes::Bytes;
use pulsar::compression::{
    Compression as PulsarCompression, CompressionLz4, CompressionSnappy, CompressionZlib,
    CompressionZstd,
};
use pulsar_wire::pb::SingleMessageMetadata;
use pulsar_wire::{BatchedMessage, Compression, DEFAULT_MAX_MESSAGE_SIZE};

/// `pulsar`'s settings for `codec`: each codec's `Default` (`pulsar::compression`), which is
/// what a `ProducerOptions` with `Compression::Lz4(Default::default())` etc. holds.
pub fn pulsar_settings(codec: Compression) -> PulsarCompression {
    match codec {
        Compression::None => PulsarCompression::None,
        Compression::Lz4 => PulsarCompression::Lz4(CompressionLz4::default()),
        Compression::Zlib => PulsarCompression::Zlib(CompressionZlib::default()),
        Compression::Zstd => PulsarCompression::Zstd(CompressionZstd::default()),
        Compression::Snappy => PulsarCompression::Snappy(CompressionSnappy::default()),
    }
}

/// Compresses `data` as `pulsar`'s `compress_message` does with `settings` (for
/// `Compression::None`, a copy, which `pulsar` does not make: it sends the payload as it is).
///
/// # Errors
/// The codec's I/O error, as `pulsar` reports it.
pub fn pulsar_compress(settings: &PulsarCompression, data: &[u8]) -> std::io::Result<Vec<u8>> {
    match settings {
        PulsarCompression::None => Ok(data.to_vec()),
        PulsarCompression::Lz4(lz4) => lz4::block::compress(data, Some(lz4.mode), false),
        PulsarCompression::Zlib(zlib) => {
            let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), zlib.level);
            encoder.write_all(data)?;
            encoder.finish()
        }
        PulsarCompression::Zstd(zstd) => zstd_013::encode_all(data, zstd.level),
        PulsarCompression::Snappy(_) => {
            let mut out = Vec::new();
            {
                let mut encoder = snap::write::FrameEncoder::new(&mut out);
                encoder.write_all(data)?;
                encoder.flush()?;
            }
            Ok(out)
        }
    }
}

/// Decompresses `data` as `pulsar`'s `ConsumerEngine::process_payload` does for `codec`; only
/// LZ4 uses `uncompressed_size`. `Compression::None` returns a copy (`pulsar` keeps the payload).
///
/// # Errors
/// The codec's I/O error.
pub fn pulsar_decompress(
    codec: Compression,
    data: &[u8],
    uncompressed_size: Option<u32>,
) -> std::io::Result<Vec<u8>> {
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Lz4 => lz4::block::decompress(data, uncompressed_size.map(|i| i as i32)),
        Compression::Zlib => {
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(data).read_to_end(&mut out)?;
            Ok(out)
        }
        Compression::Zstd => zstd_013::decode_all(data),
        Compression::Snappy => {
            let mut out = Vec::new();
            snap::read::FrameDecoder::new(data).read_to_end(&mut out)?;
            Ok(out)
        }
    }
}

/// Checks that the two SNAPPY formats are what this module says: each side decodes its own
/// payload of `data`, and neither decodes the other's.
pub fn snappy_formats_differ(data: &[u8]) -> Result<(), String> {
    let ours = pulsar_wire::compress(Compression::Snappy, data).map_err(|e| e.to_string())?;
    let theirs =
        pulsar_compress(&pulsar_settings(Compression::Snappy), data).map_err(|e| e.to_string())?;
    let size = Some(data.len() as u32);
    let ours_back =
        pulsar_wire::decompress(Compression::Snappy, &ours, size, DEFAULT_MAX_MESSAGE_SIZE)
            .map_err(|e| e.to_string())?;
    let theirs_back =
        pulsar_decompress(Compression::Snappy, &theirs, size).map_err(|e| e.to_string())?;
    if ours_back[..] != *data || theirs_back[..] != *data {
        return Err("a SNAPPY payload does not round-trip".into());
    }
    if pulsar_wire::decompress(Compression::Snappy, &theirs, size, DEFAULT_MAX_MESSAGE_SIZE).is_ok()
    {
        return Err("pulsar-wire decodes pulsar's framed SNAPPY payload".into());
    }
    if pulsar_decompress(Compression::Snappy, &ours, size).is_ok() {
        return Err("pulsar decodes pulsar-wire's raw SNAPPY block".into());
    }
    Ok(())
}

/// `len` bytes of JSON-like text: records with repeated field names and varying values (from a
/// xorshift generator seeded by `seed`), as application payloads tend to be.
pub fn json_text(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    while out.len() < len {
        out.extend_from_slice(&json_record(&mut state));
        out.extend_from_slice(b", ");
    }
    out.truncate(len);
    out
}

/// One JSON record of about 100 bytes.
fn json_record(state: &mut u64) -> Vec<u8> {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    let n = *state;
    format!(
        "{{\"order_id\": {}, \"customer\": \"cust-{:05}\", \"amount\": {}.{:02}, \"status\": \"{}\"}}",
        n % 1_000_000_000,
        (n >> 20) % 50_000,
        (n >> 8) % 10_000,
        n % 100,
        ["new", "paid", "shipped", "returned"][(n >> 40) as usize % 4],
    )
    .into_bytes()
}

/// Messages in [`small_batch`].
pub const SMALL_BATCH_MESSAGES: usize = 100;

/// A batch of [`SMALL_BATCH_MESSAGES`] small messages: each one JSON record (about 100 bytes)
/// with a partition key, a sequence id and an event time.
pub fn small_batch() -> Vec<BatchedMessage> {
    let mut state = 0x5eed_u64;
    (0..SMALL_BATCH_MESSAGES)
        .map(|i| BatchedMessage {
            metadata: SingleMessageMetadata {
                partition_key: Some(format!("key-{}", i % 16)),
                sequence_id: Some(1_000 + i as u64),
                event_time: Some(1_764_000_000_000 + i as u64),
                ..SingleMessageMetadata::default()
            },
            payload: Bytes::from(json_record(&mut state)),
        })
        .collect()
}
