//! Consumption styles: the consumer as a `Stream`, and batch receive with its limits.

use std::time::Duration;

use futures_util::StreamExt;
use pulsar_wire::{BatchReceive, ConsumerOptions, Error, OutgoingMessage};
use pulsar_wire_emulator::{EmulatorConfig, Faults};
use tokio::time::Instant;

use crate::support::{Setup, assert_quiet, send_all};

/// A `Stream` consumer handing messages to 16 concurrent handlers (`buffer_unordered`) acks
/// everything once: the backlog drains and no ack lands on a deleted entry.
#[tokio::test]
async fn a_stream_with_buffer_unordered_handlers_acks_everything_once() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "stream-unordered";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    send_all(&setup.producer(topic, 10).await, 500).await;
    let handled: Vec<String> = consumer
        .stream()
        .take(500)
        .map(|message| {
            let consumer = &consumer;
            async move {
                let message = message.expect("received");
                // Handlers finish out of order.
                let wait = message.payload().len() as u64 % 7;
                tokio::time::sleep(Duration::from_millis(wait)).await;
                consumer.ack(&message).await.expect("acked");
                String::from_utf8_lossy(message.payload()).into_owned()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut distinct = handled.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((handled.len(), distinct.len()), (500, 500));
    consumer.flush_acks().await;
    setup.assert_drained(topic).await;
    let stats = setup.stats();
    let subscription = stats.subscription(topic, "sub").expect("the subscription");
    assert_eq!(subscription.acks_of_deleted, 0);
    assert_quiet(&consumer, Duration::from_millis(200)).await;
}

/// The stream ends once the consumer is closed.
#[tokio::test]
async fn the_stream_ends_when_the_consumer_closes() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("stream-close", ConsumerOptions::default())
        .await;
    let mut stream = consumer.stream();
    let (next, closed) = tokio::join!(stream.next(), async {
        tokio::task::yield_now().await;
        consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await
    });
    closed.expect("closed");
    assert!(next.is_none(), "{:?}", next.map(|m| m.map(|m| m.id())));
    assert!(stream.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn batch_receive_stops_at_each_limit() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "batch-receive";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    for i in 0..40 {
        producer
            .send(OutgoingMessage::new(vec![b'x'; 100 + i]))
            .await
            .expect("sent");
    }
    let by_count = BatchReceive::default()
        .max_messages(10)
        .timeout(Duration::from_secs(5));
    let batch = consumer.batch_receive(by_count).await.expect("a batch");
    assert_eq!(batch.len(), 10);
    // 110 + 111 + 112 bytes reach 300.
    let by_bytes = BatchReceive::default()
        .max_bytes(300)
        .timeout(Duration::from_secs(5));
    let batch = consumer.batch_receive(by_bytes).await.expect("a batch");
    assert_eq!(batch.len(), 3);
    // The rest, then nothing more comes: the timeout ends the batch.
    let started = Instant::now();
    let by_time = BatchReceive::default()
        .max_messages(1_000)
        .timeout(Duration::from_secs(2));
    let batch = consumer.batch_receive(by_time).await.expect("a batch");
    assert_eq!(batch.len(), 27);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    let empty = consumer.batch_receive(by_time).await.expect("a batch");
    assert!(empty.is_empty());
    // Zero: what is there now, without waiting.
    let started = Instant::now();
    let now = BatchReceive::default().timeout(Duration::ZERO);
    assert!(
        consumer
            .batch_receive(now)
            .await
            .expect("a batch")
            .is_empty()
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    for message in batch {
        consumer.ack(&message).await.expect("acked");
    }
}

#[tokio::test]
async fn batch_receive_refuses_limits_that_allow_nothing() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("batch-receive-bad", ConsumerOptions::default())
        .await;
    for (limits, option) in [
        (BatchReceive::default().max_messages(0), "max_messages"),
        (
            BatchReceive::default().max_messages(usize::MAX),
            "max_messages",
        ),
        (BatchReceive::default().max_bytes(0), "max_bytes"),
    ] {
        let error = consumer.batch_receive(limits).await.expect_err("refused");
        assert!(
            matches!(&error, Error::Invalid { what, .. } if what.ends_with(option)),
            "{error}"
        );
    }
}

/// An undecodable entry met after some messages were gathered: the batch comes first, the
/// error (with the entry's id) with the next call.
#[tokio::test(start_paused = true)]
async fn an_error_after_some_messages_comes_with_the_next_batch() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "batch-receive-error";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    send_all(&producer, 2).await;
    // The two are in the consumer's queue before the broker starts corrupting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    setup.emulator.set_faults(Faults::none().corrupt_rate(1.0));
    send_all(&producer, 1).await;
    let limits = BatchReceive::default()
        .max_messages(3)
        .timeout(Duration::from_secs(5));
    let batch = consumer.batch_receive(limits).await.expect("a batch");
    assert_eq!(batch.len(), 2);
    let error = consumer.batch_receive(limits).await.expect_err("the error");
    assert!(matches!(error, Error::Undecodable { .. }), "{error}");
}

/// A `receive` future stays small (it lives in every task that awaits a message): the rarely
/// taken dead-letter path is boxed, not inlined (inlined, it made the future about 20 KB).
#[tokio::test]
async fn a_receive_future_is_under_2_kb() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("small-future", ConsumerOptions::default())
        .await;
    let receive = consumer.receive();
    let size = std::mem::size_of_val(&receive);
    println!("a receive future: {size} bytes");
    assert!(size < 2048, "a receive future of {size} bytes");
}
