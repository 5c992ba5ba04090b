//! One side of the RocketMQ restart benchmark (`scripts/bench-rocketmq-restart.sh`): a
//! producer and a push consumer (batched acks) on one topic, streaming at a fixed rate while
//! the proxy is restarted under them. Nothing in here reconnects or retries anything: that is
//! the client's job.
//!
//! ```text
//! cargo run --release -p bench-tools --bin rocketmq_restart_stream -- \
//!     --endpoint 127.0.0.1:8081 --topic T --group G [--rate 100] [--seconds 60] [--patience 60] \
//!     [--prefix P]
//! ```
//!
//! Payloads are `PREFIX` (default `m`) and a sequence number; deliveries of other payloads
//! (older runs on the topic: a new group starts at the topic's first message) are acknowledged
//! and not printed. It prints one line per event, with the Unix time in milliseconds: `ready` once consuming,
//! `sent MS PAYLOAD` when a send has its receipt, `send-error MS PAYLOAD ERROR`, `recv MS
//! PAYLOAD` for every delivery (each is acknowledged), `acked MS N` when the proxy confirmed N
//! acks, and at the end `report unacknowledged=N ack_failed=N` from the shutdown report and
//! `done`. The script reads the same lines from the Java peer.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Error, MessageHandler,
    OutgoingMessage, Producer, PushConsumer, ReceivedMessage, Session,
};

struct Args {
    endpoint: String,
    topic: String,
    group: String,
    rate: u32,
    seconds: u64,
    patience: u64,
    prefix: String,
}

fn parse_args() -> Result<Args, String> {
    let (mut endpoint, mut topic, mut group) = (None, None, None);
    let (mut rate, mut seconds, mut patience) = (100u32, 60u64, 60u64);
    let mut prefix = "m".to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |flag: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{flag} takes a number"))
        };
        match arg.as_str() {
            "--endpoint" => endpoint = it.next(),
            "--topic" => topic = it.next(),
            "--group" => group = it.next(),
            "--rate" => rate = u32::try_from(number("--rate")?.max(1)).unwrap_or(u32::MAX),
            "--seconds" => seconds = number("--seconds")?,
            "--patience" => patience = number("--patience")?,
            "--prefix" => prefix = it.next().ok_or("--prefix takes a value")?,
            "-h" | "--help" => {
                return Err(
                    "usage: rocketmq_restart_stream --endpoint HOST:PORT --topic T \
                     --group G [--rate N] [--seconds N] [--patience N] [--prefix P]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(Args {
        endpoint: endpoint.ok_or("--endpoint is required")?,
        topic: topic.ok_or("--topic is required")?,
        group: group.ok_or("--group is required")?,
        rate,
        seconds,
        patience,
        prefix,
    })
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Prints every delivery and remembers its payload.
struct Printing {
    prefix: String,
    seen: Mutex<HashSet<String>>,
}

#[async_trait::async_trait]
impl MessageHandler for Printing {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let payload = String::from_utf8_lossy(&message.body).into_owned();
        if !payload.starts_with(&self.prefix) {
            return ConsumeResult::Success;
        }
        println!("recv {} {payload}", now_ms());
        self.seen.lock().insert(payload);
        ConsumeResult::Success
    }
}

/// Prints how many acks each `AckMessage` answer confirmed.
struct AckPrinter;

impl Observer<AckKey, AckEntry, (), Error> for AckPrinter {
    fn after_flush(&self, _: &AckKey, _: &BatchInfo, items: &[ItemView<'_, AckEntry, (), Error>]) {
        let acked = items
            .iter()
            .filter(|v| v.next == Next::Resolved && matches!(v.reply, ItemReply::Ok(())))
            .count();
        if acked > 0 {
            println!("acked {} {acked}", now_ms());
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    let config = ClientConfig::new(&args.endpoint)?;
    let handler = Arc::new(Printing {
        prefix: args.prefix.clone(),
        seen: Mutex::new(HashSet::new()),
    });
    let consumer = PushConsumer::builder(config.clone(), &args.group)
        .subscribe(&args.topic, "*")
        .acks(AckSettings::default().observer(Arc::new(AckPrinter)))
        .start(Arc::clone(&handler))
        .await?;
    let producer = Arc::new(Producer::new(Session::new(config)?));
    println!("ready");
    let sent = Arc::new(Mutex::new(HashSet::new()));
    let total = u64::from(args.rate) * args.seconds;
    let every = Duration::from_secs(1) / args.rate;
    let started = Instant::now();
    let producing = tokio::spawn({
        let sent = Arc::clone(&sent);
        let topic = args.topic.clone();
        let prefix = args.prefix.clone();
        async move {
            let mut sends = Vec::new();
            for i in 0..total {
                tokio::time::sleep_until((started + every * i as u32).into()).await;
                let producer = Arc::clone(&producer);
                let sent = Arc::clone(&sent);
                let topic = topic.clone();
                let payload = format!("{prefix}{i}");
                sends.push(tokio::spawn(async move {
                    let message = OutgoingMessage::new(topic, payload.clone().into_bytes());
                    match producer.send(message).await {
                        Ok(_) => {
                            println!("sent {} {payload}", now_ms());
                            sent.lock().insert(payload);
                        }
                        Err(error) => println!("send-error {} {payload} {error}", now_ms()),
                    }
                }));
            }
            for send in sends {
                let _ = send.await;
            }
        }
    });
    let deadline = started + Duration::from_secs(args.seconds + args.patience);
    loop {
        let all_seen = {
            let seen = handler.seen.lock();
            sent.lock().iter().all(|p| seen.contains(p))
        };
        if (producing.is_finished() && all_seen) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = producing.await;
    let report = consumer.close(Duration::from_secs(10)).await;
    println!(
        "report unacknowledged={} ack_failed={}",
        report.unacknowledged.len(),
        report.acks.failed
    );
    println!("done");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rocketmq_restart_stream: {error}");
            ExitCode::FAILURE
        }
    }
}
