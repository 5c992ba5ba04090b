//! Delayed delivery: `deliver_after` / `deliver_at` messages wait on Shared and Key_Shared
//! subscriptions, never come early, are sent on their own, and survive an unload.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pulsar_wire::{ConsumerOptions, Error, Message, OutgoingMessage, Producer, SubType};
use pulsar_wire_emulator::EmulatorConfig;
use tokio::time::Instant;

use crate::support::{Setup, assert_quiet, receive, within};

/// Sends `payload` after `delay` (none: at once) and returns its id's batch size.
async fn send(producer: &Producer, payload: &str, delay: Option<Duration>) -> Option<u32> {
    let mut message = OutgoingMessage::new(payload.to_owned());
    if let Some(delay) = delay {
        message = message.deliver_after(delay);
    }
    producer.send(message).await.expect("sent").batch_size()
}

fn text(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

/// Receives one message and how long after `since` it came.
async fn next(consumer: &pulsar_wire::Consumer, since: Instant) -> (String, Duration) {
    let message = receive(consumer, 1).await.remove(0);
    (text(&message), since.elapsed())
}

#[tokio::test(start_paused = true)]
async fn delayed_messages_wait_on_a_shared_subscription_and_come_when_due() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("delayed-shared", ConsumerOptions::default())
        .await;
    let producer = setup.producer("delayed-shared", 10).await;
    let started = Instant::now();
    let (late, soon, now) = tokio::join!(
        send(&producer, "in 3 s", Some(Duration::from_secs(3))),
        send(&producer, "in 1 s", Some(Duration::from_secs(1))),
        send(&producer, "now", None),
    );
    assert_eq!(
        (late, soon),
        (None, None),
        "delayed messages go on their own"
    );
    assert_eq!(now, Some(1), "the batching producer batches the others");

    let (first, at) = next(&consumer, started).await;
    assert_eq!(first, "now");
    assert!(at < Duration::from_millis(500), "{at:?}");
    let (second, at) = next(&consumer, started).await;
    assert_eq!(second, "in 1 s");
    assert!(
        (Duration::from_secs(1)..Duration::from_millis(1_200)).contains(&at),
        "{at:?}"
    );
    let third = receive(&consumer, 1).await.remove(0);
    let at = started.elapsed();
    assert_eq!(text(&third), "in 3 s");
    assert!(
        (Duration::from_secs(3)..Duration::from_millis(3_200)).contains(&at),
        "{at:?}"
    );
    let due = third.deliver_at().expect("its delivery time");
    let sent_at = third.publish_time();
    let delay = due.duration_since(sent_at).expect("due after it was sent");
    assert!(
        (Duration::from_millis(2_900)..=Duration::from_millis(3_100)).contains(&delay),
        "{delay:?}"
    );
    let stats = setup.stats();
    let delayed = stats
        .subscription("delayed-shared", "sub")
        .map(|s| s.delayed);
    assert_eq!(delayed, Some(0));
}

#[tokio::test(start_paused = true)]
async fn key_shared_subscriptions_delay_too() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .consumer(
            "delayed-key-shared",
            ConsumerOptions::default().sub_type(SubType::KeyShared),
        )
        .await;
    let producer = setup.producer("delayed-key-shared", 0).await;
    let started = Instant::now();
    send(&producer, "in 2 s", Some(Duration::from_secs(2))).await;
    send(&producer, "now", None).await;
    assert_eq!(next(&consumer, started).await.0, "now");
    let (late, at) = next(&consumer, started).await;
    assert_eq!(late, "in 2 s");
    assert!(at >= Duration::from_secs(2), "{at:?}");
}

/// The broker delays on Shared and Key_Shared subscriptions only.
#[tokio::test(start_paused = true)]
async fn exclusive_and_failover_subscriptions_get_delayed_messages_at_once() {
    for sub_type in [SubType::Exclusive, SubType::Failover] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("delayed-{sub_type:?}");
        let consumer = setup
            .consumer(&topic, ConsumerOptions::default().sub_type(sub_type))
            .await;
        let producer = setup.producer(&topic, 0).await;
        let started = Instant::now();
        send(&producer, "in 1 min", Some(Duration::from_secs(60))).await;
        let (message, at) = next(&consumer, started).await;
        assert_eq!(message, "in 1 min");
        assert!(at < Duration::from_secs(1), "{sub_type:?}: {at:?}");
    }
}

