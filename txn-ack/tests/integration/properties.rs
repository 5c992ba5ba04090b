//! Property tests: random correct clients against the model.
//!
//! A case is a few batches (1 to 300 messages each), every message acknowledged exactly once
//! in a random order, each batch acknowledged ordinarily (through [`AckTracker`], accumulated
//! sets or held until complete), transactionally (through [`TxnAckTracker`], in up to three
//! concurrent transactions) or both mixed, interleaved with random commits, aborts,
//! cumulative acks (which a Shared subscription ignores) and duplicate acks (which the
//! trackers refuse to send). After every step the count is never negative and the entries'
//! shares add up to it; no ack is ever a conflict. At the end, with everything acknowledged
//! and committed:
//! - without aborts the count is exactly 0;
//! - with aborts it is exactly what redelivery recounted: an abort's redelivery sends an entry
//!   again while it may still be in `pendingAcks`, and a 4.0.x broker then counts its
//!   outstanding messages twice (the model's [`Counters::recounted_on_redispatch`]); nothing
//!   else may be left over;
//! - nothing is left in `pendingAcks`, and the cursor holds every entry (with broker
//!   batch-index acks disabled: every entry acknowledged ordinarily or within one committed
//!   transaction; see `rules::partial_commits_without_batch_index_acks`).
//!
//! [`Counters::recounted_on_redispatch`]: txn_ack::model::Counters::recounted_on_redispatch

use std::collections::{BTreeSet, HashMap, VecDeque};

use proptest::prelude::*;
use txn_ack::model::{AckOutcome, ConsumerModel, Dispatch, ModelConfig, WireAck};
use txn_ack::{AckKind, AckTracker, PartialBatches, TxnAckTracker, TxnId, txn_ack};

use crate::support::{at, entry, shares_add_up, snapshot, txn};

/// How a message is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Ordinary,
    /// In the transaction currently open in this slot.
    Txn(u8),
}

const SLOTS: u8 = 3;

#[derive(Debug, Clone)]
enum Step {
    /// The next message (of an entry already dispatched).
    Ack,
    Commit(u8),
    Abort(u8),
    Cumulative {
        pick: u16,
        index: u16,
        in_txn: bool,
    },
    /// One of the messages already acknowledged, again.
    Duplicate(u16),
}

#[derive(Debug, Clone)]
struct Case {
    batch_index_ack: bool,
    hold: bool,
    /// 0: unlimited.
    limit: u32,
    sizes: Vec<i32>,
    /// Every message once: entry, index, method, in acknowledgement order.
    messages: Vec<(usize, i32, Method)>,
    steps: Vec<Step>,
}

fn step(aborts: bool) -> impl Strategy<Value = Step> {
    let abort_weight = if aborts { 2 } else { 0 };
    prop_oneof![
        20 => Just(Step::Ack),
        2 => (0..SLOTS).prop_map(Step::Commit),
        abort_weight => (0..SLOTS).prop_map(Step::Abort),
        1 => (any::<u16>(), any::<u16>(), any::<bool>())
            .prop_map(|(pick, index, in_txn)| Step::Cumulative { pick, index, in_txn }),
        1 => any::<u16>().prop_map(Step::Duplicate),
    ]
}

