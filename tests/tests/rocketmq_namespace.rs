//! Namespaces against a real RocketMQ proxy (`scripts/brokers/rocketmq start` creates the topic
//! `rbns%nst`: topic `nst` in namespace `rbns`).
//!
//! The 5.3.3 proxy reads neither `Resource.resource_namespace` nor the `x-mq-namespace` header
//! (the Java client sends both): it looks up the name as given, so the client names resources
//! as the broker stores them, `rbns%nst`, and the proxy answers with the name without the
//! namespace (`nst`, `resource_namespace` `rbns`).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set (the script prints it); otherwise every test returns at
//! once.

use integration_tests::real_rocketmq::{endpoint, unique};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage, SimpleConsumer,
};

const NAMESPACE: &str = "rbns";
const TOPIC: &str = "nst";

fn config(endpoint: &str) -> ClientConfig {
    ClientConfig::new(endpoint)
        .expect("endpoint")
        .namespace(NAMESPACE)
}

async fn send(endpoint: &str, count: usize, tag: &str) -> HashSet<String> {
    let producer = Producer::builder(config(endpoint))
        .build()
        .expect("session");
    let mut ids = HashSet::new();
    for i in 0..count {
        let receipt = producer
            .send(OutgoingMessage::new(TOPIC, format!("{tag} {i}")))
            .await
            .expect("a send in the namespace");
        ids.insert(receipt.message_id().to_owned());
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simple_consumer_receives_what_was_sent_in_the_namespace() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let consumer = SimpleConsumer::builder(config(&endpoint), unique("it-ns-simple"))
        .subscribe(TOPIC, "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts in the namespace");
    // A new group starts at the topic's first message still in memory: take the backlog.
    loop {
        let messages = consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("a receive of the backlog");
        if messages.is_empty() {
            break;
        }
        for message in messages {
            consumer.ack(&message).await.expect("an ack of the backlog");
        }
    }
    let sent = send(&endpoint, 5, "simple").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = HashSet::new();
    while !sent.is_subset(&seen) {
        assert!(Instant::now() < deadline, "received {} of 5", seen.len());
        for message in consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("a receive in the namespace")
        {
            // Named as the application named it, without the namespace.
            assert_eq!(message.topic(), TOPIC);
            consumer
                .ack(&message)
                .await
                .expect("an ack in the namespace");
            seen.insert(message.message_id().to_owned());
        }
    }
    consumer.close(Duration::from_secs(10)).await;
}

/// Records the ids of the messages handled, checking that each names its topic without the
/// namespace.
#[derive(Default)]
struct Seen {
    seen: Mutex<HashSet<String>>,
    handled: AtomicUsize,
}

#[async_trait::async_trait]
impl MessageHandler for Seen {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        assert_eq!(message.topic(), TOPIC);
        self.seen.lock().insert(message.message_id().to_owned());
        self.handled.fetch_add(1, Ordering::Relaxed);
        ConsumeResult::Success
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_consumer_handles_what_was_sent_in_the_namespace() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let handler = Arc::new(Seen::default());
    let consumer = PushConsumer::builder(config(&endpoint), unique("it-ns-push"))
        .subscribe(TOPIC, "*")
        .handler(Arc::clone(&handler))
        .build()
        .await
        .expect("the push consumer starts in the namespace");
    let sent = send(&endpoint, 5, "push").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sent.is_subset(&handler.seen.lock()) {
        assert!(
            Instant::now() < deadline,
            "handled {} of 5 ({} messages in all)",
            sent.intersection(&handler.seen.lock()).count(),
            handler.handled.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.close(Duration::from_secs(10)).await;
}
