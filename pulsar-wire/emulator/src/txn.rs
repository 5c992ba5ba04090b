//! The transaction coordinator: transaction ids, their state and what each one touched.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use txn_ack::TxnId;

use super::stats::TransactionStats;
use pulsar_wire::pb::ServerError;

/// Where a transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TxnState {
    Open,
    Committed,
    Aborted,
}

/// One transaction.
#[derive(Debug)]
pub(super) struct Txn {
    pub(super) state: TxnState,
    /// Partitions registered with ADD_PARTITION_TO_TXN.
    pub(super) partitions: BTreeSet<String>,
    /// (topic, subscription) pairs registered or acknowledged in.
    pub(super) subscriptions: BTreeSet<(String, String)>,
    /// Entries sent in the transaction: (topic, entry index).
    pub(super) sends: Vec<(String, u64)>,
}

/// What an END_TXN (or a timeout) has to apply.
#[derive(Debug)]
pub(super) struct Ending {
    pub(super) commit: bool,
    pub(super) sends: Vec<(String, u64)>,
    pub(super) subscriptions: BTreeSet<(String, String)>,
}

/// The emulator's single coordinator (id 0).
#[derive(Debug, Default)]
pub(super) struct Coordinator {
    next_sequence: u64,
    txns: HashMap<TxnId, Txn>,
    pub(super) stats: TransactionStats,
}

/// An error to answer with.
pub(super) type TxnError = (ServerError, String);

impl Coordinator {
    /// NEW_TXN on coordinator `tc_id`.
    pub(super) fn create(&mut self, tc_id: u64) -> Result<TxnId, TxnError> {
        if tc_id != 0 {
            return Err((
                ServerError::TransactionCoordinatorNotFound,
                format!(
                    "transaction coordinator {tc_id} does not exist (the emulator runs coordinator 0)"
                ),
            ));
        }
        self.next_sequence += 1;
        let txn = TxnId {
            most_bits: 0,
            least_bits: self.next_sequence,
        };
        self.txns.insert(
            txn,
            Txn {
                state: TxnState::Open,
                partitions: BTreeSet::new(),
                subscriptions: BTreeSet::new(),
                sends: Vec::new(),
            },
        );
        self.stats.created += 1;
        self.stats.open += 1;
        Ok(txn)
    }

    /// The transaction, if it is open; the error to answer otherwise.
    pub(super) fn open(&mut self, txn: TxnId) -> Result<&mut Txn, TxnError> {
        match self.txns.get_mut(&txn) {
            None => Err((
                ServerError::TransactionNotFound,
                format!("transaction {txn} does not exist"),
            )),
            Some(t) if t.state != TxnState::Open => Err((
                ServerError::InvalidTxnStatus,
                format!("transaction {txn} is {:?}, not Open", t.state),
            )),
            Some(t) => Ok(t),
        }
    }

    /// END_TXN. `Ok(None)`: the transaction already ended the same way (a retried END_TXN),
    /// nothing to apply.
    pub(super) fn end(
        &mut self,
        txn: TxnId,
        commit: bool,
        timed_out: bool,
    ) -> Result<Option<Ending>, TxnError> {
        let Some(t) = self.txns.get_mut(&txn) else {
            return Err((
                ServerError::TransactionNotFound,
                format!("transaction {txn} does not exist"),
            ));
        };
        match (t.state, commit) {
            (TxnState::Open, _) => {}
            (TxnState::Committed, true) | (TxnState::Aborted, false) => return Ok(None),
            (state, _) => {
                return Err((
                    ServerError::InvalidTxnStatus,
                    format!(
                        "transaction {txn} is {state:?}; it cannot be {}",
                        if commit { "committed" } else { "aborted" }
                    ),
                ));
            }
        }
        t.state = if commit {
            TxnState::Committed
        } else {
            TxnState::Aborted
        };
        self.stats.open -= 1;
        match (commit, timed_out) {
            (true, _) => self.stats.committed += 1,
            (false, false) => self.stats.aborted += 1,
            (false, true) => self.stats.timed_out += 1,
        }
        // What remains of an ended transaction is its state, for InvalidTxnStatus answers.
        Ok(Some(Ending {
            commit,
            sends: std::mem::take(&mut t.sends),
            subscriptions: std::mem::take(&mut t.subscriptions),
        }))
    }

    /// The timeout of a NEW_TXN: `txn_ttl_seconds` carries milliseconds; 0 means the default.
    pub(super) fn timeout(ttl_millis: Option<u64>, default: Duration) -> Duration {
        match ttl_millis {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_errors() {
        let mut tc = Coordinator::default();
        assert!(tc.create(1).is_err());
        let a = tc.create(0).unwrap();
        let b = tc.create(0).unwrap();
        assert_eq!((a.most_bits, a.least_bits, b.least_bits), (0, 1, 2));
        tc.open(a).unwrap().sends.push(("t".into(), 3));
        let ending = tc.end(a, true, false).unwrap().unwrap();
        assert_eq!(ending.sends, [("t".to_string(), 3)]);
        assert!(
            tc.end(a, true, false).unwrap().is_none(),
            "a retried commit"
        );
        assert_eq!(
            tc.end(a, false, false).unwrap_err().0,
            ServerError::InvalidTxnStatus
        );
        assert_eq!(tc.open(a).unwrap_err().0, ServerError::InvalidTxnStatus);
        let unknown = TxnId {
            most_bits: 0,
            least_bits: 99,
        };
        assert_eq!(
            tc.end(unknown, true, false).unwrap_err().0,
            ServerError::TransactionNotFound
        );
        tc.end(b, false, true).unwrap();
        assert_eq!(
            (tc.stats.open, tc.stats.committed, tc.stats.timed_out),
            (0, 1, 1)
        );
        assert_eq!(
            Coordinator::timeout(Some(1500), Duration::from_secs(9)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            Coordinator::timeout(Some(0), Duration::from_secs(9)),
            Duration::from_secs(9)
        );
    }
}
