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

use clap::Parser;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, Error, MessageHandler,
    OutgoingMessage, Producer, PushConsumer, ReceivedMessage,
};

/// A producer and a push consumer streaming on one topic while the proxy restarts.
#[derive(Debug, Parser)]
#[command(name = "rocketmq_restart_stream", args_override_self = true)]
struct Args {
    /// The proxy's gRPC endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    endpoint: String,
    /// The topic.
    #[arg(long, value_name = "T")]
    topic: String,
    /// The consumer group.
    #[arg(long, value_name = "G")]
    group: String,
    /// Messages sent per second.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Seconds of sending.
    #[arg(long, value_name = "N", default_value_t = 60)]
    seconds: u64,
    /// Seconds to wait for the last deliveries after the last send.
    #[arg(long, value_name = "N", default_value_t = 60)]
    patience: u64,
    /// The payloads' prefix; deliveries of other payloads are acknowledged, not printed.
    #[arg(long, value_name = "P", default_value = "m")]
    prefix: String,
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
        let payload = String::from_utf8_lossy(message.body()).into_owned();
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
        .handler(Arc::clone(&handler))
        .build()
        .await?;
    let producer = Arc::new(Producer::builder(config).build()?);
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
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rocketmq_restart_stream: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_of_the_restart_script_parses() {
        // scripts/bench-rocketmq-restart.sh
        let args = Args::try_parse_from([
            "rocketmq_restart_stream",
            "--endpoint",
            "127.0.0.1:8081",
            "--topic",
            "T",
            "--group",
            "G",
            "--rate",
            "50",
            "--seconds",
            "30",
            "--patience",
            "90",
            "--prefix",
            "p1-",
        ])
        .unwrap();
        assert_eq!(
            (args.endpoint.as_str(), args.topic.as_str()),
            ("127.0.0.1:8081", "T")
        );
        assert_eq!((args.rate, args.seconds, args.patience), (50, 30, 90));
        assert_eq!((args.group.as_str(), args.prefix.as_str()), ("G", "p1-"));
        let args = Args::try_parse_from([
            "rocketmq_restart_stream",
            "--endpoint",
            "e",
            "--topic",
            "T",
            "--group",
            "G",
        ])
        .unwrap();
        assert_eq!((args.rate, args.seconds, args.patience), (100, 60, 60));
        assert_eq!(args.prefix, "m");
        assert!(Args::try_parse_from(["rocketmq_restart_stream", "--topic", "T"]).is_err());
    }
}
