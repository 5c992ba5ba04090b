//! Bad input gets clear errors.

use std::time::Duration;

use pulsar_wire::ServerError;
use pulsar_wire::prioritized::{LayoutSpec, PriorityConsumer, PriorityPolicy};
use pulsar_wire::{
    BatchingOptions, ClientBuilder, ConnectOptions, Consumer, ConsumerOptions, Error,
    MAX_PARTITIONS_REFRESH, MIN_PARTITIONS_REFRESH, OutgoingMessage, Producer, ProducerOptions,
};
use pulsar_wire_emulator::EmulatorConfig;

use crate::support::{Setup, receive, send_all};

#[tokio::test]
async fn an_unreachable_broker_is_reported() {
    // Bind a port, then free it: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let options = ConnectOptions::new(&format!("pulsar://127.0.0.1:{port}"))
        .expect("valid")
        .operation_timeout(Duration::from_secs(2));
    let error = ClientBuilder::from(options)
        .build()
        .await
        .expect_err("unreachable");
    assert!(matches!(error, Error::ConnectionLost { .. }), "{error}");
    assert!(error.to_string().contains(&port.to_string()), "{error}");
    assert!(error.is_retryable());
    for bad in [
        "pulsar://host",
        "pulsar+ssl://h",
        "pulsar://h:0",
        "http://h:80",
        "",
    ] {
        assert!(matches!(
            ConnectOptions::new(bad),
            Err(Error::Invalid { .. })
        ));
    }
    assert!(ConnectOptions::new("pulsar+ssl://h:6651").unwrap().is_tls());
}

#[tokio::test]
async fn unknown_topics_without_auto_creation_are_refused() {
    let setup = Setup::new(EmulatorConfig::default().auto_topic_creation(false)).await;
    let subscribed = Consumer::builder(&setup.client, "nowhere", "sub")
        .build()
        .await;
    let error = subscribed.expect_err("no such topic");
    assert_eq!(
        error.server_error(),
        Some(ServerError::TopicNotFound),
        "{error}"
    );
    let produced = Producer::builder(&setup.client, "nowhere").build().await;
    let error = produced.expect_err("no such topic");
    assert_eq!(
        error.server_error(),
        Some(ServerError::TopicNotFound),
        "{error}"
    );
    assert!(error.to_string().contains("TopicNotFound"), "{error}");
}

#[tokio::test]
async fn oversized_messages_are_refused_before_sending() {
    let setup = Setup::new(EmulatorConfig::default().max_message_size(64 * 1024)).await;
    let consumer = setup.shared("big", ConsumerOptions::default()).await;
    for producer in [
        setup.producer("big", 0).await,
        setup.producer("big", 3).await,
    ] {
        let error = producer
            .send(OutgoingMessage::new(vec![0u8; 100 * 1024]))
            .await
            .expect_err("too large");
        assert!(matches!(error, Error::Invalid { .. }), "{error}");
        assert!(error.to_string().contains("max_message_size"), "{error}");
        // The producer keeps working.
        send_all(&producer, 3).await;
    }
    for message in receive(&consumer, 6).await {
        consumer.ack(&message).await.expect("ack queued");
    }
    consumer.flush_acks().await;
    setup.assert_drained("big").await;
}

#[tokio::test]
async fn bad_names_options_and_foreign_messages_are_refused() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    for topic in ["", "a/b", "ftp://t/n/x"] {
        assert!(matches!(
            Producer::builder(&setup.client, topic).build().await,
            Err(Error::Invalid { .. })
        ));
    }
    let zero = ProducerOptions::default().batching(BatchingOptions::default().max_messages(0));
    assert!(matches!(
        Producer::builder(&setup.client, "t")
            .options(zero)
            .build()
            .await,
        Err(Error::Invalid { .. })
    ));
    let no_queue = ConsumerOptions::default().receiver_queue_size(0);
    assert!(matches!(
        Consumer::builder(&setup.client, "t", "s")
            .options(no_queue)
            .build()
            .await,
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        Consumer::builder(&setup.client, "t", "").build().await,
        Err(Error::Invalid { .. })
    ));
    let coordinator = setup.client.transaction_coordinator().await.expect("tc");
    assert!(matches!(
        coordinator.new_transaction(Duration::ZERO).await,
        Err(Error::Invalid { .. })
    ));

    let one = setup.shared("foreign", ConsumerOptions::default()).await;
    let other = Consumer::builder(&setup.client, "foreign", "other")
        .initial_position(pulsar_wire::InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed");
    let producer = setup.producer("foreign", 0).await;
    send_all(&producer, 1).await;
    let message = receive(&one, 1).await.remove(0);
    assert!(matches!(
        other.ack(&message).await,
        Err(Error::Invalid { .. })
    ));
    one.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    assert!(matches!(one.ack(&message).await, Err(Error::Closed(_))));
    assert!(matches!(one.receive().await, Err(Error::Closed(_))));
}

