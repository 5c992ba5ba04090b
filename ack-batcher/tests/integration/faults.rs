//! Transports that misbehave: one that panics, one that never answers (with and without a
//! flush timeout), and one that yields nothing to cancellation. Every item still resolves
//! exactly once and `close` returns within its timeout.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{
    BatchInfo, Batcher, Error, Flush, FlushReason, FlushResult, ItemOptions, ItemReply, Observer,
    RetryBudget, RetryPolicy,
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::support::{Failure, Script, Transport, key};

/// Panics on every flush whose first item is odd; answers the others.
struct PanicsOnOdd;

impl Flush<String, u32> for PanicsOnOdd {
    type Output = u32;
    type Error = Failure;

    async fn flush(&self, _key: &String, items: &[u32]) -> FlushResult<u32, Failure> {
        assert!(
            items[0].is_multiple_of(2),
            "the transport broke on item {}",
            items[0]
        );
        Ok(items.iter().map(|i| ItemReply::Ok(*i)).collect())
    }
}

#[derive(Default)]
struct SeesPanics(Mutex<Vec<(String, Vec<u32>, String)>>);

impl Observer<String, u32, u32, Failure> for SeesPanics {
    fn on_panicked(&self, key: &String, _batch: &BatchInfo, items: &[u32], message: &str) {
        self.0
            .lock()
            .push((key.clone(), items.to_vec(), message.to_owned()));
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_transport_fails_its_batch_and_close_returns_at_once() {
    let seen = Arc::new(SeesPanics::default());
    let batcher = Batcher::builder()
        .max_items(2)
        .observer(seen.clone())
        .build(PanicsOnOdd)
        .unwrap();
    let broken: Vec<_> = [1, 2]
        .into_iter()
        .map(|i| {
            batcher
                .try_enqueue(key("a"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    let fine: Vec<_> = [4, 5]
        .into_iter()
        .map(|i| {
            batcher
                .try_enqueue(key("a"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    for ticket in broken {
        // Bounded, so that a batcher that loses the panicking batch fails here, not hangs.
        let outcome = tokio::time::timeout(Duration::from_secs(60), ticket).await;
        match outcome.expect("a panicking flush resolves its items") {
            Err(Error::Panicked { message, attempts }) => {
                assert_eq!(attempts, 1, "a panic is not retried");
                assert!(message.contains("broke on item 1"), "{message}");
            }
            other => panic!("expected Panicked, got {other:?}"),
        }
    }
    for (ticket, id) in fine.into_iter().zip([4, 5]) {
        assert_eq!(
            ticket.await.unwrap(),
            id,
            "the next batch of the key is unaffected"
        );
    }
    let stats = batcher.stats();
    assert_eq!(
        (
            stats.flush_panics,
            stats.items_failed,
            stats.terminal_failures,
            stats.retries
        ),
        (1, 2, 2, 0)
    );
    assert_eq!(
        seen.0.lock().clone(),
        [(
            key("a"),
            vec![1, 2],
            "the transport broke on item 1".to_owned()
        )]
    );
    let t0 = Instant::now();
    let report = batcher.close(Duration::from_millis(300)).await;
    assert_eq!(Instant::now(), t0, "nothing was left in flight");
    assert!(!report.timed_out);
    assert_eq!((report.pending_at_close, report.abandoned), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_transport_that_never_answers_cannot_hold_close_past_its_timeout() {
    let script = Script::ok().with_delay(Duration::from_secs(24 * 3600));
    let batcher = Batcher::builder()
        .max_items(3)
        .build(Transport(script.clone()))
        .unwrap();
    let tickets: Vec<_> = (0..4)
        .map(|i| {
            batcher
                .try_enqueue(key("a"), i, ItemOptions::new())
                .unwrap()
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(batcher.stats().in_flight, 1);
    let t0 = Instant::now();
    let report = batcher.close(Duration::from_millis(300)).await;
    assert_eq!(Instant::now() - t0, Duration::from_millis(300));
    assert!(report.timed_out);
    assert_eq!((report.pending_at_close, report.abandoned), (4, 4));
    for ticket in tickets {
        assert!(matches!(ticket.await, Err(Error::Abandoned)));
    }
    let stats = batcher.stats();
    assert_eq!(
        (stats.pending, stats.in_flight, stats.items_abandoned),
        (0, 0, 4)
    );
}

/// Spins without ever yielding, then answers: close cannot cancel it, and must not wait
/// for it either.
struct BusyThenAnswers(std::time::Duration);

impl Flush<String, u32> for BusyThenAnswers {
    type Output = u32;
    type Error = Failure;

    async fn flush(&self, _key: &String, items: &[u32]) -> FlushResult<u32, Failure> {
        std::thread::sleep(self.0);
        Ok(items.iter().map(|i| ItemReply::Ok(*i)).collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_in_time_while_a_flush_blocks_its_thread() {
    let batcher = Batcher::builder()
        .max_items(1)
        .build(BusyThenAnswers(std::time::Duration::from_secs(3)))
        .unwrap();
    let ticket = batcher
        .try_enqueue(key("a"), 1, ItemOptions::new())
        .unwrap();
    // Let the flush start and block its worker thread.
    while batcher.stats().in_flight == 0 {
        tokio::task::yield_now().await;
    }
    let t0 = std::time::Instant::now();
    let report = batcher.close(Duration::from_millis(200)).await;
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_secs(2),
        "close took {took:?}"
    );
    assert_eq!(report.abandoned, 1);
    assert!(matches!(ticket.await, Err(Error::Abandoned)));
}

#[tokio::test(start_paused = true)]
async fn a_flush_timeout_turns_a_hang_into_missing_replies_retried_within_the_policy() {
    let script = Script::ok().with_delay(Duration::from_secs(24 * 3600));
    let batcher = Batcher::builder()
        .max_items(2)
        .flush_timeout(Duration::from_secs(2))
        .retry(
            RetryPolicy::default()
                .backoff(Duration::from_secs(1))
                .multiplier(1.0)
                .jitter(0.0)
                .max_attempts(3),
        )
        .build(Transport(script.clone()))
        .unwrap();
    let t0 = Instant::now();
    let (a, b) = tokio::join!(batcher.submit(key("a"), 1), batcher.submit(key("a"), 2));
    for outcome in [a, b] {
        assert!(
            matches!(outcome, Err(Error::Missing { attempts: 3 })),
            "{outcome:?}"
        );
    }
    // Three attempts of 2 s each, two backoffs of 1 s between them.
    assert_eq!(Instant::now() - t0, Duration::from_secs(8));
    assert_eq!(script.calls().len(), 3);
    let stats = batcher.stats();
    assert_eq!(
        (stats.flush_timeouts, stats.items_failed, stats.pending),
        (3, 2, 0)
    );
    let report = batcher.close(Duration::from_secs(1)).await;
    assert!(!report.timed_out);
}

#[tokio::test(start_paused = true)]
async fn a_flush_timeout_is_checked_when_the_batcher_is_built() {
    let built = Batcher::<String, u32, _>::builder()
        .flush_timeout(Duration::ZERO)
        .build(Transport(Script::ok()));
    assert!(
        matches!(
            built,
            Err(Error::InvalidConfig {
                setting: "flush_timeout",
                ..
            })
        ),
        "{built:?}"
    );
}

/// Runs 30 s of virtual time in which the transport fails every batch retryably, then
/// accepts everything: 2,308 items at one per 13 ms under one key (100 ms batches), each
/// with a 60 s deadline, retried every 25 to 50 ms (jittered) up to 10,000 times (the shape of RocketMQ acks
/// during a proxy restart). Returns the flush calls made during the outage, the first-attempt
/// batches among them, and whether every item then succeeded.
async fn outage_with(budget: RetryBudget) -> (usize, u64, bool) {
    let t0 = Instant::now();
    let outage = Duration::from_secs(30);
    let script = Script::new(move |_, items, _| {
        if Instant::now() < t0 + outage {
            Err(Failure { retryable: true })
        } else {
            Ok(items.iter().map(|i| ItemReply::Ok(*i)).collect())
        }
    });
    let batcher = Batcher::builder()
        .max_items(1024)
        .max_delay(Duration::from_millis(100))
        .deadline_margin(Duration::from_millis(100))
        .retry(
            // A constant backoff, as the consumer's acks had: the budget alone must bound it.
            RetryPolicy::default()
                .backoff(Duration::from_millis(50))
                .multiplier(1.0)
                .max_attempts(10_000),
        )
        .retry_budget(budget)
        .build(Transport(script.clone()))
        .unwrap();
    let mut tickets = Vec::new();
    let mut i = 0;
    while Instant::now() < t0 + outage {
        let deadline = Instant::now() + Duration::from_secs(60);
        tickets.push(
            batcher
                .enqueue(key("topic"), i, ItemOptions::new().deadline(deadline))
                .await
                .unwrap(),
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(13)).await;
    }
    let mut all_ok = true;
    for ticket in tickets {
        all_ok &= ticket.await.is_ok();
    }
    let during = script
        .calls()
        .iter()
        .filter(|call| call.at < t0 + outage)
        .count();
    let first = batcher.stats().total_batches() - batcher.stats().batches(FlushReason::Retry);
    batcher.close(Duration::from_secs(1)).await;
    (during, first, all_ok)
}

/// The bound: the first attempts, plus what the default budget allows over the outage and
/// one window before it: 20 % of the first attempts and 10 per second.
fn budget_bound(first_attempts: u64, outage: Duration) -> usize {
    let window = Duration::from_secs(10);
    (first_attempts as f64 * 1.2 + 10.0 * (outage + window).as_secs_f64()) as usize
}

#[tokio::test(start_paused = true)]
async fn an_outage_cannot_multiply_the_requests() {
    let (during, first, all_ok) = outage_with(RetryBudget::default()).await;
    let bound = budget_bound(first, Duration::from_secs(30));
    println!(
        "with the budget: {during} flushes in the outage, {first} first attempts, bound {bound}"
    );
    assert!(
        during <= bound,
        "{during} flushes during the outage, bound {bound}"
    );
    assert!(all_ok, "every item succeeds once the server is back");

    // Without the budget the same outage makes many times as many requests: the test can
    // fail.
    let (unlimited, first, all_ok) = outage_with(RetryBudget::unlimited()).await;
    println!("without: {unlimited} flushes in the outage, {first} first attempts");
    assert!(
        unlimited > 5 * bound,
        "{unlimited} flushes without a budget"
    );
    assert!(all_ok);
}

#[tokio::test(start_paused = true)]
async fn a_retry_budget_is_checked_when_the_batcher_is_built() {
    let built = Batcher::<String, u32, _>::builder()
        .retry_budget(RetryBudget::default().ratio(f64::NAN))
        .build(Transport(Script::ok()));
    assert!(
        matches!(
            built,
            Err(Error::InvalidConfig {
                setting: "retry_budget.ratio",
                ..
            })
        ),
        "{built:?}"
    );
}