fn case(aborts: bool) -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<bool>(),
        // 1..=300, mostly small: TxnAckTracker::ack costs O(batch size) per claim on the
        // entry, so large batches dominate the run time.
        prop::collection::vec(prop_oneof![3 => 1..=64i32, 1 => 65..=300i32], 1..=3),
        prop::option::of(0..40u32),
    )
        .prop_flat_map(move |(batch_index_ack, hold, sizes, extra)| {
            let pairs: Vec<(usize, i32)> = sizes
                .iter()
                .enumerate()
                .flat_map(|(e, size)| (0..*size).map(move |i| (e, i)))
                .collect();
            let total = pairs.len();
            let max_size = sizes.iter().copied().max().unwrap_or(1) as u32;
            // With aborts the recount can keep a consumer blocked: no limit then. Otherwise
            // at least twice the largest batch, so that a correct client always drains.
            let limit = match extra {
                Some(extra) if !aborts => 2 * max_size + extra,
                _ => 0,
            };
            let mixed_ok = batch_index_ack && !hold;
            (
                Just((batch_index_ack, hold, limit, sizes.clone())),
                Just(pairs).prop_shuffle(),
                prop::collection::vec(0..3u8, sizes.len()),
                prop::collection::vec(any::<u8>(), total),
                prop::collection::vec(step(aborts), 0..(2 * total).min(400)),
            )
                .prop_map(
                    move |((batch_index_ack, hold, limit, sizes), order, styles, picks, steps)| {
                        let messages = order
                            .into_iter()
                            .zip(picks)
                            .map(|((e, i), pick)| {
                                let txn_slot = Method::Txn(pick % SLOTS);
                                let method = match styles[e] {
                                    0 => Method::Ordinary,
                                    2 if mixed_ok && pick % 4 == 0 => Method::Ordinary,
                                    _ => txn_slot,
                                };
                                (e, i, method)
                            })
                            .collect();
                        Case {
                            batch_index_ack,
                            hold,
                            limit,
                            sizes,
                            messages,
                            steps,
                        }
                    },
                )
        })
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($msg)+)));
        }
    };
}

/// The client side of a run, and what it knows.
struct Run {
    case: Case,
    model: ConsumerModel,
    ordinary: AckTracker,
    txns: TxnAckTracker,
    slots: [Option<TxnId>; SLOTS as usize],
    next_txn: u64,
    queue: VecDeque<(usize, i32, Method)>,
    undispatched: VecDeque<usize>,
    dispatched: Vec<bool>,
    /// The messages of each open transaction.
    members: HashMap<TxnId, Vec<(usize, i32, Method)>>,
    /// Messages acknowledged ordinarily or in an open or committed transaction.
    acked: Vec<(usize, i32, Method)>,
    /// Per entry, the committed transactions that acknowledged some of it.
    committed_in: Vec<BTreeSet<TxnId>>,
    /// What happened, for failure messages.
    trace: Vec<String>,
}

impl Run {
    fn new(case: Case) -> Self {
        let mode = if case.hold {
            PartialBatches::HoldUntilComplete
        } else {
            PartialBatches::SendAckSet
        };
        let config = ModelConfig::new(case.limit).with_batch_index_ack(case.batch_index_ack);
        let entries = case.sizes.len();
        Self {
            model: ConsumerModel::new(config),
            ordinary: AckTracker::new(mode),
            txns: TxnAckTracker::default(),
            slots: [None; SLOTS as usize],
            next_txn: 1,
            queue: case.messages.iter().copied().collect(),
            undispatched: (0..entries).collect(),
            dispatched: vec![false; entries],
            members: HashMap::new(),
            acked: Vec::new(),
            committed_in: vec![BTreeSet::new(); entries],
            trace: Vec::new(),
            case,
        }
    }

    fn size(&self, e: usize) -> i32 {
        self.case.sizes[e]
    }

    /// Sends what the consumer may receive.
    fn dispatch(&mut self) -> Result<(), TestCaseError> {
        while let Some(e) = self.undispatched.front().copied() {
            match self.model.dispatch(entry(e as u64), self.size(e)) {
                Ok(Dispatch::Dispatched { counted, .. }) => {
                    ensure!(
                        counted == i64::from(self.size(e)),
                        "a fresh entry counts its size"
                    );
                    self.dispatched[e] = true;
                    self.undispatched.pop_front();
                }
                Ok(Dispatch::Blocked) => break,
                other => ensure!(false, "entry {e}: {other:?}"),
            }
        }
        Ok(())
    }

    fn slot_txn(&mut self, slot: u8) -> TxnId {
        *self.slots[slot as usize].get_or_insert_with(|| {
            self.next_txn += 1;
            txn(self.next_txn)
        })
    }

