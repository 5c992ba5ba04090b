//! Small helpers shared by the test modules.

use txn_ack::model::{ConsumerModel, Dispatch, EntryView, WireAck};
use txn_ack::{AckKind, EntryId, MessagePosition, TxnAck, TxnId};

/// The ledger every test entry lives in.
pub(crate) const LEDGER: u64 = 7;

/// Entry `entry_id` of [`LEDGER`].
pub(crate) fn entry(entry_id: u64) -> EntryId {
    EntryId {
        ledger_id: LEDGER,
        entry_id,
    }
}

/// Transaction `n` of coordinator 0.
pub(crate) fn txn(n: u64) -> TxnId {
    TxnId {
        most_bits: 0,
        least_bits: n,
    }
}

/// Message `index` of a batch of `size` in entry `entry_id`.
pub(crate) fn at(entry_id: u64, index: i32, size: i32) -> MessagePosition {
    MessagePosition::in_batch(LEDGER, entry_id, -1, index, size).expect("a valid position")
}

/// Dispatches and expects the entry to be sent; returns how much was counted.
pub(crate) fn dispatch(model: &mut ConsumerModel, entry_id: u64, size: i32) -> i64 {
    match model.dispatch(entry(entry_id), size) {
        Ok(Dispatch::Dispatched { counted, .. }) => counted,
        other => panic!("entry {entry_id} was not dispatched: {other:?}"),
    }
}

/// A per-index transactional ack with this set and batch size.
pub(crate) fn txn_wire(
    txn_id: TxnId,
    entry_id: u64,
    words: &[i64],
    batch_size: Option<i32>,
) -> WireAck {
    let mut ack = WireAck::individual(entry(entry_id))
        .with_ack_set(words)
        .in_txn(txn_id);
    ack.batch_size = batch_size;
    ack
}

/// This crate's transactional ack of one message, as wire input.
pub(crate) fn built(txn_id: TxnId, position: &MessagePosition) -> WireAck {
    let ack: TxnAck =
        txn_ack::txn_ack(txn_id, AckKind::Individual, position).expect("a valid position");
    WireAck::from(&ack)
}

/// Everything observable except the counters, to check that something changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    unacked: i64,
    blocked: bool,
    entries: Vec<String>,
}

pub(crate) fn snapshot(model: &ConsumerModel) -> Snapshot {
    Snapshot {
        unacked: model.unacked(),
        blocked: model.is_blocked(),
        entries: model
            .entries()
            .map(|view: EntryView<'_>| format!("{view:?}"))
            .collect(),
    }
}

/// The invariant every state keeps: the entries' shares add up to the count.
pub(crate) fn shares_add_up(model: &ConsumerModel) -> bool {
    model.entries().map(|view| view.counted).sum::<i64>() == model.unacked()
}
