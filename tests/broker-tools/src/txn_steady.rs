//! The steady transactional shape: a producer sends at a steady rate in batches while Shared
//! consumers keep up and acknowledge every message in a transaction (one batch index per ack).
//! Each consumer runs its own loop: every few messages received it opens a transaction,
//! acknowledges them in it all at once, waits for every answer and ends it in the background
//! (at most two ends in flight) while it goes on receiving; every few ended transactions one
//! is aborted, and its messages are acknowledged again once they come back (from whichever
//! consumer receives them: the loop only keeps receiving). It runs against a real broker (or
//! the emulator), with `pulsar-wire` ([`run`]) or any other client (the caller starts it and
//! calls [`watch`]).
//!
//! Two shapes: issue 11's ([`Shape::steady`], one consumer, 140 msg/s in batches of 7, limit
//! 50) and issue 27's ([`Shape::shared`], N consumers on one subscription, 300 msg/s in
//! batches of 13, limit [`SHARED_LIMIT`]). Every consumer's commits go to one record
//! ([`Commits`]), so a payload committed by two consumers (or twice by one) is seen, with
//! both consumers and how far apart their acks were ([`DoubleCommit`]).
//!
//! [`Watcher`] polls the admin stats while the run goes on and measures the blocked periods
//! (`blockedConsumerOnUnackedMsgs`) of every consumer and of the subscription as a whole (any
//! consumer blocked), so every client is measured the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pulsar_wire::ServerError;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, ConsumerOptions, Error, InitialPosition, OutgoingMessage,
    Producer, SubType, Transaction, TransactionCoordinator,
};

use crate::pulsar_admin::{ConsumerStats, PulsarAdmin};

/// `maxUnackedMessagesOnConsumer` for [`Shape::shared`] (issue 27); the caller sets it on the
/// topic.
pub const SHARED_LIMIT: u32 = 37;

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How long the producer sends.
    pub produce_for: Duration,
    /// Messages per second.
    pub rate: u32,
    /// Messages per producer batch: the producer sends one batch every `batch / rate` seconds.
    pub batch: usize,
    /// Messages acknowledged per transaction.
    pub txn_every: usize,
    /// Every `abort_every`-th transaction a consumer ends is aborted (0: none).
    pub abort_every: usize,
    /// Everything is produced before the consumers start (the bulk shape).
    pub produce_first: bool,
    /// The run gives up after this long.
    pub timeout: Duration,
    /// The application stops receiving and acknowledging once for the second value, when the
    /// first has passed since the start (a pause such as a long GC or a slow downstream call);
    /// every consumer pauses.
    pub pause: Option<(Duration, Duration)>,
    /// Consumers on the one Shared subscription, each with its own loop (named
    /// [`consumer_name`]).
    pub consumers: usize,
}

impl Shape {
    /// Issue 11's steady shape: one consumer, 140 msg/s in batches of 7 for `produce_for`, 5
    /// acks per transaction, every third aborted (the topic's limit: 50).
    pub fn steady(produce_for: Duration) -> Self {
        Self {
            produce_for,
            rate: 140,
            batch: 7,
            txn_every: 5,
            abort_every: 3,
            produce_first: false,
            timeout: produce_for + Duration::from_secs(60),
            pause: None,
            consumers: 1,
        }
    }

    /// The bulk shape: `messages` produced first (batches of 7), then consumed as above.
    pub fn bulk(messages: u32) -> Self {
        Self {
            produce_for: Duration::from_millis(u64::from(messages) * 1000 / 140),
            produce_first: true,
            timeout: Duration::from_secs(120),
            ..Self::steady(Duration::ZERO)
        }
    }

    /// Issue 27's shape: `consumers` Shared consumers on one subscription, 300 msg/s in
    /// batches of 13 for `produce_for`, 6 acks per transaction, every fourth transaction of
    /// each consumer aborted. The topic's limit is [`SHARED_LIMIT`].
    pub fn shared(consumers: usize, produce_for: Duration) -> Self {
        Self {
            produce_for,
            rate: 300,
            batch: 13,
            txn_every: 6,
            abort_every: 4,
            produce_first: false,
            timeout: produce_for + Duration::from_secs(60),
            pause: None,
            consumers,
        }
    }

    /// How many messages the producer sends: whole batches, at least `rate × produce_for`.
    pub fn messages(&self) -> u64 {
        self.ticks() * self.batch as u64
    }

    /// The time between two batches.
    fn tick(&self) -> Duration {
        Duration::from_nanos(self.batch as u64 * 1_000_000_000 / u64::from(self.rate.max(1)))
    }

