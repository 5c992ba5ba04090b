//! The RocketMQ adapter against a real proxy (`scripts/brokers/rocketmq start`).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set (the script prints it); otherwise every test returns at
//! once.

use integration_tests::real_rocketmq::{broker_version, endpoint, unique, wait_for};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{BatchInfo, FlushReason, ItemReply, ItemView, Next, Observer};
use parking_lot::Mutex;
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, MessageHandler, OutgoingMessage,
    Producer, PushConsumer, ReceivedMessage, Session, wire,
};

/// Records every message id it sees, and how often.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl MessageHandler for Recorder {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.seen.lock().push(message.message_id().to_owned());
        ConsumeResult::Success
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_acks_are_accepted_and_nothing_is_redelivered() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal";
    let group = format!("it-group-{}", std::process::id());
    let config = ClientConfig::new(&endpoint).unwrap();
    // Subscribe first so that the new group starts before the messages.
    let recorder = Arc::new(Recorder::default());
    let consumer = PushConsumer::builder(config.clone(), group.as_str())
        .subscribe(topic, "*")
        .acks(AckSettings::default().max_delay(Duration::from_secs(1)))
        .handler(recorder.clone())
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::builder(config.clone()).build().unwrap();
    let mut sent = HashSet::new();
    for i in 0..500 {
        let receipt = producer
            .send(OutgoingMessage::new(topic, format!("message {i}")))
            .await
            .expect("send");
        sent.insert(receipt.message_id().to_owned());
    }
    wait_for("500 messages", Duration::from_secs(120), || {
        let seen = recorder.seen.lock();
        sent.iter().all(|id| seen.contains(id))
    })
    .await;
    wait_for("their acks", Duration::from_secs(30), || {
        consumer.stats().acked >= 500
    })
    .await;
    let stats = consumer.stats();
    assert_eq!(stats.ack_failed, 0, "{stats:?}");
    assert!(
        stats
            .acks
            .batch_sizes
            .buckets()
            .any(|(low, _, _)| low >= 16),
        "the proxy accepted multi-entry AckMessage requests: {:?}",
        stats.acks.batch_sizes
    );
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    let ours = |seen: &[String]| seen.iter().filter(|id| sent.contains(*id)).count();
    assert_eq!(
        ours(&recorder.seen.lock()),
        500,
        "no duplicates before shutdown"
    );
}

/// Consumes with a fresh group, publishing `n` messages after it started; returns the consumer,
/// its recorder and the ids sent.
async fn consume_fresh(
    endpoint: &str,
    topic: &str,
    group: &str,
    n: usize,
    fifo_group: Option<&str>,
    acks: AckSettings,
) -> (PushConsumer, Arc<Recorder>, Vec<String>) {
    let config = ClientConfig::new(endpoint).unwrap();
    let recorder = Arc::new(Recorder::default());
    let consumer = PushConsumer::builder(config.clone(), group)
        .subscribe(topic, "*")
        .acks(acks)
        .handler(recorder.clone())
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::builder(config).build().unwrap();
    let mut sent = Vec::new();
    for i in 0..n {
        let mut message = OutgoingMessage::new(topic, format!("message {i}"));
        if let Some(group) = fifo_group {
            message = message.message_group(group);
        }
        sent.push(
            producer
                .send(message)
                .await
                .expect("send")
                .message_id()
                .to_owned(),
        );
    }
    (consumer, recorder, sent)
}

