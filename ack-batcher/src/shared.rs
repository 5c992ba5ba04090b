//! The running parts: flushing tasks, the timer driver, close and abandonment.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::observe::SharedObserver;
use crate::state::{Launch, RetryEntry, Slot, State, Tally};
use crate::{
    BatchInfo, CloseReport, Error, Flush, FlushReason, FlushResult, ItemReply, ItemView, Next,
    Retryable, Stats,
};

/// How one flush ended (short of being cancelled by close).
enum Answer<O, E> {
    /// The transport answered.
    Replied(FlushResult<O, E>),
    /// The transport panicked, with this message.
    Panicked(String),
    /// The flush ran past `flush_timeout`.
    TimedOut,
}

impl<O, E> From<Result<FlushResult<O, E>, Box<dyn Any + Send>>> for Answer<O, E> {
    fn from(caught: Result<FlushResult<O, E>, Box<dyn Any + Send>>) -> Self {
        match caught {
            Ok(result) => Self::Replied(result),
            Err(payload) => Self::Panicked(panic_message(payload.as_ref())),
        }
    }
}

/// A panic payload as text: the message of `panic!("...")` and `panic!("{x}")`, else a
/// placeholder.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

type StateOf<K, T, F> = State<K, T, <F as Flush<K, T>>::Output, <F as Flush<K, T>>::Error>;
type SlotOf<K, T, F> = Slot<<F as Flush<K, T>>::Output, <F as Flush<K, T>>::Error>;

/// Everything the batcher's handles, tasks and driver share.
pub(crate) struct Shared<K, T, F: Flush<K, T>> {
    pub(crate) flusher: F,
    pub(crate) settings: Settings,
    observer: Option<SharedObserver<K, T, F>>,
    pub(crate) state: Mutex<StateOf<K, T, F>>,
    /// One permit per item that may still be accepted (`max_pending`).
    pub(crate) room: Semaphore,
    wake_driver: Notify,
    drained: Notify,
    /// Cancelled when close runs out of time: in-flight flushes stop and abandon their items.
    cancel: CancellationToken,
    pub(crate) runtime: Handle,
}

