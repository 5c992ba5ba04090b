//! Facts about queues, assignments, retries and priority on a real RocketMQ proxy, which the
//! design of priority consumption on RocketMQ (`mq_priority::PriorityPolicy` through
//! `rocketmq-grpc`) rests on; `rocketmq-grpc/docs/priority-facts.md` holds the findings and the bytecode read
//! beside them. Each test checks one answer of the proxy:
//!
//! - where a normal message lands (the proxy picks the queue; `SystemProperties.queue_id` is
//!   not read), that a message group on a NORMAL topic is refused, and that on a FIFO topic the
//!   group picks the queue by Guava's consistent hash of the group's Java `hashCode`;
//! - what `QueryAssignment` answers (one queue -1 per broker for a normal group, every queue
//!   for an orderly one);
//! - which queues a `ReceiveMessage` pops (every queue of the named broker, whatever queue id
//!   it names);
//! - that one group consumes several topics, each with a receive loop of its own, and that a
//!   retried message comes back through its own topic's receive;
//! - from 5.4 on: what a retried or dead-lettered PRIORITY message keeps (its `priority`,
//!   which queue it comes from, where it ranks).
//!
//! Runs against `ROCKETMQ_ENDPOINT` (`ROCKETMQ_VERSION` and `ROCKETMQ_PROXY_MODE` as
//! `scripts/brokers/rocketmq start` prints them); every test but the pure one returns at once
//! without it. Topics: `it-normal`, `it-normal-2`, `it-simple`, `it-simple-2` (NORMAL, 4
//! queues), `it-fifo` (FIFO, 2 queues), from 5.4 `it-priority` (PRIORITY, 8 queues); groups
//! `prio-facts*` (created by the script on 5.4+, where the proxy refuses unknown groups; a 5.3
//! proxy creates them), `it-fifo-group` (orderly) and `it-normal-dlq` (2 retries). Each test
//! tags its messages with a `run` property of its own and counts only those; a group starts at
//! the oldest message still in memory, so it also receives earlier runs' messages, which it
//! acknowledges.
//!
//! The 5.4+ retry tests expect the broker's default retry settings unless
//! `ROCKETMQ_BROKER_CONF_EXTRA` (which the broker script appends to `broker.conf`) sets
//! `useSeparateRetryQueue=true` and `popFromRetryProbabilityForPriority=100`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use integration_tests::real_rocketmq::{
    broker_version, endpoint, take_leftovers, unique, wait_for,
};
use parking_lot::Mutex;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, OutgoingMessage, Producer, PushConsumer, ReceivedMessage, Session,
    SimpleConsumer, pb, wire,
};

type Client = pb::messaging_service_client::MessagingServiceClient<tonic::transport::Channel>;

const NORMAL_TOPIC: &str = "it-normal";
const FIFO_TOPIC: &str = "it-fifo";
const PRIORITY_TOPIC: &str = "it-priority";
/// An orderly group (`consumeMessageOrderly`), made by the broker script.
const ORDERLY_GROUP: &str = "it-fifo-group";

/// Whether the broker has PRIORITY topics (5.4 and later).
fn has_priority() -> bool {
    let version = broker_version();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    major > 5 || (major == 5 && minor >= 4)
}

/// Java's `String.hashCode`: `s[0]*31^(n-1) + ... + s[n-1]` over UTF-16 code units, wrapping.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// Guava's `Hashing.consistentHash(long, int)` (jump consistent hash, Lamping and Veach, driven
/// by a 64-bit linear congruential generator), which the proxy's send queue selector applies to
/// the message group's `hashCode` over the topic's writable queues.
fn consistent_hash(input: i64, buckets: i32) -> i32 {
    let mut state = input as u64;
    let mut candidate = 0i32;
    loop {
        state = state
            .wrapping_mul(2_862_933_555_777_941_757)
            .wrapping_add(1);
        let next_double = f64::from(((state >> 33) as i32) + 1) / f64::from(1u32 << 31);
        // Java's (int) of a double saturates, as Rust's `as` does.
        let next = (f64::from(candidate + 1) / next_double) as i32;
        if (0..buckets).contains(&next) {
            candidate = next;
        } else {
            return candidate;
        }
    }
}

/// The queue index the proxy gives a message of `group` on a topic with `queues` writable
/// queues (one broker: the index is the queue id).
fn group_queue(group: &str, queues: i32) -> i32 {
    consistent_hash(i64::from(java_hash(group)), queues)
}

/// The hash reproduces what Guava 32.0.1 (the proxy's, 5.3.3 and 5.5.0) answered for these
/// groups: `(group, hashCode, consistentHash over 2, 4, 8)`.
#[test]
fn the_group_hash_is_guavas() {
    let guava: &[(&str, i32, [i32; 3])] = &[
        ("g0", 3241, [0, 0, 0]),
        ("g1", 3242, [0, 0, 6]),
        ("g2", 3243, [0, 3, 4]),
        ("g3", 3244, [0, 2, 2]),
        ("group-a", 293_427_347, [0, 2, 7]),
        ("lvl-é", 103_361_022, [0, 3, 6]),
        ("facts-group-15", -1_165_310_024, [0, 3, 7]),
        ("-5", 1448, [1, 2, 6]),
    ];
    for (group, hash, buckets) in guava {
        assert_eq!(java_hash(group), *hash, "{group}");
        for (n, expected) in [2, 4, 8].into_iter().zip(buckets) {
            assert_eq!(group_queue(group, n), *expected, "{group} over {n}");
        }
    }
}

