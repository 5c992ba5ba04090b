//! The stall of apache/pulsar-client-go#1534 (reference §5.3, §8.6): limit 20, 3 messages per
//! batch, each batch acknowledged in its own transaction and committed.

use txn_ack::model::{ConsumerModel, Dispatch, ModelConfig, WireAck};
use txn_ack::{AckKind, MessagePosition, TxnAckTracker, TxnId};

use crate::legacy::{AccumulatedSetTxnAcker, GoV021TxnAcker};
use crate::support::{at, entry, txn};

const LIMIT: u32 = 20;
const BATCH: i32 = 3;

/// How a run went.
#[derive(Debug)]
struct Run {
    model: ConsumerModel,
    /// The batches dispatched, in order.
    dispatched: Vec<u64>,
    /// The first batch the consumer was blocked for.
    refused: Option<u64>,
    /// The unacked count after each batch's commit.
    after_commit: Vec<i64>,
    /// Acks the broker rejected as conflicts.
    conflicts: usize,
}

/// Dispatches batches 1..=`batches` one by one; each is acknowledged message by message in
/// its own transaction, which then commits. Stops at the first batch refused.
fn run(
    batch_index_ack: bool,
    batches: u64,
    mut acker: impl FnMut(TxnId, &MessagePosition) -> Option<WireAck>,
) -> Run {
    let mut run = Run {
        model: ConsumerModel::new(ModelConfig::new(LIMIT).with_batch_index_ack(batch_index_ack)),
        dispatched: Vec::new(),
        refused: None,
        after_commit: Vec::new(),
        conflicts: 0,
    };
    for batch in 1..=batches {
        match run
            .model
            .dispatch(entry(batch), BATCH)
            .expect("valid input")
        {
            Dispatch::Dispatched { .. } => run.dispatched.push(batch),
            Dispatch::Blocked => {
                run.refused = Some(batch);
                break;
            }
            Dispatch::Skipped(reason) => panic!("batch {batch} skipped: {reason:?}"),
        }
        let t = txn(batch);
        for index in 0..BATCH {
            if let Some(wire) = acker(t, &at(batch, index, BATCH)) {
                let outcome = run.model.ack(&wire).expect("valid input");
                run.conflicts += usize::from(outcome.is_conflict());
            }
        }
        run.model.commit(t).expect("an open transaction");
        run.after_commit.push(run.model.unacked());
    }
    run
}

fn this_crate(
    tracker: &mut TxnAckTracker,
) -> impl FnMut(TxnId, &MessagePosition) -> Option<WireAck> {
    |t, position| {
        let ack = tracker
            .ack(t, AckKind::Individual, position)
            .expect("each message acknowledged once");
        Some(WireAck::from(&ack))
    }
}

#[test]
fn the_legacy_go_client_blocks_and_batch_11_is_never_dispatched() {
    for batch_index_ack in [false, true] {
        let mut go = GoV021TxnAcker::new(false);
        let mut run = run(batch_index_ack, 15, |t, p| go.ack(t, p));
        assert_eq!(run.dispatched, (1..=10).collect::<Vec<_>>(), "{run:?}");
        assert_eq!(run.refused, Some(11), "batch 11 is refused");
        // Each whole-entry ack without batch_size takes 1 off instead of 3.
        assert_eq!(
            run.after_commit,
            (1..=10).map(|k| 2 * k).collect::<Vec<_>>()
        );
        assert!(run.model.is_blocked());
        assert_eq!(run.model.unacked(), 20);
        assert_eq!(run.model.leaked_unacked(), 20, "2 stranded per batch");
        assert_eq!(
            run.model.pending_acks().count(),
            0,
            "every entry left pendingAcks"
        );
        assert!(run.model.flow_permits(), "a FLOW does not help");
        assert_eq!(run.model.dispatch(entry(11), BATCH), Ok(Dispatch::Blocked));
        assert_eq!(run.conflicts, 0);
        // The ten transactions did commit: the cursor holds every entry.
        assert!(
            run.model.entries().all(|view| view.cursor.is_deleted()),
            "ten transactions committed"
        );
    }
}

#[test]
fn this_crate_never_blocks_and_the_count_returns_to_zero() {
    for batch_index_ack in [false, true] {
        let mut tracker = TxnAckTracker::default();
        let run = run(batch_index_ack, 40, this_crate(&mut tracker));
        assert_eq!(run.dispatched, (1..=40).collect::<Vec<_>>());
        assert_eq!(run.refused, None);
        assert!(
            run.after_commit.iter().all(|count| *count == 0),
            "{:?}",
            run.after_commit
        );
        assert!(!run.model.is_blocked());
        assert_eq!(run.model.counters().blocked, 0);
        assert_eq!(run.model.leaked_unacked(), 0);
        assert_eq!(run.model.pending_acks().count(), 0);
        assert!(run.model.entries().all(|view| view.cursor.is_deleted()));
        assert_eq!(run.conflicts, 0);
    }
}

#[test]
fn this_crate_also_survives_a_consumer_that_acks_late() {
    // The broker sends ahead (here: until blocked) and the client acknowledges afterwards.
    let mut model = ConsumerModel::new(ModelConfig::new(LIMIT));
    let mut tracker = TxnAckTracker::default();
    let mut next = 1u64;
    let mut delivered = 0;
    for round in 1..=20u64 {
        let mut received = Vec::new();
        while let Dispatch::Dispatched { .. } = model.dispatch(entry(next), BATCH).unwrap() {
            received.push(next);
            next += 1;
        }
        assert!(model.is_blocked(), "sent until blocked");
        assert_eq!(received.len(), 7, "21 unacked at the seventh batch");
        let t = txn(round);
        for batch in &received {
            for index in 0..BATCH {
                let ack = tracker
                    .ack(t, AckKind::Individual, &at(*batch, index, BATCH))
                    .unwrap();
                assert!(model.ack(&WireAck::from(&ack)).unwrap().is_acked());
            }
        }
        assert!(!model.is_blocked(), "unblocked once the count fell to 10");
        model.commit(t).unwrap();
        assert_eq!(model.unacked(), 0);
        delivered += received.len();
    }
    assert_eq!(delivered, 140);
}

#[test]
fn the_go_client_with_batch_index_acks_stalls_sooner_and_conflicts() {
    // EnableBatchIndexAcknowledgment=true: accumulated sets without batch_size. Each per-index
    // ack counts 0 - cardinality, so the count goes *up*; the final whole-entry ack is a
    // conflict because the entry has pending per-index acks (§5.3).
    let mut go = GoV021TxnAcker::new(true);
    let run = run(true, 15, |t, p| go.ack(t, p));
    assert_eq!(run.after_commit, [6, 12, 18, 24]);
    assert_eq!(run.dispatched, [1, 2, 3, 4]);
    assert_eq!(run.refused, Some(5));
    assert_eq!(run.conflicts, 4, "every batch's last ack");
    assert!(run.model.is_blocked());
}

#[test]
fn reusing_the_accumulated_set_keeps_entries_pending() {
    // batch_size kept but the set accumulated: the second ack of every batch conflicts, the
    // entries never leave pendingAcks, and the consumer blocks.
    let mut acker = AccumulatedSetTxnAcker::new();
    let run = run(true, 15, |t, p| acker.ack(t, p));
    assert_eq!(run.conflicts, 2 * run.dispatched.len());
    assert!(run.refused.is_some());
    assert!(run.model.pending_acks().count() >= 7);
}
