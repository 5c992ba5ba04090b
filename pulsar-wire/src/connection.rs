//! [`Connection`]: one connection to a broker (TCP, or TLS for `pulsar+ssl://`), with
//! `CONNECT` and token authentication (answering the broker's `AUTH_CHALLENGE`), request-id
//! correlation, keep-alive, and routing of pushed frames to producers and consumers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::auth::{StaticToken, TOKEN_AUTH_METHOD, TokenFile, TokenProvider, fetch_token};
use crate::codec::{Frame, OutgoingFrame, PulsarCodec};
use crate::frame_writer::FrameWriter;
use crate::pb::base_command::Type;
use crate::pb::command_lookup_topic_response::LookupType;
use crate::pb::{self, BaseCommand, ServerError};
use crate::tls::{Pem, TlsSettings};

/// The protocol version this client speaks (v19: transaction coordinator connect).
pub const PROTOCOL_VERSION: i32 = 19;

/// The `client_version` of `CONNECT` and `AUTH_RESPONSE`.
const CLIENT_VERSION: &str = concat!("pulsar-wire-rust/", env!("CARGO_PKG_VERSION"));

/// The most `AUTH_CHALLENGE`s answered before `CONNECTED` (token authentication needs none;
/// a broker that keeps asking is not making progress).
const MAX_HANDSHAKE_CHALLENGES: usize = 8;

/// The shortest [`ConnectOptions::operation_timeout`].
pub const MIN_OPERATION_TIMEOUT: Duration = Duration::from_millis(1);
/// The shortest [`ConnectOptions::keep_alive`].
pub const MIN_KEEP_ALIVE: Duration = Duration::from_secs(1);
/// The smallest [`ConnectOptions::max_frame_size`]: 64 KiB.
pub const MIN_FRAME_SIZE: usize = 64 << 10;
/// The largest [`ConnectOptions::max_frame_size`]: 2 GiB (the frame's size field is 32 bits).
pub const MAX_FRAME_SIZE: usize = 2 << 30;

/// How to connect.
///
/// `pulsar://host:port` connects over TCP, `pulsar+ssl://host:port` over TLS (crate feature
/// `tls`, on by default), verifying the broker's certificate against the CA given with
/// [`ConnectOptions::tls_ca_file`] or [`ConnectOptions::tls_ca_pem`] (or the public roots
/// when none is given) and checking that it names the host. A token
/// ([`ConnectOptions::auth_token`], [`ConnectOptions::auth_token_file`],
/// [`ConnectOptions::auth_token_provider`]) authenticates every connection.
///
/// ```
/// use pulsar_wire::ConnectOptions;
///
/// let options = ConnectOptions::new("pulsar+ssl://broker.example:6651")?
///     .tls_ca_file("/etc/pulsar/ca.pem")
///     .auth_token_file("/var/run/secrets/pulsar/token");
/// assert!(options.is_tls());
/// # Ok::<(), pulsar_wire::Error>(())
/// ```
#[derive(Clone)]
pub struct ConnectOptions {
    pub(crate) address: String,
    /// The other hosts of a multi-host service URL.
    pub(crate) other_hosts: Vec<String>,
    pub(crate) tls: bool,
    pub(crate) tls_settings: TlsSettings,
    pub(crate) auth: Option<Arc<dyn TokenProvider>>,
    pub(crate) operation_timeout: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) max_frame_size: usize,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ConnectOptions")
            .field("address", &self.address)
            .field("other_hosts", &self.other_hosts)
            .field("tls", &self.tls)
            .field("tls_settings", &self.tls_settings)
            .field("auth", &self.auth.as_ref().map(|_| "token"))
            .field("operation_timeout", &self.operation_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("max_frame_size", &self.max_frame_size)
            .finish()
    }
}

impl ConnectOptions {
    /// A broker at `service_url` (`pulsar://host:port`, `pulsar+ssl://host:port` or bare
    /// `host:port`), with a 30 s operation timeout and a 30 s keep-alive. Several hosts,
    /// separated by commas (`pulsar://h1:6650,h2:6650`), are tried in turn for the service
    /// connection (lookups and metadata) until one answers; the one that did is tried first
    /// next time.
    ///
    /// # Errors
    /// [`Error::Invalid`] when the URL is not `pulsar://host:port` or
    /// `pulsar+ssl://host:port`, or is `pulsar+ssl://` without the crate feature `tls`.
    pub fn new(service_url: &str) -> Result<Self, Error> {
        let url = parse_service_url(service_url)?;
        Ok(Self {
            address: url.address,
            other_hosts: url.others,
            tls: url.tls,
            tls_settings: TlsSettings::default(),
            auth: None,
            operation_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(30),
            max_frame_size: crate::codec::DEFAULT_MAX_FRAME_SIZE,
        })
    }

    /// Authenticates with a fixed token (`auth_method_name = "token"`, the token as
    /// `auth_data`), also sent again when the broker asks for fresh credentials.
    #[must_use]
    pub fn auth_token(self, token: impl Into<String>) -> Self {
        self.auth_token_provider(StaticToken(token.into()))
    }

    /// Authenticates with the token in a file (surrounding whitespace removed), read again
    /// for every new connection and every `AUTH_CHALLENGE`, so a rotated token is used as
    /// soon as it is written. A file that cannot be read fails the connection with
    /// [`Error::Invalid`] naming it.
    #[must_use]
    pub fn auth_token_file(self, path: impl Into<PathBuf>) -> Self {
        self.auth_token_provider(TokenFile(path.into()))
    }

    /// Authenticates with tokens from `provider`, asked for one at every new connection and
    /// at every `AUTH_CHALLENGE` (see [`TokenProvider`]).
    #[must_use]
    pub fn auth_token_provider(mut self, provider: impl TokenProvider + 'static) -> Self {
        self.auth = Some(Arc::new(provider));
        self
    }

    /// Trusts the CA certificates in a PEM file (one or more `BEGIN CERTIFICATE` blocks) to
    /// sign the broker's certificate; may be called more than once. The file is read at each
    /// new connection. Giving a CA turns off the public roots unless
    /// [`ConnectOptions::tls_webpki_roots`] turns them on again.
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_settings.ca.push(Pem::File(path.into()));
        self
    }

    /// As [`ConnectOptions::tls_ca_file`], with the PEM text itself.
    #[must_use]
    pub fn tls_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.tls_settings.ca.push(Pem::Bytes(pem.as_ref().into()));
        self
    }

    /// Whether to trust the public roots of the Mozilla CA program (`webpki-roots`) as well.
    /// Default: only when no CA is given.
    #[must_use]
    pub fn tls_webpki_roots(mut self, trust: bool) -> Self {
        self.tls_settings.webpki_roots = Some(trust);
        self
    }

    /// Presents a client certificate (mutual TLS): a PEM file with the certificate chain
    /// (leaf first) and a PEM file with its private key (PKCS#8, PKCS#1 or SEC1).
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

    /// As [`ConnectOptions::tls_client_cert_files`], with the PEM texts themselves.
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

    /// Whether the broker's certificate must name the host connected to (default `true`).
    ///
    /// `false` still verifies that a trusted CA signed the certificate and that it is
    /// valid now, but accepts it for any host: anyone holding a certificate from the same
    /// CA can then pose as the broker. Use it only when the brokers' certificates cannot
    /// name the addresses clients use.
    #[must_use]
    pub fn tls_verify_hostname(mut self, verify: bool) -> Self {
        self.tls_settings.verify_hostname = verify;
        self
    }

    /// The deadline of every request (default 30 s).
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How often an idle connection is probed with `PING` (default 30 s, at least 1 s); a
    /// connection that hears nothing for twice as long is considered lost.
    #[must_use]
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// The largest frame accepted (default 5 MiB + 10 KiB; [`MIN_FRAME_SIZE`] to
    /// [`MAX_FRAME_SIZE`]).
    #[must_use]
    pub fn max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = bytes;
        self
    }

    /// Checks every option against its valid range, so that a bad one fails here and not
    /// at the first request ([`crate::ClientBuilder::build`] and [`Connection::connect`] call it).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the option and its valid range.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |what: &'static str, reason: String| Err(Error::Invalid { what, reason });
        if self.operation_timeout < MIN_OPERATION_TIMEOUT {
            return invalid(
                "operation_timeout",
                format!(
                    "{:?} is too short: every request would time out; give at least \
                     {MIN_OPERATION_TIMEOUT:?} (30 s by default)",
                    self.operation_timeout
                ),
            );
        }
        if self.keep_alive < MIN_KEEP_ALIVE {
            return invalid(
                "keep_alive",
                format!(
                    "{:?} is too short: give at least {MIN_KEEP_ALIVE:?} (30 s by default)",
                    self.keep_alive
                ),
            );
        }
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.max_frame_size) {
            return invalid(
                "max_frame_size",
                format!(
                    "{} bytes is outside {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} (the default is \
                     {}, the broker's 5 MiB max_message_size plus headers)",
                    self.max_frame_size,
                    crate::codec::DEFAULT_MAX_FRAME_SIZE
                ),
            );
        }
        Ok(())
    }

    /// The `host:port` connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether connections use TLS (a `pulsar+ssl://` service URL).
    pub fn is_tls(&self) -> bool {
        self.tls
    }
}

