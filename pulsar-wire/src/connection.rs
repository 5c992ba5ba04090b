//! [`Connection`]: one TCP connection to a broker, with `CONNECT`, request-id correlation,
//! keep-alive, and routing of pushed frames to producers and consumers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::codec::{Frame, PulsarCodec};
use crate::pb::base_command::Type;
use crate::pb::{self, BaseCommand};

/// The protocol version this client speaks (v19: transaction coordinator connect).
pub const PROTOCOL_VERSION: i32 = 19;

/// How to connect.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub(crate) address: String,
    pub(crate) auth_token: Option<String>,
    pub(crate) operation_timeout: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) max_frame_size: usize,
}

impl ConnectOptions {
    /// A broker at `service_url` (`pulsar://host:port` or `host:port`), with a 30 s operation
    /// timeout and a 30 s keep-alive.
    ///
    /// # Errors
    /// [`Error::Invalid`] when the URL is not `pulsar://host:port`.
    pub fn new(service_url: &str) -> Result<Self, Error> {
        let address = parse_service_url(service_url)?;
        Ok(Self {
            address,
            auth_token: None,
            operation_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(30),
            max_frame_size: crate::codec::DEFAULT_MAX_FRAME_SIZE,
        })
    }

    /// Authenticates with a token (`auth_method_name = "token"`).
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// The deadline of every request (default 30 s).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How often an idle connection is probed with `PING` (default 30 s); a connection that
    /// hears nothing for twice as long is considered lost.
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// The largest frame accepted (default 5 MiB + 10 KiB).
    pub fn max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = bytes;
        self
    }

    /// The `host:port` connected to.
    pub fn address(&self) -> &str {
        &self.address
    }
}

/// `pulsar://host:port` (or bare `host:port`) → `host:port`.
pub(crate) fn parse_service_url(url: &str) -> Result<String, Error> {
    let bare = url
        .trim()
        .trim_start_matches("pulsar://")
        .trim_end_matches('/');
    let valid = bare
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if !valid || bare.contains("://") {
        return Err(Error::Invalid {
            what: "service URL",
            reason: format!(
                "{url:?} is not pulsar://host:port (other schemes, TLS included, are not supported)"
            ),
        });
    }
    Ok(bare.to_owned())
}

/// A frame pushed by the broker to a consumer.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// A `MESSAGE` frame.
    Message(Box<Frame>),
    /// The broker closed the consumer (`CLOSE_CONSUMER`).
    Closed,
    /// The topic was terminated and every message delivered.
    ReachedEndOfTopic,
    /// The connection was lost.
    ConnectionLost(Error),
}

type Pending = oneshot::Sender<Result<BaseCommand, Error>>;
type PendingSend = oneshot::Sender<Result<pb::MessageIdData, Error>>;