fn count_of(seen: &[String], sent: &[String]) -> usize {
    seen.iter().filter(|id| sent.contains(id)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_pending_acks_and_acked_messages_are_not_redelivered() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let group = format!("it-flush-{}", std::process::id());
    // A long max_delay: only the shutdown flushes.
    let acks = AckSettings::default().max_delay(Duration::from_secs(600));
    let (consumer, recorder, sent) =
        consume_fresh(&endpoint, "it-normal-2", &group, 50, None, acks).await;
    wait_for("50 messages", Duration::from_secs(120), || {
        count_of(&recorder.seen.lock(), &sent) == 50
    })
    .await;
    let report = consumer.close(Duration::from_secs(10)).await;
    // A new group also reads what earlier runs left on the topic: at least our 50.
    assert!(report.acks.succeeded >= 50, "{report:?}");
    assert_eq!(
        report.acks.pending_at_close as u64, report.acks.succeeded,
        "{report:?}"
    );
    assert!(report.unacknowledged.is_empty());
    // A second consumer of the group stays past the 20 s invisibility: nothing comes back.
    let config = ClientConfig::new(&endpoint).unwrap();
    let again = Arc::new(Recorder::default());
    let second = PushConsumer::builder(config, group.as_str())
        .subscribe("it-normal-2", "*")
        .handler(again.clone())
        .build()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(
        count_of(&again.seen.lock(), &sent),
        0,
        "acknowledged messages came back"
    );
    second.close(Duration::from_secs(5)).await;
}

/// The distinct errors of the acks that failed for good.
#[derive(Default)]
struct AckErrors(Mutex<Vec<String>>);

impl Observer<AckKey, AckEntry, (), rocketmq_grpc::Error> for AckErrors {
    fn after_flush(
        &self,
        _: &AckKey,
        _: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), rocketmq_grpc::Error>],
    ) {
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            if let ItemReply::Err(error) = view.reply {
                let error = error.to_string();
                let mut errors = self.0.lock();
                if !errors.contains(&error) {
                    errors.push(error);
                }
            }
        }
    }
}

