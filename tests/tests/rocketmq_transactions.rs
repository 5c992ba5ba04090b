//! Transactional messages on a real proxy (`scripts/brokers/rocketmq start`, topic `it-txn`
//! of type TRANSACTION, transactions left open checked every 5 s once 6 s old), with the
//! official Java 5 client (`scripts/java-peers`, `RocketMqTransaction`) on the other side.
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set; otherwise every test returns at once.

use integration_tests::real_rocketmq::{endpoint, wait_for};
use std::sync::Arc;
use std::time::Duration;

use integration_tests::real_pulsar::java_peer;
use parking_lot::Mutex;
use rocketmq_grpc::{
    ClientConfig, ConsumeResult, Error, MessageHandler, OutgoingMessage, Producer, PushConsumer,
    ReceivedMessage, TransactionResolution,
};

const TOPIC: &str = "it-txn";

/// Records every delivery it sees: the body, the message id and the delivery attempt.
#[derive(Default)]
struct Bodies(Mutex<Vec<(String, String, i32)>>);

#[async_trait::async_trait]
impl MessageHandler for Bodies {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        self.0.lock().push((
            String::from_utf8_lossy(message.body()).into_owned(),
            message.message_id().to_owned(),
            message.delivery_attempt(),
        ));
        ConsumeResult::Success
    }
}

impl Bodies {
    fn count(&self, body: &str) -> usize {
        self.0.lock().iter().filter(|seen| seen.0 == body).count()
    }

    /// The deliveries of `body`: (message id, delivery attempt) each, for failure messages (a
    /// redelivery after a lost ack has the same id and a higher attempt; a second message has
    /// attempt 1).
    fn deliveries(&self, body: &str) -> Vec<(String, i32)> {
        let seen = self.0.lock();
        seen.iter()
            .filter(|seen| seen.0 == body)
            .map(|seen| (seen.1.clone(), seen.2))
            .collect()
    }
}

/// A consumer of the topic with a new group, started before anything is sent.
async fn consumer(endpoint: &str, name: &str) -> (PushConsumer, Arc<Bodies>) {
    let bodies = Arc::new(Bodies::default());
    let group = format!("it-txn-{name}-{}", std::process::id());
    let consumer = PushConsumer::builder(ClientConfig::new(endpoint).unwrap(), group.as_str())
        .subscribe(TOPIC, "*")
        .handler(Arc::clone(&bodies))
        .build()
        .await
        .expect("the consumer starts against the real proxy");
    (consumer, bodies)
}

/// A producer whose checker commits the bodies in `commit` and answers `Unknown` for the rest
/// (the broker asks again later).
fn producer(endpoint: &str, commit: Vec<String>) -> Producer {
    let commit = Arc::new(commit);
    Producer::builder(ClientConfig::new(endpoint).unwrap())
        .topic(TOPIC)
        .transaction_checker(move |message: ReceivedMessage| {
            let commit = Arc::clone(&commit);
            async move {
                let body = String::from_utf8_lossy(message.body()).into_owned();
                if commit.contains(&body) {
                    TransactionResolution::Commit
                } else {
                    TransactionResolution::Unknown
                }
            }
        })
        .build()
        .unwrap()
}

