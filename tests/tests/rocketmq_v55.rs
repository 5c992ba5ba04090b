//! Priority messages (RIP-80) and lite topics with the lite push consumer (RIP-83) on a real
//! RocketMQ 5.5.0 proxy, and what a 5.3.3 proxy does with the same requests.
//!
//! - `ROCKETMQ55_ENDPOINT`: a 5.5.0 proxy started by `scripts/brokers/rocketmq start` with
//!   `RMQ_VERSION=5.5.0` (topics `it-priority` of type PRIORITY with 8 queues, `it-lite` of
//!   type LITE, `it-normal`; group `it-lite-group` bound to `it-lite`).
//! - `ROCKETMQ_ENDPOINT`: the 5.3.3 proxy of the other suites; only its `it-normal` topic is
//!   used, and nothing is created there but consumer groups.
//!
//! The official Java client 5.2.0 (the newest on Maven Central, with `setPriority` and the
//! `LitePushConsumer`) is the peer: `scripts/java-peers/rmq55`, class `RocketMq55`.
//!
//! Each test returns at once when its variable is not set. Bodies carry a unique prefix, so
//! runs do not see each other's messages.

use integration_tests::real_rocketmq::{settle_group, take_leftovers, unique};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::Code;
use rocketmq_grpc::priority::{GateConfig, Level, PriorityPolicy, PriorityTopics, Strategy};
use rocketmq_grpc::{
    AckSettings, ClientConfig, ConsumeResult, Error, LitePushConsumer, OutgoingMessage, Producer,
    ReceivedMessage, Session, SimpleConsumer,
};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const PRIORITY_TOPIC: &str = "it-priority";
/// Queues of `it-priority`: the levels 0..=7.
const PRIORITY_QUEUES: u32 = 8;
/// The native tiers of `native_tiers_serve_each_level_in_order`: level 0 alone, levels 1-2.
const TIER_TOP: &str = "it-tier-top";
const TIER_REST: &str = "it-tier-rest";
const LITE_TOPIC: &str = "it-lite";
const LITE_GROUP: &str = "it-lite-group";

fn endpoint55() -> Option<String> {
    std::env::var("ROCKETMQ55_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
}

fn endpoint533() -> Option<String> {
    std::env::var("ROCKETMQ_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
}

async fn producer(endpoint: &str) -> Producer {
    let producer = Producer::builder(ClientConfig::new(endpoint).unwrap())
        .build()
        .unwrap();
    producer.start().await.unwrap();
    producer
}

/// A simple consumer of `topic` whose group has nothing left to receive: what earlier runs
/// left is received and acknowledged first (a new group starts at the end of each queue), so
/// that a backlog sent afterwards is all there is to pop. (A 5.5 proxy refuses a group that
/// does not exist: the broker script creates the groups of this suite.)
async fn fresh_simple_consumer(endpoint: &str, topic: &str, group: &str) -> SimpleConsumer {
    fresh_simple_consumer_acking(endpoint, topic, group, AckSettings::default()).await
}

/// [`fresh_simple_consumer`] with its own ack settings.
async fn fresh_simple_consumer_acking(
    endpoint: &str,
    topic: &str,
    group: &str,
    acks: AckSettings,
) -> SimpleConsumer {
    let consumer = SimpleConsumer::builder(ClientConfig::new(endpoint).unwrap(), group)
        .subscribe(topic, "*")
        .await_duration(Duration::from_secs(5))
        .acks(acks)
        .build()
        .await
        .unwrap();
    let taken = take_leftovers(&consumer, 1).await;
    eprintln!("leftovers: {taken}");
    consumer
}

/// Receives until `expected` messages with `prefix` came (acknowledging each) or `within`
/// passed; returns them in arrival order.
async fn drain(
    consumer: &SimpleConsumer,
    prefix: &str,
    expected: usize,
    within: Duration,
) -> Vec<ReceivedMessage> {
    let end = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < expected && tokio::time::Instant::now() < end {
        let batch = consumer.receive(32, Duration::from_secs(30)).await;
        eprintln!(
            "drain: {:?} at {:?}",
            batch.as_ref().map(Vec::len),
            end - tokio::time::Instant::now()
        );
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) if error.code() == Some(Code::MessageNotFound) => continue,
            Err(error) => panic!("receive: {error}"),
        };
        // At once: one after the other, each ack would wait for its own batch.
        let acks = batch.iter().map(|message| consumer.ack(message));
        for acked in futures_util::future::join_all(acks).await {
            acked.unwrap();
        }
        for message in batch {
            if String::from_utf8_lossy(message.body()).starts_with(prefix) {
                got.push(message);
            }
        }
    }
    got
}

