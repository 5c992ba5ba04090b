//! [`Ledger`]: what a partition consumer knows of its transactional acks and deliveries,
//! shared with the transactions it acknowledged in, which report their outcome to it.

use txn_ack::{Deliveries, TxnAckTracker, TxnId};

/// What a partition consumer knows of its transactional acks and its deliveries; the
/// transactions it acknowledged in tell it their outcome.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Transactional acks, with the messages each open or committed transaction claims.
    pub(crate) txn_acks: TxnAckTracker,
    /// Every delivery, for duplicates and the drift of the broker's unacked count.
    pub(crate) deliveries: Deliveries,
    /// Transactional acks sent and not answered yet: while there are any, the broker may be
    /// persisting one, and a replay read meanwhile would carry its message.
    pub(crate) txn_in_flight: usize,
    /// When the last resync went out.
    pub(crate) last_resync: Option<tokio::time::Instant>,
}

impl Ledger {
    /// `txn` ended.
    pub(crate) fn ended(&mut self, txn: TxnId, committed: bool) {
        if committed {
            self.txn_acks.commit(txn);
        } else {
            self.txn_acks.abort(txn);
        }
        self.deliveries.ended(txn, committed);
    }
}
