//! The pending-ack conflict rules (reference §5.3, §6), and that this crate's builder never
//! trips them.

use txn_ack::model::{
    AckOutcome, ConflictEffects, ConflictReason, ConsumerModel, ModelConfig, TRANSACTION_CONFLICT,
    WireAck,
};
use txn_ack::{AckKind, AckTracker, Error, PartialBatches, TxnAckTracker};

use crate::legacy::AccumulatedSetTxnAcker;
use crate::support::{at, built, dispatch, entry, snapshot, txn, txn_wire};

fn model(batch_index_ack: bool) -> ConsumerModel {
    ConsumerModel::new(ModelConfig::new(0).with_batch_index_ack(batch_index_ack))
}

fn reason(outcome: AckOutcome) -> Option<ConflictReason> {
    match outcome {
        AckOutcome::Conflict(conflict) => Some(conflict.reason),
        _ => None,
    }
}

#[test]
fn reusing_an_accumulated_set_is_a_conflict() {
    for batch_index_ack in [false, true] {
        let mut broker = model(batch_index_ack);
        dispatch(&mut broker, 1, 3);
        let mut acker = AccumulatedSetTxnAcker::new();
        let t = txn(1);
        let first = acker.ack(t, &at(1, 0, 3)).unwrap();
        assert_eq!(
            (first.ack_set.as_slice(), first.batch_size),
            (&[6][..], Some(3))
        );
        assert!(broker.ack(&first).unwrap().is_acked());

        let second = acker.ack(t, &at(1, 1, 3)).unwrap();
        assert_eq!(second.ack_set, [4], "index 0 acknowledged again");
        let before = snapshot(&broker);
        let outcome = broker.ack(&second).unwrap();
        assert_eq!(reason(outcome), Some(ConflictReason::OverlapsPending));
        assert_eq!(outcome.server_error(), Some(TRANSACTION_CONFLICT));
        assert_eq!(TRANSACTION_CONFLICT, 23);
        assert_eq!(snapshot(&broker), before, "a conflict changes nothing");

        // The accumulated set completes: a whole-entry ack on a pending entry.
        let third = acker.ack(t, &at(1, 2, 3)).unwrap();
        assert!(third.ack_set.is_empty());
        assert_eq!(
            reason(broker.ack(&third).unwrap()),
            Some(ConflictReason::EntryPending)
        );
        assert_eq!(broker.counters().conflicts, 2);
        assert_eq!(broker.unacked(), 2, "only the first ack counted");
    }
}

#[test]
fn this_crates_builder_never_conflicts() {
    for batch_index_ack in [false, true] {
        for size in [1, 2, 3, 63, 64, 65, 128, 129, 300] {
            let mut broker = model(batch_index_ack);
            dispatch(&mut broker, 1, size);
            let mut tracker = TxnAckTracker::default();
            // A scrambled order over three transactions, the first committing half-way.
            let mut order: Vec<i32> = (0..size).collect();
            order.sort_by_key(|i| (i * 37) % size);
            for (n, index) in order.iter().enumerate() {
                let t = txn(if n < order.len() / 2 {
                    1
                } else {
                    2 + (n as u64 % 2)
                });
                if n == order.len() / 2 && n > 0 {
                    broker.commit(txn(1)).unwrap();
                    tracker.commit(txn(1));
                }
                let ack = tracker
                    .ack(t, AckKind::Individual, &at(1, *index, size))
                    .unwrap();
                let outcome = broker.ack(&WireAck::from(&ack)).unwrap();
                assert!(outcome.is_acked(), "size {size} index {index}: {outcome:?}");
            }
            assert_eq!(broker.unacked(), 0, "size {size}");
            assert_eq!(broker.pending_acks().count(), 0);
            for t in broker.open_transactions().collect::<Vec<_>>() {
                broker.commit(t).unwrap();
            }
            assert_eq!(broker.counters().conflicts, 0);
            let view = broker.entry(&entry(1)).unwrap();
            // With batch-index acks off, entries split over transactions stay in the cursor
            // (each commit is partial); see rules::partial_commits_without_batch_index_acks.
            if batch_index_ack || size == 1 {
                assert!(view.cursor.is_deleted(), "size {size}: {view:?}");
            }
        }
    }
}