/// `AckSettings::follow_deadlines` on the real proxy, whose auto-renewed receives are
/// invisible for 20 s (`scripts/brokers/rocketmq`): with a 25 s delay the batch goes out at the
/// handles' deadline (their 20 s minus a margin of 2 s, a tenth), not after 25 s when they would
/// have expired: the deadline follows the invisible time in the receipt handles (the proxy
/// sends no `invisible_duration`). The proxy accepts every entry, and nothing comes back after
/// the invisibility.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_that_follow_the_deadlines_go_out_before_the_handles_expire() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let group = format!("it-deadlines-{}", std::process::id());
    let errors = Arc::new(AckErrors::default());
    let acks = AckSettings::default()
        .follow_deadlines(Duration::from_secs(25))
        .observer(errors.clone());
    let (consumer, recorder, sent) =
        consume_fresh(&endpoint, "it-normal", &group, 40, None, acks).await;
    wait_for("40 messages", Duration::from_secs(60), || {
        count_of(&recorder.seen.lock(), &sent) == 40
    })
    .await;
    let all_seen = tokio::time::Instant::now();
    // A new group also reads what earlier runs left on the topic: every message it handled.
    wait_for("their acks", Duration::from_secs(30), || {
        let stats = consumer.stats();
        stats.acked + stats.ack_failed >= stats.consumed
    })
    .await;
    let waited = all_seen.elapsed();
    let stats = consumer.stats();
    assert_eq!(stats.ack_failed, 0, "{stats:?} {:?}", errors.0.lock());
    assert!(
        stats.acks.batches(FlushReason::Deadline) >= 1
            && stats.acks.batches(FlushReason::Delay) == 0,
        "the acks went out at the handles' deadline: {stats:?}"
    );
    assert!(
        waited < Duration::from_secs(20),
        "acked {waited:?} after the last receipt"
    );
    // Past the 20 s invisibility: nothing comes back.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(count_of(&recorder.seen.lock(), &sent), 40, "duplicates");
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_are_consumed_in_order_and_acked_at_once() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let (consumer, recorder, sent) = consume_fresh(
        &endpoint,
        "it-fifo",
        "it-fifo-group",
        20,
        Some(&format!("account-{}", std::process::id())),
        AckSettings::default(),
    )
    .await;
    wait_for("20 FIFO messages", Duration::from_secs(120), || {
        count_of(&recorder.seen.lock(), &sent) == 20
    })
    .await;
    let seen: Vec<String> = recorder
        .seen
        .lock()
        .iter()
        .filter(|id| sent.contains(id))
        .cloned()
        .collect();
    assert_eq!(seen, sent, "in order, once each");
    let stats = consumer.stats();
    assert!(
        stats.acks.batches(ack_batcher::FlushReason::Immediate) >= 20,
        "{stats:?}"
    );
    assert_eq!(stats.ack_failed, 0);
    consumer.close(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_receipt_handle_is_a_per_entry_internal_server_error() {
    use rocketmq_grpc::pb;
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let config = ClientConfig::new(&endpoint).unwrap();
    let session = Session::new(config.clone()).unwrap();
    let mut client = wire::client(&session, config.endpoint()).unwrap();
    let group = format!("it-malformed-{}", std::process::id());
    let response = client
        .ack_message(wire::request(
            &session,
            pb::AckMessageRequest {
                group: Some(wire::resource(&session, &group)),
                topic: Some(wire::resource(&session, "it-normal")),
                entries: vec![pb::AckMessageEntry {
                    message_id: "not-a-message".into(),
                    receipt_handle: "not a receipt handle".into(),
                    lite_topic: None,
                }],
            },
            Duration::from_secs(30),
        ))
        .await
        .unwrap()
        .into_inner();
    let entry = response
        .entries
        .first()
        .and_then(|e| e.status.as_ref())
        .map(|s| s.code);
    assert_eq!(
        entry,
        Some(pb::Code::InternalServerError as i32),
        "per entry (the proxy's default one-by-one mode): {response:?}"
    );
    assert_eq!(
        response.status.map(|s| s.code),
        entry,
        "one distinct code: the top level"
    );
}

/// Receives up to `batch_size` messages of `topic` for `group` without proxy auto-renewal,
/// invisible for `invisible`, from whichever assigned queue has some.
async fn receive_without_renewal(
    session: &Session,
    group: &str,
    topic: &str,
    invisible: Duration,
) -> Vec<rocketmq_grpc::pb::Message> {
    use rocketmq_grpc::pb;
    let config = session.config();
    let mut client = wire::client(session, config.endpoint()).unwrap();
    let assignments = client
        .query_assignment(wire::request(
            session,
            pb::QueryAssignmentRequest {
                topic: Some(wire::resource(session, topic)),
                group: Some(wire::resource(session, group)),
                endpoints: Some(wire::endpoints(config.endpoint())),
            },
            Duration::from_secs(10),
        ))
        .await
        .expect("QueryAssignment")
        .into_inner()
        .assignments;
    for queue in assignments.into_iter().filter_map(|a| a.message_queue) {
        let request = pb::ReceiveMessageRequest {
            group: Some(wire::resource(session, group)),
            message_queue: Some(queue),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 8,
            invisible_duration: Some(invisible.try_into().unwrap()),
            auto_renew: false,
            long_polling_timeout: Some(Duration::from_secs(5).try_into().unwrap()),
            attempt_id: None,
        };
        let mut stream = client
            .receive_message(wire::request(session, request, Duration::from_secs(20)))
            .await
            .expect("ReceiveMessage")
            .into_inner();
        let mut messages = Vec::new();
        while let Some(frame) = stream.message().await.expect("ReceiveMessage stream") {
            if let Some(pb::receive_message_response::Content::Message(message)) = frame.content {
                messages.push(message);
            }
        }
        if !messages.is_empty() {
            return messages;
        }
    }
    Vec::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_receipt_handle_is_invalid_for_that_entry_only() {
    use rocketmq_grpc::{AckEntry, pb, wire::map_ack_response};
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal-2";
    let group = format!("it-expired-{}", std::process::id());
    let config = ClientConfig::new(&endpoint).unwrap();
    let session = Session::new(config.clone()).unwrap();
    // A simple consumer announces its settings on the telemetry stream before it may receive.
    let settings = pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::SimpleConsumer as i32),
            access_point: Some(wire::endpoints(config.endpoint())),
            backoff_policy: None,
            request_timeout: Some(Duration::from_secs(10).try_into().unwrap()),
            pub_sub: Some(pb::settings::PubSub::Subscription(pb::Subscription {
                group: Some(wire::resource(&session, &group)),
                subscriptions: vec![pb::SubscriptionEntry {
                    topic: Some(wire::resource(&session, topic)),
                    expression: Some(pb::FilterExpression {
                        r#type: pb::FilterType::Tag as i32,
                        expression: "*".into(),
                    }),
                }],
                fifo: None,
                receive_batch_size: None,
                long_polling_timeout: None,
                lite_subscription_quota: None,
                max_lite_topic_size: None,
            })),
            user_agent: None,
        })),
    };
    let (outbound, rx) = tokio::sync::mpsc::channel(1);
    outbound.send(settings).await.unwrap();
    let mut telemetry_request =
        tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    wire::stamp(&session, telemetry_request.metadata_mut());
    let mut telemetry = wire::client(&session, config.endpoint())
        .unwrap()
        .telemetry(telemetry_request)
        .await
        .expect("Telemetry")
        .into_inner();
    telemetry.message().await.expect("the settings answer");

    let producer = Producer::builder(config.clone()).build().unwrap();
    for i in 0..2 {
        producer
            .send(OutgoingMessage::new(topic, format!("expiring {i}")))
            .await
            .expect("send");
    }
    // The shortest invisibility the proxy accepts without auto-renewal is 10 s.
    let first = receive_without_renewal(&session, &group, topic, Duration::from_secs(10)).await;
    let expiring = first.first().expect("a message to let expire").clone();
    tokio::time::sleep(Duration::from_secs(12)).await;
    // The expired message is visible again; a new receive hands out fresh handles.
    let second = receive_without_renewal(&session, &group, topic, Duration::from_secs(60)).await;
    let fresh = second
        .first()
        .expect("a message with a fresh handle")
        .clone();
    let entry = |message: &pb::Message| {
        let properties = message.system_properties.as_ref().unwrap();
        AckEntry {
            message_id: properties.message_id.clone(),
            receipt_handle: properties.receipt_handle.clone().unwrap(),
            lite_topic: None,
        }
    };
    let entries = vec![entry(&expiring), entry(&fresh)];
    assert_ne!(entries[0].receipt_handle, entries[1].receipt_handle);
    let response = wire::client(&session, config.endpoint())
        .unwrap()
        .ack_message(wire::request(
            &session,
            pb::AckMessageRequest {
                group: Some(wire::resource(&session, &group)),
                topic: Some(wire::resource(&session, topic)),
                entries: entries
                    .iter()
                    .map(|e| pb::AckMessageEntry {
                        message_id: e.message_id.clone(),
                        receipt_handle: e.receipt_handle.clone(),
                        lite_topic: None,
                    })
                    .collect(),
            },
            Duration::from_secs(10),
        ))
        .await
        .expect("AckMessage")
        .into_inner();
    let codes: Vec<i32> = response
        .entries
        .iter()
        .map(|e| e.status.as_ref().map_or(-1, |s| s.code))
        .collect();
    assert_eq!(
        codes,
        [pb::Code::InvalidReceiptHandle as i32, pb::Code::Ok as i32],
        "{response:?}"
    );
    assert_eq!(
        response.status.as_ref().map(|s| s.code),
        Some(pb::Code::MultipleResults as i32),
        "{response:?}"
    );
    // Our mapping: a terminal error for the expired entry, success for the fresh one.
    let replies = map_ack_response(&entries, response).expect("per-entry results");
    assert!(
        matches!(&replies[0], ack_batcher::ItemReply::Err(e)
            if rocketmq_grpc::is_invalid_receipt_handle(e) && !e.is_retryable()),
        "{replies:?}"
    );
    assert!(
        matches!(replies[1], ack_batcher::ItemReply::Ok(())),
        "{replies:?}"
    );
    drop(outbound);
}