#[tokio::test]
async fn transactions_need_a_coordinator() {
    let setup = Setup::new(EmulatorConfig::default().transactions(false)).await;
    let error = setup
        .client
        .transaction_coordinator()
        .await
        .expect_err("no coordinator");
    assert_eq!(
        error.server_error(),
        Some(ServerError::TransactionCoordinatorNotFound),
        "{error}"
    );
}

/// A free local port, nothing listening on it.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Options out of their range fail at `Client::connect`, naming the option and its range
/// (before: a zero operation timeout, frame limit or keep-alive was accepted and failed at
/// the first request or frame).
#[tokio::test]
async fn connection_options_out_of_range_are_refused_up_front() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let options = || ConnectOptions::new(setup.emulator.endpoint()).expect("valid");
    for (bad, name) in [
        (
            options().operation_timeout(Duration::ZERO),
            "operation_timeout",
        ),
        (options().max_frame_size(0), "max_frame_size"),
        (options().keep_alive(Duration::ZERO), "keep_alive"),
    ] {
        let error = ClientBuilder::from(bad)
            .build()
            .await
            .expect_err("out of range");
        assert!(
            matches!(&error, Error::Invalid { what, .. } if *what == name),
            "{error}"
        );
        assert!(!error.is_retryable());
    }
    ClientBuilder::from(options())
        .build()
        .await
        .expect("the defaults connect");
}

/// A receiver queue outside 1..=1,000,000 is refused when subscribing (before: u32::MAX was
/// sent as a FLOW and the broker closed the whole connection, saying only that it closed it).
#[tokio::test]
async fn a_receiver_queue_out_of_range_is_refused_when_subscribing() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    for size in [0, u32::MAX, pulsar_wire::MAX_RECEIVER_QUEUE_SIZE + 1] {
        let error = Consumer::builder(&setup.client, "queue-size", "sub")
            .receiver_queue_size(size)
            .build()
            .await
            .expect_err("out of range");
        assert!(
            matches!(&error, Error::Invalid { what, .. } if *what == "receiver_queue_size"),
            "{error}"
        );
        assert!(error.to_string().contains("1..=1000000"), "{error}");
    }
    Consumer::builder(&setup.client, "queue-size", "sub")
        .receiver_queue_size(pulsar_wire::MAX_RECEIVER_QUEUE_SIZE)
        .build()
        .await
        .expect("the largest queue is taken");
}

