//! Link states (`Producer::state`, `Consumer::state`): Connected → Reconnecting (attempts
//! counted, each with its cause) → Connected across lost connections and unloads, per
//! partition of a partitioned topic, Closed once closed. Virtual time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulsar_wire::{ConsumerOptions, Error, LinkState, LinkStates, OutgoingMessage};
use pulsar_wire_emulator::{EmulatorConfig, Faults};
use tokio::sync::watch;

use crate::support::{PATIENCE, Setup, receive, within};

/// Every set of states `states` shows from now on, in order.
type Record = Arc<Mutex<Vec<Vec<LinkState>>>>;

fn record(mut states: watch::Receiver<LinkStates>) -> Record {
    let record: Record = Arc::new(Mutex::new(vec![states.borrow().partitions().to_vec()]));
    let recorded = Arc::clone(&record);
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let now = states.borrow_and_update().partitions().to_vec();
            recorded.lock().expect("not poisoned").push(now);
        }
    });
    record
}

/// What partition `index` went through, one entry per change of kind (consecutive attempts
/// of one reconnection are one entry: the first seen).
fn history(record: &Record, index: usize) -> Vec<LinkState> {
    let mut history: Vec<LinkState> = Vec::new();
    for states in record.lock().expect("not poisoned").iter() {
        let Some(state) = states.get(index) else {
            continue;
        };
        let same_kind = history
            .last()
            .is_some_and(|last| std::mem::discriminant(last) == std::mem::discriminant(state));
        if !same_kind {
            history.push(state.clone());
        }
    }
    history
}

/// The kinds of a history: `C`onnected, `R`econnecting, `X` closed, `F`ailed.
fn kinds(history: &[LinkState]) -> String {
    history
        .iter()
        .map(|state| match state {
            LinkState::Connected => 'C',
            LinkState::Reconnecting { .. } => 'R',
            LinkState::Closed => 'X',
            LinkState::Failed { .. } => 'F',
            _ => '?',
        })
        .collect()
}

/// Whether `state` is the first attempt after a loss whose cause `matches`.
fn first_attempt(state: &LinkState, matches: impl Fn(&Error) -> bool) -> bool {
    matches!(state, LinkState::Reconnecting { attempt: 1, cause } if matches(cause))
}

fn closed_by_broker(error: &Error) -> bool {
    matches!(error, Error::Closed(what) if what.contains("from the broker"))
}

/// Waits until `states` satisfy `ready`.
async fn until(states: &mut watch::Receiver<LinkStates>, ready: impl FnMut(&LinkStates) -> bool) {
    within(PATIENCE, states.wait_for(ready))
        .await
        .expect("the state comes")
        .expect("the sender is alive");
}