    fn ticks(&self) -> u64 {
        let batch = self.batch.max(1) as u128 * 1_000_000_000;
        (self.produce_for.as_nanos() * u128::from(self.rate)).div_ceil(batch) as u64
    }
}

/// The name of consumer `index` of a run (in the admin stats and the reports).
pub fn consumer_name(index: usize) -> String {
    format!("c{index}")
}

/// One commit of a payload: which consumer acknowledged it and when the broker answered
/// that ack (from the start of the run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commit {
    /// The consumer's index.
    pub consumer: usize,
    /// When its transactional ack was answered.
    pub acked_at: Duration,
}

/// A payload committed in a second transaction: the commit seen first and this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleCommit {
    /// The payload.
    pub payload: String,
    /// The commit recorded first.
    pub first: Commit,
    /// The commit recorded later.
    pub second: Commit,
}

impl DoubleCommit {
    /// How far apart the two acks were answered.
    pub fn apart(&self) -> Duration {
        self.first.acked_at.abs_diff(self.second.acked_at)
    }

    /// Whether two consumers committed it (not one consumer twice).
    pub fn across_consumers(&self) -> bool {
        self.first.consumer != self.second.consumer
    }
}

/// The record of committed payloads across every consumer of a run.
#[derive(Debug, Clone, Default)]
pub struct Commits {
    first: HashMap<String, Commit>,
    doubles: Vec<DoubleCommit>,
}

impl Commits {
    /// Records that a committed transaction held `payload`; false when it was committed
    /// before (then a [`DoubleCommit`] is recorded).
    pub fn commit(&mut self, payload: String, commit: Commit) -> bool {
        match self.first.get(&payload) {
            Some(first) => {
                self.doubles.push(DoubleCommit {
                    payload,
                    first: *first,
                    second: commit,
                });
                false
            }
            None => {
                self.first.insert(payload, commit);
                true
            }
        }
    }

    /// Distinct payloads committed.
    pub fn distinct(&self) -> usize {
        self.first.len()
    }

    /// Every commit after a payload's first.
    pub fn doubles(&self) -> &[DoubleCommit] {
        &self.doubles
    }

    /// Payloads committed more than once.
    pub fn committed_again(&self) -> usize {
        let mut payloads: Vec<&str> = self.doubles.iter().map(|d| d.payload.as_str()).collect();
        payloads.sort_unstable();
        payloads.dedup();
        payloads.len()
    }
}

/// What one run measured on the client side (all consumers together unless a field says
/// otherwise).
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    /// Messages produced.
    pub produced: u64,
    /// Distinct payloads committed.
    pub committed: u64,
    /// Commits of payloads committed before (each one in [`ClientReport::double_commits`]).
    pub duplicates: u64,
    /// Distinct payloads committed more than once.
    pub committed_again: u64,
    /// Every commit of a payload committed before: the two consumers and when their acks
    /// were answered.
    pub double_commits: Vec<DoubleCommit>,
    /// Payload commits per consumer (double commits included).
    pub committed_by: Vec<u64>,
    /// Transactions committed.
    pub txns_committed: u64,
    /// Transactions aborted on purpose.
    pub txns_aborted: u64,
    /// Transactional acks the broker refused.
    pub acks_refused: u64,
    /// Of those, the ones refused with `TransactionConflict`.
    pub ack_conflicts: u64,
    /// Transactional acks the client refused before sending (already acknowledged).
    pub acks_refused_by_client: u64,
    /// Commits the coordinator refused.
    pub commits_refused: u64,
    /// From the first send (the bulk shape: from subscribing) to the last payload committed.
    pub drain: Duration,
    /// Every payload was committed before the timeout.
    pub drained: bool,
    /// Messages the consumers recognised as redeliveries of committed messages.
    pub committed_redeliveries: u64,
    /// Duplicate deliveries the consumers recognised (and did not hand over again).
    pub duplicates_hidden: u64,
    /// `REDELIVER_UNACKNOWLEDGED_MESSAGES` requests the consumers sent.
    pub redelivery_requests: u64,
    /// Of those, the ones that only unblocked a consumer (they replay nothing).
    pub unblocks: u64,
    /// Transactional acks held back until their batch was free or their commit.
    pub acks_held_back: u64,
    /// Messages the consumers handed to the application again themselves.
    pub handed_again: u64,
    /// The subscription's unacked count once settled, the consumers still connected (`None`
    /// when not measured).
    pub final_unacked: Option<i64>,
    /// Its backlog then.
    pub final_backlog: Option<i64>,
    /// The slowest transaction's acks (sent together, until the last answer).
    pub slowest_ack: Duration,
    /// The slowest commit.
    pub slowest_commit: Duration,
    /// The slowest abort.
    pub slowest_abort: Duration,
    /// The longest wait of a consumer for a message while payloads were still outstanding,
    /// and when it began (from the start).
    pub longest_receive_gap: (Duration, Duration),
    /// The mean time from a transaction taken to its end answered (its acks, then its
    /// commit or abort): a consumer keeps up while `txn_every` messages take less than
    /// this at its share of the producer's rate, redeliveries included.
    pub mean_cycle: Duration,
}

