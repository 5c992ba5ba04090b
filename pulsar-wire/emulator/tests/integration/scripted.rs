//! A broker-initiated CLOSE_CONSUMER, and a CLOSE_PRODUCER right behind PRODUCER_SUCCESS,
//! against scripted brokers (the emulator sends neither at a chosen moment).

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{self, BaseCommand, MessageMetadata};
use pulsar_wire::wire::{Frame, PulsarCodec, command_frame};
use pulsar_wire::{ClientBuilder, ConnectOptions, Consumer, Error, Producer};
use tokio::net::TcpListener;
use tokio_util::codec::Framed;

use crate::support::{assert_quiet, within};

/// Answers the handshake, lookups and requests; after the first FLOW sends one message and
/// then CLOSE_CONSUMER.
async fn scripted_broker(listener: TcpListener) {
    let Ok((stream, _)) = listener.accept().await else {
        return;
    };
    let mut framed = Framed::new(stream, PulsarCodec::default());
    let mut consumer_id = 0;
    while let Some(Ok(frame)) = framed.next().await {
        let c = frame.command;
        let answer = match Type::try_from(c.r#type) {
            Ok(Type::Connect) => vec![command_frame(Type::Connected, |a| {
                a.connected = Some(pb::CommandConnected {
                    server_version: "scripted".into(),
                    protocol_version: Some(19),
                    ..pb::CommandConnected::default()
                });
            })],
            Ok(Type::PartitionedMetadata) => {
                let request_id = c.partition_metadata.map_or(0, |m| m.request_id);
                vec![command_frame(Type::PartitionedMetadataResponse, |a| {
                    a.partition_metadata_response =
                        Some(pb::CommandPartitionedTopicMetadataResponse {
                            partitions: Some(0),
                            request_id,
                            ..pb::CommandPartitionedTopicMetadataResponse::default()
                        });
                })]
            }
            Ok(Type::Lookup) => {
                let request_id = c.lookup_topic.map_or(0, |m| m.request_id);
                vec![command_frame(Type::LookupResponse, |a| {
                    a.lookup_topic_response = Some(pb::CommandLookupTopicResponse {
                        request_id,
                        proxy_through_service_url: Some(true),
                        ..pb::CommandLookupTopicResponse::default()
                    });
                })]
            }
            Ok(Type::Subscribe) => {
                let subscribe = c.subscribe.unwrap_or_default();
                consumer_id = subscribe.consumer_id;
                vec![success(subscribe.request_id)]
            }
            Ok(Type::CloseConsumer) => {
                vec![success(c.close_consumer.map_or(0, |m| m.request_id))]
            }
            Ok(Type::Flow) => {
                let message = BaseCommand {
                    r#type: Type::Message as i32,
                    message: Some(pb::CommandMessage {
                        consumer_id,
                        message_id: pb::MessageIdData {
                            ledger_id: 1,
                            entry_id: 0,
                            ..pb::MessageIdData::default()
                        },
                        ..pb::CommandMessage::default()
                    }),
                    ..BaseCommand::default()
                };
                let metadata = MessageMetadata {
                    producer_name: "p".into(),
                    ..MessageMetadata::default()
                };
                vec![
                    Frame::with_payload(message, metadata, Bytes::from_static(b"last")),
                    command_frame(Type::CloseConsumer, |a| {
                        a.close_consumer = Some(pb::CommandCloseConsumer {
                            consumer_id,
                            request_id: 0,
                            ..Default::default()
                        });
                    }),
                ]
            }
            _ => Vec::new(),
        };
        for frame in answer {
            if framed.send(frame).await.is_err() {
                return;
            }
        }
    }
}

fn success(request_id: u64) -> Frame {
    command_frame(Type::Success, |a| {
        a.success = Some(pb::CommandSuccess { request_id });
    })
}

#[tokio::test]
async fn a_consumer_closed_by_the_broker_subscribes_again_with_backoff() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let address = listener.local_addr().expect("address");
    tokio::spawn(scripted_broker(listener));
    let options = ConnectOptions::new(&format!("pulsar://{address}"))
        .expect("valid")
        .operation_timeout(Duration::from_secs(5));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("connected");
    let consumer = Consumer::builder(&client, "closing", "sub")
        .build()
        .await
        .expect("subscribed");
    let message = within(Duration::from_secs(5), consumer.receive())
        .await
        .expect("in time")
        .expect("the message before the close");
    assert_eq!(message.payload().as_ref(), b"last");
    // The consumer subscribes again; this broker sends the same message and closes it again
    // each time: the copy is not handed over again, and the subscriptions are spaced by the
    // backoff, not a tight loop.
    assert_quiet(&consumer, Duration::from_secs(2)).await;
    let stats = consumer.stats();
    assert!(stats.closed_by_broker);
    assert!((1..=6).contains(&stats.reconnects), "{stats:?}");
    assert!(stats.duplicates >= 1, "{stats:?}");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
}

