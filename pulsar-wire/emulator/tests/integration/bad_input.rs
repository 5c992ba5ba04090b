//! Bad input gets clear errors.

use std::time::Duration;

use pulsar_wire::pb::ServerError;
use pulsar_wire::{
    BatchingOptions, Client, ConnectOptions, ConsumerOptions, Error, OutgoingMessage,
    ProducerOptions,
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
    let error = Client::connect(options).await.expect_err("unreachable");
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
    let subscribed = setup
        .client
        .subscribe("nowhere", "sub", ConsumerOptions::default())
        .await;
    let error = subscribed.expect_err("no such topic");
    assert_eq!(
        error.server_error(),
        Some(ServerError::TopicNotFound),
        "{error}"
    );
    let produced = setup
        .client
        .create_producer("nowhere", ProducerOptions::default())
        .await;
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
            setup
                .client
                .create_producer(topic, ProducerOptions::default())
                .await,
            Err(Error::Invalid { .. })
        ));
    }
    let zero = ProducerOptions::default().batching(BatchingOptions::default().max_messages(0));
    assert!(matches!(
        setup.client.create_producer("t", zero).await,
        Err(Error::Invalid { .. })
    ));
    let no_queue = ConsumerOptions::default().receiver_queue_size(0);
    assert!(matches!(
        setup.client.subscribe("t", "s", no_queue).await,
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        setup
            .client
            .subscribe("t", "", ConsumerOptions::default())
            .await,
        Err(Error::Invalid { .. })
    ));
    let coordinator = setup.client.transaction_coordinator().await.expect("tc");
    assert!(matches!(
        coordinator.new_transaction(Duration::ZERO).await,
        Err(Error::Invalid { .. })
    ));

    let one = setup.shared("foreign", ConsumerOptions::default()).await;
    let other = setup
        .client
        .subscribe(
            "foreign",
            "other",
            ConsumerOptions::default().initial_position(pulsar_wire::InitialPosition::Earliest),
        )
        .await
        .expect("subscribed");
    let producer = setup.producer("foreign", 0).await;
    send_all(&producer, 1).await;
    let message = receive(&one, 1).await.remove(0);
    assert!(matches!(
        other.ack(&message).await,
        Err(Error::Invalid { .. })
    ));
    one.close().await.expect("closed");
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