/// The group of [`until_poppable`]: it only watches for the last message of a test.
const FENCE_GROUP: &str = "it-priority-fence";

/// Returns once a pop of `fence`'s topic sees the message whose body is `last` (the last one
/// the test sent; `fence` is a [`fresh_simple_consumer`] of [`FENCE_GROUP`] made before the
/// sends), acknowledging what it receives ([`drain`] with `last` as the prefix).
///
/// A send returns once the broker has appended the message to its commit log; the broker puts
/// it on its queue a little later (its reput thread), in commit-log order. A pop right after the
/// sends can miss the last few: in a CI run under load, the first pop of
/// [`priority_backlog_comes_highest_first`] held 9 of its 10 high messages and 23 low ones, and
/// the tenth came in the next pop. Once one group's pop sees the last message sent, every
/// earlier one is on its queue for every group.
async fn until_poppable(fence: &SimpleConsumer, last: &str) {
    let seen = drain(fence, last, 1, Duration::from_secs(30)).await;
    assert!(!seen.is_empty(), "{last} not poppable after 30 s");
}

/// A backlog of low-priority messages, then high-priority ones: a consumer that comes later
/// gets every high one before any low one, and each carries its level (once the broker has
/// put the last one on its queue: [`until_poppable`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_backlog_comes_highest_first() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("prio");
    let group = "it-priority-group";
    let consumer = fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, group).await;
    // Its acks wait 100 ms for their batch, not 5 s: the fence should cost little.
    let quick = AckSettings::default().max_delay(Duration::from_millis(100));
    let fence = fresh_simple_consumer_acking(&endpoint, PRIORITY_TOPIC, FENCE_GROUP, quick).await;
    let producer = producer(&endpoint).await;
    const LOW: usize = 40;
    const HIGH: usize = 10;
    for i in 0..LOW {
        let body = format!("{prefix}-low-{i}");
        producer
            .send(OutgoingMessage::new(PRIORITY_TOPIC, body).priority(0))
            .await
            .unwrap();
    }
    for i in 0..HIGH {
        let body = format!("{prefix}-high-{i}");
        producer
            .send(OutgoingMessage::new(PRIORITY_TOPIC, body).priority(7))
            .await
            .unwrap();
    }
    until_poppable(&fence, &format!("{prefix}-high-{}", HIGH - 1)).await;
    fence.close(Duration::from_secs(5)).await;
    let got = drain(&consumer, &prefix, LOW + HIGH, Duration::from_secs(60)).await;
    assert_eq!(got.len(), LOW + HIGH, "every message came");
    let levels: Vec<i32> = got.iter().map(|m| m.priority().unwrap_or(-1)).collect();
    let last_high = levels.iter().rposition(|l| *l == 7).unwrap();
    let first_low = levels.iter().position(|l| *l == 0).unwrap();
    println!(
        "priority order: {HIGH} high (7) and {LOW} low (0) messages; the last high came at \
         position {last_high}, the first low at {first_low}; levels {levels:?}"
    );
    let late: Vec<String> = got[first_low..]
        .iter()
        .filter(|m| m.priority() == Some(7))
        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
        .collect();
    assert!(
        last_high < first_low,
        "every high message before any low one: {levels:?}; high after a low: {late:?}"
    );
    for message in &got {
        let body = String::from_utf8_lossy(message.body());
        let level = if body.contains("-high-") { 7 } else { 0 };
        assert_eq!(message.priority(), Some(level), "{body}");
        assert_eq!(
            message.queue_id(),
            level,
            "priority p is stored on queue min(p, 7)"
        );
    }
    consumer.close(Duration::from_secs(5)).await;
}

/// Levels above the topic's highest queue are the highest level: stored on the last queue,
/// and delivered with the level they were sent with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_above_the_queue_count_is_the_highest_level() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("prio-cap");
    let consumer = fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, "it-priority-cap").await;
    let producer = producer(&endpoint).await;
    for (i, level) in [3u32, 100, i32::MAX as u32].into_iter().enumerate() {
        producer
            .send(OutgoingMessage::new(PRIORITY_TOPIC, format!("{prefix}-{i}")).priority(level))
            .await
            .unwrap();
    }
    let got = drain(&consumer, &prefix, 3, Duration::from_secs(30)).await;
    let mut seen: Vec<(i32, i32)> = got
        .iter()
        .map(|m| (m.priority().unwrap(), m.queue_id()))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            (3, 3),
            (100, PRIORITY_QUEUES as i32 - 1),
            (i32::MAX, PRIORITY_QUEUES as i32 - 1)
        ]
    );
    consumer.close(Duration::from_secs(5)).await;
}