    fn send(&mut self, wire: &WireAck) -> Result<(), TestCaseError> {
        match self.model.ack(wire) {
            Ok(AckOutcome::Acked(_)) => Ok(()),
            other => Err(TestCaseError::fail(format!("{wire:?} -> {other:?}"))),
        }
    }

    /// Acknowledges the first queued message whose entry was dispatched; false if none.
    fn ack_next(&mut self) -> Result<bool, TestCaseError> {
        let Some(at_queue) = self.queue.iter().position(|(e, _, _)| self.dispatched[*e]) else {
            return Ok(false);
        };
        let Some(message) = self.queue.remove(at_queue) else {
            return Ok(false);
        };
        let (e, index, method) = message;
        let position = at(e as u64, index, self.size(e));
        match method {
            Method::Ordinary => {
                let ack = self.ordinary.ack(&position);
                ensure!(ack.is_ok(), "{ack:?}");
                if let Ok(Some(ack)) = ack {
                    self.send(&WireAck::from(&ack))?;
                }
            }
            Method::Txn(slot) => {
                let t = self.slot_txn(slot);
                let ack = self.txns.ack(t, AckKind::Individual, &position);
                let ack = ack.map_err(|e| TestCaseError::fail(format!("tracker refused: {e}")))?;
                self.send(&WireAck::from(&ack))?;
                self.members.entry(t).or_default().push(message);
            }
        }
        self.acked.push(message);
        Ok(true)
    }

    fn commit(&mut self, slot: u8) -> Result<(), TestCaseError> {
        let Some(t) = self.slots[slot as usize].take() else {
            return Ok(());
        };
        self.txns.commit(t);
        let committed = self.model.commit(t);
        ensure!(committed.is_ok(), "{committed:?}");
        for (e, _, _) in self.members.remove(&t).unwrap_or_default() {
            self.committed_in[e].insert(t);
        }
        Ok(())
    }

    fn abort(&mut self, slot: u8) -> Result<(), TestCaseError> {
        let Some(t) = self.slots[slot as usize].take() else {
            return Ok(());
        };
        self.txns.abort(t);
        let aborted = self
            .model
            .abort(t)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let members = self.members.remove(&t).unwrap_or_default();
        let entries: BTreeSet<usize> = members.iter().map(|(e, _, _)| *e).collect();
        let expected: Vec<_> = entries.iter().map(|e| entry(*e as u64)).collect();
        ensure!(aborted.redeliver == expected, "{aborted:?} for {members:?}");
        // The subscription redelivers them: the dispatcher sends them again.
        for e in entries {
            let before = self.model.entry(&entry(e as u64)).map(|v| format!("{v:?}"));
            let dispatched = self.model.dispatch(entry(e as u64), self.size(e));
            self.trace.push(format!(
                "abort {t} ({} msgs) -> redispatch {e}: {dispatched:?}; before {before:?}; unacked {}",
                members.len(),
                self.model.unacked()
            ));
            match dispatched {
                Ok(Dispatch::Dispatched { .. } | Dispatch::Skipped(_)) => {}
                other => ensure!(false, "redelivering {e}: {other:?}"),
            }
        }
        self.acked.retain(|m| !members.contains(m));
        self.queue.extend(members);
        Ok(())
    }

    fn cumulative(&mut self, pick: u16, index: u16, in_txn: bool) -> Result<(), TestCaseError> {
        let e = pick as usize % self.case.sizes.len();
        let index = (index as i32) % self.size(e);
        let ack = txn_ack(
            txn(u64::MAX),
            AckKind::Cumulative,
            &at(e as u64, index, self.size(e)),
        )
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut wire = WireAck::from(&ack);
        if !in_txn {
            wire.txn = None;
        }
        let before = snapshot(&self.model);
        let outcome = self.model.ack(&wire);
        ensure!(matches!(outcome, Ok(AckOutcome::Ignored(_))), "{outcome:?}");
        ensure!(
            snapshot(&self.model) == before,
            "a cumulative ack changed something"
        );
        Ok(())
    }