/// Waits until `count()` reaches `at_least`.
async fn until_count(count: impl Fn() -> u64, at_least: u64) {
    let reached = within(PATIENCE, async {
        while count() < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(reached.is_some(), "{} < {at_least}", count());
}

#[tokio::test(start_paused = true)]
async fn a_producer_and_a_consumer_report_a_lost_connection_and_an_unload() {
    let topic = "states";
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    let (mut produced, mut consumed) = (producer.state(), consumer.state());
    for states in [&produced, &consumed] {
        let states = states.borrow();
        assert_eq!(states.partitions().len(), 1);
        assert!(states.is_connected() && states.overall().is_connected());
    }
    let (producer_record, consumer_record) = (record(producer.state()), record(consumer.state()));

    // The broker goes away and stays away: attempt after attempt, each with its cause.
    setup
        .emulator
        .set_faults(Faults::none().drop_after_frames(Some(1)));
    setup.emulator.disconnect_all();
    for states in [&mut produced, &mut consumed] {
        until(
            states,
            |s| matches!(s.overall(), LinkState::Reconnecting { attempt, .. } if *attempt >= 3),
        )
        .await;
        let LinkState::Reconnecting { cause, .. } = states.borrow().overall().clone() else {
            unreachable!("waited for it");
        };
        assert!(cause.is_retryable(), "a failed attempt's cause: {cause:?}");
        assert!(!states.borrow().is_connected());
    }
    assert!(!producer.is_connected());
    // It comes back: both are connected again, and work.
    setup.emulator.set_faults(Faults::none());
    until(&mut produced, LinkStates::is_connected).await;
    until(&mut consumed, LinkStates::is_connected).await;
    producer
        .send(OutgoingMessage::new("after the outage"))
        .await
        .expect("sent");
    let message = receive(&consumer, 1).await.remove(0);
    consumer.ack(&message).await.expect("acked");

    // An unload: the broker closes both on connections that stay open.
    let reconnects = (producer.reconnects(), consumer.stats().reconnects);
    assert_eq!(setup.emulator.unload(topic), (1, 1));
    until_count(|| producer.reconnects(), reconnects.0 + 1).await;
    until_count(|| consumer.stats().reconnects, reconnects.1 + 1).await;
    until(&mut produced, LinkStates::is_connected).await;
    until(&mut consumed, LinkStates::is_connected).await;

    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    for states in [&produced, &consumed] {
        assert!(matches!(states.borrow().overall(), LinkState::Closed));
    }
    tokio::task::yield_now().await;
    for (who, record) in [
        ("producer", &producer_record),
        ("consumer", &consumer_record),
    ] {
        let history = history(record, 0);
        assert_eq!(kinds(&history), "CRCRCX", "{who}: {history:#?}");
        assert!(
            first_attempt(&history[1], |cause| matches!(
                cause,
                Error::ConnectionLost { .. }
            )),
            "{who}: the outage's first attempt names the lost connection: {:?}",
            history[1]
        );
        assert!(
            first_attempt(&history[3], closed_by_broker),
            "{who}: the unload's first attempt names the broker's close: {:?}",
            history[3]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_topic_reports_each_partition() {
    let topic = "states-parted";
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup.emulator.create_topic(topic, 3).expect("created");
    let consumer = setup.shared(topic, ConsumerOptions::default()).await;
    let producer = setup.producer(topic, 0).await;
    let (mut produced, mut consumed) = (producer.state(), consumer.state());
    for states in [&produced, &consumed] {
        assert_eq!(states.borrow().partitions().len(), 3);
        assert!(states.borrow().is_connected());
    }
    let (producer_record, consumer_record) = (record(producer.state()), record(consumer.state()));

    assert_eq!(setup.emulator.unload(topic), (3, 3));
    until_count(|| producer.reconnects(), 3).await;
    until_count(|| consumer.stats().reconnects, 3).await;
    until(&mut produced, LinkStates::is_connected).await;
    until(&mut consumed, LinkStates::is_connected).await;
    for (who, record) in [
        ("producer", &producer_record),
        ("consumer", &consumer_record),
    ] {
        for partition in 0..3 {
            let history = history(record, partition);
            assert_eq!(kinds(&history), "CRC", "{who} {partition}: {history:#?}");
            assert!(
                first_attempt(&history[1], closed_by_broker),
                "{who} {partition}: {:?}",
                history[1]
            );
        }
    }

    // A partition added later gets its own entry.
    setup.emulator.update_partitions(topic, 4).expect("grown");
    assert_eq!(producer.refresh_partitions().await.expect("refreshed"), 4);
    assert_eq!(consumer.refresh_partitions().await.expect("refreshed"), 4);
    for states in [&produced, &consumed] {
        assert_eq!(states.borrow().partitions().len(), 4);
        assert!(states.borrow().is_connected());
    }

    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    for states in [&produced, &consumed] {
        let states = states.borrow();
        assert!(
            states
                .partitions()
                .iter()
                .all(|s| matches!(s, LinkState::Closed)),
            "{states:?}"
        );
    }
}