/// What one consumer's loop counted.
#[derive(Debug, Default)]
struct Counts {
    committed: u64,
    txns_committed: u64,
    txns_aborted: u64,
    acks_refused: u64,
    ack_conflicts: u64,
    acks_refused_by_client: u64,
    commits_refused: u64,
    slowest_ack: Duration,
    slowest_commit: Duration,
    slowest_abort: Duration,
    longest_receive_gap: (Duration, Duration),
    cycles: Duration,
    ended: u32,
}

/// What the consumers' loops share.
struct Run {
    started: Instant,
    deadline: Instant,
    /// The producer's count of messages sent, once it is done.
    produced: Arc<Mutex<Option<u64>>>,
    commits: Mutex<Commits>,
    drained_at: Mutex<Option<Duration>>,
    /// A loop failed: the others stop.
    stop: AtomicBool,
}

/// Runs the shape with `pulsar-wire` on `topic` / `subscription`: [`Shape::consumers`]
/// consumers of one client, each on its own task. `legacy` delivers redeliveries of
/// committed messages to the application as before the fix (tests only). With `admin`, the
/// settled unacked count and backlog are read before the consumers close.
///
/// # Errors
/// When the client cannot connect, subscribe or produce, or a consumer's receive fails.
pub async fn run(
    client: &Client,
    topic: &str,
    subscription: &str,
    shape: &Shape,
    legacy: bool,
    admin: Option<&PulsarAdmin>,
) -> Result<ClientReport, Error> {
    // The steady shape subscribes first; the bulk one after everything is produced (a
    // subscription from the earliest message sees it all).
    let early = if shape.produce_first {
        None
    } else {
        Some(subscribe(client, topic, subscription, shape, legacy).await?)
    };
    let producer = Producer::builder(client, topic)
        .batching(
            BatchingOptions::default()
                .max_messages(shape.batch)
                .max_delay(Duration::from_millis(50)),
        )
        .build()
        .await?;
    let coordinator = client.transaction_coordinator().await?.clone();
    let started = Instant::now();
    let produced = Arc::new(Mutex::new(None::<u64>));
    let mut producing = Some({
        let shape = shape.clone();
        let produced = Arc::clone(&produced);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(shape.tick());
            let mut sends = Vec::new();
            let mut next = 0u64;
            for _ in 0..shape.ticks() {
                tick.tick().await;
                let payloads: Vec<_> = (0..shape.batch)
                    .map(|_| {
                        next += 1;
                        format!("p{}", next - 1)
                    })
                    .collect();
                let producer = producer.clone();
                sends.push(tokio::spawn(async move {
                    let batch = payloads
                        .into_iter()
                        .map(|payload| producer.send(OutgoingMessage::new(payload)));
                    futures_util::future::join_all(batch).await
                }));
            }
            let mut ok = 0;
            for send in sends {
                if let Ok(results) = send.await {
                    ok += results.iter().filter(|r| r.is_ok()).count() as u64;
                }
            }
            *produced.lock() = Some(ok);
            let _ = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
        })
    });
    if shape.produce_first
        && let Some(task) = producing.take()
    {
        let _ = task.await;
    }
    let consumers = match early {
        Some(consumers) => consumers,
        None => subscribe(client, topic, subscription, shape, legacy).await?,
    };
    let started = if shape.produce_first {
        Instant::now()
    } else {
        started
    };
    let run = Arc::new(Run {
        started,
        deadline: started + shape.timeout,
        produced: Arc::clone(&produced),
        commits: Mutex::new(Commits::default()),
        drained_at: Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    let loops = consumers.iter().enumerate().map(|(index, consumer)| {
        tokio::spawn(consume(
            index,
            Arc::clone(consumer),
            coordinator.clone(),
            subscription.to_owned(),
            shape.clone(),
            Arc::clone(&run),
        ))
    });
    let mut report = ClientReport::default();
    let mut cycles = Duration::ZERO;
    let mut ended = 0u32;
    let mut failed = None;
    for counts in futures_util::future::join_all(loops).await {
        let counts = match counts.expect("a consumer's loop") {
            Ok(counts) => counts,
            Err(error) => {
                failed.get_or_insert(error);
                continue;
            }
        };
        report.committed_by.push(counts.committed);
        report.txns_committed += counts.txns_committed;
        report.txns_aborted += counts.txns_aborted;
        report.acks_refused += counts.acks_refused;
        report.ack_conflicts += counts.ack_conflicts;
        report.acks_refused_by_client += counts.acks_refused_by_client;
        report.commits_refused += counts.commits_refused;
        report.slowest_ack = report.slowest_ack.max(counts.slowest_ack);
        report.slowest_commit = report.slowest_commit.max(counts.slowest_commit);
        report.slowest_abort = report.slowest_abort.max(counts.slowest_abort);
        report.longest_receive_gap = report.longest_receive_gap.max(counts.longest_receive_gap);
        cycles += counts.cycles;
        ended += counts.ended;
    }
    if let Some(error) = failed {
        return Err(error);
    }
    report.produced = produced.lock().unwrap_or(0);
    if let Some(drain) = *run.drained_at.lock() {
        report.drained = true;
        report.drain = drain;
    }
    {
        let commits = run.commits.lock();
        report.committed = commits.distinct() as u64;
        report.duplicates = commits.doubles().len() as u64;
        report.committed_again = commits.committed_again() as u64;
        report.double_commits = commits.doubles().to_vec();
    }
    report.mean_cycle = cycles / ended.max(1);
    if let Some(admin) = admin {
        let (unacked, backlog) =
            settled_counts(admin, topic, subscription, Duration::from_secs(10)).await;
        report.final_unacked = Some(unacked);
        report.final_backlog = Some(backlog);
    }
    for consumer in &consumers {
        let stats = consumer.stats();
        report.committed_redeliveries += stats.committed_redeliveries;
        report.duplicates_hidden += stats.duplicates;
        report.redelivery_requests += stats.redelivery_requests;
        report.unblocks += stats.unblocks;
        report.acks_held_back += stats.acks_held_back;
        report.handed_again += stats.handed_again;
    }
    if let Some(task) = producing {
        task.abort();
    }
    for consumer in &consumers {
        consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    }
    Ok(report)
}

/// Subscribes the shape's consumers, one after the other, on one Shared subscription.
async fn subscribe(
    client: &Client,
    topic: &str,
    subscription: &str,
    shape: &Shape,
    legacy: bool,
) -> Result<Vec<Arc<Consumer>>, Error> {
    let mut consumers = Vec::with_capacity(shape.consumers);
    for index in 0..shape.consumers.max(1) {
        let options = ConsumerOptions::default()
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest)
            .name(consumer_name(index))
            .legacy_committed_redeliveries(legacy);
        consumers.push(Arc::new(
            Consumer::builder(client, topic, subscription)
                .options(options)
                .build()
                .await?,
        ));
    }
    Ok(consumers)
}

