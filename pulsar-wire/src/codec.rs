//! Frames: the length-prefixed commands and the checksummed payload frames, as a `tokio-util`
//! codec.
//!
//! ```text
//! simple:  [u32 total][u32 cmd size][BaseCommand]
//! payload: [u32 total][u32 cmd size][BaseCommand]
//!          ([u16 0x0e02][u32 size][BrokerEntryMetadata])?   MESSAGE frames only, skipped
//!          [u16 0x0e01][u32 CRC32C][u32 meta size][MessageMetadata][payload]
//! ```
//! All integers are big-endian; `total` counts every byte after itself; the CRC32C covers
//! everything after the checksum field.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

use crate::Error;
use crate::pb::{BaseCommand, BrokerEntryMetadata, MessageMetadata};

/// The checksummed-payload magic number.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// The broker-entry-metadata magic number.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;
/// The default largest frame: the broker's default `max_message_size` (5 MiB) plus 10 KiB.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 5 * 1024 * 1024 + 10 * 1024;

/// The payload part of a `SEND` or `MESSAGE` frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// The message (or batch) metadata.
    pub metadata: MessageMetadata,
    /// The payload bytes (a single message, or a batch of them).
    pub data: Bytes,
    /// Whether the CRC32C matched (always true for frames this process built).
    pub checksum_ok: bool,
    /// The broker entry metadata, when the broker exposed it.
    pub broker_entry: Option<BrokerEntryMetadata>,
}

/// One frame: a command, with a payload for `SEND` and `MESSAGE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The command.
    pub command: BaseCommand,
    /// The payload, for payload frames.
    pub payload: Option<Payload>,
}

impl Frame {
    /// A frame without payload.
    pub fn command(command: BaseCommand) -> Self {
        Self {
            command,
            payload: None,
        }
    }

    /// A payload frame.
    pub fn with_payload(command: BaseCommand, metadata: MessageMetadata, data: Bytes) -> Self {
        Self {
            command,
            payload: Some(Payload {
                metadata,
                data,
                checksum_ok: true,
                broker_entry: None,
            }),
        }
    }
}

/// Encodes and decodes [`Frame`]s, refusing frames above a size limit before allocating.
#[derive(Debug, Clone, Copy)]
pub struct PulsarCodec {
    max_frame_size: usize,
}

impl Default for PulsarCodec {
    fn default() -> Self {
        Self {
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
        }
    }
}

impl PulsarCodec {
    /// A codec that refuses frames larger than `max_frame_size` bytes.
    pub fn new(max_frame_size: usize) -> Self {
        Self { max_frame_size }
    }

    /// The size limit.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }
}

fn read_u32(buf: &mut Bytes, what: &str) -> Result<usize, Error> {
    if buf.remaining() < 4 {
        return Err(Error::malformed(format!("truncated before the {what}")));
    }
    Ok(buf.get_u32() as usize)
}

fn take(buf: &mut Bytes, len: usize, what: &str) -> Result<Bytes, Error> {
    if buf.remaining() < len {
        return Err(Error::malformed(format!(
            "the {what} claims {len} bytes but only {} remain",
            buf.remaining()
        )));
    }
    Ok(buf.split_to(len))
}

/// Decodes the body of one frame (everything after the total size).
pub fn decode_frame(mut frame: Bytes) -> Result<Frame, Error> {
    let command_size = read_u32(&mut frame, "command size")?;
    let command = take(&mut frame, command_size, "command")?;
    let command = BaseCommand::decode(command)
        .map_err(|e| Error::malformed(format!("the command does not decode: {e}")))?;
    if !frame.has_remaining() {
        return Ok(Frame::command(command));
    }
    let mut broker_entry = None;
    if frame.remaining() >= 2 && frame[..2] == MAGIC_BROKER_ENTRY_METADATA.to_be_bytes() {
        frame.advance(2);
        let size = read_u32(&mut frame, "broker entry metadata size")?;
        let bytes = take(&mut frame, size, "broker entry metadata")?;
        broker_entry = Some(BrokerEntryMetadata::decode(bytes).map_err(|e| {
            Error::malformed(format!("the broker entry metadata does not decode: {e}"))
        })?);
    }
    if frame.remaining() < 2 {
        return Err(Error::malformed("truncated before the magic number"));
    }
    let magic = frame.get_u16();
    if magic != MAGIC_CRC32C {
        return Err(Error::malformed(format!(
            "wrong magic number {magic:#06x} (expected {MAGIC_CRC32C:#06x})"
        )));
    }
    let expected = read_u32(&mut frame, "checksum")? as u32;
    let checksum_ok = crc32c(&[&frame]) == expected;
    let metadata_size = read_u32(&mut frame, "metadata size")?;
    let metadata = take(&mut frame, metadata_size, "metadata")?;
    let metadata = MessageMetadata::decode(metadata)
        .map_err(|e| Error::malformed(format!("the message metadata does not decode: {e}")))?;
    Ok(Frame {
        command,
        payload: Some(Payload {
            metadata,
            data: frame,
            checksum_ok,
            broker_entry,
        }),
    })
}