/// A parsed service URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceUrl {
    /// `host:port` (the first, for a URL naming several).
    pub(crate) address: String,
    /// The other hosts of a multi-host URL (`pulsar://h1:6650,h2:6650`), in order.
    pub(crate) others: Vec<String>,
    /// `pulsar+ssl://`.
    pub(crate) tls: bool,
}

/// `pulsar://host:port`, `pulsar+ssl://host:port` or bare `host:port`; several hosts
/// separated by commas (`pulsar://h1:6650,h2:6650`, as the Java client takes them).
pub(crate) fn parse_service_url(url: &str) -> Result<ServiceUrl, Error> {
    let trimmed = url.trim();
    let (tls, rest) = match trimmed.strip_prefix("pulsar+ssl://") {
        Some(rest) => (true, rest),
        None => (false, trimmed.strip_prefix("pulsar://").unwrap_or(trimmed)),
    };
    let bare = rest.trim_end_matches('/');
    let valid = |host_port: &str| {
        host_port.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        })
    };
    let hosts: Vec<&str> = bare.split(',').map(str::trim).collect();
    if !hosts.iter().all(|h| valid(h)) || bare.contains("://") || bare.contains('/') {
        return Err(Error::Invalid {
            what: "service URL",
            reason: format!(
                "{url:?} is not pulsar://host:port or pulsar+ssl://host:port (several hosts: \
                 pulsar://h1:6650,h2:6650, each with its port)"
            ),
        });
    }
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Invalid {
            what: "service URL",
            reason: format!("{url:?} needs TLS: enable the `tls` feature of pulsar-wire"),
        });
    }
    Ok(ServiceUrl {
        address: hosts[0].to_owned(),
        others: hosts[1..].iter().map(|h| (*h).to_owned()).collect(),
        tls,
    })
}

/// Why a producer is gone from its connection (what the connection's watch of it tells).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerGone {
    /// The broker closed it (`CLOSE_PRODUCER`: the topic was unloaded or moved).
    Closed,
    /// The broker closed it naming the broker that serves the topic now (`CLOSE_PRODUCER`
    /// with `assignedBrokerServiceUrl`, PIP-307): that broker's `host:port`.
    Moved(String),
    /// The connection ended.
    Lost,
}

/// A frame pushed by the broker to a consumer.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// A `MESSAGE` frame.
    Message(Box<Frame>),
    /// The broker closed the consumer (`CLOSE_CONSUMER`).
    Closed,
    /// The broker closed the consumer naming the broker that serves the topic now
    /// (`CLOSE_CONSUMER` with `assignedBrokerServiceUrl`, PIP-307): that broker's
    /// `host:port`.
    Moved(String),
    /// The topic was terminated and every message delivered.
    ReachedEndOfTopic,
    /// The connection was lost.
    ConnectionLost(Error),
}

/// A broker's answer to a lookup ([`Connection::lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// This broker serves the topic.
    Here,
    /// A proxy serves the topic's broker: use the service URL's connection.
    ThroughServiceUrl,
    /// The broker at this `host:port` serves the topic.
    Connect(String),
    /// Ask the broker at this `host:port` again, with `authoritative` set as given (the
    /// broker that redirects may have decided who owns the topic).
    Redirect {
        /// The broker to ask.
        address: String,
        /// Whether to tell it the redirect is authoritative.
        authoritative: bool,
    },
}

type Pending = oneshot::Sender<Result<BaseCommand, Error>>;
type PendingSend = oneshot::Sender<Result<pb::MessageIdData, Error>>;

struct Shared {
    address: String,
    tls: bool,
    auth: Option<Arc<dyn TokenProvider>>,
    timeout: Duration,
    outbound: mpsc::Sender<OutgoingFrame>,
    next_id: AtomicU64,
    requests: Mutex<HashMap<u64, Pending>>,
    sends: Mutex<HashMap<(u64, u64), PendingSend>>,
    consumers: Mutex<HashMap<u64, mpsc::UnboundedSender<ConsumerEvent>>>,
    /// Producers told when the broker closes them (`CLOSE_PRODUCER`).
    /// Told when the broker closes the producer, with the broker it names, if any.
    producers: Mutex<HashMap<u64, oneshot::Sender<Option<String>>>>,
    closed: CancellationToken,
    lost: Mutex<Option<Error>>,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    auth_challenges: AtomicU64,
    server_version: String,
    protocol_version: i32,
    max_message_size: Option<i32>,
}

/// One connection to a broker. Cheap to clone; closed when the last clone is dropped or on
/// [`Connection::close`].
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    _guard: Arc<CloseOnDrop>,
}

struct CloseOnDrop(CancellationToken);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("address", &self.shared.address)
            .field("server_version", &self.shared.server_version)
            .field("protocol_version", &self.shared.protocol_version)
            .finish_non_exhaustive()
    }
}

fn command(r#type: Type, fill: impl FnOnce(&mut BaseCommand)) -> BaseCommand {
    let mut command = BaseCommand {
        r#type: r#type as i32,
        ..BaseCommand::default()
    };
    fill(&mut command);
    command
}

type BoxedRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxedWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// The byte stream to the broker, split: TCP, or TLS over TCP.
async fn open_stream(options: &ConnectOptions) -> Result<(BoxedRead, BoxedWrite), Error> {
    let address = options.address.as_str();
    if !options.tls && options.tls_settings.is_customised() {
        return Err(Error::Invalid {
            what: "TLS options",
            reason: format!(
                "TLS options are set but the service URL of {address} is pulsar:// (plain \
                 TCP): use pulsar+ssl://{address} to connect with TLS"
            ),
        });
    }
    #[cfg(feature = "tls")]
    let tls_config = if options.tls {
        Some(crate::tls::client_config(&options.tls_settings)?)
    } else {
        None
    };
    #[cfg(not(feature = "tls"))]
    if options.tls {
        return Err(Error::Invalid {
            what: "service URL",
            reason: format!("TLS to {address} needs the `tls` feature of pulsar-wire"),
        });
    }
    let open = async {
        let tcp = TcpStream::connect(address)
            .await
            .map_err(|e| Error::ConnectionLost {
                addr: address.to_owned(),
                reason: e.to_string(),
            })?;
        let _ = tcp.set_nodelay(true);
        #[cfg(feature = "tls")]
        if let Some(config) = tls_config {
            let stream = crate::tls::handshake(tcp, address, config).await?;
            let (read, write) = tokio::io::split(stream);
            return Ok::<(BoxedRead, BoxedWrite), Error>((Box::new(read), Box::new(write)));
        }
        let (read, write) = tcp.into_split();
        Ok::<(BoxedRead, BoxedWrite), Error>((Box::new(read), Box::new(write)))
    };
    tokio::time::timeout(options.operation_timeout, open)
        .await
        .map_err(|_| Error::Timeout {
            operation: "connect",
            after: options.operation_timeout,
            cause: format!("{} did not accept the connection", options.address),
        })?
}

/// An error read from or written to the stream during the handshake; on TLS, one that
/// TLS caused (a refused client certificate shows only here with TLS 1.3) says so.
fn stream_error(options: &ConnectOptions, error: Error) -> Error {
    #[cfg(feature = "tls")]
    if options.tls
        && let Error::Io(io) = &error
    {
        return match crate::tls::explain(&options.address, io) {
            Error::ConnectionLost { .. } => error,
            tls => tls,
        };
    }
    let _ = options;
    error
}

/// `CONNECT` with the token of the options' provider.
fn connect_frame(token: Option<String>, refresh: bool) -> Frame {
    Frame::command(command(Type::Connect, |c| {
        c.connect = Some(pb::CommandConnect {
            client_version: CLIENT_VERSION.into(),
            auth_method_name: token.as_ref().map(|_| TOKEN_AUTH_METHOD.into()),
            auth_data: token.map(String::into_bytes),
            protocol_version: Some(PROTOCOL_VERSION),
            proxy_to_broker_url: None,
            feature_flags: Some(pb::FeatureFlags {
                // AUTH_CHALLENGE is answered when there is a token to answer with.
                supports_auth_refresh: Some(refresh),
                supports_broker_entry_metadata: Some(true),
                supports_partial_producer: Some(false),
                supports_topic_watchers: Some(false),
            }),
        });
    }))
}

/// `AUTH_RESPONSE` carrying `token`.
fn auth_response_frame(token: String) -> Frame {
    Frame::command(command(Type::AuthResponse, |c| {
        c.auth_response = Some(pb::CommandAuthResponse {
            client_version: Some(CLIENT_VERSION.into()),
            response: Some(pb::AuthData {
                auth_method_name: Some(TOKEN_AUTH_METHOD.into()),
                auth_data: Some(token.into_bytes()),
            }),
            protocol_version: Some(PROTOCOL_VERSION),
        });
    }))
}

/// The `ERROR` answering `CONNECT` or `AUTH_RESPONSE` as an error.
fn refusal(address: &str, token_sent: bool, error: pb::CommandError) -> Error {
    if error.error == ServerError::AuthenticationError as i32 {
        return Error::Authentication {
            broker: address.to_owned(),
            message: error.message,
            token_sent,
        };
    }
    Error::Server {
        operation: "CONNECT",
        code: error.error,
        message: error.message,
    }
}

/// `CONNECT`, answering `AUTH_CHALLENGE`s, until `CONNECTED`.
async fn handshake(
    reader: &mut FramedRead<BoxedRead, PulsarCodec>,
    writer: &mut FrameWriter<BoxedWrite>,
    options: &ConnectOptions,
) -> Result<pb::CommandConnected, Error> {
    let address = options.address.as_str();
    let provider = options.auth.as_deref();
    let token = match provider {
        Some(provider) => Some(fetch_token(provider).await?),
        None => None,
    };
    let token_sent = token.is_some();
    writer
        .send(connect_frame(token, token_sent))
        .await
        .map_err(|e| stream_error(options, e))?;
    let mut challenges = 0;
    loop {
        let answer = match reader.next().await {
            Some(answer) => answer.map_err(|e| stream_error(options, e))?,
            None => {
                let mut reason =
                    "the broker closed the connection without answering CONNECT".to_owned();
                if !options.tls {
                    reason.push_str("; if the port speaks TLS, connect with pulsar+ssl://");
                }
                if token_sent {
                    reason.push_str("; a broker that rejects the token may also just close");
                }
                return Err(Error::ConnectionLost {
                    addr: address.to_owned(),
                    reason,
                });
            }
        };
        match Type::try_from(answer.command.r#type) {
            Ok(Type::Connected) => return Ok(answer.command.connected.unwrap_or_default()),
            Ok(Type::Error) => {
                let error = answer.command.error.unwrap_or_default();
                return Err(refusal(address, token_sent, error));
            }
            Ok(Type::AuthChallenge) => {
                let Some(provider) = provider else {
                    return Err(Error::Authentication {
                        broker: address.to_owned(),
                        message: "it asked for credentials with AUTH_CHALLENGE".into(),
                        token_sent: false,
                    });
                };
                challenges += 1;
                if challenges > MAX_HANDSHAKE_CHALLENGES {
                    return Err(Error::ConnectionLost {
                        addr: address.to_owned(),
                        reason: format!(
                            "the broker sent more than {MAX_HANDSHAKE_CHALLENGES} AUTH_CHALLENGEs \
                             without CONNECTED"
                        ),
                    });
                }
                let token = fetch_token(provider).await?;
                writer
                    .send(auth_response_frame(token))
                    .await
                    .map_err(|e| stream_error(options, e))?;
            }
            _ => {
                return Err(Error::ConnectionLost {
                    addr: address.to_owned(),
                    reason: format!(
                        "unexpected answer to CONNECT: type {}",
                        answer.command.r#type
                    ),
                });
            }
        }
    }
}

