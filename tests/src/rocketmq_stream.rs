//! A steady RocketMQ stream through proxy and broker faults: a producer sends numbered
//! payloads at a fixed rate (each send on its own task, so a send that retries through an
//! outage does not slow the others) while a push consumer with batched acks handles them, and
//! faults (a proxy restart, a broker stopped and started) happen at set times. Nothing in the
//! stream recovers anything by itself. [`run`] counts by payload, and times every ack the
//! proxy confirmed, so that "no message handled twice that had been acked before the outage"
//! can be checked.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Error, MessageHandler,
    OutgoingMessage, Producer, PushConsumer, ReceivedMessage, ShutdownReport,
};

/// One fault: started at its time from the first send; the outage lasts until it returns.
pub type Fault = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The stream's shape.
#[derive(Debug, Clone)]
pub struct Stream {
    /// Messages per second.
    pub rate: u32,
    /// How long the producer sends.
    pub produce_for: Duration,
    /// How long the consumer waits for the last payloads after the last send returned.
    pub patience: Duration,
    /// Every payload starts with it (other runs' messages on the topic are ignored).
    pub prefix: String,
    /// How long to go on handling after every payload arrived, so that redeliveries of
    /// messages whose acks were lost are counted: longer than the proxy's invisible time.
    pub settle: Duration,
}

/// What one run counted.
#[derive(Debug, Default)]
pub struct Report {
    /// Sends that returned a receipt.
    pub sent: u64,
    /// Sends that failed, and the first few errors.
    pub send_failures: u64,
    /// See [`Report::send_failures`].
    pub send_errors: Vec<String>,
    /// Sends that started during the fault window and got a receipt.
    pub sent_during_fault: u64,
    /// The longest a successful send took.
    pub longest_send: Duration,
    /// Distinct payloads handled.
    pub received: u64,
    /// Payloads sent with a receipt that were never handled.
    pub lost: u64,
    /// Deliveries of a payload already handled.
    pub copies: u64,
    /// Deliveries after the fault began of payloads whose ack the proxy had confirmed before
    /// it began: these must not happen.
    pub copies_of_acked: u64,
    /// `AckMessage` requests (flush attempts, retries included) made during the fault window.
    pub ack_requests_during_fault: u64,
    /// `AckMessage` requests in all.
    pub ack_requests: u64,
    /// Acks the proxy confirmed.
    pub acked: u64,
    /// Acks that failed for good, and per distinct error (its first 240 characters): how
    /// many, the first time (from the first send) and the attempts it took.
    pub ack_failures: u64,
    /// See [`Report::ack_failures`].
    pub ack_errors: Vec<(String, u64, Duration, u32)>,
    /// Of [`Report::ack_failures`], those the proxy did not refuse for an invalid (expired)
    /// receipt handle: acks given up while the handle may still have been valid.
    pub acks_given_up: u64,
    /// The fault window, from the first send.
    pub fault_window: (Duration, Duration),
    /// From the end of the fault window to the first ack the proxy confirmed after it.
    pub first_ack_after_fault: Option<Duration>,
    /// The consumer's shutdown report.
    pub shutdown: ShutdownReport,
    /// The consumer's counters at the end.
    pub consumer: String,
}

impl Report {
    /// What keeps the run from "nothing lost, no send failed, no ack given up unless the proxy
    /// said its handle expired, the shutdown report empty". Copies of acknowledged messages are checked apart
    /// ([`Report::copies_of_acked`]): a broker killed with -9 forgets the consume progress of
    /// its last seconds and delivers those messages again, whatever the client did.
    pub fn shortfalls(&self) -> Vec<String> {
        let mut missed = Vec::new();
        if self.send_failures > 0 {
            missed.push(format!(
                "{} sends failed: {:?}",
                self.send_failures, self.send_errors
            ));
        }
        if self.lost > 0 {
            missed.push(format!("{} payloads sent were never handled", self.lost));
        }
        if self.acks_given_up > 0 {
            missed.push(format!(
                "{} acks given up while their handles may have been valid: {:?}",
                self.acks_given_up, self.ack_errors
            ));
        }
        if !self.shutdown.unacknowledged.is_empty() {
            missed.push(format!(
                "the shutdown report lists {} unacknowledged: {:?}",
                self.shutdown.unacknowledged.len(),
                &self.shutdown.unacknowledged[..self.shutdown.unacknowledged.len().min(5)]
            ));
        }
        missed
    }
}

