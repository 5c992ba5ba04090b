//! Encode and decode throughput of pulsar-wire's codec and of the `pulsar` crate's
//! (`pulsar::message::Codec`) on the same frames, in one run:
//!
//! - `message_batch100`: a `MESSAGE` frame carrying a batch of 100 messages of 100 bytes
//!   (properties, key, event time, sequence id each);
//! - `ack1000`: an `ACK` frame with 1,000 message ids, every 4th with an ack set.
//!
//! `suggested_backpatch_encode` and `suggested_slice_decode` measure changes suggested for
//! pulsar-wire's codec (`pulsar_codec_compare::{encode_frame_backpatched, decode_sliced}`), not
//! pulsar-wire's code.
//!
//! One frame per iteration. Both encoders take the frame by value (`Encoder<Item>`), so it is
//! cloned outside the timed part; each encodes into a buffer allocated outside the timed part.
//! Both decoders get a `BytesMut` holding exactly the frame, filled outside the timed part.
//! What the routine returns is dropped outside the timed part.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use pulsar::message::Codec;
use pulsar_codec_compare::{SameFrame, decode_sliced, encode_frame_backpatched, same_frames};
use pulsar_wire::wire::PulsarCodec;
use tokio_util::codec::{Decoder, Encoder};

#[path = "../../benches/frames/mod.rs"]
mod frames;

fn bench_frame(c: &mut Criterion, name: &str, frame: &SameFrame) {
    let len = frame.bytes.len();
    let mut group = c.benchmark_group(format!("compare/{name}"));
    group.throughput(Throughput::Bytes(len as u64));

    group.bench_function("pulsar_wire_encode", |b| {
        b.iter_batched(
            || (frame.wire.clone(), BytesMut::with_capacity(len)),
            |(item, mut dst)| {
                PulsarCodec::default().encode(item, &mut dst).unwrap();
                dst
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_encode", |b| {
        b.iter_batched(
            || (frame.pulsar.clone(), BytesMut::with_capacity(len)),
            |(item, mut dst)| {
                Codec.encode(item, &mut dst).unwrap();
                dst
            },
            BatchSize::SmallInput,
        );
    });
    // Not pulsar-wire's code: the change suggested for its `encode_frame`, measured here.
    group.bench_function("suggested_backpatch_encode", |b| {
        b.iter_batched(
            || (frame.wire.clone(), BytesMut::with_capacity(len)),
            |(item, mut dst)| {
                encode_frame_backpatched(&item, &mut dst);
                drop(item);
                dst
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_wire_decode", |b| {
        b.iter_batched(
            || BytesMut::from(&frame.bytes[..]),
            |mut src| black_box(PulsarCodec::default().decode(&mut src).unwrap().unwrap()),
            BatchSize::SmallInput,
        );
    });
    // Not pulsar-wire's code: the change suggested for its decoder, measured here.
    group.bench_function("suggested_slice_decode", |b| {
        b.iter_batched(
            || BytesMut::from(&frame.bytes[..]),
            |mut src| black_box(decode_sliced(&mut src).unwrap().unwrap()),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("pulsar_decode", |b| {
        b.iter_batched(
            || BytesMut::from(&frame.bytes[..]),
            |mut src| black_box(Codec.decode(&mut src).unwrap().unwrap()),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let message = same_frames(frames::message_frame()).expect("the MESSAGE frame");
    let ack = same_frames(frames::ack_frame()).expect("the ACK frame");
    // The frames are what they claim to be.
    assert_eq!(
        pulsar_wire::wire::decode_batch(
            &message.wire.payload.as_ref().unwrap().metadata,
            message.wire.payload.as_ref().unwrap().data.clone(),
        )
        .unwrap(),
        frames::batch_messages()
    );
    assert_eq!(
        ack.pulsar.command.ack.as_ref().unwrap().message_id.len(),
        frames::ACK_IDS
    );
    assert_eq!(frames::wire_bytes(&ack.wire), ack.bytes);
    eprintln!(
        "frame sizes: message_batch100 {} bytes ({} messages x {} bytes), ack1000 {} bytes",
        message.bytes.len(),
        frames::BATCH_MESSAGES,
        frames::PAYLOAD_BYTES,
        ack.bytes.len()
    );
    bench_frame(c, "message_batch100", &message);
    bench_frame(c, "ack1000", &ack);
}

criterion_group!(benches, bench);
criterion_main!(benches);