/// What the client refuses before sending, and what the 5.5.0 proxy refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_lite_refusals() {
    let Some(endpoint) = endpoint55() else { return };
    let producer = producer(&endpoint).await;
    let refused = |error: Error| match error {
        Error::Invalid { what, .. } => what,
        other => panic!("not refused before sending: {other}"),
    };
    let too_high = OutgoingMessage::new(PRIORITY_TOPIC, "x").priority(u32::MAX);
    assert_eq!(
        refused(producer.send(too_high).await.unwrap_err()),
        "priority"
    );
    let both = OutgoingMessage::new(PRIORITY_TOPIC, "x")
        .priority(1)
        .message_group("g");
    assert_eq!(refused(producer.send(both).await.unwrap_err()), "priority");
    let bad_name = OutgoingMessage::new(LITE_TOPIC, "x").lite_topic("no spaces");
    assert_eq!(
        refused(producer.send(bad_name).await.unwrap_err()),
        "lite_topic"
    );
    // The proxy: a priority message on a normal topic, a lite message on the priority topic.
    for (message, what) in [
        (
            OutgoingMessage::new("it-normal", unique("prio-normal")).priority(3),
            "a priority message on a NORMAL topic",
        ),
        (
            OutgoingMessage::new(PRIORITY_TOPIC, unique("lite-prio")).lite_topic("x"),
            "a lite message on a PRIORITY topic",
        ),
        (
            OutgoingMessage::new(LITE_TOPIC, unique("plain-lite")),
            "a normal message on a LITE topic",
        ),
    ] {
        let error = producer.send(message).await.unwrap_err();
        println!("5.5.0, {what}: {error}");
        assert_eq!(
            error.code(),
            Some(Code::MessagePropertyConflictWithType),
            "{what}: {error}"
        );
    }
    let long = "x".repeat(65);
    let error = producer
        .send(OutgoingMessage::new(LITE_TOPIC, "x").lite_topic(long))
        .await
        .unwrap_err();
    println!("5.5.0, a 65-byte lite topic: {error}");
    assert_eq!(error.code(), Some(Code::IllegalLiteTopic), "{error}");
}

/// What a lite handler saw.
#[derive(Default)]
struct Seen {
    messages: Mutex<Vec<(String, Option<String>)>>,
}

impl Seen {
    fn with_prefix(&self, prefix: &str) -> Vec<(String, Option<String>)> {
        self.messages
            .lock()
            .iter()
            .filter(|(body, _)| body.starts_with(prefix))
            .cloned()
            .collect()
    }
}