#[derive(Default)]
struct Seen {
    /// Per payload: the delivery times, from the first send.
    deliveries: Mutex<HashMap<String, Vec<Duration>>>,
    /// Message id to payload.
    payloads: Mutex<HashMap<String, String>>,
}

struct Handler {
    prefix: String,
    started: Instant,
    seen: Arc<Seen>,
}

#[async_trait::async_trait]
impl MessageHandler for Handler {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let payload = String::from_utf8_lossy(&message.body).into_owned();
        if payload.starts_with(&self.prefix) {
            let at = self.started.elapsed();
            self.seen
                .payloads
                .lock()
                .insert(message.message_id.clone(), payload.clone());
            self.seen
                .deliveries
                .lock()
                .entry(payload)
                .or_default()
                .push(at);
        }
        ConsumeResult::Success
    }
}

/// Times every flush attempt and every ack the proxy confirmed.
struct AckClock {
    started: Instant,
    flushes: Mutex<Vec<Duration>>,
    confirmed: Mutex<Vec<(Duration, String)>>,
    /// Final ack failures: when, after how many attempts, the error, and whether the proxy
    /// said the receipt handle is no longer valid.
    failed: Mutex<Vec<(Duration, u32, String, bool)>>,
}

impl Observer<AckKey, AckEntry, (), Error> for AckClock {
    fn before_flush(&self, _: &AckKey, _: &BatchInfo, _: &[AckEntry]) {
        self.flushes.lock().push(self.started.elapsed());
    }

    fn after_flush(&self, _: &AckKey, _: &BatchInfo, items: &[ItemView<'_, AckEntry, (), Error>]) {
        let at = self.started.elapsed();
        let mut confirmed = self.confirmed.lock();
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            match view.reply {
                ItemReply::Ok(()) => confirmed.push((at, view.item.message_id.clone())),
                ItemReply::Err(error) => self.failed.lock().push((
                    at,
                    view.attempt,
                    error.to_string(),
                    rocketmq_grpc::is_invalid_receipt_handle(error),
                )),
                _ => self
                    .failed
                    .lock()
                    .push((at, view.attempt, "no result".into(), false)),
            }
        }
    }
}