fn code_name(status: Option<&pb::Status>) -> &'static str {
    let code = status.map_or(-1, |s| s.code);
    pb::Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A raw client: one session (one client id), its telemetry stream kept open.
struct Wire {
    session: Arc<Session>,
    client: Client,
    telemetry: Vec<tokio::sync::mpsc::Sender<pb::TelemetryCommand>>,
}

impl Wire {
    fn new(endpoint: &str) -> Self {
        let session = Session::new(ClientConfig::new(endpoint).unwrap()).unwrap();
        let client = wire::client(&session, session.config().endpoint()).unwrap();
        Self {
            session,
            client,
            telemetry: Vec::new(),
        }
    }

    fn resource(&self, name: &str) -> pb::Resource {
        wire::resource(&self.session, name)
    }

    /// Announces a consumer of `kind` in `group` on `topics` (every tag) on a telemetry stream:
    /// the proxy refuses assignments and receives of a client whose settings it has not seen.
    async fn register(&mut self, kind: pb::ClientType, group: &str, topics: &[&str]) {
        let settings = pb::TelemetryCommand {
            status: None,
            command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
                client_type: Some(kind as i32),
                access_point: Some(wire::endpoints(self.session.config().endpoint())),
                backoff_policy: None,
                request_timeout: Some(Duration::from_secs(10).try_into().unwrap()),
                pub_sub: Some(pb::settings::PubSub::Subscription(pb::Subscription {
                    group: Some(self.resource(group)),
                    subscriptions: topics
                        .iter()
                        .map(|topic| pb::SubscriptionEntry {
                            topic: Some(self.resource(topic)),
                            expression: Some(pb::FilterExpression {
                                r#type: pb::FilterType::Tag as i32,
                                expression: "*".into(),
                            }),
                        })
                        .collect(),
                    ..pb::Subscription::default()
                })),
                user_agent: None,
            })),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(settings).await.unwrap();
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        wire::stamp(&self.session, request.metadata_mut());
        let mut stream = self
            .client
            .clone()
            .telemetry(request)
            .await
            .expect("Telemetry")
            .into_inner();
        stream.message().await.expect("the settings answer");
        self.telemetry.push(tx);
        tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    }

    /// The topic's queues as QueryRoute lists them.
    async fn route(&mut self, topic: &str) -> Vec<pb::MessageQueue> {
        let request = pb::QueryRouteRequest {
            topic: Some(self.resource(topic)),
            endpoints: Some(wire::endpoints(self.session.config().endpoint())),
        };
        let answer = self
            .client
            .query_route(wire::request(
                &self.session,
                request,
                Duration::from_secs(10),
            ))
            .await
            .expect("QueryRoute")
            .into_inner();
        assert!(
            !answer.message_queues.is_empty(),
            "no route of {topic}: {:?}",
            answer.status
        );
        answer.message_queues
    }

    async fn query_assignment(&mut self, topic: &str, group: &str) -> pb::QueryAssignmentResponse {
        let request = pb::QueryAssignmentRequest {
            topic: Some(self.resource(topic)),
            group: Some(self.resource(group)),
            endpoints: Some(wire::endpoints(self.session.config().endpoint())),
        };
        self.client
            .query_assignment(wire::request(
                &self.session,
                request,
                Duration::from_secs(10),
            ))
            .await
            .expect("QueryAssignment")
            .into_inner()
    }

    async fn send(&mut self, messages: Vec<pb::Message>) -> pb::SendMessageResponse {
        self.client
            .send_message(wire::request(
                &self.session,
                pb::SendMessageRequest { messages },
                Duration::from_secs(10),
            ))
            .await
            .expect("SendMessage")
            .into_inner()
    }

    /// One receive of up to 32 messages naming `queue` (its topic, broker and id); long-polls
    /// for up to `poll`.
    async fn receive_once(
        &mut self,
        group: &str,
        queue: &pb::MessageQueue,
        poll: Duration,
    ) -> (Vec<pb::Status>, Vec<pb::Message>) {
        let request = pb::ReceiveMessageRequest {
            group: Some(self.resource(group)),
            message_queue: Some(queue.clone()),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 32,
            invisible_duration: Some(Duration::from_secs(15).try_into().unwrap()),
            auto_renew: false,
            long_polling_timeout: Some(poll.try_into().unwrap()),
            attempt_id: None,
        };
        let mut stream = self
            .client
            .receive_message(wire::request(
                &self.session,
                request,
                poll + Duration::from_secs(10),
            ))
            .await
            .expect("ReceiveMessage")
            .into_inner();
        let (mut statuses, mut messages) = (Vec::new(), Vec::new());
        while let Some(frame) = stream.message().await.expect("a receive frame") {
            match frame.content {
                Some(pb::receive_message_response::Content::Status(s)) => statuses.push(s),
                Some(pb::receive_message_response::Content::Message(m)) => messages.push(m),
                _ => {}
            }
        }
        (statuses, messages)
    }

    /// Acknowledges `messages` of `topic` (every one received, this run's or not).
    async fn ack(&mut self, group: &str, topic: &str, messages: &[pb::Message]) {
        if messages.is_empty() {
            return;
        }
        let entries = messages
            .iter()
            .map(|m| {
                let system = m.system_properties.as_ref().unwrap();
                pb::AckMessageEntry {
                    message_id: system.message_id.clone(),
                    receipt_handle: system.receipt_handle.clone().unwrap_or_default(),
                    lite_topic: None,
                }
            })
            .collect();
        let request = pb::AckMessageRequest {
            group: Some(self.resource(group)),
            topic: Some(self.resource(topic)),
            entries,
        };
        let answer = self
            .client
            .ack_message(wire::request(
                &self.session,
                request,
                Duration::from_secs(10),
            ))
            .await
            .expect("AckMessage")
            .into_inner();
        assert_eq!(
            code_name(answer.status.as_ref()),
            "OK",
            "ack: {:?}",
            answer.status
        );
    }

    /// Receives naming `queue` (and acknowledging everything) until `expected` messages of
    /// `run` came or `within` passed; returns this run's messages.
    async fn drain(
        &mut self,
        group: &str,
        queue: &pb::MessageQueue,
        run: &str,
        expected: usize,
        within: Duration,
    ) -> Vec<pb::Message> {
        let topic = queue.topic.as_ref().unwrap().name.clone();
        let end = tokio::time::Instant::now() + within;
        let mut ours = Vec::new();
        while ours.len() < expected && tokio::time::Instant::now() < end {
            let (_, messages) = self
                .receive_once(group, queue, Duration::from_secs(3))
                .await;
            self.ack(group, &topic, &messages).await;
            ours.extend(messages.into_iter().filter(|m| run_of(m) == Some(run)));
        }
        ours
    }
}

