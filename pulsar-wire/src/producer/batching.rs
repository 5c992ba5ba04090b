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

use super::partition::PartitionSet;
use super::{MessageId, OutgoingMessage};
use crate::Error;

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
        let ids = self
            .sink
            .send_batch(key.partition, &messages, key.txn)
            .await?;
        Ok(ids.into_iter().map(ItemReply::Ok).collect())
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
    pub(crate) fn new(sink: Arc<S>, mut options: BatchingOptions) -> Result<Self, Error> {
        options.validate()?;
        let smallest = sink.max_message_size();
        options.max_bytes = options.max_bytes.min(smallest / 2).max(1);
        let open = Arc::new(Mutex::new(OpenBatches::default()));
        let batcher = Batcher::builder()
            .max_items(options.max_messages)
            .max_delay(options.max_delay)
            // Keeps each key's batches in order on the wire.
            .max_in_flight_per_key(1)
            .max_pending((options.max_messages * 64).max(65_536))
            // A SEND that failed may still have been written: never send it twice.
            .retry(RetryPolicy::never())
            .build(BatchSender {
                sink,
                open: Arc::clone(&open),
            })
            .map_err(|e| crate::producer::batcher_error(e, "the producer"))?;
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

    /// Adds a message to its key's batch and waits for its id.
    pub(crate) async fn send(
        &self,
        key: BatchKey,
        message: OutgoingMessage,
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
            .enqueue(key, Pending { message, epoch }, ItemOptions::new())
            .await
            .map_err(|e| crate::producer::batcher_error(e, "the producer"))?;
        ticket
            .await
            .map_err(|e| crate::producer::batcher_error(e, "the producer"))
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
