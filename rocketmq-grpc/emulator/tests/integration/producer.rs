//! The producer against the emulator: retries to another queue, FIFO keeping its queue,
//! terminal codes, outages shorter and longer than the retry window, the proxy's retry
//! policy and route refreshes.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::RetryBudget;
use rocketmq_grpc::pb::Code;
use rocketmq_grpc::{
    Backoff, Error, OutgoingMessage, Producer, ProducerBuilder, SendRetryPolicy, Session,
};
use rocketmq_grpc_emulator::{Emulator, Rpc, ScriptedFailure, TopicKind};

use crate::support;

const TOPIC: &str = "orders";
const FIFO: &str = "fifo-orders";

async fn emulator() -> Emulator {
    Emulator::builder()
        .topic(TOPIC, TopicKind::Normal, 4)
        .topic(FIFO, TopicKind::Fifo, 4)
        .start()
        .await
        .expect("the emulator starts")
}

fn producer(emulator: &Emulator) -> Producer {
    builder(emulator).build().expect("a producer")
}

fn builder(emulator: &Emulator) -> ProducerBuilder {
    Producer::builder(support::config(emulator))
}

/// (message ids, queue the client asked for, code) of every SendMessage the emulator saw.
fn sends(emulator: &Emulator) -> Vec<(String, i32, Code)> {
    emulator
        .send_log()
        .into_iter()
        .map(|r| (r.message_ids.join(","), r.queue_id, r.code))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_send_retried_after_a_retryable_failure_goes_to_another_queue() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    producer
        .send(OutgoingMessage::new(TOPIC, "first"))
        .await
        .expect("sent");
    assert_eq!(emulator.stats().calls(Rpc::QueryRoute), 1);
    // A stale route is queried again at most once a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = emulator.send_log().len();
    emulator.fail_next(
        Rpc::SendMessage,
        1,
        ScriptedFailure::Code(Code::InternalServerError),
    );
    let receipt = producer
        .send(OutgoingMessage::new(TOPIC, "hello"))
        .await
        .expect("the retry succeeds");
    let log = sends(&emulator)[before..].to_vec();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].2, Code::InternalServerError);
    assert_eq!(log[1].2, Code::Ok);
    assert_eq!(log[0].0, log[1].0, "the retry keeps the message id");
    assert_eq!(log[1].0, receipt.message_id());
    assert_ne!(log[0].1, log[1].1, "the retry goes to another queue");
    // The failure marked the route stale: it was queried again before the retry.
    assert_eq!(emulator.stats().calls(Rpc::QueryRoute), 2);
    // Within a second of that query, another failure retries on the cached queues.
    emulator.fail_next(Rpc::SendMessage, 1, ScriptedFailure::Unavailable);
    producer
        .send(OutgoingMessage::new(TOPIC, "third"))
        .await
        .expect("sent");
    assert_eq!(emulator.stats().calls(Rpc::QueryRoute), 2);
}

#[tokio::test]
async fn a_dropped_connection_is_retried_too() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    emulator.fail_next(Rpc::SendMessage, 2, ScriptedFailure::Unavailable);
    producer
        .send(OutgoingMessage::new(TOPIC, "hello"))
        .await
        .expect("the third attempt succeeds");
    let queues: Vec<i32> = sends(&emulator).iter().map(|s| s.1).collect();
    assert_eq!(queues.len(), 3);
    assert!(
        queues[0] != queues[1] && queues[1] != queues[2],
        "{queues:?}"
    );
}

#[tokio::test]
async fn fifo_messages_keep_their_queue() {
    let emulator = emulator().await;
    let producer = producer(&emulator);
    emulator.fail_next(Rpc::SendMessage, 2, ScriptedFailure::Unavailable);
    producer
        .send(OutgoingMessage::new(FIFO, "first").message_group("g-1"))
        .await
        .expect("the third attempt succeeds");
    producer
        .send(OutgoingMessage::new(FIFO, "second").message_group("g-1"))
        .await
        .expect("sent");
    let log = sends(&emulator);
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|s| s.1 == log[0].1), "{log:?}");
}

