//! The same frames for both codecs: pulsar-wire builds and encodes them, and the `pulsar`
//! crate's codec decodes those bytes into its own `Message`, which it re-encodes to the very
//! same bytes (checked by [`same_frames`]).
//!
//! [`compression`]: what `pulsar` does to compress and decompress payloads, for the compression
//! comparison.

pub mod compression;

// The frames of pulsar-wire's codec benchmark; only the `MESSAGE` command and its entry
// metadata are used here.
#[allow(dead_code)]
#[path = "../../benches/frames/mod.rs"]
mod frames;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;
use pulsar::message::{Codec, Message};
use pulsar_wire::pb::{BaseCommand, BrokerEntryMetadata, MessageMetadata};
use pulsar_wire::wire::{
    DEFAULT_MAX_FRAME_SIZE, Frame, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C, Payload, PulsarCodec,
};
use tokio_util::codec::{Decoder, Encoder};

/// One frame in both crates' types, and its wire bytes.
#[derive(Debug, Clone)]
pub struct SameFrame {
    /// pulsar-wire's frame.
    pub wire: Frame,
    /// The `pulsar` crate's message for the same bytes.
    pub pulsar: Message,
    /// The bytes (length prefix included).
    pub bytes: Bytes,
}

/// Converts `frame` by way of its bytes, and checks that both codecs agree on them: each
/// decodes the bytes, and each encodes its frame to exactly these bytes.
pub fn same_frames(frame: Frame) -> Result<SameFrame, String> {
    let mut encoded = BytesMut::new();
    PulsarCodec::default()
        .encode(frame.clone(), &mut encoded)
        .map_err(|e| format!("pulsar-wire does not encode the frame: {e}"))?;
    let bytes = encoded.freeze();

    let mut src = BytesMut::from(&bytes[..]);
    let pulsar = Codec
        .decode(&mut src)
        .map_err(|e| format!("pulsar does not decode pulsar-wire's bytes: {e}"))?
        .ok_or("pulsar wants more bytes")?;
    if !src.is_empty() {
        return Err(format!("pulsar left {} bytes undecoded", src.len()));
    }
    let mut again = BytesMut::new();
    Codec
        .encode(pulsar.clone(), &mut again)
        .map_err(|e| format!("pulsar does not encode its message: {e}"))?;
    if again[..] != bytes[..] {
        return Err("pulsar encodes the same message to different bytes".into());
    }
    let mut src = BytesMut::from(&bytes[..]);
    let decoded = PulsarCodec::default()
        .decode(&mut src)
        .map_err(|e| format!("pulsar-wire does not decode its bytes: {e}"))?;
    if decoded.as_ref() != Some(&frame) {
        return Err("pulsar-wire decodes a different frame".into());
    }
    let mut backpatched = BytesMut::new();
    encode_frame_backpatched(&frame, &mut backpatched);
    if backpatched[..] != bytes[..] {
        return Err("the back-patching variant encodes different bytes".into());
    }
    let mut src = BytesMut::from(&bytes[..]);
    if decode_sliced(&mut src)?.as_ref() != Some(&frame) {
        return Err("the slice-decoding variant decodes a different frame".into());
    }
    Ok(SameFrame {
        wire: frame,
        pulsar,
        bytes,
    })
}

