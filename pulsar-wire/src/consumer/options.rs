//! How a consumer subscribes: [`ConsumerOptions`], [`SubType`], [`InitialPosition`].

use std::time::Duration;

use txn_ack::PartialBatches;

use super::chunks::ChunkLimits;
use super::dead_letter::DeadLetterPolicy;
use super::key_shared::KeySharedPolicy;
use super::nack_backoff::NackBackoff;
use crate::Error;

/// The subscription type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SubType {
    /// One consumer at a time.
    #[default]
    Exclusive,
    /// Messages spread over every consumer; each tracks its unacknowledged messages.
    Shared,
    /// One active consumer, the others standing by.
    Failover,
    /// Shared, with every key sticking to one consumer: the broker dispatches each entry by
    /// its key (the entry's `ordering_key`, else its `partition_key`), so producers that batch
    /// must batch by key ([`crate::BatchingOptions::key_based`]). How keys are spread:
    /// [`ConsumerOptions::key_shared_policy`] (default [`KeySharedPolicy::auto_split`]).
    KeyShared,
}

/// Where a new subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InitialPosition {
    /// After the last message published.
    #[default]
    Latest,
    /// At the first message kept.
    Earliest,
}

/// The least [`ConsumerOptions::ack_timeout`] (as the Java client's).
pub const MIN_ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest [`ConsumerOptions::receiver_queue_size`]: a million messages per partition.
pub const MAX_RECEIVER_QUEUE_SIZE: u32 = 1_000_000;

/// How a consumer subscribes and acknowledges.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub(crate) sub_type: SubType,
    pub(crate) initial_position: InitialPosition,
    pub(crate) receiver_queue_size: u32,
    pub(crate) name: Option<String>,
    pub(crate) ack_group_time: Duration,
    pub(crate) ack_group_max: usize,
    pub(crate) partial_batches: PartialBatches,
    pub(crate) ack_receipts: bool,
    pub(crate) legacy_committed_redeliveries: bool,
    pub(crate) max_uncompressed_size: Option<usize>,
    pub(crate) dead_letter: Option<DeadLetterPolicy>,
    pub(crate) key_shared: Option<KeySharedPolicy>,
    pub(crate) chunk_limits: ChunkLimits,
    pub(crate) nack_backoff: Option<NackBackoff>,
    pub(crate) partitions_refresh: Option<Duration>,
    pub(crate) ack_timeout: Option<Duration>,
    pub(crate) retry: bool,
    /// A reader's non-durable subscription: where it starts (`start_message_id`).
    pub(crate) reader_start: Option<Option<crate::pb::MessageIdData>>,
    /// The schema sent in `SUBSCRIBE`, if any.
    pub(crate) schema: Option<crate::schema::Schema>,
}

impl Default for ConsumerOptions {
    /// Exclusive, from the latest message, 1,000 permits, acks grouped for 100 ms or 1,000
    /// ids, a batch acknowledged once all of it is (as the Java client of 4.0 by default), no ack receipts,
    /// compressed entries decompressed up to the broker's `max_message_size`.
    fn default() -> Self {
        Self {
            sub_type: SubType::Exclusive,
            initial_position: InitialPosition::Latest,
            receiver_queue_size: 1000,
            name: None,
            ack_group_time: Duration::from_millis(100),
            ack_group_max: 1000,
            partial_batches: PartialBatches::HoldUntilComplete,
            ack_receipts: false,
            legacy_committed_redeliveries: false,
            max_uncompressed_size: None,
            dead_letter: None,
            key_shared: None,
            chunk_limits: ChunkLimits::default(),
            nack_backoff: None,
            partitions_refresh: Some(crate::DEFAULT_PARTITIONS_REFRESH),
            ack_timeout: None,
            retry: false,
            reader_start: None,
            schema: None,
        }
    }
}

impl ConsumerOptions {
    /// The subscription type (default Exclusive).
    #[must_use]
    pub fn sub_type(mut self, sub_type: SubType) -> Self {
        self.sub_type = sub_type;
        self
    }

    /// Where a new subscription starts (default Latest).
    #[must_use]
    pub fn initial_position(mut self, position: InitialPosition) -> Self {
        self.initial_position = position;
        self
    }

    /// The flow permits granted per partition (default 1,000, at most
    /// [`MAX_RECEIVER_QUEUE_SIZE`]); refilled when half are used.
    #[must_use]
    pub fn receiver_queue_size(mut self, size: u32) -> Self {
        self.receiver_queue_size = size;
        self
    }

    /// The consumer's name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How long acks are grouped before they are sent (default 100 ms; zero sends each ack at
    /// once).
    #[must_use]
    pub fn ack_group_time(mut self, time: Duration) -> Self {
        self.ack_group_time = time;
        self
    }

    /// The most ids in one `CommandAck` (default 1,000).
    #[must_use]
    pub fn ack_group_max(mut self, max: usize) -> Self {
        self.ack_group_max = max;
        self
    }

