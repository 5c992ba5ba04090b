//! The generated case: the batcher's settings, the transport's answers and the operations.

use std::time::Duration;

use ack_batcher::RetryPolicy;
use proptest::collection::vec;
use proptest::prelude::*;

use super::KEYS;

/// How the transport answers one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ItemFault {
    Ok,
    Retryable,
    Terminal,
    Missing,
}

/// How the transport answers one call; call `n` uses plan `n % plans.len()`.
#[derive(Debug, Clone)]
pub(super) struct CallPlan {
    /// Virtual milliseconds the transport sleeps before answering.
    pub(super) delay_ms: u64,
    /// Fail the whole batch, retryably (`true`) or not.
    pub(super) whole: Option<bool>,
    /// Per-item answers, cycled over the batch.
    pub(super) items: Vec<ItemFault>,
    /// Answer only this many items (the rest are missing).
    pub(super) truncate: Option<usize>,
    /// Add one reply too many (unless truncated).
    pub(super) extra: bool,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Submit one item, from the test's task or from a task of its own (which may still be
    /// waiting for room, or not even started, when later operations run).
    Submit {
        key: u8,
        deadline_ms: Option<u64>,
        immediate: bool,
        spawned: bool,
    },
    /// `flush(key)`, awaited or left running.
    Flush { key: u8, wait: bool },
    /// `flush_all()`, awaited or left running.
    FlushAll { wait: bool },
    /// Sleep this many virtual milliseconds.
    Advance(u64),
}

#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) max_items: usize,
    pub(super) max_delay_ms: u64,
    pub(super) margin_ms: u64,
    pub(super) max_in_flight: usize,
    pub(super) max_attempts: u32,
    backoff_ms: u64,
    multiplier: f64,
    pub(super) max_pending: usize,
    pub(super) reject: bool,
    pub(super) plans: Vec<CallPlan>,
    pub(super) ops: Vec<Op>,
    /// The close timeout (or `drop_timeout`, at least 1 ms).
    pub(super) close_ms: u64,
    /// End by dropping the batcher rather than calling `close`.
    pub(super) drop_instead_of_close: bool,
}

impl Case {
    pub(super) fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
            .backoff(Duration::from_millis(self.backoff_ms))
            .multiplier(self.multiplier)
            .max_backoff(Duration::from_millis(self.backoff_ms * 4))
            .max_attempts(self.max_attempts)
    }
}

fn item_fault() -> impl Strategy<Value = ItemFault> {
    prop_oneof![
        6 => Just(ItemFault::Ok),
        2 => Just(ItemFault::Retryable),
        1 => Just(ItemFault::Terminal),
        1 => Just(ItemFault::Missing),
    ]
}

fn call_plan() -> impl Strategy<Value = CallPlan> {
    (
        prop_oneof![3 => Just(0u64), 2 => 1u64..=20],
        proptest::option::weighted(0.15, any::<bool>()),
        vec(item_fault(), 1..4),
        proptest::option::weighted(0.15, 0usize..4),
        proptest::bool::weighted(0.1),
    )
        .prop_map(|(delay_ms, whole, items, truncate, extra)| CallPlan {
            delay_ms,
            whole,
            items,
            truncate,
            extra,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0..KEYS,
            proptest::option::weighted(0.3, 0u64..=60),
            proptest::bool::weighted(0.15),
            proptest::bool::weighted(0.15),
        )
            .prop_map(|(key, deadline_ms, immediate, spawned)| Op::Submit {
                key,
                deadline_ms,
                immediate,
                spawned,
            }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, wait)| Op::Flush { key, wait }),
        1 => any::<bool>().prop_map(|wait| Op::FlushAll { wait }),
        2 => (0u64..=30).prop_map(Op::Advance),
    ]
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    (
        (1usize..=8, 1u64..=40, 0u64..=10, 1usize..=3),
        (1u32..=4, 1u64..=5, prop_oneof![Just(1.0), Just(2.0)]),
        // `None`: plenty of room; `Some(extra)`: `max_pending = max_items + extra`.
        (proptest::option::weighted(0.3, 0usize..=6), any::<bool>()),
        vec(call_plan(), 1..8),
        vec(op(), 0..80),
        (0u64..=60, proptest::bool::weighted(0.2)),
    )
        .prop_map(
            |(
                (max_items, max_delay_ms, margin_ms, max_in_flight),
                (max_attempts, backoff_ms, multiplier),
                (tight, reject),
                plans,
                ops,
                (close_ms, drop_instead_of_close),
            )| Case {
                max_items,
                max_delay_ms,
                margin_ms,
                max_in_flight,
                max_attempts,
                backoff_ms,
                multiplier,
                max_pending: tight.map_or(1024, |extra| max_items + extra),
                reject,
                plans,
                ops,
                close_ms,
                drop_instead_of_close,
            },
        )
}