/// One consumer's loop: receives, acknowledges every `txn_every` messages in a transaction
/// and ends it in the background, until every payload is committed (by any consumer), the
/// deadline passes or another loop failed.
async fn consume(
    index: usize,
    consumer: Arc<Consumer>,
    coordinator: TransactionCoordinator,
    subscription: String,
    shape: Shape,
    run: Arc<Run>,
) -> Result<Counts, Error> {
    let result =
        consume_until_done(index, &consumer, &coordinator, &subscription, &shape, &run).await;
    if result.is_err() {
        run.stop.store(true, Ordering::Release);
    }
    result
}

async fn consume_until_done(
    index: usize,
    consumer: &Consumer,
    coordinator: &TransactionCoordinator,
    subscription: &str,
    shape: &Shape,
    run: &Run,
) -> Result<Counts, Error> {
    let mut counts = Counts::default();
    let mut batch = Vec::with_capacity(shape.txn_every);
    let mut last_message = Instant::now();
    let mut pause = shape.pause;
    let mut next: Option<tokio::task::JoinHandle<Result<Transaction, Error>>> = None;
    let mut ending: VecDeque<tokio::task::JoinHandle<Ending>> = VecDeque::new();
    loop {
        if let Some((at, length)) = pause
            && run.started.elapsed() >= at
        {
            // The application's own pause, not a wait for the client: nothing is received
            // or acknowledged meanwhile.
            pause = None;
            tokio::time::sleep(length).await;
            last_message = Instant::now();
        }
        while ending.front().is_some_and(|end| end.is_finished()) {
            let end = ending.pop_front().expect("a finished end");
            settle(end.await, index, &mut counts, &run.commits);
        }
        let total = *run.produced.lock();
        if let Some(total) = total
            && run.commits.lock().distinct() as u64 >= total
        {
            run.drained_at
                .lock()
                .get_or_insert_with(|| run.started.elapsed());
            break;
        }
        if Instant::now() >= run.deadline || run.stop.load(Ordering::Acquire) {
            break;
        }
        let received = tokio::time::timeout(Duration::from_millis(200), consumer.receive()).await;
        let message = match received {
            Ok(Ok(message)) => Some(message),
            Ok(Err(error)) => return Err(error),
            Err(_) => None,
        };
        if message.is_some() {
            let gap = last_message.elapsed();
            if gap > counts.longest_receive_gap.0 {
                counts.longest_receive_gap = (gap, last_message - run.started);
            }
            last_message = Instant::now();
        }
        if let Some(message) = message {
            batch.push(message);
            if batch.len() < shape.txn_every {
                continue;
            }
        } else if batch.is_empty() {
            continue;
        }
        // The messages received are acknowledged in one transaction, all at once (the acks
        // go out together and the transaction ends once every answer is in). The transaction
        // was opened, and the subscription registered in it, while the previous one went on,
        // and the next one is opened now; it ends in the background: a cycle costs the acks'
        // round trip.
        let cycle = Instant::now();
        let open = match next.take() {
            Some(opening) => opening.await.expect("the task opening a transaction")?,
            None => open_transaction(coordinator, consumer.topic(), subscription).await?,
        };
        next = Some(tokio::spawn(open_transaction_owned(
            coordinator.clone(),
            consumer.topic().to_owned(),
            subscription.to_owned(),
        )));
        let sent = Instant::now();
        let acks = futures_util::future::join_all(batch.iter().map(|message| async {
            let acked = consumer.ack_in(&open, message).await;
            (acked, run.started.elapsed())
        }))
        .await;
        counts.slowest_ack = counts.slowest_ack.max(sent.elapsed());
        let mut payloads = Vec::with_capacity(batch.len());
        for (message, (acked, at)) in batch.drain(..).zip(acks) {
            match acked {
                Ok(()) => {
                    let payload = String::from_utf8_lossy(message.payload()).into_owned();
                    payloads.push((payload, at));
                }
                Err(Error::Ack(error)) => {
                    counts.acks_refused_by_client += 1;
                    tracing::debug!(%error, "ack refused by the client");
                }
                Err(error) => {
                    counts.acks_refused += 1;
                    if error.server_error() == Some(ServerError::TransactionConflict) {
                        counts.ack_conflicts += 1;
                    }
                    tracing::info!(%error, "ack refused");
                }
            }
        }
        counts.ended += 1;
        let abort =
            shape.abort_every > 0 && (counts.ended as usize).is_multiple_of(shape.abort_every);
        // The transaction ends in the background while the next messages are received and
        // acknowledged; at most two ends are in flight.
        while ending.len() >= 2 {
            let oldest = ending.pop_front().expect("two in flight");
            settle(oldest.await, index, &mut counts, &run.commits);
        }
        ending.push_back(tokio::spawn(async move {
            let sent = Instant::now();
            let outcome = if abort {
                open.abort().await
            } else {
                let outcome = open.commit().await;
                if outcome.is_err() {
                    let _ = open.abort().await;
                }
                outcome
            };
            Ending {
                abort,
                outcome,
                payloads,
                took: sent.elapsed(),
            }
        }));
        counts.cycles += cycle.elapsed();
    }
    for end in ending {
        settle(end.await, index, &mut counts, &run.commits);
    }
    if let Some(opening) = next.take()
        && let Ok(Ok(unused)) = opening.await
    {
        let _ = unused.abort().await;
    }
    Ok(counts)
}

