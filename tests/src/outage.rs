//! A steady stream through broker faults: a batching producer sends numbered payloads at a
//! fixed rate while a Shared consumer receives and acknowledges them, and faults (a topic
//! unload, a broker restart) happen at set times; nothing in the stream recovers anything by
//! itself (no user code rebuilds a producer or consumer). [`run`] counts by payload: what was
//! sent, what arrived, copies, errors seen by the application, and what the broker still holds
//! at the end.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pulsar_wire::{BatchingOptions, Client, InitialPosition, OutgoingMessage, SubType};

use broker_tools::pulsar_admin::PulsarAdmin;
use broker_tools::txn_steady::settled_counts;

/// One fault, started at its time from the first send.
pub type Fault = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The stream's shape.
#[derive(Debug, Clone)]
pub struct Stream {
    /// Messages per second.
    pub rate: u32,
    /// How long the producer sends.
    pub produce_for: Duration,
    /// How long the consumer waits for the last payloads after the producer is done.
    pub patience: Duration,
}

/// What one run counted.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Payloads sent with a receipt.
    pub sent: u64,
    /// Sends that failed, with their errors (the first few).
    pub send_errors: Vec<String>,
    /// How many sends failed.
    pub send_failures: u64,
    /// Distinct payloads received.
    pub received: u64,
    /// Payloads sent with a receipt that never arrived.
    pub lost: u64,
    /// Deliveries of a payload already received.
    pub copies: u64,
    /// Errors `receive` returned (the first few), and how many.
    pub receive_errors: Vec<String>,
    /// How many `receive` calls failed.
    pub receive_failures: u64,
    /// Producer re-registrations and consumer re-subscriptions.
    pub producer_reconnects: u64,
    /// See [`Report::producer_reconnects`].
    pub consumer_reconnects: u64,
    /// Acks the consumer sent again for redelivered messages.
    pub acks_resent: u64,
    /// The subscription's unacked count and backlog once settled.
    pub final_unacked: i64,
    /// See [`Report::final_unacked`].
    pub final_backlog: i64,
    /// The longest time without a delivery while the producer was sending.
    pub longest_gap: Duration,
    /// How long the run took.
    pub took: Duration,
}

impl Report {
    /// What keeps the run from "nothing lost, no error reaches user code, the broker left
    /// with nothing unacknowledged".
    pub fn shortfalls(&self) -> Vec<String> {
        let mut missed = Vec::new();
        if self.send_failures > 0 {
            missed.push(format!(
                "{} sends failed: {:?}",
                self.send_failures, self.send_errors
            ));
        }
        if self.lost > 0 {
            missed.push(format!("{} sent payloads never arrived", self.lost));
        }
        if self.receive_failures > 0 {
            missed.push(format!(
                "{} receive errors: {:?}",
                self.receive_failures, self.receive_errors
            ));
        }
        if (self.final_unacked, self.final_backlog) != (0, 0) {
            missed.push(format!(
                "ended with unacked {}, backlog {}",
                self.final_unacked, self.final_backlog
            ));
        }
        missed
    }
}

