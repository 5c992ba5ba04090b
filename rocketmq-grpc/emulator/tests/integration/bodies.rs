//! Message bodies are `bytes::Bytes` end to end: what a producer sends (or the emulator
//! publishes) is what a consumer receives, byte for byte, from an empty body to 1 MiB.
//!
//! Virtual time (tokio's clock paused): waits pass at once.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use rocketmq_grpc::{OutgoingMessage, Producer, ReceivedMessage, SimpleConsumer};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};

use crate::support::{self, GROUP};

const TOPIC: &str = "bodies";

/// An emulator that, unlike the proxy, takes empty bodies (to see one go through unchanged).
async fn emulator() -> Emulator {
    Emulator::builder()
        .group(GROUP, false)
        .topic(TOPIC, TopicKind::Normal, 4)
        .reject_empty_body(false)
        .start()
        .await
        .expect("the emulator starts")
}

async fn consumer(emulator: &Emulator) -> SimpleConsumer {
    SimpleConsumer::builder(support::config(emulator), GROUP)
        .subscribe(TOPIC, "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts")
}

/// Receives (and acknowledges) until `n` messages came, by message id.
async fn receive(consumer: &SimpleConsumer, n: usize) -> HashMap<String, ReceivedMessage> {
    let mut all = HashMap::new();
    while all.len() < n {
        for message in consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("receive")
        {
            consumer.ack(&message).await.expect("ack");
            all.insert(message.message_id().to_owned(), message);
        }
    }
    all
}

/// Bodies of every shape: text, every byte value, empty, a slice of a larger buffer, and
/// 1 MiB that is not one repeated byte.
fn bodies() -> Vec<(&'static str, Bytes)> {
    let all_bytes: Vec<u8> = (0..=255).collect();
    let large = Bytes::from(
        (0..1024 * 1024_u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect::<Vec<u8>>(),
    );
    vec![
        ("text", Bytes::from_static("hello, 世界".as_bytes())),
        ("every byte value", Bytes::from(all_bytes)),
        ("empty", Bytes::new()),
        ("a slice", large.slice(1000..1100)),
        ("1 MiB", large),
    ]
}

#[tokio::test(start_paused = true)]
async fn bodies_sent_as_bytes_are_received_unchanged() {
    let emulator = emulator().await;
    let producer = Producer::builder(support::config(&emulator))
        .build()
        .expect("a session");
    let mut sent = HashMap::new();
    for (what, body) in bodies() {
        let message = OutgoingMessage::new(TOPIC, body.clone());
        assert_eq!(message.body(), &body, "{what}: the message holds its body");
        let receipt = producer.send(message).await.expect("sent");
        sent.insert(receipt.message_id().to_owned(), (what, body));
    }
    let consumer = consumer(&emulator).await;
    let received = receive(&consumer, sent.len()).await;
    assert_eq!(received.len(), sent.len());
    for (id, (what, body)) in &sent {
        let message = &received[id];
        assert_eq!(message.body().len(), body.len(), "{what}: its length");
        assert!(message.body() == body, "{what}: its content");
    }
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn bodies_published_by_the_emulator_are_received_unchanged() {
    let emulator = emulator().await;
    let mut published = HashMap::new();
    for (what, body) in bodies() {
        let stored = emulator
            .publish(TOPIC, PublishMessage::new(body.clone()))
            .expect("published");
        published.insert(stored.message_id, (what, body));
    }
    let consumer = consumer(&emulator).await;
    let received = receive(&consumer, published.len()).await;
    for (id, (what, body)) in &published {
        assert!(received[id].body() == body, "{what}: its content");
    }
    consumer.close(Duration::from_secs(5)).await;
}
