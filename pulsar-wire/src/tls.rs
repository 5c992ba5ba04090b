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
mod tests;