fn run_of(message: &pb::Message) -> Option<&str> {
    message.user_properties.get("run").map(String::as_str)
}

fn queue_of(message: &pb::Message) -> i32 {
    message.system_properties.as_ref().unwrap().queue_id
}

/// A message of `run` as the official clients build it (type NORMAL unless changed).
fn message(topic: &str, run: &str, n: usize) -> pb::Message {
    pb::Message {
        topic: Some(pb::Resource {
            resource_namespace: String::new(),
            name: topic.into(),
        }),
        user_properties: [
            ("run".to_owned(), run.to_owned()),
            ("n".to_owned(), n.to_string()),
        ]
        .into_iter()
        .collect(),
        system_properties: Some(pb::SystemProperties {
            message_id: format!("{run}-{n}").replace(['-', '_'], "0"),
            body_encoding: pb::Encoding::Identity as i32,
            message_type: pb::MessageType::Normal as i32,
            born_timestamp: Some(std::time::SystemTime::now().into()),
            born_host: "priority-facts".into(),
            ..Default::default()
        }),
        body: bytes::Bytes::from(format!("{run}-{n}")),
    }
}

/// Counts per queue id.
fn histogram(messages: &[pb::Message]) -> BTreeMap<i32, usize> {
    messages.iter().fold(BTreeMap::new(), |mut h, m| {
        *h.entry(queue_of(m)).or_default() += 1;
        h
    })
}

/// (a) The proxy picks the queue of a normal message: sent one by one without a group they
/// spread over the topic's queues (round robin), and `SystemProperties.queue_id` (set to 3
/// here) changes nothing: the proxy never reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_picks_the_queue_of_a_normal_message() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-a");
    let group = "prio-facts";
    let mut wire = Wire::new(&endpoint);
    wire.register(pb::ClientType::SimpleConsumer, group, &[NORMAL_TOPIC])
        .await;
    let route = wire.route(NORMAL_TOPIC).await;
    const EACH: usize = 8;
    for n in 0..2 * EACH {
        let mut m = message(NORMAL_TOPIC, &run, n);
        if n >= EACH {
            m.system_properties.as_mut().unwrap().queue_id = 3;
        }
        let answer = wire.send(vec![m]).await;
        assert_eq!(code_name(answer.status.as_ref()), "OK", "{answer:?}");
    }
    let got = wire
        .drain(group, &route[0], &run, 2 * EACH, Duration::from_secs(60))
        .await;
    assert_eq!(got.len(), 2 * EACH, "every message came back");
    let n_of = |m: &pb::Message| m.user_properties["n"].parse::<usize>().unwrap();
    let (plain, asked): (Vec<_>, Vec<_>) = got.into_iter().partition(|m| n_of(m) < EACH);
    let (plain, asked) = (histogram(&plain), histogram(&asked));
    println!(
        "{} queues; without a queue id: {plain:?} (queue -> messages); with queue_id 3: {asked:?}",
        route.len()
    );
    assert!(plain.len() > 1, "spread over the queues: {plain:?}");
    assert!(asked.len() > 1, "queue_id 3 is not honoured: {asked:?}");
}

