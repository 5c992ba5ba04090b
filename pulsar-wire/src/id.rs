//! Ids shared by producers, consumers and acks: [`MessageId`], where a message was stored,
//! and the `MessageIdData` an ack puts on the wire.

use std::fmt;

use txn_ack::{AckId, MAX_BATCH_SIZE};

use crate::pb::MessageIdData;

/// Where a message was stored: its entry, partition and place in the entry's batch.
///
/// Producers return it for each message sent and consumers give it with each message
/// received ([`Message::id`](crate::Message::id)). To seek to a message whose id was kept
/// elsewhere, build it again with [`MessageId::new`] or [`MessageId::in_batch`].
///
/// ```
/// use pulsar_wire::MessageId;
///
/// let id = MessageId::in_batch(12, 7, 0, 2, 4).expect("index 2 of a batch of 4");
/// assert_eq!((id.ledger_id(), id.entry_id(), id.partition()), (12, 7, 0));
/// assert_eq!((id.batch_index(), id.batch_size()), (2, Some(4)));
/// assert_eq!(id.to_string(), "12:7:0:2");
/// assert_eq!(MessageId::in_batch(12, 7, 0, 4, 4), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageId {
    pub(crate) ledger_id: u64,
    pub(crate) entry_id: u64,
    pub(crate) partition: i32,
    pub(crate) batch_index: i32,
    pub(crate) batch_size: Option<u32>,
}

impl MessageId {
    /// The id of a message sent without batching: entry `entry_id` of ledger `ledger_id`, in
    /// `partition` (-1 for a topic that is not partitioned).
    pub fn new(ledger_id: u64, entry_id: u64, partition: i32) -> Self {
        Self {
            ledger_id,
            entry_id,
            partition,
            batch_index: -1,
            batch_size: None,
        }
    }

    /// The id of message `batch_index` of an entry holding a batch of `batch_size` messages,
    /// or `None` unless `1 <= batch_size <= `[`txn_ack::MAX_BATCH_SIZE`] and
    /// `0 <= batch_index < batch_size` (take both from the message's own id).
    #[must_use]
    pub fn in_batch(
        ledger_id: u64,
        entry_id: u64,
        partition: i32,
        batch_index: i32,
        batch_size: u32,
    ) -> Option<Self> {
        let fits = (1..=MAX_BATCH_SIZE).contains(&batch_size)
            && u32::try_from(batch_index).is_ok_and(|index| index < batch_size);
        fits.then_some(Self {
            ledger_id,
            entry_id,
            partition,
            batch_index,
            batch_size: Some(batch_size),
        })
    }

    /// The ledger.
    pub fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// The entry within the ledger.
    pub fn entry_id(&self) -> u64 {
        self.entry_id
    }

    /// The partition, -1 for a topic that is not partitioned.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The index in the entry's batch, -1 for a message sent without batching.
    pub fn batch_index(&self) -> i32 {
        self.batch_index
    }

    /// The number of messages in the entry's batch, `None` for a message sent without
    /// batching.
    pub fn batch_size(&self) -> Option<u32> {
        self.batch_size
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.ledger_id, self.entry_id, self.partition, self.batch_index
        )
    }
}

/// The `MessageIdData` of an ack: ledger, entry, the partition and batch index when known,
/// the `ack_set` words (none for a whole entry) and the batch size when the ack carries one.
pub(crate) fn wire_id(id: &AckId) -> MessageIdData {
    MessageIdData {
        ledger_id: id.entry().ledger_id,
        entry_id: id.entry().entry_id,
        partition: (id.partition() >= 0).then_some(id.partition()),
        batch_index: (id.batch_index() >= 0).then_some(id.batch_index()),
        ack_set: id.wire_ack_set().collect(),
        batch_size: id.batch_size().and_then(|size| i32::try_from(size).ok()),
    }
}
