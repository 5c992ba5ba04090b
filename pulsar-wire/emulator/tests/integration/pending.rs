//! The producer's bounded pending queue (`ProducerOptions::max_pending_messages`), while the
//! producer cannot reach its broker and sends pile up: with a limit the next send fails at
//! once (`QueueFull::Fail`) or waits for a place within the send timeout (`QueueFull::Block`);
//! without one it is taken. Every send resolves, a dropped waiting send takes no place, and
//! `close` fails the waiting ones. Virtual time: the waits cost no wall-clock time.

use std::collections::HashSet;
use std::time::Duration;

use pulsar_wire::{
    Consumer, ConsumerOptions, Error, MessageId, OutgoingMessage, Producer, ProducerOptions,
    QueueFull,
};
use pulsar_wire_emulator::{EmulatorConfig, Faults};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::{PATIENCE, Setup, producer_options, within};

const TOPIC: &str = "pending";

/// Takes the broker away from `producer`: every connection is dropped at its next frame, so
/// the producer keeps trying to register again. Returns once it knows it is disconnected.
async fn outage(setup: &Setup, producer: &Producer) {
    setup
        .emulator
        .set_faults(Faults::none().drop_after_frames(Some(1)));
    setup.emulator.disconnect_all();
    within(PATIENCE, producer.state().wait_for(|s| !s.is_connected()))
        .await
        .expect("the producer notices the outage")
        .expect("the producer is alive");
}

/// Gives the broker back.
fn restore(setup: &Setup) {
    setup.emulator.set_faults(Faults::none());
}

async fn producer(setup: &Setup, options: ProducerOptions) -> Producer {
    Producer::builder(&setup.client, TOPIC)
        .options(options)
        .build()
        .await
        .expect("producer created")
}

fn spawn_send(producer: &Producer, payload: &str) -> JoinHandle<Result<MessageId, Error>> {
    let producer = producer.clone();
    let message = OutgoingMessage::new(payload.to_owned());
    tokio::spawn(async move { producer.send(message).await })
}

/// Waits until `producer` holds `count` messages sent and not receipted.
async fn until_pending(producer: &Producer, count: usize) {
    let reached = within(PATIENCE, async {
        while producer.pending_messages() != count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        reached.is_some(),
        "{} pending, not {count}",
        producer.pending_messages()
    );
}

async fn joined(send: JoinHandle<Result<MessageId, Error>>) -> Result<MessageId, Error> {
    within(PATIENCE, send)
        .await
        .expect("the send resolves")
        .expect("joined")
}

/// The payloads `consumer` receives until none comes for [`PATIENCE`] (virtual: longer than
/// the longest backoff of a consumer subscribing again), acknowledged.
async fn payloads(consumer: &Consumer) -> HashSet<String> {
    let mut payloads = HashSet::new();
    while let Some(message) = within(PATIENCE, consumer.receive()).await {
        let message = message.expect("received");
        consumer.ack(&message).await.expect("acked");
        payloads.insert(String::from_utf8_lossy(message.payload()).into_owned());
    }
    payloads
}

fn set(payloads: &[&str]) -> HashSet<String> {
    payloads.iter().map(|p| (*p).to_owned()).collect()
}

/// With a limit of 3, the fourth send during an outage fails at once with
/// `ProducerQueueFull` (batched or not); without a limit it is taken and sent once the broker
/// is back.
#[tokio::test(start_paused = true)]
async fn a_full_queue_fails_the_next_send_at_once_and_without_a_limit_it_is_taken() {
    for per_batch in [0, 5] {
        for limit in [Some(3), None] {
            let setup = Setup::new(EmulatorConfig::default()).await;
            let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
            let options = producer_options(per_batch)
                .send_timeout(Duration::from_secs(120))
                .max_pending_messages(limit);
            let producer = producer(&setup, options).await;
            outage(&setup, &producer).await;
            let held: Vec<_> = (0..3)
                .map(|i| spawn_send(&producer, &format!("held{i}")))
                .collect();
            until_pending(&producer, 3).await;
            let started = Instant::now();
            let fourth = spawn_send(&producer, "fourth");
            let expected = if limit.is_some() {
                match joined(fourth).await {
                    Err(error @ Error::ProducerQueueFull { .. }) => {
                        let Error::ProducerQueueFull {
                            limit: 3,
                            waited: None,
                            ref topic,
                        } = error
                        else {
                            panic!("{error:?}");
                        };
                        assert!(topic.ends_with(TOPIC), "{topic}");
                        let text = error.to_string();
                        assert!(
                            text.contains("max_pending_messages") && text.contains("Block"),
                            "says the limit and what to do: {text}"
                        );
                        assert!(error.is_retryable());
                    }
                    other => panic!("batch {per_batch}: expected a full queue, got {other:?}"),
                }
                assert_eq!(started.elapsed(), Duration::ZERO, "failed at once");
                assert_eq!(producer.pending_messages(), 3);
                set(&["held0", "held1", "held2"])
            } else {
                until_pending(&producer, 4).await;
                assert!(!fourth.is_finished(), "taken, waiting for the broker");
                restore(&setup);
                assert!(joined(fourth).await.is_ok());
                set(&["held0", "held1", "held2", "fourth"])
            };
            restore(&setup);
            for send in held {
                assert!(
                    joined(send).await.is_ok(),
                    "batch {per_batch}, limit {limit:?}"
                );
            }
            assert_eq!(producer.pending_messages(), 0);
            assert_eq!(payloads(&consumer).await, expected);
            // Room again: a send goes through.
            let after = producer.send(OutgoingMessage::new("after")).await;
            assert!(after.is_ok(), "{after:?}");
        }
    }
}

/// With `QueueFull::Block`, a send beyond the limit waits while the broker is away (it is not
/// even batched: the messages pending stay at the limit) and goes out once places come back.
#[tokio::test(start_paused = true)]
async fn a_blocking_send_waits_for_a_place_and_goes_out_once_the_broker_is_back() {
    for per_batch in [0, 5] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
        let options = producer_options(per_batch)
            .send_timeout(Duration::from_secs(60))
            .max_pending_messages(Some(2))
            .on_queue_full(QueueFull::Block);
        let producer = producer(&setup, options).await;
        outage(&setup, &producer).await;
        let held = [spawn_send(&producer, "a"), spawn_send(&producer, "b")];
        until_pending(&producer, 2).await;
        let third = spawn_send(&producer, "c");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!third.is_finished(), "batch {per_batch}: waits for a place");
        assert_eq!(producer.pending_messages(), 2);
        restore(&setup);
        for send in held {
            assert!(joined(send).await.is_ok());
        }
        let third = joined(third).await;
        assert!(third.is_ok(), "batch {per_batch}: {third:?}");
        assert_eq!(producer.pending_messages(), 0);
        assert_eq!(payloads(&consumer).await, set(&["a", "b", "c"]));
    }
}

