//! Connections, request metadata and signing shared by every RPC of one client.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha1::Sha1;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;

use crate::Error;
use crate::pb;
use crate::pb::messaging_service_client::MessagingServiceClient;

/// A proxy address: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `host:port` (an optional `http://` prefix is accepted).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the text is not `host:port` with a port in 1..=65535.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bare = text.trim().trim_start_matches("http://");
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

    fn uri(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
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

/// How to reach and talk to the proxy.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) endpoint: Endpoint,
    pub(crate) namespace: String,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) request_timeout: Duration,
    pub(crate) tls: bool,
    pub(crate) max_message_size: usize,
}

impl ClientConfig {
    /// A client of the proxy at `endpoint` (`host:port`), with a 3 s request timeout, no
    /// namespace, no credentials and no TLS.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `endpoint` is not `host:port`.
    pub fn new(endpoint: &str) -> Result<Self, Error> {
        Ok(Self {
            endpoint: Endpoint::parse(endpoint)?,
            namespace: String::new(),
            credentials: None,
            request_timeout: Duration::from_secs(3),
            tls: false,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        })
    }

    /// The namespace sent in `x-mq-namespace` and in every resource.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Signs every request with these credentials.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The deadline of every RPC except long polling (default 3 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Connects with TLS (needs the crate feature `tls`).
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// The largest gRPC message the client decodes (default [`DEFAULT_MAX_MESSAGE_SIZE`],
    /// 5 MiB; 64 KiB to 1 GiB). Every message the proxy delivers must fit: a receive whose
    /// frame is larger fails as a whole (its other messages stay invisible until their
    /// invisibility ends), and again on every redelivery. Set it to the proxy's
    /// `maxMessageSize` plus [`MESSAGE_OVERHEAD`] when that was raised. Requests are encoded
    /// up to the larger of this and the proxy's inbound limit, [`PROXY_MAX_INBOUND`].
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// The proxy's address.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
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
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid(
                "tls",
                "TLS needs the crate feature `tls` of rocketmq-grpc",
            ));
        }
        Ok(())
    }
}

/// One client's connections and identity: every RPC it makes carries the same client id, which
/// the proxy uses to tie acks to the receiving client.
#[derive(Debug)]
pub struct Session {
    config: ClientConfig,
    client_id: String,
    channels: Mutex<HashMap<Endpoint, Channel>>,
    requests: AtomicU64,
}

static CLIENT_INDEX: AtomicU64 = AtomicU64::new(0);

impl Session {
    /// Opens a session. Connections are made lazily, on the first RPC to each endpoint.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for settings out of range.
    pub fn new(config: ClientConfig) -> Result<Arc<Self>, Error> {
        config.validate()?;
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
            client_id,
            channels: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
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

    /// A resource (topic or group) in the session's namespace.
    pub(crate) fn resource(&self, name: &str) -> pb::Resource {
        pb::Resource {
            resource_namespace: self.config.namespace.clone(),
            name: name.to_owned(),
        }
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
        let mut builder = tonic::transport::Endpoint::from_shared(endpoint.uri(self.config.tls))
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(self.config.request_timeout)
            .tcp_nodelay(true);
        #[cfg(feature = "tls")]
        if self.config.tls {
            builder = builder
                .tls_config(tonic::transport::ClientTlsConfig::new().with_webpki_roots())
                .map_err(|e| unreachable(e.to_string()))?;
        }
        builder = builder.keep_alive_while_idle(true);
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
        let access = self.config.endpoint.clone();
        let mut client = self.client(&access)?;
        let request = pb::HeartbeatRequest {
            group: group.map(|g| self.resource(g)),
            client_type: client_type as i32,
        };
        let response = client
            .heartbeat(self.request(request, self.config.request_timeout))
            .await
            .map_err(|status| Error::rpc("Heartbeat", status))?
            .into_inner();
        Error::check("Heartbeat", response.status.as_ref())
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
        let second = session.request((), Duration::from_secs(1));
        assert_ne!(
            second.metadata().get("x-mq-request-id"),
            md.get("x-mq-request-id"),
            "request ids are unique"
        );
    }
}
