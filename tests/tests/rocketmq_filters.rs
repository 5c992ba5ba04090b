//! Subscription filters through our consumers on a real proxy (`scripts/brokers/rocketmq
//! start`, topic `sql-normal`; the broker runs with `enablePropertyFilter=true`): a SQL92
//! expression and a tag expression pick exactly the messages they name, for the push and the
//! simple consumer; an expression the broker cannot parse fails the receive with an error that
//! names it. (The raw answers, against the emulator too: `rocketmq_differential.rs`.)
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set; otherwise every test returns at once.

use integration_tests::real_rocketmq::{endpoint, unique};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, FilterExpression, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage, SimpleConsumer,
};

const TOPIC: &str = "sql-normal";

/// Sends 12 messages of run `run`: property `n` = 0..12, tag `a`, `b` or `c` by `n % 3`.
async fn send_run(endpoint: &str, run: &str) {
    let producer = Producer::builder(ClientConfig::new(endpoint).unwrap())
        .topic(TOPIC)
        .start()
        .await
        .expect("the producer starts");
    for n in 0..12 {
        let tag = ["a", "b", "c"][n % 3];
        producer
            .send(
                OutgoingMessage::new(TOPIC, format!("{run} {n}"))
                    .tag(tag)
                    .property("run", run)
                    .property("n", n.to_string()),
            )
            .await
            .expect("sent");
    }
}

fn n_of(message: &ReceivedMessage) -> u32 {
    message.properties()["n"].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql92_filter_gives_the_push_consumer_only_what_it_names() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let run = unique("sql");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |message: ReceivedMessage| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().push(message);
                ConsumeResult::Success
            }
        }
    };
    let consumer = PushConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        unique("it-sql-push").as_str(),
    )
    .subscribe(
        TOPIC,
        FilterExpression::sql92(format!("run = '{run}' AND n > 5 AND TAGS <> 'c'")),
    )
    .handler(handler)
    .build()
    .await
    .expect("the consumer starts");
    send_run(&endpoint, &run).await;
    // 6, 7, 9, 10 (8 and 11 have tag c).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.lock().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", seen.lock());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Anything else would come within the same receives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut ns: Vec<u32> = seen.lock().iter().map(n_of).collect();
    ns.sort_unstable();
    assert_eq!(ns, [6, 7, 9, 10]);
    consumer.close(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_give_the_simple_consumer_only_what_they_name() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let run = unique("filters");
    let sql = SimpleConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        unique("it-sql-simple").as_str(),
    )
    .subscribe(
        TOPIC,
        FilterExpression::sql92(format!("run = '{run}' AND n BETWEEN 2 AND 4")),
    )
    .await_duration(Duration::from_secs(5))
    .build()
    .await
    .expect("the simple consumer starts");
    // A tag filter: the run's messages of tag b (others of the topic also have tags; they are
    // counted only when of this run).
    let tags = SimpleConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        unique("it-tag-simple").as_str(),
    )
    .subscribe(TOPIC, FilterExpression::tag("b"))
    .await_duration(Duration::from_secs(5))
    .build()
    .await
    .expect("the simple consumer starts");
    send_run(&endpoint, &run).await;
    for (consumer, want, tag) in [
        (&sql, vec![2, 3, 4], None),
        (&tags, vec![1, 4, 7, 10], Some("b")),
    ] {
        let mut ns = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while ns.len() < want.len() {
            assert!(tokio::time::Instant::now() < deadline, "{ns:?}");
            for message in consumer.receive(32, Duration::from_secs(30)).await.unwrap() {
                if message.properties().get("run") == Some(&run) {
                    if tag.is_some() {
                        assert_eq!(message.tag(), tag, "{message:?}");
                    }
                    ns.push(n_of(&message));
                }
                consumer.ack(&message).await.unwrap();
            }
        }
        ns.sort_unstable();
        assert_eq!(ns, want);
    }
    sql.close(Duration::from_secs(5)).await;
    tags.close(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expression_the_broker_cannot_parse_fails_the_receive_naming_it() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let consumer = SimpleConsumer::builder(
        ClientConfig::new(&endpoint).unwrap(),
        unique("it-sql-bad").as_str(),
    )
    .subscribe(TOPIC, FilterExpression::sql92("n >>> 1"))
    .await_duration(Duration::from_secs(5))
    .build()
    .await
    .expect("the proxy takes the settings; the receive finds the expression bad");
    let err = consumer
        .receive(32, Duration::from_secs(30))
        .await
        .expect_err("an unparsable expression");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("n >>> 1"), "{err}");
    consumer.close(Duration::from_secs(5)).await;
}