/// A blocking send waits at most the send timeout, then fails with `ProducerQueueFull`
/// saying how long it waited. The place it waited for was held by a send whose future was
/// dropped while its message waited for its receipt: the message still holds its place (it
/// is still sent, once the broker is back), until its receipt.
#[tokio::test(start_paused = true)]
async fn a_blocking_send_gives_up_after_the_send_timeout_behind_a_dropped_send_still_pending() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
    let options = producer_options(0)
        .send_timeout(Duration::from_secs(5))
        .max_pending_messages(Some(1))
        .on_queue_full(QueueFull::Block);
    let producer = producer(&setup, options).await;
    outage(&setup, &producer).await;
    let dropped = spawn_send(&producer, "dropped");
    until_pending(&producer, 1).await;
    dropped.abort();
    assert!(dropped.await.is_err(), "cancelled");
    assert_eq!(
        producer.pending_messages(),
        1,
        "its message keeps its place"
    );
    let started = Instant::now();
    match producer.send(OutgoingMessage::new("late")).await {
        Err(
            ref error @ Error::ProducerQueueFull {
                waited: Some(waited),
                limit: 1,
                ..
            },
        ) => {
            assert_eq!(waited, Duration::from_secs(5));
            assert!(error.to_string().contains("5s"), "{error}");
        }
        other => panic!("expected a full queue after waiting, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    restore(&setup);
    until_pending(&producer, 0).await;
    assert_eq!(payloads(&consumer).await, set(&["dropped"]));
}

/// A waiting send that is dropped takes no place: the next waiting one gets it. `close`
/// fails the sends waiting for a place at once, and every link state ends closed.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiting_send_takes_no_place_and_close_fails_the_waiting_ones() {
    for per_batch in [0, 5] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
        let options = producer_options(per_batch)
            .send_timeout(Duration::from_secs(60))
            .max_pending_messages(Some(1))
            .on_queue_full(QueueFull::Block);
        let producer = producer(&setup, options).await;
        outage(&setup, &producer).await;
        let first = spawn_send(&producer, "first");
        until_pending(&producer, 1).await;
        let cancelled = spawn_send(&producer, "cancelled");
        let next = spawn_send(&producer, "next");
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancelled.abort();
        restore(&setup);
        assert!(joined(first).await.is_ok());
        let next = joined(next).await;
        assert!(next.is_ok(), "batch {per_batch}: {next:?}");
        assert_eq!(payloads(&consumer).await, set(&["first", "next"]));
        assert_eq!(producer.pending_messages(), 0);

        outage(&setup, &producer).await;
        let stuck = spawn_send(&producer, "stuck");
        until_pending(&producer, 1).await;
        let waiting = spawn_send(&producer, "waiting");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        let closing = tokio::spawn({
            let producer = producer.clone();
            async move { producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await }
        });
        let started = Instant::now();
        assert!(
            matches!(joined(waiting).await, Err(Error::Closed(_))),
            "batch {per_batch}"
        );
        assert_eq!(started.elapsed(), Duration::ZERO, "failed at once");
        let closed = within(PATIENCE * 6, closing)
            .await
            .expect("close returns")
            .expect("joined");
        assert!(closed.is_ok(), "{closed:?}");
        assert!(joined(stuck).await.is_err(), "resolved by close");
        assert_eq!(producer.pending_messages(), 0);
        assert!(matches!(
            producer.send(OutgoingMessage::new("after")).await,
            Err(Error::Closed(_))
        ));
        assert!(matches!(
            producer.state().borrow().overall(),
            pulsar_wire::LinkState::Closed
        ));
    }
}

