//! Properties of [`SubscriptionModel`] with several consumers (issue 27): random scripts of
//! dispatches (the dispatcher's replay set first, to any consumer that is not blocked),
//! ordinary and transactional acks sent through any consumer, commits and aborts, redelivery
//! requests with and without ids, consumers leaving and joining.
//!
//! After every step:
//! - each consumer's entries' shares add up to its count;
//! - a step changes only the counts and `pendingAcks` it may change: an ack only its owner's
//!   ([`SubscriptionModel::ack_owner`] before the ack), a redelivery request only its
//!   sender's (and only entries of the sender's own `pendingAcks` leave), a commit or an abort
//!   none, a dispatch only its target's;
//! - a consumer's `pendingAcks` holds only entries dispatched to it.
//!
//! With ordinary acks only, at the end (every replay dispatched, every consumer acknowledging
//! the whole entries it holds) every count is 0 and every entry deleted, whichever consumer
//! acknowledged what.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use txn_ack::model::{
    ConflictEffects, ConsumerId, Dispatch, ModelConfig, SubscriptionModel, WireAck,
};
use txn_ack::{AckKind, EntryId, MessagePosition, TxnId, txn_ack};

use crate::support::{LEDGER, entry, txn};

#[derive(Debug, Clone)]
enum Step {
    /// A new entry of this size joins the dispatcher's queue.
    Produce(i32),
    /// The dispatcher sends the next queued entry to the `n`-th consumer (modulo those
    /// connected) unless it is blocked.
    Dispatch(u8),
    /// Consumer `by` acknowledges the whole entry of one of the entries ever dispatched.
    Ack {
        by: u8,
        pick: u16,
    },
    /// Consumer `by` acknowledges one index of such an entry (batch-index acks enabled only).
    AckIndex {
        by: u8,
        pick: u16,
        index: u16,
    },
    /// Consumer `by` acknowledges one index in the transaction of slot `slot`.
    TxnAck {
        by: u8,
        pick: u16,
        index: u16,
        slot: u8,
    },
    Commit(u8),
    Abort(u8),
    RedeliverAll(u8),
    /// Consumer `by` names up to three entries ever dispatched (its own or not).
    RedeliverIds {
        by: u8,
        picks: Vec<u16>,
    },
    /// The `n`-th consumer leaves (if more than one is connected).
    Leave(u8),
    Join,
}

fn step(transactions: bool) -> BoxedStrategy<Step> {
    let plain = prop_oneof![
        4 => (1..=12i32).prop_map(Step::Produce),
        8 => any::<u8>().prop_map(Step::Dispatch),
        5 => (any::<u8>(), any::<u16>()).prop_map(|(by, pick)| Step::Ack { by, pick }),
        3 => (any::<u8>(), any::<u16>(), any::<u16>())
            .prop_map(|(by, pick, index)| Step::AckIndex { by, pick, index }),
        1 => any::<u8>().prop_map(Step::RedeliverAll),
        2 => (any::<u8>(), prop::collection::vec(any::<u16>(), 1..=3))
            .prop_map(|(by, picks)| Step::RedeliverIds { by, picks }),
        1 => any::<u8>().prop_map(Step::Leave),
        1 => Just(Step::Join),
    ];
    if !transactions {
        return plain.boxed();
    }
    prop_oneof![
        25 => plain,
        6 => (any::<u8>(), any::<u16>(), any::<u16>(), 0..3u8)
            .prop_map(|(by, pick, index, slot)| Step::TxnAck { by, pick, index, slot }),
        2 => (0..3u8).prop_map(Step::Commit),
        2 => (0..3u8).prop_map(Step::Abort),
    ]
    .boxed()
}

/// What each consumer looks like: count and `pendingAcks`.
type Accounting = BTreeMap<ConsumerId, (i64, BTreeSet<EntryId>)>;