async fn wait_for(seen: &Seen, prefix: &str, count: usize, within: Duration) {
    let end = tokio::time::Instant::now() + within;
    while seen.with_prefix(prefix).len() < count && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn lite_consumer(endpoint: &str, seen: &Arc<Seen>) -> LitePushConsumer {
    let seen = Arc::clone(seen);
    LitePushConsumer::builder(ClientConfig::new(endpoint).unwrap(), LITE_GROUP, LITE_TOPIC)
        .handler(move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            async move {
                let body = String::from_utf8_lossy(message.body()).into_owned();
                seen.messages
                    .lock()
                    .push((body, message.lite_topic().map(str::to_owned)));
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap()
}

/// A lite push consumer gets the messages of the lite topics it subscribed to, each with its
/// lite topic, and none of the others; its acks pass; after unsubscribing it gets no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite_consumer_gets_its_lite_topics_only() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("lite");
    let mine = unique("mine").replace('-', "_");
    let other = unique("other");
    let seen = Arc::new(Seen::default());
    let consumer = lite_consumer(&endpoint, &seen).await;
    consumer.subscribe_lite(&mine).await.unwrap();
    assert_eq!(consumer.lite_topics(), vec![mine.clone()]);
    assert_eq!(consumer.bind_topic(), LITE_TOPIC);
    let producer = producer(&endpoint).await;
    let started = tokio::time::Instant::now();
    for i in 0..10 {
        for lite in [&mine, &other] {
            producer
                .send(
                    OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-{lite}-{i}"))
                        .lite_topic(lite),
                )
                .await
                .unwrap();
        }
    }
    wait_for(&seen, &prefix, 10, Duration::from_secs(30)).await;
    let took = started.elapsed();
    // Anything of the other lite topic would have come by now too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = seen.with_prefix(&prefix);
    println!(
        "lite: 10 messages of {mine} came in {took:?}; {} in all",
        got.len()
    );
    assert_eq!(got.len(), 10, "{got:?}");
    for (body, lite) in &got {
        assert!(body.contains(&mine), "{body}");
        assert_eq!(lite.as_deref(), Some(mine.as_str()));
    }
    consumer.unsubscribe_lite(&mine).await.unwrap();
    assert!(consumer.lite_topics().is_empty());
    producer
        .send(OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-after")).lite_topic(&mine))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(seen.with_prefix(&format!("{prefix}-after")).len(), 0);
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert_eq!(report.acks.failed, 0, "{report:?}");
}

/// Bad names are refused before any request; the quota the proxy announces is enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite_subscription_refusals() {
    let Some(endpoint) = endpoint55() else { return };
    let seen = Arc::new(Seen::default());
    let consumer = lite_consumer(&endpoint, &seen).await;
    for bad in ["", "a b", "ünï", &"x".repeat(65)] {
        match consumer.subscribe_lite(bad).await.unwrap_err() {
            Error::Invalid { what, .. } => assert_eq!(what, "lite_topic", "{bad:?}"),
            other => panic!("{bad:?}: {other}"),
        }
    }
    assert!(consumer.lite_topics().is_empty());
    consumer.close(Duration::from_secs(5)).await;
}

/// A lite subscription that starts at the oldest message gets what was sent before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite_subscription_from_the_start_gets_the_backlog() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("lite-backlog");
    let lite = unique("backlog");
    let producer = producer(&endpoint).await;
    for i in 0..5 {
        producer
            .send(OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-{i}")).lite_topic(&lite))
            .await
            .unwrap();
    }
    let seen = Arc::new(Seen::default());
    let consumer = lite_consumer(&endpoint, &seen).await;
    consumer
        .subscribe_lite_from(&lite, rocketmq_grpc::LiteOffset::Min)
        .await
        .unwrap();
    wait_for(&seen, &prefix, 5, Duration::from_secs(30)).await;
    assert_eq!(seen.with_prefix(&prefix).len(), 5);
    consumer.close(Duration::from_secs(5)).await;
}

/// RocketMQ 5.3.3 does not know the fields: a priority message and a lite message to a normal
/// topic are stored as normal messages and come back without their level or lite topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_5_3_3_priority_and_lite_are_normal_messages() {
    let Some(endpoint) = endpoint533() else {
        return;
    };
    let prefix = unique("v533");
    // A new group (the proxy creates it), which starts at the end of each queue, and a tag of
    // this run only: the shared topic carries other suites' messages (thousands at times),
    // which the broker's tag filter skips.
    let group = unique("it-v533-probe");
    let tag = unique("v533").replace('-', "_");
    let consumer = SimpleConsumer::builder(ClientConfig::new(&endpoint).unwrap(), &group)
        .subscribe("it-normal", tag.as_str())
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // Its first receives set its offsets on every queue (a queue it first pops after the
    // sends would start after them); up to 10 rounds while other suites' messages flow.
    for _ in 0..10 {
        match consumer.receive(32, Duration::from_secs(20)).await {
            Ok(batch) if !batch.is_empty() => {
                for message in &batch {
                    let _ = consumer.ack(message).await;
                }
            }
            _ => break,
        }
    }
    let producer = producer(&endpoint).await;
    producer
        .send(
            OutgoingMessage::new("it-normal", format!("{prefix}-prio"))
                .tag(&tag)
                .priority(7),
        )
        .await
        .unwrap();
    producer
        .send(
            OutgoingMessage::new("it-normal", format!("{prefix}-lite"))
                .tag(&tag)
                .lite_topic("x"),
        )
        .await
        .unwrap();
    let got = drain(&consumer, &prefix, 2, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 2);
    for message in &got {
        println!(
            "5.3.3: {} came back with priority {:?}, lite topic {:?}",
            String::from_utf8_lossy(message.body()),
            message.priority(),
            message.lite_topic()
        );
        assert_eq!(message.priority(), None);
        assert_eq!(message.lite_topic(), None);
    }
    consumer.close(Duration::from_secs(5)).await;
}

/// RocketMQ 5.3.3 refuses a lite push consumer at its settings (the client type is unknown to
/// it) and does not serve `SyncLiteSubscription` at all (gRPC `UNIMPLEMENTED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_5_3_3_a_lite_consumer_is_refused() {
    let Some(endpoint) = endpoint533() else {
        return;
    };
    let lite = LitePushConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        "it-v533-probe",
        "it-normal",
    )
    .handler(|_: ReceivedMessage| async { ConsumeResult::Success })
    .build()
    .await;
    let error = lite.unwrap_err();
    println!("5.3.3: a lite push consumer is refused: {error}");
    match &error {
        Error::Rpc { rpc, source } => {
            assert_eq!(*rpc, "Telemetry");
            assert!(source.message().contains("UNRECOGNIZED"), "{error}");
        }
        other => panic!("{other}"),
    }
    // SyncLiteSubscription itself, on the wire.
    let session = Session::new(ClientConfig::new(&endpoint).unwrap()).unwrap();
    let access = session.config().endpoint().clone();
    let mut client = rocketmq_grpc::wire::client(&session, &access).unwrap();
    let request = rocketmq_grpc::pb::SyncLiteSubscriptionRequest {
        action: rocketmq_grpc::pb::LiteSubscriptionAction::PartialAdd as i32,
        topic: Some(rocketmq_grpc::wire::resource(&session, "it-normal")),
        group: Some(rocketmq_grpc::wire::resource(&session, "it-v533-probe")),
        lite_topic_set: vec!["x".into()],
        version: None,
        offset_option: None,
    };
    let status = client
        .sync_lite_subscription(rocketmq_grpc::wire::request(
            &session,
            request,
            Duration::from_secs(10),
        ))
        .await
        .unwrap_err();
    println!("5.3.3: SyncLiteSubscription: {status}");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

