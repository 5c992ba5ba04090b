//! Building acks and updating the trackers for batches of up to 64 messages does not allocate.
//!
//! The integration binary's global allocator counts the allocations of the current thread while
//! counting is switched on, so tests running in parallel on other threads do not interfere.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use txn_ack::{
    AckKind, AckTracker, MessagePosition, PartialBatches, TxnAckTracker, TxnId, txn_ack,
};

/// The system allocator, counting this thread's allocations while [`count_allocations`] runs.
pub(crate) struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are plain
// thread-local cells with const initialisers, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note_allocation() {
    // `try_with` fails only while the thread is being torn down; nothing is counted then.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

/// Runs `f` and returns how many allocations this thread made meanwhile.
fn count_allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

const TXN: TxnId = TxnId {
    most_bits: 1,
    least_bits: 2,
};

#[test]
fn the_counter_sees_allocations() {
    let n = count_allocations(|| {
        std::hint::black_box(vec![1u8; 10]);
    });
    assert_eq!(n, 1, "a check that cannot fail is no check");
}

#[test]
fn building_transactional_acks_does_not_allocate() {
    for size in [1, 2, 63, 64] {
        let positions: Vec<_> = (0..size)
            .map(|i| MessagePosition::in_batch(5, 6, 0, i, size).unwrap())
            .collect();
        let n = count_allocations(|| {
            for position in &positions {
                let ack = txn_ack(TXN, AckKind::Individual, position).unwrap();
                std::hint::black_box(ack.id.wire_ack_set().sum::<i64>());
                std::hint::black_box(txn_ack(TXN, AckKind::Cumulative, position).unwrap());
            }
        });
        assert_eq!(n, 0, "batch of {size}");
    }
}

#[test]
fn updating_the_trackers_does_not_allocate() {
    let entries = 32;
    let mut ordinary = AckTracker::with_capacity(PartialBatches::SendAckSet, entries, 256);
    let mut held = AckTracker::with_capacity(PartialBatches::HoldUntilComplete, entries, 256);
    let mut txns = TxnAckTracker::with_capacity(entries, 256);
    let positions: Vec<Vec<MessagePosition>> = (0..entries as u64)
        .map(|entry| {
            let size = 1 + (entry % 64) as i32;
            (0..size)
                .map(|i| MessagePosition::in_batch(9, entry, 0, i, size).unwrap())
                .collect()
        })
        .collect();
    let n = count_allocations(|| {
        // Interleave the entries so that several batches are partial at once.
        for i in 0..64 {
            for batch in &positions {
                if let Some(position) = batch.get(i) {
                    std::hint::black_box(ordinary.ack(position).unwrap());
                    std::hint::black_box(held.ack(position).unwrap());
                    std::hint::black_box(txns.ack(TXN, AckKind::Individual, position).unwrap());
                }
            }
        }
        txns.commit(TXN);
    });
    assert_eq!(n, 0);
    assert_eq!(ordinary.partial_entries(), 0);
    assert_eq!(txns.entries(), 0);
}
