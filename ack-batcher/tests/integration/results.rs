//! Per-item results: id mapping, missing replies, terminal and retryable failures, retries.

use std::time::Duration;

use ack_batcher::{Batcher, Error, FlushReason, ItemOptions, ItemReply, Matched, RetryPolicy};
use tokio::time::Instant;

use crate::support::{Failure, Script, Transport, key};

const RETRYABLE: Failure = Failure { retryable: true };
const TERMINAL: Failure = Failure { retryable: false };

#[tokio::test(start_paused = true)]
async fn results_are_mapped_by_id_when_the_transport_answers_out_of_order() {
    // The "server" answers entries in reverse order, keyed by id, with a duplicate id.
    let script = Script::new(|_, items, _| {
        let responses: Vec<(u32, u32)> = items
            .iter()
            .enumerate()
            .rev()
            .map(|(position, id)| (*id, id * 100 + position as u32))
            .collect();
        Ok(Matched::by_id(items.iter().copied(), responses).into_replies(Ok))
    });
    let batcher = Batcher::builder()
        .max_items(4)
        .build(Transport(script))
        .unwrap();
    let tickets: Vec<_> = [5, 7, 5, 9]
        .into_iter()
        .map(|id| {
            batcher
                .try_enqueue(key("t"), id, ItemOptions::new())
                .unwrap()
        })
        .collect();
    let mut outputs = Vec::new();
    for ticket in tickets {
        outputs.push(ticket.await.unwrap());
    }
    // Duplicates are matched in submission order: the first 5 gets the first reply for 5
    // that came back (from position 2, since replies came reversed).
    assert_eq!(outputs, [502, 701, 500, 903]);
}

#[tokio::test(start_paused = true)]
async fn missing_results_are_retried_and_then_reported_missing() {
    // The first answer covers only the first item; later answers cover everything except
    // item 3, which the server never reports.
    let script = Script::new(|_, items, attempt| {
        if attempt == 0 && items.len() > 1 {
            return Ok(vec![ItemReply::Ok(items[0] * 10)]);
        }
        Ok(items
            .iter()
            .map(|i| {
                if *i == 3 {
                    ItemReply::Missing
                } else {
                    ItemReply::Ok(i * 10)
                }
            })
            .collect())
    });
    let batcher = Batcher::builder()
        .max_items(3)
        .retry(RetryPolicy::default().max_attempts(3))
        .build(Transport(script.clone()))
        .unwrap();
    let (a, b, c) = tokio::join!(
        batcher.submit(key("t"), 1),
        batcher.submit(key("t"), 2),
        batcher.submit(key("t"), 3),
    );
    assert_eq!(a.unwrap(), 10);
    assert_eq!(b.unwrap(), 20, "a missing reply is retryable");
    assert!(matches!(c, Err(Error::Missing { attempts: 3 })), "{c:?}");
    // Items 2 and 3 are retried together once; then item 3 alone, then reported missing.
    assert_eq!(script.sizes(), [3, 2, 1]);
    let stats = batcher.stats();
    assert_eq!(stats.missing_replies, 4);
    assert_eq!(stats.items_failed, 1);
}

