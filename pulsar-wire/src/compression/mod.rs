//! Payload compression: the four codecs of the protocol, each behind a cargo feature.
//!
//! What is compressed is the whole payload after the metadata: a single message's payload,
//! or a batch's whole `[u32 size][SingleMessageMetadata][payload]…` region as one unit. The
//! entry's `MessageMetadata` names the codec (`compression`) and the length before
//! compression (`uncompressed_size`). The formats, as the reference clients write them:
//!
//! | codec | format | feature |
//! |---|---|---|
//! | LZ4 | a raw LZ4 block (no frame); its length is `uncompressed_size` | `lz4` |
//! | ZLIB | a zlib stream (RFC 1950); the Java client ends it with a sync flush, not a final block | `zlib` |
//! | ZSTD | a zstd frame (the Java client compresses at level 3, as [`compress`] does) | `zstd` |
//! | SNAPPY | a raw snappy block (not the framed format) | `snappy` |
//!
//! [`decompress`] guards against decompression bombs: the declared size is checked against a
//! limit before anything is allocated for it, and no output grows beyond the limit.

mod kind;

use bytes::Bytes;

use crate::Error;
use crate::pb::{CompressionType, MessageMetadata};

pub use kind::Compression;

/// The broker's default `max_message_size` (5 MiB): the largest payload a producer may send,
/// and the default limit of a decompressed payload.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 5 * 1024 * 1024;

impl Compression {
    /// The codec of a wire value (`MessageMetadata.compression`).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a value that is no codec of the protocol.
    pub fn from_wire(code: i32) -> Result<Self, Error> {
        match CompressionType::try_from(code) {
            Ok(CompressionType::None) => Ok(Self::None),
            Ok(CompressionType::Lz4) => Ok(Self::Lz4),
            Ok(CompressionType::Zlib) => Ok(Self::Zlib),
            Ok(CompressionType::Zstd) => Ok(Self::Zstd),
            Ok(CompressionType::Snappy) => Ok(Self::Snappy),
            Err(_) => Err(Error::Invalid {
                what: "compression",
                reason: format!(
                    "code {code} is not a codec of the protocol (NONE=0, LZ4=1, ZLIB=2, ZSTD=3, \
                     SNAPPY=4)"
                ),
            }),
        }
    }

    /// The codec of an entry: its metadata's `compression`, read raw (prost's getter would
    /// read an unknown code as NONE).
    ///
    /// # Errors
    /// As [`Compression::from_wire`].
    pub(crate) fn of(metadata: &MessageMetadata) -> Result<Self, Error> {
        metadata.compression.map_or(Ok(Self::None), Self::from_wire)
    }

    /// `Ok` when this build has the codec.
    ///
    /// # Errors
    /// [`Error::CodecDisabled`], naming the feature to enable.
    pub fn ensure_available(self) -> Result<(), Error> {
        match self.feature() {
            Some(feature) if !self.is_available() => Err(Error::CodecDisabled {
                codec: self,
                feature,
            }),
            _ => Ok(()),
        }
    }
}

/// Compresses `data` with `codec` (for [`Compression::None`], a copy).
///
/// # Errors
/// [`Error::CodecDisabled`] for a codec this build lacks; [`Error::Compression`] when the
/// codec fails (an input too large for its format).
pub fn compress(codec: Compression, data: &[u8]) -> Result<Bytes, Error> {
    codec.ensure_available()?;
    #[allow(unused_variables)]
    let failed = |e: &dyn std::fmt::Display| Error::Compression {
        codec,
        reason: format!("cannot compress {} bytes: {e}", data.len()),
    };
    let out: Vec<u8> = match codec {
        Compression::None => data.to_vec(),
        #[cfg(feature = "lz4")]
        Compression::Lz4 => lz4_flex::block::compress(data),
        #[cfg(feature = "zlib")]
        Compression::Zlib => {
            use std::io::Write;
            let mut encoder = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(data.len() / 2 + 64),
                flate2::Compression::default(),
            );
            encoder
                .write_all(data)
                .and_then(|()| encoder.finish())
                .map_err(|e| failed(&e))?
        }
        #[cfg(feature = "zstd")]
        Compression::Zstd => zstd_compress(data).map_err(|e| failed(&e))?,
        #[cfg(feature = "snappy")]
        Compression::Snappy => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| failed(&e))?,
        #[allow(unreachable_patterns)]
        _ => unreachable_codec(codec)?,
    };
    Ok(Bytes::from(out))
}

