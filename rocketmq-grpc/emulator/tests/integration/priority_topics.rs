//! `rocketmq_grpc::priority` against the emulator: messages routed by a priority policy land
//! on their level's topic (level topics, any 5.x) or carry their level as the native priority
//! (5.4+), and a consumer reads the level back.
//!
//! Virtual time (`start_paused`): long polls and ack delays pass at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::priority::{GateConfig, Level, PriorityPolicy, PriorityTopics, Strategy};
use rocketmq_grpc::{
    ConsumeResult, Error, OutgoingMessage, Producer, PushConsumer, ReceivedMessage, SimpleConsumer,
};
use rocketmq_grpc_emulator::{Emulator, PublishMessage, TopicKind};

use crate::support::{self, GROUP};

const LEVELS: [&str; 3] = ["prio-0", "prio-1", "prio-2"];
const NATIVE: &str = "prio-native";

async fn emulator() -> Emulator {
    let mut builder = Emulator::builder().group(GROUP, false);
    for topic in LEVELS {
        builder = builder.topic(topic, TopicKind::Normal, 2);
    }
    builder
        .topic(NATIVE, TopicKind::Priority, 3)
        .start()
        .await
        .expect("the emulator starts")
}

fn policy() -> PriorityPolicy {
    PriorityPolicy::builder()
        .levels(3)
        .default_level(1)
        .build()
        .unwrap()
}

fn producer(emulator: &Emulator) -> Producer {
    Producer::builder(support::config(emulator))
        .build()
        .unwrap()
}

/// `counts[k]` messages of level `k`, and `unlabelled` without the property.
async fn send(producer: &Producer, topics: &PriorityTopics, counts: [usize; 3], unlabelled: usize) {
    let property = topics.policy().property().to_owned();
    for (level, &count) in counts.iter().enumerate() {
        for i in 0..count {
            let message = OutgoingMessage::new("ignored", format!("{level}-{i}"))
                .property(&property, level.to_string());
            producer.send_prioritized(topics, message).await.unwrap();
        }
    }
    for i in 0..unlabelled {
        let message = OutgoingMessage::new("ignored", format!("none-{i}"));
        producer.send_prioritized(topics, message).await.unwrap();
    }
}

fn stored(emulator: &Emulator, topic: &str) -> Vec<u64> {
    emulator.topic_info(topic).unwrap().messages_per_queue
}

/// Receives `n` messages from `topic` and counts them by the level `topics` reads.
async fn levels_received(
    emulator: &Emulator,
    topics: &PriorityTopics,
    topic: &str,
    n: usize,
) -> HashMap<Level, usize> {
    let consumer = SimpleConsumer::builder(support::config(emulator), GROUP)
        .subscribe(topic, "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts");
    let mut levels = HashMap::new();
    let mut got = 0;
    while got < n {
        for message in consumer.receive(16, Duration::from_secs(30)).await.unwrap() {
            *levels.entry(topics.level_of(&message)).or_insert(0) += 1;
            consumer.ack(&message).await.unwrap();
            got += 1;
        }
    }
    consumer.close(Duration::from_secs(5)).await;
    levels
}

#[tokio::test(start_paused = true)]
async fn level_topics_take_each_level_and_the_default_takes_the_unlabelled() {
    let emulator = emulator().await;
    let topics = PriorityTopics::builder(policy())
        .level_topics(LEVELS)
        .build()
        .unwrap();
    send(&producer(&emulator), &topics, [3, 5, 7], 2).await;
    let per_topic: Vec<u64> = LEVELS
        .iter()
        .map(|t| stored(&emulator, t).iter().sum())
        .collect();
    assert_eq!(per_topic, [3, 7, 7]);
    assert_eq!(stored(&emulator, NATIVE), [0, 0, 0]);
    let stats = topics.policy().stats();
    assert_eq!((stats.valid, stats.missing), (15, 2));
    // The unlabelled ones got the default level's property: read back as level 1.
    let levels = levels_received(&emulator, &topics, LEVELS[1], 7).await;
    assert_eq!(levels, HashMap::from([(Level::new(1), 7)]));
}

#[tokio::test(start_paused = true)]
async fn native_levels_are_priorities_on_their_queues() {
    let emulator = emulator().await;
    let topics = PriorityTopics::builder(policy())
        .native(NATIVE)
        .build()
        .unwrap();
    send(&producer(&emulator), &topics, [3, 5, 7], 2).await;
    // Level k has priority 2 - k, stored on queue 2 - k.
    assert_eq!(stored(&emulator, NATIVE), [7, 7, 3]);
    for topic in LEVELS {
        assert_eq!(stored(&emulator, topic).iter().sum::<u64>(), 0);
    }
    let levels = levels_received(&emulator, &topics, NATIVE, 17).await;
    assert_eq!(
        levels,
        HashMap::from([(Level::new(0), 3), (Level::new(1), 7), (Level::new(2), 7)])
    );
}

