//! A differential conformance harness: one seeded script of consumer actions runs against a
//! target (the real broker through its admin stats, or the embedded
//! [`Emulator`]) and, in step, against
//! `txn_ack::model::SubscriptionModel` fed with exactly what the clients sent and what
//! arrived where. After every step the target's state (per consumer `unackedMessages` and
//! `blockedConsumerOnUnackedMsgs`, the subscription's `msgBacklog` in entries) must equal the
//! model's.
//!
//! - [`Script::generate`] builds a script from a seed with a small deterministic generator of
//!   its own ([`SplitMix64`]); the seed also picks the script's [`Class`].
//! - [`run_script`] executes it: every ack is a raw `CommandAck` with a request id (so the
//!   harness knows exactly what went out and waits for the broker's answer), transactions
//!   come from the client's coordinator, and every MESSAGE that arrives is fed to the model
//!   as one dispatch of its entry, with the indexes it carried checked against the ack set the
//!   model predicts.
//! - Because the real broker is asynchronous, after each step the harness drains the
//!   consumers and polls the target until its state equals the model's, the dispatches the
//!   model expects (produced entries, replays after an abort or a redelivery request) have
//!   arrived, and the target's own dispatch counter matches what arrived; or until the target
//!   stops changing (bounded). A difference is a [`ConformanceError`] naming the seed, the step
//!   and both states.
//!
//! Consumers are built with `ConsumerOptions::legacy_committed_redeliveries(true)` so that
//! every delivery is handed over and the client never sends a redelivery request by itself.
//!
//! # A broker race the scripts avoid
//! A 4.0.8 broker can send an entry again *after* an ordinary whole-entry ack of it: when a
//! replay of the entry is queued (after an abort or a redelivery request) while its consumer
//! is blocked, the ack's removal from `pendingAcks` unblocks the consumer and starts the
//! dispatcher's replay read before `cursor.asyncDelete` runs, and the entry arrives with every
//! index (its pending-ack state cleared, redelivery count 0) although the cursor deleted it.
//! Whether it is read before or after the delete is a race inside the broker, so a script
//! never sends a whole-entry ack of an entry waiting for a replay while a consumer is blocked
//! (the step is noted and skipped).
//!
//! # Several consumers
//! Scripts of [`Class::TwoConsumers`], [`Class::SharedTxn`] and [`Class::ThreeConsumers`] run
//! two or three Shared consumers of one subscription. Which consumer the broker sends an entry
//! or a replay to depends on timing on a real broker (its round robin, when reads happen), so
//! the harness does not predict it: every MESSAGE is fed to the model as a dispatch to the
//! consumer it arrived at, and the model says what that does to each consumer's count. What is
//! compared is then determined: each consumer's unacked count and blocked flag, the
//! subscription's backlog, that every entry the model expects to be sent (new, or replayed
//! after an abort, a redelivery request or a consumer closing) arrives at *some* consumer, and
//! that the indexes each delivery carries are the model's. Acks and requests change the
//! counts the model says (an ack the owner's, `getAckOwnerConsumerAndBatchSize`; a request
//! only the sender's `pendingAcks`).
//!
//! Not determined, so avoided (the step is noted and skipped):
//! - an ack of an entry the cursor already deleted while a consumer still holds it in
//!   `pendingAcks` (after an abort's replay went to another consumer and one of them
//!   acknowledged it), once it is at or below the mark-delete position: each read of the
//!   broker's dispatcher drops it from `pendingAcks` without a decrement, so whether the ack
//!   still finds an owner depends on whether a read happened in between;
//! - a REDELIVER_UNACKNOWLEDGED_MESSAGES with ids that would replay nothing: the broker then
//!   reads only if permits came while the consumer was blocked, which depends on when the
//!   client sent its FLOW (the emulator's rule tests cover it with raw frames). A request with
//!   ids always names an entry of the sender's own `pendingAcks` that the cursor has not
//!   deleted, and may name one of another consumer's too (passed over).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use pulsar_wire::pb;
use pulsar_wire::wire::{ConnectionExt, ConsumerExt, command_frame};
use pulsar_wire::{
    BatchingOptions, Client, Consumer, InitialPosition, Message, OutgoingMessage, Producer,
    ProducerOptions, SubType, Transaction,
};
use pulsar_wire_emulator::Emulator;
use txn_ack::model::{
    AckOutcome, ConflictEffects, ConsumerId, Dispatch, ModelConfig, SubscriptionModel, WireAck,
};
use txn_ack::{AckKind, EntryId, TxnId};

use broker_tools::pulsar_admin::PulsarAdmin;

/// The subscription every script uses.
pub const SUBSCRIPTION: &str = "conformance";
/// Transaction slots a script uses (`txn j` is `j % TXN_SLOTS`).
pub const TXN_SLOTS: usize = 3;
/// How long the harness waits for the target to reach the model's state after a step.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(3);
/// How long the target must stay unchanged (nothing arriving) before a difference is final.
const STABLE_FOR: Duration = Duration::from_millis(700);
/// How long a transaction may stay open.
const TXN_TIMEOUT: Duration = Duration::from_secs(300);

/// SplitMix64 (Steele, Lea and Flood's generator): tiny, fast and deterministic, enough to
/// derive scripts from seeds.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n.max(1))) >> 32) as u32
    }

    /// `true` with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent
    }
}

/// The kind of script a seed makes (`seed % 5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// One consumer, every kind of step.
    Mixed,
    /// The steady transactional shape: one consumer, mostly transactional acks of indexes of
    /// one batch in several transactions, aborts that make the broker replay entries with
    /// indexes still held or acknowledged in another transaction, duplicate transactional acks
    /// of replayed indexes (conflicts that still decrement), commits.
    Steady,
    /// A second consumer joins the subscription; ordinary acks (whole entry, batch index,
    /// cumulative) through either consumer, redelivery requests with and without ids.
    TwoConsumers,
    /// The steady transactional shape with two consumers from the start: aborts replay
    /// entries to either consumer, so both may hold an entry; transactional acks through
    /// either consumer.
    SharedTxn,
    /// Three consumers joining one after the other, every kind of step, and one of them
    /// closing with messages unacknowledged (they go to the others).
    ThreeConsumers,
}

impl Class {
    /// The class of `seed`.
    pub fn of(seed: u64) -> Self {
        match seed % 5 {
            0 => Self::Mixed,
            1 => Self::Steady,
            2 => Self::TwoConsumers,
            3 => Self::SharedTxn,
            _ => Self::ThreeConsumers,
        }
    }

