//! The everyday features a team needs beside the core (issue 28), on the real broker of
//! `scripts/brokers/pulsar` with the official Java client on the other side. Skipped unless
//! `PULSAR_SERVICE_URL` and `PULSAR_ADMIN_URL` are set.
//!
//! Delayed delivery: the test broker runs with `isDelayedDeliveryDeliverAtTimeStrict=true` and
//! a 200 ms tick (`scripts/brokers/pulsar`); with the broker's defaults a message may come up
//! to a tick (1 s) early or late.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use integration_tests::real_pulsar::{RealPulsar, java_peer};
use pulsar_wire::{
    BatchingOptions, Consumer, ConsumerOptions, DeadLetterPolicy, InitialPosition, Message,
    MessageId, ORIGIN_MESSAGE_ID, OutgoingMessage, PatternConsumer, Producer, ProducerOptions,
    REAL_TOPIC, RECONSUME_TIMES, Reader, ReaderOptions, SeekTo, StartAt, SubType,
};

const SUB: &str = "sub";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A consumer of the broker's topic as `name`, from the earliest message.
async fn subscribe(broker: &RealPulsar, name: &str, options: ConsumerOptions) -> Consumer {
    Consumer::builder(&broker.client, &broker.topic, name)
        .options(options.initial_position(InitialPosition::Earliest))
        .build()
        .await
        .expect("subscribed")
}

/// Options of a Shared consumer.
fn shared() -> ConsumerOptions {
    integration_tests::real_pulsar::consumer_options().sub_type(SubType::Shared)
}

/// A producer on the broker's topic.
async fn producer(broker: &RealPulsar, options: ProducerOptions) -> Producer {
    Producer::builder(&broker.client, &broker.topic)
        .options(options)
        .build()
        .await
        .expect("producer")
}

async fn receive(consumer: &Consumer, what: &str) -> Message {
    tokio::time::timeout(Duration::from_secs(30), consumer.receive())
        .await
        .unwrap_or_else(|_| panic!("{what} did not arrive within 30 s"))
        .expect("received")
}

/// How late `message` arrives now, in milliseconds, against its property `due`.
fn lateness(message: &Message) -> i64 {
    let due: i64 = message
        .property("due")
        .and_then(|due| due.parse().ok())
        .expect("a due property");
    now_ms() - due
}

// ----- delayed delivery -----------------------------------------------------------------------

/// `deliverAfter(3 s)` messages of the Java client reach our Shared consumer no earlier than
/// due and within 1 s after, each once, each as its own entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_of_the_java_client_reach_our_shared_consumer_when_due() {
    let Some(broker) = RealPulsar::new("delayed-java", 0).await else {
        return;
    };
    let consumer = subscribe(&broker, SUB, shared()).await;
    let produced = java_peer(
        "PulsarDelayedProduce",
        &[&broker.service_url, &broker.topic, "20", "3000"],
    )
    .await;
    assert!(produced.contains("produced=20"), "{produced}");
    let mut seen = std::collections::HashSet::new();
    let mut latest = i64::MIN;
    while seen.len() < 20 {
        let message = receive(&consumer, "a delayed message").await;
        let late = lateness(&message);
        assert!(late >= 0, "{:?} came {} ms early", message.id(), -late);
        latest = latest.max(late);
        let due: u64 = message
            .property("due")
            .and_then(|d| d.parse().ok())
            .expect("due");
        assert_eq!(
            message.deliver_at(),
            Some(UNIX_EPOCH + Duration::from_millis(due)),
            "the metadata's deliver_at_time"
        );
        assert_eq!(message.id().batch_size(), None, "sent on its own");
        assert!(seen.insert(String::from_utf8_lossy(message.payload()).into_owned()));
        consumer.ack(&message).await.expect("acked");
    }
    assert!(latest <= 1_000, "a message came {latest} ms late");
    println!("delayed-java: 20 messages, latest {latest} ms after due");
}

