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
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Credentials, MessageHandler,
    OutgoingMessage, Producer, PushCloseReport, PushConsumer, ReceivedMessage, Session,
};
use rocketmq_grpc_emulator::{Emulator, TopicKind};
use tokio::task::JoinSet;

const USAGE: &str = "usage: rocketmq_push_consumer [--endpoint HOST:PORT --topic TOPIC --group GROUP \
[--access-key AK --secret-key SK] [--namespace NS]] [--messages N] [--timeout SECS]";

/// Command-line options.
#[derive(Debug)]
struct Options {
    /// A real proxy; `None` starts the embedded emulator.
    endpoint: Option<String>,
    topic: String,
    group: String,
    access_key: Option<String>,
    secret_key: Option<String>,
    namespace: Option<String>,
    messages: u64,
    /// How long to wait for every message to be consumed.
    timeout: Duration,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        endpoint: None,
        topic: "orders".into(),
        group: "order-consumers".into(),
        access_key: None,
        secret_key: None,
        namespace: None,
        messages: 2_000,
        timeout: Duration::from_secs(30),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--endpoint" => options.endpoint = Some(value()?),
            "--topic" => options.topic = value()?,
            "--group" => options.group = value()?,
            "--access-key" => options.access_key = Some(value()?),
            "--secret-key" => options.secret_key = Some(value()?),
            "--namespace" => options.namespace = Some(value()?),
            "--messages" => {
                options.messages = value()?
                    .parse()
                    .map_err(|_| "--messages needs a number".to_string())?;
            }
            "--timeout" => {
                let secs: u64 = value()?
                    .parse()
                    .map_err(|_| "--timeout needs a number of seconds".to_string())?;
                options.timeout = Duration::from_secs(secs);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.access_key.is_some() != options.secret_key.is_some() {
        return Err("--access-key and --secret-key go together".into());
    }
    Ok(options)
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
                message.message_id,
                message.topic,
                message.queue_id,
                message.delivery_attempt,
                String::from_utf8_lossy(&message.body)
            );
        } else if n == 4 {
            println!("  ... (only the first three are printed)");
        }
        ConsumeResult::Success
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("error: {error}");
            }
            eprintln!("{USAGE}");
            return if error.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
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
        .start(SharedHandler(Arc::clone(&handler)))
        .await?;
    println!("consumer {} subscribed", consumer.client_id());

    // 3. Some messages, 32 in flight at a time.
    let producer = Arc::new(Producer::new(Session::new(config)?));
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