struct Run {
    model: SubscriptionModel,
    batch_index_ack: bool,
    sizes: Vec<i32>,
    /// Entries waiting for the dispatcher: new ones and replays, in entry order.
    queue: BTreeSet<u64>,
    /// Entries ever dispatched to each consumer (while connected).
    received: BTreeMap<ConsumerId, BTreeSet<EntryId>>,
    next_consumer: u64,
    /// The open transaction of each slot.
    slots: [Option<TxnId>; 3],
    next_txn: u64,
}

impl Run {
    fn new(consumers: u8, limit: u32, batch_index_ack: bool) -> Self {
        let config = ModelConfig::new(limit)
            .with_batch_index_ack(batch_index_ack)
            .with_conflict_effects(ConflictEffects::AsBroker);
        let mut run = Self {
            model: SubscriptionModel::new(config),
            batch_index_ack,
            sizes: Vec::new(),
            queue: BTreeSet::new(),
            received: BTreeMap::new(),
            next_consumer: 0,
            slots: [None; 3],
            next_txn: 1,
        };
        for _ in 0..consumers {
            run.join();
        }
        run
    }

    fn join(&mut self) {
        let id = ConsumerId(self.next_consumer);
        self.next_consumer += 1;
        assert!(self.model.add_consumer(id));
        self.received.insert(id, BTreeSet::new());
    }

    fn nth(&self, n: u8) -> ConsumerId {
        let ids: Vec<ConsumerId> = self.model.consumers().map(|c| c.id).collect();
        ids[usize::from(n) % ids.len()]
    }

    fn dispatched(&self) -> Vec<EntryId> {
        let mut all: BTreeSet<EntryId> = BTreeSet::new();
        for entries in self.received.values() {
            all.extend(entries);
        }
        all.extend(self.model.entries().map(|v| v.entry));
        all.into_iter().collect()
    }

    fn pick(&self, pick: u16) -> Option<EntryId> {
        let all = self.dispatched();
        (!all.is_empty()).then(|| all[usize::from(pick) % all.len()])
    }

    fn size(&self, entry: &EntryId) -> i32 {
        self.sizes[entry.entry_id as usize]
    }

    fn accounting(&self) -> Accounting {
        self.model
            .consumers()
            .map(|c| {
                let pending = self.model.pending_acks(c.id).map(|(e, _)| e).collect();
                (c.id, (c.unacked, pending))
            })
            .collect()
    }

    fn replay(&mut self, entries: &[EntryId]) {
        for entry in entries {
            if !self
                .model
                .entry(entry)
                .is_some_and(|v| v.cursor.is_deleted())
            {
                self.queue.insert(entry.entry_id);
            }
        }
    }

    fn slot(&mut self, slot: u8) -> TxnId {
        let at = usize::from(slot) % 3;
        *self.slots[at].get_or_insert_with(|| {
            self.next_txn += 1;
            txn(self.next_txn)
        })
    }