/// Our `deliver_after(8 s)` messages reach a Java Shared consumer no earlier than due and
/// within 1 s after (the Java consumer subscribes while they wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_delayed_messages_reach_a_java_shared_consumer_when_due() {
    let Some(broker) = RealPulsar::new("delayed-to-java", 0).await else {
        return;
    };
    // The subscription exists before the messages do.
    subscribe(&broker, SUB, shared())
        .await
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let producer = producer(&broker, ProducerOptions::default()).await;
    let consuming = tokio::spawn({
        let (url, topic) = (broker.service_url.clone(), broker.topic.clone());
        async move { java_peer("PulsarDelayedConsume", &[&url, &topic, SUB, "20", "60"]).await }
    });
    for i in 0..20 {
        let due = now_ms() + 8_000;
        let message = OutgoingMessage::new(format!("r{i}"))
            .property("due", due.to_string())
            .deliver_at(UNIX_EPOCH + Duration::from_millis(u64::try_from(due).unwrap_or(0)));
        producer.send(message).await.expect("sent");
    }
    let consumed = consuming.await.expect("the Java consumer");
    println!("delayed-to-java: {consumed}");
    let field = |name: &str| -> i64 {
        consumed
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {consumed}"))
    };
    assert_eq!(
        (field("received"), field("distinct")),
        (20, 20),
        "{consumed}"
    );
    assert_eq!(field("early"), 0, "{consumed}");
    assert!(field("latest_ms") <= 1_000, "{consumed}");
}

/// The broker's rules the emulator follows: an Exclusive subscription gets a delayed message
/// at once, a Shared one when due; messages without a delay from the same batching producer
/// go first; a delayed message is its own entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_delayed_messages_wait_on_shared_and_not_on_exclusive_subscriptions() {
    let Some(broker) = RealPulsar::new("delayed-ours", 0).await else {
        return;
    };
    let shared = subscribe(&broker, "shared", shared()).await;
    let exclusive = subscribe(
        &broker,
        "exclusive",
        integration_tests::real_pulsar::consumer_options(),
    )
    .await;
    let producer = producer(
        &broker,
        ProducerOptions::default().batching(BatchingOptions::default().max_messages(10)),
    )
    .await;
    let due = now_ms() + 3_000;
    let delayed = (0..5).map(|i| {
        producer.send(
            OutgoingMessage::new(format!("d{i}"))
                .property("due", due.to_string())
                .deliver_after(Duration::from_secs(3)),
        )
    });
    let plain =
        (0..5).map(|i| producer.send(OutgoingMessage::new(format!("p{i}")).property("due", "0")));
    let ids = futures_util::future::join_all(delayed.chain(plain)).await;
    for (i, id) in ids.iter().enumerate() {
        let id = id.as_ref().expect("sent");
        if i < 5 {
            assert_eq!(id.batch_size(), None, "a delayed message is its own entry");
        }
    }
    for _ in 0..10 {
        let message = receive(&exclusive, "a message on the Exclusive subscription").await;
        let text = String::from_utf8_lossy(message.payload()).into_owned();
        assert!(
            text.starts_with('p') || lateness(&message) < -1_000,
            "{text} came at once on the Exclusive subscription"
        );
    }
    for i in 0..10 {
        let message = receive(&shared, "a message on the Shared subscription").await;
        let text = String::from_utf8_lossy(message.payload()).into_owned();
        if i < 5 {
            assert!(text.starts_with('p'), "the plain ones first, got {text}");
        } else {
            assert!(text.starts_with('d'), "{text}");
            let late = lateness(&message);
            assert!((0..=1_000).contains(&late), "{text}: {late} ms after due");
        }
        shared.ack(&message).await.expect("acked");
    }
}

/// The broker's delay tracker lives in memory: an unload forgets it, the cursor is read
/// again, and the delayed message still comes once, when due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_survives_an_unload_and_comes_once() {
    let Some(broker) = RealPulsar::new("delayed-unload", 0).await else {
        return;
    };
    let consumer = subscribe(&broker, SUB, shared()).await;
    let producer = producer(&broker, ProducerOptions::default()).await;
    let due = now_ms() + 4_000;
    producer
        .send(
            OutgoingMessage::new("once")
                .property("due", due.to_string())
                .deliver_after(Duration::from_secs(4)),
        )
        .await
        .expect("sent");
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.admin.unload(&broker.topic).await.expect("unloaded");
    let message = receive(&consumer, "the delayed message").await;
    let late = lateness(&message);
    assert!((0..=1_500).contains(&late), "{late} ms after due");
    consumer.ack(&message).await.expect("acked");
    let again = tokio::time::timeout(Duration::from_secs(3), consumer.receive()).await;
    assert!(
        again.is_err(),
        "a second copy: {:?}",
        again.map(|m| m.map(|m| m.id()))
    );
}

// ----- redelivery policies --------------------------------------------------------------------