/// A lite subscription without an offset, made after messages were sent to a lite topic the
/// group never consumed, gets them: a group starts a lite topic it never read at its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite_subscription_without_offset_after_a_backlog() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("lite-late");
    let lite = unique("late");
    let producer = producer(&endpoint).await;
    for i in 0..5 {
        producer
            .send(OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-{i}")).lite_topic(&lite))
            .await
            .unwrap();
    }
    let seen = Arc::new(Seen::default());
    let consumer = lite_consumer(&endpoint, &seen).await;
    consumer.subscribe_lite(&lite).await.unwrap();
    producer
        .send(OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-after")).lite_topic(&lite))
        .await
        .unwrap();
    wait_for(&seen, &prefix, 6, Duration::from_secs(15)).await;
    let got = seen.with_prefix(&prefix);
    println!(
        "lite without offset after a backlog of 5: {} came: {got:?}",
        got.len()
    );
    assert_eq!(got.len(), 6, "{got:?}");
    consumer.close(Duration::from_secs(5)).await;
}

/// The Java peer (`scripts/java-peers/rmq55/run RocketMq55 ARGS`), built first if needed; its
/// stdout as lines.
fn java55(args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let run = format!(
        "{}/../scripts/java-peers/rmq55/run",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = Command::new(&run)
        .arg("RocketMq55")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {run}: {e}"));
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Runs the Java peer to its end; its stdout, or a panic when it failed.
async fn java55_output(args: &[&str]) -> Vec<String> {
    let (mut child, mut lines) = java55(args);
    let mut out = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        out.push(line);
    }
    let status = child.wait().await.unwrap();
    assert!(status.success(), "the Java peer failed ({status}): {out:?}");
    out
}

/// Reads the Java peer's lines until "ready".
async fn java55_ready(lines: &mut Lines<BufReader<ChildStdout>>) {
    let ready = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "ready" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "the Java peer did not get ready");
}

/// The "got=BODY priority=P lite=L" lines of the Java peer, in order.
async fn java55_got(
    mut child: Child,
    mut lines: Lines<BufReader<ChildStdout>>,
) -> Vec<(String, i32, String)> {
    let mut got = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let Some(rest) = line.strip_prefix("got=") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let body = fields.next().unwrap().to_owned();
        let priority = fields
            .next()
            .and_then(|f| f.strip_prefix("priority="))
            .unwrap()
            .parse()
            .unwrap();
        let lite = fields
            .next()
            .and_then(|f| f.strip_prefix("lite="))
            .unwrap()
            .to_owned();
        got.push((body, priority, lite));
    }
    let status = child.wait().await.unwrap();
    assert!(
        status.success(),
        "the Java peer failed ({status}); it got {got:?}"
    );
    got
}

/// Eight levels on the native priority topic (level `k` is native priority `7 - k`).
fn eight_levels() -> PriorityTopics {
    PriorityTopics::builder(PriorityPolicy::new(8).unwrap())
        .native(PRIORITY_TOPIC)
        .build()
        .unwrap()
}

/// Priority messages from the Java client (`setPriority`) come to this client's consumer in
/// priority order, with their levels, which the priority API reads at the right level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_priority_messages_come_here_in_order() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("java-prio");
    let consumer = fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, "it-priority-java").await;
    java55_output(&[
        "send-priority",
        &endpoint,
        PRIORITY_TOPIC,
        &format!("{prefix}-low"),
        "0",
        "20",
    ])
    .await;
    java55_output(&[
        "send-priority",
        &endpoint,
        PRIORITY_TOPIC,
        &format!("{prefix}-high"),
        "7",
        "5",
    ])
    .await;
    let got = drain(&consumer, &prefix, 25, Duration::from_secs(60)).await;
    let levels: Vec<i32> = got.iter().map(|m| m.priority().unwrap_or(-1)).collect();
    println!("Java to Rust, priority levels in arrival order: {levels:?}");
    assert_eq!(levels.len(), 25);
    assert!(
        levels[..5].iter().all(|l| *l == 7) && levels[5..].iter().all(|l| *l == 0),
        "{levels:?}"
    );
    // The priority API reads the Java client's `setPriority` at the right level (it sets no
    // property): with eight levels native 7 is level 0 (the most important), native 0 level 7.
    let topics = eight_levels();
    for message in &got {
        let body = String::from_utf8_lossy(message.body());
        let expected = if body.contains("-high-") { 0 } else { 7 };
        assert_eq!(topics.level_of(message), Level::new(expected), "{body}");
    }
    consumer.close(Duration::from_secs(5)).await;
}

