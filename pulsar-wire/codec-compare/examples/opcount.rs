//! Interleaved timing of the codec operations of `benches/compare.rs`, for a machine that other
//! processes keep busy: each round times N frames with every operation in turn (setup and drop
//! outside the timed part, as in the criterion bench), and the medians over the rounds are
//! printed, with each operation's median ratio to the first one's in the same round.
//!
//! ```sh
//! cargo run --release --manifest-path pulsar-wire/codec-compare/Cargo.toml --example opcount \
//!     -- ack1000 200 100 pulsar_wire_encode pulsar_encode backpatch_encode
//! ```
//!
//! Operations: `{pulsar_wire,pulsar}_{encode,decode}` as in the criterion bench, and
//! `backpatch_encode`, the library's `encode_frame_backpatched` (a variant of `encode_frame` that
//! lets prost compute the command's length, as it does anyway, and back-patches the size
//! fields: one `encoded_len` walk fewer), and `slice_decode`, the library's `decode_sliced`
//! (prost decodes from `&[u8]` slices of the frame instead of `Bytes` handles).
//! It also runs one operation in a loop, for `perf record`:
//! `opcount FRAME ROUNDS N OP` with a single OP.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pulsar::message::Codec;
use pulsar_codec_compare::{SameFrame, decode_sliced, encode_frame_backpatched, same_frames};
use pulsar_wire::wire::PulsarCodec;
use tokio_util::codec::{Decoder, Encoder};

// Only some of the frame helpers are used here.
#[allow(dead_code)]
#[path = "../../benches/frames/mod.rs"]
mod frames;

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
        "slice_decode" => {
            let inputs: Vec<_> = (0..n).map(|_| BytesMut::from(&frame.bytes[..])).collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|mut src| decode_sliced(&mut src).unwrap().unwrap())
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
    quantile(values, 0.5)
}

fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

/// The frame every operation works on.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
enum Frame {
    /// A MESSAGE frame carrying a batch of 100.
    MessageBatch100,
    /// An ACK frame of 1,000 message ids.
    Ack1000,
}

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(about = "Interleaved timing of the codec operations of benches/compare.rs")]
struct Args {
    /// The frame.
    #[arg(value_enum)]
    frame: Frame,
    /// How many rounds.
    rounds: usize,
    /// How many frames each operation handles per round.
    n: usize,
    /// The operations, in turn each round; ratios are to the first one.
    #[arg(required = true, num_args = 1..)]
    ops: Vec<String>,
}

fn main() {
    let Args {
        frame,
        rounds,
        n,
        ops,
    } = <Args as clap::Parser>::parse();
    let frame = match frame {
        Frame::MessageBatch100 => frames::message_frame(),
        Frame::Ack1000 => frames::ack_frame(),
    };
    let frame = same_frames(frame).unwrap();
    let mut check = BytesMut::new();
    encode_frame_backpatched(&frame.wire, &mut check);
    assert_eq!(
        check[..],
        frame.bytes[..],
        "the back-patched encoding differs"
    );

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
        "{:<20} {:>12} {:>10} {:>12} {:>16} {:>18}",
        "op", "median ns", "MB/s", "frames/s", "time / first op", "(quartiles)"
    );
    for (i, op) in ops.iter().enumerate() {
        let t = median(&mut ns[i]);
        let (q1, q3) = (
            quantile(&mut ratios[i], 0.25),
            quantile(&mut ratios[i], 0.75),
        );
        println!(
            "{op:<20} {t:>12.0} {:>10.1} {:>12.0} {:>15.3}x {:>8.3}x..{:.3}x",
            bytes / t * 1e3,
            1e9 / t,
            median(&mut ratios[i]),
            q1,
            q3
        );
    }
}
