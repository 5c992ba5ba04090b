//! The crate's error type.

use std::sync::Arc;

use crate::Compression;
use crate::pb::ServerError;

/// Everything the adapter can report.
///
/// [`Error::is_retryable`] says whether the same operation may succeed later.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A frame announced a size above the limit; nothing was allocated for it.
    #[error(
        "a frame of {size} bytes exceeds the limit of {max} bytes (raise the limit if the broker's max_message_size is higher)"
    )]
    FrameTooLarge {
        /// The announced size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes are not a valid frame; the connection cannot be trusted any more.
    #[error("malformed frame: {reason}")]
    MalformedFrame {
        /// What is wrong.
        reason: String,
    },
    /// A batch payload could not be split into its messages.
    #[error("malformed batch: {reason}")]
    MalformedBatch {
        /// What is wrong.
        reason: String,
    },
    /// A payload could not be decompressed or compressed: corrupt or truncated data, or a
    /// declared `uncompressed_size` that is missing where the format needs one, above the
    /// limit, or not the size of the output. Not retryable: the same bytes fail the same way.
    #[error("{codec}: {reason}")]
    Compression {
        /// The codec.
        codec: Compression,
        /// What was wrong, with the sizes.
        reason: String,
    },
    /// A payload uses a codec that this build of pulsar-wire leaves out. Not retryable:
    /// enable the feature.
    #[error(
        "compression {codec} is not compiled in: enable the `{feature}` feature of pulsar-wire"
    )]
    CodecDisabled {
        /// The codec.
        codec: Compression,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// The connection failed or closed; requests pending on it fail with this. Retryable on a
    /// new connection: producers and consumers reconnect by themselves, so calling again is
    /// enough.
    #[error(
        "connection to {addr} lost: {reason}; retry the call (producers and consumers reconnect by themselves)"
    )]
    ConnectionLost {
        /// The broker's address.
        addr: String,
        /// What happened.
        reason: String,
    },
    /// The broker refused the client's credentials: it answered `CONNECT` (or the
    /// `AUTH_RESPONSE` to its `AUTH_CHALLENGE`) with `AuthenticationError`, or asked for
    /// credentials when none are configured. Not retryable: fix the token.
    /// [`Error::server_error`] gives `AuthenticationError`.
    #[error(
        "the broker at {broker} refused the authentication ({message}): {}",
        authentication_hint(*token_sent)
    )]
    Authentication {
        /// The broker's address (`host:port`).
        broker: String,
        /// The broker's explanation.
        message: String,
        /// Whether the client sent a token.
        token_sent: bool,
    },
    /// The TLS handshake with a broker failed (an untrusted or expired certificate, one that
    /// does not name the host, a refused client certificate, a port that does not speak
    /// TLS). Not retryable: the reason says what to fix.
    #[error("TLS with the broker at {broker} failed: {reason}")]
    Tls {
        /// The broker's address (`host:port`).
        broker: String,
        /// What went wrong, and what to do.
        reason: String,
    },
    /// An I/O error.
    #[error("I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The broker answered with an error.
    #[error("the broker refused {operation}: {} ({}): {message}", server_error_name(*.code), .code)]
    Server {
        /// What was attempted.
        operation: &'static str,
        /// The `ServerError` code.
        code: i32,
        /// The broker's explanation.
        message: String,
    },
    /// The broker did not answer within the timeout. Retryable: the message says which option
    /// sets the timeout.
    #[error(
        "{operation} timed out after {after:?}: {cause}; {}",
        timeout_hint(operation)
    )]
    Timeout {
        /// What was attempted.
        operation: &'static str,
        /// The timeout.
        after: std::time::Duration,
        /// Which broker did not answer, and what the client saw meanwhile (for a send: the
        /// broker it was registered with, or why it could not register again).
        cause: String,
    },
    /// An argument or setting was rejected.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was rejected.
        what: &'static str,
        /// Why, and what is accepted.
        reason: String,
    },
    /// An ack could not be built (from `txn-ack`).
    #[error(transparent)]
    Ack(#[from] txn_ack::Error),
    /// A priority setting or decision failed (from the `mq-priority` crate), for example a
    /// layout that does not cover the topic's partitions after it grew. Not retryable: fix
    /// the policy or layout.
    #[error(transparent)]
    Priority(#[from] mq_priority::Error),
    /// [`crate::Consumer::receive`] got an entry it cannot decode: its checksum does not
    /// match, its payload does not decompress, or its batch is corrupt. The entry was not
    /// acknowledged and stays in the subscription's backlog; the application decides:
    /// [`crate::Consumer::ack_id`] drops it, [`crate::Consumer::nack_id`] has it delivered
    /// again (a corruption in transit may not recur); with
    /// [`crate::ConsumerOptions::dead_letter`], an entry nacked often enough goes to the
    /// dead-letter topic instead. Not retryable as such: receive the next message.
    #[error(
        "entry {id} cannot be decoded ({reason}, delivered {redelivery_count} times before); it is not acknowledged: ack it by id (Consumer::ack_id) to drop it or nack it by id (Consumer::nack_id) to have it sent again"
    )]
    Undecodable {
        /// The entry's id (batch index -1: the whole entry).
        id: crate::MessageId,
        /// What was wrong.
        reason: String,
        /// How often the broker delivered the entry before.
        redelivery_count: u32,
    },
    /// The broker refused the schema of a producer (`PRODUCER`) or consumer (`SUBSCRIBE`)
    /// with `IncompatibleSchema`: the topic has a schema of another kind, or one the new
    /// definition is not compatible with under the namespace's compatibility strategy, or
    /// the definition is invalid. Not retryable: the same schema is refused again.
    /// [`Error::server_error`] gives `IncompatibleSchema`.
    #[error(
        "the broker refused the schema on {topic} as incompatible with the topic's schema ({reason}): use the topic's schema (pulsar-admin schemas get {topic}) or one compatible with it under the namespace's schema compatibility strategy, or change the topic's schema or strategy"
    )]
    IncompatibleSchema {
        /// The topic (the partition's, on a partitioned topic).
        topic: String,
        /// The broker's explanation.
        reason: String,
    },
    /// A typed producer's codec could not write a value (for example a value that does not
    /// match the Avro definition). Nothing was sent. Not retryable: fix the value or the
    /// schema.
    #[error("a value cannot be written as {format}: {reason}")]
    SchemaEncode {
        /// The schema's kind (`JSON`, `AVRO`, `PROTOBUF`, …).
        format: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A typed consumer received a message whose payload its codec cannot read. The message
    /// is not acknowledged: the application decides, as for [`Error::Undecodable`]
    /// ([`crate::Consumer::ack_id`] drops it, [`crate::Consumer::nack_id`] has it delivered
    /// again, or to the dead-letter topic after enough redeliveries). Not retryable as such:
    /// receive the next message.
    #[error(
        "message {id} on {topic} cannot be read as {format} ({reason}); it is not acknowledged: ack it by id (Consumer::ack_id) to drop it or nack it by id (Consumer::nack_id) to have it sent again"
    )]
    SchemaDecode {
        /// The message's id.
        id: crate::MessageId,
        /// The topic it came from (the partition's, on a partitioned topic).
        topic: String,
        /// The schema's kind (`JSON`, `AVRO`, `PROTOBUF`, …).
        format: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The client, producer or consumer was closed. Not retryable: what is closed stays
    /// closed; create a new one.
    #[error("{0} is closed; create a new one")]
    Closed(&'static str),
    /// A producer's pending queue is full: [`crate::ProducerOptions::max_pending_messages`]
    /// messages are sent and wait for their receipts (they pile up while the producer
    /// reconnects, see [`crate::Producer::state`]). With [`crate::QueueFull::Fail`] the send
    /// failed at once; with [`crate::QueueFull::Block`] no place came within the send
    /// timeout (`waited`). The message was not sent. Retryable: send it again later, or raise
    /// the limit.
    #[error(
        "the pending queue of the producer on {topic} is full: {limit} messages are sent and wait for their receipts (ProducerOptions::max_pending_messages); {}",
        queue_full_hint(*waited)
    )]
    ProducerQueueFull {
        /// The producer's topic.
        topic: String,
        /// The limit.
        limit: usize,
        /// How long the send waited for a place, with [`crate::QueueFull::Block`].
        waited: Option<std::time::Duration>,
    },
    /// A bounded queue of the client is full for now: `queue` holds `limit` items that wait
    /// for the broker (the frames queued for writing on a connection, or an acknowledgement
    /// batcher's pending acks). Nothing was sent. Retryable: the queue drains as the broker
    /// takes what waits; try again later, or send fewer at once.
    #[error(
        "{queue} is full: {limit} items wait for the broker; try again later, or send fewer at once"
    )]
    QueueFull {
        /// Which queue: for example "the frames queued for 127.0.0.1:6650".
        queue: String,
        /// How many items it holds at most.
        limit: usize,
    },
    /// A commit was refused before it was sent because an operation of the transaction had
    /// failed (the broker took nothing of it into the transaction, so committing would commit
    /// less than the application did). Not retryable: abort the transaction; its other
    /// messages are delivered again.
    #[error(
        "transaction {txn} cannot commit: {} of its operations failed, first {first}; abort it and acknowledge its messages again after their redelivery",
        .failed
    )]
    TransactionFailed {
        /// The transaction.
        txn: String,
        /// How many operations failed.
        failed: usize,
        /// The first failure: which operation on which message, and the broker's answer.
        first: String,
    },
}

