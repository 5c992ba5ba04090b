//! The crate's error type.

use crate::ids::{EntryId, TxnId};

/// The largest batch this crate accepts, in messages. Pulsar producers batch at most 1,000
/// messages by default (`batchingMaxMessages`); this leaves ample room while keeping a bad
/// size from the network from allocating without bound.
pub const MAX_BATCH_SIZE: u32 = 1 << 16;

/// Everything this crate can refuse. None of these is retryable: each names an input that is
/// wrong and stays wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A batch size of 0, negative, or above [`MAX_BATCH_SIZE`].
    #[error(
        "batch size {size} is invalid: a batch holds 1..={MAX_BATCH_SIZE} messages (take it from \
         the entry's num_messages_in_batch)"
    )]
    InvalidBatchSize {
        /// The size given.
        size: i64,
    },
    /// A batch index outside `0..batch_size`.
    #[error(
        "batch index {index} is outside a batch of {batch_size} messages (valid: 0..{batch_size})"
    )]
    IndexOutOfRange {
        /// The index given.
        index: i64,
        /// The batch's size.
        batch_size: u32,
    },
    /// Ack-set words with a bit set at or beyond the batch size.
    #[error(
        "the ack set has bit {bit} set, but the batch holds only {batch_size} messages: the words \
         do not belong to this batch"
    )]
    BitsBeyondBatch {
        /// The first offending bit.
        bit: u64,
        /// The batch's size.
        batch_size: u32,
    },
    /// Two sets of different batch sizes were combined.
    #[error("ack sets of batches of {left} and {right} messages cannot be combined")]
    BatchSizeMismatch {
        /// The size of the set operated on.
        left: u32,
        /// The size of the other set.
        right: u32,
    },
    /// A batch-level operation on a position that is not in a batch (or the reverse).
    #[error("{what}: message {ledger_id}:{entry_id} {reason}")]
    WrongPositionKind {
        /// What was attempted.
        what: &'static str,
        /// The entry's ledger.
        ledger_id: u64,
        /// The entry.
        entry_id: u64,
        /// Why the position does not fit.
        reason: &'static str,
    },
    /// The same message was already acknowledged in a transaction (this one or another that is
    /// still open or committed): a second transactional ack would be rejected by the broker with
    /// `TransactionConflict`.
    #[error(
        "message {ledger_id}:{entry_id} index {index} is already acknowledged in transaction \
         {most_bits}:{least_bits}; a second transactional ack would be a TransactionConflict"
    )]
    AlreadyAckedInTxn {
        /// The entry's ledger.
        ledger_id: u64,
        /// The entry.
        entry_id: u64,
        /// The batch index (-1 for a message that is not in a batch).
        index: i32,
        /// The transaction holding the earlier ack, most significant bits.
        most_bits: u64,
        /// The transaction holding the earlier ack, least significant bits.
        least_bits: u64,
    },
    /// The message was already acknowledged outside any transaction.
    #[error(
        "message {ledger_id}:{entry_id} index {index} is already acknowledged outside a \
         transaction; a transactional ack would be a TransactionConflict"
    )]
    AlreadyAcked {
        /// The entry's ledger.
        ledger_id: u64,
        /// The entry.
        entry_id: u64,
        /// The batch index (-1 for a message that is not in a batch).
        index: i32,
    },
    /// The entry was acknowledged completely by committed transactions.
    #[error(
        "entry {ledger_id}:{entry_id} is already acknowledged by committed transactions; a \
         further transactional ack would be a TransactionConflict"
    )]
    EntryAlreadyAcknowledged {
        /// The entry's ledger.
        ledger_id: u64,
        /// The entry.
        entry_id: u64,
    },
    /// The entry was seen before with a different batch size.
    #[error("entry {entry} was seen as a batch of {known} messages, now given as {given}")]
    InconsistentBatchSize {
        /// The entry.
        entry: EntryId,
        /// The size recorded first.
        known: u32,
        /// The size given now.
        given: i64,
    },
    /// An ack of an entry the broker model never dispatched (feature `model`).
    #[error("entry {entry} was never dispatched to a consumer of this subscription")]
    UnknownEntry {
        /// The entry.
        entry: EntryId,
    },
    /// An ack, commit or abort in a transaction that already ended (feature `model`).
    #[error("transaction {txn} already {}", if *committed { "committed" } else { "aborted" })]
    TransactionEnded {
        /// The transaction.
        txn: TxnId,
        /// Whether it committed (else it aborted).
        committed: bool,
    },
    /// A dispatch, ack or request of a consumer the broker model does not know as connected
    /// (feature `model`).
    #[error("consumer {consumer} is not connected to this subscription (add it first)")]
    UnknownConsumer {
        /// The consumer's id.
        consumer: u64,
    },
}