    /// How many consumers its scripts connect at most.
    pub fn consumers(self) -> usize {
        match self {
            Self::Mixed | Self::Steady => 1,
            Self::TwoConsumers | Self::SharedTxn => 2,
            Self::ThreeConsumers => 3,
        }
    }
}

/// Which delivered message a step acts on: `pick` modulo the candidates of consumer
/// `consumer % consumers`; with `fresh`, only messages no step acknowledged yet are candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// The consumer (modulo the consumers connected).
    pub consumer: u8,
    /// The message (modulo the candidates).
    pub pick: u32,
    /// Only messages not acknowledged by an earlier step.
    pub fresh: bool,
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "c{} #{}{}",
            self.consumer,
            self.pick,
            if self.fresh { " (fresh)" } else { "" }
        )
    }
}

/// One step of a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Produce `batches` batches of `size` messages each (one entry per batch).
    Produce {
        /// Entries.
        batches: u8,
        /// Messages per entry, 1..=7.
        size: u8,
    },
    /// Hand what arrived at consumer `consumer` to the application (it becomes ackable).
    Receive {
        /// The consumer (modulo the consumers connected).
        consumer: u8,
    },
    /// An ordinary individual ack of the message's whole entry (no ack set).
    Ack(Pick),
    /// An ordinary batch-index ack: the ack set clears only the message's index.
    AckIndex(Pick),
    /// A cumulative ack of the message's entry (the broker ignores it on Shared).
    AckCumulative(Pick),
    /// A transactional ack of the message in transaction slot `txn` (an independent set with
    /// the batch size, as `txn_ack::txn_ack` builds it), sent even when the message was
    /// acknowledged before.
    TxnAck {
        /// The message.
        pick: Pick,
        /// The transaction slot.
        txn: u8,
    },
    /// Commit the `txn`-th open transaction (modulo those open; nothing if none is).
    Commit {
        /// The slot.
        txn: u8,
    },
    /// Abort the `txn`-th open transaction (modulo those open; nothing if none is).
    Abort {
        /// The slot.
        txn: u8,
    },
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES without ids from consumer `consumer`.
    RedeliverAll {
        /// The consumer (modulo the consumers connected).
        consumer: u8,
    },
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES with ids from the consumer of the picked message:
    /// its entry (which must be in that consumer's `pendingAcks` and not deleted), and with
    /// `other` also an entry another consumer holds (the broker passes it over).
    RedeliverIds {
        /// The message whose entry is named.
        pick: Pick,
        /// Name another consumer's entry too.
        other: bool,
    },
    /// Another consumer subscribes (up to the class's number).
    AddConsumer,
    /// Consumer `consumer` closes (when more than one is connected): what it holds goes to
    /// the others.
    Close {
        /// The consumer (modulo the consumers connected).
        consumer: u8,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Produce { batches, size } => write!(f, "produce {batches} batches of {size}"),
            Self::Receive { consumer } => write!(f, "receive on c{consumer}"),
            Self::Ack(pick) => write!(f, "ack whole entry of {pick}"),
            Self::AckIndex(pick) => write!(f, "batch-index ack of {pick}"),
            Self::AckCumulative(pick) => write!(f, "cumulative ack of {pick}"),
            Self::TxnAck { pick, txn } => write!(f, "txn ack of {pick} in txn {txn}"),
            Self::Commit { txn } => write!(f, "commit txn {txn}"),
            Self::Abort { txn } => write!(f, "abort txn {txn}"),
            Self::RedeliverAll { consumer } => write!(f, "redeliver all on c{consumer}"),
            Self::RedeliverIds { pick, other } => write!(
                f,
                "redeliver the entry of {pick}{}",
                if *other {
                    " and another consumer's"
                } else {
                    ""
                }
            ),
            Self::AddConsumer => f.write_str("add a consumer"),
            Self::Close { consumer } => write!(f, "close c{consumer}"),
        }
    }
}