fn authentication_hint(token_sent: bool) -> &'static str {
    if token_sent {
        "check the token: the broker must accept it (signed with its secret or public key \
         for a role it knows, and not expired); see ConnectOptions::auth_token, auth_token_file \
         and auth_token_provider"
    } else {
        "the broker requires authentication: give a token with ConnectOptions::auth_token, \
         auth_token_file or auth_token_provider"
    }
}

fn timeout_hint(operation: &str) -> &'static str {
    if operation == "SEND" {
        "send it again, or raise the send timeout (ProducerOptions::send_timeout; \
         ConnectOptions::operation_timeout for a send on a bare Connection)"
    } else {
        "retry, or raise the operation timeout (ConnectOptions::operation_timeout)"
    }
}

fn queue_full_hint(waited: Option<std::time::Duration>) -> String {
    match waited {
        None => "the message was not sent: send it again later, raise the limit, or have sends \
                 wait for room with ProducerOptions::on_queue_full(QueueFull::Block)"
            .into(),
        Some(waited) => format!(
            "no place came within {waited:?} (the send timeout) and the message was not sent: \
             the broker may be unreachable (Producer::state tells); send it again later, or \
             raise the limit or the send timeout"
        ),
    }
}

pub(crate) fn server_error_name(code: i32) -> &'static str {
    ServerError::try_from(code).map_or("UnknownServerError", |e| e.as_str_name())
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Self::Io(Arc::new(error))
    }
}

