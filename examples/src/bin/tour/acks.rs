//! Capability 1: the same messages acknowledged one RPC per message and batched.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rocketmq_grpc::{
    AckSettings, ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage, Producer,
    PushConsumer, ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, TopicKind};
use tokio::sync::Notify;

use crate::table;

const MESSAGES: u64 = 4_000;
const QUEUES: u32 = 4;

/// Counts what the handler saw and wakes the waiter when all messages are in.
#[derive(Debug, Default)]
struct Counting {
    seen: AtomicU64,
    all_in: Notify,
}

/// The consumer's handler; the run keeps the other handle on the counts.
struct Handler(Arc<Counting>);

#[async_trait::async_trait]
impl MessageHandler for Handler {
    async fn handle(&self, _message: &ReceivedMessage) -> ConsumeResult {
        if self.0.seen.fetch_add(1, Ordering::Relaxed) + 1 == MESSAGES {
            self.0.all_in.notify_one();
        }
        ConsumeResult::Success
    }
}

struct Outcome {
    requests: u64,
    entries: u64,
    unacknowledged: usize,
    took: Duration,
}

/// Sends [`MESSAGES`] to a fresh topic, consumes them with `acks`, shuts down, and reads the
/// emulator's counters for that run.
async fn consume(emulator: &Emulator, topic: &str, acks: AckSettings) -> Result<Outcome, String> {
    let error = |what: &'static str| move |e: rocketmq_grpc::Error| format!("{what}: {e}");
    let config = ClientConfig::new(&emulator.endpoint()).map_err(error("config"))?;
    let counting = Arc::new(Counting::default());
    let before = emulator.stats();
    let started = Instant::now();
    let consumer = PushConsumer::builder(config.clone(), format!("{topic}-group"))
        .subscribe(topic, "*")
        .concurrency(256)
        .acks(acks)
        .handler(Handler(Arc::clone(&counting)))
        .build()
        .await
        .map_err(error("consumer"))?;
    let producer = Producer::builder(config)
        .build()
        .map_err(error("session"))?;
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(64) {
        let sends = chunk
            .iter()
            .map(|i| producer.send(OutgoingMessage::new(topic, format!("order #{i}"))));
        for sent in futures_util::future::join_all(sends).await {
            sent.map_err(error("send"))?;
        }
    }
    let all_in = counting.all_in.notified();
    if counting.seen.load(Ordering::Relaxed) < MESSAGES {
        tokio::time::timeout(Duration::from_secs(30), all_in)
            .await
            .map_err(|_| "not every message arrived within 30 s".to_owned())?;
    }
    let report = consumer.close(Duration::from_secs(10)).await;
    let took = started.elapsed();
    let after = emulator.stats();
    Ok(Outcome {
        requests: after.ack_requests() - before.ack_requests(),
        entries: after.ack_entries - before.ack_entries,
        unacknowledged: report.unacknowledged.len(),
        took,
    })
}

/// Runs both modes and prints the table; the claim is fewer RPCs than 1 per 100 messages,
/// with every message acknowledged.
pub(crate) async fn run() -> Result<bool, String> {
    let (immediate, batched) = ("tour-acks-one-per-message", "tour-acks-batched");
    let emulator = Emulator::builder()
        .topic(immediate, TopicKind::Normal, QUEUES)
        .group(format!("{immediate}-group"), false)
        .topic(batched, TopicKind::Normal, QUEUES)
        .group(format!("{batched}-group"), false)
        .start()
        .await
        .map_err(|e| format!("emulator: {e}"))?;
    let one = consume(&emulator, immediate, AckSettings::immediate()).await?;
    let ours = consume(&emulator, batched, AckSettings::default()).await?;
    emulator
        .shutdown()
        .await
        .map_err(|e| format!("emulator shutdown: {e}"))?;

    let row = |name: &str, o: &Outcome| {
        vec![
            name.to_owned(),
            MESSAGES.to_string(),
            o.requests.to_string(),
            format!("{:.1}", o.entries as f64 / o.requests.max(1) as f64),
            o.unacknowledged.to_string(),
            format!("{:.2?}", o.took),
        ]
    };
    table::print(
        &[
            "acks",
            "messages",
            "AckMessage RPCs",
            "entries/RPC",
            "unacked at shutdown",
            "took",
        ],
        &[
            row("one per message (official clients)", &one),
            row("batched per (endpoint, topic)", &ours),
        ],
    );
    let holds = ours.requests * 100 <= MESSAGES
        && ours.entries == MESSAGES
        && ours.unacknowledged == 0
        && one.unacknowledged == 0;
    println!(
        "  {:.1}x fewer ack RPCs; every message acknowledged once in both runs",
        one.requests as f64 / ours.requests.max(1) as f64
    );
    Ok(holds)
}
