//! A steady RocketMQ stream through proxy and broker faults: a producer sends numbered
//! payloads at a fixed rate (each send on its own task, so a send that retries through an
//! outage does not slow the others) while a push consumer with batched acks handles them, and
//! faults (a proxy restart, a broker stopped and started) happen at set times. Nothing in the
//! stream recovers anything by itself. [`run`] counts by payload, and times every ack the
//! proxy confirmed, so that the messages handled again after their acks were confirmed can be
//! counted, split into the broker's redeliveries and repeats ([`copies_of_acked`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Error, MessageHandler,
    OutgoingMessage, Producer, PushCloseReport, PushConsumer, ReceivedMessage, SendReceipt,
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
    /// The proxy's invisibility of auto-renewed receives (`defaultInvisibleTimeMills`, 20 s in
    /// `scripts/brokers/rocketmq` and `rocketmq-cluster`): an ack that fails for good in the
    /// last [`LAST_RETRY_WINDOW`] of it ran out of time, not of patience.
    pub invisible: Duration,
}

/// The end of a receipt handle's invisibility where an ack that fails may give up: the ack
/// retries' longest wait (5 s) and 1 s of margin. A retry that would start after the end is
/// not made; it could only be refused as expired.
pub const LAST_RETRY_WINDOW: Duration = Duration::from_secs(6);

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
    /// The first few of [`Report::lost`]: payload, when its send started (from the first
    /// send), how long it took, the message id and the queue offset from its receipt.
    pub lost_detail: Vec<String>,
    /// Deliveries of a payload already handled.
    pub copies: u64,
    /// Deliveries after the fault began of payloads whose ack the proxy had confirmed before
    /// it began, as [`copies_of_acked`] splits them.
    pub copies_of_acked: CopiesOfAcked,
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
    /// receipt handle and that failed before the last [`LAST_RETRY_WINDOW`] of the handle's
    /// invisibility: acks given up while the handle was still valid.
    pub acks_given_up: u64,
    /// The fault window, from the first send.
    pub fault_window: (Duration, Duration),
    /// From the end of the fault window to the first ack the proxy confirmed after it.
    pub first_ack_after_fault: Option<Duration>,
    /// The consumer's shutdown report.
    pub shutdown: PushCloseReport,
    /// The consumer's counters at the end.
    pub consumer: String,
}

