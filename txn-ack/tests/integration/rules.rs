//! The model's accounting rules one by one (reference §5, §6, §7).

use txn_ack::model::{
    AckOutcome, ConflictEffects, ConflictReason, ConsumerModel, CursorState, Dispatch,
    IgnoredReason, ModelConfig, SkipReason, TxnStatus, WireAck,
};
use txn_ack::{AckKind, AckTracker, PartialBatches, TxnAckTracker};

use crate::support::{at, built, dispatch, entry, shares_add_up, snapshot, txn, txn_wire};

fn model(max: u32, batch_index_ack: bool) -> ConsumerModel {
    ConsumerModel::new(ModelConfig::new(max).with_batch_index_ack(batch_index_ack))
}

fn ordinary(tracker: &mut AckTracker, entry_id: u64, index: i32, size: i32) -> Option<WireAck> {
    tracker
        .ack(&at(entry_id, index, size))
        .unwrap()
        .map(|ack| WireAck::from(&ack))
}

#[test]
fn dispatch_counts_the_batch_and_blocks_at_the_limit() {
    let mut broker = model(6, false);
    assert_eq!(dispatch(&mut broker, 1, 3), 3);
    assert!(!broker.is_blocked());
    match broker.dispatch(entry(2), 3).unwrap() {
        Dispatch::Dispatched {
            counted,
            ack_set,
            blocked,
        } => {
            assert_eq!((counted, blocked), (3, true), "6 >= 6");
            assert!(ack_set.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let before = snapshot(&broker);
    assert_eq!(broker.dispatch(entry(3), 3), Ok(Dispatch::Blocked));
    assert_eq!(snapshot(&broker), before, "a refused entry changes nothing");
    assert!(broker.entry(&entry(3)).is_none());
    assert_eq!(
        broker.pending_acks().collect::<Vec<_>>(),
        [(entry(1), 3), (entry(2), 3)]
    );
    assert_eq!(broker.counters().refused_while_blocked, 1);
    // Unlimited: never blocked.
    let mut unlimited = model(0, false);
    for e in 0..100 {
        dispatch(&mut unlimited, e, 300);
    }
    assert!(!unlimited.flow_permits());
    assert_eq!(unlimited.unacked(), 30_000);
}

#[test]
fn redelivered_batches_count_only_their_outstanding_messages() {
    let mut broker = model(0, true);
    dispatch(&mut broker, 1, 3);
    let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
    let ack = ordinary(&mut tracker, 1, 0, 3).unwrap();
    assert_eq!(broker.ack(&ack).unwrap().effect().unacked_delta, -1);
    let redelivered = broker.redeliver_unacknowledged(&[entry(1), entry(1), entry(9)]);
    assert_eq!(
        (redelivered.entries, redelivered.messages),
        (vec![entry(1)], 2)
    );
    assert_eq!(broker.unacked(), 0);
    match broker.dispatch(entry(1), 3).unwrap() {
        Dispatch::Dispatched {
            counted, ack_set, ..
        } => {
            assert_eq!(counted, 2, "index 0 is acknowledged in the cursor");
            assert_eq!(ack_set, [6], "the client skips index 0");
        }
        other => panic!("{other:?}"),
    }
    // A deleted entry is not sent again.
    broker.ack(&WireAck::individual(entry(1))).unwrap();
    assert_eq!(
        broker.dispatch(entry(1), 3),
        Ok(Dispatch::Skipped(SkipReason::AlreadyAcknowledged))
    );
}

#[test]
fn ordinary_acks_use_the_brokers_batch_size() {
    // §5.1: the client's batch_size is not read; the dispatched size is.
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 5);
    let ack = WireAck::individual(entry(1)).with_batch_size(1);
    assert_eq!(broker.ack(&ack).unwrap().effect().unacked_delta, -5);
    assert_eq!(broker.unacked(), 0);
    // A duplicate whole-entry ack counts nothing: the entry is no longer in pendingAcks.
    let again = broker.ack(&ack).unwrap().effect();
    assert_eq!(
        (again.unacked_delta, again.removed_from_pending_acks),
        (0, false)
    );
}

#[test]
fn batch_index_acks_count_only_when_the_broker_has_them_enabled() {
    for (enabled, partial_delta) in [(true, -1), (false, 0)] {
        let mut broker = model(0, enabled);
        dispatch(&mut broker, 1, 3);
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        for index in 0..2 {
            let ack = ordinary(&mut tracker, 1, index, 3).unwrap();
            let effect = broker.ack(&ack).unwrap().effect();
            assert_eq!(effect.unacked_delta, partial_delta, "enabled={enabled}");
            assert!(
                !effect.removed_from_pending_acks,
                "partial acks keep the entry"
            );
        }
        let view = broker.entry(&entry(1)).unwrap();
        match (enabled, view.cursor) {
            (true, CursorState::Partial(set)) => assert_eq!(set.words(), [4]),
            (false, CursorState::Outstanding) => {}
            other => panic!("{other:?}"),
        }
        // The last index completes the batch: a whole-entry ack.
        let last = ordinary(&mut tracker, 1, 2, 3).unwrap();
        assert!(last.ack_set.is_empty());
        let effect = broker.ack(&last).unwrap().effect();
        assert_eq!(effect.unacked_delta, if enabled { -1 } else { -3 });
        assert!(effect.removed_from_pending_acks && effect.entry_deleted);
        assert_eq!(broker.unacked(), 0);
    }
}

#[test]
fn cumulative_acks_are_ignored_on_shared() {
    let mut broker = model(0, true);
    dispatch(&mut broker, 1, 3);
    let before = snapshot(&broker);
    let plain = WireAck::cumulative(entry(1));
    let in_txn =
        WireAck::from(&txn_ack::txn_ack(txn(1), AckKind::Cumulative, &at(1, 1, 3)).unwrap());
    let unknown = WireAck::cumulative(entry(99)).with_ack_set(&[-1, -1]);
    for ack in [plain, in_txn, unknown] {
        assert_eq!(
            broker.ack(&ack),
            Ok(AckOutcome::Ignored(IgnoredReason::CumulativeOnShared))
        );
    }
    assert_eq!(snapshot(&broker), before);
    assert_eq!(broker.transaction_status(&txn(1)), TxnStatus::NotStarted);
    assert_eq!(broker.counters().ignored, 3);
}

#[test]
fn transactional_acks_count_at_ack_time_not_at_commit() {
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 1);
    let t = txn(1);
    // A per-index ack: batch_size - cardinality = 3 - 2.
    let outcome = broker.ack(&built(t, &at(1, 0, 3))).unwrap();
    assert_eq!(outcome.effect().unacked_delta, -1);
    assert!(
        !outcome.effect().removed_from_pending_acks,
        "removed once fully acknowledged"
    );
    // A batch of one: no set, batch_size 1; removed at once.
    let one = built(t, &at(2, 0, 1));
    assert!(one.ack_set.is_empty() && one.batch_size == Some(1));
    let effect = broker.ack(&one).unwrap().effect();
    assert_eq!(
        (effect.unacked_delta, effect.removed_from_pending_acks),
        (-1, true)
    );
    assert_eq!(broker.unacked(), 2);
    assert_eq!(broker.transaction_status(&t), TxnStatus::Open);
    assert_eq!(
        broker.transaction_entries(&t).collect::<Vec<_>>(),
        [entry(1), entry(2)]
    );
    let committed = broker.commit(t).unwrap();
    assert_eq!(committed.entries, [entry(1), entry(2)]);
    assert_eq!(committed.deleted, [entry(2)]);
    assert_eq!(broker.unacked(), 2, "commit does not count");
    assert_eq!(broker.transaction_status(&t), TxnStatus::Committed);
    // Not in pendingAcks any more, yet a transactional ack still counts (apache/pulsar#25049).
    broker.redeliver_unacknowledged(&[entry(1)]);
    assert_eq!(
        broker.unacked(),
        -1,
        "3 taken off: the cursor never saw the pending ack"
    );
    let late = broker.ack(&built(txn(2), &at(1, 1, 3))).unwrap().effect();
    assert_eq!(late.unacked_delta, -1);
    assert!(shares_add_up(&broker));
}

#[test]
fn unblocking_needs_an_entry_to_leave_pending_acks_at_half_the_limit() {
    let mut broker = model(6, true);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    assert!(broker.is_blocked());
    // Partial acks bring the count to 3 = 6/2, but no entry leaves pendingAcks.
    let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
    for (e, i) in [(1, 0), (1, 1), (2, 0)] {
        let ack = ordinary(&mut tracker, e, i, 3).unwrap();
        assert!(!broker.ack(&ack).unwrap().effect().unblocked);
    }
    assert_eq!(broker.unacked(), 3);
    assert!(broker.is_blocked());
    // The batch completes: entry 1 leaves pendingAcks with the count at 3 <= 3.
    let last = ordinary(&mut tracker, 1, 2, 3).unwrap();
    let effect = broker.ack(&last).unwrap().effect();
    assert!(effect.removed_from_pending_acks && effect.unblocked);
    assert!(!broker.is_blocked());
    assert_eq!(broker.counters().unblocked, 1);
}

#[test]
fn an_ordinary_whole_entry_ack_checks_for_unblocking_again_after_it_counts() {
    // Consumer.individualAckNormal (4.0.8, l.567-630) removes the entry from pendingAcks
    // (checking the unblock condition with the count before the decrement), decrements, and
    // since 4.0.3 (apache/pulsar#23796) calls updateBlockedConsumerOnUnackedMsgs again. A
    // 4.0.8 broker with a limit of 12 unblocks at 5 after a whole-entry ack from 10.
    let mut broker = model(6, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    assert!(broker.is_blocked());
    let effect = broker.ack(&WireAck::individual(entry(1))).unwrap().effect();
    assert!(
        effect.removed_from_pending_acks && effect.unblocked,
        "6 > 3 at the removal, 3 <= 3 after the decrement"
    );
    assert_eq!(broker.unacked(), 3);
    assert!(!broker.is_blocked());

    // The same for a transactional whole-entry ack, which decrements first.
    let mut broker = model(6, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    let whole = WireAck::individual(entry(1))
        .with_batch_size(3)
        .in_txn(txn(1));
    let effect = broker.ack(&whole).unwrap().effect();
    assert!(effect.unblocked, "3 <= 3 after the decrement");

    // With a limit of 4 and batches of 3, whole-entry acks no longer leave the consumer
    // blocked with nothing unacknowledged: the second ack takes the count to 0 <= 2.
    let mut broker = model(4, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    let effect = broker.ack(&WireAck::individual(entry(1))).unwrap().effect();
    assert!(!effect.unblocked, "3 > 2 after the decrement");
    assert!(broker.is_blocked());
    let effect = broker.ack(&WireAck::individual(entry(2))).unwrap().effect();
    assert!(effect.unblocked);
    assert_eq!((broker.unacked(), broker.is_blocked()), (0, false));
    assert_eq!(dispatch(&mut broker, 3, 3), 3);

    // A whole-entry ack of an entry no longer in pendingAcks counts nothing and checks
    // nothing: the consumer stays blocked.
    let mut broker = model(4, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 3);
    broker.redeliver_unacknowledged(&[entry(1)]);
    broker.flow_permits();
    dispatch(&mut broker, 3, 3);
    assert!(broker.is_blocked());
    let effect = broker.ack(&WireAck::individual(entry(1))).unwrap().effect();
    assert!(!effect.removed_from_pending_acks && !effect.unblocked);
    assert!(broker.is_blocked());
}

#[test]
fn flow_blocks_at_the_limit_and_redelivery_unblocks() {
    let mut broker = model(6, false);
    dispatch(&mut broker, 1, 3);
    // A legacy ack (a set, no batch_size) pushes the count up; acks never block by themselves.
    broker.ack(&txn_wire(txn(1), 1, &[6], None)).unwrap();
    broker.ack(&txn_wire(txn(1), 1, &[4], None)).unwrap();
    assert_eq!(broker.unacked(), 6);
    assert!(!broker.is_blocked());
    assert!(broker.flow_permits(), "FLOW at 6 >= 6 blocks");
    let redelivered = broker.redeliver_unacknowledged(&[entry(1)]);
    assert_eq!(redelivered.messages, 3);
    assert!(!broker.is_blocked(), "redelivery unblocks");
    assert_eq!(broker.unacked(), 3);
    broker.flow_permits();
    let all = broker.redeliver_all();
    assert_eq!(
        (all.entries.len(), all.messages, broker.unacked()),
        (0, 3, 0)
    );
    assert!(shares_add_up(&broker));
}

#[test]
fn abort_gives_indexes_back_and_redelivers() {
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 3);
    let mut tracker = TxnAckTracker::default();
    for (t, index) in [(1, 0), (2, 1)] {
        let ack = tracker
            .ack(txn(t), AckKind::Individual, &at(1, index, 3))
            .unwrap();
        broker.ack(&WireAck::from(&ack)).unwrap();
    }
    assert_eq!(broker.unacked(), 1);
    let aborted = broker.abort(txn(1)).unwrap();
    tracker.abort(txn(1));
    assert_eq!(aborted.redeliver, [entry(1)]);
    assert_eq!(broker.unacked(), 1, "an abort does not restore the count");
    let pending = broker.entry(&entry(1)).unwrap().pending.unwrap();
    assert_eq!(
        pending.ack_set,
        Some(vec![5]),
        "index 1 still pending in txn 2"
    );
    // The dispatcher sends the entry again without the index pending in txn 2.
    match broker.dispatch(entry(1), 3).unwrap() {
        Dispatch::Dispatched {
            counted, ack_set, ..
        } => assert_eq!((counted, ack_set), (2, vec![5])),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        broker.counters().recounted_on_redispatch,
        1,
        "index 2 was still counted"
    );
    assert_eq!(broker.unacked(), 3);
    for index in [0, 2] {
        let ack = tracker
            .ack(txn(3), AckKind::Individual, &at(1, index, 3))
            .unwrap();
        assert!(broker.ack(&WireAck::from(&ack)).unwrap().is_acked());
    }
    assert_eq!(broker.pending_acks().count(), 0);
    assert_eq!(broker.unacked(), 1, "the recounted message stays");
    assert_eq!(broker.leaked_unacked(), 1);
    // Ended transactions stay ended.
    assert!(broker.abort(txn(1)).is_err());
    assert!(broker.ack(&built(txn(1), &at(1, 0, 3))).is_err());
}

#[test]
fn aborting_a_fully_acknowledged_entry_counts_exactly() {
    let mut broker = model(0, true);
    dispatch(&mut broker, 1, 3);
    for index in 0..3 {
        broker.ack(&built(txn(1), &at(1, index, 3))).unwrap();
    }
    assert_eq!((broker.unacked(), broker.pending_acks().count()), (0, 0));
    let aborted = broker.abort(txn(1)).unwrap();
    assert!(
        broker.entry(&entry(1)).unwrap().pending.is_none(),
        "all given back"
    );
    for e in aborted.redeliver {
        assert_eq!(
            broker.dispatch(e, 3).unwrap(),
            Dispatch::Dispatched {
                counted: 3,
                ack_set: vec![],
                blocked: false
            }
        );
    }
    for index in 0..3 {
        broker.ack(&built(txn(2), &at(1, index, 3))).unwrap();
    }
    broker.commit(txn(2)).unwrap();
    assert_eq!(broker.unacked(), 0);
    assert_eq!(broker.counters().recounted_on_redispatch, 0);
    assert!(broker.entry(&entry(1)).unwrap().cursor.is_deleted());
}

#[test]
fn without_batch_size_an_abort_does_not_give_the_index_back() {
    // individualAckAbortCommon flips over the stored batch size, 0 here (§6, [derived]).
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 3);
    broker.ack(&txn_wire(txn(1), 1, &[6], None)).unwrap();
    broker.abort(txn(1)).unwrap();
    let pending = broker.entry(&entry(1)).unwrap().pending.unwrap();
    assert_eq!((pending.ack_set, pending.batch_size), (Some(vec![6]), 0));
    let outcome = broker.ack(&built(txn(2), &at(1, 0, 3))).unwrap();
    assert!(matches!(
        outcome,
        AckOutcome::Conflict(c) if c.reason == ConflictReason::OverlapsPending
    ));
    // The redelivered entry is sent without index 0.
    match broker.dispatch(entry(1), 3).unwrap() {
        Dispatch::Dispatched { ack_set, .. } => assert_eq!(ack_set, [6]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dispatch_skips_entries_wholly_pending_in_a_transaction() {
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 3);
    dispatch(&mut broker, 2, 1);
    for index in 0..3 {
        broker.ack(&built(txn(1), &at(1, index, 3))).unwrap();
    }
    broker.ack(&built(txn(1), &at(2, 0, 1))).unwrap();
    for (e, size) in [(1, 3), (2, 1)] {
        assert_eq!(
            broker.dispatch(entry(e), size),
            Ok(Dispatch::Skipped(SkipReason::PendingInTransaction))
        );
    }
}

#[test]
fn partial_commits_without_batch_index_acks() {
    // Decision (see the model docs): a merged set acknowledging every index deletes the
    // entry; a partial one leaves the cursor as it is, since it keeps no batch-deleted sets.
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 3);
    broker.ack(&built(txn(1), &at(1, 0, 3))).unwrap();
    broker.commit(txn(1)).unwrap();
    assert_eq!(
        broker.entry(&entry(1)).unwrap().cursor,
        CursorState::Outstanding
    );
    for index in 1..3 {
        broker.ack(&built(txn(2), &at(1, index, 3))).unwrap();
    }
    let committed = broker.commit(txn(2)).unwrap();
    assert!(committed.deleted.is_empty());
    assert_eq!((broker.unacked(), broker.pending_acks().count()), (0, 0));
    // With batch-index acks the cursor merges both commits.
    let mut broker = model(0, true);
    dispatch(&mut broker, 1, 3);
    broker.ack(&built(txn(1), &at(1, 0, 3))).unwrap();
    broker.commit(txn(1)).unwrap();
    assert!(matches!(
        broker.entry(&entry(1)).unwrap().cursor,
        CursorState::Partial(_)
    ));
    for index in 1..3 {
        broker.ack(&built(txn(2), &at(1, index, 3))).unwrap();
    }
    assert_eq!(broker.commit(txn(2)).unwrap().deleted, [entry(1)]);
}

#[test]
fn mixing_ordinary_and_transactional_acks_in_one_batch() {
    let mut broker = model(0, true);
    dispatch(&mut broker, 1, 3);
    let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
    broker.ack(&built(txn(1), &at(1, 0, 3))).unwrap();
    for index in 1..3 {
        let ack = ordinary(&mut tracker, 1, index, 3).unwrap();
        assert!(
            !ack.ack_set.is_empty(),
            "index 0 is not the tracker's: still partial"
        );
        broker.ack(&ack).unwrap();
    }
    assert_eq!(broker.unacked(), 0);
    assert_eq!(
        broker.pending_acks().count(),
        0,
        "the pending-ack state says all acknowledged"
    );
    assert!(
        !broker.entry(&entry(1)).unwrap().cursor.is_deleted(),
        "txn 1 is still open"
    );
    assert_eq!(broker.commit(txn(1)).unwrap().deleted, [entry(1)]);
}

#[test]
fn as_broker_conflict_effects_count_before_the_check() {
    let config = ModelConfig::new(0).with_conflict_effects(ConflictEffects::AsBroker);
    let mut broker = ConsumerModel::new(config);
    dispatch(&mut broker, 1, 3);
    let ack = built(txn(1), &at(1, 0, 3));
    broker.ack(&ack).unwrap();
    let outcome = broker.ack(&ack).unwrap();
    assert!(outcome.is_conflict());
    assert_eq!(outcome.effect().unacked_delta, -1);
    assert_eq!(broker.unacked(), 1);
    assert!(shares_add_up(&broker));
}

#[test]
fn repeated_redeliveries_report_each_recount_once() {
    // Found by the abort property: an entry sent again twice must not report its first
    // recount a second time.
    let mut broker = model(0, false);
    dispatch(&mut broker, 1, 4);
    for (t, expected_recount) in [(1, 3), (2, 6)] {
        broker.ack(&built(txn(t), &at(1, 0, 4))).unwrap();
        for e in broker.abort(txn(t)).unwrap().redeliver {
            broker.dispatch(e, 4).unwrap();
        }
        assert_eq!(broker.counters().recounted_on_redispatch, expected_recount);
    }
    for index in 0..4 {
        broker.ack(&built(txn(3), &at(1, index, 4))).unwrap();
    }
    assert_eq!(broker.pending_acks().count(), 0);
    assert_eq!(broker.unacked(), 6);
    assert_eq!(broker.leaked_unacked(), 6);
}

#[test]
fn one_send_messages_call_checks_the_limit_once_and_may_overshoot_it() {
    // Consumer.sendMessages (4.0.8, l.333-447) adds every entry of the call to the count and
    // blocks the consumer only after the loop (incrementUnackedMessages, l.428); the
    // dispatcher checks the flag once, when it picks the consumer.
    let mut broker = model(12, true);
    let answers = broker
        .dispatch_all(&[(entry(1), 6), (entry(2), 6), (entry(3), 5)])
        .unwrap();
    assert_eq!(broker.unacked(), 17, "6 + 6 + 5, past the limit of 12");
    assert!(broker.is_blocked());
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Dispatch::Dispatched { blocked: true, .. }))
    );
    // Entry by entry, the third would have been refused.
    let mut one_by_one = model(12, true);
    dispatch(&mut one_by_one, 1, 6);
    dispatch(&mut one_by_one, 2, 6);
    assert_eq!(one_by_one.dispatch(entry(3), 5), Ok(Dispatch::Blocked));
    // A blocked consumer gets nothing from a call.
    assert_eq!(
        broker.dispatch_all(&[(entry(4), 1)]).unwrap(),
        vec![Dispatch::Blocked]
    );
    assert_eq!(broker.unacked(), 17);
    // An entry already acknowledged in the cursor is skipped inside a call as well.
    broker.ack(&WireAck::individual(entry(1))).unwrap();
    broker.redeliver_all();
    let answers = broker
        .dispatch_all(&[(entry(1), 6), (entry(2), 6)])
        .unwrap();
    assert!(matches!(answers[0], Dispatch::Skipped(_)));
    assert_eq!(broker.unacked(), 6);
}

