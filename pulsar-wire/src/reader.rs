//! [`Reader`]: reads a topic from a chosen message on, in order, without a durable
//! subscription (the Java client's `Reader`).

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::pb::MessageIdData;
use crate::{Consumer, ConsumerOptions, Error, InitialPosition, Message, MessageId, SubType};

/// Where a [`Reader`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// The first message the topic keeps.
    Earliest,
    /// After the last message published when the reader is created.
    Latest,
    /// At this message (a message id of a topic that is not partitioned, or of one
    /// partition read as a topic: `<topic>-partition-N`), included or not as
    /// [`ReaderOptions::inclusive`] says.
    Id(MessageId),
}

/// How a [`Reader`] reads.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReaderOptions {
    start: StartAt,
    inclusive: bool,
    receiver_queue_size: u32,
    name: Option<String>,
}

impl ReaderOptions {
    /// Reading from `start`, the start message excluded, with a receiver queue of 1,000 per
    /// partition.
    pub fn new(start: StartAt) -> Self {
        Self {
            start,
            inclusive: false,
            receiver_queue_size: 1_000,
            name: None,
        }
    }

    /// Whether a [`StartAt::Id`] start reads that message too (default no, as the Java
    /// client's `startMessageIdInclusive`).
    #[must_use]
    pub fn inclusive(mut self, inclusive: bool) -> Self {
        self.inclusive = inclusive;
        self
    }

    /// The messages fetched ahead per partition (as
    /// [`ConsumerOptions::receiver_queue_size`]).
    #[must_use]
    pub fn receiver_queue_size(mut self, size: u32) -> Self {
        self.receiver_queue_size = size;
        self
    }

    /// The reader's name on the broker.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// Reads a topic in order from [`ReaderOptions`]' start, through a non-durable Exclusive
/// subscription of its own (gone when the reader closes: nothing is kept on the broker). What
/// it returns it acknowledges itself; after a lost connection it subscribes again and skips
/// what it returned already, so each message comes once, in order per partition.
#[derive(Debug)]
pub struct Reader {
    consumer: Consumer,
    /// The start message and whether it is read (a [`StartAt::Id`] start).
    start: Option<(MessageId, bool)>,
    /// The last message returned, by partition: what comes again is skipped.
    last: Mutex<HashMap<i32, MessageId>>,
}

/// Whether a topic whose last entry is `end` holds a message after `id` (or `id` itself,
/// with `including`).
fn beyond(end: (u64, u64), id: &MessageId, including: bool) -> bool {
    let entry = (id.ledger_id, id.entry_id);
    let more_in_entry = id
        .batch_size
        .is_some_and(|size| id.batch_index + 1 < size as i32);
    end > entry || (end == entry && (including || more_in_entry))
}

/// Orders ids of one partition: by entry, then index in the batch (-1, no batch, first).
fn order(id: &MessageId) -> (u64, u64, i32) {
    (id.ledger_id, id.entry_id, id.batch_index)
}

impl Reader {
    pub(crate) async fn create(
        pool: &crate::pool::Pool,
        topic: &str,
        options: ReaderOptions,
    ) -> Result<Self, Error> {
        let topic = crate::topic_name(topic)?;
        let (start_id, initial, start) = match options.start {
            StartAt::Earliest => (None, InitialPosition::Earliest, None),
            StartAt::Latest => (None, InitialPosition::Latest, None),
            StartAt::Id(id) => {
                if pool.partitions(&topic).await? > 0 {
                    return Err(Error::Invalid {
                        what: "StartAt::Id",
                        reason: format!(
                            "{topic} is partitioned and a message id names one partition: \
                             read {topic}-partition-{} from it, or start the whole topic at \
                             Earliest or Latest",
                            id.partition.max(0)
                        ),
                    });
                }
                // The broker reads the start message's whole entry (it steps back one entry
                // for an id with a batch index, which is always sent, as the Java client
                // does); what precedes the start in it is skipped here.
                let data = MessageIdData {
                    ledger_id: id.ledger_id,
                    entry_id: id.entry_id,
                    batch_index: Some(id.batch_index),
                    ..MessageIdData::default()
                };
                (
                    Some(data),
                    InitialPosition::Earliest,
                    Some((id, options.inclusive)),
                )
            }
        };
        let mut consumer_options = ConsumerOptions::default()
            .sub_type(SubType::Exclusive)
            .initial_position(initial)
            .receiver_queue_size(options.receiver_queue_size);
        if let Some(name) = options.name {
            consumer_options = consumer_options.name(name);
        }
        consumer_options.reader_start = Some(start_id);
        let subscription = format!("reader-{:016x}", fastrand::u64(..));
        let consumer = Consumer::subscribe(pool, &topic, &subscription, consumer_options).await?;
        Ok(Self {
            consumer,
            start,
            last: Mutex::new(HashMap::new()),
        })
    }