/// A message nacked four times comes back after 1, 2, 4 and 8 s (±20 %), its redelivery
/// count (the broker's) one higher each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_message_comes_back_after_the_backoff() {
    let Some(broker) = RealPulsar::new("nack-backoff", 0).await else {
        return;
    };
    let backoff =
        pulsar_wire::NackBackoff::exponential(Duration::from_secs(1), Duration::from_secs(8), 2.0);
    let consumer = subscribe(&broker, SUB, shared().nack_backoff(backoff)).await;
    let producer = producer(&broker, ProducerOptions::default()).await;
    producer
        .send(OutgoingMessage::new("again"))
        .await
        .expect("sent");
    let mut message = receive(&consumer, "the message").await;
    let mut waits = Vec::new();
    for (n, expected) in [1u64, 2, 4, 8].into_iter().enumerate() {
        let nacked = std::time::Instant::now();
        consumer.nack(&message).expect("nacked");
        message = receive(&consumer, "the nacked message").await;
        let waited = nacked.elapsed();
        waits.push(waited);
        let expected = Duration::from_secs(expected);
        assert!(
            waited >= expected.mul_f64(0.8) && waited <= expected.mul_f64(1.2),
            "nack {n}: {waited:?}, expected {expected:?}"
        );
        assert_eq!(message.redelivery_count(), n as u32 + 1);
    }
    println!("nack-backoff: waited {waits:?}");
    consumer.ack(&message).await.expect("acked");
}

// ----- topics that grow -----------------------------------------------------------------------

