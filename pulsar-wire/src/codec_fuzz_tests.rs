//! Property tests of the frame and batch decoders on hostile bytes (random bytes, every prefix
//! of valid frames, wrong magic numbers, bad checksums, oversized sizes, random batch payloads:
//! always `Ok` or `Err`, never a panic), and round trips of every command this crate encodes.
//!
//! The fuzz targets in `pulsar-wire/fuzz` feed the same decoders with coverage-guided input.

// The command strategies name every field and still end in `..Default::default()`, so that a
// field added to the proto subset does not break this file.
#![allow(clippy::needless_update)]

use bytes::{BufMut, Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

use crate::Error;
use crate::batch::{BatchedMessage, decode_batch, encode_batch};
use crate::codec::{
    DEFAULT_MAX_FRAME_SIZE, Frame, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C, PulsarCodec,
    decode_frame, encode_frame,
};
use crate::pb::base_command::Type;
use crate::pb::*;

// ---------------------------------------------------------------------------------------------
// Strategies for the protocol types.

fn text() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z0-9:/._-]{0,24}", 1 => ".{0,8}"]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max)
}

fn opt<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    proptest::option::of(s)
}

/// An enum field: mostly a declared value, sometimes one this crate does not know.
fn enum_value(declared: i32) -> impl Strategy<Value = i32> {
    prop_oneof![9 => 0..declared, 1 => any::<i32>()]
}

fn auth_data() -> impl Strategy<Value = AuthData> {
    (opt(text()), opt(bytes(64))).prop_map(|(auth_method_name, auth_data)| AuthData {
        auth_method_name,
        auth_data,
    })
}

fn key_value() -> impl Strategy<Value = KeyValue> {
    (text(), text()).prop_map(|(key, value)| KeyValue { key, value })
}

fn key_long_value() -> impl Strategy<Value = KeyLongValue> {
    (text(), any::<u64>()).prop_map(|(key, value)| KeyLongValue { key, value })
}

fn message_id() -> impl Strategy<Value = MessageIdData> {
    (
        any::<u64>(),
        any::<u64>(),
        opt(any::<i32>()),
        opt(any::<i32>()),
        vec(any::<i64>(), 0..4),
        opt(any::<i32>()),
    )
        .prop_map(
            |(ledger_id, entry_id, partition, batch_index, ack_set, batch_size)| MessageIdData {
                ledger_id,
                entry_id,
                partition,
                batch_index,
                ack_set,
                batch_size,
                ..Default::default()
            },
        )
}

fn feature_flags() -> impl Strategy<Value = FeatureFlags> {
    (
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
        opt(any::<bool>()),
    )
        .prop_map(|(a, b, c, d)| FeatureFlags {
            supports_auth_refresh: a,
            supports_broker_entry_metadata: b,
            supports_partial_producer: c,
            supports_topic_watchers: d,
            ..Default::default()
        })
}

/// A `request_id`-only response body: `(request_id, least, most, error, message)`.
fn txn_response()
-> impl Strategy<Value = (u64, Option<u64>, Option<u64>, Option<i32>, Option<String>)> {
    (
        any::<u64>(),
        opt(any::<u64>()),
        opt(any::<u64>()),
        opt(enum_value(26)),
        opt(text()),
    )
}

fn message_metadata() -> impl Strategy<Value = MessageMetadata> {
    (
        (
            text(),
            any::<u64>(),
            any::<u64>(),
            vec(key_value(), 0..4),
            opt(text()),
            opt(enum_value(5)),
            opt(any::<u32>()),
            opt(any::<i32>()),
        ),
        (
            opt(any::<u64>()),
            opt(bytes(8)),
            opt(any::<i64>()),
            opt(any::<u64>()),
            opt(any::<u64>()),
            opt(any::<u64>()),
            opt(any::<bool>()),
        ),
    )
        .prop_map(
            |(
                (
                    producer_name,
                    sequence_id,
                    publish_time,
                    properties,
                    partition_key,
                    compression,
                    uncompressed_size,
                    num_messages_in_batch,
                ),
                (
                    event_time,
                    ordering_key,
                    deliver_at_time,
                    txnid_least_bits,
                    txnid_most_bits,
                    highest_sequence_id,
                    null_value,
                ),
            )| MessageMetadata {
                producer_name,
                sequence_id,
                publish_time,
                properties,
                partition_key,
                compression,
                uncompressed_size,
                num_messages_in_batch,
                event_time,
                ordering_key,
                deliver_at_time,
                txnid_least_bits,
                txnid_most_bits,
                highest_sequence_id,
                null_value,
                ..Default::default()
            },
        )
}

fn single_message_metadata() -> impl Strategy<Value = SingleMessageMetadata> {
    (
        vec(key_value(), 0..3),
        opt(text()),
        any::<i32>(),
        opt(any::<bool>()),
        opt(any::<u64>()),
        opt(bytes(8)),
        opt(any::<u64>()),
        opt(any::<bool>()),
    )
        .prop_map(
            |(
                properties,
                partition_key,
                payload_size,
                compacted_out,
                event_time,
                ordering_key,
                sequence_id,
                null_value,
            )| SingleMessageMetadata {
                properties,
                partition_key,
                payload_size,
                compacted_out,
                event_time,
                ordering_key,
                sequence_id,
                null_value,
                ..Default::default()
            },
        )
}

fn batched_message() -> impl Strategy<Value = BatchedMessage> {
    (single_message_metadata(), bytes(64)).prop_map(|(metadata, payload)| BatchedMessage {
        metadata,
        payload: Bytes::from(payload),
    })
}

/// Wraps a command body into a `BaseCommand` of type `$t` with member `$member`.
macro_rules! command {
    ($t:expr, $member:ident, $strategy:expr) => {
        $strategy
            .prop_map(move |body| BaseCommand {
                r#type: $t as i32,
                $member: Some(body),
                ..BaseCommand::default()
            })
            .boxed()
    };
}

