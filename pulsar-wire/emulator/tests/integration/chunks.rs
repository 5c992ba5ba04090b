//! Chunked messages through the emulator: our producer splits, our consumer reassembles;
//! chunks out of order, orphans and limits.

use std::time::Duration;

use bytes::Bytes;
use pulsar_wire::{
    ChunkLimits, Compression, ConsumerOptions, Error, OutgoingMessage, Producer, ProducerOptions,
    SubType,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, assert_quiet, receive};

/// `len` bytes that compress somewhat, different for each `seed`.
fn payload(seed: usize, len: usize) -> Bytes {
    let mut bytes = Vec::with_capacity(len);
    let mut x = seed as u64 * 0x9e37_79b9 + 1;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Text-like: a few distinct words, so codecs find repeats but not only repeats.
        let word = ["alpha ", "beta ", "gamma ", "delta ", "order-", "42 "][(x % 6) as usize];
        bytes.extend_from_slice(word.as_bytes());
        bytes.push(b'a' + (x % 26) as u8);
    }
    bytes.truncate(len);
    Bytes::from(bytes)
}

fn chunking(codec: Compression) -> ProducerOptions {
    ProducerOptions::default()
        .no_batching()
        .chunking(true)
        .chunk_size(64 * 1024)
        .compression(codec)
}

#[tokio::test]
async fn large_messages_go_in_chunks_and_come_back_whole_with_every_codec() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let codecs = Compression::ALL.into_iter().filter(|c| c.is_available());
    for codec in std::iter::once(Compression::None).chain(codecs) {
        let topic = format!("chunks-{codec}");
        let consumer = setup
            .consumer(
                &topic,
                ConsumerOptions::default().sub_type(SubType::Failover),
            )
            .await;
        let producer = Producer::builder(&setup.client, &topic)
            .options(chunking(codec))
            .build()
            .await
            .expect("producer created");
        // Large and small messages, sent concurrently: each stays whole and in order.
        let sizes = [700 * 1024, 10, 300 * 1024, 64 * 1024, 5];
        let sends = sizes.iter().enumerate().map(|(i, &len)| {
            producer.send(OutgoingMessage::new(payload(i, len)).property("i", i.to_string()))
        });
        let ids: Vec<_> = futures_util::future::join_all(sends)
            .await
            .into_iter()
            .map(|id| id.expect("sent"))
            .collect();
        for (i, &len) in sizes.iter().enumerate() {
            let message = receive(&consumer, 1).await.remove(0);
            assert_eq!(
                message.property("i"),
                Some(i.to_string().as_str()),
                "{codec}"
            );
            assert_eq!(message.payload(), &payload(i, len), "{codec} message {i}");
            assert_eq!(message.id(), ids[i], "{codec}: the id is the last chunk's");
            let chunks = message.chunk_ids();
            if len > 64 * 1024 && codec == Compression::None {
                assert!(chunks.len() > 1, "{codec} message {i}: {chunks:?}");
            }
            if len < 1024 {
                assert!(chunks.is_empty(), "{codec} message {i}");
            }
            consumer.ack(&message).await.expect("acked");
        }
        consumer.flush_acks().await;
        setup.assert_drained(&topic).await;
        let stats = consumer.stats();
        assert_eq!(stats.undecodable, 0, "{codec}");
        assert!(stats.chunked >= 1, "{codec}: {stats:?}");
        consumer
            .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
            .await
            .expect("closed");
    }
}

#[tokio::test]
async fn a_chunked_message_nacked_comes_back_whole_and_its_chunks_are_all_acked() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "chunks-nack";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = Producer::builder(&setup.client, topic)
        .options(chunking(Compression::None))
        .build()
        .await
        .expect("producer created");
    let big = payload(7, 200 * 1024);
    producer
        .send(OutgoingMessage::new(big.clone()))
        .await
        .expect("sent");
    let first = receive(&consumer, 1).await.remove(0);
    assert_eq!(first.payload(), &big);
    let chunks = first.chunk_ids();
    assert_eq!(chunks.len(), 4, "{chunks:?}");
    consumer.nack(&first).expect("nacked");
    let again = receive(&consumer, 1).await.remove(0);
    assert_eq!(again.payload(), &big);
    assert_eq!(again.chunk_ids(), chunks);
    assert!(again.redelivery_count() >= 1);
    consumer.ack(&again).await.expect("acked");
    consumer.flush_acks().await;
    setup.assert_drained(topic).await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
}