/// A body of exactly the proxy's 4 MiB limit goes out and comes back, and the small messages
/// sent around it are not held up: the consumer's decoding limit leaves room for the
/// message's properties and handle (tonic's default of 4 MiB did not, and every receive that
/// included the message failed, again and again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_4_mib_is_sent_and_received() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal";
    let group = format!("it-large-{}", std::process::id());
    let config = ClientConfig::new(&endpoint).unwrap();
    let recorder = Arc::new(Recorder::default());
    let consumer = PushConsumer::builder(config.clone(), group.as_str())
        .subscribe(topic, "*")
        .acks(AckSettings::default().max_delay(Duration::from_secs(1)))
        .handler(recorder.clone())
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::builder(config).build().unwrap();
    let mut sent = Vec::new();
    for i in 0..3 {
        let body = if i == 1 {
            vec![b'x'; rocketmq_grpc::DEFAULT_MAX_BODY]
        } else {
            format!("small {i}").into_bytes()
        };
        let receipt = producer
            .send(OutgoingMessage::new(topic, body))
            .await
            .expect("the proxy takes a body of exactly 4 MiB");
        sent.push(receipt.message_id().to_owned());
    }
    wait_for(
        "the 4 MiB message and its neighbours",
        Duration::from_secs(60),
        || {
            let seen = recorder.seen.lock();
            sent.iter().all(|id| seen.contains(id))
        },
    )
    .await;
    wait_for("their acks", Duration::from_secs(30), || {
        consumer.stats().acked >= 3
    })
    .await;
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    assert_eq!(count_of(&recorder.seen.lock(), &sent), 3, "each once");
}