    /// What acks of partly acknowledged batches send. Default:
    /// [`PartialBatches::HoldUntilComplete`], nothing until the whole batch is acknowledged,
    /// then one ack of the entry, as the Java client of 4.0 does by default.
    ///
    /// [`PartialBatches::SendAckSet`] sends the accumulated set with every ack. Choose it only
    /// when the broker has `acknowledgmentAtBatchIndexLevelEnabled=true` (off by default up
    /// to 4.0.x): then a batch partly acknowledged before a consumer leaves comes back with
    /// only its outstanding messages. Without it the broker's cursor ignores those sets, and a
    /// 4.0.x broker with transactions enabled keeps them in its pending-ack state: a batch
    /// given to another registration after a lost connection or an unload is then counted
    /// as its outstanding messages, but its last ack takes the whole batch off, so that
    /// consumer's unacked count goes below zero and its `maxUnackedMessagesOnConsumer` limit
    /// no longer holds.
    #[must_use]
    pub fn partial_batches(mut self, mode: PartialBatches) -> Self {
        self.partial_batches = mode;
        self
    }

    /// Asks the broker to confirm each ack frame (`request_id` → `ACK_RESPONSE`); its answer
    /// reaches [`Consumer::ack_and_wait`](crate::Consumer::ack_and_wait).
    #[must_use]
    pub fn ack_receipts(mut self, receipts: bool) -> Self {
        self.ack_receipts = receipts;
        self
    }

    /// The largest payload a compressed entry may decompress to (its declared
    /// `uncompressed_size` is checked before anything is allocated for it). Default: the
    /// broker's `max_message_size` from `CONNECTED` ([`crate::DEFAULT_MAX_MESSAGE_SIZE`] when
    /// it does not say). An entry above the limit is not delivered: it reaches
    /// [`Consumer::receive`](crate::Consumer::receive) as [`Error::Undecodable`], unacknowledged, and is counted in
    /// [`ConsumerStats::undecodable`](crate::ConsumerStats::undecodable). Producers (the Java
    /// client's and this crate's) check only the compressed size against `max_message_size`,
    /// so raise this to read highly compressible payloads that are larger uncompressed.
    #[must_use]
    pub fn max_uncompressed_size(mut self, bytes: usize) -> Self {
        self.max_uncompressed_size = Some(bytes);
        self
    }

    /// Moves messages delivered too often to a dead-letter topic instead of handing them to
    /// the application ([`DeadLetterPolicy`]; default none). Applies to
    /// [`Consumer::receive`](crate::Consumer::receive): messages and undecodable entries that arrive with a
    /// `redelivery_count` of at least the policy's maximum are published there (an
    /// undecodable entry with its payload as stored and [`UNDECODABLE_REASON`](crate::UNDECODABLE_REASON)) and
    /// acknowledged once the broker stored them.
    #[must_use]
    pub fn dead_letter(mut self, policy: DeadLetterPolicy) -> Self {
        self.dead_letter = Some(policy);
        self
    }

    /// How a [`SubType::KeyShared`] subscription spreads keys over its consumers, sent as the
    /// `KeySharedMeta` of `SUBSCRIBE` (default [`KeySharedPolicy::auto_split`], which a
    /// Key_Shared consumer sends when this is not set). Sticky ranges are checked when the
    /// consumer subscribes.
    #[must_use]
    pub fn key_shared_policy(mut self, policy: KeySharedPolicy) -> Self {
        self.key_shared = Some(policy);
        self
    }