/// The Java client's ZSTD level.
#[cfg(feature = "zstd")]
const ZSTD_LEVEL: i32 = 3;

// One ZSTD context of each kind per thread, made on the thread's first use and kept: making
// one costs more than compressing or decompressing a small payload (1 KiB of JSON-like text:
// 25 µs with a new context against 5 µs with a kept one to compress, 20 µs against 2 µs to
// decompress; BENCHMARKS-archive.md, "compression against the pulsar crate"). A context is
// about 96 KB to decompress and, at level 3, 42 KB to 1.3 MB to compress depending on the
// largest recent input (the C library shrinks a workspace that stays much too large). A call
// that fails drops its context, so that no error leaves one in an unknown state.
#[cfg(feature = "zstd")]
thread_local! {
    static ZSTD_COMPRESSOR: std::cell::Cell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::Cell::new(None) };
    static ZSTD_DECOMPRESSOR: std::cell::Cell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `f` with this thread's context from `slot` (taken out meanwhile), or with one `make`
/// makes when the thread has none (its first call, or its thread-locals are being destroyed);
/// the context goes back into `slot` if `f` succeeded.
#[cfg(feature = "zstd")]
fn with_zstd_context<C, T>(
    slot: &'static std::thread::LocalKey<std::cell::Cell<Option<C>>>,
    make: impl FnOnce() -> std::io::Result<C>,
    f: impl FnOnce(&mut C) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let mut context = match slot.try_with(std::cell::Cell::take).ok().flatten() {
        Some(context) => context,
        None => make()?,
    };
    let result = f(&mut context);
    if result.is_ok() {
        // Fails only while the thread's locals are destroyed: the context is dropped then.
        let _ = slot.try_with(|cell| cell.set(Some(context)));
    }
    result
}

/// `data` as a zstd frame at [`ZSTD_LEVEL`], with this thread's compression context.
#[cfg(feature = "zstd")]
fn zstd_compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    with_zstd_context(
        &ZSTD_COMPRESSOR,
        || zstd::bulk::Compressor::new(ZSTD_LEVEL),
        |compressor| compressor.compress(data),
    )
}

/// Decompresses `data`, compressed with `codec`, into the `uncompressed_size` bytes the
/// entry declares, refusing to produce more than `max_size` bytes.
///
/// The declared size is checked against `max_size` before anything is allocated for it; the
/// output must have exactly the declared size. Without a declared size (the field is
/// optional in the protocol, although the reference producers always set it), ZLIB, ZSTD and
/// SNAPPY payloads are decompressed up to `max_size` bytes; LZ4 blocks do not record their
/// length and are refused. For [`Compression::None`] the data comes back as it is.
///
/// # Errors
/// [`Error::Compression`] for a missing declared size where the format needs one, a declared
/// size above `max_size`, an output of another size than declared, or corrupt or truncated
/// data; [`Error::CodecDisabled`] for a codec this build lacks. Never panics.
pub fn decompress(
    codec: Compression,
    data: &[u8],
    uncompressed_size: Option<u32>,
    max_size: usize,
) -> Result<Bytes, Error> {
    if codec == Compression::None {
        return Ok(Bytes::copy_from_slice(data));
    }
    codec.ensure_available()?;
    let declared = match uncompressed_size.map(usize::try_from) {
        None => None,
        Some(Ok(size)) if size <= max_size => Some(size),
        Some(_) => {
            return Err(Error::Compression {
                codec,
                reason: format!(
                    "cannot decompress {} bytes: the declared uncompressed_size of {} bytes is \
                     above the limit of {max_size} bytes (the broker's max_message_size unless \
                     the consumer sets another)",
                    data.len(),
                    uncompressed_size.unwrap_or_default()
                ),
            });
        }
    };
    let out = codec_decompress(codec, data, declared, max_size)?;
    if let Some(declared) = declared
        && out.len() != declared
    {
        return Err(Error::Compression {
            codec,
            reason: format!(
                "{} bytes decompressed to {} bytes, not the declared uncompressed_size of \
                 {declared}",
                data.len(),
                out.len()
            ),
        });
    }
    Ok(Bytes::from(out))
}

