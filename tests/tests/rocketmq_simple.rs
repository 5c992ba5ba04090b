//! The RocketMQ [`SimpleConsumer`] against a real proxy (`scripts/brokers/rocketmq start`), and
//! against the official Java client's simple consumer (`scripts/java-peers`,
//! `RocketMqSimpleConsume`).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set (the script prints it); otherwise every test returns at
//! once. Each test uses a group of its own, so a topic's older messages reach a new group too
//! (the broker starts a new group at the first message still in memory): the tests count only
//! the messages they sent.

use integration_tests::real_rocketmq::{endpoint, unique};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::real_pulsar::java_peer;
use rocketmq_grpc::{
    ClientConfig, Error, OutgoingMessage, Producer, SimpleConsumer, is_invalid_receipt_handle, pb,
    wire,
};

/// A consumer of a new group that has made its first receive (which sets the group's starting
/// offsets), with whatever that receive got acknowledged.
async fn started(endpoint: &str, topic: &str, group: &str) -> SimpleConsumer {
    let consumer = SimpleConsumer::builder(ClientConfig::new(endpoint).unwrap(), group)
        .subscribe(topic, "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts against the real proxy");
    // A new group starts at the topic's first message still in memory: take (and ack) what
    // is there until a receive comes back empty.
    let consumer = Arc::new(consumer);
    let mut acks = tokio::task::JoinSet::new();
    loop {
        let messages = consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("a receive of the backlog");
        if messages.is_empty() {
            break;
        }
        for message in messages {
            let consumer = Arc::clone(&consumer);
            acks.spawn(async move { consumer.ack(&message).await });
        }
    }
    while let Some(done) = acks.join_next().await {
        done.unwrap().expect("ack of the backlog");
    }
    Arc::into_inner(consumer).expect("no other owner")
}

async fn send(
    endpoint: &str,
    topic: &str,
    bodies: impl Iterator<Item = String>,
) -> HashSet<String> {
    let producer = Arc::new(
        Producer::builder(ClientConfig::new(endpoint).unwrap())
            .build()
            .unwrap(),
    );
    let mut sends = tokio::task::JoinSet::new();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(64));
    for body in bodies {
        let producer = Arc::clone(&producer);
        let permit = Arc::clone(&semaphore).acquire_owned().await.unwrap();
        let topic = topic.to_owned();
        sends.spawn(async move {
            let receipt = producer
                .send(OutgoingMessage::new(topic, body))
                .await
                .expect("send");
            drop(permit);
            receipt.message_id().to_owned()
        });
    }
    let mut ids = HashSet::new();
    while let Some(id) = sends.join_next().await {
        ids.insert(id.unwrap());
    }
    ids
}

