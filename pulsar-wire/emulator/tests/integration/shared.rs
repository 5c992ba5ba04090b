//! Shared subscriptions with several consumers (issue 27), client against emulator, in
//! virtual time: the emulator hands replays to any consumer, as a 4.0.8 broker does, so a
//! request that makes the broker replay what one consumer's application holds would hand
//! those messages to another consumer. The tests show that the client makes no such request:
//! no redelivery request without ids (the earlier client's resync when quiet), transactional
//! acks of a partly held batch held back until the batch is free or the commit, and, when
//! its count drifted, an unblock request that names no entry any consumer holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pulsar_wire::{
    Consumer, Error, InitialPosition, Message, OutgoingMessage, SubType, Transaction,
    sticky_key_hash,
};
use pulsar_wire_emulator::{ConflictEffects, EmulatorConfig, Stats};
use tokio::time::Instant;

use crate::support::{Setup, receive, send_all, within};

/// How long the holding consumer's application keeps its messages.
const HOLD: Duration = Duration::from_secs(8);

/// Long enough never to time out in a test, virtual time included.
const TXN_TIMEOUT: Duration = Duration::from_secs(3600);

/// Runs `test` on a current-thread runtime whose clock is paused (it moves on whenever
/// every task waits).
fn paused<F: Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(test);
}

/// Consumer `name` of subscription `sub` on `topic`, from the earliest message.
async fn consumer(setup: &Setup, topic: &str, name: &str, sub_type: SubType) -> Consumer {
    Consumer::builder(&setup.client, topic, "sub")
        .sub_type(sub_type)
        .name(name)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed")
}

