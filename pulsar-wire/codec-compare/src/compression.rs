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

use bytes::{Bytes, BytesMut};
use pulsar::compression::{
    Compression as PulsarCompression, CompressionLz4, CompressionSnappy, CompressionZlib,
    CompressionZstd,
};
use pulsar::message::proto::CompressionType as PulsarCompressionType;
use pulsar::message::{Codec, Message as PulsarMessage};
use pulsar_wire::pb::CompressionType;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{BaseCommand, CommandSend, MessageMetadata, SingleMessageMetadata};
use pulsar_wire::wire::{
    BatchedMessage, Frame, PulsarCodec, decode_batch, decompress_payload, encode_batch,
};
use pulsar_wire::{Compression, DEFAULT_MAX_MESSAGE_SIZE, compress, decompress};
use tokio_util::codec::{Decoder, Encoder};

use crate::{frames, same_frames};

/// The four codecs compared.
pub const CODECS: [Compression; 4] = [
    Compression::Lz4,
    Compression::Zlib,
    Compression::Zstd,
    Compression::Snappy,
];

/// `pulsar`'s settings for `codec`: each codec's `Default` (`pulsar::compression`), which is
/// what a `ProducerOptions` with `Compression::Lz4(Default::default())` etc. holds.
///
/// # Panics
/// For a codec added to pulsar-wire after this comparison was written (`Compression` is
/// `#[non_exhaustive]`): give it its `pulsar` setting here before comparing it.
pub fn pulsar_settings(codec: Compression) -> PulsarCompression {
    match codec {
        Compression::None => PulsarCompression::None,
        Compression::Lz4 => PulsarCompression::Lz4(CompressionLz4::default()),
        Compression::Zlib => PulsarCompression::Zlib(CompressionZlib::default()),
        Compression::Zstd => PulsarCompression::Zstd(CompressionZstd::default()),
        Compression::Snappy => PulsarCompression::Snappy(CompressionSnappy::default()),
        other => panic!("no `pulsar` setting for {other:?}: add one to pulsar_settings"),
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
/// The codec's I/O error; [`std::io::ErrorKind::Unsupported`] for a codec added to pulsar-wire
/// after this comparison was written (`Compression` is `#[non_exhaustive]`).
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
        other => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("no `pulsar` decoder for {other:?}: add one to pulsar_decompress"),
        )),
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

/// The payloads of the comparison: 1 KiB and 64 KiB of JSON-like text (one message each) and
/// the batch payload of [`small_batch`], as `encode_batch` writes it (the bytes both clients
/// compress for a batch).
pub fn payloads() -> Vec<(&'static str, Bytes)> {
    vec![
        ("json_1k", Bytes::from(json_text(1024, 1))),
        ("json_64k", Bytes::from(json_text(64 * 1024, 2))),
        ("batch100", encode_batch(&small_batch())),
    ]
}

/// One payload and one codec: what each side compresses and decompresses.
#[derive(Debug)]
pub struct PayloadCase {
    /// The codec.
    pub codec: Compression,
    /// `pulsar`'s settings for it.
    pub settings: PulsarCompression,
    /// The payload.
    pub data: Bytes,
    /// What pulsar-wire decompresses: its own output.
    pub ours: Bytes,
    /// What `pulsar` decompresses: pulsar-wire's output too (the same bytes), but for SNAPPY,
    /// its own framed output.
    pub theirs: Vec<u8>,
    /// The sizes compressed by pulsar-wire and by `pulsar`.
    pub compressed_sizes: (usize, usize),
}

impl PayloadCase {
    /// Compresses `data` both ways and checks that both sides round-trip, that each reads the
    /// other's output where the formats agree, and that the SNAPPY formats differ.
    pub fn new(codec: Compression, data: Bytes) -> Result<Self, String> {
        let settings = pulsar_settings(codec);
        let ours = compress(codec, &data).map_err(|e| e.to_string())?;
        let their_output = pulsar_compress(&settings, &data).map_err(|e| e.to_string())?;
        let theirs = if codec == Compression::Snappy {
            snappy_formats_differ(&data)?;
            their_output.clone()
        } else {
            // pulsar-wire reads pulsar's output.
            let back = decompress(
                codec,
                &their_output,
                size_of(&data),
                DEFAULT_MAX_MESSAGE_SIZE,
            )
            .map_err(|e| format!("{codec}: pulsar-wire does not read pulsar's output: {e}"))?;
            if back != data {
                return Err(format!(
                    "{codec}: pulsar's output decompresses to other bytes"
                ));
            }
            ours.to_vec()
        };
        let case = Self {
            codec,
            settings,
            compressed_sizes: (ours.len(), their_output.len()),
            data,
            ours,
            theirs,
        };
        if case.wire_decompress() != case.data || case.pulsar_decompress() != case.data {
            return Err(format!("{codec}: a side does not round-trip"));
        }
        Ok(case)
    }

