//! Low-level protocol access, for emulators, benchmarks, fuzzing and protocol tests: the
//! frame codec, batch payloads, commands built by hand, and what a [`Connection`] hands out
//! on the wire. Applications use [`Client`](crate::Client), producers and consumers instead.
//!
//! There is no stability promise here beyond the crate's own version: these items follow the
//! protocol and the crate's internals, and change with them.
//!
//! A [`Connection`]'s raw frames and requests are [`ConnectionExt`]'s methods, and the
//! connection behind a received message is [`ConsumerExt::wire_of`].

use std::future::Future;

use tokio::sync::mpsc;

use crate::pb::{BaseCommand, MessageIdData};
use crate::{Consumer, Error, Message};

pub use crate::batch::{BatchedMessage, decode_batch, decode_batch_with_limit, encode_batch};
pub use crate::codec::{
    DEFAULT_MAX_FRAME_SIZE, Frame, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C, Payload, PulsarCodec,
    decode_frame, encode_frame,
};
pub use crate::compression::decompress_payload;
pub use crate::connection::{
    Connection, ConsumerEvent, LookupAnswer, OUTBOUND_FRAMES, PROTOCOL_VERSION, ProducerGone,
    command_frame,
};

/// The wire value of a codec (`MessageMetadata.compression`).
pub fn compression_type(codec: crate::Compression) -> crate::pb::CompressionType {
    codec.wire()
}

/// The codec of an entry: its metadata's `compression`, read raw (prost's getter would read an
/// unknown code as NONE).
///
/// # Errors
/// [`Error::Invalid`] for a code that is not a codec of the protocol.
pub fn compression_of(metadata: &crate::pb::MessageMetadata) -> Result<crate::Compression, Error> {
    crate::Compression::of(metadata)
}

mod sealed {
    /// Implemented by this crate's types only, so that the traits of [`super`] can grow.
    #[allow(unreachable_pub)]
    pub trait Sealed {}

    impl Sealed for crate::Connection {}
    impl Sealed for crate::Consumer {}
}

/// Frames and requests put on a [`Connection`] as they are: what the producers and consumers
/// of this crate do for you.
pub trait ConnectionExt: sealed::Sealed {
    /// Writes a frame that expects no answer.
    ///
    /// # Errors
    /// When the connection is closed or lost.
    /// The queue of frames to write is bounded ([`OUTBOUND_FRAMES`]): a frame that finds it
    /// full is refused with [`Error::Invalid`].
    fn send(&self, frame: Frame) -> Result<(), Error>;

    /// Sends a request built with a fresh request id and waits for its answer. An `ERROR`
    /// answer becomes [`Error::Server`].
    ///
    /// # Errors
    /// [`Error::Server`], [`Error::Timeout`], or [`Error::ConnectionLost`] when the connection
    /// goes away first.
    fn request<B>(
        &self,
        operation: &'static str,
        build: B,
    ) -> impl Future<Output = Result<BaseCommand, Error>> + Send
    where
        B: FnOnce(u64) -> Frame + Send;

    /// Routes frames pushed to `consumer_id` (messages, close, end of topic) to the returned
    /// receiver. It is not bounded by itself: the consumer's flow permits bound what the
    /// broker sends, and the read loop never waits for one consumer (the others on the
    /// connection would wait too).
    fn register_consumer(&self, consumer_id: u64) -> mpsc::UnboundedReceiver<ConsumerEvent>;

    /// Sends a `SEND` frame of `producer_id` with `sequence_id` and waits for its receipt.
    ///
    /// # Errors
    /// [`Error::Server`] for `SEND_ERROR`; [`Error::Timeout`]; [`Error::ConnectionLost`].
    fn send_message(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: Frame,
    ) -> impl Future<Output = Result<MessageIdData, Error>> + Send;
}

impl ConnectionExt for Connection {
    fn send(&self, frame: Frame) -> Result<(), Error> {
        Connection::send(self, frame)
    }

    fn request<B>(
        &self,
        operation: &'static str,
        build: B,
    ) -> impl Future<Output = Result<BaseCommand, Error>> + Send
    where
        B: FnOnce(u64) -> Frame + Send,
    {
        Connection::request(self, operation, build)
    }

    fn register_consumer(&self, consumer_id: u64) -> mpsc::UnboundedReceiver<ConsumerEvent> {
        Connection::register_consumer(self, consumer_id)
    }

    fn send_message(
        &self,
        producer_id: u64,
        sequence_id: u64,
        frame: Frame,
    ) -> impl Future<Output = Result<MessageIdData, Error>> + Send {
        Connection::send_message(self, producer_id, sequence_id, frame)
    }
}

/// The wire behind a [`Consumer`]'s messages.
pub trait ConsumerExt: sealed::Sealed {
    /// The connection and consumer id behind a message, for sending raw frames
    /// ([`command_frame`]) about it, as tests and tools do.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a message of another consumer.
    fn wire_of(&self, message: &Message) -> Result<(Connection, u64), Error>;
}

impl ConsumerExt for Consumer {
    fn wire_of(&self, message: &Message) -> Result<(Connection, u64), Error> {
        Consumer::wire_of(self, message)
    }
}
