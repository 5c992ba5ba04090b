//! Producer batching: per partition (and transaction, since one `SEND` carries at most one;
//! and, with key-based batching, per message key) one open batch, sealed by count, bytes,
//! delay, flush or close; every sealed batch one `SEND`, every message's future resolving to
//! its own [`MessageId`].
//!
//! Order: a batch is sealed and its frame queued on the partition producer under one lock
//! ([`Batches`]'s, then the partition's sequencer), so a partition's batches reach the wire
//! in the order they were sealed, with growing sequence ids, as a broker with deduplication
//! requires; many of them may wait for their receipts at once (the Java client's pipelining),
//! bounded by the messages the batcher holds. A batch's messages share one [`Outcome`]: one
//! completion per batch, not per message.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, TryAcquireError};
use txn_ack::TxnId;

use super::message::OutgoingMessage;
use super::partition::{BatchReceipt, PartitionSet};
use super::queue::{IntoSlot, Slot};
use crate::Error;
use crate::id::MessageId;

/// When a producer seals a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchingOptions {
    pub(crate) max_messages: usize,
    pub(crate) max_bytes: usize,
    pub(crate) max_delay: Duration,
    pub(crate) key_based: bool,
}

impl Default for BatchingOptions {
    /// 1,000 messages, 128 KiB or 1 ms after a batch's first message, whichever comes first
    /// (the Java client's defaults); messages of any key batched together.
    fn default() -> Self {
        Self {
            max_messages: 1000,
            max_bytes: 128 * 1024,
            max_delay: Duration::from_millis(1),
            key_based: false,
        }
    }
}

impl BatchingOptions {
    /// The most messages in one batch (default 1,000; at most [`crate::MAX_BATCH_MESSAGES`]).
    #[must_use]
    pub fn max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// A batch is sealed before a message would take it beyond this many bytes (default
    /// 128 KiB; capped at half the broker's largest message). A soft limit: a message
    /// arriving while a batch is sealed for its delay may still join it.
    #[must_use]
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The longest a message waits for its batch to fill (default 1 ms).
    #[must_use]
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// Batches by key (default off; the Java client's `BatcherBuilder.KEY_BASED`): a batch
    /// holds messages of one key only, the ordering key when a message has one, else its
    /// partition key; messages without either are batched together. Each batch's entry
    /// carries its key (`ordering_key`, `partition_key`), and the limits apply to each key's
    /// batch on its own.
    ///
    /// **Key_Shared consumers need it** (or no batching): the broker dispatches a whole entry
    /// by the entry's key, and an entry of mixed keys has none, so its messages all go to the
    /// consumer of the `NONE_KEY` hash, whichever consumer owns their own keys — a key then
    /// reaches two consumers and its order is lost. A key's messages keep their order; the
    /// sequence ids on the wire keep growing across keys.
    #[must_use]
    pub fn key_based(mut self, key_based: bool) -> Self {
        self.key_based = key_based;
        self
    }

    /// Whether batches are formed per key ([`BatchingOptions::key_based`]).
    pub fn is_key_based(&self) -> bool {
        self.key_based
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Error::Invalid {
            what: "batching options",
            reason,
        };
        if !(1..=crate::MAX_BATCH_MESSAGES as usize).contains(&self.max_messages) {
            return Err(invalid(format!(
                "max_messages {} is not in 1..={}",
                self.max_messages,
                crate::MAX_BATCH_MESSAGES
            )));
        }
        if self.max_bytes == 0 {
            return Err(invalid("max_bytes must be positive".into()));
        }
        if self.max_delay.is_zero() || self.max_delay > Duration::from_secs(3600) {
            return Err(invalid(format!(
                "max_delay {:?} is not between 1 ns and 1 h",
                self.max_delay
            )));
        }
        Ok(())
    }
}

/// A batch's key: the partition index, the transaction, if any, and with key-based batching
/// the messages' key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BatchKey {
    pub(crate) partition: usize,
    pub(crate) txn: Option<TxnId>,
    pub(crate) group: Option<KeyGroup>,
}

impl BatchKey {
    /// Whether it is a partition's default batch (no transaction, no key), which has a place
    /// of its own instead of an entry in a map.
    fn is_plain(&self) -> bool {
        self.txn.is_none() && self.group.is_none()
    }
}

/// The key a key-based batch is formed by: the ordering key takes precedence over the
/// partition key, as the broker's sticky key does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum KeyGroup {
    Ordering(Bytes),
    Partition(String),
}