    /// Applies `step`; returns the consumers whose count or `pendingAcks` it may change
    /// (`None`: any).
    fn apply(&mut self, step: &Step) -> Result<Option<BTreeSet<ConsumerId>>, TestCaseError> {
        let only = |ids: &[ConsumerId]| Some(ids.iter().copied().collect::<BTreeSet<_>>());
        Ok(match step {
            Step::Produce(size) => {
                self.queue.insert(self.sizes.len() as u64);
                self.sizes.push(*size);
                only(&[])
            }
            Step::Dispatch(n) => {
                let to = self.nth(*n);
                let Some(&index) = self.queue.first() else {
                    return Ok(only(&[]));
                };
                let id = entry(index);
                let answer = self
                    .model
                    .dispatch(to, id, self.sizes[index as usize])
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match answer {
                    Dispatch::Dispatched { .. } => {
                        self.queue.remove(&index);
                        self.received.entry(to).or_default().insert(id);
                    }
                    Dispatch::Skipped(_) => {
                        self.queue.remove(&index);
                    }
                    Dispatch::Blocked => {}
                }
                only(&[to])
            }
            Step::Ack { by, pick } => {
                let by = self.nth(*by);
                let Some(entry) = self.pick(*pick) else {
                    return Ok(only(&[]));
                };
                let owner = self.model.ack_owner(by, &entry);
                self.model
                    .ack(by, &WireAck::individual(entry))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                only(&[owner])
            }
            Step::AckIndex { by, pick, index } => {
                let by = self.nth(*by);
                let Some(entry) = self.pick(*pick).filter(|_| self.batch_index_ack) else {
                    return Ok(only(&[]));
                };
                let size = self.size(&entry);
                let index = i32::from(*index) % size;
                let position = MessagePosition::in_batch(LEDGER, entry.entry_id, -1, index, size)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let id = txn_ack(txn(0), AckKind::Individual, &position)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?
                    .id;
                let mut wire = WireAck::from_id(AckKind::Individual, &id);
                wire.batch_size = None;
                let owner = self.model.ack_owner(by, &entry);
                self.model
                    .ack(by, &wire)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                only(&[owner])
            }
            Step::TxnAck {
                by,
                pick,
                index,
                slot,
            } => {
                let by = self.nth(*by);
                let Some(entry) = self.pick(*pick) else {
                    return Ok(only(&[]));
                };
                let size = self.size(&entry);
                let index = i32::from(*index) % size;
                let txn_id = self.slot(*slot);
                let position = MessagePosition::in_batch(LEDGER, entry.entry_id, -1, index, size)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let ack = txn_ack(txn_id, AckKind::Individual, &position)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let owner = self.model.ack_owner(by, &entry);
                self.model
                    .ack(by, &WireAck::from(&ack))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                only(&[owner])
            }
            Step::Commit(slot) | Step::Abort(slot) => {
                let at = usize::from(*slot) % 3;
                let Some(txn_id) = self.slots[at].take() else {
                    return Ok(only(&[]));
                };
                if matches!(step, Step::Commit(_)) {
                    self.model
                        .commit(txn_id)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                } else {
                    let aborted = self
                        .model
                        .abort(txn_id)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    self.replay(&aborted.redeliver);
                }
                only(&[])
            }
            Step::RedeliverAll(n) => {
                let by = self.nth(*n);
                let held: BTreeSet<EntryId> = self.model.pending_acks(by).map(|(e, _)| e).collect();
                let redelivered = self
                    .model
                    .redeliver_all(by)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let taken: BTreeSet<EntryId> = redelivered.entries.iter().copied().collect();
                prop_assert_eq!(&taken, &held, "without ids: everything it held");
                prop_assert_eq!(self.model.unacked(by), Some(0));
                self.replay(&redelivered.entries);
                only(&[by])
            }
            Step::RedeliverIds { by, picks } => {
                let by = self.nth(*by);
                let named: Vec<EntryId> = picks.iter().filter_map(|p| self.pick(*p)).collect();
                let held: BTreeSet<EntryId> = self.model.pending_acks(by).map(|(e, _)| e).collect();
                let redelivered = self
                    .model
                    .redeliver_unacknowledged(by, &named)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for entry in &redelivered.entries {
                    prop_assert!(held.contains(entry), "{entry} was not the sender's");
                    prop_assert!(named.contains(entry), "{entry} was not named");
                }
                prop_assert_eq!(self.model.is_blocked(by), Some(false));
                self.replay(&redelivered.entries);
                only(&[by])
            }
            Step::Leave(n) => {
                if self.model.consumers().count() < 2 {
                    return Ok(only(&[]));
                }
                let gone = self.nth(*n);
                let held: BTreeSet<EntryId> =
                    self.model.pending_acks(gone).map(|(e, _)| e).collect();
                let removed = self
                    .model
                    .remove_consumer(gone)
                    .ok_or_else(|| TestCaseError::fail("the consumer was connected"))?;
                let taken: BTreeSet<EntryId> = removed.entries.iter().copied().collect();
                prop_assert_eq!(taken, held);
                self.received.remove(&gone);
                self.replay(&removed.entries);
                only(&[gone])
            }
            Step::Join => {
                self.join();
                only(&[])
            }
        })
    }

