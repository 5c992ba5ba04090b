//! Submit-to-result throughput of `ack-batcher` against a bare channel floor.
//!
//! One criterion group, `submit_to_result`, with one element per item so that criterion
//! prints elements/s:
//!
//! - `floor`: a bounded `tokio::sync::mpsc` channel (capacity 1,024) plus one
//!   `tokio::sync::oneshot` per item. The producer sends `(item, oneshot::Sender)` for every
//!   item, a consumer task answers each oneshot, then the producer awaits every receiver.
//! - `batcher_1_key`: [`Batcher::try_enqueue`] for every item under one key, then every
//!   [`Ticket`] is awaited. The transport answers `Ok(())` for every item at once, batches
//!   hold `max_items = 1,024` and `max_delay` is an hour, so every batch flushes on size.
//! - `batcher_1000_keys`: the same with 1,000 `u32` keys, items spread round-robin, and
//!   1,024,000 items per iteration so that each key fills exactly one batch of 1,024.
//!
//! Everything runs on one multi-thread Tokio runtime with 2 worker threads. The timed loop
//! itself is spawned onto that runtime, so that producer, consumer and flushing tasks all
//! share its 2 workers. The channel, its consumer task and each batcher are built once per
//! benchmark, outside the timed part; the batchers are checked (every batch flushed on
//! size) and closed at the end.
//!
//! Run it with `cargo bench -p ack-batcher --bench throughput`, or with
//! `scripts/bench-ack-batcher.sh`, which also prints the ns/item medians and their ratios to
//! the floor.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ack_batcher::{Batcher, Flush, FlushReason, FlushResult, ItemOptions, ItemReply, Retryable};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

/// The group name; criterion writes `target/criterion/submit_to_result/<bench>/...`.
const GROUP: &str = "submit_to_result";
/// Items per batch, and the floor channel's capacity.
const BATCH: usize = 1024;
/// Items per iteration of `floor` and `batcher_1_key`.
const ITEMS_1_KEY: usize = 64 * BATCH;
/// Keys of `batcher_1000_keys`.
const KEYS: usize = 1000;
/// Items per iteration of `batcher_1000_keys`: one full batch per key.
const ITEMS_1000_KEYS: usize = KEYS * BATCH;

/// The transport's error; the no-op transport never returns it.
#[derive(Debug, Clone)]
struct Never;

impl Retryable for Never {
    fn is_retryable(&self) -> bool {
        false
    }
}

/// A transport that answers `Ok(())` for every item at once.
struct Noop;

impl Flush<u32, u64> for Noop {
    type Output = ();
    type Error = Never;

    async fn flush(&self, _key: &u32, items: &[u64]) -> FlushResult<(), Never> {
        Ok(vec![ItemReply::Ok(()); items.len()])
    }
}

type NoopBatcher = Batcher<u32, u64, Noop>;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs `task` (the timed loop of one sample) as a task on `rt`, so that it shares the
/// runtime's worker threads with the tasks it talks to, and returns what it measured.
fn run_on(rt: &Runtime, task: impl Future<Output = Duration> + Send + 'static) -> Duration {
    rt.block_on(async { tokio::spawn(task).await.expect("benchmark task panicked") })
}

/// One `floor` iteration: send `n` items with their oneshot senders, then await every
/// receiver.
async fn floor_iteration(
    tx: &mpsc::Sender<(u64, oneshot::Sender<()>)>,
    receivers: &mut Vec<oneshot::Receiver<()>>,
    n: usize,
) {
    for item in 0..n as u64 {
        let (reply, receiver) = oneshot::channel();
        tx.send((item, reply)).await.expect("consumer alive");
        receivers.push(receiver);
    }
    for receiver in receivers.drain(..) {
        receiver.await.expect("answered");
    }
}

