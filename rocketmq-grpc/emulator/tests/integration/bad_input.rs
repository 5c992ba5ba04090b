//! Bad input: a clear error, no panic.

use std::time::Duration;

use rocketmq_grpc::Code;
use rocketmq_grpc::{ClientConfig, Credentials, Error, OutgoingMessage, Producer, PushConsumer};
use rocketmq_grpc_emulator::Emulator;

use crate::support::{self, GROUP, Handler};

#[tokio::test]
async fn an_unreachable_endpoint_is_reported_as_such() {
    let config = ClientConfig::new("127.0.0.1:1")
        .unwrap()
        .request_timeout(Duration::from_secs(2));
    let error = PushConsumer::builder(config, GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
}

#[tokio::test]
async fn wrong_credentials_unknown_topic_and_unknown_group_are_refused() {
    let emulator = Emulator::builder()
        .topic("orders", rocketmq_grpc_emulator::TopicKind::Normal, 1)
        .group(GROUP, false)
        .credentials("ak", "sk")
        .start()
        .await
        .unwrap();
    let good = || support::config(&emulator).credentials(Credentials::new("ak", "sk"));
    let refused = |error: Error, code: Code| {
        assert_eq!(error.code(), Some(code), "{error:?}");
        assert!(error.to_string().contains(code.name()), "{error}");
    };
    let wrong = support::config(&emulator).credentials(Credentials::new("ak", "not-the-secret"));
    let error = PushConsumer::builder(wrong, GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    refused(error, Code::Unauthorized);
    let error = PushConsumer::builder(good(), GROUP)
        .subscribe("no-such-topic", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    refused(error, Code::TopicNotFound);
    let error = PushConsumer::builder(good(), "no-such-group")
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    refused(error, Code::ConsumerGroupNotFound);
    let ok = PushConsumer::builder(good(), GROUP)
        .subscribe("orders", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap();
    ok.close(Duration::from_secs(5)).await;
}

/// A push consumer built without a handler is refused before anything connects, naming
/// `handler` and saying what to do.
#[tokio::test]
async fn a_push_consumer_without_a_handler_is_refused_naming_it() {
    let emulator = support::emulator(&["orders"]).await;
    let error = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .build()
        .await
        .expect_err("no handler");
    assert!(
        matches!(
            error,
            Error::Invalid {
                what: "handler",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains(".handler(..)"), "{error}");
    assert!(emulator.clients().is_empty(), "nothing connected");
}

#[tokio::test]
async fn oversized_messages_are_refused_before_and_by_the_proxy() {
    let emulator = support::emulator(&["orders"]).await;
    let body = vec![0u8; 5 * 1024 * 1024];
    let producer = Producer::builder(support::config(&emulator))
        .build()
        .unwrap();
    let error = producer
        .send(OutgoingMessage::new("orders", body.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::MessageTooLarge {
                limit: 4_194_304,
                ..
            }
        ),
        "{error:?}"
    );
    let lenient = Producer::builder(support::config(&emulator))
        .max_body(8 * 1024 * 1024)
        .build()
        .unwrap();
    let error = lenient
        .send(OutgoingMessage::new("orders", body))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(Code::MessageBodyTooLarge), "{error:?}");
    let sent = lenient
        .send(OutgoingMessage::new("orders", "fine"))
        .await
        .unwrap();
    assert!(!sent.message_id().is_empty());
}

#[tokio::test]
async fn invalid_settings_are_rejected_by_name() {
    assert!(matches!(
        ClientConfig::new("localhost"),
        Err(Error::Invalid {
            what: "endpoint",
            ..
        })
    ));
    let config = ClientConfig::new("127.0.0.1:1").unwrap();
    let error = PushConsumer::builder(config.clone(), GROUP)
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        Error::Invalid {
            what: "subscribe",
            ..
        }
    ));
    let error = PushConsumer::builder(config, "")
        .subscribe("t", "*")
        .handler(Handler::default())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Invalid { what: "group", .. }));
    for renewal in [
        Duration::from_secs(9),
        Duration::from_secs(12 * 3600 + 1),
        Duration::MAX,
    ] {
        let error = PushConsumer::builder(ClientConfig::new("127.0.0.1:1").unwrap(), GROUP)
            .subscribe("t", "*")
            .renewal(renewal)
            .handler(Handler::default())
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                Error::Invalid {
                    what: "renewal",
                    ..
                }
            ),
            "{renewal:?}: {error}"
        );
    }
}