impl KeyGroup {
    /// The group of `message`, `None` for a message without keys.
    pub(crate) fn of(message: &OutgoingMessage) -> Option<Self> {
        match (&message.extras().ordering_key, &message.extras().key) {
            (Some(ordering), _) => Some(Self::Ordering(ordering.clone())),
            (None, Some(key)) => Some(Self::Partition(key.clone())),
            (None, None) => None,
        }
    }
}

/// Where sealed batches go: the partition producers (or, in tests, a recorder).
pub(crate) trait BatchSink: Send + Sync + 'static {
    /// Numbers `messages` and queues them as one batch entry to `partition` before it
    /// returns, so that batches reach the wire in the order they are started; returns the
    /// wait for the entry's receipt.
    fn start_batch(
        &self,
        partition: usize,
        messages: &[OutgoingMessage],
        txn: Option<TxnId>,
    ) -> Result<BatchReceipt, Error>;

    /// The smallest `max_message_size` of the partitions.
    fn max_message_size(&self) -> usize;
}

impl BatchSink for PartitionSet {
    fn start_batch(
        &self,
        partition: usize,
        messages: &[OutgoingMessage],
        txn: Option<TxnId>,
    ) -> Result<BatchReceipt, Error> {
        let producer = self.get(partition).ok_or_else(|| Error::Invalid {
            what: "partition",
            reason: format!("{partition} is not a partition of this producer"),
        })?;
        producer.start_batch(messages, txn)
    }

    fn max_message_size(&self) -> usize {
        self.all()
            .iter()
            .map(|p| p.max_message_size)
            .min()
            .unwrap_or(usize::MAX)
    }
}

/// The result of one batch, shared by its messages' sends: set once, when the receipt (or
/// the failure) comes, then every waiting send is woken. Each message's send registers its
/// waker at its index in the batch (a [`Receipt`], a few words) and, once woken, reads the
/// result without a lock; [`ProducerBatcher::flush`] and [`ProducerBatcher::close`] wait on
/// `done`.
#[derive(Debug, Default)]
struct Outcome {
    /// Set before the wakers are taken, so that a send that finds no result under the
    /// wakers' lock has its waker taken and woken after the result is set.
    result: OnceLock<Result<MessageId, Error>>,
    /// The waker of each message's send that waits, by its index in the batch.
    wakers: Mutex<Vec<Option<Waker>>>,
    done: Notify,
}

impl Outcome {
    /// Sets the result (the first one set stays) and wakes the waiting sends.
    fn resolve(&self, result: Result<MessageId, Error>) {
        // A second result (a close that abandons a batch answered meanwhile) is dropped.
        let _ = self.result.set(result);
        let wakers = std::mem::take(&mut *self.wakers.lock());
        for waker in wakers.into_iter().flatten() {
            waker.wake();
        }
        self.done.notify_waiters();
    }

    /// The result, or `Pending` with the waker of the message at `index` registered.
    fn poll_for(&self, index: usize, cx: &mut Context<'_>) -> Poll<Result<MessageId, Error>> {
        if let Some(result) = self.result.get() {
            return Poll::Ready(result.clone());
        }
        let mut wakers = self.wakers.lock();
        // Set between the first look and the lock: its wakers may be taken already.
        if let Some(result) = self.result.get() {
            return Poll::Ready(result.clone());
        }
        if wakers.len() <= index {
            wakers.resize_with(index + 1, || None);
        }
        match &mut wakers[index] {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            place => *place = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Waits for the result.
    async fn wait(&self) -> Result<MessageId, Error> {
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            // Registered before the check, so that a result set in between still wakes it.
            notified.as_mut().enable();
            if let Some(result) = self.result.get() {
                return result.clone();
            }
            notified.await;
        }
    }

    fn is_resolved(&self) -> bool {
        self.result.get().is_some()
    }
}

/// A batched message's wait for its id: its batch's [`Outcome`] and its index there. A few
/// words, so that an application holding thousands of sends does not hold thousands of large
/// futures.
#[derive(Debug)]
pub(crate) struct Receipt {
    outcome: Arc<Outcome>,
    index: usize,
}

impl Future for Receipt {
    type Output = Result<MessageId, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let index = self.index;
        self.outcome.poll_for(index, cx).map(|result| {
            result.map(|entry| MessageId {
                batch_index: i32::try_from(index).unwrap_or(i32::MAX),
                ..entry
            })
        })
    }
}