impl Decoder for PulsarCodec {
    type Item = Frame;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Error> {
        if src.len() < 4 {
            return Ok(None);
        }
        if src.starts_with(b"HTTP") {
            // An HTTP server answered the CONNECT (its "HTTP/1.1 400" reads as a huge size).
            return Err(Error::malformed(
                "the server answered in HTTP: this is not a Pulsar binary-protocol port (the \
                 broker's admin port is HTTP; use its binary port, 6650 by default, or 6651 \
                 for TLS)",
            ));
        }
        let total = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if total > self.max_frame_size {
            return Err(Error::FrameTooLarge {
                size: total,
                max: self.max_frame_size,
            });
        }
        if src.len() < 4 + total {
            src.reserve(4 + total - src.len());
            return Ok(None);
        }
        src.advance(4);
        let frame = src.split_to(total).freeze();
        decode_frame(frame).map(Some)
    }
}

/// Appends one encoded frame to `dst`.
///
/// The sizes are written as placeholders and filled in once the command and metadata are
/// encoded, so that prost walks each message once.
pub fn encode_frame(frame: &Frame, dst: &mut BytesMut) {
    encode_frame_head(frame, None, dst);
    if let Some(payload) = &frame.payload {
        dst.put_slice(&payload.data);
    }
}

/// A frame on its way to the broker, with its payload's checksum when the producer computed
/// it as it built the payload (while the bytes were in cache): the writer then reads the
/// data only to send it.
#[derive(Debug, Clone)]
pub(crate) struct OutgoingFrame {
    /// The frame.
    pub(crate) frame: Frame,
    /// [`payload_checksum`] of the frame's payload, when known.
    pub(crate) checksum: Option<u32>,
}

impl From<Frame> for OutgoingFrame {
    fn from(frame: Frame) -> Self {
        Self {
            frame,
            checksum: None,
        }
    }
}

/// The CRC32C a frame carries for a payload of `metadata` and `data`: over the metadata's
/// size, the metadata and the data.
pub(crate) fn payload_checksum(metadata: &MessageMetadata, data: &[u8]) -> u32 {
    let mut head = BytesMut::with_capacity(4 + metadata.encoded_len());
    put_metadata(metadata, &mut head);
    crc32c(&[&head, data])
}

/// The CRC32C (Castagnoli, the frame's checksum) of `parts`, one after the other.
fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for part in parts {
        digest.update(part);
    }
    // CRC-32 parameters: the state is 32 bits wide.
    digest.finalize() as u32
}

/// Appends `metadata`'s size, then `metadata`.
fn put_metadata(metadata: &MessageMetadata, dst: &mut BytesMut) {
    dst.put_u32(metadata.encoded_len() as u32);
    // Encoding into a growable BytesMut cannot fail.
    let _ = metadata.encode(dst);
}

/// Appends one encoded frame to `dst` but for its payload's data, which the caller writes
/// right after: the sizes and the checksum already count it (`checksum`, the payload's
/// [`payload_checksum`], when given). A writer that can send several buffers at once sends a
/// batch's data from where it is, without a copy.
pub(crate) fn encode_frame_head(frame: &Frame, checksum: Option<u32>, dst: &mut BytesMut) {
    let start = dst.len();
    dst.put_u32(0); // total size
    dst.put_u32(0); // command size
    // Encoding into a growable BytesMut cannot fail.
    let _ = frame.command.encode(dst);
    let command_size = dst.len() - start - 8;
    put_u32_at(dst, start + 4, command_size);
    let mut data_len = 0;
    if let Some(payload) = &frame.payload {
        dst.put_u16(MAGIC_CRC32C);
        let checksum_at = dst.len();
        dst.put_u32(0);
        let covered_from = dst.len();
        put_metadata(&payload.metadata, dst);
        let computed = || crc32c(&[&dst[covered_from..], &payload.data]);
        debug_assert!(checksum.is_none_or(|given| given == computed()));
        let crc = checksum.unwrap_or_else(computed);
        dst[checksum_at..checksum_at + 4].copy_from_slice(&crc.to_be_bytes());
        data_len = payload.data.len();
    }
    let total = dst.len() - start - 4 + data_len;
    put_u32_at(dst, start, total);
}

/// Overwrites four bytes at `at` with `value` (big-endian).
fn put_u32_at(dst: &mut BytesMut, at: usize, value: usize) {
    dst[at..at + 4].copy_from_slice(&(value as u32).to_be_bytes());
}

