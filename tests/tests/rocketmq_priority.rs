//! Our priority API on a real RocketMQ proxy (`ROCKETMQ_ENDPOINT`; 5.3.3 in the general suites,
//! 5.5.0 in `scripts/test-rocketmq-v55`): a simple consumer of level topics
//! (`SimpleConsumerBuilder::priority`) hands out urgent messages sent while it works through a
//! low backlog at once, each message once; two gated push consumers in one group share the
//! work and keep the priority. The topics `prio-simple-urgent`, `prio-simple-low`,
//! `prio-pair-urgent` and `prio-pair-low` and the groups `prio-simple` and `prio-pair` come
//! from `scripts/brokers/rocketmq start`. The push consumer's burst of the shape is
//! `bench-tools/src/bin/rocketmq_priority.rs`, run by the same scripts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::real_rocketmq::{endpoint, settle_group, take_leftovers, unique};
use parking_lot::Mutex;
use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics};
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, OutgoingMessage, Producer, PushConsumer, ReceivedMessage,
    SimpleConsumer,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

const GROUP: &str = "prio-simple";
const LOW: usize = 300;
const URGENT: usize = 10;

fn topics() -> PriorityTopics {
    level_topics(["prio-simple-urgent", "prio-simple-low"])
}

fn level_topics(topics: [&str; 2]) -> PriorityTopics {
    PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
        .level_topics(topics)
        .build()
        .unwrap()
}

