//! Key_Shared: key-based batching producers, key-sticky dispatch, STICKY hash ranges, and the
//! order of sequence ids on the wire.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use pulsar_wire::pb::ServerError;
use pulsar_wire::{
    BatchingOptions, Compression, Consumer, Error, HashRange, InitialPosition, KeySharedPolicy,
    Message, OutgoingMessage, Producer, SubType, sticky_key_hash,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{PATIENCE, Setup, within};

/// Odd, so that even round-robin dispatch of the interleaved batches would spread each key
/// over both consumers.
const KEYS: usize = 19;
const PER_KEY: usize = 50;

fn key(k: usize) -> String {
    format!("key-{k}")
}

fn payload(k: usize, i: usize) -> String {
    format!("{}/{i}", key(k))
}

/// The index `i` of a payload `key-K/i`.
fn index(message: &Message) -> usize {
    std::str::from_utf8(message.payload())
        .ok()
        .and_then(|p| p.rsplit_once('/'))
        .and_then(|(_, i)| i.parse().ok())
        .expect("payloads are key-K/i")
}

/// A producer batching up to 10 messages for up to 20 ms, by key when `key_based`.
async fn producer(setup: &Setup, topic: &str, key_based: bool) -> Producer {
    let batching = BatchingOptions::default()
        .max_messages(10)
        .max_delay(Duration::from_millis(20))
        .key_based(key_based);
    Producer::builder(&setup.client, topic)
        .batching(batching)
        .build()
        .await
        .expect("producer created")
}

/// A Key_Shared consumer of subscription `sub` from the earliest message.
async fn key_shared(
    setup: &Setup,
    topic: &str,
    name: &str,
    policy: KeySharedPolicy,
) -> Result<Consumer, Error> {
    Consumer::builder(&setup.client, topic, "sub")
        .sub_type(SubType::KeyShared)
        .key_shared_policy(policy)
        .name(name)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
}

/// Sends `per_key` messages for each of `keys` keys, interleaved (key 0 message 0, key 1
/// message 0, …) and all at once, so that batches fill with every key.
async fn send_interleaved(producer: &Producer, keys: usize, per_key: usize) {
    let sends = (0..per_key).flat_map(|i| {
        (0..keys).map(move |k| producer.send(OutgoingMessage::new(payload(k, i)).key(key(k))))
    });
    let ids = futures_util::future::join_all(sends).await;
    for id in ids {
        id.expect("every send succeeds");
    }
}

/// Receives from both consumers, acknowledging each message, until neither delivers for
/// `quiet`; returns what each received, in order.
async fn drain_both(a: &Consumer, b: &Consumer, quiet: Duration) -> [Vec<Message>; 2] {
    let mut received = [Vec::new(), Vec::new()];
    loop {
        let (slot, message) = tokio::select! {
            message = a.receive() => (0, message),
            message = b.receive() => (1, message),
            () = tokio::time::sleep(quiet) => break,
        };
        let message = message.expect("received");
        let consumer = if slot == 0 { a } else { b };
        consumer.ack(&message).await.expect("ack queued");
        received[slot].push(message);
    }
    received
}

/// Every key went to exactly one consumer, in order, every message once, and no entry holds
/// two keys; returns how many keys each consumer had.
fn assert_key_shared(received: &[Vec<Message>; 2], keys: usize, per_key: usize) -> [usize; 2] {
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut next: HashMap<String, usize> = HashMap::new();
    let mut entry_keys: HashMap<(u64, u64), String> = HashMap::new();
    let mut batched = 0;
    for (consumer, messages) in received.iter().enumerate() {
        for message in messages {
            let key = message.key().expect("every message has a key").to_owned();
            let at = *owner.entry(key.clone()).or_insert(consumer);
            assert_eq!(at, consumer, "{key} reached both consumers");
            let expected = next.entry(key.clone()).or_default();
            assert_eq!(
                index(message),
                *expected,
                "{key} out of order or duplicated"
            );
            *expected += 1;
            let id = message.id();
            if id.batch_size().is_some_and(|n| n > 1) {
                batched += 1;
            }
            let first = entry_keys
                .entry((id.ledger_id(), id.entry_id()))
                .or_insert_with(|| key.clone());
            assert_eq!(*first, key, "entry {id} holds two keys");
        }
    }
    assert_eq!(owner.len(), keys, "every key arrived");
    assert!(
        next.values().all(|n| *n == per_key),
        "every message of every key arrived once: {next:?}"
    );
    assert!(
        batched > keys * per_key / 2,
        "most messages came in batches"
    );
    let mut per_consumer = [0, 0];
    for consumer in owner.values() {
        per_consumer[*consumer] += 1;
    }
    per_consumer
}

#[tokio::test]
async fn each_key_sticks_to_one_consumer_in_order_with_key_based_batches() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-auto";
    let a = key_shared(&setup, topic, "a", KeySharedPolicy::auto_split())
        .await
        .expect("a subscribed");
    let b = key_shared(&setup, topic, "b", KeySharedPolicy::default())
        .await
        .expect("b subscribed");
    let producer = producer(&setup, topic, true).await;
    send_interleaved(&producer, KEYS, PER_KEY).await;
    let received = drain_both(&a, &b, Duration::from_millis(500)).await;
    let per_consumer = assert_key_shared(&received, KEYS, PER_KEY);
    assert!(
        per_consumer.iter().all(|n| *n > 0),
        "the keys are spread over both consumers: {per_consumer:?}"
    );
    a.flush_acks().await;
    b.flush_acks().await;
    setup.assert_drained(topic).await;
}

