//! Connections, request metadata and signing shared by every RPC of one client.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use parking_lot::Mutex;
use sha1::Sha1;
use tokio::sync::watch;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;

use crate::Error;
use crate::link::{Link, LinkState};
use crate::pb;
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::tls::{Pem, TlsConfig, TlsSettings};

/// A proxy address: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `host:port` (an optional `http://` or `https://` prefix is accepted and
    /// dropped; [`ClientConfig::new`] reads it).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the text is not `host:port` with a port in 1..=65535.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let trimmed = text.trim();
        let bare = trimmed
            .strip_prefix("http://")
            .or_else(|| trimmed.strip_prefix("https://"))
            .unwrap_or(trimmed);
        let bad = |reason: &str| {
            Error::invalid(
                "endpoint",
                format!("{text:?} is not host:port ({reason}), e.g. 127.0.0.1:8081"),
            )
        };
        let (host, port) = bare.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number"))?;
        if host.is_empty() || port == 0 {
            return Err(bad("empty host or port 0"));
        }
        Ok(Self {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
        })
    }

    /// The host: a DNS name or an IP address (without the brackets of an IPv6 literal).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The first address of the protocol's `Endpoints`, if any is usable.
    pub(crate) fn from_pb(endpoints: &pb::Endpoints) -> Option<Self> {
        let address = endpoints.addresses.first()?;
        let port = u16::try_from(address.port).ok().filter(|p| *p != 0)?;
        (!address.host.is_empty()).then(|| Self {
            host: address.host.clone(),
            port,
        })
    }

    /// This endpoint as the protocol's `Endpoints`.
    pub(crate) fn to_pb(&self) -> pb::Endpoints {
        let scheme = if self.host.parse::<std::net::Ipv4Addr>().is_ok() {
            pb::AddressScheme::IPv4
        } else if self.host.parse::<std::net::Ipv6Addr>().is_ok() {
            pb::AddressScheme::IPv6
        } else {
            pb::AddressScheme::DomainName
        };
        pb::Endpoints {
            scheme: scheme as i32,
            addresses: vec![pb::Address {
                host: self.host.clone(),
                port: i32::from(self.port),
            }],
        }
    }

    /// The URI of tonic's channel. Always `http`: with TLS, the channel's connector makes
    /// the TLS connection itself (tonic's own TLS cannot skip the hostname check nor explain
    /// a refused certificate).
    fn uri(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// An access key and its secret, for the proxy's HMAC-SHA1 request signing.
#[derive(Clone)]
pub struct Credentials {
    access_key: String,
    secret_key: String,
}

impl Credentials {
    /// An access key and secret key pair.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        Self {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .finish()
    }
}

/// The body size limit the proxy applies by default (4 MiB), the default of the producer's
/// `max_body`.
pub const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;

/// Room in a gRPC message for what comes with a body: one received message carries its
/// system properties (ids, receipt handle, timestamps, hosts) and user properties next to
/// the body. The broker caps the properties of a message at 32 KiB (`Short.MAX_VALUE`
/// characters) and the rest is a few hundred bytes (223 bytes for a 4 MiB body from a 5.3.3
/// proxy); 1 MiB leaves a wide margin and keeps the limit a round number.
pub const MESSAGE_OVERHEAD: usize = 1024 * 1024;

/// The default [`ClientConfig::max_message_size`]: the proxy's default body limit
/// ([`DEFAULT_MAX_BODY`], 4 MiB) plus [`MESSAGE_OVERHEAD`].
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = DEFAULT_MAX_BODY + MESSAGE_OVERHEAD;

/// The proxy's `grpcMaxInboundMessageSize` (130 MiB): the largest request it reads, hence
/// the largest the client encodes (unless `max_message_size` is larger).
pub const PROXY_MAX_INBOUND: usize = 130 * 1024 * 1024;

const MIN_MESSAGE_SIZE: usize = 64 * 1024;
const MAX_MESSAGE_SIZE: usize = 1024 * 1024 * 1024;

