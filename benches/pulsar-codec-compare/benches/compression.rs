//! Compression and decompression throughput of pulsar-wire and of the `pulsar` crate, per codec
//! (LZ4, ZLIB, ZSTD, SNAPPY), in one run. `pulsar` has no public compression API, so its side is
//! the same calls of the same crates with its default settings
//! (`pulsar_codec_compare::compression`, which names the functions of `pulsar` they follow).
//!
//! Payloads: `json_1k` and `json_64k` (JSON-like text of 1 KiB and 64 KiB, one message) and
//! `batch100` (the batch payload of 100 messages of about 100 bytes of JSON each, as
//! `encode_batch` writes it: the bytes both clients compress for a batch).
//!
//! - `compression/{payload}/{codec}`: `pulsar_wire_compress` (`pulsar_wire::compress`),
//!   `pulsar_compress`, `pulsar_wire_decompress` (`pulsar_wire::decompress`, declared size and
//!   the default 5 MiB limit), `pulsar_decompress`. LZ4, ZLIB and ZSTD: both decompress the same
//!   bytes, pulsar-wire's output (each side also decodes the other's output, checked before
//!   timing). SNAPPY: each side decompresses its own format (raw block against framed), since
//!   neither reads the other's.
//! - `frame/batch100/{codec}` (NONE too): `pulsar_wire_encode_send` / `pulsar_encode_send`:
//!   compress the uncompressed batch payload, set `compression` and `uncompressed_size` in the
//!   entry metadata, encode the `SEND` frame into a `BytesMut` (`PulsarCodec` /
//!   `pulsar::message::Codec`); `pulsar_wire_decode_message` / `pulsar_decode_message`: decode a
//!   `MESSAGE` frame from a `BytesMut` and decompress its batch payload (the split into
//!   messages is left out: `pulsar`'s batch parser is not public). Command, metadata and
//!   buffers are made outside the timed part; the frames are checked to be the same bytes for
//!   both codecs (`same_frames`) but for the compressed payload itself.
//!
//! `Throughput::Bytes` = the uncompressed payload, in both directions, so MB/s compare codecs
//! and clients on the same work.
//!
//! ```sh
//! cargo bench --manifest-path benches/pulsar-codec-compare/Cargo.toml --bench compression -- \
//!     --warm-up-time 1 --measurement-time 3
//! scripts/bench-pulsar-compression.sh   # the same, then MB/s and ratios
//! ```

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pulsar::message::proto::CompressionType as PulsarCompressionType;
use pulsar::message::{Codec, Message as PulsarMessage};
use pulsar_codec_compare::compression::{
    SMALL_BATCH_MESSAGES, json_text, pulsar_compress, pulsar_decompress, pulsar_settings,
    small_batch, snappy_formats_differ,
};
use pulsar_codec_compare::same_frames;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{BaseCommand, CommandSend, MessageMetadata};
use pulsar_wire::{
    Compression, DEFAULT_MAX_MESSAGE_SIZE, Frame, PulsarCodec, compress, decode_batch, decompress,
    decompress_payload, encode_batch,
};
use tokio_util::codec::{Decoder, Encoder};

// Only the `MESSAGE` command and its entry metadata are used here.
#[allow(dead_code)]
#[path = "../../../pulsar-wire/benches/frames/mod.rs"]
mod frames;

const CODECS: [Compression; 4] = [
    Compression::Lz4,
    Compression::Zlib,
    Compression::Zstd,
    Compression::Snappy,
];

/// What `pulsar` decompresses for `codec`: pulsar-wire's output where `pulsar` reads it (the
/// same bytes for both), its own framed format for SNAPPY.
fn pulsar_input(codec: Compression, ours: &Bytes, theirs: &[u8]) -> Vec<u8> {
    if codec == Compression::Snappy {
        theirs.to_vec()
    } else {
        ours.to_vec()
    }
}

