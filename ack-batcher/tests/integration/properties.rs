//! The property test: a fault-injecting transport under random operations, on virtual time.
//!
//! Every case builds a paused current-thread runtime, a batcher with random (small) settings
//! and a transport that fails items (retryably or terminally), fails whole batches, answers
//! with too few or too many replies and sleeps inside `flush`. It then runs a random sequence
//! of submits (some with deadlines, some immediate, some from tasks of their own), `flush(key)`,
//! `flush_all` (awaited or left running) and sleeps, and finally `close` with a random timeout,
//! which is sometimes shorter than the transport's delays so that items are abandoned. One case
//! in five drops the batcher instead, which closes it in the background within `drop_timeout`.
//!
//! Everything that happens is written to one event log: the test's own submits, the
//! observer's `before_flush` / `after_flush` / `on_abandoned`, and the transport's calls and
//! returns. [`check_log`] then checks the log against the items' outcomes:
//!
//! - every accepted item resolves exactly once, to the outcome its last reply implies;
//! - no batch is empty, exceeds `max_items` or mixes keys;
//! - first attempts of a key's non-immediate items keep their submission order within a batch,
//!   and across the key's batches (in transport call order) when `max_in_flight_per_key` is 1,
//!   the only case the batcher promises it for;
//! - the transport's calls, their answers and the observer's views agree one to one, and
//!   retries are decided by the retry policy and wait for its backoff.
//!
//! The run itself checks, after every operation, that the batcher's `pending` gauge equals the
//! number of unresolved tickets (and stays within `max_pending`), that an awaited flush
//! returns only once its key's items were answered, and after `close` that every ticket is
//! already resolved (polled once, no waiting), that `stats().pending` is 0, that the close
//! report and the counters add up, and that a closed batcher hands items back.
//!
//! Cases run in about 2 ms each. The tests at the end show that the checker catches what it
//! should, and pin down, ignored, the bugs found while writing it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ack_batcher::{
    Backpressure, BatchInfo, Batcher, Error, Flush, FlushReason, FlushResult, ItemOptions,
    ItemReply, ItemView, Next, Observer, RetryPolicy, Retryable, Stats, Ticket,
};
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::time::Instant;

/// Keys are `0..KEYS`.
const KEYS: u8 = 3;

/// An item id: the number of the submit operation with the key in the low byte.
fn item_id(seq: u64, key: u8) -> u64 {
    (seq << 8) | u64::from(key)
}

fn key_of(id: u64) -> u8 {
    (id & 0xff) as u8
}

/// What a successful item resolves to: its own id and the attempt the transport saw.
type Out = (u64, u32);

/// A transport failure; `call` is the index of the flush call that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    retryable: bool,
    call: usize,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable {
            "retryable"
        } else {
            "terminal"
        };
        write!(f, "{kind} fault in call {}", self.call)
    }
}

impl std::error::Error for Fault {}

impl Retryable for Fault {
    fn is_retryable(&self) -> bool {
        self.retryable
    }
}

// ---------------------------------------------------------------------------------------------
// The generated case.

/// How the transport answers one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemFault {
    Ok,
    Retryable,
    Terminal,
    Missing,
}

/// How the transport answers one call; call `n` uses plan `n % plans.len()`.
#[derive(Debug, Clone)]
struct CallPlan {
    /// Virtual milliseconds the transport sleeps before answering.
    delay_ms: u64,
    /// Fail the whole batch, retryably (`true`) or not.
    whole: Option<bool>,
    /// Per-item answers, cycled over the batch.
    items: Vec<ItemFault>,
    /// Answer only this many items (the rest are missing).
    truncate: Option<usize>,
    /// Add one reply too many (unless truncated).
    extra: bool,
}

