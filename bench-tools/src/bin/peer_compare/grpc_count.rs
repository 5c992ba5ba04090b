//! A counting HTTP/2 (gRPC) forwarder: every request goes unchanged to the real proxy, and the
//! forwarder counts requests per method and the entries of each `AckMessage` request. It
//! outlives proxy restarts: requests made while the proxy is down are answered `UNAVAILABLE`
//! and counted, so a client's request rate during an outage can be measured.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What went through the forwarder.
#[derive(Debug, Default, Clone)]
pub(crate) struct GrpcCounts {
    /// Requests per gRPC method (the last path segment).
    pub(crate) requests: BTreeMap<String, u64>,
    /// Entries of all `AckMessage` requests.
    pub(crate) ack_entries: u64,
    /// Requests per method answered `UNAVAILABLE` because the proxy could not be reached.
    pub(crate) unavailable: BTreeMap<String, u64>,
}

impl GrpcCounts {
    pub(crate) fn requests_of(&self, method: &str) -> u64 {
        self.requests.get(method).copied().unwrap_or(0)
    }
}

/// Listens on 127.0.0.1 (any port) and forwards every connection to `upstream`.
pub(crate) async fn start(
    upstream: SocketAddr,
) -> std::io::Result<(SocketAddr, Arc<Mutex<GrpcCounts>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let counts = Arc::new(Mutex::new(GrpcCounts::default()));
    let shared = Arc::clone(&counts);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counts = Arc::clone(&shared);
            tokio::spawn(async move {
                if let Err(error) = forward_connection(client, upstream, counts).await {
                    eprintln!("grpc forwarder: a connection ended: {error}");
                }
            });
        }
    });
    Ok((address, counts))
}

async fn forward_connection(
    client: TcpStream,
    upstream: SocketAddr,
    counts: Arc<Mutex<GrpcCounts>>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    client.set_nodelay(true)?;
    let own_port = client.local_addr()?.port();
    let upstream = Arc::new(Upstream {
        address: upstream,
        sender: tokio::sync::Mutex::new(None),
    });
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        handle(
            Arc::clone(&upstream),
            Arc::clone(&counts),
            own_port,
            request,
        )
    });
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(client), service)
        .await?;
    Ok(())
}

/// The proxy side of one client connection, connected on demand: when the proxy restarts,
/// the client's connection to the forwarder stays up, its requests in the meantime are
/// answered `UNAVAILABLE` (and counted), and the next request after the proxy is back
/// connects again.
struct Upstream {
    address: SocketAddr,
    sender: tokio::sync::Mutex<Option<hyper::client::conn::http2::SendRequest<Body>>>,
}

impl Upstream {
    async fn sender(&self) -> Result<hyper::client::conn::http2::SendRequest<Body>, BoxError> {
        let mut sender = self.sender.lock().await;
        if let Some(open) = sender.as_ref().filter(|open| !open.is_closed()) {
            return Ok(open.clone());
        }
        let connect = TcpStream::connect(self.address);
        let server = tokio::time::timeout(std::time::Duration::from_secs(1), connect)
            .await
            .map_err(|_| "connecting to the proxy timed out")??;
        server.set_nodelay(true)?;
        let (open, connection) = hyper::client::conn::http2::handshake::<_, _, Body>(
            TokioExecutor::new(),
            TokioIo::new(server),
        )
        .await?;
        tokio::spawn(connection);
        *sender = Some(open.clone());
        Ok(open)
    }
}

/// A trailers-only gRPC answer `UNAVAILABLE`, as a client gets when it cannot connect.
fn unavailable(reason: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", hyper::header::HeaderValue::from_static("14"));
    if let Ok(message) = hyper::header::HeaderValue::from_str(reason) {
        headers.insert("grpc-message", message);
    }
    response
}

