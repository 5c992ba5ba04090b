//! Transactional acks: one independent set per ack, the batch size always kept.

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use crate::ids::{EntryId, TxnId};
use crate::recent::{Recall, Recent};
use crate::{AckId, AckKind, AckSet, Error, MessagePosition};

/// One transactional ack to send (`CommandAck` with the txn bits and a request id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnAck {
    /// The transaction.
    pub txn: TxnId,
    /// Individual or cumulative.
    pub kind: AckKind,
    /// The id, with its independent set and batch size.
    pub id: AckId,
}

/// Builds the transactional ack of one message. Pure: no state, no allocation for batches of
/// up to 64 messages.
///
/// - A batched message gets a per-index ack whose set is **independent** (every message of the
///   batch outstanding except this one, or except `0..=index` for a cumulative ack) and whose
///   `batch_size` is always set, the last index of a batch included. A batch of one therefore
///   sends no set and `batch_size = 1`.
/// - A message that is not in a batch sends neither a set nor a batch size.
///
/// ```
/// use txn_ack::{txn_ack, AckKind, MessagePosition, TxnId};
/// let txn = TxnId { most_bits: 0, least_bits: 7 };
/// for (index, words) in [(0, [6]), (1, [5]), (2, [3])] {
///     let at = MessagePosition::in_batch(1, 2, -1, index, 3)?;
///     let ack = txn_ack(txn, AckKind::Individual, &at)?;
///     assert_eq!(ack.id.wire_ack_set().collect::<Vec<_>>(), words);
///     assert_eq!(ack.id.batch_size(), Some(3));
/// }
/// # Ok::<(), txn_ack::Error>(())
/// ```
///
/// # Errors
/// [`Error::WrongPositionKind`] for the entry-level position of a batch: a transactional ack
/// names one message (a whole-entry transactional ack after per-index ones is a conflict).
pub fn txn_ack(txn: TxnId, kind: AckKind, position: &MessagePosition) -> Result<TxnAck, Error> {
    let id = if position.is_batched() {
        let index = position.index_in_batch("a transactional ack")?;
        let mut set = AckSet::outstanding(position.batch_size())?;
        match kind {
            AckKind::Individual => set.ack(index)?,
            AckKind::Cumulative => set.ack_up_to(index)? > 0,
        };
        AckId::with_set(position, position.batch_index(), set)
    } else {
        AckId::whole_entry(position)
    };
    Ok(TxnAck { txn, kind, id })
}

/// The messages of one entry claimed by one transaction.
#[derive(Debug, Clone)]
struct Claim {
    txn: TxnId,
    /// A cleared bit is a message this transaction acknowledged.
    set: AckSet,
    committed: bool,
}

/// Every transaction's claims on one entry. The first claim is inline: one transaction per
/// entry, the common case, allocates nothing beyond the map's slot.
#[derive(Debug, Clone)]
struct Claims {
    first: Claim,
    more: Vec<Claim>,
}

impl Claims {
    fn iter(&self) -> impl Iterator<Item = &Claim> {
        std::iter::once(&self.first).chain(&self.more)
    }
}

/// Builds transactional acks and refuses the ones the broker would reject.
///
/// Every ack comes from [`txn_ack`]; the tracker also remembers which messages each open or
/// committed transaction acknowledged, so that acknowledging the same message again (in the
/// same transaction or another) is an [`Error::AlreadyAckedInTxn`] instead of a wire ack the
/// broker would answer with `TransactionConflict`. An abort releases the transaction's
/// messages; a commit makes them final.
#[derive(Debug, Clone)]
pub struct TxnAckTracker {
    entries: HashMap<EntryId, Claims, FxBuildHasher>,
    completed: Recent<()>,
}

impl Default for TxnAckTracker {
    fn default() -> Self {
        Self::with_capacity(64, 4096)
    }
}

impl TxnAckTracker {
    /// A tracker that holds `entries` entries with claims and remembers `recent_capacity`
    /// fully committed entries without allocating.
    pub fn with_capacity(entries: usize, recent_capacity: usize) -> Self {
        Self {
            entries: HashMap::with_capacity_and_hasher(entries, FxBuildHasher),
            completed: Recent::new(Recall::default().at_least(recent_capacity)),
        }
    }

    /// The time now, on any monotonic clock of the caller's: fully committed entries are
    /// remembered by the [`Recall`](crate::Recall) on it (its count bounds without a clock).
    pub fn set_clock(&mut self, now: std::time::Duration) {
        self.completed.set_clock(now);
    }

    /// Builds the ack of `position` in `txn` and records the claim.
    ///
    /// # Errors
    /// [`Error::AlreadyAckedInTxn`] if a message it covers is already acknowledged in an open
    /// or committed transaction; [`Error::InconsistentBatchSize`] if the entry was seen with
    /// another size; the errors of [`txn_ack`].
    pub fn ack(
        &mut self,
        txn: TxnId,
        kind: AckKind,
        position: &MessagePosition,
    ) -> Result<TxnAck, Error> {
        let ack = txn_ack(txn, kind, position)?;
        let entry = position.entry();
        let claimed = claimed_set(&ack, position)?;
        if self.completed.contains(&entry) {
            return Err(Error::EntryAlreadyAcknowledged {
                ledger_id: entry.ledger_id,
                entry_id: entry.entry_id,
            });
        }
        match self.entries.get_mut(&entry) {
            None => {
                let first = Claim {
                    txn,
                    set: claimed,
                    committed: false,
                };
                self.entries.insert(
                    entry,
                    Claims {
                        first,
                        more: Vec::new(),
                    },
                );
            }
            Some(claims) => {
                for claim in claims.iter() {
                    if claim.set.batch_size() != claimed.batch_size() {
                        return Err(Error::InconsistentBatchSize {
                            entry,
                            known: claim.set.batch_size(),
                            given: i64::from(claimed.batch_size()),
                        });
                    }
                    if let Some(index) = claim.set.first_acked_in_both(&claimed)? {
                        return Err(Error::AlreadyAckedInTxn {
                            ledger_id: entry.ledger_id,
                            entry_id: entry.entry_id,
                            index: if position.is_batched() {
                                index as i32
                            } else {
                                -1
                            },
                            most_bits: claim.txn.most_bits,
                            least_bits: claim.txn.least_bits,
                        });
                    }
                }
                let own = std::iter::once(&mut claims.first)
                    .chain(claims.more.iter_mut())
                    .find(|claim| claim.txn == txn && !claim.committed);
                match own {
                    Some(own) => own.set.merge_acks(&claimed)?,
                    None => claims.more.push(Claim {
                        txn,
                        set: claimed,
                        committed: false,
                    }),
                }
            }
        }
        Ok(ack)
    }

