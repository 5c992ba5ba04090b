//! The ids of entries and transactions, shared by positions, acks, transactions and errors.

use std::fmt;

/// An entry of a topic partition: a ledger and an entry within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId {
    /// The ledger.
    pub ledger_id: u64,
    /// The entry within the ledger.
    pub entry_id: u64,
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}

/// A transaction id: the coordinator's id in the most significant bits, a sequence in the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId {
    /// `txnid_most_bits`.
    pub most_bits: u64,
    /// `txnid_least_bits`.
    pub least_bits: u64,
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.most_bits, self.least_bits)
    }
}