impl Error {
    /// The broker's error code, for [`Error::Server`] (and `AuthenticationError` for
    /// [`Error::Authentication`]).
    pub fn server_error(&self) -> Option<crate::ServerError> {
        match self {
            Self::Server { code, .. } => crate::ServerError::from_number(*code),
            Self::Authentication { .. } => Some(crate::ServerError::AuthenticationError),
            Self::IncompatibleSchema { .. } => Some(crate::ServerError::IncompatibleSchema),
            _ => None,
        }
    }

    /// Whether the same operation may succeed later (on a new connection if the old one was
    /// lost).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::ConnectionLost { .. }
            | Self::Io(_)
            | Self::Timeout { .. }
            | Self::ProducerQueueFull { .. }
            | Self::QueueFull { .. } => true,
            Self::Server { code, .. } => matches!(
                ServerError::try_from(*code),
                Ok(ServerError::ServiceNotReady
                    | ServerError::TooManyRequests
                    | ServerError::MetadataError
                    | ServerError::PersistenceError
                    | ServerError::TransactionCoordinatorNotFound)
            ),
            _ => false,
        }
    }

    /// Whether the broker refused because the topic's bundle is moving ("… is being
    /// unloaded"): asked again, it answers once the move is done.
    pub(crate) fn is_bundle_moving(&self) -> bool {
        matches!(self, Self::Server { message, .. } if message.contains("being unloaded"))
    }

    /// Whether registering a producer or subscribing a consumer again may succeed later: the
    /// broker is down, starting or moving the topic, or still has the previous registration
    /// (`busy`: `ProducerBusy` or `ConsumerBusy`, until it notices the old connection is
    /// gone).
    pub(crate) fn may_link_again(&self, busy: ServerError) -> bool {
        self.is_retryable()
            || self.is_bundle_moving()
            || matches!(
                self,
                Self::Server { code, .. }
                    if ServerError::try_from(*code)
                        .is_ok_and(|code| code == busy || code == ServerError::UnknownError)
            )
    }

    /// `IncompatibleSchema` from the broker on `topic` as [`Error::IncompatibleSchema`]; any
    /// other error as it is.
    pub(crate) fn schema_refused(self, topic: &str) -> Self {
        match self {
            Self::Server { code, message, .. }
                if code == ServerError::IncompatibleSchema as i32 =>
            {
                Self::IncompatibleSchema {
                    topic: topic.to_owned(),
                    reason: message,
                }
            }
            other => other,
        }
    }

    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        Self::MalformedFrame {
            reason: reason.into(),
        }
    }
}

