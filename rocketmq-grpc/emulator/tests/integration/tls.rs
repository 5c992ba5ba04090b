//! TLS between the client and the emulator (`EmulatorBuilder::tls`): the right CA sends and
//! receives; a wrong CA, a certificate for another host or an expired one fails at once with
//! [`Error::Tls`], not retryable, saying what to do; hostname verification can be switched
//! off; a required client certificate is accepted when given and its absence fails.
//!
//! Virtual time (tokio's clock paused): a failure "at once" would show the producer's 10 s
//! retry window in the clock if it were retried.

use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rocketmq_grpc::{ClientConfig, Error, OutgoingMessage, Producer, SimpleConsumer};
use rocketmq_grpc_emulator::{Emulator, TopicKind};

use crate::support::GROUP;

/// A CA made for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("self-signed").pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, in PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        self.issue_with(names, |_| {})
    }

    fn issue_with(
        &self,
        names: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let key = KeyPair::generate().expect("a key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        adjust(&mut params);
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

async fn emulator(cert: &str, key: &str, client_ca: Option<&str>) -> Emulator {
    let mut builder = Emulator::builder()
        .group(GROUP, false)
        .topic("orders", TopicKind::Normal, 4)
        .tls(cert, key);
    if let Some(ca) = client_ca {
        builder = builder.tls_client_ca(ca);
    }
    let emulator = builder.start().await.expect("the TLS emulator starts");
    assert!(emulator.is_tls());
    assert!(emulator.url().starts_with("https://"));
    emulator
}

fn config(host: &str, emulator: &Emulator) -> ClientConfig {
    ClientConfig::new(&format!("https://{host}:{}", emulator.local_addr().port())).expect("valid")
}

/// Sends one message and receives it with a simple consumer.
async fn round_trip(config: ClientConfig) {
    let producer = Producer::builder(config.clone()).build().expect("session");
    let receipt = producer
        .send(OutgoingMessage::new("orders", "over TLS"))
        .await
        .expect("a send over TLS");
    let consumer = SimpleConsumer::builder(config, GROUP)
        .subscribe("orders", "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts over TLS");
    let mut received = Vec::new();
    while received.is_empty() {
        received = consumer
            .receive(32, Duration::from_secs(30))
            .await
            .expect("a receive over TLS");
    }
    assert_eq!(received[0].message_id(), receipt.message_id());
    assert_eq!(&received[0].body()[..], b"over TLS");
    consumer.ack(&received[0]).await.expect("an ack over TLS");
    consumer.close(Duration::from_secs(5)).await;
}

/// The error of a send with `config`, checked to come at once (no retry window).
async fn failed_send(config: ClientConfig) -> Error {
    let producer = Producer::builder(config).build().expect("session");
    let started = tokio::time::Instant::now();
    let error = producer
        .send(OutgoingMessage::new("orders", "never sent"))
        .await
        .expect_err("the send fails");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "failed after {:?}, not at once: {error}",
        started.elapsed()
    );
    assert!(!error.is_retryable(), "{error}");
    error
}

#[tokio::test(start_paused = true)]
async fn the_right_ca_sends_and_receives_by_address_and_by_name() {
    let ca = Ca::new("emulator CA");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let emulator = emulator(&cert, &key, None).await;
    round_trip(config("127.0.0.1", &emulator).tls_ca_pem(&ca.pem)).await;
    // The CA from a file, by host name.
    let dir = std::env::temp_dir().join(format!("rmq-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ca.pem");
    std::fs::write(&path, &ca.pem).unwrap();
    round_trip(config("localhost", &emulator).tls_ca_file(&path)).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(emulator.stats().acked, 2);
}

#[tokio::test(start_paused = true)]
async fn a_wrong_ca_fails_at_once_and_names_the_fix() {
    let ca = Ca::new("emulator CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let emulator = emulator(&cert, &key, None).await;
    let error = failed_send(config("127.0.0.1", &emulator).tls_ca_pem(Ca::new("other").pem)).await;
    let Error::Tls { endpoint, reason } = &error else {
        panic!("not a TLS error: {error}");
    };
    assert_eq!(endpoint, &emulator.endpoint());
    assert!(
        reason.contains("not signed by a CA this client trusts"),
        "{reason}"
    );
    assert!(reason.contains("ClientConfig::tls_ca_file"), "{reason}");
    // The public roots alone (no CA given) do not know the emulator's CA either.
    let error = failed_send(config("127.0.0.1", &emulator)).await;
    assert!(error.to_string().contains("tls_ca_file"), "{error}");
    // Nor does a consumer start.
    let error = SimpleConsumer::builder(
        config("127.0.0.1", &emulator).tls_ca_pem(Ca::new("other").pem),
        GROUP,
    )
    .subscribe("orders", "*")
    .build()
    .await
    .expect_err("the consumer does not start");
    assert!(matches!(error, Error::Tls { .. }), "{error}");
    assert_eq!(emulator.stats().messages_stored, 0);
}

#[tokio::test(start_paused = true)]
async fn a_certificate_for_another_host_fails_unless_hostname_verification_is_off() {
    let ca = Ca::new("emulator CA");
    let (cert, key) = ca.issue(&["proxy.example"]);
    let emulator = emulator(&cert, &key, None).await;
    let error = failed_send(config("127.0.0.1", &emulator).tls_ca_pem(&ca.pem)).await;
    let text = error.to_string();
    assert!(text.contains("not valid for \"127.0.0.1\""), "{text}");
    assert!(text.contains("tls_verify_hostname(false)"), "{text}");
    round_trip(
        config("127.0.0.1", &emulator)
            .tls_ca_pem(&ca.pem)
            .tls_verify_hostname(false),
    )
    .await;
    // Switching the check off still checks the CA.
    let error = failed_send(
        config("127.0.0.1", &emulator)
            .tls_ca_pem(Ca::new("other").pem)
            .tls_verify_hostname(false),
    )
    .await;
    assert!(error.to_string().contains("tls_ca_file"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn an_expired_certificate_fails_at_once_saying_so() {
    let ca = Ca::new("emulator CA");
    let (cert, key) = ca.issue_with(&["127.0.0.1"], |params| {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    });
    let emulator = emulator(&cert, &key, None).await;
    let error = failed_send(config("127.0.0.1", &emulator).tls_ca_pem(&ca.pem)).await;
    assert!(
        error.to_string().contains("outside its validity period"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_required_client_certificate_works_when_given_and_its_absence_fails() {
    let ca = Ca::new("emulator CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let client_ca = Ca::new("client CA");
    let (client_cert, client_key) = client_ca.issue(&["client.example"]);
    let emulator = emulator(&cert, &key, Some(&client_ca.pem)).await;
    round_trip(
        config("127.0.0.1", &emulator)
            .tls_ca_pem(&ca.pem)
            .tls_client_cert_pem(&client_cert, &client_key),
    )
    .await;
    let error = failed_send(config("127.0.0.1", &emulator).tls_ca_pem(&ca.pem)).await;
    assert!(matches!(error, Error::Tls { .. }), "{error}");
    assert!(
        error.to_string().contains("tls_client_cert_files"),
        "{error}"
    );
    // A certificate from a CA the emulator does not trust fails the same way.
    let (stranger, stranger_key) = Ca::new("stranger").issue(&["client.example"]);
    let error = failed_send(
        config("127.0.0.1", &emulator)
            .tls_ca_pem(&ca.pem)
            .tls_client_cert_pem(&stranger, &stranger_key),
    )
    .await;
    assert!(
        error.to_string().contains("tls_client_cert_files"),
        "{error}"
    );
}

#[tokio::test]
async fn unusable_server_pem_is_refused_at_start() {
    let error = Emulator::builder()
        .tls("not a certificate", "not a key")
        .start()
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("invalid tls:"), "{error}");
    let error = Emulator::builder()
        .tls_client_ca(Ca::new("client CA").pem)
        .start()
        .await
        .expect_err("refused");
    assert!(
        error.to_string().contains("EmulatorBuilder::tls"),
        "{error}"
    );
}
