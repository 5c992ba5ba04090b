//! The run: one case, from building the batcher through its operations to the end.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ack_batcher::{Backpressure, Batcher, Error, ItemOptions, Ticket};
use tokio::time::Instant;

use super::case::{Case, Op};
use super::checker::{Limits, Outcome, check_log};
use super::ending::{Closing, end_by_drop};
use super::log::{Event, Recorder, SharedLog, Transport, lock};
use super::{Fault, Out, item_id, key_of};

pub(super) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Longer than anything a case does; a wait that reaches it is a hang.
pub(super) const HANG: Duration = Duration::from_secs(3600);

/// Polls a future exactly once, outside Tokio's cooperative budget (which could otherwise
/// report a ready ticket as pending).
pub(super) fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    pin!(tokio::task::unconstrained(future)).poll(&mut cx)
}

type Tickets = Vec<(u64, Ticket<Out, Fault>)>;

pub(super) type TestBatcher = Batcher<u8, u64, Transport>;

/// Where accepted items go: the log (in acceptance order) and the unresolved tickets.
#[derive(Clone, Default)]
pub(super) struct Sink {
    pub(super) log: SharedLog,
    pub(super) tickets: Arc<Mutex<Tickets>>,
}

impl Sink {
    /// Polls every unresolved ticket once, moving the resolved ones' outcomes to `outcomes`.
    /// Returns the ids still unresolved.
    pub(super) fn collect(&self, outcomes: &mut HashMap<u64, Outcome>) -> Result<Vec<u64>, String> {
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
    pub(super) fn accepted(&self) -> Vec<u64> {
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

pub(super) async fn run(case: Case) -> Result<(), String> {
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