/// A Java 5.5 producer's `setPriority(p)` message has no property: its level is read from
/// the native priority.
#[tokio::test(start_paused = true)]
async fn a_native_priority_without_the_property_is_read_back_as_its_level() {
    let emulator = emulator().await;
    let topics = PriorityTopics::builder(policy())
        .native(NATIVE)
        .build()
        .unwrap();
    let producer = producer(&emulator);
    for p in [2u32, 0, 9] {
        producer
            .send(OutgoingMessage::new(NATIVE, format!("java-{p}")).priority(p))
            .await
            .unwrap();
    }
    let levels = levels_received(&emulator, &topics, NATIVE, 3).await;
    assert_eq!(
        levels,
        HashMap::from([(Level::new(0), 2), (Level::new(2), 1)])
    );
}

/// Gate settings a push consumer cannot use are refused before it connects, naming
/// `priority`; a receiver queue above the concurrency (the default 1,000 against 64) is taken
/// as the concurrency, so the defaults start.
#[tokio::test(start_paused = true)]
async fn a_push_consumer_refuses_gate_settings_it_cannot_use() {
    let emulator = emulator().await;
    let topics = PriorityTopics::builder(policy())
        .level_topics(LEVELS)
        .build()
        .unwrap();
    let defaults = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(64)
        .priority(topics.clone(), GateConfig::default())
        .handler(|_: ReceivedMessage| async { ConsumeResult::Success })
        .build()
        .await
        .expect("the default gate settings start");
    defaults.close(Duration::from_secs(5)).await;
    let watermarks = GateConfig::default()
        .with_high_watermark(0.1)
        .with_low_watermark(0.5);
    let no_halving_floor = GateConfig::default().with_min_queue_size(0);
    for gate in [watermarks, no_halving_floor] {
        let started = PushConsumer::builder(support::config(&emulator), GROUP)
            .concurrency(64)
            .priority(topics.clone(), gate)
            .handler(|_: ReceivedMessage| async { ConsumeResult::Success })
            .build()
            .await;
        assert!(
            matches!(
                started,
                Err(Error::Invalid {
                    what: "priority",
                    ..
                })
            ),
            "{started:?}"
        );
    }
}