/// A batch being filled.
#[derive(Debug)]
struct OpenBatch {
    messages: Vec<OutgoingMessage>,
    /// The messages' places in the producer's pending queue, merged into one, given back when
    /// the batch is answered, before the senders learn the result.
    slot: Option<Slot>,
    bytes: usize,
    /// Unique over the producer's batches, so that a stale timer never seals a newer batch.
    epoch: u64,
    outcome: Arc<Outcome>,
}

/// The open batches and the batches on the wire.
#[derive(Debug, Default)]
struct Batches {
    /// Each partition's default batch (no transaction, no key), by partition index.
    plain: Vec<Option<OpenBatch>>,
    /// The batches of transactions and keys; a key is dropped once its batch is sealed, so
    /// that the keys of key-based batching do not pile up.
    keyed: HashMap<BatchKey, OpenBatch>,
    next_epoch: u64,
    /// The batches sealed and not answered yet, by epoch, with their message counts.
    in_flight: HashMap<u64, (Arc<Outcome>, usize)>,
    closed: bool,
}

impl Batches {
    fn open_mut(&mut self, key: &BatchKey) -> Option<&mut OpenBatch> {
        if key.is_plain() {
            self.plain.get_mut(key.partition)?.as_mut()
        } else {
            self.keyed.get_mut(key)
        }
    }

    /// The open batch of `key`, started when there is none (then `true`).
    fn open_or_start(&mut self, key: &BatchKey, max_messages: usize) -> (&mut OpenBatch, bool) {
        let epoch = self.next_epoch + 1;
        let start = || OpenBatch {
            messages: Vec::with_capacity(max_messages.min(1024)),
            slot: None,
            bytes: 0,
            epoch,
            outcome: Arc::new(Outcome {
                result: OnceLock::new(),
                wakers: Mutex::new(Vec::with_capacity(max_messages.min(1024))),
                done: Notify::new(),
            }),
        };
        let (batch, opened) = if key.is_plain() {
            if self.plain.len() <= key.partition {
                self.plain.resize_with(key.partition + 1, || None);
            }
            let place = &mut self.plain[key.partition];
            let opened = place.is_none();
            (place.get_or_insert_with(start), opened)
        } else {
            let opened = !self.keyed.contains_key(key);
            (self.keyed.entry(key.clone()).or_insert_with(start), opened)
        };
        if opened {
            self.next_epoch = epoch;
        }
        (batch, opened)
    }

    fn take(&mut self, key: &BatchKey) -> Option<OpenBatch> {
        if key.is_plain() {
            self.plain.get_mut(key.partition)?.take()
        } else {
            self.keyed.remove(key)
        }
    }

    /// The keys of every open batch.
    fn open_keys(&self) -> Vec<BatchKey> {
        let plain = self.plain.iter().enumerate().filter(|(_, b)| b.is_some());
        plain
            .map(|(partition, _)| BatchKey {
                partition,
                txn: None,
                group: None,
            })
            .chain(self.keyed.keys().cloned())
            .collect()
    }

    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.plain.iter().flatten().count() + self.keyed.len()
    }
}

/// What the batcher shares with its timers and completion tasks.
#[derive(Debug)]
struct Shared<S> {
    sink: Arc<S>,
    options: BatchingOptions,
    batches: Mutex<Batches>,
    /// Bounds the messages the batcher holds (open and on the wire); a send waits for room.
    room: Semaphore,
}

impl<S: BatchSink> Shared<S> {
    /// Seals `key`'s open batch (the one of `epoch`, when given) and starts it on the sink,
    /// under the batches' lock: a partition's batches reach the wire in the order they are
    /// sealed. Returns the messages, to be dropped once the lock is released.
    fn seal(
        self: &Arc<Self>,
        batches: &mut Batches,
        key: &BatchKey,
        epoch: Option<u64>,
    ) -> Vec<OutgoingMessage> {
        if epoch.is_some_and(|epoch| batches.open_mut(key).is_none_or(|b| b.epoch != epoch)) {
            return Vec::new();
        }
        let Some(batch) = batches.take(key) else {
            return Vec::new();
        };
        let OpenBatch {
            messages,
            slot,
            epoch,
            outcome,
            ..
        } = batch;
        let count = messages.len();
        match self.sink.start_batch(key.partition, &messages, key.txn) {
            Ok(receipt) => {
                batches
                    .in_flight
                    .insert(epoch, (Arc::clone(&outcome), count));
                let shared = Arc::clone(self);
                tokio::spawn(async move {
                    let result = receipt.await;
                    shared.answered(epoch, slot, count, &outcome, result);
                });
            }
            Err(error) => {
                drop(slot);
                self.room.add_permits(count);
                outcome.resolve(Err(error));
            }
        }
        messages
    }

