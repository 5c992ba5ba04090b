//! Ordinary acks: every kind of entry drains, with grouped frames.

use std::time::{Duration, Instant};

use pulsar_wire::pb::base_command::Type;
use pulsar_wire::{
    ConsumerOptions, Error, OutgoingMessage, PartialBatches, SubType, key_partition,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, assert_quiet, receive, send_all};

#[tokio::test]
async fn batched_and_unbatched_messages_drain() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("mixed", ConsumerOptions::default()).await;
    let batched = setup.producer("mixed", 3).await;
    let single = setup.producer("mixed", 0).await;
    let ids = send_all(&batched, 30).await;
    assert!(ids.iter().all(|id| id.batch_size() == Some(3)));
    assert_eq!(ids[4].batch_index(), 1);
    let plain = send_all(&single, 10).await;
    assert!(
        plain
            .iter()
            .all(|id| id.batch_size().is_none() && id.batch_index() == -1)
    );

    let messages = receive(&consumer, 40).await;
    let (in_batches, alone): (Vec<_>, Vec<_>) =
        messages.iter().partition(|m| m.position().is_batched());
    assert_eq!((in_batches.len(), alone.len()), (30, 10));
    assert!(in_batches.iter().all(|m| m.position().batch_size() == 3));
    for message in &messages {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("mixed").await;
    setup.assert_never_blocked();
    let stats = consumer.stats();
    assert_eq!(stats.received, 40);
    // 10 batches of 3 and 10 single entries acknowledged in a handful of frames.
    assert!(stats.ack_frames <= 3, "{stats:?}");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
}

#[tokio::test]
async fn single_message_batches_are_batches_and_drain() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("ones", ConsumerOptions::default()).await;
    let producer = setup.producer("ones", 1).await;
    let ids = send_all(&producer, 12).await;
    assert!(
        ids.iter()
            .all(|id| id.batch_size() == Some(1) && id.batch_index() == 0)
    );
    let messages = receive(&consumer, 12).await;
    for message in &messages {
        assert!(
            message.position().is_batched(),
            "num_messages_in_batch is present"
        );
        assert_eq!(message.id().batch_size(), Some(1));
        consumer.ack(message).await.expect("ack queued");
    }
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("close flushes the acks");
    setup.assert_drained("ones").await;
    setup.assert_never_blocked();
}

#[tokio::test]
async fn ordinary_acks_get_past_the_unacked_limit() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup.emulator.create_topic("limited", 0).expect("created");
    setup
        .emulator
        .set_max_unacked_messages("limited", 20)
        .expect("limit set");
    let consumer = setup.shared("limited", ConsumerOptions::default()).await;
    let producer = setup.producer("limited", 3).await;
    send_all(&producer, 90).await;
    // Dispatch blocks at 20 unacknowledged messages and resumes once the grouped acks bring
    // the count to 10: acknowledging as messages arrive gets everything through.
    for _ in 0..90 {
        let message = receive(&consumer, 1).await.remove(0);
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("limited").await;
    assert!(setup.stats().consumers().all(|c| c.times_blocked >= 1));
}

