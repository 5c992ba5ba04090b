//! Compressed entries through the emulator: our producer with every codec, batched or not;
//! entries built as other clients write them; entries that do not decompress.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{self, MessageMetadata, SingleMessageMetadata};
use pulsar_wire::wire::{
    BatchedMessage, ConnectionExt, ConsumerEvent, Frame, command_frame, encode_batch,
};
use pulsar_wire::{
    BatchingOptions, Compression, Connection, ConsumerOptions, Error, OutgoingMessage, Producer,
    ProducerOptions, compress, topic_name,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{PATIENCE, Setup, assert_quiet, producer_options, receive, within};

/// A payload of about 1 KiB that compresses (JSON-like text), different for each `i`.
fn payload(i: usize) -> Bytes {
    let record = format!(
        "{{\"order\": {i}, \"customer\": \"c-{}\", \"items\": [1, 2, 3]}}, ",
        i % 13
    );
    Bytes::from(record.repeat(1024 / record.len() + 1))
}

fn available() -> impl Iterator<Item = Compression> {
    Compression::ALL.into_iter().filter(|c| c.is_available())
}

#[tokio::test]
async fn every_codec_batched_or_not_reaches_our_consumer_intact() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    const COUNT: usize = 60;
    for codec in available() {
        for per_batch in [0, 1, 25] {
            let topic = format!("compressed-{codec}-{per_batch}");
            let consumer = setup.shared(&topic, ConsumerOptions::default()).await;
            let producer = Producer::builder(&setup.client, &topic)
                .options(producer_options(per_batch).compression(codec))
                .build()
                .await
                .expect("producer created");
            let sends = (0..COUNT).map(|i| {
                producer.send(
                    OutgoingMessage::new(payload(i))
                        .key(format!("k{i}"))
                        .property("i", i.to_string()),
                )
            });
            let ids = futures_util::future::join_all(sends).await;
            for id in &ids {
                let id = id.as_ref().expect("sent");
                assert_eq!(
                    id.batch_size().is_some(),
                    per_batch > 0,
                    "{codec} {per_batch}"
                );
            }
            let messages = receive(&consumer, COUNT).await;
            let mut seen = BTreeSet::new();
            for message in &messages {
                let i: usize = message
                    .property("i")
                    .expect("property")
                    .parse()
                    .expect("a number");
                assert_eq!(
                    message.payload(),
                    &payload(i),
                    "{codec} {per_batch} message {i}"
                );
                assert_eq!(message.key(), Some(format!("k{i}").as_str()));
                assert!(seen.insert(i), "{codec} {per_batch}: {i} twice");
                consumer.ack(message).await.expect("ack queued");
            }
            let stats = consumer.stats();
            assert_eq!(stats.undecodable, 0, "{codec} {per_batch}: {stats:?}");
            assert_eq!(stats.received, COUNT as u64, "{codec} {per_batch}");
            setup.assert_drained(&topic).await;
            producer
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await
                .expect("closed");
            consumer
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await
                .expect("closed");
        }
    }
}

/// A raw connection with a producer registered on `topic`: (connection, producer id, name).
async fn raw_producer(setup: &Setup, topic: &str) -> (Connection, u64, String) {
    let topic = topic_name(topic).expect("a topic");
    let connection = setup.client.lookup(&topic).await.expect("looked up");
    let producer_id = connection.next_id();
    let answer = connection
        .request("PRODUCER", |request_id| {
            command_frame(Type::Producer, |c| {
                c.producer = Some(pb::CommandProducer {
                    topic: topic.clone(),
                    producer_id,
                    request_id,
                    ..pb::CommandProducer::default()
                });
            })
        })
        .await
        .expect("producer registered");
    let name = answer
        .producer_success
        .expect("PRODUCER_SUCCESS")
        .producer_name;
    (connection, producer_id, name)
}