impl Connection {
    /// Connects (over TLS for a `pulsar+ssl://` URL) and performs the `CONNECT` handshake,
    /// with the token of the options' provider if there is one.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the broker cannot be reached; [`Error::Tls`] when the
    /// TLS handshake fails; [`Error::Authentication`] when the broker refuses the token (or
    /// wants one and none is configured); [`Error::Server`] when it refuses the connection
    /// otherwise; [`Error::Invalid`] for unusable TLS files or TLS options on a `pulsar://`
    /// URL; [`Error::Timeout`]; and the token provider's own errors.
    pub async fn connect(options: &ConnectOptions) -> Result<Self, Error> {
        options.validate()?;
        let (read, write) = open_stream(options).await?;
        let codec = PulsarCodec::new(options.max_frame_size);
        let mut reader = FramedRead::new(read, codec);
        let mut writer = FrameWriter::new(write, options.max_frame_size);
        let connected = tokio::time::timeout(
            options.operation_timeout,
            handshake(&mut reader, &mut writer, options),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: "CONNECT",
            after: options.operation_timeout,
            cause: format!("{} did not answer CONNECT", options.address),
        })??;
        let (outbound, rx) = mpsc::channel(OUTBOUND_FRAMES);
        let closed = CancellationToken::new();
        let shared = Arc::new(Shared {
            address: options.address.clone(),
            tls: options.tls,
            auth: options.auth.clone(),
            timeout: options.operation_timeout,
            outbound,
            next_id: AtomicU64::new(1),
            requests: Mutex::new(HashMap::new()),
            sends: Mutex::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            producers: Mutex::new(HashMap::new()),
            closed: closed.clone(),
            lost: Mutex::new(None),
            frames_sent: AtomicU64::new(1),
            frames_received: AtomicU64::new(1),
            auth_challenges: AtomicU64::new(0),
            server_version: connected.server_version,
            protocol_version: connected.protocol_version.unwrap_or(0),
            max_message_size: connected.max_message_size,
        });
        tokio::spawn(write_loop(Arc::clone(&shared), writer, rx));
        tokio::spawn(read_loop(Arc::clone(&shared), reader, options.keep_alive));
        Ok(Self {
            shared,
            _guard: Arc::new(CloseOnDrop(closed)),
        })
    }

    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        self.shared.tls
    }

    /// How many `AUTH_CHALLENGE`s the broker sent after `CONNECTED`. Each is answered with
    /// a token fetched anew from the provider; when the provider fails, the connection is
    /// closed with its error instead.
    pub fn auth_challenges(&self) -> u64 {
        self.shared.auth_challenges.load(Ordering::Relaxed)
    }

    /// A new id for a request, producer or consumer (unique per connection).
    pub fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The broker's version string.
    pub fn server_version(&self) -> &str {
        &self.shared.server_version
    }

    /// The protocol version the broker agreed to.
    pub fn protocol_version(&self) -> i32 {
        self.shared.protocol_version
    }

    /// The broker's largest message, if it said.
    pub fn max_message_size(&self) -> Option<i32> {
        self.shared.max_message_size
    }

    /// The `host:port` of the broker.
    pub fn address(&self) -> &str {
        &self.shared.address
    }

    /// Frames written and read so far (the handshake included).
    pub fn frames(&self) -> (u64, u64) {
        (
            self.shared.frames_sent.load(Ordering::Relaxed),
            self.shared.frames_received.load(Ordering::Relaxed),
        )
    }

    fn check_open(&self) -> Result<(), Error> {
        if let Some(error) = self.shared.lost.lock().clone() {
            return Err(error);
        }
        if self.shared.closed.is_cancelled() {
            return Err(Error::Closed("the connection"));
        }
        Ok(())
    }

    /// Writes a frame that expects no answer (for users: [`crate::wire::ConnectionExt::send`]).
    pub(crate) fn send(&self, frame: impl Into<OutgoingFrame>) -> Result<(), Error> {
        self.check_open()?;
        queue(&self.shared, frame)
    }

    /// Sends a request built with a fresh request id and waits for its answer (for users:
    /// [`crate::wire::ConnectionExt::request`]).
    pub(crate) async fn request(
        &self,
        operation: &'static str,
        build: impl FnOnce(u64) -> Frame,
    ) -> Result<BaseCommand, Error> {
        let request_id = self.next_id();
        let (tx, rx) = oneshot::channel();
        self.shared.requests.lock().insert(request_id, tx);
        if let Err(error) = self.send(build(request_id)) {
            self.shared.requests.lock().remove(&request_id);
            return Err(error);
        }
        let answer = tokio::time::timeout(self.shared.timeout, rx).await;
        let answer = match answer {
            Err(_) => {
                self.shared.requests.lock().remove(&request_id);
                return Err(Error::Timeout {
                    operation,
                    after: self.shared.timeout,
                    cause: format!("the broker at {} did not answer", self.shared.address),
                });
            }
            Ok(Err(_)) => return Err(self.lost_error()),
            Ok(Ok(answer)) => answer?,
        };
        if let Some(error) = server_error_of(&answer) {
            return Err(Error::Server {
                operation,
                code: error.0,
                message: error.1,
            });
        }
        Ok(answer)
    }

    /// Sends a `SEND` frame and waits for its receipt (for users:
    /// [`crate::wire::ConnectionExt::send_message`]).
    pub(crate) async fn send_message(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: Frame,
    ) -> Result<pb::MessageIdData, Error> {
        self.start_send(producer_id, sequence_id, frame.into())?
            .await
    }

    /// Writes a `SEND` frame now and returns the wait for its receipt: frames written one
    /// after another go out in that order, whenever their receipts are awaited.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the frame cannot be written; the returned wait fails as
    /// [`Connection::send_message`].
    pub(crate) fn start_send(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: OutgoingFrame,
    ) -> Result<impl Future<Output = Result<pb::MessageIdData, Error>> + Send + use<>, Error> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .sends
            .lock()
            .insert((producer_id, sequence_id), tx);
        if let Err(error) = self.send(frame) {
            self.shared.sends.lock().remove(&(producer_id, sequence_id));
            return Err(error);
        }
        let this = self.clone();
        Ok(async move { this.receipt(producer_id, sequence_id, rx).await })
    }

    /// Resolves once `producer_id` is gone from this connection: the broker closed it
    /// (`CLOSE_PRODUCER`, [`ProducerGone::Closed`]) or the connection ended
    /// ([`ProducerGone::Lost`]). Holds no clone of the connection.
    pub(crate) fn watch_producer(
        &self,
        producer_id: u64,
    ) -> impl Future<Output = ProducerGone> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        self.shared.producers.lock().insert(producer_id, tx);
        let closed = self.shared.closed.clone();
        async move {
            tokio::select! {
                told = rx => match told {
                    Ok(Some(address)) => ProducerGone::Moved(address),
                    Ok(None) => ProducerGone::Closed,
                    Err(_) => ProducerGone::Lost,
                },
                () = closed.cancelled() => ProducerGone::Lost,
            }
        }
    }

    /// Whether `producer_id` is still watched here: false once the broker closed it
    /// (`CLOSE_PRODUCER` is handled before any frame after it).
    pub(crate) fn watches_producer(&self, producer_id: u64) -> bool {
        self.shared.producers.lock().contains_key(&producer_id)
    }

    /// Stops watching `producer_id` and forgets the receipts it still waits for here (their
    /// waits fail as on a lost connection): a producer that moved to another connection.
    pub(crate) fn forget_producer(&self, producer_id: u64) {
        self.shared.producers.lock().remove(&producer_id);
        self.shared
            .sends
            .lock()
            .retain(|(producer, _), _| *producer != producer_id);
    }

    async fn receipt(
        &self,
        producer_id: u64,
        sequence_id: u64,
        rx: oneshot::Receiver<Result<pb::MessageIdData, Error>>,
    ) -> Result<pb::MessageIdData, Error> {
        match tokio::time::timeout(self.shared.timeout, rx).await {
            Err(_) => {
                self.shared.sends.lock().remove(&(producer_id, sequence_id));
                Err(Error::Timeout {
                    operation: "SEND",
                    after: self.shared.timeout,
                    cause: format!("the broker at {} sent no receipt", self.shared.address),
                })
            }
            Ok(Err(_)) => Err(self.lost_error()),
            Ok(Ok(result)) => result,
        }
    }

    /// Routes frames pushed to `consumer_id` to the returned receiver (for users:
    /// [`crate::wire::ConnectionExt::register_consumer`]).
    pub(crate) fn register_consumer(
        &self,
        consumer_id: u64,
    ) -> mpsc::UnboundedReceiver<ConsumerEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.consumers.lock().insert(consumer_id, tx);
        rx
    }

    /// Whether frames for `consumer_id` are routed (it is registered and the broker has not
    /// closed it).
    pub(crate) fn is_registered_consumer(&self, consumer_id: u64) -> bool {
        self.shared.consumers.lock().contains_key(&consumer_id)
    }

    /// Stops routing frames to `consumer_id`.
    pub(crate) fn unregister_consumer(&self, consumer_id: u64) {
        self.shared.consumers.lock().remove(&consumer_id);
    }

    /// Asks this broker who serves `topic` (`LOOKUP`, with `authoritative` as a redirect
    /// said); the answer tells a redirect from a broker to connect to.
    ///
    /// # Errors
    /// As [`ConnectionExt::request`](crate::wire::ConnectionExt::request); [`Error::Server`] for a `Failed` answer; [`Error::Invalid`]
    /// for a URL this client cannot use (no TLS URL for a TLS client, or the other scheme).
    pub async fn lookup(&self, topic: &str, authoritative: bool) -> Result<LookupAnswer, Error> {
        let answer = self
            .request("LOOKUP", |request_id| {
                Frame::command(command(Type::Lookup, |c| {
                    c.lookup_topic = Some(pb::CommandLookupTopic {
                        topic: topic.to_owned(),
                        request_id,
                        authoritative: Some(authoritative),
                    });
                }))
            })
            .await?;
        let response = answer.lookup_topic_response.unwrap_or_default();
        if let Some(code) = response.error {
            return Err(Error::Server {
                operation: "LOOKUP",
                code,
                message: response.message.unwrap_or_default(),
            });
        }
        let redirect = response.response == Some(LookupType::Redirect as i32);
        let redirect_authoritative = response.authoritative();
        if !redirect && response.proxy_through_service_url() {
            return Ok(LookupAnswer::ThroughServiceUrl);
        }
        let url = if self.shared.tls {
            match (response.broker_service_url_tls, response.broker_service_url) {
                (Some(url), _) => Some(url),
                (None, Some(plain)) => {
                    return Err(Error::Invalid {
                        what: "lookup",
                        reason: format!(
                            "the broker at {} sends {topic} to {plain} but gives no TLS URL \
                             (brokerServiceUrlTls), and this client connects with TLS: enable \
                             TLS on every broker (brokerServicePortTls) or connect with \
                             pulsar://",
                            self.address()
                        ),
                    });
                }
                (None, None) => None,
            }
        } else {
            response.broker_service_url
        };
        let Some(url) = url else {
            return Ok(LookupAnswer::Here);
        };
        let target = parse_service_url(&url)?;
        if target.tls != self.shared.tls {
            return Err(Error::Invalid {
                what: "lookup",
                reason: format!(
                    "the broker at {} sends {topic} to {url}, which is {} while this client \
                     connects {}",
                    self.address(),
                    if target.tls { "TLS" } else { "plain TCP" },
                    if self.shared.tls {
                        "with TLS"
                    } else {
                        "over plain TCP"
                    },
                ),
            });
        }
        Ok(if redirect {
            LookupAnswer::Redirect {
                address: target.address,
                authoritative: redirect_authoritative,
            }
        } else if target.address == self.address() {
            LookupAnswer::Here
        } else {
            LookupAnswer::Connect(target.address)
        })
    }

    /// The number of partitions of a topic (0 when it is not partitioned).
    ///
    /// # Errors
    /// As [`ConnectionExt::request`](crate::wire::ConnectionExt::request).
    pub async fn partitions(&self, topic: &str) -> Result<u32, Error> {
        let answer = self
            .request("PARTITIONED_METADATA", |request_id| {
                Frame::command(command(Type::PartitionedMetadata, |c| {
                    c.partition_metadata = Some(pb::CommandPartitionedTopicMetadata {
                        topic: topic.to_owned(),
                        request_id,
                    });
                }))
            })
            .await?;
        let response = answer.partition_metadata_response.unwrap_or_default();
        if let Some(code) = response.error {
            return Err(Error::Server {
                operation: "PARTITIONED_METADATA",
                code,
                message: response.message.unwrap_or_default(),
            });
        }
        Ok(response.partitions.unwrap_or(0))
    }

    /// The topics of `namespace` (`tenant/namespace`) in `mode`, as the broker lists them
    /// (`GET_TOPICS_OF_NAMESPACE`): partitions by their own names, system topics left out.
    /// `pattern` is sent for the broker to filter with (brokers that do not filter, or
    /// filter only short patterns, list them all).
    ///
    /// # Errors
    /// As [`ConnectionExt::request`](crate::wire::ConnectionExt::request).
    pub(crate) async fn topics_of_namespace(
        &self,
        namespace: &str,
        mode: pb::command_get_topics_of_namespace::Mode,
        pattern: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let answer = self
            .request("GET_TOPICS_OF_NAMESPACE", |request_id| {
                Frame::command(command(Type::GetTopicsOfNamespace, |c| {
                    c.get_topics_of_namespace = Some(pb::CommandGetTopicsOfNamespace {
                        request_id,
                        namespace: namespace.to_owned(),
                        mode: Some(mode as i32),
                        topics_pattern: pattern.map(str::to_owned),
                        topics_hash: None,
                    });
                }))
            })
            .await?;
        Ok(answer
            .get_topics_of_namespace_response
            .map(|response| response.topics)
            .unwrap_or_default())
    }

    /// Closes the connection; pending requests fail with [`Error::Closed`].
    pub fn close(&self) {
        self.shared.closed.cancel();
    }

    /// Whether the connection is closed or lost.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Why the connection ended (or "closed" while it is open).
    pub(crate) fn lost_error(&self) -> Error {
        self.shared
            .lost
            .lock()
            .clone()
            .unwrap_or(Error::Closed("the connection"))
    }
}

