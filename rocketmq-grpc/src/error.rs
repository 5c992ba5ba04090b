//! The crate's error type.

use std::sync::Arc;

use crate::pb::Code;

/// Everything the adapter can report.
///
/// Which variants are worth retrying is answered by [`Error::is_retryable`]; acks use it to
/// decide between an individual retry and a final failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting was rejected; the message says which and what is accepted.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidConfig {
        /// The setting.
        setting: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// An endpoint could not be parsed or connected to.
    #[error("cannot reach endpoint {endpoint}: {reason}")]
    Unreachable {
        /// The endpoint as configured.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
    /// The RPC failed below the RocketMQ protocol (connection refused or dropped, deadline
    /// exceeded, HTTP/2 error). Retryable.
    #[error("{rpc} failed at the gRPC level: {source}")]
    Rpc {
        /// The RPC.
        rpc: &'static str,
        /// The gRPC status.
        #[source]
        source: Arc<tonic::Status>,
    },
    /// The proxy answered with a non-OK RocketMQ status.
    #[error("{rpc} was refused by the proxy: {} ({code}): {message}", code_name(*.code))]
    Server {
        /// The RPC.
        rpc: &'static str,
        /// The RocketMQ status code (`apache.rocketmq.v2.Code`).
        code: i32,
        /// The proxy's explanation.
        message: String,
    },
    /// A message or body larger than the limit.
    #[error("the message body is {size} bytes, more than the limit of {limit} bytes")]
    MessageTooLarge {
        /// The body's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The client was shut down.
    #[error("the client is shut down")]
    ShutDown,
    /// The emulator could not bind its listener (feature `emulator`). Retryable with another
    /// port.
    #[cfg(feature = "emulator")]
    #[error("cannot bind the emulator to {addr}: {source}")]
    EmulatorBind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The emulator's server stopped with a transport error (feature `emulator`).
    #[cfg(feature = "emulator")]
    #[error("the emulator's server failed: {0}")]
    EmulatorServe(#[source] Arc<tonic::transport::Error>),
    /// The emulator's server task panicked or was cancelled (feature `emulator`).
    #[cfg(feature = "emulator")]
    #[error("the emulator's server task ended abnormally: {0}")]
    EmulatorTask(String),
    /// An emulator topic or group already exists with other settings (feature `emulator`).
    #[cfg(feature = "emulator")]
    #[error("{0} already exists in the emulator with other settings")]
    AlreadyExists(String),
    /// The emulator has no such topic (feature `emulator`).
    #[cfg(feature = "emulator")]
    #[error("topic {0:?} does not exist in the emulator")]
    UnknownTopic(String),
    /// A send failed after retrying: every attempt failed with a retryable error until the
    /// producer's attempts and retry window were used up. Retryable when `last` is.
    #[error("the send failed after {attempts} attempts in {elapsed:?}; the last error: {last}")]
    SendFailed {
        /// Attempts made.
        attempts: u32,
        /// Time from the first attempt to giving up.
        elapsed: std::time::Duration,
        /// The last attempt's error.
        #[source]
        last: Box<Error>,
    },
}

/// The name of a RocketMQ status code, or "UNKNOWN" for a value this crate does not know.
pub(crate) fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

impl Error {
    /// The RocketMQ status code, for [`Error::Server`] (and for [`Error::SendFailed`], its
    /// last error's).
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Server { code, .. } => Code::try_from(*code).ok(),
            Self::SendFailed { last, .. } => last.code(),
            _ => None,
        }
    }

    /// Whether the same request may succeed later. An invalid receipt handle never will; nor
    /// will invalid settings or an oversized message.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Rpc { .. } | Self::Unreachable { .. } => true,
            Self::Server { code, .. } => *code != Code::InvalidReceiptHandle as i32,
            Self::InvalidConfig { .. } | Self::MessageTooLarge { .. } | Self::ShutDown => false,
            #[cfg(feature = "emulator")]
            Self::EmulatorBind { .. } => true,
            #[cfg(feature = "emulator")]
            Self::EmulatorServe(_)
            | Self::EmulatorTask(_)
            | Self::AlreadyExists(_)
            | Self::UnknownTopic(_) => false,
            Self::SendFailed { last, .. } => last.is_retryable(),
        }
    }

    pub(crate) fn rpc(rpc: &'static str, status: tonic::Status) -> Self {
        Self::Rpc {
            rpc,
            source: Arc::new(status),
        }
    }

    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            setting,
            reason: reason.into(),
        }
    }

    /// `Ok` for an OK status, else [`Error::Server`].
    pub(crate) fn check(rpc: &'static str, status: Option<&crate::pb::Status>) -> Result<(), Self> {
        match status {
            Some(status) if status.code == Code::Ok as i32 => Ok(()),
            Some(status) => Err(Self::Server {
                rpc,
                code: status.code,
                message: status.message.clone(),
            }),
            None => Err(Self::Server {
                rpc,
                code: Code::Unspecified as i32,
                message: "the response carried no status".into(),
            }),
        }
    }
}

impl ack_batcher::Retryable for Error {
    fn is_retryable(&self) -> bool {
        Error::is_retryable(self)
    }
}