    /// pulsar-wire: `compress`.
    pub fn wire_compress(&self) -> Bytes {
        compress(self.codec, &self.data).unwrap()
    }

    /// `pulsar`: [`pulsar_compress`].
    pub fn pulsar_compress(&self) -> Vec<u8> {
        pulsar_compress(&self.settings, &self.data).unwrap()
    }

    /// pulsar-wire: `decompress` with the declared size and the default limit of 5 MiB.
    pub fn wire_decompress(&self) -> Bytes {
        decompress(
            self.codec,
            &self.ours,
            size_of(&self.data),
            DEFAULT_MAX_MESSAGE_SIZE,
        )
        .unwrap()
    }

    /// `pulsar`: [`pulsar_decompress`] with the declared size.
    pub fn pulsar_decompress(&self) -> Vec<u8> {
        pulsar_decompress(self.codec, &self.theirs, size_of(&self.data)).unwrap()
    }
}

fn size_of(data: &[u8]) -> Option<u32> {
    Some(data.len() as u32)
}

/// The `SEND` command of a batch of [`SMALL_BATCH_MESSAGES`] messages.
pub fn send_command() -> BaseCommand {
    BaseCommand {
        r#type: Type::Send as i32,
        send: Some(CommandSend {
            producer_id: 1,
            sequence_id: 1_000,
            num_messages: Some(SMALL_BATCH_MESSAGES as i32),
            ..CommandSend::default()
        }),
        ..BaseCommand::default()
    }
}

/// The `compression` and `uncompressed_size` of an entry of `len` bytes before compression
/// (both unset without a codec, as both producers do).
fn codec_fields(codec: Compression, len: usize) -> (Option<i32>, Option<u32>) {
    if codec == Compression::None {
        (None, None)
    } else {
        let wire = match codec {
            Compression::Lz4 => CompressionType::Lz4,
            Compression::Zlib => CompressionType::Zlib,
            Compression::Zstd => CompressionType::Zstd,
            Compression::Snappy => CompressionType::Snappy,
            _ => CompressionType::None,
        };
        (Some(wire as i32), Some(len as u32))
    }
}

/// The input of [`FrameCase::wire_encode_send`]: command, metadata, output buffer.
pub type WireSendInput = (BaseCommand, MessageMetadata, BytesMut);
/// The input of [`FrameCase::pulsar_encode_send`]: the payload a `pulsar` message owns, the
/// message (uncompressed), output buffer.
pub type PulsarSendInput = (Vec<u8>, PulsarMessage, BytesMut);

/// Whole frames with the compressed batch of [`small_batch`], for one codec (NONE too).
///
/// - `SEND` (a producer's work once the batch is serialized): compress the batch payload, set
///   `compression` and `uncompressed_size` in the entry metadata, encode the frame into a
///   `BytesMut`.
/// - `MESSAGE` (a consumer's work before it splits the batch): decode the frame, decompress
///   its payload. The split is left out: `pulsar`'s batch parser is not public.
///
/// Both sides' frames are the same bytes but for the compressed payload (checked by
/// [`FrameCase::new`] with `same_frames`).
#[derive(Debug)]
pub struct FrameCase {
    /// The codec.
    pub codec: Compression,
    settings: PulsarCompression,
    plain: Bytes,
    plain_vec: Vec<u8>,
    metadata: MessageMetadata,
    pulsar_template: PulsarMessage,
    /// pulsar-wire's `MESSAGE` frame (its compressed batch).
    pub wire_message: Bytes,
    /// `pulsar`'s `MESSAGE` frame: the same bytes, but for SNAPPY, its framed payload.
    pub pulsar_message: Bytes,
    capacity: usize,
    /// The uncompressed batch payload's size.
    pub batch_size: usize,
    /// The sizes of pulsar-wire's and `pulsar`'s `SEND` frames.
    pub send_sizes: (usize, usize),
}