/// A generated script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The seed it came from.
    pub seed: u64,
    /// Its class.
    pub class: Class,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Script {
    /// The script of `seed`, `len` steps long (the first always produces).
    pub fn generate(seed: u64, len: usize) -> Self {
        let class = Class::of(seed);
        let mut rng = SplitMix64::new(seed ^ 0x5EED_C0DE);
        let mut steps = Vec::with_capacity(len);
        let size = |rng: &mut SplitMix64| 1 + rng.below(7) as u8;
        let first_size = match class {
            // The steady shape wants batches big enough to spread over transactions.
            Class::Steady => 3 + rng.below(5) as u8,
            _ => size(&mut rng),
        };
        steps.push(Step::Produce {
            batches: 1 + rng.below(3) as u8,
            size: first_size,
        });
        let add_at = 2 + rng.below(6) as usize;
        // Drawn only for three consumers, so that the other classes' scripts stay what they
        // were for the same seed.
        let (add_again_at, close_at) = if class == Class::ThreeConsumers {
            (
                add_at + 4 + rng.below(10) as usize,
                len / 2 + rng.below((len / 3).max(1) as u32) as usize,
            )
        } else {
            (usize::MAX, usize::MAX)
        };
        let consumers = class.consumers() as u32;
        while steps.len() < len {
            let pick = |rng: &mut SplitMix64, fresh: u32| Pick {
                consumer: rng.below(consumers.max(2)) as u8,
                pick: rng.below(1 << 16),
                fresh: rng.chance(fresh),
            };
            let txn = rng.below(TXN_SLOTS as u32) as u8;
            let roll = rng.below(100);
            let anyone = |rng: &mut SplitMix64| rng.below(consumers) as u8;
            let step = match class {
                Class::Mixed => match roll {
                    0..=9 => Step::Produce {
                        batches: 1 + rng.below(3) as u8,
                        size: size(&mut rng),
                    },
                    10..=24 => Step::Receive { consumer: 0 },
                    25..=34 => Step::Ack(pick(&mut rng, 80)),
                    35..=47 => Step::AckIndex(pick(&mut rng, 75)),
                    48..=50 => Step::AckCumulative(pick(&mut rng, 50)),
                    51..=74 => Step::TxnAck {
                        pick: pick(&mut rng, 75),
                        txn,
                    },
                    75..=83 => Step::Commit { txn },
                    84..=94 => Step::Abort { txn },
                    _ => Step::RedeliverAll { consumer: 0 },
                },
                Class::Steady => match roll {
                    0..=6 => Step::Produce {
                        batches: 1 + rng.below(2) as u8,
                        size: 3 + rng.below(5) as u8,
                    },
                    7..=19 => Step::Receive { consumer: 0 },
                    20..=59 => Step::TxnAck {
                        pick: pick(&mut rng, 70),
                        txn,
                    },
                    60..=69 => Step::Commit { txn },
                    70..=84 => Step::Abort { txn },
                    85..=89 => Step::AckIndex(pick(&mut rng, 70)),
                    90..=93 => Step::Ack(pick(&mut rng, 70)),
                    _ => Step::RedeliverAll { consumer: 0 },
                },
                Class::TwoConsumers if steps.len() == add_at => Step::AddConsumer,
                Class::TwoConsumers => match roll {
                    0..=17 => Step::Produce {
                        batches: 1 + rng.below(3) as u8,
                        size: size(&mut rng),
                    },
                    18..=39 => Step::Receive {
                        consumer: anyone(&mut rng),
                    },
                    40..=64 => Step::Ack(pick(&mut rng, 85)),
                    65..=74 => Step::AckIndex(pick(&mut rng, 75)),
                    75..=79 => Step::AckCumulative(pick(&mut rng, 50)),
                    80..=89 => Step::RedeliverIds {
                        pick: pick(&mut rng, 90),
                        other: rng.chance(50),
                    },
                    _ => Step::RedeliverAll {
                        consumer: anyone(&mut rng),
                    },
                },
                Class::SharedTxn if steps.len() == 1 => Step::AddConsumer,
                Class::SharedTxn => match roll {
                    0..=7 => Step::Produce {
                        batches: 1 + rng.below(2) as u8,
                        size: 3 + rng.below(5) as u8,
                    },
                    8..=23 => Step::Receive {
                        consumer: anyone(&mut rng),
                    },
                    24..=59 => Step::TxnAck {
                        pick: pick(&mut rng, 70),
                        txn,
                    },
                    60..=68 => Step::Commit { txn },
                    69..=81 => Step::Abort { txn },
                    82..=86 => Step::AckIndex(pick(&mut rng, 70)),
                    87..=91 => Step::Ack(pick(&mut rng, 70)),
                    92..=95 => Step::RedeliverIds {
                        pick: pick(&mut rng, 80),
                        other: rng.chance(50),
                    },
                    _ => Step::RedeliverAll {
                        consumer: anyone(&mut rng),
                    },
                },
                Class::ThreeConsumers if steps.len() == add_at || steps.len() == add_again_at => {
                    Step::AddConsumer
                }
                Class::ThreeConsumers if steps.len() == close_at => Step::Close {
                    consumer: anyone(&mut rng),
                },
                Class::ThreeConsumers => match roll {
                    0..=11 => Step::Produce {
                        batches: 1 + rng.below(3) as u8,
                        size: size(&mut rng),
                    },
                    12..=29 => Step::Receive {
                        consumer: anyone(&mut rng),
                    },
                    30..=41 => Step::Ack(pick(&mut rng, 80)),
                    42..=49 => Step::AckIndex(pick(&mut rng, 75)),
                    50..=69 => Step::TxnAck {
                        pick: pick(&mut rng, 75),
                        txn,
                    },
                    70..=76 => Step::Commit { txn },
                    77..=85 => Step::Abort { txn },
                    86..=91 => Step::RedeliverIds {
                        pick: pick(&mut rng, 80),
                        other: rng.chance(50),
                    },
                    _ => Step::RedeliverAll {
                        consumer: anyone(&mut rng),
                    },
                },
            };
            steps.push(step);
        }
        Self { seed, class, steps }
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} ({:?}):", self.seed, self.class)?;
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "  {i:>3}: {step}")?;
        }
        Ok(())
    }
}

/// One consumer's state as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerState {
    /// `unackedMessages`.
    pub unacked: i64,
    /// `blockedConsumerOnUnackedMsgs`.
    pub blocked: bool,
}

/// The compared state: per consumer (by name) and the subscription's backlog in entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// The consumers, by name.
    pub consumers: BTreeMap<String, ConsumerState>,
    /// `msgBacklog`: entries not yet wholly acknowledged.
    pub backlog_entries: i64,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, c) in &self.consumers {
            write!(f, "{name}: unacked {} blocked {}; ", c.unacked, c.blocked)?;
        }
        write!(f, "backlog {} entries", self.backlog_entries)
    }
}

/// What a target reports beyond [`State`]: how much it dispatched to each consumer, to tell
/// whether everything it sent has arrived.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Snapshot {
    state: State,
    /// Per consumer: entries (emulator) or messages counted as `msgOutCounter` (broker).
    out: BTreeMap<String, u64>,
}

/// Where a script runs.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A real broker, read through its admin API.
    Real(&'a PulsarAdmin),
    /// The embedded emulator.
    Emulator(&'a Emulator),
}

impl Target<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::Real(_) => "broker",
            Self::Emulator(_) => "emulator",
        }
    }

    /// Creates `topic` with `maxUnackedMessagesOnConsumer = limit`.
    async fn prepare(&self, topic: &str, limit: u32) -> Result<(), String> {
        match self {
            Self::Real(admin) => {
                admin.create_topic(topic).await.map_err(|e| e.0)?;
                admin
                    .set_max_unacked_on_consumer(topic, limit, Duration::from_secs(60))
                    .await
                    .map_err(|e| e.0)
            }
            Self::Emulator(emulator) => {
                emulator.create_topic(topic, 0).map_err(|e| e.to_string())?;
                emulator
                    .set_max_unacked_messages(topic, limit)
                    .map_err(|e| e.to_string())
            }
        }
    }

    async fn snapshot(&self, topic: &str) -> Result<Snapshot, String> {
        let mut snapshot = Snapshot::default();
        match self {
            Self::Real(admin) => {
                let stats = admin.topic_stats(topic).await.map_err(|e| e.0)?;
                let Some(sub) = stats.subscriptions.get(SUBSCRIPTION) else {
                    return Ok(snapshot);
                };
                snapshot.state.backlog_entries = sub.msg_backlog;
                for c in &sub.consumers {
                    snapshot.state.consumers.insert(
                        c.consumer_name.clone(),
                        ConsumerState {
                            unacked: c.unacked_messages,
                            blocked: c.blocked_consumer_on_unacked_msgs,
                        },
                    );
                    snapshot
                        .out
                        .insert(c.consumer_name.clone(), c.msg_out_counter.max(0) as u64);
                }
            }
            Self::Emulator(emulator) => {
                let stats = emulator.stats();
                let Some(sub) = stats.subscription(topic, SUBSCRIPTION) else {
                    return Ok(snapshot);
                };
                snapshot.state.backlog_entries = sub.backlog_entries as i64;
                for c in &sub.consumers {
                    snapshot.state.consumers.insert(
                        c.name.clone(),
                        ConsumerState {
                            unacked: c.unacked,
                            blocked: c.blocked,
                        },
                    );
                    snapshot.out.insert(c.name.clone(), c.dispatched_entries);
                }
            }
        }
        Ok(snapshot)
    }
}

