//! Shared pieces: handlers, an ack recorder and waiting for conditions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ack_batcher::{BatchInfo, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, ClientConfig, ConsumeResult, Error, MessageHandler, PushConsumer,
    ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};

pub(crate) const GROUP: &str = "group";

/// Succeeds every message, optionally after a pause, and counts them.
#[derive(Default)]
pub(crate) struct Handler {
    pub(crate) handled: Arc<AtomicU64>,
    pub(crate) pause: Duration,
}

#[async_trait::async_trait]
impl MessageHandler for Handler {
    async fn handle(&self, _message: &ReceivedMessage) -> ConsumeResult {
        if !self.pause.is_zero() {
            tokio::time::sleep(self.pause).await;
        }
        self.handled.fetch_add(1, Ordering::Relaxed);
        ConsumeResult::Success
    }
}

/// What the ack observer saw: per batch its topic and message ids, per message its final reply.
#[derive(Default)]
pub(crate) struct Acks {
    pub(crate) batches: Mutex<Vec<(String, Vec<String>)>>,
    /// Final outcome per message id: `Ok(())` or the error's code.
    pub(crate) finals: Mutex<HashMap<String, Result<(), Option<i32>>>>,
    pub(crate) missing_seen: AtomicU64,
}

impl Observer<AckKey, AckEntry, (), Error> for Acks {
    fn before_flush(&self, key: &AckKey, _: &BatchInfo, items: &[AckEntry]) {
        let ids = items.iter().map(|e| e.message_id.clone()).collect();
        self.batches.lock().push((key.topic.clone(), ids));
    }

    fn after_flush(&self, _: &AckKey, _: &BatchInfo, items: &[ItemView<'_, AckEntry, (), Error>]) {
        let mut finals = self.finals.lock();
        for view in items {
            if matches!(view.reply, ItemReply::Missing) {
                self.missing_seen.fetch_add(1, Ordering::Relaxed);
            }
            if view.next != Next::Resolved {
                continue;
            }
            let outcome = match view.reply {
                ItemReply::Ok(()) => Ok(()),
                ItemReply::Err(error) => Err(error.code().map(|c| c as i32)),
                _ => Err(None),
            };
            let previous = finals.insert(view.item.message_id.clone(), outcome);
            assert!(
                previous.is_none(),
                "{} resolved twice",
                view.item.message_id
            );
        }
    }
}

/// An emulator with `topics` normal topics of 4 queues and the group.
pub(crate) async fn emulator(topics: &[&str]) -> Emulator {
    let mut builder = Emulator::builder().group(GROUP, false).seed(7);
    for topic in topics {
        builder = builder.topic(*topic, TopicKind::Normal, 4);
    }
    builder.start().await.expect("the emulator starts")
}

/// Publishes `n` small messages and returns their ids.
pub(crate) fn publish(emulator: &Emulator, topic: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            emulator
                .publish(topic, PublishMessage::new(format!("message {i}")))
                .expect("publish")
                .message_id
        })
        .collect()
}

pub(crate) fn config(emulator: &Emulator) -> ClientConfig {
    ClientConfig::new(&emulator.endpoint()).expect("a valid endpoint")
}

/// Waits (polling, bounded) until `done` holds.
pub(crate) async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the consumer handled `n` messages.
pub(crate) async fn wait_handled(consumer: &PushConsumer, n: u64, limit: Duration) {
    wait_for(&format!("{n} handled messages"), limit, || {
        consumer.stats().consumed >= n
    })
    .await;
}