/// Decompresses an entry's payload as its metadata says (`compression`,
/// `uncompressed_size`), with the limit `max_size`; an uncompressed payload comes back as it
/// is, without a copy.
///
/// # Errors
/// As [`decompress`]; [`Error::Invalid`] for an unknown codec code.
#[cfg_attr(not(feature = "unstable-wire"), allow(unreachable_pub))]
pub fn decompress_payload(
    metadata: &MessageMetadata,
    data: Bytes,
    max_size: usize,
) -> Result<Bytes, Error> {
    match Compression::of(metadata)? {
        Compression::None => Ok(data),
        codec => decompress(codec, &data, metadata.uncompressed_size, max_size),
    }
}

/// The codec's output; `declared` is at most `max_size` when present, and nothing above the
/// larger of the two is allocated.
fn codec_decompress(
    codec: Compression,
    data: &[u8],
    declared: Option<usize>,
    max_size: usize,
) -> Result<Vec<u8>, Error> {
    let failed = |reason: String| Error::Compression {
        codec,
        reason: format!("cannot decompress {} bytes: {reason}", data.len()),
    };
    match codec {
        #[cfg(feature = "lz4")]
        Compression::Lz4 => {
            let declared = declared.ok_or_else(|| {
                failed(
                    "the entry declares no uncompressed_size, which an LZ4 block needs (the \
                     block does not record its length)"
                        .into(),
                )
            })?;
            // At most `declared` bytes, into a buffer that is not zeroed first; a shorter
            // output is refused by the caller.
            lz4_flex::block::decompress(data, declared).map_err(|e| {
                failed(format!(
                    "the LZ4 block is corrupt or does not fit the declared {declared} bytes: {e}"
                ))
            })
        }
        #[cfg(feature = "zlib")]
        Compression::Zlib => inflate(data, declared, max_size).map_err(failed),
        #[cfg(feature = "zstd")]
        Compression::Zstd => {
            // Single-shot decompression into a buffer of the declared size (or of the limit):
            // zstd writes straight into it and needs no window buffer, whatever the frame says.
            let mut out = Vec::new();
            let capacity = declared.unwrap_or(max_size);
            out.try_reserve_exact(capacity)
                .map_err(|e| failed(format!("cannot allocate {capacity} bytes: {e}")))?;
            with_zstd_context(
                &ZSTD_DECOMPRESSOR,
                zstd::bulk::Decompressor::new,
                |decompressor| decompressor.decompress_to_buffer(data, &mut out),
            )
            .map_err(|e| {
                failed(format!(
                    "the ZSTD frame is corrupt, truncated or larger than {capacity} bytes: {e}"
                ))
            })?;
            Ok(out)
        }
        #[cfg(feature = "snappy")]
        Compression::Snappy => {
            let length = snap::raw::decompress_len(data)
                .map_err(|e| failed(format!("the SNAPPY block header is corrupt: {e}")))?;
            let expected = declared.unwrap_or(length);
            if length != expected || length > max_size {
                return Err(failed(format!(
                    "the SNAPPY block says it holds {length} bytes, {}",
                    if length != expected {
                        format!("not the declared uncompressed_size of {expected}")
                    } else {
                        format!("above the limit of {max_size} bytes")
                    }
                )));
            }
            let mut out = vec![0; length];
            let written = snap::raw::Decoder::new()
                .decompress(data, &mut out)
                .map_err(|e| failed(format!("the SNAPPY block is corrupt: {e}")))?;
            out.truncate(written);
            Ok(out)
        }
        #[allow(unreachable_patterns)]
        _ => {
            let _ = (data, declared, max_size, failed);
            unreachable_codec(codec)
        }
    }
}

