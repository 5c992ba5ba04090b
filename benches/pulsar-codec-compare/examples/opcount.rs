//! Interleaved timing of the codec operations of `benches/compare.rs`, for a machine that other
//! processes keep busy: each round times N frames with every operation in turn (setup and drop
//! outside the timed part, as in the criterion bench), and the medians over the rounds are
//! printed, with each operation's median ratio to the first one's in the same round.
//!
//! ```sh
//! cargo run --release --manifest-path benches/pulsar-codec-compare/Cargo.toml --example opcount \
//!     -- ack1000 200 100 pulsar_wire_encode pulsar_encode backpatch_encode
//! ```
//!
//! Operations: `{pulsar_wire,pulsar}_{encode,decode}` as in the criterion bench, and
//! `backpatch_encode`, a variant of `encode_frame` (below) that lets prost compute the command's
//! length, as it does anyway, and back-patches the size fields: one `encoded_len` walk fewer.
//! It also runs one operation in a loop, for `perf record`:
//! `opcount FRAME ROUNDS N OP` with a single OP.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use prost::Message;
use pulsar::message::Codec;
use pulsar_codec_compare::{SameFrame, same_frames};
use pulsar_wire::{Frame, MAGIC_CRC32C, PulsarCodec};
use tokio_util::codec::{Decoder, Encoder};

// Only some of the frame helpers are used here.
#[allow(dead_code)]
#[path = "../../../pulsar-wire/benches/frames/mod.rs"]
mod frames;

/// `encode_frame` with the size fields written after prost encodes.
fn encode_frame_backpatched(frame: &Frame, dst: &mut BytesMut) {
    let start = dst.len();
    dst.put_u64(0);
    frame.command.encode(dst).unwrap();
    let command_size = dst.len() - start - 8;
    if let Some(payload) = &frame.payload {
        dst.put_u16(MAGIC_CRC32C);
        let checksum_at = dst.len();
        dst.put_u32(0);
        let covered_from = dst.len();
        dst.put_u32(0);
        payload.metadata.encode(dst).unwrap();
        let metadata_size = (dst.len() - covered_from - 4) as u32;
        dst[covered_from..covered_from + 4].copy_from_slice(&metadata_size.to_be_bytes());
        dst.put_slice(&payload.data);
        let crc = crc32c::crc32c(&dst[covered_from..]);
        dst[checksum_at..checksum_at + 4].copy_from_slice(&crc.to_be_bytes());
    }
    let total = (dst.len() - start - 4) as u32;
    dst[start..start + 4].copy_from_slice(&total.to_be_bytes());
    dst[start + 4..start + 8].copy_from_slice(&(command_size as u32).to_be_bytes());
}

/// Times `n` runs of `op` on `frame`; setup and drop are not timed.
fn run(op: &str, frame: &SameFrame, n: usize) -> Duration {
    let len = frame.bytes.len();
    match op {
        "pulsar_wire_encode" => {
            let inputs: Vec<_> = (0..n)
                .map(|_| (frame.wire.clone(), BytesMut::with_capacity(len)))
                .collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|(item, mut dst)| {
                    PulsarCodec::default().encode(item, &mut dst).unwrap();
                    dst
                })
                .collect();
            let elapsed = start.elapsed();
            black_box(outputs);
            elapsed
        }
        "backpatch_encode" => {
            let inputs: Vec<_> = (0..n)
                .map(|_| (frame.wire.clone(), BytesMut::with_capacity(len)))
                .collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|(item, mut dst)| {
                    encode_frame_backpatched(&item, &mut dst);
                    drop(item);
                    dst
                })
                .collect();
            let elapsed = start.elapsed();
            black_box(outputs);
            elapsed
        }
        "pulsar_encode" => {
            let inputs: Vec<_> = (0..n)
                .map(|_| (frame.pulsar.clone(), BytesMut::with_capacity(len)))
                .collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|(item, mut dst)| {
                    Codec.encode(item, &mut dst).unwrap();
                    dst
                })
                .collect();
            let elapsed = start.elapsed();
            black_box(outputs);
            elapsed
        }
        "pulsar_wire_decode" => {
            let inputs: Vec<_> = (0..n).map(|_| BytesMut::from(&frame.bytes[..])).collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|mut src| PulsarCodec::default().decode(&mut src).unwrap().unwrap())
                .collect();
            let elapsed = start.elapsed();
            black_box(outputs);
            elapsed
        }
        "pulsar_decode" => {
            let inputs: Vec<_> = (0..n).map(|_| BytesMut::from(&frame.bytes[..])).collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|mut src| Codec.decode(&mut src).unwrap().unwrap())
                .collect();
            let elapsed = start.elapsed();
            black_box(outputs);
            elapsed
        }
        other => panic!("unknown op {other}"),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: opcount message_batch100|ack1000 ROUNDS N OP...";
    let [_, frame, rounds, n, ops @ ..] = &args[..] else {
        panic!("{usage}");
    };
    assert!(!ops.is_empty(), "{usage}");
    let frame = match frame.as_str() {
        "message_batch100" => frames::message_frame(),
        "ack1000" => frames::ack_frame(),
        other => panic!("unknown frame {other}"),
    };
    let frame = same_frames(frame).unwrap();
    let mut check = BytesMut::new();
    encode_frame_backpatched(&frame.wire, &mut check);
    assert_eq!(
        check[..],
        frame.bytes[..],
        "the back-patched encoding differs"
    );
    let rounds: usize = rounds.parse().unwrap();
    let n: usize = n.parse().unwrap();

    let mut ns = vec![Vec::new(); ops.len()];
    let mut ratios = vec![Vec::new(); ops.len()];
    for _ in 0..rounds {
        let times: Vec<f64> = ops
            .iter()
            .map(|op| run(op, &frame, n).as_nanos() as f64 / n as f64)
            .collect();
        for (i, t) in times.iter().enumerate() {
            ns[i].push(*t);
            ratios[i].push(t / times[0]);
        }
    }
    let bytes = frame.bytes.len() as f64;
    println!(
        "{} bytes per frame, {rounds} rounds of {n} frames per op",
        frame.bytes.len()
    );
    println!(
        "{:<20} {:>12} {:>10} {:>12} {:>16}",
        "op", "median ns", "MB/s", "frames/s", "time / first op"
    );
    for (i, op) in ops.iter().enumerate() {
        let t = median(&mut ns[i]);
        println!(
            "{op:<20} {t:>12.0} {:>10.1} {:>12.0} {:>15.3}x",
            bytes / t * 1e3,
            1e9 / t,
            median(&mut ratios[i])
        );
    }
}