/// A chunked message acknowledged in a transaction that aborts comes back whole, from the
/// consumer itself (its acks were held until the commit: the abort's copies of single chunks,
/// arriving before the abort was answered, could not be kept as whole messages); acknowledged
/// in a second transaction that commits, everything is gone.
#[tokio::test]
async fn a_chunked_message_of_an_aborted_transaction_comes_back_whole() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "chunks-txn";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = Producer::builder(&setup.client, topic)
        .options(chunking(Compression::None))
        .build()
        .await
        .expect("producer created");
    let big = payload(9, 200 * 1024);
    producer
        .send(OutgoingMessage::new(big.clone()))
        .await
        .expect("sent");
    let first = receive(&consumer, 1).await.remove(0);
    let coordinator = setup
        .client
        .transaction_coordinator()
        .await
        .expect("coordinator");
    let txn = coordinator
        .new_transaction(Duration::from_secs(60))
        .await
        .expect("transaction");
    consumer.ack_in(&txn, &first).await.expect("held back");
    assert_eq!(consumer.stats().txn_acks, 0, "nothing sent before the end");
    txn.abort().await.expect("aborted");
    let again = receive(&consumer, 1).await.remove(0);
    assert_eq!(again.payload(), &big);
    assert_eq!(again.redelivery_count(), first.redelivery_count() + 1);
    assert_eq!(consumer.stats().redelivery_requests, 0);
    let txn = coordinator
        .new_transaction(Duration::from_secs(60))
        .await
        .expect("transaction");
    consumer.ack_in(&txn, &again).await.expect("held back");
    txn.commit().await.expect("committed");
    assert_eq!(
        consumer.stats().txn_acks,
        4,
        "every chunk's entry with the commit"
    );
    setup.assert_drained(topic).await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn chunking_with_batching_is_refused_and_a_message_too_large_for_the_limits_is_surfaced() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let refused = Producer::builder(&setup.client, "chunks-refused")
        .chunking(true)
        .build()
        .await
        .expect_err("batching and chunking");
    assert!(
        matches!(&refused, Error::Invalid { reason, .. } if reason.contains("no_batching")),
        "{refused}"
    );
    let topic = "chunks-limit";
    let consumer = setup
        .consumer(
            topic,
            ConsumerOptions::default()
                .sub_type(SubType::Exclusive)
                .chunk_limits(ChunkLimits::default().max_bytes(100 * 1024)),
        )
        .await;
    let producer = Producer::builder(&setup.client, topic)
        .options(chunking(Compression::None))
        .build()
        .await
        .expect("producer created");
    producer
        .send(OutgoingMessage::new(payload(1, 150 * 1024)))
        .await
        .expect("sent");
    producer
        .send(OutgoingMessage::new("after"))
        .await
        .expect("sent");
    // The first chunk says 150 KiB, above the consumer's 100 KiB: surfaced, not acked.
    let error = consumer.receive().await.expect_err("too large");
    let Error::Undecodable { id, reason, .. } = &error else {
        panic!("{error}");
    };
    assert!(reason.contains("chunk limit"), "{reason}");
    // So is every later chunk, each with its id.
    let mut orphans = vec![*id];
    loop {
        match consumer.receive().await {
            Err(Error::Undecodable { id, reason, .. }) => {
                assert!(reason.contains("chunk limit"), "{reason}");
                orphans.push(id);
            }
            Ok(message) => {
                assert_eq!(message.payload(), &Bytes::from("after"));
                consumer.ack(&message).await.expect("acked");
                break;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(orphans.len(), 3, "{orphans:?}");
    for id in &orphans {
        consumer
            .ack_id(id)
            .await
            .expect("dropped by the application");
    }
    consumer.flush_acks().await;
    setup.assert_drained(topic).await;
}
