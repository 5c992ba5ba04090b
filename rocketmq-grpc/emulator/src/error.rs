//! The emulator's error type.

use std::net::SocketAddr;
use std::sync::Arc;

/// Everything the emulator's builder and admin API can report.
///
/// Only [`Error::Bind`] is worth retrying (with another port); see [`Error::is_retryable`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument of the builder or of the admin API was rejected; the message says which and
    /// what is accepted. Not retryable.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The setting or argument (`"emulator"` for the admin API's arguments).
        what: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The listener could not be bound. Retryable with another port.
    #[error("cannot bind the emulator to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The server stopped with a transport error. Not retryable.
    #[error("the emulator's server failed: {0}")]
    Serve(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The server task panicked or was cancelled. Not retryable.
    #[error("the emulator's server task ended abnormally: {0}")]
    Task(String),
    /// A topic or group already exists with other settings. Not retryable.
    #[error("{0} already exists in the emulator with other settings")]
    AlreadyExists(String),
    /// There is no such topic. Not retryable.
    #[error("topic {0:?} does not exist in the emulator")]
    UnknownTopic(String),
}

impl Error {
    /// Whether the same call may succeed later: only for [`Error::Bind`] (the port may be
    /// free then, or another port may be given).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Bind { .. } => true,
            Self::Invalid { .. }
            | Self::Serve(_)
            | Self::Task(_)
            | Self::AlreadyExists(_)
            | Self::UnknownTopic(_) => false,
        }
    }
}
