//! A RocketMQ 5 push consumer whose acks are batched, from start to shutdown.
//!
//! By default it starts the embedded proxy emulator (no RocketMQ needed), creates a topic and a
//! consumer group, sends some messages with [`Producer`], consumes them with [`PushConsumer`],
//! shows how the acks were batched, and shuts down with the [`PushCloseReport`]. It takes a few
//! seconds:
//!
//! ```sh
//! cargo run -p examples --bin rocketmq_push_consumer
//! ```
//!
//! Against a real proxy (the topic and the group must exist):
//!
//! ```sh
//! cargo run -p examples --bin rocketmq_push_consumer -- \
//!     --endpoint 127.0.0.1:8081 --topic orders --group order-consumers \
//!     [--access-key AK --secret-key SK] [--namespace NS] [--messages 2000]
//! ```
//!
//! Acks are batched per (endpoint, topic): up to 1,024 entries per `AckMessage` request, or
//! whatever arrived within 5 s. Here 2,000 messages make one full batch of 1,024 (flushed on
//! size) and the rest is flushed when the consumer shuts down.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use clap::Parser;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Credentials, MessageHandler,
    OutgoingMessage, Producer, PushCloseReport, PushConsumer, ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, TopicKind};
use tokio::task::JoinSet;

/// A RocketMQ 5 push consumer whose acks are batched, from start to shutdown.
#[derive(Debug, Parser)]
#[command(name = "rocketmq_push_consumer", args_override_self = true)]
struct Options {
    /// A real proxy; without it the embedded emulator.
    #[arg(long, value_name = "HOST:PORT")]
    endpoint: Option<String>,
    /// The topic (it must exist on a real proxy).
    #[arg(long, value_name = "TOPIC", default_value = "orders")]
    topic: String,
    /// The consumer group (it must exist on a real proxy).
    #[arg(long, value_name = "GROUP", default_value = "order-consumers")]
    group: String,
    /// The access key of signed requests (with --secret-key).
    #[arg(long, value_name = "AK", requires = "secret_key")]
    access_key: Option<String>,
    /// The secret key of --access-key.
    #[arg(long, value_name = "SK", requires = "access_key")]
    secret_key: Option<String>,
    /// The proxy's namespace.
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Messages sent and consumed.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    messages: u64,
    /// How long to wait for every message to be consumed, in seconds.
    #[arg(long = "timeout", value_name = "SECS", default_value = "30", value_parser = seconds)]
    timeout: Duration,
}

/// Seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    text.parse()
        .map(Duration::from_secs)
        .map_err(|e| format!("{e}"))
}

/// Counts messages and prints the first few.
#[derive(Debug, Default)]
struct Handler {
    consumed: AtomicU64,
}

#[async_trait::async_trait]
impl MessageHandler for Handler {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let n = self.consumed.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 3 {
            println!(
                "  got {} from {} (queue {}, attempt {}): {:?}",
                message.message_id(),
                message.topic(),
                message.queue_id(),
                message.delivery_attempt(),
                String::from_utf8_lossy(message.body())
            );
        } else if n == 4 {
            println!("  ... (only the first three are printed)");
        }
        ConsumeResult::Success
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = Options::parse();
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    // 1. A proxy: the embedded emulator, or the one given with --endpoint.
    let emulator = match &options.endpoint {
        Some(_) => None,
        None => {
            let emulator = Emulator::builder()
                .topic(&options.topic, TopicKind::Normal, 4)
                .group(&options.group, false)
                .start()
                .await?;
            println!(
                "started the embedded emulator at {} (topic {:?} with 4 queues, group {:?})",
                emulator.endpoint(),
                options.topic,
                options.group
            );
            Some(emulator)
        }
    };
    let endpoint = match (&options.endpoint, &emulator) {
        (Some(endpoint), _) => endpoint.clone(),
        (None, Some(emulator)) => emulator.endpoint(),
        (None, None) => unreachable!("the emulator starts when no endpoint is given"),
    };
    let mut config = ClientConfig::new(&endpoint)?;
    if let (Some(access_key), Some(secret_key)) = (&options.access_key, &options.secret_key) {
        config = config.credentials(Credentials::new(access_key, secret_key));
    }
    if let Some(namespace) = &options.namespace {
        config = config.namespace(namespace);
    }

    // 2. The consumer: every message of the topic, batched acks (the default settings).
    let handler = Arc::new(Handler::default());
    let tally = Arc::new(AckTally::default());
    let consumer = PushConsumer::builder(config.clone(), &options.group)
        .subscribe(&options.topic, "*")
        .concurrency(256)
        .acks(AckSettings::default().observer(tally.clone()))
        .handler(SharedHandler(Arc::clone(&handler)))
        .build()
        .await?;
    println!("consumer {} subscribed", consumer.client_id());

    // 3. Some messages, 32 in flight at a time.
    let producer = Arc::new(Producer::builder(config).build()?);
    let started = Instant::now();
    let mut sends = JoinSet::new();
    let mut sent = 0u64;
    for i in 0..options.messages {
        if sends.len() >= 32
            && let Some(result) = sends.join_next().await
        {
            result??;
            sent += 1;
        }
        let producer = Arc::clone(&producer);
        let message = OutgoingMessage::new(&options.topic, format!("order #{i}")).tag("example");
        sends.spawn(async move { producer.send(message).await });
    }
    while let Some(result) = sends.join_next().await {
        result??;
        sent += 1;
    }
    println!("sent {sent} messages in {:.2?}", started.elapsed());

