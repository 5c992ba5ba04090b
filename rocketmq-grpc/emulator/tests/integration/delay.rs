//! Delay (timed) messages against the emulator: none comes before its delivery time, each comes
//! at it with the time it was given, and what the proxy refuses is refused with the option's
//! name. (The real proxy and the Java client: `tests/tests/rocketmq_delay.rs`.)
//!
//! Virtual time: the emulator maps a delivery time onto its clock when it stores the message,
//! so waits pass at once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rocketmq_grpc::Code;
use rocketmq_grpc::{Error, OutgoingMessage, Producer, ReceivedMessage, SimpleConsumer};
use rocketmq_grpc_emulator::{Emulator, TopicKind};
use tokio::time::Instant;

use crate::support::{self, GROUP};

async fn emulator() -> Emulator {
    Emulator::builder()
        .topic("later", TopicKind::Delay, 2)
        .topic("plain", TopicKind::Normal, 2)
        .group(GROUP, false)
        .start()
        .await
        .expect("the emulator starts")
}

fn producer(emulator: &Emulator) -> Producer {
    Producer::builder(support::config(emulator))
        .build()
        .unwrap()
}

async fn consumer(emulator: &Emulator) -> SimpleConsumer {
    SimpleConsumer::builder(support::config(emulator), GROUP)
        .subscribe("later", "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts")
}

/// Receives until `n` messages came, each with the virtual time it came at.
async fn receive_timed(consumer: &SimpleConsumer, n: usize) -> Vec<(Instant, ReceivedMessage)> {
    let mut all = Vec::new();
    while all.len() < n {
        let batch = consumer.receive(32, Duration::from_secs(60)).await.unwrap();
        let now = Instant::now();
        all.extend(batch.into_iter().map(|m| (now, m)));
    }
    all
}

fn millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH).unwrap().as_millis()
}

#[tokio::test(start_paused = true)]
async fn each_delay_message_comes_at_its_time_and_not_before() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    let consumer = consumer(&emulator).await;
    let start = Instant::now();
    // Sent in reverse order of their times: the 3 s one must still come first.
    let delays = [9u64, 6, 3];
    let mut wanted = Vec::new();
    for secs in delays {
        let message = OutgoingMessage::new("later", format!("after {secs} s"))
            .deliver_after(Duration::from_secs(secs));
        let at = message.delivery_time().unwrap();
        producer.send(message).await.unwrap();
        wanted.push((secs, at));
    }
    let got = receive_timed(&consumer, 3).await;
    let bodies: Vec<_> = got.iter().map(|(_, m)| m.body().clone()).collect();
    assert_eq!(
        bodies,
        vec![
            b"after 3 s".to_vec(),
            b"after 6 s".to_vec(),
            b"after 9 s".to_vec()
        ],
        "in the order of their delivery times"
    );
    for (secs, at) in wanted {
        let (came, message) = got
            .iter()
            .find(|(_, m)| *m.body() == format!("after {secs} s").into_bytes())
            .unwrap();
        // The emulator maps the wall-clock delivery time onto virtual time when it stores the
        // message: the real milliseconds that pass meanwhile come off the wait.
        let waited = came.duration_since(start);
        assert!(
            waited >= Duration::from_secs(secs) - Duration::from_millis(100)
                && waited <= Duration::from_secs(secs + 1),
            "due after {secs} s, came after {waited:?}"
        );
        assert_eq!(
            message.deliver_at().map(millis),
            Some(millis(at)),
            "the delivery time it was sent with, to the millisecond"
        );
        consumer.ack(message).await.unwrap();
    }
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_message_without_a_delay_is_not_held_back_by_an_earlier_delayed_one() {
    let emulator = Emulator::builder()
        .topic("later", TopicKind::Delay, 1)
        .group(GROUP, false)
        .start()
        .await
        .unwrap();
    let producer = producer(&emulator);
    let consumer = consumer(&emulator).await;
    producer
        .send(OutgoingMessage::new("later", "in a minute").deliver_after(Duration::from_secs(60)))
        .await
        .unwrap();
    // Due at once (a delivery time now), behind the held one on the same queue.
    producer
        .send(OutgoingMessage::new("later", "now").deliver_at(SystemTime::now()))
        .await
        .unwrap();
    let start = Instant::now();
    let first = receive_timed(&consumer, 1).await;
    assert_eq!(first[0].1.body(), "now");
    assert!(first[0].0.duration_since(start) < Duration::from_secs(2));
    let second = receive_timed(&consumer, 1).await;
    assert_eq!(second[0].1.body(), "in a minute");
    assert!(second[0].0.duration_since(start) >= Duration::from_secs(59));
}

#[tokio::test(start_paused = true)]
async fn delivery_times_the_proxy_or_the_client_refuses_are_errors_naming_them() {
    let emulator = emulator().await;
    let producer = producer(&emulator);

    // Both a delivery time and a message group: refused before sending.
    let both = OutgoingMessage::new("later", "x")
        .deliver_after(Duration::from_secs(5))
        .message_group("g");
    let err = producer.send(both).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Invalid {
                what: "deliver_at",
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_retryable());

    // A minute in the past: refused before sending, saying what to do.
    let past =
        OutgoingMessage::new("later", "x").deliver_at(SystemTime::now() - Duration::from_secs(60));
    let err = producer.send(past).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Invalid {
                what: "deliver_at",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("in the past"), "{err}");

    // Two days ahead: past the proxy's maxDelayTimeMills (1 day), refused at once, not retried.
    let far = OutgoingMessage::new("later", "x").deliver_after(Duration::from_secs(2 * 86_400));
    let err = producer.send(far).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::IllegalDeliveryTime), "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("deliver_at"), "{err}");

    // Years ahead (beyond what the clock holds is capped at a century): the same.
    let years = OutgoingMessage::new("later", "x").deliver_after(Duration::MAX);
    let err = producer.send(years).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::IllegalDeliveryTime), "{err}");

    // A delay message on a NORMAL topic: the proxy's type conflict.
    let wrong_topic = OutgoingMessage::new("plain", "x").deliver_after(Duration::from_secs(5));
    let err = producer.send(wrong_topic).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(Code::MessagePropertyConflictWithType),
        "{err}"
    );

    // A transactional message with a delivery time: refused before sending.
    let producer = Producer::builder(support::config(&emulator))
        .transaction_checker(|_: ReceivedMessage| async {
            rocketmq_grpc::TransactionResolution::Unknown
        })
        .build()
        .unwrap();
    let transaction = producer.begin_transaction().unwrap();
    let err = producer
        .send_in(
            &transaction,
            OutgoingMessage::new("later", "x").deliver_after(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Invalid {
                what: "deliver_at",
                ..
            }
        ),
        "{err}"
    );
}
