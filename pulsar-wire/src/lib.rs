//! A Pulsar binary-protocol adapter whose acknowledgements are always right.
//!
//! Work in progress: the frame codec and batch format are here; connection, producer,
//! consumer, transactions and the emulator follow.

mod batch;
mod codec;
mod connection;
mod error;

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
