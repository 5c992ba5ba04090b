//! TLS to the proxy: the settings [`ClientConfig`](crate::ClientConfig) collects, the rustls
//! client configuration built from them, the connector tonic's channels use, and the
//! explanation of a failed handshake (what was wrong and what to do).

use std::path::PathBuf;
use std::sync::Arc;

use crate::Error;

/// PEM data given by the application: a file (read when the session is built) or bytes.
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

    /// The CA setting this PEM came from.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn ca_setting(&self) -> &'static str {
        match self {
            Self::File(_) => "tls_ca_file",
            Self::Bytes(_) => "tls_ca_pem",
        }
    }

    /// The client certificate setting this PEM came from.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn client_setting(&self) -> &'static str {
        match self {
            Self::File(_) => "tls_client_cert_files",
            Self::Bytes(_) => "tls_client_cert_pem",
        }
    }

    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    fn read(&self, setting: &'static str) -> Result<Arc<[u8]>, Error> {
        match self {
            Self::Bytes(bytes) => Ok(Arc::clone(bytes)),
            Self::File(path) => std::fs::read(path).map(Arc::from).map_err(|e| {
                Error::invalid(setting, format!("cannot read {}: {e}", path.display()))
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
    /// Whether the proxy's certificate must name the host connected to.
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
    /// Whether any TLS option was set (an error when TLS is off).
    pub(crate) fn is_customised(&self) -> bool {
        !self.ca.is_empty()
            || self.webpki_roots.is_some()
            || self.client_cert.is_some()
            || !self.verify_hostname
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::{Connector, TlsConfig, client_config};

/// Without the feature there is no TLS configuration to hold.
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub(crate) struct TlsConfig;

#[cfg(feature = "tls")]
mod enabled {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use hyper_util::rt::TokioIo;
    use rustls::SignatureScheme;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;
    use tonic::codegen::http::Uri;

    use super::{Pem, TlsSettings};
    use crate::Error;
    use crate::error::TlsFailure;

    /// The rustls configuration shared by a session's connections.
    pub(crate) type TlsConfig = Arc<ClientConfig>;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn certificates(
        pem: &Pem,
        setting: &'static str,
    ) -> Result<Vec<CertificateDer<'static>>, Error> {
        let bytes = pem.read(setting)?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::invalid(setting, format!("{} is not valid PEM: {e}", pem.describe()))
            })?;
        if certs.is_empty() {
            return Err(Error::invalid(
                setting,
                format!(
                    "{} holds no certificate (a PEM block \"BEGIN CERTIFICATE\")",
                    pem.describe()
                ),
            ));
        }
        Ok(certs)
    }

    /// The rustls configuration of `settings` on the `ring` provider (whatever other crates
    /// installed as the process default), speaking HTTP/2 (ALPN `h2`).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting when a file cannot be read or holds no
    /// usable certificate or key, or when nothing is trusted.
    pub(crate) fn client_config(settings: &TlsSettings) -> Result<TlsConfig, Error> {
        let provider = provider();
        let mut roots = RootCertStore::empty();
        for pem in &settings.ca {
            let setting = pem.ca_setting();
            for (i, cert) in certificates(pem, setting)?.into_iter().enumerate() {
                roots.add(cert).map_err(|e| {
                    Error::invalid(
                        setting,
                        format!(
                            "certificate {} of {} cannot be a trust anchor: {e}",
                            i + 1,
                            pem.describe()
                        ),
                    )
                })?;
            }
        }
        if settings.webpki_roots.unwrap_or(settings.ca.is_empty()) {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if roots.is_empty() {
            return Err(Error::invalid(
                "tls_webpki_roots",
                "nothing to verify the proxy's certificate with: give its CA with \
                 ClientConfig::tls_ca_file or tls_ca_pem, or trust the public roots with \
                 tls_webpki_roots(true)",
            ));
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| {
                    Error::invalid("tls", format!("cannot build the certificate verifier: {e}"))
                })?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid("tls", format!("no TLS version available: {e}")))?;
        let builder = if settings.verify_hostname {
            builder.with_webpki_verifier(verifier)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyHostname(verifier)))
        };
        let mut config = match &settings.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let setting = cert.client_setting();
                let chain = certificates(cert, setting)?;
                let key_bytes = key.read(setting)?;
                let private_key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
                    Error::invalid(
                        setting,
                        format!(
                            "{} holds no usable private key (PEM \"BEGIN PRIVATE KEY\", \"BEGIN \
                             RSA PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\"): {e}",
                            key.describe()
                        ),
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, private_key)
                    .map_err(|e| {
                        Error::invalid(
                            setting,
                            format!(
                                "{} with the key of {}: {e}",
                                cert.describe(),
                                key.describe()
                            ),
                        )
                    })?
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// Verifies the chain like the webpki verifier but accepts a certificate that does not
    /// name the host (`ClientConfig::tls_verify_hostname(false)`).
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

    /// Opens TCP then TLS connections to one proxy endpoint for a tonic channel (whose URI
    /// it ignores: the channel is made for this endpoint).
    #[derive(Debug, Clone)]
    pub(crate) struct Connector {
        host: Arc<str>,
        port: u16,
        /// `host:port`, for errors.
        endpoint: Arc<str>,
        config: TlsConfig,
    }

    impl Connector {
        /// Connections to `host` (a DNS name or an IP address without brackets) at `port`.
        pub(crate) fn new(host: &str, port: u16, endpoint: String, config: TlsConfig) -> Self {
            Self {
                host: host.into(),
                port,
                endpoint: endpoint.into(),
                config,
            }
        }
    }

    /// A TLS stream whose I/O errors caused by TLS (an alert the proxy sends after the
    /// handshake: with TLS 1.3 a refused client certificate shows only then) carry a
    /// [`TlsFailure`] that says what to do.
    #[derive(Debug)]
    pub(crate) struct Guarded {
        stream: TlsStream<TcpStream>,
        host: Arc<str>,
        endpoint: Arc<str>,
    }

    impl Guarded {
        fn explain(&self, error: std::io::Error) -> std::io::Error {
            match error
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>())
            {
                Some(tls) => std::io::Error::new(
                    error.kind(),
                    TlsFailure {
                        endpoint: self.endpoint.to_string(),
                        reason: explain(&self.host, &self.endpoint, tls),
                    },
                ),
                None => error,
            }
        }
    }

    impl AsyncRead for Guarded {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            match Pin::new(&mut this.stream).poll_read(cx, buf) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(this.explain(e))),
                other => other,
            }
        }
    }

    impl AsyncWrite for Guarded {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            match Pin::new(&mut this.stream).poll_write(cx, buf) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(this.explain(e))),
                other => other,
            }
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            match Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(this.explain(e))),
                other => other,
            }
        }

        fn is_write_vectored(&self) -> bool {
            self.stream.is_write_vectored()
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            let this = self.get_mut();
            match Pin::new(&mut this.stream).poll_flush(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(this.explain(e))),
                other => other,
            }
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
        }
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    impl tonic::codegen::Service<Uri> for Connector {
        type Response = TokioIo<Guarded>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _uri: Uri) -> Self::Future {
            let (host, port, endpoint) = (
                Arc::clone(&self.host),
                self.port,
                Arc::clone(&self.endpoint),
            );
            let config = Arc::clone(&self.config);
            Box::pin(async move {
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    Box::new(TlsFailure {
                        endpoint: endpoint.to_string(),
                        reason: format!(
                            "{host:?} is neither a DNS name nor an IP address, so no \
                             certificate can name it: {e}"
                        ),
                    }) as BoxError
                })?;
                let tcp = TcpStream::connect((&*host, port)).await?;
                let _ = tcp.set_nodelay(true);
                let stream = TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|error| handshake_error(&host, &endpoint, error))?;
                Ok(TokioIo::new(Guarded {
                    stream,
                    host,
                    endpoint,
                }))
            })
        }
    }

    /// A handshake error: a [`TlsFailure`] when TLS refused, the I/O error itself otherwise
    /// (a connection reset, which may pass).
    fn handshake_error(host: &str, endpoint: &str, error: std::io::Error) -> BoxError {
        match error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            Some(tls) => Box::new(TlsFailure {
                endpoint: endpoint.to_owned(),
                reason: explain(host, endpoint, tls),
            }),
            None => Box::new(error),
        }
    }

    /// What was wrong and what to do, for a TLS error with the proxy at `endpoint`.
    fn explain(host: &str, endpoint: &str, error: &rustls::Error) -> String {
        use rustls::AlertDescription as Alert;
        match error {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                "the proxy's certificate is not signed by a CA this client trusts ({error}): \
                 give the CA that signed it with ClientConfig::tls_ca_file or tls_ca_pem"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "the proxy's certificate is not valid for {host:?} ({error}): connect with a \
                 host name its subjectAltName lists, or give the proxy a certificate for \
                 {host:?} (ClientConfig::tls_verify_hostname(false) skips this check, which \
                 lets anyone holding a certificate of the same CA pose as the proxy)"
            ),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            ) => format!(
                "the proxy's certificate is outside its validity period ({error}): renew it \
                 (or check this machine's clock)"
            ),
            rustls::Error::InvalidCertificate(_) => {
                format!("the proxy's certificate was rejected: {error}")
            }
            rustls::Error::AlertReceived(
                Alert::CertificateRequired
                | Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateUnknown
                | Alert::AccessDenied,
            ) => format!(
                "the proxy rejected this client's certificate or its absence ({error}): if it \
                 requires client certificates, give one signed by a CA it trusts with \
                 ClientConfig::tls_client_cert_files or tls_client_cert_pem"
            ),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                format!(
                    "the server at {endpoint} does not speak TLS ({error}): is TLS enabled on \
                     the proxy's gRPC port, or should ClientConfig::tls be off?"
                )
            }
            other => format!("{other}"),
        }
    }
}