/// A `partitions_refresh` outside 100 ms..=1 day is refused when creating a producer or
/// subscribing, plainly or by priority, naming the option (before: zero was taken as `None`
/// in silence, and `Duration::MAX` panicked the refresh task of a producer or a priority
/// consumer at its first wait).
#[tokio::test]
async fn a_partitions_refresh_out_of_range_is_refused() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    setup
        .emulator
        .create_topic("refreshed", 2)
        .expect("created");
    // Creates a producer, a plain and a priority consumer with `every`, closing each that
    // opens; returns each one's outcome.
    let open_each = |every: Duration| {
        let client = &setup.client;
        async move {
            let policy = PriorityPolicy::new(2).expect("policy");
            let priority = PriorityConsumer::builder(
                client,
                "refreshed",
                "prio",
                policy,
                LayoutSpec::partition_shares([1, 1]),
            )
            .partitions_refresh(Some(every));
            let producer = match Producer::builder(client, "refreshed")
                .partitions_refresh(Some(every))
                .build()
                .await
            {
                Ok(producer) => producer
                    .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                    .await
                    .map(drop),
                Err(error) => Err(error),
            };
            let plain = match Consumer::builder(client, "refreshed", "plain")
                .partitions_refresh(Some(every))
                .build()
                .await
            {
                Ok(consumer) => consumer
                    .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                    .await
                    .map(drop),
                Err(error) => Err(error),
            };
            let prioritized = match priority.build().await {
                Ok(consumer) => consumer
                    .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
                    .await
                    .map(drop),
                Err(error) => Err(error),
            };
            [
                ("producer", producer),
                ("consumer", plain),
                ("priority consumer", prioritized),
            ]
        }
    };
    for every in [
        Duration::ZERO,
        Duration::from_millis(99),
        MAX_PARTITIONS_REFRESH + Duration::from_nanos(1),
        Duration::MAX,
    ] {
        for (side, outcome) in open_each(every).await {
            let error = outcome.expect_err(side);
            assert!(
                matches!(&error, Error::Invalid { what, .. } if *what == "partitions_refresh"),
                "{side}: {error}"
            );
            assert!(
                error.to_string().contains("100ms..=86400s"),
                "{side}: {error}"
            );
        }
    }
    for every in [MIN_PARTITIONS_REFRESH, MAX_PARTITIONS_REFRESH] {
        for (side, outcome) in open_each(every).await {
            outcome.unwrap_or_else(|error| panic!("{side} with {every:?}: {error}"));
        }
    }
}

/// After `Client::close` nothing works any more, each call failing with `Closed` (before:
/// creating producers, sending, subscribing and receiving all went on working).
#[tokio::test]
async fn a_closed_client_refuses_everything_with_closed() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = setup.producer("closing", 0).await;
    let consumer = setup.shared("closing", ConsumerOptions::default()).await;
    send_all(&producer, 1).await;
    receive(&consumer, 1).await;
    setup.client.close().await;
    let closed = |error: Error| assert!(matches!(error, Error::Closed(_)), "{error}");
    closed(
        Producer::builder(&setup.client, "closing")
            .build()
            .await
            .expect_err("closed"),
    );
    closed(
        Consumer::builder(&setup.client, "closing", "other")
            .build()
            .await
            .expect_err("closed"),
    );
    closed(
        producer
            .send(OutgoingMessage::new("late"))
            .await
            .expect_err("closed"),
    );
    closed(consumer.receive().await.expect_err("closed"));
}

/// `send_timeout(Duration::ZERO)` means no timeout, as the Java client's `sendTimeout(0)`
/// (before: every send failed at once with a timeout).
#[tokio::test]
async fn a_zero_send_timeout_means_none() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let producer = Producer::builder(&setup.client, "no-timeout")
        .send_timeout(Duration::ZERO)
        .build()
        .await
        .expect("created");
    producer
        .send(OutgoingMessage::new("m"))
        .await
        .expect("sent, not timed out");
}

/// A service URL naming several hosts (`pulsar://h1:6650,h2:6650`, as the Java client takes
/// it) connects to the first that answers (before: a DNS error for the whole string).
#[tokio::test]
async fn a_multi_host_service_url_connects_to_a_host_that_answers() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let endpoint = setup.emulator.endpoint().trim_start_matches("pulsar://");
    let url = format!("pulsar://127.0.0.1:{},{endpoint}", closed_port());
    let options = ConnectOptions::new(&url)
        .expect("several hosts are valid")
        .operation_timeout(Duration::from_secs(5));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("the second host answers");
    let producer = Producer::builder(&client, "multi-host")
        .build()
        .await
        .expect("created through the second host");
    producer
        .send(OutgoingMessage::new("m"))
        .await
        .expect("sent");
}

/// An HTTP port (the broker's admin port) is recognised as one (before: "a frame of
/// 1213486160 bytes exceeds the limit").
#[tokio::test]
async fn an_http_port_is_said_to_be_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        if let Ok((mut tcp, _)) = listener.accept().await {
            let mut buffer = [0u8; 256];
            let _ = tcp.read(&mut buffer).await;
            let _ = tcp
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let options = ConnectOptions::new(&format!("pulsar://{address}"))
        .expect("valid")
        .operation_timeout(Duration::from_secs(5));
    let error = ClientBuilder::from(options)
        .build()
        .await
        .expect_err("not Pulsar");
    assert!(
        error
            .to_string()
            .contains("not a Pulsar binary-protocol port"),
        "{error}"
    );
}