    // 4. Wait until the handler has seen them all (on a real proxy there may be older ones too).
    let deadline = Instant::now() + options.timeout;
    while handler.consumed.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let consumed = handler.consumed.load(Ordering::Relaxed);
    println!("consumed {consumed} messages in {:.2?}", started.elapsed());
    if consumed < sent {
        println!("  (fewer than sent: gave up after {:?})", options.timeout);
    }

    // 5. Batching so far: most acks wait for their batch; 1,024 of them went in one request.
    let stats = consumer.stats();
    println!(
        "before shutdown: {} acks confirmed, {} pending in the batcher",
        stats.acked, stats.acks.pending
    );

    // 6. Shutdown flushes the rest and reports anything that could not be acknowledged.
    let report = consumer.close(Duration::from_secs(10)).await;
    print_report(&report);
    tally.print();

    if let Some(emulator) = emulator {
        let stats = emulator.stats();
        println!(
            "emulator: {} AckMessage requests for {} entries ({:.1} entries per request); \
             {} of exactly 1,024 entries; {} messages acknowledged, {} redelivered",
            stats.ack_requests(),
            stats.ack_entries,
            stats.mean_ack_entries(),
            stats.ack_requests_with_entries(1024),
            stats.acked,
            stats.redelivered
        );
        println!(
            "  one entry per request (what the official clients send) would have taken {} requests",
            stats.ack_entries
        );
        emulator.shutdown().await?;
    }
    Ok(())
}

fn print_report(report: &PushCloseReport) {
    println!("shutdown report:");
    println!("  handlers finished: {}", report.handlers_finished);
    println!(
        "  acks pending at shutdown: {} ({} confirmed, {} failed, {} abandoned{})",
        report.acks.pending_at_close,
        report.acks.succeeded,
        report.acks.failed,
        report.acks.abandoned,
        if report.acks.timed_out {
            ", timed out"
        } else {
            ""
        }
    );
    if report.unacknowledged.is_empty() {
        println!("  every consumed message is acknowledged");
    } else {
        println!(
            "  {} consumed messages could not be acknowledged (the proxy redelivers them): {:?}",
            report.unacknowledged.len(),
            report.unacknowledged
        );
    }
}

/// Sees every ack request the consumer sends, including those sent while it shuts down (the
/// consumer's own `stats()` is gone once `shutdown` has taken it).
#[derive(Debug, Default)]
struct AckTally {
    inner: Mutex<Tally>,
}

#[derive(Debug, Default)]
struct Tally {
    requests_by_reason: BTreeMap<&'static str, u64>,
    requests_by_size: BTreeMap<usize, u64>,
    entries: u64,
    confirmed: u64,
    failed: u64,
}

impl Observer<AckKey, AckEntry, (), rocketmq_grpc::Error> for AckTally {
    fn before_flush(&self, _key: &AckKey, batch: &BatchInfo, _items: &[AckEntry]) {
        let mut tally = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *tally
            .requests_by_reason
            .entry(batch.reason.as_str())
            .or_default() += 1;
        *tally.requests_by_size.entry(batch.len).or_default() += 1;
        tally.entries += batch.len as u64;
    }

    fn after_flush(
        &self,
        _key: &AckKey,
        _batch: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), rocketmq_grpc::Error>],
    ) {
        let mut tally = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            if matches!(view.reply, ItemReply::Ok(())) {
                tally.confirmed += 1;
            } else {
                tally.failed += 1;
            }
        }
    }
}

impl AckTally {
    fn print(&self) {
        let tally = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let requests: u64 = tally.requests_by_reason.values().sum();
        println!(
            "acks: {} confirmed, {} failed, in {requests} AckMessage requests ({:.1} entries per request)",
            tally.confirmed,
            tally.failed,
            if requests == 0 {
                0.0
            } else {
                tally.entries as f64 / requests as f64
            }
        );
        for (reason, n) in &tally.requests_by_reason {
            println!("  {n:>6} requests flushed on {reason}");
        }
        for (size, n) in &tally.requests_by_size {
            println!("  {n:>6} requests of {size} entries");
        }
    }
}

/// Lets `main` keep a handle on the handler's counter.
struct SharedHandler(Arc<Handler>);

#[async_trait::async_trait]
impl MessageHandler for SharedHandler {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.0.handle(message).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_command_lines_parse() {
        let parse =
            |a: &[&str]| Options::try_parse_from(["rocketmq_push_consumer"].iter().chain(a));
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.endpoint, o.topic.as_str(), o.group.as_str()),
            (None, "orders", "order-consumers")
        );
        assert_eq!((o.messages, o.timeout), (2_000, Duration::from_secs(30)));
        let o = parse(&[
            "--endpoint",
            "127.0.0.1:8081",
            "--topic",
            "t",
            "--group",
            "g",
            "--access-key",
            "AK",
            "--secret-key",
            "SK",
            "--namespace",
            "NS",
            "--messages",
            "20",
            "--timeout",
            "5",
        ])
        .unwrap();
        assert_eq!(o.endpoint.as_deref(), Some("127.0.0.1:8081"));
        assert_eq!((o.topic.as_str(), o.group.as_str()), ("t", "g"));
        assert_eq!(
            (o.access_key.as_deref(), o.secret_key.as_deref()),
            (Some("AK"), Some("SK"))
        );
        assert_eq!(o.namespace.as_deref(), Some("NS"));
        assert_eq!((o.messages, o.timeout), (20, Duration::from_secs(5)));
        assert!(parse(&["--access-key", "AK"]).is_err());
        assert!(parse(&["--messages", "x"]).is_err());
    }
}