/// The longest [`ClientConfig::namespace`]: 64 characters, which leaves a wrapped name
/// (`namespace%name`) room within the broker's 127-character limit.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// How to reach and talk to the proxy.
///
/// # TLS
/// `https://host:port` or [`ClientConfig::tls`]`(true)` connects with TLS (crate feature
/// `tls`), verifying the proxy's certificate against the CA given with
/// [`ClientConfig::tls_ca_file`] or [`ClientConfig::tls_ca_pem`] (or the public roots of
/// `webpki-roots` when none is given) and checking that it names the host.
/// [`ClientConfig::tls_client_cert_files`] presents a client certificate (mutual TLS). The
/// files are read, and every setting checked, when the [`Session`] is built
/// ([`Error::Invalid`] naming the setting). A certificate the client refuses (unknown
/// CA, wrong host, expired) or a client certificate the proxy refuses fails the RPC at once
/// with [`Error::Tls`], which is not retryable and says what to fix.
///
/// ```
/// use rocketmq_grpc::{ClientConfig, Session};
///
/// # fn demo() -> Result<(), rocketmq_grpc::Error> {
/// let config = ClientConfig::new("https://proxy.example:8081")?
///     .tls_ca_file("/etc/rocketmq/ca.pem")
///     .tls_client_cert_files("/etc/rocketmq/client.pem", "/etc/rocketmq/client.key");
/// let session = Session::new(config)?; // reads and checks the PEM files
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The access points, tried in turn: the first until it is unavailable.
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) namespace: String,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) request_timeout: Duration,
    pub(crate) tls: bool,
    pub(crate) tls_settings: TlsSettings,
    pub(crate) max_message_size: usize,
}

impl ClientConfig {
    /// A client of the proxy at `endpoint` (`host:port`; `https://host:port` turns TLS on,
    /// `http://host:port` is plain), with a 3 s request timeout, no namespace, no credentials.
    ///
    /// Several proxies, separated by commas (`https://p1:8081,p2:8081`), are access points
    /// tried in turn: the client uses the first until it is unavailable (connection refused
    /// or lost, [`Error::Unreachable`]), then the next, for the RPCs that go to the access
    /// point (routes, heartbeats, telemetry, assignments); sends and receives go where the
    /// routes say.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// let config = ClientConfig::new("10.0.0.7:8081, 10.0.0.8:8081")?;
    /// assert_eq!(config.endpoints().len(), 2);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Invalid`] if an endpoint is not `host:port`.
    pub fn new(endpoint: &str) -> Result<Self, Error> {
        let endpoints = endpoint
            .split(',')
            .map(Endpoint::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            endpoints,
            namespace: String::new(),
            credentials: None,
            request_timeout: Duration::from_secs(3),
            tls: endpoint.trim().starts_with("https://"),
            tls_settings: TlsSettings::default(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        })
    }

    /// The namespace of every topic and group (default none): up to [`MAX_NAMESPACE_LEN`]
    /// letters, digits, `-` and `_`. Names are sent as the broker stores them,
    /// `namespace%name` (`%RETRY%namespace%group` for a retry topic), in every resource,
    /// with the namespace also in `resource_namespace` and the `x-mq-namespace` header as the
    /// Java client sends it; received messages name their topic without it. The
    /// open-source proxy (5.3.3) reads neither of the latter two, only the wrapped name.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// // Topic "orders" is the broker's topic "tenant-a%orders".
    /// let config = ClientConfig::new("127.0.0.1:8081")?.namespace("tenant-a");
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Signs every request with these credentials.
    #[must_use]
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The deadline of every RPC except long polling (default 3 s).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Connects with TLS (needs the crate feature `tls`; `https://` in the endpoint turns it
    /// on too). See [TLS](ClientConfig#tls).
    #[must_use]
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trusts the CA certificates in a PEM file (one or more `BEGIN CERTIFICATE` blocks) to
    /// sign the proxy's certificate; may be called more than once. The file is read when the
    /// [`Session`] is built. Giving a CA turns off the public roots unless
    /// [`ClientConfig::tls_webpki_roots`] turns them on again.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// let config = ClientConfig::new("https://127.0.0.1:8081")?.tls_ca_file("ca.pem");
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_settings.ca.push(Pem::File(path.into()));
        self
    }

