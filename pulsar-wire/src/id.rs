//! Ids shared by producers, consumers and acks: [`MessageId`], where a message was stored,
//! and the `MessageIdData` an ack puts on the wire.

use std::fmt;

use txn_ack::AckId;

use crate::pb::MessageIdData;

/// Where a message was stored: its entry, partition and place in the entry's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageId {
    /// The ledger.
    pub ledger_id: u64,
    /// The entry within the ledger.
    pub entry_id: u64,
    /// The partition, -1 for a topic that is not partitioned.
    pub partition: i32,
    /// The index in the entry's batch, -1 for a message sent without batching.
    pub batch_index: i32,
    /// The number of messages in the entry's batch, `None` for a message sent without
    /// batching.
    pub batch_size: Option<u32>,
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
