//! A plain Shared work queue: N consumers on one Shared subscription, M messages, and a handler
//! that takes a fixed time per message before an ordinary ack. It shows whether a message one
//! consumer holds (received, not acknowledged yet) is handed to another consumer meanwhile, which
//! a client's own redelivery requests cause in a Shared subscription (the broker replays to any
//! consumer).
//!
//! Each consumer runs its handler on up to [`Shape::concurrency`] messages at once: it takes the
//! next message from its client only when a handler is free, so the rest wait in the client's
//! receiver queue, and every message it takes is held for [`Shape::handle_for`] while the other
//! consumers keep receiving. Issue 27's shape ([`Shape::standard`]): 4 consumers, 2,000 messages,
//! 2 s per message, 50 at once per consumer: 2,000 × 2 s / (4 × 50) = 20 s of handling.
//!
//! Every delivery to the application is recorded as a [`Receipt`] (consumer, received at, acked
//! at); [`analyse`] finds the payloads received by one consumer while another held them, the
//! payloads acknowledged more than once and those never acknowledged.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, ConsumerOptions, Error, InitialPosition, OutgoingMessage,
    Producer, ProducerOptions, SubType,
};
use tokio::sync::Semaphore;

use crate::pulsar_admin::PulsarAdmin;
use crate::txn_steady::{consumer_name, settled_counts};

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Consumers on the one Shared subscription.
    pub consumers: usize,
    /// Messages produced (all at once, after every consumer subscribed).
    pub messages: u32,
    /// How long the handler takes per message before it acknowledges it.
    pub handle_for: Duration,
    /// Messages each consumer handles at once.
    pub concurrency: usize,
    /// Messages per producer batch (1: no batching).
    pub batch: usize,
    /// The consumers' receiver queue (`None`: the client's default).
    pub receiver_queue: Option<u32>,
    /// Once every payload is acknowledged, the consumers keep receiving this long (copies
    /// still coming are recorded and handled), then stop and finish their handlers.
    pub grace: Duration,
    /// The run gives up after this long.
    pub timeout: Duration,
}

impl Shape {
    /// `consumers` consumers, `messages` messages, `handle_for` per message, 50 at once per
    /// consumer, unbatched, the client's receiver queue; a grace of one handling time; a
    /// timeout of three times the handling time the shape needs, plus a minute.
    pub fn new(consumers: usize, messages: u32, handle_for: Duration) -> Self {
        let mut shape = Self {
            consumers,
            messages,
            handle_for,
            concurrency: 50,
            batch: 1,
            receiver_queue: None,
            grace: handle_for,
            timeout: Duration::ZERO,
        };
        shape.timeout = shape.default_timeout();
        shape
    }

    /// The handling time the shape needs when the messages are spread evenly: rounds of
    /// `concurrency` messages per consumer.
    pub fn handling_time(&self) -> Duration {
        let slots = (self.consumers.max(1) * self.concurrency.max(1)) as u32;
        self.handle_for * self.messages.div_ceil(slots)
    }

    /// Three times [`Shape::handling_time`], plus a minute.
    pub fn default_timeout(&self) -> Duration {
        self.handling_time() * 3 + Duration::from_secs(60)
    }

    /// Issue 27's shape: 4 consumers, 2,000 messages, 2 s per message.
    pub fn standard() -> Self {
        Self::new(4, 2_000, Duration::from_secs(2))
    }
}

/// One delivery of a payload to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The consumer's index.
    pub consumer: usize,
    /// When the application received it (from the start of the run).
    pub received_at: Duration,
    /// When its ack succeeded (`None`: not acknowledged, or the ack failed).
    pub acked_at: Option<Duration>,
}

/// A payload received by a second consumer while a first one held it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOver {
    /// The payload.
    pub payload: String,
    /// The consumer that held it.
    pub holder: usize,
    /// When it received it.
    pub held_from: Duration,
    /// When it acknowledged it (`None`: never).
    pub held_until: Option<Duration>,
    /// The consumer that received it meanwhile.
    pub other: usize,
    /// When.
    pub received_at: Duration,
}

/// What [`analyse`] finds in the receipts of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Analysis {
    /// Deliveries to the application.
    pub received: u64,
    /// Payloads received by a second consumer while a first one held them (one entry per
    /// payload: the first such delivery).
    pub handed_over: Vec<HandOver>,
    /// Payloads received again by the consumer holding them.
    pub received_again_by_holder: u64,
    /// Payloads acknowledged more than once (by one consumer or several).
    pub acked_more_than_once: u64,
    /// Payloads produced and never acknowledged.
    pub never_acked: u64,
}