    /// As [`ClientConfig::tls_ca_file`], with the PEM text itself.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// # fn demo(ca_pem: String) -> Result<(), rocketmq_grpc::Error> {
    /// let config = ClientConfig::new("127.0.0.1:8081")?.tls(true).tls_ca_pem(ca_pem);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn tls_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.tls_settings.ca.push(Pem::Bytes(pem.as_ref().into()));
        self
    }

    /// Whether to trust the public roots of the Mozilla CA program (`webpki-roots`) as well.
    /// Default: only when no CA is given.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// // A private CA, and public CAs as well (a proxy behind a public load balancer).
    /// let config = ClientConfig::new("https://mq.example:443")?
    ///     .tls_ca_file("private-ca.pem")
    ///     .tls_webpki_roots(true);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn tls_webpki_roots(mut self, trust: bool) -> Self {
        self.tls_settings.webpki_roots = Some(trust);
        self
    }

    /// Presents a client certificate (mutual TLS): a PEM file with the certificate chain
    /// (leaf first) and a PEM file with its private key (PKCS#8, PKCS#1 or SEC1).
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// let config = ClientConfig::new("https://127.0.0.1:8081")?
    ///     .tls_ca_file("ca.pem")
    ///     .tls_client_cert_files("client.pem", "client.key");
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn tls_client_cert_files(
        mut self,
        cert_chain: impl Into<PathBuf>,
        private_key: impl Into<PathBuf>,
    ) -> Self {
        self.tls_settings.client_cert =
            Some((Pem::File(cert_chain.into()), Pem::File(private_key.into())));
        self
    }

    /// As [`ClientConfig::tls_client_cert_files`], with the PEM texts themselves.
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// # fn demo(ca: &str, cert: &str, key: &str) -> Result<(), rocketmq_grpc::Error> {
    /// let config = ClientConfig::new("https://127.0.0.1:8081")?
    ///     .tls_ca_pem(ca)
    ///     .tls_client_cert_pem(cert, key);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn tls_client_cert_pem(
        mut self,
        cert_chain: impl AsRef<[u8]>,
        private_key: impl AsRef<[u8]>,
    ) -> Self {
        self.tls_settings.client_cert = Some((
            Pem::Bytes(cert_chain.as_ref().into()),
            Pem::Bytes(private_key.as_ref().into()),
        ));
        self
    }

    /// Whether the proxy's certificate must name the host connected to (default `true`).
    ///
    /// `false` still verifies that a trusted CA signed the certificate and that it is valid
    /// now, but accepts it for any host: anyone holding a certificate from the same CA can
    /// then pose as the proxy. Use it only when the proxy's certificate cannot name the
    /// address clients use (the self-signed `CN=localhost` certificate of a proxy in TLS test
    /// mode names no host at all).
    ///
    /// ```
    /// use rocketmq_grpc::ClientConfig;
    ///
    /// let config = ClientConfig::new("https://10.0.0.7:8081")?
    ///     .tls_ca_file("proxy-ca.pem")
    ///     .tls_verify_hostname(false);
    /// # Ok::<(), rocketmq_grpc::Error>(())
    /// ```
    #[must_use]
    pub fn tls_verify_hostname(mut self, verify: bool) -> Self {
        self.tls_settings.verify_hostname = verify;
        self
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The largest gRPC message the client decodes (default [`DEFAULT_MAX_MESSAGE_SIZE`],
    /// 5 MiB; 64 KiB to 1 GiB). Every message the proxy delivers must fit: a receive whose
    /// frame is larger fails as a whole (its other messages stay invisible until their
    /// invisibility ends), and again on every redelivery. Set it to the proxy's
    /// `maxMessageSize` plus [`MESSAGE_OVERHEAD`] when that was raised. Requests are encoded
    /// up to the larger of this and the proxy's inbound limit, [`PROXY_MAX_INBOUND`].
    #[must_use]
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// The proxy's address (the first access point when several are given).
    pub fn endpoint(&self) -> &Endpoint {
        // `new` parsed at least one (an empty text is not `host:port`).
        &self.endpoints[0]
    }

    /// Every access point, in the order they are tried.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    fn validate(&self) -> Result<(), Error> {
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(3600) {
            return Err(Error::invalid(
                "request_timeout",
                format!("{:?} is not between 1 ns and 1 h", self.request_timeout),
            ));
        }
        if !(MIN_MESSAGE_SIZE..=MAX_MESSAGE_SIZE).contains(&self.max_message_size) {
            return Err(Error::invalid(
                "max_message_size",
                format!(
                    "{} bytes is not between 64 KiB and 1 GiB; messages of the default 4 MiB \
                     body limit need {DEFAULT_MAX_MESSAGE_SIZE}",
                    self.max_message_size
                ),
            ));
        }
        validate_namespace(&self.namespace)?;
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "tls",
                "TLS needs the crate feature `tls` of rocketmq-grpc",
            ));
        }
        if !self.tls && self.tls_settings.is_customised() {
            return Err(Error::invalid(
                "tls",
                format!(
                    "TLS options are set but TLS is off: connect to https://{} or call \
                     ClientConfig::tls(true)",
                    self.endpoint()
                ),
            ));
        }
        Ok(())
    }

    /// The TLS configuration, built (files read) once per session.
    fn tls_config(&self) -> Result<Option<TlsConfig>, Error> {
        if !self.tls {
            return Ok(None);
        }
        #[cfg(feature = "tls")]
        {
            crate::tls::client_config(&self.tls_settings).map(Some)
        }
        #[cfg(not(feature = "tls"))]
        {
            Ok(Some(TlsConfig))
        }
    }
}