/// Inflates a zlib stream into `declared` bytes (or, without a declared size, at most
/// `max_size` bytes, the buffer growing as the output does). A stream that stops after a
/// sync flush without a final block (as the Java client writes them) is complete once it
/// produced the declared size.
#[cfg(feature = "zlib")]
fn inflate(data: &[u8], declared: Option<usize>, max_size: usize) -> Result<Vec<u8>, String> {
    use flate2::{Decompress, FlushDecompress, Status};

    let limit = declared.unwrap_or(max_size);
    let mut out = Vec::new();
    let first = declared.unwrap_or_else(|| {
        data.len()
            .saturating_mul(4)
            .clamp(64, limit.max(64))
            .min(limit)
    });
    out.try_reserve_exact(first)
        .map_err(|e| format!("cannot allocate {first} bytes: {e}"))?;
    let mut inflater = Decompress::new(true);
    let rest = |inflater: &Decompress| {
        usize::try_from(inflater.total_in())
            .ok()
            .and_then(|used| data.get(used..))
            .unwrap_or_default()
    };
    let corrupt = |e: flate2::DecompressError, produced: usize| {
        format!("the ZLIB stream is corrupt after {produced} output bytes: {e}")
    };
    let full = loop {
        if out.len() == out.capacity() {
            if out.len() >= limit {
                break true;
            }
            let more = out.len().max(64).min(limit - out.len());
            out.try_reserve_exact(more)
                .map_err(|e| format!("cannot allocate {more} more bytes: {e}"))?;
        }
        let before = (inflater.total_in(), inflater.total_out());
        let status = inflater
            .decompress_vec(rest(&inflater), &mut out, FlushDecompress::None)
            .map_err(|e| corrupt(e, out.len()))?;
        if status == Status::StreamEnd {
            break false;
        }
        if (inflater.total_in(), inflater.total_out()) == before {
            // No progress with room left: the input is used up.
            break false;
        }
    };
    if full {
        // The output reached its size: the stream must not hold more.
        let mut probe = Vec::with_capacity(1);
        inflater
            .decompress_vec(rest(&inflater), &mut probe, FlushDecompress::None)
            .map_err(|e| corrupt(e, out.len()))?;
        if !probe.is_empty() {
            return Err(match declared {
                Some(declared) => format!(
                    "the ZLIB stream holds more than the declared uncompressed_size of \
                     {declared} bytes"
                ),
                None => format!("the ZLIB stream holds more than the limit of {max_size} bytes"),
            });
        }
    }
    if let Some(declared) = declared
        && out.len() < declared
    {
        return Err(format!(
            "the ZLIB stream ends after {} of the declared {declared} bytes (truncated or corrupt)",
            out.len()
        ));
    }
    Ok(out)
}

