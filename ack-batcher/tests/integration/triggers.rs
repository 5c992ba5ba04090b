//! When batches flush: size, delay, deadline, explicit, and per-key separation.

use std::time::Duration;

use ack_batcher::{Batcher, FlushReason, ItemOptions};
use tokio::time::{Instant, advance};

use crate::support::{Script, Transport, key};

#[tokio::test(start_paused = true)]
async fn flushes_at_exactly_max_items() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .max_items(4)
        .build(Transport(script.clone()))
        .unwrap();
    let mut tickets = Vec::new();
    for id in 0..3 {
        tickets.push(
            batcher
                .try_enqueue(key("t"), id, ItemOptions::new())
                .unwrap(),
        );
    }
    tokio::task::yield_now().await;
    assert!(script.calls().is_empty(), "3 of 4 items must not flush");
    tickets.push(
        batcher
            .try_enqueue(key("t"), 3, ItemOptions::new())
            .unwrap(),
    );
    let started = Instant::now();
    for (id, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(ticket.await.unwrap(), id as u32 * 10);
    }
    assert_eq!(
        Instant::now(),
        started,
        "a full batch flushes without waiting"
    );
    assert_eq!(script.sizes(), [4]);
    let stats = batcher.stats();
    assert_eq!(stats.batches(FlushReason::Size), 1);
    assert_eq!(stats.total_batches(), 1);
    assert_eq!(stats.items_succeeded, 4);
}

#[tokio::test(start_paused = true)]
async fn flushes_at_exactly_max_delay_after_the_first_item() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .max_items(100)
        .max_delay(Duration::from_millis(500))
        .build(Transport(script.clone()))
        .unwrap();
    let first_at = Instant::now();
    let first = batcher
        .try_enqueue(key("t"), 1, ItemOptions::new())
        .unwrap();
    advance(Duration::from_millis(300)).await;
    let second = batcher
        .try_enqueue(key("t"), 2, ItemOptions::new())
        .unwrap();
    advance(Duration::from_millis(199)).await;
    tokio::task::yield_now().await;
    assert!(
        script.calls().is_empty(),
        "1 ms before max_delay nothing flushes"
    );
    assert_eq!(first.await.unwrap(), 10);
    assert_eq!(second.await.unwrap(), 20);
    let calls = script.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].at - first_at, Duration::from_millis(500));
    assert_eq!(calls[0].items, [1, 2]);
    assert_eq!(batcher.stats().batches(FlushReason::Delay), 1);
}

#[tokio::test(start_paused = true)]
async fn an_item_deadline_flushes_its_batch_early() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .max_items(100)
        .max_delay(Duration::from_secs(5))
        .deadline_margin(Duration::from_millis(500))
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let plain = batcher
        .try_enqueue(key("t"), 1, ItemOptions::new())
        .unwrap();
    advance(Duration::from_millis(100)).await;
    let urgent = batcher
        .try_enqueue(
            key("t"),
            2,
            ItemOptions::new().deadline(Instant::now() + Duration::from_secs(2)),
        )
        .unwrap();
    assert_eq!(plain.await.unwrap(), 10);
    assert_eq!(urgent.await.unwrap(), 20);
    let calls = script.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].items, [1, 2]);
    // deadline (t0 + 2.1 s) minus margin (0.5 s), not t0 + max_delay (5 s)
    assert_eq!(calls[0].at - t0, Duration::from_millis(1600));
    assert_eq!(batcher.stats().batches(FlushReason::Deadline), 1);
}

#[tokio::test(start_paused = true)]
async fn an_item_already_within_its_margin_flushes_at_once() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .deadline_margin(Duration::from_secs(1))
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let waiting = batcher
        .try_enqueue(key("t"), 1, ItemOptions::new())
        .unwrap();
    let late = batcher
        .try_enqueue(
            key("t"),
            2,
            ItemOptions::new().deadline(t0 + Duration::from_millis(300)),
        )
        .unwrap();
    assert_eq!(late.await.unwrap(), 20);
    assert_eq!(waiting.await.unwrap(), 10, "it shared the deadline's batch");
    assert_eq!(script.calls()[0].at, t0);
    assert_eq!(batcher.stats().batches(FlushReason::Deadline), 1);
}

