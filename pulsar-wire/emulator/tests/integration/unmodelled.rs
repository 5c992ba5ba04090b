//! Commands the emulator does not model are answered at once (an error naming the command),
//! not left to the client's timeout; GET_LAST_MESSAGE_ID is modelled minimally.

use std::time::Duration;

use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{self, BaseCommand, ServerError};
use pulsar_wire::wire::{ConnectionExt, ConsumerExt, Frame, command_frame};
use pulsar_wire::{Connection, ConsumerOptions, Error, SubType};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, receive, send_all, within};

/// An answer that comes at once arrives well before this.
const AT_ONCE: Duration = Duration::from_secs(1);

/// A consumer's connection and id on `topic`, with one message received from it.
async fn wire(setup: &Setup, topic: &str) -> (pulsar_wire::Consumer, Connection, u64) {
    let consumer = setup
        .consumer(
            topic,
            ConsumerOptions::default().sub_type(SubType::Exclusive),
        )
        .await;
    let producer = setup.producer(topic, 0).await;
    send_all(&producer, 1).await;
    let message = receive(&consumer, 1).await.remove(0);
    let (connection, consumer_id) = consumer.wire_of(&message).expect("our message");
    (consumer, connection, consumer_id)
}

/// Sends a request and returns its answer, which must come within [`AT_ONCE`].
async fn ask(
    connection: &Connection,
    name: &'static str,
    build: impl FnOnce(u64) -> Frame + Send,
) -> Result<BaseCommand, Error> {
    within(AT_ONCE, connection.request(name, build))
        .await
        .unwrap_or_else(|| panic!("no answer to {name} within {AT_ONCE:?}"))
}

fn assert_not_implemented(answer: Result<BaseCommand, Error>, name: &str) {
    match answer {
        Err(Error::Server { code, message, .. }) => {
            assert_eq!(
                code,
                ServerError::NotAllowedError as i32,
                "{name}: {message}"
            );
            assert_eq!(
                message,
                format!("the pulsar-wire emulator does not implement {name}")
            );
        }
        other => panic!("{name}: expected NotAllowedError, got {other:?}"),
    }
}

#[tokio::test]
async fn unmodelled_requests_get_an_error_at_once() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let (_consumer, connection, consumer_id) = wire(&setup, "unmodelled").await;
    let answer = ask(&connection, "CONSUMER_STATS", |request_id| {
        command_frame(Type::ConsumerStats, |c| {
            c.consumer_stats = Some(pb::CommandConsumerStats {
                request_id,
                consumer_id,
            });
        })
    })
    .await;
    assert_not_implemented(answer, "CONSUMER_STATS");
    let answer = ask(&connection, "GET_SCHEMA", |request_id| {
        command_frame(Type::GetSchema, |c| {
            c.get_schema = Some(pb::CommandGetSchema {
                request_id,
                topic: "unmodelled".into(),
            });
        })
    })
    .await;
    assert_not_implemented(answer, "GET_SCHEMA");
    let answer = ask(&connection, "GET_OR_CREATE_SCHEMA", |request_id| {
        command_frame(Type::GetOrCreateSchema, |c| {
            c.get_or_create_schema = Some(pb::CommandGetOrCreateSchema {
                request_id,
                topic: "unmodelled".into(),
            });
        })
    })
    .await;
    assert_not_implemented(answer, "GET_OR_CREATE_SCHEMA");
    let answer = ask(&connection, "END_TXN_ON_PARTITION", |request_id| {
        command_frame(Type::EndTxnOnPartition, |c| {
            c.end_txn_on_partition = Some(pb::CommandEndTxnOnPartition { request_id });
        })
    })
    .await;
    assert_not_implemented(answer, "END_TXN_ON_PARTITION");
    let answer = ask(&connection, "END_TXN_ON_SUBSCRIPTION", |request_id| {
        command_frame(Type::EndTxnOnSubscription, |c| {
            c.end_txn_on_subscription = Some(pb::CommandEndTxnOnSubscription { request_id });
        })
    })
    .await;
    assert_not_implemented(answer, "END_TXN_ON_SUBSCRIPTION");
    let answer = ask(&connection, "WATCH_TOPIC_LIST", |request_id| {
        command_frame(Type::WatchTopicList, |c| {
            c.watch_topic_list = Some(pb::CommandWatchTopicList {
                request_id,
                watcher_id: 1,
            });
        })
    })
    .await;
    assert_not_implemented(answer, "WATCH_TOPIC_LIST");
    let answer = ask(&connection, "WATCH_TOPIC_LIST_CLOSE", |request_id| {
        command_frame(Type::WatchTopicListClose, |c| {
            c.watch_topic_list_close = Some(pb::CommandWatchTopicListClose {
                request_id,
                watcher_id: 1,
            });
        })
    })
    .await;
    assert_not_implemented(answer, "WATCH_TOPIC_LIST_CLOSE");
    let stats = setup.stats();
    assert_eq!(stats.unmodelled_commands.values().sum::<u64>(), 7);
    assert_eq!(
        stats.unmodelled_commands.get(&(Type::ConsumerStats as i32)),
        Some(&1)
    );
}