/// (a) A message group on a NORMAL topic makes it a FIFO message (the proxy adds
/// `__SHARDINGKEY`), which the proxy's topic message type check refuses, whatever
/// `message_type` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_group_on_a_normal_topic_is_refused() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-a2");
    let mut wire = Wire::new(&endpoint);
    for (n, kind) in [pb::MessageType::Normal, pb::MessageType::Fifo]
        .into_iter()
        .enumerate()
    {
        let mut m = message(NORMAL_TOPIC, &run, n);
        let system = m.system_properties.as_mut().unwrap();
        system.message_group = Some(format!("{run}-group"));
        system.message_type = kind as i32;
        let answer = wire.send(vec![m]).await;
        println!(
            "a group on a NORMAL topic, type {}: {} {:?}",
            kind.as_str_name(),
            code_name(answer.status.as_ref()),
            answer.status.as_ref().map(|s| &s.message)
        );
        assert_eq!(
            code_name(answer.status.as_ref()),
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        );
    }
}

/// (a) On a FIFO topic the message group picks the queue: index
/// `Hashing.consistentHash(group.hashCode(), writable queues)` of the sorted writable queues.
/// A non-orderly group receives them like normal messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_group_picks_the_queue_by_consistent_hash() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-a3");
    let group = "prio-facts";
    let mut wire = Wire::new(&endpoint);
    wire.register(pb::ClientType::SimpleConsumer, group, &[FIFO_TOPIC])
        .await;
    let route = wire.route(FIFO_TOPIC).await;
    let writable = route
        .iter()
        .filter(|q| {
            q.permission == pb::Permission::Write as i32
                || q.permission == pb::Permission::ReadWrite as i32
        })
        .count();
    let writable = i32::try_from(writable).unwrap();
    const GROUPS: usize = 16;
    let mut predicted = BTreeMap::new();
    for n in 0..GROUPS {
        let mut m = message(FIFO_TOPIC, &run, n);
        let system = m.system_properties.as_mut().unwrap();
        let message_group = format!("{run}-g{n}");
        predicted.insert(n.to_string(), group_queue(&message_group, writable));
        system.message_group = Some(message_group);
        system.message_type = pb::MessageType::Fifo as i32;
        let answer = wire.send(vec![m]).await;
        assert_eq!(code_name(answer.status.as_ref()), "OK", "{answer:?}");
    }
    let got = wire
        .drain(group, &route[0], &run, GROUPS, Duration::from_secs(60))
        .await;
    assert_eq!(got.len(), GROUPS, "every message came back");
    let seen: BTreeMap<String, i32> = got
        .iter()
        .map(|m| (m.user_properties["n"].clone(), queue_of(m)))
        .collect();
    println!("{writable} writable queues; message n -> queue: {seen:?}; predicted: {predicted:?}");
    assert_eq!(seen, predicted);
    assert!(
        seen.values().collect::<BTreeSet<_>>().len() > 1,
        "the groups cover more than one queue"
    );
}

/// (b) QueryAssignment gives a normal group one queue per broker with id -1 (the proxy pops
/// all of that broker's queues for it), and an orderly group every readable queue by id.
/// From 5.4 a PRIORITY topic is assigned like any other: one queue -1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_assignment_gives_a_normal_group_one_queue_per_broker() {
    let Some(endpoint) = endpoint() else { return };
    let mut topics = vec![NORMAL_TOPIC, FIFO_TOPIC];
    if has_priority() {
        topics.push(PRIORITY_TOPIC);
    }
    let mut normal = Wire::new(&endpoint);
    normal
        .register(pb::ClientType::PushConsumer, "prio-facts-push", &topics)
        .await;
    for topic in &topics {
        let answer = normal.query_assignment(topic, "prio-facts-push").await;
        let ids: Vec<(String, i32)> = answer
            .assignments
            .iter()
            .filter_map(|a| a.message_queue.as_ref())
            .map(|q| (q.broker.as_ref().unwrap().name.clone(), q.id))
            .collect();
        let route = normal.route(topic).await;
        println!(
            "normal group on {topic} ({} queues in the route): {} {ids:?}",
            route.len(),
            code_name(answer.status.as_ref())
        );
        assert_eq!(ids, [("broker-a".to_owned(), -1)], "{topic}");
    }
    let mut orderly = Wire::new(&endpoint);
    orderly
        .register(pb::ClientType::PushConsumer, ORDERLY_GROUP, &[FIFO_TOPIC])
        .await;
    let answer = orderly.query_assignment(FIFO_TOPIC, ORDERLY_GROUP).await;
    let ids: Vec<i32> = answer
        .assignments
        .iter()
        .filter_map(|a| a.message_queue.as_ref())
        .map(|q| q.id)
        .collect();
    println!(
        "orderly group on {FIFO_TOPIC}: {} {ids:?}",
        code_name(answer.status.as_ref())
    );
    assert_eq!(ids, [0, 1]);
}