#[tokio::test(start_paused = true)]
async fn terminal_errors_are_not_retried() {
    let script = Script::new(|_, items, _| {
        Ok(items
            .iter()
            .map(|i| {
                if *i == 2 {
                    ItemReply::Err(TERMINAL)
                } else {
                    ItemReply::Ok(*i)
                }
            })
            .collect())
    });
    let batcher = Batcher::builder()
        .max_items(2)
        .build(Transport(script.clone()))
        .unwrap();
    let (a, b) = tokio::join!(batcher.submit(key("t"), 1), batcher.submit(key("t"), 2));
    assert_eq!(a.unwrap(), 1);
    match b {
        Err(Error::Failed { source, attempts }) => {
            assert_eq!(source, TERMINAL);
            assert_eq!(attempts, 1);
        }
        other => panic!("expected a terminal failure, got {other:?}"),
    }
    assert_eq!(script.sizes(), [2], "no retry call");
    let stats = batcher.stats();
    assert_eq!((stats.retries, stats.terminal_failures), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_whole_batch_error_reaches_every_item() {
    let script = Script::new(|_, _, _| Err(TERMINAL));
    let batcher = Batcher::builder()
        .max_items(3)
        .build(Transport(script))
        .unwrap();
    let results = tokio::join!(
        batcher.submit(key("t"), 1),
        batcher.submit(key("t"), 2),
        batcher.submit(key("t"), 3),
    );
    for result in [results.0, results.1, results.2] {
        assert!(matches!(result, Err(Error::Failed { source, attempts: 1 }) if source == TERMINAL));
    }
}

#[tokio::test(start_paused = true)]
async fn retries_are_individual_and_follow_the_backoff_and_attempt_cap() {
    // Item 2 always fails retryably; items 1 and 3 succeed.
    let script = Script::new(|_, items, _| {
        Ok(items
            .iter()
            .map(|i| {
                if *i == 2 {
                    ItemReply::Err(RETRYABLE)
                } else {
                    ItemReply::Ok(*i)
                }
            })
            .collect())
    });
    let batcher = Batcher::builder()
        .max_items(3)
        .retry(
            RetryPolicy::default()
                .backoff(Duration::from_millis(100))
                .multiplier(2.0)
                .jitter(0.0)
                .max_attempts(4),
        )
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let (a, b, c) = tokio::join!(
        batcher.submit(key("t"), 1),
        batcher.submit(key("t"), 2),
        batcher.submit(key("t"), 3),
    );
    assert_eq!((a.unwrap(), c.unwrap()), (1, 3));
    assert!(
        matches!(b, Err(Error::Failed { source, attempts: 4 }) if source == RETRYABLE),
        "retries stop at max_attempts"
    );
    let calls: Vec<_> = script
        .calls()
        .iter()
        .map(|c| ((c.at - t0).as_millis(), c.items.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (0, vec![1, 2, 3]),
            (100, vec![2]),
            (300, vec![2]),
            (700, vec![2]),
        ],
        "each retry is a batch of one after 100, 200, 400 ms"
    );
    let stats = batcher.stats();
    assert_eq!(stats.retries, 3);
    assert_eq!(stats.batches(FlushReason::Retry), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_items_deadline() {
    let script = Script::new(|_, items, _| Ok(vec![ItemReply::Err(RETRYABLE); items.len()]));
    let batcher = Batcher::builder()
        .retry(
            RetryPolicy::default()
                .backoff(Duration::from_secs(1))
                .multiplier(1.0)
                .jitter(0.0)
                .max_attempts(100),
        )
        .deadline_margin(Duration::ZERO)
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_millis(3500);
    let ticket = batcher
        .try_enqueue(
            key("t"),
            1,
            ItemOptions::new().deadline(deadline).immediate(),
        )
        .unwrap();
    let result = ticket.await;
    assert!(
        matches!(result, Err(Error::Failed { attempts: 4, .. })),
        "{result:?}"
    );
    // Attempts at 0, 1, 2, 3 s; a fifth at 4 s would start after the deadline.
    assert_eq!(
        script.calls().last().unwrap().at - t0,
        Duration::from_secs(3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_retrying_item_does_not_block_others() {
    // Item 1 fails retryably twice, then succeeds; everything else succeeds at once.
    let script = Script::new(|_, items, attempt| {
        Ok(items
            .iter()
            .map(|i| {
                if *i == 1 && attempt < 2 {
                    ItemReply::Err(RETRYABLE)
                } else {
                    ItemReply::Ok(*i)
                }
            })
            .collect())
    });
    let batcher = Batcher::builder()
        .max_items(1)
        .max_in_flight_per_key(1)
        .retry(
            RetryPolicy::default()
                .backoff(Duration::from_secs(10))
                .jitter(0.0),
        )
        .build(Transport(script))
        .unwrap();
    let t0 = Instant::now();
    let slow = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.submit(key("t"), 1).await }
    });
    tokio::task::yield_now().await;
    for id in 2..20 {
        assert_eq!(batcher.submit(key("t"), id).await.unwrap(), id);
    }
    assert_eq!(
        Instant::now(),
        t0,
        "later items of the same key went through at once"
    );
    assert_eq!(slow.await.unwrap().unwrap(), 1);
    assert_eq!(Instant::now() - t0, Duration::from_secs(20));
}
