//! Close, drop, backpressure, key release, observers and settings.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{
    Backpressure, BatchInfo, Batcher, Error, FlushReason, ItemOptions, ItemReply, ItemView, Next,
    Observer, RetryPolicy,
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::support::{Failure, Script, Transport, key};

#[tokio::test(start_paused = true)]
async fn close_flushes_and_waits_for_in_flight_batches() {
    let script = Script::ok().with_delay(Duration::from_secs(2));
    let batcher = Batcher::builder()
        .max_items(2)
        .build(Transport(script.clone()))
        .unwrap();
    let in_flight: Vec<_> = (0..2)
        .map(|i| {
            batcher
                .try_enqueue(key("a"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    let open = batcher
        .try_enqueue(key("b"), 7, ItemOptions::new())
        .unwrap();
    let t0 = Instant::now();
    let report = batcher.close(Duration::from_secs(30)).await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    assert_eq!(report.pending_at_close, 3);
    assert_eq!(
        (report.succeeded, report.failed, report.abandoned),
        (3, 0, 0)
    );
    assert!(!report.timed_out);
    for ticket in in_flight {
        ticket.await.unwrap();
    }
    assert_eq!(open.await.unwrap(), 70);
    assert_eq!(batcher.stats().batches(FlushReason::Close), 1);
    assert_eq!(batcher.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn close_abandons_what_is_left_at_the_timeout() {
    // Key "slow" takes a minute to answer; key "retry" keeps failing retryably.
    let script = Script::new(|key, items, _| {
        if key == "retry" {
            Ok(vec![
                ItemReply::Err(Failure { retryable: true });
                items.len()
            ])
        } else {
            Ok(items.iter().map(|i| ItemReply::Ok(*i)).collect())
        }
    });
    let batcher = Batcher::builder()
        .retry(RetryPolicy::default().max_attempts(1000))
        .build(Transport(script.clone()))
        .unwrap();
    let retrying = batcher
        .try_enqueue(key("retry"), 1, ItemOptions::new().immediate())
        .unwrap();
    tokio::task::yield_now().await;
    *script.delay.lock() = Duration::from_secs(60);
    let slow = batcher
        .try_enqueue(key("slow"), 2, ItemOptions::new())
        .unwrap();
    let t0 = Instant::now();
    let report = batcher.close(Duration::from_secs(5)).await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(5));
    assert!(report.timed_out);
    assert_eq!(report.pending_at_close, 2);
    assert_eq!(report.abandoned, 2);
    assert!(matches!(slow.await, Err(Error::Abandoned)));
    assert!(matches!(retrying.await, Err(Error::Abandoned)));
    let stats = batcher.stats();
    assert_eq!((stats.pending, stats.in_flight, stats.keys), (0, 0, 0));
    assert_eq!(stats.items_abandoned, 2);
}

#[tokio::test(start_paused = true)]
async fn submit_after_close_hands_the_item_back() {
    let batcher = Batcher::builder().build(Transport(Script::ok())).unwrap();
    batcher.close(Duration::from_secs(1)).await;
    assert!(batcher.is_closed());
    let refused = batcher.submit(key("t"), 42).await.unwrap_err();
    assert!(matches!(refused, Error::Closed(42)));
    assert_eq!(refused.into_item(), Some(42));
    let refused = batcher
        .try_enqueue(key("t"), 43, ItemOptions::new())
        .unwrap_err();
    assert_eq!(refused.into_item(), Some(43));
    assert_eq!(batcher.stats().items_submitted, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_batcher_still_resolves_every_item() {
    let script = Script::ok().with_delay(Duration::from_millis(10));
    let batcher = Batcher::builder().build(Transport(script.clone())).unwrap();
    let tickets: Vec<_> = (0..5)
        .map(|i| {
            batcher
                .try_enqueue(key("t"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    let clone = batcher.clone();
    drop(batcher);
    assert!(!clone.is_closed(), "a clone keeps the batcher open");
    drop(clone);
    let t0 = Instant::now();
    for (i, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(ticket.await.unwrap(), i as u32 * 10);
    }
    assert_eq!(
        Instant::now() - t0,
        Duration::from_millis(10),
        "flushed on drop"
    );
}

#[tokio::test(start_paused = true)]
async fn rejecting_backpressure_hands_the_item_back() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .max_items(2)
        .max_pending(2)
        .backpressure(Backpressure::Reject)
        .max_delay(Duration::from_secs(1))
        .build(Transport(script))
        .unwrap();
    let first = batcher
        .try_enqueue(key("a"), 1, ItemOptions::new())
        .unwrap();
    let _second = batcher
        .try_enqueue(key("b"), 2, ItemOptions::new())
        .unwrap();
    let refused = batcher.submit(key("a"), 3).await.unwrap_err();
    assert!(
        matches!(refused, Error::Full { item: 3, limit: 2 }),
        "{refused:?}"
    );
    assert!(refused.is_retryable());
    assert_eq!(first.await.unwrap(), 10);
    assert_eq!(batcher.submit(key("a"), 3).await.unwrap(), 30, "room again");
}

#[tokio::test(start_paused = true)]
async fn waiting_backpressure_admits_when_room_frees_up() {
    let batcher = Batcher::builder()
        .max_items(1)
        .max_pending(1)
        .build(Transport(
            Script::ok().with_delay(Duration::from_millis(50)),
        ))
        .unwrap();
    let first = batcher
        .try_enqueue(key("a"), 1, ItemOptions::new())
        .unwrap();
    assert!(matches!(
        batcher.try_enqueue(key("a"), 2, ItemOptions::new()),
        Err(Error::Full { item: 2, .. })
    ));
    let t0 = Instant::now();
    assert_eq!(batcher.submit(key("a"), 2).await.unwrap(), 20);
    assert_eq!(Instant::now() - t0, Duration::from_millis(100));
    assert_eq!(first.await.unwrap(), 10);
}

#[tokio::test(start_paused = true)]
async fn close_wakes_items_waiting_for_room() {
    let batcher = Batcher::builder()
        .max_items(1)
        .max_pending(1)
        .build(Transport(Script::ok().with_delay(Duration::from_secs(1))))
        .unwrap();
    let _first = batcher
        .try_enqueue(key("a"), 1, ItemOptions::new())
        .unwrap();
    let waiting = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.submit(key("a"), 2).await }
    });
    tokio::task::yield_now().await;
    batcher.close(Duration::from_secs(5)).await;
    assert!(matches!(waiting.await.unwrap(), Err(Error::Closed(2))));
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_released() {
    let batcher = Batcher::builder()
        .max_delay(Duration::from_millis(10))
        .build(Transport(Script::ok()))
        .unwrap();
    let tickets: Vec<_> = (0..1000)
        .map(|i| {
            batcher
                .try_enqueue(format!("one-off-{i}"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    assert_eq!(batcher.stats().keys, 1000);
    for ticket in tickets {
        ticket.await.unwrap();
    }
    tokio::task::yield_now().await;
    let stats = batcher.stats();
    assert_eq!((stats.keys, stats.pending, stats.in_flight), (0, 0, 0));
    assert_eq!(stats.batches(FlushReason::Delay), 1000);
}

/// Records what an observer sees.
#[derive(Default)]
struct Seen {
    before: Mutex<Vec<(String, BatchInfo, Vec<u32>)>>,
    after: Mutex<Vec<(u32, bool, u32, Next)>>,
}

impl Observer<String, u32, u32, Failure> for Seen {
    fn before_flush(&self, key: &String, batch: &BatchInfo, items: &[u32]) {
        self.before
            .lock()
            .push((key.clone(), *batch, items.to_vec()));
    }

    fn after_flush(&self, _: &String, _: &BatchInfo, items: &[ItemView<'_, u32, u32, Failure>]) {
        let mut after = self.after.lock();
        for view in items {
            let ok = matches!(view.reply, ItemReply::Ok(_));
            after.push((*view.item, ok, view.attempt, view.next));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn observers_see_every_item_with_its_own_reply() {
    // Item 2 fails retryably in the first batch and succeeds when retried alone.
    let script = Script::new(|_, items, _| {
        Ok(items
            .iter()
            .map(|i| {
                if *i == 2 && items.len() == 2 {
                    ItemReply::Err(Failure { retryable: true })
                } else {
                    ItemReply::Ok(*i)
                }
            })
            .collect())
    });
    let seen = Arc::new(Seen::default());
    let batcher = Batcher::builder()
        .max_items(2)
        .retry(
            RetryPolicy::default()
                .backoff(Duration::from_secs(1))
                .jitter(0.0),
        )
        .observer(seen.clone())
        .build(Transport(script))
        .unwrap();
    let (a, b) = tokio::join!(batcher.submit(key("t"), 1), batcher.submit(key("t"), 2));
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    let before = seen.before.lock().clone();
    assert_eq!(before.len(), 2);
    assert_eq!(before[0].1.reason, FlushReason::Size);
    assert_eq!(before[0].2, [1, 2]);
    assert_eq!(before[1].1.reason, FlushReason::Retry);
    assert_eq!(before[1].2, [2]);
    let after = seen.after.lock().clone();
    assert_eq!(
        after,
        [
            (1, true, 1, Next::Resolved),
            (
                2,
                false,
                1,
                Next::Retry {
                    after: Duration::from_secs(1)
                }
            ),
            (2, true, 2, Next::Resolved),
        ]
    );
}

#[test]
fn building_outside_a_runtime_is_an_error() {
    let result = Batcher::builder().build(Transport(Script::ok()));
    assert!(matches!(result, Err(Error::NoRuntime)));
}

#[tokio::test]
async fn invalid_settings_are_rejected_with_the_settings_name() {
    let result = Batcher::builder()
        .max_items(0)
        .build(Transport(Script::ok()));
    match result {
        Err(
            error @ Error::InvalidConfig {
                setting: "max_items",
                ..
            },
        ) => {
            assert!(error.to_string().contains("max_items"), "{error}");
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let result = Batcher::builder()
        .retry(RetryPolicy::default().backoff(Duration::ZERO))
        .build(Transport(Script::ok()));
    assert!(matches!(
        result,
        Err(Error::InvalidConfig {
            setting: "retry.backoff",
            ..
        })
    ));
}