/// Runs the stream on `topic` with a fresh push consumer of `group` (default batched acks,
/// 4 s batches) and `producer`, starting each fault at its time.
///
/// # Panics
/// If the consumer cannot start.
pub async fn run(
    config: ClientConfig,
    topic: &str,
    group: &str,
    producer: Arc<Producer>,
    stream: Stream,
    faults: Vec<(Duration, Fault)>,
) -> Report {
    let started = Instant::now();
    let seen = Arc::new(Seen::default());
    let clock = Arc::new(AckClock {
        started,
        flushes: Mutex::new(Vec::new()),
        confirmed: Mutex::new(Vec::new()),
        failed: Mutex::new(Vec::new()),
    });
    let consumer = PushConsumer::builder(config, group)
        .subscribe(topic, "*")
        .acks(AckSettings::default().observer(clock.clone()))
        .start(Handler {
            prefix: stream.prefix.clone(),
            started,
            seen: Arc::clone(&seen),
        })
        .await
        .expect("the consumer starts");
    let window = Arc::new(Mutex::new((Duration::MAX, Duration::MAX)));
    let fault_task = tokio::spawn({
        let window = Arc::clone(&window);
        async move {
            for (at, fault) in faults {
                tokio::time::sleep_until((started + at).into()).await;
                let begun = started.elapsed();
                {
                    let mut window = window.lock();
                    window.0 = window.0.min(begun);
                }
                fault().await;
                window.lock().1 = started.elapsed();
            }
        }
    });
    let sent = Arc::new(Mutex::new(Vec::<(Duration, Duration, String)>::new()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let total = u64::from(stream.rate) * stream.produce_for.as_secs();
    let every = Duration::from_secs(1) / stream.rate.max(1);
    let mut sends = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until((started + every * i as u32).into()).await;
        let producer = Arc::clone(&producer);
        let (sent, failures) = (Arc::clone(&sent), Arc::clone(&failures));
        let payload = format!("{}{i}", stream.prefix);
        let topic = topic.to_owned();
        sends.push(tokio::spawn(async move {
            let at = started.elapsed();
            let message = OutgoingMessage::new(topic, payload.clone().into_bytes());
            match producer.send(message).await {
                Ok(_) => sent.lock().push((at, started.elapsed() - at, payload)),
                Err(error) => failures.lock().push(format!("{payload}: {error}")),
            }
        }));
    }
    for send in sends {
        let _ = send.await;
    }
    let _ = fault_task.await;
    let sent_payloads: HashSet<String> = sent.lock().iter().map(|s| s.2.clone()).collect();
    let patience = Instant::now() + stream.patience;
    while Instant::now() < patience {
        let done = {
            let deliveries = seen.deliveries.lock();
            sent_payloads.iter().all(|p| deliveries.contains_key(p))
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(stream.settle).await;
    let counters = consumer.stats();
    let shutdown = consumer.shutdown(Duration::from_secs(15)).await;

    let (from, to) = *window.lock();
    let deliveries = seen.deliveries.lock();
    let payloads = seen.payloads.lock();
    let confirmed = clock.confirmed.lock();
    let acked_before: HashSet<&String> = confirmed
        .iter()
        .filter(|(at, _)| *at < from)
        .filter_map(|(_, id)| payloads.get(id))
        .collect();
    let copies_of_acked = acked_before
        .iter()
        .map(|payload| {
            deliveries
                .get(*payload)
                .map_or(0, |times| times.iter().filter(|at| **at >= from).count())
        })
        .sum::<usize>() as u64;
    let flushes = clock.flushes.lock();
    let sent = sent.lock();
    let failures = failures.lock();
    let in_window = |at: &Duration| *at >= from && *at < to;
    let failed = clock.failed.lock();
    let mut ack_errors: Vec<(String, u64, Duration, u32)> = Vec::new();
    for (at, attempt, error, _) in failed.iter() {
        let short: String = error.chars().take(240).collect();
        match ack_errors.iter_mut().find(|e| e.0 == short) {
            Some(entry) => entry.1 += 1,
            None => ack_errors.push((short, 1, *at, *attempt)),
        }
    }
    Report {
        sent: sent.len() as u64,
        send_failures: failures.len() as u64,
        send_errors: failures.iter().take(5).cloned().collect(),
        sent_during_fault: sent.iter().filter(|s| in_window(&s.0)).count() as u64,
        longest_send: sent.iter().map(|s| s.1).max().unwrap_or_default(),
        received: deliveries.len() as u64,
        lost: sent_payloads
            .iter()
            .filter(|p| !deliveries.contains_key(*p))
            .count() as u64,
        copies: deliveries
            .values()
            .map(|times| times.len() as u64 - 1)
            .sum(),
        copies_of_acked,
        ack_requests_during_fault: flushes.iter().filter(|at| in_window(at)).count() as u64,
        ack_requests: flushes.len() as u64,
        acked: confirmed.len() as u64,
        ack_failures: failed.len() as u64,
        ack_errors,
        acks_given_up: failed.iter().filter(|f| !f.3).count() as u64,
        fault_window: (from, to),
        first_ack_after_fault: confirmed
            .iter()
            .map(|(at, _)| *at)
            .find(|at| *at >= to)
            .map(|at| at - to),
        shutdown,
        consumer: format!("{counters:?}"),
    }
}