    /// A batch of `count` messages was answered: gives their places back, then tells the
    /// senders.
    fn answered(
        &self,
        epoch: u64,
        slot: Option<Slot>,
        count: usize,
        outcome: &Outcome,
        result: Result<MessageId, Error>,
    ) {
        drop(slot);
        self.room.add_permits(count);
        self.batches.lock().in_flight.remove(&epoch);
        outcome.resolve(result);
    }

    /// Seals the batch of `key` and `epoch` once the batching delay has passed (unless it was
    /// sealed before).
    fn arm_timer(self: &Arc<Self>, key: BatchKey, epoch: u64) {
        let weak = Arc::downgrade(self);
        let delay = self.options.max_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(shared) = weak.upgrade() {
                let sealed = {
                    let mut batches = shared.batches.lock();
                    shared.seal(&mut batches, &key, Some(epoch))
                };
                drop(sealed);
            }
        });
    }

    /// Seals every open batch; returns the outcomes of every batch on the wire then.
    fn seal_all(self: &Arc<Self>, close: bool) -> Vec<(Arc<Outcome>, usize)> {
        let mut dropped = Vec::new();
        let outcomes = {
            let mut batches = self.batches.lock();
            if close {
                batches.closed = true;
            }
            for key in batches.open_keys() {
                dropped.push(self.seal(&mut batches, &key, None));
            }
            batches.in_flight.values().cloned().collect()
        };
        drop(dropped);
        outcomes
    }
}

/// The producer's batcher: per partition (and transaction, and with key-based batching, key)
/// one open batch, sealed by count, bytes, delay, [`ProducerBatcher::flush`] or
/// [`ProducerBatcher::close`]; many sealed batches of a partition may wait for their
/// receipts at once, in order on the wire.
#[derive(Debug)]
pub(crate) struct ProducerBatcher<S: BatchSink = PartitionSet> {
    shared: Arc<Shared<S>>,
}

impl<S: BatchSink> ProducerBatcher<S> {
    /// A batcher sending to `sink`. It holds at most the larger of 65,536 messages and 64
    /// full batches (or the producer's pending limit, when larger, so that the producer's
    /// limit is the one that applies); further sends wait for room.
    pub(crate) fn new(
        sink: Arc<S>,
        mut options: BatchingOptions,
        max_pending_messages: Option<usize>,
    ) -> Result<Self, Error> {
        options.validate()?;
        let smallest = sink.max_message_size();
        options.max_bytes = options.max_bytes.min(smallest / 2).max(1);
        let room = (options.max_messages * 64)
            .max(65_536)
            .max(max_pending_messages.unwrap_or(0))
            .min(Semaphore::MAX_PERMITS);
        Ok(Self {
            shared: Arc::new(Shared {
                sink,
                options,
                batches: Mutex::new(Batches::default()),
                room: Semaphore::new(room),
            }),
        })
    }

    /// The batch key of a message to `partition` in `txn`: with key-based batching, its key
    /// is part of it.
    pub(crate) fn key(
        &self,
        partition: usize,
        txn: Option<TxnId>,
        message: &OutgoingMessage,
    ) -> BatchKey {
        BatchKey {
            partition,
            txn,
            group: if self.shared.options.key_based {
                KeyGroup::of(message)
            } else {
                None
            },
        }
    }

    /// Takes room for one message in the batcher when there is some now (`false`: a send
    /// waits for it in [`ProducerBatcher::send`]); then [`ProducerBatcher::add`] must follow.
    ///
    /// # Errors
    /// [`Error::Closed`] once the batcher is closing.
    pub(crate) fn try_reserve(&self) -> Result<bool, Error> {
        match self.shared.room.try_acquire() {
            Ok(permit) => {
                permit.forget();
                Ok(true)
            }
            Err(TryAcquireError::Closed) => Err(Error::Closed("the producer")),
            Err(TryAcquireError::NoPermits) => Ok(false),
        }
    }