/// A difference between the target and the model, or a step the harness could not run.
#[derive(Debug, Clone)]
pub struct ConformanceError {
    /// The script's seed.
    pub seed: u64,
    /// `broker` or `emulator`.
    pub target: &'static str,
    /// The step's number (0-based; `None` before the first step).
    pub step: Option<usize>,
    /// The step's text.
    pub step_text: String,
    /// What went wrong.
    pub what: String,
    /// The model's state.
    pub model: State,
    /// The target's state (last read).
    pub observed: State,
    /// The steps and events so far (the last ones).
    pub log: Vec<String>,
}

impl fmt::Display for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            Some(step) => write!(
                f,
                "seed {} on the {}: step {step} ({}): {}",
                self.seed, self.target, self.step_text, self.what
            )?,
            None => write!(
                f,
                "seed {} on the {}: {}",
                self.seed, self.target, self.what
            )?,
        }
        writeln!(f)?;
        writeln!(f, "  model:  {}", self.model)?;
        writeln!(f, "  target: {}", self.observed)?;
        writeln!(f, "  log (last {}):", self.log.len())?;
        for line in &self.log {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConformanceError {}

/// What a script did, when it passed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Steps run.
    pub steps: usize,
    /// MESSAGE frames that arrived (entries dispatched).
    pub dispatches: u64,
    /// Of those, entries dispatched while still in the consumer's `pendingAcks`.
    pub redispatches: u64,
    /// Acks sent (ordinary, cumulative and transactional).
    pub acks: u64,
    /// Transactional acks the broker answered with `TransactionConflict`.
    pub conflicts: u64,
    /// Commits and aborts.
    pub commits: u64,
    /// Aborts.
    pub aborts: u64,
    /// Times a consumer became blocked (as the model saw it).
    pub blocks: u64,
    /// The steps and the events between them.
    pub log: Vec<String>,
}

/// One message handed to the application.
#[derive(Debug)]
struct Held {
    message: Message,
    acked: bool,
}

/// A frame being assembled from the messages that arrived.
#[derive(Debug, Clone)]
struct Frame {
    entry: EntryId,
    batch_size: u32,
    redelivery_count: u32,
    indexes: Vec<u32>,
}

#[derive(Debug)]
struct Slot {
    name: String,
    /// The consumer's id in the model.
    id: ConsumerId,
    consumer: Consumer,
    /// Arrived, not yet handed to the application.
    arrived: Vec<Message>,
    held: Vec<Held>,
    out_entries: u64,
    out_messages: u64,
}

struct Run<'a> {
    target: Target<'a>,
    client: &'a Client,
    topic: String,
    seed: u64,
    config: ModelConfig,
    /// The broker's side of the subscription: the cursor, the pending acks, and each
    /// connected consumer's count and `pendingAcks`.
    model: SubscriptionModel,
    /// The consumers connected, in subscription order.
    slots: Vec<Slot>,
    /// Consumers subscribed so far (names and ids are `c0`, `c1`, ... in that order).
    subscribed: u64,
    /// The most consumers the script connects.
    max_consumers: usize,
    producers: BTreeMap<u8, Producer>,
    txns: Vec<Option<Transaction>>,
    produced: BTreeSet<EntryId>,
    /// Entries the dispatcher should send: produced and not sent yet, or replayed.
    to_dispatch: BTreeSet<EntryId>,
    log: Vec<String>,
    report: Report,
    step: Option<usize>,
    step_text: String,
    last_observed: State,
}

/// Runs `script` on `topic` (created here, with `maxUnackedMessagesOnConsumer = limit`)
/// against `target` and the model, comparing after every step.
///
/// # Errors
/// The first difference, or a step that could not be run, as a [`ConformanceError`].
pub async fn run_script(
    target: Target<'_>,
    client: &Client,
    topic: &str,
    limit: u32,
    script: &Script,
) -> Result<Report, Box<ConformanceError>> {
    let config = ModelConfig::new(limit)
        .with_batch_index_ack(true)
        .with_conflict_effects(ConflictEffects::AsBroker);
    let mut run = Run {
        target,
        client,
        topic: topic.to_owned(),
        seed: script.seed,
        config,
        model: SubscriptionModel::new(config),
        slots: Vec::new(),
        subscribed: 0,
        max_consumers: script.class.consumers(),
        producers: BTreeMap::new(),
        txns: (0..TXN_SLOTS).map(|_| None).collect(),
        produced: BTreeSet::new(),
        to_dispatch: BTreeSet::new(),
        log: Vec::new(),
        report: Report::default(),
        step: None,
        step_text: String::new(),
        last_observed: State::default(),
    };
    let result = run.run(script).await;
    run.close().await;
    result.map(|()| run.report.clone())
}

