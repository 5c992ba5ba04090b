//! [`Ledger`]: what a partition consumer knows of its transactional acks and deliveries, and
//! the transactional acks it holds back.
//!
//! # Why acks are held back
//! On a Shared or Key_Shared subscription a 4.0.x broker replays the entry of an aborted
//! transactional ack to *any* consumer with permits, carrying every message of the entry that
//! is neither acknowledged nor pending in another transaction: the messages of that batch this
//! application still holds go to another consumer too (seen on 4.0.8: after an abort of one
//! index of a batch of 10 that consumer A held, consumer B received all 10). So a transactional
//! ack of a message whose batch still has messages the application holds is **held back**: it
//! goes out once every other message of its batch is acknowledged (or acknowledged in a
//! transaction), or with its transaction's commit. An abort then has nothing on the broker to
//! undo for it, and the message is handed to this application again ([`HeldBackAck::message`]).

use std::collections::{HashMap, HashSet};

use txn_ack::{Deliveries, EntryId, MessagePosition, TxnAck, TxnAckTracker, TxnId};

use super::Message;
use crate::txn::{TxnOp, TxnRef};

/// A transactional ack not sent yet.
#[derive(Debug, Clone)]
pub(crate) struct HeldBackAck {
    /// Its transaction.
    pub(crate) txn: TxnRef,
    /// The ack, built with its independent set and batch size.
    pub(crate) ack: TxnAck,
    /// The message it acknowledges, for a new delivery when the transaction aborts.
    pub(crate) message: Message,
    /// Whether an abort hands the message over again: false for the earlier chunks of a
    /// chunked message, which go with its last.
    pub(crate) hand_over: bool,
}

impl HeldBackAck {
    pub(crate) fn position(&self) -> &MessagePosition {
        self.message.position()
    }
}

/// A transactional ack taken to go out, counted in flight in its transaction until it is
/// answered or put back: its commit waits for it. `op` is `None` once the transaction is gone
/// (dropped without an end: the coordinator aborts it, and the message is handed over again).
///
/// The count travels with the ack, not with whoever took it: an ack that waits for an abort
/// under way on its partition gives its count up when its own transaction is the one
/// aborting, so that the abort (which waits for its transaction's acks in flight) and the ack
/// (which waits for the abort) never wait for each other.
pub(crate) struct Outgoing {
    pub(crate) held: HeldBackAck,
    pub(crate) op: Option<TxnOp>,
}

impl Outgoing {
    /// `held`, counted in flight in its transaction.
    pub(crate) fn new(held: HeldBackAck) -> Self {
        let op = held.txn.op();
        Self { held, op }
    }
}

/// The index of a message in its entry's batch (0 for a message not in a batch).
fn index_of(position: &MessagePosition) -> usize {
    usize::try_from(position.batch_index()).unwrap_or(0)
}

/// What a partition consumer knows of its transactional acks and its deliveries.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Transactional acks, with the messages each open or committed transaction claims.
    pub(crate) txn_acks: TxnAckTracker,
    /// Every delivery, for duplicates and the drift of the broker's unacked count.
    pub(crate) deliveries: Deliveries,
    /// Transactional acks held back, by entry.
    held_back: HashMap<EntryId, Vec<HeldBackAck>>,
    /// Transactional acks the broker refused, kept until their transaction ends.
    refused: Vec<HeldBackAck>,
    /// Copies of messages acknowledged in a transaction not ended yet, that arrived from
    /// the broker: its abort sent them (they are handed over once it ended), unless it
    /// commits.
    copies: HashMap<TxnId, Vec<Message>>,
    /// Transactional acks sent and not answered yet.
    pub(crate) txn_in_flight: usize,
    /// Transactions whose abort is under way (`END_TXN` not answered yet): no transactional
    /// ack goes out meanwhile, and their held-back acks stay for the abort to give back.
    aborting: HashSet<TxnId>,
}

impl Ledger {
    /// Whether a transactional ack of `position` can go out now: every other message of its
    /// entry that the application holds is acknowledged in a transaction whose ack is held
    /// back (so a replay of the entry carries nothing the application holds).
    pub(crate) fn entry_is_free(&self, position: &MessagePosition) -> bool {
        self.is_free(&position.entry(), Some(index_of(position)))
    }

    /// Whether every message of `entry` the application holds, but `own`, is acknowledged in
    /// a transaction whose ack is held back (and that is not aborting: its messages are about
    /// to be held again).
    fn is_free(&self, entry: &EntryId, own: Option<usize>) -> bool {
        let held_back = self.held_back.get(entry);
        self.deliveries.held_indexes(entry).all(|index| {
            own == Some(index)
                || held_back.is_some_and(|acks| {
                    acks.iter()
                        .any(|held| index_of(held.position()) == index && self.goes_out(held))
                })
        })
    }

