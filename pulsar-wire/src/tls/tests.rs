//! TLS against in-process servers: handshakes, verification, client certificates, lookups.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::connection::fake_broker::{Peer, listen};
use crate::pb::base_command::Type;
use crate::pb::{self, command_lookup_topic_response::LookupType};
use crate::{ConnectOptions, Connection, Error};

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
        let key = KeyPair::generate().expect("a key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let params = CertificateParams::new(names).expect("params");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS broker on 127.0.0.1 that answers one CONNECT; requires client certificates
/// signed by `client_ca` when given. The task returns the server's TLS error, if any.
async fn tls_broker(
    cert: &str,
    key: &str,
    client_ca: Option<&str>,
) -> (u16, JoinHandle<Option<String>>) {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a key");
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(cert.expect("a CA")).expect("added");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (listener, address) = listen().await;
    let port = address.rsplit_once(':').unwrap().1.parse().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.ok()?;
        let stream = match acceptor.accept(tcp).await {
            Ok(stream) => stream,
            Err(e) => return Some(e.to_string()),
        };
        let mut peer = Peer::new(stream);
        match futures_util::StreamExt::next(&mut peer.0).await {
            Some(Ok(_connect)) => {
                peer.connected().await;
                peer.drain().await;
                None
            }
            Some(Err(e)) => Some(e.to_string()),
            None => Some("closed".into()),
        }
    });
    (port, task)
}

/// A TLS broker on 127.0.0.1 that serves every connection: `CONNECT`, then `LOOKUP`s
/// answered with `answer(own host:port)`.
async fn tls_lookup_broker(
    cert: &str,
    key: &str,
    answer: impl Fn(&str) -> pb::CommandLookupTopicResponse + Send + Sync + 'static,
) -> String {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a key");
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (listener, address) = listen().await;
    let own = address.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, answer, own) = (acceptor.clone(), Arc::clone(&answer), own.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut peer = Peer::new(stream);
                peer.accept_connect().await;
                while let Some(Ok(frame)) = futures_util::StreamExt::next(&mut peer.0).await {
                    let Some(lookup) = frame.command.lookup_topic else {
                        continue;
                    };
                    let mut response = answer(&own);
                    response.request_id = lookup.request_id;
                    peer.send(crate::command_frame(Type::LookupResponse, |c| {
                        c.lookup_topic_response = Some(response);
                    }))
                    .await;
                }
            });
        }
    });
    address
}

fn options(url: &str) -> ConnectOptions {
    ConnectOptions::new(url)
        .expect("valid")
        .operation_timeout(Duration::from_secs(10))
}

#[tokio::test]
async fn a_broker_certified_by_the_trusted_ca_is_connected_to() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    for host in ["127.0.0.1", "localhost"] {
        let (port, _broker) = tls_broker(&cert, &key, None).await;
        let connection = Connection::connect(
            &options(&format!("pulsar+ssl://{host}:{port}")).tls_ca_pem(&ca.pem),
        )
        .await
        .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert!(connection.is_tls());
        assert_eq!(connection.server_version(), "fake");
        connection.close();
    }
}