/// Whether `error` says the proxy is not there (connection refused or lost).
pub(crate) fn is_unavailable(error: &Error) -> bool {
    match error {
        Error::Unreachable { .. } => true,
        Error::Rpc { source, .. } => source.is_unavailable(),
        _ => false,
    }
}

/// Checks a namespace: empty (none) or up to [`MAX_NAMESPACE_LEN`] ASCII letters, digits,
/// `-` and `_` (the broker's name characters without its separators `%` and `|`).
fn validate_namespace(namespace: &str) -> Result<(), Error> {
    if namespace.len() > MAX_NAMESPACE_LEN {
        return Err(Error::invalid(
            "namespace",
            format!(
                "{namespace:?} is {} characters long, more than {MAX_NAMESPACE_LEN}",
                namespace.len()
            ),
        ));
    }
    if let Some(bad) = namespace
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(Error::invalid(
            "namespace",
            format!(
                "{namespace:?} contains {bad:?}: a namespace is made of ASCII letters, digits, \
                 '-' and '_' ('%' separates it from the name on the broker)"
            ),
        ));
    }
    Ok(())
}

/// The name the broker stores for `name` in `namespace`: `namespace%name`, with the retry
/// and dead-letter prefixes kept in front (`%RETRY%namespace%group`); unchanged without a
/// namespace or when it already carries this one.
pub(crate) fn wrap_namespace(namespace: &str, name: &str) -> String {
    if namespace.is_empty() || name.is_empty() {
        return name.to_owned();
    }
    let (prefix, bare) = ["%RETRY%", "%DLQ%"]
        .iter()
        .find_map(|p| name.strip_prefix(p).map(|rest| (*p, rest)))
        .unwrap_or(("", name));
    match bare.strip_prefix(namespace) {
        Some(rest) if rest.starts_with('%') => name.to_owned(),
        _ => format!("{prefix}{namespace}%{bare}"),
    }
}

