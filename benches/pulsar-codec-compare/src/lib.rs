//! The same frames for both codecs: pulsar-wire builds and encodes them, and the `pulsar`
//! crate's codec decodes those bytes into its own `Message`, which it re-encodes to the very
//! same bytes (checked by [`same_frames`]).

use bytes::{Bytes, BytesMut};
use pulsar::message::{Codec, Message};
use pulsar_wire::{Frame, PulsarCodec};
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
    Ok(SameFrame {
        wire: frame,
        pulsar,
        bytes,
    })
}
