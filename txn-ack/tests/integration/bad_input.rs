//! Bad input gets a clear error, never a panic: in the builders and in the model.

use proptest::prelude::*;
use txn_ack::model::{ConflictEffects, ConsumerModel, Dispatch, ModelConfig, WireAck};
use txn_ack::{
    AckKind, AckSet, AckTracker, EntryId, Error, MAX_BATCH_SIZE, MessagePosition, PartialBatches,
    TxnAckTracker,
};

use crate::support::{LEDGER, at, dispatch, entry, shares_add_up, snapshot, txn, txn_wire};

const MAX: i32 = MAX_BATCH_SIZE as i32;

#[test]
fn positions_and_sets_refuse_bad_sizes_and_indexes() {
    for size in [0, -1, MAX + 1, i32::MAX, i32::MIN] {
        assert_eq!(
            MessagePosition::in_batch(LEDGER, 1, -1, 0, size),
            Err(Error::InvalidBatchSize {
                size: i64::from(size)
            })
        );
    }
    assert!(MessagePosition::in_batch(LEDGER, 1, -1, 0, MAX).is_ok());
    for index in [3, 4, -1, i32::MAX] {
        assert!(matches!(
            MessagePosition::in_batch(LEDGER, 1, -1, index, 3),
            Err(Error::IndexOutOfRange { batch_size: 3, .. })
        ));
    }
    assert!(AckSet::outstanding(0).is_err());
    assert!(AckSet::outstanding(MAX_BATCH_SIZE + 1).is_err());
    let mut set = AckSet::outstanding(3).unwrap();
    assert!(matches!(
        set.ack(3),
        Err(Error::IndexOutOfRange { index: 3, .. })
    ));
    assert!(set.ack_up_to(u32::MAX).is_err());
    for (size, words, bit) in [
        (3, vec![8], 3),
        (3, vec![-1], 3),
        (64, vec![0, 1], 64),
        (65, vec![0, 2], 65),
        (129, vec![0, 0, 2], 129),
    ] {
        assert_eq!(
            AckSet::from_wire(size, &words),
            Err(Error::BitsBeyondBatch {
                bit,
                batch_size: size
            }),
            "{words:?}"
        );
    }
    let message = Error::BitsBeyondBatch {
        bit: 3,
        batch_size: 3,
    }
    .to_string();
    assert!(
        message.contains("bit 3") && message.contains("3 messages"),
        "{message}"
    );
}

#[test]
fn ordinary_acks_are_idempotent_and_transactional_ones_refused() {
    let mut ordinary = AckTracker::new(PartialBatches::SendAckSet);
    assert!(ordinary.ack(&at(1, 1, 3)).unwrap().is_some());
    assert!(
        ordinary.ack(&at(1, 1, 3)).unwrap().is_none(),
        "nothing new to send"
    );
    ordinary.ack(&at(1, 0, 3)).unwrap();
    assert!(ordinary.ack(&at(1, 2, 3)).unwrap().is_some());
    for index in 0..3 {
        assert!(
            ordinary.ack(&at(1, index, 3)).unwrap().is_none(),
            "late duplicate"
        );
    }
    let mut holding = AckTracker::new(PartialBatches::HoldUntilComplete);
    assert!(holding.ack(&at(1, 1, 3)).unwrap().is_none());
    assert!(holding.ack(&at(1, 1, 3)).unwrap().is_none());

    let mut transactional = TxnAckTracker::default();
    transactional
        .ack(txn(1), AckKind::Individual, &at(1, 1, 3))
        .unwrap();
    let again = transactional.ack(txn(1), AckKind::Individual, &at(1, 1, 3));
    assert!(matches!(
        again,
        Err(Error::AlreadyAckedInTxn {
            ledger_id: LEDGER,
            entry_id: 1,
            index: 1,
            ..
        })
    ));
    let message = again.unwrap_err().to_string();
    assert!(message.contains("TransactionConflict"), "{message}");
}