/// (c) A receive pops every queue of the broker it names, whatever queue id it names: one
/// naming queue 99 (no such queue) is answered, and receives naming queue 3 bring this run's
/// messages from every queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_pops_every_queue_whatever_queue_it_names() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-c");
    let group = "prio-facts-2";
    let mut wire = Wire::new(&endpoint);
    wire.register(pb::ClientType::SimpleConsumer, group, &[NORMAL_TOPIC])
        .await;
    let route = wire.route(NORMAL_TOPIC).await;
    const SENT: usize = 12;
    for n in 0..SENT {
        let answer = wire.send(vec![message(NORMAL_TOPIC, &run, n)]).await;
        assert_eq!(code_name(answer.status.as_ref()), "OK", "{answer:?}");
    }
    let mut nowhere = route[0].clone();
    nowhere.id = 99;
    let (statuses, first) = wire
        .receive_once(group, &nowhere, Duration::from_secs(3))
        .await;
    wire.ack(group, NORMAL_TOPIC, &first).await;
    let mut got: Vec<pb::Message> = first
        .into_iter()
        .filter(|m| run_of(m) == Some(run.as_str()))
        .collect();
    println!(
        "naming queue 99: {:?}, {} of this run's messages from queues {:?}",
        statuses
            .iter()
            .map(|s| code_name(Some(s)))
            .collect::<Vec<_>>(),
        got.len(),
        histogram(&got)
    );
    let mut three = route[0].clone();
    three.id = 3;
    let rest = wire
        .drain(
            group,
            &three,
            &run,
            SENT - got.len(),
            Duration::from_secs(60),
        )
        .await;
    println!(
        "naming queue 3: {} messages from queues {:?}",
        rest.len(),
        histogram(&rest)
    );
    got.extend(rest);
    assert_eq!(got.len(), SENT, "every message came back");
    let queues = histogram(&got);
    assert!(
        queues.keys().any(|q| *q != 3) && queues.len() > 1,
        "messages of other queues came: {queues:?}"
    );
}

/// (e) One group consumes several topics at once: a push consumer with two subscriptions
/// gets both topics' messages (one receive loop per assigned queue, so one per topic and
/// broker), and a simple consumer too (its receives take the topics in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_consumes_several_topics() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-e");
    let topics = ["it-normal-2", "it-simple-2"];
    let config = ClientConfig::new(&endpoint).unwrap();
    let seen: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let prefix = run.clone();
    let push = PushConsumer::builder(config.clone(), "prio-facts-push")
        .subscribe(topics[0], "*")
        .subscribe(topics[1], "*")
        .handler(move |message: ReceivedMessage| {
            let sink = Arc::clone(&sink);
            let prefix = prefix.clone();
            async move {
                if message.properties().get("run") == Some(&prefix) {
                    sink.lock()
                        .push((message.topic().to_owned(), message.queue_id()));
                }
                ConsumeResult::Success
            }
        })
        .build()
        .await
        .unwrap();
    // The simple consumer receives from both topics before the messages are sent: a group's
    // first pop of a queue may start at its end (5.5.0: unless the queue's first message is
    // still in the broker's memory, `initPopOffsetByCheckMsgInMem`), which skipped the
    // messages of a topic this group had never received from in one CI run.
    let simple = SimpleConsumer::builder(config.clone(), "prio-facts-2")
        .subscribe(topics[0], "*")
        .subscribe(topics[1], "*")
        .await_duration(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    take_leftovers(&simple, topics.len()).await;
    let producer = Producer::builder(config.clone()).build().unwrap();
    producer.start().await.unwrap();
    for topic in topics {
        for n in 0..3 {
            producer
                .send(OutgoingMessage::new(topic, format!("{run}-{n}")).property("run", &run))
                .await
                .unwrap();
        }
    }
    wait_for("both topics' messages", Duration::from_secs(60), || {
        seen.lock().len() >= 6
    })
    .await;
    push.close(Duration::from_secs(5)).await;
    let by_topic = seen.lock().iter().fold(BTreeMap::new(), |mut h, (t, _)| {
        *h.entry(t.clone()).or_insert(0) += 1;
        h
    });
    println!("push consumer of two topics: {by_topic:?}");
    assert_eq!(by_topic.len(), 2, "{by_topic:?}");
    let mut got = BTreeMap::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.values().sum::<usize>() < 6 && tokio::time::Instant::now() < end {
        for message in simple
            .receive(32, Duration::from_secs(15))
            .await
            .unwrap_or_default()
        {
            simple.ack(&message).await.unwrap();
            if message.properties().get("run") == Some(&run) {
                *got.entry(message.topic().to_owned()).or_insert(0) += 1;
            }
        }
    }
    simple.close(Duration::from_secs(5)).await;
    println!("simple consumer of two topics: {got:?}");
    assert_eq!(got.values().sum::<usize>(), 6, "{got:?}");
    assert_eq!(got.len(), 2);
}