/// A codec left out of this build; [`Compression::ensure_available`] refuses it before.
#[allow(dead_code)]
fn unreachable_codec<T>(codec: Compression) -> Result<T, Error> {
    Err(Error::CodecDisabled {
        codec,
        feature: codec.feature().unwrap_or("none"),
    })
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use proptest::prelude::*;

    use super::*;

    /// Counts the bytes each thread holds, to show that decompressing allocates no more than
    /// the limit.
    struct Probe;

    thread_local! {
        static LIVE: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    fn grew(bytes: usize) {
        let _ = LIVE.try_with(|live| {
            live.set(live.get().saturating_add(bytes));
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
        });
    }

    fn shrank(bytes: usize) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(bytes)));
    }

    // The one `unsafe` of the crate, in a test build only (the library forbids it): a global
    // allocator must be an `unsafe impl`.
    // SAFETY: every call goes to `System` with the caller's arguments; the counters only
    // observe.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Probe {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller's contract.
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller's contract.
            let ptr = unsafe { System.alloc_zeroed(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as the caller's contract.
            unsafe { System.dealloc(ptr, layout) };
            shrank(layout.size());
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as the caller's contract.
            let new = unsafe { System.realloc(ptr, layout, new_size) };
            if !new.is_null() {
                shrank(layout.size());
                grew(new_size);
            }
            new
        }
    }

    #[global_allocator]
    static PROBE: Probe = Probe;

    /// What `f` returns, and the most bytes this thread held meanwhile beyond what it held
    /// before (the C library behind ZSTD allocates its context outside this count).
    fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let start = LIVE.with(Cell::get);
        PEAK.with(|peak| peak.set(start));
        let out = f();
        (out, PEAK.with(Cell::get).saturating_sub(start))
    }

    /// Room for the codecs' own state (the zlib inflater's window is 32 KiB).
    const STATE: usize = 128 * 1024;

    /// The codecs this build has.
    fn codecs() -> Vec<Compression> {
        Compression::ALL[1..]
            .iter()
            .copied()
            .filter(|c| c.is_available())
            .collect()
    }

    fn text(len: usize) -> Vec<u8> {
        (0..)
            .flat_map(|i: u32| {
                format!("{{\"id\": {i}, \"name\": \"user-{}\"}}, ", i % 97).into_bytes()
            })
            .take(len)
            .collect()
    }

    fn round_trip(codec: Compression, data: &[u8]) -> Bytes {
        let compressed = compress(codec, data).unwrap();
        let size = Some(data.len() as u32);
        decompress(codec, &compressed, size, data.len()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn every_codec_round_trips() {
        for codec in codecs().into_iter().chain([Compression::None]) {
            for len in [0, 1, 13, 1024, 100_000] {
                let data = text(len);
                assert_eq!(round_trip(codec, &data), data, "{codec} {len}");
            }
            let random: Vec<u8> = (0..5000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            assert_eq!(round_trip(codec, &random), random, "{codec} random");
        }
        let data = text(100_000);
        for codec in codecs() {
            let compressed = compress(codec, &data).unwrap();
            assert!(
                compressed.len() < data.len() / 3,
                "{codec}: {} bytes",
                compressed.len()
            );
        }
    }

    /// Hand-made LZ4 block (format: token = literal length << 4 | match length - 4, the
    /// literals, a little-endian offset): "abc", a 9-byte match at offset 3, then the 5
    /// literals the format requires at the end.
    #[cfg(feature = "lz4")]
    #[test]
    fn an_lz4_block_from_the_spec_decodes() {
        let block = [
            0x35, b'a', b'b', b'c', 0x03, 0x00, 0x50, b'x', b'y', b'z', b'w', b'v',
        ];
        let out = decompress(Compression::Lz4, &block, Some(17), 1024).unwrap();
        assert_eq!(&out[..], b"abcabcabcabcxyzwv");
        // The same length declared shorter or longer is refused.
        for wrong in [16, 18] {
            let error = decompress(Compression::Lz4, &block, Some(wrong), 1024).unwrap_err();
            assert!(error.to_string().contains("LZ4"), "{error}");
        }
        // What lz4_flex writes is a plain block too (no size prepended, no frame).
        let data = text(4096);
        let block = lz4_flex::block::compress(&data);
        assert_eq!(
            decompress(Compression::Lz4, &block, Some(4096), 4096).unwrap(),
            data
        );
    }

    /// RFC 1950/1951 by hand: header 78 01, one final stored block ("hello"), Adler-32;
    /// and the same as a non-final stored block ended by a sync flush (an empty stored block),
    /// with no trailer, as the Java client's deflater leaves its streams.
    #[cfg(feature = "zlib")]
    #[test]
    fn zlib_streams_from_the_spec_decode_finished_or_sync_flushed() {
        let finished = [
            0x78, 0x01, 0x01, 0x05, 0x00, 0xfa, 0xff, b'h', b'e', b'l', b'l', b'o', 0x06, 0x2c,
            0x02, 0x15,
        ];
        assert_eq!(
            &decompress(Compression::Zlib, &finished, Some(5), 64).unwrap()[..],
            b"hello"
        );
        let mut bad_adler = finished;
        bad_adler[15] ^= 1;
        assert!(decompress(Compression::Zlib, &bad_adler, Some(5), 64).is_err());
        let flushed = [
            0x78, 0x01, 0x00, 0x05, 0x00, 0xfa, 0xff, b'h', b'e', b'l', b'l', b'o', 0x00, 0x00,
            0x00, 0xff, 0xff,
        ];
        assert_eq!(
            &decompress(Compression::Zlib, &flushed, Some(5), 64).unwrap()[..],
            b"hello"
        );
        assert_eq!(
            &decompress(Compression::Zlib, &flushed, None, 64).unwrap()[..],
            b"hello"
        );
        let error = decompress(Compression::Zlib, &flushed, Some(6), 64).unwrap_err();
        assert!(
            error.to_string().contains("ends after 5 of the declared 6"),
            "{error}"
        );
        let error = decompress(Compression::Zlib, &flushed, Some(4), 64).unwrap_err();
        assert!(
            error.to_string().contains("more than the declared"),
            "{error}"
        );

        // A compressed (not stored) stream written the Java way: sync flush, never finished.
        let data = text(50_000);
        let mut deflater = flate2::Compress::new(flate2::Compression::default(), true);
        let mut stream = Vec::with_capacity(data.len());
        deflater
            .compress_vec(&data, &mut stream, flate2::FlushCompress::Sync)
            .unwrap();
        assert_eq!(deflater.total_in() as usize, data.len());
        assert_eq!(&stream[stream.len() - 4..], [0x00, 0x00, 0xff, 0xff]);
        let out = decompress(
            Compression::Zlib,
            &stream,
            Some(data.len() as u32),
            data.len(),
        );
        assert_eq!(out.unwrap(), data);
    }

    /// The thread's ZSTD contexts, reused, give what fresh ones give, whatever came before:
    /// a larger input, an error, another thread.
    #[cfg(feature = "zstd")]
    #[test]
    fn zstd_contexts_are_reused_safely() {
        let check = || {
            let large = text(200_000);
            let small = text(1000);
            for data in [&large, &small, &large, &small] {
                let compressed = compress(Compression::Zstd, data).unwrap();
                assert_eq!(
                    compressed,
                    zstd::bulk::compress(data, ZSTD_LEVEL).unwrap(),
                    "the same frame as a fresh context's"
                );
                let size = Some(data.len() as u32);
                // A corrupt frame, then a frame cut short, then the good one.
                let mut corrupt = compressed.to_vec();
                let middle = corrupt.len() / 2;
                corrupt[middle] ^= 0xff;
                corrupt[4] ^= 0xff;
                assert!(decompress(Compression::Zstd, &corrupt, size, data.len()).is_err());
                let cut = &compressed[..compressed.len() - 1];
                assert!(decompress(Compression::Zstd, cut, size, data.len()).is_err());
                let back = decompress(Compression::Zstd, &compressed, size, data.len()).unwrap();
                assert_eq!(&back[..], &data[..]);
            }
        };
        check();
        std::thread::spawn(check).join().unwrap();
        check();
    }

    /// RFC 8878 by hand: magic, a single-segment frame header with a 1-byte content size,
    /// and one last block, raw ("hello") or RLE (10 × 'a').
    #[cfg(feature = "zstd")]
    #[test]
    fn zstd_frames_from_the_spec_decode() {
        let raw = [
            0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x05, 0x29, 0x00, 0x00, b'h', b'e', b'l', b'l', b'o',
        ];
        assert_eq!(
            &decompress(Compression::Zstd, &raw, Some(5), 64).unwrap()[..],
            b"hello"
        );
        assert_eq!(
            &decompress(Compression::Zstd, &raw, None, 64).unwrap()[..],
            b"hello"
        );
        let rle = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x0a, 0x53, 0x00, 0x00, b'a'];
        assert_eq!(
            &decompress(Compression::Zstd, &rle, Some(10), 64).unwrap()[..],
            b"aaaaaaaaaa"
        );
        // Declared shorter than the frame's content, or longer.
        assert!(decompress(Compression::Zstd, &rle, Some(9), 64).is_err());
        let error = decompress(Compression::Zstd, &rle, Some(11), 64).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("not the declared uncompressed_size of 11"),
            "{error}"
        );
        // Without a declared size, the limit still holds.
        assert!(decompress(Compression::Zstd, &rle, None, 9).is_err());
    }

    /// The snappy format by hand: the varint length, then a literal tag ((len - 1) << 2)
    /// and its bytes, and a copy with a 1-byte offset ((len - 4) << 2 | 1, offset).
    #[cfg(feature = "snappy")]
    #[test]
    fn snappy_blocks_from_the_spec_decode() {
        let literal = [0x05, 0x10, b'h', b'e', b'l', b'l', b'o'];
        assert_eq!(
            &decompress(Compression::Snappy, &literal, Some(5), 64).unwrap()[..],
            b"hello"
        );
        let copy = [0x0c, 0x08, b'a', b'b', b'c', 0x15, 0x03];
        assert_eq!(
            &decompress(Compression::Snappy, &copy, Some(12), 64).unwrap()[..],
            b"abcabcabcabc"
        );
        assert_eq!(
            &decompress(Compression::Snappy, &copy, None, 64).unwrap()[..],
            b"abcabcabcabc"
        );
        let error = decompress(Compression::Snappy, &copy, Some(11), 64).unwrap_err();
        assert!(error.to_string().contains("holds 12 bytes"), "{error}");
        assert!(decompress(Compression::Snappy, &copy, None, 11).is_err());
        // The framed format (stream identifier chunk) is not what Pulsar sends.
        let framed = [0xff, 0x06, 0x00, 0x00, b's', b'N', b'a', b'P', b'p', b'Y'];
        assert!(decompress(Compression::Snappy, &framed, Some(6), 64).is_err());
    }

    #[test]
    fn corrupt_truncated_and_oversized_inputs_are_errors() {
        let data = text(10_000);
        for codec in codecs() {
            let compressed = compress(codec, &data).unwrap();
            let size = Some(data.len() as u32);
            let truncated = &compressed[..compressed.len() / 2];
            let error = decompress(codec, truncated, size, data.len()).unwrap_err();
            assert!(
                matches!(error, Error::Compression { codec: c, .. } if c == codec),
                "{error}"
            );
            let mut flipped = compressed.to_vec();
            for i in (0..flipped.len()).step_by(7) {
                flipped[i] ^= 0x5a;
            }
            if let Ok(out) = decompress(codec, &flipped, size, data.len()) {
                // A codec without a checksum may decode garbage of the right size; never more.
                assert_eq!(out.len(), data.len(), "{codec}");
            }
            // Declared above the limit: refused before decompressing, with both sizes.
            let (result, peak) = peak_during(|| decompress(codec, &compressed, size, 9_999));
            let error = result.unwrap_err();
            let text = error.to_string();
            assert!(text.starts_with(codec.name()), "{text}");
            assert!(text.contains("10000") && text.contains("9999"), "{text}");
            assert!(peak < 1024, "{codec}: {peak} bytes allocated");
            let huge = decompress(codec, &compressed, Some(u32::MAX), DEFAULT_MAX_MESSAGE_SIZE);
            assert!(huge.is_err());
            // The empty input.
            assert!(decompress(codec, &[], Some(1), 64).is_err(), "{codec}");
        }
        if Compression::Lz4.is_available() {
            let error = decompress(Compression::Lz4, &[0x10, b'x'], None, 64).unwrap_err();
            assert!(
                error.to_string().contains("declares no uncompressed_size"),
                "{error}"
            );
        }
    }

    #[test]
    fn payloads_follow_their_metadata() {
        let data = Bytes::from(text(3000));
        let plain = MessageMetadata::default();
        assert_eq!(decompress_payload(&plain, data.clone(), 10).unwrap(), data);
        for codec in codecs() {
            let metadata = MessageMetadata {
                compression: Some(codec.wire() as i32),
                uncompressed_size: Some(3000),
                ..MessageMetadata::default()
            };
            let compressed = compress(codec, &data).unwrap();
            assert_eq!(
                decompress_payload(&metadata, compressed, 3000).unwrap(),
                data
            );
        }
        let unknown = MessageMetadata {
            compression: Some(7),
            ..MessageMetadata::default()
        };
        let error = decompress_payload(&unknown, data, 3000).unwrap_err();
        assert!(error.to_string().contains("code 7"), "{error}");
    }

    #[test]
    fn codecs_have_names_features_and_wire_values() {
        for (code, codec) in Compression::ALL.into_iter().enumerate() {
            assert_eq!(Compression::from_wire(code as i32).unwrap(), codec);
            assert_eq!(codec.wire() as i32, code as i32);
            assert_eq!(codec.is_available(), codec.ensure_available().is_ok());
        }
        assert!(Compression::from_wire(5).is_err());
        assert_eq!(Compression::Zstd.to_string(), "ZSTD");
        assert_eq!(Compression::Snappy.feature(), Some("snappy"));
        let disabled = Error::CodecDisabled {
            codec: Compression::Lz4,
            feature: "lz4",
        };
        assert_eq!(
            disabled.to_string(),
            "compression LZ4 is not compiled in: enable the `lz4` feature of pulsar-wire"
        );
        assert!(!disabled.is_retryable());
        for codec in Compression::ALL.into_iter().filter(|c| !c.is_available()) {
            let error = compress(codec, b"x").unwrap_err();
            assert!(matches!(error, Error::CodecDisabled { .. }), "{error}");
            let error = decompress(codec, b"x", Some(1), 64).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains(codec.feature().unwrap_or_default()),
                "{error}"
            );
        }
    }

    fn codec() -> impl Strategy<Value = Compression> {
        // All four, so that the strategy exists in any build; a test returns early for one
        // this build lacks.
        prop::sample::select(Compression::ALL[1..].to_vec())
    }

    #[test]
    fn the_probe_sees_allocations() {
        let (_, peak) = peak_during(|| std::hint::black_box(vec![1u8; 10_000]));
        assert!(peak >= 10_000, "{peak}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes, random declared sizes and limits: never a panic, never an output
        /// beyond the limit or of another size than declared, never more allocated than the
        /// limit (and the codec's own state).
        #[test]
        fn random_input_never_panics_or_exceeds_the_limit(
            codec in codec(),
            data in prop::collection::vec(any::<u8>(), 0..2048),
            declared in prop::option::of(prop_oneof![0u32..70_000, any::<u32>()]),
            max in 0usize..65_536,
        ) {
            if !codec.is_available() {
                return Ok(());
            }
            let (result, peak) = peak_during(|| decompress(codec, &data, declared, max));
            prop_assert!(peak <= max + STATE, "{} allocated {} bytes, limit {}", codec, peak, max);
            if let Ok(out) = result {
                prop_assert!(out.len() <= max);
                if let Some(declared) = declared {
                    prop_assert_eq!(out.len(), declared as usize);
                }
            }
        }

        /// Valid compressed data with random bytes changed and cut short, under random
        /// declared sizes and limits: the same guarantees.
        #[test]
        fn damaged_input_never_panics_or_exceeds_the_limit(
            codec in codec(),
            len in 0usize..20_000,
            damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
            declared in prop::option::of(0u32..40_000),
            max in 0usize..40_000,
        ) {
            if !codec.is_available() {
                return Ok(());
            }
            let mut data = compress(codec, &text(len)).unwrap().to_vec();
            for (at, byte) in damage {
                let i = at.index(data.len());
                data[i] ^= byte;
            }
            data.truncate(cut.index(data.len() + 1));
            let (result, peak) = peak_during(|| decompress(codec, &data, declared, max));
            prop_assert!(peak <= max + STATE, "{} allocated {} bytes, limit {}", codec, peak, max);
            if let Ok(out) = result {
                prop_assert!(out.len() <= max);
                if let Some(declared) = declared {
                    prop_assert_eq!(out.len(), declared as usize);
                }
            }
        }

        /// Whatever the codec and data, what compresses decompresses to the same bytes.
        #[test]
        fn compressed_data_round_trips(
            codec in codec(),
            data in prop::collection::vec(prop_oneof![Just(b'a'), any::<u8>()], 0..4096),
        ) {
            if !codec.is_available() {
                return Ok(());
            }
            prop_assert_eq!(round_trip(codec, &data), data);
        }

        /// Valid compressed data under a wrong declared size or a smaller limit: an error,
        /// never a panic.
        #[test]
        fn wrong_declared_sizes_are_errors(
            codec in codec(),
            len in 1usize..3000,
            delta in 1u32..100,
            shorter in any::<bool>(),
        ) {
            if !codec.is_available() {
                return Ok(());
            }
            let data = text(len);
            let compressed = compress(codec, &data).unwrap();
            let wrong = if shorter {
                (len as u32).saturating_sub(delta)
            } else {
                len as u32 + delta
            };
            prop_assert!(decompress(codec, &compressed, Some(wrong), 1 << 20).is_err());
            prop_assert!(decompress(codec, &compressed, Some(len as u32), len - 1).is_err());
        }
    }
}
