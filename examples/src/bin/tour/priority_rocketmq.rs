//! Capability 3 on RocketMQ: the same backlog and urgent messages on the RocketMQ proxy
//! emulator, consumed by a push consumer without priority (one topic) and with level topics
//! and the priority gate (`PriorityTopics` + `PushConsumerBuilder::priority`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics};
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, OutgoingMessage, Producer, PushConsumer, ReceivedMessage,
};
use rocketmq_grpc_emulator::{Emulator, TopicKind};
use tokio::sync::watch;

use crate::priority::{HIGH, LOW, Outcome, PROPERTY};

const GROUP: &str = "tour";
const URGENT_TOPIC: &str = "tour-urgent";
const LOW_TOPIC: &str = "tour-low";

/// Queues [`LOW`] low messages and then [`HIGH`] urgent ones, starts one push consumer
/// (concurrency 64) and waits until it has handled them all.
pub(crate) async fn drain(with_priority: bool) -> Result<Outcome, Box<dyn std::error::Error>> {
    // One queue per topic: the proxy assigns a push consumer one queue per broker and topic.
    let emulator = Emulator::builder()
        .topic(URGENT_TOPIC, TopicKind::Normal, 1)
        .topic(LOW_TOPIC, TopicKind::Normal, 1)
        .group(GROUP, false)
        .start()
        .await?;
    let config = ClientConfig::new(&emulator.endpoint())?;
    let policy = PriorityPolicy::builder()
        .levels(2)
        .property(PROPERTY)
        .build()?;
    let topics = PriorityTopics::builder(policy)
        .level_topics([URGENT_TOPIC, LOW_TOPIC])
        .build()?;
    let producer = Producer::builder(config.clone()).build()?;
    let mut confirmed: HashMap<String, Instant> = HashMap::with_capacity(HIGH);
    let names = (0..LOW)
        .map(|i| (format!("l{i}"), "1"))
        .chain((0..HIGH).map(|i| (format!("h{i}"), "0")));
    let names: Vec<_> = names.collect();
    for chunk in names.chunks(1_000) {
        let sends = chunk.iter().map(|(name, level)| {
            // Without priority every message goes to the low topic, behind the backlog.
            let message = OutgoingMessage::new(LOW_TOPIC, name.clone()).property(PROPERTY, *level);
            let (producer, topics) = (&producer, &topics);
            async move {
                let sent = if with_priority {
                    producer.send_prioritized(topics, message).await
                } else {
                    producer.send(message).await
                };
                sent.map(|_| (name, Instant::now()))
            }
        });
        for sent in futures_util::future::join_all(sends).await {
            let (name, at) = sent?;
            if name.starts_with('h') {
                confirmed.insert(name.clone(), at);
            }
        }
    }
    let handled: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let (counter, mut count) = watch::channel(0usize);
    let sink = Arc::clone(&handled);
    let builder = PushConsumer::builder(config, GROUP).concurrency(64);
    let builder = if with_priority {
        builder.priority(topics, GateConfig::default())
    } else {
        builder.subscribe(LOW_TOPIC, "*")
    };
    let consumer = builder
        .handler(move |message: ReceivedMessage| {
            let name = String::from_utf8_lossy(message.body()).into_owned();
            sink.lock().push((name, Instant::now()));
            counter.send_modify(|c| *c += 1);
            async { ConsumeResult::Success }
        })
        .build()
        .await?;
    let all = tokio::time::timeout(
        Duration::from_secs(120),
        count.wait_for(|c| *c >= LOW + HIGH),
    );
    all.await
        .map_err(|_| "not every message was handled in 120 s")??;
    let report = consumer.close(Duration::from_secs(10)).await;
    let handled = handled.lock();
    let mut urgent = Vec::with_capacity(HIGH);
    let mut seen: HashMap<&str, u32> = HashMap::with_capacity(LOW + HIGH);
    let (mut low_so_far, mut low_before_last_urgent) = (0, 0);
    for (name, at) in handled.iter() {
        if let Some(sent) = confirmed.get(name) {
            urgent.push(at.saturating_duration_since(*sent));
            low_before_last_urgent = low_so_far;
        } else {
            low_so_far += 1;
        }
        *seen.entry(name.as_str()).or_default() += 1;
    }
    urgent.sort_unstable();
    Ok(Outcome {
        delivered_once: seen.len() == LOW + HIGH
            && seen.values().all(|&n| n == 1)
            && report.unacknowledged.is_empty(),
        urgent,
        low_before_last_urgent,
    })
}
