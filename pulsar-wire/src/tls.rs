//! TLS for `pulsar+ssl://` service URLs: the settings [`ConnectOptions`](crate::ConnectOptions)
//! collects, the rustls client configuration built from them, and a handshake whose errors say
//! what to fix.

use std::path::PathBuf;
use std::sync::Arc;

use crate::Error;

/// PEM data given by the application: a file (read at each new connection, so a rotated
/// file is picked up) or bytes.
#[derive(Clone)]
pub(crate) enum Pem {
    File(PathBuf),
    Bytes(Arc<[u8]>),
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Bytes may hold a private key: print their size only.
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Bytes(bytes) => write!(f, "<{} bytes of PEM>", bytes.len()),
        }
    }
}

impl Pem {
    /// Where the PEM comes from, for errors.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Bytes(bytes) => format!("the {} PEM bytes given", bytes.len()),
        }
    }

    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn read(&self, what: &'static str) -> Result<Arc<[u8]>, Error> {
        match self {
            Self::Bytes(bytes) => Ok(Arc::clone(bytes)),
            Self::File(path) => std::fs::read(path)
                .map(Arc::from)
                .map_err(|e| Error::Invalid {
                    what,
                    reason: format!("cannot read {}: {e}", path.display()),
                }),
        }
    }
}

/// What to trust and what to present.
#[derive(Debug, Clone)]
pub(crate) struct TlsSettings {
    /// CA certificates to trust (each PEM may hold several).
    pub(crate) ca: Vec<Pem>,
    /// Whether to trust the Mozilla roots of `webpki-roots`; `None`: only when no CA is given.
    pub(crate) webpki_roots: Option<bool>,
    /// The client certificate chain and its private key (mutual TLS).
    pub(crate) client_cert: Option<(Pem, Pem)>,
    /// Whether the broker's certificate must name the host connected to.
    pub(crate) verify_hostname: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca: Vec::new(),
            webpki_roots: None,
            client_cert: None,
            verify_hostname: true,
        }
    }
}

impl TlsSettings {
    /// Whether any TLS option was set (an error on a `pulsar://` URL).
    pub(crate) fn is_customised(&self) -> bool {
        !self.ca.is_empty()
            || self.webpki_roots.is_some()
            || self.client_cert.is_some()
            || !self.verify_hostname
    }
}

/// The host of `host:port` (brackets of an IPv6 literal removed).
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(feature = "tls")]
pub(crate) use enabled::{client_config, explain, handshake};

#[cfg(feature = "tls")]
mod enabled {
    use std::sync::Arc;

    use rustls::SignatureScheme;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;

    use super::{Pem, TlsSettings, host_of};
    use crate::Error;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn certificates(pem: &Pem, what: &'static str) -> Result<Vec<CertificateDer<'static>>, Error> {
        let bytes = pem.read(what)?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Invalid {
                what,
                reason: format!("{} is not valid PEM: {e}", pem.describe()),
            })?;
        if certs.is_empty() {
            return Err(Error::Invalid {
                what,
                reason: format!(
                    "{} holds no certificate (a PEM block \"BEGIN CERTIFICATE\")",
                    pem.describe()
                ),
            });
        }
        Ok(certs)
    }