/// The `(code, message)` of an answer that reports an error.
fn server_error_of(answer: &BaseCommand) -> Option<(i32, String)> {
    if let Some(e) = &answer.error {
        return Some((e.error, e.message.clone()));
    }
    let responses = [
        answer
            .ack_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
        answer
            .new_txn_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
        answer
            .add_partition_to_txn_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
        answer
            .add_subscription_to_txn_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
        answer
            .end_txn_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
        answer
            .tc_client_connect_response
            .as_ref()
            .and_then(|r| r.error.map(|e| (e, r.message.clone()))),
    ];
    responses
        .into_iter()
        .flatten()
        .next()
        .map(|(code, message)| (code, message.unwrap_or_default()))
}

/// The `host:port` of the broker a `CLOSE_PRODUCER` or `CLOSE_CONSUMER` names (PIP-307): its
/// TLS URL for a TLS client, its plain one otherwise; `None` when it names none this client
/// can use (the client then looks the topic up as after any close).
fn assigned_broker(tls: bool, plain: Option<&str>, secure: Option<&str>) -> Option<String> {
    let url = if tls { secure } else { plain }?;
    let target = parse_service_url(url).ok()?;
    (target.tls == tls).then_some(target.address)
}

/// The request id an answer carries, if it is an answer to a request.
fn request_id_of(c: &BaseCommand) -> Option<u64> {
    c.success
        .as_ref()
        .map(|r| r.request_id)
        .or_else(|| c.error.as_ref().map(|r| r.request_id))
        .or_else(|| c.producer_success.as_ref().map(|r| r.request_id))
        .or_else(|| c.lookup_topic_response.as_ref().map(|r| r.request_id))
        .or_else(|| c.partition_metadata_response.as_ref().map(|r| r.request_id))
        .or_else(|| c.ack_response.as_ref().and_then(|r| r.request_id))
        .or_else(|| c.new_txn_response.as_ref().map(|r| r.request_id))
        .or_else(|| {
            c.add_partition_to_txn_response
                .as_ref()
                .map(|r| r.request_id)
        })
        .or_else(|| {
            c.add_subscription_to_txn_response
                .as_ref()
                .map(|r| r.request_id)
        })
        .or_else(|| c.end_txn_response.as_ref().map(|r| r.request_id))
        .or_else(|| c.tc_client_connect_response.as_ref().map(|r| r.request_id))
        .or_else(|| {
            c.get_last_message_id_response
                .as_ref()
                .map(|r| r.request_id)
        })
        .or_else(|| {
            c.get_topics_of_namespace_response
                .as_ref()
                .map(|r| r.request_id)
        })
}