/// Priority messages from this client, sent at their levels through the priority API
/// (`Producer::send_prioritized`), reach the Java client's consumer in priority order, with the
/// native priorities of their levels (`MessageView.getPriority`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_priority_messages_reach_java_in_order() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("rust-prio");
    let (child, mut lines) = java55(&[
        "receive",
        &endpoint,
        PRIORITY_TOPIC,
        "it-priority-rust-java",
        &prefix,
        "25",
        "120",
        "8",
    ]);
    java55_ready(&mut lines).await;
    let producer = producer(&endpoint).await;
    // Sent through the priority API: level 7 of eight (the least important) is native
    // priority 0, level 0 native priority 7.
    let topics = eight_levels();
    let property = topics.policy().property().to_owned();
    for i in 0..20 {
        let message =
            OutgoingMessage::new("any", format!("{prefix}-low-{i}")).property(&property, "7");
        producer.send_prioritized(&topics, message).await.unwrap();
    }
    for i in 0..5 {
        let message =
            OutgoingMessage::new("any", format!("{prefix}-high-{i}")).property(&property, "0");
        producer.send_prioritized(&topics, message).await.unwrap();
    }
    let got = java55_got(child, lines).await;
    let levels: Vec<i32> = got.iter().map(|(_, p, _)| *p).collect();
    println!("Rust to Java, priority levels in arrival order: {levels:?}");
    assert_eq!(levels.len(), 25);
    // The Java consumer waits 8 s after "ready": the whole backlog is there when it receives.
    assert!(
        levels[..5].iter().all(|l| *l == 7) && levels[5..].iter().all(|l| *l == 0),
        "{levels:?}"
    );
}

/// Lite messages from this client reach the Java client's lite push consumer (subscribed to one
/// lite topic) with their lite topic, and those of another lite topic do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_lite_messages_reach_the_java_lite_consumer() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("rust-lite");
    let lite = unique("java-sub");
    let (child, mut lines) = java55(&[
        "lite-consume",
        &endpoint,
        LITE_TOPIC,
        LITE_GROUP,
        &lite,
        &prefix,
        "5",
        "120",
    ]);
    java55_ready(&mut lines).await;
    let producer = producer(&endpoint).await;
    for i in 0..5 {
        producer
            .send(
                OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-other-{i}"))
                    .lite_topic("not-subscribed"),
            )
            .await
            .unwrap();
        producer
            .send(OutgoingMessage::new(LITE_TOPIC, format!("{prefix}-{i}")).lite_topic(&lite))
            .await
            .unwrap();
    }
    let got = java55_got(child, lines).await;
    println!("Rust to the Java lite consumer: {got:?}");
    assert_eq!(got.len(), 5);
    assert!(
        got.iter()
            .all(|(body, _, l)| *l == lite && !body.contains("other")),
        "{got:?}"
    );
}

/// Lite messages from the Java client (`setLiteTopic`) reach this client's lite push consumer
/// with their lite topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_lite_messages_reach_our_lite_consumer() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("java-lite");
    let lite = unique("rust-sub");
    let seen = Arc::new(Seen::default());
    let consumer = lite_consumer(&endpoint, &seen).await;
    consumer.subscribe_lite(&lite).await.unwrap();
    java55_output(&["send-lite", &endpoint, LITE_TOPIC, &prefix, &lite, "5"]).await;
    wait_for(&seen, &prefix, 5, Duration::from_secs(30)).await;
    let got = seen.with_prefix(&prefix);
    println!("Java to the Rust lite consumer: {got:?}");
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|(_, l)| l.as_deref() == Some(lite.as_str())));
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

