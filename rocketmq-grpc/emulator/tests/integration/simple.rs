//! The simple consumer against the emulator: receive on request, acks batched per (endpoint,
//! topic) with each caller's own result, a changed invisible duration whose new handle later
//! acks use, bad arguments refused with their name, and `close`.
//!
//! Virtual time (tokio's clock paused): waits pass at once, and the emulator's deadlines
//! follow the same clock.

use std::sync::Arc;
use std::time::Duration;

use rocketmq_grpc::Code;
use rocketmq_grpc::{AckSettings, Error, ReceivedMessage, SimpleConsumer};

use crate::support::{self, GROUP};

async fn consumer(emulator: &rocketmq_grpc_emulator::Emulator) -> Arc<SimpleConsumer> {
    Arc::new(
        SimpleConsumer::builder(support::config(emulator), GROUP)
            .subscribe("orders", "*")
            .await_duration(Duration::from_secs(5))
            .build()
            .await
            .expect("the simple consumer starts"),
    )
}

/// Receives until `n` messages came (each receive up to 32).
async fn receive(consumer: &SimpleConsumer, n: usize) -> Vec<ReceivedMessage> {
    let mut all = Vec::new();
    while all.len() < n {
        all.extend(
            consumer
                .receive(32, Duration::from_secs(60))
                .await
                .expect("receive"),
        );
    }
    all
}

#[tokio::test(start_paused = true)]
async fn acks_of_many_callers_share_requests_and_each_gets_its_result() {
    let emulator = support::emulator(&["orders"]).await;
    let sent = support::publish(&emulator, "orders", 100);
    let consumer = consumer(&emulator).await;
    let messages = receive(&consumer, 100).await;
    let mut ids: Vec<_> = messages.iter().map(|m| m.message_id().to_owned()).collect();
    ids.sort();
    let mut expected = sent.clone();
    expected.sort();
    assert_eq!(ids, expected);
    let acks: Vec<_> = messages
        .into_iter()
        .map(|message| {
            let consumer = Arc::clone(&consumer);
            tokio::spawn(async move { consumer.ack(&message).await })
        })
        .collect();
    for ack in acks {
        ack.await.unwrap().expect("ack");
    }
    assert_eq!(emulator.stats().acked, 100);
    assert_eq!(
        emulator.stats().ack_requests(),
        1,
        "one AckMessage for 100 acks"
    );
    let stats = consumer.stats();
    assert_eq!((stats.received, stats.acked), (100, 100));
    assert_eq!(stats.acks.total_batches(), 1);
    let report = consumer.close(Duration::from_secs(5)).await;
    assert!(report.unacknowledged.is_empty(), "{report:?}");
}