impl Run<'_> {
    fn fail(&self, what: impl Into<String>) -> Box<ConformanceError> {
        let keep = 40;
        let log = self.log[self.log.len().saturating_sub(keep)..].to_vec();
        Box::new(ConformanceError {
            seed: self.seed,
            target: self.target.name(),
            step: self.step,
            step_text: self.step_text.clone(),
            what: what.into(),
            model: self.model_state(),
            observed: self.last_observed.clone(),
            log,
        })
    }

    fn note(&mut self, line: impl Into<String>) {
        self.log.push(line.into());
    }

    async fn run(&mut self, script: &Script) -> Result<(), Box<ConformanceError>> {
        self.target
            .prepare(&self.topic, self.config.max_unacked_messages)
            .await
            .map_err(|e| self.fail(format!("preparing the topic: {e}")))?;
        self.add_consumer().await?;
        self.settle().await?;
        for (i, step) in script.steps.iter().enumerate() {
            self.step = Some(i);
            self.step_text = step.to_string();
            self.note(format!("step {i}: {step}"));
            self.apply(*step).await?;
            self.settle().await?;
            self.report.steps += 1;
        }
        self.report.blocks = self.model.counters().blocked;
        self.report.log = self.log.clone();
        Ok(())
    }

    async fn close(&mut self) {
        for txn in self.txns.iter_mut() {
            if let Some(txn) = txn.take() {
                let _ = txn.abort().await;
            }
        }
        for slot in &self.slots {
            let _ = slot
                .consumer
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await;
        }
        for producer in self.producers.values() {
            let _ = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
        }
    }

    async fn add_consumer(&mut self) -> Result<(), Box<ConformanceError>> {
        let id = ConsumerId(self.subscribed);
        let name = format!("c{}", self.subscribed);
        let options = crate::real_pulsar::consumer_options()
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest)
            .name(name.clone())
            .receiver_queue_size(1000)
            .legacy_committed_redeliveries(true);
        let consumer = Consumer::builder(self.client, &self.topic, SUBSCRIPTION)
            .options(options)
            .build()
            .await
            .map_err(|e| self.fail(format!("subscribing {name}: {e}")))?;
        self.subscribed += 1;
        self.model.add_consumer(id);
        self.slots.push(Slot {
            name,
            id,
            consumer,
            arrived: Vec::new(),
            held: Vec::new(),
            out_entries: 0,
            out_messages: 0,
        });
        Ok(())
    }

    async fn producer(&mut self, size: u8) -> Result<&Producer, Box<ConformanceError>> {
        if !self.producers.contains_key(&size) {
            let options = ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(usize::from(size))
                    .max_delay(Duration::from_secs(5)),
            );
            let producer = Producer::builder(self.client, &self.topic)
                .options(options)
                .build()
                .await
                .map_err(|e| self.fail(format!("creating a producer: {e}")))?;
            self.producers.insert(size, producer);
        }
        Ok(&self.producers[&size])
    }

    fn slot_of(&self, consumer: u8) -> usize {
        usize::from(consumer) % self.slots.len()
    }

    /// The held message a pick names: (slot, index into `held`).
    fn resolve(&self, pick: Pick) -> Option<(usize, usize)> {
        let slot = self.slot_of(pick.consumer);
        let candidates: Vec<usize> = self.slots[slot]
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| !pick.fresh || !h.acked)
            .map(|(i, _)| i)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        Some((slot, candidates[pick.pick as usize % candidates.len()]))
    }

    async fn apply(&mut self, step: Step) -> Result<(), Box<ConformanceError>> {
        match step {
            Step::Produce { batches, size } => self.produce(batches, size).await,
            Step::Receive { consumer } => {
                let at = self.slot_of(consumer);
                let slot = &mut self.slots[at];
                let arrived = std::mem::take(&mut slot.arrived);
                let count = arrived.len();
                slot.held.extend(arrived.into_iter().map(|message| Held {
                    message,
                    acked: false,
                }));
                self.note(format!("  {count} messages handed over"));
                Ok(())
            }
            Step::Ack(pick) | Step::AckIndex(pick) | Step::AckCumulative(pick) => {
                let Some((slot, index)) = self.resolve(pick) else {
                    self.note("  nothing to ack");
                    return Ok(());
                };
                let position = *self.slots[slot].held[index].message.position();
                let entry = position.entry();
                if matches!(step, Step::Ack(_))
                    && self.to_dispatch.contains(&entry)
                    && self.model.consumers().any(|c| c.blocked)
                {
                    // A broker race (see the module docs): the ack would unblock the consumer
                    // before the cursor deletes the entry, and the replay it then reads may be
                    // sent with every index although the entry is acknowledged.
                    self.note(format!(
                        "  not sent: {entry} waits for a replay to a blocked consumer"
                    ));
                    return Ok(());
                }
                let wire = match step {
                    Step::Ack(_) => WireAck::individual(entry),
                    Step::AckCumulative(_) => WireAck::cumulative(entry),
                    _ => {
                        // An independent set clearing only this index (`txn_ack` builds
                        // exactly that; the transaction and the batch size are dropped).
                        let id = txn_ack::txn_ack(
                            TxnId {
                                most_bits: 0,
                                least_bits: 0,
                            },
                            AckKind::Individual,
                            &position,
                        )
                        .map_err(|e| self.fail(e.to_string()))?
                        .id;
                        let mut wire = WireAck::from_id(AckKind::Individual, &id);
                        wire.batch_size = None;
                        wire
                    }
                };
                self.ack(slot, index, wire, None).await
            }
            Step::TxnAck { pick, txn } => {
                let Some((slot, index)) = self.resolve(pick) else {
                    self.note("  nothing to ack");
                    return Ok(());
                };
                let txn = self.txn(txn).await?;
                let position = *self.slots[slot].held[index].message.position();
                let ack = txn_ack::txn_ack(txn.id(), AckKind::Individual, &position)
                    .map_err(|e| self.fail(e.to_string()))?;
                let wire = WireAck::from(&ack);
                self.ack(slot, index, wire, Some(txn)).await
            }
            Step::Commit { txn } | Step::Abort { txn } => {
                let commit = matches!(step, Step::Commit { .. });
                // The `txn`-th open transaction (modulo those open), so that ends land.
                let open: Vec<usize> = (0..TXN_SLOTS).filter(|s| self.txns[*s].is_some()).collect();
                let Some(transaction) = (!open.is_empty())
                    .then(|| self.txns[open[usize::from(txn) % open.len()]].take())
                    .flatten()
                else {
                    self.note("  no transaction open");
                    return Ok(());
                };
                let id = transaction.id();
                let answer = if commit {
                    transaction.commit().await
                } else {
                    transaction.abort().await
                };
                answer.map_err(|e| self.fail(format!("ending {id}: {e}")))?;
                self.report.commits += u64::from(commit);
                self.report.aborts += u64::from(!commit);
                if commit {
                    if let Ok(committed) = self.model.commit(id) {
                        let line = format!(
                            "  committed {id}: entries {:?}, deleted {:?}",
                            ids(&committed.entries),
                            ids(&committed.deleted)
                        );
                        self.note(line);
                    }
                } else if let Ok(aborted) = self.model.abort(id) {
                    let line = format!("  aborted {id}: replays {:?}", ids(&aborted.redeliver));
                    self.note(line);
                    self.to_dispatch.extend(aborted.redeliver);
                }
                Ok(())
            }
            Step::RedeliverAll { consumer } => {
                let slot = self.slot_of(consumer);
                self.slots[slot]
                    .consumer
                    .redeliver_unacknowledged()
                    .map_err(|e| self.fail(format!("redelivery request: {e}")))?;
                let redelivered = self
                    .model
                    .redeliver_all(self.slots[slot].id)
                    .map_err(|e| self.fail(e.to_string()))?;
                let line = format!(
                    "  {}: redeliver all: {:?}",
                    self.slots[slot].name,
                    ids(&redelivered.entries)
                );
                self.note(line);
                self.to_dispatch.extend(redelivered.entries);
                Ok(())
            }
            Step::RedeliverIds { pick, other } => self.redeliver_ids(pick, other).await,
            Step::AddConsumer => {
                if self.slots.len() < self.max_consumers {
                    self.add_consumer().await?;
                }
                Ok(())
            }
            Step::Close { consumer } => {
                if self.slots.len() < 2 {
                    self.note("  the only consumer stays");
                    return Ok(());
                }
                let at = self.slot_of(consumer);
                let slot = self.slots.remove(at);
                slot.consumer
                    .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                    .await
                    .map_err(|e| self.fail(format!("closing {}: {e}", slot.name)))?;
                let removed = self
                    .model
                    .remove_consumer(slot.id)
                    .ok_or_else(|| self.fail(format!("{} was not in the model", slot.name)))?;
                let line = format!(
                    "  {} closed: replays {:?} (unacked {})",
                    slot.name,
                    ids(&removed.entries),
                    removed.messages
                );
                self.note(line);
                self.to_dispatch.extend(removed.entries);
                Ok(())
            }
        }
    }

    async fn produce(&mut self, batches: u8, size: u8) -> Result<(), Box<ConformanceError>> {
        let count = usize::from(batches) * usize::from(size);
        let producer = self.producer(size).await?;
        let sends = (0..count).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
        let sent = futures_util::future::join_all(sends).await;
        let mut entries = BTreeSet::new();
        for id in sent {
            let id = id.map_err(|e| self.fail(format!("send: {e}")))?;
            if id.batch_size() != Some(u32::from(size)) {
                return Err(self.fail(format!("{id} is in a batch of {:?}", id.batch_size())));
            }
            entries.insert(EntryId {
                ledger_id: id.ledger_id(),
                entry_id: id.entry_id(),
            });
        }
        if entries.len() != usize::from(batches) {
            return Err(self.fail(format!("{count} messages made entries {entries:?}")));
        }
        self.note(format!("  produced {:?}", ids(&entries)));
        self.produced.extend(entries.iter().copied());
        self.to_dispatch.extend(entries);
        Ok(())
    }

    async fn txn(&mut self, slot: u8) -> Result<Transaction, Box<ConformanceError>> {
        let slot = usize::from(slot) % TXN_SLOTS;
        if let Some(txn) = &self.txns[slot] {
            return Ok(txn.clone());
        }
        let coordinator = self
            .client
            .transaction_coordinator()
            .await
            .map_err(|e| self.fail(format!("the coordinator: {e}")))?;
        let txn = coordinator
            .new_transaction(TXN_TIMEOUT)
            .await
            .map_err(|e| self.fail(format!("a new transaction: {e}")))?;
        txn.add_subscription(&self.topic, SUBSCRIPTION)
            .await
            .map_err(|e| self.fail(format!("adding the subscription to the transaction: {e}")))?;
        self.note(format!("  opened {} in slot {slot}", txn.id()));
        self.txns[slot] = Some(txn.clone());
        Ok(txn)
    }

    /// Sends `wire` through the consumer that received the held message, waits for the
    /// answer (cumulative acks have none on Shared: sent without a request id), feeds the
    /// owner's model and compares conflicts.
    async fn ack(
        &mut self,
        slot: usize,
        index: usize,
        wire: WireAck,
        txn: Option<Transaction>,
    ) -> Result<(), Box<ConformanceError>> {
        if wire.kind == AckKind::Individual && self.pruning_decides(&wire.entry) {
            // See the module docs: whether the holder still has the entry in `pendingAcks`
            // depends on whether the broker's dispatcher read since the cursor deleted it.
            self.note(format!(
                "  not sent: {} is deleted and still held, at or below the mark-delete position",
                wire.entry
            ));
            return Ok(());
        }
        let message = &self.slots[slot].held[index].message;
        let (connection, consumer_id) = self.slots[slot]
            .consumer
            .wire_of(message)
            .map_err(|e| self.fail(e.to_string()))?;
        let cumulative = wire.kind == AckKind::Cumulative;
        let build = |request_id: Option<u64>| {
            command_frame(pb::base_command::Type::Ack, |c| {
                c.ack = Some(pb::CommandAck {
                    consumer_id,
                    ack_type: if cumulative {
                        pb::command_ack::AckType::Cumulative
                    } else {
                        pb::command_ack::AckType::Individual
                    } as i32,
                    message_id: vec![pb::MessageIdData {
                        ledger_id: wire.entry.ledger_id,
                        entry_id: wire.entry.entry_id,
                        ack_set: wire.ack_set.clone(),
                        batch_size: wire.batch_size,
                        ..pb::MessageIdData::default()
                    }],
                    txnid_least_bits: wire.txn.map(|t| t.least_bits),
                    txnid_most_bits: wire.txn.map(|t| t.most_bits),
                    request_id,
                    ..pb::CommandAck::default()
                });
            })
        };
        let answer = if cumulative {
            connection.send(build(None)).map(drop)
        } else {
            connection
                .request("ACK", |request_id| build(Some(request_id)))
                .await
                .map(drop)
        };
        drop(txn);
        let broker_conflict = match answer {
            Ok(()) => false,
            Err(pulsar_wire::Error::Server { code, .. })
                if code == pb::ServerError::TransactionConflict as i32 =>
            {
                true
            }
            Err(error) => return Err(self.fail(format!("the ack was refused: {error}"))),
        };
        self.report.acks += 1;
        self.report.conflicts += u64::from(broker_conflict);
        // Mark what this ack covers as acknowledged for later picks.
        let position = *self.slots[slot].held[index].message.position();
        for held in &mut self.slots[slot].held {
            let same_entry = held.message.position().entry() == position.entry();
            if same_entry
                && (wire.ack_set.is_empty()
                    || held.message.position().batch_index() == position.batch_index())
            {
                held.acked = true;
            }
        }
        let acker = self.slots[slot].id;
        let owner = self.model.ack_owner(acker, &wire.entry);
        let outcome = self.model.ack(acker, &wire);
        let line = format!(
            "  {} ack (owner c{}) {:?} {} set {:?} batch_size {:?} txn {:?} -> model {:?}, \
             broker {}",
            self.slots[slot].name,
            owner.0,
            wire.kind,
            wire.entry,
            wire.ack_set,
            wire.batch_size,
            wire.txn.map(|t| t.to_string()),
            outcome,
            if broker_conflict { "conflict" } else { "ok" }
        );
        self.note(line);
        let model_conflict = match outcome {
            Ok(AckOutcome::Conflict(_)) => true,
            Ok(_) | Err(txn_ack::Error::UnknownEntry { .. }) => false,
            Err(error) => return Err(self.fail(format!("the model refused the ack: {error}"))),
        };
        if model_conflict != broker_conflict {
            return Err(self.fail(format!(
                "the {} answered {} but the model {}",
                self.target.name(),
                if broker_conflict {
                    "TransactionConflict"
                } else {
                    "success"
                },
                if model_conflict {
                    "a conflict"
                } else {
                    "success"
                }
            )));
        }
        Ok(())
    }

    fn is_deleted(&self, entry: &EntryId) -> bool {
        self.model
            .entry(entry)
            .is_some_and(|v| v.cursor.is_deleted())
    }

    /// Whether an ack of `entry` would depend on the broker's mark-delete pruning: the cursor
    /// deleted it, a consumer still holds it, and every entry up to it is deleted.
    fn pruning_decides(&self, entry: &EntryId) -> bool {
        self.is_deleted(entry)
            && self.model.holders(entry).next().is_some()
            && self
                .produced
                .range(..=*entry)
                .all(|earlier| self.is_deleted(earlier))
    }

    /// REDELIVER_UNACKNOWLEDGED_MESSAGES with ids, sent raw through the consumer of the
    /// picked message: its entry, which must be in that consumer's `pendingAcks` and not
    /// deleted (so that the broker replays it and reads), and with `other` an entry only
    /// another consumer holds.
    async fn redeliver_ids(
        &mut self,
        pick: Pick,
        other: bool,
    ) -> Result<(), Box<ConformanceError>> {
        let Some((slot, index)) = self.resolve(pick) else {
            self.note("  nothing to name");
            return Ok(());
        };
        let id = self.slots[slot].id;
        let entry = self.slots[slot].held[index].message.position().entry();
        let own = self.model.holders(&entry).any(|h| h == id) && !self.is_deleted(&entry);
        if !own {
            self.note(format!(
                "  not sent: {entry} is not in {}'s pendingAcks or is deleted",
                self.slots[slot].name
            ));
            return Ok(());
        }
        let mut named = vec![entry];
        if other
            && let Some(theirs) = self
                .slots
                .iter()
                .filter(|s| s.id != id)
                .flat_map(|s| self.model.pending_acks(s.id).map(|(e, _)| e))
                .find(|e| self.model.holders(e).all(|h| h != id))
        {
            named.push(theirs);
        }
        let message = &self.slots[slot].held[index].message;
        let (connection, consumer_id) = self.slots[slot]
            .consumer
            .wire_of(message)
            .map_err(|e| self.fail(e.to_string()))?;
        let frame = command_frame(
            pb::base_command::Type::RedeliverUnacknowledgedMessages,
            |c| {
                c.redeliver_unacknowledged_messages =
                    Some(pb::CommandRedeliverUnacknowledgedMessages {
                        consumer_id,
                        message_ids: named
                            .iter()
                            .map(|e| pb::MessageIdData {
                                ledger_id: e.ledger_id,
                                entry_id: e.entry_id,
                                ..pb::MessageIdData::default()
                            })
                            .collect(),
                        ..pb::CommandRedeliverUnacknowledgedMessages::default()
                    });
            },
        );
        connection
            .send(frame)
            .map_err(|e| self.fail(format!("redelivery request: {e}")))?;
        let redelivered = self
            .model
            .redeliver_unacknowledged(id, &named)
            .map_err(|e| self.fail(e.to_string()))?;
        let line = format!(
            "  {}: redeliver {:?}: replays {:?}",
            self.slots[slot].name,
            ids(&named),
            ids(&redelivered.entries)
        );
        self.note(line);
        self.to_dispatch.extend(redelivered.entries);
        Ok(())
    }

    fn model_state(&self) -> State {
        let consumers = self
            .model
            .consumers()
            .filter_map(|c| {
                let slot = self.slots.iter().find(|s| s.id == c.id)?;
                Some((
                    slot.name.clone(),
                    ConsumerState {
                        unacked: c.unacked,
                        blocked: c.blocked,
                    },
                ))
            })
            .collect();
        let deleted = self.produced.iter().filter(|e| self.is_deleted(e)).count();
        State {
            consumers,
            backlog_entries: (self.produced.len() - deleted) as i64,
        }
    }

    fn observed_out(&self) -> BTreeMap<String, u64> {
        self.slots
            .iter()
            .map(|s| {
                let out = match self.target {
                    Target::Real(_) => s.out_messages,
                    Target::Emulator(_) => s.out_entries,
                };
                (s.name.clone(), out)
            })
            .collect()
    }

    /// Entries the model says a consumer would take now.
    fn expected_dispatches(&mut self) -> Vec<EntryId> {
        let mut expected = Vec::new();
        let mut consumed = Vec::new();
        for entry in &self.to_dispatch {
            let size = self.model.entry(entry).map(|v| v.batch_size as i32);
            let mut any_open = false;
            let mut dispatchable = false;
            for consumer in self.model.consumers() {
                if consumer.blocked {
                    continue;
                }
                any_open = true;
                let mut probe = self.model.clone();
                // Never dispatched: any size will do for the probe (the entry is new).
                if let Ok(Dispatch::Dispatched { .. }) =
                    probe.dispatch(consumer.id, *entry, size.unwrap_or(1))
                {
                    dispatchable = true;
                }
            }
            if dispatchable {
                expected.push(*entry);
            } else if any_open {
                consumed.push(*entry);
            }
        }
        for entry in consumed {
            self.to_dispatch.remove(&entry);
        }
        expected
    }

    /// Takes what arrived at every consumer, feeding the frames to that consumer's model.
    /// Returns how many frames arrived.
    async fn drain(&mut self, wait: Duration) -> Result<usize, Box<ConformanceError>> {
        let mut count = 0;
        for s in 0..self.slots.len() {
            let mut frames: Vec<Frame> = Vec::new();
            loop {
                let next = tokio::time::timeout(wait, self.slots[s].consumer.receive()).await;
                let message = match next {
                    Err(_) => break,
                    Ok(Err(error)) => return Err(self.fail(format!("receive: {error}"))),
                    Ok(Ok(message)) => message,
                };
                let position = *message.position();
                let index = position.batch_index().max(0) as u32;
                let continues = frames.last().is_some_and(|f| {
                    f.entry == position.entry()
                        && f.redelivery_count == message.redelivery_count()
                        && f.indexes.last().is_some_and(|last| *last < index)
                });
                match frames.last_mut() {
                    Some(frame) if continues => frame.indexes.push(index),
                    _ => frames.push(Frame {
                        entry: position.entry(),
                        batch_size: position.batch_size(),
                        redelivery_count: message.redelivery_count(),
                        indexes: vec![index],
                    }),
                }
                self.slots[s].arrived.push(message);
            }
            count += frames.len();
            for group in self.calls(s, frames) {
                self.feed(s, &group)?;
            }
        }
        Ok(count)
    }

    /// Splits the frames that arrived together at slot `s` into `sendMessages` calls: a frame
    /// that arrives while the model has the consumer blocked went out in the same call as the
    /// frame before it (the dispatcher checks the blocked flag once per call).
    fn calls(&self, s: usize, frames: Vec<Frame>) -> Vec<Vec<Frame>> {
        let id = self.slots[s].id;
        let mut groups: Vec<Vec<Frame>> = Vec::new();
        for frame in frames {
            let mut probe = self.model.clone();
            for group in &groups {
                let _ = probe.dispatch_all(id, &entries_of(group));
            }
            match groups.last_mut() {
                Some(group) if probe.is_blocked(id).unwrap_or(false) => group.push(frame),
                _ => groups.push(vec![frame]),
            }
        }
        groups
    }

    /// The MESSAGE frames of one `sendMessages` call that arrived at slot `s`: a dispatch for
    /// its model.
    fn feed(&mut self, s: usize, frames: &[Frame]) -> Result<(), Box<ConformanceError>> {
        let id = self.slots[s].id;
        let in_pending: Vec<bool> = frames
            .iter()
            .map(|f| self.model.holders(&f.entry).any(|h| h == id))
            .collect();
        let before = self.model.unacked(id).unwrap_or(0);
        let answers = self.model.dispatch_all(id, &entries_of(frames));
        let after = self.model.unacked(id).unwrap_or(0);
        let slot = &mut self.slots[s];
        let line = format!(
            "  {} got {} -> model {:?}, unacked {before} -> {}",
            slot.name,
            frames
                .iter()
                .zip(&in_pending)
                .map(|(f, pending)| format!(
                    "{} (size {}, redelivery {}) indexes {:?}{}",
                    f.entry,
                    f.batch_size,
                    f.redelivery_count,
                    f.indexes,
                    if *pending {
                        " while in pendingAcks"
                    } else {
                        ""
                    }
                ))
                .collect::<Vec<_>>()
                .join(" + "),
            answers,
            after
        );
        slot.out_entries += frames.len() as u64;
        slot.out_messages += frames.iter().map(|f| u64::from(f.batch_size)).sum::<u64>();
        self.log.push(line);
        for frame in frames {
            self.to_dispatch.remove(&frame.entry);
        }
        self.report.dispatches += frames.len() as u64;
        self.report.redispatches += in_pending.iter().filter(|p| **p).count() as u64;
        let answers =
            answers.map_err(|error| self.fail(format!("the model refused a dispatch: {error}")))?;
        for (frame, answer) in frames.iter().zip(answers) {
            let Dispatch::Dispatched { ack_set, .. } = answer else {
                return Err(self.fail(format!(
                    "{} arrived at {} but the model would not dispatch it: {answer:?}",
                    frame.entry, self.slots[s].name
                )));
            };
            let predicted: Vec<u32> = if ack_set.is_empty() {
                (0..frame.batch_size).collect()
            } else {
                (0..frame.batch_size)
                    .filter(|i| {
                        let word = ack_set.get((*i / 64) as usize).copied().unwrap_or(0);
                        (word as u64 >> (i % 64)) & 1 == 1
                    })
                    .collect()
            };
            if predicted != frame.indexes {
                return Err(self.fail(format!(
                    "{} arrived with indexes {:?}; the model's ack set says {:?}",
                    frame.entry, frame.indexes, predicted
                )));
            }
        }
        Ok(())
    }

    /// Drains and polls until the target's state equals the model's with every expected
    /// dispatch arrived, or until it stops changing (bounded by [`SETTLE_LIMIT`]).
    async fn settle(&mut self) -> Result<(), Box<ConformanceError>> {
        let real = matches!(self.target, Target::Real(_));
        let started = Instant::now();
        let mut stable_since = Instant::now();
        let mut last: Option<Snapshot> = None;
        let mut wait = Duration::from_millis(if real { 20 } else { 5 });
        loop {
            let frames = self.drain(wait).await?;
            let expected = self.expected_dispatches();
            let snapshot = self
                .target
                .snapshot(&self.topic)
                .await
                .map_err(|e| self.fail(format!("reading the target's stats: {e}")))?;
            self.last_observed = snapshot.state.clone();
            let model = self.model_state();
            let out_ok = snapshot.out == self.observed_out();
            if out_ok && expected.is_empty() && snapshot.state == model {
                return Ok(());
            }
            if frames > 0 || last.as_ref() != Some(&snapshot) {
                stable_since = Instant::now();
                last = Some(snapshot.clone());
            }
            let now = Instant::now();
            if now - stable_since >= STABLE_FOR || now - started >= SETTLE_LIMIT {
                let what = if !out_ok {
                    format!(
                        "the target dispatched {:?}, the consumers received {:?}",
                        snapshot.out,
                        self.observed_out()
                    )
                } else if !expected.is_empty() {
                    format!(
                        "the model expects {:?} to be dispatched; nothing arrived",
                        ids(&expected)
                    )
                } else {
                    "the states differ".to_owned()
                };
                return Err(self.fail(what));
            }
            // Give the target time: wait a little longer for messages, then poll again.
            wait = Duration::from_millis(if real { 50 } else { 10 });
        }
    }
}

