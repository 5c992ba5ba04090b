//! A RocketMQ 5 gRPC client adapter whose acknowledgements are batched with `ack-batcher`.
//!
//! Every official RocketMQ 5 client sends one `AckMessage` RPC per consumed message although
//! the request carries repeated entries and the proxy answers per entry. This crate batches
//! acks per (endpoint, topic), maps the proxy's answer back to each message by id, retries what
//! failed one message at a time, and never blocks one ack behind another.
//!
//! - [`Session`]: connections, the headers the proxy reads and HMAC-SHA1 request signing.
//! - [`Producer`]: sends normal and FIFO messages.
//! - [`PushConsumer`]: receives from every assigned queue, runs a [`MessageHandler`] with
//!   bounded concurrency (FIFO messages in order), acknowledges through `ack-batcher` keyed by
//!   (endpoint, topic) — FIFO and late messages at once — and nacks failures with
//!   `ChangeInvisibleDuration`.
//! - [`AckFlusher`]: the `ack-batcher` transport that sends one `AckMessage` per batch, with
//!   [`map_ack_response`] applying the proxy's result rules.
//!
//! # Feature flags
//! - `emulator` (off by default): an embedded in-memory proxy emulator for examples and tests.
//! - `tls` (off by default): TLS connections to the proxy.

mod ack;
mod consumer;
#[cfg(feature = "emulator")]
pub mod emulator;
mod error;
mod message;
mod producer;
mod session;

pub use ack::{AckEntry, AckFlusher, AckKey, is_invalid_receipt_handle, map_ack_response};
pub use consumer::{
    AckObserver, AckSettings, ConsumeResult, ConsumerStats, MessageHandler, PushConsumer,
    PushConsumerBuilder, ShutdownReport,
};
pub use error::Error;
pub use message::{OutgoingMessage, ReceivedMessage};
pub use producer::{DEFAULT_MAX_BODY, Producer, SendReceipt};
pub use session::{
    ClientConfig, Credentials, DEFAULT_MAX_MESSAGE_SIZE, Endpoint, MESSAGE_OVERHEAD,
    PROXY_MAX_INBOUND, Session, sign,
};

/// Generated protocol types and the `MessagingService` client and server.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]
pub mod pb {
    tonic::include_proto!("apache.rocketmq.v2");
}