    /// Adds a message to its key's batch, waiting for room in the batcher, and waits for its
    /// id; the message holds `slot` until its batch is answered. A send whose future is
    /// dropped still goes out once it is in its batch.
    pub(crate) async fn send(
        &self,
        key: BatchKey,
        message: OutgoingMessage,
        slot: Slot,
    ) -> Result<MessageId, Error> {
        let closed = || Error::Closed("the producer");
        match self.shared.room.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::Closed) => return Err(closed()),
            Err(TryAcquireError::NoPermits) => {
                Box::pin(self.shared.room.acquire())
                    .await
                    .map_err(|_| closed())?
                    .forget();
            }
        }
        self.add(key, message, slot)?.await
    }

    /// Puts a message in its key's batch (its room in the batcher taken: by
    /// [`ProducerBatcher::try_reserve`] or in [`ProducerBatcher::send`]), sealing the batch
    /// when it is full; the message holds `slot` until its batch is answered.
    ///
    /// # Errors
    /// [`Error::Closed`] once the batcher is closing (the room is given back).
    pub(crate) fn add(
        &self,
        key: BatchKey,
        message: OutgoingMessage,
        slot: impl IntoSlot,
    ) -> Result<Receipt, Error> {
        let shared = &self.shared;
        let size = message.encoded_size();
        let options = &shared.options;
        let mut dropped = Vec::new();
        let receipt = {
            let mut batches = shared.batches.lock();
            if batches.closed {
                drop(batches);
                shared.room.add_permits(1);
                return Err(Error::Closed("the producer"));
            }
            if batches
                .open_mut(&key)
                .is_some_and(|b| b.bytes + size > options.max_bytes)
            {
                dropped = shared.seal(&mut batches, &key, None);
            }
            let (batch, opened) = batches.open_or_start(&key, options.max_messages);
            if opened {
                shared.arm_timer(key.clone(), batch.epoch);
            }
            batch.messages.push(message);
            slot.merge_into(&mut batch.slot);
            batch.bytes += size;
            let receipt = Receipt {
                outcome: Arc::clone(&batch.outcome),
                index: batch.messages.len() - 1,
            };
            if batch.messages.len() >= options.max_messages {
                let sealed = shared.seal(&mut batches, &key, None);
                drop(batches);
                drop(sealed);
            }
            receipt
        };
        drop(dropped);
        Ok(receipt)
    }

    /// Seals every open batch and waits for the answers of every batch on the wire.
    pub(crate) async fn flush(&self) {
        for (outcome, _) in self.shared.seal_all(false) {
            let _ = outcome.wait().await;
        }
    }

    /// Stops taking messages, seals every open batch and waits for every batch on the wire,
    /// at most `deadline`; the sends of batches still unanswered then fail with
    /// [`Error::Closed`]. Returns how many messages were abandoned so.
    pub(crate) async fn close(&self, deadline: Duration) -> usize {
        self.shared.room.close();
        let outcomes = self.shared.seal_all(true);
        let all = async {
            for (outcome, _) in &outcomes {
                let _ = outcome.wait().await;
            }
        };
        if tokio::time::timeout(deadline, all).await.is_ok() {
            return 0;
        }
        let mut abandoned = 0;
        for (outcome, count) in outcomes {
            if !outcome.is_resolved() {
                abandoned += count;
                outcome.resolve(Err(Error::Closed("the producer")));
            }
        }
        abandoned
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// Records every batch it is given and answers with ids (entry = the batch's number):
    /// at once, or once the test adds a permit to `answers`; with `refuse`, refuses every
    /// batch.
    #[derive(Debug, Default)]
    struct Recorder {
        batches: Mutex<Vec<Vec<OutgoingMessage>>>,
        answers: Option<Arc<tokio::sync::Semaphore>>,
        refuse: bool,
    }

    impl BatchSink for Recorder {
        fn start_batch(
            &self,
            partition: usize,
            messages: &[OutgoingMessage],
            _txn: Option<TxnId>,
        ) -> Result<BatchReceipt, Error> {
            if self.refuse {
                return Err(Error::Invalid {
                    what: "batch",
                    reason: "refused by the test".into(),
                });
            }
            let entry = {
                let mut batches = self.batches.lock();
                batches.push(messages.to_vec());
                batches.len() as u64 - 1
            };
            let size = messages.len() as u32;
            let answers = self.answers.clone();
            Ok(Box::pin(async move {
                match answers {
                    Some(answers) => answers
                        .acquire()
                        .await
                        .map_err(|_| Error::Closed("the test's answers"))?
                        .forget(),
                    // Lets other batches start before this one is answered.
                    None => tokio::task::yield_now().await,
                }
                Ok(MessageId {
                    ledger_id: 1,
                    entry_id: entry,
                    partition: partition as i32,
                    batch_index: -1,
                    batch_size: Some(size),
                })
            }))
        }

        fn max_message_size(&self) -> usize {
            crate::DEFAULT_MAX_MESSAGE_SIZE
        }
    }

    /// Message `index` with an optional partition key `k<key>` and ordering key `o<ordering>`.
    fn message(index: usize, key: Option<u8>, ordering: Option<u8>) -> OutgoingMessage {
        let mut message = OutgoingMessage::new(index.to_string());
        if let Some(key) = key {
            message = message.key(format!("k{key}"));
        }
        if let Some(ordering) = ordering {
            message = message.ordering_key(format!("o{ordering}").into_bytes());
        }
        message
    }

    fn index_of(message: &OutgoingMessage) -> usize {
        std::str::from_utf8(message.payload())
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("payloads are indexes")
    }

    /// Sends `messages` concurrently through a batcher with `options` (virtual time); returns
    /// the recorded batches, each message's id, and how many keys still had an open batch.
    fn run(
        options: BatchingOptions,
        messages: Vec<OutgoingMessage>,
    ) -> (Vec<Vec<OutgoingMessage>>, Vec<MessageId>, usize) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let recorder = Arc::new(Recorder::default());
            let batcher =
                ProducerBatcher::new(Arc::clone(&recorder), options, None).expect("valid");
            let queue = crate::producer::queue::PendingQueue::unbounded();
            let sends = messages.into_iter().map(|message| {
                let key = batcher.key(0, None, &message);
                let queue = &queue;
                let batcher = &batcher;
                async move {
                    let slot = queue.admit().await?;
                    batcher.send(key, message, slot).await
                }
            });
            let ids = futures_util::future::join_all(sends)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, Error>>()
                .expect("every send succeeds");
            let open = batcher.shared.batches.lock().open_count();
            assert_eq!(queue.pending(), 0, "every message gave its place back");
            batcher.close(crate::DEFAULT_CLOSE_DEADLINE).await;
            let batches = std::mem::take(&mut *recorder.batches.lock());
            (batches, ids, open)
        })
    }

    fn keyed_messages() -> impl Strategy<Value = Vec<OutgoingMessage>> {
        proptest::collection::vec(
            (proptest::option::of(0u8..4), proptest::option::of(0u8..3)),
            1..120,
        )
        .prop_map(|keys| {
            keys.into_iter()
                .enumerate()
                .map(|(i, (key, ordering))| message(i, key, ordering))
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// With key-based batching a batch never holds two keys (the ordering key first, then
        /// the partition key, keyless messages apart), every message goes out once, a key's
        /// messages keep their order, and each message gets the id of its place.
        #[test]
        fn a_key_based_batch_never_mixes_keys(
            messages in keyed_messages(),
            max_messages in 1usize..8,
            max_bytes in prop_oneof![Just(usize::MAX), 20usize..200],
        ) {
            let options = BatchingOptions::default()
                .key_based(true)
                .max_messages(max_messages)
                .max_bytes(max_bytes)
                .max_delay(Duration::from_millis(5));
            let count = messages.len();
            let (batches, ids, open) = run(options, messages);
            let mut seen = vec![false; count];
            let mut last_of_group: HashMap<Option<KeyGroup>, usize> = HashMap::new();
            for (entry, batch) in batches.iter().enumerate() {
                prop_assert!(!batch.is_empty() && batch.len() <= max_messages);
                let group = KeyGroup::of(&batch[0]);
                for (position, message) in batch.iter().enumerate() {
                    prop_assert_eq!(&KeyGroup::of(message), &group, "batch {} mixes keys", entry);
                    let index = index_of(message);
                    prop_assert!(!std::mem::replace(&mut seen[index], true), "{} sent twice", index);
                    if let Some(previous) = last_of_group.insert(group.clone(), index) {
                        prop_assert!(previous < index, "{} went out after {}", previous, index);
                    }
                    prop_assert_eq!(ids[index].entry_id, entry as u64);
                    prop_assert_eq!(ids[index].batch_index, position as i32);
                }
            }
            prop_assert!(seen.iter().all(|s| *s), "a message was never sent");
            prop_assert_eq!(open, 0, "sealed batches leave no open key behind");
        }
    }

    #[test]
    fn the_ordering_key_takes_precedence_over_the_partition_key() {
        let messages = vec![
            message(0, Some(1), Some(7)),
            message(1, Some(2), Some(7)),
            message(2, Some(1), None),
            message(3, None, None),
            message(4, Some(1), None),
            message(5, None, None),
        ];
        let options = BatchingOptions::default().key_based(true);
        let (batches, _, _) = run(options, messages);
        let mut groups: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(index_of).collect())
            .collect();
        groups.sort();
        assert_eq!(groups, [vec![0, 1], vec![2, 4], vec![3, 5]]);
    }

    /// A recorder whose batches are answered only when the test adds permits to `answers`,
    /// or (`refuse`) that refuses every batch.
    fn gate(refuse: bool) -> Arc<Recorder> {
        Arc::new(Recorder {
            answers: Some(Arc::new(tokio::sync::Semaphore::new(0))),
            refuse,
            ..Recorder::default()
        })
    }

    /// The sizes of the batches `recorder` was given.
    fn batch_sizes(recorder: &Recorder) -> Vec<usize> {
        recorder.batches.lock().iter().map(Vec::len).collect()
    }

    fn answer(recorder: &Recorder, batches: usize) {
        if let Some(answers) = &recorder.answers {
            answers.add_permits(batches);
        }
    }

    /// Spawns a send of message `index` to partition 0.
    fn spawn_send(
        batcher: &Arc<ProducerBatcher<Recorder>>,
        queue: &Arc<crate::producer::queue::PendingQueue>,
        index: usize,
    ) -> tokio::task::JoinHandle<Result<MessageId, Error>> {
        let batcher = Arc::clone(batcher);
        let queue = Arc::clone(queue);
        tokio::spawn(async move {
            let message = message(index, None, None);
            let slot = queue.admit().await?;
            batcher
                .send(batcher.key(0, None, &message), message, slot)
                .await
        })
    }

    /// The regression of issue 17: one batch per partition on the wire at a time held the
    /// producer to a batch per round trip. Now a partition's sealed batches all go out
    /// before the first is answered, and each message still gets its own id, in order.
    #[tokio::test(start_paused = true)]
    async fn a_partition_has_many_batches_on_the_wire_at_once() {
        let gate = gate(false);
        let options = BatchingOptions::default()
            .max_messages(2)
            .max_delay(Duration::from_millis(10));
        let batcher =
            Arc::new(ProducerBatcher::new(Arc::clone(&gate), options, None).expect("valid"));
        let queue = Arc::new(crate::producer::queue::PendingQueue::unbounded());
        let mut sends = Vec::new();
        for index in 0..7 {
            sends.push(spawn_send(&batcher, &queue, index));
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        assert_eq!(
            batch_sizes(&gate),
            [2, 2, 2],
            "three full batches out, none answered"
        );
        assert_eq!(queue.pending(), 7);
        // The odd one goes out after the batching delay.
        tokio::time::sleep(Duration::from_millis(11)).await;
        assert_eq!(batch_sizes(&gate), [2, 2, 2, 1]);
        answer(&gate, 4);
        for (index, send) in sends.into_iter().enumerate() {
            let id = send.await.expect("joined").expect("sent");
            assert_eq!(
                (id.entry_id, id.batch_index, id.batch_size),
                (
                    (index / 2) as u64,
                    (index % 2) as i32,
                    Some(if index == 6 { 1 } else { 2 })
                )
            );
        }
        assert_eq!(queue.pending(), 0, "every place given back");
        assert_eq!(batcher.close(crate::DEFAULT_CLOSE_DEADLINE).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_batch_fails_each_of_its_messages_and_gives_their_places_back() {
        let gate = gate(true);
        let options = BatchingOptions::default().max_messages(3);
        let batcher =
            Arc::new(ProducerBatcher::new(Arc::clone(&gate), options, None).expect("valid"));
        let queue = Arc::new(crate::producer::queue::PendingQueue::unbounded());
        let sends: Vec<_> = (0..3).map(|i| spawn_send(&batcher, &queue, i)).collect();
        for send in sends {
            match send.await.expect("joined") {
                Err(Error::Invalid { what: "batch", .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(queue.pending(), 0);
    }

    /// Closing waits for the batches on the wire at most its deadline, then fails their
    /// sends with `Closed` and counts them; later sends fail at once.
    #[tokio::test(start_paused = true)]
    async fn close_gives_up_on_unanswered_batches_after_its_timeout() {
        let gate = gate(false);
        let options = BatchingOptions::default().max_messages(2);
        let batcher =
            Arc::new(ProducerBatcher::new(Arc::clone(&gate), options, None).expect("valid"));
        let queue = Arc::new(crate::producer::queue::PendingQueue::unbounded());
        let sends: Vec<_> = (0..3).map(|i| spawn_send(&batcher, &queue, i)).collect();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        answer(&gate, 1);
        let started = tokio::time::Instant::now();
        assert_eq!(
            batcher.close(crate::DEFAULT_CLOSE_DEADLINE).await,
            1,
            "the second batch (one message) abandoned"
        );
        assert_eq!(started.elapsed(), crate::DEFAULT_CLOSE_DEADLINE);
        assert_eq!(batch_sizes(&gate), [2, 1], "close sealed the open batch");
        let results: Vec<_> = futures_util::future::join_all(sends).await;
        assert!(results[0].as_ref().expect("joined").is_ok());
        assert!(results[1].as_ref().expect("joined").is_ok());
        assert!(matches!(
            results[2].as_ref().expect("joined"),
            Err(Error::Closed(_))
        ));
        let late = spawn_send(&batcher, &queue, 9).await.expect("joined");
        assert!(matches!(late, Err(Error::Closed(_))));
    }

    /// The fast path of `Producer::send`: room reserved, the message added, its `Receipt`
    /// polled. A receipt polled again with another waker wakes only that one (the waker kept
    /// at its index is replaced); a dropped receipt holds nothing back; the batch's merged
    /// places are all given back when it is answered, which wakes `drained`; each receipt
    /// gets its own index.
    #[tokio::test(start_paused = true)]
    async fn a_receipt_wakes_its_latest_waker_and_a_batch_gives_its_places_back_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use futures_util::task::{ArcWake, waker};

        struct Count(AtomicUsize);
        impl ArcWake for Count {
            fn wake_by_ref(count: &Arc<Self>) {
                count.0.fetch_add(1, Ordering::SeqCst);
            }
        }

        let gate = gate(false);
        let options = BatchingOptions::default().max_messages(3);
        let batcher = ProducerBatcher::new(Arc::clone(&gate), options, None).expect("valid");
        let queue = crate::producer::queue::PendingQueue::unbounded();
        let mut receipts = Vec::new();
        for index in 0..3 {
            let message = message(index, None, None);
            let slot = queue.try_admit().expect("open").expect("a place");
            assert!(batcher.try_reserve().expect("open"), "room in the batcher");
            let key = batcher.key(0, None, &message);
            receipts.push(batcher.add(key, message, slot).expect("added"));
        }
        assert_eq!(batch_sizes(&gate), [3], "full, so sealed");
        assert_eq!(queue.pending(), 3);
        let (first, latest) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let (first_waker, latest_waker) = (waker(Arc::clone(&first)), waker(Arc::clone(&latest)));
        let mut oldest = receipts.remove(0);
        for waker in [&first_waker, &latest_waker] {
            let mut cx = Context::from_waker(waker);
            assert!(Pin::new(&mut oldest).poll(&mut cx).is_pending());
        }
        drop(receipts.pop());
        answer(&gate, 1);
        tokio::time::timeout(Duration::from_secs(1), queue.drained())
            .await
            .expect("the answer gives every place back");
        assert_eq!(
            (
                first.0.load(Ordering::SeqCst),
                latest.0.load(Ordering::SeqCst)
            ),
            (0, 1),
            "only the waker of the last poll is woken"
        );
        let mut cx = Context::from_waker(&latest_waker);
        match Pin::new(&mut oldest).poll(&mut cx) {
            Poll::Ready(Ok(id)) => assert_eq!((id.batch_index, id.batch_size), (0, Some(3))),
            other => panic!("{other:?}"),
        }
        let second = receipts.pop().expect("the second receipt").await;
        assert_eq!(second.expect("sent").batch_index, 1);
    }

    #[test]
    fn without_key_based_batching_keys_share_a_batch() {
        let messages = (0..6)
            .map(|i| message(i, Some(i as u8 % 3), None))
            .collect();
        let (batches, _, _) = run(BatchingOptions::default(), messages);
        assert_eq!(batches.len(), 1, "one batch for every key");
        assert!(!BatchingOptions::default().is_key_based());
    }
}