/// A topic grown from 4 to 8 partitions under a running plain producer and consumer (both
/// refreshing every second): written and read on all 8 with no call of the application,
/// nothing lost, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_producer_and_consumer_follow_growth_from_4_to_8_partitions() {
    let Some(broker) = RealPulsar::new("grows", 4).await else {
        return;
    };
    let every = Some(Duration::from_secs(1));
    let consumer = subscribe(&broker, SUB, shared().partitions_refresh(every)).await;
    let producer = producer(
        &broker,
        ProducerOptions::default()
            .no_batching()
            .partitions_refresh(every),
    )
    .await;
    let total = 600;
    let producing = tokio::spawn(async move {
        for i in 0..total {
            producer
                .send(OutgoingMessage::new(format!("m{i}")).key(format!("k{i}")))
                .await
                .expect("sent");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        producer
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    broker
        .admin
        .update_partitions(&broker.topic, 8)
        .await
        .expect("grown to 8");
    let mut received = std::collections::HashSet::new();
    let mut partitions = std::collections::HashSet::new();
    while received.len() < total {
        let message = receive(&consumer, "a message of the growing topic").await;
        partitions.insert(message.id().partition());
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        assert!(received.insert(payload.clone()), "{payload} twice");
        consumer.ack(&message).await.expect("acked");
    }
    let producer = producing.await.expect("the producer");
    assert_eq!(producer.partitions(), 8);
    assert_eq!(consumer.partitions(), 8);
    assert_eq!(partitions.len(), 8, "read from {partitions:?}");
}

/// With an ack timeout of 2 s, a message the application holds without acking comes back
/// after the timeout (to the second's tick), its count one higher (the broker's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_message_comes_back_after_the_ack_timeout() {
    let Some(broker) = RealPulsar::new("ack-timeout", 0).await else {
        return;
    };
    let consumer = subscribe(&broker, SUB, shared().ack_timeout(Duration::from_secs(2))).await;
    let producer = producer(&broker, ProducerOptions::default()).await;
    producer
        .send(OutgoingMessage::new("held"))
        .await
        .expect("sent");
    let first = receive(&consumer, "the message").await;
    let received = std::time::Instant::now();
    let again = receive(&consumer, "the message again").await;
    let waited = received.elapsed();
    assert_eq!(again.id(), first.id());
    assert_eq!(again.redelivery_count(), 1);
    assert!(
        (Duration::from_secs(2)..Duration::from_millis(3_200)).contains(&waited),
        "{waited:?}"
    );
    consumer.ack(&again).await.expect("acked");
    assert_eq!(consumer.stats().ack_timeouts, 1);
}

// ----- reader -------------------------------------------------------------------------------

/// Reads with our reader from `start` until nothing is available: the ids as the Java peer
/// prints them.
async fn read_ids(broker: &RealPulsar, options: ReaderOptions) -> Vec<String> {
    let reader = Reader::builder(&broker.client, &broker.topic, StartAt::Earliest)
        .options(options)
        .build()
        .await
        .expect("a reader");
    let mut ids = Vec::new();
    while reader.has_message_available().await.expect("asked") {
        let message = tokio::time::timeout(Duration::from_secs(10), reader.read_next())
            .await
            .expect("available, so it comes")
            .expect("read");
        let id = message.id();
        ids.push(format!(
            "{}:{}:{}",
            id.ledger_id(),
            id.entry_id(),
            id.batch_index()
        ));
    }
    reader
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    ids
}

/// On one topic written by the Java client (30 messages in batches of 4) and ours (3 more,
/// unbatched), our reader returns the same ids in the same order as the Java reader: from the
/// earliest, and from ids inside a batch, at its start and outside one, inclusive and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_reader_returns_what_the_java_reader_returns() {
    let Some(broker) = RealPulsar::new("reader", 0).await else {
        return;
    };
    let produced = java_peer(
        "PulsarProduce",
        &[&broker.service_url, &broker.topic, "30", "4"],
    )
    .await;
    assert!(produced.contains("produced=30"), "{produced}");
    let ours = producer(&broker, ProducerOptions::default().no_batching()).await;
    for i in 0..3 {
        ours.send(OutgoingMessage::new(format!("r{i}")))
            .await
            .expect("sent");
    }
    let java = |start: String, inclusive: bool| {
        let (url, topic) = (broker.service_url.clone(), broker.topic.clone());
        async move {
            let printed = java_peer(
                "PulsarRead",
                &[&url, &topic, &start, &inclusive.to_string()],
            )
            .await;
            printed
                .lines()
                .filter(|line| !line.starts_with("read="))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    let earliest = read_ids(&broker, ReaderOptions::new(StartAt::Earliest)).await;
    assert_eq!(earliest.len(), 33, "{earliest:?}");
    assert_eq!(java("earliest".into(), false).await, earliest);
    // Our ids of the starts, with their batch sizes.
    let reader = Reader::builder(&broker.client, &broker.topic, StartAt::Earliest)
        .build()
        .await
        .expect("a reader");
    let mut ids = Vec::new();
    for _ in 0..33 {
        ids.push(reader.read_next().await.expect("read").id());
    }
    reader
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    for at in [5, 8, 31] {
        let id = ids[at];
        let start = format!(
            "{}:{}:{}:{}",
            id.ledger_id(),
            id.entry_id(),
            id.batch_index(),
            id.batch_size().unwrap_or(0)
        );
        for inclusive in [false, true] {
            let options = ReaderOptions::new(StartAt::Id(id)).inclusive(inclusive);
            let ours = read_ids(&broker, options).await;
            let expected = &earliest[if inclusive { at } else { at + 1 }..];
            assert_eq!(ours, expected, "from {start}, inclusive {inclusive}");
            assert_eq!(
                java(start.clone(), inclusive).await,
                ours,
                "the Java reader from {start}, inclusive {inclusive}"
            );
        }
    }
}

// ----- seek ------------------------------------------------------------------------------------

/// An id as the seek peer prints it: PARTITION:LEDGER:ENTRY:BATCH_INDEX.
fn shown(id: &MessageId) -> String {
    format!(
        "{}:{}:{}:{}",
        id.partition(),
        id.ledger_id(),
        id.entry_id(),
        id.batch_index()
    )
}

/// Our Exclusive consumer as `name` receives and acknowledges `total` messages, seeks to
/// `to` (or to the id of `nth`'s message), then returns what comes until nothing does for
/// 2 s, with the ids of what it received first.
async fn seek_ids(
    broker: &RealPulsar,
    name: &str,
    total: usize,
    to: impl FnOnce(&[MessageId]) -> SeekTo,
) -> (Vec<MessageId>, Vec<String>) {
    let consumer = subscribe(
        broker,
        name,
        integration_tests::real_pulsar::consumer_options(),
    )
    .await;
    let mut first = Vec::new();
    for i in 0..total {
        let message = receive(&consumer, &format!("message {i}")).await;
        consumer.ack(&message).await.expect("acked");
        first.push(message.id());
    }
    consumer.seek(to(&first)).await.expect("sought");
    let mut after = Vec::new();
    while let Ok(message) = tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await {
        let message = message.expect("received");
        consumer.ack(&message).await.expect("acked");
        after.push(shown(&message.id()));
    }
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    (first, after)
}

/// The Java client's seek (`PulsarSeek`) as `name`: the ids after it.
async fn java_seek_ids(broker: &RealPulsar, name: &str, total: usize, target: &str) -> Vec<String> {
    let printed = java_peer(
        "PulsarSeek",
        &[
            &broker.service_url,
            &broker.topic,
            name,
            &total.to_string(),
            target,
        ],
    )
    .await;
    assert!(printed.contains("after="), "{printed}");
    printed
        .lines()
        .filter(|line| !line.starts_with("after="))
        .map(str::to_owned)
        .collect()
}

/// Per partition, in order (the interleaving of partitions is the broker's).
fn by_partition(mut ids: Vec<String>) -> Vec<String> {
    ids.sort_by_key(|id| {
        let parts: Vec<i64> = id.split(':').map(|p| p.parse().unwrap_or(-1)).collect();
        parts
    });
    ids
}

/// On one topic written by the Java client (30 messages in batches of 4) and ours (3 more,
/// unbatched), our seek returns the same ids in the same order as the Java client's seek on
/// subscriptions of their own: to ids inside a batch, at a batch's start, at its end and
/// outside one, to a publish time, to the earliest and to the latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_seek_returns_what_the_java_seek_returns() {
    let Some(broker) = RealPulsar::new("seek", 0).await else {
        return;
    };
    let produced = java_peer(
        "PulsarProduce",
        &[&broker.service_url, &broker.topic, "30", "4"],
    )
    .await;
    assert!(produced.contains("produced=30"), "{produced}");
    let ours = producer(&broker, ProducerOptions::default().no_batching()).await;
    for i in 0..3 {
        ours.send(OutgoingMessage::new(format!("s{i}")))
            .await
            .expect("sent");
    }
    let (ids, after_earliest) = seek_ids(&broker, "ours-earliest", 33, |_| SeekTo::Earliest).await;
    assert_eq!(after_earliest.len(), 33);
    assert_eq!(
        java_seek_ids(&broker, "java-earliest", 33, "earliest").await,
        after_earliest
    );
    for at in [5, 8, 11, 31] {
        let (_, after) = seek_ids(&broker, &format!("ours-{at}"), 33, |ids| {
            SeekTo::After(ids[at])
        })
        .await;
        let expected: Vec<String> = ids[at + 1..].iter().map(shown).collect();
        assert_eq!(after, expected, "after {}", shown(&ids[at]));
        let target = format!("id:{}", shown(&ids[at]));
        assert_eq!(
            java_seek_ids(&broker, &format!("java-{at}"), 33, &target).await,
            after,
            "the Java seek to {target}"
        );
    }
    // A publish time: that of message 13 (its batch's time).
    let consumer = subscribe(
        &broker,
        "times",
        integration_tests::real_pulsar::consumer_options(),
    )
    .await;
    let mut times = Vec::new();
    for i in 0..33 {
        times.push(
            receive(&consumer, &format!("message {i}"))
                .await
                .publish_time(),
        );
    }
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let time = times[13];
    let (_, after_time) = seek_ids(&broker, "ours-time", 33, |_| SeekTo::Time(time)).await;
    let expected: Vec<String> = ids
        .iter()
        .zip(&times)
        .filter(|(_, t)| **t >= time)
        .map(|(id, _)| shown(id))
        .collect();
    assert_eq!(after_time, expected);
    assert_eq!(
        java_seek_ids(
            &broker,
            "java-time",
            33,
            &format!("time:{}", epoch_millis(time))
        )
        .await,
        after_time
    );
    let (_, after_latest) = seek_ids(&broker, "ours-latest", 33, |_| SeekTo::Latest).await;
    assert!(after_latest.is_empty(), "{after_latest:?}");
    assert!(
        java_seek_ids(&broker, "java-latest", 33, "latest")
            .await
            .is_empty()
    );
}

/// On a partitioned topic (3 partitions, written by the Java client in batches, which its
/// router keeps on one partition, and by ours unbatched, round robin): a seek to an id moves
/// its partition only, a seek to the earliest all of them, as the Java client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_seek_on_a_partitioned_topic_matches_the_java_seek() {
    let Some(broker) = RealPulsar::new("seek-parted", 3).await else {
        return;
    };
    let produced = java_peer(
        "PulsarProduce",
        &[&broker.service_url, &broker.topic, "30", "4"],
    )
    .await;
    assert!(produced.contains("produced=30"), "{produced}");
    let ours = producer(&broker, ProducerOptions::default().no_batching()).await;
    for i in 0..9 {
        ours.send(OutgoingMessage::new(format!("s{i}")))
            .await
            .expect("sent");
    }
    let (ids, after_earliest) = seek_ids(&broker, "ours-earliest", 39, |_| SeekTo::Earliest).await;
    assert_eq!(after_earliest.len(), 39);
    assert!(
        (0..3).all(|p| ids.iter().any(|id| id.partition() == p)),
        "{ids:?}"
    );
    assert_eq!(
        by_partition(java_seek_ids(&broker, "java-earliest", 39, "earliest").await),
        by_partition(after_earliest)
    );
    let busiest = (0..3)
        .max_by_key(|p| ids.iter().filter(|id| id.partition() == *p).count())
        .unwrap_or(0);
    let mut on_one: Vec<MessageId> = ids
        .iter()
        .copied()
        .filter(|id| id.partition() == busiest)
        .collect();
    on_one.sort_by_key(|id| (id.ledger_id(), id.entry_id(), id.batch_index()));
    let target = on_one[on_one.len() / 2];
    let (_, after) = seek_ids(&broker, "ours-id", 39, |_| SeekTo::After(target)).await;
    assert_eq!(
        after,
        on_one[on_one.len() / 2 + 1..]
            .iter()
            .map(shown)
            .collect::<Vec<_>>(),
        "after {}",
        shown(&target)
    );
    assert_eq!(
        java_seek_ids(&broker, "java-id", 39, &format!("id:{}", shown(&target))).await,
        after
    );
    // A publish time moves every partition: that of the busiest partition's middle message.
    let consumer = subscribe(
        &broker,
        "times",
        integration_tests::real_pulsar::consumer_options(),
    )
    .await;
    let mut times = Vec::new();
    for i in 0..39 {
        let message = receive(&consumer, &format!("message {i}")).await;
        times.push((message.id(), message.publish_time()));
    }
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let time = times
        .iter()
        .find(|(id, _)| *id == target)
        .map(|(_, time)| *time)
        .expect("the target's time");
    let (_, after_time) = seek_ids(&broker, "ours-time", 39, |_| SeekTo::Time(time)).await;
    let expected: Vec<String> = times
        .iter()
        .filter(|(_, t)| *t >= time)
        .map(|(id, _)| shown(id))
        .collect();
    assert_eq!(by_partition(after_time.clone()), by_partition(expected));
    assert_eq!(
        by_partition(
            java_seek_ids(
                &broker,
                "java-time",
                39,
                &format!("time:{}", epoch_millis(time))
            )
            .await
        ),
        by_partition(after_time)
    );
}