impl Encoder<Frame> for PulsarCodec {
    type Error = Error;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), Error> {
        let start = dst.len();
        encode_frame(&frame, dst);
        let size = dst.len() - start - 4;
        if size > self.max_frame_size {
            dst.truncate(start);
            return Err(Error::FrameTooLarge {
                size,
                max: self.max_frame_size,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::base_command::Type;
    use crate::pb::{CommandPing, CommandSend};

    #[test]
    fn the_checksum_is_crc32c_of_the_parts_joined() {
        // The catalogue's check value of CRC-32/ISCSI.
        assert_eq!(crc32c(&[b"123456789"]), 0xe306_9283);
        assert_eq!(crc32c(&[b"1234", b"", b"56789"]), 0xe306_9283);
    }

    proptest::proptest! {
        /// Against an independent implementation (`crc32c`), at lengths around the SIMD
        /// paths' block sizes and split anywhere.
        #[test]
        fn the_checksum_agrees_with_an_independent_crc32c(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..5000),
            split in 0usize..5000,
        ) {
            let split = split.min(data.len());
            let (head, tail) = data.split_at(split);
            proptest::prop_assert_eq!(crc32c(&[head, tail]), ::crc32c::crc32c(&data));
        }
    }

    fn ping() -> Frame {
        Frame::command(BaseCommand {
            r#type: Type::Ping as i32,
            ping: Some(CommandPing {}),
            ..BaseCommand::default()
        })
    }

    fn send() -> Frame {
        Frame::with_payload(
            BaseCommand {
                r#type: Type::Send as i32,
                send: Some(CommandSend {
                    producer_id: 1,
                    sequence_id: 7,
                    ..CommandSend::default()
                }),
                ..BaseCommand::default()
            },
            MessageMetadata {
                producer_name: "p".into(),
                sequence_id: 7,
                publish_time: 1,
                ..MessageMetadata::default()
            },
            Bytes::from_static(b"hello"),
        )
    }

    fn encoded(frame: &Frame) -> BytesMut {
        let mut buf = BytesMut::new();
        encode_frame(frame, &mut buf);
        buf
    }

    #[test]
    fn frames_round_trip_even_when_split() {
        let mut codec = PulsarCodec::default();
        for frame in [ping(), send()] {
            let bytes = encoded(&frame);
            let mut partial = BytesMut::from(&bytes[..bytes.len() - 1]);
            assert_eq!(codec.decode(&mut partial).unwrap(), None);
            partial.extend_from_slice(&bytes[bytes.len() - 1..]);
            assert_eq!(codec.decode(&mut partial).unwrap(), Some(frame));
            assert!(partial.is_empty());
        }
    }

    #[test]
    fn simple_frame_layout() {
        let bytes = encoded(&ping());
        let command_size = ping().command.encoded_len() as u32;
        assert_eq!(&bytes[..4], (command_size + 4).to_be_bytes());
        assert_eq!(&bytes[4..8], command_size.to_be_bytes());
    }

    #[test]
    fn a_corrupted_payload_is_flagged_not_fatal() {
        let mut bytes = encoded(&send());
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let frame = PulsarCodec::default().decode(&mut bytes).unwrap().unwrap();
        assert!(!frame.payload.unwrap().checksum_ok);
    }

    #[test]
    fn wrong_magic_truncations_and_oversized_frames_are_errors() {
        let mut bytes = encoded(&send());
        let magic_at = 8 + send().command.encoded_len();
        bytes[magic_at] = 0x0f;
        assert!(matches!(
            PulsarCodec::default().decode(&mut bytes),
            Err(Error::MalformedFrame { .. })
        ));
        let mut huge = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(
            PulsarCodec::default().decode(&mut huge),
            Err(Error::FrameTooLarge { .. })
        ));
        // A command size larger than the frame.
        let mut lying = BytesMut::from(&[0, 0, 0, 5, 0, 0, 0, 9, 1][..]);
        assert!(PulsarCodec::default().decode(&mut lying).is_err());
    }

    #[test]
    fn broker_entry_metadata_is_skipped() {
        let frame = send();
        let plain = encoded(&frame);
        let command_end = 8 + frame.command.encoded_len();
        let entry = BrokerEntryMetadata {
            broker_timestamp: Some(5),
            index: Some(9),
        };
        let entry_bytes = entry.encode_to_vec();
        let mut with_entry = BytesMut::new();
        let total = plain.len() - 4 + 6 + entry_bytes.len();
        with_entry.put_u32(total as u32);
        with_entry.put_slice(&plain[4..command_end]);
        with_entry.put_u16(MAGIC_BROKER_ENTRY_METADATA);
        with_entry.put_u32(entry_bytes.len() as u32);
        with_entry.put_slice(&entry_bytes);
        with_entry.put_slice(&plain[command_end..]);
        let decoded = PulsarCodec::default()
            .decode(&mut with_entry)
            .unwrap()
            .unwrap();
        let payload = decoded.payload.unwrap();
        assert!(payload.checksum_ok);
        assert_eq!(payload.broker_entry, Some(entry));
        assert_eq!(&payload.data[..], b"hello");
    }
}