#[tokio::test(start_paused = true)]
async fn an_expired_handle_fails_only_its_own_ack() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 1);
    let consumer = consumer(&emulator).await;
    let expired = consumer
        .receive(1, Duration::from_secs(10))
        .await
        .unwrap()
        .pop()
        .expect("a message");
    tokio::time::sleep(Duration::from_secs(11)).await;
    support::publish(&emulator, "orders", 1);
    let fresh = receive(&consumer, 2).await;
    let fresh = fresh
        .iter()
        .find(|m| m.message_id() != expired.message_id())
        .expect("the new message");
    let (old, new) = tokio::join!(consumer.ack(&expired), consumer.ack(fresh));
    assert_eq!(old.unwrap_err().code(), Some(Code::InvalidReceiptHandle));
    new.expect("the fresh ack succeeds");
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_changed_invisible_duration_gives_the_handle_later_acks_use() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 1);
    let consumer = consumer(&emulator).await;
    let first = receive(&consumer, 1).await.pop().unwrap();
    let changed = consumer
        .change_invisible_duration(&first, Duration::from_secs(120))
        .await
        .expect("ChangeInvisibleDuration");
    // Past the first handle's 60 s: the message stays invisible, and the ack of the first
    // copy goes out with the new handle.
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert!(
        consumer
            .receive(32, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
    consumer
        .ack(&first)
        .await
        .expect("acked with the new handle");
    assert_eq!(emulator.stats().acked, 1);
    assert_eq!(consumer.stats().invisible_changed, 1);
    drop(changed);
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn zero_or_too_many_messages_are_refused_by_name() {
    let emulator = support::emulator(&["orders"]).await;
    let consumer = consumer(&emulator).await;
    for bad in [0, 33, u32::MAX] {
        let error = consumer
            .receive(bad, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Invalid {
                    what: "max_messages",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("1..=32"), "{error}");
    }
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn an_invisible_duration_outside_the_proxys_limits_is_refused_by_name() {
    let emulator = support::emulator(&["orders"]).await;
    let consumer = consumer(&emulator).await;
    for bad in [
        Duration::ZERO,
        Duration::from_millis(9_999),
        Duration::from_secs(12 * 3600 + 1),
    ] {
        let error = consumer.receive(1, bad).await.unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Invalid {
                    what: "invisible_duration",
                    ..
                }
            ),
            "{error:?}"
        );
    }
    support::publish(&emulator, "orders", 1);
    let message = receive(&consumer, 1).await.pop().unwrap();
    let error = consumer
        .change_invisible_duration(&message, Duration::from_secs(12 * 3600 + 1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "invisible_duration",
                ..
            }
        ),
        "{error:?}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn close_flushes_pending_acks_and_later_calls_fail() {
    let emulator = support::emulator(&["orders"]).await;
    support::publish(&emulator, "orders", 3);
    let consumer = consumer(&emulator).await;
    let messages = receive(&consumer, 3).await;
    let pending: Vec<_> = messages
        .iter()
        .cloned()
        .map(|message| {
            let consumer = Arc::clone(&consumer);
            tokio::spawn(async move { consumer.ack(&message).await })
        })
        .collect();
    tokio::task::yield_now().await;
    let report = consumer.close(Duration::from_secs(5)).await;
    assert_eq!(report.acks.succeeded, 3, "{report:?}");
    for ack in pending {
        ack.await.unwrap().expect("resolved once, with success");
    }
    assert_eq!(emulator.stats().acked, 3);
    assert!(matches!(
        consumer.receive(1, Duration::from_secs(30)).await,
        Err(Error::Closed("the simple consumer"))
    ));
    assert!(matches!(
        consumer.ack(&messages[0]).await,
        Err(Error::Closed("the simple consumer"))
    ));
    assert!(
        consumer
            .close(Duration::from_secs(1))
            .await
            .unacknowledged
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn the_builder_names_a_bad_option() {
    let emulator = support::emulator(&["orders"]).await;
    let error = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Invalid {
                what: "subscribe",
                ..
            }
        ),
        "{error:?}"
    );
    let error = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .await_duration(Duration::ZERO)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Invalid {
                what: "await_duration",
                ..
            }
        ),
        "{error:?}"
    );
    let immediate = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .acks(AckSettings::immediate())
        .build()
        .await
        .expect("immediate acks");
    immediate.close(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn the_stream_settings_are_checked_by_the_builder() {
    let emulator = support::emulator(&["orders"]).await;
    for (builder, setting) in [
        (
            SimpleConsumer::builder(support::config(&emulator), GROUP)
                .subscribe("orders", "*")
                .receive_batch_size(0),
            "receive_batch_size",
        ),
        (
            SimpleConsumer::builder(support::config(&emulator), GROUP)
                .subscribe("orders", "*")
                .receive_batch_size(33),
            "receive_batch_size",
        ),
        (
            SimpleConsumer::builder(support::config(&emulator), GROUP)
                .subscribe("orders", "*")
                .invisible_duration(Duration::from_secs(1)),
            "invisible_duration",
        ),
    ] {
        let error = builder.build().await.unwrap_err();
        assert!(
            matches!(error, Error::Invalid { what: s, .. } if s == setting),
            "{error:?}"
        );
    }
}

/// `n` messages through the stream, handled 8 at a time, each acknowledged once by its
/// handler; the stream, then waiting in a long poll, ends when the consumer closes.
#[tokio::test(start_paused = true)]
async fn the_stream_yields_every_message_once_and_ends_at_close() {
    use futures_util::StreamExt;

    const N: usize = 100;
    let emulator = support::emulator(&["orders"]).await;
    let mut sent = support::publish(&emulator, "orders", N);
    let consumer = Arc::new(
        SimpleConsumer::builder(support::config(&emulator), GROUP)
            .subscribe("orders", "*")
            .await_duration(Duration::from_secs(5))
            .receive_batch_size(7)
            .invisible_duration(Duration::from_secs(60))
            .build()
            .await
            .expect("the simple consumer starts"),
    );
    let acked = Arc::new(tokio::sync::Notify::new());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let worker = {
        let consumer = Arc::clone(&consumer);
        let (acked, count) = (Arc::clone(&acked), Arc::clone(&count));
        tokio::spawn(async move {
            let consumer = &*consumer;
            consumer
                .stream()
                .map(|message| {
                    let (acked, count) = (&acked, &count);
                    async move {
                        let message = message.expect("no receive fails");
                        consumer.ack(&message).await.expect("ack");
                        if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == N {
                            acked.notify_one();
                        }
                        message.message_id().to_owned()
                    }
                })
                .buffer_unordered(8)
                .collect::<Vec<String>>()
                .await
        })
    };
    acked.notified().await;
    // The stream is in its next long poll now; closing ends it.
    consumer.close(Duration::from_secs(5)).await;
    let mut handled = tokio::time::timeout(Duration::from_secs(60), worker)
        .await
        .expect("the stream ends after close")
        .expect("the worker");
    handled.sort();
    sent.sort();
    assert_eq!(handled, sent, "every message handled exactly once");
    let ledger = emulator.ledger("orders", GROUP);
    assert_eq!(ledger.len(), N);
    for record in &ledger {
        assert!(record.acked, "{record:?}");
        assert_eq!(record.ok_acks, 1, "acknowledged once: {record:?}");
        assert_eq!(record.deliveries, 1, "delivered once: {record:?}");
    }
    assert_eq!(consumer.stats().acked, N as u64);
    // A stream made after close ends at once.
    assert!(consumer.stream().next().await.is_none());
}

/// A retryable receive failure is an item and the stream goes on after a backoff; a refusal
/// for good is the last item.
#[tokio::test(start_paused = true)]
async fn the_stream_goes_on_after_a_retryable_error_and_ends_after_another() {
    use futures_util::StreamExt;
    use rocketmq_grpc::pb::Code;
    use rocketmq_grpc_emulator::{Rpc, ScriptedFailure};

    let emulator = support::emulator(&["orders"]).await;
    let consumer = consumer(&emulator).await;
    let sent = support::publish(&emulator, "orders", 1);
    emulator.fail_next(Rpc::ReceiveMessage, 2, ScriptedFailure::Unavailable);
    let mut stream = consumer.stream();
    for _ in 0..2 {
        let error = stream.next().await.expect("an item").unwrap_err();
        assert!(error.is_retryable(), "{error:?}");
    }
    let message = stream.next().await.expect("an item").expect("the message");
    assert_eq!(message.message_id(), sent[0]);
    consumer.ack(&message).await.expect("ack");

    emulator.fail_next(
        Rpc::ReceiveMessage,
        1,
        ScriptedFailure::Code(Code::Forbidden),
    );
    let error = stream.next().await.expect("an item").unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    assert!(stream.next().await.is_none(), "the stream ended");
    // The consumer itself is still open: a new stream receives.
    let sent = support::publish(&emulator, "orders", 1);
    let message = consumer
        .stream()
        .next()
        .await
        .expect("an item")
        .expect("the message");
    assert_eq!(message.message_id(), sent[0]);
    consumer.close(Duration::from_secs(1)).await;
}