/// A transaction ended in the background.
struct Ending {
    abort: bool,
    outcome: Result<(), Error>,
    /// Its payloads acknowledged, with when each ack was answered.
    payloads: Vec<(String, Duration)>,
    took: Duration,
}

/// Counts an ended transaction of consumer `index`: a commit's payloads are committed.
fn settle(
    end: Result<Ending, tokio::task::JoinError>,
    index: usize,
    counts: &mut Counts,
    commits: &Mutex<Commits>,
) {
    let end = end.expect("the task ending a transaction");
    if end.abort {
        counts.slowest_abort = counts.slowest_abort.max(end.took);
        counts.txns_aborted += 1;
        return;
    }
    counts.slowest_commit = counts.slowest_commit.max(end.took);
    match end.outcome {
        Ok(()) => {
            counts.txns_committed += 1;
            counts.committed += end.payloads.len() as u64;
            let mut commits = commits.lock();
            for (payload, acked_at) in end.payloads {
                commits.commit(
                    payload,
                    Commit {
                        consumer: index,
                        acked_at,
                    },
                );
            }
        }
        Err(error) => {
            counts.commits_refused += 1;
            tracing::info!(%error, "commit refused");
        }
    }
}

/// Opens a transaction and registers `subscription` of `topic` in it.
async fn open_transaction(
    coordinator: &TransactionCoordinator,
    topic: &str,
    subscription: &str,
) -> Result<Transaction, Error> {
    let txn = coordinator.new_transaction(Duration::from_secs(60)).await?;
    txn.add_subscription(topic, subscription).await?;
    Ok(txn)
}