/// Sends one entry as it is (metadata and payload untouched).
async fn send_raw(
    raw: &(Connection, u64, String),
    sequence_id: u64,
    metadata: MessageMetadata,
    data: Bytes,
) -> Result<pb::MessageIdData, Error> {
    let (connection, producer_id, name) = raw;
    let command = command_frame(Type::Send, |c| {
        c.send = Some(pb::CommandSend {
            producer_id: *producer_id,
            sequence_id,
            num_messages: metadata.num_messages_in_batch,
            ..pb::CommandSend::default()
        });
    })
    .command;
    let metadata = MessageMetadata {
        producer_name: name.clone(),
        sequence_id,
        publish_time: 1,
        ..metadata
    };
    connection
        .send_message(
            *producer_id,
            sequence_id,
            Frame::with_payload(command, metadata, data),
        )
        .await
}

fn metadata(codec: Compression, uncompressed: usize, batch: Option<i32>) -> MessageMetadata {
    MessageMetadata {
        compression: Some(pulsar_wire::wire::compression_type(codec) as i32),
        uncompressed_size: Some(uncompressed as u32),
        num_messages_in_batch: batch,
        ..MessageMetadata::default()
    }
}

/// A zlib stream as the Java client's deflater leaves it: sync-flushed, never finished (no
/// final block, no Adler-32).
fn java_zlib(data: &[u8]) -> Bytes {
    let mut deflater = flate2::Compress::new(flate2::Compression::default(), true);
    let mut out = Vec::with_capacity(data.len() + 64);
    deflater
        .compress_vec(data, &mut out, flate2::FlushCompress::Sync)
        .expect("deflated");
    assert_eq!(
        deflater.total_in() as usize,
        data.len(),
        "the buffer was large enough"
    );
    Bytes::from(out)
}

#[tokio::test]
async fn entries_written_as_other_clients_write_them_are_delivered() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "foreign-compressed";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let raw = raw_producer(&setup, topic).await;
    let mut expected = Vec::new();
    let mut sequence = 0;
    for codec in available().filter(|c| *c != Compression::None) {
        // A batch of 10, compressed as one unit.
        let singles: Vec<_> = (0..10)
            .map(|i| {
                let body = format!("{codec} batched {i}");
                expected.push(body.clone());
                BatchedMessage {
                    metadata: SingleMessageMetadata {
                        sequence_id: Some(i),
                        ..SingleMessageMetadata::default()
                    },
                    payload: Bytes::from(body),
                }
            })
            .collect();
        let plain = encode_batch(&singles);
        let data = if codec == Compression::Zlib {
            java_zlib(&plain)
        } else {
            compress(codec, &plain).expect("compressed")
        };
        send_raw(&raw, sequence, metadata(codec, plain.len(), Some(10)), data)
            .await
            .expect("stored");
        sequence += 1;
        // A message on its own.
        let body = format!("{codec} single {}", "x".repeat(500));
        expected.push(body.clone());
        let data = if codec == Compression::Zlib {
            java_zlib(body.as_bytes())
        } else {
            compress(codec, body.as_bytes()).expect("compressed")
        };
        send_raw(&raw, sequence, metadata(codec, body.len(), None), data)
            .await
            .expect("stored");
        sequence += 1;
    }
    let messages = receive(&consumer, expected.len()).await;
    let got: Vec<String> = messages
        .iter()
        .map(|m| String::from_utf8(m.payload().to_vec()).expect("text"))
        .collect();
    assert_eq!(got, expected);
    for message in &messages {
        consumer.ack(message).await.expect("ack queued");
    }
    assert_eq!(consumer.stats().undecodable, 0);
    setup.assert_drained(topic).await;
}