/// On a partitioned topic (3 partitions, written by the Java client and ours), our reader
/// from the earliest returns the same ids as the Java reader, in the same order per partition
/// (how partitions interleave is the broker's); from the latest, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_reader_on_a_partitioned_topic_matches_the_java_reader() {
    let Some(broker) = RealPulsar::new("reader-parted", 3).await else {
        return;
    };
    let produced = java_peer(
        "PulsarProduce",
        &[&broker.service_url, &broker.topic, "30", "4"],
    )
    .await;
    assert!(produced.contains("produced=30"), "{produced}");
    let ours = producer(&broker, ProducerOptions::default().no_batching()).await;
    for i in 0..9 {
        ours.send(OutgoingMessage::new(format!("r{i}")))
            .await
            .expect("sent");
    }
    let earliest = read_ids(&broker, ReaderOptions::new(StartAt::Earliest)).await;
    assert_eq!(earliest.len(), 39, "{earliest:?}");
    let printed = java_peer(
        "PulsarRead",
        &[&broker.service_url, &broker.topic, "earliest", "false"],
    )
    .await;
    let java: Vec<String> = printed
        .lines()
        .filter(|line| !line.starts_with("read="))
        .map(str::to_owned)
        .collect();
    // Ledger ids differ between partitions: ordering by (ledger, entry, index) keeps each
    // partition's order and puts the partitions one after another.
    assert_eq!(by_partition(java), by_partition(earliest));
    let latest = read_ids(&broker, ReaderOptions::new(StartAt::Latest)).await;
    assert!(latest.is_empty(), "{latest:?}");
}