/// Answers the handshake, lookups and requests as [`scripted_broker`] does, for producers:
/// the first `PRODUCER` gets `PRODUCER_SUCCESS` followed at once by `CLOSE_PRODUCER` (as an
/// unload that crosses the registration does), the next ones `PRODUCER_SUCCESS` alone, and
/// every `SEND` a receipt. Counts the `PRODUCER` commands in `registrations`.
async fn closing_producer_broker(
    listener: TcpListener,
    registrations: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    let Ok((stream, _)) = listener.accept().await else {
        return;
    };
    let mut framed = Framed::new(stream, PulsarCodec::default());
    while let Some(Ok(frame)) = framed.next().await {
        let c = frame.command;
        let answer = match Type::try_from(c.r#type) {
            Ok(Type::Connect) => vec![command_frame(Type::Connected, |a| {
                a.connected = Some(pb::CommandConnected {
                    server_version: "scripted".into(),
                    protocol_version: Some(19),
                    ..pb::CommandConnected::default()
                });
            })],
            Ok(Type::PartitionedMetadata) => {
                let request_id = c.partition_metadata.map_or(0, |m| m.request_id);
                vec![command_frame(Type::PartitionedMetadataResponse, |a| {
                    a.partition_metadata_response =
                        Some(pb::CommandPartitionedTopicMetadataResponse {
                            partitions: Some(0),
                            request_id,
                            ..pb::CommandPartitionedTopicMetadataResponse::default()
                        });
                })]
            }
            Ok(Type::Lookup) => {
                let request_id = c.lookup_topic.map_or(0, |m| m.request_id);
                vec![command_frame(Type::LookupResponse, |a| {
                    a.lookup_topic_response = Some(pb::CommandLookupTopicResponse {
                        request_id,
                        proxy_through_service_url: Some(true),
                        ..pb::CommandLookupTopicResponse::default()
                    });
                })]
            }
            Ok(Type::Producer) => {
                let producer = c.producer.unwrap_or_default();
                let first = registrations.fetch_add(1, Ordering::SeqCst) == 0;
                let mut frames = vec![command_frame(Type::ProducerSuccess, |a| {
                    a.producer_success = Some(pb::CommandProducerSuccess {
                        request_id: producer.request_id,
                        producer_name: "scripted-producer".into(),
                        ..pb::CommandProducerSuccess::default()
                    });
                })];
                if first {
                    frames.push(command_frame(Type::CloseProducer, |a| {
                        a.close_producer = Some(pb::CommandCloseProducer {
                            producer_id: producer.producer_id,
                            request_id: 0,
                            ..Default::default()
                        });
                    }));
                }
                frames
            }
            Ok(Type::CloseProducer) => {
                vec![success(c.close_producer.map_or(0, |m| m.request_id))]
            }
            Ok(Type::Send) => {
                let send = c.send.unwrap_or_default();
                vec![command_frame(Type::SendReceipt, |a| {
                    a.send_receipt = Some(pb::CommandSendReceipt {
                        producer_id: send.producer_id,
                        sequence_id: send.sequence_id,
                        message_id: Some(pb::MessageIdData {
                            ledger_id: 7,
                            entry_id: send.sequence_id,
                            ..pb::MessageIdData::default()
                        }),
                        highest_sequence_id: None,
                    });
                })]
            }
            _ => Vec::new(),
        };
        // One write for all: the client reads the answers together.
        for frame in answer {
            if framed.feed(frame).await.is_err() {
                return;
            }
        }
        if framed.flush().await.is_err() {
            return;
        }
    }
}

/// Regression: a `CLOSE_PRODUCER` right behind `PRODUCER_SUCCESS` was dropped (the producer
/// watched for it only once it had the answer), so the producer believed itself registered
/// and its sends failed with the broker's "no producer" until the send timeout. It now
/// registers again.
#[tokio::test]
async fn a_producer_closed_right_after_its_registration_registers_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let address = listener.local_addr().expect("address");
    let registrations = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(closing_producer_broker(
        listener,
        std::sync::Arc::clone(&registrations),
    ));
    let options = ConnectOptions::new(&format!("pulsar://{address}"))
        .expect("valid")
        .operation_timeout(Duration::from_secs(5));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("connected");
    let producer = Producer::builder(&client, "closing-producer")
        .no_batching()
        .build()
        .await
        .expect("created");
    let mut states = producer.state();
    let again = within(Duration::from_secs(5), async {
        while producer.reconnects() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        again.is_some(),
        "the close was missed: {} registrations",
        registrations.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert_eq!(registrations.load(std::sync::atomic::Ordering::SeqCst), 2);
    within(
        Duration::from_secs(5),
        states.wait_for(|s| s.is_connected()),
    )
    .await
    .expect("connected in time")
    .expect("alive");
    let sent = producer
        .send(pulsar_wire::OutgoingMessage::new("after"))
        .await;
    assert!(sent.is_ok(), "{sent:?}");
}