/// [`open_transaction`] with owned arguments, for a task.
async fn open_transaction_owned(
    coordinator: TransactionCoordinator,
    topic: String,
    subscription: String,
) -> Result<Transaction, Error> {
    open_transaction(&coordinator, &topic, &subscription).await
}

/// Blocked periods of one consumer, from samples of its stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Periods {
    /// How many times it became blocked.
    pub count: u32,
    /// Their total length.
    pub total: Duration,
    /// The longest one.
    pub longest: Duration,
    /// Each period: when it was first seen (from the start of watching) and how long it lasted
    /// (until the first sample that saw it unblocked, or the end of watching).
    pub periods: Vec<(Duration, Duration)>,
    since: Option<Duration>,
}

impl Periods {
    /// Takes one sample, `at` from the start of watching.
    pub fn observe(&mut self, at: Duration, blocked: bool) {
        match (blocked, self.since) {
            (true, None) => {
                self.since = Some(at);
                self.count += 1;
            }
            (false, Some(start)) => self.end(start, at),
            _ => {}
        }
    }

    /// Ends a period still going on at `at`.
    pub fn finish(&mut self, at: Duration) {
        if let Some(start) = self.since {
            self.end(start, at);
        }
    }

    fn end(&mut self, start: Duration, at: Duration) {
        let length = at.saturating_sub(start);
        self.total += length;
        self.longest = self.longest.max(length);
        self.periods.push((start, length));
        self.since = None;
    }
}

/// The blocked periods seen in the admin stats while a run goes on: of the subscription
/// (any consumer blocked: `count`, `total`, `longest`, `periods`) and of each consumer.
#[derive(Debug, Clone, Default)]
pub struct BlockedPeriods {
    /// How many times a consumer became blocked while none was.
    pub count: u32,
    /// The total time some consumer was blocked.
    pub total: Duration,
    /// The longest time some consumer was blocked without a break.
    pub longest: Duration,
    /// The largest unacked count of a consumer seen.
    pub max_unacked: i64,
    /// How many stats were read.
    pub samples: u32,
    /// Each period with some consumer blocked: when it was first seen (from the start of
    /// watching) and how long it lasted.
    pub periods: Vec<(Duration, Duration)>,
    /// Each consumer's own periods, by its name in the stats (a consumer that leaves the
    /// stats counts as not blocked).
    pub consumers: BTreeMap<String, Periods>,
    any: Periods,
}

impl BlockedPeriods {
    /// Takes one sample of the subscription's consumers, `at` from the start of watching.
    pub fn observe(&mut self, at: Duration, consumers: &[ConsumerStats]) {
        self.samples += 1;
        for (name, periods) in &mut self.consumers {
            if !consumers.iter().any(|c| &c.consumer_name == name) {
                periods.observe(at, false);
            }
        }
        for consumer in consumers {
            self.max_unacked = self.max_unacked.max(consumer.unacked_messages);
            self.consumers
                .entry(consumer.consumer_name.clone())
                .or_default()
                .observe(at, consumer.blocked_consumer_on_unacked_msgs);
        }
        let blocked = consumers.iter().any(|c| c.blocked_consumer_on_unacked_msgs);
        self.any.observe(at, blocked);
        self.publish();
    }

