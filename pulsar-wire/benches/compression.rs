//! Compression throughput per codec, on a batch of 100 messages of 1 KiB (JSON-like records:
//! repeated field names, varying values, as application payloads tend to be).
//!
//! - `encode`: `encode_batch` of the 100 messages, then `compress` of the batch payload (what
//!   a producer does per batch);
//! - `decode`: `decode_batch` of the compressed batch: decompressing it (with the default
//!   limit of 5 MiB), then splitting it into the 100 messages (what a consumer does per entry).
//!
//! `Throughput::Bytes` = the uncompressed batch payload, so MB/s compare codecs on the same
//! work; the compressed sizes are printed before the run. `none` is the baseline (no codec).
//!
//! ```sh
//! cargo bench -p pulsar-wire --features unstable-wire --bench compression -- --quick
//! ```

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pulsar_wire::pb::{MessageMetadata, SingleMessageMetadata};
use pulsar_wire::wire::{BatchedMessage, decode_batch, encode_batch};
use pulsar_wire::{Compression, compress};

const MESSAGES: usize = 100;
const PAYLOAD_BYTES: usize = 1024;

/// A 1 KiB JSON-like payload; values come from a xorshift generator seeded by `i`.
fn payload(i: usize) -> Bytes {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = String::with_capacity(PAYLOAD_BYTES + 128);
    while out.len() < PAYLOAD_BYTES {
        let n = next();
        out.push_str(&format!(
            "{{\"order_id\": {}, \"customer\": \"cust-{:05}\", \"amount\": {}.{:02}, \"status\": \"{}\"}}, ",
            n % 1_000_000_000,
            (n >> 20) % 50_000,
            (n >> 8) % 10_000,
            n % 100,
            ["new", "paid", "shipped", "returned"][(n >> 40) as usize % 4],
        ));
    }
    out.truncate(PAYLOAD_BYTES);
    Bytes::from(out)
}

fn messages() -> Vec<BatchedMessage> {
    (0..MESSAGES)
        .map(|i| BatchedMessage {
            metadata: SingleMessageMetadata {
                partition_key: Some(format!("key-{}", i % 16)),
                sequence_id: Some(i as u64),
                ..SingleMessageMetadata::default()
            },
            payload: payload(i),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let messages = messages();
    let plain = encode_batch(&messages);
    for codec in Compression::ALL.into_iter().filter(|c| c.is_available()) {
        let compressed = compress(codec, &plain).expect("compresses");
        let metadata = MessageMetadata {
            num_messages_in_batch: Some(MESSAGES as i32),
            compression: (codec != Compression::None)
                .then_some(pulsar_wire::wire::compression_type(codec) as i32),
            uncompressed_size: Some(plain.len() as u32),
            ..MessageMetadata::default()
        };
        let decoded = decode_batch(&metadata, compressed.clone()).expect("decodes");
        assert_eq!(decoded.len(), MESSAGES);
        assert!(
            decoded
                .iter()
                .zip(&messages)
                .all(|(a, b)| a.payload == b.payload)
        );
        eprintln!(
            "{codec}: batch of {MESSAGES} x {PAYLOAD_BYTES} B = {} B, compressed {} B ({:.1}%)",
            plain.len(),
            compressed.len(),
            100.0 * compressed.len() as f64 / plain.len() as f64
        );

        let mut group = c.benchmark_group(format!("compression/{}", codec.name().to_lowercase()));
        group.throughput(Throughput::Bytes(plain.len() as u64));
        group.bench_function("encode", |b| {
            b.iter(|| {
                let data = encode_batch(black_box(&messages));
                compress(codec, &data).expect("compresses")
            });
        });
        group.bench_function("decode", |b| {
            b.iter(|| decode_batch(black_box(&metadata), compressed.clone()).expect("decodes"));
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
