//! Priority messages and lite topics (RocketMQ 5.4+) against the emulator, as the 5.5.0 proxy
//! serves them (`tests/tests/rocketmq_v55.rs` checks the same on the real one): a backlog of
//! low-priority messages waits behind high-priority ones, levels above the last queue are the
//! last queue; a lite push consumer gets the lite topics it subscribed to and no others, a
//! backlog included, and stops getting them when it unsubscribes.
//!
//! Virtual time (`start_paused`): long polls and ack delays pass at once.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::Code;
use rocketmq_grpc::{
    ConsumeResult, Error, LitePushConsumer, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage, SimpleConsumer,
};
use rocketmq_grpc_emulator::{Emulator, Rpc, TopicKind};

use crate::support::{self, GROUP};

const PRIORITY: &str = "urgent";
const LITE: &str = "replies";
const LITE_GROUP: &str = "repliers";

async fn emulator() -> Emulator {
    Emulator::builder()
        .topic(PRIORITY, TopicKind::Priority, 8)
        .topic(LITE, TopicKind::Lite, 4)
        .topic("plain", TopicKind::Normal, 2)
        .group(GROUP, false)
        .lite_group(LITE_GROUP, LITE)
        .start()
        .await
        .expect("the emulator starts")
}

fn producer(emulator: &Emulator) -> Producer {
    Producer::builder(support::config(emulator))
        .build()
        .unwrap()
}

async fn simple(emulator: &Emulator, topic: &str) -> SimpleConsumer {
    SimpleConsumer::builder(support::config(emulator), GROUP)
        .subscribe(topic, "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts")
}

#[tokio::test(start_paused = true)]
async fn a_low_priority_backlog_waits_behind_high_priority_messages() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    for i in 0..40 {
        let message = OutgoingMessage::new(PRIORITY, format!("low-{i}")).priority(0);
        producer.send(message).await.unwrap();
    }
    for i in 0..10 {
        let message = OutgoingMessage::new(PRIORITY, format!("high-{i}")).priority(7);
        producer.send(message).await.unwrap();
    }
    let consumer = simple(&emulator, PRIORITY).await;
    let mut levels = Vec::new();
    while levels.len() < 50 {
        for message in consumer.receive(16, Duration::from_secs(30)).await.unwrap() {
            levels.push(message.priority().unwrap());
            assert_eq!(message.queue_id(), message.priority().unwrap());
            consumer.ack(&message).await.unwrap();
        }
    }
    assert_eq!(levels[..10], [7; 10], "{levels:?}");
    assert!(levels[10..].iter().all(|l| *l == 0), "{levels:?}");
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn levels_above_the_last_queue_are_the_last_queue() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    for level in [3u32, 100, i32::MAX as u32] {
        let message = OutgoingMessage::new(PRIORITY, format!("level-{level}")).priority(level);
        producer.send(message).await.unwrap();
    }
    let consumer = simple(&emulator, PRIORITY).await;
    let mut got = Vec::new();
    while got.len() < 3 {
        for message in consumer.receive(16, Duration::from_secs(30)).await.unwrap() {
            got.push((message.priority().unwrap(), message.queue_id()));
        }
    }
    got.sort_unstable();
    assert_eq!(got, [(3, 3), (100, 7), (i32::MAX, 7)]);
}

/// A push consumer on a priority topic sees the order too: with the backlog there before it
/// starts and one message at a time, every high message comes before any low one.
#[tokio::test(start_paused = true)]
async fn a_push_consumer_gets_high_priority_first() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    for i in 0..20 {
        producer
            .send(OutgoingMessage::new(PRIORITY, format!("low-{i}")).priority(1))
            .await
            .unwrap();
    }
    for i in 0..5 {
        producer
            .send(OutgoingMessage::new(PRIORITY, format!("high-{i}")).priority(6))
            .await
            .unwrap();
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&order);
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe(PRIORITY, "*")
        .concurrency(1)
        .receive_batch_size(1)
        .handler(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().push(message.priority().unwrap());
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap();
    support::wait_for("the messages", Duration::from_secs(60), || {
        order.lock().len() == 25
    })
    .await;
    let order = order.lock().clone();
    let last_high = order.iter().rposition(|l| *l == 6).unwrap();
    let first_low = order.iter().position(|l| *l == 1).unwrap();
    assert!(last_high < first_low, "{order:?}");
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn the_proxy_refuses_messages_of_another_type_and_bad_lite_topics() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    for (message, code) in [
        (
            OutgoingMessage::new("plain", "p").priority(3),
            Code::MessagePropertyConflictWithType,
        ),
        (
            OutgoingMessage::new(PRIORITY, "l").lite_topic("x"),
            Code::MessagePropertyConflictWithType,
        ),
        (
            OutgoingMessage::new(LITE, "n"),
            Code::MessagePropertyConflictWithType,
        ),
        (
            OutgoingMessage::new(LITE, "long").lite_topic("x".repeat(65)),
            Code::IllegalLiteTopic,
        ),
    ] {
        let error = producer.send(message).await.unwrap_err();
        assert_eq!(error.code(), Some(code), "{error}");
    }
    // Refused by the client before sending.
    let error = producer
        .send(OutgoingMessage::new(LITE, "x").lite_topic("a b"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Invalid {
                what: "lite_topic",
                ..
            }
        ),
        "{error}"
    );
}

