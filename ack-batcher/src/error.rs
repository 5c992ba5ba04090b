//! The crate's error type and the retry classification a transport provides.

use std::fmt;

/// Tells the batcher whether a transport failure is worth retrying.
///
/// Implement it on the transport's error type. The batcher retries an item only when its
/// failure says so; a terminal failure reaches the item's future at once.
pub trait Retryable {
    /// `true` when sending the same item again may succeed (a timeout, an unavailable server,
    /// throttling); `false` when it never will (for example an invalid receipt handle).
    fn is_retryable(&self) -> bool;
}

/// Everything that can go wrong with a batched item, or with building a batcher.
///
/// `E` is the transport's error type. `T` is the item type: the variants that refuse an item
/// ([`Error::Closed`] and [`Error::Full`]) hand it back so that the caller can send it another
/// way. Outcomes of accepted items ([`crate::Ticket`]) use `T = ()` because the item is never
/// refused once accepted.
///
/// Which variants are worth acting on again:
/// - [`Error::Failed`]: the transport said no; retry later only if
///   [`Retryable::is_retryable`] says so (the batcher already retried it within its policy).
/// - [`Error::Missing`]: retryable: the server's answer had no result for the item.
/// - [`Error::Panicked`]: the transport panicked on the item's batch; unknown outcome, not
///   retried (fix the transport).
/// - [`Error::Abandoned`]: unknown outcome; the item may have been processed.
/// - [`Error::Closed`], [`Error::Full`]: the item was never sent; it is handed back.
/// - [`Error::InvalidConfig`], [`Error::NoRuntime`]: programming errors; fix the setup.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error<E, T = ()> {
    /// The transport failed this item, either terminally or retryably until the retry policy or
    /// the item's deadline ran out.
    #[error("the transport failed this item after {attempts} attempt(s): {source}")]
    Failed {
        /// The last failure the transport reported for this item.
        #[source]
        source: E,
        /// How many times the item was sent.
        attempts: u32,
    },
    /// The transport's answer carried no result for this item, on every attempt. Whether the
    /// server processed it is unknown; sending it again is safe for idempotent items such as acks.
    #[error(
        "the server's answer had no result for this item after {attempts} attempt(s); it may or \
         may not have been processed, send it again if it is idempotent"
    )]
    Missing {
        /// How many times the item was sent.
        attempts: u32,
    },
    /// The transport panicked while sending this item's batch. A panic is a bug in the
    /// transport, so the whole batch fails this way at once and is not retried; whether the
    /// server processed the items is unknown. (A flush that runs past the builder's
    /// `flush_timeout` is not a panic: it counts as an answer without results, see
    /// [`Error::Missing`].)
    #[error(
        "the transport panicked while sending this item's batch (attempt {attempts}): \
         {message}; the item was not retried and may or may not have been processed"
    )]
    Panicked {
        /// The panic's message (its payload when that is a string).
        message: String,
        /// How many times the item was sent, the panicking attempt included.
        attempts: u32,
    },
    /// The batcher stopped before this item's outcome was known: `close` ran out of time, or
    /// the batcher was dropped while its runtime was shutting down. The item may or may not
    /// have been processed.
    #[error(
        "the batcher was closed before this item's outcome was known (close timed out or the \
         runtime shut down); it may or may not have been processed"
    )]
    Abandoned,
    /// The batcher is closed and takes no new items. The item is handed back unsent: send it
    /// another way (for example directly, as a batch of one) or drop it.
    #[error("the batcher is closed and takes no new items; the item is handed back unsent")]
    Closed(T),
    /// The batcher already holds its limit of pending items and was told not to wait
    /// ([`crate::Backpressure::Reject`] or [`crate::Batcher::try_enqueue`]). The item is
    /// handed back unsent: try again later, send it another way, or raise `max_pending`.
    #[error(
        "the batcher already holds its limit of {limit} pending items; the item is handed back \
         unsent: try again later or raise max_pending"
    )]
    Full {
        /// The refused item.
        item: T,
        /// The configured limit of pending items.
        limit: usize,
    },
    /// A setting was rejected when the batcher was built.
    #[error("invalid batcher setting `{setting}`: {reason}")]
    InvalidConfig {
        /// The name of the builder method whose value was rejected.
        setting: &'static str,
        /// What is wrong and which values are accepted.
        reason: String,
    },
    /// The batcher was built outside a Tokio runtime; it needs one for its timers and flushes.
    #[error(
        "the batcher must be built inside a Tokio runtime (call build() from async code or \
         inside Runtime::enter)"
    )]
    NoRuntime,
}

impl<E: fmt::Debug, T> fmt::Debug for Error<E, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { source, attempts } => f
                .debug_struct("Failed")
                .field("source", source)
                .field("attempts", attempts)
                .finish(),
            Self::Missing { attempts } => f
                .debug_struct("Missing")
                .field("attempts", attempts)
                .finish(),
            Self::Panicked { message, attempts } => f
                .debug_struct("Panicked")
                .field("message", message)
                .field("attempts", attempts)
                .finish(),
            Self::Abandoned => f.write_str("Abandoned"),
            Self::Closed(_) => f.write_str("Closed(..)"),
            Self::Full { limit, .. } => f
                .debug_struct("Full")
                .field("limit", limit)
                .finish_non_exhaustive(),
            Self::InvalidConfig { setting, reason } => f
                .debug_struct("InvalidConfig")
                .field("setting", setting)
                .field("reason", reason)
                .finish(),
            Self::NoRuntime => f.write_str("NoRuntime"),
        }
    }
}

impl<E, T> Error<E, T> {
    /// The item this error hands back, if it refused one ([`Error::Closed`], [`Error::Full`]).
    pub fn into_item(self) -> Option<T> {
        match self {
            Self::Closed(item) | Self::Full { item, .. } => Some(item),
            _ => None,
        }
    }

    /// Whether trying the same thing again later may succeed.
    pub fn is_retryable(&self) -> bool
    where
        E: Retryable,
    {
        match self {
            Self::Failed { source, .. } => source.is_retryable(),
            Self::Missing { .. } | Self::Full { .. } => true,
            Self::Panicked { .. }
            | Self::Abandoned
            | Self::Closed(_)
            | Self::InvalidConfig { .. }
            | Self::NoRuntime => false,
        }
    }

    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            setting,
            reason: reason.into(),
        }
    }
}

impl<E> Error<E, ()> {
    /// Moves an accepted item's outcome into the error type of a call that also hands items
    /// back. Accepted items never carry [`Error::Closed`] or [`Error::Full`].
    pub(crate) fn with_item_type<T>(self) -> Error<E, T> {
        match self {
            Self::Failed { source, attempts } => Error::Failed { source, attempts },
            Self::Missing { attempts } => Error::Missing { attempts },
            Self::Panicked { message, attempts } => Error::Panicked { message, attempts },
            Self::InvalidConfig { setting, reason } => Error::InvalidConfig { setting, reason },
            Self::NoRuntime => Error::NoRuntime,
            Self::Abandoned | Self::Closed(()) | Self::Full { .. } => Error::Abandoned,
        }
    }
}