/// Consumers that come and go, and an unload (the broker's delay tracker is in memory: the
/// entries are read again from the cursor): a delayed message still comes once, when due.
#[tokio::test(start_paused = true)]
async fn a_delayed_message_survives_an_unload_and_comes_once() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "delayed-unload";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    let started = Instant::now();
    send(&producer, "in 2 s", Some(Duration::from_secs(2))).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = setup.stats();
    assert_eq!(stats.subscription(topic, "sub").map(|s| s.delayed), Some(1));
    setup.emulator.unload(topic);
    let (message, at) = next(&consumer, started).await;
    assert_eq!(message, "in 2 s");
    assert!(at >= Duration::from_secs(2), "{at:?}");
    assert_quiet(&consumer, Duration::from_secs(3)).await;
}

/// Two consumers: due messages go to whichever has permits; each once.
#[tokio::test(start_paused = true)]
async fn delayed_messages_spread_over_shared_consumers_once_each() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "delayed-two";
    let a = setup.shared(topic, ConsumerOptions::default()).await;
    let b = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    let started = Instant::now();
    let sends = (0..20).map(|i| {
        producer.send(
            OutgoingMessage::new(format!("d{i}"))
                .deliver_after(Duration::from_millis(1_000 + 100 * i)),
        )
    });
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
    let mut seen = Vec::new();
    while seen.len() < 20 {
        tokio::select! {
            Ok(message) = a.receive() => seen.push((text(&message), started.elapsed())),
            Ok(message) = b.receive() => seen.push((text(&message), started.elapsed())),
        }
    }
    for (payload, at) in &seen {
        let i: u64 = payload[1..].parse().expect("dN");
        assert!(
            at >= &Duration::from_millis(1_000 + 100 * i),
            "{payload} at {at:?}"
        );
    }
    let mut payloads: Vec<_> = seen.into_iter().map(|(p, _)| p).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), 20);
    assert_quiet(&a, Duration::from_millis(500)).await;
    assert_quiet(&b, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn delivery_times_that_cannot_be_sent_are_refused_with_the_reason() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("delayed-bad", 0).await;
    let before_1970 = UNIX_EPOCH - Duration::from_secs(1);
    let error = producer
        .send(OutgoingMessage::new("x").deliver_at(before_1970))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "deliver_at",
                ..
            }
        ) && error.to_string().contains("1970"),
        "{error}"
    );
    let error = producer
        .send(OutgoingMessage::new("x").deliver_after(Duration::MAX))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "deliver_at",
                ..
            }
        ),
        "{error}"
    );
    // A time already past delivers at once.
    let consumer = setup
        .shared("delayed-bad", ConsumerOptions::default())
        .await;
    let past = SystemTime::now() - Duration::from_secs(3_600);
    producer
        .send(OutgoingMessage::new("past").deliver_at(past))
        .await
        .expect("sent");
    let message = within(Duration::from_secs(2), consumer.receive())
        .await
        .expect("at once")
        .expect("received");
    assert_eq!(text(&message), "past");
}

/// Event and publish times are `SystemTime`s, sent as milliseconds since the epoch: the event
/// time comes back to the millisecond, in a batch or not; the epoch (the protocol's 0) comes
/// back as no event time; a time before 1970 is refused at the send, naming `event_time`.
#[tokio::test]
async fn event_and_publish_times_are_system_times_to_the_millisecond() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("times", ConsumerOptions::default()).await;
    let event = UNIX_EPOCH + Duration::from_millis(1_733_500_000_123) + Duration::from_micros(456);
    let to_the_millisecond = UNIX_EPOCH + Duration::from_millis(1_733_500_000_123);
    for per_batch in [0, 3] {
        let producer = setup.producer("times", per_batch).await;
        let before = SystemTime::now() - Duration::from_millis(1);
        producer
            .send(OutgoingMessage::new("event").event_time(event))
            .await
            .expect("sent");
        producer
            .send(OutgoingMessage::new("epoch").event_time(UNIX_EPOCH))
            .await
            .expect("sent");
        producer
            .send(OutgoingMessage::new("none"))
            .await
            .expect("sent");
        let after = SystemTime::now();
        let received = receive(&consumer, 3).await;
        let times: Vec<_> = received.iter().map(|m| (text(m), m.event_time())).collect();
        assert_eq!(
            times,
            [
                ("event".to_owned(), Some(to_the_millisecond)),
                ("epoch".to_owned(), None),
                ("none".to_owned(), None),
            ],
            "batched: {per_batch}"
        );
        for message in &received {
            let published = message.publish_time();
            assert!((before..=after).contains(&published), "{published:?}");
            consumer.ack(message).await.expect("acked");
        }
        let error = producer
            .send(OutgoingMessage::new("x").event_time(UNIX_EPOCH - Duration::from_millis(1)))
            .await
            .expect_err("refused");
        assert!(
            matches!(
                &error,
                Error::Invalid {
                    what: "event_time",
                    ..
                }
            ) && error.to_string().contains("1970"),
            "{error}"
        );
        producer
            .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
            .await
            .expect("closed");
    }
}