#[tokio::test]
async fn the_emulator_passes_compressed_entries_through_unchanged() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = topic_name("passthrough").expect("a topic");
    // A raw consumer, to see the MESSAGE frames themselves.
    let connection = setup.client.lookup(&topic).await.expect("looked up");
    let consumer_id = connection.next_id();
    let mut events = connection.register_consumer(consumer_id);
    connection
        .request("SUBSCRIBE", |request_id| {
            command_frame(Type::Subscribe, |c| {
                c.subscribe = Some(pb::CommandSubscribe {
                    topic: topic.clone(),
                    subscription: "raw".into(),
                    sub_type: pb::command_subscribe::SubType::Shared as i32,
                    consumer_id,
                    request_id,
                    ..pb::CommandSubscribe::default()
                });
            })
        })
        .await
        .expect("subscribed");
    connection
        .send(command_frame(Type::Flow, |c| {
            c.flow = Some(pb::CommandFlow {
                consumer_id,
                message_permits: 1000,
            });
        }))
        .expect("flow");
    for codec in available().filter(|c| *c != Compression::None) {
        for batched in [false, true] {
            let options = if batched {
                // Sealed by its count, never by its delay.
                ProducerOptions::default().batching(
                    BatchingOptions::default()
                        .max_messages(2)
                        .max_delay(Duration::from_secs(30)),
                )
            } else {
                ProducerOptions::default().no_batching()
            };
            let producer = Producer::builder(&setup.client, &topic)
                .options(options.compression(codec))
                .build()
                .await
                .expect("producer created");
            let (a, b) = tokio::join!(
                producer.send(OutgoingMessage::new(payload(1))),
                producer.send(OutgoingMessage::new(payload(2))),
            );
            a.expect("sent");
            b.expect("sent");
            for _ in 0..if batched { 1 } else { 2 } {
                let event = within(PATIENCE, events.recv())
                    .await
                    .expect("in time")
                    .expect("an event");
                let ConsumerEvent::Message(frame) = event else {
                    panic!("not a message");
                };
                let payload_in = frame.payload.expect("a payload");
                let metadata = &payload_in.metadata;
                assert_eq!(
                    pulsar_wire::wire::compression_of(metadata).expect("known"),
                    codec
                );
                let uncompressed = metadata.uncompressed_size.expect("declared") as usize;
                assert!(
                    payload_in.data.len() < uncompressed,
                    "{codec}: {} bytes on the wire for {uncompressed}",
                    payload_in.data.len()
                );
                let plain = pulsar_wire::wire::decompress_payload(
                    metadata,
                    payload_in.data.clone(),
                    uncompressed,
                )
                .expect("decompresses");
                assert_eq!(plain.len(), uncompressed);
                if batched {
                    let messages = pulsar_wire::wire::decode_batch(metadata, payload_in.data)
                        .expect("a batch");
                    assert_eq!(messages.len(), 2);
                    assert_eq!(messages[0].payload, payload(1));
                } else {
                    assert!(plain == payload(1) || plain == payload(2));
                }
            }
            producer
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await
                .expect("closed");
        }
    }
}

#[tokio::test]
async fn an_entry_that_does_not_decompress_is_reported_unacknowledged_and_the_next_delivered() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let topic = "corrupt-compressed";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let raw = raw_producer(&setup, topic).await;
    let mut sequence = 0;
    let codecs: Vec<_> = available().filter(|c| *c != Compression::None).collect();
    for codec in &codecs {
        let good = compress(*codec, &payload(7)).expect("compressed");
        // Cut short, and declared larger than the broker takes.
        let cut = good.slice(..good.len() / 2);
        send_raw(
            &raw,
            sequence,
            metadata(*codec, payload(7).len(), Some(1)),
            cut,
        )
        .await
        .expect("stored");
        send_raw(
            &raw,
            sequence + 1,
            metadata(*codec, 64 << 20, None),
            good.clone(),
        )
        .await
        .expect("stored");
        send_raw(
            &raw,
            sequence + 2,
            metadata(*codec, payload(7).len(), None),
            good,
        )
        .await
        .expect("stored");
        sequence += 3;
    }
    // The entries that do not decompress reach the application as errors, in order.
    let mut undecodable = Vec::new();
    for _ in &codecs {
        for _ in 0..2 {
            match within(PATIENCE, consumer.receive()).await {
                Some(Err(Error::Undecodable { id, reason, .. })) => {
                    assert!(!reason.is_empty());
                    undecodable.push(id);
                }
                other => panic!(
                    "expected an undecodable entry: {:?}",
                    other.map(|r| r.map(|m| m.id()))
                ),
            }
        }
        let message = receive(&consumer, 1).await.remove(0);
        assert_eq!(message.payload(), &payload(7));
        consumer.ack(&message).await.expect("ack queued");
    }
    assert_quiet(&consumer, Duration::from_millis(200)).await;
    consumer.flush_acks().await;
    assert_eq!(consumer.stats().undecodable, 2 * codecs.len() as u64);
    assert_eq!(setup.stats().backlog(topic), undecodable.len() as u64);
    for id in &undecodable {
        consumer.ack_id(id).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained(topic).await;
}