async fn handle(
    upstream: Arc<Upstream>,
    counts: Arc<Mutex<GrpcCounts>>,
    own_port: u16,
    request: Request<Incoming>,
) -> Result<Response<Body>, BoxError> {
    let path = request.uri().path();
    let names_endpoints = if path.ends_with("/QueryRoute") {
        Some(Answer::Route)
    } else if path.ends_with("/QueryAssignment") {
        Some(Answer::Assignment)
    } else {
        None
    };
    let (method, request) = count(request, &counts).await?;
    let sent = match upstream.sender().await {
        Ok(mut sender) => sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    let response = match sent {
        Ok(response) => response,
        Err(reason) => {
            *counts.lock().unavailable.entry(method).or_default() += 1;
            return Ok(unavailable(&format!(
                "the forwarder cannot reach the proxy: {reason}"
            )));
        }
    };
    let Some(answer) = names_endpoints else {
        return Ok(response.map(|body| body.map_err(|e| Box::new(e) as BoxError).boxed()));
    };
    // A proxy in local mode names its own gRPC port in routes and assignments (whatever
    // `useEndpointPortFromRequest` says); name this forwarder's instead, so that receives
    // and acks come through it too.
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(|e| Box::new(e) as BoxError)?;
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    let rewritten = bytes
        .get(5..)
        .and_then(|message| redirect(answer, message, own_port))
        .unwrap_or(bytes);
    let mut frames = vec![Ok(Frame::data(rewritten))];
    frames.extend(trailers.map(|t| Ok(Frame::trailers(t))));
    let body = StreamBody::new(futures_util::stream::iter(frames));
    Ok(Response::from_parts(parts, body.boxed()))
}

/// The answers that name broker endpoints.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Route,
    Assignment,
}

/// The route or assignment answer, gRPC-framed, with its broker endpoints on `port`; `None`
/// if `message` does not decode.
fn redirect(answer: Answer, message: &[u8], port: u16) -> Option<Bytes> {
    use rocketmq_grpc::pb::{MessageQueue, QueryAssignmentResponse, QueryRouteResponse};
    fn retarget<'a>(queues: impl Iterator<Item = &'a mut MessageQueue>, port: u16) {
        let addresses = queues
            .filter_map(|q| q.broker.as_mut()?.endpoints.as_mut())
            .flat_map(|e| e.addresses.iter_mut());
        for address in addresses {
            address.port = i32::from(port);
        }
    }
    let encoded = match answer {
        Answer::Route => {
            let mut route = QueryRouteResponse::decode(message).ok()?;
            retarget(route.message_queues.iter_mut(), port);
            route.encode_to_vec()
        }
        Answer::Assignment => {
            let mut assignment = QueryAssignmentResponse::decode(message).ok()?;
            let queues = assignment.assignments.iter_mut();
            retarget(queues.filter_map(|a| a.message_queue.as_mut()), port);
            assignment.encode_to_vec()
        }
    };
    let mut framed = Vec::with_capacity(5 + encoded.len());
    framed.push(0);
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);
    Some(Bytes::from(framed))
}

/// Counts the request; an `AckMessage` body is read whole (it is one unary message) to count
/// its entries, then forwarded as it was.
async fn count(
    request: Request<Incoming>,
    counts: &Mutex<GrpcCounts>,
) -> Result<(String, Request<Body>), BoxError> {
    let method = request
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_owned();
    *counts.lock().requests.entry(method.clone()).or_default() += 1;
    if method != "AckMessage" {
        let request = request.map(|body| body.map_err(|e| Box::new(e) as BoxError).boxed());
        return Ok((method, request));
    }
    let (parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| Box::new(e) as BoxError)?
        .to_bytes();
    // gRPC framing: 1 byte compression flag, 4 bytes length, then the message.
    if let Some(message) = bytes.get(5..)
        && let Ok(ack) = rocketmq_grpc::pb::AckMessageRequest::decode(message)
    {
        counts.lock().ack_entries += ack.entries.len() as u64;
    }
    let request = Request::from_parts(
        parts,
        Full::new(bytes).map_err(|never| match never {}).boxed(),
    );
    Ok((method, request))
}
