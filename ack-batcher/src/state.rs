//! The batcher's bookkeeping, changed only under one lock and never awaiting.
//!
//! Every accepted item lives in exactly one place until its outcome is delivered: an open
//! batch, a queued (sealed) batch, an in-flight record, or the retry schedule. Items move
//! between those places here; the flushing tasks and the driver in `shared` do the I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::budget::{RetryBudget, Spending};
use crate::config::Settings;
use crate::ticket::Reply;
use crate::{FlushReason, Stats};

/// The capacity an open batch starts with (it grows up to `max_items` as needed).
const OPEN_CAPACITY: usize = 64;

/// What the batcher keeps of an item besides the item itself.
pub(crate) struct Slot<O, E> {
    pub(crate) reply: Reply<O, E>,
    pub(crate) deadline: Option<Instant>,
    /// Attempts started so far.
    pub(crate) attempts: u32,
}

/// The batch of a key that is still filling.
struct Open<T, O, E> {
    id: u64,
    items: Vec<T>,
    slots: Vec<Slot<O, E>>,
    flush_at: Instant,
    by_deadline: bool,
}

/// A batch that is complete and waits for a free in-flight slot of its key.
pub(crate) struct Sealed<T, O, E> {
    id: u64,
    reason: FlushReason,
    items: Vec<T>,
    slots: Vec<Slot<O, E>>,
}

/// A batch handed to a flushing task: the task owns the items, the state keeps the slots.
#[derive(Debug)]
pub(crate) struct Launch<K, T> {
    pub(crate) id: u64,
    pub(crate) reason: FlushReason,
    pub(crate) key: K,
    pub(crate) items: Vec<T>,
}

/// An item waiting to be sent again, alone.
pub(crate) struct RetryEntry<K, T, O, E> {
    pub(crate) due: Instant,
    pub(crate) key: K,
    pub(crate) item: T,
    pub(crate) slot: Slot<O, E>,
    /// The failure that asked for this retry (`None`: a missing reply), what the item
    /// resolves to if the retry budget holds it back past its deadline.
    pub(crate) last: Option<E>,
}

struct KeyState<T, O, E> {
    open: Option<Open<T, O, E>>,
    queued: VecDeque<Sealed<T, O, E>>,
    in_flight: usize,
    /// Ids of this key's sealed batches that have not completed (queued or in flight).
    outstanding: BTreeSet<u64>,
    /// Explicit flushes waiting for every batch up to the given id to complete.
    waiters: Vec<(u64, oneshot::Sender<()>)>,
}

impl<T, O, E> KeyState<T, O, E> {
    fn new() -> Self {
        Self {
            open: None,
            queued: VecDeque::new(),
            in_flight: 0,
            outstanding: BTreeSet::new(),
            waiters: Vec::new(),
        }
    }

    fn is_idle(&self) -> bool {
        self.open.is_none() && self.queued.is_empty() && self.in_flight == 0
    }

    /// Wakes the explicit flushes whose batches have all completed.
    fn wake_waiters(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        let oldest = self.outstanding.first().copied();
        let (done, waiting) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|(up_to, _)| oldest.is_none_or(|oldest| oldest > *up_to));
        self.waiters = waiting;
        for (_, waiter) in done {
            let _ = waiter.send(());
        }
    }
}

/// Everything except the per-key map, so that both can be borrowed at once.
pub(crate) struct Book<K, T, O, E> {
    timers: BTreeMap<(Instant, u64), K>,
    retries: BTreeMap<(Instant, u64), RetryEntry<K, T, O, E>>,
    /// The slots of batches being flushed, by batch id.
    in_flight: HashMap<u64, (K, Vec<Slot<O, E>>)>,
    next_id: u64,
    pub(crate) closed: bool,
    /// Set when close ran out of time: nothing new is scheduled, everything left is abandoned.
    pub(crate) abandoning: bool,
    pub(crate) pending: usize,
    queued: usize,
    /// When the driver will wake next; `None` while it waits for a nudge.
    pub(crate) driver_at: Option<Instant>,
    pub(crate) counters: Stats,
    budget: RetryBudget,
    spending: Spending,
}

impl<K, T, O, E> Book<K, T, O, E> {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether the driver must be nudged to wake before `at`.
    fn is_earlier_than_driver(&self, at: Instant) -> bool {
        self.driver_at.is_none_or(|driver_at| at < driver_at)
    }

