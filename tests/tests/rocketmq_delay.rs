//! Delay (timed) messages on a real proxy (`scripts/brokers/rocketmq start`, topic `it-delay`
//! of type DELAY), with the official Java 5 client (`scripts/java-peers`, `RocketMqDelay`) on
//! the other side: what one sends the other receives no earlier than its delivery time and
//! within a second after it (the broker's timer ticks every second).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set; otherwise every test returns at once.

use integration_tests::real_rocketmq::{endpoint, unique};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use integration_tests::real_pulsar::java_peer;
use parking_lot::Mutex;
use rocketmq_grpc::Code;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage,
};
use tokio::io::{AsyncBufReadExt, BufReader};

const TOPIC: &str = "it-delay";

fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// One arrival: when it came and the delivery time it carried (Unix ms).
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at_ms: i64,
    due_ms: i64,
}

/// Records when each message whose body starts with its prefix came.
struct Arrivals {
    prefix: String,
    seen: Mutex<HashMap<String, Vec<Arrival>>>,
}

#[async_trait::async_trait]
impl MessageHandler for Arrivals {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let at_ms = unix_ms(SystemTime::now());
        let body = String::from_utf8_lossy(message.body()).into_owned();
        if body.starts_with(&self.prefix) {
            let due_ms = message.deliver_at().map_or(-1, unix_ms);
            self.seen
                .lock()
                .entry(body)
                .or_default()
                .push(Arrival { at_ms, due_ms });
        }
        ConsumeResult::Success
    }
}

/// Checks each arrival against its due time: not before, at most `late_ms` after; returns the
/// lateness of each (ms) for the report.
fn lateness(arrivals: &[(String, Arrival, i64)], late_ms: i64) -> Vec<i64> {
    let mut all = Vec::new();
    for (body, arrival, due_ms) in arrivals {
        assert_eq!(
            arrival.due_ms, *due_ms,
            "{body}: the delivery time it carries is the one it was sent with"
        );
        let late = arrival.at_ms - due_ms;
        assert!(
            (0..=late_ms).contains(&late),
            "{body}: came {late} ms after its delivery time (wanted 0..={late_ms}): {arrivals:?}"
        );
        all.push(late);
    }
    all.sort_unstable();
    all
}

/// Java sends delay messages 5 s ahead; our push consumer gets each once, not before it is
/// due, within a second after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_delay_messages_come_to_us_when_due() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let prefix = unique("java-delay");
    let arrivals = Arc::new(Arrivals {
        prefix: prefix.clone(),
        seen: Mutex::new(HashMap::new()),
    });
    let consumer = PushConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        unique("it-delay-ours").as_str(),
    )
    .subscribe(TOPIC, "*")
    .handler(Arc::clone(&arrivals))
    .build()
    .await
    .expect("the consumer starts against the real proxy");
    let out = java_peer(
        "RocketMqDelay",
        &["send", &endpoint, TOPIC, &prefix, "10", "5000"],
    )
    .await;
    let sent: Vec<(String, i64)> = out
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("sent=")?;
            let (body, due) = rest.split_once(" due=")?;
            Some((body.to_owned(), due.parse().ok()?))
        })
        .collect();
    assert_eq!(sent.len(), 10, "{out}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while arrivals.seen.lock().len() < sent.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of 10 came: {:?}",
            arrivals.seen.lock().len(),
            arrivals.seen.lock()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Copies would come within the invisibility; the handler succeeded, so none may.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = arrivals.seen.lock().clone();
    let checked: Vec<_> = sent
        .iter()
        .map(|(body, due)| {
            let copies = &seen[body];
            assert_eq!(copies.len(), 1, "{body} came {} times", copies.len());
            (body.clone(), copies[0], *due)
        })
        .collect();
    let late = lateness(&checked, 1000);
    eprintln!("Java -> ours, lateness (ms, sorted): {late:?}");
    consumer.close(Duration::from_secs(10)).await;
}

/// We send delay messages; the Java push consumer gets each not before it is due, within a
/// second after, carrying our delivery time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_delay_messages_come_to_java_when_due() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let prefix = unique("ours-delay");
    let group = unique("it-delay-java");
    let run = format!("{}/../scripts/java-peers/run", env!("CARGO_MANIFEST_DIR"));
    let mut java = tokio::process::Command::new(&run)
        .args([
            "RocketMqDelay",
            "consume",
            &endpoint,
            TOPIC,
            &group,
            &prefix,
            "10",
            "90",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the Java peer starts");
    let mut lines = BufReader::new(java.stdout.take().unwrap()).lines();
    loop {
        match lines.next_line().await.unwrap() {
            Some(line) if line == "ready" => break,
            Some(_) => {}
            None => panic!("the Java consumer ended before it was ready"),
        }
    }
    let producer = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .topic(TOPIC)
        .build()
        .unwrap();
    let mut sent = HashMap::new();
    for i in 0..10 {
        let body = format!("{prefix}-{i}");
        let message = OutgoingMessage::new(TOPIC, body.clone())
            .deliver_after(Duration::from_millis(5000 + 300 * i));
        let due = unix_ms(message.delivery_time().unwrap());
        producer.send(message).await.expect("sent");
        sent.insert(body, due);
    }
    let mut got = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let Some(rest) = line.strip_prefix("got=") else {
            continue;
        };
        let mut parts = rest.split(' ');
        let body = parts.next().unwrap().to_owned();
        let at_ms: i64 = parts
            .next()
            .unwrap()
            .trim_start_matches("at=")
            .parse()
            .unwrap();
        let due_ms: i64 = parts
            .next()
            .unwrap()
            .trim_start_matches("due=")
            .parse()
            .unwrap();
        got.push((body, Arrival { at_ms, due_ms }));
    }
    let status = java.wait().await.unwrap();
    assert!(status.success(), "the Java consumer timed out: {got:?}");
    assert_eq!(got.len(), 10, "{got:?}");
    let checked: Vec<_> = got
        .into_iter()
        .map(|(body, arrival)| {
            let due = sent[&body];
            (body, arrival, due)
        })
        .collect();
    let late = lateness(&checked, 1000);
    eprintln!("ours -> Java, lateness (ms, sorted): {late:?}");
}

/// A delivery time further ahead than the proxy allows fails at once, not retried, naming the
/// option; a delay message on a NORMAL topic gets the proxy's type conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_a_delivery_time_past_its_limit_at_once() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let producer = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = producer
        .send(OutgoingMessage::new(TOPIC, "too far").deliver_after(Duration::from_secs(2 * 86_400)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::IllegalDeliveryTime), "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("deliver_at"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "not retried");
    let err = producer
        .send(
            OutgoingMessage::new("it-normal", "delay on normal")
                .deliver_after(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(Code::MessagePropertyConflictWithType),
        "{err}"
    );
}
