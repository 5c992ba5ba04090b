//! Token authentication against an emulator that requires a token, with the closure form of
//! `TokenProvider`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pulsar_wire::{ClientBuilder, ConnectOptions, Consumer, Error, OutgoingMessage, Producer};
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

use crate::support::receive;

const TOKEN: &str = "s3cr3t";

async fn emulator() -> Emulator {
    Emulator::start(EmulatorConfig::default().auth_token(TOKEN))
        .await
        .expect("the emulator starts")
}

fn options(emulator: &Emulator) -> ConnectOptions {
    ConnectOptions::new(emulator.endpoint())
        .expect("a valid URL")
        .operation_timeout(Duration::from_secs(10))
}

/// A closure is a token provider: it is asked at connect, and its token lets the client
/// produce and consume.
#[tokio::test]
async fn a_closure_provides_the_token() {
    let emulator = emulator().await;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let client = ClientBuilder::from(options(&emulator).auth_token_provider(move || {
        let counted = Arc::clone(&counted);
        async move {
            counted.fetch_add(1, Ordering::Relaxed);
            Ok(TOKEN.to_owned())
        }
    }))
    .build()
    .await
    .expect("connected with the closure's token");
    assert!(calls.load(Ordering::Relaxed) >= 1);
    let consumer = Consumer::builder(&client, "auth", "sub")
        .initial_position(pulsar_wire::InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed");
    let producer = Producer::builder(&client, "auth")
        .options(Default::default())
        .build()
        .await
        .expect("a producer");
    producer
        .send(OutgoingMessage::new("hello"))
        .await
        .expect("sent");
    let received = receive(&consumer, 1).await;
    assert_eq!(received[0].payload().as_ref(), b"hello");
    client.close().await;
}

/// A closure's wrong token is refused as an authentication error, and a closure's own error
/// comes back from `connect` as it is.
#[tokio::test]
async fn a_closure_s_wrong_token_or_error_fails_the_connect() {
    let emulator = emulator().await;
    let error = ClientBuilder::from(
        options(&emulator).auth_token_provider(|| async { Ok("wrong".to_owned()) }),
    )
    .build()
    .await
    .expect_err("refused");
    assert!(matches!(error, Error::Authentication { .. }), "{error}");
    assert!(!error.is_retryable(), "{error}");
    let error = ClientBuilder::from(options(&emulator).auth_token_provider(|| async {
        Err(Error::Invalid {
            what: "token",
            reason: "the vault is sealed".into(),
        })
    }))
    .build()
    .await
    .expect_err("no token");
    assert!(error.to_string().contains("the vault is sealed"), "{error}");
}