    /// Ends the periods still going on at `at`.
    pub fn finish(&mut self, at: Duration) {
        for periods in self.consumers.values_mut() {
            periods.finish(at);
        }
        self.any.finish(at);
        self.publish();
    }

    fn publish(&mut self) {
        self.count = self.any.count;
        self.total = self.any.total;
        self.longest = self.any.longest;
        self.periods.clone_from(&self.any.periods);
    }
}

/// Polls a subscription's stats every `every` until stopped.
#[derive(Debug)]
pub struct Watcher {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<BlockedPeriods>,
}

/// Starts watching `topic` / `subscription`.
pub fn watch(admin: PulsarAdmin, topic: String, subscription: String, every: Duration) -> Watcher {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut periods = BlockedPeriods::default();
        let watching = Instant::now();
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.changed() => break,
            }
            let Ok(stats) = admin.topic_stats(&topic).await else {
                continue;
            };
            let consumers = stats
                .subscription(&subscription)
                .map(|s| s.consumers.as_slice())
                .unwrap_or_default();
            periods.observe(watching.elapsed(), consumers);
        }
        periods.finish(watching.elapsed());
        periods
    });
    Watcher { stop, task }
}

impl Watcher {
    /// Stops and returns what was seen.
    pub async fn finish(self) -> BlockedPeriods {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The subscription's unacked count and backlog once they settle at 0, or as they are after
/// `patience` (the broker's counters settle shortly after the last commit).
pub async fn settled_counts(
    admin: &PulsarAdmin,
    topic: &str,
    subscription: &str,
    patience: Duration,
) -> (i64, i64) {
    let settle = Instant::now();
    let (mut unacked, mut backlog) = (i64::MAX, i64::MAX);
    loop {
        if let Ok(stats) = admin.topic_stats(topic).await
            && let Some(sub) = stats.subscription(subscription)
        {
            unacked = sub.unacked_messages;
            backlog = sub.msg_backlog;
            if unacked == 0 && backlog == 0 {
                break;
            }
        }
        if settle.elapsed() >= patience {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (unacked, backlog)
}

#[cfg(test)]
mod tests {
    use super::*;

    use pulsar_wire_emulator::{Emulator, EmulatorConfig};

    #[test]
    fn the_shapes_send_whole_batches_at_their_rate() {
        let steady = Shape::steady(Duration::from_secs(60));
        assert_eq!(
            (steady.tick(), steady.messages()),
            (Duration::from_millis(50), 8_400)
        );
        assert_eq!(Shape::bulk(2_100).messages(), 2_100);
        let shared = Shape::shared(2, Duration::from_secs(60));
        assert_eq!(shared.tick(), Duration::from_nanos(43_333_333));
        // 1,385 batches of 13: the first whole number of batches with at least 18,000.
        assert_eq!(shared.messages(), 18_005);
        assert_eq!(
            (shared.consumers, shared.txn_every, shared.abort_every),
            (2, 6, 4)
        );
    }

    fn commit(consumer: usize, millis: u64) -> Commit {
        Commit {
            consumer,
            acked_at: Duration::from_millis(millis),
        }
    }

    #[test]
    fn a_payload_committed_again_names_both_commits() {
        let mut commits = Commits::default();
        assert!(commits.commit("p0".into(), commit(0, 100)));
        assert!(commits.commit("p1".into(), commit(1, 105)));
        assert!(!commits.commit("p0".into(), commit(1, 90)));
        assert!(!commits.commit("p0".into(), commit(0, 400)));
        assert!(commits.commit("p2".into(), commit(0, 500)));
        assert_eq!(commits.distinct(), 3);
        assert_eq!(commits.committed_again(), 1);
        let doubles = commits.doubles();
        assert_eq!(doubles.len(), 2);
        assert_eq!(doubles[0].payload, "p0");
        assert_eq!(
            (doubles[0].first, doubles[0].second),
            (commit(0, 100), commit(1, 90))
        );
        assert_eq!(doubles[0].apart(), Duration::from_millis(10));
        assert!(doubles[0].across_consumers());
        assert_eq!(doubles[1].apart(), Duration::from_millis(300));
        assert!(!doubles[1].across_consumers());
    }

    fn stats(name: &str, blocked: bool, unacked: i64) -> ConsumerStats {
        ConsumerStats {
            consumer_name: name.into(),
            unacked_messages: unacked,
            blocked_consumer_on_unacked_msgs: blocked,
            available_permits: 0,
            msg_out_counter: 0,
        }
    }

    #[test]
    fn blocked_periods_are_measured_per_consumer_and_for_the_subscription() {
        let s = Duration::from_secs;
        let mut blocked = BlockedPeriods::default();
        blocked.observe(s(0), &[stats("c0", false, 3), stats("c1", false, 5)]);
        blocked.observe(s(1), &[stats("c0", true, 37), stats("c1", false, 5)]);
        blocked.observe(s(2), &[stats("c0", true, 37), stats("c1", true, 38)]);
        blocked.observe(s(3), &[stats("c0", false, 10), stats("c1", true, 37)]);
        blocked.observe(s(5), &[stats("c0", false, 10), stats("c1", false, 2)]);
        blocked.observe(s(6), &[stats("c0", true, 37), stats("c1", false, 2)]);
        // c0 leaves the stats (it closed): its period ends there.
        blocked.observe(s(7), &[stats("c1", true, 37)]);
        blocked.finish(s(9));
        assert_eq!(blocked.samples, 7);
        assert_eq!(blocked.max_unacked, 38);
        let c0 = &blocked.consumers["c0"];
        assert_eq!(c0.periods, vec![(s(1), s(2)), (s(6), s(1))]);
        assert_eq!((c0.count, c0.total, c0.longest), (2, s(3), s(2)));
        let c1 = &blocked.consumers["c1"];
        assert_eq!(c1.periods, vec![(s(2), s(3)), (s(7), s(2))]);
        assert_eq!((c1.count, c1.total, c1.longest), (2, s(5), s(3)));
        // Some consumer blocked: 1 s to 5 s, then 6 s to the end.
        assert_eq!(blocked.periods, vec![(s(1), s(4)), (s(6), s(3))]);
        assert_eq!(
            (blocked.count, blocked.total, blocked.longest),
            (2, s(7), s(4))
        );
    }

    async fn emulator_client(limit: u32) -> (Emulator, Client, &'static str) {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("emulator");
        let topic = "persistent://public/default/steady";
        emulator.create_topic(topic, 0).expect("topic");
        emulator
            .set_max_unacked_messages(topic, limit)
            .expect("limit");
        let client = Client::builder(emulator.endpoint())
            .build()
            .await
            .expect("client");
        (emulator, client, topic)
    }

    /// The steady shape on the embedded emulator: drains with the fix, stalls without.
    async fn on_emulator(legacy: bool) -> ClientReport {
        let (_emulator, client, topic) = emulator_client(50).await;
        let shape = Shape {
            timeout: Duration::from_secs(12),
            ..Shape::steady(Duration::from_secs(6))
        };
        let report = run(&client, topic, "s", &shape, legacy, None)
            .await
            .expect("run");
        client.close().await;
        report
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_steady_shape_drains_on_the_emulator_and_stalls_with_the_legacy_consumer() {
        let fixed = on_emulator(false).await;
        assert!(fixed.drained, "{fixed:?}");
        assert_eq!(fixed.committed, fixed.produced);
        assert_eq!(
            fixed.duplicates + fixed.commits_refused + fixed.acks_refused,
            0
        );
        assert_eq!(fixed.committed_by, vec![fixed.committed]);
        let legacy = on_emulator(true).await;
        assert!(!legacy.drained, "{legacy:?}");
        assert!(legacy.committed < legacy.produced / 2, "{legacy:?}");
    }

    /// Issue 27's shape with three consumers, 3 s long, on the emulator: every consumer runs
    /// its own loop and commits its share, and the report adds up. (Whether it drains is the
    /// client's business, not the harness's.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shared_shape_runs_three_consumers_on_the_emulator() {
        let (_emulator, client, topic) = emulator_client(SHARED_LIMIT).await;
        let shape = Shape {
            timeout: Duration::from_secs(9),
            ..Shape::shared(3, Duration::from_secs(3))
        };
        let report = run(&client, topic, "s", &shape, false, None)
            .await
            .expect("run");
        client.close().await;
        println!("{report:?}");
        assert_eq!(report.produced, shape.messages(), "{report:?}");
        assert_eq!(report.committed_by.len(), 3, "{report:?}");
        assert!(report.committed_by.iter().all(|&n| n > 0), "{report:?}");
        assert_eq!(
            report.committed_by.iter().sum::<u64>(),
            report.committed + report.duplicates,
            "{report:?}"
        );
        assert_eq!(report.double_commits.len() as u64, report.duplicates);
        assert!(report.committed_again <= report.duplicates);
        assert!(report.txns_aborted > 0, "{report:?}");
    }
}