/// What a lite handler saw: (body, lite topic).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

async fn lite_consumer(
    emulator: &Emulator,
    group: &str,
) -> Result<(LitePushConsumer, Seen), Error> {
    let seen: Seen = Arc::default();
    let sink = Arc::clone(&seen);
    let consumer = LitePushConsumer::builder(support::config(emulator), group, LITE)
        .handler(move |message: ReceivedMessage| {
            let sink = Arc::clone(&sink);
            async move {
                let body = String::from_utf8_lossy(message.body()).into_owned();
                let lite = message.lite_topic().unwrap_or_default().to_owned();
                sink.lock().push((body, lite));
                ConsumeResult::Success
            }
        })
        .build()
        .await?;
    Ok((consumer, seen))
}

#[tokio::test(start_paused = true)]
async fn a_lite_consumer_gets_the_lite_topics_it_subscribed_to() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    // A backlog of the lite topic before the subscription: it comes too.
    for i in 0..3 {
        let message = OutgoingMessage::new(LITE, format!("early-{i}")).lite_topic("mine");
        producer.send(message).await.unwrap();
    }
    let (consumer, seen) = lite_consumer(&emulator, LITE_GROUP).await.unwrap();
    consumer.subscribe_lite("mine").await.unwrap();
    consumer.subscribe_lite("mine").await.unwrap();
    assert_eq!(consumer.lite_topics(), ["mine"]);
    for i in 0..5 {
        for lite in ["mine", "other"] {
            let message = OutgoingMessage::new(LITE, format!("{lite}-{i}")).lite_topic(lite);
            producer.send(message).await.unwrap();
        }
    }
    support::wait_for("the messages", Duration::from_secs(60), || {
        seen.lock().len() >= 8
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let got = seen.lock().clone();
    assert_eq!(got.len(), 8, "{got:?}");
    assert!(got.iter().all(|(_, lite)| lite == "mine"), "{got:?}");
    // The acks named the lite topic and passed.
    support::wait_for("the messages", Duration::from_secs(60), || {
        consumer.stats().acked == 8
    })
    .await;
    assert_eq!(consumer.stats().ack_failed, 0);
    consumer.unsubscribe_lite("mine").await.unwrap();
    assert!(consumer.lite_topics().is_empty());
    producer
        .send(OutgoingMessage::new(LITE, "after").lite_topic("mine"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(seen.lock().len(), 8);
    assert!(emulator.stats().calls(Rpc::SyncLiteSubscription) >= 2);
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert!(report.handlers_finished);
    // `close` takes `&self`: the consumer is still there, closed.
    let error = consumer.subscribe_lite("mine").await.unwrap_err();
    assert!(
        matches!(error, Error::Closed("the lite push consumer")),
        "{error}"
    );
    assert!(!error.is_retryable());
    let error = consumer.unsubscribe_lite("mine").await.unwrap_err();
    assert!(matches!(error, Error::Closed(_)), "{error}");
    // A second close returns at once with an empty report.
    let started = tokio::time::Instant::now();
    let again = consumer.close(Duration::from_secs(10)).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(
        !again.handlers_finished && again.acks.pending_at_close == 0,
        "{again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lite_groups_and_regular_groups_do_not_mix() {
    let emulator = emulator().await;
    let error = lite_consumer(&emulator, GROUP).await.unwrap_err();
    assert_eq!(error.code(), Some(Code::IllegalConsumerGroup), "{error}");
    let error = PushConsumer::builder(support::config(&emulator), LITE_GROUP)
        .subscribe(LITE, "*")
        .handler(|_: ReceivedMessage| async { ConsumeResult::Success })
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(Code::IllegalConsumerGroup), "{error}");
}

#[tokio::test(start_paused = true)]
async fn bad_lite_subscriptions_are_refused_with_the_option_named() {
    let emulator = emulator().await;
    let (consumer, _) = lite_consumer(&emulator, LITE_GROUP).await.unwrap();
    for bad in ["", "a b", &"x".repeat(65)] {
        match consumer.subscribe_lite(bad).await.unwrap_err() {
            Error::Invalid { what, .. } => assert_eq!(what, "lite_topic"),
            other => panic!("{bad:?}: {other}"),
        }
    }
    // The emulator does not model subscriptions from the end: it says so.
    let error = consumer
        .subscribe_lite_from("later", rocketmq_grpc::LiteOffset::Max)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(Code::NotImplemented), "{error}");
    let closed = consumer.close(Duration::from_secs(5)).await;
    assert!(closed.handlers_finished);
}