/// Ours and the Java client's: a committed message is delivered once, a rolled-back one never
/// (not even after the broker's checks would have asked about it: 15 s later).
///
/// Our producer's checker answers `Unknown`, so only the explicit ends decide. It used to
/// commit both bodies ("only the explicit ends may decide"); one CI run under load then
/// received `ours-commit` twice. The broker checks a transaction every 5 s once it is 6 s old,
/// so an end that is slow under load can race a check whose answer also commits; whether that
/// was the cause is not proven (the failure messages now show each delivery's id and attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_message_comes_once_and_a_rolled_back_one_never() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let (consumer, bodies) = consumer(&endpoint, "ends").await;
    let run = std::process::id();
    let [ours_commit, ours_rollback, java_commit, java_rollback] = [
        "ours-commit",
        "ours-rollback",
        "java-commit",
        "java-rollback",
    ]
    .map(|name| format!("{name}-{run}"));
    // The checker decides nothing: only the explicit ends may decide.
    let producer = producer(&endpoint, Vec::new());
    let committed = producer.begin_transaction().unwrap();
    producer
        .send_in(&committed, OutgoingMessage::new(TOPIC, ours_commit.clone()))
        .await
        .expect("the half message");
    let rolled_back = producer.begin_transaction().unwrap();
    producer
        .send_in(
            &rolled_back,
            OutgoingMessage::new(TOPIC, ours_rollback.clone()),
        )
        .await
        .expect("the half message");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(bodies.count(&ours_commit), 0, "invisible before the commit");
    committed.commit().await.expect("committed");
    rolled_back.rollback().await.expect("rolled back");
    for (body, end) in [(&java_commit, "commit"), (&java_rollback, "rollback")] {
        let printed = java_peer("RocketMqTransaction", &[&endpoint, TOPIC, body, end]).await;
        assert!(printed.contains(&format!("ended={end}")), "{printed}");
    }
    wait_for("both committed messages", Duration::from_secs(60), || {
        bodies.count(&ours_commit) == 1 && bodies.count(&java_commit) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    for body in [&ours_commit, &java_commit] {
        assert_eq!(
            bodies.count(body),
            1,
            "{body} once; its deliveries (id, attempt): {:?}",
            bodies.deliveries(body)
        );
    }
    for body in [&ours_rollback, &java_rollback] {
        assert_eq!(
            bodies.count(body),
            0,
            "{body} never; its deliveries (id, attempt): {:?}",
            bodies.deliveries(body)
        );
    }
    // Used after its end, a transaction says so.
    for result in [
        committed.commit().await,
        committed.rollback().await,
        producer
            .send_in(&committed, OutgoingMessage::new(TOPIC, "late"))
            .await
            .map(|_| ()),
    ] {
        let error = result.expect_err("the transaction has ended");
        assert!(
            matches!(&error, Error::Invalid { .. })
                && error.to_string().contains("already committed"),
            "{error}"
        );
    }
    consumer.close(Duration::from_secs(5)).await;
}

/// Transactions left open by producers that went away before ending them (ours dropped, the
/// Java client halted) are decided by the checker of a producer started afterwards: the
/// broker checks them, the proxy asks the new producer, it commits, and each message is
/// delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_transaction_is_committed_by_the_checker_of_a_restarted_producer() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let (consumer, bodies) = consumer(&endpoint, "orphans").await;
    let run = std::process::id();
    let ours = format!("ours-orphan-{run}");
    let java = format!("java-orphan-{run}");
    {
        let crashed = producer(&endpoint, Vec::new());
        let transaction = crashed.begin_transaction().unwrap();
        crashed
            .send_in(&transaction, OutgoingMessage::new(TOPIC, ours.clone()))
            .await
            .expect("the half message");
        // Dropped without an end: the producer's tasks stop, as if the process died.
    }
    let printed = java_peer("RocketMqTransaction", &[&endpoint, TOPIC, &java, "orphan"]).await;
    assert!(printed.contains("ended=orphan"), "{printed}");
    let restarted = producer(&endpoint, vec![ours.clone(), java.clone()]);
    restarted
        .start()
        .await
        .expect("the restarted producer's settings");
    wait_for(
        "both orphans, committed by the checker",
        Duration::from_secs(90),
        || bodies.count(&ours) == 1 && bodies.count(&java) == 1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        (bodies.count(&ours), bodies.count(&java)),
        (1, 1),
        "once each"
    );
    consumer.close(Duration::from_secs(5)).await;
}

/// Bad input: a producer without a checker cannot begin a transaction; a transactional
/// message cannot be FIFO; a transaction takes one message; another producer's transaction
/// is refused. Each error names what was wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misused_transactions_get_errors_that_name_the_problem() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let error = Producer::builder(ClientConfig::new(&endpoint).unwrap())
        .build()
        .unwrap()
        .begin_transaction()
        .expect_err("no checker");
    assert!(error.to_string().contains("transaction_checker"), "{error}");
    let producer = producer(&endpoint, Vec::new());
    let transaction = producer.begin_transaction().unwrap();
    let error = producer
        .send_in(
            &transaction,
            OutgoingMessage::new(TOPIC, "fifo").message_group("g"),
        )
        .await
        .expect_err("FIFO");
    assert!(error.to_string().contains("message group"), "{error}");
    let first = producer
        .send_in(&transaction, OutgoingMessage::new(TOPIC, "first"))
        .await
        .expect("the half message");
    let error = producer
        .send_in(&transaction, OutgoingMessage::new(TOPIC, "second"))
        .await
        .expect_err("a second message");
    assert!(
        error.to_string().contains("one message per transaction")
            && error.to_string().contains(first.message_id()),
        "{error}"
    );
    let other = self::producer(&endpoint, Vec::new());
    let error = other
        .send_in(&transaction, OutgoingMessage::new(TOPIC, "elsewhere"))
        .await
        .expect_err("another producer's transaction");
    assert!(error.to_string().contains("another producer"), "{error}");
    // A plain send to a transactional topic is refused by the proxy.
    let error = other
        .send(OutgoingMessage::new(TOPIC, "plain"))
        .await
        .expect_err("a normal message on a transactional topic");
    assert!(error.to_string().contains("TRANSACTION"), "{error}");
    transaction.rollback().await.expect("rolled back");
}
