//! Our priority API on a real RocketMQ proxy (`ROCKETMQ_ENDPOINT`; 5.3.3 in the general suites,
//! 5.5.0 in `scripts/test-rocketmq-v55`): a simple consumer of level topics
//! (`SimpleConsumerBuilder::priority`) hands out urgent messages sent while it works through a
//! low backlog at once, each message once. The topics `prio-simple-urgent` and `prio-simple-low` and the
//! group `prio-simple` come from `scripts/brokers/rocketmq start`. The push consumer's burst
//! on these topics is `examples/src/bin/rocketmq_priority.rs`, run by the same scripts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::real_rocketmq::{endpoint, take_leftovers, unique};
use rocketmq_grpc::priority::{GateConfig, PriorityPolicy, PriorityTopics};
use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer, Session, SimpleConsumer};
use tokio::task::JoinSet;
use tokio::time::Instant;

const GROUP: &str = "prio-simple";
const LOW: usize = 300;
const URGENT: usize = 10;

fn topics() -> PriorityTopics {
    PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
        .level_topics(["prio-simple-urgent", "prio-simple-low"])
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
    let producer = Producer::new(Session::new(config).unwrap());
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
            let body = String::from_utf8_lossy(&message.body).into_owned();
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
