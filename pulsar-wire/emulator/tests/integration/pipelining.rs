//! The producer's batches on the wire at once (issue 17): many batches of one partition wait
//! for their receipts together, yet the broker stores them in the order they were sent, every
//! message gets the id of its place, and a consumer receives them in that order. Also: a
//! send's future stays small, since applications hold thousands of them.

use pulsar_wire::{ConsumerOptions, OutgoingMessage};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, receive, send_all};

const TOPIC: &str = "pipelining";

#[tokio::test(start_paused = true)]
async fn batches_in_flight_together_keep_their_order_and_ids() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = setup.shared(TOPIC, ConsumerOptions::default()).await;
    let producer = setup.producer(TOPIC, 10).await;
    let ids = send_all(&producer, 1_000).await;
    for (index, pair) in ids.windows(2).enumerate() {
        let position =
            |id: &pulsar_wire::MessageId| (id.ledger_id(), id.entry_id(), id.batch_index());
        assert!(
            position(&pair[0]) < position(&pair[1]),
            "message {index}'s id is not before the next one's"
        );
    }
    for (index, id) in ids.iter().enumerate() {
        assert_eq!(
            (id.batch_index(), id.batch_size()),
            ((index % 10) as i32, Some(10)),
            "message {index}"
        );
    }
    let received = receive(&consumer, ids.len()).await;
    for (index, message) in received.iter().enumerate() {
        assert_eq!(message.payload().as_ref(), format!("m{index}").as_bytes());
        assert_eq!(message.id(), ids[index]);
    }
}

/// A send's future was 7,984 bytes before issue 17 (the large and rare paths inline), and an
/// application holding 10,000 sends moved and stored all that: most of the producer's memory
/// traffic.
#[tokio::test]
async fn a_send_future_stays_small() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer(TOPIC, 10).await;
    let send = producer.send(OutgoingMessage::new("x"));
    let size = std::mem::size_of_val(&send);
    assert!(size <= 256, "a send's future takes {size} bytes");
    drop(send);
}

/// A send's future is `Unpin` and can be polled by hand; polled again after it completed it
/// says so (an error naming `send`) instead of hanging or panicking.
#[tokio::test]
async fn a_send_future_polled_again_after_it_completed_says_so() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer(TOPIC, 10).await;
    producer
        .close(std::time::Duration::from_secs(5))
        .await
        .expect("closed");
    let mut send = producer.send(OutgoingMessage::new("x"));
    let mut cx = Context::from_waker(Waker::noop());
    let first = std::pin::Pin::new(&mut send).poll(&mut cx);
    assert!(
        matches!(first, Poll::Ready(Err(pulsar_wire::Error::Closed(_)))),
        "{first:?}"
    );
    let again = std::pin::Pin::new(&mut send).poll(&mut cx);
    assert!(
        matches!(
            again,
            Poll::Ready(Err(pulsar_wire::Error::Invalid { what: "send", .. }))
        ),
        "{again:?}"
    );
}