#[tokio::test]
async fn terminal_codes_are_not_retried() {
    // Retried or not as `Error::is_retryable` classifies the code; INVALID_RECEIPT_HANDLE is
    // terminal in every classification, the others as the crate classifies them.
    let emulator = emulator().await;
    let producer = producer(&emulator);
    for code in [
        Code::InvalidReceiptHandle,
        Code::Forbidden,
        Code::BadRequest,
        Code::TopicNotFound,
        Code::MessageBodyTooLarge,
        Code::IllegalMessageTag,
        Code::TooManyRequests,
    ] {
        // TOPIC_NOT_FOUND for a topic the producer has routed before is retried: the real
        // name server answers it until a restarted broker registers again.
        let terminal = !Error::Server {
            rpc: "SendMessage",
            code: code as i32,
            message: String::new(),
        }
        .is_retryable()
            && code != Code::TopicNotFound;
        let before = emulator.send_log().len();
        emulator.fail_next(Rpc::SendMessage, 1, ScriptedFailure::Code(code));
        let result = producer.send(OutgoingMessage::new(TOPIC, "m")).await;
        let calls = emulator.send_log().len() - before;
        if terminal {
            let error = result.expect_err("a terminal code fails the send");
            assert_eq!(
                error.code(),
                rocketmq_grpc::Code::from_number(code as i32),
                "{error}"
            );
            assert_eq!(calls, 1, "{code:?} is not retried");
        } else {
            result.expect("a retryable code is retried");
            assert_eq!(calls, 2, "{code:?} is retried once");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_send_during_an_outage_shorter_than_the_window_succeeds() {
    let mut emulator = emulator().await;
    let producer = Arc::new(producer(&emulator));
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    emulator.stop_serving().await.expect("down");
    let started = tokio::time::Instant::now();
    let send = tokio::spawn({
        let producer = Arc::clone(&producer);
        async move { producer.send(OutgoingMessage::new(TOPIC, "during")).await }
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    emulator.resume_serving().await.expect("up again");
    let receipt = send
        .await
        .expect("the task ends")
        .expect("the send succeeds once the proxy is back");
    assert!(started.elapsed() >= Duration::from_secs(4));
    assert!(started.elapsed() < Duration::from_secs(10));
    let log = sends(&emulator);
    assert_eq!(
        log.last().map(|s| (&s.0, s.2)),
        Some((&receipt.message_id().to_owned(), Code::Ok))
    );
    assert_eq!(emulator.stats().messages_stored, 2);
}

#[tokio::test(start_paused = true)]
async fn an_outage_longer_than_the_window_fails_with_the_attempts_and_the_last_error() {
    let mut emulator = emulator().await;
    let producer = builder(&emulator)
        .retry_window(Duration::from_secs(5))
        .build()
        .unwrap();
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    emulator.stop_serving().await.expect("down");
    let started = tokio::time::Instant::now();
    let error = producer
        .send(OutgoingMessage::new(TOPIC, "during"))
        .await
        .expect_err("the outage outlasts the window");
    let elapsed = started.elapsed();
    let Error::SendFailed {
        attempts, ref last, ..
    } = error
    else {
        panic!("SendFailed expected, got {error}");
    };
    assert!(attempts > 3, "more than the policy's attempts: {attempts}");
    assert!(last.is_retryable(), "{last}");
    assert!(error.is_retryable());
    let text = error.to_string();
    assert!(
        text.contains(&format!("after {attempts} attempts")),
        "{text}"
    );
    assert!(
        text.contains("SendMessage") || text.contains("QueryRoute"),
        "{text}"
    );
    assert!(elapsed >= Duration::from_secs(3), "{elapsed:?}");
    assert!(elapsed <= Duration::from_secs(6), "{elapsed:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_window_the_policys_attempts_are_all() {
    let mut emulator = emulator().await;
    let producer = builder(&emulator)
        .retry_window(Duration::ZERO)
        .build()
        .unwrap();
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    emulator.stop_serving().await.expect("down");
    let error = producer
        .send(OutgoingMessage::new(TOPIC, "during"))
        .await
        .expect_err("down");
    assert!(
        matches!(error, Error::SendFailed { attempts: 3, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn the_retry_policy_the_proxy_announces_is_taken() {
    let emulator = Emulator::builder()
        .topic(TOPIC, TopicKind::Normal, 4)
        .producer_backoff(5, Duration::from_millis(50), Duration::from_secs(2), 3.0)
        .start()
        .await
        .unwrap();
    let session = Session::new(support::config(&emulator)).unwrap();
    let producer = builder(&emulator)
        .session(Arc::clone(&session))
        .build()
        .unwrap();
    assert_eq!(producer.retry_policy(), SendRetryPolicy::default());
    producer.start().await.expect("the proxy answers");
    let announced = SendRetryPolicy::new(
        5,
        Backoff::Exponential {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
            multiplier: 3.0,
        },
    );
    assert_eq!(producer.retry_policy(), announced);
    assert!(emulator.clients().contains(&session.client_id().to_owned()));
    // Attempts fixed by the application are kept; the back-off still comes from the proxy.
    let fixed = Producer::builder(support::config(&emulator))
        .max_attempts(2)
        .build()
        .unwrap();
    fixed.start().await.unwrap();
    assert_eq!(
        fixed.retry_policy(),
        SendRetryPolicy::new(2, announced.backoff)
    );
    // Five attempts: four scripted failures are retried through.
    emulator.fail_next(Rpc::SendMessage, 4, ScriptedFailure::Unavailable);
    producer
        .send(OutgoingMessage::new(TOPIC, "m"))
        .await
        .expect("the fifth attempt succeeds");
}

#[tokio::test(start_paused = true)]
async fn routes_are_refreshed_every_30_s_and_one_query_serves_concurrent_sends() {
    let emulator = emulator().await;
    let producer = Arc::new(producer(&emulator));
    let sends: Vec<_> = (0..20)
        .map(|i| {
            let producer = Arc::clone(&producer);
            tokio::spawn(async move {
                producer
                    .send(OutgoingMessage::new(TOPIC, format!("m{i}")))
                    .await
            })
        })
        .collect();
    for send in sends {
        send.await.unwrap().expect("sent");
    }
    assert_eq!(
        emulator.stats().calls(Rpc::QueryRoute),
        1,
        "no thundering herd"
    );
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(
        emulator.stats().calls(Rpc::QueryRoute),
        2,
        "refreshed after 30 s"
    );
    // Concurrent failures mark the route stale once; the retries share one query.
    emulator.fail_next(Rpc::SendMessage, 10, ScriptedFailure::Unavailable);
    let sends: Vec<_> = (0..10)
        .map(|i| {
            let producer = Arc::clone(&producer);
            tokio::spawn(async move {
                producer
                    .send(OutgoingMessage::new(TOPIC, format!("r{i}")))
                    .await
            })
        })
        .collect();
    for send in sends {
        send.await.unwrap().expect("sent");
    }
    let queries = emulator.stats().calls(Rpc::QueryRoute);
    assert!((3..=4).contains(&queries), "{queries} QueryRoute calls");
}

#[tokio::test(start_paused = true)]
async fn the_producer_announces_its_settings_again_after_a_proxy_restart() {
    let mut emulator = emulator().await;
    let session = Session::new(support::config(&emulator)).unwrap();
    let producer = builder(&emulator)
        .session(Arc::clone(&session))
        .build()
        .unwrap();
    producer.start().await.expect("answered");
    let answers = producer.settings_answers();
    emulator.stop_serving().await.unwrap();
    assert!(emulator.clients().is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    emulator.resume_serving().await.unwrap();
    let id = session.client_id().to_owned();
    support::wait_for(
        "the settings announced again",
        Duration::from_secs(30),
        || emulator.clients().contains(&id),
    )
    .await;
    assert!(producer.settings_answers() > answers);
    // Heartbeats follow (the proxy refuses them without settings).
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(emulator.stats().calls(Rpc::Heartbeat) >= 2);
}

/// 100 sends a second for 30 s with the proxy down from 5 s to 15 s, a 60 s retry window,
/// with `budget`: how many sends failed, the `SendMessage` attempts, the retries deferred.
async fn steady_stream_through_an_outage(budget: RetryBudget) -> (usize, u64, u64) {
    let mut emulator = emulator().await;
    let producer = builder(&emulator)
        .retry_window(Duration::from_secs(60))
        .retry_budget(budget)
        .build()
        .expect("a valid budget");
    let producer = Arc::new(producer);
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    let started = tokio::time::Instant::now();
    let mut sends = Vec::new();
    for i in 0..3_000u32 {
        tokio::time::sleep_until(started + Duration::from_millis(10) * i).await;
        if i == 500 {
            emulator.stop_serving().await.expect("down");
        }
        if i == 1_500 {
            emulator.resume_serving().await.expect("up again");
        }
        let producer = Arc::clone(&producer);
        sends.push(tokio::spawn(async move {
            producer
                .send(OutgoingMessage::new(TOPIC, format!("m{i}")))
                .await
        }));
    }
    let mut failed = 0;
    for send in sends {
        failed += usize::from(send.await.expect("the task ends").is_err());
    }
    assert_eq!(emulator.stats().messages_stored as usize, 3_001 - failed);
    (
        failed,
        producer.send_attempts() - 1,
        producer.retries_deferred(),
    )
}

/// Through a 10 s outage under 100 sends a second, every send succeeds once the proxy is
/// back, and the retries keep to the budget. The bound on `SendMessage` requests: the 3,000
/// first attempts, plus the budget over the 30 s and one window before (20 % of 3,000 plus 10
/// a second for 40 s: 1,000), plus one retry each for the 1,000 sends waiting when the proxy
/// returns (woken by the first success, they go past the budget): 5,000. Without the budget
/// every send of the outage retries on its own back-off, up to every 2 s.
#[tokio::test(start_paused = true)]
async fn an_outage_under_a_steady_stream_keeps_to_the_retry_budget() {
    let (failed, attempts, deferred) =
        steady_stream_through_an_outage(RetryBudget::default()).await;
    println!(
        "with the budget: {attempts} SendMessage attempts for 3000 sends, {deferred} retries deferred"
    );
    assert_eq!(failed, 0, "every send succeeds once the proxy is back");
    assert!(attempts <= 5_000, "{attempts} attempts");
    assert!(deferred > 0);
    let (failed, unlimited, _) = steady_stream_through_an_outage(RetryBudget::unlimited()).await;
    println!("without: {unlimited} SendMessage attempts");
    assert_eq!(failed, 0);
    assert!(
        unlimited > 2 * attempts,
        "{unlimited} attempts without the budget"
    );
}

/// The builder makes a started producer in one expression, and refuses a bad setting with its
/// name before anything is sent.
#[tokio::test]
async fn the_builder_starts_a_producer_and_names_a_bad_setting() {
    let emulator = emulator().await;
    let producer = Producer::builder(support::config(&emulator))
        .topic("orders")
        .retry_window(Duration::from_secs(1))
        .max_attempts(2)
        .start()
        .await
        .expect("started");
    assert!(
        producer.settings_answers() >= 1,
        "the proxy answered before start returned"
    );
    assert_eq!(producer.retry_policy().max_attempts, 2);
    producer
        .send(OutgoingMessage::new("orders", "built"))
        .await
        .expect("sent");

    let err = Producer::builder(support::config(&emulator))
        .retry_budget(RetryBudget::default().ratio(-1.0))
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Invalid {
                what: "retry_budget",
                ..
            }
        ),
        "{err}"
    );

    // A shared session: the builder's config is not used for connections then.
    let session = Session::new(support::config(&emulator)).unwrap();
    let shared = Producer::builder(support::config(&emulator))
        .session(Arc::clone(&session))
        .build()
        .unwrap();
    shared
        .send(OutgoingMessage::new("orders", "shared"))
        .await
        .expect("sent over the shared session");
}

/// Sends `n` messages in tasks of their own, after the proxy went down: each retries within
/// the retry window (10 s by default).
async fn sends_in_flight(
    producer: &Arc<Producer>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<rocketmq_grpc::SendReceipt, Error>>> {
    let sends = (0..n)
        .map(|i| {
            let producer = Arc::clone(producer);
            tokio::spawn(async move {
                producer
                    .send(OutgoingMessage::new(TOPIC, format!("in flight {i}")))
                    .await
            })
        })
        .collect();
    // Their first attempts fail and they wait to retry.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sends
}

#[tokio::test(start_paused = true)]
async fn close_waits_for_a_send_in_flight_and_later_calls_fail_with_closed() {
    let mut emulator = emulator().await;
    let producer = Arc::new(producer(&emulator));
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    emulator.stop_serving().await.expect("down");
    let sends = sends_in_flight(&producer, 1).await;
    // The proxy comes back 3 s into the close, whose deadline is 30 s.
    let close_started = tokio::time::Instant::now();
    let (report, ()) = tokio::join!(producer.close(Duration::from_secs(30)), async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        emulator.resume_serving().await.expect("up again");
    });
    assert!(close_started.elapsed() >= Duration::from_secs(3));
    assert!(close_started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        (report.in_flight, report.finished, report.abandoned),
        (1, 1, 0),
        "{report:?}"
    );
    for send in sends {
        send.await
            .expect("the task ends")
            .expect("the send in flight finished before close returned");
    }
    assert_eq!(emulator.stats().messages_stored, 2);
    // Every later call fails with Closed, naming the producer, and is not retryable.
    let error = producer
        .send(OutgoingMessage::new(TOPIC, "after"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Closed("the producer")), "{error}");
    assert!(!error.is_retryable());
    assert_eq!(error.to_string(), "the producer is closed; build a new one");
    let error = producer
        .send_batch(vec![OutgoingMessage::new(TOPIC, "after")])
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Closed(_)), "{error}");
    let error = producer.start().await.unwrap_err();
    assert!(matches!(error, Error::Closed(_)), "{error}");
    assert_eq!(
        emulator.stats().messages_stored,
        2,
        "nothing sent after close"
    );
    // A second close returns at once with an empty report.
    let again_started = tokio::time::Instant::now();
    let again = producer.close(Duration::from_secs(30)).await;
    assert_eq!(again_started.elapsed(), Duration::ZERO);
    assert_eq!(
        (again.in_flight, again.finished, again.abandoned),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn close_abandons_the_sends_still_retrying_at_its_deadline() {
    let mut emulator = emulator().await;
    let producer = Arc::new(
        builder(&emulator)
            .retry_window(Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    emulator.stop_serving().await.expect("down");
    let sends = sends_in_flight(&producer, 3).await;
    let started = tokio::time::Instant::now();
    let report = producer.close(Duration::from_secs(2)).await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (report.in_flight, report.finished, report.abandoned),
        (3, 0, 3),
        "{report:?}"
    );
    for send in sends {
        let error = send.await.expect("the task ends").unwrap_err();
        assert!(matches!(error, Error::Closed("the producer")), "{error}");
    }
    // Well within the retry window: they ended because of the close.
    assert!(started.elapsed() < Duration::from_secs(3));
    emulator.resume_serving().await.expect("up again");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        emulator.stats().messages_stored,
        1,
        "no abandoned send went on"
    );
}

#[tokio::test(start_paused = true)]
async fn close_with_nothing_in_flight_returns_at_once() {
    let emulator = emulator().await;
    let producer = builder(&emulator)
        .transaction_checker(|_: rocketmq_grpc::ReceivedMessage| async {
            rocketmq_grpc::TransactionResolution::Unknown
        })
        .build()
        .unwrap();
    let open = producer.begin_transaction().expect("a transaction");
    producer
        .send(OutgoingMessage::new(TOPIC, "before"))
        .await
        .expect("sent");
    let started = tokio::time::Instant::now();
    let report = producer.close(Duration::from_secs(30)).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        (report.in_flight, report.finished, report.abandoned),
        (0, 0, 0)
    );
    let error = producer.begin_transaction().unwrap_err();
    assert!(matches!(error, Error::Closed("the producer")), "{error}");
    let error = open.rollback().await.unwrap_err();
    assert!(matches!(error, Error::Closed("the producer")), "{error}");
}
