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
//! cargo bench --manifest-path pulsar-wire/codec-compare/Cargo.toml --bench compression -- \
//!     --warm-up-time 1 --measurement-time 3
//! scripts/bench-pulsar-compression.sh   # the same, then MB/s and ratios
//! ```

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pulsar_codec_compare::compression::{CODECS, FrameCase, PayloadCase, payloads};
use pulsar_wire::Compression;

fn bench_payload(c: &mut Criterion, name: &str, case: &PayloadCase) {
    let (ours, theirs) = case.compressed_sizes;
    let len = case.data.len();
    eprintln!(
        "{name} {}: {len} B, compressed by pulsar-wire {ours} B ({:.1} %), by pulsar {theirs} B \
         ({:.1} %)",
        case.codec,
        100.0 * ours as f64 / len as f64,
        100.0 * theirs as f64 / len as f64,
    );
    let mut group = c.benchmark_group(format!(
        "compression/{name}/{}",
        case.codec.name().to_lowercase()
    ));
    group.throughput(Throughput::Bytes(len as u64));
    group.bench_function("pulsar_wire_compress", |b| {
        b.iter(|| black_box(case).wire_compress());
    });
    group.bench_function("pulsar_compress", |b| {
        b.iter(|| black_box(case).pulsar_compress());
    });
    group.bench_function("pulsar_wire_decompress", |b| {
        b.iter(|| black_box(case).wire_decompress());
    });
    group.bench_function("pulsar_decompress", |b| {
        b.iter(|| black_box(case).pulsar_decompress());
    });
    group.finish();
}

fn bench_frames(c: &mut Criterion, case: &FrameCase) {
    eprintln!(
        "frame batch100 {}: SEND {} B (pulsar-wire) / {} B (pulsar), MESSAGE {} B / {} B",
        case.codec,
        case.send_sizes.0,
        case.send_sizes.1,
        case.wire_message.len(),
        case.pulsar_message.len()
    );
    let mut group = c.benchmark_group(format!(
        "frame/batch100/{}",
        case.codec.name().to_lowercase()
    ));
    group.throughput(Throughput::Bytes(case.batch_size as u64));
    group.bench_function("pulsar_wire_encode_send", |b| {
        b.iter_batched(
            || case.wire_send_input(),
            |input| case.wire_encode_send(input),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_encode_send", |b| {
        b.iter_batched(
            || case.pulsar_send_input(),
            |input| case.pulsar_encode_send(input),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_wire_decode_message", |b| {
        b.iter_batched(
            || case.wire_message_input(),
            FrameCase::wire_decode_message,
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_decode_message", |b| {
        b.iter_batched(
            || case.pulsar_message_input(),
            FrameCase::pulsar_decode_message,
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    for (name, data) in payloads() {
        for codec in CODECS {
            let case = PayloadCase::new(codec, data.clone()).expect("the payload case");
            bench_payload(c, name, &case);
        }
    }
    for codec in std::iter::once(Compression::None).chain(CODECS) {
        let case = FrameCase::new(codec).expect("the frame case");
        bench_frames(c, &case);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