#[test]
fn the_model_refuses_bad_input_and_changes_nothing() {
    let mut broker = ConsumerModel::new(ModelConfig::new(10).with_batch_index_ack(true));
    dispatch(&mut broker, 1, 3);
    broker.ack(&txn_wire(txn(1), 1, &[6], Some(3))).unwrap();
    broker.commit(txn(1)).unwrap();
    let before = snapshot(&broker);
    let counters = *broker.counters();
    for size in [0, -1, MAX + 1, i32::MIN] {
        assert_eq!(
            broker.dispatch(entry(2), size),
            Err(Error::InvalidBatchSize {
                size: i64::from(size)
            })
        );
    }
    assert!(matches!(
        broker.dispatch(entry(2), MAX),
        Ok(Dispatch::Dispatched { .. })
    ));
    let after_big = snapshot(&broker);
    let counters_big = *broker.counters();
    assert_eq!(
        broker.dispatch(entry(1), 4),
        Err(Error::InconsistentBatchSize {
            entry: entry(1),
            known: 3,
            given: 4
        })
    );
    let unknown = EntryId {
        ledger_id: 99,
        entry_id: 0,
    };
    assert_eq!(
        broker.ack(&WireAck::individual(unknown)),
        Err(Error::UnknownEntry { entry: unknown })
    );
    for (words, bit) in [(vec![8i64], 3u64), (vec![-1], 3), (vec![0, 1], 64)] {
        for txn_id in [None, Some(txn(2))] {
            let mut ack = WireAck::individual(entry(1)).with_ack_set(&words);
            ack.txn = txn_id;
            assert_eq!(
                broker.ack(&ack),
                Err(Error::BitsBeyondBatch { bit, batch_size: 3 })
            );
        }
    }
    for size in [0, -3, MAX + 1] {
        assert_eq!(
            broker.ack(&txn_wire(txn(2), 1, &[5], Some(size))),
            Err(Error::InvalidBatchSize {
                size: i64::from(size)
            })
        );
    }
    assert_eq!(
        broker.ack(&txn_wire(txn(1), 1, &[5], Some(3))),
        Err(Error::TransactionEnded {
            txn: txn(1),
            committed: true
        })
    );
    assert!(broker.commit(txn(1)).is_err() && broker.abort(txn(1)).is_err());
    assert_eq!(snapshot(&broker), after_big);
    assert_eq!(*broker.counters(), counters_big);
    assert_ne!(before, after_big);
    assert_eq!(
        counters.dispatched_entries + 1,
        counters_big.dispatched_entries
    );
    // Trailing zero words (Go keeps them) are not an error.
    assert!(
        broker
            .ack(&txn_wire(txn(2), 1, &[5, 0, 0], Some(3)))
            .unwrap()
            .is_acked()
    );
    let message = Error::BitsBeyondBatch {
        bit: 3,
        batch_size: 3,
    }
    .to_string();
    assert!(message.contains("bit 3"), "{message}");
}

/// One raw operation on the model, from any client, with any values.
#[derive(Debug, Clone)]
enum Op {
    Dispatch(u8, i32),
    Ack {
        entry: u8,
        cumulative: bool,
        words: Vec<i64>,
        batch_size: Option<i32>,
        txn: Option<u8>,
    },
    Commit(u8),
    Abort(u8),
    Redeliver(Vec<u8>),
    RedeliverAll,
    Flow,
}

fn size() -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => 1..=5i32,
        2 => 1..=300i32,
        1 => -3..=0i32,
        1 => Just(MAX),
        1 => Just(MAX + 1),
        1 => any::<i32>(),
    ]
}

fn word() -> impl Strategy<Value = i64> {
    prop_oneof![0..16i64, Just(-1i64), Just(i64::MIN), any::<i64>()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..6u8, size()).prop_map(|(e, s)| Op::Dispatch(e, s)),
        8 => (
            0..6u8,
            prop::bool::weighted(0.1),
            prop::collection::vec(word(), 0..4),
            prop::option::of(size()),
            prop::option::of(0..4u8),
        )
            .prop_map(|(entry, cumulative, words, batch_size, txn)| Op::Ack {
                entry,
                cumulative,
                words,
                batch_size,
                txn,
            }),
        1 => (0..4u8).prop_map(Op::Commit),
        1 => (0..4u8).prop_map(Op::Abort),
        1 => prop::collection::vec(0..6u8, 0..3).prop_map(Op::Redeliver),
        1 => Just(Op::RedeliverAll),
        1 => Just(Op::Flow),
    ]
}

