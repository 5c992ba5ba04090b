//! Batch sends with per-message receipts and tag / SQL92 subscription filters, through the
//! crate's `Producer` and `SimpleConsumer`, against the emulator (which answers them as the
//! 5.3.3 proxy does; `tests/tests/rocketmq_differential.rs` compares the two).
//!
//! Virtual time (tokio's clock paused): empty long polls pass at once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rocketmq_grpc::Code;
use rocketmq_grpc::{
    Error, FilterExpression, OutgoingMessage, Producer, ReceivedMessage, SimpleConsumer,
};

use crate::support::{self, GROUP};

async fn consumer(
    emulator: &rocketmq_grpc_emulator::Emulator,
    filter: FilterExpression,
) -> SimpleConsumer {
    SimpleConsumer::builder(support::config(emulator), GROUP)
        .subscribe("orders", filter)
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts")
}

/// Receives until a receive comes back empty.
async fn drain(consumer: &SimpleConsumer) -> Result<Vec<ReceivedMessage>, Error> {
    let mut all = Vec::new();
    loop {
        let got = consumer.receive(32, Duration::from_secs(60)).await?;
        if got.is_empty() {
            return Ok(all);
        }
        all.extend(got);
    }
}

fn producer(emulator: &rocketmq_grpc_emulator::Emulator) -> Producer {
    Producer::builder(support::config(emulator))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_batch_gets_one_receipt_per_message_and_consumers_see_the_first_id() {
    let emulator = support::emulator(&["orders"]).await;
    let producer = producer(&emulator);
    let batch = (0..3)
        .map(|i| {
            OutgoingMessage::new("orders", format!("b{i}"))
                .tag("t")
                .key(format!("k{i}"))
        })
        .collect();
    let receipt = producer.send_batch(batch).await.expect("the batch is sent");
    let receipts = receipt.receipts();
    assert_eq!(receipts.len(), 3);
    let first = receipts[0].message_id();
    assert!(receipts.iter().all(|r| r.message_id() == first));
    assert_ne!(receipt.batch_id(), first);
    let offsets: Vec<i64> = receipts.iter().map(|r| r.offset()).collect();
    assert_eq!(offsets, [offsets[0], offsets[0] + 1, offsets[0] + 2]);
    assert_eq!(producer.send_attempts(), 1, "one request for the batch");

    let consumer = consumer(&emulator, FilterExpression::all()).await;
    let received = drain(&consumer).await.unwrap();
    let bodies: Vec<&[u8]> = received.iter().map(|m| &m.body()[..]).collect();
    assert_eq!(bodies, [b"b0".as_slice(), b"b1", b"b2"]);
    assert!(received.iter().all(|m| m.message_id() == first));
    let keys: Vec<Vec<String>> = received.iter().map(|m| m.keys().to_vec()).collect();
    assert_eq!(keys, [["k0"], ["k1"], ["k2"]]);
    // Same id, own handles: each acknowledges on its own.
    for message in &received {
        consumer.ack(message).await.expect("ack");
    }
    consumer.close(Duration::from_secs(5)).await;
}

/// A cluster-mode proxy names each message of a batch in its answer; the receipts carry those
/// ids. On 5.5.0 consumers see them too; on 5.3.3 (`batch_messages_apart(false)`) the broker
/// still delivers every message with the first's id.
#[tokio::test(start_paused = true)]
async fn a_cluster_mode_proxy_gives_each_message_of_a_batch_its_own_receipt_id() {
    for apart in [true, false] {
        let emulator = rocketmq_grpc_emulator::Emulator::builder()
            .group(GROUP, false)
            .topic("orders", rocketmq_grpc_emulator::TopicKind::Normal, 4)
            .proxy_mode(rocketmq_grpc_emulator::ProxyMode::Cluster)
            .batch_messages_apart(apart)
            .start()
            .await
            .expect("the emulator starts");
        let producer = producer(&emulator);
        let batch = (0..3)
            .map(|i| OutgoingMessage::new("orders", format!("b{i}")).tag("t"))
            .collect();
        let receipt = producer.send_batch(batch).await.expect("the batch is sent");
        let ids: Vec<String> = receipt
            .receipts()
            .iter()
            .map(|r| r.message_id().to_owned())
            .collect();
        assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 3, "{ids:?}");
        assert_eq!(receipt.batch_id(), ids.join(","));

        let consumer = consumer(&emulator, FilterExpression::all()).await;
        let received = drain(&consumer).await.unwrap();
        let seen: Vec<String> = received.iter().map(|m| m.message_id().to_owned()).collect();
        if apart {
            assert_eq!(seen, ids);
        } else {
            assert_eq!(seen, vec![ids[0].clone(); 3]);
        }
        consumer.close(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn batches_the_proxy_would_change_are_refused_before_sending() {
    let emulator = support::emulator(&["orders"]).await;
    let producer = producer(&emulator);
    let refused = |result: Result<_, Error>| match result {
        Err(Error::Invalid { what, reason }) => (what, reason),
        other => panic!("{other:?}"),
    };
    let (setting, _) = refused(producer.send_batch(Vec::new()).await);
    assert_eq!(setting, "messages");
    let (setting, reason) = refused(
        producer
            .send_batch(vec![
                OutgoingMessage::new("orders", "a").tag("x"),
                OutgoingMessage::new("orders", "b").tag("y"),
            ])
            .await,
    );
    assert_eq!(setting, "tag");
    assert!(
        reason.contains("\"x\"") && reason.contains("\"y\""),
        "{reason}"
    );
    let (setting, _) = refused(
        producer
            .send_batch(vec![
                OutgoingMessage::new("orders", "a"),
                OutgoingMessage::new("other", "b"),
            ])
            .await,
    );
    assert_eq!(setting, "topic");
    let too_big = vec![OutgoingMessage::new("orders", vec![7u8; 3 << 20]); 2];
    assert!(matches!(
        producer.send_batch(too_big).await,
        Err(Error::MessageTooLarge { .. })
    ));
    assert_eq!(producer.send_attempts(), 0, "nothing was sent");
}

async fn send_tagged(emulator: &rocketmq_grpc_emulator::Emulator) {
    let producer = producer(emulator);
    for n in 0..12 {
        let message = OutgoingMessage::new("orders", format!("m{n}"))
            .tag(["a", "b", "c"][n / 4])
            .property("n", n.to_string())
            .property("color", ["red", "blue", "green"][n % 3]);
        producer.send(message).await.unwrap();
    }
}

async fn count(emulator: &rocketmq_grpc_emulator::Emulator, filter: FilterExpression) -> usize {
    let consumer = consumer(emulator, filter).await;
    let n = drain(&consumer).await.unwrap().len();
    consumer.close(Duration::from_secs(5)).await;
    n
}

#[tokio::test(start_paused = true)]
async fn tag_and_sql92_filters_deliver_what_the_proxy_delivers() {
    // Counts a real 5.3.3 proxy gave for the same messages and filters.
    for (filter, expected) in [
        (FilterExpression::tag("a"), 4),
        (FilterExpression::from("a || b"), 8),
        (FilterExpression::all(), 12),
        (FilterExpression::sql92("n > 5"), 6),
        (FilterExpression::sql92("color = 'red' AND n < 6"), 2),
        (FilterExpression::sql92("n BETWEEN 2 AND 4"), 3),
        (
            FilterExpression::sql92("color IN ('red', 'green') OR n = 11"),
            8,
        ),
        (FilterExpression::sql92("NOT (color = 'red')"), 8),
        (FilterExpression::sql92("missing IS NULL AND TAGS = 'c'"), 4),
    ] {
        // A new emulator each time: a group passes over what its filter rejects for good.
        let emulator = support::emulator(&["orders"]).await;
        send_tagged(&emulator).await;
        assert_eq!(count(&emulator, filter.clone()).await, expected, "{filter}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unparsable_sql92_filter_fails_the_receive_naming_it() {
    let emulator = support::emulator(&["orders"]).await;
    send_tagged(&emulator).await;
    let consumer = Arc::new(consumer(&emulator, FilterExpression::sql92("n >>> 1")).await);
    let error = consumer
        .receive(32, Duration::from_secs(60))
        .await
        .expect_err("the proxy cannot parse it");
    assert_eq!(error.code(), Some(Code::InternalServerError));
    assert!(!error.is_retryable(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("n >>> 1") && text.contains("orders"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn fifo_messages_carry_their_group_as_sharding_key() {
    let emulator = rocketmq_grpc_emulator::Emulator::builder()
        .topic("fifo", rocketmq_grpc_emulator::TopicKind::Fifo, 2)
        .group(GROUP, false)
        .start()
        .await
        .unwrap();
    producer(&emulator)
        .send(OutgoingMessage::new("fifo", "x").message_group("g1"))
        .await
        .unwrap();
    let consumer = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("fifo", "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let received = drain(&consumer).await.unwrap();
    let keys: BTreeSet<&str> = received[0]
        .properties()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, BTreeSet::from(["__SHARDINGKEY"]));
    assert_eq!(received[0].properties()["__SHARDINGKEY"], "g1");
}