// ----- retry letters ---------------------------------------------------------------------------

/// A Shared consumer of ours with retry enabled and a maximum of 3 reconsumes.
async fn retrying(broker: &RealPulsar) -> Consumer {
    subscribe(
        broker,
        SUB,
        shared()
            .enable_retry(true)
            .dead_letter(DeadLetterPolicy::new(3)),
    )
    .await
}

/// `reconsume_later` goes through the retry topic with the Java client's properties: ours
/// reconsumes, a Java consumer with `enableRetry` on the same subscription reads it there
/// (RECONSUMETIMES=1 and the rest) and reconsumes it, ours reads that (2), reconsumes it after
/// 1 s and gets it no earlier (3), and the next reconsume, past the maximum of 3, lands it in
/// the dead-letter topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconsumed_messages_go_through_the_retry_topic_to_the_dead_letter_topic() {
    let Some(broker) = RealPulsar::new("retry", 0).await else {
        return;
    };
    let id = producer(&broker, ProducerOptions::default())
        .await
        .send(
            OutgoingMessage::new("later")
                .key("k")
                .property("app", "yes"),
        )
        .await
        .expect("sent");
    let retry_topic = format!("{}-{SUB}-RETRY", broker.topic);
    // As the Java client prints an id: with its batch index when it is in a batch.
    let origin = match id.batch_size() {
        Some(_) => format!(
            "{}:{}:-1:{}",
            id.ledger_id(),
            id.entry_id(),
            id.batch_index()
        ),
        None => format!("{}:{}:-1", id.ledger_id(), id.entry_id()),
    };
    let consumer = retrying(&broker).await;
    let message = receive(&consumer, "the message").await;
    consumer
        .reconsume_later(&message, Duration::from_secs(1))
        .await
        .expect("reconsumed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let printed = java_peer(
        "PulsarRetry",
        &[
            &broker.service_url,
            &broker.topic,
            SUB,
            "3",
            "1",
            "reconsume",
            "1000",
        ],
    )
    .await;
    let line = printed
        .lines()
        .find(|line| line.starts_with(&retry_topic))
        .unwrap_or_else(|| panic!("the Java consumer read nothing from {retry_topic}: {printed}"));
    for property in [
        "later".to_owned(),
        "RECONSUMETIMES=1".to_owned(),
        "DELAY_TIME=1000".to_owned(),
        format!("REAL_TOPIC={}", broker.topic),
        format!("ORIGIN_MESSAGE_ID={origin}"),
        format!("REAL_SUBSCRIPTION={SUB}"),
        "app=yes".to_owned(),
    ] {
        assert!(
            line.split(' ').any(|part| part == property),
            "{property} in {line}"
        );
    }
    let consumer = retrying(&broker).await;
    let mut message = receive(&consumer, "the Java client's retry letter").await;
    if message.property(RECONSUME_TIMES) == Some("1") {
        // Our first letter again, although the Java client acknowledged it before it closed:
        // seen once in about 100 local runs and once in CI (0289860, 2026-12-05); before it
        // the test failed on this copy. One such copy is accepted, no more: the next
        // delivery must be the Java client's letter. The broker then holds our letter and
        // the Java client's, 2 messages in: its ack did not take effect (a Java client or
        // broker matter), and this client did not write a letter twice, which would make 3.
        // The redelivered copy is acknowledged, and the Java client's letter comes next.
        let stats = broker
            .admin
            .topic_stats(&retry_topic)
            .await
            .expect("the retry topic's stats");
        assert_eq!(
            stats.msg_in_counter, 2,
            "our letter came again, and the retry topic has {} messages in (2: ours and the \
             Java client's); the Java client printed {printed}; stats: {}",
            stats.msg_in_counter, stats.json
        );
        eprintln!(
            "the broker delivered our first letter again after the Java client acknowledged \
             it (2 messages in: not written twice); acknowledging it"
        );
        consumer.ack(&message).await.expect("acknowledged");
        message = receive(&consumer, "the Java client's retry letter").await;
    }
    assert_eq!(message.topic(), retry_topic);
    assert_eq!(message.property(RECONSUME_TIMES), Some("2"));
    assert_eq!(message.property(REAL_TOPIC), Some(broker.topic.as_str()));
    assert_eq!(message.property(ORIGIN_MESSAGE_ID), Some(origin.as_str()));
    assert_eq!(message.key(), Some("k"));
    let asked = std::time::Instant::now();
    consumer
        .reconsume_later(&message, Duration::from_secs(1))
        .await
        .expect("reconsumed");
    let message = receive(&consumer, "our retry letter").await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(3),
        "came after {waited:?}"
    );
    assert_eq!(message.property(RECONSUME_TIMES), Some("3"));
    consumer
        .reconsume_later(&message, Duration::from_secs(1))
        .await
        .expect("dead-lettered");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let dlq = Consumer::builder(
        &broker.client,
        format!("{}-{SUB}-DLQ", broker.topic),
        "reader",
    )
    .options(
        integration_tests::real_pulsar::consumer_options()
            .initial_position(InitialPosition::Earliest),
    )
    .build()
    .await
    .expect("subscribed to the dead-letter topic");
    let letter = receive(&dlq, "the dead letter").await;
    assert_eq!(letter.payload().as_ref(), b"later");
    assert_eq!(letter.property(RECONSUME_TIMES), Some("4"));
    assert_eq!(letter.property(REAL_TOPIC), Some(broker.topic.as_str()));
    assert_eq!(letter.property(ORIGIN_MESSAGE_ID), Some(origin.as_str()));
}