    fn duplicate(&mut self, pick: u16) -> Result<(), TestCaseError> {
        if self.acked.is_empty() {
            return Ok(());
        }
        let (e, index, method) = self.acked[pick as usize % self.acked.len()];
        let position = at(e as u64, index, self.size(e));
        match method {
            Method::Ordinary => {
                let again = self.ordinary.ack(&position);
                ensure!(matches!(again, Ok(None)), "ordinary duplicate: {again:?}");
            }
            Method::Txn(slot) => {
                let t = self.slots[slot as usize].unwrap_or(txn(u64::MAX - 1));
                let again = self.txns.ack(t, AckKind::Individual, &position);
                ensure!(again.is_err(), "transactional duplicate sent: {again:?}");
            }
        }
        Ok(())
    }

    fn check_step(&self) -> Result<(), TestCaseError> {
        ensure!(
            self.model.unacked() >= 0,
            "negative: {}",
            self.model.unacked()
        );
        ensure!(shares_add_up(&self.model), "shares do not add up");
        ensure!(self.model.counters().conflicts == 0, "a conflict");
        Ok(())
    }

    fn run(mut self) -> Result<(), TestCaseError> {
        self.dispatch()?;
        let steps = std::mem::take(&mut self.case.steps);
        for step in steps {
            match step {
                Step::Ack => {
                    self.ack_next()?;
                }
                Step::Commit(slot) => self.commit(slot)?,
                Step::Abort(slot) => self.abort(slot)?,
                Step::Cumulative {
                    pick,
                    index,
                    in_txn,
                } => self.cumulative(pick, index, in_txn)?,
                Step::Duplicate(pick) => self.duplicate(pick)?,
            }
            self.dispatch()?;
            self.check_step()?;
        }
        // Everything acknowledged, then everything committed.
        while !self.queue.is_empty() {
            self.dispatch()?;
            ensure!(
                self.ack_next()?,
                "stalled: blocked={}",
                self.model.is_blocked()
            );
            self.check_step()?;
        }
        for slot in 0..SLOTS {
            self.commit(slot)?;
        }
        self.check_end()
    }

    fn check_end(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        ensure!(
            self.undispatched.is_empty(),
            "not everything was dispatched"
        );
        ensure!(model.pending_acks().count() == 0, "left in pendingAcks");
        ensure!(model.open_transactions().count() == 0, "open transactions");
        let recounted = model.counters().recounted_on_redispatch;
        ensure!(
            model.unacked() == recounted,
            "unacked {} but recounted {recounted}\n{}\n{:?}",
            model.unacked(),
            self.trace.join("\n"),
            model
                .entries()
                .map(|v| (v.entry, v.counted, v.in_pending_acks))
                .collect::<Vec<_>>()
        );
        ensure!(model.leaked_unacked() == model.unacked(), "leak elsewhere");
        if model.counters().aborts == 0 {
            ensure!(
                model.unacked() == 0,
                "unacked {} without aborts",
                model.unacked()
            );
        }
        for (e, committed) in self.committed_in.iter().enumerate() {
            let view = model.entry(&entry(e as u64)).expect("dispatched");
            let all_ordinary = self
                .case
                .messages
                .iter()
                .filter(|(m, _, _)| *m == e)
                .all(|(_, _, method)| *method == Method::Ordinary);
            let expected = self.case.batch_index_ack || all_ordinary || committed.len() == 1;
            ensure!(
                view.cursor.is_deleted() == expected,
                "entry {e}: {view:?}, committed in {committed:?}"
            );
        }
        Ok(())
    }
}

proptest! {
    /// Without aborts the count returns to exactly 0, also with a limit and lazy dispatch.
    #[test]
    fn correct_clients_return_to_zero(case in case(false)) {
        Run::new(case).run()?;
    }

    /// With aborts the count returns to exactly what the abort redeliveries recounted.
    #[test]
    fn correct_clients_with_aborts_leave_only_the_redelivery_recount(case in case(true)) {
        Run::new(case).run()?;
    }
}