impl Report {
    /// What keeps the run from "nothing lost, no send failed, no ack given up unless the proxy
    /// said its handle expired, the shutdown report empty". Copies of acknowledged messages
    /// are checked apart ([`Report::copies_of_acked`]): a broker killed with -9 forgets the
    /// consume progress of its last seconds and delivers those messages again, whatever the
    /// client did, and even after TERM the broker revives a few acknowledged ones.
    pub fn shortfalls(&self) -> Vec<String> {
        let mut missed = Vec::new();
        if self.send_failures > 0 {
            missed.push(format!(
                "{} sends failed: {:?}",
                self.send_failures, self.send_errors
            ));
        }
        if self.lost > 0 {
            missed.push(format!(
                "{} payloads sent were never handled: {:?}",
                self.lost, self.lost_detail
            ));
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

/// One delivery of a payload to the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// When, from the first send.
    pub at: Duration,
    /// The queue it came from (a revived message comes from the group's retry queue).
    pub queue: i32,
    /// The broker's delivery attempt (1 the first time; a revive increments it).
    pub attempt: i32,
}

/// Later deliveries of payloads whose ack the proxy confirmed before the fault began.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopiesOfAcked {
    /// All of them.
    pub total: u64,
    /// Those the broker delivered again: a delivery attempt above every attempt handled before
    /// the fault. The 5.3.3 broker revives a few pop checkpoints whose acks it had confirmed
    /// when it restarts, even after TERM (24 and 99 in two runs): the client cannot prevent it.
    pub redelivered: u64,
    /// Those with no higher attempt: the same delivery handed to the handler again by the
    /// client, or the broker popping again from a consume offset it lost (after kill -9).
    pub repeated: u64,
    /// The earliest and latest five, by first handling: the payload, when it was first handled
    /// and acked, and each later delivery.
    pub detail: Vec<String>,
}

/// Splits the deliveries at or after `from` of each payload in `acked_before` (with the time
/// its ack was confirmed) into broker redeliveries and repeats.
pub fn copies_of_acked(
    acked_before: &HashMap<&String, Duration>,
    deliveries: &HashMap<String, Vec<Delivery>>,
    from: Duration,
) -> CopiesOfAcked {
    let mut copies = CopiesOfAcked::default();
    let mut detail = Vec::new();
    for (payload, acked_at) in acked_before {
        let Some(all) = deliveries.get(*payload) else {
            continue;
        };
        let (before, later): (Vec<&Delivery>, Vec<&Delivery>) =
            all.iter().partition(|delivery| delivery.at < from);
        if later.is_empty() {
            continue;
        }
        let handled_attempt = before.iter().map(|d| d.attempt).max().unwrap_or(0);
        let redelivered = later
            .iter()
            .filter(|delivery| delivery.attempt > handled_attempt)
            .count() as u64;
        copies.total += later.len() as u64;
        copies.redelivered += redelivered;
        copies.repeated += later.len() as u64 - redelivered;
        let again: Vec<String> = later
            .iter()
            .map(|d| format!("{:.1?} q{} attempt {}", d.at, d.queue, d.attempt))
            .collect();
        detail.push((
            all[0].at,
            format!(
                "{payload}: handled {:.1?}, acked {acked_at:.1?}, again {again:?}",
                all[0].at
            ),
        ));
    }
    detail.sort();
    if detail.len() > 10 {
        detail.drain(5..detail.len() - 5);
    }
    copies.detail = detail.into_iter().map(|(_, line)| line).collect();
    copies
}

#[derive(Default)]
struct Seen {
    /// Per payload: its deliveries, in order.
    deliveries: Mutex<HashMap<String, Vec<Delivery>>>,
    /// Message id to payload.
    payloads: Mutex<HashMap<String, String>>,
    /// Every message id handled (other runs' messages too) to its latest delivery time.
    received: Mutex<HashMap<String, Duration>>,
}

struct Handler {
    prefix: String,
    started: Instant,
    seen: Arc<Seen>,
}

#[async_trait::async_trait]
impl MessageHandler for Handler {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let at = self.started.elapsed();
        self.seen
            .received
            .lock()
            .insert(message.message_id().to_owned(), at);
        let payload = String::from_utf8_lossy(message.body()).into_owned();
        if payload.starts_with(&self.prefix) {
            self.seen
                .payloads
                .lock()
                .insert(message.message_id().to_owned(), payload.clone());
            self.seen
                .deliveries
                .lock()
                .entry(payload)
                .or_default()
                .push(Delivery {
                    at,
                    queue: message.queue_id(),
                    attempt: message.delivery_attempt(),
                });
        }
        ConsumeResult::Success
    }
}

/// Times every flush attempt and every ack the proxy confirmed.
struct AckClock {
    started: Instant,
    flushes: Mutex<Vec<Duration>>,
    confirmed: Mutex<Vec<(Duration, String)>>,
    /// Final ack failures: when, after how many attempts, the error, and whether the handle
    /// was no longer valid (the proxy said so) or about to end (see [`LAST_RETRY_WINDOW`]).
    failed: Mutex<Vec<(Duration, u32, String, bool)>>,
    seen: Arc<Seen>,
    invisible: Duration,
}