    /// The rustls configuration of `settings`, on the `ring` provider (whatever other crates
    /// installed as the process default).
    ///
    /// # Errors
    /// [`Error::Invalid`] when a file cannot be read or holds no usable certificate or key,
    /// or nothing is trusted.
    pub(crate) fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, Error> {
        let provider = provider();
        let mut roots = RootCertStore::empty();
        for pem in &settings.ca {
            for (i, cert) in certificates(pem, "TLS CA certificate")?
                .into_iter()
                .enumerate()
            {
                roots.add(cert).map_err(|e| Error::Invalid {
                    what: "TLS CA certificate",
                    reason: format!(
                        "certificate {} of {} cannot be a trust anchor: {e}",
                        i + 1,
                        pem.describe()
                    ),
                })?;
            }
        }
        if settings.webpki_roots.unwrap_or(settings.ca.is_empty()) {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if roots.is_empty() {
            return Err(Error::Invalid {
                what: "TLS options",
                reason: "nothing to verify the broker's certificate with: give its CA with \
                         ConnectOptions::tls_ca_file or tls_ca_pem, or trust the public roots \
                         with tls_webpki_roots(true)"
                    .into(),
            });
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| Error::Invalid {
                    what: "TLS options",
                    reason: format!("cannot build the certificate verifier: {e}"),
                })?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Invalid {
                what: "TLS options",
                reason: format!("no TLS version available: {e}"),
            })?;
        let builder = if settings.verify_hostname {
            builder.with_webpki_verifier(verifier)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyHostname(verifier)))
        };
        let config = match &settings.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates(cert, "TLS client certificate")?;
                let key_bytes = key.read("TLS client key")?;
                let private_key =
                    PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| Error::Invalid {
                        what: "TLS client key",
                        reason: format!(
                            "{} holds no usable private key (PEM \"BEGIN PRIVATE KEY\", \"BEGIN RSA \
                             PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\"): {e}",
                            key.describe()
                        ),
                    })?;
                builder
                    .with_client_auth_cert(chain, private_key)
                    .map_err(|e| Error::Invalid {
                        what: "TLS client certificate",
                        reason: format!(
                            "{} with the key of {}: {e}",
                            cert.describe(),
                            key.describe()
                        ),
                    })?
            }
        };
        Ok(Arc::new(config))
    }

    /// Verifies the chain like the webpki verifier but accepts a certificate that does not
    /// name the host (`ConnectOptions::tls_verify_hostname(false)`).
    #[derive(Debug)]
    struct AnyHostname(Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for AnyHostname {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            match self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }

    /// The TLS handshake over `tcp` with the broker at `address` (`host:port`).
    ///
    /// # Errors
    /// [`Error::Tls`] when the handshake fails (with what to fix), [`Error::Invalid`] when
    /// the host is not a valid server name, [`Error::ConnectionLost`] on other I/O errors.
    pub(crate) async fn handshake(
        tcp: TcpStream,
        address: &str,
        config: Arc<ClientConfig>,
    ) -> Result<TlsStream<TcpStream>, Error> {
        let host = host_of(address);
        let name = ServerName::try_from(host.to_owned()).map_err(|e| Error::Invalid {
            what: "TLS server name",
            reason: format!(
                "{host:?} (from {address}) is neither a DNS name nor an IP address: {e}"
            ),
        })?;
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| explain(address, &e))
    }

    /// An I/O error on a TLS connection to `address`: [`Error::Tls`] with what to fix when
    /// TLS failed, [`Error::ConnectionLost`] otherwise.
    pub(crate) fn explain(address: &str, error: &std::io::Error) -> Error {
        let host = host_of(address);
        let tls = |reason: String| Error::Tls {
            broker: address.to_owned(),
            reason,
        };
        let Some(inner) = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        else {
            if error.kind() == std::io::ErrorKind::UnexpectedEof {
                return tls(format!(
                    "the broker closed the connection during the handshake ({error}): is \
                     {address} the broker's TLS port (brokerServicePortTls, 6651 by default)?"
                ));
            }
            return Error::ConnectionLost {
                addr: address.to_owned(),
                reason: error.to_string(),
            };
        };
        use rustls::AlertDescription as Alert;
        let reason = match inner {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                "the broker's certificate is not signed by a CA this client trusts ({inner}): \
                 give the CA that signed it with ConnectOptions::tls_ca_file or tls_ca_pem"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "the broker's certificate is not valid for {host:?} ({inner}): connect with a \
                 host name its subjectAltName lists, or give the broker a certificate for \
                 {host:?} (ConnectOptions::tls_verify_hostname(false) skips this check, which \
                 lets anyone holding a certificate of the same CA pose as the broker)"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!(
                "the broker's certificate is outside its validity period ({inner}): renew it \
                 (or check this machine's clock)"
            ),
            rustls::Error::InvalidCertificate(_) => {
                format!("the broker's certificate was rejected: {inner}")
            }
            rustls::Error::AlertReceived(
                Alert::CertificateRequired
                | Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateUnknown
                | Alert::AccessDenied,
            ) => format!(
                "the broker rejected this client's certificate or its absence ({inner}): if \
                 it requires client certificates (tlsRequireTrustedClientCertOnConnect), give \
                 one signed by a CA it trusts with ConnectOptions::tls_client_cert_files or \
                 tls_client_cert_pem"
            ),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                format!(
                    "the broker does not speak TLS here ({inner}): is {address} the broker's \
                     TLS port (brokerServicePortTls, 6651 by default)?"
                )
            }
            other => format!("{other}"),
        };
        tls(reason)
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
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
    use crate::{Client, ConnectOptions, Connection, Error};

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
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
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
        let connected = Connection::connect(
            &options(&format!("pulsar+ssl://127.0.0.1:{port}")).tls_ca_file(&path),
        )
        .await;
        std::fs::remove_file(&path).unwrap();
        connected.expect("connected with the CA file");

        let error = Connection::connect(
            &options(&format!("pulsar+ssl://127.0.0.1:{port}")).tls_ca_file(&path),
        )
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
        let client = Client::connect(options(&format!("pulsar+ssl://{a}")).tls_ca_pem(&ca.pem))
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
        let client = Client::connect(options(&format!("pulsar+ssl://{a}")).tls_ca_pem(&ca.pem))
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
}