    /// Counts a sealed batch, then starts it or queues it behind the key's in-flight limit.
    fn dispatch(
        &mut self,
        ks: &mut KeyState<T, O, E>,
        key: K,
        sealed: Sealed<T, O, E>,
        limit: usize,
    ) -> Option<Launch<K, T>>
    where
        K: Clone,
    {
        if sealed.reason != FlushReason::Retry {
            self.spending.first_attempt(Instant::now(), &self.budget);
        }
        self.counters.batches_by_reason[sealed.reason.index()] += 1;
        self.counters.batch_sizes.record(sealed.items.len());
        ks.outstanding.insert(sealed.id);
        if ks.in_flight < limit {
            Some(self.start(ks, key, sealed))
        } else {
            ks.queued.push_back(sealed);
            self.queued += 1;
            None
        }
    }

    fn start(&mut self, ks: &mut KeyState<T, O, E>, key: K, sealed: Sealed<T, O, E>) -> Launch<K, T>
    where
        K: Clone,
    {
        let Sealed {
            id,
            reason,
            items,
            mut slots,
        } = sealed;
        for slot in &mut slots {
            slot.attempts += 1;
        }
        ks.in_flight += 1;
        self.in_flight.insert(id, (key.clone(), slots));
        Launch {
            id,
            reason,
            key,
            items,
        }
    }

    /// Seals the key's open batch, if any.
    fn seal(
        &mut self,
        ks: &mut KeyState<T, O, E>,
        key: K,
        reason: FlushReason,
        limit: usize,
    ) -> Option<Launch<K, T>>
    where
        K: Clone,
    {
        let open = ks.open.take()?;
        self.timers.remove(&(open.flush_at, open.id));
        let sealed = Sealed {
            id: open.id,
            reason,
            items: open.items,
            slots: open.slots,
        };
        self.dispatch(ks, key, sealed, limit)
    }

    /// Adds one item to the key's open batch (opening one if needed) and seals it when full
    /// or when the item's deadline leaves no time to wait.
    fn push(
        &mut self,
        ks: &mut KeyState<T, O, E>,
        key: K,
        item: T,
        slot: Slot<O, E>,
        s: &Settings,
    ) -> Pushed<K, T>
    where
        K: Clone,
    {
        let mut wake = false;
        let deadline_at = slot.deadline.map(|d| {
            d.checked_sub(s.deadline_margin)
                .unwrap_or_else(Instant::now)
        });
        let open = match &mut ks.open {
            Some(open) => open,
            None => {
                let id = self.new_id();
                let flush_at = Instant::now() + s.max_delay;
                self.timers.insert((flush_at, id), key.clone());
                wake = self.is_earlier_than_driver(flush_at);
                // Presized for the common case without reserving max_items for sparse keys.
                let capacity = s.max_items.min(OPEN_CAPACITY);
                ks.open.insert(Open {
                    id,
                    items: Vec::with_capacity(capacity),
                    slots: Vec::with_capacity(capacity),
                    flush_at,
                    by_deadline: false,
                })
            }
        };
        open.items.push(item);
        open.slots.push(slot);
        let mut due_now = false;
        if let Some(at) = deadline_at.filter(|at| *at < open.flush_at) {
            let stale = (open.flush_at, open.id);
            open.flush_at = at;
            open.by_deadline = true;
            due_now = at <= Instant::now();
            if let Some(key) = self.timers.remove(&stale) {
                self.timers.insert((at, stale.1), key);
            }
            wake |= self.is_earlier_than_driver(at);
        }
        let limit = s.max_in_flight_per_key;
        let launch = if open.items.len() >= s.max_items {
            self.seal(ks, key, FlushReason::Size, limit)
        } else if due_now {
            self.seal(ks, key, FlushReason::Deadline, limit)
        } else {
            None
        };
        Pushed { launch, wake }
    }
}

/// What adding an item asks the caller to do once the lock is released.
#[derive(Debug)]
pub(crate) struct Pushed<K, T> {
    pub(crate) launch: Option<Launch<K, T>>,
    /// The driver must be nudged: a timer earlier than its next wake was added.
    pub(crate) wake: bool,
}

