//! Producer batching on `ack-batcher`: one batcher per producer keyed by partition (and
//! transaction, since one `SEND` carries at most one), every flush one `SEND` of a batch, every
//! message's future resolving to its own [`MessageId`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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
}

impl Default for BatchingOptions {
    /// 1,000 messages, 128 KiB or 1 ms after a batch's first message, whichever comes first
    /// (the Java client's defaults).
    fn default() -> Self {
        Self {
            max_messages: 1000,
            max_bytes: 128 * 1024,
            max_delay: Duration::from_millis(1),
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

/// A batch's key: the partition index and the transaction, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BatchKey {
    pub(crate) partition: usize,
    pub(crate) txn: Option<TxnId>,
}

/// One message waiting for its batch.
#[derive(Debug)]
pub(crate) struct Pending {
    message: OutgoingMessage,
    /// Which open batch of its key the accounting put it in.
    epoch: u64,
}

/// The `ack-batcher` transport: one `SEND` per batch.
#[derive(Debug)]
pub(crate) struct BatchSender {
    partitions: Arc<PartitionSet>,
    open: Arc<Mutex<HashMap<BatchKey, OpenBatch>>>,
}

impl Flush<BatchKey, Pending> for BatchSender {
    type Output = MessageId;
    type Error = Error;

    async fn flush(&self, key: &BatchKey, items: &[Pending]) -> FlushResult<MessageId, Error> {
        // A batch sealed by its delay ends the accounting's open batch too.
        if let Some(first) = items.first() {
            let mut open = self.open.lock();
            if let Some(batch) = open.get_mut(key)
                && batch.epoch == first.epoch
            {
                batch.seal();
            }
        }
        let producer = self
            .partitions
            .get(key.partition)
            .ok_or_else(|| Error::Invalid {
                what: "partition",
                reason: format!("{} is not a partition of this producer", key.partition),
            })?;
        let messages: Vec<&OutgoingMessage> = items.iter().map(|p| &p.message).collect();
        let ids = producer.send_batch(&messages, key.txn).await?;
        Ok(ids.into_iter().map(ItemReply::Ok).collect())
    }
}

/// The bytes and messages of a key's open batch, as far as the producer can tell.
#[derive(Debug, Default)]
struct OpenBatch {
    bytes: usize,
    messages: usize,
    epoch: u64,
}

impl OpenBatch {
    fn seal(&mut self) {
        self.bytes = 0;
        self.messages = 0;
        self.epoch += 1;
    }
}

/// The producer's batcher with the byte limit the batcher itself does not know.
#[derive(Debug)]
pub(crate) struct ProducerBatcher {
    batcher: Batcher<BatchKey, Pending, BatchSender>,
    open: Arc<Mutex<HashMap<BatchKey, OpenBatch>>>,
    options: BatchingOptions,
}

/// How long closing a producer waits for its batches.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

impl ProducerBatcher {
    pub(crate) fn new(
        partitions: Arc<PartitionSet>,
        mut options: BatchingOptions,
    ) -> Result<Self, Error> {
        options.validate()?;
        let smallest = partitions
            .all()
            .iter()
            .map(|p| p.max_message_size)
            .min()
            .unwrap_or(usize::MAX);
        options.max_bytes = options.max_bytes.min(smallest / 2).max(1);
        let open = Arc::new(Mutex::new(HashMap::new()));
        let batcher = Batcher::builder()
            .max_items(options.max_messages)
            .max_delay(options.max_delay)
            // Keeps each key's batches in order on the wire.
            .max_in_flight_per_key(1)
            .max_pending((options.max_messages * 64).max(65_536))
            // A SEND that failed may still have been written: never send it twice.
            .retry(RetryPolicy::never())
            .build(BatchSender {
                partitions,
                open: Arc::clone(&open),
            })
            .map_err(|e| crate::producer::batcher_error(e, "the producer"))?;
        Ok(Self {
            batcher,
            open,
            options,
        })
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
            let batch = open.entry(key).or_default();
            if batch.messages > 0 && batch.bytes + size > self.options.max_bytes {
                // Seal the open batch now; the flush starts without being awaited.
                drop(self.batcher.flush(&key));
                batch.seal();
            }
            batch.bytes += size;
            batch.messages += 1;
            let epoch = batch.epoch;
            if batch.messages >= self.options.max_messages {
                batch.seal();
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