/// Arbitrary `BaseCommand`s of type `t`, with arbitrary field values; `None` for a type added to
/// the proto subset without a strategy here (the round-trip test then fails and says so).
fn command(t: Type) -> Option<BoxedStrategy<BaseCommand>> {
    #[allow(unreachable_patterns)]
    let strategy = match t {
        Type::Connect => command!(
            t,
            connect,
            (
                text(),
                opt(bytes(16)),
                opt(any::<i32>()),
                opt(text()),
                opt(text()),
                opt(feature_flags()),
            )
                .prop_map(|(client_version, auth_data, protocol_version, m, p, f)| {
                    CommandConnect {
                        client_version,
                        auth_data,
                        protocol_version,
                        auth_method_name: m,
                        proxy_to_broker_url: p,
                        feature_flags: f,
                        ..Default::default()
                    }
                })
        ),
        Type::Connected => command!(
            t,
            connected,
            (
                text(),
                opt(any::<i32>()),
                opt(any::<i32>()),
                opt(feature_flags())
            )
                .prop_map(|(server_version, protocol_version, max_message_size, f)| {
                    CommandConnected {
                        server_version,
                        protocol_version,
                        max_message_size,
                        feature_flags: f,
                        ..Default::default()
                    }
                })
        ),
        Type::Subscribe => command!(
            t,
            subscribe,
            (
                (text(), text(), enum_value(4), any::<u64>(), any::<u64>()),
                (
                    opt(text()),
                    opt(any::<i32>()),
                    opt(any::<bool>()),
                    opt(message_id()),
                    vec(key_value(), 0..3),
                    opt(enum_value(2)),
                    opt(any::<bool>()),
                ),
            )
                .prop_map(
                    |(
                        (topic, subscription, sub_type, consumer_id, request_id),
                        (name, priority, durable, start, metadata, initial, force),
                    )| CommandSubscribe {
                        topic,
                        subscription,
                        sub_type,
                        consumer_id,
                        request_id,
                        consumer_name: name,
                        priority_level: priority,
                        durable,
                        start_message_id: start,
                        metadata,
                        initial_position: initial,
                        force_topic_creation: force,
                        ..Default::default()
                    }
                )
        ),
        Type::Producer => command!(
            t,
            producer,
            (
                text(),
                any::<u64>(),
                any::<u64>(),
                opt(text()),
                vec(key_value(), 0..3),
                opt(any::<u64>()),
                opt(any::<bool>()),
                opt(any::<bool>()),
            )
                .prop_map(
                    |(topic, producer_id, request_id, name, metadata, epoch, user, txn)| {
                        CommandProducer {
                            topic,
                            producer_id,
                            request_id,
                            producer_name: name,
                            metadata,
                            epoch,
                            user_provided_producer_name: user,
                            txn_enabled: txn,
                            ..Default::default()
                        }
                    }
                )
        ),
        Type::Send => command!(
            t,
            send,
            (
                any::<u64>(),
                any::<u64>(),
                opt(any::<i32>()),
                opt(any::<u64>()),
                opt(any::<u64>()),
                opt(any::<u64>()),
            )
                .prop_map(|(producer_id, sequence_id, num, least, most, highest)| {
                    CommandSend {
                        producer_id,
                        sequence_id,
                        num_messages: num,
                        txnid_least_bits: least,
                        txnid_most_bits: most,
                        highest_sequence_id: highest,
                        ..Default::default()
                    }
                })
        ),
        Type::SendReceipt => command!(
            t,
            send_receipt,
            (
                any::<u64>(),
                any::<u64>(),
                opt(message_id()),
                opt(any::<u64>())
            )
                .prop_map(|(producer_id, sequence_id, message_id, highest)| {
                    CommandSendReceipt {
                        producer_id,
                        sequence_id,
                        message_id,
                        highest_sequence_id: highest,
                        ..Default::default()
                    }
                })
        ),
        Type::SendError => command!(
            t,
            send_error,
            (any::<u64>(), any::<u64>(), enum_value(26), text()).prop_map(
                |(producer_id, sequence_id, error, message)| CommandSendError {
                    producer_id,
                    sequence_id,
                    error,
                    message,
                    ..Default::default()
                }
            )
        ),
        Type::Message => command!(
            t,
            message,
            (
                any::<u64>(),
                message_id(),
                opt(any::<u32>()),
                vec(any::<i64>(), 0..4),
                opt(any::<u64>()),
            )
                .prop_map(|(consumer_id, message_id, redelivery, ack_set, epoch)| {
                    CommandMessage {
                        consumer_id,
                        message_id,
                        redelivery_count: redelivery,
                        ack_set,
                        consumer_epoch: epoch,
                        ..Default::default()
                    }
                })
        ),
        Type::Ack => command!(
            t,
            ack,
            (
                any::<u64>(),
                enum_value(2),
                vec(message_id(), 0..8),
                opt(enum_value(5)),
                vec(key_long_value(), 0..3),
                opt(any::<u64>()),
                opt(any::<u64>()),
                opt(any::<u64>()),
            )
                .prop_map(
                    |(consumer_id, ack_type, ids, validation, properties, least, most, req)| {
                        CommandAck {
                            consumer_id,
                            ack_type,
                            message_id: ids,
                            validation_error: validation,
                            properties,
                            txnid_least_bits: least,
                            txnid_most_bits: most,
                            request_id: req,
                            ..Default::default()
                        }
                    }
                )
        ),
        Type::Flow => command!(
            t,
            flow,
            (any::<u64>(), any::<u32>()).prop_map(|(consumer_id, message_permits)| CommandFlow {
                consumer_id,
                message_permits,
                ..Default::default()
            })
        ),
        Type::Unsubscribe => command!(
            t,
            unsubscribe,
            (any::<u64>(), any::<u64>()).prop_map(|(consumer_id, request_id)| {
                CommandUnsubscribe {
                    consumer_id,
                    request_id,
                    ..Default::default()
                }
            })
        ),
        Type::Success => command!(
            t,
            success,
            any::<u64>().prop_map(|request_id| CommandSuccess {
                request_id,
                ..Default::default()
            })
        ),
        Type::Error => command!(
            t,
            error,
            (any::<u64>(), enum_value(26), text()).prop_map(|(request_id, error, message)| {
                CommandError {
                    request_id,
                    error,
                    message,
                    ..Default::default()
                }
            })
        ),
        Type::CloseProducer => command!(
            t,
            close_producer,
            (any::<u64>(), any::<u64>()).prop_map(|(producer_id, request_id)| {
                CommandCloseProducer {
                    producer_id,
                    request_id,
                    ..Default::default()
                }
            })
        ),
        Type::CloseConsumer => command!(
            t,
            close_consumer,
            (any::<u64>(), any::<u64>()).prop_map(|(consumer_id, request_id)| {
                CommandCloseConsumer {
                    consumer_id,
                    request_id,
                    ..Default::default()
                }
            })
        ),
        Type::ProducerSuccess => command!(
            t,
            producer_success,
            (
                any::<u64>(),
                text(),
                opt(any::<i64>()),
                opt(bytes(8)),
                opt(any::<u64>()),
                opt(any::<bool>()),
            )
                .prop_map(|(request_id, producer_name, last, schema, epoch, ready)| {
                    CommandProducerSuccess {
                        request_id,
                        producer_name,
                        last_sequence_id: last,
                        schema_version: schema,
                        topic_epoch: epoch,
                        producer_ready: ready,
                        ..Default::default()
                    }
                })
        ),
        Type::Ping => command!(t, ping, Just(CommandPing::default())),
        Type::Pong => command!(t, pong, Just(CommandPong::default())),
        Type::RedeliverUnacknowledgedMessages => command!(
            t,
            redeliver_unacknowledged_messages,
            (any::<u64>(), vec(message_id(), 0..8), opt(any::<u64>())).prop_map(
                |(consumer_id, message_ids, consumer_epoch)| {
                    CommandRedeliverUnacknowledgedMessages {
                        consumer_id,
                        message_ids,
                        consumer_epoch,
                        ..Default::default()
                    }
                }
            )
        ),
        Type::PartitionedMetadata => command!(
            t,
            partition_metadata,
            (text(), any::<u64>()).prop_map(|(topic, request_id)| {
                CommandPartitionedTopicMetadata {
                    topic,
                    request_id,
                    ..Default::default()
                }
            })
        ),
        Type::PartitionedMetadataResponse => command!(
            t,
            partition_metadata_response,
            (
                opt(any::<u32>()),
                any::<u64>(),
                opt(enum_value(2)),
                opt(enum_value(26)),
                opt(text()),
            )
                .prop_map(|(partitions, request_id, response, error, message)| {
                    CommandPartitionedTopicMetadataResponse {
                        partitions,
                        request_id,
                        response,
                        error,
                        message,
                        ..Default::default()
                    }
                })
        ),
        Type::Lookup => command!(
            t,
            lookup_topic,
            (text(), any::<u64>(), opt(any::<bool>())).prop_map(
                |(topic, request_id, authoritative)| CommandLookupTopic {
                    topic,
                    request_id,
                    authoritative,
                    ..Default::default()
                }
            )
        ),
        Type::LookupResponse => command!(
            t,
            lookup_topic_response,
            (
                opt(text()),
                opt(text()),
                opt(enum_value(3)),
                any::<u64>(),
                opt(any::<bool>()),
                opt(enum_value(26)),
                opt(text()),
                opt(any::<bool>()),
            )
                .prop_map(
                    |(url, url_tls, response, request_id, auth, error, message, proxy)| {
                        CommandLookupTopicResponse {
                            broker_service_url: url,
                            broker_service_url_tls: url_tls,
                            response,
                            request_id,
                            authoritative: auth,
                            error,
                            message,
                            proxy_through_service_url: proxy,
                            ..Default::default()
                        }
                    }
                )
        ),
        Type::ReachedEndOfTopic => command!(
            t,
            reached_end_of_topic,
            any::<u64>().prop_map(|consumer_id| CommandReachedEndOfTopic {
                consumer_id,
                ..Default::default()
            })
        ),
        Type::ActiveConsumerChange => command!(
            t,
            active_consumer_change,
            (any::<u64>(), opt(any::<bool>())).prop_map(|(consumer_id, is_active)| {
                CommandActiveConsumerChange {
                    consumer_id,
                    is_active,
                    ..Default::default()
                }
            })
        ),
        Type::AckResponse => command!(
            t,
            ack_response,
            (
                any::<u64>(),
                opt(any::<u64>()),
                opt(any::<u64>()),
                opt(enum_value(26)),
                opt(text()),
                opt(any::<u64>()),
            )
                .prop_map(|(consumer_id, least, most, error, message, request_id)| {
                    CommandAckResponse {
                        consumer_id,
                        txnid_least_bits: least,
                        txnid_most_bits: most,
                        error,
                        message,
                        request_id,
                        ..Default::default()
                    }
                })
        ),
        Type::NewTxn => command!(
            t,
            new_txn,
            (any::<u64>(), opt(any::<u64>()), opt(any::<u64>())).prop_map(
                |(request_id, ttl, tc_id)| CommandNewTxn {
                    request_id,
                    txn_ttl_seconds: ttl,
                    tc_id,
                    ..Default::default()
                }
            )
        ),
        Type::NewTxnResponse => command!(
            t,
            new_txn_response,
            txn_response().prop_map(|(request_id, least, most, error, message)| {
                CommandNewTxnResponse {
                    request_id,
                    txnid_least_bits: least,
                    txnid_most_bits: most,
                    error,
                    message,
                    ..Default::default()
                }
            })
        ),
        Type::AddPartitionToTxn => command!(
            t,
            add_partition_to_txn,
            (
                any::<u64>(),
                opt(any::<u64>()),
                opt(any::<u64>()),
                vec(text(), 0..4)
            )
                .prop_map(|(request_id, least, most, partitions)| {
                    CommandAddPartitionToTxn {
                        request_id,
                        txnid_least_bits: least,
                        txnid_most_bits: most,
                        partitions,
                        ..Default::default()
                    }
                })
        ),
        Type::AddPartitionToTxnResponse => command!(
            t,
            add_partition_to_txn_response,
            txn_response().prop_map(|(request_id, least, most, error, message)| {
                CommandAddPartitionToTxnResponse {
                    request_id,
                    txnid_least_bits: least,
                    txnid_most_bits: most,
                    error,
                    message,
                    ..Default::default()
                }
            })
        ),
        Type::AddSubscriptionToTxn => command!(
            t,
            add_subscription_to_txn,
            (
                any::<u64>(),
                opt(any::<u64>()),
                opt(any::<u64>()),
                vec(
                    (text(), text()).prop_map(|(topic, subscription)| Subscription {
                        topic,
                        subscription,
                        ..Default::default()
                    }),
                    0..4
                ),
            )
                .prop_map(|(request_id, least, most, subscription)| {
                    CommandAddSubscriptionToTxn {
                        request_id,
                        txnid_least_bits: least,
                        txnid_most_bits: most,
                        subscription,
                        ..Default::default()
                    }
                })
        ),
        Type::AddSubscriptionToTxnResponse => command!(
            t,
            add_subscription_to_txn_response,
            txn_response().prop_map(|(request_id, least, most, error, message)| {
                CommandAddSubscriptionToTxnResponse {
                    request_id,
                    txnid_least_bits: least,
                    txnid_most_bits: most,
                    error,
                    message,
                    ..Default::default()
                }
            })
        ),
        Type::EndTxn => command!(
            t,
            end_txn,
            (
                any::<u64>(),
                opt(any::<u64>()),
                opt(any::<u64>()),
                opt(enum_value(2))
            )
                .prop_map(|(request_id, least, most, action)| CommandEndTxn {
                    request_id,
                    txnid_least_bits: least,
                    txnid_most_bits: most,
                    txn_action: action,
                    ..Default::default()
                })
        ),
        Type::EndTxnResponse => command!(
            t,
            end_txn_response,
            txn_response().prop_map(|(request_id, least, most, error, message)| {
                CommandEndTxnResponse {
                    request_id,
                    txnid_least_bits: least,
                    txnid_most_bits: most,
                    error,
                    message,
                    ..Default::default()
                }
            })
        ),
        Type::TcClientConnectRequest => command!(
            t,
            tc_client_connect_request,
            (any::<u64>(), any::<u64>()).prop_map(|(request_id, tc_id)| {
                CommandTcClientConnectRequest {
                    request_id,
                    tc_id,
                    ..Default::default()
                }
            })
        ),
        Type::TcClientConnectResponse => command!(
            t,
            tc_client_connect_response,
            (any::<u64>(), opt(enum_value(26)), opt(text())).prop_map(
                |(request_id, error, message)| CommandTcClientConnectResponse {
                    request_id,
                    error,
                    message,
                    ..Default::default()
                }
            )
        ),
        Type::ConsumerStats => command!(
            t,
            consumer_stats,
            (any::<u64>(), any::<u64>()).prop_map(|(request_id, consumer_id)| {
                CommandConsumerStats {
                    request_id,
                    consumer_id,
                    ..Default::default()
                }
            })
        ),
        Type::Seek => command!(
            t,
            seek,
            (
                any::<u64>(),
                any::<u64>(),
                opt(message_id()),
                opt(any::<u64>())
            )
                .prop_map(|(consumer_id, request_id, message_id, publish_time)| {
                    CommandSeek {
                        consumer_id,
                        request_id,
                        message_id,
                        message_publish_time: publish_time,
                        ..Default::default()
                    }
                })
        ),
        Type::GetLastMessageId => command!(
            t,
            get_last_message_id,
            (any::<u64>(), any::<u64>()).prop_map(|(consumer_id, request_id)| {
                CommandGetLastMessageId {
                    consumer_id,
                    request_id,
                    ..Default::default()
                }
            })
        ),
        Type::GetLastMessageIdResponse => command!(
            t,
            get_last_message_id_response,
            (message_id(), any::<u64>(), opt(message_id())).prop_map(
                |(last_message_id, request_id, mark_delete)| CommandGetLastMessageIdResponse {
                    last_message_id,
                    request_id,
                    consumer_mark_delete_position: mark_delete,
                    ..Default::default()
                }
            )
        ),
        Type::GetTopicsOfNamespaceResponse => command!(
            t,
            get_topics_of_namespace_response,
            (any::<u64>(), vec(text(), 0..4), any::<bool>()).prop_map(
                |(request_id, topics, filtered)| CommandGetTopicsOfNamespaceResponse {
                    request_id,
                    topics,
                    filtered: Some(filtered),
                    ..Default::default()
                }
            )
        ),
        Type::GetTopicsOfNamespace => command!(
            t,
            get_topics_of_namespace,
            (any::<u64>(), text()).prop_map(|(request_id, namespace)| {
                CommandGetTopicsOfNamespace {
                    request_id,
                    namespace,
                    ..Default::default()
                }
            })
        ),
        Type::GetSchema => command!(
            t,
            get_schema,
            (any::<u64>(), text()).prop_map(|(request_id, topic)| CommandGetSchema {
                request_id,
                topic,
                ..Default::default()
            })
        ),
        Type::GetOrCreateSchema => command!(
            t,
            get_or_create_schema,
            (any::<u64>(), text()).prop_map(|(request_id, topic)| CommandGetOrCreateSchema {
                request_id,
                topic,
                ..Default::default()
            })
        ),
        Type::AuthChallenge => command!(
            t,
            auth_challenge,
            (opt(text()), opt(auth_data()), opt(any::<i32>())).prop_map(
                |(server_version, challenge, protocol_version)| CommandAuthChallenge {
                    server_version,
                    challenge,
                    protocol_version,
                }
            )
        ),
        Type::AuthResponse => command!(
            t,
            auth_response,
            (opt(text()), opt(auth_data()), opt(any::<i32>())).prop_map(
                |(client_version, response, protocol_version)| CommandAuthResponse {
                    client_version,
                    response,
                    protocol_version,
                }
            )
        ),
        Type::EndTxnOnPartition => command!(
            t,
            end_txn_on_partition,
            any::<u64>().prop_map(|request_id| CommandEndTxnOnPartition {
                request_id,
                ..Default::default()
            })
        ),
        Type::EndTxnOnSubscription => command!(
            t,
            end_txn_on_subscription,
            any::<u64>().prop_map(|request_id| CommandEndTxnOnSubscription {
                request_id,
                ..Default::default()
            })
        ),
        Type::WatchTopicList => command!(
            t,
            watch_topic_list,
            (any::<u64>(), any::<u64>()).prop_map(|(request_id, watcher_id)| {
                CommandWatchTopicList {
                    request_id,
                    watcher_id,
                    ..Default::default()
                }
            })
        ),
        Type::WatchTopicListClose => command!(
            t,
            watch_topic_list_close,
            (any::<u64>(), any::<u64>()).prop_map(|(request_id, watcher_id)| {
                CommandWatchTopicListClose {
                    request_id,
                    watcher_id,
                    ..Default::default()
                }
            })
        ),
        _ => return None,
    };
    Some(strategy)
}