/// The same run without key-based batching: every entry mixes keys, so it has no key and the
/// whole stream goes to the one consumer of the `NONE_KEY` hash.
#[tokio::test]
async fn batches_of_mixed_keys_all_go_to_one_consumer() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-mixed";
    let a = key_shared(&setup, topic, "a", KeySharedPolicy::default())
        .await
        .expect("a subscribed");
    let b = key_shared(&setup, topic, "b", KeySharedPolicy::default())
        .await
        .expect("b subscribed");
    let producer = producer(&setup, topic, false).await;
    send_interleaved(&producer, KEYS, PER_KEY).await;
    let received = drain_both(&a, &b, Duration::from_millis(500)).await;
    let counts = [received[0].len(), received[1].len()];
    assert!(
        counts.contains(&0) && counts.contains(&(KEYS * PER_KEY)),
        "one consumer got everything: {counts:?}"
    );
    let mut entry_keys: HashMap<u64, HashSet<&str>> = HashMap::new();
    for message in received.iter().flatten() {
        entry_keys
            .entry(message.id().entry_id())
            .or_default()
            .insert(message.key().unwrap_or_default());
    }
    assert!(
        entry_keys.values().all(|keys| keys.len() > 1),
        "every entry mixes keys"
    );
}

#[tokio::test]
async fn sticky_ranges_decide_the_consumer_by_the_key_hash() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-sticky";
    let low = HashRange::new(0, 32767);
    let a = key_shared(&setup, topic, "low", KeySharedPolicy::sticky([low]))
        .await
        .expect("low subscribed");
    let b = key_shared(
        &setup,
        topic,
        "high",
        KeySharedPolicy::sticky([HashRange::new(32768, 65535)]),
    )
    .await
    .expect("high subscribed");
    let producer = producer(&setup, topic, true).await;
    send_interleaved(&producer, KEYS, 5).await;
    let received = drain_both(&a, &b, Duration::from_millis(500)).await;
    assert_key_shared(&received, KEYS, 5);
    for (consumer, messages) in received.iter().enumerate() {
        for message in messages {
            let hash = sticky_key_hash(message.key().unwrap_or_default().as_bytes());
            assert_eq!(
                usize::from(!low.contains(hash)),
                consumer,
                "{:?} hashes to {hash}",
                message.key()
            );
        }
    }
}

#[tokio::test]
async fn a_hash_no_consumer_covers_waits_for_one_that_does() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-uncovered";
    let covered = HashRange::new(0, 32767);
    let a = key_shared(&setup, topic, "low", KeySharedPolicy::sticky([covered]))
        .await
        .expect("low subscribed");
    let producer = producer(&setup, topic, true).await;
    send_interleaved(&producer, KEYS, 3).await;
    let low_keys: HashSet<String> = (0..KEYS)
        .map(key)
        .filter(|k| covered.contains(sticky_key_hash(k.as_bytes())))
        .collect();
    assert!(
        !low_keys.is_empty() && low_keys.len() < KEYS,
        "{low_keys:?}"
    );
    let mut got = Vec::new();
    while let Some(message) = within(Duration::from_millis(300), a.receive()).await {
        let message = message.expect("received");
        a.ack(&message).await.expect("ack queued");
        got.push(message);
    }
    assert_eq!(got.len(), low_keys.len() * 3);
    assert!(
        got.iter()
            .all(|m| low_keys.contains(m.key().unwrap_or_default()))
    );
    let stats = setup.stats();
    let sub = stats
        .subscription(&format!("persistent://public/default/{topic}"), "sub")
        .expect("the subscription");
    assert!(
        sub.waiting_for_key_consumer > 0,
        "the other keys' entries wait: {sub:#?}"
    );

    let b = key_shared(
        &setup,
        topic,
        "high",
        KeySharedPolicy::sticky([HashRange::new(32768, 65535)]),
    )
    .await
    .expect("high subscribed");
    let rest = (KEYS - low_keys.len()) * 3;
    let mut late = Vec::new();
    for _ in 0..rest {
        let message = within(PATIENCE, b.receive())
            .await
            .expect("the waiting entries arrive")
            .expect("received");
        b.ack(&message).await.expect("ack queued");
        late.push(message);
    }
    assert!(
        late.iter()
            .all(|m| !low_keys.contains(m.key().unwrap_or_default()))
    );
    b.flush_acks().await;
    a.flush_acks().await;
    setup.assert_drained(topic).await;
}

