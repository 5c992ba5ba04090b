//! The steady transactional shape of issue "transactional acks that never stall": a producer
//! sends at a steady rate in batches, one Shared consumer keeps up and acknowledges every
//! message in a transaction (one batch index per ack): every few messages received it opens a
//! transaction, acknowledges them in it all at once, waits for every answer and ends it in the
//! background (at most two ends in flight) while it goes on receiving, every third one aborted. It runs against a real broker (or the emulator), with
//! `pulsar-wire` ([`run`]) or any other client (the caller starts it and calls [`watch`]).
//!
//! [`Watcher`] polls the admin stats while the run goes on and measures the consumer's blocked
//! periods (`blockedConsumerOnUnackedMsgs`), so both clients are measured the same way.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pulsar_wire::{
    BatchingOptions, Client, ConsumerOptions, Error, InitialPosition, OutgoingMessage,
    ProducerOptions, SubType, Transaction, TransactionCoordinator,
};

use crate::pulsar_admin::PulsarAdmin;

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How long the producer sends.
    pub produce_for: Duration,
    /// Messages per second.
    pub rate: u32,
    /// Messages per producer batch.
    pub batch: usize,
    /// Messages acknowledged per transaction.
    pub txn_every: usize,
    /// Every `abort_every`-th transaction is aborted (0: none).
    pub abort_every: usize,
    /// Everything is produced before the consumer starts (the bulk shape).
    pub produce_first: bool,
    /// The run gives up after this long.
    pub timeout: Duration,
    /// The application stops receiving and acknowledging once for the second value, when the
    /// first has passed since the start (a pause such as a long GC or a slow downstream call).
    pub pause: Option<(Duration, Duration)>,
}

impl Shape {
    /// The steady shape: 140 msg/s in batches of 7 for `produce_for`, 5 acks per
    /// transaction, every third aborted.
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

    /// How many messages the producer sends.
    pub fn messages(&self) -> u64 {
        let per_tick = self.per_tick() as u64;
        self.ticks() * per_tick
    }

    fn per_tick(&self) -> usize {
        // Ticks of 50 ms: a full batch per tick at 140 msg/s.
        (self.rate as usize / 20).max(1)
    }

    fn ticks(&self) -> u64 {
        (self.produce_for.as_millis() / 50) as u64
    }
}

/// What one run measured on the client side.
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    /// Messages produced.
    pub produced: u64,
    /// Distinct payloads committed.
    pub committed: u64,
    /// Payloads committed a second time.
    pub duplicates: u64,
    /// Transactions committed.
    pub txns_committed: u64,
    /// Transactions aborted on purpose.
    pub txns_aborted: u64,
    /// Transactional acks the broker refused.
    pub acks_refused: u64,
    /// Transactional acks the client refused before sending (already acknowledged).
    pub acks_refused_by_client: u64,
    /// Commits the coordinator refused.
    pub commits_refused: u64,
    /// From the first send (the bulk shape: from subscribing) to the last payload committed.
    pub drain: Duration,
    /// Every payload was committed before the timeout.
    pub drained: bool,
    /// Messages the consumer recognised as redeliveries of committed messages.
    pub committed_redeliveries: u64,
    /// Duplicate deliveries the consumer recognised (and did not hand over again).
    pub duplicates_hidden: u64,
    /// `REDELIVER_UNACKNOWLEDGED_MESSAGES` requests the consumer sent.
    pub redelivery_requests: u64,
    /// Of those, the ones that only unblocked the consumer (they replay nothing).
    pub unblocks: u64,
    /// Transactional acks held back until their batch was free or their commit.
    pub acks_held_back: u64,
    /// Messages the consumer handed to the application again itself.
    pub handed_again: u64,
    /// The subscription's unacked count once settled, the consumer still connected (`None`
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
    /// The longest wait for a message while payloads were still outstanding, and when it
    /// began (from the start).
    pub longest_receive_gap: (Duration, Duration),
    /// The mean time from a transaction taken to its end answered (its acks, then its
    /// commit or abort): the consumer keeps up while `txn_every` messages take less than
    /// this at the producer's rate, redeliveries included.
    pub mean_cycle: Duration,
}

