//! Shared and Key_Shared subscriptions with several consumers on a real broker
//! (`scripts/brokers/pulsar start`): what one consumer's application holds is never handed to
//! another because of a request the client made.
//!
//! On a 4.0.x broker a replay goes to *any* consumer of a Shared subscription with permits: a
//! redelivery request without ids (everything the consumer holds), a negative ack of a batch
//! entry or the abort of a transactional ack of part of a batch (the whole entry, the messages
//! the application still holds included). These tests hold messages in one consumer while
//! others keep receiving, and check that none of the held ones reach the others.
//!
//! Runs when `PULSAR_SERVICE_URL` and `PULSAR_ADMIN_URL` are set; otherwise every test returns
//! at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use broker_tools::pulsar_admin::PulsarAdmin;
use integration_tests::real_pulsar::RealPulsar;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, ConsumerOptions, InitialPosition, Message, OutgoingMessage,
    Producer, ProducerOptions, SubType, Transaction,
};

const SUB: &str = "sub";
const PATIENCE: Duration = Duration::from_secs(15);

/// A client, the admin API and a fresh topic with its per-consumer unacked limit.
struct Broker {
    client: Client,
    admin: PulsarAdmin,
    topic: String,
    started: Instant,
    scenario: String,
}

async fn broker(scenario: &str, limit: u32) -> Option<Broker> {
    let RealPulsar {
        client,
        admin,
        topic,
        ..
    } = RealPulsar::new(&format!("shared-{scenario}"), 0).await?;
    admin
        .set_max_unacked_on_consumer(&topic, limit, Duration::from_secs(60))
        .await
        .expect("the per-topic limit is set");
    Some(Broker {
        client,
        admin,
        topic,
        started: Instant::now(),
        scenario: scenario.to_owned(),
    })
}

impl Broker {
    async fn consumer(&self, name: &str, options: ConsumerOptions) -> Consumer {
        Consumer::builder(&self.client, &self.topic, SUB)
            .options(
                options
                    .name(name)
                    .initial_position(InitialPosition::Earliest)
                    .ack_group_time(Duration::from_millis(10)),
            )
            .build()
            .await
            .expect("subscribed")
    }

    /// A producer batching `per_batch` messages (0: none; key-based batches for keyed
    /// messages).
    async fn producer(&self, per_batch: usize) -> Producer {
        let options = if per_batch == 0 {
            ProducerOptions::default().no_batching()
        } else {
            ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(per_batch)
                    .max_delay(Duration::from_millis(50))
                    .key_based(true),
            )
        };
        Producer::builder(&self.client, &self.topic)
            .options(options)
            .build()
            .await
            .expect("producer created")
    }

    async fn new_txn(&self) -> Transaction {
        self.client
            .transaction_coordinator()
            .await
            .expect("the coordinator")
            .new_transaction(Duration::from_secs(60))
            .await
            .expect("a transaction")
    }

    /// Waits until nothing is unacknowledged or in the backlog, consumers connected.
    async fn assert_drained(&self) {
        self.admin
            .wait_for_stats(&self.topic, PATIENCE, |stats| {
                stats
                    .subscription(SUB)
                    .is_some_and(|s| !s.consumers.is_empty() && s.is_drained())
            })
            .await
            .unwrap_or_else(|e| panic!("{}: not drained: {e}", self.scenario));
    }

    fn done(&self) {
        println!("{}: passed in {:?}", self.scenario, self.started.elapsed());
    }
}