/// One client's connections and identity: every RPC it makes carries the same client id, which
/// the proxy uses to tie acks to the receiving client.
#[derive(Debug)]
pub struct Session {
    config: ClientConfig,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Option<TlsConfig>,
    client_id: String,
    channels: Mutex<HashMap<Endpoint, Channel>>,
    requests: AtomicU64,
    /// The index in `config.endpoints` of the access point in use.
    access: AtomicUsize,
    /// The state of the channel to the proxy, shared by every client of the session.
    link: Link,
}

static CLIENT_INDEX: AtomicU64 = AtomicU64::new(0);

impl Session {
    /// Opens a session. Connections are made lazily, on the first RPC to each endpoint.
    ///
    /// # Errors
    /// [`Error::Invalid`] for settings out of range, a namespace with other characters
    /// than letters, digits, `-` and `_`, and TLS files that cannot be read or hold no usable
    /// certificate or key (naming the setting).
    pub fn new(config: ClientConfig) -> Result<Arc<Self>, Error> {
        config.validate()?;
        let tls = config.tls_config()?;
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let client_id = format!(
            "{host}@{}@{}@{}",
            std::process::id(),
            CLIENT_INDEX.fetch_add(1, Ordering::Relaxed),
            radix36(nanos)
        );
        Ok(Arc::new(Self {
            config,
            tls,
            client_id,
            channels: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            access: AtomicUsize::new(0),
            link: Link::new(),
        }))
    }

    /// The id sent as `x-mq-client-id` on every RPC.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The link state of the session's channel to the proxy (see [`LinkState`]), shared by
    /// every producer and consumer of the session; [`LinkState::Closed`] once each of them is
    /// closed.
    pub fn state(&self) -> watch::Receiver<LinkState> {
        self.link.subscribe()
    }

    /// The link state's source.
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// The access point in use: the first of [`ClientConfig::endpoints`] until it fails.
    pub(crate) fn access_point(&self) -> Endpoint {
        let endpoints = &self.config.endpoints;
        endpoints[self.access.load(Ordering::Relaxed) % endpoints.len()].clone()
    }

    /// Every access point as the protocol's `Endpoints` (the settings' `access_point`).
    pub(crate) fn access_points_pb(&self) -> pb::Endpoints {
        let mut all = self.config.endpoint().to_pb();
        all.addresses = self
            .config
            .endpoints
            .iter()
            .flat_map(|e| e.to_pb().addresses)
            .collect();
        all
    }

    /// `error` of an RPC to the access point `endpoint`, passed on; when it says the proxy
    /// is unavailable (connection refused or lost), the next access point is used from now
    /// on (unless another caller moved on already).
    pub(crate) fn access_failed(&self, endpoint: &Endpoint, error: Error) -> Error {
        let endpoints = &self.config.endpoints;
        if is_unavailable(&error) && endpoints.len() > 1 {
            let current = self.access.load(Ordering::Relaxed);
            if endpoints[current % endpoints.len()] == *endpoint {
                let next = (current + 1) % endpoints.len();
                if self
                    .access
                    .compare_exchange(current, next, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    tracing::warn!(
                        failed = %endpoint,
                        next = %endpoints[next],
                        %error,
                        "the proxy is unavailable; using the next access point"
                    );
                }
            }
        }
        error
    }

    /// A resource (topic or group) in the session's namespace: the name as the broker
    /// stores it (`namespace%name`), with the namespace in `resource_namespace` as well.
    pub(crate) fn resource(&self, name: &str) -> pb::Resource {
        pb::Resource {
            resource_namespace: self.config.namespace.clone(),
            name: wrap_namespace(&self.config.namespace, name),
        }
    }

    /// `queue` (from a route or an assignment, whose topic the proxy names without the
    /// namespace) with its topic named as the broker stores it.
    pub(crate) fn queue(&self, mut queue: pb::MessageQueue) -> pb::MessageQueue {
        if let Some(topic) = queue.topic.as_mut()
            && !self.config.namespace.is_empty()
        {
            topic.name = wrap_namespace(&self.config.namespace, &topic.name);
            topic.resource_namespace = self.config.namespace.clone();
        }
        queue
    }