/// Finds, in every payload's receipts, the deliveries to one consumer while another held it
/// (received between the holder's receipt and its ack, or the `end` when it never acknowledged
/// it), the payloads acknowledged more than once, and the `produced` payloads never
/// acknowledged.
pub fn analyse<'a>(
    produced: impl IntoIterator<Item = &'a str>,
    receipts: &HashMap<String, Vec<Receipt>>,
    end: Duration,
) -> Analysis {
    let mut analysis = Analysis::default();
    let mut payloads: Vec<_> = receipts.iter().collect();
    payloads.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (payload, list) in payloads {
        analysis.received += list.len() as u64;
        if list.iter().filter(|r| r.acked_at.is_some()).count() > 1 {
            analysis.acked_more_than_once += 1;
        }
        let held_while = |holder: &Receipt, other: &Receipt| {
            holder.received_at <= other.received_at
                && other.received_at < holder.acked_at.unwrap_or(end)
        };
        let pairs = || {
            list.iter().enumerate().flat_map(move |(i, holder)| {
                list.iter()
                    .enumerate()
                    .filter(move |&(j, other)| i != j && held_while(holder, other))
                    .map(move |(_, other)| (holder, other))
            })
        };
        if let Some((holder, other)) = pairs().find(|(h, o)| h.consumer != o.consumer) {
            analysis.handed_over.push(HandOver {
                payload: payload.clone(),
                holder: holder.consumer,
                held_from: holder.received_at,
                held_until: holder.acked_at,
                other: other.consumer,
                received_at: other.received_at,
            });
        }
        if pairs().any(|(h, o)| h.consumer == o.consumer) {
            analysis.received_again_by_holder += 1;
        }
    }
    analysis.never_acked = produced
        .into_iter()
        .filter(|payload| {
            receipts
                .get(*payload)
                .is_none_or(|list| list.iter().all(|r| r.acked_at.is_none()))
        })
        .count() as u64;
    analysis
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Messages produced.
    pub produced: u64,
    /// Deliveries to the application per consumer.
    pub received_by: Vec<u64>,
    /// What the receipts show.
    pub analysis: Analysis,
    /// Every delivery to the application, by payload.
    pub receipts: HashMap<String, Vec<Receipt>>,
    /// Acks that failed.
    pub acks_failed: u64,
    /// Every payload was acknowledged before the timeout.
    pub finished: bool,
    /// From the first send to the last payload's first ack (or to the timeout).
    pub total: Duration,
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
}

/// What the consumers' loops share.
struct Queue {
    started: Instant,
    produced: usize,
    receipts: Mutex<HashMap<String, Vec<Receipt>>>,
    acked: Mutex<HashSet<String>>,
    all_acked_at: Mutex<Option<Duration>>,
    acks_failed: Mutex<u64>,
}

impl Queue {
    fn received(&self, payload: &str, consumer: usize) -> usize {
        let mut receipts = self.receipts.lock();
        let list = receipts.entry(payload.to_owned()).or_default();
        list.push(Receipt {
            consumer,
            received_at: self.started.elapsed(),
            acked_at: None,
        });
        list.len() - 1
    }

    fn acked(&self, payload: &str, receipt: usize, acked: Result<(), Error>) {
        let at = self.started.elapsed();
        if let Err(error) = acked {
            *self.acks_failed.lock() += 1;
            tracing::info!(%error, payload, "ack failed");
            return;
        }
        if let Some(r) = self
            .receipts
            .lock()
            .get_mut(payload)
            .and_then(|list| list.get_mut(receipt))
        {
            r.acked_at = Some(at);
        }
        let mut acked = self.acked.lock();
        acked.insert(payload.to_owned());
        if acked.len() >= self.produced {
            self.all_acked_at.lock().get_or_insert(at);
        }
    }

    /// Whether the consumers stop receiving: the grace after the last payload's first ack
    /// has passed, or the deadline.
    fn done(&self, shape: &Shape) -> bool {
        let now = self.started.elapsed();
        now >= shape.timeout
            || self
                .all_acked_at
                .lock()
                .is_some_and(|at| now >= at + shape.grace)
    }
}

