//! Feeds arbitrary bytes to `PulsarCodec::decode` as a connection would: in chunks, decoding
//! after each one, until the codec fails. Every frame it accepts must re-encode to bytes that
//! decode to the same frame, and its payload is split as a batch, as a consumer would.
//!
//! Input: `[limit selector][chunk size][stream…]`.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pulsar_wire::wire::{DEFAULT_MAX_FRAME_SIZE, Frame, PulsarCodec, decode_batch, encode_frame};
use tokio_util::codec::Decoder;

/// What re-encoding keeps of a decoded frame: the checksum is recomputed and the broker entry
/// metadata is not sent.
fn as_sent(mut frame: Frame) -> Frame {
    if let Some(payload) = &mut frame.payload {
        payload.checksum_ok = true;
        payload.broker_entry = None;
    }
    frame
}

fuzz_target!(|data: &[u8]| {
    let [limit, chunk, stream @ ..] = data else {
        return;
    };
    let max = match limit % 4 {
        0 => DEFAULT_MAX_FRAME_SIZE,
        1 => 64,
        2 => 1024,
        _ => 1 << 16,
    };
    let chunk = usize::from(*chunk) + 1;
    let mut codec = PulsarCodec::new(max);
    let mut buf = BytesMut::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            let capacity_before = buf.capacity();
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(buf.len() < before, "a decoded frame consumed no bytes");
                    if let Some(payload) = &frame.payload {
                        let _ = decode_batch(&payload.metadata, payload.data.clone());
                    }
                    let frame = as_sent(frame);
                    let mut again = BytesMut::new();
                    encode_frame(&frame, &mut again);
                    let decoded = PulsarCodec::default().decode(&mut again);
                    assert_eq!(decoded.ok().flatten().as_ref(), Some(&frame));
                    assert!(again.is_empty());
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "an incomplete frame consumed bytes");
                    // Room is reserved for the announced frame only, which is within the
                    // limit (slack for `BytesMut`'s own growth policy).
                    let bound = (4 + max).max(1 << 17) + 2 * stream.len();
                    assert!(
                        buf.capacity() <= bound.max(2 * capacity_before),
                        "reserved {} bytes (limit {max})",
                        buf.capacity()
                    );
                    break;
                }
                Err(_) => return,
            }
        }
    }
});
