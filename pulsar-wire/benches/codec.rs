//! Encode and decode throughput of the frame codec:
//!
//! - `message_batch100`: a `MESSAGE` frame carrying a batch of 100 messages of 100 bytes
//!   (properties, key, event time, sequence id each);
//! - `ack1000`: an `ACK` frame with 1,000 message ids, every 4th with an ack set.
//!
//! One frame per iteration, `Throughput::Bytes` = the frame's size on the wire (frames/s is
//! 1 / time per iteration; `scripts/bench-pulsar-codec.sh` prints both).
//!
//! - `encode`: `Encoder::encode` of an owned frame (cloned outside the timed part) into a
//!   buffer allocated outside the timed part, as a `Framed` sink does;
//! - `encode_ref`: `encode_frame(&frame)` into a reused buffer (no clone, no drop);
//! - `encode_with_batch` (MESSAGE): `encode_batch` of the 100 messages, then the frame;
//! - `decode`: `Decoder::decode` of a `BytesMut` holding the frame (filled outside the timed
//!   part);
//! - `decode_with_batch` (MESSAGE): the same, then `decode_batch` into the 100 messages.
//!
//! The same frames, compared with the `pulsar` crate's codec: `pulsar-wire/codec-compare`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pulsar_wire::wire::{Frame, PulsarCodec, decode_batch, encode_batch, encode_frame};
use tokio_util::codec::{Decoder, Encoder};

mod frames;

fn bench_frame(c: &mut Criterion, name: &str, frame: &Frame, with_batch: bool) {
    let bytes = frames::wire_bytes(frame);
    let len = bytes.len();
    let mut group = c.benchmark_group(format!("codec/{name}"));
    group.throughput(Throughput::Bytes(len as u64));

    group.bench_function("encode", |b| {
        b.iter_batched(
            || (frame.clone(), BytesMut::with_capacity(len)),
            |(item, mut dst)| {
                PulsarCodec::default().encode(item, &mut dst).unwrap();
                dst
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("encode_ref", |b| {
        let mut dst = BytesMut::with_capacity(len);
        b.iter(|| {
            dst.clear();
            encode_frame(black_box(frame), &mut dst);
            black_box(dst.len())
        });
    });
    if with_batch {
        let messages = frames::batch_messages();
        let command = frames::message_command();
        let metadata = frames::batch_metadata();
        group.bench_function("encode_with_batch", |b| {
            b.iter_batched(
                || (metadata.clone(), BytesMut::with_capacity(len)),
                |(metadata, mut dst)| {
                    let data = encode_batch(black_box(&messages));
                    let item = Frame::with_payload(command.clone(), metadata, data);
                    PulsarCodec::default().encode(item, &mut dst).unwrap();
                    dst
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.bench_function("decode", |b| {
        b.iter_batched(
            || BytesMut::from(&bytes[..]),
            |mut src| black_box(PulsarCodec::default().decode(&mut src).unwrap().unwrap()),
            BatchSize::SmallInput,
        );
    });
    if with_batch {
        group.bench_function("decode_with_batch", |b| {
            b.iter_batched(
                || BytesMut::from(&bytes[..]),
                |mut src| {
                    let frame = PulsarCodec::default().decode(&mut src).unwrap().unwrap();
                    let payload = frame.payload.unwrap();
                    let messages = decode_batch(&payload.metadata, payload.data).unwrap();
                    assert_eq!(messages.len(), frames::BATCH_MESSAGES);
                    messages
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    let message = frames::message_frame();
    let ack = frames::ack_frame();
    eprintln!(
        "frame sizes: message_batch100 {} bytes ({} messages x {} bytes), ack1000 {} bytes ({} ids)",
        frames::wire_bytes(&message).len(),
        frames::BATCH_MESSAGES,
        frames::PAYLOAD_BYTES,
        frames::wire_bytes(&ack).len(),
        frames::ACK_IDS,
    );
    bench_frame(c, "message_batch100", &message, true);
    bench_frame(c, "ack1000", &ack, false);
}

criterion_group!(benches, bench);
criterion_main!(benches);