/// Takes 30 s over the message whose body is `marker`, recording its id when its handling
/// starts and when it ends.
struct Slow {
    /// The body of the one message handled slowly; others (what earlier runs left on the
    /// topic, which a new group also reads) are handled at once.
    marker: String,
    started: Mutex<Vec<String>>,
    finished: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl MessageHandler for Slow {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        if message.body() != self.marker.as_bytes() {
            return ConsumeResult::Success;
        }
        self.started.lock().push(message.message_id().to_owned());
        tokio::time::sleep(Duration::from_secs(30)).await;
        self.finished.lock().push(message.message_id().to_owned());
        ConsumeResult::Success
    }
}

/// A 30 s handler under the proxy's 20 s invisibility (as `scripts/brokers/rocketmq`
/// configures it): with renewal (the default) the message is handled once and its ack
/// accepted; without (`renewal(Duration::ZERO)`, as the official clients behave) the same
/// message comes again to the same group while the first handler still runs (on 5.3.3; a
/// 5.5.0 proxy renews it itself). Two groups
/// consume the same message side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_invisibility_gets_no_duplicate_with_renewal() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal-2";
    let config = ClientConfig::new(&endpoint).unwrap();
    let marker = unique("slow");
    let start = |renewal: Duration, name: &str| {
        let config = config.clone();
        let group = format!("it-slow-{name}-{}", std::process::id());
        let slow = Arc::new(Slow {
            marker: marker.clone(),
            started: Mutex::default(),
            finished: Mutex::default(),
        });
        async move {
            let consumer = PushConsumer::builder(config, group.as_str())
                .subscribe(topic, "*")
                .renewal(renewal)
                .handler(slow.clone())
                .build()
                .await
                .expect("the consumer starts against the real proxy");
            (consumer, slow)
        }
    };
    let (renewing, renewing_slow) = start(Duration::from_secs(60), "renewing").await;
    let (plain, plain_slow) = start(Duration::ZERO, "plain").await;
    let producer = Producer::builder(config.clone()).build().unwrap();
    let id = producer
        .send(OutgoingMessage::new(topic, marker.clone()))
        .await
        .expect("send")
        .message_id()
        .to_owned();
    let starts = |slow: &Slow| {
        slow.started
            .lock()
            .iter()
            .filter(|seen| **seen == id)
            .count()
    };
    if broker_version().starts_with("5.3") {
        wait_for(
            "the second delivery without renewal",
            Duration::from_secs(90),
            || starts(&plain_slow) >= 2,
        )
        .await;
    } else {
        // A 5.5.0 proxy renews a push consumer's receive itself (its `enableProxyAutoRenew`,
        // which on 5.3.3 left the message to expire, in local and cluster mode alike): the
        // consumer without renewal also handles the message once there.
        wait_for("the end without renewal", Duration::from_secs(90), || {
            !plain_slow.finished.lock().is_empty()
        })
        .await;
        assert_eq!(starts(&plain_slow), 1, "{:?}", plain.stats());
    }
    wait_for("the renewed message's end", Duration::from_secs(60), || {
        !renewing_slow.finished.lock().is_empty()
    })
    .await;
    // Past the end of the first invisibility and of the ack: nothing comes again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stats = renewing.stats();
    assert_eq!(
        starts(&renewing_slow),
        1,
        "handled once with renewal: {stats:?}"
    );
    assert!(stats.renewed >= 1, "{stats:?}");
    assert_eq!(stats.ack_failed, 0, "{stats:?}");
    let report = renewing.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
    plain.close(Duration::from_secs(1)).await;
}

