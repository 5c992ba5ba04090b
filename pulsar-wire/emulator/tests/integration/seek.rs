//! Seek: back and forward to a message id (in a batch or not), to the earliest and the
//! latest, to a publish time, on one partition of a partitioned topic; what was fetched
//! before the seek is dropped; `last_message_id`.

use std::time::Duration;

use pulsar_wire::{
    Consumer, ConsumerOptions, Error, Message, MessageId, OutgoingMessage, SeekTo, SubType,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, assert_quiet, receive, send_all};

fn texts(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect()
}

fn payloads(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

async fn ack_all(consumer: &Consumer, messages: &[Message]) {
    for message in messages {
        consumer.ack(message).await.expect("acked");
    }
    consumer.flush_acks().await;
}

const QUIET: Duration = Duration::from_millis(300);

/// Everything received and acknowledged, then a seek back to the 8th message: what follows
/// it comes again, once, and the subscription drains again. Batched and not, on every
/// subscription type.
#[tokio::test]
async fn a_seek_back_to_an_id_replays_what_follows_it() {
    for per_batch in [0, 5] {
        for sub_type in [SubType::Exclusive, SubType::Shared, SubType::Failover] {
            let setup = Setup::new(EmulatorConfig::default()).await;
            let topic = format!("seek-back-{per_batch}");
            let ids = send_all(&setup.producer(&topic, per_batch).await, 15).await;
            let consumer = setup
                .consumer(&topic, ConsumerOptions::default().sub_type(sub_type))
                .await;
            let all = receive(&consumer, 15).await;
            assert_eq!(texts(&all), payloads(0..15));
            ack_all(&consumer, &all).await;
            setup.assert_drained(&topic).await;
            consumer.seek(ids[7]).await.expect("sought");
            let again = receive(&consumer, 7).await;
            assert_eq!(
                texts(&again),
                payloads(8..15),
                "batch {per_batch}, {sub_type:?}"
            );
            assert_eq!(again[0].id(), ids[8]);
            assert_quiet(&consumer, QUIET).await;
            ack_all(&consumer, &again).await;
            setup.assert_drained(&topic).await;
        }
    }
}

/// Three messages taken of fifteen (the rest fetched ahead), then a seek forward past the
/// 11th: the next message is the 12th, never one fetched before the seek; once the rest is
/// acknowledged nothing is left (the sought message was acknowledged by the consumer).
#[tokio::test]
async fn a_seek_forward_drops_what_was_fetched_before_it() {
    for per_batch in [0, 5] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("seek-forward-{per_batch}");
        let ids = send_all(&setup.producer(&topic, per_batch).await, 15).await;
        let consumer = setup.shared(&topic, ConsumerOptions::default()).await;
        let first = receive(&consumer, 3).await;
        assert_eq!(texts(&first), payloads(0..3));
        consumer.seek(ids[10]).await.expect("sought");
        let rest = receive(&consumer, 4).await;
        assert_eq!(texts(&rest), payloads(11..15), "batch {per_batch}");
        assert_quiet(&consumer, QUIET).await;
        // The messages held from before the seek are still acknowledged fine.
        ack_all(&consumer, &first).await;
        ack_all(&consumer, &rest).await;
        setup.assert_drained(&topic).await;
    }
}

#[tokio::test]
async fn a_seek_to_the_earliest_or_the_latest() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("seek-ends", 4).await;
    send_all(&producer, 10).await;
    let consumer = setup.shared("seek-ends", ConsumerOptions::default()).await;
    let all = receive(&consumer, 10).await;
    ack_all(&consumer, &all).await;
    consumer.seek(SeekTo::Earliest).await.expect("sought");
    let again = receive(&consumer, 10).await;
    assert_eq!(texts(&again), payloads(0..10));
    consumer.seek(SeekTo::Latest).await.expect("sought");
    assert_quiet(&consumer, QUIET).await;
    producer
        .send(OutgoingMessage::new("after"))
        .await
        .expect("sent");
    assert_eq!(texts(&receive(&consumer, 1).await), ["after"]);
}

