//! Low-level access to the protocol, for emulators, benchmarks and protocol tests.
//!
//! An application needs none of this: [`Producer`](crate::Producer),
//! [`PushConsumer`](crate::PushConsumer) and [`AckFlusher`](crate::AckFlusher) make every RPC
//! themselves. These are the pieces they are built from, for code that speaks the protocol
//! directly: a [`Session`]'s raw gRPC client, requests carrying its headers and signature, the
//! conversions between the crate's types and the wire types of [`crate::pb`], and the mapping of
//! an `AckMessage` answer onto its entries.
//!
//! No stability promise beyond the crate's: these follow the proto subset and the session's
//! internals, and change with them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rocketmq_grpc::{ClientConfig, Session, pb, wire};
//!
//! let session = Session::new(ClientConfig::new("127.0.0.1:8081")?)?;
//! let access = session.config().endpoint().clone();
//! let mut client = wire::client(&session, &access)?;
//! let request = pb::QueryRouteRequest {
//!     topic: Some(wire::resource(&session, "orders")),
//!     endpoints: Some(wire::endpoints(&access)),
//! };
//! let answer = client
//!     .query_route(wire::request(&session, request, Duration::from_secs(3)))
//!     .await?
//!     .into_inner();
//! println!("{} queues", answer.message_queues.len());
//! # Ok(()) }
//! ```

use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use crate::pb;
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::{Endpoint, Error, Session};

pub use crate::ack::map_ack_response;

/// A `MessagingService` client for `endpoint` over `session`'s connection to it (one HTTP/2
/// connection per endpoint, made lazily), with the session's message size limits.
///
/// # Errors
/// [`Error::Unreachable`] if the endpoint cannot form a URI (or, with TLS, a TLS setup).
pub fn client(
    session: &Session,
    endpoint: &Endpoint,
) -> Result<MessagingServiceClient<Channel>, Error> {
    session.client(endpoint)
}

/// Wraps `message` with the headers the proxy reads (`x-mq-client-id` and the others), the
/// signature when the session has credentials, and a deadline of `timeout`.
pub fn request<T>(session: &Session, message: T, timeout: Duration) -> tonic::Request<T> {
    session.request(message, timeout)
}

/// Adds the headers the proxy reads and the signature to `metadata` (for a request built by
/// hand, such as the `Telemetry` stream's).
pub fn stamp(session: &Session, metadata: &mut MetadataMap) {
    session.stamp(metadata);
}

/// A resource (topic or group) in `session`'s namespace.
pub fn resource(session: &Session, name: &str) -> pb::Resource {
    session.resource(name)
}

/// `endpoint` as the protocol's `Endpoints`.
pub fn endpoints(endpoint: &Endpoint) -> pb::Endpoints {
    endpoint.to_pb()
}

/// The first usable address of the protocol's `Endpoints`, if any.
pub fn endpoint(endpoints: &pb::Endpoints) -> Option<Endpoint> {
    Endpoint::from_pb(endpoints)
}