#[test]
fn a_whole_entry_ack_after_per_index_ones_conflicts() {
    // Coalescing to a whole-entry ack (even with the right batch_size) after per-index ones.
    let mut broker = model(false);
    dispatch(&mut broker, 1, 3);
    let t = txn(1);
    broker.ack(&built(t, &at(1, 0, 3))).unwrap();
    broker.ack(&built(t, &at(1, 1, 3))).unwrap();
    let whole = WireAck::individual(entry(1)).with_batch_size(3).in_txn(t);
    assert_eq!(
        reason(broker.ack(&whole).unwrap()),
        Some(ConflictReason::EntryPending)
    );
    assert_eq!(broker.unacked(), 1);

    // On a 4.0.x broker the decrement happens before the check: 1 + 1 + 3 for 3 messages.
    let mut broker =
        ConsumerModel::new(ModelConfig::new(0).with_conflict_effects(ConflictEffects::AsBroker));
    dispatch(&mut broker, 1, 3);
    broker.ack(&built(t, &at(1, 0, 3))).unwrap();
    broker.ack(&built(t, &at(1, 1, 3))).unwrap();
    let outcome = broker.ack(&whole).unwrap();
    assert!(outcome.is_conflict());
    assert_eq!(outcome.effect().unacked_delta, -3);
    assert!(outcome.effect().removed_from_pending_acks);
    assert_eq!(broker.unacked(), -2);
}

#[test]
fn acks_of_acknowledged_messages_conflict() {
    let mut broker = model(true);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    // An ordinary batch-index ack of index 1, then a transactional one of the same message.
    let mut ordinary = AckTracker::new(PartialBatches::SendAckSet);
    let ack = ordinary.ack(&at(1, 1, 3)).unwrap().unwrap();
    broker.ack(&WireAck::from(&ack)).unwrap();
    let outcome = broker.ack(&built(txn(1), &at(1, 1, 3))).unwrap();
    assert_eq!(reason(outcome), Some(ConflictReason::AckedInCursor));
    assert!(broker.ack(&built(txn(1), &at(1, 0, 3))).unwrap().is_acked());
    // A whole entry acknowledged outside any transaction.
    broker.ack(&WireAck::individual(entry(2))).unwrap();
    let outcome = broker.ack(&built(txn(1), &at(2, 0, 3))).unwrap();
    assert_eq!(reason(outcome), Some(ConflictReason::AlreadyAcknowledged));
}

#[test]
fn the_checks_ignore_which_transaction_acked() {
    let mut broker = model(false);
    dispatch(&mut broker, 1, 3);
    let ack = built(txn(1), &at(1, 2, 3));
    assert!(broker.ack(&ack).unwrap().is_acked());
    assert_eq!(
        reason(broker.ack(&ack).unwrap()),
        Some(ConflictReason::OverlapsPending)
    );
    let other = built(txn(2), &at(1, 2, 3));
    assert_eq!(
        reason(broker.ack(&other).unwrap()),
        Some(ConflictReason::OverlapsPending)
    );
    // The tracker refuses both instead of sending them.
    let mut tracker = TxnAckTracker::default();
    tracker
        .ack(txn(1), AckKind::Individual, &at(1, 2, 3))
        .unwrap();
    for t in [txn(1), txn(2)] {
        assert!(matches!(
            tracker.ack(t, AckKind::Individual, &at(1, 2, 3)),
            Err(Error::AlreadyAckedInTxn { index: 2, .. })
        ));
    }
    // After an abort the message can be acknowledged again, on both sides.
    broker.abort(txn(1)).unwrap();
    tracker.abort(txn(1));
    let again = tracker
        .ack(txn(3), AckKind::Individual, &at(1, 2, 3))
        .unwrap();
    assert!(broker.ack(&WireAck::from(&again)).unwrap().is_acked());
}

#[test]
fn without_batch_size_conflicts_go_undetected_and_the_count_goes_up() {
    // §5.3: batchSize 0 turns the overlap probe into all ones.
    let mut broker = model(false);
    dispatch(&mut broker, 1, 3);
    let legacy = txn_wire(txn(1), 1, &[6], None);
    for expected in [5, 7] {
        let outcome = broker.ack(&legacy).unwrap();
        assert!(outcome.is_acked(), "the same index twice, unnoticed");
        assert_eq!(outcome.effect().unacked_delta, 2, "0 - cardinality");
        assert_eq!(broker.unacked(), expected);
    }
    // With the batch size the same repeat is caught.
    let mut broker = model(false);
    dispatch(&mut broker, 1, 3);
    let correct = txn_wire(txn(1), 1, &[6], Some(3));
    assert!(broker.ack(&correct).unwrap().is_acked());
    assert!(broker.ack(&correct).unwrap().is_conflict());
}

#[test]
fn a_per_index_ack_on_an_entry_pending_as_a_whole_is_refused() {
    let mut broker = model(false);
    dispatch(&mut broker, 1, 3);
    let whole = WireAck::individual(entry(1))
        .with_batch_size(3)
        .in_txn(txn(1));
    assert!(broker.ack(&whole).unwrap().is_acked());
    let outcome = broker.ack(&built(txn(2), &at(1, 0, 3))).unwrap();
    assert_eq!(reason(outcome), Some(ConflictReason::PendingAsWholeEntry));
    assert_eq!(
        reason(broker.ack(&whole).unwrap()),
        Some(ConflictReason::EntryPending)
    );
}