/// Acknowledges `messages` in the background: an ack waits in its batch (up to 5 s), so
/// awaited one receive after the other they would take seconds.
fn ack_all(
    acks: &mut JoinSet<()>,
    consumer: &Arc<SimpleConsumer>,
    messages: Vec<rocketmq_grpc::ReceivedMessage>,
) {
    for message in messages {
        let consumer = Arc::clone(consumer);
        acks.spawn(async move { consumer.ack(&message).await.unwrap() });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_consumer_of_level_topics_hands_out_urgent_messages_at_once() {
    let Some(endpoint) = endpoint() else { return };
    let config = ClientConfig::new(&endpoint).unwrap();
    let topics = topics();
    let consumer = SimpleConsumer::builder(config.clone(), GROUP)
        .priority(topics.clone(), GateConfig::default())
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let consumer = Arc::new(consumer);
    let mut acks = JoinSet::new();
    // What earlier runs left.
    take_leftovers(&consumer, 1).await;
    let prefix = unique("simple-prio");
    let property = topics.policy().property().to_owned();
    let producer = Producer::builder(config).build().unwrap();
    for i in 0..LOW {
        let low = OutgoingMessage::new("any", format!("{prefix}-low-{i}")).property(&property, "1");
        producer.send_prioritized(&topics, low).await.unwrap();
    }
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut urgent_sent: HashMap<String, Instant> = HashMap::new();
    let mut urgent_late: Vec<(String, Duration)> = Vec::new();
    let mut receives = 0;
    let end = Instant::now() + Duration::from_secs(90);
    while seen.len() < LOW + URGENT && Instant::now() < end {
        let got = consumer.receive(16, Duration::from_secs(20)).await.unwrap();
        receives += 1;
        for message in &got {
            let body = String::from_utf8_lossy(message.body()).into_owned();
            if body.starts_with(&prefix) {
                *seen.entry(body.clone()).or_default() += 1;
                if let Some(sent) = urgent_sent.get(&body) {
                    urgent_late.push((body, sent.elapsed()));
                }
            }
        }
        ack_all(&mut acks, &consumer, got);
        // The burst, while the low backlog is being worked through.
        if receives == 3 {
            for i in 0..URGENT {
                let body = format!("{prefix}-urgent-{i}");
                let urgent = OutgoingMessage::new("any", body.clone()).property(&property, "0");
                urgent_sent.insert(body, Instant::now());
                producer.send_prioritized(&topics, urgent).await.unwrap();
            }
        }
    }
    println!(
        "{receives} receives; urgent messages handed out after {:?}",
        urgent_late.iter().map(|(_, d)| *d).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), LOW + URGENT, "messages seen");
    assert!(seen.values().all(|n| *n == 1), "a message came twice");
    assert_eq!(urgent_late.len(), URGENT);
    let slowest = urgent_late.iter().map(|(_, d)| *d).max().unwrap();
    assert!(
        slowest < Duration::from_secs(3),
        "an urgent message came {slowest:?} after its send (a receive of its topic cancelled \
         earlier took it and left it invisible?)"
    );
    while let Some(acked) = acks.join_next().await {
        acked.unwrap();
    }
    let consumer = Arc::into_inner(consumer).expect("the acks are done");
    consumer.close(Duration::from_secs(5)).await;
}

/// Two gated push consumers in one group (two instances of a service): each message is
/// handled once by one of them, and an urgent burst sent while they work through a low
/// backlog overtakes what is left of it. Without priority the burst would come after the
/// whole rest of the backlog (about 1,800 messages); the bound is a third of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gated_push_consumers_share_a_group() {
    let Some(endpoint) = endpoint() else { return };
    const PAIR_GROUP: &str = "prio-pair";
    const LOW: usize = 2_000;
    const URGENT: usize = 50;
    const WARM: usize = 200;
    let config = ClientConfig::new(&endpoint).unwrap();
    // Topics of their own: another group's runs would leave thousands of messages to the
    // simple consumer's group on the shared ones.
    let topics = level_topics(["prio-pair-urgent", "prio-pair-low"]);
    // The group's first pop of each queue sets its offset; leftovers of earlier runs go, and
    // so do the settling consumer's stale pops.
    let settle = SimpleConsumer::builder(config.clone(), PAIR_GROUP)
        .priority(topics.clone(), GateConfig::default())
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    eprintln!("leftovers: {}", settle_group(settle).await);

    let prefix = unique("pair-prio");
    let property = topics.policy().property().to_owned();
    let producer = Producer::builder(config.clone()).build().unwrap();
    let mut sends = JoinSet::new();
    let producer = Arc::new(producer);
    for i in 0..LOW {
        let low = OutgoingMessage::new("any", format!("{prefix}-low-{i}")).property(&property, "1");
        while sends.len() >= 16 {
            sends.join_next().await.unwrap().unwrap();
        }
        let (producer, topics) = (Arc::clone(&producer), topics.clone());
        sends.spawn(async move {
            producer
                .send_prioritized(&topics, low)
                .await
                .map(drop)
                .unwrap()
        });
    }
    while let Some(sent) = sends.join_next().await {
        sent.unwrap();
    }

    // (consumer, body, when) in handling order.
    let handled: Arc<Mutex<Vec<(usize, String, Instant)>>> = Arc::default();
    let mut consumers = Vec::new();
    for which in 0..2 {
        let sink = Arc::clone(&handled);
        let prefix = prefix.clone();
        let consumer = PushConsumer::builder(config.clone(), PAIR_GROUP)
            .priority(topics.clone(), GateConfig::default())
            .concurrency(8)
            .long_polling(Duration::from_secs(5))
            .handler(move |message: ReceivedMessage| {
                let sink = Arc::clone(&sink);
                let body = String::from_utf8_lossy(message.body()).into_owned();
                let ours = body.starts_with(&prefix);
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if ours {
                        sink.lock().push((which, body, Instant::now()));
                    }
                    ConsumeResult::Success
                }
            })
            .build()
            .await
            .unwrap();
        consumers.push(consumer);
    }
    let wait_for = |count: usize| {
        let handled = Arc::clone(&handled);
        async move {
            let end = Instant::now() + Duration::from_secs(120);
            while handled.lock().len() < count && Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(WARM).await;
    let burst_at = handled.lock().len();
    let burst_from = Instant::now();
    for i in 0..URGENT {
        let urgent =
            OutgoingMessage::new("any", format!("{prefix}-urgent-{i}")).property(&property, "0");
        producer.send_prioritized(&topics, urgent).await.unwrap();
    }
    wait_for(LOW + URGENT).await;
    // Anything handled twice would come after the count was reached: give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for consumer in consumers {
        let report = consumer.close(Duration::from_secs(10)).await;
        assert!(report.unacknowledged.is_empty(), "{report:?}");
    }
    let handled = handled.lock().clone();
    let mut times: HashMap<&str, u32> = HashMap::new();
    for (_, body, _) in &handled {
        *times.entry(body.as_str()).or_default() += 1;
    }
    let by = |which: usize| handled.iter().filter(|(w, _, _)| *w == which).count();
    let last_urgent = handled
        .iter()
        .rposition(|(_, body, _)| body.contains("-urgent-"))
        .unwrap_or(handled.len());
    let low_before_last_urgent = handled[burst_at..last_urgent]
        .iter()
        .filter(|(_, body, _)| body.contains("-low-"))
        .count();
    let urgent: Vec<(usize, usize, Duration)> = handled
        .iter()
        .enumerate()
        .filter(|(_, (_, body, _))| body.contains("-urgent-"))
        .map(|(i, (which, _, at))| (i, *which, at.duration_since(burst_from)))
        .collect();
    println!("urgent (position, consumer, after the burst's start): {urgent:?}");
    println!(
        "two consumers in one group: {} and {} handled; {low_before_last_urgent} low messages \
         handled between the burst ({burst_at} handled then) and its last message",
        by(0),
        by(1)
    );
    assert_eq!(times.len(), LOW + URGENT, "every message handled");
    assert!(times.values().all(|n| *n == 1), "a message handled twice");
    assert!(
        low_before_last_urgent < (LOW - WARM) / 3,
        "the burst waited behind {low_before_last_urgent} low messages"
    );
}