impl<K, T, F> Shared<K, T, F>
where
    K: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    T: Send + Sync + 'static,
    F: Flush<K, T>,
{
    pub(crate) fn new(
        flusher: F,
        settings: Settings,
        observer: Option<SharedObserver<K, T, F>>,
        runtime: Handle,
    ) -> Arc<Self> {
        let budget = settings.retry_budget.clone();
        let shared = Arc::new(Self {
            flusher,
            room: Semaphore::new(settings.max_pending),
            settings,
            observer,
            state: Mutex::new(State::new(budget)),
            wake_driver: Notify::new(),
            drained: Notify::new(),
            cancel: CancellationToken::new(),
            runtime,
        });
        shared.runtime.spawn(Arc::clone(&shared).drive());
        shared
    }

    /// Accepts an item whose room permit was already taken.
    pub(crate) fn accept(
        self: &Arc<Self>,
        key: K,
        item: T,
        reply: crate::ticket::Reply<F::Output, F::Error>,
        deadline: Option<Instant>,
        immediate: bool,
    ) -> Result<(), T> {
        let slot = Slot {
            reply,
            deadline,
            attempts: 0,
        };
        let pushed = {
            let mut state = self.state.lock();
            if state.book.closed {
                drop(state);
                self.room.add_permits(1);
                return Err(item);
            }
            state.add(key, item, slot, immediate, &self.settings)
        };
        if pushed.wake {
            self.wake_driver.notify_one();
        }
        if let Some(launch) = pushed.launch {
            self.spawn(launch);
        }
        Ok(())
    }

    pub(crate) fn spawn(self: &Arc<Self>, launch: Launch<K, T>) {
        self.runtime.spawn(Arc::clone(self).run(launch));
    }

    fn spawn_all(self: &Arc<Self>, launches: Vec<Launch<K, T>>) {
        for launch in launches {
            self.spawn(launch);
        }
    }

    /// Flushes one batch and books its outcome.
    async fn run(self: Arc<Self>, launch: Launch<K, T>) {
        let Launch {
            id,
            reason,
            key,
            items,
        } = launch;
        let info = BatchInfo {
            id,
            reason,
            len: items.len(),
        };
        tracing::trace!(batch = id, %reason, len = items.len(), "flushing batch");
        if let Some(observer) = &self.observer {
            observer.before_flush(&key, &info, &items);
        }
        // The call itself runs inside the guarded future, so a transport that panics before
        // returning its future is caught too.
        let flush =
            AssertUnwindSafe(async { self.flusher.flush(&key, &items).await }).catch_unwind();
        let answer = async {
            match self.settings.flush_timeout {
                Some(limit) => tokio::time::timeout(limit, flush)
                    .await
                    .map_or(Answer::TimedOut, Answer::from),
                None => Answer::from(flush.await),
            }
        };
        let answer = tokio::select! {
            biased;
            () = self.cancel.cancelled() => None,
            answer = answer => Some(answer),
        };
        match answer {
            Some(Answer::Replied(result)) => self.complete(&info, key, items, result, false),
            Some(Answer::TimedOut) => {
                tracing::warn!(
                    batch = id,
                    len = items.len(),
                    "flush timed out; its items count as missing replies"
                );
                self.complete(&info, key, items, Ok(Vec::new()), true);
            }
            Some(Answer::Panicked(message)) => self.fail_panicked(&info, key, &items, message),
            None => self.abandon_in_flight(id, key),
        }
    }

    /// A flush whose transport panicked: every item of the batch fails with
    /// [`Error::Panicked`], without retries.
    fn fail_panicked(self: &Arc<Self>, info: &BatchInfo, key: K, items: &[T], message: String) {
        let Some(slots) = self.state.lock().take_in_flight(info.id) else {
            return; // abandoned by close meanwhile
        };
        tracing::error!(batch = info.id, len = items.len(), %message, "the transport panicked; the batch fails");
        if let Some(observer) = &self.observer {
            observer.on_panicked(&key, info, items, &message);
        }
        let tally = Tally {
            failed: slots.len() as u64,
            terminal: slots.len() as u64,
            panicked: true,
            ..Tally::default()
        };
        for slot in slots {
            let _ = slot.reply.send(Err(Error::Panicked {
                message: message.clone(),
                attempts: slot.attempts,
            }));
        }
        self.finish(info.id, &key, tally, Vec::new());
    }

    /// Delivers each item's reply, or schedules its retry.
    fn complete(
        self: &Arc<Self>,
        info: &BatchInfo,
        key: K,
        items: Vec<T>,
        result: FlushResult<F::Output, F::Error>,
        timed_out: bool,
    ) {
        let Some(slots) = self.state.lock().take_in_flight(info.id) else {
            return; // abandoned by close while the transport was answering
        };
        let len = items.len();
        let mut tally = Tally {
            timed_out,
            ..Tally::default()
        };
        let replies = match result {
            Ok(mut replies) => {
                if replies.len() > len {
                    tally.extra = (replies.len() - len) as u64;
                    tracing::warn!(
                        batch = info.id,
                        extra = tally.extra,
                        "transport returned more replies than items; extras ignored"
                    );
                    replies.truncate(len);
                }
                replies.resize_with(len, || ItemReply::Missing);
                replies
            }
            Err(error) => {
                tracing::debug!(batch = info.id, len, "whole batch failed");
                (0..len).map(|_| ItemReply::Err(error.clone())).collect()
            }
        };
        let now = Instant::now();
        let retry = &self.settings.retry;
        // One draw for the whole batch: its retries stay due together and go out as one batch.
        let unit = retry.draw();
        let next: Vec<Next> = replies
            .iter()
            .zip(&slots)
            .map(|(reply, slot)| {
                let retryable = match reply {
                    ItemReply::Ok(_) => false,
                    ItemReply::Err(error) => error.is_retryable(),
                    ItemReply::Missing => true,
                };
                if !retryable || slot.attempts >= retry.max_attempts {
                    return Next::Resolved;
                }
                let after = retry.jittered_delay(slot.attempts, unit);
                if slot.deadline.is_none_or(|deadline| now + after < deadline) {
                    Next::Retry { after }
                } else {
                    Next::Resolved
                }
            })
            .collect();
        if let Some(observer) = &self.observer {
            let views: Vec<_> = items
                .iter()
                .zip(&replies)
                .zip(slots.iter().zip(&next))
                .map(|((item, reply), (slot, next))| ItemView {
                    item,
                    reply,
                    attempt: slot.attempts,
                    next: *next,
                })
                .collect();
            observer.after_flush(&key, info, &views);
        }
        let mut retries = Vec::new();
        for (((item, slot), reply), next) in items.into_iter().zip(slots).zip(replies).zip(next) {
            let attempts = slot.attempts;
            let outcome = match (reply, next) {
                (ItemReply::Ok(output), _) => {
                    tally.succeeded += 1;
                    Ok(output)
                }
                (reply, Next::Retry { after }) => {
                    let last = match reply {
                        ItemReply::Err(error) => Some(error),
                        _ => {
                            tally.missing += 1;
                            None
                        }
                    };
                    retries.push(RetryEntry {
                        due: now + after,
                        key: key.clone(),
                        item,
                        slot,
                        last,
                    });
                    continue;
                }
                (ItemReply::Err(source), _) => {
                    tally.failed += 1;
                    tally.terminal += u64::from(!source.is_retryable());
                    Err(Error::Failed { source, attempts })
                }
                (ItemReply::Missing, _) => {
                    tally.failed += 1;
                    tally.missing += 1;
                    Err(Error::Missing { attempts })
                }
            };
            let _ = slot.reply.send(outcome);
        }
        self.finish(info.id, &key, tally, retries);
    }

    /// A cancelled flush: its items are abandoned.
    fn abandon_in_flight(self: &Arc<Self>, id: u64, key: K) {
        let Some(slots) = self.state.lock().take_in_flight(id) else {
            return;
        };
        let tally = Tally {
            abandoned: slots.len() as u64,
            ..Tally::default()
        };
        self.resolve_abandoned(&key, slots);
        self.finish(id, &key, tally, Vec::new());
    }

    fn finish(
        self: &Arc<Self>,
        id: u64,
        key: &K,
        tally: Tally,
        retries: Vec<RetryEntry<K, T, F::Output, F::Error>>,
    ) {
        let (finished, abandoned) = self.state.lock().finish(id, key, tally, retries);
        let resolved =
            (tally.succeeded + tally.failed + tally.abandoned) as usize + abandoned.len();
        if !abandoned.is_empty() {
            self.resolve_abandoned(key, abandoned);
        }
        self.room.add_permits(resolved);
        if let Some(launch) = finished.launch {
            self.spawn(launch);
        }
        if finished.wake {
            self.wake_driver.notify_one();
        }
        if finished.drained {
            self.drained.notify_waiters();
            self.wake_driver.notify_one();
        }
    }

    fn resolve_abandoned(&self, key: &K, slots: Vec<SlotOf<K, T, F>>) {
        if let Some(observer) = &self.observer {
            observer.on_abandoned(key, slots.len());
        }
        for slot in slots {
            let _ = slot.reply.send(Err(Error::Abandoned));
        }
    }

    /// Resolves retries the budget held back past their deadline to their last failure (the
    /// state already counted them as failed).
    fn give_up(&self, given_up: Vec<RetryEntry<K, T, F::Output, F::Error>>) {
        let count = given_up.len();
        tracing::warn!(
            count,
            "retries held back by the retry budget until their deadline; giving up"
        );
        let mut by_key: Vec<(K, Vec<T>)> = Vec::new();
        for retry in given_up {
            let attempts = retry.slot.attempts;
            let outcome = match retry.last {
                Some(source) => Err(Error::Failed { source, attempts }),
                None => Err(Error::Missing { attempts }),
            };
            let _ = retry.slot.reply.send(outcome);
            match by_key.iter_mut().find(|(key, _)| *key == retry.key) {
                Some((_, items)) => items.push(retry.item),
                None => by_key.push((retry.key, vec![retry.item])),
            }
        }
        if let Some(observer) = &self.observer {
            for (key, items) in &by_key {
                observer.on_given_up(key, items);
            }
        }
        self.room.add_permits(count);
    }

    /// The timer loop: seals batches whose time has come and starts due retries. Ends once
    /// the batcher is closed and holds nothing.
    async fn drive(self: Arc<Self>) {
        loop {
            let (due, done, drained) = {
                let mut state = self.state.lock();
                let due = state.due(Instant::now(), &self.settings);
                let drained = state.book.pending == 0;
                (due, state.book.closed && drained, drained)
            };
            let next = due.next;
            self.spawn_all(due.launches);
            if !due.given_up.is_empty() {
                self.give_up(due.given_up);
                if drained {
                    self.drained.notify_waiters();
                }
            }
            if done {
                return;
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = self.wake_driver.notified() => {}
                    }
                }
                None => self.wake_driver.notified().await,
            }
        }
    }

    /// Seals the open batches of `key` (or of every key) and returns waiters for them.
    pub(crate) fn flush(self: &Arc<Self>, key: Option<&K>) -> Vec<oneshot::Receiver<()>> {
        let mut launches = Vec::new();
        let mut waiters = Vec::new();
        {
            let mut state = self.state.lock();
            let keys = match key {
                Some(key) => vec![key.clone()],
                None => state.keys(),
            };
            for key in &keys {
                let (launch, waiter) = state.flush_key(key, &self.settings);
                launches.extend(launch);
                waiters.extend(waiter);
            }
        }
        self.spawn_all(launches);
        waiters
    }

    pub(crate) fn stats(&self) -> Stats {
        self.state.lock().stats()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().book.closed
    }

    /// Stops intake, flushes everything, waits up to `timeout`, then abandons what is left.
    pub(crate) async fn close(self: &Arc<Self>, timeout: Duration) -> CloseReport {
        let deadline = Instant::now() + timeout;
        let (before, pending_at_close, launches) = {
            let mut state = self.state.lock();
            state.book.closed = true;
            let launches = state.seal_all(FlushReason::Close, &self.settings);
            (state.book.counters.clone(), state.book.pending, launches)
        };
        self.room.close();
        self.spawn_all(launches);
        self.wake_driver.notify_one();
        let timed_out = tokio::time::timeout_at(deadline, self.wait_drained())
            .await
            .is_err();
        if timed_out {
            let taken = self.state.lock().abandon_idle_items();
            let count: usize = taken.iter().map(|(_, slots)| slots.len()).sum();
            tracing::warn!(
                abandoned_not_in_flight = count,
                "close timed out; abandoning what is left"
            );
            self.cancel.cancel();
            // Flushes still running are not waited for: a transport that never yields (or
            // ignores cancellation) must not hold close past its timeout. Their items are
            // abandoned now; whatever those flushes return later finds nothing to resolve.
            let in_flight = self.state.lock().abandon_in_flight();
            let count = count
                + in_flight
                    .iter()
                    .map(|(_, slots)| slots.len())
                    .sum::<usize>();
            for (key, slots) in taken.into_iter().chain(in_flight) {
                self.resolve_abandoned(&key, slots);
            }
            self.room.add_permits(count);
            self.drained.notify_waiters();
            self.wake_driver.notify_one();
        }
        let after = self.state.lock().book.counters.clone();
        CloseReport {
            pending_at_close,
            succeeded: after.items_succeeded - before.items_succeeded,
            failed: after.items_failed - before.items_failed,
            abandoned: after.items_abandoned - before.items_abandoned,
            timed_out,
        }
    }

    async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.lock().book.pending == 0 {
                return;
            }
            notified.await;
        }
    }
}