impl FrameCase {
    /// Builds the frames and checks both sides' results before anything is timed.
    pub fn new(codec: Compression) -> Result<Self, String> {
        let messages = small_batch();
        let settings = pulsar_settings(codec);
        let plain = encode_batch(&messages);
        let plain_vec = plain.to_vec();
        let len = plain.len();
        let mut metadata = frames::batch_metadata();
        metadata.producer_name = "bench-producer".into();
        // `pulsar`'s message for the uncompressed frame: same bytes as pulsar-wire's.
        let uncompressed = same_frames(Frame::with_payload(
            send_command(),
            metadata.clone(),
            plain.clone(),
        ))?;
        let our_data = if codec == Compression::None {
            plain.clone()
        } else {
            compress(codec, &plain).map_err(|e| e.to_string())?
        };
        let mut compressed_metadata = metadata.clone();
        (
            compressed_metadata.compression,
            compressed_metadata.uncompressed_size,
        ) = codec_fields(codec, len);
        let expected_send = same_frames(Frame::with_payload(
            send_command(),
            compressed_metadata.clone(),
            our_data.clone(),
        ))?;

        let mut message_metadata = frames::batch_metadata();
        (
            message_metadata.compression,
            message_metadata.uncompressed_size,
        ) = codec_fields(codec, len);
        let message = same_frames(Frame::with_payload(
            frames::message_command(),
            message_metadata,
            our_data,
        ))?;
        let pulsar_message = if codec == Compression::Snappy {
            let mut framed = message.pulsar.clone();
            if let Some(payload) = framed.payload.as_mut() {
                payload.data = pulsar_compress(&settings, &plain).map_err(|e| e.to_string())?;
            }
            let mut bytes = BytesMut::new();
            Codec
                .encode(framed, &mut bytes)
                .map_err(|e| e.to_string())?;
            bytes.freeze()
        } else {
            message.bytes.clone()
        };

        let mut case = Self {
            codec,
            settings,
            plain,
            plain_vec,
            metadata,
            pulsar_template: uncompressed.pulsar,
            wire_message: message.bytes,
            pulsar_message,
            capacity: 0,
            batch_size: len,
            send_sizes: (0, 0),
        };
        case.capacity = expected_send.bytes.len() * 2 + 64;

        // pulsar-wire's SEND: the expected bytes.
        let ours = case.wire_encode_send(case.wire_send_input());
        if ours[..] != expected_send.bytes[..] {
            return Err(format!("{codec}: pulsar-wire's SEND frame differs"));
        }
        // pulsar's SEND: the same command and metadata, a payload that decompresses (by
        // pulsar, and by pulsar-wire where the formats agree) to the batch.
        let theirs = case.pulsar_encode_send(case.pulsar_send_input());
        let decoded = Self::pulsar_decode_message(BytesMut::from(&theirs[..]));
        if decoded.command != expected_send.pulsar.command
            || decoded.payload.as_ref().map(|p| &p.metadata)
                != expected_send.pulsar.payload.as_ref().map(|p| &p.metadata)
            || decoded.payload.as_ref().map(|p| &p.data[..]) != Some(&case.plain_vec[..])
        {
            return Err(format!("{codec}: pulsar's SEND frame differs"));
        }
        if codec != Compression::Snappy {
            let (frame, data) = Self::wire_decode_message(BytesMut::from(&theirs[..]));
            if frame.command != send_command() || data != case.plain {
                return Err(format!(
                    "{codec}: pulsar-wire does not read pulsar's SEND frame"
                ));
            }
        }
        case.send_sizes = (ours.len(), theirs.len());

        // MESSAGE: both decode the batch; pulsar-wire's splits into the messages.
        let (frame, data) = Self::wire_decode_message(case.wire_message_input());
        if data != case.plain {
            return Err(format!("{codec}: pulsar-wire's MESSAGE decode differs"));
        }
        let mut plain_metadata = frame.payload.map(|p| p.metadata).unwrap_or_default();
        plain_metadata.compression = None;
        let split = decode_batch(&plain_metadata, data).map_err(|e| e.to_string())?;
        if split.len() != messages.len()
            || !split
                .iter()
                .zip(&messages)
                .all(|(a, b)| a.payload == b.payload)
        {
            return Err(format!(
                "{codec}: the batch does not split into its messages"
            ));
        }
        let decoded = Self::pulsar_decode_message(case.pulsar_message_input());
        if decoded.payload.map(|p| p.data) != Some(case.plain_vec.clone()) {
            return Err(format!("{codec}: pulsar's MESSAGE decode differs"));
        }
        Ok(case)
    }