/// Records the bodies it handles and wakes whoever waits for one.
#[derive(Default)]
struct Bodies {
    seen: Mutex<HashSet<String>>,
    arrived: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl MessageHandler for Bodies {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.seen
            .lock()
            .insert(String::from_utf8_lossy(message.body()).into_owned());
        self.arrived.notify_waiters();
        ConsumeResult::Success
    }
}

impl Bodies {
    /// Waits until every one of `bodies` was handled.
    async fn all(&self, bodies: &[&str]) {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if bodies.iter().all(|body| self.seen.lock().contains(*body)) {
                return;
            }
            arrived.await;
        }
    }
}

/// Pairs of messages sent back to back, 1,000 times: the second of a pair comes at once,
/// never after a long poll's 20 s. The broker drops the arrival of a message that comes while
/// a pop is between its scan (nothing found) and its suspension, so that pop waits its whole
/// long-polling time; a consumer with one poll per queue had the second message of 5 of 1,000
/// pairs wait 20 s on 5.3.3 (3 of 2,000 in another run; 1 and 2 of 1,000 in this test). The
/// standby poll beside each queue's loop is woken instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_right_after_another_is_not_held_for_a_long_poll() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    const PAIRS: usize = 1_000;
    // A stalled message waits the consumer's long polling, 20 s; a prompt one a few ms.
    const LATE: Duration = Duration::from_secs(5);
    // A topic of its own: its 2,000 messages would be leftovers for other tests' new groups.
    let topic = "it-pairs";
    let group = unique("it-pairs");
    let config = ClientConfig::new(&endpoint).unwrap();
    let bodies = Arc::new(Bodies::default());
    let consumer = PushConsumer::builder(config.clone(), group.as_str())
        .subscribe(topic, "*")
        .handler(Arc::clone(&bodies))
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    let producer = Producer::builder(config).build().unwrap();
    let run = unique("pair");
    let mut late = Vec::new();
    for i in 0..PAIRS {
        let (first, second) = (format!("{run}-{i}-a"), format!("{run}-{i}-b"));
        for body in [&first, &second] {
            producer
                .send(OutgoingMessage::new(topic, body.clone()))
                .await
                .expect("send");
        }
        let started = tokio::time::Instant::now();
        // The first pair also waits for the new group's first pops.
        let limit = if i == 0 {
            Duration::from_secs(60)
        } else {
            LATE
        };
        if tokio::time::timeout(limit, bodies.all(&[&first, &second]))
            .await
            .is_err()
        {
            // Late: wait it out, so that the next pair starts alone.
            tokio::time::timeout(Duration::from_secs(60), bodies.all(&[&first, &second]))
                .await
                .expect("the pair comes at last");
            late.push((i, started.elapsed()));
        }
    }
    consumer.close(Duration::from_secs(10)).await;
    assert!(
        late.is_empty(),
        "{} of {PAIRS} pairs came late (pair, after): {late:?}",
        late.len()
    );
}