    /// A client for `endpoint`, sharing one HTTP/2 connection per endpoint.
    ///
    /// # Errors
    /// [`Error::Unreachable`] if the endpoint cannot form a URI.
    pub(crate) fn client(
        &self,
        endpoint: &Endpoint,
    ) -> Result<MessagingServiceClient<Channel>, Error> {
        let mut channels = self.channels.lock();
        if let Some(channel) = channels.get(endpoint) {
            return Ok(self.limits(MessagingServiceClient::new(channel.clone())));
        }
        let unreachable = |reason: String| Error::Unreachable {
            endpoint: endpoint.to_string(),
            reason,
        };
        let builder = tonic::transport::Endpoint::from_shared(endpoint.uri())
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(self.config.request_timeout)
            .tcp_nodelay(true)
            .keep_alive_while_idle(true);
        #[cfg(feature = "tls")]
        let channel = match &self.tls {
            Some(config) => builder.connect_with_connector_lazy(crate::tls::Connector::new(
                endpoint.host(),
                endpoint.port(),
                endpoint.to_string(),
                Arc::clone(config),
            )),
            None => builder.connect_lazy(),
        };
        #[cfg(not(feature = "tls"))]
        let channel = builder.connect_lazy();
        channels.insert(endpoint.clone(), channel.clone());
        Ok(self.limits(MessagingServiceClient::new(channel)))
    }

    /// Applies the message size limits to a client (tonic's defaults would refuse to decode
    /// more than 4 MiB, less than a message with a 4 MiB body).
    fn limits(&self, client: MessagingServiceClient<Channel>) -> MessagingServiceClient<Channel> {
        let max = self.config.max_message_size;
        client
            .max_decoding_message_size(max)
            .max_encoding_message_size(max.max(PROXY_MAX_INBOUND))
    }

    /// One `Heartbeat` to the access point, as `client_type` (of `group`, for consumers).
    ///
    /// # Errors
    /// [`Error::Rpc`] on transport failures; [`Error::Server`] when the proxy refuses it.
    pub(crate) async fn heartbeat(
        &self,
        group: Option<&str>,
        client_type: pb::ClientType,
    ) -> Result<(), Error> {
        let access = self.access_point();
        let mut client = self.client(&access)?;
        let request = pb::HeartbeatRequest {
            group: group.map(|g| self.resource(g)),
            client_type: client_type as i32,
        };
        let response = client
            .heartbeat(self.request(request, self.config.request_timeout))
            .await
            .map_err(|status| self.access_failed(&access, Error::rpc("Heartbeat", status)));
        self.link.observe(&response);
        Error::check("Heartbeat", response?.into_inner().status.as_ref())
    }

    /// Wraps `message` with the proxy's headers, the signature and a deadline of `timeout`.
    pub(crate) fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        self.stamp(request.metadata_mut());
        request
    }

    /// Adds the proxy's headers and the signature to `metadata`.
    pub(crate) fn stamp(&self, metadata: &mut MetadataMap) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let date_time = format_date_time(now);
        let request_id = format!(
            "{}-{}",
            self.client_id,
            self.requests.fetch_add(1, Ordering::Relaxed)
        );
        let mut put = |key: &'static str, value: &str| {
            if let Ok(value) = AsciiMetadataValue::try_from(value) {
                metadata.insert(key, value);
            }
        };
        put("x-mq-client-id", &self.client_id);
        put("x-mq-language", "RUST");
        put("x-mq-client-version", env!("CARGO_PKG_VERSION"));
        put("x-mq-protocol", "v2");
        put("x-mq-request-id", &request_id);
        put("x-mq-date-time", &date_time);
        if !self.config.namespace.is_empty() {
            put("x-mq-namespace", &self.config.namespace);
        }
        if let Some(credentials) = &self.config.credentials {
            put("authorization", &authorization(credentials, &date_time));
        }
    }
}

