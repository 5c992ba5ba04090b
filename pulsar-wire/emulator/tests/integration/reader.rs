//! The reader: from the earliest, the latest or a message id (inclusive or not), in order,
//! once, through a lost connection; `has_message_available`.

use std::time::Duration;

use futures_util::StreamExt;
use pulsar_wire::{Error, Message, MessageId, Reader, ReaderOptions, StartAt};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{PATIENCE, Setup, send_all, within};

fn text(message: &Message) -> String {
    String::from_utf8_lossy(message.payload()).into_owned()
}

async fn reader(setup: &Setup, topic: &str, options: ReaderOptions) -> Reader {
    Reader::builder(&setup.client, topic, StartAt::Earliest)
        .options(options)
        .build()
        .await
        .expect("a reader")
}

/// Reads `count` messages' payloads.
async fn read(reader: &Reader, count: usize) -> Vec<String> {
    let mut read = Vec::with_capacity(count);
    for _ in 0..count {
        let message = within(PATIENCE, reader.read_next())
            .await
            .unwrap_or_else(|| panic!("only {} of {count} read", read.len()))
            .expect("read");
        read.push(text(&message));
    }
    read
}

fn payloads(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

#[tokio::test]
async fn a_reader_from_the_earliest_reads_everything_in_order_then_nothing_is_available() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    send_all(&setup.producer("read-all", 5).await, 15).await;
    let reader = reader(&setup, "read-all", ReaderOptions::new(StartAt::Earliest)).await;
    assert!(reader.has_message_available().await.expect("asked"));
    assert_eq!(read(&reader, 15).await, payloads(0..15));
    assert!(!reader.has_message_available().await.expect("asked"));
    assert!(
        within(Duration::from_millis(300), reader.read_next())
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_reader_from_the_latest_reads_what_comes_after_it() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("read-latest", 0).await;
    send_all(&producer, 3).await;
    let reader = reader(&setup, "read-latest", ReaderOptions::new(StartAt::Latest)).await;
    assert!(!reader.has_message_available().await.expect("asked"));
    producer
        .send(pulsar_wire::OutgoingMessage::new("after"))
        .await
        .expect("sent");
    assert!(reader.has_message_available().await.expect("asked"));
    assert_eq!(read(&reader, 1).await, ["after"]);
}

/// From a message id inside a batch and outside one, excluded and included.
#[tokio::test]
async fn a_reader_from_an_id_starts_after_it_or_at_it() {
    for per_batch in [0, 5] {
        let setup = Setup::new(EmulatorConfig::default()).await;
        let topic = format!("read-from-{per_batch}");
        let ids: Vec<MessageId> = send_all(&setup.producer(&topic, per_batch).await, 15).await;
        for (inclusive, first) in [(false, 8), (true, 7)] {
            let options = ReaderOptions::new(StartAt::Id(ids[7])).inclusive(inclusive);
            let reader = reader(&setup, &topic, options).await;
            assert_eq!(
                read(&reader, 15 - first).await,
                payloads(first..15),
                "batch {per_batch}, inclusive {inclusive}"
            );
            assert!(!reader.has_message_available().await.expect("asked"));
            reader
                .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                .await
                .expect("closed");
        }
        // From the last message, excluded: nothing available.
        let reader = reader(&setup, &topic, ReaderOptions::new(StartAt::Id(ids[14]))).await;
        assert!(!reader.has_message_available().await.expect("asked"));
    }
}

/// Every connection dropped while reading: the reader subscribes again (its non-durable
/// subscription starts over) and returns each message once, in order. (The consumer's own
/// recall of acknowledged entries hides the copies for 10 s; the reader's skip of what it
/// returned covers any gap.)
#[tokio::test]
async fn a_reader_survives_a_lost_connection_reading_each_message_once() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    send_all(&setup.producer("read-lost", 4).await, 40).await;
    let reader = reader(&setup, "read-lost", ReaderOptions::new(StartAt::Earliest)).await;
    let mut all = read(&reader, 13).await;
    setup.emulator.disconnect_all();
    all.extend(read(&reader, 27).await);
    assert_eq!(all, payloads(0..40));
    assert!(
        within(Duration::from_millis(300), reader.read_next())
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_partitioned_topic_is_read_whole_or_refused_from_an_id() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup
        .emulator
        .create_topic("read-parts", 3)
        .expect("created");
    let producer = setup.producer("read-parts", 0).await;
    let ids = send_all(&producer, 30).await;
    let reader = reader(&setup, "read-parts", ReaderOptions::new(StartAt::Earliest)).await;
    let mut read = read(&reader, 30).await;
    read.sort();
    let mut expected = payloads(0..30);
    expected.sort();
    assert_eq!(read, expected);
    let error = Reader::builder(&setup.client, "read-parts", StartAt::Id(ids[3]))
        .build()
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &error,
            Error::Invalid {
                what: "StartAt::Id",
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_reader_is_a_stream() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    send_all(&setup.producer("read-stream", 3).await, 9).await;
    let reader = reader(&setup, "read-stream", ReaderOptions::new(StartAt::Earliest)).await;
    let read: Vec<String> = reader
        .stream()
        .take(9)
        .map(|message| text(&message.expect("read")))
        .collect()
        .await;
    assert_eq!(read, payloads(0..9));
}

/// A reader's stats and link state are its consumer's: what it received, its partition's
/// link through a lost connection, Closed once closed.
#[tokio::test(start_paused = true)]
async fn a_reader_has_stats_and_a_link_state() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    send_all(&setup.producer("read-stats", 0).await, 3).await;
    let reader = reader(&setup, "read-stats", ReaderOptions::new(StartAt::Earliest)).await;
    let mut state = reader.state();
    assert_eq!(state.borrow().partitions().len(), 1);
    assert!(state.borrow().is_connected());
    assert_eq!(read(&reader, 3).await, payloads(0..3));
    assert_eq!(reader.stats().received, 3);
    let reconnects = reader.stats().reconnects;
    setup
        .emulator
        .set_faults(pulsar_wire_emulator::Faults::none().drop_after_frames(Some(1)));
    setup.emulator.disconnect_all();
    within(
        PATIENCE,
        state.wait_for(|s| matches!(s.overall(), pulsar_wire::LinkState::Reconnecting { .. })),
    )
    .await
    .expect("reconnecting in time")
    .expect("the state lives");
    setup
        .emulator
        .set_faults(pulsar_wire_emulator::Faults::none());
    within(
        PATIENCE,
        state.wait_for(pulsar_wire::LinkStates::is_connected),
    )
    .await
    .expect("connected again in time")
    .expect("the state lives");
    assert!(reader.stats().reconnects > reconnects);
    reader
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    assert!(matches!(
        state.borrow().overall(),
        pulsar_wire::LinkState::Closed
    ));
    assert_eq!(reader.stats().received, 3);
}