/// One batcher iteration: enqueue `n` items round-robin over `keys` keys, then await every
/// ticket.
async fn batcher_iteration(
    batcher: &NoopBatcher,
    tickets: &mut Vec<ack_batcher::Ticket<(), Never>>,
    keys: usize,
    n: usize,
) {
    for item in 0..n {
        let key = (item % keys) as u32;
        let ticket = batcher
            .try_enqueue(key, item as u64, ItemOptions::new())
            .expect("max_pending leaves room for every item");
        tickets.push(ticket);
    }
    for ticket in tickets.drain(..) {
        ticket
            .await
            .expect("the no-op transport accepts every item");
    }
}

fn build_batcher(rt: &Runtime, n: usize) -> NoopBatcher {
    let _entered = rt.enter();
    Batcher::builder()
        .max_items(BATCH)
        .max_delay(Duration::from_secs(3600))
        // Twice the items of an iteration: a batch's room is given back just after its
        // items resolve, so the next iteration may start before the last batch finished.
        .max_pending(2 * n)
        .build(Noop)
        .expect("valid settings")
}

/// Runs one untimed iteration and checks that every batch flushed on size.
fn check_flushes_on_size(rt: &Runtime, batcher: &NoopBatcher, keys: usize, n: usize) {
    let before = batcher.stats();
    let warm_up = batcher.clone();
    run_on(rt, async move {
        let mut tickets = Vec::with_capacity(n);
        batcher_iteration(&warm_up, &mut tickets, keys, n).await;
        Duration::ZERO
    });
    let after = batcher.stats();
    let size = after.batches(FlushReason::Size) - before.batches(FlushReason::Size);
    let total = after.total_batches() - before.total_batches();
    assert_eq!(size, (n / BATCH) as u64, "every batch flushes on size");
    assert_eq!(total, size, "no batch flushed for another reason");
}

/// Closes the batcher and checks that the benchmark left nothing behind and that every
/// batch of the whole run flushed on size.
fn close(rt: &Runtime, batcher: NoopBatcher) {
    let stats = batcher.stats();
    assert_eq!(
        stats.total_batches(),
        stats.batches(FlushReason::Size),
        "every batch of the run flushed on size"
    );
    assert_eq!(
        stats.items_succeeded,
        stats.batches(FlushReason::Size) * BATCH as u64,
        "every item of every batch succeeded"
    );
    let report = rt.block_on(batcher.close(Duration::from_secs(10)));
    assert_eq!(report.pending_at_close, 0, "nothing was pending at close");
    assert!(!report.timed_out);
}

fn bench_batcher(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    name: &str,
    keys: usize,
    n: usize,
) {
    let batcher = build_batcher(rt, n);
    check_flushes_on_size(rt, &batcher, keys, n);
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let batcher = batcher.clone();
            run_on(rt, async move {
                let mut tickets = Vec::with_capacity(n);
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    batcher_iteration(&batcher, &mut tickets, keys, n).await;
                    total += start.elapsed();
                }
                total
            })
        });
    });
    close(rt, batcher);
}

fn throughput(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group(GROUP);
    group.sampling_mode(SamplingMode::Flat);

    // floor: the channel and its consumer live for the whole benchmark.
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(ITEMS_1_KEY as u64));
    let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<()>)>(BATCH);
    let consumer = rt.spawn(async move {
        while let Some((item, reply)) = rx.recv().await {
            black_box(item);
            let _ = reply.send(());
        }
    });
    group.bench_function("floor", |b| {
        b.iter_custom(|iters| {
            let tx = tx.clone();
            run_on(&rt, async move {
                let mut receivers = Vec::with_capacity(ITEMS_1_KEY);
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    floor_iteration(&tx, &mut receivers, ITEMS_1_KEY).await;
                    total += start.elapsed();
                }
                total
            })
        });
    });
    drop(tx);
    rt.block_on(consumer).expect("consumer task");

    bench_batcher(&mut group, &rt, "batcher_1_key", 1, ITEMS_1_KEY);

    // About a quarter of a second or more per iteration: fewer samples.
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    bench_batcher(&mut group, &rt, "batcher_1000_keys", KEYS, ITEMS_1000_KEYS);

    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
