//! The compression codecs of the protocol, as a plain value (no compression code here).

use crate::pb::CompressionType;

/// A compression codec of the protocol (`CompressionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// LZ4, raw block format (feature `lz4`).
    Lz4,
    /// ZLIB, RFC 1950 stream (feature `zlib`).
    Zlib,
    /// Zstandard frame (feature `zstd`).
    Zstd,
    /// Snappy, raw block format (feature `snappy`).
    Snappy,
}

impl Compression {
    /// Every codec, `None` first.
    pub const ALL: [Self; 5] = [Self::None, Self::Lz4, Self::Zlib, Self::Zstd, Self::Snappy];

    /// The wire value (public as `wire::compression_type`).
    pub(crate) fn wire(self) -> CompressionType {
        match self {
            Self::None => CompressionType::None,
            Self::Lz4 => CompressionType::Lz4,
            Self::Zlib => CompressionType::Zlib,
            Self::Zstd => CompressionType::Zstd,
            Self::Snappy => CompressionType::Snappy,
        }
    }

    /// The protocol's name: `NONE`, `LZ4`, `ZLIB`, `ZSTD`, `SNAPPY`.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "NONE",
            Self::Lz4 => "LZ4",
            Self::Zlib => "ZLIB",
            Self::Zstd => "ZSTD",
            Self::Snappy => "SNAPPY",
        }
    }

    /// The cargo feature of pulsar-wire that brings the codec (`None` for no compression).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Lz4 => Some("lz4"),
            Self::Zlib => Some("zlib"),
            Self::Zstd => Some("zstd"),
            Self::Snappy => Some("snappy"),
        }
    }

    /// Whether this build has the codec.
    pub fn is_available(self) -> bool {
        match self {
            Self::None => true,
            Self::Lz4 => cfg!(feature = "lz4"),
            Self::Zlib => cfg!(feature = "zlib"),
            Self::Zstd => cfg!(feature = "zstd"),
            Self::Snappy => cfg!(feature = "snappy"),
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Compression> for CompressionType {
    fn from(codec: Compression) -> Self {
        codec.wire()
    }
}