/// (e) A nacked message comes back through its own topic: receives of the group's other topic
/// never bring it (the retry topic is per group and topic), a receive of its topic does, as
/// the next delivery attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_comes_back_through_its_own_topic() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-r");
    let group = "prio-facts-retry";
    let (topic, other) = ("it-simple", "it-simple-2");
    let mut wire = Wire::new(&endpoint);
    wire.register(pb::ClientType::SimpleConsumer, group, &[topic, other])
        .await;
    let queue = wire.route(topic).await.remove(0);
    let other_queue = wire.route(other).await.remove(0);
    let answer = wire.send(vec![message(topic, &run, 0)]).await;
    assert_eq!(code_name(answer.status.as_ref()), "OK", "{answer:?}");
    let mut first = None;
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while first.is_none() && tokio::time::Instant::now() < end {
        let (_, messages) = wire
            .receive_once(group, &queue, Duration::from_secs(3))
            .await;
        let (ours, others): (Vec<_>, Vec<_>) = messages
            .into_iter()
            .partition(|m| run_of(m) == Some(run.as_str()));
        wire.ack(group, topic, &others).await;
        first = ours.into_iter().next();
    }
    let first = first.expect("the message came");
    let system = first.system_properties.as_ref().unwrap();
    let request = pb::ChangeInvisibleDurationRequest {
        group: Some(wire.resource(group)),
        topic: Some(wire.resource(topic)),
        receipt_handle: system.receipt_handle.clone().unwrap(),
        invisible_duration: Some(Duration::from_secs(1).try_into().unwrap()),
        message_id: system.message_id.clone(),
        lite_topic: None,
        suspend: None,
    };
    let answer = wire
        .client
        .change_invisible_duration(wire::request(
            &wire.session,
            request,
            Duration::from_secs(10),
        ))
        .await
        .expect("ChangeInvisibleDuration")
        .into_inner();
    assert_eq!(code_name(answer.status.as_ref()), "OK", "{answer:?}");
    let nacked = tokio::time::Instant::now();
    // The other topic first, for 10 s: the retry never comes there.
    while nacked.elapsed() < Duration::from_secs(10) {
        let (_, messages) = wire
            .receive_once(group, &other_queue, Duration::from_secs(2))
            .await;
        wire.ack(group, other, &messages).await;
        assert!(
            messages.iter().all(|m| run_of(m) != Some(run.as_str())),
            "the retry came through the other topic"
        );
    }
    let again = wire
        .drain(group, &queue, &run, 1, Duration::from_secs(60))
        .await;
    let again = again.first().expect("the retry came through its topic");
    let system = again.system_properties.as_ref().unwrap();
    println!(
        "the retry came {:?} after the nack, through {topic}: topic {}, queue {} (first delivery \
         queue {}), attempt {:?}",
        nacked.elapsed(),
        again.topic.as_ref().unwrap().name,
        system.queue_id,
        queue_of(&first),
        system.delivery_attempt
    );
    assert_eq!(again.topic.as_ref().unwrap().name, topic);
    assert_eq!(system.delivery_attempt, Some(2));
}