/// The error the model documents for an ack, computed independently.
fn expected_ack_error(
    model: &ConsumerModel,
    ack: &WireAck,
    ended: &[(u8, bool)],
) -> Option<&'static str> {
    if ack.kind == AckKind::Cumulative {
        return None;
    }
    let Some(view) = model.entry(&ack.entry) else {
        return Some("UnknownEntry");
    };
    let size = u64::from(view.batch_size);
    let beyond = ack.ack_set.iter().enumerate().any(|(w, word)| {
        (0..64).any(|bit| (*word as u64) & (1 << bit) != 0 && w as u64 * 64 + bit >= size)
    });
    if beyond {
        return Some("BitsBeyondBatch");
    }
    let txn_id = ack.txn?;
    if ended.iter().any(|(t, _)| txn(u64::from(*t)) == txn_id) {
        return Some("TransactionEnded");
    }
    match ack.batch_size {
        Some(size) if !(1..=MAX).contains(&size) => Some("InvalidBatchSize"),
        _ => None,
    }
}

fn kind(error: &Error) -> &'static str {
    match error {
        Error::InvalidBatchSize { .. } => "InvalidBatchSize",
        Error::InconsistentBatchSize { .. } => "InconsistentBatchSize",
        Error::UnknownEntry { .. } => "UnknownEntry",
        Error::BitsBeyondBatch { .. } => "BitsBeyondBatch",
        Error::TransactionEnded { .. } => "TransactionEnded",
        _ => "other",
    }
}

proptest! {
    /// Garbage in: every operation returns an answer or the documented error, an error changes
    /// nothing, and the entries' shares always add up to the count.
    #[test]
    fn garbage_never_panics(
        max in 0..12u32,
        batch_index_ack in any::<bool>(),
        as_broker in any::<bool>(),
        ops in prop::collection::vec(op(), 0..60),
    ) {
        let effects = if as_broker { ConflictEffects::AsBroker } else { ConflictEffects::None };
        let mut model = ConsumerModel::new(
            ModelConfig::new(max).with_batch_index_ack(batch_index_ack).with_conflict_effects(effects),
        );
        let mut ended: Vec<(u8, bool)> = Vec::new();
        for op in ops {
            let before = (snapshot(&model), *model.counters());
            match op {
                Op::Dispatch(e, size) => {
                    let known = model.entry(&entry(u64::from(e))).map(|v| v.batch_size);
                    let result = model.dispatch(entry(u64::from(e)), size);
                    let expected = if !(1..=MAX).contains(&size) {
                        Some("InvalidBatchSize")
                    } else if known.is_some_and(|k| i64::from(k) != i64::from(size)) {
                        Some("InconsistentBatchSize")
                    } else {
                        None
                    };
                    prop_assert_eq!(result.as_ref().err().map(kind), expected, "{:?}", result);
                    if result.is_err() {
                        prop_assert_eq!(&(snapshot(&model), *model.counters()), &before);
                    }
                }
                Op::Ack { entry: e, cumulative, words, batch_size, txn: t } => {
                    let ack = WireAck {
                        kind: if cumulative { AckKind::Cumulative } else { AckKind::Individual },
                        entry: entry(u64::from(e)),
                        ack_set: words,
                        batch_size,
                        txn: t.map(|t| txn(u64::from(t))),
                    };
                    let expected = expected_ack_error(&model, &ack, &ended);
                    let result = model.ack(&ack);
                    prop_assert_eq!(result.as_ref().err().map(kind), expected, "{:?} -> {:?}", ack, result);
                    if result.is_err() {
                        prop_assert_eq!(&(snapshot(&model), *model.counters()), &before);
                    }
                }
                Op::Commit(t) | Op::Abort(t) => {
                    let commit = matches!(op, Op::Commit(_));
                    let result = if commit {
                        model.commit(txn(u64::from(t))).map(|_| ())
                    } else {
                        model.abort(txn(u64::from(t))).map(|_| ())
                    };
                    let was_ended = ended.iter().any(|(e, _)| *e == t);
                    prop_assert_eq!(result.is_err(), was_ended);
                    if !was_ended {
                        ended.push((t, commit));
                    }
                }
                Op::Redeliver(entries) => {
                    let ids: Vec<EntryId> = entries.iter().map(|e| entry(u64::from(*e))).collect();
                    model.redeliver_unacknowledged(&ids);
                    prop_assert!(!model.is_blocked());
                }
                Op::RedeliverAll => {
                    model.redeliver_all();
                    prop_assert_eq!(model.unacked(), 0);
                    prop_assert_eq!(model.pending_acks().count(), 0);
                }
                Op::Flow => {
                    let was_blocked = model.is_blocked();
                    let at_limit = max > 0 && model.unacked() >= i64::from(max);
                    prop_assert_eq!(model.flow_permits(), was_blocked || at_limit);
                }
            }
            prop_assert!(shares_add_up(&model));
        }
    }
}