    /// Makes `txn`'s acknowledgements final. Entries acknowledged completely by committed
    /// transactions are then forgotten (and remembered as complete).
    pub fn commit(&mut self, txn: TxnId) {
        let completed = &mut self.completed;
        self.entries.retain(|entry, claims| {
            let mut acked: Option<AckSet> = None;
            for claim in std::iter::once(&mut claims.first).chain(claims.more.iter_mut()) {
                if claim.txn == txn {
                    claim.committed = true;
                }
                if claim.committed {
                    match &mut acked {
                        Some(acked) => {
                            let _ = acked.merge_acks(&claim.set);
                        }
                        None => acked = Some(claim.set.clone()),
                    }
                }
            }
            let complete = acked.is_some_and(|acked| acked.is_complete());
            if complete {
                completed.insert(*entry, ());
            }
            !complete
        });
    }

    /// Releases `txn`'s acknowledgements: those messages may be acknowledged again.
    pub fn abort(&mut self, txn: TxnId) {
        self.entries.retain(|_, claims| {
            claims
                .more
                .retain(|claim| claim.txn != txn || claim.committed);
            if claims.first.txn == txn && !claims.first.committed {
                match claims.more.pop() {
                    Some(next) => claims.first = next,
                    None => return false,
                }
            }
            true
        });
    }

    /// How many entries have open or committed claims.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
}

/// The messages an ack covers, as a set where a cleared bit is covered.
fn claimed_set(ack: &TxnAck, position: &MessagePosition) -> Result<AckSet, Error> {
    if !position.is_batched() {
        return AckSet::acknowledged(1);
    }
    match &ack.id.ack_set {
        Some(set) => Ok(set.clone()),
        None => AckSet::acknowledged(position.batch_size()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: TxnId = TxnId {
        most_bits: 0,
        least_bits: 1,
    };
    const T2: TxnId = TxnId {
        most_bits: 0,
        least_bits: 2,
    };

    fn at(index: i32, size: i32) -> MessagePosition {
        MessagePosition::in_batch(3, 4, -1, index, size).unwrap()
    }

    #[test]
    fn every_index_gets_an_independent_set_and_the_batch_size() {
        let mut tracker = TxnAckTracker::default();
        for (index, words) in [(0, vec![6]), (1, vec![5]), (2, vec![3])] {
            let ack = tracker.ack(T1, AckKind::Individual, &at(index, 3)).unwrap();
            assert_eq!(ack.id.wire_ack_set().collect::<Vec<_>>(), words);
            assert_eq!(ack.id.batch_size, Some(3));
            assert!(!ack.id.is_whole_entry(), "the last index too is per-index");
        }
    }

    #[test]
    fn batches_of_one_and_single_messages() {
        let one = txn_ack(T1, AckKind::Individual, &at(0, 1)).unwrap();
        assert!(one.id.ack_set.is_none());
        assert_eq!(one.id.batch_size, Some(1));
        let single = txn_ack(T1, AckKind::Individual, &MessagePosition::single(3, 5, 0)).unwrap();
        assert!(single.id.ack_set.is_none());
        assert_eq!(single.id.batch_size, None);
        assert!(txn_ack(T1, AckKind::Individual, &at(0, 3).entry_level()).is_err());
    }

    #[test]
    fn cumulative_txn_acks_clear_up_to_the_index() {
        let ack = txn_ack(T1, AckKind::Cumulative, &at(1, 4)).unwrap();
        assert_eq!(ack.id.wire_ack_set().collect::<Vec<_>>(), [0b1100]);
        assert_eq!(ack.id.batch_size, Some(4));
    }

    #[test]
    fn acking_a_message_twice_is_an_error() {
        let mut tracker = TxnAckTracker::default();
        tracker.ack(T1, AckKind::Individual, &at(1, 3)).unwrap();
        let again = tracker.ack(T1, AckKind::Individual, &at(1, 3));
        assert!(matches!(
            again,
            Err(Error::AlreadyAckedInTxn {
                index: 1,
                least_bits: 1,
                ..
            })
        ));
        let other = tracker.ack(T2, AckKind::Cumulative, &at(2, 3));
        assert!(
            matches!(other, Err(Error::AlreadyAckedInTxn { index: 1, .. })),
            "{other:?}"
        );
        tracker.abort(T1);
        tracker.ack(T2, AckKind::Individual, &at(1, 3)).unwrap();
        tracker.ack(T2, AckKind::Individual, &at(0, 3)).unwrap();
        tracker.ack(T2, AckKind::Individual, &at(2, 3)).unwrap();
        tracker.commit(T2);
        assert_eq!(tracker.entries(), 0);
        assert!(matches!(
            tracker.ack(T1, AckKind::Individual, &at(2, 3)),
            Err(Error::EntryAlreadyAcknowledged { .. })
        ));
    }
}