/// A seek to a publish time starts at the first entry published at or after it: the
/// expected messages are worked out from the publish times the messages carry.
#[tokio::test]
async fn a_seek_to_a_time_starts_at_the_first_entry_published_then() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("seek-time", 3).await;
    for _ in 0..4 {
        send_all(&producer, 6).await;
    }
    let consumer = setup.shared("seek-time", ConsumerOptions::default()).await;
    let all = receive(&consumer, 24).await;
    ack_all(&consumer, &all).await;
    for pick in [0, 7, 13, 23] {
        let time = all[pick].publish_time();
        let expected: Vec<MessageId> = all
            .iter()
            .filter(|m| m.publish_time() >= time)
            .map(Message::id)
            .collect();
        consumer.seek_to_time(time).await.expect("sought");
        let again = receive(&consumer, expected.len()).await;
        assert_eq!(again.iter().map(Message::id).collect::<Vec<_>>(), expected);
        assert_quiet(&consumer, QUIET).await;
        ack_all(&consumer, &again).await;
    }
    // After the last message: nothing.
    consumer
        .seek_to_time(all[23].publish_time() + Duration::from_millis(1))
        .await
        .expect("sought");
    assert_quiet(&consumer, QUIET).await;
}

/// On a partitioned topic an id moves its own partition only; a time moves them all.
#[tokio::test]
async fn a_seek_on_a_partitioned_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup
        .emulator
        .create_topic("seek-parts", 3)
        .expect("created");
    let ids = send_all(&setup.producer("seek-parts", 0).await, 12).await;
    let consumer = setup
        .consumer("seek-parts", ConsumerOptions::default())
        .await;
    let all = receive(&consumer, 12).await;
    ack_all(&consumer, &all).await;
    let on_1: Vec<MessageId> = ids
        .iter()
        .copied()
        .filter(|id| id.partition() == 1)
        .collect();
    assert!(on_1.len() >= 2, "{ids:?}");
    consumer.seek(on_1[0]).await.expect("sought");
    let again = receive(&consumer, on_1.len() - 1).await;
    assert_eq!(again.iter().map(Message::id).collect::<Vec<_>>(), on_1[1..]);
    assert_quiet(&consumer, QUIET).await;
    ack_all(&consumer, &again).await;
    consumer.seek(SeekTo::Earliest).await.expect("sought");
    let mut everything: Vec<MessageId> = receive(&consumer, 12)
        .await
        .iter()
        .map(Message::id)
        .collect();
    everything.sort_by_key(|id| (id.partition(), id.entry_id()));
    let mut sent = ids.clone();
    sent.sort_by_key(|id| (id.partition(), id.entry_id()));
    assert_eq!(everything, sent);
    // A partition the topic does not have.
    let wrong = MessageId::new(ids[0].ledger_id(), ids[0].entry_id(), 7);
    assert!(matches!(
        consumer.seek(wrong).await,
        Err(Error::Invalid {
            what: "SeekTo::After",
            ..
        })
    ));
}

#[tokio::test]
async fn the_last_message_id() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("last-id", ConsumerOptions::default()).await;
    assert_eq!(consumer.last_message_id().await.expect("asked"), None);
    let ids = send_all(&setup.producer("last-id", 4).await, 10).await;
    let last = consumer
        .last_message_id()
        .await
        .expect("asked")
        .expect("some");
    assert_eq!(
        (last.ledger_id(), last.entry_id(), last.batch_index()),
        (ids[9].ledger_id(), ids[9].entry_id(), ids[9].batch_index())
    );
    setup.emulator.create_topic("last-ids", 2).expect("created");
    let parted = setup.shared("last-ids", ConsumerOptions::default()).await;
    assert!(matches!(
        parted.last_message_id().await,
        Err(Error::Invalid {
            what: "last_message_id",
            ..
        })
    ));
    assert_eq!(
        parted.last_message_ids().await.expect("asked"),
        [None, None]
    );
}

/// A Failover standby seeks: the broker disconnects the active consumer only (the standby
/// keeps its link); everything comes again, to whichever consumer is active then.
#[tokio::test]
async fn a_failover_standby_seeks_and_keeps_its_link() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    send_all(&setup.producer("seek-failover", 0).await, 10).await;
    let failover = || ConsumerOptions::default().sub_type(SubType::Failover);
    let active = setup.consumer("seek-failover", failover()).await;
    let standby = setup.consumer("seek-failover", failover()).await;
    let all = receive(&active, 10).await;
    ack_all(&active, &all).await;
    standby.seek(SeekTo::Earliest).await.expect("sought");
    let mut again = Vec::new();
    while again.len() < 10 {
        let message = tokio::select! {
            m = active.receive() => m,
            m = standby.receive() => m,
            () = tokio::time::sleep(crate::support::PATIENCE) => {
                panic!("only {} of 10 came again", again.len())
            }
        };
        again.push(message.expect("received"));
    }
    again.sort_by_key(|m| m.id().entry_id());
    assert_eq!(texts(&again), payloads(0..10));
    assert_eq!(standby.stats().reconnects, 0);
    assert_eq!(active.stats().reconnects, 1);
}