impl AckClock {
    /// Whether `at` is in the last [`LAST_RETRY_WINDOW`] of the invisibility of the latest
    /// delivery of `message_id`, or after it.
    fn handle_ending(&self, message_id: &str, at: Duration) -> bool {
        self.seen
            .received
            .lock()
            .get(message_id)
            .is_some_and(|delivered| at + LAST_RETRY_WINDOW >= *delivered + self.invisible)
    }
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
                    rocketmq_grpc::is_invalid_receipt_handle(error)
                        || self.handle_ending(&view.item.message_id, at),
                )),
                _ => self.failed.lock().push((
                    at,
                    view.attempt,
                    "no result".into(),
                    self.handle_ending(&view.item.message_id, at),
                )),
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
        seen: Arc::clone(&seen),
        invisible: stream.invisible,
    });
    let consumer = PushConsumer::builder(config, group)
        .subscribe(topic, "*")
        .acks(AckSettings::default().observer(clock.clone()))
        .handler(Handler {
            prefix: stream.prefix.clone(),
            started,
            seen: Arc::clone(&seen),
        })
        .build()
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
    // Per successful send: when it started, how long it took, the payload and its receipt.
    let sent = Arc::new(Mutex::new(
        Vec::<(Duration, Duration, String, SendReceipt)>::new(),
    ));
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
                Ok(receipt) => sent
                    .lock()
                    .push((at, started.elapsed() - at, payload, receipt)),
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
    let shutdown = consumer.close(Duration::from_secs(15)).await;

    let (from, to) = *window.lock();
    let deliveries = seen.deliveries.lock();
    let payloads = seen.payloads.lock();
    let confirmed = clock.confirmed.lock();
    let acked_before: HashMap<&String, Duration> = confirmed
        .iter()
        .filter(|(at, _)| *at < from)
        .filter_map(|(at, id)| payloads.get(id).map(|payload| (payload, *at)))
        .collect();
    let copies_of_acked = copies_of_acked(&acked_before, &deliveries, from);
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
        lost_detail: sent
            .iter()
            .filter(|s| !deliveries.contains_key(&s.2))
            .take(10)
            .map(|(at, took, payload, receipt)| {
                format!(
                    "{payload}: sent at {at:.3?} in {took:.3?}, id {}, offset {}",
                    receipt.message_id(),
                    receipt.offset()
                )
            })
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(secs: u64, attempt: i32) -> Delivery {
        Delivery {
            at: Duration::from_secs(secs),
            queue: 0,
            attempt,
        }
    }

    #[test]
    fn copies_of_acked_messages_are_split_by_who_delivered_them() {
        let (revived, repeated, once, unacked) = (
            "revived".to_owned(),
            "repeated".to_owned(),
            "once".to_owned(),
            "unacked".to_owned(),
        );
        let deliveries = HashMap::from([
            // Handled at 8 s, acked, revived by the broker after the restart (attempt 2).
            (revived.clone(), vec![delivery(8, 1), delivery(61, 2)]),
            // Handled at 9 s, acked, then the same delivery (attempt 1) again.
            (repeated.clone(), vec![delivery(9, 1), delivery(62, 1)]),
            (once.clone(), vec![delivery(10, 1)]),
            // Never acked before the fault: its copy is not counted.
            (unacked.clone(), vec![delivery(14, 1), delivery(63, 2)]),
        ]);
        let acked_before = HashMap::from([
            (&revived, Duration::from_secs(13)),
            (&repeated, Duration::from_secs(13)),
            (&once, Duration::from_secs(14)),
        ]);
        let copies = copies_of_acked(&acked_before, &deliveries, Duration::from_secs(15));
        assert_eq!(
            (copies.total, copies.redelivered, copies.repeated),
            (2, 1, 1)
        );
        assert_eq!(copies.detail.len(), 2);
        assert!(copies.detail[0].starts_with("revived: handled 8.0s, acked 13.0s"));
        // A copy before the fault (its attempt is the one handled) does not count.
        let deliveries = HashMap::from([(
            revived.clone(),
            vec![delivery(8, 1), delivery(12, 2), delivery(61, 2)],
        )]);
        let acked_before = HashMap::from([(&revived, Duration::from_secs(13))]);
        let copies = copies_of_acked(&acked_before, &deliveries, Duration::from_secs(15));
        assert_eq!(
            (copies.total, copies.redelivered, copies.repeated),
            (1, 0, 1)
        );
    }
}