/// Runs the shape with `pulsar-wire` on `topic` / `subscription`. `legacy` delivers
/// redeliveries of committed messages to the application as before the fix (tests only).
/// With `admin`, the settled unacked count and backlog are read before the consumer closes.
///
/// # Errors
/// When the client cannot connect, subscribe or produce.
pub async fn run(
    client: &Client,
    topic: &str,
    subscription: &str,
    shape: &Shape,
    legacy: bool,
    admin: Option<&PulsarAdmin>,
) -> Result<ClientReport, Error> {
    let subscribe = || {
        client.subscribe(
            topic,
            subscription,
            ConsumerOptions::default()
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest)
                .legacy_committed_redeliveries(legacy),
        )
    };
    // The steady shape subscribes first; the bulk one after everything is produced (a
    // subscription from the earliest message sees it all).
    let early = if shape.produce_first {
        None
    } else {
        Some(subscribe().await?)
    };
    let producer = client
        .create_producer(
            topic,
            ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(shape.batch)
                    .max_delay(Duration::from_millis(50)),
            ),
        )
        .await?;
    let coordinator = client.transaction_coordinator().await?;
    let started = Instant::now();
    let produced = Arc::new(Mutex::new(None::<u64>));
    let mut producing = Some({
        let shape = shape.clone();
        let produced = Arc::clone(&produced);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            let mut sends = Vec::new();
            let mut next = 0u64;
            for _ in 0..shape.ticks() {
                tick.tick().await;
                let payloads: Vec<_> = (0..shape.per_tick())
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
            let _ = producer.close().await;
        })
    });
    if shape.produce_first
        && let Some(task) = producing.take()
    {
        let _ = task.await;
    }
    let consumer = match early {
        Some(consumer) => consumer,
        None => subscribe().await?,
    };
    let started = if shape.produce_first {
        Instant::now()
    } else {
        started
    };
    let mut report = ClientReport::default();
    let mut committed = HashSet::new();
    let mut batch = Vec::with_capacity(shape.txn_every);
    let mut ended = 0usize;
    let deadline = started + shape.timeout;
    let mut last_message = Instant::now();
    let mut pause = shape.pause;
    let mut cycles = Duration::ZERO;
    let mut next: Option<tokio::task::JoinHandle<Result<Transaction, Error>>> = None;
    let mut ending: std::collections::VecDeque<tokio::task::JoinHandle<Ending>> =
        std::collections::VecDeque::new();
    loop {
        if let Some((at, length)) = pause
            && started.elapsed() >= at
        {
            // The application's own pause, not a wait for the client: nothing is received
            // or acknowledged meanwhile.
            pause = None;
            tokio::time::sleep(length).await;
            last_message = Instant::now();
        }
        while ending.front().is_some_and(|end| end.is_finished()) {
            let end = ending.pop_front().expect("a finished end");
            settle(
                end.await.expect("the task ending a transaction"),
                &mut report,
                &mut committed,
            );
        }
        let done_producing = *produced.lock();
        if let Some(total) = done_producing
            && committed.len() as u64 >= total
        {
            report.produced = total;
            report.drained = true;
            report.drain = started.elapsed();
            break;
        }
        if Instant::now() >= deadline {
            report.produced = done_producing.unwrap_or(0);
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
            if gap > report.longest_receive_gap.0 {
                report.longest_receive_gap = (gap, last_message - started);
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
        let acks = futures_util::future::join_all(
            batch.iter().map(|message| consumer.ack_in(&open, message)),
        )
        .await;
        report.slowest_ack = report.slowest_ack.max(sent.elapsed());
        let mut payloads = Vec::with_capacity(batch.len());
        for (message, acked) in batch.drain(..).zip(acks) {
            match acked {
                Ok(()) => {
                    payloads.push(String::from_utf8_lossy(message.payload()).into_owned());
                }
                Err(Error::Ack(error)) => {
                    report.acks_refused_by_client += 1;
                    tracing::debug!(%error, "ack refused by the client");
                }
                Err(error) => {
                    report.acks_refused += 1;
                    tracing::info!(%error, "ack refused");
                }
            }
        }
        ended += 1;
        let abort = shape.abort_every > 0 && ended.is_multiple_of(shape.abort_every);
        // The transaction ends in the background while the next messages are received and
        // acknowledged; at most two ends are in flight.
        while ending.len() >= 2 {
            let oldest = ending.pop_front().expect("two in flight");
            settle(
                oldest.await.expect("the task ending a transaction"),
                &mut report,
                &mut committed,
            );
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
        cycles += cycle.elapsed();
    }
    for end in ending {
        settle(
            end.await.expect("the task ending a transaction"),
            &mut report,
            &mut committed,
        );
    }
    if let Some(opening) = next.take()
        && let Ok(Ok(unused)) = opening.await
    {
        let _ = unused.abort().await;
    }
    report.committed = committed.len() as u64;
    report.mean_cycle = cycles / u32::try_from(ended.max(1)).unwrap_or(u32::MAX);
    if let Some(admin) = admin {
        let (unacked, backlog) =
            settled_counts(admin, topic, subscription, Duration::from_secs(10)).await;
        report.final_unacked = Some(unacked);
        report.final_backlog = Some(backlog);
    }
    let stats = consumer.stats();
    report.committed_redeliveries = stats.committed_redeliveries;
    report.duplicates_hidden = stats.duplicates;
    report.redelivery_requests = stats.redelivery_requests;
    report.unblocks = stats.unblocks;
    report.acks_held_back = stats.acks_held_back;
    report.handed_again = stats.handed_again;
    if let Some(task) = producing {
        task.abort();
    }
    consumer.close().await?;
    Ok(report)
}

/// A transaction ended in the background.
struct Ending {
    abort: bool,
    outcome: Result<(), Error>,
    payloads: Vec<String>,
    took: Duration,
}

/// Counts an ended transaction: a commit's payloads are committed.
fn settle(end: Ending, report: &mut ClientReport, committed: &mut HashSet<String>) {
    if end.abort {
        report.slowest_abort = report.slowest_abort.max(end.took);
        report.txns_aborted += 1;
        return;
    }
    report.slowest_commit = report.slowest_commit.max(end.took);
    match end.outcome {
        Ok(()) => {
            report.txns_committed += 1;
            for payload in end.payloads {
                if !committed.insert(payload) {
                    report.duplicates += 1;
                }
            }
        }
        Err(error) => {
            report.commits_refused += 1;
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

/// The consumer's blocked periods seen in the admin stats while a run goes on.
#[derive(Debug, Clone, Default)]
pub struct BlockedPeriods {
    /// How many times the consumer became blocked.
    pub count: u32,
    /// Their total length.
    pub total: Duration,
    /// The longest one.
    pub longest: Duration,
    /// The largest unacked count seen.
    pub max_unacked: i64,
    /// How many stats were read.
    pub samples: u32,
    /// Each period: when it was first seen (from the start of watching) and how long it lasted.
    pub periods: Vec<(Duration, Duration)>,
}

impl BlockedPeriods {
    fn ended(&mut self, at: Duration, length: Duration) {
        self.total += length;
        self.longest = self.longest.max(length);
        self.periods.push((at, length));
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
        let mut since: Option<Instant> = None;
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
            periods.samples += 1;
            let blocked = stats.subscription(&subscription).is_some_and(|s| {
                s.consumers.iter().any(|c| {
                    periods.max_unacked = periods.max_unacked.max(c.unacked_messages);
                    c.blocked_consumer_on_unacked_msgs
                })
            });
            match (blocked, since) {
                (true, None) => {
                    since = Some(Instant::now());
                    periods.count += 1;
                }
                (false, Some(start)) => {
                    periods.ended(start - watching, start.elapsed());
                    since = None;
                }
                _ => {}
            }
        }
        if let Some(start) = since {
            periods.ended(start - watching, start.elapsed());
        }
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
    use pulsar_wire::ConnectOptions;
    use pulsar_wire_emulator::{Emulator, EmulatorConfig};

    /// The steady shape on the embedded emulator: drains with the fix, stalls without.
    async fn on_emulator(legacy: bool) -> ClientReport {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("emulator");
        let topic = "persistent://public/default/steady";
        emulator.create_topic(topic, 0).expect("topic");
        emulator.set_max_unacked_messages(topic, 50).expect("limit");
        let client = Client::connect(ConnectOptions::new(emulator.endpoint()).expect("url"))
            .await
            .expect("client");
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
        let legacy = on_emulator(true).await;
        assert!(!legacy.drained, "{legacy:?}");
        assert!(legacy.committed < legacy.produced / 2, "{legacy:?}");
    }
}
