//! The entries of a topic's ledger, whether each can be read, and the view of them a
//! subscription dispatches from.

use bytes::Bytes;
use txn_ack::{EntryId, TxnId};

use pulsar_wire::pb::MessageMetadata;

/// Whether an entry can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Visibility {
    /// Readable.
    Visible,
    /// Sent in a transaction still open: it holds back every later entry (the transaction
    /// buffer's max read position).
    Pending(TxnId),
    /// Sent in a transaction that aborted: never read.
    Aborted,
}

/// One entry of the ledger: a single message or a whole batch.
#[derive(Debug)]
pub(super) struct StoredEntry {
    pub(super) metadata: MessageMetadata,
    pub(super) payload: Bytes,
    /// `num_messages_in_batch`, or 1 for an entry that is not a batch.
    pub(super) num_messages: i32,
    pub(super) visibility: Visibility,
}

/// What a subscription reads from its topic.
#[derive(Debug, Clone, Copy)]
pub(super) struct TopicView<'a> {
    pub(super) entries: &'a [StoredEntry],
    pub(super) ledger_id: u64,
    pub(super) partition: i32,
    /// Now, in milliseconds since the epoch (delayed entries wait until their time).
    pub(super) now_ms: i64,
}

impl TopicView<'_> {
    pub(super) fn entry_id(&self, index: u64) -> EntryId {
        EntryId {
            ledger_id: self.ledger_id,
            entry_id: index,
        }
    }
}
