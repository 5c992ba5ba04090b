//! A broker-initiated CLOSE_CONSUMER, against a scripted broker (the emulator never sends
//! one unprompted).

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{self, BaseCommand, MessageMetadata};
use pulsar_wire::{
    Client, ConnectOptions, ConsumerOptions, Error, Frame, PulsarCodec, command_frame,
};
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
    let client = Client::connect(options).await.expect("connected");
    let consumer = client
        .subscribe("closing", "sub", ConsumerOptions::default())
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
    consumer.close().await.expect("closed");
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
}