#[tokio::test]
async fn batch_index_acks_count_and_skip_on_redelivery() {
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let options = ConsumerOptions::default().partial_batches(PartialBatches::SendAckSet);
    let consumer = setup.shared("indexes", options).await;
    let producer = setup.producer("indexes", 4).await;
    send_all(&producer, 4).await;
    let messages = receive(&consumer, 4).await;
    consumer.ack_and_wait(&messages[0]).await.expect("acked");
    consumer.ack_and_wait(&messages[2]).await.expect("acked");
    let unacked = || setup.stats().consumers().map(|c| c.unacked).sum::<i64>();
    let deadline = Instant::now() + Duration::from_secs(5);
    while unacked() != 2 {
        assert!(Instant::now() < deadline, "unacked stays {}", unacked());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two messages outstanding, in one entry: the broker's msgBacklog counts the entry.
    let stats = setup.stats();
    let sub = stats.subscription("indexes", "sub").expect("subscribed");
    assert_eq!((sub.backlog, sub.backlog_entries), (2, 1));
    // The entry comes back with indexes 0 and 2 cleared: only 1 and 3 are delivered.
    consumer.redeliver_unacknowledged().expect("sent");
    let again = receive(&consumer, 2).await;
    let indexes: Vec<_> = again.iter().map(|m| m.position().batch_index()).collect();
    assert_eq!(indexes, [1, 3]);
    assert_eq!(consumer.stats().skipped, 2);
    for message in &again {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("indexes").await;
    assert_quiet(&consumer, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn partial_batches_can_wait_for_the_whole_entry() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let options = ConsumerOptions::default().partial_batches(PartialBatches::HoldUntilComplete);
    let consumer = setup.shared("hold", options).await;
    let producer = setup.producer("hold", 3).await;
    send_all(&producer, 3).await;
    let messages = receive(&consumer, 3).await;
    consumer.ack_and_wait(&messages[0]).await.expect("held");
    consumer.ack_and_wait(&messages[1]).await.expect("held");
    assert_eq!(
        consumer.stats().acked_ids,
        0,
        "nothing sent for a partial batch"
    );
    consumer.ack_and_wait(&messages[2]).await.expect("acked");
    assert_eq!(consumer.stats().acked_ids, 1, "one whole-entry id");
    setup.assert_drained("hold").await;
}

#[tokio::test]
async fn cumulative_acks_on_an_exclusive_subscription() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .consumer(
            "cumulative",
            ConsumerOptions::default().sub_type(SubType::Exclusive),
        )
        .await;
    let batched = setup.producer("cumulative", 3).await;
    let single = setup.producer("cumulative", 0).await;
    send_all(&batched, 30).await;
    send_all(&single, 5).await;
    let messages = receive(&consumer, 35).await;
    // The broker counts unacked messages on Shared and Key_Shared subscriptions only.
    assert!(
        setup.stats().consumers().all(|c| c.unacked == 0),
        "{:#?}",
        setup.stats().consumers().collect::<Vec<_>>()
    );
    // Half way, in the middle of a batch, then the last one.
    consumer
        .ack_cumulative(&messages[13])
        .await
        .expect("ack queued");
    consumer.flush_acks().await;
    // Entries 4 to 14 stay: 11 entries (what a 4.0.x broker's msgBacklog counts), 23
    // messages (without the broker's batch-index acknowledgement entry 4 keeps all 3).
    let backlog = || {
        let stats = setup.stats();
        let sub = stats.subscription("cumulative", "sub").expect("subscribed");
        (sub.backlog, sub.backlog_entries)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while backlog() != (23, 11) {
        assert!(Instant::now() < deadline, "backlog stays {:?}", backlog());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer
        .ack_cumulative(&messages[34])
        .await
        .expect("ack queued");
    consumer.flush_acks().await;
    setup.assert_drained("cumulative").await;
    assert_eq!(consumer.stats().ack_frames, 2);

    let shared = setup
        .shared("cumulative-shared", ConsumerOptions::default())
        .await;
    let producer = setup.producer("cumulative-shared", 0).await;
    send_all(&producer, 1).await;
    let message = receive(&shared, 1).await.remove(0);
    assert!(matches!(
        shared.ack_cumulative(&message).await,
        Err(Error::Invalid { .. })
    ));
}

/// Waits until the subscription's backlog of `topic` is (messages, entries).
async fn wait_backlog(setup: &Setup, topic: &str, want: (u64, u64)) {
    let backlog = || {
        let stats = setup.stats();
        let sub = stats.subscription(topic, "sub").expect("subscribed");
        (sub.backlog, sub.backlog_entries)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while backlog() != want {
        assert!(Instant::now() < deadline, "backlog stays {:?}", backlog());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_cumulative_ack_inside_a_batch_survives_a_reconnect() {
    let topic = "cumulative-reconnect";
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let exclusive = || {
        ConsumerOptions::default()
            .sub_type(SubType::Exclusive)
            .partial_batches(PartialBatches::SendAckSet)
    };
    let consumer = setup.consumer(topic, exclusive()).await;
    let producer = setup.producer(topic, 5).await;
    send_all(&producer, 10).await;
    let messages = receive(&consumer, 10).await;
    let entry = |i: usize| messages[i].position().entry_id();
    assert!((0..5).all(|i| entry(i) == entry(0)), "one batch of 5");
    assert!((5..10).all(|i| entry(i) == entry(5)), "another batch of 5");
    // Index 1 of the first entry: indexes 0 and 1 are acknowledged, the mark-delete stays
    // before the entry and the cursor keeps its batch-deleted indexes.
    consumer
        .ack_cumulative(&messages[1])
        .await
        .expect("ack queued");
    consumer.flush_acks().await;
    wait_backlog(&setup, topic, (8, 2)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    // The cursor belongs to the subscription: it keeps the acknowledged indexes.
    wait_backlog(&setup, topic, (8, 2)).await;

    let again = setup.consumer(topic, exclusive()).await;
    let redelivered = receive(&again, 8).await;
    let positions: Vec<_> = redelivered
        .iter()
        .map(|m| (m.position().entry_id(), m.position().batch_index()))
        .collect();
    let mut expected: Vec<_> = (2..5).map(|i| (entry(0), i)).collect();
    expected.extend((0..5).map(|i| (entry(5), i)));
    assert_eq!(positions, expected);
    // The redelivered entry carried the ack set: the client skipped indexes 0 and 1.
    assert_eq!(again.stats().skipped, 2);
    assert_quiet(&again, Duration::from_millis(200)).await;
    again
        .ack_cumulative(&redelivered[7])
        .await
        .expect("ack queued");
    again.flush_acks().await;
    setup.assert_drained(topic).await;
}

#[tokio::test]
async fn batch_index_acks_outlive_the_consumer_that_made_them() {
    let topic = "indexes-reconnect";
    let setup = Setup::new(EmulatorConfig::default().batch_index_ack(true)).await;
    let options = ConsumerOptions::default().partial_batches(PartialBatches::SendAckSet);
    let consumer = setup.shared(topic, options.clone()).await;
    let producer = setup.producer(topic, 4).await;
    send_all(&producer, 4).await;
    let messages = receive(&consumer, 4).await;
    consumer.ack_and_wait(&messages[0]).await.expect("acked");
    consumer.ack_and_wait(&messages[3]).await.expect("acked");
    wait_backlog(&setup, topic, (2, 1)).await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    wait_backlog(&setup, topic, (2, 1)).await;
    let other = setup.shared(topic, options).await;
    let again = receive(&other, 2).await;
    let indexes: Vec<_> = again.iter().map(|m| m.position().batch_index()).collect();
    assert_eq!(indexes, [1, 2]);
    assert_eq!(other.stats().skipped, 2);
    for message in &again {
        other.ack(message).await.expect("ack queued");
    }
    other.flush_acks().await;
    setup.assert_drained(topic).await;
    assert_quiet(&other, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn partitioned_topics_route_by_key_and_drain() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup.emulator.create_topic("parted", 3).expect("created");
    let consumer = setup.shared("parted", ConsumerOptions::default()).await;
    let producer = setup.producer("parted", 4).await;
    assert_eq!(producer.partitions(), 3);
    let keyed = (0..12).map(|i| producer.send(OutgoingMessage::new("k").key(format!("key{i}"))));
    let keyed = futures_util::future::join_all(keyed).await;
    for (i, id) in keyed.iter().enumerate() {
        let id = id.as_ref().expect("sent");
        assert_eq!(id.partition() as u32, key_partition(&format!("key{i}"), 3));
    }
    let spread = send_all(&producer, 12).await;
    let mut per_partition = [0; 3];
    for id in &spread {
        per_partition[id.partition() as usize] += 1;
    }
    assert_eq!(per_partition, [4, 4, 4], "round robin without a key");
    for message in receive(&consumer, 24).await {
        assert!(message.topic().contains("-partition-"));
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("parted").await;
    setup.assert_never_blocked();
}

/// 10,000 messages in batches of 10, each acknowledged on its own as it arrives; the acks are
/// grouped (100 ms / 1,000 ids) and the emulator counts the ACK frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_with_grouped_acks() {
    const MESSAGES: usize = 10_000;
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared("load", ConsumerOptions::default()).await;
    let producer = setup.producer("load", 10).await;
    let started = Instant::now();
    let send = tokio::spawn({
        let producer = producer.clone();
        async move { send_all(&producer, MESSAGES).await }
    });
    let mut acks_started = None;
    for _ in 0..MESSAGES {
        let message = crate::support::within(crate::support::PATIENCE, consumer.receive())
            .await
            .expect("delivered in time")
            .expect("received");
        acks_started.get_or_insert_with(Instant::now);
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    let acked_in = acks_started.map(|t| t.elapsed()).unwrap_or_default();
    send.await.expect("sender");
    setup.assert_drained("load").await;
    setup.assert_never_blocked();
    let stats = setup.stats();
    let ack_frames = stats.received(Type::Ack);
    let ratio = ack_frames as f64 / MESSAGES as f64;
    let rate = MESSAGES as f64 / acked_in.as_secs_f64();
    println!(
        "10,000 messages: {ack_frames} ACK frames ({ratio:.4} per message), {} FLOW frames, \
         {} SEND frames; acks at {rate:.0}/s; whole run {:?}",
        stats.received(Type::Flow),
        stats.received(Type::Send),
        started.elapsed()
    );
    assert!(
        ratio <= 0.01,
        "{ack_frames} ACK frames for {MESSAGES} messages"
    );
    assert_eq!(consumer.stats().ack_frames, ack_frames);
}

#[tokio::test]
async fn receipts_nacks_and_every_subscription_type() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup
        .shared("receipts", ConsumerOptions::default().ack_receipts(true))
        .await;
    let producer = setup.producer("receipts", 2).await;
    send_all(&producer, 4).await;
    let messages = receive(&consumer, 4).await;
    // A negative ack of a message in a batch whose other message the application holds
    // brings that message back, from the consumer itself (the broker would send the whole
    // batch again, to any consumer); it is acknowledged with the rest.
    consumer.nack(&messages[0]).expect("nack sent");
    let again = receive(&consumer, 1).await;
    assert_eq!(
        again[0].redelivery_count(),
        messages[0].redelivery_count() + 1
    );
    assert_eq!(again[0].id(), messages[0].id());
    for message in again.iter().chain(&messages[1..]) {
        consumer.ack_and_wait(message).await.expect("confirmed");
    }
    assert!(setup.stats().sent(Type::AckResponse) >= 1);
    assert_eq!(consumer.stats().nacks, 1);
    assert_eq!(consumer.stats().handed_again, 1);
    assert_eq!(consumer.stats().redelivery_requests, 0);
    setup.assert_drained("receipts").await;

    for (topic, sub_type) in [
        ("failover", SubType::Failover),
        ("key-shared", SubType::KeyShared),
    ] {
        let consumer = setup
            .consumer(topic, ConsumerOptions::default().sub_type(sub_type))
            .await;
        let producer = setup.producer(topic, 0).await;
        send_all(&producer, 3).await;
        for message in receive(&consumer, 3).await {
            consumer.ack(&message).await.expect("ack queued");
        }
        consumer
            .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
            .await
            .expect("closed");
        setup.assert_drained(topic).await;
    }
}

/// A batch of 7 partly acknowledged (4 of 7) by a consumer whose connection then drops:
/// the entry goes to the consumer's new registration, the application gets the other 3, and
/// what the consumer's unacked count ends at. Returns that count and the payloads the
/// application got after the drop.
async fn partly_acked_batch_after_a_drop(
    config: EmulatorConfig,
    partial: Option<PartialBatches>,
) -> (i64, Vec<String>) {
    let setup = Setup::new(config).await;
    let options = partial.map_or_else(ConsumerOptions::default, |mode| {
        ConsumerOptions::default().partial_batches(mode)
    });
    let consumer = setup.shared("partly", options).await;
    let producer = setup.producer("partly", 7).await;
    send_all(&producer, 7).await;
    let first = receive(&consumer, 7).await;
    for message in &first[..4] {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    // What went out (nothing when the acks are held) reached the broker before the drop.
    let sent = consumer.stats().acked_ids;
    let deadline = Instant::now() + Duration::from_secs(10);
    while setup.stats().consumers().map(|c| c.acked_ids).sum::<u64>() < sent {
        assert!(Instant::now() < deadline, "the acks did not arrive");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    setup.emulator.disconnect_all();
    // The entry comes to the new registration; the application still holds the other 3,
    // so nothing new is handed over. Wait until the entry was dispatched again.
    let redispatched = || {
        setup
            .stats()
            .consumers()
            .map(|c| c.dispatched_entries)
            .sum::<u64>()
            >= 1
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redispatched() {
        assert!(
            Instant::now() < deadline,
            "the entry was not dispatched again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_quiet(&consumer, Duration::from_millis(200)).await;
    let rest = &first[4..];
    for message in rest {
        consumer.ack(message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    assert_quiet(&consumer, Duration::from_millis(300)).await;
    let unacked = setup.stats().consumers().map(|c| c.unacked).sum::<i64>();
    let payloads = rest
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect();
    (unacked, payloads)
}

/// The default holds a partly acknowledged batch's acks until the batch is complete, as the
/// Java client of 4.0 does: on a 4.0.x broker as configured by default (batch-index acks
/// off, transactions on) the count ends at 0.
#[tokio::test]
async fn a_partly_acked_batch_given_to_a_new_registration_drains_by_default() {
    let (unacked, rest) = partly_acked_batch_after_a_drop(EmulatorConfig::default(), None).await;
    assert_eq!(rest, ["m4", "m5", "m6"]);
    assert_eq!(unacked, 0);
}

/// Why that is the default: sending the accumulated set to that broker leaves it in the
/// pending-ack state (`syncBatchPositionAckSetForTransaction`); the entry goes to the new
/// registration counted as its 3 outstanding messages, and its last ack takes off all 7, so
/// the count ends at -4. (The property `outages::nothing_is_lost_through_unloads_and_dropped_connections`
/// failed about once in 30 runs under load this way while this was the default.)
#[tokio::test]
async fn ack_sets_on_a_broker_without_batch_index_acks_drive_the_count_below_zero() {
    let (unacked, rest) = partly_acked_batch_after_a_drop(
        EmulatorConfig::default(),
        Some(PartialBatches::SendAckSet),
    )
    .await;
    assert_eq!(rest, ["m4", "m5", "m6"]);
    assert_eq!(unacked, -4);
}

/// With batch-index acks on the broker, the accumulated set is right: the count ends at 0.
#[tokio::test]
async fn ack_sets_on_a_broker_with_batch_index_acks_drain() {
    let (unacked, rest) = partly_acked_batch_after_a_drop(
        EmulatorConfig::default().batch_index_ack(true),
        Some(PartialBatches::SendAckSet),
    )
    .await;
    assert_eq!(rest, ["m4", "m5", "m6"]);
    assert_eq!(unacked, 0);
}