/// A simple consumer of `topic` in `group` with nothing of earlier runs left to receive.
async fn fresh_simple_consumer(endpoint: &str, topic: &str, group: &str) -> SimpleConsumer {
    let consumer = SimpleConsumer::builder(ClientConfig::new(endpoint).unwrap(), group)
        .subscribe(topic, "*")
        .await_duration(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    loop {
        let early = consumer
            .receive(32, Duration::from_secs(20))
            .await
            .unwrap_or_default();
        if early.is_empty() {
            break;
        }
        for message in &early {
            let _ = consumer.ack(message).await;
        }
    }
    consumer
}

/// Whether the broker was started (`ROCKETMQ_BROKER_CONF_EXTRA`, which the broker script appends
/// to `broker.conf`) with the retry settings that keep a retried priority message's rank:
/// `useSeparateRetryQueue=true` (the retry topic gets the topic's queue count and a retry keeps
/// its queue) and `popFromRetryProbabilityForPriority=100` (a pop in priority mode reads the
/// retry topic first).
fn ranked_priority_retries() -> bool {
    let extra = std::env::var("ROCKETMQ_BROKER_CONF_EXTRA").unwrap_or_default();
    let set = |line: &str| extra.lines().any(|l| l.trim() == line);
    set("useSeparateRetryQueue=true") && set("popFromRetryProbabilityForPriority=100")
}

/// How long [`a_retried_high_message_ranks_by_the_broker_retry_settings`] receives after its
/// 10 s pause for the 10 fresh lows and the retried high (a receive under way when it ends
/// may add up to its 30 s).
///
/// Why: with 5.5.0's default retry settings the retried high message came back late, after
/// the fresh lows, from the retry topic's one queue. The wait was 60 s (ending 70 s after the
/// nack) until a run saw 65 s (4bd7067, 2026-12-06): the history records no failure on it,
/// but the margin was gone. Cause not established (the retry topic read after the topic's
/// queues in priority mode is the suspect; `priority-facts.md`, F8). Normal topics' retries
/// came within 10-15 s (F7), and with the changed settings this one came within the 10 s
/// pause.
///
/// Measured (5.5.0 defaults, after the nack): 65 s, 80 s and 65 s in three runs, where is not
/// recorded (399687f, 2026-12-06; the first receive's invisibility of 30 s or 15 s made no
/// difference).
///
/// Bound: the loop ends 130 s after the nack (10 s + 120 s), about 1.6x the largest seen
/// (80 s), and a receive under way then may run to 160 s, 2x. The test prints when the retry
/// came.
const RETRIED_HIGH_WAIT: Duration = Duration::from_secs(120);

/// (d, 5.4+) A nacked PRIORITY message keeps its `priority` but, with the broker's defaults,
/// comes back from the retry topic's single queue (`useSeparateRetryQueue=false`: queue 0),
/// which a pop reads only after the topic's own queues
/// (`popFromRetryProbabilityForPriority=0`): a retried message of the highest level comes
/// after every fresh message of the lowest. With both settings changed
/// ([`ranked_priority_retries`]) it comes back first, from queue 7 of the retry topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_high_message_ranks_by_the_broker_retry_settings() {
    let Some(endpoint) = endpoint() else { return };
    if !has_priority() {
        return;
    }
    let run = unique("facts-d");
    let consumer = fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, "prio-facts-retry").await;
    let producer = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .build()
        .unwrap();
    producer.start().await.unwrap();
    const LOW: usize = 10;
    for n in 0..LOW {
        producer
            .send(
                OutgoingMessage::new(PRIORITY_TOPIC, format!("{run}-low-{n}"))
                    .property("run", &run)
                    .priority(0),
            )
            .await
            .unwrap();
    }
    producer
        .send(
            OutgoingMessage::new(PRIORITY_TOPIC, format!("{run}-high"))
                .property("run", &run)
                .priority(7),
        )
        .await
        .unwrap();
    let is_ours = |m: &ReceivedMessage| m.properties().get("run") == Some(&run);
    let mut high = None;
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while high.is_none() && tokio::time::Instant::now() < end {
        for message in consumer
            .receive(1, Duration::from_secs(30))
            .await
            .unwrap_or_default()
        {
            assert!(is_ours(&message), "nothing else is left");
            high = Some(message);
        }
    }
    let high = high.expect("a first message");
    assert_eq!(high.priority(), Some(7), "the highest level comes first");
    println!(
        "first delivery: priority {:?}, queue {}, attempt {}",
        high.priority(),
        high.queue_id(),
        high.delivery_attempt()
    );
    consumer
        .change_invisible_duration(&high, Duration::from_secs(1))
        .await
        .unwrap();
    let nacked = tokio::time::Instant::now();
    // Time for the revive service to put it on the retry topic.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut order = Vec::new();
    let end = tokio::time::Instant::now() + RETRIED_HIGH_WAIT;
    while order.len() < LOW + 1 && tokio::time::Instant::now() < end {
        for message in consumer
            .receive(1, Duration::from_secs(30))
            .await
            .unwrap_or_default()
        {
            consumer.ack(&message).await.unwrap();
            if is_ours(&message) {
                if message.delivery_attempt() > 1 {
                    println!("the retry came {:?} after the nack", nacked.elapsed());
                }
                order.push((
                    message.priority(),
                    message.queue_id(),
                    message.delivery_attempt(),
                ));
            }
        }
    }
    consumer.close(Duration::from_secs(5)).await;
    println!("after the nack, (priority, queue, attempt) in delivery order: {order:?}");
    assert_eq!(order.len(), LOW + 1, "{order:?}");
    let (retried, fresh) = if ranked_priority_retries() {
        (order[0], &order[1..])
    } else {
        (order[LOW], &order[..LOW])
    };
    if ranked_priority_retries() {
        assert_eq!(
            retried,
            (Some(7), 7, 2),
            "the retried high message comes first, from the retry topic's queue 7: {order:?}"
        );
    } else {
        assert_eq!(
            retried,
            (Some(7), 0, 2),
            "the retried high message comes last, from the retry topic's queue 0: {order:?}"
        );
    }
    assert!(fresh.iter().all(|(p, _, a)| *p == Some(0) && *a == 1));
}

/// (d, 5.4+) The other side of the retry settings: a retried message of the LOWEST level
/// against a fresh one of the highest. With the broker's defaults the fresh high message
/// comes first (the retry topic is read after the topic); with
/// [`ranked_priority_retries`] the retry topic is read first, so the retried low message
/// comes before the fresh high one (an inversion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_low_message_against_a_fresh_high_one() {
    let Some(endpoint) = endpoint() else { return };
    if !has_priority() {
        return;
    }
    let run = unique("facts-d2");
    let consumer = fresh_simple_consumer(&endpoint, PRIORITY_TOPIC, "prio-facts-push").await;
    let producer = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .build()
        .unwrap();
    producer.start().await.unwrap();
    let send = |body: String, level: u32| {
        let message = OutgoingMessage::new(PRIORITY_TOPIC, body)
            .property("run", &run)
            .priority(level);
        let producer = &producer;
        async move { producer.send(message).await.unwrap() }
    };
    send(format!("{run}-low"), 0).await;
    let is_ours = |m: &ReceivedMessage| m.properties().get("run") == Some(&run);
    let mut low = None;
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while low.is_none() && tokio::time::Instant::now() < end {
        low = consumer
            .receive(1, Duration::from_secs(30))
            .await
            .unwrap_or_default()
            .into_iter()
            .find(|m| is_ours(m));
    }
    let low = low.expect("the low message");
    consumer
        .change_invisible_duration(&low, Duration::from_secs(1))
        .await
        .unwrap();
    // Time for the revive service to put it on the retry topic.
    tokio::time::sleep(Duration::from_secs(10)).await;
    send(format!("{run}-high"), 7).await;
    let mut order = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while order.len() < 2 && tokio::time::Instant::now() < end {
        for message in consumer
            .receive(1, Duration::from_secs(30))
            .await
            .unwrap_or_default()
        {
            consumer.ack(&message).await.unwrap();
            if is_ours(&message) {
                order.push((
                    message.priority(),
                    message.queue_id(),
                    message.delivery_attempt(),
                ));
            }
        }
    }
    consumer.close(Duration::from_secs(5)).await;
    println!("a retried low and a fresh high, (priority, queue, attempt) in order: {order:?}");
    let (retried_low, fresh_high) = ((Some(0), 0, 2), (Some(7), 7, 1));
    let expected = if ranked_priority_retries() {
        [retried_low, fresh_high]
    } else {
        [fresh_high, retried_low]
    };
    assert_eq!(order, expected);
}