#[tokio::test]
async fn conflicting_key_shared_consumers_are_refused() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-refused";
    let _a = key_shared(
        &setup,
        topic,
        "a",
        KeySharedPolicy::sticky([HashRange::new(0, 1000)]),
    )
    .await
    .expect("a subscribed");
    let server_code = |result: Result<Consumer, Error>| match result {
        Err(Error::Server { code, message, .. }) => (code, message),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    };
    let (code, message) = server_code(
        key_shared(
            &setup,
            topic,
            "b",
            KeySharedPolicy::sticky([HashRange::new(1000, 2000)]),
        )
        .await,
    );
    assert_eq!(code, ServerError::ConsumerAssignError as i32, "{message}");
    assert!(message.contains("Range conflict"), "{message}");
    let (code, message) =
        server_code(key_shared(&setup, topic, "c", KeySharedPolicy::auto_split()).await);
    assert_eq!(code, ServerError::ConsumerBusy as i32, "{message}");
    assert!(message.contains("'STICKY'"), "{message}");
    let (code, message) = server_code(
        key_shared(
            &setup,
            topic,
            "d",
            KeySharedPolicy::sticky([HashRange::new(2000, 3000)]).allow_out_of_order_delivery(true),
        )
        .await,
    );
    assert_eq!(code, ServerError::ConsumerBusy as i32, "{message}");
    assert!(message.contains("out of order"), "{message}");
    key_shared(
        &setup,
        topic,
        "e",
        KeySharedPolicy::sticky([HashRange::new(1001, 65535)]),
    )
    .await
    .expect("a disjoint range is taken");
}

#[tokio::test]
async fn invalid_policies_fail_before_subscribing() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    for (policy, expected) in [
        (KeySharedPolicy::sticky([]), "at least one hash range"),
        (KeySharedPolicy::sticky([HashRange::new(5, 4)]), "5..=4"),
        (KeySharedPolicy::sticky([HashRange::new(0, 65536)]), "65535"),
        (
            KeySharedPolicy::sticky([HashRange::new(0, 10), HashRange::new(10, 20)]),
            "overlap",
        ),
    ] {
        match key_shared(&setup, "ks-invalid", "x", policy).await {
            Err(Error::Invalid { what, reason }) => {
                assert_eq!(what, "key_shared_policy");
                assert!(reason.contains(expected), "{reason}");
            }
            other => panic!("expected Error::Invalid, got {:?}", other.map(|_| ())),
        }
    }
    let shared = Consumer::builder(&setup.client, "ks-invalid", "sub")
        .sub_type(SubType::Shared)
        .key_shared_policy(KeySharedPolicy::default())
        .build()
        .await;
    assert!(
        matches!(&shared, Err(Error::Invalid { reason, .. }) if reason.contains("Key_Shared")),
        "{:?}",
        shared.map(|_| ())
    );
    assert_eq!(
        setup.stats().topics.len(),
        0,
        "nothing reached the emulator"
    );
}

/// Many keys' batches flushed at once on one partition, from several threads, compressed (so
/// that building a frame takes a while): the sequence ids of the stored entries grow in the
/// order the entries were written, and each key's payloads keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_key_batches_keep_sequence_ids_in_wire_order() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "ks-order";
    let keys = 64;
    let per_key = 40;
    let batching = BatchingOptions::default()
        .max_messages(4)
        .max_delay(Duration::from_millis(2))
        .key_based(true);
    let producer = Producer::builder(&setup.client, topic)
        .batching(batching)
        .compression(Compression::Zlib)
        .build()
        .await
        .expect("producer created");
    let filler = "x".repeat(2000);
    let mut tasks = Vec::new();
    for k in 0..keys {
        let producer = producer.clone();
        let filler = filler.clone();
        tasks.push(tokio::spawn(async move {
            let sends = (0..per_key).map(|i| {
                let text = format!("{}/{i}/{filler}", key(k));
                producer.send(OutgoingMessage::new(text).key(key(k)))
            });
            futures_util::future::join_all(sends).await
        }));
    }
    for task in tasks {
        for id in task.await.expect("the sending task") {
            id.expect("every send succeeds");
        }
    }
    let reader = Consumer::builder(&setup.client, topic, "reader")
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(10_000)
        .build()
        .await
        .expect("subscribed");
    let mut by_position = BTreeMap::new();
    for _ in 0..keys * per_key {
        let message = within(PATIENCE, reader.receive())
            .await
            .expect("every message arrives")
            .expect("received");
        let id = message.id();
        by_position.insert((id.entry_id(), id.batch_index()), message);
    }
    let mut last_sequence = None;
    let mut next: HashMap<String, usize> = HashMap::new();
    for ((entry, batch_index), message) in &by_position {
        let sequence = message.sequence_id().expect("a sequence id");
        if let Some(last) = last_sequence {
            assert!(
                sequence > last,
                "entry {entry} index {batch_index} has sequence id {sequence} after {last}"
            );
        }
        last_sequence = Some(sequence);
        let text = std::str::from_utf8(message.payload()).expect("text");
        let mut parts = text.split('/');
        let (k, i) = (parts.next().unwrap_or_default(), parts.next());
        let expected = next.entry(k.to_owned()).or_default();
        assert_eq!(i, Some(expected.to_string().as_str()), "{k} out of order");
        *expected += 1;
    }
    assert_eq!(next.len(), keys);
}