/// A push consumer of a priority topic, started on a backlog, handles the high messages first
/// (one at a time: the proxy assigns the whole topic as one queue, popped highest first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_consumer_handles_high_priority_first() {
    let Some(endpoint) = endpoint55() else { return };
    let group = "it-priority-push";
    let prefix = unique("push-prio");
    // Sets the group's offsets and takes what earlier runs left.
    fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, group)
        .await
        .close(Duration::from_secs(5))
        .await;
    let producer = producer(&endpoint).await;
    for i in 0..20 {
        producer
            .send(OutgoingMessage::new(PRIORITY_TOPIC, format!("{prefix}-low-{i}")).priority(1))
            .await
            .unwrap();
    }
    for i in 0..5 {
        producer
            .send(OutgoingMessage::new(PRIORITY_TOPIC, format!("{prefix}-high-{i}")).priority(6))
            .await
            .unwrap();
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&order);
    let prefix2 = prefix.clone();
    let consumer =
        rocketmq_grpc::PushConsumer::builder(ClientConfig::new(&endpoint).unwrap(), group)
            .subscribe(PRIORITY_TOPIC, "*")
            .concurrency(1)
            .receive_batch_size(1)
            .handler(move |message: ReceivedMessage| {
                let sink = Arc::clone(&sink);
                let prefix = prefix2.clone();
                async move {
                    if String::from_utf8_lossy(message.body()).starts_with(&prefix) {
                        sink.lock().push(message.priority().unwrap_or(-1));
                    }
                    ConsumeResult::Success
                }
            })
            .build()
            .await
            .unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while order.lock().len() < 25 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let order = order.lock().clone();
    println!("push consumer, priority levels in handling order: {order:?}");
    assert_eq!(order.len(), 25);
    assert!(
        order[..5].iter().all(|l| *l == 6) && order[5..].iter().all(|l| *l == 1),
        "{order:?}"
    );
    consumer.close(Duration::from_secs(10)).await;
}

/// A failed urgent message keeps its rank through a priority consumer (apache/rocketmq#10350):
/// a native priority consumer retries it in place instead of nacking it. Nacked, it would come
/// back through the group's retry topic after the whole low backlog (and 65-80 s late on
/// 5.5.0's defaults, `rocketmq_priority_facts.rs`). Its first attempt runs past the
/// receive's invisibility (20 s in the broker script) before failing, so that its 1 s retry
/// delay could not be a local retry without holding it: the case that was nacked before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_urgent_message_is_retried_before_the_low_backlog() {
    let Some(endpoint) = endpoint55() else { return };
    let group = "it-priority-retry";
    let prefix = unique("retry-prio");
    fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, group)
        .await
        .close(Duration::from_secs(5))
        .await;
    let topics = PriorityTopics::builder(PriorityPolicy::new(2).unwrap())
        .native(PRIORITY_TOPIC)
        .build()
        .unwrap();
    let property = topics.policy().property().to_owned();
    let producer = producer(&endpoint).await;
    for i in 0..20 {
        let low = OutgoingMessage::new("any", format!("{prefix}-low-{i}")).property(&property, "1");
        producer.send_prioritized(&topics, low).await.unwrap();
    }
    let urgent = OutgoingMessage::new("any", format!("{prefix}-urgent")).property(&property, "0");
    producer.send_prioritized(&topics, urgent).await.unwrap();
    // (body, attempt, level) in handling order.
    let order: Arc<Mutex<Vec<(String, i32, u8)>>> = Arc::default();
    let sink = Arc::clone(&order);
    let reader = topics.clone();
    let prefix2 = prefix.clone();
    let consumer =
        rocketmq_grpc::PushConsumer::builder(ClientConfig::new(&endpoint).unwrap(), group)
            .concurrency(1)
            .receive_batch_size(1)
            .priority(topics, Default::default())
            .handler(move |message: ReceivedMessage| {
                let sink = Arc::clone(&sink);
                let level = reader.level_of(&message).get();
                let body = String::from_utf8_lossy(message.body()).into_owned();
                let prefix = prefix2.clone();
                async move {
                    if !body.starts_with(&prefix) {
                        return ConsumeResult::Success;
                    }
                    let attempt = message.delivery_attempt();
                    sink.lock().push((body.clone(), attempt, level));
                    if body.ends_with("-urgent") && attempt == 1 {
                        // Past the receive's 20 s invisibility (renewed meanwhile), then fail.
                        tokio::time::sleep(Duration::from_secs(22)).await;
                        return ConsumeResult::Failure;
                    }
                    ConsumeResult::Success
                }
            })
            .build()
            .await
            .unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(120);
    while order.lock().len() < 22 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = consumer.close(Duration::from_secs(10)).await;
    let order = order.lock().clone();
    println!("a failed urgent message and a low backlog, in handling order: {order:?}");
    assert_eq!(order.len(), 22, "{order:?}");
    let urgent: Vec<usize> = (0..order.len())
        .filter(|&i| order[i].0.ends_with("-urgent"))
        .collect();
    assert_eq!(
        urgent,
        [0, 1],
        "the urgent message first, then its retry: {order:?}"
    );
    assert_eq!(
        (order[1].1, order[1].2),
        (2, 0),
        "the retry is attempt 2 at level 0"
    );
    assert!(
        order[2..]
            .iter()
            .all(|(_, attempt, level)| *attempt == 1 && *level == 1)
    );
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