/// Every value of `BaseCommand.Type` in the proto subset.
fn all_types() -> Vec<Type> {
    (0..=255).filter_map(|n| Type::try_from(n).ok()).collect()
}

/// Any command of any type.
fn any_command() -> impl Strategy<Value = BaseCommand> {
    prop::sample::select(all_types()).prop_flat_map(|t| {
        command(t).unwrap_or_else(|| panic!("no strategy for {t:?} in codec_fuzz_tests.rs"))
    })
}

/// `SEND` or `MESSAGE` frames with arbitrary metadata and payload.
fn payload_frame() -> impl Strategy<Value = Frame> {
    (
        prop_oneof![
            command(Type::Send).expect("SEND"),
            command(Type::Message).expect("MESSAGE")
        ],
        message_metadata(),
        bytes(300),
    )
        .prop_map(|(command, metadata, data)| {
            Frame::with_payload(command, metadata, Bytes::from(data))
        })
}

/// Any frame this crate can send or receive.
fn any_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![any_command().prop_map(Frame::command), payload_frame()]
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn encoded(frame: &Frame) -> BytesMut {
    let mut buf = BytesMut::new();
    encode_frame(frame, &mut buf);
    buf
}

/// Decodes every frame in `bytes`, as a connection would, until the codec wants more bytes or
/// fails. Each payload is also split as a batch, as a consumer would. Must never panic.
fn decode_stream(codec: &mut PulsarCodec, bytes: &[u8]) -> (Vec<Frame>, Option<Error>) {
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    loop {
        let before = buf.len();
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => {
                assert!(buf.len() < before, "a decoded frame consumed no bytes");
                if let Some(payload) = &frame.payload {
                    let _ = decode_batch(&payload.metadata, payload.data.clone());
                }
                frames.push(frame);
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete frame consumed bytes");
                return (frames, None);
            }
            Err(e) => return (frames, Some(e)),
        }
    }
}