/// Receives and acknowledges (concurrently) until every id of `sent` was received; returns how
/// many of ours came more than once.
async fn receive_all(
    consumer: &Arc<SimpleConsumer>,
    sent: &HashSet<String>,
    limit: Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    let mut acks = tokio::task::JoinSet::new();
    while seen.len() < sent.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "received {} of {} in {limit:?}",
            seen.len(),
            sent.len()
        );
        let messages = consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("receive");
        for message in messages {
            if sent.contains(message.message_id()) && !seen.insert(message.message_id().to_owned())
            {
                duplicates += 1;
            }
            let consumer = Arc::clone(consumer);
            acks.spawn(async move { consumer.ack(&message).await });
        }
        while let Some(done) = acks.try_join_next() {
            done.unwrap().expect("every ack succeeds");
        }
    }
    while let Some(done) = acks.join_next().await {
        done.unwrap().expect("every ack succeeds");
    }
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_are_acked_in_at_most_12_requests() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-simple";
    let group = unique("it-simple-10k");
    let consumer = Arc::new(started(&endpoint, topic, &group).await);
    let before = consumer.stats().acks.total_batches();
    let sent = send(&endpoint, topic, (0..10_000).map(|i| format!("simple {i}"))).await;
    assert_eq!(sent.len(), 10_000);
    let duplicates = receive_all(&consumer, &sent, Duration::from_secs(300)).await;
    assert_eq!(duplicates, 0);
    let stats = consumer.stats();
    let requests = stats.acks.total_batches() - before;
    eprintln!("10,000 messages acked in {requests} AckMessage requests: {stats:?}");
    assert!(requests <= 12, "{requests} AckMessage requests: {stats:?}");
    assert_eq!(stats.ack_failed, 0, "{stats:?}");
    // Nothing comes back once the invisibility (60 s) of the last messages has passed.
    tokio::time::sleep(Duration::from_secs(62)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let again = consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("receive");
        let ours: Vec<_> = again
            .iter()
            .filter(|m| sent.contains(m.message_id()))
            .map(|m| m.message_id())
            .collect();
        assert!(ours.is_empty(), "delivered again: {ours:?}");
        for message in &again {
            let _ = consumer.ack(message).await;
        }
    }
    let report = consumer.close(Duration::from_secs(10)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_handle_fails_only_its_own_ack_among_concurrent_acks() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-simple";
    let group = unique("it-simple-expired");
    let consumer = Arc::new(started(&endpoint, topic, &group).await);
    let sent = send(&endpoint, topic, (0..2).map(|i| format!("expiring {i}"))).await;
    // The shortest invisibility the proxy accepts is 10 s.
    let mut expiring = None;
    while expiring.is_none() {
        for message in consumer.receive(1, Duration::from_secs(10)).await.unwrap() {
            if sent.contains(message.message_id()) {
                expiring = Some(message);
            } else {
                consumer.ack(&message).await.unwrap();
            }
        }
    }
    let expiring = expiring.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    // The expired message is visible again, and the other one: fresh handles, 60 s.
    let mut fresh = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while fresh.len() < 2 && tokio::time::Instant::now() < deadline {
        for message in consumer.receive(32, Duration::from_secs(60)).await.unwrap() {
            if sent.contains(message.message_id()) {
                fresh.push(message);
            }
        }
    }
    let fresh = fresh
        .into_iter()
        .find(|m| m.message_id() != expiring.message_id())
        .expect("the other message, with a fresh handle");
    // Both at once: each gets its own result.
    let (old, new) = tokio::join!(consumer.ack(&expiring), consumer.ack(&fresh));
    assert!(
        matches!(&old, Err(e) if is_invalid_receipt_handle(e) && !e.is_retryable()),
        "{old:?}"
    );
    assert!(new.is_ok(), "{new:?}");
    // The client knows the first handle's deadline passed, so that ack goes out at once as a
    // batch of its own (a mixed batch's per-entry answer is shown by rocketmq_real.rs's
    // an_expired_receipt_handle_is_invalid_for_that_entry_only); the other ack is unharmed.
    let stats = consumer.stats();
    assert_eq!(stats.ack_failed, 1, "{stats:?}");
    consumer.close(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_invisible_duration_gives_a_handle_that_later_acks_use() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-simple";
    let group = unique("it-simple-change");
    let consumer = Arc::new(started(&endpoint, topic, &group).await);
    let sent = send(&endpoint, topic, std::iter::once("changed".to_owned())).await;
    let mut ours = None;
    while ours.is_none() {
        for message in consumer.receive(32, Duration::from_secs(10)).await.unwrap() {
            if sent.contains(message.message_id()) {
                ours = Some(message);
            } else {
                consumer.ack(&message).await.unwrap();
            }
        }
    }
    let first = ours.unwrap();
    let changed = consumer
        .change_invisible_duration(&first, Duration::from_secs(30))
        .await
        .expect("ChangeInvisibleDuration");
    // The first copy's handle is superseded; the ack of that copy uses the new handle.
    consumer
        .ack(&first)
        .await
        .expect("acked with the new handle");
    assert_eq!(consumer.stats().invisible_changed, 1);
    drop(changed);
    let closed = consumer.close(Duration::from_secs(5)).await;
    assert!(closed.unacknowledged.is_empty(), "{closed:?}");
    assert!(matches!(
        consumer.receive(1, Duration::from_secs(30)).await,
        Err(Error::Closed("the simple consumer"))
    ));
}

/// What the proxy does with a receive of more than 32 messages or of none, with 100 messages
/// waiting: the consumer refuses both itself (`MAX_RECEIVE_MESSAGES`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_at_most_32_messages_per_receive() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-simple";
    let group = unique("it-simple-limits");
    let consumer = started(&endpoint, topic, &group).await;
    let session = rocketmq_grpc::Session::new(ClientConfig::new(&endpoint).unwrap()).unwrap();
    // A simple consumer's settings on this session's telemetry stream (the proxy refuses
    // receives of a client it has not seen there).
    let settings = pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::SimpleConsumer as i32),
            access_point: Some(wire::endpoints(session.config().endpoint())),
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
    let mut telemetry = wire::client(&session, session.config().endpoint())
        .unwrap()
        .telemetry(telemetry_request)
        .await
        .expect("Telemetry")
        .into_inner();
    telemetry.message().await.expect("the settings answer");
    let mut client = wire::client(&session, session.config().endpoint()).unwrap();
    let route = client
        .query_route(wire::request(
            &session,
            pb::QueryRouteRequest {
                topic: Some(wire::resource(&session, topic)),
                endpoints: Some(wire::endpoints(session.config().endpoint())),
            },
            Duration::from_secs(10),
        ))
        .await
        .unwrap()
        .into_inner();
    send(&endpoint, topic, (0..100).map(|i| format!("limits {i}"))).await;
    let mut codes = Vec::new();
    let mut counts = Vec::new();
    for batch_size in [64, 0] {
        let request = pb::ReceiveMessageRequest {
            group: Some(wire::resource(&session, &group)),
            message_queue: route.message_queues.first().cloned(),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size,
            invisible_duration: Some(Duration::from_secs(30).try_into().unwrap()),
            auto_renew: false,
            long_polling_timeout: Some(Duration::from_secs(5).try_into().unwrap()),
            attempt_id: None,
        };
        let mut stream = client
            .receive_message(wire::request(&session, request, Duration::from_secs(20)))
            .await
            .unwrap()
            .into_inner();
        let mut count = 0;
        while let Some(frame) = stream.message().await.unwrap() {
            match frame.content {
                Some(pb::receive_message_response::Content::Status(status)) => {
                    codes.push((batch_size, status.code, status.message));
                }
                Some(pb::receive_message_response::Content::Message(_)) => count += 1,
                _ => {}
            }
        }
        counts.push((batch_size, count));
    }
    drop(outbound);
    eprintln!("receive answers by batch size: {codes:?}, messages: {counts:?}");
    assert!(
        counts.iter().all(|(_, count)| *count <= 32),
        "{counts:?} {codes:?}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_simple_consumer_consumes_what_we_send_and_we_consume_what_java_sends() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-simple-2";
    // Java consumes ours: its group's offsets are set by a first receive of ours.
    let java_group = unique("it-simple-java");
    started(&endpoint, topic, &java_group)
        .await
        .close(Duration::from_secs(5))
        .await;
    let prefix = unique("from-rust");
    send(&endpoint, topic, (0..200).map(|i| format!("{prefix} {i}"))).await;
    let out = java_peer(
        "RocketMqSimpleConsume",
        &[&endpoint, topic, &java_group, &prefix, "200", "180"],
    )
    .await;
    assert!(out.contains("consumed=200"), "{out}");

    // We consume what Java sends.
    let group = unique("it-simple-from-java");
    let consumer = Arc::new(started(&endpoint, topic, &group).await);
    let out = java_peer("E2eRocketMqProduce", &[&endpoint, topic, "300", "64", "16"]).await;
    eprintln!("{out}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut from_java = 0;
    let mut acks = tokio::task::JoinSet::new();
    while from_java < 300 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{from_java} of Java's 300"
        );
        for message in consumer.receive(32, Duration::from_secs(60)).await.unwrap() {
            if message.body().len() == 64 && message.body().iter().all(|b| *b == b'x') {
                from_java += 1;
            }
            let consumer = Arc::clone(&consumer);
            acks.spawn(async move { consumer.ack(&message).await });
        }
    }
    while let Some(done) = acks.join_next().await {
        done.unwrap().expect("ack");
    }
    assert!(consumer.stats().acks.total_batches() < 300);
    consumer.close(Duration::from_secs(10)).await;
}
