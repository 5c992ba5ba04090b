//! The event log, the fault-injecting transport that writes to it and the observer that
//! records into it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ack_batcher::{
    BatchInfo, Flush, FlushReason, FlushResult, ItemReply, ItemView, Next, Observer,
};
use tokio::time::Instant;

use super::case::{CallPlan, ItemFault};
use super::{Fault, Out};

/// The observer's view of one item after a flush.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct View {
    pub(super) id: u64,
    pub(super) reply: ItemReply<Out, Fault>,
    pub(super) attempt: u32,
    pub(super) next: Next,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
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
    /// `Observer::on_given_up`: the retry budget held these items back past their deadline.
    GivenUp { key: u8, items: Vec<u64> },
    /// The test is about to call `close`.
    CloseStart,
}

#[derive(Debug, Default)]
pub(super) struct Log {
    pub(super) events: Vec<Event>,
    calls: usize,
    seen: HashMap<u64, u32>,
    /// Problems noticed inside the observer (which must not panic: a panicking flushing task
    /// would leave its items pending forever).
    pub(super) violations: Vec<String>,
}

pub(super) type SharedLog = Arc<Mutex<Log>>;

pub(super) fn lock(log: &SharedLog) -> MutexGuard<'_, Log> {
    log.lock().expect("log lock poisoned")
}

pub(super) struct Transport {
    pub(super) log: SharedLog,
    pub(super) plans: Vec<CallPlan>,
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

pub(super) struct Recorder {
    pub(super) log: SharedLog,
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

    fn on_given_up(&self, key: &u8, items: &[u64]) {
        lock(&self.log).events.push(Event::GivenUp {
            key: *key,
            items: items.to_vec(),
        });
    }
}
