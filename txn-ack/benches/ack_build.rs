//! Cost per ack of building transactional acks and updating the trackers, per batch size.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use txn_ack::{
    AckKind, AckTracker, MessagePosition, PartialBatches, TxnAckTracker, TxnId, txn_ack,
};

const TXN: TxnId = TxnId {
    most_bits: 1,
    least_bits: 2,
};
const SIZES: [i32; 3] = [1, 64, 1000];
/// Entries per iteration, so that small batches still give a measurable iteration.
const MESSAGES_PER_ITERATION: i32 = 4096;

fn batches(size: i32) -> Vec<Vec<MessagePosition>> {
    let entries = (MESSAGES_PER_ITERATION / size).max(1);
    (0..entries)
        .map(|entry| {
            (0..size)
                .map(|i| MessagePosition::in_batch(3, entry as u64, 0, i, size).unwrap())
                .collect()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("ack_build");
    for size in SIZES {
        let batches = batches(size);
        let messages: usize = batches.iter().map(Vec::len).sum();
        group.throughput(Throughput::Elements(messages as u64));
        group.bench_with_input(BenchmarkId::new("txn_ack", size), &batches, |b, batches| {
            b.iter(|| {
                for position in batches.iter().flatten() {
                    black_box(txn_ack(TXN, AckKind::Individual, position).unwrap());
                }
            });
        });
        group.bench_with_input(
            BenchmarkId::new("txn_tracker", size),
            &batches,
            |b, batches| {
                b.iter_batched_ref(
                    || TxnAckTracker::with_capacity(batches.len(), 0),
                    |tracker| {
                        for position in batches.iter().flatten() {
                            black_box(tracker.ack(TXN, AckKind::Individual, position).unwrap());
                        }
                    },
                    criterion::BatchSize::LargeInput,
                );
            },
        );
        group.bench_with_input(
            BenchmarkId::new("ack_tracker", size),
            &batches,
            |b, batches| {
                b.iter_batched_ref(
                    || {
                        AckTracker::with_capacity(
                            PartialBatches::SendAckSet,
                            batches.len(),
                            batches.len(),
                        )
                    },
                    |tracker| {
                        for position in batches.iter().flatten() {
                            black_box(tracker.ack(position).unwrap());
                        }
                    },
                    criterion::BatchSize::LargeInput,
                );
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
