//! Pattern subscriptions: every matching topic of the namespace (a partitioned one whole),
//! not the others, and topics created later within the discovery interval.

use std::collections::BTreeSet;
use std::time::Duration;

use pulsar_wire::{
    ConsumerOptions, Error, InitialPosition, LinkState, OutgoingMessage, PatternConsumer,
    PatternOptions, SubType,
};
use pulsar_wire_emulator::{EmulatorConfig, Faults};

use crate::support::{PATIENCE, Setup, within};

fn options(discovery: Option<Duration>) -> PatternOptions {
    PatternOptions::new(
        ConsumerOptions::default()
            .sub_type(SubType::Shared)
            .initial_position(InitialPosition::Earliest),
    )
    .discovery_interval(discovery)
}

async fn send(setup: &Setup, topic: &str, payload: &str) {
    setup
        .producer(topic, 0)
        .await
        .send(OutgoingMessage::new(payload.to_owned()))
        .await
        .expect("sent");
}

/// Receives `count` payloads (acknowledging each), in any order.
async fn take(consumer: &PatternConsumer, count: usize) -> BTreeSet<String> {
    let mut got = BTreeSet::new();
    for i in 0..count {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("message {i} of {count} did not arrive: {got:?}"))
            .expect("received");
        consumer.ack(&message).await.expect("acked");
        got.insert(String::from_utf8_lossy(message.payload()).into_owned());
    }
    got
}

#[tokio::test]
async fn a_pattern_consumer_reads_the_matching_topics_and_those_created_later() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup.emulator.create_topic("orders-p", 2).expect("created");
    send(&setup, "orders-a", "a").await;
    send(&setup, "orders-b", "b").await;
    send(&setup, "other", "other").await;
    for _ in 0..2 {
        send(&setup, "orders-p", "p").await;
    }
    let consumer = PatternConsumer::builder(
        &setup.client,
        "persistent://public/default/orders-.*",
        "sub",
    )
    .options(options(Some(Duration::from_millis(200))))
    .build()
    .await
    .expect("subscribed");
    assert_eq!(
        consumer.topics(),
        [
            "persistent://public/default/orders-a",
            "persistent://public/default/orders-b",
            "persistent://public/default/orders-p",
        ]
    );
    let got = take(&consumer, 4).await;
    assert_eq!(got, ["a", "b", "p"].map(String::from).into());
    // A topic created now is found by the next discovery.
    send(&setup, "orders-new", "new").await;
    assert_eq!(take(&consumer, 1).await, ["new".to_owned()].into());
    assert!(
        consumer
            .topics()
            .contains(&"persistent://public/default/orders-new".to_owned())
    );
    assert!(
        within(Duration::from_millis(300), consumer.receive())
            .await
            .is_none(),
        "nothing of the other topic"
    );
    consumer.flush_acks().await;
    for topic in ["orders-a", "orders-b", "orders-new"] {
        setup.assert_drained(topic).await;
    }
    // A receive waiting when the consumer closes ends with Closed.
    let consumer = std::sync::Arc::new(consumer);
    let waiting = {
        let consumer = std::sync::Arc::clone(&consumer);
        tokio::spawn(async move { consumer.receive().await })
    };
    tokio::task::yield_now().await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let ended = within(PATIENCE, waiting)
        .await
        .expect("the waiting receive ended")
        .expect("joined");
    assert!(matches!(ended, Err(Error::Closed(_))), "{ended:?}");
    assert!(matches!(consumer.receive().await, Err(Error::Closed(_))));
}

/// Without periodic discovery, a new topic comes with `discover`.
#[tokio::test]
async fn discovery_on_request() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = PatternConsumer::builder(&setup.client, "public/default/jobs-[0-9]+", "sub")
        .options(options(None))
        .build()
        .await
        .expect("subscribed");
    assert!(consumer.topics().is_empty());
    send(&setup, "jobs-1", "1").await;
    send(&setup, "jobs-x", "x").await;
    assert_eq!(
        consumer.discover().await.expect("listed"),
        ["persistent://public/default/jobs-1"]
    );
    assert_eq!(take(&consumer, 1).await, ["1".to_owned()].into());
}

#[tokio::test]
async fn bad_patterns_and_options_are_refused() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    for (pattern, options, what) in [
        ("orders-.*", options(None), "pattern"),
        (
            "persistent://public/default/orders-(",
            options(None),
            "pattern",
        ),
        (
            "public/default/orders",
            options(Some(Duration::ZERO)),
            "discovery_interval",
        ),
        (
            "public/default/orders",
            PatternOptions::new(ConsumerOptions::default().enable_retry(true)),
            "enable_retry",
        ),
        (
            "public/default/orders",
            PatternOptions::new(ConsumerOptions::default().receiver_queue_size(0)),
            "receiver_queue_size",
        ),
    ] {
        let error = PatternConsumer::builder(&setup.client, pattern, "sub")
            .options(options)
            .build()
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, Error::Invalid { what: w, .. } if *w == what),
            "{pattern}: {error}"
        );
    }
}

/// A pattern consumer's stats sum its topics' consumers and keep them after the close; its
/// link state has one entry per topic, the worst of the topic's partitions, through a lost
/// connection, and Closed entries once closed.
#[tokio::test(start_paused = true)]
async fn a_pattern_consumer_sums_the_stats_and_reports_a_state_per_topic() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup.emulator.create_topic("watch-p", 2).expect("created");
    send(&setup, "watch-a", "a").await;
    for _ in 0..2 {
        send(&setup, "watch-p", "p").await;
    }
    let consumer = PatternConsumer::builder(&setup.client, "public/default/watch-.*", "sub")
        .options(options(None))
        .build()
        .await
        .expect("subscribed");
    assert_eq!(consumer.topics().len(), 2);
    let mut state = consumer.state();
    assert_eq!(state.borrow().partitions().len(), 2, "one entry per topic");
    assert!(state.borrow().is_connected());
    take(&consumer, 3).await;
    assert_eq!(consumer.stats().received, 3);
    let reconnects = consumer.stats().reconnects;

    setup
        .emulator
        .set_faults(Faults::none().drop_after_frames(Some(1)));
    setup.emulator.disconnect_all();
    within(
        PATIENCE,
        state.wait_for(|s| matches!(s.overall(), LinkState::Reconnecting { .. })),
    )
    .await
    .expect("reconnecting in time")
    .expect("the state lives");
    setup.emulator.set_faults(Faults::none());
    within(
        PATIENCE,
        state.wait_for(|s| s.is_connected() && s.partitions().len() == 2),
    )
    .await
    .expect("connected again in time")
    .expect("the state lives");
    // Three partitions' consumers (a, p-0, p-1) came back.
    assert!(consumer.stats().reconnects >= reconnects + 3);

    // A topic that comes adds an entry.
    send(&setup, "watch-new", "new").await;
    consumer.discover().await.expect("listed");
    within(PATIENCE, state.wait_for(|s| s.partitions().len() == 3))
        .await
        .expect("a third entry in time")
        .expect("the state lives");
    take(&consumer, 1).await;
    assert_eq!(consumer.stats().received, 4);

    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let states = state.borrow().clone();
    assert_eq!(states.partitions().len(), 3);
    assert!(
        states
            .partitions()
            .iter()
            .all(|s| matches!(s, LinkState::Closed))
    );
    // The counters of the closed consumers stay.
    assert_eq!(consumer.stats().received, 4);
}