/// Native tiers ("both"): level 0 alone on `it-tier-top`, levels 1 and 2 on `it-tier-rest` at
/// native priorities 1 and 0. A backlog of level 2 is sent first, then level 1, then level
/// 0; a simple consumer of the tiers gets every level-1 message before any level-2 one (the
/// broker orders the tier) and the level-0 ones with the first answers, not behind the
/// backlog (the consumer asks both tiers and sorts by level), each read back at its level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_tiers_serve_each_level_in_order() {
    let Some(endpoint) = endpoint55() else { return };
    let prefix = unique("tiers");
    let policy = PriorityPolicy::builder()
        .levels(3)
        .default_level(2)
        .build()
        .unwrap();
    let topics = PriorityTopics::builder(policy.clone())
        .native_tiers([(TIER_TOP, 1), (TIER_REST, 2)])
        .build()
        .unwrap();
    let gate = GateConfig::default()
        .with_strategy(Strategy::Strict)
        .with_receiver_queue_size(32);
    let builder = || {
        SimpleConsumer::builder(ClientConfig::new(&endpoint).unwrap(), "it-priority-tiers")
            .priority(topics.clone(), gate.clone())
            .await_duration(Duration::from_secs(5))
            .build()
    };
    // Leftovers and stale pops go first (a stale pop would take a level-0 message for 40 s).
    eprintln!(
        "leftovers: {}",
        settle_group(builder().await.unwrap()).await
    );
    let consumer = builder().await.unwrap();
    let producer = producer(&endpoint).await;
    const BACKLOG: usize = 60;
    const EACH: usize = 10;
    let mut sent = Vec::new();
    for (level, count) in [(2, BACKLOG), (1, EACH), (0, EACH)] {
        for i in 0..count {
            let message = OutgoingMessage::new(TIER_REST, format!("{prefix}-{level}-{i}"))
                .property(policy.property(), level.to_string());
            let routed = topics.route(message).unwrap();
            sent.push((routed.topic().to_owned(), routed.priority_level()));
            producer.send(routed).await.unwrap();
        }
    }
    assert_eq!(sent[0], (TIER_REST.to_owned(), Some(0)));
    assert_eq!(sent[BACKLOG], (TIER_REST.to_owned(), Some(1)));
    assert_eq!(sent[BACKLOG + EACH], (TIER_TOP.to_owned(), Some(0)));
    let total = BACKLOG + 2 * EACH;
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut got: Vec<(usize, Level, String)> = Vec::new();
    while got.len() < total && tokio::time::Instant::now() < end {
        let batch = match consumer.receive(32, Duration::from_secs(30)).await {
            Ok(batch) => batch,
            Err(error) if error.code() == Some(Code::MessageNotFound) => continue,
            Err(error) => panic!("receive: {error}"),
        };
        let acks = batch.iter().map(|message| consumer.ack(message));
        for acked in futures_util::future::join_all(acks).await {
            acked.unwrap();
        }
        for message in batch {
            let body = String::from_utf8_lossy(message.body()).into_owned();
            let Some(rest) = body.strip_prefix(&format!("{prefix}-")) else {
                continue;
            };
            let sent_level: usize = rest[..1].parse().unwrap();
            got.push((
                sent_level,
                topics.level_of(&message),
                message.topic().to_owned(),
            ));
        }
    }
    let order: Vec<usize> = got.iter().map(|(level, _, _)| *level).collect();
    println!("native tiers, levels in receiving order: {order:?}");
    assert_eq!(got.len(), total, "every message came once");
    for (sent_level, read, topic) in &got {
        assert_eq!(
            usize::from(read.get()),
            *sent_level,
            "read back at its level"
        );
        let expected = if *sent_level == 0 {
            TIER_TOP
        } else {
            TIER_REST
        };
        assert_eq!(topic, expected);
    }
    let first_backlog = order.iter().position(|l| *l == 2).unwrap();
    let last_one = order.iter().rposition(|l| *l == 1).unwrap();
    let last_zero = order.iter().rposition(|l| *l == 0).unwrap();
    assert!(
        last_one < first_backlog,
        "the broker serves level 1 before level 2 in the tier: {order:?}"
    );
    // Without priority the level-0 messages, sent last, would come last (positions 70-79);
    // here they come with the first answers of the two tiers (at most 2 x 32 messages).
    assert!(
        last_zero < 2 * 32,
        "level 0 with the first answers: {order:?}"
    );
    consumer.close(Duration::from_secs(10)).await;
}
