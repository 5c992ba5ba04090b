//! Broken transactional ack builders. They exist only in these tests, to prove that the
//! checks can fail; nothing outside `tests/` builds acks this way.

use std::collections::HashMap;

use txn_ack::model::WireAck;
use txn_ack::{AckSet, AckTracker, EntryId, MessagePosition, PartialBatches, TxnId};

/// What pulsar-client-go v0.21.0 sends for `AckWithTxn` (reference §8.3, §8.4).
///
/// Every received message carries a tracker over its batch (only when the batch holds more
/// than one message). Acking clears the message's bit. While the batch is partial, nothing is
/// sent with `EnableBatchIndexAcknowledgment=false`; with it, the tracker's **accumulated** set
/// is sent. When the batch completes, the id is replaced by a bare `{ledger, entry}`: a
/// whole-entry ack. `batch_size` is **never** set.
#[derive(Debug)]
pub(crate) struct GoV021TxnAcker {
    batch_index_ack: bool,
    trackers: HashMap<EntryId, AckSet>,
}

impl GoV021TxnAcker {
    pub(crate) fn new(batch_index_ack: bool) -> Self {
        Self {
            batch_index_ack,
            trackers: HashMap::new(),
        }
    }

    /// Acknowledges one received message in `txn`; returns what goes on the wire, if anything.
    pub(crate) fn ack(&mut self, txn: TxnId, position: &MessagePosition) -> Option<WireAck> {
        let entry = position.entry();
        let whole_entry = WireAck::individual(entry).in_txn(txn);
        if position.batch_size() <= 1 {
            // No tracker: `ack()` is true and the id is rebuilt as a bare entry.
            return Some(whole_entry);
        }
        let tracker = self.trackers.entry(entry).or_insert_with(|| {
            AckSet::outstanding(position.batch_size()).expect("a valid batch size")
        });
        let index = u32::try_from(position.batch_index()).expect("a message of the batch");
        tracker.ack(index).expect("an index of the batch");
        if tracker.is_complete() {
            self.trackers.remove(&entry);
            return Some(whole_entry);
        }
        if !self.batch_index_ack {
            return None;
        }
        let words: Vec<i64> = tracker.wire_words().collect();
        Some(WireAck::individual(entry).with_ack_set(&words).in_txn(txn))
    }
}

/// The mistake the Go fix (PR #1535) warns about: the batch size is kept, but the
/// accumulated set of ordinary batch-index acks is reused for transactional acks. Built from
/// this crate's [`AckTracker`], whose output is right for ordinary acks only.
#[derive(Debug)]
pub(crate) struct AccumulatedSetTxnAcker {
    tracker: AckTracker,
}

impl AccumulatedSetTxnAcker {
    pub(crate) fn new() -> Self {
        Self {
            tracker: AckTracker::new(PartialBatches::SendAckSet),
        }
    }

    /// Acknowledges one message in `txn` with the accumulated set and the batch size.
    pub(crate) fn ack(&mut self, txn: TxnId, position: &MessagePosition) -> Option<WireAck> {
        let ack = self.tracker.ack(position).expect("a valid position")?;
        Some(WireAck::from(&ack).in_txn(txn))
    }
}