/// Items taken out of the state to be resolved as abandoned, grouped by key.
/// What [`State::due`] found: batches to start, when to look again, and retries the budget
/// held back until their deadline passed (already counted as failed; their items still
/// need their outcome).
pub(crate) struct Due<K, T, O, E> {
    pub(crate) launches: Vec<Launch<K, T>>,
    pub(crate) next: Option<Instant>,
    pub(crate) given_up: Vec<RetryEntry<K, T, O, E>>,
}

/// The due retries of one key, in the order they became due.
type RetriesOf<K, T, O, E> = Vec<RetryEntry<K, T, O, E>>;

pub(crate) type AbandonedSlots<K, O, E> = Vec<(K, Vec<Slot<O, E>>)>;

/// What completing a batch asks the caller to do once the lock is released.
#[derive(Debug)]
pub(crate) struct Finished<K, T> {
    pub(crate) launch: Option<Launch<K, T>>,
    pub(crate) wake: bool,
    pub(crate) drained: bool,
}

/// How a completed batch's items ended, for the counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
    pub(crate) terminal: u64,
    pub(crate) abandoned: u64,
    pub(crate) missing: u64,
    pub(crate) extra: u64,
    /// The transport panicked on the batch.
    pub(crate) panicked: bool,
    /// The flush ran past `flush_timeout`.
    pub(crate) timed_out: bool,
}

impl Tally {
    fn resolved(&self) -> usize {
        (self.succeeded + self.failed + self.abandoned) as usize
    }
}

/// The whole bookkeeping: per-key batches plus the shared book.
pub(crate) struct State<K, T, O, E> {
    keys: HashMap<K, KeyState<T, O, E>>,
    pub(crate) book: Book<K, T, O, E>,
}