impl ack_batcher::Retryable for Error {
    fn is_retryable(&self) -> bool {
        Error::is_retryable(self)
    }
}

/// Maps a batcher's error for an item or a setup onto the crate's error.
pub(crate) fn batcher_error<T>(error: ack_batcher::Error<Error, T>, what: &'static str) -> Error {
    match error {
        ack_batcher::Error::Failed { source, .. } => source,
        ack_batcher::Error::InvalidConfig { setting, reason } => Error::Invalid {
            what: setting,
            reason,
        },
        ack_batcher::Error::Full { limit, .. } => Error::QueueFull {
            queue: format!("the pending acknowledgements of {what}"),
            limit,
        },
        ack_batcher::Error::NoRuntime => Error::Invalid {
            what: "runtime",
            reason: "must be created inside a Tokio runtime".into(),
        },
        // Missing (never produced by these transports), Abandoned, Closed.
        _ => Error::Closed(what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_timeout_and_connection_lost_say_what_to_do() {
        let closed = Error::Closed("the producer").to_string();
        assert_eq!(closed, "the producer is closed; create a new one");
        let lookup = Error::Timeout {
            operation: "LOOKUP",
            after: std::time::Duration::from_secs(30),
            cause: "the broker at b:6650 did not answer".into(),
        }
        .to_string();
        assert!(
            lookup.starts_with("LOOKUP timed out after 30s: the broker at b:6650 did not answer; "),
            "{lookup}"
        );
        assert!(
            lookup.contains(
                "retry, or raise the operation timeout (ConnectOptions::operation_timeout)"
            ),
            "{lookup}"
        );
        let send = Error::Timeout {
            operation: "SEND",
            after: std::time::Duration::from_secs(30),
            cause: "the broker at b:6650 sent no receipt".into(),
        }
        .to_string();
        assert!(
            send.contains(
                "send it again, or raise the send timeout (ProducerOptions::send_timeout"
            ),
            "{send}"
        );
        let lost = Error::ConnectionLost {
            addr: "b:6650".into(),
            reason: "reset".into(),
        }
        .to_string();
        assert_eq!(
            lost,
            "connection to b:6650 lost: reset; retry the call (producers and consumers reconnect by themselves)"
        );
    }

    #[test]
    fn a_full_queue_is_retryable_and_names_the_queue() {
        let full: ack_batcher::Error<Error, u32> = ack_batcher::Error::Full {
            item: 7,
            limit: 65_536,
        };
        let error = batcher_error(full, "the consumer of t");
        assert!(
            matches!(&error, Error::QueueFull { limit: 65_536, queue } if queue.contains("the consumer of t")),
            "{error:?}"
        );
        assert!(error.is_retryable());
        assert!(error.to_string().contains("try again later"), "{error}");
        let invalid: ack_batcher::Error<Error, u32> = ack_batcher::Error::InvalidConfig {
            setting: "max_pending",
            reason: "zero".into(),
        };
        assert!(!batcher_error(invalid, "x").is_retryable());
    }
}