/// Runs the shape with `pulsar-wire` on `topic` / `subscription`. With `admin`, the settled
/// unacked count and backlog are read before the consumers close.
///
/// # Errors
/// When the client cannot subscribe or produce, or a consumer's receive fails.
pub async fn run(
    client: &Client,
    topic: &str,
    subscription: &str,
    shape: &Shape,
    admin: Option<&PulsarAdmin>,
) -> Result<Report, Error> {
    let mut consumers = Vec::with_capacity(shape.consumers);
    for index in 0..shape.consumers.max(1) {
        let mut options = ConsumerOptions::default()
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest)
            .name(consumer_name(index));
        if let Some(size) = shape.receiver_queue {
            options = options.receiver_queue_size(size);
        }
        consumers.push(Arc::new(
            Consumer::builder(client, topic, subscription)
                .options(options)
                .build()
                .await?,
        ));
    }
    let producer_options = if shape.batch > 1 {
        ProducerOptions::default().batching(
            BatchingOptions::default()
                .max_messages(shape.batch)
                .max_delay(Duration::from_millis(10)),
        )
    } else {
        ProducerOptions::default().no_batching()
    };
    let producer = Producer::builder(client, topic)
        .options(producer_options)
        .build()
        .await?;
    let started = Instant::now();
    let payloads: Vec<String> = (0..shape.messages).map(|i| format!("w{i}")).collect();
    let sends = futures_util::future::join_all(
        payloads
            .iter()
            .map(|payload| producer.send(OutgoingMessage::new(payload.clone()))),
    )
    .await;
    let produced: Vec<&str> = payloads
        .iter()
        .zip(&sends)
        .filter(|(_, sent)| sent.is_ok())
        .map(|(payload, _)| payload.as_str())
        .collect();
    if let Some(Err(error)) = sends.iter().find(|sent| sent.is_err()) {
        tracing::warn!(%error, failed = payloads.len() - produced.len(), "sends failed");
    }
    let _ = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
    let queue = Arc::new(Queue {
        started,
        produced: produced.len(),
        receipts: Mutex::new(HashMap::new()),
        acked: Mutex::new(HashSet::new()),
        all_acked_at: Mutex::new(None),
        acks_failed: Mutex::new(0),
    });
    let loops = consumers.iter().enumerate().map(|(index, consumer)| {
        tokio::spawn(consume(
            index,
            Arc::clone(consumer),
            shape.clone(),
            Arc::clone(&queue),
        ))
    });
    let mut report = Report::default();
    let mut failed = None;
    for received in futures_util::future::join_all(loops).await {
        match received.expect("a consumer's loop") {
            Ok(received) => report.received_by.push(received),
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
    }
    if let Some(error) = failed {
        return Err(error);
    }
    let end = queue.started.elapsed();
    report.produced = produced.len() as u64;
    let all_acked_at = *queue.all_acked_at.lock();
    report.finished = all_acked_at.is_some();
    report.total = all_acked_at.unwrap_or(end);
    report.acks_failed = *queue.acks_failed.lock();
    report.receipts = std::mem::take(&mut *queue.receipts.lock());
    report.analysis = analyse(produced, &report.receipts, end);
    if let Some(admin) = admin {
        let (unacked, backlog) =
            settled_counts(admin, topic, subscription, Duration::from_secs(10)).await;
        report.final_unacked = Some(unacked);
        report.final_backlog = Some(backlog);
    }
    for consumer in &consumers {
        let stats = consumer.stats();
        report.redelivery_requests += stats.redelivery_requests;
        report.unblocks += stats.unblocks;
        report.acks_held_back += stats.acks_held_back;
        report.handed_again += stats.handed_again;
    }
    for consumer in &consumers {
        consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    }
    Ok(report)
}