    /// The input of [`FrameCase::wire_encode_send`] (made outside the timed part).
    pub fn wire_send_input(&self) -> WireSendInput {
        (
            send_command(),
            self.metadata.clone(),
            BytesMut::with_capacity(self.capacity),
        )
    }

    /// pulsar-wire's producer side: compress the batch payload (none for NONE: the payload
    /// `Bytes` is shared), fill in the metadata, encode with `PulsarCodec`.
    pub fn wire_encode_send(&self, (command, mut metadata, mut dst): WireSendInput) -> BytesMut {
        let data = if self.codec == Compression::None {
            self.plain.clone()
        } else {
            compress(self.codec, &self.plain).unwrap()
        };
        (metadata.compression, metadata.uncompressed_size) =
            codec_fields(self.codec, self.plain.len());
        let frame = Frame::with_payload(command, metadata, data);
        PulsarCodec::default().encode(frame, &mut dst).unwrap();
        dst
    }

    /// The input of [`FrameCase::pulsar_encode_send`] (made outside the timed part).
    pub fn pulsar_send_input(&self) -> PulsarSendInput {
        (
            self.plain_vec.clone(),
            self.pulsar_template.clone(),
            BytesMut::with_capacity(self.capacity),
        )
    }

    /// `pulsar`'s producer side: its message owns the payload (`ProducerMessage::payload`, a
    /// `Vec<u8>`), which `compress_message` replaces by the compressed one (nothing for NONE);
    /// then `pulsar::message::Codec` encodes the frame.
    pub fn pulsar_encode_send(&self, (payload, mut message, mut dst): PulsarSendInput) -> BytesMut {
        let len = payload.len();
        let data = if self.codec == Compression::None {
            payload
        } else {
            pulsar_compress(&self.settings, &payload).unwrap()
        };
        let entry = message.payload.as_mut().unwrap();
        (entry.metadata.compression, entry.metadata.uncompressed_size) =
            codec_fields(self.codec, len);
        entry.data = data;
        Codec.encode(message, &mut dst).unwrap();
        dst
    }

    /// The input of [`FrameCase::wire_decode_message`]: a buffer holding the frame.
    pub fn wire_message_input(&self) -> BytesMut {
        BytesMut::from(&self.wire_message[..])
    }

    /// pulsar-wire's consumer side: decode the frame, decompress its payload as its metadata
    /// says (`decompress_payload`, default limit).
    pub fn wire_decode_message(mut src: BytesMut) -> (Frame, Bytes) {
        let mut frame = PulsarCodec::default().decode(&mut src).unwrap().unwrap();
        let payload = frame.payload.as_mut().unwrap();
        let data = std::mem::take(&mut payload.data);
        let data = decompress_payload(&payload.metadata, data, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
        (frame, data)
    }

    /// The input of [`FrameCase::pulsar_decode_message`]: a buffer holding `pulsar`'s frame.
    pub fn pulsar_message_input(&self) -> BytesMut {
        BytesMut::from(&self.pulsar_message[..])
    }

    /// `pulsar`'s consumer side: decode the frame with `pulsar::message::Codec`, then what
    /// `process_payload` does before the batch split: read the codec, decompress, replace the
    /// payload's data.
    pub fn pulsar_decode_message(mut src: BytesMut) -> PulsarMessage {
        let mut message = Codec.decode(&mut src).unwrap().unwrap();
        let payload = message.payload.as_mut().unwrap();
        let codec = match payload.metadata.compression {
            None => PulsarCompressionType::None,
            Some(code) => PulsarCompressionType::try_from(code).unwrap(),
        };
        let codec = match codec {
            PulsarCompressionType::None => Compression::None,
            PulsarCompressionType::Lz4 => Compression::Lz4,
            PulsarCompressionType::Zlib => Compression::Zlib,
            PulsarCompressionType::Zstd => Compression::Zstd,
            PulsarCompressionType::Snappy => Compression::Snappy,
        };
        if codec != Compression::None {
            payload.data =
                pulsar_decompress(codec, &payload.data, payload.metadata.uncompressed_size)
                    .unwrap();
        }
        message
    }
}
