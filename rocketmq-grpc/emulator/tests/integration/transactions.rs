//! Transactional messages against the emulator: a committed half message is delivered once, a
//! rolled-back one never, nothing before the commit; misuse gets errors that name it. (The real
//! proxy, orphan checks and the Java client: `tests/tests/rocketmq_transactions.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rocketmq_grpc::{
    ConsumeResult, Error, MessageHandler, OutgoingMessage, Producer, PushConsumer, ReceivedMessage,
    TransactionResolution,
};
use rocketmq_grpc_emulator::{Emulator, TopicKind};

use crate::support::{self, GROUP};

/// Counts the messages whose body is `committed`, and all others.
#[derive(Default)]
struct Count {
    committed: AtomicU64,
    others: AtomicU64,
}

#[async_trait::async_trait]
impl MessageHandler for Count {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let counter = if message.body() == "committed" {
            &self.committed
        } else {
            &self.others
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ConsumeResult::Success
    }
}

async fn emulator() -> Emulator {
    Emulator::builder()
        .topic("tx", TopicKind::Transaction, 2)
        .group(GROUP, false)
        .start()
        .await
        .expect("the emulator starts")
}

fn producer(emulator: &Emulator) -> Producer {
    Producer::builder(support::config(emulator))
        .transaction_checker(|_: ReceivedMessage| async { TransactionResolution::Unknown })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_committed_message_comes_once_and_a_rolled_back_one_never() {
    let emulator = emulator().await;
    let count = Arc::new(Count::default());
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("tx", "*")
        .handler(Arc::clone(&count))
        .build()
        .await
        .unwrap();
    let producer = producer(&emulator);
    let committed = producer.begin_transaction().unwrap();
    producer
        .send_in(&committed, OutgoingMessage::new("tx", "committed"))
        .await
        .unwrap();
    let rolled_back = producer.begin_transaction().unwrap();
    producer
        .send_in(&rolled_back, OutgoingMessage::new("tx", "rolled back"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        count.committed.load(Ordering::Relaxed),
        0,
        "held until the commit"
    );
    committed.commit().await.unwrap();
    rolled_back.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(count.committed.load(Ordering::Relaxed), 1);
    assert_eq!(count.others.load(Ordering::Relaxed), 0);
    let ended = committed.rollback().await.expect_err("ended");
    assert!(
        matches!(ended, Error::Invalid { .. }) && ended.to_string().contains("already committed"),
        "{ended}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_transaction_needs_a_checker_one_plain_message_and_its_own_producer() {
    let emulator = emulator().await;
    let plain = Producer::builder(support::config(&emulator))
        .build()
        .unwrap();
    let error = plain.begin_transaction().expect_err("no checker");
    assert!(error.to_string().contains("transaction_checker"), "{error}");
    let producer = producer(&emulator);
    let transaction = producer.begin_transaction().unwrap();
    let error = producer
        .send_in(
            &transaction,
            OutgoingMessage::new("tx", "x").message_group("g"),
        )
        .await
        .expect_err("FIFO");
    assert!(error.to_string().contains("message group"), "{error}");
    producer
        .send_in(&transaction, OutgoingMessage::new("tx", "one"))
        .await
        .unwrap();
    let error = producer
        .send_in(&transaction, OutgoingMessage::new("tx", "two"))
        .await
        .expect_err("a second message");
    assert!(
        error.to_string().contains("one message per transaction"),
        "{error}"
    );
    let error = self::producer(&emulator)
        .send_in(&transaction, OutgoingMessage::new("tx", "three"))
        .await
        .expect_err("another producer's");
    assert!(error.to_string().contains("another producer"), "{error}");
    // A plain send to a transactional topic is refused by the "proxy", as by the real one.
    let error = plain
        .send(OutgoingMessage::new("tx", "plain"))
        .await
        .expect_err("a normal message on a transactional topic");
    assert!(error.to_string().contains("TRANSACTION"), "{error}");
    transaction.rollback().await.unwrap();
    // Used after its end: every call names the transaction and says how it ended.
    for error in [
        transaction
            .commit()
            .await
            .expect_err("commit after rollback"),
        transaction.rollback().await.expect_err("rollback twice"),
        producer
            .send_in(&transaction, OutgoingMessage::new("tx", "late"))
            .await
            .expect_err("a send after the end"),
    ] {
        assert!(
            matches!(
                error,
                Error::Invalid {
                    what: "transaction",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("already rolled back"), "{error}");
    }
    // Ended without its message: a commit of an empty transaction is refused too.
    let empty = producer.begin_transaction().unwrap();
    let error = empty.commit().await.expect_err("nothing to commit");
    assert!(
        matches!(
            error,
            Error::Invalid {
                what: "transaction",
                ..
            }
        ),
        "{error}"
    );
}