#[tokio::test]
async fn the_ca_can_come_from_a_file() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let path = std::env::temp_dir().join(format!("pulsar-wire-ca-{}.pem", std::process::id()));
    std::fs::write(&path, &ca.pem).unwrap();
    let (port, _broker) = tls_broker(&cert, &key, None).await;
    let connected =
        Connection::connect(&options(&format!("pulsar+ssl://127.0.0.1:{port}")).tls_ca_file(&path))
            .await;
    std::fs::remove_file(&path).unwrap();
    connected.expect("connected with the CA file");

    let error =
        Connection::connect(&options(&format!("pulsar+ssl://127.0.0.1:{port}")).tls_ca_file(&path))
            .await
            .expect_err("the file is gone");
    assert!(matches!(error, Error::Invalid { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused_unless_hostname_checks_are_off() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["broker.example"]);
    let (port, broker) = tls_broker(&cert, &key, None).await;
    let url = format!("pulsar+ssl://127.0.0.1:{port}");
    let error = Connection::connect(&options(&url).tls_ca_pem(&ca.pem))
        .await
        .expect_err("wrong host");
    let Error::Tls { broker: at, reason } = &error else {
        panic!("not a TLS error: {error:?}");
    };
    assert_eq!(at, &format!("127.0.0.1:{port}"));
    assert!(reason.contains("not valid for \"127.0.0.1\""), "{reason}");
    assert!(reason.contains("tls_verify_hostname"), "{reason}");
    assert!(!error.is_retryable());
    assert!(
        broker.await.unwrap().is_some(),
        "the server saw the refusal"
    );

    let (port, _broker) = tls_broker(&cert, &key, None).await;
    Connection::connect(
        &options(&format!("pulsar+ssl://127.0.0.1:{port}"))
            .tls_ca_pem(&ca.pem)
            .tls_verify_hostname(false),
    )
    .await
    .expect("the chain is trusted and the name is not checked");
}

#[tokio::test]
async fn a_certificate_from_an_untrusted_ca_is_refused() {
    let ca = Ca::new("the broker's CA");
    let other = Ca::new("another CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    for verify_hostname in [true, false] {
        let (port, _broker) = tls_broker(&cert, &key, None).await;
        let error = Connection::connect(
            &options(&format!("pulsar+ssl://127.0.0.1:{port}"))
                .tls_ca_pem(&other.pem)
                .tls_verify_hostname(verify_hostname),
        )
        .await
        .expect_err("untrusted");
        let text = error.to_string();
        assert!(matches!(error, Error::Tls { .. }), "{error:?}");
        assert!(
            text.contains("not signed by a CA this client trusts"),
            "{text}"
        );
        assert!(text.contains("tls_ca_file"), "{text}");
    }
    // The public roots do not vouch for a private CA either.
    let (port, _broker) = tls_broker(&cert, &key, None).await;
    let error = Connection::connect(&options(&format!("pulsar+ssl://127.0.0.1:{port}")))
        .await
        .expect_err("untrusted");
    assert!(error.to_string().contains("not signed by a CA"), "{error}");
}

#[tokio::test]
async fn a_broker_that_requires_client_certificates_gets_one() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let (client_cert, client_key) = ca.issue(&["client"]);

    let (port, _broker) = tls_broker(&cert, &key, Some(&ca.pem)).await;
    let error = Connection::connect(
        &options(&format!("pulsar+ssl://127.0.0.1:{port}")).tls_ca_pem(&ca.pem),
    )
    .await
    .expect_err("no client certificate");
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
    assert!(
        error.to_string().contains("tls_client_cert_files"),
        "{error}"
    );

    let (port, broker) = tls_broker(&cert, &key, Some(&ca.pem)).await;
    let connection = Connection::connect(
        &options(&format!("pulsar+ssl://127.0.0.1:{port}"))
            .tls_ca_pem(&ca.pem)
            .tls_client_cert_pem(&client_cert, &client_key),
    )
    .await
    .expect("connected with a client certificate");
    connection.close();
    assert_eq!(
        broker.await.unwrap(),
        None,
        "the server accepted the client"
    );
}

#[tokio::test]
async fn tls_to_a_plain_port_says_so() {
    let (listener, address) = listen().await;
    tokio::spawn(async move {
        // A plain broker reads the ClientHello as a frame, finds it bad and closes.
        let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
        let _ = futures_util::StreamExt::next(&mut peer.0).await;
    });
    let ca = Ca::new("test CA");
    let error =
        Connection::connect(&options(&format!("pulsar+ssl://{address}")).tls_ca_pem(&ca.pem))
            .await
            .expect_err("not TLS");
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
    assert!(error.to_string().contains("TLS port"), "{error}");
}