async fn write_loop(
    shared: Arc<Shared>,
    mut writer: FrameWriter<BoxedWrite>,
    mut rx: mpsc::Receiver<OutgoingFrame>,
) {
    loop {
        let frame = tokio::select! {
            () = shared.closed.cancelled() => break,
            frame = rx.recv() => match frame {
                Some(frame) => frame,
                None => break,
            },
        };
        // Write everything queued, then flush once.
        let mut result = writer.feed(frame).await;
        let mut written = 1;
        while result.is_ok() {
            match rx.try_recv() {
                Ok(frame) => {
                    result = writer.feed(frame).await;
                    written += 1;
                }
                Err(_) => break,
            }
        }
        shared.frames_sent.fetch_add(written, Ordering::Relaxed);
        if let Err(error) = result.and(writer.flush().await) {
            fail_all(&shared, error.to_string());
            return;
        }
    }
    let _ = writer.close().await;
    fail_all(&shared, "the connection was closed".into());
}

async fn read_loop(
    shared: Arc<Shared>,
    mut reader: FramedRead<BoxedRead, PulsarCodec>,
    keep_alive: Duration,
) {
    let mut idle_probes = 0u32;
    let reason = loop {
        let next = tokio::select! {
            () = shared.closed.cancelled() => break "the connection was closed".to_string(),
            next = tokio::time::timeout(keep_alive, reader.next()) => next,
        };
        let frame = match next {
            Err(_) => {
                idle_probes += 1;
                if idle_probes >= 2 {
                    break format!("no answer to keep-alive pings for {:?}", keep_alive * 2);
                }
                let _ = queue(
                    &shared,
                    Frame::command(command(Type::Ping, |c| {
                        c.ping = Some(pb::CommandPing {});
                    })),
                );
                continue;
            }
            Ok(None) => break "the broker closed the connection".to_string(),
            Ok(Some(Err(error))) => break error.to_string(),
            Ok(Some(Ok(frame))) => frame,
        };
        idle_probes = 0;
        shared.frames_received.fetch_add(1, Ordering::Relaxed);
        route(&shared, frame);
    };
    fail_all(&shared, reason);
}

/// Hands one received frame to whoever waits for it.
fn route(shared: &Arc<Shared>, frame: Frame) {
    let c = &frame.command;
    match Type::try_from(c.r#type) {
        Ok(Type::AuthChallenge) => answer_challenge(shared),
        // The broker refuses refreshed credentials with an ERROR for request id -1, then
        // closes: what is pending fails with that, not with a bare "connection lost".
        Ok(Type::Error)
            if c.error.as_ref().is_some_and(|e| {
                e.error == ServerError::AuthenticationError as i32
                    && !shared.requests.lock().contains_key(&e.request_id)
            }) =>
        {
            let error = c.error.clone().unwrap_or_default();
            fail_all_with(
                shared,
                refusal(&shared.address, shared.auth.is_some(), error),
            );
        }
        Ok(Type::Ping) => {
            let _ = queue(
                shared,
                Frame::command(command(Type::Pong, |c| {
                    c.pong = Some(pb::CommandPong {});
                })),
            );
        }
        Ok(Type::Pong) => {}
        Ok(Type::SendReceipt) => {
            if let Some(receipt) = &c.send_receipt {
                let key = (receipt.producer_id, receipt.sequence_id);
                if let Some(waiter) = shared.sends.lock().remove(&key) {
                    let _ = waiter.send(Ok(receipt.message_id.clone().unwrap_or_default()));
                }
            }
        }
        Ok(Type::SendError) => {
            if let Some(e) = &c.send_error {
                let key = (e.producer_id, e.sequence_id);
                if let Some(waiter) = shared.sends.lock().remove(&key) {
                    let _ = waiter.send(Err(Error::Server {
                        operation: "SEND",
                        code: e.error,
                        message: e.message.clone(),
                    }));
                }
            }
        }
        Ok(Type::Message) => {
            let consumer_id = c.message.as_ref().map(|m| m.consumer_id);
            if let Some(tx) = consumer_id.and_then(|id| shared.consumers.lock().get(&id).cloned()) {
                let _ = tx.send(ConsumerEvent::Message(Box::new(frame)));
            }
        }
        Ok(Type::CloseConsumer) => {
            let close = c.close_consumer.as_ref();
            let tx = close.and_then(|m| shared.consumers.lock().remove(&m.consumer_id));
            if let Some(tx) = tx {
                let assigned = close.and_then(|m| {
                    assigned_broker(
                        shared.tls,
                        m.assigned_broker_service_url.as_deref(),
                        m.assigned_broker_service_url_tls.as_deref(),
                    )
                });
                let _ = tx.send(match assigned {
                    Some(address) => ConsumerEvent::Moved(address),
                    None => ConsumerEvent::Closed,
                });
            }
        }
        Ok(Type::CloseProducer) => {
            let close = c.close_producer.as_ref();
            let tx = close.and_then(|m| shared.producers.lock().remove(&m.producer_id));
            if let Some(tx) = tx {
                let _ = tx.send(close.and_then(|m| {
                    assigned_broker(
                        shared.tls,
                        m.assigned_broker_service_url.as_deref(),
                        m.assigned_broker_service_url_tls.as_deref(),
                    )
                }));
            }
        }
        Ok(Type::ReachedEndOfTopic) => {
            let id = c.reached_end_of_topic.as_ref().map(|m| m.consumer_id);
            let tx = id.and_then(|id| shared.consumers.lock().get(&id).cloned());
            if let Some(tx) = tx {
                let _ = tx.send(ConsumerEvent::ReachedEndOfTopic);
            }
        }
        _ => match request_id_of(c) {
            Some(request_id) => {
                if let Some(waiter) = shared.requests.lock().remove(&request_id) {
                    let _ = waiter.send(Ok(frame.command));
                }
            }
            None => tracing::debug!(r#type = c.r#type, "ignoring an unexpected frame"),
        },
    }
}

/// Answers an `AUTH_CHALLENGE` with a fresh token from the provider, off the read loop; a
/// provider that fails (or none) closes the connection with that reason.
fn answer_challenge(shared: &Arc<Shared>) {
    shared.auth_challenges.fetch_add(1, Ordering::Relaxed);
    let Some(provider) = shared.auth.clone() else {
        fail_all_with(
            shared,
            Error::Authentication {
                broker: shared.address.clone(),
                message: "it asked for credentials with AUTH_CHALLENGE".into(),
                token_sent: false,
            },
        );
        return;
    };
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let token = tokio::select! {
            () = shared.closed.cancelled() => return,
            token = fetch_token(provider.as_ref()) => token,
        };
        match token {
            Ok(token) => {
                let _ = queue(&shared, auth_response_frame(token));
            }
            Err(error) => fail_all(
                &shared,
                format!(
                    "the broker asked for fresh credentials (AUTH_CHALLENGE) and the token \
                     provider failed: {error}"
                ),
            ),
        }
    });
}

/// Fails every pending request, send and consumer: the connection is gone.
fn fail_all(shared: &Shared, reason: String) {
    fail_all_with(
        shared,
        Error::ConnectionLost {
            addr: shared.address.clone(),
            reason,
        },
    );
}

