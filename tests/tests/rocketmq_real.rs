//! The RocketMQ adapter against a real proxy (`scripts/brokers/rocketmq start`).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set (the script prints it); otherwise every test returns at
//! once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::{
    AckSettings, ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage, Producer,
    PushConsumer, ReceivedMessage, Session,
};

fn endpoint() -> Option<String> {
    std::env::var("ROCKETMQ_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
}

/// Records every message id it sees, and how often.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl MessageHandler for Recorder {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.seen.lock().push(message.message_id.clone());
        ConsumeResult::Success
    }
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_acks_are_accepted_and_nothing_is_redelivered() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal";
    let group = format!("it-group-{}", std::process::id());
    let config = ClientConfig::new(&endpoint).unwrap();
    // Subscribe first so that the new group starts before the messages.
    let recorder = Arc::new(Recorder::default());
    let consumer = PushConsumer::builder(config.clone(), group.as_str())
        .subscribe(topic, "*")
        .acks(AckSettings::default().max_delay(Duration::from_secs(1)))
        .start(recorder.clone())
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::new(Session::new(config.clone()).unwrap());
    let mut sent = HashSet::new();
    for i in 0..500 {
        let receipt = producer
            .send(OutgoingMessage::new(topic, format!("message {i}")))
            .await
            .expect("send");
        sent.insert(receipt.message_id);
    }
    wait_for("500 messages", Duration::from_secs(120), || {
        let seen = recorder.seen.lock();
        sent.iter().all(|id| seen.contains(id))
    })
    .await;
    wait_for("their acks", Duration::from_secs(30), || {
        consumer.stats().acked >= 500
    })
    .await;
    let stats = consumer.stats();
    assert_eq!(stats.ack_failed, 0, "{stats:?}");
    assert!(
        stats
            .acks
            .batch_sizes
            .buckets()
            .any(|(low, _, _)| low >= 16),
        "the proxy accepted multi-entry AckMessage requests: {:?}",
        stats.acks.batch_sizes
    );
    let report = consumer.shutdown(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    let ours = |seen: &[String]| seen.iter().filter(|id| sent.contains(*id)).count();
    assert_eq!(
        ours(&recorder.seen.lock()),
        500,
        "no duplicates before shutdown"
    );
}