fn bench_payload(c: &mut Criterion, name: &str, data: &[u8], codec: Compression) {
    let settings = pulsar_settings(codec);
    let size = Some(data.len() as u32);
    let ours = compress(codec, data).expect("pulsar-wire compresses");
    let theirs = pulsar_compress(&settings, data).expect("pulsar compresses");
    let their_input = pulsar_input(codec, &ours, &theirs);
    // Both round-trip, and where the formats agree, each reads the other's output.
    let back = decompress(codec, &ours, size, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(&back[..], data, "{codec}: pulsar-wire round trip");
    let back = pulsar_decompress(codec, &their_input, size).unwrap();
    assert_eq!(&back[..], data, "{codec}: pulsar decompression");
    if codec != Compression::Snappy {
        let back = decompress(codec, &theirs, size, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
        assert_eq!(
            &back[..],
            data,
            "{codec}: pulsar-wire reads pulsar's output"
        );
    } else {
        snappy_formats_differ(data).unwrap();
    }
    eprintln!(
        "{name} {codec}: {} B, compressed by pulsar-wire {} B ({:.1} %), by pulsar {} B ({:.1} %)",
        data.len(),
        ours.len(),
        100.0 * ours.len() as f64 / data.len() as f64,
        theirs.len(),
        100.0 * theirs.len() as f64 / data.len() as f64,
    );

    let mut group = c.benchmark_group(format!(
        "compression/{name}/{}",
        codec.name().to_lowercase()
    ));
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_function("pulsar_wire_compress", |b| {
        b.iter(|| compress(codec, black_box(data)).unwrap());
    });
    group.bench_function("pulsar_compress", |b| {
        b.iter(|| pulsar_compress(black_box(&settings), black_box(data)).unwrap());
    });
    group.bench_function("pulsar_wire_decompress", |b| {
        b.iter(|| decompress(codec, black_box(&ours), size, DEFAULT_MAX_MESSAGE_SIZE).unwrap());
    });
    group.bench_function("pulsar_decompress", |b| {
        b.iter(|| pulsar_decompress(codec, black_box(&their_input), size).unwrap());
    });
    group.finish();
}

/// The `SEND` command of a 100-message batch.
fn send_command() -> BaseCommand {
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
        (Some(codec.wire() as i32), Some(len as u32))
    }
}

/// pulsar-wire's producer side: compress the batch payload, fill in the metadata, encode.
fn wire_encode_send(
    codec: Compression,
    plain: &Bytes,
    command: BaseCommand,
    mut metadata: MessageMetadata,
    dst: &mut BytesMut,
) {
    let data = if codec == Compression::None {
        plain.clone()
    } else {
        compress(codec, plain).unwrap()
    };
    (metadata.compression, metadata.uncompressed_size) = codec_fields(codec, plain.len());
    let frame = Frame::with_payload(command, metadata, data);
    PulsarCodec::default().encode(frame, dst).unwrap();
}

/// `pulsar`'s producer side: its message owns the payload (`ProducerMessage::payload`, a
/// `Vec<u8>`); `compress_message` replaces it (nothing for NONE), then `Codec` encodes.
fn pulsar_encode_send(
    codec: Compression,
    settings: &pulsar::compression::Compression,
    payload: Vec<u8>,
    mut message: PulsarMessage,
    dst: &mut BytesMut,
) {
    let len = payload.len();
    let data = if codec == Compression::None {
        payload
    } else {
        pulsar_compress(settings, &payload).unwrap()
    };
    let entry = message.payload.as_mut().unwrap();
    (entry.metadata.compression, entry.metadata.uncompressed_size) = codec_fields(codec, len);
    entry.data = data;
    Codec.encode(message, dst).unwrap();
}

/// pulsar-wire's consumer side: decode the frame, decompress its payload as its metadata says.
fn wire_decode_message(src: &mut BytesMut) -> (Frame, Bytes) {
    let mut frame = PulsarCodec::default().decode(src).unwrap().unwrap();
    let payload = frame.payload.as_mut().unwrap();
    let data = std::mem::take(&mut payload.data);
    let data = decompress_payload(&payload.metadata, data, DEFAULT_MAX_MESSAGE_SIZE).unwrap();
    (frame, data)
}

/// `pulsar`'s consumer side: decode the frame, then what `process_payload` does before the
/// batch split: read the codec, decompress, replace the payload's data.
fn pulsar_decode_message(src: &mut BytesMut) -> PulsarMessage {
    let mut message = Codec.decode(src).unwrap().unwrap();
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
            pulsar_decompress(codec, &payload.data, payload.metadata.uncompressed_size).unwrap();
    }
    message
}

/// The `MESSAGE` frame delivering `data` (the batch payload compressed with `codec`).
fn message_frame(codec: Compression, plain_len: usize, data: Bytes) -> Frame {
    let mut metadata = frames::batch_metadata();
    (metadata.compression, metadata.uncompressed_size) = codec_fields(codec, plain_len);
    Frame::with_payload(frames::message_command(), metadata, data)
}