/// (d) A message that runs out of attempts (group `it-normal-dlq`: 2 retries, 3 attempts)
/// goes to `%DLQ%it-normal-dlq` with its user properties (a level named by a property stays),
/// and from 5.4 a PRIORITY message with its `priority`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_its_properties_and_priority() {
    let Some(endpoint) = endpoint() else { return };
    let run = unique("facts-dlq");
    let group = "it-normal-dlq";
    let topic = if has_priority() {
        PRIORITY_TOPIC
    } else {
        NORMAL_TOPIC
    };
    let consumer = fresh_simple_consumer(&endpoint, topic, group).await;
    let producer = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .build()
        .unwrap();
    producer.start().await.unwrap();
    let mut poison = OutgoingMessage::new(topic, format!("{run}-poison"))
        .property("run", &run)
        .property("level", "2");
    if has_priority() {
        poison = poison.priority(5);
    }
    producer.send(poison).await.unwrap();
    // The proxy forwards a message to the dead-letter topic when a receive pops it beyond the
    // group's attempts (its PopMessageResultFilter), so receive on after the third attempt.
    // The overall limit, 150 s, was 120 s until 3ee2c0a (2026-12-06) added the 20 s after the
    // third attempt; it was not raised after a failure, and no run's time is recorded. Retries
    // came back within 10-15 s (priority-facts.md, F7), so two retries and the 20 s after
    // them take about 50 s; 150 s is about 3x that estimate, a guess, not a measured bound.
    let mut attempts = Vec::new();
    let mut last_nack = None;
    let end = tokio::time::Instant::now() + Duration::from_secs(150);
    while tokio::time::Instant::now() < end
        && last_nack.is_none_or(|at: tokio::time::Instant| at.elapsed() < Duration::from_secs(20))
    {
        for message in consumer
            .receive(32, Duration::from_secs(15))
            .await
            .unwrap_or_default()
        {
            if message.properties().get("run") != Some(&run) {
                consumer.ack(&message).await.unwrap();
                continue;
            }
            attempts.push((
                message.delivery_attempt(),
                message.priority(),
                message.queue_id(),
            ));
            consumer
                .change_invisible_duration(&message, Duration::from_secs(1))
                .await
                .unwrap();
            if attempts.len() == 3 {
                last_nack = Some(tokio::time::Instant::now());
            }
        }
    }
    consumer.close(Duration::from_secs(5)).await;
    println!("attempts (attempt, priority, queue): {attempts:?}");
    assert_eq!(attempts.len(), 3, "2 retries: 3 attempts");
    let dead_letters = format!("%DLQ%{group}");
    let config = ClientConfig::new(&endpoint).unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(90);
    // The dead-letter topic is made with the first dead letter; its route follows.
    let reader = loop {
        match SimpleConsumer::builder(config.clone(), "prio-facts-reader")
            .subscribe(dead_letters.as_str(), "*")
            .await_duration(Duration::from_secs(3))
            .build()
            .await
        {
            Ok(reader) => break reader,
            Err(error) if tokio::time::Instant::now() < end => {
                println!("no reader of {dead_letters} yet: {error}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(error) => panic!("no reader of {dead_letters}: {error}"),
        }
    };
    let mut found = None;
    while found.is_none() && tokio::time::Instant::now() < end {
        for message in reader
            .receive(32, Duration::from_secs(15))
            .await
            .unwrap_or_default()
        {
            reader.ack(&message).await.unwrap();
            if message.properties().get("run") == Some(&run) {
                found = Some(message);
            }
        }
    }
    reader.close(Duration::from_secs(5)).await;
    let dead = found.expect("the dead letter came");
    println!(
        "the dead letter: topic {}, queue {}, priority {:?}, attempt {}, properties {:?}",
        dead.topic(),
        dead.queue_id(),
        dead.priority(),
        dead.delivery_attempt(),
        dead.properties()
    );
    assert_eq!(
        dead.properties().get("level").map(String::as_str),
        Some("2")
    );
    if has_priority() {
        assert_eq!(dead.priority(), Some(5));
    }
}