/// A variant of `pulsar_wire::wire::encode_frame`, measured as a suggested change (it is not in
/// pulsar-wire): the size fields are written after prost encodes and back-patched, instead of
/// calling `encoded_len()` first. prost's `Message::encode` walks the message for its length
/// anyway, so this saves one whole walk of the command (1,000 ids for an `ACK`). Same bytes.
pub fn encode_frame_backpatched(frame: &Frame, dst: &mut BytesMut) {
    let start = dst.len();
    dst.put_u64(0);
    // `BytesMut` grows as needed: encoding into it cannot fail.
    let _ = frame.command.encode(dst);
    let command_size = (dst.len() - start - 8) as u32;
    if let Some(payload) = &frame.payload {
        dst.put_u16(MAGIC_CRC32C);
        let checksum_at = dst.len();
        dst.put_u32(0);
        let covered_from = dst.len();
        dst.put_u32(0);
        let _ = payload.metadata.encode(dst);
        let metadata_size = (dst.len() - covered_from - 4) as u32;
        dst[covered_from..covered_from + 4].copy_from_slice(&metadata_size.to_be_bytes());
        dst.put_slice(&payload.data);
        let crc = crc32c::crc32c(&dst[covered_from..]);
        dst[checksum_at..checksum_at + 4].copy_from_slice(&crc.to_be_bytes());
    }
    let total = (dst.len() - start - 4) as u32;
    dst[start..start + 4].copy_from_slice(&total.to_be_bytes());
    dst[start + 4..start + 8].copy_from_slice(&command_size.to_be_bytes());
}

/// A variant of `PulsarCodec::decode` + `pulsar_wire::wire::decode_frame`, measured as a suggested
/// change (it is not in pulsar-wire): prost decodes the command, the broker entry metadata and
/// the message metadata from `&[u8]` slices of the frame instead of from `Bytes` handles. The
/// generated types own their strings and byte fields (`String`, `Vec<u8>`), so a `Bytes` source
/// saves no copy, and prost's reads through `Buf for Bytes` cost more than through `&[u8]`.
/// Same checks and results as pulsar-wire's decoder (errors as strings here).
pub fn decode_sliced(src: &mut BytesMut) -> Result<Option<Frame>, String> {
    if src.len() < 4 {
        return Ok(None);
    }
    let total = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
    if total > DEFAULT_MAX_FRAME_SIZE {
        return Err(format!("a frame of {total} bytes is too large"));
    }
    if src.len() < 4 + total {
        src.reserve(4 + total - src.len());
        return Ok(None);
    }
    src.advance(4);
    let frame = src.split_to(total).freeze();
    let at = |offset: usize, len: usize, what: &str| {
        frame
            .get(offset..offset.checked_add(len).ok_or("overflow")?)
            .ok_or_else(|| format!("truncated in the {what}"))
    };
    let u32_at = |offset: usize, what: &str| {
        at(offset, 4, what).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
    };
    let command_size = u32_at(0, "command size")?;
    let command = BaseCommand::decode(at(4, command_size, "command")?)
        .map_err(|e| format!("the command does not decode: {e}"))?;
    let mut offset = 4 + command_size;
    if offset == frame.len() {
        return Ok(Some(Frame::command(command)));
    }
    let mut broker_entry = None;
    if frame.get(offset..offset + 2) == Some(&MAGIC_BROKER_ENTRY_METADATA.to_be_bytes()[..]) {
        let size = u32_at(offset + 2, "broker entry metadata size")?;
        broker_entry = Some(
            BrokerEntryMetadata::decode(at(offset + 6, size, "broker entry metadata")?)
                .map_err(|e| format!("the broker entry metadata does not decode: {e}"))?,
        );
        offset += 6 + size;
    }
    if at(offset, 2, "magic number")? != MAGIC_CRC32C.to_be_bytes() {
        return Err("wrong magic number".into());
    }
    let expected = u32_at(offset + 2, "checksum")? as u32;
    let covered = offset + 6;
    let checksum_ok = crc32c::crc32c(&frame[covered.min(frame.len())..]) == expected;
    let metadata_size = u32_at(covered, "metadata size")?;
    let metadata = MessageMetadata::decode(at(covered + 4, metadata_size, "metadata")?)
        .map_err(|e| format!("the message metadata does not decode: {e}"))?;
    Ok(Some(Frame {
        command,
        payload: Some(Payload {
            metadata,
            data: frame.slice(covered + 4 + metadata_size..),
            checksum_ok,
            broker_entry,
        }),
    }))
}