// ----- pattern subscriptions -------------------------------------------------------------------

/// A pattern consumer (discovery every 1 s) reads the matching topic that exists, and a
/// topic created after it subscribed (partitioned, written by the Java client) within the
/// discovery interval and a little; nothing of a topic that does not match; nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_consumer_finds_a_topic_created_after_it_subscribed() {
    let Some(broker) = RealPulsar::new("pattern", 0).await else {
        return;
    };
    let first = format!("{}-first", broker.topic);
    broker.admin.create_topic(&first).await.expect("created");
    let producer = Producer::builder(&broker.client, &first)
        .build()
        .await
        .expect("producer");
    for i in 0..5 {
        producer
            .send(OutgoingMessage::new(format!("first-{i}")))
            .await
            .expect("sent");
    }
    // The broker's own topic does not match (the pattern wants a suffix).
    ours_send(&broker, "unmatched").await;
    let consumer = PatternConsumer::builder(&broker.client, format!("{}-.*", broker.topic), SUB)
        .consumer(shared().initial_position(InitialPosition::Earliest))
        .discovery_interval(Some(Duration::from_secs(1)))
        .build()
        .await
        .expect("subscribed");
    assert_eq!(consumer.topics(), std::slice::from_ref(&first));
    let mut got = Vec::new();
    for _ in 0..5 {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("in time")
            .expect("received");
        consumer.ack(&message).await.expect("acked");
        got.push(String::from_utf8_lossy(message.payload()).into_owned());
    }
    let later = format!("{}-later", broker.topic);
    broker
        .admin
        .create_partitioned_topic(&later, 2)
        .await
        .expect("created");
    let created = std::time::Instant::now();
    // Subscribed by the next discovery: within the 1 s interval, and the listing's time.
    while !consumer.topics().contains(&later) {
        assert!(
            created.elapsed() < Duration::from_secs(3),
            "not subscribed {:?} after its creation",
            created.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let found = created.elapsed();
    assert!(
        found <= Duration::from_millis(2_000),
        "found after {found:?}"
    );
    let produced = java_peer("PulsarProduce", &[&broker.service_url, &later, "20", "4"]).await;
    assert!(produced.contains("produced=20"), "{produced}");
    let mut from_later = 0;
    while from_later < 20 {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("the later topic's messages in time")
            .expect("received");
        assert!(message.topic().starts_with(&later), "{}", message.topic());
        consumer.ack(&message).await.expect("acked");
        from_later += 1;
    }
    assert!(consumer.topics().contains(&later));
    assert!(
        tokio::time::timeout(Duration::from_secs(2), consumer.receive())
            .await
            .is_err(),
        "nothing more (the unmatched topic's message stays there)"
    );
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    got.sort();
    assert_eq!(
        got,
        (0..5).map(|i| format!("first-{i}")).collect::<Vec<_>>()
    );
}

/// Sends one message to the broker's own topic.
async fn ours_send(broker: &RealPulsar, payload: &str) {
    producer(broker, ProducerOptions::default())
        .await
        .send(OutgoingMessage::new(payload.to_owned()))
        .await
        .expect("sent");
}

/// `time` in milliseconds since the epoch, as the Java peer's `time:` argument takes it.
fn epoch_millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .expect("a publish time after the epoch")
        .as_millis()
}