/// As [`fail_all`], with the error to report; the first reason recorded wins.
fn fail_all_with(shared: &Shared, error: Error) {
    let error = shared.lost.lock().get_or_insert(error).clone();
    shared.closed.cancel();
    for (_, waiter) in shared.requests.lock().drain() {
        let _ = waiter.send(Err(error.clone()));
    }
    for (_, waiter) in shared.sends.lock().drain() {
        let _ = waiter.send(Err(error.clone()));
    }
    for (_, consumer) in shared.consumers.lock().drain() {
        let _ = consumer.send(ConsumerEvent::ConnectionLost(error.clone()));
    }
}

/// Queues a frame for the writer. The queue is bounded: a frame that finds it full is
/// refused (the broker has not taken the frames before it), and nothing else changes.
fn queue(shared: &Shared, frame: impl Into<OutgoingFrame>) -> Result<(), Error> {
    match shared.outbound.try_send(frame.into()) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::Closed("the connection")),
        Err(mpsc::error::TrySendError::Full(_)) => Err(Error::QueueFull {
            queue: format!("the frames queued for writing to {}", shared.address),
            limit: OUTBOUND_FRAMES,
        }),
    }
}

/// The most frames queued for writing on one connection.
pub const OUTBOUND_FRAMES: usize = 65_536;

/// Builds a command frame of `type`, letting `fill` set its member.
pub fn command_frame(r#type: Type, fill: impl FnOnce(&mut BaseCommand)) -> Frame {
    Frame::command(command(r#type, fill))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls() {
        let plain = |address: &str| ServiceUrl {
            address: address.into(),
            others: Vec::new(),
            tls: false,
        };
        assert_eq!(
            parse_service_url("pulsar://127.0.0.1:6650").unwrap(),
            plain("127.0.0.1:6650")
        );
        assert_eq!(
            parse_service_url("localhost:6650/").unwrap(),
            plain("localhost:6650")
        );
        let parsed = parse_service_url("pulsar+ssl://broker.example:6651");
        if cfg!(feature = "tls") {
            let tls = ServiceUrl {
                address: "broker.example:6651".into(),
                others: Vec::new(),
                tls: true,
            };
            assert_eq!(parsed.unwrap(), tls);
        } else {
            let error = parsed.unwrap_err();
            assert!(error.to_string().contains("`tls` feature"), "{error}");
        }
        assert_eq!(
            parse_service_url("pulsar://h1:6650, h2:6651").unwrap(),
            ServiceUrl {
                address: "h1:6650".into(),
                others: vec!["h2:6651".into()],
                tls: false,
            }
        );
        for bad in [
            "pulsar://h1:6650,h2",
            "pulsar://h1:6650,",
            "http://x:1",
            "pulsar+ssl://x",
            "pulsar://x:1/path",
            "pulsar://x",
            "x:0",
            ":6650",
            "",
        ] {
            assert!(parse_service_url(bad).is_err(), "{bad}");
        }
    }
}

/// A scripted broker for the unit tests: one connection, driven by the test.
#[cfg(test)]
pub(crate) mod fake_broker {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncRead, AsyncWrite};
    use tokio::net::TcpListener;
    use tokio_util::codec::Framed;

    use super::command_frame;
    use crate::codec::{Frame, PulsarCodec};
    use crate::pb::base_command::Type;
    use crate::pb::{self, BaseCommand};

    /// The framed connection of the broker side.
    pub(crate) struct Peer<S>(pub(crate) Framed<S, PulsarCodec>);

    impl<S: AsyncRead + AsyncWrite + Unpin> Peer<S> {
        pub(crate) fn new(stream: S) -> Self {
            Self(Framed::new(stream, PulsarCodec::default()))
        }

        /// The next command, which must be of type `expected`.
        pub(crate) async fn expect(&mut self, expected: Type) -> BaseCommand {
            let frame = self
                .0
                .next()
                .await
                .expect("a frame from the client")
                .expect("a valid frame");
            assert_eq!(
                frame.command.r#type, expected as i32,
                "expected {expected:?}, got {:?}",
                frame.command
            );
            frame.command
        }

        pub(crate) async fn send(&mut self, frame: Frame) {
            self.0.send(frame).await.expect("sent to the client");
        }

        pub(crate) async fn connected(&mut self) {
            self.send(command_frame(Type::Connected, |c| {
                c.connected = Some(pb::CommandConnected {
                    server_version: "fake".into(),
                    protocol_version: Some(19),
                    ..Default::default()
                });
            }))
            .await;
        }

        /// `CONNECT`, answered with `CONNECTED`; returns its body.
        pub(crate) async fn accept_connect(&mut self) -> pb::CommandConnect {
            let connect = self.expect(Type::Connect).await.connect.expect("a body");
            self.connected().await;
            connect
        }

        /// An `ERROR` for request id -1 with `AuthenticationError`, as a broker refuses
        /// credentials.
        pub(crate) async fn refuse_authentication(&mut self) {
            self.send(command_frame(Type::Error, |c| {
                c.error = Some(pb::CommandError {
                    request_id: u64::MAX,
                    error: pb::ServerError::AuthenticationError as i32,
                    message: "Failed to authenticate".into(),
                });
            }))
            .await;
        }

        pub(crate) async fn challenge(&mut self) {
            self.send(command_frame(Type::AuthChallenge, |c| {
                c.auth_challenge = Some(pb::CommandAuthChallenge {
                    server_version: Some("fake".into()),
                    challenge: Some(pb::AuthData {
                        auth_method_name: Some("token".into()),
                        auth_data: Some(b"PulsarAuthRefresh".to_vec()),
                    }),
                    protocol_version: Some(19),
                });
            }))
            .await;
        }

        /// Reads until the client closes.
        pub(crate) async fn drain(mut self) {
            while let Some(Ok(_)) = self.0.next().await {}
        }
    }

    /// A listener on 127.0.0.1 and its `host:port`.
    pub(crate) async fn listen() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let address = listener.local_addr().expect("an address").to_string();
        (listener, address)
    }

    /// The token an `AUTH_RESPONSE` carries.
    pub(crate) fn response_token(command: &BaseCommand) -> String {
        let response = command
            .auth_response
            .as_ref()
            .and_then(|r| r.response.as_ref())
            .expect("AUTH_RESPONSE with credentials");
        assert_eq!(response.auth_method_name.as_deref(), Some("token"));
        String::from_utf8(response.auth_data.clone().unwrap_or_default()).expect("UTF-8")
    }
}