#[tokio::test]
async fn unusable_tls_settings_are_reported_before_connecting() {
    // Nothing listens: each error must come from the settings.
    let url = "pulsar+ssl://127.0.0.1:9";
    let cases = [
        (
            options(url).tls_ca_pem("not PEM at all"),
            "holds no certificate",
        ),
        (options(url).tls_webpki_roots(false), "nothing to verify"),
        (
            options(url)
                .tls_ca_pem(Ca::new("ca").pem)
                .tls_client_cert_pem(Ca::new("c").pem, "no key here"),
            "holds no usable private key",
        ),
        (
            options("pulsar://127.0.0.1:9").tls_ca_pem(Ca::new("ca").pem),
            "use pulsar+ssl://127.0.0.1:9",
        ),
    ];
    for (options, expected) in cases {
        let error = Connection::connect(&options).await.expect_err("refused");
        assert!(matches!(error, Error::Invalid { .. }), "{error:?}");
        assert!(error.to_string().contains(expected), "{error}");
    }
}

#[tokio::test]
async fn a_redirect_on_tls_follows_the_brokers_tls_url() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    // B serves the topic itself.
    let b = tls_lookup_broker(&cert, &key, |own| pb::CommandLookupTopicResponse {
        broker_service_url: Some("pulsar://127.0.0.1:1".into()),
        broker_service_url_tls: Some(format!("pulsar+ssl://{own}")),
        response: Some(LookupType::Connect as i32),
        authoritative: Some(true),
        ..Default::default()
    })
    .await;
    // A sends it to B: a plain URL that leads nowhere, and B's TLS URL.
    let to_b = format!("pulsar+ssl://{b}");
    let a = tls_lookup_broker(&cert, &key, move |_| pb::CommandLookupTopicResponse {
        broker_service_url: Some("pulsar://127.0.0.1:1".into()),
        broker_service_url_tls: Some(to_b.clone()),
        response: Some(LookupType::Redirect as i32),
        ..Default::default()
    })
    .await;
    let client =
        crate::ClientBuilder::from(options(&format!("pulsar+ssl://{a}")).tls_ca_pem(&ca.pem))
            .build()
            .await
            .expect("connected to A");
    let connection = client.lookup("t").await.expect("redirected");
    assert_eq!(connection.address(), b);
    assert!(connection.is_tls());
}

#[tokio::test]
async fn a_redirect_without_a_tls_url_is_refused_clearly() {
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let a = tls_lookup_broker(&cert, &key, |_| pb::CommandLookupTopicResponse {
        broker_service_url: Some("pulsar://127.0.0.1:6650".into()),
        response: Some(LookupType::Redirect as i32),
        ..Default::default()
    })
    .await;
    let client =
        crate::ClientBuilder::from(options(&format!("pulsar+ssl://{a}")).tls_ca_pem(&ca.pem))
            .build()
            .await
            .expect("connected");
    let error = client.lookup("t").await.expect_err("no TLS URL");
    let text = error.to_string();
    assert!(
        matches!(error, Error::Invalid { what: "lookup", .. }),
        "{error:?}"
    );
    assert!(text.contains("brokerServiceUrlTls"), "{text}");
    assert!(text.contains("pulsar://127.0.0.1:6650"), "{text}");
    assert!(text.contains(&a), "{text}");
}

#[test]
fn hosts_of_addresses() {
    assert_eq!(super::host_of("broker.example:6651"), "broker.example");
    assert_eq!(super::host_of("127.0.0.1:6651"), "127.0.0.1");
    assert_eq!(super::host_of("[::1]:6651"), "::1");
}

#[test]
fn pem_bytes_are_not_printed() {
    let options = options("pulsar+ssl://h:6651").tls_client_cert_pem("CERT", "SECRET KEY");
    let debug = format!("{options:?}");
    assert!(!debug.contains("SECRET"), "{debug}");
}