struct Shared {
    address: String,
    timeout: Duration,
    outbound: mpsc::UnboundedSender<Frame>,
    next_id: AtomicU64,
    requests: Mutex<HashMap<u64, Pending>>,
    sends: Mutex<HashMap<(u64, u64), PendingSend>>,
    consumers: Mutex<HashMap<u64, mpsc::UnboundedSender<ConsumerEvent>>>,
    closed: CancellationToken,
    lost: Mutex<Option<Error>>,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
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

impl Connection {
    /// Connects and performs the `CONNECT` handshake.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the broker cannot be reached; [`Error::Server`] when it
    /// refuses the connection (for example `AuthenticationError`); [`Error::Timeout`].
    pub async fn connect(options: &ConnectOptions) -> Result<Self, Error> {
        let lost = |reason: String| Error::ConnectionLost {
            addr: options.address.clone(),
            reason,
        };
        let stream = tokio::time::timeout(
            options.operation_timeout,
            TcpStream::connect(&options.address),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: "connect",
            after: options.operation_timeout,
        })?
        .map_err(|e| lost(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let codec = PulsarCodec::new(options.max_frame_size);
        let mut reader = FramedRead::new(read, codec);
        let mut writer = FramedWrite::new(write, codec);
        let connect = command(Type::Connect, |c| {
            c.connect = Some(pb::CommandConnect {
                client_version: concat!("pulsar-wire-rust/", env!("CARGO_PKG_VERSION")).into(),
                auth_data: options.auth_token.as_ref().map(|t| t.clone().into_bytes()),
                protocol_version: Some(PROTOCOL_VERSION),
                auth_method_name: options.auth_token.as_ref().map(|_| "token".into()),
                proxy_to_broker_url: None,
                feature_flags: Some(pb::FeatureFlags {
                    supports_auth_refresh: Some(false),
                    supports_broker_entry_metadata: Some(true),
                    supports_partial_producer: Some(false),
                    supports_topic_watchers: Some(false),
                }),
            });
        });
        writer.send(Frame::command(connect)).await?;
        let answer = tokio::time::timeout(options.operation_timeout, reader.next())
            .await
            .map_err(|_| Error::Timeout {
                operation: "CONNECT",
                after: options.operation_timeout,
            })?
            .ok_or_else(|| lost("closed during the handshake".into()))??;
        let connected = match Type::try_from(answer.command.r#type) {
            Ok(Type::Connected) => answer.command.connected.unwrap_or_default(),
            Ok(Type::Error) => {
                let e = answer.command.error.unwrap_or_default();
                return Err(Error::Server {
                    operation: "CONNECT",
                    code: e.error,
                    message: e.message,
                });
            }
            _ => {
                return Err(lost(format!(
                    "unexpected answer to CONNECT: type {}",
                    answer.command.r#type
                )));
            }
        };
        let (outbound, rx) = mpsc::unbounded_channel();
        let closed = CancellationToken::new();
        let shared = Arc::new(Shared {
            address: options.address.clone(),
            timeout: options.operation_timeout,
            outbound,
            next_id: AtomicU64::new(1),
            requests: Mutex::new(HashMap::new()),
            sends: Mutex::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            closed: closed.clone(),
            lost: Mutex::new(None),
            frames_sent: AtomicU64::new(1),
            frames_received: AtomicU64::new(1),
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

    /// Writes a frame that expects no answer.
    ///
    /// # Errors
    /// When the connection is closed or lost.
    pub fn send(&self, frame: Frame) -> Result<(), Error> {
        self.check_open()?;
        self.shared
            .outbound
            .send(frame)
            .map_err(|_| Error::Closed("the connection"))
    }

    /// Sends a request built with a fresh request id and waits for its answer. An `ERROR`
    /// answer becomes [`Error::Server`].
    ///
    /// # Errors
    /// [`Error::Server`], [`Error::Timeout`], or [`Error::ConnectionLost`] when the connection
    /// goes away first.
    pub async fn request(
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

    /// Sends a `SEND` frame and waits for its receipt.
    ///
    /// # Errors
    /// [`Error::Server`] for `SEND_ERROR`; [`Error::Timeout`]; [`Error::ConnectionLost`].
    pub async fn send_message(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: Frame,
    ) -> Result<pb::MessageIdData, Error> {
        self.start_send(producer_id, sequence_id, frame)?.await
    }

    /// Writes a `SEND` frame now and returns the wait for its receipt: frames written one
    /// after another go out in that order, whenever their receipts are awaited.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the frame cannot be written; the returned wait fails as
    /// [`Connection::send_message`].
    pub fn start_send(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: Frame,
    ) -> Result<impl Future<Output = Result<pb::MessageIdData, Error>> + Send + '_, Error> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .sends
            .lock()
            .insert((producer_id, sequence_id), tx);
        if let Err(error) = self.send(frame) {
            self.shared.sends.lock().remove(&(producer_id, sequence_id));
            return Err(error);
        }
        Ok(self.receipt(producer_id, sequence_id, rx))
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
                })
            }
            Ok(Err(_)) => Err(self.lost_error()),
            Ok(Ok(result)) => result,
        }
    }

    /// Routes frames pushed to `consumer_id` (messages, close, end of topic) to the returned
    /// receiver.
    pub fn register_consumer(&self, consumer_id: u64) -> mpsc::UnboundedReceiver<ConsumerEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.consumers.lock().insert(consumer_id, tx);
        rx
    }