impl<K, T, O, E> State<K, T, O, E>
where
    K: Clone + Eq + Hash,
{
    pub(crate) fn new(budget: RetryBudget) -> Self {
        Self {
            keys: HashMap::new(),
            book: Book {
                timers: BTreeMap::new(),
                retries: BTreeMap::new(),
                in_flight: HashMap::new(),
                next_id: 0,
                closed: false,
                abandoning: false,
                pending: 0,
                queued: 0,
                driver_at: None,
                counters: Stats::default(),
                budget,
                spending: Spending::default(),
            },
        }
    }

    /// Accepts an item: into its key's open batch, or straight out as a batch of one.
    pub(crate) fn add(
        &mut self,
        key: K,
        item: T,
        slot: Slot<O, E>,
        immediate: bool,
        s: &Settings,
    ) -> Pushed<K, T> {
        let book = &mut self.book;
        book.pending += 1;
        book.counters.items_submitted += 1;
        let place = |book: &mut Book<K, T, O, E>, ks: &mut KeyState<T, O, E>, key: K| {
            if immediate {
                let sealed = Sealed {
                    id: book.new_id(),
                    reason: FlushReason::Immediate,
                    items: vec![item],
                    slots: vec![slot],
                };
                let launch = book.dispatch(ks, key, sealed, s.max_in_flight_per_key);
                Pushed {
                    launch,
                    wake: false,
                }
            } else {
                book.push(ks, key, item, slot, s)
            }
        };
        if let Some(ks) = self.keys.get_mut(&key) {
            return place(book, ks, key);
        }
        let mut ks = KeyState::new();
        let pushed = place(book, &mut ks, key.clone());
        if !ks.is_idle() {
            self.keys.insert(key, ks);
        }
        pushed
    }

    /// Seals the key's open batch and registers a waiter for every batch of the key sealed
    /// so far. `None` when the key has nothing outstanding.
    pub(crate) fn flush_key(
        &mut self,
        key: &K,
        s: &Settings,
    ) -> (Option<Launch<K, T>>, Option<oneshot::Receiver<()>>) {
        let Some(ks) = self.keys.get_mut(key) else {
            return (None, None);
        };
        let launch = self.book.seal(
            ks,
            key.clone(),
            FlushReason::Explicit,
            s.max_in_flight_per_key,
        );
        let waiter = ks.outstanding.last().map(|up_to| {
            let (tx, rx) = oneshot::channel();
            ks.waiters.push((*up_to, tx));
            rx
        });
        (launch, waiter)
    }

    /// Every key with something outstanding.
    pub(crate) fn keys(&self) -> Vec<K> {
        self.keys.keys().cloned().collect()
    }

    /// Seals every open batch (close).
    pub(crate) fn seal_all(&mut self, reason: FlushReason, s: &Settings) -> Vec<Launch<K, T>> {
        let book = &mut self.book;
        self.keys
            .iter_mut()
            .filter_map(|(key, ks)| book.seal(ks, key.clone(), reason, s.max_in_flight_per_key))
            .collect()
    }

    /// Seals the batches whose flush time has come and turns due retries into batches of
    /// one. Returns the launches and the next time the driver must wake.
    pub(crate) fn due(&mut self, now: Instant, s: &Settings) -> Due<K, T, O, E> {
        let mut launches = Vec::new();
        let mut given_up = Vec::new();
        let limit = s.max_in_flight_per_key;
        while let Some(entry) = self.book.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), key) = entry.remove_entry();
            let Some(ks) = self.keys.get_mut(&key) else {
                continue;
            };
            let reason = match &ks.open {
                Some(open) if open.id == id && open.by_deadline => FlushReason::Deadline,
                Some(open) if open.id == id => FlushReason::Delay,
                _ => continue,
            };
            // The timer entry is already gone; `seal` removing it again is a no-op.
            launches.extend(self.book.seal(ks, key, reason, limit));
        }
        // Retries of one key that are due together go out together, up to `max_items` per
        // batch, in the order they became due: a failing server sees one request per failed
        // batch and attempt, not one per item.
        let mut due_retries: Vec<(K, RetriesOf<K, T, O, E>)> = Vec::new();
        let mut by_key: HashMap<K, usize> = HashMap::new();
        while let Some(entry) = self.book.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let retry = entry.remove();
            match by_key.get(&retry.key) {
                Some(&at) => due_retries[at].1.push(retry),
                None => {
                    by_key.insert(retry.key.clone(), due_retries.len());
                    due_retries.push((retry.key.clone(), vec![retry]));
                }
            }
        }
        for (key, retries) in due_retries {
            let mut retries = retries.into_iter().peekable();
            while retries.peek().is_some() {
                let chunk: Vec<_> = retries.by_ref().take(s.max_items).collect();
                let book = &mut self.book;
                if !book.spending.try_retry(now, &book.budget) {
                    // Over the budget: wait another backoff, or give up at the deadline.
                    book.counters.retries_deferred += chunk.len() as u64;
                    let unit = s.retry.draw();
                    for mut retry in chunk {
                        let due = now + s.retry.jittered_delay(retry.slot.attempts, unit);
                        if retry.slot.deadline.is_some_and(|deadline| due >= deadline) {
                            given_up.push(retry);
                        } else {
                            retry.due = due;
                            let id = book.new_id();
                            book.retries.insert((due, id), retry);
                        }
                    }
                    continue;
                }
                let (items, slots): (Vec<T>, Vec<Slot<O, E>>) = chunk
                    .into_iter()
                    .map(|retry| (retry.item, retry.slot))
                    .unzip();
                let sealed = Sealed {
                    id: book.new_id(),
                    reason: FlushReason::Retry,
                    items,
                    slots,
                };
                let ks = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
                launches.extend(book.dispatch(ks, key.clone(), sealed, limit));
            }
        }
        let next_timer = self.book.timers.first_key_value().map(|((at, _), _)| *at);
        let next_retry = self.book.retries.first_key_value().map(|((at, _), _)| *at);
        let next = match (next_timer, next_retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.book.driver_at = next;
        let count = given_up.len();
        self.book.pending -= count;
        self.book.counters.items_failed += count as u64;
        Due {
            launches,
            next,
            given_up,
        }
    }

    /// Takes an in-flight batch's slots for resolution; `None` if it was abandoned meanwhile.
    pub(crate) fn take_in_flight(&mut self, id: u64) -> Option<Vec<Slot<O, E>>> {
        self.book.in_flight.remove(&id).map(|(_, slots)| slots)
    }

    /// Takes the items of every batch still being flushed (close ran out of time): they are
    /// counted as abandoned here, and the flushes, whenever they end, find nothing to resolve.
    pub(crate) fn abandon_in_flight(&mut self) -> AbandonedSlots<K, O, E> {
        let book = &mut self.book;
        let mut taken: AbandonedSlots<K, O, E> = Vec::new();
        for (id, (key, slots)) in book.in_flight.drain() {
            if let Some(ks) = self.keys.get_mut(&key) {
                ks.in_flight -= 1;
                ks.outstanding.remove(&id);
                ks.wake_waiters();
            }
            taken.push((key, slots));
        }
        let count: usize = taken.iter().map(|(_, slots)| slots.len()).sum();
        book.pending -= count;
        book.counters.items_abandoned += count as u64;
        self.keys.retain(|_, ks| !ks.is_idle());
        taken
    }

    /// Books the end of an in-flight batch: counters, retries to schedule, the key's next
    /// queued batch, waiters, and the key's release when it went idle.
    pub(crate) fn finish(
        &mut self,
        id: u64,
        key: &K,
        tally: Tally,
        retries: Vec<RetryEntry<K, T, O, E>>,
    ) -> (Finished<K, T>, Vec<Slot<O, E>>) {
        let book = &mut self.book;
        let c = &mut book.counters;
        c.items_succeeded += tally.succeeded;
        c.items_failed += tally.failed;
        c.terminal_failures += tally.terminal;
        c.items_abandoned += tally.abandoned;
        c.missing_replies += tally.missing;
        c.extra_replies += tally.extra;
        c.flush_panics += u64::from(tally.panicked);
        c.flush_timeouts += u64::from(tally.timed_out);
        book.pending -= tally.resolved();
        let mut wake = false;
        let mut abandoned = Vec::new();
        if book.abandoning {
            book.pending -= retries.len();
            book.counters.items_abandoned += retries.len() as u64;
            abandoned.extend(retries.into_iter().map(|retry| retry.slot));
        } else {
            book.counters.retries += retries.len() as u64;
            for retry in retries {
                wake |= book.is_earlier_than_driver(retry.due);
                let id = book.new_id();
                book.retries.insert((retry.due, id), retry);
            }
        }
        let mut launch = None;
        let mut idle = false;
        if let Some(ks) = self.keys.get_mut(key) {
            ks.in_flight -= 1;
            ks.outstanding.remove(&id);
            if let Some(sealed) = ks.queued.pop_front() {
                book.queued -= 1;
                launch = Some(book.start(ks, key.clone(), sealed));
            }
            ks.wake_waiters();
            idle = ks.is_idle();
        }
        if idle {
            self.keys.remove(key);
        }
        let finished = Finished {
            launch,
            wake,
            drained: self.book.pending == 0,
        };
        (finished, abandoned)
    }

    /// Close ran out of time: takes every item that is not in flight (open, queued, awaiting
    /// retry) out of the state, counted as abandoned. In-flight batches are abandoned by their
    /// own tasks once cancelled.
    pub(crate) fn abandon_idle_items(&mut self) -> AbandonedSlots<K, O, E> {
        let book = &mut self.book;
        book.abandoning = true;
        let mut taken: AbandonedSlots<K, O, E> = Vec::new();
        for (key, ks) in &mut self.keys {
            let mut slots = Vec::new();
            if let Some(open) = ks.open.take() {
                book.timers.remove(&(open.flush_at, open.id));
                slots.extend(open.slots);
            }
            for sealed in ks.queued.drain(..) {
                ks.outstanding.remove(&sealed.id);
                slots.extend(sealed.slots);
            }
            ks.wake_waiters();
            if !slots.is_empty() {
                taken.push((key.clone(), slots));
            }
        }
        book.queued = 0;
        for (_, retry) in std::mem::take(&mut book.retries) {
            taken.push((retry.key, vec![retry.slot]));
        }
        let count: usize = taken.iter().map(|(_, slots)| slots.len()).sum();
        book.pending -= count;
        book.counters.items_abandoned += count as u64;
        self.keys.retain(|_, ks| !ks.is_idle());
        taken
    }

    /// A snapshot of the counters and gauges.
    pub(crate) fn stats(&self) -> Stats {
        let book = &self.book;
        Stats {
            pending: book.pending,
            in_flight: book.in_flight.len(),
            queued: book.queued,
            awaiting_retry: book.retries.len(),
            keys: self.keys.len(),
            ..book.counters.clone()
        }
    }
}
