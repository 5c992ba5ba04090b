//! Several access points (`ClientConfig::new("a:1,b:2")`): when the first proxy is
//! unavailable, the producer and the consumers go on with the next.
//!
//! Virtual time (tokio's clock paused): the producer's retry backoff passes at once.

use std::time::Duration;

use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer, SimpleConsumer};

use crate::support::{self, GROUP};

#[tokio::test(start_paused = true)]
async fn the_next_access_point_serves_when_the_first_is_down() {
    let mut first = support::emulator(&["orders"]).await;
    let second = support::emulator(&["orders"]).await;
    first.stop_serving().await.expect("the first proxy stops");
    let config =
        ClientConfig::new(&format!("{},{}", first.endpoint(), second.endpoint())).expect("valid");
    assert_eq!(config.endpoints().len(), 2);

    let producer = Producer::builder(config.clone()).build().expect("session");
    let receipt = producer
        .send(OutgoingMessage::new("orders", "to whichever proxy is up"))
        .await
        .expect("the send goes to the second proxy");
    assert_eq!(second.stats().messages_stored, 1);

    let consumer = SimpleConsumer::builder(config, GROUP)
        .subscribe("orders", "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the consumer starts on the second proxy");
    let mut received = Vec::new();
    while received.is_empty() {
        received = consumer
            .receive(32, Duration::from_secs(30))
            .await
            .expect("receive");
    }
    assert_eq!(received[0].message_id(), receipt.message_id());
    consumer.ack(&received[0]).await.expect("ack");
    consumer.close(Duration::from_secs(5)).await;
    assert_eq!(second.stats().acked, 1);
}

#[test]
fn a_list_with_an_empty_or_bad_entry_is_refused() {
    for bad in [
        "127.0.0.1:1,",
        "127.0.0.1:1,,127.0.0.1:2",
        "127.0.0.1:1,nohost",
    ] {
        let error = ClientConfig::new(bad).expect_err(bad);
        assert!(error.to_string().contains("host:port"), "{error}");
    }
}