#[tokio::test]
async fn commands_without_a_request_id_are_logged_and_the_connection_stays() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let (_consumer, connection, consumer_id) = wire(&setup, "no-request-id").await;
    // A type number the proto subset does not know (41 to 49 are unused by the protocol),
    // AUTH_RESPONSE without a challenge, and a command only a broker sends.
    let unknown = Frame::command(BaseCommand {
        r#type: 45,
        ..BaseCommand::default()
    });
    connection.send(unknown).expect("sent");
    connection
        .send(command_frame(Type::AuthResponse, |c| {
            c.auth_response = Some(pb::CommandAuthResponse::default());
        }))
        .expect("sent");
    connection
        .send(command_frame(Type::Success, |c| {
            c.success = Some(pb::CommandSuccess { request_id: 999 });
        }))
        .expect("sent");
    // Still served, in order, at once.
    let answer = ask(&connection, "GET_LAST_MESSAGE_ID", |request_id| {
        command_frame(Type::GetLastMessageId, |c| {
            c.get_last_message_id = Some(pb::CommandGetLastMessageId {
                consumer_id,
                request_id,
            });
        })
    })
    .await
    .expect("answered");
    assert!(answer.get_last_message_id_response.is_some());
    assert!(!connection.is_closed());
    let stats = setup.stats();
    assert_eq!(stats.unmodelled_commands.get(&45), Some(&1));
    assert_eq!(
        stats.unmodelled_commands.get(&(Type::AuthResponse as i32)),
        Some(&1)
    );
    assert_eq!(
        stats.unmodelled_commands.get(&(Type::Success as i32)),
        Some(&1)
    );
    assert_eq!(stats.faults.malformed_frames, 0);
}

#[tokio::test]
async fn get_last_message_id_reports_the_last_entry_and_the_mark_delete() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let (consumer, connection, consumer_id) = wire(&setup, "last").await;
    let last = |connection: Connection| async move {
        let answer = ask(&connection, "GET_LAST_MESSAGE_ID", |request_id| {
            command_frame(Type::GetLastMessageId, |c| {
                c.get_last_message_id = Some(pb::CommandGetLastMessageId {
                    consumer_id,
                    request_id,
                });
            })
        })
        .await
        .expect("answered");
        answer
            .get_last_message_id_response
            .expect("a GET_LAST_MESSAGE_ID_RESPONSE")
    };
    // Entry 0 holds the one unbatched message; nothing is acknowledged yet.
    let response = last(connection.clone()).await;
    assert_eq!(response.last_message_id.entry_id, 0);
    assert_eq!(response.last_message_id.batch_index, None);
    let mark_delete = response.consumer_mark_delete_position.expect("sent");
    assert_eq!(mark_delete.entry_id, u64::MAX, "-1: nothing deleted");
    // A batch of 3 in entry 1: its largest batch index is 2.
    let batched = setup.producer("last", 3).await;
    send_all(&batched, 3).await;
    let messages = receive(&consumer, 3).await;
    consumer.ack_cumulative(&messages[2]).await.expect("queued");
    consumer.flush_acks().await;
    let response = last(connection.clone()).await;
    assert_eq!(response.last_message_id.entry_id, 1);
    assert_eq!(response.last_message_id.batch_index, Some(2));
    assert_eq!(
        response.last_message_id.ledger_id,
        messages[2].position().ledger_id()
    );
    let mark_delete = response.consumer_mark_delete_position.expect("sent");
    assert_eq!(mark_delete.entry_id, 1);

    // A consumer unknown on this connection.
    let answer = ask(&connection, "GET_LAST_MESSAGE_ID", |request_id| {
        command_frame(Type::GetLastMessageId, |c| {
            c.get_last_message_id = Some(pb::CommandGetLastMessageId {
                consumer_id: consumer_id + 1000,
                request_id,
            });
        })
    })
    .await;
    assert!(
        matches!(answer, Err(Error::Server { code, .. }) if code == ServerError::ConsumerNotFound as i32),
        "{answer:?}"
    );
}