    fn check(
        &self,
        before: &Accounting,
        may_change: Option<&BTreeSet<ConsumerId>>,
    ) -> Result<(), TestCaseError> {
        let after = self.accounting();
        for consumer in self.model.consumers() {
            let shares: i64 = self
                .dispatched()
                .iter()
                .filter_map(|e| self.model.counted(consumer.id, e))
                .sum();
            prop_assert_eq!(shares, consumer.unacked, "{}'s shares", consumer.id);
            let received = self.received.get(&consumer.id).cloned().unwrap_or_default();
            for (entry, _) in self.model.pending_acks(consumer.id) {
                prop_assert!(
                    received.contains(&entry),
                    "{} holds {entry} it never got",
                    consumer.id
                );
            }
        }
        if let Some(may_change) = may_change {
            for (id, state) in &after {
                if may_change.contains(id) {
                    continue;
                }
                if let Some(earlier) = before.get(id) {
                    prop_assert_eq!(earlier, state, "{} changed", id);
                }
            }
        }
        Ok(())
    }

    /// Every replay and new entry dispatched round robin, every consumer acknowledging the
    /// whole entries it holds (ordinary acks).
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for (n, slot) in self.slots.iter_mut().enumerate() {
            if let Some(open) = slot.take() {
                let aborted = self
                    .model
                    .abort(open)
                    .map_err(|e| TestCaseError::fail(format!("slot {n}: {e}")))?;
                for entry in aborted.redeliver {
                    self.queue.insert(entry.entry_id);
                }
            }
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            prop_assert!(rounds < 10_000, "the drain does not end");
            let ids: Vec<ConsumerId> = self.model.consumers().map(|c| c.id).collect();
            for id in &ids {
                let held: Vec<EntryId> = self.model.pending_acks(*id).map(|(e, _)| e).collect();
                for entry in held {
                    self.model
                        .ack(*id, &WireAck::individual(entry))
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            let Some(&index) = self.queue.first() else {
                break;
            };
            let to = ids[rounds % ids.len()];
            match self
                .model
                .dispatch(to, entry(index), self.sizes[index as usize])
                .map_err(|e| TestCaseError::fail(e.to_string()))?
            {
                Dispatch::Dispatched { .. } | Dispatch::Skipped(_) => {
                    self.queue.remove(&index);
                    self.received.entry(to).or_default().insert(entry(index));
                }
                Dispatch::Blocked => {}
            }
        }
        Ok(())
    }
}

fn run(
    steps: &[Step],
    consumers: u8,
    limit: u32,
    batch_index_ack: bool,
) -> Result<Run, TestCaseError> {
    let mut run = Run::new(consumers, limit, batch_index_ack);
    for step in steps {
        let before = run.accounting();
        let may_change = run.apply(step)?;
        run.check(&before, may_change.as_ref())?;
    }
    Ok(run)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Ordinary acks through any consumer, redeliveries, consumers coming and going: the
    /// invariants hold throughout and everything drains to zero.
    #[test]
    fn ordinary_acks_through_any_consumer_drain_to_zero(
        steps in prop::collection::vec(step(false), 0..120),
        consumers in 1..=3u8,
        batch_index_ack in any::<bool>(),
    ) {
        // Unlimited: a limit with redeliveries can keep consumers blocked in the middle of
        // the drain, which is not what this property is about.
        let mut run = run(&steps, consumers, 0, batch_index_ack)?;
        run.drain()?;
        for consumer in run.model.consumers() {
            prop_assert_eq!(consumer.unacked, 0, "{}", consumer.id);
            prop_assert_eq!(run.model.pending_acks(consumer.id).count(), 0);
        }
        for index in 0..run.sizes.len() as u64 {
            if let Some(view) = run.model.entry(&entry(index)) {
                prop_assert!(view.cursor.is_deleted(), "{index} is not deleted: {view:?}");
            }
        }
    }

    /// Transactions too, a limit, conflicts with the broker's effects: the invariants hold
    /// throughout (each step changes only the accounting it may change).
    #[test]
    fn every_step_changes_only_its_owners_accounting(
        steps in prop::collection::vec(step(true), 0..160),
        consumers in 1..=3u8,
        limit in prop_oneof![Just(0u32), 5..40u32],
        batch_index_ack in any::<bool>(),
    ) {
        run(&steps, consumers, limit, batch_index_ack)?;
    }
}

/// Fact 1 of issue 27 in the model: an abort touches no consumer; the replay goes to B while
/// A keeps the entry and its count; then both hold it.
#[test]
fn an_abort_leaves_the_holder_counting_and_the_replay_counts_again_elsewhere() {
    let (a, b) = (ConsumerId(1), ConsumerId(2));
    let mut model = SubscriptionModel::new(ModelConfig::new(0).with_batch_index_ack(true));
    model.add_consumer(a);
    model.add_consumer(b);
    let e = entry(0);
    assert!(matches!(
        model.dispatch(a, e, 10),
        Ok(Dispatch::Dispatched { counted: 10, .. })
    ));
    let position = MessagePosition::in_batch(LEDGER, 0, -1, 0, 10).unwrap();
    let ack = txn_ack(txn(1), AckKind::Individual, &position).unwrap();
    assert!(model.ack(a, &WireAck::from(&ack)).unwrap().is_acked());
    assert_eq!(model.unacked(a), Some(9));
    let aborted = model.abort(txn(1)).unwrap();
    assert_eq!(aborted.redeliver, [e]);
    assert_eq!(model.unacked(a), Some(9));
    match model.dispatch(b, e, 10) {
        Ok(Dispatch::Dispatched {
            counted, ack_set, ..
        }) => assert_eq!((counted, ack_set), (10, vec![])),
        other => panic!("{other:?}"),
    }
    assert_eq!(model.holders(&e).collect::<Vec<_>>(), [a, b]);
    // An ack through B finds B's own pendingAcks first.
    assert_eq!(model.ack_owner(b, &e), b);
    // Through a third consumer: the first holder in subscription order.
    let c = ConsumerId(3);
    model.add_consumer(c);
    assert_eq!(model.ack_owner(c, &e), a);
    // B acknowledges the entry: B's count goes to 0; A's stays until the mark-delete pruning,
    // which takes the entry out of A's pendingAcks without a decrement.
    model.ack(b, &WireAck::individual(e)).unwrap();
    assert_eq!(model.unacked(b), Some(0));
    assert_eq!(model.holders(&e).collect::<Vec<_>>(), [a]);
    assert_eq!(model.remove_pending_acks_up_to(e), 1);
    assert_eq!(model.unacked(a), Some(9));
    assert_eq!(model.leaked_unacked(a), 9);
    assert_eq!(model.ack_owner(a, &e), a);
    model.ack(a, &WireAck::individual(e)).unwrap();
    assert_eq!(
        model.unacked(a),
        Some(9),
        "no owner holds it: nothing comes off"
    );
}

/// `Consumer.redeliverUnacknowledgedMessages(List)`: ids outside the sender's pendingAcks are
/// passed over, the sender is unblocked anyway.
#[test]
fn a_request_with_ids_of_another_consumer_only_unblocks_the_sender() {
    let (a, b) = (ConsumerId(1), ConsumerId(2));
    let mut model = SubscriptionModel::new(ModelConfig::new(4));
    model.add_consumer(a);
    model.add_consumer(b);
    model.dispatch(a, entry(0), 4).unwrap();
    model.dispatch(b, entry(1), 2).unwrap();
    assert_eq!(model.is_blocked(a), Some(true));
    let redelivered = model.redeliver_unacknowledged(a, &[entry(1)]).unwrap();
    assert!(redelivered.entries.is_empty());
    assert_eq!(model.is_blocked(a), Some(false));
    assert_eq!((model.unacked(a), model.unacked(b)), (Some(4), Some(2)));
    assert_eq!(model.holders(&entry(1)).collect::<Vec<_>>(), [b]);
    assert_eq!(
        model
            .redeliver_unacknowledged(ConsumerId(9), &[])
            .unwrap_err(),
        txn_ack::Error::UnknownConsumer { consumer: 9 }
    );
}