    /// Whether a held-back ack may go out: its transaction is not aborting.
    fn goes_out(&self, held: &HeldBackAck) -> bool {
        !self.aborting.contains(&held.txn.id())
    }

    /// An abort of `txn` began: no transactional ack goes out until it ends.
    pub(crate) fn abort_started(&mut self, txn: TxnId) {
        self.aborting.insert(txn);
    }

    /// The abort of `txn` ended (or failed).
    pub(crate) fn abort_ended(&mut self, txn: TxnId) {
        self.aborting.remove(&txn);
    }

    /// Whether an abort is under way.
    pub(crate) fn is_aborting(&self) -> bool {
        !self.aborting.is_empty()
    }

    /// Whether the abort of `txn` is under way.
    pub(crate) fn is_aborting_txn(&self, txn: TxnId) -> bool {
        self.aborting.contains(&txn)
    }

    /// Holds an ack back until its entry is free or its transaction commits.
    pub(crate) fn hold_back(&mut self, ack: HeldBackAck) {
        self.held_back
            .entry(ack.position().entry())
            .or_default()
            .push(ack);
    }

    /// The acks held back for `entry`, taken, if no message of it is held otherwise; each
    /// counted in flight in its transaction (taken under the same lock as a commit takes the
    /// rest, so that the commit waits for them).
    pub(crate) fn take_if_free(&mut self, entry: &EntryId) -> Vec<Outgoing> {
        if !self.held_back.contains_key(entry) || !self.is_free(entry, None) {
            return Vec::new();
        }
        self.take_entry(entry)
    }

    /// The acks held back for `entry`, taken, each counted in flight in its transaction
    /// (its ack of another message of the entry, the last one held, is going out now).
    pub(crate) fn take_entry(&mut self, entry: &EntryId) -> Vec<Outgoing> {
        let held = self.held_back.remove(entry).unwrap_or_default();
        let (acks, staying): (Vec<_>, Vec<_>) =
            held.into_iter().partition(|held| self.goes_out(held));
        if !staying.is_empty() {
            self.held_back.insert(*entry, staying);
        }
        acks.into_iter().map(Outgoing::new).collect()
    }

    /// Every ack held back, taken (but those of aborting transactions), each counted in
    /// flight in its transaction (the consumer is closing: the broker hands what it holds to
    /// other consumers anyway).
    pub(crate) fn take_all(&mut self) -> Vec<Outgoing> {
        let entries: Vec<EntryId> = self.held_back.keys().copied().collect();
        entries
            .iter()
            .flat_map(|entry| self.take_entry(entry))
            .collect()
    }

    /// The acks held back for `txn`, taken (its commit sends them, its abort gives them back).
    pub(crate) fn take_txn(&mut self, txn: TxnId) -> Vec<HeldBackAck> {
        let mut taken = Vec::new();
        self.held_back.retain(|_, acks| {
            let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(acks)
                .into_iter()
                .partition(|held| held.txn.id() == txn);
            taken.extend(mine);
            *acks = others;
            !acks.is_empty()
        });
        taken
    }

    /// Keeps an ack the broker refused until its transaction ends.
    pub(crate) fn refused(&mut self, ack: HeldBackAck) {
        self.refused.push(ack);
    }

    /// The acks of `txn` the broker refused, taken.
    pub(crate) fn take_refused(&mut self, txn: TxnId) -> Vec<HeldBackAck> {
        let (mine, others) = std::mem::take(&mut self.refused)
            .into_iter()
            .partition(|held| held.txn.id() == txn);
        self.refused = others;
        mine
    }

    /// Keeps a copy of a message acknowledged in `txn`, not ended yet, that arrived again.
    pub(crate) fn keep_copy(&mut self, txn: TxnId, message: Message) {
        let copies = self.copies.entry(txn).or_default();
        if !copies
            .iter()
            .any(|copy| copy.position() == message.position())
        {
            copies.push(message);
        }
    }

    /// `txn` ended; returns the copies of its messages that its abort sent before the
    /// consumer knew of it, to hand over.
    pub(crate) fn ended(&mut self, txn: TxnId, committed: bool) -> Vec<Message> {
        if committed {
            self.txn_acks.commit(txn);
        } else {
            self.txn_acks.abort(txn);
        }
        let returned = self.deliveries.ended(txn, committed);
        let mut copies = self.copies.remove(&txn).unwrap_or_default();
        copies.retain(|copy| returned.contains(copy.position()));
        copies
    }
}