/// A limit of 0 is refused when the producer is created.
#[tokio::test]
async fn a_limit_of_zero_is_refused() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let refused = Producer::builder(&setup.client, TOPIC)
        .max_pending_messages(Some(0))
        .build()
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Invalid {
                what: "max_pending_messages",
                ..
            })
        ),
        "{refused:?}"
    );
}

/// One step of [`queue_run`].
#[derive(Debug, Clone)]
enum Step {
    /// Starts this many sends (not awaited).
    Send(usize),
    /// Drops the future of the oldest send not finished (waiting for a place or a receipt).
    Cancel,
    /// Takes the broker away.
    Outage,
    /// Gives it back.
    Restore,
    /// Lets this many seconds of virtual time pass.
    Wait(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (1usize..6).prop_map(Step::Send),
        1 => Just(Step::Cancel),
        1 => Just(Step::Outage),
        1 => Just(Step::Restore),
        2 => (0u64..30).prop_map(Step::Wait),
    ]
}

/// Whatever the sends, cancellations, outages and waits: the producer never holds more than
/// its limit, every send that is not cancelled resolves, one that went through was stored,
/// one refused for a full queue was not sent at all, and every place comes back.
async fn queue_run(steps: Vec<Step>, limit: usize, when_full: QueueFull, per_batch: usize) {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
    let options = producer_options(per_batch)
        .send_timeout(Duration::from_secs(20))
        .max_pending_messages(Some(limit))
        .on_queue_full(when_full);
    let producer = producer(&setup, options).await;
    let mut sends = Vec::new();
    let mut cancelled = HashSet::new();
    for step in steps {
        match step {
            Step::Send(n) => {
                for _ in 0..n {
                    let payload = format!("m{}", sends.len());
                    sends.push((payload.clone(), spawn_send(&producer, &payload)));
                }
                tokio::task::yield_now().await;
            }
            Step::Cancel => {
                if let Some((payload, send)) = sends
                    .iter()
                    .find(|(payload, send)| !send.is_finished() && !cancelled.contains(payload))
                {
                    send.abort();
                    cancelled.insert(payload.clone());
                }
            }
            Step::Outage => {
                setup
                    .emulator
                    .set_faults(Faults::none().drop_after_frames(Some(1)));
                setup.emulator.disconnect_all();
            }
            Step::Restore => restore(&setup),
            Step::Wait(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
        }
        assert!(producer.pending_messages() <= limit, "above the limit");
    }
    restore(&setup);
    let (mut stored, mut unsent) = (HashSet::new(), HashSet::new());
    for (payload, send) in sends {
        if cancelled.contains(&payload) {
            continue;
        }
        match within(PATIENCE * 6, send)
            .await
            .unwrap_or_else(|| panic!("send {payload} hung"))
            .expect("joined")
        {
            Ok(_) => {
                stored.insert(payload);
            }
            Err(Error::ProducerQueueFull { waited, .. }) => {
                assert_eq!(waited.is_some(), when_full == QueueFull::Block);
                unsent.insert(payload);
            }
            // The outage outlasted the send timeout: it may still have been stored.
            Err(Error::Timeout { .. }) => {}
            Err(error) => panic!("send {payload}: {error:?}"),
        }
    }
    until_pending(&producer, 0).await;
    let received = payloads(&consumer).await;
    let lost: Vec<_> = stored.difference(&received).collect();
    assert!(lost.is_empty(), "receipted but never received: {lost:?}");
    let sent_anyway: Vec<_> = unsent.intersection(&received).collect();
    assert!(
        sent_anyway.is_empty(),
        "refused for a full queue but received: {sent_anyway:?}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        ..proptest::prelude::ProptestConfig::default()
    })]

    #[test]
    fn the_pending_queue_holds_its_limit_and_every_send_resolves(
        steps in proptest::collection::vec(step(), 3..25),
        limit in 1usize..6,
        block in proptest::prelude::any::<bool>(),
        batched in proptest::prelude::any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let when_full = if block { QueueFull::Block } else { QueueFull::Fail };
        runtime.block_on(queue_run(steps, limit, when_full, if batched { 3 } else { 0 }));
    }
}