    /// The next message, in order per partition.
    ///
    /// # Errors
    /// What [`Consumer::receive`] returns.
    pub async fn read_next(&self) -> Result<Message, Error> {
        loop {
            let message = self.consumer.receive().await?;
            let id = message.id();
            let before_start = self.start.is_some_and(|(start, inclusive)| {
                let (at, from) = (order(&id), order(&start));
                at < from || (at == from && !inclusive)
            });
            let seen = self
                .last
                .lock()
                .get(&id.partition)
                .is_some_and(|last| order(&id) <= order(last));
            // A reader's acks only move its non-durable cursor: cumulative, grouped.
            self.consumer.ack_cumulative(&message).await?;
            if before_start || seen {
                continue;
            }
            self.last.lock().insert(id.partition, id);
            return Ok(message);
        }
    }

    /// Whether a message is there to read now or the topic holds one after the last read
    /// (the broker's last message id, `GET_LAST_MESSAGE_ID`, on every partition).
    ///
    /// # Errors
    /// Connection errors; [`Error::Closed`].
    pub async fn has_message_available(&self) -> Result<bool, Error> {
        for partition in self.consumer.partition_consumers().iter() {
            let end = partition.end_position().await?;
            let Some((ledger_id, entry_id)) = end.last else {
                continue;
            };
            let slot = partition.partition;
            let last = self.last.lock().get(&slot).copied();
            let end_entry = (ledger_id, entry_id);
            let after = match (last, self.start) {
                (Some(last), _) => beyond(end_entry, &last, false),
                (None, Some((start, inclusive))) => beyond(end_entry, &start, inclusive),
                // Earliest or Latest, nothing read yet: what the subscription has not read.
                (None, None) => end.readable,
            };
            if after {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The messages as a [`futures_util::Stream`] ([`crate::Messages`]), ending when the
    /// reader closes.
    pub fn stream(&self) -> crate::Messages<'_> {
        crate::Messages::new(self)
    }

    /// The topic's full name.
    pub fn topic(&self) -> &str {
        self.consumer.topic()
    }

    /// The counters of the reader's consumer (see [`Consumer::stats`]): `received` counts
    /// what the broker delivered, messages before the start and those delivered again after
    /// a reconnection (which [`Reader::read_next`] skips) included.
    pub fn stats(&self) -> crate::ConsumerStats {
        self.consumer.stats()
    }

    /// The link state of every partition's consumer, by partition (see [`Consumer::state`]).
    pub fn state(&self) -> tokio::sync::watch::Receiver<crate::LinkStates> {
        self.consumer.state()
    }

    /// Closes the reader (its subscription goes with it), within `deadline`
    /// ([`Consumer::close`]).
    ///
    /// # Errors
    /// As [`Consumer::close`].
    pub async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        self.consumer.close(deadline).await
    }
}

#[crate::async_trait]
impl crate::MessageConsumer for Reader {
    async fn receive(&self) -> Result<Message, Error> {
        self.read_next().await
    }

    /// Nothing to do: the reader acknowledges what it returns itself.
    async fn ack(&self, _message: &Message) -> Result<(), Error> {
        Ok(())
    }

    fn nack(&self, message: &Message) -> Result<(), Error> {
        Err(Error::Invalid {
            what: "nack",
            reason: format!(
                "a reader reads in order and does not take message {} back",
                message.id()
            ),
        })
    }

    async fn refresh_partitions(&self) -> Result<usize, Error> {
        self.consumer.refresh_partitions().await
    }

    async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        Reader::close(self, deadline).await
    }

    fn has_ended(&self) -> bool {
        self.consumer.has_ended()
    }

    fn topic(&self) -> &str {
        Reader::topic(self)
    }
}
