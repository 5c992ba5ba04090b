//! The checker: the event log of a finished run against the tickets' outcomes, and the
//! batcher's counters against the log.

use std::collections::{HashMap, HashSet};

use ack_batcher::{Error, FlushReason, ItemReply, Next, RetryPolicy, Retryable, Stats};
use tokio::time::Instant;

use super::log::{Event, Log, View};
use super::{Fault, Out, item_id, key_of};

/// An item's outcome as its ticket delivered it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    Ok(Out),
    Failed { source: Fault, attempts: u32 },
    Missing { attempts: u32 },
    Abandoned,
}

impl Outcome {
    pub(super) fn from_result(result: Result<Out, Error<Fault>>) -> Result<Self, String> {
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
pub(super) struct Limits {
    pub(super) max_items: usize,
    pub(super) max_attempts: u32,
    pub(super) retry: RetryPolicy,
    /// Whether a key's batches must reach the transport in submission order: the batcher
    /// promises it only with `max_in_flight_per_key(1)`; otherwise only within a batch.
    pub(super) ordered_across_batches: bool,
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
pub(super) fn check_log(
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
    // Items the retry budget held back until their deadline (they resolve to their last
    // failure although their last view asked for a retry).
    let mut given_up: HashSet<u64> = HashSet::new();

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
                    FlushReason::Retry => first_attempts == 0,
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
                check_one_jitter_draw(*batch, batch_views, limits)?;
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
                    check_next(view, deadline, *at, limits)?;
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
            Event::GivenUp { key, items } => {
                for id in items {
                    ensure!(
                        submitted.get(id).is_some_and(|s| s.deadline.is_some()),
                        "item {id} of key {key} given up by the budget without a deadline"
                    );
                    ensure!(given_up.insert(*id), "item {id} given up twice");
                }
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
                let expected_next = if given_up.contains(id) {
                    matches!(view.next, Next::Retry { .. })
                } else {
                    view.next == Next::Resolved
                };
                let consistent = expected_next
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

/// Whether an item's next step is one the retry policy allows (see `RetryPolicy`): a retry
/// only of a retryable reply with attempts left, after a wait between the jittered minimum
/// and the policy's `delay_for`, starting before the deadline; resolution otherwise. A
/// retryable item may be resolved for its deadline only if the longest wait passes it (the
/// jittered wait is at most that long; the draw itself is not visible here).
fn check_next(
    view: &View,
    deadline: Option<Instant>,
    now: Instant,
    limits: &Limits,
) -> Result<(), String> {
    let retryable = match &view.reply {
        ItemReply::Ok(_) => false,
        ItemReply::Err(error) => error.is_retryable(),
        ItemReply::Missing => true,
    };
    let retry = &limits.retry;
    let longest = retry.delay_for(view.attempt);
    let shortest = retry.jittered_delay(view.attempt, 1.0);
    let may_retry = retryable && view.attempt < limits.max_attempts;
    match view.next {
        Next::Retry { after } => ensure!(
            may_retry
                && (shortest..=longest).contains(&after)
                && deadline.is_none_or(|deadline| now + after < deadline),
            "item {} attempt {}: retry after {after:?}, the retry policy allows {} \
             (between {shortest:?} and {longest:?}, before the deadline {deadline:?}, now {now:?})",
            view.id,
            view.attempt,
            if may_retry { "a retry" } else { "no retry" }
        ),
        Next::Resolved => ensure!(
            !may_retry || deadline.is_some_and(|deadline| now + longest >= deadline),
            "item {} attempt {}: resolved, the retry policy says retry after at most {longest:?}",
            view.id,
            view.attempt
        ),
        other => return Err(format!("item {}: unknown next step {other:?}", view.id)),
    }
    Ok(())
}

/// The retries of one batch share one jitter draw: each wait is the same share of its longest.
fn check_one_jitter_draw(batch: u64, views: &[View], limits: &Limits) -> Result<(), String> {
    let shares: Vec<f64> = views
        .iter()
        .filter_map(|view| match view.next {
            Next::Retry { after } => {
                Some(after.as_secs_f64() / limits.retry.delay_for(view.attempt).as_secs_f64())
            }
            _ => None,
        })
        .collect();
    ensure!(
        shares.windows(2).all(|w| (w[0] - w[1]).abs() < 1e-6),
        "batch {batch}: its retries drew different jitters: {shares:?}"
    );
    Ok(())
}

/// The batcher's counters against what the observer and the transport saw.
pub(super) fn check_counters(log: &Log, stats: &Stats, timed_out: bool) -> Result<(), String> {
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