/// What encoding a decoded frame keeps: the broker entry metadata is not re-sent and the
/// checksum is recomputed.
fn as_sent(mut frame: Frame) -> Frame {
    if let Some(payload) = &mut frame.payload {
        payload.checksum_ok = true;
        payload.broker_entry = None;
    }
    frame
}

/// The offset of the 0x0e01 magic number in an encoded payload frame.
fn magic_at(frame: &Frame) -> usize {
    8 + frame.command.encoded_len()
}

/// The number of the first field after `type` in an encoded `BaseCommand` (its member).
fn member_field_number(command: &BaseCommand) -> Option<u32> {
    let encoded = command.encode_to_vec();
    let mut buf = &encoded[..];
    let (tag, wire_type) = prost::encoding::decode_key(&mut buf).ok()?;
    assert_eq!(tag, 1, "type is not the first field");
    prost::encoding::skip_field(wire_type, tag, &mut buf, Default::default()).ok()?;
    if buf.is_empty() {
        return None;
    }
    prost::encoding::decode_key(&mut buf).ok().map(|(n, _)| n)
}

// ---------------------------------------------------------------------------------------------
// Round trips.

/// Every member of `BaseCommand` round-trips through the codec with arbitrary field values,
/// 64 cases per command type.
#[test]
fn every_command_type_round_trips() {
    let types = all_types();
    assert!(types.len() >= 36, "only {} command types", types.len());
    for t in types {
        let strategy = command(t).unwrap_or_else(|| {
            panic!("BaseCommand type {t:?} has no strategy in codec_fuzz_tests.rs: add one")
        });
        let mut runner = TestRunner::new(Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&strategy, |command| {
                prop_assert_eq!(command.r#type, t as i32);
                prop_assert_eq!(
                    member_field_number(&command),
                    Some(t as u32),
                    "the member set for {:?} is not field {}",
                    t,
                    t as i32
                );
                let frame = Frame::command(command);
                let mut codec = PulsarCodec::default();
                let mut buf = BytesMut::new();
                codec.encode(frame.clone(), &mut buf).unwrap();
                prop_assert_eq!(&buf[..], &encoded(&frame)[..]);
                prop_assert_eq!(codec.decode(&mut buf).unwrap(), Some(frame));
                prop_assert!(buf.is_empty());
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{t:?}: {e}"));
    }
}

proptest! {
    #![proptest_config(Config { failure_persistence: None, ..Config::default() })]

    /// Payload frames (`SEND`, `MESSAGE`) with arbitrary metadata and payload round-trip, with
    /// a valid checksum over `[meta size][meta][payload]`.
    #[test]
    fn payload_frames_round_trip(frame in payload_frame()) {
        let bytes = encoded(&frame);
        let at = magic_at(&frame);
        prop_assert_eq!(&bytes[at..at + 2], &MAGIC_CRC32C.to_be_bytes()[..]);
        let crc = u32::from_be_bytes(bytes[at + 2..at + 6].try_into().unwrap());
        prop_assert_eq!(crc, crc32c::crc32c(&bytes[at + 6..]));
        let total = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        prop_assert_eq!(total + 4, bytes.len());
        let mut buf = bytes.clone();
        prop_assert_eq!(PulsarCodec::default().decode(&mut buf).unwrap(), Some(frame.clone()));
        prop_assert_eq!(decode_frame(bytes.freeze().slice(4..)).unwrap(), frame);
    }

    /// Several frames back to back decode in order, whatever the chunking of the stream.
    #[test]
    fn streams_of_frames_decode_in_any_chunking(
        frames in vec(any_frame(), 1..6),
        cuts in vec(any::<Index>(), 0..8),
    ) {
        let mut stream = BytesMut::new();
        for frame in &frames {
            encode_frame(frame, &mut stream);
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len())).collect();
        cuts.push(stream.len());
        cuts.sort_unstable();
        let mut codec = PulsarCodec::default();
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        let mut from = 0;
        for cut in cuts {
            buf.extend_from_slice(&stream[from..cut]);
            from = cut;
            while let Some(frame) = codec.decode(&mut buf).unwrap() {
                decoded.push(frame);
            }
        }
        prop_assert_eq!(decoded, frames);
        prop_assert!(buf.is_empty());
    }

    /// A MESSAGE frame carrying a batch: the frame and the batch both round-trip.
    #[test]
    fn batches_in_message_frames_round_trip(
        command in command(Type::Message).expect("MESSAGE"),
        metadata in message_metadata(),
        messages in vec(batched_message(), 1..40),
    ) {
        let metadata = MessageMetadata {
            num_messages_in_batch: Some(messages.len() as i32),
            compression: None,
            ..metadata
        };
        let frame = Frame::with_payload(command, metadata, encode_batch(&messages));
        let decoded = PulsarCodec::default().decode(&mut encoded(&frame)).unwrap().unwrap();
        prop_assert_eq!(&decoded, &frame);
        let payload = decoded.payload.unwrap();
        let batch = decode_batch(&payload.metadata, payload.data).unwrap();
        prop_assert_eq!(batch.len(), messages.len());
        for (got, sent) in batch.iter().zip(&messages) {
            prop_assert_eq!(&got.payload, &sent.payload);
            let mut expected = sent.metadata.clone();
            expected.payload_size = sent.payload.len() as i32;
            prop_assert_eq!(&got.metadata, &expected);
        }
    }

    /// Broker entry metadata before the magic number is read and skipped; the checksum still
    /// holds.
    #[test]
    fn broker_entry_metadata_round_trips(
        frame in payload_frame(),
        broker_timestamp in opt(any::<u64>()),
        index in opt(any::<u64>()),
    ) {
        let entry = BrokerEntryMetadata { broker_timestamp, index, ..Default::default() };
        let entry_bytes = entry.encode_to_vec();
        let plain = encoded(&frame);
        let at = magic_at(&frame);
        let mut with_entry = BytesMut::new();
        with_entry.put_u32((plain.len() - 4 + 6 + entry_bytes.len()) as u32);
        with_entry.put_slice(&plain[4..at]);
        with_entry.put_u16(MAGIC_BROKER_ENTRY_METADATA);
        with_entry.put_u32(entry_bytes.len() as u32);
        with_entry.put_slice(&entry_bytes);
        with_entry.put_slice(&plain[at..]);
        let decoded = PulsarCodec::default().decode(&mut with_entry).unwrap().unwrap();
        let payload = decoded.payload.as_ref().unwrap();
        prop_assert!(payload.checksum_ok);
        prop_assert_eq!(payload.broker_entry.as_ref(), Some(&entry));
        prop_assert_eq!(as_sent(decoded), frame);
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile input: never a panic.

/// Valid frames with random bytes overwritten.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (any_frame(), vec((any::<Index>(), any::<u8>()), 1..6)).prop_map(|(frame, edits)| {
        let mut bytes = encoded(&frame).to_vec();
        for (at, byte) in edits {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        bytes
    })
}

/// A plausible header (total and command size that fit) followed by random bytes.
fn random_body() -> impl Strategy<Value = Vec<u8>> {
    (bytes(400), any::<Index>(), any::<bool>()).prop_map(|(body, command_size, magic)| {
        let mut out = BytesMut::new();
        let command_size = command_size.index(body.len() + 1);
        out.put_u32((4 + body.len() + if magic { 2 } else { 0 }) as u32);
        out.put_u32(command_size as u32);
        out.put_slice(&body[..command_size]);
        if magic {
            out.put_u16(MAGIC_CRC32C);
        }
        out.put_slice(&body[command_size..]);
        out.to_vec()
    })
}

fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(600),
        // Small sizes, so that random bytes get past the size check.
        (0u32..600, bytes(600)).prop_map(|(total, rest)| {
            let mut out = total.to_be_bytes().to_vec();
            out.extend(rest);
            out
        }),
        mutated_frame(),
        random_body(),
    ]
}