#[derive(Debug, Clone)]
enum Op {
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
struct Case {
    max_items: usize,
    max_delay_ms: u64,
    margin_ms: u64,
    max_in_flight: usize,
    max_attempts: u32,
    backoff_ms: u64,
    multiplier: f64,
    max_pending: usize,
    reject: bool,
    plans: Vec<CallPlan>,
    ops: Vec<Op>,
    /// The close timeout (or `drop_timeout`, at least 1 ms).
    close_ms: u64,
    /// End by dropping the batcher rather than calling `close`.
    drop_instead_of_close: bool,
}

impl Case {
    fn retry_policy(&self) -> RetryPolicy {
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

fn case() -> impl Strategy<Value = Case> {
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

// ---------------------------------------------------------------------------------------------
// The event log.

/// The observer's view of one item after a flush.
#[derive(Debug, Clone, PartialEq)]
struct View {
    id: u64,
    reply: ItemReply<Out, Fault>,
    attempt: u32,
    next: Next,
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// The test's submit was accepted.
    Submit {
        id: u64,
        immediate: bool,
        deadline: Option<Instant>,
    },
    /// `Observer::before_flush`.
    Before {
        batch: u64,
        reason: FlushReason,
        key: u8,
        items: Vec<u64>,
        at: Instant,
    },
    /// The transport's `flush` was called; `attempts` counts how often it saw each item.
    Call {
        call: usize,
        key: u8,
        items: Vec<u64>,
        attempts: Vec<u32>,
    },
    /// The transport's `flush` returned.
    Return {
        call: usize,
        result: FlushResult<Out, Fault>,
    },
    /// `Observer::after_flush`, with the virtual time it was called at.
    After {
        batch: u64,
        key: u8,
        at: Instant,
        views: Vec<View>,
    },
    /// `Observer::on_abandoned`.
    Abandoned { key: u8, count: usize },
    /// The test is about to call `close`.
    CloseStart,
}

#[derive(Debug, Default)]
struct Log {
    events: Vec<Event>,
    calls: usize,
    seen: HashMap<u64, u32>,
    /// Problems noticed inside the observer (which must not panic: a panicking flushing task
    /// would leave its items pending forever).
    violations: Vec<String>,
}

type SharedLog = Arc<Mutex<Log>>;

fn lock(log: &SharedLog) -> MutexGuard<'_, Log> {
    log.lock().expect("log lock poisoned")
}

struct Transport {
    log: SharedLog,
    plans: Vec<CallPlan>,
}

impl Flush<u8, u64> for Transport {
    type Output = Out;
    type Error = Fault;

    async fn flush(&self, key: &u8, items: &[u64]) -> FlushResult<Out, Fault> {
        let (call, delay, result) = {
            let mut log = lock(&self.log);
            let call = log.calls;
            log.calls += 1;
            let attempts: Vec<u32> = items
                .iter()
                .map(|id| {
                    let seen = log.seen.entry(*id).or_insert(0);
                    *seen += 1;
                    *seen
                })
                .collect();
            let plan = &self.plans[call % self.plans.len()];
            let result = match plan.whole {
                Some(retryable) => Err(Fault { retryable, call }),
                None => {
                    let mut replies: Vec<_> = items
                        .iter()
                        .zip(&attempts)
                        .enumerate()
                        .map(|(pos, (id, attempt))| {
                            let fault = Fault {
                                retryable: true,
                                call,
                            };
                            match plan.items[pos % plan.items.len()] {
                                ItemFault::Ok => ItemReply::Ok((*id, *attempt)),
                                ItemFault::Retryable => ItemReply::Err(fault),
                                ItemFault::Terminal => ItemReply::Err(Fault {
                                    retryable: false,
                                    ..fault
                                }),
                                ItemFault::Missing => ItemReply::Missing,
                            }
                        })
                        .collect();
                    match plan.truncate {
                        Some(len) => replies.truncate(len),
                        None if plan.extra => replies.push(ItemReply::Ok((u64::MAX, 0))),
                        None => {}
                    }
                    Ok(replies)
                }
            };
            log.events.push(Event::Call {
                call,
                key: *key,
                items: items.to_vec(),
                attempts,
            });
            (call, plan.delay_ms, result)
        };
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        lock(&self.log).events.push(Event::Return {
            call,
            result: result.clone(),
        });
        result
    }
}

struct Recorder {
    log: SharedLog,
}

impl Observer<u8, u64, Out, Fault> for Recorder {
    fn before_flush(&self, key: &u8, batch: &BatchInfo, items: &[u64]) {
        let mut log = lock(&self.log);
        if batch.len != items.len() {
            let problem = format!("before_flush: {batch:?} with {} items", items.len());
            log.violations.push(problem);
        }
        log.events.push(Event::Before {
            batch: batch.id,
            reason: batch.reason,
            key: *key,
            items: items.to_vec(),
            at: Instant::now(),
        });
    }

    fn after_flush(&self, key: &u8, batch: &BatchInfo, items: &[ItemView<'_, u64, Out, Fault>]) {
        let views = items
            .iter()
            .map(|view| View {
                id: *view.item,
                reply: view.reply.clone(),
                attempt: view.attempt,
                next: view.next,
            })
            .collect();
        let mut log = lock(&self.log);
        if batch.len != items.len() {
            let problem = format!("after_flush: {batch:?} with {} items", items.len());
            log.violations.push(problem);
        }
        log.events.push(Event::After {
            batch: batch.id,
            key: *key,
            at: Instant::now(),
            views,
        });
    }

    fn on_abandoned(&self, key: &u8, count: usize) {
        lock(&self.log)
            .events
            .push(Event::Abandoned { key: *key, count });
    }
}

// ---------------------------------------------------------------------------------------------
// The checker.

/// An item's outcome as its ticket delivered it.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok(Out),
    Failed { source: Fault, attempts: u32 },
    Missing { attempts: u32 },
    Abandoned,
}

impl Outcome {
    fn from_result(result: Result<Out, Error<Fault>>) -> Result<Self, String> {
        Ok(match result {
            Ok(out) => Self::Ok(out),
            Err(Error::Failed { source, attempts }) => Self::Failed { source, attempts },
            Err(Error::Missing { attempts }) => Self::Missing { attempts },
            Err(Error::Abandoned) => Self::Abandoned,
            Err(other) => return Err(format!("a ticket resolved to {other:?}")),
        })
    }
}

/// What the checker needs to know of the settings.
struct Limits {
    max_items: usize,
    max_attempts: u32,
    retry: RetryPolicy,
    /// Whether a key's batches must reach the transport in submission order: the batcher
    /// promises it only with `max_in_flight_per_key(1)`; otherwise only within a batch.
    ordered_across_batches: bool,
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// An accepted item, as the checker knows it.
struct Submitted {
    /// Its place in the order items were accepted.
    order: usize,
    immediate: bool,
    deadline: Option<Instant>,
}

/// The views an item got, in order, with the time of each.
type ViewsById = HashMap<u64, Vec<(Instant, View)>>;

/// Checks the event log of a finished (closed) run against the tickets' outcomes.
fn check_log(
    events: &[Event],
    outcomes: &HashMap<u64, Outcome>,
    limits: &Limits,
) -> Result<(), String> {
    let mut submitted: HashMap<u64, Submitted> = HashMap::new();
    let mut closing = false;
    // Attempts of each item as the observer saw them start.
    let mut started: HashMap<u64, u32> = HashMap::new();
    let mut views: ViewsById = HashMap::new();
    // Calls without a return yet: index -> (key, items, attempts).
    let mut open_calls: HashMap<usize, (u8, Vec<u64>, Vec<u32>)> = HashMap::new();
    // Batches announced by `before_flush` whose transport call never started.
    let mut uncalled: Vec<Vec<u64>> = Vec::new();
    // The last first-attempt, non-immediate item each key sent (in its current batch only,
    // unless batches are ordered too).
    let mut last_sent: HashMap<u8, u64> = HashMap::new();
    let mut abandoned_reported: HashMap<u8, usize> = HashMap::new();

    for (index, event) in events.iter().enumerate() {
        let previous = index.checked_sub(1).map(|i| &events[i]);
        match event {
            Event::Submit {
                id,
                immediate,
                deadline,
            } => {
                ensure!(!closing, "item {id} was accepted after close");
                let item = Submitted {
                    order: submitted.len(),
                    immediate: *immediate,
                    deadline: *deadline,
                };
                ensure!(
                    submitted.insert(*id, item).is_none(),
                    "item {id} was submitted twice"
                );
            }
            Event::Before {
                batch,
                reason,
                key,
                items,
                at,
            } => {
                check_batch(*key, items, limits.max_items, &submitted)
                    .map_err(|e| format!("batch {batch} ({reason}): {e}"))?;
                let mut first_attempts = 0;
                for id in items {
                    let attempt = started.entry(*id).or_insert(0);
                    *attempt += 1;
                    if *attempt == 1 {
                        first_attempts += 1;
                        continue;
                    }
                    // A retry: the previous attempt's view asked for it, and its backoff passed.
                    let last = views.get(id).and_then(|v| v.last());
                    match last {
                        Some((answered, view)) if view.attempt + 1 == *attempt => {
                            let Next::Retry { after } = view.next else {
                                return Err(format!(
                                    "item {id} was sent again (attempt {attempt}) after {:?}",
                                    view.next
                                ));
                            };
                            ensure!(
                                *at >= *answered + after,
                                "item {id}: retry {attempt} started {:?} after the answer, \
                                 before its backoff {after:?}",
                                *at - *answered
                            );
                        }
                        _ => {
                            return Err(format!(
                                "item {id}: attempt {attempt} started without a view of \
                                 attempt {} asking for a retry",
                                *attempt - 1
                            ));
                        }
                    }
                }
                let all_first = first_attempts == items.len();
                let reason_ok = match reason {
                    FlushReason::Size => items.len() == limits.max_items && all_first,
                    FlushReason::Immediate => {
                        items.len() == 1 && all_first && submitted[&items[0]].immediate
                    }
                    FlushReason::Retry => items.len() == 1 && first_attempts == 0,
                    FlushReason::Close => all_first && closing,
                    FlushReason::Deadline => {
                        all_first && items.iter().any(|id| submitted[id].deadline.is_some())
                    }
                    _ => all_first,
                };
                ensure!(
                    reason_ok,
                    "batch {batch} ({reason}) of {items:?} does not fit its reason"
                );
                uncalled.push(items.clone());
            }
            Event::Call {
                call,
                key,
                items,
                attempts,
            } => {
                check_batch(*key, items, limits.max_items, &submitted)
                    .map_err(|e| format!("call {call}: {e}"))?;
                match previous {
                    Some(Event::Before {
                        key: k, items: i, ..
                    }) if k == key && i == items => {}
                    _ => return Err(format!("call {call} was not announced by before_flush")),
                }
                uncalled.pop();
                if !limits.ordered_across_batches {
                    last_sent.remove(key);
                }
                for (id, attempt) in items.iter().zip(attempts) {
                    ensure!(
                        started.get(id) == Some(attempt),
                        "call {call}: the transport saw attempt {attempt} of item {id}, \
                         the observer {:?}",
                        started.get(id)
                    );
                    let ordered = *attempt == 1 && !submitted[id].immediate;
                    if let Some(last) = ordered.then(|| last_sent.insert(*key, *id)).flatten() {
                        ensure!(
                            submitted[&last].order < submitted[id].order,
                            "key {key}: item {id} reached the transport (call {call}) \
                             after item {last}, which was submitted later"
                        );
                    }
                }
                open_calls.insert(*call, (*key, items.clone(), attempts.clone()));
            }
            Event::Return { call, .. } => {
                ensure!(
                    open_calls.contains_key(call),
                    "call {call} returned twice or without being made"
                );
            }
            Event::After {
                batch,
                key,
                at,
                views: batch_views,
            } => {
                let Some(Event::Return { call, result }) = previous else {
                    return Err(format!(
                        "after_flush of batch {batch} without a transport answer"
                    ));
                };
                let (call_key, items, attempts) = open_calls.remove(call).expect("checked");
                ensure!(
                    call_key == *key
                        && batch_views.iter().map(|v| v.id).eq(items.iter().copied())
                        && batch_views
                            .iter()
                            .map(|v| v.attempt)
                            .eq(attempts.iter().copied()),
                    "after_flush of batch {batch} does not match call {call}: \
                     {batch_views:?} vs {items:?} attempts {attempts:?}"
                );
                for (pos, view) in batch_views.iter().enumerate() {
                    let expected = match result {
                        Err(error) => ItemReply::Err(error.clone()),
                        Ok(replies) => replies.get(pos).cloned().unwrap_or(ItemReply::Missing),
                    };
                    ensure!(
                        view.reply == expected,
                        "item {}: observer saw {:?}, the transport answered {expected:?}",
                        view.id,
                        view.reply
                    );
                    let deadline = submitted[&view.id].deadline;
                    let next = expected_next(&view.reply, view.attempt, deadline, *at, limits);
                    ensure!(
                        view.next == next,
                        "item {} attempt {}: next is {:?}, the retry policy says {next:?}",
                        view.id,
                        view.attempt,
                        view.next
                    );
                    let earlier = views.entry(view.id).or_default();
                    if let Some((_, last)) = earlier.last() {
                        ensure!(
                            last.next != Next::Resolved,
                            "item {} resolved twice (attempts {} and {})",
                            view.id,
                            last.attempt,
                            view.attempt
                        );
                    }
                    earlier.push((*at, view.clone()));
                }
            }
            Event::Abandoned { key, count } => {
                ensure!(closing, "{count} items of key {key} abandoned before close");
                *abandoned_reported.entry(*key).or_default() += count;
            }
            Event::CloseStart => closing = true,
        }
    }

    // Items whose transport call never returned, or never started, were abandoned.
    let cut_off = open_calls
        .values()
        .flat_map(|(_, items, _)| items)
        .chain(uncalled.iter().flatten());
    for id in cut_off {
        ensure!(
            outcomes.get(id) == Some(&Outcome::Abandoned),
            "item {id}: its flush was cut off but it resolved to {:?}",
            outcomes.get(id)
        );
    }

    let mut abandoned: HashMap<u8, usize> = HashMap::new();
    for (id, outcome) in outcomes {
        ensure!(
            submitted.contains_key(id),
            "item {id} resolved without being submitted"
        );
        let last = views.get(id).and_then(|v| v.last()).map(|(_, view)| view);
        match (outcome, last) {
            (Outcome::Abandoned, None) => {}
            (Outcome::Abandoned, Some(view)) => ensure!(
                matches!(view.next, Next::Retry { .. }),
                "item {id} was abandoned after its final answer {view:?}"
            ),
            (_, None) => {
                return Err(format!(
                    "item {id} resolved to {outcome:?} without an answer"
                ));
            }
            (outcome, Some(view)) => {
                let consistent = view.next == Next::Resolved
                    && match (outcome, &view.reply) {
                        (Outcome::Ok(out), ItemReply::Ok(reply)) => {
                            out == reply && *out == (*id, view.attempt)
                        }
                        (Outcome::Failed { source, attempts }, ItemReply::Err(error)) => {
                            source == error && *attempts == view.attempt
                        }
                        (Outcome::Missing { attempts }, ItemReply::Missing) => {
                            *attempts == view.attempt
                        }
                        _ => false,
                    };
                ensure!(
                    consistent,
                    "item {id} resolved to {outcome:?}, its last view was {view:?}"
                );
            }
        }
        if *outcome == Outcome::Abandoned {
            *abandoned.entry(key_of(*id)).or_default() += 1;
        }
    }
    for id in submitted.keys() {
        ensure!(outcomes.contains_key(id), "item {id} never resolved");
    }
    ensure!(
        abandoned == abandoned_reported,
        "abandoned items per key {abandoned:?}, on_abandoned reported {abandoned_reported:?}"
    );
    Ok(())
}

/// A batch (announced or sent) is non-empty, within `max_items`, of one key, and of
/// submitted items only.
fn check_batch(
    key: u8,
    items: &[u64],
    max_items: usize,
    submitted: &HashMap<u64, Submitted>,
) -> Result<(), String> {
    ensure!(!items.is_empty(), "empty batch");
    ensure!(
        items.len() <= max_items,
        "{} items exceed max_items {max_items}",
        items.len()
    );
    ensure!(
        items.iter().all(|id| key_of(*id) == key),
        "batch of key {key} mixes keys: {items:?}"
    );
    if let Some(id) = items.iter().find(|id| !submitted.contains_key(id)) {
        return Err(format!("item {id} was flushed before it was submitted"));
    }
    let distinct: HashSet<_> = items.iter().collect();
    ensure!(
        distinct.len() == items.len(),
        "an item appears twice: {items:?}"
    );
    Ok(())
}

/// What the retry policy says an item's reply leads to (see `RetryPolicy`).
fn expected_next(
    reply: &ItemReply<Out, Fault>,
    attempt: u32,
    deadline: Option<Instant>,
    now: Instant,
    limits: &Limits,
) -> Next {
    let retryable = match reply {
        ItemReply::Ok(_) => false,
        ItemReply::Err(error) => error.is_retryable(),
        ItemReply::Missing => true,
    };
    let after = limits.retry.delay_for(attempt);
    let in_time = deadline.is_none_or(|deadline| now + after < deadline);
    if retryable && attempt < limits.max_attempts && in_time {
        Next::Retry { after }
    } else {
        Next::Resolved
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Longer than anything a case does; a wait that reaches it is a hang.
const HANG: Duration = Duration::from_secs(3600);

/// Polls a future exactly once, outside Tokio's cooperative budget (which could otherwise
/// report a ready ticket as pending).
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    pin!(tokio::task::unconstrained(future)).poll(&mut cx)
}

type Tickets = Vec<(u64, Ticket<Out, Fault>)>;

type TestBatcher = Batcher<u8, u64, Transport>;

/// Where accepted items go: the log (in acceptance order) and the unresolved tickets.
#[derive(Clone, Default)]
struct Sink {
    log: SharedLog,
    tickets: Arc<Mutex<Tickets>>,
}

impl Sink {
    /// Polls every unresolved ticket once, moving the resolved ones' outcomes to `outcomes`.
    /// Returns the ids still unresolved.
    fn collect(&self, outcomes: &mut HashMap<u64, Outcome>) -> Result<Vec<u64>, String> {
        let mut tickets = self.tickets.lock().expect("tickets lock poisoned");
        let mut problem = None;
        tickets.retain_mut(|(id, ticket)| match poll_once(ticket) {
            Poll::Pending => true,
            Poll::Ready(result) => {
                match Outcome::from_result(result) {
                    Ok(outcome) => {
                        if outcomes.insert(*id, outcome).is_some() {
                            problem = Some(format!("item {id} resolved twice"));
                        }
                    }
                    Err(error) => problem = Some(format!("item {id}: {error}")),
                }
                false
            }
        });
        match problem {
            Some(problem) => Err(problem),
            None => Ok(tickets.iter().map(|(id, _)| *id).collect()),
        }
    }

    /// The items accepted so far, in acceptance order.
    fn accepted(&self) -> Vec<u64> {
        lock(&self.log)
            .events
            .iter()
            .filter_map(|event| match event {
                Event::Submit { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    /// After an awaited `flush`: every item in `before` has had a transport answer.
    fn check_answered(&self, before: &[u64], what: &str) -> Result<(), String> {
        let log = lock(&self.log);
        let answered: HashSet<u64> = log
            .events
            .iter()
            .filter_map(|event| match event {
                Event::After { views, .. } => Some(views.iter().map(|v| v.id)),
                _ => None,
            })
            .flatten()
            .collect();
        if let Some(id) = before.iter().find(|id| !answered.contains(id)) {
            return Err(format!(
                "{what} returned before item {id}, accepted earlier, had an answer"
            ));
        }
        Ok(())
    }
}

/// One submit, from the test's own task or a spawned one. Logs the item right when it is
/// accepted (in the same poll), so that the log has the batcher's acceptance order.
async fn submit(
    batcher: TestBatcher,
    sink: Sink,
    key: u8,
    id: u64,
    deadline: Option<Instant>,
    immediate: bool,
    reject: bool,
) -> Result<(), String> {
    let mut options = ItemOptions::new();
    if let Some(deadline) = deadline {
        options = options.deadline(deadline);
    }
    if immediate {
        options = options.immediate();
    }
    match batcher.enqueue(key, id, options).await {
        Ok(ticket) => {
            lock(&sink.log).events.push(Event::Submit {
                id,
                immediate,
                deadline,
            });
            sink.tickets
                .lock()
                .expect("tickets lock poisoned")
                .push((id, ticket));
        }
        Err(Error::Full { item, limit }) => {
            let pending = batcher.stats().pending;
            ensure!(
                reject && item == id && pending == limit,
                "item {id}: Full (item {item}, limit {limit}) with {pending} pending, \
                 rejecting: {reject}"
            );
        }
        Err(Error::Closed(item)) => ensure!(
            item == id && batcher.is_closed(),
            "item {id}: Closed (item {item}) while the batcher was open"
        ),
        Err(error) => return Err(format!("item {id}: enqueue failed with {error:?}")),
    }
    Ok(())
}

async fn run(case: Case) -> Result<(), String> {
    let sink = Sink::default();
    let log = Arc::clone(&sink.log);
    let batcher = Batcher::builder()
        .max_items(case.max_items)
        .max_delay(millis(case.max_delay_ms))
        .deadline_margin(millis(case.margin_ms))
        .max_in_flight_per_key(case.max_in_flight)
        .max_pending(case.max_pending)
        .backpressure(if case.reject {
            Backpressure::Reject
        } else {
            Backpressure::Wait
        })
        .retry(case.retry_policy())
        .drop_timeout(millis(case.close_ms.max(1)))
        .observer(Arc::new(Recorder {
            log: Arc::clone(&log),
        }))
        .build(Transport {
            log: Arc::clone(&log),
            plans: case.plans.clone(),
        })
        .map_err(|error| format!("build: {error}"))?;

    let mut outcomes: HashMap<u64, Outcome> = HashMap::new();
    let mut detached: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = Vec::new();
    let mut submitters = Vec::new();
    let mut seq = 0;
    for (step, op) in case.ops.iter().enumerate() {
        match *op {
            Op::Submit {
                key,
                deadline_ms,
                immediate,
                spawned,
            } => {
                seq += 1;
                let id = item_id(seq, key);
                let deadline = deadline_ms.map(|ms| Instant::now() + millis(ms));
                let submit = submit(
                    batcher.clone(),
                    sink.clone(),
                    key,
                    id,
                    deadline,
                    immediate,
                    case.reject,
                );
                if spawned {
                    submitters.push(tokio::spawn(submit));
                } else {
                    tokio::time::timeout(HANG, submit)
                        .await
                        .map_err(|_| format!("step {step}: enqueue of item {id} hung"))?
                        .map_err(|error| format!("step {step}: {error}"))?;
                }
            }
            Op::Flush { key, wait } => {
                let flush = batcher.flush(&key);
                if wait {
                    let mut before = sink.accepted();
                    before.retain(|id| key_of(*id) == key);
                    tokio::time::timeout(HANG, flush)
                        .await
                        .map_err(|_| format!("step {step}: flush({key}) hung"))?;
                    sink.check_answered(&before, &format!("step {step}: flush({key})"))?;
                } else {
                    detached.push(Box::pin(flush));
                }
            }
            Op::FlushAll { wait } => {
                let flush = batcher.flush_all();
                if wait {
                    let before = sink.accepted();
                    tokio::time::timeout(HANG, flush)
                        .await
                        .map_err(|_| format!("step {step}: flush_all hung"))?;
                    sink.check_answered(&before, &format!("step {step}: flush_all"))?;
                } else {
                    detached.push(Box::pin(flush));
                }
            }
            Op::Advance(ms) => tokio::time::sleep(millis(ms)).await,
        }
        let unresolved = sink.collect(&mut outcomes)?.len();
        let pending = batcher.stats().pending;
        ensure!(
            pending == unresolved,
            "step {step}: stats().pending is {pending}, {unresolved} tickets are unresolved"
        );
        ensure!(
            pending <= case.max_pending,
            "step {step}: {pending} pending, above max_pending"
        );
    }
    ensure!(
        !outcomes.values().any(|o| *o == Outcome::Abandoned),
        "an item was abandoned before close"
    );

    let limits = Limits {
        max_items: case.max_items,
        max_attempts: case.max_attempts,
        retry: case.retry_policy(),
        ordered_across_batches: case.max_in_flight == 1,
    };
    if case.drop_instead_of_close {
        end_by_drop(batcher, &sink, submitters, detached, &mut outcomes, &case).await?;
    } else {
        let end = Closing {
            sink: &sink,
            submitters,
            detached,
            timeout: millis(case.close_ms),
            next_id: item_id(seq + 1, 0),
        };
        end.close(&batcher, &mut outcomes).await?;
    }
    let events = lock(&log).events.clone();
    check_log(&events, &outcomes, &limits)
}

type Submitter = tokio::task::JoinHandle<Result<(), String>>;

type Detached = Vec<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// Awaits a spawned submitter; it must finish and have found nothing wrong.
async fn join(submitter: Submitter) -> Result<(), String> {
    tokio::time::timeout(HANG, submitter)
        .await
        .map_err(|_| "a spawned submit hung".to_owned())?
        .map_err(|error| format!("a spawned submit panicked: {error}"))?
}

/// Ends a run by dropping the last handle: the batcher closes itself in the background
/// within `drop_timeout`, and every ticket still resolves.
async fn end_by_drop(
    batcher: TestBatcher,
    sink: &Sink,
    submitters: Vec<Submitter>,
    detached: Detached,
    outcomes: &mut HashMap<u64, Outcome>,
    case: &Case,
) -> Result<(), String> {
    // The submitters hold handles too; let them finish (they may wait for room) first.
    for submitter in submitters {
        join(submitter).await?;
    }
    lock(&sink.log).events.push(Event::CloseStart);
    let dropped = Instant::now();
    drop(batcher);
    let tickets = std::mem::take(&mut *sink.tickets.lock().expect("tickets lock poisoned"));
    for (id, ticket) in tickets {
        let result = tokio::time::timeout(HANG, ticket)
            .await
            .map_err(|_| format!("item {id} never resolved after the batcher was dropped"))?;
        ensure!(
            outcomes.insert(id, Outcome::from_result(result)?).is_none(),
            "item {id} resolved twice"
        );
    }
    let elapsed = dropped.elapsed();
    let timeout = millis(case.close_ms.max(1));
    ensure!(
        elapsed <= timeout,
        "the dropped batcher took {elapsed:?} to resolve everything, drop_timeout is {timeout:?}"
    );
    for flush in detached {
        tokio::time::timeout(HANG, flush)
            .await
            .map_err(|_| "a flush future hung after the batcher was dropped".to_owned())?;
    }
    Ok(())
}

/// Ends a run with `close`.
struct Closing<'a> {
    sink: &'a Sink,
    submitters: Vec<Submitter>,
    detached: Detached,
    timeout: Duration,
    /// An id never used, for the submits after close.
    next_id: u64,
}

impl Closing<'_> {
    async fn close(
        mut self,
        batcher: &TestBatcher,
        outcomes: &mut HashMap<u64, Outcome>,
    ) -> Result<(), String> {
        let pending_at_close = self.sink.collect(outcomes)?;
        lock(&self.sink.log).events.push(Event::CloseStart);
        let timeout = self.timeout;
        let started = Instant::now();
        let report = tokio::time::timeout(timeout + HANG, batcher.close(timeout))
            .await
            .map_err(|_| "close hung".to_owned())?;
        let elapsed = started.elapsed();

        // Right after close returned: everything is resolved.
        let unresolved = self.sink.collect(outcomes)?;
        ensure!(
            unresolved.is_empty(),
            "tickets still pending right after close returned: {unresolved:?}"
        );
        for flush in &mut self.detached {
            ensure!(
                poll_once(flush).is_ready(),
                "a flush future is still pending after close"
            );
        }
        // Spawned submits still waiting were refused; none may have got in after close.
        for submitter in self.submitters.drain(..) {
            join(submitter).await?;
        }
        let late = self.sink.collect(outcomes)?;
        ensure!(late.is_empty(), "items accepted after close: {late:?}");

        let count = |ids: &[u64], f: fn(&Outcome) -> bool| {
            ids.iter().filter(|id| f(&outcomes[*id])).count() as u64
        };
        let is_ok = |o: &Outcome| matches!(o, Outcome::Ok(_));
        let is_failed = |o: &Outcome| matches!(o, Outcome::Failed { .. } | Outcome::Missing { .. });
        let is_abandoned = |o: &Outcome| *o == Outcome::Abandoned;
        let is_terminal =
            |o: &Outcome| matches!(o, Outcome::Failed { source, .. } if !source.retryable);

        // The close report covers exactly the items pending when close started.
        ensure!(
            report.pending_at_close == pending_at_close.len(),
            "report {report:?}, {} items were pending",
            pending_at_close.len()
        );
        let (succeeded, failed, abandoned) = (
            count(&pending_at_close, is_ok),
            count(&pending_at_close, is_failed),
            count(&pending_at_close, is_abandoned),
        );
        ensure!(
            (report.succeeded, report.failed, report.abandoned) == (succeeded, failed, abandoned),
            "report {report:?}, outcomes of the pending items: {succeeded} succeeded, {failed} \
             failed, {abandoned} abandoned"
        );
        ensure!(
            report.timed_out == (abandoned > 0),
            "report {report:?} with {abandoned} abandoned"
        );
        ensure!(
            if report.timed_out {
                elapsed == timeout
            } else {
                elapsed <= timeout
            },
            "close took {elapsed:?} with a timeout of {timeout:?} ({report:?})"
        );

        // The counters agree with the outcomes and the log.
        let stats = batcher.stats();
        let all: Vec<u64> = outcomes.keys().copied().collect();
        let accepted = self.sink.accepted().len() as u64;
        ensure!(
            stats.pending == 0
                && stats.in_flight == 0
                && stats.queued == 0
                && stats.awaiting_retry == 0
                && stats.keys == 0,
            "after close: {stats:?}"
        );
        ensure!(
            stats.items_submitted == accepted
                && stats.items_succeeded == count(&all, is_ok)
                && stats.items_failed == count(&all, is_failed)
                && stats.items_abandoned == count(&all, is_abandoned),
            "counters {stats:?} vs {accepted} accepted and outcomes {outcomes:?}"
        );
        let terminal = count(&all, is_terminal);
        ensure!(
            (terminal..=stats.items_failed).contains(&stats.terminal_failures),
            "terminal_failures {} with {terminal} non-retryable failures of {}",
            stats.terminal_failures,
            stats.items_failed
        );
        check_counters(&lock(&self.sink.log), &stats, report.timed_out)?;

        // A closed batcher hands items back.
        ensure!(batcher.is_closed(), "is_closed() is false after close");
        let id = self.next_id;
        let refused = [
            batcher.enqueue(0, id, ItemOptions::new()).await.err(),
            batcher
                .try_enqueue(0, id, ItemOptions::new().immediate())
                .err(),
            batcher.submit(0, id).await.err(),
            batcher.submit_immediate(0, id).await.err(),
        ]
        .map(|error| {
            error.and_then(|error| matches!(error, Error::Closed(_)).then(|| error.into_item()))
        });
        ensure!(
            refused.iter().all(|item| *item == Some(Some(id))),
            "after close, submitting gave {refused:?}"
        );
        let again = batcher.close(timeout).await;
        ensure!(
            again.pending_at_close == 0
                && again.succeeded + again.failed + again.abandoned == 0
                && !again.timed_out,
            "a second close reported {again:?}"
        );
        ensure!(
            batcher.stats().items_submitted == accepted,
            "refused items were counted as submitted"
        );
        Ok(())
    }
}

/// The batcher's counters against what the observer and the transport saw.
fn check_counters(log: &Log, stats: &Stats, timed_out: bool) -> Result<(), String> {
    ensure!(log.violations.is_empty(), "{:?}", log.violations);
    let mut befores: HashMap<FlushReason, u64> = HashMap::new();
    let (mut retries, mut missing, mut extra) = (0, 0, 0);
    let mut sizes: HashMap<usize, usize> = HashMap::new();
    for event in &log.events {
        match event {
            Event::Before { reason, .. } => *befores.entry(*reason).or_default() += 1,
            Event::After { views, .. } => {
                for view in views {
                    retries += u64::from(matches!(view.next, Next::Retry { .. }));
                    missing += u64::from(view.reply == ItemReply::Missing);
                }
            }
            Event::Call { call, items, .. } => {
                sizes.insert(*call, items.len());
            }
            Event::Return {
                call,
                result: Ok(replies),
            } => extra += replies.len().saturating_sub(sizes[call]) as u64,
            _ => {}
        }
    }
    // Batches queued and then abandoned by a timed-out close never reach the observer.
    for reason in FlushReason::ALL {
        let seen = befores.get(&reason).copied().unwrap_or(0);
        let counted = stats.batches(reason);
        ensure!(
            if timed_out {
                seen <= counted
            } else {
                seen == counted
            },
            "{counted} batches counted for {reason}, the observer saw {seen}"
        );
    }
    ensure!(
        stats.batch_sizes.total() == stats.total_batches(),
        "batch size histogram {:?} vs {} batches",
        stats.batch_sizes,
        stats.total_batches()
    );
    // Retries due when a close times out are abandoned instead, and not counted.
    ensure!(
        if timed_out {
            stats.retries <= retries
        } else {
            stats.retries == retries
        },
        "{} retries counted, the observer saw {retries}",
        stats.retries
    );
    ensure!(
        stats.missing_replies == missing && stats.extra_replies == extra,
        "missing/extra replies counted {}/{}, seen {missing}/{extra}",
        stats.missing_replies,
        stats.extra_replies
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    })]

    /// Every item resolves exactly once, batches respect `max_items` and keys, items keep
    /// their order, and close resolves everything, under random faults and operations.
    #[test]
    fn batcher_holds_its_guarantees_under_faults(case in case()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        if let Err(problem) = runtime.block_on(run(case)) {
            return Err(TestCaseError::fail(problem));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checker catches what it should (fabricated logs).

fn limits() -> Limits {
    Limits {
        max_items: 4,
        max_attempts: 2,
        retry: RetryPolicy::default(),
        ordered_across_batches: true,
    }
}

fn submitted(id: u64) -> Event {
    Event::Submit {
        id,
        immediate: false,
        deadline: None,
    }
}

fn sent(key: u8, items: &[u64], at: Instant) -> [Event; 2] {
    [
        Event::Before {
            batch: items[0],
            reason: FlushReason::Explicit,
            key,
            items: items.to_vec(),
            at,
        },
        Event::Call {
            call: items[0] as usize,
            key,
            items: items.to_vec(),
            attempts: vec![1; items.len()],
        },
    ]
}

#[test]
fn checker_accepts_a_consistent_log() {
    let at = Instant::now();
    let a = item_id(1, 0);
    let mut events = vec![submitted(a)];
    events.extend(sent(0, &[a], at));
    events.push(Event::Return {
        call: a as usize,
        result: Ok(vec![ItemReply::Ok((a, 1))]),
    });
    events.push(Event::After {
        batch: a,
        key: 0,
        at,
        views: vec![View {
            id: a,
            reply: ItemReply::Ok((a, 1)),
            attempt: 1,
            next: Next::Resolved,
        }],
    });
    let outcomes = HashMap::from([(a, Outcome::Ok((a, 1)))]);
    assert_eq!(check_log(&events, &outcomes, &limits()), Ok(()));
}

#[test]
fn checker_reports_a_batch_that_mixes_keys() {
    let at = Instant::now();
    let (a, b) = (item_id(1, 0), item_id(2, 1));
    let mut events = vec![submitted(a), submitted(b)];
    events.extend(sent(0, &[a, b], at));
    let error = check_log(&events, &HashMap::new(), &limits()).expect_err("a mixed batch");
    assert!(error.contains("mixes keys"), "{error}");
}

#[test]
fn checker_reports_items_out_of_order() {
    let at = Instant::now();
    let (a, b) = (item_id(1, 0), item_id(2, 0));
    let mut events = vec![submitted(a), submitted(b)];
    events.extend(sent(0, &[b], at));
    events.extend(sent(0, &[a], at));
    let error = check_log(&events, &HashMap::new(), &limits()).expect_err("out of order");
    assert!(error.contains("submitted later"), "{error}");
}

#[test]
fn checker_reports_items_out_of_order_within_a_batch() {
    let at = Instant::now();
    let (a, b, c) = (item_id(1, 0), item_id(2, 0), item_id(3, 0));
    let mut events = vec![submitted(a), submitted(b), submitted(c)];
    events.extend(sent(0, &[a], at));
    events.extend(sent(0, &[c, b], at));
    let unordered = Limits {
        ordered_across_batches: false,
        ..limits()
    };
    let error = check_log(&events, &HashMap::new(), &unordered).expect_err("out of order");
    assert!(error.contains("submitted later"), "{error}");
}

#[test]
fn checker_reports_an_oversized_batch_and_a_lost_item() {
    let at = Instant::now();
    let ids: Vec<u64> = (1..=5).map(|seq| item_id(seq, 2)).collect();
    let mut events: Vec<Event> = ids.iter().map(|id| submitted(*id)).collect();
    events.extend(sent(2, &ids, at));
    let error = check_log(&events, &HashMap::new(), &limits()).expect_err("too big");
    assert!(error.contains("exceed max_items"), "{error}");

    let events = vec![submitted(ids[0])];
    let error = check_log(&events, &HashMap::new(), &limits()).expect_err("lost");
    assert!(error.contains("never resolved"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// Bugs found along the way, each reduced to a minimal failing test. They are ignored so that the
// suite stays green; run them with `--ignored`.

/// A transport that answers every call at once with `items` (cycled), and its log.
fn answering_transport(items: Vec<ItemFault>) -> (SharedLog, Transport) {
    let log = SharedLog::default();
    let transport = Transport {
        log: Arc::clone(&log),
        plans: vec![CallPlan {
            delay_ms: 0,
            whole: None,
            items,
            truncate: None,
            extra: false,
        }],
    };
    (log, transport)
}

/// `Stats::terminal_failures` counts the items whose last failure the transport marked not
/// retryable; an item whose retryable failure ran out of attempts is failed, not terminal.
#[test]
fn terminal_failures_leave_out_items_that_ran_out_of_attempts() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (_log, transport) = answering_transport(vec![ItemFault::Retryable]);
    let stats = runtime.block_on(async {
        let batcher = Batcher::builder()
            .retry(RetryPolicy::never())
            .build(transport)
            .expect("valid settings");
        // The transport fails the item retryably; with one attempt that is final.
        let outcome = batcher.submit_immediate(0, item_id(1, 0)).await;
        assert!(
            matches!(outcome, Err(Error::Failed { attempts: 1, .. })),
            "{outcome:?}"
        );
        batcher.close(Duration::from_secs(1)).await;
        batcher.stats()
    });
    assert_eq!(stats.items_failed, 1);
    assert_eq!(stats.terminal_failures, 0, "{stats:?}");
}