/// One consumer's loop: takes a message whenever one of its handlers is free and handles it
/// (waits [`Shape::handle_for`], then acknowledges it), until [`Queue::done`]; then waits for its
/// handlers. Returns how many messages it received.
async fn consume(
    index: usize,
    consumer: Arc<Consumer>,
    shape: Shape,
    queue: Arc<Queue>,
) -> Result<u64, Error> {
    let handlers = Arc::new(Semaphore::new(shape.concurrency.max(1)));
    let mut running = tokio::task::JoinSet::new();
    let mut received = 0;
    let wait = Duration::from_millis(200);
    while !queue.done(&shape) {
        let Ok(handler) = tokio::time::timeout(wait, Arc::clone(&handlers).acquire_owned()).await
        else {
            continue;
        };
        let handler = handler.expect("the semaphore is never closed");
        let message = match tokio::time::timeout(wait, consumer.receive()).await {
            Ok(Ok(message)) => message,
            Ok(Err(error)) => return Err(error),
            Err(_) => continue,
        };
        received += 1;
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        let receipt = queue.received(&payload, index);
        let (consumer, queue, handle_for) =
            (Arc::clone(&consumer), Arc::clone(&queue), shape.handle_for);
        running.spawn(async move {
            // The application's work on the message.
            tokio::time::sleep(handle_for).await;
            let acked = consumer.ack(&message).await;
            queue.acked(&payload, receipt, acked);
            drop(handler);
        });
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
    Ok(received)
}

#[cfg(test)]
mod tests {
    use super::*;

    use pulsar_wire_emulator::{Emulator, EmulatorConfig};

    fn receipt(consumer: usize, received: u64, acked: Option<u64>) -> Receipt {
        Receipt {
            consumer,
            received_at: Duration::from_millis(received),
            acked_at: acked.map(Duration::from_millis),
        }
    }

    #[test]
    fn a_payload_received_by_another_consumer_while_held_is_found() {
        let ms = Duration::from_millis;
        let receipts: HashMap<String, Vec<Receipt>> = [
            // Handled once.
            ("a", vec![receipt(0, 10, Some(2_010))]),
            // c1 receives it while c0 holds it; both ack.
            (
                "b",
                vec![receipt(0, 10, Some(2_010)), receipt(1, 1_100, Some(3_100))],
            ),
            // c1 receives it after c0 acked: a copy, not a hand-over; acked twice.
            (
                "c",
                vec![receipt(0, 10, Some(2_010)), receipt(1, 2_010, Some(4_010))],
            ),
            // c0 never acks; c2 receives it at 5 s, c0 still holding it.
            (
                "d",
                vec![receipt(0, 20, None), receipt(2, 5_000, Some(7_000))],
            ),
            // The holder receives it again while holding it.
            (
                "e",
                vec![receipt(3, 20, Some(2_020)), receipt(3, 1_000, Some(3_000))],
            ),
            // Received, never acked by anyone.
            ("f", vec![receipt(1, 30, None)]),
        ]
        .into_iter()
        .map(|(payload, list)| (payload.to_owned(), list))
        .collect();
        let analysis = analyse(["a", "b", "c", "d", "e", "f", "g"], &receipts, ms(9_000));
        assert_eq!(analysis.received, 10);
        assert_eq!(
            analysis.handed_over,
            vec![
                HandOver {
                    payload: "b".into(),
                    holder: 0,
                    held_from: ms(10),
                    held_until: Some(ms(2_010)),
                    other: 1,
                    received_at: ms(1_100),
                },
                HandOver {
                    payload: "d".into(),
                    holder: 0,
                    held_from: ms(20),
                    held_until: None,
                    other: 2,
                    received_at: ms(5_000),
                },
            ]
        );
        assert_eq!(analysis.received_again_by_holder, 1);
        // b, c and e.
        assert_eq!(analysis.acked_more_than_once, 3);
        // f (received, never acked) and g (never received).
        assert_eq!(analysis.never_acked, 2);
    }

    #[test]
    fn the_standard_shape_handles_everything_in_20_s() {
        let shape = Shape::standard();
        assert_eq!((shape.consumers, shape.messages), (4, 2_000));
        assert_eq!(shape.handling_time(), Duration::from_secs(20));
        assert_eq!(shape.timeout, Duration::from_secs(3 * 20 + 60));
    }

    /// A short run on the emulator: every payload is received and acknowledged, the handlers
    /// of each consumer run at once, and the report adds up. (Whether a held message is handed
    /// over is the client's business, not the harness's.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_work_queue_runs_on_the_emulator() {
        let emulator = Emulator::start(EmulatorConfig::default())
            .await
            .expect("emulator");
        let topic = "persistent://public/default/work";
        emulator.create_topic(topic, 0).expect("topic");
        let client = Client::builder(emulator.endpoint())
            .build()
            .await
            .expect("client");
        let shape = Shape {
            concurrency: 5,
            grace: Duration::from_millis(300),
            timeout: Duration::from_secs(10),
            ..Shape::new(2, 40, Duration::from_millis(300))
        };
        let report = run(&client, topic, "s", &shape, None).await.expect("run");
        client.close().await;
        println!("{report:?}");
        assert!(report.finished, "{report:?}");
        assert_eq!(report.produced, 40);
        assert_eq!(report.analysis.never_acked, 0, "{report:?}");
        assert_eq!(report.received_by.len(), 2);
        assert!(report.received_by.iter().all(|&n| n > 0), "{report:?}");
        assert_eq!(
            report.received_by.iter().sum::<u64>(),
            report.analysis.received
        );
        // 20 messages or more for one consumer, 5 at a time, 300 ms each: 4 rounds at least.
        assert!(report.total >= Duration::from_millis(1_200), "{report:?}");
        // Each consumer held more than one message at once, and never more than 5.
        for consumer in 0..2 {
            let mut held: Vec<(Duration, i32)> = report
                .receipts
                .values()
                .flatten()
                .filter(|r| r.consumer == consumer)
                .flat_map(|r| [(r.received_at, 1), (r.acked_at.expect("acked"), -1)])
                .collect();
            held.sort_unstable_by_key(|&(at, step)| (at, step));
            let most = held
                .iter()
                .scan(0, |now, &(_, step)| {
                    *now += step;
                    Some(*now)
                })
                .max();
            assert!(matches!(most, Some(2..=5)), "c{consumer}: {most:?} at once");
        }
    }
}