#[tokio::test(start_paused = true)]
async fn keys_are_batched_separately() {
    let script = Script::ok();
    let batcher = Batcher::builder()
        .max_items(3)
        .max_delay(Duration::from_secs(1))
        .build(Transport(script.clone()))
        .unwrap();
    let mut tickets = Vec::new();
    for id in 0..10u32 {
        let k = if id % 2 == 0 { "even" } else { "odd" };
        tickets.push(batcher.try_enqueue(key(k), id, ItemOptions::new()).unwrap());
    }
    for ticket in tickets {
        ticket.await.unwrap();
    }
    let calls = script.calls();
    for call in &calls {
        let parity = if call.key == "even" { 0 } else { 1 };
        assert!(call.items.iter().all(|i| i % 2 == parity), "{call:?}");
        assert!(call.items.len() <= 3);
    }
    let even: Vec<u32> = calls
        .iter()
        .filter(|c| c.key == "even")
        .flat_map(|c| c.items.clone())
        .collect();
    assert_eq!(even, [0, 2, 4, 6, 8], "a key's items keep their order");
    let stats = batcher.stats();
    assert_eq!(stats.batches(FlushReason::Size), 2);
    assert_eq!(stats.batches(FlushReason::Delay), 2);
}

#[tokio::test(start_paused = true)]
async fn explicit_flush_resolves_once_the_batch_is_answered() {
    let script = Script::ok().with_delay(Duration::from_millis(40));
    let batcher = Batcher::builder().build(Transport(script.clone())).unwrap();
    let a = batcher
        .try_enqueue(key("a"), 1, ItemOptions::new())
        .unwrap();
    let b = batcher
        .try_enqueue(key("b"), 2, ItemOptions::new())
        .unwrap();
    let t0 = Instant::now();
    batcher.flush(&key("a")).await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(40));
    assert_eq!(a.await.unwrap(), 10);
    assert_eq!(script.calls().len(), 1, "only key a was flushed");
    batcher.flush_all().await;
    assert_eq!(b.await.unwrap(), 20);
    batcher.flush(&key("nothing")).await;
    assert_eq!(batcher.stats().batches(FlushReason::Explicit), 2);
}

#[tokio::test(start_paused = true)]
async fn immediate_items_skip_the_wait() {
    let script = Script::ok();
    let batcher = Batcher::builder().build(Transport(script.clone())).unwrap();
    let queued = batcher
        .try_enqueue(key("t"), 1, ItemOptions::new())
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(batcher.submit_immediate(key("t"), 2).await.unwrap(), 20);
    assert_eq!(Instant::now(), t0);
    assert_eq!(script.sizes(), [1]);
    assert_eq!(queued.await.unwrap(), 10);
    let stats = batcher.stats();
    assert_eq!(stats.batches(FlushReason::Immediate), 1);
    assert_eq!(stats.batches(FlushReason::Delay), 1);
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_limit_queues_a_keys_batches_in_order() {
    let script = Script::ok().with_delay(Duration::from_millis(100));
    let batcher = Batcher::builder()
        .max_items(2)
        .max_in_flight_per_key(1)
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let mut tickets = Vec::new();
    for id in 0..6 {
        tickets.push(
            batcher
                .try_enqueue(key("t"), id, ItemOptions::new())
                .unwrap(),
        );
    }
    assert_eq!(batcher.stats().queued, 2);
    let other = batcher.submit_immediate(key("other"), 99).await.unwrap();
    assert_eq!(other, 990);
    assert_eq!(
        Instant::now() - t0,
        Duration::from_millis(100),
        "another key is not held up by key t's queue"
    );
    for ticket in tickets {
        ticket.await.unwrap();
    }
    let starts: Vec<_> = script
        .calls()
        .iter()
        .filter(|c| c.key == "t")
        .map(|c| ((c.at - t0).as_millis(), c.items.clone()))
        .collect();
    assert_eq!(
        starts,
        [(0, vec![0, 1]), (100, vec![2, 3]), (200, vec![4, 5])]
    );
}