#[cfg(test)]
mod auth_tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::fake_broker::{Peer, listen, response_token};
    use super::*;

    /// Hands out `token-1`, `token-2`, ...
    struct Counting(AtomicU64);

    #[async_trait::async_trait]
    impl TokenProvider for Counting {
        async fn token(&self) -> Result<String, Error> {
            Ok(format!(
                "token-{}",
                self.0.fetch_add(1, Ordering::Relaxed) + 1
            ))
        }
    }

    fn counting() -> Counting {
        Counting(AtomicU64::new(0))
    }

    struct Failing;

    #[async_trait::async_trait]
    impl TokenProvider for Failing {
        async fn token(&self) -> Result<String, Error> {
            Err(Error::Invalid {
                what: "token",
                reason: "the vault is sealed".into(),
            })
        }
    }

    fn options(address: &str) -> ConnectOptions {
        ConnectOptions::new(address)
            .expect("valid")
            .operation_timeout(Duration::from_secs(30))
    }

    #[tokio::test]
    async fn connect_sends_the_token() {
        let (listener, address) = listen().await;
        let broker = tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            let connect = peer.accept_connect().await;
            peer.drain().await;
            connect
        });
        let connection = Connection::connect(&options(&address).auth_token("s3cr3t"))
            .await
            .expect("connected");
        connection.close();
        let connect = broker.await.expect("the broker ran");
        assert_eq!(connect.auth_method_name.as_deref(), Some("token"));
        assert_eq!(connect.auth_data.as_deref(), Some(&b"s3cr3t"[..]));
        let flags = connect.feature_flags.expect("feature flags");
        assert_eq!(flags.supports_auth_refresh, Some(true));
    }

    #[tokio::test]
    async fn without_a_token_connect_carries_no_credentials() {
        let (listener, address) = listen().await;
        let broker = tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            let connect = peer.accept_connect().await;
            peer.drain().await;
            connect
        });
        let connection = Connection::connect(&options(&address))
            .await
            .expect("connected");
        connection.close();
        let connect = broker.await.expect("the broker ran");
        assert_eq!(connect.auth_method_name, None);
        assert_eq!(connect.auth_data, None);
        assert_eq!(
            connect.feature_flags.unwrap().supports_auth_refresh,
            Some(false)
        );
    }

    #[tokio::test]
    async fn a_refused_token_fails_connect_at_once_naming_the_broker() {
        let (listener, address) = listen().await;
        tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            peer.expect(Type::Connect).await;
            peer.refuse_authentication().await;
            // A broker closes after the error.
        });
        let started = Instant::now();
        let error = crate::ClientBuilder::from(options(&address).auth_token("wrong"))
            .build()
            .await
            .expect_err("refused");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let Error::Authentication {
            broker, token_sent, ..
        } = &error
        else {
            panic!("not an authentication error: {error:?}");
        };
        assert_eq!(broker, &address);
        assert!(token_sent);
        let text = error.to_string();
        assert!(text.contains(&address), "{text}");
        assert!(text.contains("Failed to authenticate"), "{text}");
        assert!(text.contains("check the token"), "{text}");
        assert_eq!(
            error.server_error(),
            Some(crate::ServerError::AuthenticationError)
        );
        assert!(!error.is_retryable());
    }

    #[tokio::test]
    async fn a_broker_that_wants_credentials_says_so_when_none_are_given() {
        let (listener, address) = listen().await;
        tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            peer.expect(Type::Connect).await;
            peer.refuse_authentication().await;
        });
        let error = Connection::connect(&options(&address))
            .await
            .expect_err("refused");
        assert!(
            matches!(
                error,
                Error::Authentication {
                    token_sent: false,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("requires authentication"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_challenge_is_answered_with_a_fresh_token_and_the_connection_goes_on() {
        let (listener, address) = listen().await;
        let (tokens_tx, tokens_rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            let connect = peer.accept_connect().await;
            let first = String::from_utf8(connect.auth_data.unwrap_or_default()).unwrap();
            peer.challenge().await;
            let response = peer.expect(Type::AuthResponse).await;
            let second = response_token(&response);
            let _ = tokens_tx.send((first, second));
            // The connection still serves requests.
            let request = peer.expect(Type::PartitionedMetadata).await;
            let request_id = request.partition_metadata.unwrap().request_id;
            peer.send(command_frame(Type::PartitionedMetadataResponse, |c| {
                c.partition_metadata_response = Some(pb::CommandPartitionedTopicMetadataResponse {
                    partitions: Some(3),
                    request_id,
                    ..Default::default()
                });
            }))
            .await;
            peer.drain().await;
        });
        let connection = Connection::connect(&options(&address).auth_token_provider(counting()))
            .await
            .expect("connected");
        let (first, second) = tokens_rx.await.expect("the broker saw both tokens");
        assert_eq!(first, "token-1");
        assert_eq!(
            second, "token-2",
            "AUTH_RESPONSE carries a token fetched anew"
        );
        assert_eq!(connection.auth_challenges(), 1);
        assert_eq!(
            connection
                .partitions("persistent://public/default/t")
                .await
                .expect("answered"),
            3
        );
        assert!(!connection.is_closed());
    }

    #[tokio::test]
    async fn a_challenge_during_the_handshake_is_answered_before_connected() {
        let (listener, address) = listen().await;
        let broker = tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            peer.expect(Type::Connect).await;
            peer.challenge().await;
            let token = response_token(&peer.expect(Type::AuthResponse).await);
            peer.connected().await;
            peer.drain().await;
            token
        });
        let connection = Connection::connect(&options(&address).auth_token_provider(counting()))
            .await
            .expect("connected after the challenge");
        assert_eq!(connection.server_version(), "fake");
        assert_eq!(
            connection.auth_challenges(),
            0,
            "only challenges after CONNECTED"
        );
        connection.close();
        assert_eq!(broker.await.unwrap(), "token-2");
    }

    #[tokio::test]
    async fn a_refused_refresh_fails_what_is_pending_with_the_authentication_error() {
        let (listener, address) = listen().await;
        tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            peer.accept_connect().await;
            // A request arrives and stays unanswered while the credentials are refreshed.
            peer.expect(Type::PartitionedMetadata).await;
            peer.challenge().await;
            peer.expect(Type::AuthResponse).await;
            peer.refuse_authentication().await;
        });
        let connection = Connection::connect(&options(&address).auth_token("expiring"))
            .await
            .expect("connected");
        let started = Instant::now();
        let error = connection
            .partitions("persistent://public/default/t")
            .await
            .expect_err("the connection is refused");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(
                error,
                Error::Authentication {
                    token_sent: true,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(connection.is_closed());
        // Later requests get the same reason.
        let again = connection.partitions("t").await.expect_err("closed");
        assert!(matches!(again, Error::Authentication { .. }), "{again:?}");
    }

    #[tokio::test]
    async fn a_provider_failing_on_a_challenge_closes_the_connection_with_its_error() {
        let (listener, address) = listen().await;
        tokio::spawn(async move {
            let mut peer = Peer::new(listener.accept().await.expect("accepted").0);
            // Accept whatever CONNECT carries, then challenge.
            peer.accept_connect().await;
            peer.expect(Type::PartitionedMetadata).await;
            peer.challenge().await;
            peer.drain().await;
        });
        // The provider fails from the second call on.
        struct OnceThenFail(AtomicU64);
        #[async_trait::async_trait]
        impl TokenProvider for OnceThenFail {
            async fn token(&self) -> Result<String, Error> {
                if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                    Ok("first".into())
                } else {
                    Failing.token().await
                }
            }
        }
        let connection = Connection::connect(
            &options(&address).auth_token_provider(OnceThenFail(AtomicU64::new(0))),
        )
        .await
        .expect("connected");
        let error = connection
            .partitions("t")
            .await
            .expect_err("the connection is closed");
        let text = error.to_string();
        assert!(matches!(error, Error::ConnectionLost { .. }), "{error:?}");
        assert!(text.contains("AUTH_CHALLENGE"), "{text}");
        assert!(text.contains("the vault is sealed"), "{text}");
    }

    #[tokio::test]
    async fn a_provider_failing_at_connect_is_reported_as_it_is() {
        let (listener, address) = listen().await;
        tokio::spawn(async move {
            let _ = listener.accept().await;
        });
        let error = Connection::connect(&options(&address).auth_token_provider(Failing))
            .await
            .expect_err("no token");
        assert!(error.to_string().contains("the vault is sealed"), "{error}");
    }

    #[test]
    fn options_never_print_the_token() {
        let options = options("pulsar://127.0.0.1:6650").auth_token("s3cr3t");
        let debug = format!("{options:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("token"), "{debug}");
    }
}