    /// Stops routing frames to `consumer_id`.
    pub fn unregister_consumer(&self, consumer_id: u64) {
        self.shared.consumers.lock().remove(&consumer_id);
    }

    /// Looks a topic up; returns the broker URL to use (`None` when this connection's broker
    /// serves it or the lookup says to go through the service URL).
    ///
    /// # Errors
    /// As [`Connection::request`].
    pub async fn lookup(&self, topic: &str) -> Result<Option<String>, Error> {
        let answer = self
            .request("LOOKUP", |request_id| {
                Frame::command(command(Type::Lookup, |c| {
                    c.lookup_topic = Some(pb::CommandLookupTopic {
                        topic: topic.to_owned(),
                        request_id,
                        authoritative: Some(false),
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
        if response.proxy_through_service_url() {
            return Ok(None);
        }
        Ok(response
            .broker_service_url
            .filter(|url| parse_service_url(url).ok().as_deref() != Some(self.address())))
    }

    /// The number of partitions of a topic (0 when it is not partitioned).
    ///
    /// # Errors
    /// As [`Connection::request`].
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

    /// Closes the connection; pending requests fail with [`Error::Closed`].
    pub fn close(&self) {
        self.shared.closed.cancel();
    }

    /// Whether the connection is closed or lost.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    fn lost_error(&self) -> Error {
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
}

async fn write_loop(
    shared: Arc<Shared>,
    mut writer: FramedWrite<tokio::net::tcp::OwnedWriteHalf, PulsarCodec>,
    mut rx: mpsc::UnboundedReceiver<Frame>,
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
    mut reader: FramedRead<tokio::net::tcp::OwnedReadHalf, PulsarCodec>,
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
                if idle_probes > 2 {
                    break format!("no answer to keep-alive pings for {:?}", keep_alive * 2);
                }
                let _ = shared
                    .outbound
                    .send(Frame::command(command(Type::Ping, |c| {
                        c.ping = Some(pb::CommandPing {});
                    })));
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
fn route(shared: &Shared, frame: Frame) {
    let c = &frame.command;
    match Type::try_from(c.r#type) {
        Ok(Type::Ping) => {
            let _ = shared
                .outbound
                .send(Frame::command(command(Type::Pong, |c| {
                    c.pong = Some(pb::CommandPong {});
                })));
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
            let id = c.close_consumer.as_ref().map(|m| m.consumer_id);
            if let Some(tx) = id.and_then(|id| shared.consumers.lock().remove(&id)) {
                let _ = tx.send(ConsumerEvent::Closed);
            }
        }
        Ok(Type::ReachedEndOfTopic) => {
            let id = c.reached_end_of_topic.as_ref().map(|m| m.consumer_id);
            if let Some(tx) = id.and_then(|id| shared.consumers.lock().get(&id).cloned()) {
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

/// Fails every pending request, send and consumer: the connection is gone.
fn fail_all(shared: &Shared, reason: String) {
    let error = Error::ConnectionLost {
        addr: shared.address.clone(),
        reason,
    };
    {
        let mut lost = shared.lost.lock();
        if lost.is_none() {
            *lost = Some(error.clone());
        }
    }
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

/// Builds a command frame of `type`, letting `fill` set its member.
pub fn command_frame(r#type: Type, fill: impl FnOnce(&mut BaseCommand)) -> Frame {
    Frame::command(command(r#type, fill))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls() {
        assert_eq!(
            parse_service_url("pulsar://127.0.0.1:6650").unwrap(),
            "127.0.0.1:6650"
        );
        assert_eq!(
            parse_service_url("localhost:6650/").unwrap(),
            "localhost:6650"
        );
        for bad in [
            "http://x:1",
            "pulsar+ssl://x:6651",
            "pulsar://x",
            "x:0",
            ":6650",
            "",
        ] {
            assert!(parse_service_url(bad).is_err(), "{bad}");
        }
    }
}