fn payload(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

/// Sends `count` messages `{prefix}{i}`, with `keys` keys in turn (0: no key), all at once.
async fn send(producer: &Producer, prefix: &str, count: usize, keys: usize) {
    let sends = (0..count).map(|i| {
        let mut message = OutgoingMessage::new(format!("{prefix}{i}"));
        if keys > 0 {
            message = message.key(format!("k{}", i % keys));
        }
        producer.send(message)
    });
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
}

/// Receives `count` messages, each within [`PATIENCE`].
async fn receive(consumer: &Consumer, count: usize) -> Vec<Message> {
    let mut messages = Vec::with_capacity(count);
    for i in 0..count {
        let message = tokio::time::timeout(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|_| panic!("message {i} of {count} did not arrive"))
            .expect("received");
        messages.push(message);
    }
    messages
}

/// Receives and acknowledges everything that arrives until `until`, returning the payloads.
async fn take_until(consumer: &Consumer, until: Instant) -> Vec<String> {
    let mut payloads = Vec::new();
    while let Ok(Ok(message)) = tokio::time::timeout_at(until.into(), consumer.receive()).await {
        consumer.ack(&message).await.expect("ack queued");
        payloads.push(payload(&message));
    }
    payloads
}

/// One consumer (A) takes `held` messages and holds them unacknowledged for 8 s while
/// `others` more consumers subscribe and take everything else that is sent meanwhile; then A
/// acknowledges them. None of A's messages may reach the others while A holds them.
async fn hold(scenario: &str, others: usize, sub_type: SubType, per_batch: usize, keys: usize) {
    let Some(broker) = broker(scenario, 100).await else {
        return;
    };
    let options = || integration_tests::real_pulsar::consumer_options().sub_type(sub_type);
    // A small receiver queue: A takes what it holds and a few more, then gets nothing new
    // (a consumer that gets nothing for a while is where a client might "repair" things).
    let a = broker
        .consumer("A", options().receiver_queue_size(10))
        .await;
    let producer = broker.producer(per_batch).await;
    let held_count = 10;
    send(&producer, "held-", held_count, keys).await;
    let held = receive(&a, held_count).await;
    let held_payloads: HashSet<String> = held.iter().map(payload).collect();
    let mut rest = Vec::new();
    for i in 0..others {
        rest.push(broker.consumer(&format!("B{i}"), options()).await);
    }
    // The others keep receiving while A holds its messages for 8 s.
    let until = Instant::now() + Duration::from_secs(8);
    let sending = async {
        for wave in 0..4 {
            send(&producer, &format!("more{wave}-"), 10, keys).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let taking = futures_util::future::join_all(rest.iter().map(|c| take_until(c, until)));
    let ((), taken) = tokio::join!(sending, taking);
    let reached: Vec<&String> = taken
        .iter()
        .flatten()
        .filter(|p| held_payloads.contains(*p))
        .collect();
    assert!(
        reached.is_empty(),
        "{scenario}: {} of the {held_count} messages A held reached another consumer: {reached:?} \
         (A's stats {:?})",
        reached.len(),
        a.stats()
    );
    // A lets go; everything drains.
    for message in &held {
        a.ack(message).await.expect("ack queued");
    }
    let until = Instant::now() + Duration::from_secs(3);
    let mut all = futures_util::future::join_all(
        std::iter::once(&a)
            .chain(&rest)
            .map(|c| take_until(c, until)),
    )
    .await
    .concat();
    all.extend(taken.into_iter().flatten());
    all.extend(held_payloads);
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(
        distinct.len(),
        held_count + 40,
        "{scenario}: every payload arrived"
    );
    assert_eq!(a.stats().redelivery_requests, 0, "{:?}", a.stats());
    broker.assert_drained().await;
    broker.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_batch_stays_with_its_consumer_of_two() {
    hold("hold-batched-2", 1, SubType::Shared, 10, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_messages_stay_with_their_consumer_of_two() {
    hold("hold-unbatched-2", 1, SubType::Shared, 0, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_batch_stays_with_its_consumer_of_three() {
    hold("hold-batched-3", 2, SubType::Shared, 10, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_keys_stay_with_their_key_shared_consumer() {
    // Two keys in batches of 5, and ten keys one by one.
    hold("hold-key-shared-batched", 2, SubType::KeyShared, 5, 2).await;
    hold("hold-key-shared", 2, SubType::KeyShared, 0, 10).await;
}

/// The probe of the broker rule behind held-back transactional acks, with this client: A
/// holds a batch of 10, acknowledges one message of it in a transaction and aborts. The
/// broker would send the whole batch to B; the client never put the ack on the broker, so
/// nothing moves, and A's application gets the aborted message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_of_part_of_a_held_batch_hands_nothing_to_another_consumer() {
    let Some(broker) = broker("abort-part", 100).await else {
        return;
    };
    let options = || integration_tests::real_pulsar::consumer_options().sub_type(SubType::Shared);
    let a = broker.consumer("A", options()).await;
    let producer = broker.producer(10).await;
    send(&producer, "m", 10, 0).await;
    let held = receive(&a, 10).await;
    assert!(
        held.iter()
            .all(|m| m.id().entry_id() == held[0].id().entry_id()),
        "one batch"
    );
    let b = broker.consumer("B", options()).await;
    let txn = broker.new_txn().await;
    a.ack_in(&txn, &held[0])
        .await
        .expect("acked in the transaction");
    txn.abort().await.expect("aborted");
    let again = receive(&a, 1).await.remove(0);
    assert_eq!(again.id(), held[0].id());
    assert_eq!(again.redelivery_count(), held[0].redelivery_count() + 1);
    let to_b = take_until(&b, Instant::now() + Duration::from_secs(3)).await;
    assert!(to_b.is_empty(), "B received {to_b:?}");
    // Now all ten in one transaction: the last frees the batch, and they all commit.
    let txn = broker.new_txn().await;
    for message in std::iter::once(&again).chain(&held[1..]) {
        a.ack_in(&txn, message).await.expect("acked");
    }
    txn.commit().await.expect("committed");
    let stats = a.stats();
    assert_eq!(stats.txn_acks, 10, "{stats:?}");
    assert_eq!(stats.redelivery_requests, 0, "{stats:?}");
    broker.assert_drained().await;
    broker.done();
}

/// An idle consumer, holding a few messages, sends nothing but flow permits (and pings) for
/// a minute: no redelivery request of any kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_sends_no_redelivery_requests() {
    let Some(broker) = broker("idle", 100).await else {
        return;
    };
    let a = broker
        .consumer(
            "A",
            integration_tests::real_pulsar::consumer_options().sub_type(SubType::Shared),
        )
        .await;
    let producer = broker.producer(5).await;
    send(&producer, "m", 20, 0).await;
    let messages = receive(&a, 20).await;
    // Five held, the rest acknowledged.
    for message in &messages[5..] {
        a.ack(message).await.expect("ack queued");
    }
    a.flush_acks().await;
    let idle = Instant::now() + Duration::from_secs(60);
    assert!(take_until(&a, idle).await.is_empty());
    let stats = a.stats();
    assert_eq!(stats.redelivery_requests, 0, "{stats:?}");
    for message in &messages[..5] {
        a.ack(message).await.expect("ack queued");
    }
    broker.assert_drained().await;
    broker.done();
}

/// A consumer whose unacked count on the broker drifted above what it holds (another client's
/// abort replayed a batch it held: here a transactional ack sent raw, past this client) and
/// reached the limit is unblocked without anything being replayed: every later message
/// arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_consumer_is_unblocked_without_a_replay() {
    let Some(broker) = broker("drifted", 15).await else {
        return;
    };
    let a = broker
        .consumer(
            "A",
            integration_tests::real_pulsar::consumer_options().sub_type(SubType::Shared),
        )
        .await;
    let producer = broker.producer(10).await;
    send(&producer, "held-", 10, 0).await;
    let held = receive(&a, 10).await;
    let txn = broker.new_txn().await;
    pulsar_wire_emulator::legacy::txn_ack_with_batch_size(&a, &txn, &held[0])
        .await
        .expect("the raw ack is accepted");
    txn.abort().await.expect("aborted");
    // The abort replays the batch to A (the only consumer): counted again, 19 of 15.
    broker
        .admin
        .wait_for_stats(&broker.topic, PATIENCE, |stats| {
            stats.subscription(SUB).is_some_and(|s| {
                s.consumers
                    .iter()
                    .any(|c| c.blocked_consumer_on_unacked_msgs && c.unacked_messages >= 15)
            })
        })
        .await
        .expect("A is blocked with a drifted count");
    for message in &held {
        a.ack(message).await.expect("ack queued");
    }
    send(&producer, "later-", 30, 0).await;
    let mut later = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while later.len() < 30 {
        let message = tokio::time::timeout_at(deadline.into(), a.receive())
            .await
            .unwrap_or_else(|_| panic!("{} of 30 arrived; {:?}", later.len(), a.stats()))
            .expect("received");
        let text = payload(&message);
        assert!(text.starts_with("later-"), "replayed: {text}");
        a.ack(&message).await.expect("ack queued");
        later.insert(text);
    }
    let stats = a.stats();
    assert!(stats.unblocks >= 1, "{stats:?}");
    assert_eq!(stats.redelivery_requests, stats.unblocks, "{stats:?}");
    broker.done();
}

/// What no client request can prevent: a consumer's registration ends (here its topic is
/// unloaded) and the broker gives everything it held to any consumer. The application of the
/// old registration still holds those messages; `held_elsewhere` says which may be with
/// another consumer now (exactly those no copy of came back), and a transactional ack of one
/// fails the commit instead of committing it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_lost_registration_held_is_said_to_be_held_elsewhere() {
    // A paused (no permits after it subscribes again): the batch goes to B.
    let elsewhere = lost_registration("lost-registration-paused", true).await;
    assert!(elsewhere.is_none_or(|n| n == 10), "{elsewhere:?}");
    // A with permits: whoever subscribes first gets it.
    lost_registration("lost-registration", false).await;
}

/// Returns how many of the 10 messages A held are said to be held elsewhere.
async fn lost_registration(scenario: &str, pause_a: bool) -> Option<usize> {
    let broker = broker(scenario, 100).await?;
    let options = || integration_tests::real_pulsar::consumer_options().sub_type(SubType::Shared);
    let a = broker
        .consumer("A", options().receiver_queue_size(10))
        .await;
    let producer = broker.producer(10).await;
    send(&producer, "held-", 10, 0).await;
    let held = receive(&a, 10).await;
    let b = broker.consumer("B", options()).await;
    assert!(
        held.iter()
            .all(|m| !a.held_elsewhere(m).expect("A's message"))
    );
    if pause_a {
        a.pause();
    }
    broker.admin.unload(&broker.topic).await.expect("unloaded");
    // Both consumers subscribe again; the broker dispatches the batch again, to A or B.
    let to_b = take_until(&b, Instant::now() + Duration::from_secs(8)).await;
    let elsewhere: HashSet<String> = held
        .iter()
        .filter(|m| a.held_elsewhere(m).expect("A's message"))
        .map(payload)
        .collect();
    let to_b: HashSet<String> = to_b.into_iter().collect();
    println!(
        "after the unload: {} of 10 went to B, {} said to be held elsewhere; A's stats {:?}",
        to_b.len(),
        elsewhere.len(),
        a.stats()
    );
    assert!(
        to_b.is_subset(&elsewhere),
        "B got {to_b:?}, elsewhere {elsewhere:?}"
    );
    assert!(a.stats().held_at_link_loss >= 10, "{:?}", a.stats());
    // A transaction over all ten: the ones that may be elsewhere fail the commit.
    let txn = broker.new_txn().await;
    for message in &held {
        a.ack_in(&txn, message).await.expect("acked (or held back)");
    }
    let committed = txn.commit().await;
    if elsewhere.is_empty() {
        committed.expect("all ten came back to A: committed");
    } else {
        let error = committed.expect_err("a message may be elsewhere: not committed");
        assert!(error.to_string().contains("another consumer"), "{error}");
        txn.abort().await.expect("aborted");
        // A lets the others go: only what came back to A is still A's to acknowledge.
        for message in held.iter().filter(|m| !elsewhere.contains(&payload(m))) {
            a.ack(message).await.expect("ack queued");
        }
    }
    a.resume();
    take_until(&a, Instant::now() + Duration::from_secs(2)).await;
    broker.assert_drained().await;
    broker.done();
    Some(elsewhere.len())
}

/// A plain Shared work queue (issue 27's shape): 4 consumers whose handlers take 2 s a
/// message (up to 50 at once each), 2,000 messages: no message is handed to a second consumer
/// while a first holds it, each is acknowledged once, and nothing is left. With the default
/// receiver queue and with one of 50 (so that every consumer's messages are all with its
/// handlers). The consumer before issue 27, in the same shapes: 404 and 424 messages
/// acknowledged twice; with the queue of 50, 932 and 1,197 handed to a second consumer while
/// held and 1,830 acknowledged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_queue_hands_no_held_message_to_a_second_consumer() {
    work_queue("work-queue", None).await;
    work_queue("work-queue-50", Some(50)).await;
}

async fn work_queue(scenario: &str, receiver_queue: Option<u32>) {
    use broker_tools::work_queue;
    let Some(broker) = broker(scenario, 50_000).await else {
        return;
    };
    let shape = work_queue::Shape {
        receiver_queue,
        ..work_queue::Shape::standard()
    };
    let report = work_queue::run(
        &broker.client,
        &broker.topic,
        SUB,
        &shape,
        Some(&broker.admin),
    )
    .await
    .expect("the run");
    println!(
        "{}: {:?}, received by {:?}, {:?}",
        broker.scenario, report.analysis, report.received_by, report.total
    );
    let analysis = &report.analysis;
    assert!(report.finished, "{report:?}");
    assert_eq!(report.produced, 2_000);
    assert!(
        analysis.handed_over.is_empty(),
        "{:?}",
        analysis.handed_over
    );
    assert_eq!(analysis.acked_more_than_once, 0, "{report:?}");
    assert_eq!(analysis.never_acked, 0, "{report:?}");
    assert_eq!(report.redelivery_requests, 0, "{report:?}");
    assert_eq!(
        (report.final_unacked, report.final_backlog),
        (Some(0), Some(0))
    );
    broker.done();
}