    /// The schema sent in `SUBSCRIBE` (none by default: bytes). The broker checks it against
    /// the topic's schema (registering it when the topic has none and is idle) and refuses
    /// an incompatible one ([`Error::IncompatibleSchema`] from
    /// [`crate::ConsumerBuilder::build`]). Payloads are delivered as stored, with their
    /// [`crate::Message::schema_version`]: [`crate::TypedConsumer`] decodes them with the
    /// schema's codec.
    #[must_use]
    pub fn schema(mut self, schema: crate::schema::Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// The `KeySharedMeta` to send: the policy (or AUTO_SPLIT) on a Key_Shared subscription,
    /// nothing otherwise.
    pub(crate) fn key_shared_meta(&self) -> Option<crate::pb::KeySharedMeta> {
        (self.sub_type == SubType::KeyShared)
            .then(|| self.key_shared.clone().unwrap_or_default().wire())
    }

    /// Bounds on the chunked messages held while their chunks arrive ([`ChunkLimits`]:
    /// by default 10 incomplete messages and 128 MiB per partition, each waiting at most
    /// 60 s for its next chunk). Chunked messages are reassembled and delivered as one
    /// message; one dropped by these limits is redelivered later, never acknowledged.
    #[must_use]
    pub fn chunk_limits(mut self, limits: ChunkLimits) -> Self {
        self.chunk_limits = limits;
        self
    }

    /// Tests only: delivers redeliveries of messages already committed in a transaction to the
    /// application and sends nothing for them, never holds transactional acks back and never
    /// asks the broker to unblock the consumer, as this crate did before it handled them (the
    /// consumer then stalls on a 4.0.x broker). Never set it in an application.
    #[doc(hidden)]
    #[must_use]
    pub fn legacy_committed_redeliveries(mut self, legacy: bool) -> Self {
        self.legacy_committed_redeliveries = legacy;
        self
    }

    /// How often a consumer of a partitioned topic re-reads the partition count and
    /// subscribes to the partitions added since, in the background (default every
    /// [`crate::DEFAULT_PARTITIONS_REFRESH`], as the Java client's
    /// `autoUpdatePartitionsInterval`; `None`: only on
    /// [`Consumer::refresh_partitions`](crate::Consumer::refresh_partitions)). A period must
    /// be in [`crate::MIN_PARTITIONS_REFRESH`]`..=`[`crate::MAX_PARTITIONS_REFRESH`]:
    /// subscribing refuses others (zero included) with [`Error::Invalid`] naming
    /// `partitions_refresh`.
    #[must_use]
    pub fn partitions_refresh(mut self, every: Option<Duration>) -> Self {
        self.partitions_refresh = every;
        self
    }

    /// Subscribes to the retry-letter topic too, so that
    /// [`Consumer::reconsume_later`](crate::Consumer::reconsume_later) can hand a message back
    /// after a delay (the Java client's `enableRetry`; default off). The retry topic is the
    /// dead-letter policy's ([`DeadLetterPolicy::retry_letter_topic`], default
    /// `{topic}-{subscription}-RETRY`); without a policy, one with
    /// [`MAX_RECONSUME_TIMES`](crate::MAX_RECONSUME_TIMES) and the default topics applies, as
    /// with the Java client. Its messages come through
    /// [`Consumer::receive`](crate::Consumer::receive) beside the topic's. The delay holds on
    /// Shared and Key_Shared subscriptions only (the broker delays nothing else); a priority
    /// consumer refuses it.
    #[must_use]
    pub fn enable_retry(mut self, enabled: bool) -> Self {
        self.retry = enabled;
        self
    }

    /// Asks for a message again once the application has held it this long without
    /// acknowledging it (plainly, negatively or in a transaction), as a nack does (the Java
    /// client's `ackTimeout`; default none, as there; at least [`MIN_ACK_TIMEOUT`]).
    /// On a Shared or Key_Shared subscription the broker may give it to another consumer,
    /// and a message of a batch of more than one is handed to this one again instead (the
    /// broker would resend the whole batch). Counted in
    /// [`ConsumerStats::ack_timeouts`](crate::ConsumerStats::ack_timeouts). Applies to
    /// messages of [`Consumer::receive`](crate::Consumer::receive) (and its stream and
    /// batches); a priority consumer refuses it.
    #[must_use]
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = Some(timeout);
        self
    }

    /// How long a nacked message waits before it is asked for again, by its redelivery count
    /// (default none: at once; the Java client waits a minute).
    #[must_use]
    pub fn nack_backoff(mut self, backoff: NackBackoff) -> Self {
        self.nack_backoff = Some(backoff);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        crate::producer::check_partitions_refresh(self.partitions_refresh)?;
        if let Some(backoff) = &self.nack_backoff {
            backoff.validate()?;
        }
        if let Some(timeout) = self.ack_timeout
            && !(MIN_ACK_TIMEOUT..=super::MAX_NACK_DELAY).contains(&timeout)
        {
            return Err(Error::Invalid {
                what: "ack_timeout",
                reason: format!(
                    "{timeout:?} is outside {:?}..={:?}",
                    MIN_ACK_TIMEOUT,
                    super::MAX_NACK_DELAY
                ),
            });
        }
        if !(1..=MAX_RECEIVER_QUEUE_SIZE).contains(&self.receiver_queue_size) {
            // The broker takes a FLOW's permits as a signed 32-bit count and refuses 0: either
            // ends the whole connection.
            return Err(Error::Invalid {
                what: "receiver_queue_size",
                reason: format!(
                    "{} is outside 1..={MAX_RECEIVER_QUEUE_SIZE} (default 1,000; a queue of 0, \
                     the Java client's zero-queue consumer, is not supported: 1 fetches one \
                     message at a time)",
                    self.receiver_queue_size
                ),
            });
        }
        if let Some(policy) = &self.dead_letter {
            policy.validate()?;
        }
        if let Some(policy) = &self.key_shared {
            if self.sub_type != SubType::KeyShared {
                return Err(Error::Invalid {
                    what: "key_shared_policy",
                    reason: format!(
                        "a key-shared policy applies to a Key_Shared subscription, not to a {:?} \
                         one: set sub_type(SubType::KeyShared) or drop the policy",
                        self.sub_type
                    ),
                });
            }
            policy.validate()?;
        }
        self.chunk_limits.validate()?;
        if self.ack_group_time > Duration::from_secs(3600) {
            return Err(Error::Invalid {
                what: "ack_group_time",
                reason: format!("{:?} is longer than 1 h", self.ack_group_time),
            });
        }
        if !(1..=1 << 20).contains(&self.ack_group_max) {
            return Err(Error::Invalid {
                what: "ack_group_max",
                reason: format!("{} is not in 1..=1048576", self.ack_group_max),
            });
        }
        Ok(())
    }
}
