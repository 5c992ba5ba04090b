//! Producer batching on `ack-batcher`: one batcher per producer keyed by partition (and
//! transaction, since one `SEND` carries at most one; and, with key-based batching, by the
//! message's key), every flush one `SEND` of a batch, every message's future resolving to its
//! own [`MessageId`].
//!
//! Order: the batcher keeps one batch in flight per key, so a key's batches reach the wire in
//! order. Batches of different keys of one partition may be flushed at the same time; the
//! partition producer assigns their sequence ids and queues their frames under one lock
//! ([`super::partition::PartitionProducer`]), so sequence ids still grow in the order the
//! frames are written, as a broker with deduplication requires.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use ack_batcher::{Batcher, Flush, FlushResult, ItemOptions, ItemReply, RetryPolicy};
use parking_lot::Mutex;
use txn_ack::TxnId;

use super::message::OutgoingMessage;
use super::partition::PartitionSet;
use super::queue::Slot;
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
    pub fn max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// A batch is sealed before a message would take it beyond this many bytes (default
    /// 128 KiB; capped at half the broker's largest message). A soft limit: a message
    /// arriving while a batch is sealed for its delay may still join it.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The longest a message waits for its batch to fill (default 1 ms).
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
        match (&message.ordering_key, &message.key) {
            (Some(ordering), _) => Some(Self::Ordering(ordering.clone())),
            (None, Some(key)) => Some(Self::Partition(key.clone())),
            (None, None) => None,
        }
    }
}

/// One message waiting for its batch.
#[derive(Debug)]
pub(crate) struct Pending {
    message: OutgoingMessage,
    /// Which open batch of its key the accounting put it in.
    epoch: u64,
    /// Its place in the producer's pending queue: given back once its batch is answered,
    /// before the batcher hands the result to the sender.
    slot: Mutex<Option<Slot>>,
}

/// Where sealed batches go: the partition producers (or, in tests, a recorder).
pub(crate) trait BatchSink: Send + Sync + 'static {
    /// Sends `messages` as one batch entry to `partition`; returns each message's id.
    fn send_batch(
        &self,
        partition: usize,
        messages: &[&OutgoingMessage],
        txn: Option<TxnId>,
    ) -> impl Future<Output = Result<Vec<MessageId>, Error>> + Send;

    /// The smallest `max_message_size` of the partitions.
    fn max_message_size(&self) -> usize;
}

impl BatchSink for PartitionSet {
    async fn send_batch(
        &self,
        partition: usize,
        messages: &[&OutgoingMessage],
        txn: Option<TxnId>,
    ) -> Result<Vec<MessageId>, Error> {
        let producer = self.get(partition).ok_or_else(|| Error::Invalid {
            what: "partition",
            reason: format!("{partition} is not a partition of this producer"),
        })?;
        producer.send_batch(messages, txn).await
    }

    fn max_message_size(&self) -> usize {
        self.all()
            .iter()
            .map(|p| p.max_message_size)
            .min()
            .unwrap_or(usize::MAX)
    }
}

/// The `ack-batcher` transport: one `SEND` per batch.
#[derive(Debug)]
pub(crate) struct BatchSender<S> {
    sink: Arc<S>,
    open: Arc<Mutex<OpenBatches>>,
}

impl<S: BatchSink> Flush<BatchKey, Pending> for BatchSender<S> {
    type Output = MessageId;
    type Error = Error;

    async fn flush(&self, key: &BatchKey, items: &[Pending]) -> FlushResult<MessageId, Error> {
        // A batch sealed by its delay ends the accounting's open batch too.
        if let Some(first) = items.first() {
            self.open.lock().seal(key, first.epoch);
        }
        let messages: Vec<&OutgoingMessage> = items.iter().map(|p| &p.message).collect();
        let sent = self
            .sink
            .send_batch(key.partition, &messages, key.txn)
            .await;
        for item in items {
            drop(item.slot.lock().take());
        }
        Ok(sent?.into_iter().map(ItemReply::Ok).collect())
    }
}

/// The bytes and messages of a key's open batch, as far as the producer can tell.
#[derive(Debug)]
struct OpenBatch {
    bytes: usize,
    messages: usize,
    /// Unique over the producer's batches, so that a stale flush never seals a newer batch.
    epoch: u64,
}

/// The open batches by key; a key is dropped once its batch is sealed, so that keys of
/// key-based batching do not pile up.
#[derive(Debug, Default)]
pub(crate) struct OpenBatches {
    batches: HashMap<BatchKey, OpenBatch>,
    next_epoch: u64,
}

impl OpenBatches {
    /// The open batch of `key`, opened when there is none.
    fn open(&mut self, key: &BatchKey) -> &mut OpenBatch {
        let epoch = &mut self.next_epoch;
        self.batches.entry(key.clone()).or_insert_with(|| {
            *epoch += 1;
            OpenBatch {
                bytes: 0,
                messages: 0,
                epoch: *epoch,
            }
        })
    }