/// A push consumer given a native topic subscribes to it; the broker serves the higher
/// priorities first, so the most important level is handled first.
#[tokio::test(start_paused = true)]
async fn a_push_consumer_of_a_native_topic_gets_the_most_important_level_first() {
    let emulator = emulator().await;
    let topics = PriorityTopics::builder(policy())
        .native(NATIVE)
        .build()
        .unwrap();
    send(&producer(&emulator), &topics, [5, 0, 20], 0).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&order);
    let levels = topics.clone();
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(1)
        .receive_batch_size(1)
        .priority(topics, GateConfig::default())
        .handler(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            let level = levels.level_of(&message);
            async move {
                seen.lock().push(level.get());
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap();
    assert!(consumer.gate_stats().is_none());
    support::wait_for("the messages", Duration::from_secs(60), || {
        order.lock().len() == 25
    })
    .await;
    let order = order.lock().clone();
    assert_eq!(order[..5], [0; 5], "{order:?}");
    consumer.close(Duration::from_secs(5)).await;
}

/// Native tiers: level 0 alone on one priority topic, levels 1 and 2 on another at native
/// priorities. A push consumer gates across the two topics (the gate's levels are the tiers)
/// and the broker orders the lower tier, so level 0 comes first and level 1 before level 2.
#[tokio::test(start_paused = true)]
async fn a_push_consumer_of_native_tiers_gates_the_tiers_and_the_broker_orders_each() {
    let emulator = Emulator::builder()
        .group(GROUP, false)
        .topic("tier-top", TopicKind::Priority, 1)
        .topic("tier-rest", TopicKind::Priority, 2)
        .start()
        .await
        .expect("the emulator starts");
    let topics = PriorityTopics::builder(policy())
        .native_tiers([("tier-top", 1), ("tier-rest", 2)])
        .build()
        .unwrap();
    let producer = producer(&emulator);
    send(&producer, &topics, [0, 0, 20], 0).await;
    send(&producer, &topics, [5, 5, 0], 0).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&order);
    let levels = topics.clone();
    let gate = GateConfig::default()
        .with_strategy(Strategy::Strict)
        .with_receiver_queue_size(4)
        .with_min_queue_size(2);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(2)
        .receive_batch_size(1)
        .priority(topics, gate)
        .handler(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            let level = levels.level_of(&message);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                seen.lock().push(level.get());
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap();
    support::wait_for("the messages", Duration::from_secs(60), || {
        order.lock().len() == 30
    })
    .await;
    let order = order.lock().clone();
    let last = |level: u8| order.iter().rposition(|l| *l == level).unwrap();
    let first = |level: u8| order.iter().position(|l| *l == level).unwrap();
    assert!(last(0) < 10, "level 0 early: {order:?}");
    assert!(last(1) < first(2), "level 1 before level 2: {order:?}");
    let stats = consumer.gate_stats().expect("a gate over the tiers");
    assert_eq!(stats.levels.len(), 2);
    assert_eq!(stats.levels[0].delivered, 5);
    assert_eq!(stats.levels[1].delivered, 25);
    consumer.close(Duration::from_secs(5)).await;
}

/// A failed message comes back through its own level topic: the gate counts its nack and its
/// second arrival on its level, and its level reads the same both times.
#[tokio::test(start_paused = true)]
async fn a_nacked_message_comes_back_on_its_level() {
    let mut builder = Emulator::builder()
        .group(GROUP, false)
        // A short invisibility: the failure is nacked, not retried in the consumer.
        .auto_renew(Duration::from_secs(2), Duration::from_secs(3600));
    for topic in LEVELS {
        builder = builder.topic(topic, TopicKind::Normal, 1);
    }
    let emulator = builder.start().await.expect("the emulator starts");
    let topics = PriorityTopics::builder(policy())
        .level_topics(LEVELS)
        .build()
        .unwrap();
    let property = topics.policy().property().to_owned();
    producer(&emulator)
        .send_prioritized(
            &topics,
            OutgoingMessage::new("x", "fails once").property(&property, "0"),
        )
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let attempts = Arc::clone(&seen);
    let levels = topics.clone();
    let gate = GateConfig::default()
        .with_receiver_queue_size(8)
        .with_min_queue_size(2);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .concurrency(8)
        .priority(topics, gate)
        .handler(move |message: ReceivedMessage| {
            let mut attempts = attempts.lock();
            attempts.push((message.topic().to_owned(), levels.level_of(&message)));
            let result = if attempts.len() == 1 {
                ConsumeResult::Failure
            } else {
                ConsumeResult::Success
            };
            async move { result }
        })
        .build()
        .await
        .unwrap();
    support::wait_handled(&consumer, 1, Duration::from_secs(120)).await;
    let seen = seen.lock().clone();
    assert_eq!(
        seen,
        [
            (LEVELS[0].to_owned(), Level::new(0)),
            (LEVELS[0].to_owned(), Level::new(0))
        ]
    );
    let stats = consumer.gate_stats().unwrap();
    let first = &stats.levels[0];
    assert_eq!(
        (first.arrivals, first.delivered, first.nacked, first.acked),
        (2, 2, 1, 1)
    );
    assert_eq!(stats.levels[2].arrivals, 0);
    consumer.close(Duration::from_secs(5)).await;
}

/// A simple consumer of level topics under a strict gate: while the most important level has
/// messages, the receives ask it alone; then the others. Every message comes once.
#[tokio::test(start_paused = true)]
async fn a_simple_consumer_receives_the_most_important_level_first() {
    let mut builder = Emulator::builder().group(GROUP, false);
    for topic in LEVELS {
        builder = builder.topic(topic, TopicKind::Normal, 1);
    }
    let emulator = builder.start().await.expect("the emulator starts");
    for i in 0..200 {
        emulator
            .publish(LEVELS[2], PublishMessage::new(format!("low-{i}")))
            .unwrap();
    }
    for i in 0..20 {
        emulator
            .publish(LEVELS[0], PublishMessage::new(format!("urgent-{i}")))
            .unwrap();
    }
    let topics = PriorityTopics::builder(policy())
        .level_topics(LEVELS)
        .build()
        .unwrap();
    let gate = GateConfig::default()
        .with_strategy(Strategy::Strict)
        .with_receiver_queue_size(32);
    let consumer = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .await_duration(Duration::from_secs(5))
        .priority(topics.clone(), gate)
        .build()
        .await
        .unwrap();
    let mut levels = Vec::new();
    let mut ids = HashSet::new();
    while levels.len() < 220 {
        let received = consumer.receive(16, Duration::from_secs(60)).await.unwrap();
        for message in received {
            levels.push(topics.level_of(&message).get());
            assert!(
                ids.insert(message.message_id().to_owned()),
                "received twice"
            );
            consumer.ack(&message).await.unwrap();
        }
    }
    assert_eq!(levels[..20], [0; 20], "{levels:?}");
    assert!(levels[20..].iter().all(|l| *l == 2), "{levels:?}");
    let stats = consumer.gate_stats().unwrap();
    let counts: Vec<_> = stats.levels.iter().map(|l| (l.arrivals, l.acked)).collect();
    assert_eq!(counts, [(20, 20), (0, 0), (200, 200)]);
    consumer.close(Duration::from_secs(5)).await;
    for topic in LEVELS {
        assert!(emulator.ledger(topic, GROUP).iter().all(|r| r.acked));
    }
}