#[tokio::test]
async fn the_compressed_size_counts_against_max_message_size() {
    let setup = Setup::new(EmulatorConfig::default().max_message_size(64 * 1024)).await;
    let Some(codec) = available().find(|c| *c != Compression::None) else {
        return;
    };
    let topic = "compressed-big";
    let raised = setup
        .shared(
            topic,
            ConsumerOptions::default()
                .name("raised")
                .max_uncompressed_size(1 << 20),
        )
        .await;
    for batching in [false, true] {
        let options = if batching {
            ProducerOptions::default()
        } else {
            ProducerOptions::default().no_batching()
        };
        let producer = Producer::builder(&setup.client, topic)
            .options(options.compression(codec))
            .build()
            .await
            .expect("producer created");
        // 200 KiB of text compresses below 64 KiB: sent.
        let text = Bytes::from("all work and no play ".repeat(10_000));
        producer
            .send(OutgoingMessage::new(text.clone()))
            .await
            .expect("sent compressed");
        let message = receive(&raised, 1).await.remove(0);
        assert_eq!(message.payload(), &text);
        raised.ack(&message).await.expect("ack queued");
        // 100 KiB that does not compress: refused, with both sizes.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..100 * 1024)
            .map(|_| {
                // xorshift64
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let error = producer
            .send(OutgoingMessage::new(noise))
            .await
            .expect_err("too large compressed");
        assert!(matches!(error, Error::Invalid { .. }), "{error}");
        let text = error.to_string();
        assert!(
            text.contains("once compressed") && text.contains("max_message_size"),
            "{text}"
        );
        producer
            .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
            .await
            .expect("closed");
    }
    assert_eq!(raised.stats().undecodable, 0);
}

#[tokio::test]
async fn by_default_a_consumer_decompresses_up_to_the_brokers_max_message_size() {
    let setup = Setup::new(EmulatorConfig::default().max_message_size(64 * 1024)).await;
    let Some(codec) = available().find(|c| *c != Compression::None) else {
        return;
    };
    let topic = "compressed-limit";
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = Producer::builder(&setup.client, topic)
        .no_batching()
        .compression(codec)
        .build()
        .await
        .expect("producer created");
    let big = Bytes::from("z".repeat(100 * 1024));
    producer
        .send(OutgoingMessage::new(big))
        .await
        .expect("sent");
    producer
        .send(OutgoingMessage::new("small"))
        .await
        .expect("sent");
    let Some(Err(Error::Undecodable { id, .. })) = within(PATIENCE, consumer.receive()).await
    else {
        panic!("the entry above the limit is reported first");
    };
    consumer.ack_id(&id).await.expect("ack queued");
    let message = receive(&consumer, 1).await.remove(0);
    assert_eq!(message.payload(), &Bytes::from("small"));
    consumer.ack(&message).await.expect("ack queued");
    assert_eq!(consumer.stats().undecodable, 1);
    setup.assert_drained(topic).await;
}
