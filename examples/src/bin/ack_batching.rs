//! Batched acknowledgements with `ack-batcher`, against an in-process ack "server".
//!
//! A consumer acknowledges 20,000 messages on 4 topics, one of them FIFO. Every ack RPC costs the server a
//! fixed 2 ms round trip however many entries it carries. The server answers per entry: a few
//! receipt handles have expired (a terminal error, never retried) and, now and then, a whole
//! RPC fails with a transient error (retried one entry at a time). FIFO messages take the
//! immediate path.
//!
//! Messages arrive at 10,000 per second. The same workload runs twice: one entry per RPC
//! (what RocketMQ clients do today), then batched per topic with the defaults (up to 1,024
//! entries or 5 s; `close` flushes what is left). Run it with
//! `cargo run --release -p examples --bin ack_batching`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ack_batcher::{
    Batcher, Error, Flush, FlushReason, FlushResult, ItemOptions, ItemReply, Retryable, Ticket,
};
use tokio::time::Instant;

const MESSAGES: u64 = 20_000;
const TOPICS: [&str; 3] = ["orders", "payments", "audit"];
const FIFO_TOPIC: &str = "fifo-ledger";
const RPC_LATENCY: Duration = Duration::from_millis(2);
/// Messages consumed per second.
const RATE: u64 = 10_000;

/// The batching key: acks are grouped per topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Topic(&'static str);

/// An ack as the consumer hands it over: the message's receipt handle.
#[derive(Debug)]
struct Ack {
    receipt_handle: String,
}

/// What the server can answer for an entry or an RPC.
#[derive(Debug, Clone, thiserror::Error)]
enum AckError {
    #[error("receipt handle expired")]
    InvalidReceiptHandle,
    #[error("server busy, try again")]
    Busy,
}

impl Retryable for AckError {
    fn is_retryable(&self) -> bool {
        matches!(self, AckError::Busy)
    }
}

/// The in-process ack server: one `flush` is one RPC.
#[derive(Default)]
struct AckServer {
    rpcs: AtomicU64,
}

impl Flush<Topic, Ack> for Arc<AckServer> {
    type Output = ();
    type Error = AckError;

    async fn flush(&self, _topic: &Topic, acks: &[Ack]) -> FlushResult<(), AckError> {
        let rpc = self.rpcs.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(RPC_LATENCY).await;
        if rpc % 97 == 13 {
            return Err(AckError::Busy); // a transient failure of the whole RPC
        }
        Ok(acks
            .iter()
            .map(|ack| {
                if ack.receipt_handle.ends_with("-expired") {
                    ItemReply::Err(AckError::InvalidReceiptHandle)
                } else {
                    ItemReply::Ok(())
                }
            })
            .collect())
    }
}

/// Consumes every message at `RATE` messages per second and hands its ack to `batcher`
/// without waiting for it, as a push consumer does; then collects every ack's own outcome.
/// Returns the tickets of the acks' outcomes.
async fn consume(batcher: &Batcher<Topic, Ack, Arc<AckServer>>) -> Vec<Ticket<(), AckError>> {
    let mut tickets = Vec::with_capacity(MESSAGES as usize);
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    for id in 0..MESSAGES {
        if id % (RATE / 100) == 0 {
            pace.tick().await;
        }
        // One message in 20 is on the FIFO topic.
        let topic = if id % 20 == 0 {
            Topic(FIFO_TOPIC)
        } else {
            Topic(TOPICS[(id % 3) as usize])
        };
        let expired = if id % 1000 == 7 { "-expired" } else { "" };
        let ack = Ack {
            receipt_handle: format!("rh-{id}{expired}"),
        };
        // FIFO acks are not batched: the next message of the group waits for this ack.
        let options = if topic.0 == FIFO_TOPIC {
            ItemOptions::new().immediate()
        } else {
            ItemOptions::new()
        };
        match batcher.enqueue(topic, ack, options).await {
            Ok(ticket) => tickets.push(ticket),
            Err(refused) => panic!("ack refused while consuming: {refused}"),
        }
    }
    tickets
}

async fn run(label: &str, max_items: usize) -> Result<(), Error<AckError>> {
    let server = Arc::new(AckServer::default());
    let batcher = Batcher::builder()
        .max_items(max_items)
        .max_in_flight_per_key(8)
        .build(server.clone())?;
    let started = Instant::now();
    let tickets = consume(&batcher).await;
    // Closing flushes the partial batches at once instead of waiting for max_delay.
    let report = batcher.close(Duration::from_secs(10)).await;
    let elapsed = started.elapsed();
    let [mut ok, mut failed, mut abandoned] = [0u64; 3];
    for ticket in tickets {
        match ticket.await {
            Ok(()) => ok += 1,
            Err(Error::Abandoned) => abandoned += 1,
            Err(_) => failed += 1,
        }
    }
    let stats = batcher.stats();
    let rpcs = server.rpcs.load(Ordering::Relaxed);
    println!("== {label}");
    println!(
        "  {MESSAGES} acks in {:.2} s: {ok} ok, {failed} failed for good, {abandoned} abandoned",
        elapsed.as_secs_f64()
    );
    println!(
        "  {rpcs} ack RPCs ({:.1} entries per RPC), {} retries",
        MESSAGES as f64 / rpcs as f64,
        stats.retries,
    );
    let sizes: Vec<String> = stats
        .batch_sizes
        .buckets()
        .map(|(low, high, n)| format!("{low}-{high}: {n}"))
        .collect();
    println!("  batches by size: {}", sizes.join(", "));
    let reasons: Vec<String> = FlushReason::ALL
        .iter()
        .filter(|r| stats.batches(**r) > 0)
        .map(|r| format!("{r} {}", stats.batches(*r)))
        .collect();
    println!("  batches by reason: {}", reasons.join(", "));
    println!(
        "  close: {} pending at close, {} abandoned",
        report.pending_at_close, report.abandoned
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error<AckError>> {
    run("one entry per RPC (today's clients)", 1).await?;
    run("batched per topic (ack-batcher)", 1024).await?;
    Ok(())
}
