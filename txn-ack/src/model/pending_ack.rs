//! The subscription's transactional pending-ack state (`PendingAckHandleImpl`, §6).

use std::collections::BTreeMap;

use super::java_bits::{JavaBits, is_ack_set_overlap, overlap_probe};
use super::{ConflictReason, PendingAckView};
use crate::{EntryId, TxnId};

/// One position in `individualAckPositions`: the merged set of every pending transactional
/// ack on the entry (plus synchronised ordinary batch-index acks), and the batch size of the
/// latest transactional ack (0 when it had none, or when only an ordinary ack created it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingPosition {
    /// `None`: a whole-entry ack (no ack set).
    pub(crate) set: Option<JavaBits>,
    pub(crate) batch_size: u32,
}

impl PendingPosition {
    pub(crate) fn view(&self) -> PendingAckView {
        PendingAckView {
            ack_set: self.set.as_ref().map(JavaBits::to_long_array),
            batch_size: self.batch_size,
        }
    }
}

/// `individualAckPositions` and `individualAckOfTransaction`.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingAcks {
    positions: BTreeMap<EntryId, PendingPosition>,
    /// Per open transaction, each entry it acknowledged with the AND of its own sets (`None`
    /// for a whole-entry ack).
    txns: BTreeMap<TxnId, BTreeMap<EntryId, Option<JavaBits>>>,
}

impl PendingAcks {
    pub(crate) fn position(&self, entry: &EntryId) -> Option<&PendingPosition> {
        self.positions.get(entry)
    }

    pub(crate) fn txn_entries(&self, txn: &TxnId) -> Option<&BTreeMap<EntryId, Option<JavaBits>>> {
        self.txns.get(txn)
    }

    pub(crate) fn open_txns(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.txns.keys().copied()
    }

    /// The conflict checks of `internalIndividualAcknowledgeMessage`, steps 2 and 3 of §6
    /// (step 1, "already deleted in the cursor", is the caller's). `cursor_set` is the cursor's
    /// batch-deleted set (`getBatchPositionAckSet`), `None` when it has none.
    pub(crate) fn check(
        &self,
        entry: &EntryId,
        set: Option<&JavaBits>,
        batch_size: u32,
        cursor_set: Option<&JavaBits>,
    ) -> Result<(), ConflictReason> {
        let pending = self.positions.get(entry);
        match set {
            Some(set) => {
                let probe = overlap_probe(set, batch_size);
                if is_ack_set_overlap(Some(&probe), cursor_set) {
                    return Err(ConflictReason::AckedInCursor);
                }
                if let Some(pending) = pending {
                    match &pending.set {
                        Some(pending_set) => {
                            if is_ack_set_overlap(Some(pending_set), Some(&probe)) {
                                return Err(ConflictReason::OverlapsPending);
                            }
                        }
                        // The broker's check reads a missing set as "no overlap" and then fails
                        // merging into it; the model refuses the ack instead.
                        None => return Err(ConflictReason::PendingAsWholeEntry),
                    }
                }
                Ok(())
            }
            None if pending.is_some() => Err(ConflictReason::EntryPending),
            None => Ok(()),
        }
    }

    /// `handleIndividualAck`: records an accepted transactional ack.
    pub(crate) fn acknowledge(
        &mut self,
        txn: TxnId,
        entry: EntryId,
        set: Option<JavaBits>,
        batch_size: u32,
    ) {
        let own = self.txns.entry(txn).or_default();
        match set {
            Some(set) => {
                match own.get_mut(&entry) {
                    Some(Some(merged)) => merged.and(&set),
                    // Unreachable through `check` (a whole-entry ack leaves a pending position
                    // without a set, which refuses every later ack); kept total.
                    Some(None) => {}
                    None => {
                        own.insert(entry, Some(set.clone()));
                    }
                }
                match self.positions.get_mut(&entry) {
                    Some(pending) => {
                        pending.batch_size = batch_size;
                        if let Some(pending_set) = &mut pending.set {
                            pending_set.and(&set);
                        }
                    }
                    None => {
                        self.positions.insert(
                            entry,
                            PendingPosition {
                                set: Some(set),
                                batch_size,
                            },
                        );
                    }
                }
            }
            None => {
                own.insert(entry, None);
                self.positions.entry(entry).or_insert(PendingPosition {
                    set: None,
                    batch_size,
                });
            }
        }
    }

    /// `syncBatchPositionAckSetForTransaction`: an ordinary batch-index ack is merged into the
    /// pending state (a new position gets batch size 0).
    pub(crate) fn sync_ordinary(&mut self, entry: EntryId, set: &JavaBits) {
        match self.positions.get_mut(&entry) {
            Some(pending) => {
                if let Some(pending_set) = &mut pending.set {
                    pending_set.and(set);
                }
            }
            None => {
                self.positions.insert(
                    entry,
                    PendingPosition {
                        set: Some(set.clone()),
                        batch_size: 0,
                    },
                );
            }
        }
    }

    /// `checkIsCanDeleteConsumerPendingAck`: no pending position, a whole-entry one, or an
    /// empty merged set.
    pub(crate) fn can_delete_consumer_pending_ack(&self, entry: &EntryId) -> bool {
        match self.positions.get(entry) {
            None => true,
            Some(pending) => pending.set.as_ref().is_none_or(JavaBits::is_empty),
        }
    }

    /// `clearIndividualPosition`: the cursor deleted the entry.
    pub(crate) fn clear(&mut self, entry: &EntryId) {
        self.positions.remove(entry);
    }

    /// Ends `txn` for a commit: its merged positions, to acknowledge on the cursor.
    pub(crate) fn commit(&mut self, txn: &TxnId) -> BTreeMap<EntryId, Option<JavaBits>> {
        self.txns.remove(txn).unwrap_or_default()
    }

    /// `individualAckAbortCommon`: gives the transaction's indexes back (OR with its set
    /// flipped over the stored batch size) and returns the entries to redeliver.
    pub(crate) fn abort(&mut self, txn: &TxnId) -> Vec<EntryId> {
        let own = self.txns.remove(txn).unwrap_or_default();
        for (entry, merged) in &own {
            let restorable = match (merged, self.positions.get(entry)) {
                (Some(merged), Some(pending)) => Some((merged, pending.batch_size)),
                _ => None,
            };
            let Some((merged, batch_size)) = restorable else {
                self.positions.remove(entry);
                continue;
            };
            let mut given_back = merged.clone();
            given_back.flip(0, u64::from(batch_size));
            let Some(pending) = self.positions.get_mut(entry) else {
                continue;
            };
            match &mut pending.set {
                Some(pending_set) => {
                    pending_set.or(&given_back);
                    if pending_set.cardinality() == u64::from(batch_size) {
                        self.positions.remove(entry);
                    }
                }
                // A whole-entry position cannot hold a set; the broker would fail here.
                None => {
                    self.positions.remove(entry);
                }
            }
        }
        own.into_keys().collect()
    }
}
