//! TLS to a real RocketMQ proxy (`scripts/brokers/rocketmq start`): the 5.3.3 proxy serves TLS
//! and plain gRPC on the same port (its default, permissive TLS mode).
//!
//! Runs when `ROCKETMQ_ENDPOINT` is set (the script prints it); otherwise every test returns at
//! once. The proxy's CA is the file `ROCKETMQ_TLS_CA` names (the script gives the proxy a
//! certificate for `localhost` and `127.0.0.1` signed by a CA it generates, and prints
//! `ROCKETMQ_TLS_CA`); without it, the certificate the proxy presents is trusted as its own CA
//! (fetched with `openssl s_client`): a proxy in TLS test mode (`tlsTestModeEnable`, its
//! default) makes a self-signed `CN=localhost` certificate at each start that names no host
//! (no subjectAltName), so the host name is not checked then.

use integration_tests::real_rocketmq::{endpoint, unique};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketmq_grpc::{ClientConfig, Error, OutgoingMessage, Producer, SimpleConsumer};

/// The PEM of the CA to trust for the proxy at `endpoint`, and whether its certificate names
/// the host (see the module's documentation).
async fn proxy_ca(endpoint: &str) -> (String, bool) {
    if let Some(path) = std::env::var_os("ROCKETMQ_TLS_CA").filter(|p| !p.is_empty()) {
        let pem = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("ROCKETMQ_TLS_CA {}: {e}", path.to_string_lossy()));
        return (pem, true);
    }
    let output = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", endpoint, "-showcerts"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("openssl s_client runs (or set ROCKETMQ_TLS_CA)");
    let text = String::from_utf8_lossy(&output.stdout);
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("the proxy presents a certificate: does it serve TLS?");
    let end = text[begin..]
        .find("-----END CERTIFICATE-----")
        .map(|i| begin + i + "-----END CERTIFICATE-----".len())
        .expect("a whole certificate");
    (format!("{}\n", &text[begin..end]), false)
}

async fn tls_config(endpoint: &str) -> ClientConfig {
    let (ca, verify_hostname) = proxy_ca(endpoint).await;
    ClientConfig::new(&format!("https://{endpoint}"))
        .expect("endpoint")
        .tls_ca_pem(ca)
        .tls_verify_hostname(verify_hostname)
}

/// A CA the proxy's certificate does not come from.
fn other_ca() -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not the proxy's CA");
    params.self_signed(&key).expect("self-signed").pem()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_and_receives_over_tls_with_the_proxys_ca() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let topic = "it-normal";
    let config = tls_config(&endpoint).await;
    let consumer = Arc::new(
        SimpleConsumer::builder(config.clone(), unique("it-tls"))
            .subscribe(topic, "*")
            .await_duration(Duration::from_secs(5))
            .build()
            .await
            .expect("the simple consumer starts over TLS"),
    );
    // A new group starts at the topic's first message still in memory: take (and ack) the
    // backlog until a receive comes back empty.
    loop {
        let messages = consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("a receive of the backlog over TLS");
        if messages.is_empty() {
            break;
        }
        for message in messages {
            let consumer = Arc::clone(&consumer);
            tokio::spawn(async move { consumer.ack(&message).await });
        }
    }
    let producer = Producer::builder(config).build().expect("session");
    let mut sent = HashSet::new();
    for i in 0..5 {
        let receipt = producer
            .send(OutgoingMessage::new(topic, format!("over TLS {i}")))
            .await
            .expect("a send over TLS");
        sent.insert(receipt.message_id().to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = HashSet::new();
    while !sent.is_subset(&seen) {
        assert!(
            Instant::now() < deadline,
            "received {} of 5 over TLS",
            seen.len()
        );
        for message in consumer
            .receive(32, Duration::from_secs(60))
            .await
            .expect("a receive over TLS")
        {
            consumer.ack(&message).await.expect("an ack over TLS");
            seen.insert(message.message_id().to_owned());
        }
    }
    let consumer = Arc::into_inner(consumer).expect("no other owner");
    consumer.close(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_fails_at_once_and_says_what_to_do() {
    let Some(endpoint) = endpoint() else {
        eprintln!("ROCKETMQ_ENDPOINT is not set; skipping");
        return;
    };
    let config = ClientConfig::new(&format!("https://{endpoint}"))
        .expect("endpoint")
        .tls_ca_pem(other_ca());
    let producer = Producer::builder(config.clone()).build().expect("session");
    let started = Instant::now();
    let error = producer
        .send(OutgoingMessage::new("it-normal", "never sent"))
        .await
        .expect_err("a proxy certificate from another CA is refused");
    let elapsed = started.elapsed();
    assert!(!error.is_retryable(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("not signed by a CA this client trusts"),
        "{text}"
    );
    assert!(text.contains("tls_ca_file"), "{text}");
    // At once: not after the producer's 10 s retry window.
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}: {text}");

    let started = Instant::now();
    let error = SimpleConsumer::builder(config, unique("it-tls-wrong-ca"))
        .subscribe("it-normal", "*")
        .build()
        .await
        .expect_err("the consumer does not start either");
    assert!(matches!(error, Error::Tls { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(3));
}