    /// Ends `key`'s open batch if it is the one of `epoch`.
    fn seal(&mut self, key: &BatchKey, epoch: u64) {
        if self.batches.get(key).is_some_and(|b| b.epoch == epoch) {
            self.batches.remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.batches.len()
    }
}

/// The producer's batcher with the byte limit the batcher itself does not know.
#[derive(Debug)]
pub(crate) struct ProducerBatcher<S: BatchSink = PartitionSet> {
    batcher: Batcher<BatchKey, Pending, BatchSender<S>>,
    open: Arc<Mutex<OpenBatches>>,
    options: BatchingOptions,
}

/// How long closing a producer waits for its batches.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

impl<S: BatchSink> ProducerBatcher<S> {
    /// A batcher sending to `sink`; with a limit on the producer's pending messages, the
    /// batcher's own bound is raised to it, so that the producer's limit is the one that
    /// applies.
    pub(crate) fn new(
        sink: Arc<S>,
        mut options: BatchingOptions,
        max_pending_messages: Option<usize>,
    ) -> Result<Self, Error> {
        options.validate()?;
        let smallest = sink.max_message_size();
        options.max_bytes = options.max_bytes.min(smallest / 2).max(1);
        let open = Arc::new(Mutex::new(OpenBatches::default()));
        let batcher = Batcher::builder()
            .max_items(options.max_messages)
            .max_delay(options.max_delay)
            // Keeps each key's batches in order on the wire.
            .max_in_flight_per_key(1)
            .max_pending(
                (options.max_messages * 64)
                    .max(65_536)
                    .max(max_pending_messages.unwrap_or(0)),
            )
            // A SEND that failed may still have been written: never send it twice.
            .retry(RetryPolicy::never())
            .build(BatchSender {
                sink,
                open: Arc::clone(&open),
            })
            .map_err(|e| crate::error::batcher_error(e, "the producer"))?;
        Ok(Self {
            batcher,
            open,
            options,
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
            group: if self.options.key_based {
                KeyGroup::of(message)
            } else {
                None
            },
        }
    }

    /// Adds a message to its key's batch and waits for its id; the message holds `slot`
    /// until its batch is answered.
    pub(crate) async fn send(
        &self,
        key: BatchKey,
        message: OutgoingMessage,
        slot: Slot,
    ) -> Result<MessageId, Error> {
        let size = message.encoded_size();
        let epoch = {
            let mut open = self.open.lock();
            let batch = open.open(&key);
            let batch = if batch.messages > 0 && batch.bytes + size > self.options.max_bytes {
                // Seal the open batch now; the flush starts without being awaited.
                drop(self.batcher.flush(&key));
                let epoch = batch.epoch;
                open.seal(&key, epoch);
                open.open(&key)
            } else {
                batch
            };
            batch.bytes += size;
            batch.messages += 1;
            let epoch = batch.epoch;
            if batch.messages >= self.options.max_messages {
                open.seal(&key, epoch);
            }
            epoch
        };
        let ticket = self
            .batcher
            .enqueue(
                key,
                Pending {
                    message,
                    epoch,
                    slot: Mutex::new(Some(slot)),
                },
                ItemOptions::new(),
            )
            .await
            .map_err(|e| crate::error::batcher_error(e, "the producer"))?;
        ticket
            .await
            .map_err(|e| crate::error::batcher_error(e, "the producer"))
    }

    /// Flushes every open batch and waits for the answers.
    pub(crate) async fn flush(&self) {
        self.batcher.flush_all().await;
    }

    /// Flushes and stops taking messages.
    pub(crate) async fn close(&self) -> ack_batcher::CloseReport {
        self.batcher.close(CLOSE_TIMEOUT).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// Records every batch it is given and answers with ids (entry = the batch's number).
    #[derive(Debug, Default)]
    struct Recorder {
        batches: Mutex<Vec<Vec<OutgoingMessage>>>,
    }

    impl BatchSink for Recorder {
        async fn send_batch(
            &self,
            partition: usize,
            messages: &[&OutgoingMessage],
            _txn: Option<TxnId>,
        ) -> Result<Vec<MessageId>, Error> {
            let entry = {
                let mut batches = self.batches.lock();
                batches.push(messages.iter().map(|m| (*m).clone()).collect());
                batches.len() as u64 - 1
            };
            // Lets other batches' flushes run before this one is answered.
            tokio::task::yield_now().await;
            let size = messages.len() as u32;
            Ok((0..size)
                .map(|index| MessageId {
                    ledger_id: 1,
                    entry_id: entry,
                    partition: partition as i32,
                    batch_index: index as i32,
                    batch_size: Some(size),
                })
                .collect())
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
            let open = batcher.open.lock().len();
            assert_eq!(queue.pending(), 0, "every message gave its place back");
            batcher.close().await;
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