#[test]
fn a_restored_cursor_set_is_sent_and_counted_on_the_next_dispatch() {
    // Indexes 0 and 1 of 5 acknowledged through a consumer that has gone.
    let mut outstanding = txn_ack::AckSet::outstanding(5).unwrap();
    outstanding.ack_up_to(1).unwrap();
    let mut broker = model(0, true);
    assert!(broker.restore_cursor(entry(1), 5, &outstanding).unwrap());
    match broker.dispatch(entry(1), 5).unwrap() {
        Dispatch::Dispatched {
            counted, ack_set, ..
        } => {
            assert_eq!(counted, 3);
            assert_eq!(ack_set, [0b11100]);
        }
        other => panic!("{other:?}"),
    }
    // The consumer's own state is newer: a second restore does nothing.
    assert!(!broker.restore_cursor(entry(1), 5, &outstanding).unwrap());
    // A set of another size, or an invalid size, is refused.
    assert!(broker.restore_cursor(entry(2), 4, &outstanding).is_err());
    assert!(broker.restore_cursor(entry(2), 0, &outstanding).is_err());
    // Nothing outstanding: the entry is deleted and not sent.
    let mut done = txn_ack::AckSet::outstanding(5).unwrap();
    done.ack_up_to(4).unwrap();
    assert!(broker.restore_cursor(entry(3), 5, &done).unwrap());
    assert!(matches!(
        broker.dispatch(entry(3), 5).unwrap(),
        Dispatch::Skipped(_)
    ));
    // Without batch-index acks the cursor keeps no such sets.
    let mut plain = model(0, false);
    assert!(!plain.restore_cursor(entry(1), 5, &outstanding).unwrap());
    assert_eq!(dispatch(&mut plain, 1, 5), 5);
}