fn entries_of(frames: &[Frame]) -> Vec<(EntryId, i32)> {
    frames
        .iter()
        .map(|f| (f.entry, f.batch_size as i32))
        .collect()
}

fn ids<'a>(entries: impl IntoIterator<Item = &'a EntryId>) -> Vec<String> {
    entries.into_iter().map(ToString::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_deterministic_per_seed() {
        for seed in 0..50 {
            assert_eq!(Script::generate(seed, 30), Script::generate(seed, 30));
        }
        assert_ne!(Script::generate(1, 30), Script::generate(4, 30));
    }

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // The first outputs of SplitMix64 from seed 0 (Vigna's reference implementation).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn every_class_has_its_steps() {
        let steady = Script::generate(1, 40);
        assert_eq!(steady.class, Class::Steady);
        assert!(steady.steps.iter().any(|s| matches!(s, Step::Abort { .. })));
        let two = Script::generate(2, 40);
        assert_eq!(two.class, Class::TwoConsumers);
        assert!(two.steps.contains(&Step::AddConsumer));
        assert!(!two.steps.iter().any(|s| matches!(s, Step::TxnAck { .. })));
        let txn = Script::generate(3, 40);
        assert_eq!(txn.class, Class::SharedTxn);
        assert_eq!(txn.steps[1], Step::AddConsumer);
        assert!(txn.steps.iter().any(|s| matches!(s, Step::Abort { .. })));
        let three = Script::generate(4, 64);
        assert_eq!(three.class, Class::ThreeConsumers);
        assert_eq!(
            three
                .steps
                .iter()
                .filter(|s| **s == Step::AddConsumer)
                .count(),
            2
        );
        assert!(three.steps.iter().any(|s| matches!(s, Step::Close { .. })));
    }
}
