//! Golden vectors: the wire words of the reference's worked examples (§4.2) and round trips
//! across word boundaries.

use txn_ack::model::{ConsumerModel, ModelConfig, WireAck};
use txn_ack::{AckKind, AckSet, AckTracker, PartialBatches, txn_ack};

use crate::support::{at, dispatch, txn};

fn txn_words(index: i32, size: i32) -> Vec<i64> {
    txn_ack(txn(1), AckKind::Individual, &at(1, index, size))
        .unwrap()
        .id
        .wire_ack_set()
        .collect()
}

#[test]
fn a_batch_of_three() {
    // Independent per-index sets, with the batch size, for transactional acks.
    for (index, words) in [(0, [6]), (1, [5]), (2, [3])] {
        assert_eq!(txn_words(index, 3), words, "index {index}");
        let ack = txn_ack(txn(1), AckKind::Individual, &at(1, index, 3)).unwrap();
        assert_eq!(
            (ack.id.batch_size(), ack.id.batch_index()),
            (Some(3), index)
        );
    }
    // The accumulated set of ordinary acks after indexes 0 and 1, then nothing at all.
    let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
    let first = tracker.ack(&at(1, 0, 3)).unwrap().unwrap();
    assert_eq!(first.id.wire_ack_set().collect::<Vec<_>>(), [6]);
    let second = tracker.ack(&at(1, 1, 3)).unwrap().unwrap();
    assert_eq!(second.id.wire_ack_set().collect::<Vec<_>>(), [4]);
    let all = tracker.ack(&at(1, 2, 3)).unwrap().unwrap();
    assert_eq!(
        all.id.wire_ack_set().count(),
        0,
        "all acknowledged: no ack_set"
    );
    assert!(all.id.ack_set().is_none());
    assert_eq!((all.id.batch_index(), all.id.batch_size()), (-1, Some(3)));
    // The same words straight from AckSet.
    let mut set = AckSet::outstanding(3).unwrap();
    set.ack(0).unwrap();
    set.ack(1).unwrap();
    assert_eq!(set.wire_words().collect::<Vec<_>>(), [4]);
    set.ack(2).unwrap();
    assert_eq!(set.wire_words().count(), 0);
}

#[test]
fn the_broker_reads_the_golden_vectors_as_one_message_each() {
    for batch_index_ack in [false, true] {
        let mut broker =
            ConsumerModel::new(ModelConfig::new(0).with_batch_index_ack(batch_index_ack));
        dispatch(&mut broker, 1, 3);
        for (index, words) in [(0, [6]), (1, [5]), (2, [3])] {
            let wire = WireAck::individual(crate::support::entry(1))
                .with_ack_set(&words)
                .with_batch_size(3)
                .in_txn(txn(1));
            let effect = broker.ack(&wire).unwrap().effect();
            assert_eq!(effect.unacked_delta, -1, "index {index}");
            assert_eq!(effect.removed_from_pending_acks, index == 2);
        }
        assert_eq!(broker.unacked(), 0);
    }
}

/// A deterministic spread of patterns for a batch of `size`.
fn patterns(size: u32) -> Vec<Vec<u32>> {
    let last = size - 1;
    vec![
        (0..size).collect(), // nothing acknowledged
        vec![],              // everything acknowledged
        vec![0],
        vec![last],
        vec![63.min(last)],
        vec![64.min(last)],
        (0..size).filter(|i| i % 3 == 0).collect(),
        (0..size).filter(|i| *i != 63 && *i != 64).collect(),
    ]
}

#[test]
fn words_round_trip_across_word_boundaries() {
    for size in [64u32, 65, 128, 129] {
        for outstanding in patterns(size) {
            let mut set = AckSet::acknowledged(size).unwrap();
            let mut words = vec![0i64; size.div_ceil(64) as usize];
            for i in &outstanding {
                words[*i as usize / 64] |= 1i64 << (i % 64);
            }
            set.restore(&AckSet::from_wire(size, &words).unwrap())
                .unwrap();
            assert_eq!(set.outstanding_indexes().collect::<Vec<_>>(), outstanding);
            // Trailing zero words are trimmed, like Java's toLongArray().
            let trimmed = words
                .iter()
                .rposition(|w| *w != 0)
                .map_or(0, |last| last + 1);
            let wire: Vec<i64> = set.wire_words().collect();
            assert_eq!(wire, words[..trimmed], "size {size}");
            assert_eq!(AckSet::from_wire(size, &wire).unwrap(), set);
        }
        // Every index's independent set: all bits but one, the last word trimmed when empty.
        for index in [0, 1, 62, 63, 64, size - 1] {
            if index >= size {
                continue;
            }
            let words = txn_words(index as i32, size as i32);
            let set = AckSet::from_wire(size, &words).unwrap();
            assert_eq!(set.outstanding_count(), size - 1);
            assert!(!set.is_outstanding(index).unwrap());
            // The last word is empty only when it holds nothing but this index.
            let last_word_empty = index + 1 == size && size % 64 == 1;
            let expected = size.div_ceil(64) as usize - usize::from(last_word_empty);
            assert_eq!(words.len(), expected, "size {size} index {index}");
        }
    }
    // Bit 63 is the sign bit of the wire word.
    assert_eq!(txn_words(63, 64), [i64::MAX]);
    assert_eq!(txn_words(0, 64), [-2]);
    // The last of 65: the second word is empty and trimmed away.
    assert_eq!(txn_words(64, 65), [-1]);
    assert_eq!(txn_words(0, 65), [-2, 1]);
    assert_eq!(txn_words(128, 129), [-1, -1]);
}

#[test]
fn the_broker_reads_boundary_sets_as_one_message_each() {
    // Including the trimmed 65th and 129th: the broker's padding covers the missing word.
    for size in [64, 65, 128, 129] {
        let mut broker = ConsumerModel::new(ModelConfig::new(0).with_batch_index_ack(true));
        dispatch(&mut broker, 1, size);
        let mut order: Vec<i32> = (0..size).rev().collect();
        order.rotate_left(size as usize / 3);
        for index in order {
            let wire =
                WireAck::from(&txn_ack(txn(1), AckKind::Individual, &at(1, index, size)).unwrap());
            let outcome = broker.ack(&wire).unwrap();
            assert!(outcome.is_acked(), "size {size} index {index}: {outcome:?}");
            assert_eq!(outcome.effect().unacked_delta, -1);
        }
        assert_eq!(broker.unacked(), 0);
        assert_eq!(broker.commit(txn(1)).unwrap().deleted.len(), 1);
        // The same message twice. The broker compares within the pending set's own size
        // (64 bits per word it kept), so when the last index was alone in a trimmed word
        // (65, 129) the repeat goes unnoticed and counts again ([derived], §6): the
        // tracker's own refusal is what keeps a client correct there.
        let mut broker = ConsumerModel::new(ModelConfig::new(0));
        dispatch(&mut broker, 1, size);
        let last = at(1, size - 1, size);
        let wire = WireAck::from(&txn_ack(txn(1), AckKind::Individual, &last).unwrap());
        assert!(broker.ack(&wire).unwrap().is_acked());
        let again = broker.ack(&wire).unwrap();
        if size % 64 == 1 {
            assert!(again.is_acked(), "size {size}: {again:?}");
            assert_eq!(broker.unacked(), i64::from(size) - 2);
        } else {
            assert!(again.is_conflict(), "size {size}: {again:?}");
        }
        let mut tracker = txn_ack::TxnAckTracker::default();
        tracker.ack(txn(1), AckKind::Individual, &last).unwrap();
        assert!(tracker.ack(txn(1), AckKind::Individual, &last).is_err());
    }
}