/// The `authorization` header: HMAC-SHA1 of the raw `x-mq-date-time` value, hex encoded.
pub(crate) fn authorization(credentials: &Credentials, date_time: &str) -> String {
    format!(
        "MQv2-HMAC-SHA1 Credential={}, SignedHeaders=x-mq-date-time, Signature={}",
        credentials.access_key,
        sign(&credentials.secret_key, date_time)
    )
}

/// Hex HMAC-SHA1 of `content` keyed with `secret`.
pub(crate) fn sign(secret: &str, content: &str) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha1>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(content.as_bytes());
    hex::encode_upper(mac.finalize().into_bytes())
}

/// `yyyyMMddTHHmmssZ` in UTC, as the Java client formats `x-mq-date-time`.
fn format_date_time(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let secs = unix_seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn radix36(mut n: u128) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_time_is_utc_in_the_java_format() {
        assert_eq!(format_date_time(0), "19700101T000000Z");
        assert_eq!(format_date_time(1_709_251_199), "20240229T235959Z");
        assert_eq!(format_date_time(1_798_761_600), "20270101T000000Z");
    }

    #[test]
    fn signature_is_hmac_sha1_of_the_date_time() {
        // RFC 2202 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            sign("Jefe", "what do ya want for nothing?"),
            "EFFCDF6AE5EB2FA2D27416D5F184DF9C259A7C79"
        );
        let header = authorization(&Credentials::new("ak", "sk"), "20240101T000000Z");
        assert!(
            header.starts_with(
                "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature="
            )
        );
    }

    #[test]
    fn endpoints_parse_or_say_why_not() {
        assert_eq!(
            Endpoint::parse("127.0.0.1:8081").unwrap().to_string(),
            "127.0.0.1:8081"
        );
        assert_eq!(Endpoint::parse("http://localhost:1").unwrap().port, 1);
        for bad in ["", "localhost", "host:0", "host:x", ":80"] {
            let error = Endpoint::parse(bad).unwrap_err();
            assert!(error.to_string().contains("host:port"), "{error}");
        }
    }

    #[test]
    fn the_message_size_limit_fits_the_proxys_largest_message_and_is_validated() {
        let config = ClientConfig::new("127.0.0.1:1").unwrap();
        assert_eq!(config.max_message_size, 5 * 1024 * 1024);
        assert!(config.max_message_size > DEFAULT_MAX_BODY + 4096);
        for bad in [0, 1024, usize::MAX] {
            let error = Session::new(config.clone().max_message_size(bad)).unwrap_err();
            assert!(error.to_string().contains("max_message_size"), "{error}");
        }
        assert!(Session::new(config.max_message_size(17 * 1024 * 1024)).is_ok());
    }

    #[test]
    fn names_are_wrapped_in_the_namespace_as_the_broker_stores_them() {
        assert_eq!(wrap_namespace("", "orders"), "orders");
        assert_eq!(wrap_namespace("ns", "orders"), "ns%orders");
        assert_eq!(wrap_namespace("ns", "ns%orders"), "ns%orders");
        assert_eq!(wrap_namespace("ns", "nsx%orders"), "ns%nsx%orders");
        assert_eq!(wrap_namespace("ns", "%RETRY%group"), "%RETRY%ns%group");
        assert_eq!(wrap_namespace("ns", "%DLQ%ns%group"), "%DLQ%ns%group");
        let session =
            Session::new(ClientConfig::new("127.0.0.1:1").unwrap().namespace("rbns")).unwrap();
        let resource = session.resource("nst");
        assert_eq!(resource.name, "rbns%nst");
        assert_eq!(resource.resource_namespace, "rbns");
        let queue = session.queue(pb::MessageQueue {
            topic: Some(pb::Resource {
                resource_namespace: "rbns".into(),
                name: "nst".into(),
            }),
            ..pb::MessageQueue::default()
        });
        assert_eq!(queue.topic.unwrap().name, "rbns%nst");
    }

    #[test]
    fn bad_namespaces_are_refused_naming_the_setting() {
        let config = ClientConfig::new("127.0.0.1:1").unwrap();
        for bad in ["a%b", "a|b", "with space", "ünï", &"x".repeat(65)] {
            let error = Session::new(config.clone().namespace(bad)).unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::Invalid {
                        what: "namespace",
                        ..
                    }
                ),
                "{error}"
            );
        }
        for good in ["", "rbns", "tenant-a_1", &"x".repeat(64)] {
            assert!(
                Session::new(config.clone().namespace(good)).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn tls_options_need_tls_and_https_turns_it_on() {
        let error = Session::new(
            ClientConfig::new("127.0.0.1:1")
                .unwrap()
                .tls_verify_hostname(false),
        )
        .unwrap_err();
        assert!(error.to_string().contains("TLS is off"), "{error}");
        assert!(ClientConfig::new("https://127.0.0.1:1").unwrap().is_tls());
        assert!(!ClientConfig::new("http://127.0.0.1:1").unwrap().is_tls());
        assert_eq!(
            ClientConfig::new("https://[::1]:8081")
                .unwrap()
                .endpoint()
                .host(),
            "::1"
        );
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_is_refused() {
        let error = Session::new(ClientConfig::new("https://127.0.0.1:1").unwrap()).unwrap_err();
        assert!(error.to_string().contains("feature `tls`"), "{error}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn unusable_tls_files_are_refused_naming_the_setting() {
        let https = || ClientConfig::new("https://127.0.0.1:1").unwrap();
        let setting = |config: ClientConfig| match Session::new(config) {
            Err(Error::Invalid { what, reason }) => (what, reason),
            other => panic!("not refused: {other:?}"),
        };
        let (name, reason) = setting(https().tls_ca_file("/nonexistent/ca.pem"));
        assert_eq!(name, "tls_ca_file");
        assert!(reason.contains("/nonexistent/ca.pem"), "{reason}");
        let (name, reason) = setting(https().tls_ca_pem("not PEM at all"));
        assert_eq!(name, "tls_ca_pem");
        assert!(reason.contains("no certificate"), "{reason}");
        let (name, _) = setting(https().tls_webpki_roots(false));
        assert_eq!(name, "tls_webpki_roots");
        // A key where the certificate should be: no certificate.
        let key =
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIGZ2\n-----END PRIVATE KEY-----\n";
        let (name, reason) = setting(https().tls_client_cert_pem(key, key));
        assert_eq!(name, "tls_client_cert_pem");
        assert!(reason.contains("no certificate"), "{reason}");
        let (name, _) =
            setting(https().tls_client_cert_files("/nonexistent/c.pem", "/nonexistent/k.pem"));
        assert_eq!(name, "tls_client_cert_files");
        // The public roots alone are a valid configuration.
        assert!(Session::new(https()).is_ok());
    }

    #[tokio::test]
    async fn every_request_carries_the_proxy_headers() {
        let config = ClientConfig::new("127.0.0.1:1")
            .unwrap()
            .namespace("ns")
            .credentials(Credentials::new("ak", "sk"));
        let session = Session::new(config).unwrap();
        let request = session.request((), Duration::from_secs(1));
        let md = request.metadata();
        let get = |k| {
            md.get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(get("x-mq-client-id"), session.client_id());
        assert_eq!(get("x-mq-language"), "RUST");
        assert_eq!(get("x-mq-protocol"), "v2");
        assert_eq!(get("x-mq-namespace"), "ns");
        let date = get("x-mq-date-time");
        assert_eq!(date.len(), 16);
        assert!(get("authorization").ends_with(&sign("sk", &date)));
        // A known HMAC-SHA1 value (key "key"), as the proxy computes it.
        assert_eq!(
            sign("key", "The quick brown fox jumps over the lazy dog"),
            "DE7C9B85B8B78AA6BC8A7A36F70A90701C9DB4D9"
        );
        let second = session.request((), Duration::from_secs(1));
        assert_ne!(
            second.metadata().get("x-mq-request-id"),
            md.get("x-mq-request-id"),
            "request ids are unique"
        );
    }
}