fn payload(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

/// REDELIVER_UNACKNOWLEDGED_MESSAGES frames the emulator received on `topic`, without and
/// with ids, over the subscription's life.
fn redeliveries(stats: &Stats, topic: &str) -> (u64, u64) {
    stats.subscription(topic, "sub").map_or((0, 0), |s| {
        (s.redeliver_all_commands, s.redeliver_ids_commands)
    })
}

/// Receives on every consumer of `others` for `wait` (virtual time), acknowledging what
/// arrives; returns (consumer index, payload) of each message.
async fn keep_receiving(others: &[Consumer], wait: Duration) -> Vec<(usize, String)> {
    let deadline = Instant::now() + wait;
    let mut received = Vec::new();
    loop {
        let next = futures_util::future::select_all(
            others
                .iter()
                .enumerate()
                .map(|(i, c)| Box::pin(async move { (i, c.receive().await) })),
        );
        let Ok(((i, message), _, _)) = tokio::time::timeout_at(deadline, next).await else {
            return received;
        };
        let message = message.expect("received");
        others[i].ack(&message).await.expect("ack queued");
        received.push((i, payload(&message)));
    }
}

/// Issue 27, item 1: consumer A's application receives 10 messages and holds them for
/// [`HOLD`] while the other consumers keep receiving; none of the 10 may reach another
/// consumer. A subscribes alone and gets the 10 (`batched`: one entry of 10), then the others
/// subscribe and one more message goes to A (its turn in the round robin, which then points
/// at the next consumer): whatever A's client asked the broker to replay would go there. The
/// client asks for nothing (the earlier client's resync without ids, every few seconds when
/// quiet, handed the 10 to another consumer).
async fn held_messages_stay_with_their_consumer(batched: bool, sub_type: SubType, others: usize) {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "held";
    let a = consumer(&setup, topic, "a", sub_type).await;
    let producer = setup.producer(topic, if batched { 10 } else { 0 }).await;
    send_all(&producer, 10).await;
    let held: BTreeSet<String> = receive(&a, 10).await.iter().map(payload).collect();
    let mut rest = Vec::new();
    for i in 0..others {
        rest.push(consumer(&setup, topic, &format!("b{i}"), sub_type).await);
    }
    producer
        .send(OutgoingMessage::new("m10"))
        .await
        .expect("sent");
    let received = keep_receiving(&rest, HOLD).await;
    let handed: Vec<&(usize, String)> = received
        .iter()
        .filter(|(_, payload)| held.contains(payload))
        .collect();
    let stats = setup.stats();
    assert!(
        handed.is_empty(),
        "{} of the {} messages A holds reached another consumer: {handed:?}; \
         REDELIVER_UNACKNOWLEDGED_MESSAGES received (without ids, with ids): {:?}",
        handed.len(),
        held.len(),
        redeliveries(&stats, topic),
    );
}

#[test]
fn a_message_a_shared_consumer_holds_is_not_handed_to_another() {
    paused(held_messages_stay_with_their_consumer(
        false,
        SubType::Shared,
        1,
    ));
}

#[test]
fn a_batch_a_shared_consumer_holds_is_not_handed_to_another() {
    paused(held_messages_stay_with_their_consumer(
        true,
        SubType::Shared,
        1,
    ));
}

#[test]
fn a_message_one_of_three_shared_consumers_holds_is_not_handed_to_another() {
    paused(held_messages_stay_with_their_consumer(
        false,
        SubType::Shared,
        2,
    ));
}

/// Key_Shared replays keep their key's consumer (the broker sends a replayed entry to the
/// consumer of its hash), so A's held messages stay with A whatever its client asks; the
/// messages carry a key whose hash A keeps when the others join (AUTO_SPLIT as the emulator
/// does it: A keeps the first part of the hash space).
#[test]
fn a_message_a_key_shared_consumer_holds_is_not_handed_to_another() {
    paused(async {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = "held-keys";
        let a = consumer(&setup, topic, "a", SubType::KeyShared).await;
        let others = 2usize;
        // A key in A's part of the hash space once there are 3 consumers.
        let key = (0..)
            .map(|k| format!("k{k}"))
            .find(|k| {
                u64::from(sticky_key_hash(k.as_bytes())) * (others as u64 + 1)
                    < u64::from(pulsar_wire::KEY_HASH_RANGE_SIZE)
            })
            .expect("a key");
        let producer = setup.producer(topic, 0).await;
        for i in 0..10 {
            producer
                .send(OutgoingMessage::new(format!("m{i}")).key(key.clone()))
                .await
                .expect("sent");
        }
        let held: BTreeSet<String> = receive(&a, 10).await.iter().map(payload).collect();
        let mut rest = Vec::new();
        for i in 0..others {
            rest.push(consumer(&setup, topic, &format!("b{i}"), SubType::KeyShared).await);
        }
        producer
            .send(OutgoingMessage::new("m10").key(key))
            .await
            .expect("sent");
        let received = keep_receiving(&rest, HOLD).await;
        let handed: Vec<_> = received.iter().filter(|(_, p)| held.contains(p)).collect();
        assert!(handed.is_empty(), "{handed:?}");
    });
}

/// Issue 27, acceptance: an idle consumer sends nothing but flow permits and pings; over 60 s
/// (virtual) the broker receives no REDELIVER_UNACKNOWLEDGED_MESSAGES from it (the earlier
/// client resynced when quiet).
#[test]
fn an_idle_consumer_sends_no_redelivery_requests() {
    paused(async {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let idle = consumer(&setup, "idle", "a", SubType::Shared).await;
        assert!(
            within(Duration::from_secs(60), idle.receive())
                .await
                .is_none()
        );
        assert_eq!(redeliveries(&setup.stats(), "idle"), (0, 0));
    });
}

/// The abort shape of issue 27, with the client: A's application holds a batch of 10,
/// acknowledges one message in a transaction and aborts it (batch-index acks enabled, as in
/// the broker run). Had the ack reached the broker, a 4.0.8 broker's abort would replay the
/// whole entry to the consumer whose turn it is (the emulator rule test
/// `an_abort_replays_the_batch_to_another_consumer_while_the_holder_keeps_counting_it`
/// shows it with raw frames), and B would get the 10 messages A still holds. The client holds
/// a transactional ack of a batch its application partly holds back until the batch is free
/// or the transaction commits: the abort has nothing on the broker to undo, and B gets none
/// of the 10.
#[test]
fn an_aborted_transactional_ack_hands_no_held_message_to_another_consumer() {
    paused(async {
        let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
        let topic = "abort";
        let a = consumer(&setup, topic, "a", SubType::Shared).await;
        let b = consumer(&setup, topic, "b", SubType::Shared).await;
        let producer = setup.producer(topic, 10).await;
        send_all(&producer, 10).await;
        let held = receive(&a, 10).await;
        let txn = new_txn(&setup).await;
        a.ack_in(&txn, &held[0]).await.expect("acknowledged");
        txn.abort().await.expect("aborted");
        let received = keep_receiving(std::slice::from_ref(&b), HOLD).await;
        let held: BTreeSet<String> = held.iter().map(payload).collect();
        let handed: Vec<_> = received.iter().filter(|(_, p)| held.contains(p)).collect();
        assert!(
            handed.is_empty(),
            "{} of the 10 messages A holds reached B: {handed:?}",
            handed.len()
        );
    });
}

async fn new_txn(setup: &Setup) -> Transaction {
    setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator")
        .new_transaction(TXN_TIMEOUT)
        .await
        .expect("a transaction")
}

/// What the steady shape with several consumers did.
#[derive(Debug, Default)]
struct SteadyReport {
    produced: usize,
    /// Payloads committed, with how many commits included each.
    committed: BTreeMap<String, u32>,
    /// Per payload, the consumers that received it.
    received_by: HashMap<String, BTreeSet<usize>>,
    commits: u64,
    aborts: u64,
    /// Transactional acks the broker (or the client) refused.
    acks_refused: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES the emulator received (without ids, with ids).
    redeliveries: (u64, u64),
    /// Unacked counts and backlog at the end.
    unacked: Vec<i64>,
    backlog: u64,
    times_blocked: u64,
}

impl SteadyReport {
    fn committed_twice(&self) -> usize {
        self.committed.values().filter(|n| **n > 1).count()
    }

    fn received_by_two(&self) -> usize {
        self.received_by.values().filter(|c| c.len() > 1).count()
    }
}

/// The steady shape of issue 27 with `consumers` Shared consumers, scaled down: limit 37,
/// producer batches of 13, each consumer acknowledges every message it receives in a
/// transaction (6 acks per transaction), every 4th of its transactions aborted (the broker
/// replays those messages, to any consumer, and they are acknowledged again later), a
/// transaction with a refused ack aborted. Runs until every payload is committed or 120 s of
/// virtual time pass.
async fn steady(consumers: usize, batches: usize) -> SteadyReport {
    let setup = Setup::new(
        EmulatorConfig::default()
            .batch_index_ack(true)
            .conflict_effects(ConflictEffects::AsBroker),
    )
    .await;
    let topic = "steady";
    setup.emulator.create_topic(topic, 0).expect("created");
    setup
        .emulator
        .set_max_unacked_messages(topic, 37)
        .expect("the limit");
    let mut all = Vec::new();
    for i in 0..consumers {
        all.push(Arc::new(
            consumer(&setup, topic, &format!("c{i}"), SubType::Shared).await,
        ));
    }
    let producer = setup.producer(topic, 13).await;
    let produced = batches * 13;
    let sending = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(43));
        for batch in 0..batches {
            tick.tick().await;
            let sends = (0..13).map(|i| {
                let producer = producer.clone();
                async move {
                    producer
                        .send(OutgoingMessage::new(format!("p{}", batch * 13 + i)))
                        .await
                }
            });
            for sent in futures_util::future::join_all(sends).await {
                sent.expect("sent");
            }
        }
    });
    let report = Arc::new(Mutex::new(SteadyReport {
        produced,
        ..SteadyReport::default()
    }));
    let coordinator = setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator")
        .clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut tasks = Vec::new();
    for (index, consumer) in all.iter().enumerate() {
        let consumer = Arc::clone(consumer);
        let report = Arc::clone(&report);
        let coordinator = coordinator.clone();
        tasks.push(tokio::spawn(async move {
            let mut ended = 0usize;
            let mut batch = Vec::new();
            loop {
                if report.lock().committed.len() >= produced || Instant::now() >= deadline {
                    return;
                }
                match within(Duration::from_millis(200), consumer.receive()).await {
                    Some(message) => {
                        let message = message.expect("received");
                        report
                            .lock()
                            .received_by
                            .entry(payload(&message))
                            .or_default()
                            .insert(index);
                        batch.push(message);
                        if batch.len() < 6 {
                            continue;
                        }
                    }
                    None if batch.is_empty() => continue,
                    None => {}
                }
                let txn = coordinator
                    .new_transaction(TXN_TIMEOUT)
                    .await
                    .expect("a transaction");
                txn.add_subscription(consumer.topic(), "sub")
                    .await
                    .expect("registered");
                let acks = futures_util::future::join_all(
                    batch.iter().map(|message| consumer.ack_in(&txn, message)),
                )
                .await;
                let refused = acks.iter().filter(|a| a.is_err()).count() as u64;
                ended += 1;
                let abort = refused > 0 || ended.is_multiple_of(4);
                let payloads: Vec<String> = batch.drain(..).map(|m| payload(&m)).collect();
                let outcome: Result<(), Error> = if abort {
                    txn.abort().await
                } else {
                    txn.commit().await
                };
                let mut report = report.lock();
                report.acks_refused += refused;
                match (abort, outcome) {
                    (false, Ok(())) => {
                        report.commits += 1;
                        for payload in payloads {
                            *report.committed.entry(payload).or_default() += 1;
                        }
                    }
                    _ => report.aborts += 1,
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("the consumer's task");
    }
    sending.await.expect("the producer's task");
    for consumer in &all {
        consumer.flush_acks().await;
    }
    let stats = setup.stats();
    let mut report = Arc::try_unwrap(report)
        .map(Mutex::into_inner)
        .unwrap_or_default();
    report.redeliveries = redeliveries(&stats, topic);
    if let Some(sub) = stats.subscription(topic, "sub") {
        report.unacked = sub.consumers.iter().map(|c| c.unacked).collect();
        report.backlog = sub.backlog;
        report.times_blocked = sub.consumers.iter().map(|c| c.times_blocked).sum();
    }
    report.produced = produced;
    report
}

fn assert_steady(report: &SteadyReport) {
    let summary = format!(
        "produced {}, committed {} (twice: {}), received by two consumers {}, commits {}, \
         aborts {}, acks refused {}, redeliveries {:?}, unacked {:?}, backlog {}, blocked {} \
         times",
        report.produced,
        report.committed.len(),
        report.committed_twice(),
        report.received_by_two(),
        report.commits,
        report.aborts,
        report.acks_refused,
        report.redeliveries,
        report.unacked,
        report.backlog,
        report.times_blocked
    );
    assert_eq!(report.committed.len(), report.produced, "{summary}");
    assert_eq!(report.committed_twice(), 0, "{summary}");
    assert_eq!(report.redeliveries.0, 0, "no blind resync: {summary}");
    assert!(report.unacked.iter().all(|n| *n == 0), "{summary}");
    assert_eq!(report.backlog, 0, "{summary}");
}

/// Issue 27, item 2, two consumers: every payload committed exactly once, no redelivery
/// request without ids, nothing left unacknowledged and no backlog.
#[test]
fn the_steady_shape_with_two_consumers_commits_each_payload_once() {
    paused(async {
        let report = steady(2, 30).await;
        assert_steady(&report);
    });
}

/// The same with three consumers.
#[test]
fn the_steady_shape_with_three_consumers_commits_each_payload_once() {
    paused(async {
        let report = steady(3, 30).await;
        assert_steady(&report);
    });
}