fn bench_frames(c: &mut Criterion, messages: &[pulsar_wire::BatchedMessage], codec: Compression) {
    let settings = pulsar_settings(codec);
    let plain = encode_batch(messages);
    let plain_vec = plain.to_vec();
    let len = plain.len();

    // SEND: the same frame for both codecs but for the compressed payload. The templates are
    // uncompressed; each routine compresses and sets the two codec fields.
    let mut metadata = frames::batch_metadata();
    metadata.producer_name = "bench-producer".into();
    let template = same_frames(Frame::with_payload(
        send_command(),
        metadata.clone(),
        plain.clone(),
    ))
    .expect("the SEND frame");
    let mut expected = BytesMut::new();
    {
        let (c, u) = codec_fields(codec, len);
        let mut m = metadata.clone();
        (m.compression, m.uncompressed_size) = (c, u);
        let data = if codec == Compression::None {
            plain.clone()
        } else {
            compress(codec, &plain).unwrap()
        };
        let same = same_frames(Frame::with_payload(send_command(), m, data))
            .expect("the compressed SEND frame");
        expected.extend_from_slice(&same.bytes);
    }
    let mut ours = BytesMut::new();
    wire_encode_send(codec, &plain, send_command(), metadata.clone(), &mut ours);
    assert_eq!(ours, expected, "{codec}: pulsar-wire's SEND frame");
    let mut theirs = BytesMut::new();
    pulsar_encode_send(
        codec,
        &settings,
        plain_vec.clone(),
        template.pulsar.clone(),
        &mut theirs,
    );
    // pulsar's frame carries the same command and metadata, and its payload decompresses
    // (by pulsar, and by pulsar-wire where the formats agree) to the batch.
    let decoded = pulsar_decode_message(&mut theirs.clone());
    let expected_pulsar = Codec.decode(&mut expected.clone()).unwrap().unwrap();
    assert_eq!(decoded.command, expected_pulsar.command);
    assert_eq!(
        decoded.payload.as_ref().unwrap().metadata,
        expected_pulsar.payload.as_ref().unwrap().metadata
    );
    assert_eq!(decoded.payload.as_ref().unwrap().data, plain_vec);
    if codec != Compression::Snappy {
        let (frame, data) = wire_decode_message(&mut theirs.clone());
        assert_eq!(frame.command, send_command());
        assert_eq!(data, plain);
    }

    // MESSAGE: pulsar-wire's compressed batch for both (pulsar's framed one for SNAPPY).
    let our_data = if codec == Compression::None {
        plain.clone()
    } else {
        compress(codec, &plain).unwrap()
    };
    let ours_frame = same_frames(message_frame(codec, len, our_data)).expect("the MESSAGE frame");
    let their_bytes = if codec == Compression::Snappy {
        let mut message = ours_frame.pulsar.clone();
        message.payload.as_mut().unwrap().data = pulsar_compress(&settings, &plain).unwrap();
        let mut bytes = BytesMut::new();
        Codec.encode(message, &mut bytes).unwrap();
        bytes.freeze()
    } else {
        ours_frame.bytes.clone()
    };
    let (frame, data) = wire_decode_message(&mut BytesMut::from(&ours_frame.bytes[..]));
    assert_eq!(data, plain, "{codec}: pulsar-wire's MESSAGE decode");
    let mut plain_metadata = frame.payload.as_ref().unwrap().metadata.clone();
    plain_metadata.compression = None;
    let split = decode_batch(&plain_metadata, data).unwrap();
    assert!(
        split.len() == messages.len()
            && split
                .iter()
                .zip(messages)
                .all(|(a, b)| a.payload == b.payload
                    && a.metadata.sequence_id == b.metadata.sequence_id),
        "{codec}: the batch splits into its messages"
    );
    let decoded = pulsar_decode_message(&mut BytesMut::from(&their_bytes[..]));
    assert_eq!(decoded.payload.as_ref().unwrap().data, plain_vec);
    eprintln!(
        "frame batch100 {codec}: SEND {} B (pulsar-wire) / {} B (pulsar), MESSAGE {} B / {} B",
        ours.len(),
        theirs.len(),
        ours_frame.bytes.len(),
        their_bytes.len()
    );

    let mut group = c.benchmark_group(format!("frame/batch100/{}", codec.name().to_lowercase()));
    group.throughput(Throughput::Bytes(len as u64));
    let capacity = ours.len().max(theirs.len()) + 64;
    group.bench_function("pulsar_wire_encode_send", |b| {
        b.iter_batched(
            || {
                (
                    send_command(),
                    metadata.clone(),
                    BytesMut::with_capacity(capacity),
                )
            },
            |(command, metadata, mut dst)| {
                wire_encode_send(codec, &plain, command, metadata, &mut dst);
                dst
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_encode_send", |b| {
        b.iter_batched(
            || {
                (
                    plain_vec.clone(),
                    template.pulsar.clone(),
                    BytesMut::with_capacity(capacity),
                )
            },
            |(payload, message, mut dst)| {
                pulsar_encode_send(codec, &settings, payload, message, &mut dst);
                dst
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_wire_decode_message", |b| {
        b.iter_batched(
            || BytesMut::from(&ours_frame.bytes[..]),
            |mut src| wire_decode_message(&mut src),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_decode_message", |b| {
        b.iter_batched(
            || BytesMut::from(&their_bytes[..]),
            |mut src| pulsar_decode_message(&mut src),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let messages = small_batch();
    let payloads = [
        ("json_1k", Bytes::from(json_text(1024, 1))),
        ("json_64k", Bytes::from(json_text(64 * 1024, 2))),
        ("batch100", encode_batch(&messages)),
    ];
    for (name, data) in &payloads {
        for codec in CODECS {
            bench_payload(c, name, data, codec);
        }
    }
    for codec in std::iter::once(Compression::None).chain(CODECS) {
        bench_frames(c, &messages, codec);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
