//! Interleaved timing of the compression comparison (`benches/compression.rs`), for a machine
//! that other processes keep busy: for each payload, codec and operation, every round times a
//! run of pulsar-wire's operation and a run of `pulsar`'s, back to back (in alternating order),
//! and the per-round ratio is kept. Printed: median MB/s of each side and the median and
//! quartiles of the ratio pulsar-wire throughput / `pulsar` throughput. Load that comes and goes
//! hits both sides of a round alike, which criterion's one-bench-after-the-other cannot ensure.
//!
//! ```sh
//! cargo run --release --manifest-path pulsar-wire/codec-compare/Cargo.toml \
//!     --example compression_rounds -- [ROUNDS (100)] [MS PER RUN (3)] [FILTER]
//! ```
//!
//! FILTER keeps the lines whose label contains it (e.g. `ZSTD`, `json_1k`, `frame`). The
//! operations and their inputs are those of the criterion bench, timed as there: a payload
//! operation's output is dropped in the timed part (`iter`), a frame operation's input is made
//! and its output dropped outside it (`iter_batched`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use pulsar_codec_compare::compression::{CODECS, FrameCase, PayloadCase, payloads};
use pulsar_wire::Compression;

/// Times `n` runs of an operation.
type Timed<'a> = Box<dyn FnMut(usize) -> Duration + 'a>;

/// As criterion's `iter`: what `op` returns is dropped in the timed part.
fn repeat<T>(mut op: impl FnMut() -> T) -> impl FnMut(usize) -> Duration {
    move |n| {
        let start = Instant::now();
        for _ in 0..n {
            black_box(op());
        }
        start.elapsed()
    }
}

/// As criterion's `iter_batched`: inputs are made, and outputs dropped, outside the timed part.
fn repeat_with_input<I, T>(
    mut input: impl FnMut() -> I,
    mut op: impl FnMut(I) -> T,
) -> impl FnMut(usize) -> Duration {
    move |n| {
        let inputs: Vec<I> = (0..n).map(|_| input()).collect();
        let mut out = Vec::with_capacity(n);
        let start = Instant::now();
        for i in inputs {
            out.push(black_box(op(black_box(i))));
        }
        let elapsed = start.elapsed();
        drop(out);
        elapsed
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs `rounds` rounds of both operations, each run about `run` long; prints one line.
fn compare(
    label: &str,
    bytes: usize,
    mut ours: Timed<'_>,
    mut theirs: Timed<'_>,
    rounds: usize,
    run: Duration,
) {
    // Calibrate: runs per round so that the slower side takes about `run`.
    let per_op = |op: &mut Timed<'_>| {
        let mut n = 1;
        loop {
            let t = op(n);
            if t >= Duration::from_millis(1) || n >= 1 << 20 {
                return t / n as u32;
            }
            n *= 2;
        }
    };
    let slower = per_op(&mut ours)
        .max(per_op(&mut theirs))
        .max(Duration::from_nanos(1));
    let n = ((run.as_nanos() / slower.as_nanos()) as usize).max(1);
    let (mut ours_ns, mut theirs_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = ours(n);
            (a, theirs(n))
        } else {
            let b = theirs(n);
            (ours(n), b)
        };
        let (a, b) = (
            a.as_nanos() as f64 / n as f64,
            b.as_nanos() as f64 / n as f64,
        );
        ours_ns.push(a);
        theirs_ns.push(b);
        ratios.push(b / a);
    }
    for v in [&mut ours_ns, &mut theirs_ns, &mut ratios] {
        v.sort_by(f64::total_cmp);
    }
    let mbps = |ns: f64| bytes as f64 / ns * 1e3;
    println!(
        "{label:<26} {:>10.1} {:>10.1} {:>7.2}x  [{:.2}-{:.2}]",
        mbps(quantile(&ours_ns, 0.5)),
        mbps(quantile(&theirs_ns, 0.5)),
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75),
    );
}

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(about = "Interleaved timing of the compression comparison (benches/compression.rs)")]
struct Args {
    /// How many rounds.
    #[arg(default_value_t = 100)]
    rounds: usize,
    /// About how long each run of an operation takes, in milliseconds.
    #[arg(default_value_t = 3)]
    ms_per_run: u64,
    /// Keep the lines whose label contains this (e.g. `ZSTD`, `json_1k`, `frame`).
    #[arg(default_value = "")]
    filter: String,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let rounds = args.rounds;
    let run = Duration::from_millis(args.ms_per_run);
    let filter = args.filter;
    println!(
        "{rounds} rounds, about {} ms per run; MB/s = 10^6 bytes/s of uncompressed payload; \
         ratio = pulsar-wire throughput / pulsar throughput, median [quartiles] of the rounds",
        run.as_millis()
    );
    println!(
        "{:<26} {:>10} {:>10} {:>8}",
        "payload codec op", "wire MB/s", "pulsar", "ratio"
    );
    for (name, data) in payloads() {
        for codec in CODECS {
            let case = PayloadCase::new(codec, data.clone()).expect("the payload case");
            let len = data.len();
            for op in ["compress", "decompress"] {
                let label = format!("{name} {codec} {op}");
                if !label.contains(&filter) {
                    continue;
                }
                let (ours, theirs): (Timed<'_>, Timed<'_>) = if op == "compress" {
                    (
                        Box::new(repeat(|| case.wire_compress())),
                        Box::new(repeat(|| case.pulsar_compress())),
                    )
                } else {
                    (
                        Box::new(repeat(|| case.wire_decompress())),
                        Box::new(repeat(|| case.pulsar_decompress())),
                    )
                };
                compare(&label, len, ours, theirs, rounds, run);
            }
        }
    }
    for codec in std::iter::once(Compression::None).chain(CODECS) {
        let case = FrameCase::new(codec).expect("the frame case");
        for op in ["encode SEND", "decode MESSAGE"] {
            let label = format!("frame {codec} {op}");
            if !label.contains(&filter) {
                continue;
            }
            let (ours, theirs): (Timed<'_>, Timed<'_>) = if op == "encode SEND" {
                (
                    Box::new(repeat_with_input(
                        || case.wire_send_input(),
                        |i| case.wire_encode_send(i),
                    )),
                    Box::new(repeat_with_input(
                        || case.pulsar_send_input(),
                        |i| case.pulsar_encode_send(i),
                    )),
                )
            } else {
                (
                    Box::new(repeat_with_input(
                        || case.wire_message_input(),
                        FrameCase::wire_decode_message,
                    )),
                    Box::new(repeat_with_input(
                        || case.pulsar_message_input(),
                        FrameCase::pulsar_decode_message,
                    )),
                )
            };
            compare(&label, case.batch_size, ours, theirs, rounds, run);
        }
    }
}