/// Whether `payload` is one of this stream's (`m` and a number): a peer client streaming on
/// the same topic uses another prefix.
fn is_ours(payload: &str) -> bool {
    payload
        .strip_prefix('m')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Runs `stream` on `topic` (subscription `sub`) with `faults` at their times.
///
/// # Panics
/// When the producer or consumer cannot be created at the start.
pub async fn run(
    client: &Client,
    admin: &PulsarAdmin,
    topic: &str,
    stream: &Stream,
    faults: Vec<(Duration, Fault)>,
) -> Report {
    let consumer = Arc::new(
        pulsar_wire::Consumer::builder(client, topic, "sub")
            .options(
                crate::real_pulsar::consumer_options()
                    .sub_type(SubType::Shared)
                    .initial_position(InitialPosition::Earliest),
            )
            .build()
            .await
            .expect("subscribed"),
    );
    let producer = pulsar_wire::Producer::builder(client, topic)
        .batching(
            BatchingOptions::default()
                .max_messages(10)
                .max_delay(Duration::from_millis(20)),
        )
        .build()
        .await
        .expect("producer created");
    let started = Instant::now();
    let sent = Arc::new(Mutex::new(HashSet::new()));
    let report = Arc::new(Mutex::new(Report::default()));
    let total = (u64::from(stream.rate) * stream.produce_for.as_millis() as u64 / 1000).max(1);
    let producing = tokio::spawn({
        let producer = producer.clone();
        let sent = Arc::clone(&sent);
        let report = Arc::clone(&report);
        let every = Duration::from_secs(1) / stream.rate.max(1);
        async move {
            let mut sends = Vec::new();
            for i in 0..total {
                tokio::time::sleep_until((started + every * i as u32).into()).await;
                let producer = producer.clone();
                let sent = Arc::clone(&sent);
                let report = Arc::clone(&report);
                sends.push(tokio::spawn(async move {
                    let payload = format!("m{i}");
                    match producer.send(OutgoingMessage::new(payload.clone())).await {
                        Ok(_) => {
                            sent.lock().insert(payload);
                        }
                        Err(error) => {
                            let mut report = report.lock();
                            report.send_failures += 1;
                            if report.send_errors.len() < 3 {
                                report.send_errors.push(format!("{payload}: {error}"));
                            }
                        }
                    }
                }));
            }
            for send in sends {
                let _ = send.await;
            }
        }
    });
    let faulting = tokio::spawn(async move {
        for (at, fault) in faults {
            tokio::time::sleep_until((started + at).into()).await;
            fault().await;
        }
    });
    let mut seen = HashSet::new();
    let mut last_delivery = Instant::now();
    let deadline = started + stream.produce_for + stream.patience;
    loop {
        if producing.is_finished() && faulting.is_finished() {
            let sent = sent.lock();
            if sent.iter().all(|payload| seen.contains(payload)) {
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), consumer.receive()).await {
            Err(_) => {}
            Ok(Ok(message)) => {
                if !producing.is_finished() {
                    let gap = last_delivery.elapsed();
                    let mut report = report.lock();
                    report.longest_gap = report.longest_gap.max(gap);
                }
                last_delivery = Instant::now();
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                if !is_ours(&payload) {
                    // Another client's payload on a shared topic (a peer streaming side by side).
                    let _ = consumer.ack(&message).await;
                    continue;
                }
                if !seen.insert(payload) {
                    report.lock().copies += 1;
                }
                let _ = consumer.ack(&message).await;
            }
            Ok(Err(error)) => {
                {
                    let mut report = report.lock();
                    report.receive_failures += 1;
                    if report.receive_errors.len() < 3 {
                        report.receive_errors.push(error.to_string());
                    }
                }
                // Never a tight loop, even when every receive fails.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let _ = producing.await;
    let _ = faulting.await;
    // Whatever still comes (a peer streaming on the same topic may still be sending): received
    // and acknowledged until 2 s pass without a delivery, so that the subscription can settle.
    while Instant::now() < deadline {
        let Ok(Ok(message)) =
            tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await
        else {
            break;
        };
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        if is_ours(&payload) && !seen.insert(payload) {
            report.lock().copies += 1;
        }
        let _ = consumer.ack(&message).await;
    }
    consumer.flush_acks().await;
    let (unacked, backlog) = settled_counts(admin, topic, "sub", Duration::from_secs(15)).await;
    let stats = consumer.stats();
    let mut report = report.lock().clone();
    {
        let sent = sent.lock();
        report.sent = sent.len() as u64;
        report.lost = sent
            .iter()
            .filter(|payload| !seen.contains(*payload))
            .count() as u64;
    }
    report.received = seen.len() as u64;
    report.producer_reconnects = producer.reconnects();
    report.consumer_reconnects = stats.reconnects;
    report.acks_resent = stats.acks_resent;
    report.final_unacked = unacked;
    report.final_backlog = backlog;
    report.took = started.elapsed();
    let _ = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
    let _ = consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
    report
}
