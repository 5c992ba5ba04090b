//! A Pulsar binary-protocol adapter whose acknowledgements are always right.
//!
//! Work in progress: the frame codec and batch format are here; connection, producer,
//! consumer, transactions and the emulator follow.
//!
//! # Feature flags
//! - `emulator` (off by default): an embedded broker on 127.0.0.1 speaking the same protocol,
//!   with the 4.0.x unacked accounting, transactions, stats and fault injection, for examples
//!   and tests.

mod batch;
mod codec;
mod connection;
mod error;

#[cfg(feature = "emulator")]
pub mod emulator;

pub use batch::{BatchedMessage, MAX_BATCH_MESSAGES, decode_batch, encode_batch};
pub use codec::{
    DEFAULT_MAX_FRAME_SIZE, Frame, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C, Payload, PulsarCodec,
    decode_frame, encode_frame,
};
pub use connection::{ConnectOptions, Connection, ConsumerEvent, PROTOCOL_VERSION, command_frame};
pub use error::Error;

/// Generated protocol types (`pulsar.proto`).
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms
)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/pulsar.proto.rs"));
}