proptest! {
    #![proptest_config(Config { cases: 1024, failure_persistence: None, ..Config::default() })]

    /// Random, mutated and half-valid byte streams: the codec returns frames, asks for more or
    /// fails, and never panics, whatever its size limit. A frame it accepts re-encodes to a
    /// frame that decodes to the same thing.
    #[test]
    fn hostile_streams_never_panic(input in hostile_bytes(), max in prop_oneof![Just(DEFAULT_MAX_FRAME_SIZE), 0usize..700]) {
        let mut codec = PulsarCodec::new(max);
        let (frames, _) = decode_stream(&mut codec, &input);
        for frame in frames {
            let frame = as_sent(frame);
            let again = PulsarCodec::default().decode(&mut encoded(&frame)).unwrap();
            prop_assert_eq!(again, Some(frame));
        }
        if input.len() >= 4 {
            let _ = decode_frame(Bytes::copy_from_slice(&input[4..]));
        }
        let _ = decode_frame(Bytes::from(input));
    }
}

proptest! {
    #![proptest_config(Config { failure_persistence: None, ..Config::default() })]

    /// Every strict prefix of a valid frame is "not yet" to the streaming decoder, which
    /// consumes nothing and reserves no more than the announced frame.
    #[test]
    fn every_prefix_waits_for_more(frame in any_frame()) {
        let bytes = encoded(&frame);
        for len in 0..bytes.len() {
            let mut prefix = BytesMut::from(&bytes[..len]);
            let capacity_before = prefix.capacity();
            prop_assert_eq!(PulsarCodec::default().decode(&mut prefix).unwrap(), None);
            prop_assert_eq!(&prefix[..], &bytes[..len]);
            prop_assert!(prefix.capacity() <= bytes.len().max(2 * capacity_before));
        }
    }

    /// A frame whose body is cut anywhere, with its total size rewritten to match (so the
    /// decoder sees a complete but truncated frame): cut in the header, the command, the
    /// checksummed header or the metadata, it is an error; cut in the payload it decodes with
    /// the checksum flagged; cut right after the command it is a simple frame.
    #[test]
    fn truncated_frames_are_errors_or_flagged(frame in any_frame()) {
        let bytes = encoded(&frame);
        let body = bytes.clone().freeze().slice(4..);
        let command_end = 4 + frame.command.encoded_len();
        let payload_start = frame.payload.as_ref().map(|p| {
            command_end + 2 + 4 + 4 + p.metadata.encoded_len()
        });
        for len in 0..body.len() {
            let mut rewritten = BytesMut::new();
            rewritten.put_u32(len as u32);
            rewritten.put_slice(&body[..len]);
            let via_codec = PulsarCodec::default().decode(&mut rewritten);
            let direct = decode_frame(body.slice(..len));
            prop_assert_eq!(format!("{via_codec:?}"), format!("{:?}", direct.clone().map(Some)));
            match direct {
                Err(Error::MalformedFrame { .. }) => {
                    prop_assert!(len != command_end, "cut after the command must decode");
                    prop_assert!(payload_start.is_none_or(|start| len < start));
                }
                Err(e) => prop_assert!(false, "unexpected error kind {e:?}"),
                Ok(decoded) => {
                    if len == command_end {
                        prop_assert_eq!(decoded, Frame::command(frame.command.clone()));
                    } else {
                        let start = payload_start.expect("only payload frames decode cut");
                        prop_assert!(len >= start, "cut at {len} before the payload at {start}");
                        let payload = decoded.payload.unwrap();
                        prop_assert!(!payload.checksum_ok, "a truncated payload passed the checksum");
                        let sent = frame.payload.as_ref().unwrap();
                        prop_assert_eq!(&payload.metadata, &sent.metadata);
                        prop_assert_eq!(&payload.data[..], &sent.data[..len - start]);
                    }
                }
            }
        }
    }

    /// Any magic number but 0x0e01 (and 0x0e02, which announces broker entry metadata) where
    /// the payload part starts is a malformed frame.
    #[test]
    fn wrong_magic_is_an_error(frame in payload_frame(), magic in any::<u16>()) {
        let at = magic_at(&frame);
        let mut bytes = encoded(&frame);
        bytes[at..at + 2].copy_from_slice(&magic.to_be_bytes());
        let result = PulsarCodec::default().decode(&mut bytes);
        match magic {
            MAGIC_CRC32C => prop_assert_eq!(result.unwrap(), Some(frame)),
            MAGIC_BROKER_ENTRY_METADATA => {}
            _ => prop_assert!(
                matches!(result, Err(Error::MalformedFrame { .. })),
                "{result:?}"
            ),
        }
    }

    /// A wrong checksum, or a corrupted metadata or payload byte, is flagged on the frame,
    /// not fatal: the connection goes on and the consumer reports ChecksumMismatch.
    #[test]
    fn bad_checksums_are_flagged(
        frame in payload_frame(),
        checksum in any::<u32>(),
        corrupt in opt((any::<Index>(), 1u8..=255)),
    ) {
        let at = magic_at(&frame);
        let mut bytes = encoded(&frame);
        let metadata_start = at + 10;
        let mut expected = frame.clone();
        match corrupt {
            // Flip bits of one payload byte (never in the metadata, which then might not
            // decode at all).
            Some((index, flip)) if !frame.payload.as_ref().unwrap().data.is_empty() => {
                let data_start = metadata_start + frame.payload.as_ref().unwrap().metadata.encoded_len();
                let i = data_start + index.index(bytes.len() - data_start);
                bytes[i] ^= flip;
                let payload = expected.payload.as_mut().unwrap();
                let mut data = payload.data.to_vec();
                data[i - data_start] ^= flip;
                payload.data = Bytes::from(data);
                payload.checksum_ok = false;
            }
            _ => {
                let good = u32::from_be_bytes(bytes[at + 2..at + 6].try_into().unwrap());
                prop_assume!(checksum != good);
                bytes[at + 2..at + 6].copy_from_slice(&checksum.to_be_bytes());
                expected.payload.as_mut().unwrap().checksum_ok = false;
            }
        }
        let mut stream = bytes.clone();
        encode_frame(&frame, &mut stream);
        let mut codec = PulsarCodec::default();
        prop_assert_eq!(codec.decode(&mut stream).unwrap(), Some(expected));
        // The next frame on the connection is unaffected.
        prop_assert_eq!(codec.decode(&mut stream).unwrap(), Some(frame));
        prop_assert!(stream.is_empty());
    }

    /// A total size above the limit is refused from the first 4 bytes, before anything is
    /// reserved for it, however many bytes follow.
    #[test]
    fn oversized_frames_are_refused_before_allocating(
        max in prop_oneof![Just(DEFAULT_MAX_FRAME_SIZE), 0usize..1 << 20],
        excess in prop_oneof![1u64..16, any::<u32>().prop_map(u64::from)],
        tail in bytes(64),
    ) {
        let total = (max as u64).saturating_add(excess).min(u64::from(u32::MAX));
        prop_assume!(total > max as u64);
        let mut buf = BytesMut::new();
        buf.put_u32(total as u32);
        buf.put_slice(&tail);
        let (len, capacity) = (buf.len(), buf.capacity());
        let result = PulsarCodec::new(max).decode(&mut buf);
        prop_assert!(
            matches!(result, Err(Error::FrameTooLarge { size, max: m }) if size as u64 == total && m == max),
            "{result:?}"
        );
        prop_assert_eq!((buf.len(), buf.capacity()), (len, capacity));
    }

    /// A total size within the limit reserves at most that frame (so never more than the
    /// limit), whatever the limit.
    #[test]
    fn reservations_stay_within_the_limit(
        max in 8usize..1 << 22,
        total in any::<Index>(),
        have in any::<Index>(),
    ) {
        let total = total.index(max + 1);
        let mut buf = BytesMut::new();
        buf.put_u32(total as u32);
        buf.put_slice(&vec![0; have.index(total.min(4096) + 1).min(total.saturating_sub(1))]);
        let buf_len = buf.len();
        let mut buf = BytesMut::from(&buf[..]);
        let capacity_before = buf.capacity();
        let result = PulsarCodec::new(max).decode(&mut buf);
        if buf_len < 4 + total {
            prop_assert!(matches!(result, Ok(None)), "{result:?}");
            prop_assert!(buf.capacity() >= 4 + total, "the frame's room was not reserved");
        }
        prop_assert!(
            buf.capacity() <= (4 + total).max(2 * capacity_before),
            "reserved {} for a frame of {}",
            buf.capacity(),
            4 + total
        );
        prop_assert!(buf.capacity() <= (4 + max).max(2 * capacity_before));
    }

    /// Command, metadata and broker-entry sizes larger than what remains are errors (the
    /// decoder never trusts an inner size).
    #[test]
    fn lying_inner_sizes_are_errors(frame in payload_frame(), lie in any::<u32>(), which in 0..3u8) {
        let at = magic_at(&frame);
        let mut bytes = encoded(&frame);
        let remaining_after = |offset: usize, bytes: &BytesMut| (bytes.len() - offset) as u64;
        match which {
            0 => {
                prop_assume!(u64::from(lie) > remaining_after(8, &bytes));
                bytes[4..8].copy_from_slice(&lie.to_be_bytes());
            }
            1 => {
                prop_assume!(u64::from(lie) > remaining_after(at + 10, &bytes));
                bytes[at + 6..at + 10].copy_from_slice(&lie.to_be_bytes());
            }
            _ => {
                // Announce broker entry metadata whose size runs past the end.
                prop_assume!(u64::from(lie) > remaining_after(at, &bytes));
                let mut lying = BytesMut::new();
                lying.put_u32((bytes.len() - 4 + 6) as u32);
                lying.put_slice(&bytes[4..at]);
                lying.put_u16(MAGIC_BROKER_ENTRY_METADATA);
                lying.put_u32(lie);
                lying.put_slice(&bytes[at..]);
                bytes = lying;
            }
        }
        let result = PulsarCodec::default().decode(&mut bytes);
        prop_assert!(matches!(result, Err(Error::MalformedFrame { .. })), "{result:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Batches.

/// Batch payloads: random bytes, or a run of `[u32 size][bytes]` records with sizes that may
/// lie.
fn batch_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        bytes(600),
        vec((bytes(40), opt(any::<u32>()), bytes(40)), 0..12).prop_map(|records| {
            let mut out = BytesMut::new();
            for (metadata, lie, payload) in records {
                out.put_u32(lie.unwrap_or(metadata.len() as u32));
                out.put_slice(&metadata);
                out.put_slice(&payload);
            }
            out.to_vec()
        }),
        (
            vec(batched_message(), 1..10),
            vec((any::<Index>(), any::<u8>()), 0..4)
        )
            .prop_map(|(messages, edits)| {
                let mut out = encode_batch(&messages).to_vec();
                if !out.is_empty() {
                    for (at, byte) in edits {
                        let at = at.index(out.len());
                        out[at] = byte;
                    }
                }
                out
            }),
    ]
}

proptest! {
    #![proptest_config(Config { cases: 1024, failure_persistence: None, ..Config::default() })]

    /// Random batch payloads with random `num_messages_in_batch` and compression: `Ok` or
    /// `Err`, never a panic; when `Ok`, exactly the declared number of messages, each with
    /// the payload size its metadata declares.
    #[test]
    fn random_batches_never_panic(
        data in batch_payload(),
        count in opt(prop_oneof![-2i32..40, any::<i32>()]),
        compression in opt(prop_oneof![4 => Just(0), 1 => enum_value(5)]),
    ) {
        let metadata = MessageMetadata {
            num_messages_in_batch: count,
            compression,
            ..MessageMetadata::default()
        };
        let len = data.len();
        if let Ok(messages) = decode_batch(&metadata, Bytes::from(data)) {
            prop_assert_eq!(messages.len() as i32, count.unwrap_or(1));
            let mut used = 0;
            for message in &messages {
                prop_assert_eq!(message.payload.len() as i64, i64::from(message.metadata.payload_size));
                used += 4 + message.payload.len();
            }
            prop_assert!(used <= len, "decoded more than the payload held");
        }
    }

    /// Batches round-trip; a declared count above the real one is an error and one below it
    /// yields the first messages.
    #[test]
    fn batches_round_trip(messages in vec(batched_message(), 1..30), shift in -3i32..=3) {
        let data = encode_batch(&messages);
        let count = messages.len() as i32 + shift;
        let metadata = MessageMetadata {
            num_messages_in_batch: Some(count),
            ..MessageMetadata::default()
        };
        let result = decode_batch(&metadata, data);
        if count > messages.len() as i32 || count < 1 {
            prop_assert!(matches!(result, Err(Error::MalformedBatch { .. })), "{result:?}");
        } else if let Ok(decoded) = result {
            prop_assert_eq!(decoded.len() as i32, count);
            for (got, sent) in decoded.iter().zip(&messages) {
                prop_assert_eq!(&got.payload, &sent.payload);
                prop_assert_eq!(&got.metadata.properties, &sent.metadata.properties);
                prop_assert_eq!(got.metadata.payload_size as usize, sent.payload.len());
            }
        } else {
            prop_assert!(false, "a valid batch did not decode: {result:?}");
        }
    }
}
