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
    /// A setting or an argument was rejected; the message says which and what is accepted.
    /// The same variant as `pulsar_wire::Error::Invalid`.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The setting or argument (the setter's name for a setting).
        what: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// An endpoint could not be parsed or connected to. Retryable: the proxy may be starting.
    #[error(
        "cannot reach endpoint {endpoint}: {reason}; check the endpoint (host and gRPC port of \
         the proxy) and that the proxy is running and reachable from here"
    )]
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
        source: RpcStatus,
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
    /// A message body (or a batch, bodies and headers together) larger than the producer's
    /// `max_body` limit ([`ProducerBuilder::max_body`](crate::ProducerBuilder::max_body)).
    /// Not sent; not retryable.
    #[error(
        "the message body is {size} bytes, more than the producer's `max_body` limit of {limit} \
         bytes; split the body (or the batch), or raise `max_body` up to the broker's \
         `maxMessageSize` (4 MiB by default)"
    )]
    MessageTooLarge {
        /// The body's size (for a batch: the bodies and their headers together).
        size: usize,
        /// The limit (`max_body`).
        limit: usize,
    },
    /// TLS with the proxy failed: the client refused the proxy's certificate (signed by an
    /// unknown CA, not valid for the host, expired), the proxy refused the client's
    /// certificate or its absence, or the endpoint does not speak TLS. Not retryable: the
    /// same connection fails the same way until a setting or a certificate changes; the
    /// reason says which.
    #[error("TLS with the proxy at {endpoint} failed: {reason}")]
    Tls {
        /// The endpoint (`host:port`).
        endpoint: String,
        /// What was wrong and what to do.
        reason: String,
    },
    /// The named producer or consumer was closed (its `close` was called): every later call
    /// fails with this, and so do calls still waiting when `close` gave up on them (a send
    /// still retrying at the producer's close deadline, an ack not answered in time). Not
    /// retryable: build a new one.
    #[error("{0} is closed; build a new one")]
    Closed(&'static str),
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

/// The gRPC status of an RPC that failed below the RocketMQ protocol ([`Error::Rpc`]): the
/// connection was refused or dropped, the deadline passed, or HTTP/2 failed. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RpcStatus(Arc<tonic::Status>);

impl RpcStatus {
    /// The gRPC status code, as the gRPC specification numbers them (`4` deadline exceeded,
    /// `8` resource exhausted, `12` unimplemented, `14` unavailable, ...).
    #[must_use]
    pub fn code(&self) -> i32 {
        self.0.code() as i32
    }

    /// The status message: what the transport or the proxy said.
    #[must_use]
    pub fn message(&self) -> &str {
        self.0.message()
    }

    /// Whether the proxy could not be reached (gRPC `UNAVAILABLE`: refused, dropped, or not
    /// yet connected).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        self.0.code() == tonic::Code::Unavailable
    }
}

impl std::fmt::Display for RpcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RpcStatus {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The name of a RocketMQ status code, or "UNKNOWN" for a value this crate does not know.
pub(crate) fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

impl Error {
    /// The RocketMQ status code, for [`Error::Server`] (and for [`Error::SendFailed`], its
    /// last error's).
    pub fn code(&self) -> Option<crate::Code> {
        match self {
            Self::Server { code, .. } => crate::Code::from_number(*code),
            Self::SendFailed { last, .. } => last.code(),
            _ => None,
        }
    }

    /// Whether the same request may succeed later, from the proxy's documented meaning of
    /// each code. Acks are retried (with backoff, within the ack batcher's retry budget, until
    /// the receipt handle's deadline) only when this is true; other failures are final at once.
    ///
    /// | what failed | retryable | why |
    /// |---|---|---|
    /// | transport ([`Error::Rpc`]): `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `CANCELLED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNKNOWN`, `DATA_LOSS` | yes | the connection or the proxy is (briefly) away |
    /// | transport: `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE` (e.g. a message over the decode limit), `UNIMPLEMENTED`, and `RESOURCE_EXHAUSTED` "... exceeds maximum ..." (a request over the proxy's inbound limit) | no | the same request fails the same way |
    /// | [`Error::Unreachable`] | yes | |
    /// | `TOO_MANY_REQUESTS` 42900 ("flow limit") | yes | throttling |
    /// | `REQUEST_TIMEOUT` 40800, `PROXY_TIMEOUT` 50400, `MASTER_PERSISTENCE_TIMEOUT` 50401, `SLAVE_PERSISTENCE_TIMEOUT` 50402 | yes | timeouts |
    /// | `INTERNAL_ERROR` 50000, `INTERNAL_SERVER_ERROR` 50001, `HA_NOT_AVAILABLE` 50002 | yes | what the proxy answers for a broker that is restarting ("connect to ... failed"), a broker-side non-OK ack, or any unexpected exception |
    /// | `INTERNAL_SERVER_ERROR` 50001 "parse the consumer's subscription failed" | no | the 5.3.3 proxy's answer to a receive whose SQL92 filter does not parse |
    /// | `CODE_UNSPECIFIED` 0 (no status), `MULTIPLE_RESULTS` 30000 (without per-entry results) | yes | the answer is missing |
    /// | `INVALID_RECEIPT_HANDLE` 40013 or `BAD_REQUEST` 40000 whose message contains "cannot find broker" | **yes** | the proxy could not resolve the broker named in the receipt handle: its route to that broker is missing while the broker restarts (the proxy's `resolveBrokerAddrInReceiptHandle` reports it as `INVALID_RECEIPT_HANDLE`); the handle itself may still be valid |
    /// | `INVALID_RECEIPT_HANDLE` 40013 otherwise ("receipt handle is expired", superseded) | no | the handle will never be valid again |
    /// | `BAD_REQUEST` 40000 otherwise and the `ILLEGAL_*` / `INVALID_*` / `*_REQUIRED` family 40001–40021 (`ILLEGAL_TOPIC`, `ILLEGAL_CONSUMER_GROUP`, `ILLEGAL_INVISIBLE_TIME`, `CLIENT_ID_REQUIRED`, `UNRECOGNIZED_CLIENT_TYPE`, ...) | no | the request is malformed |
    /// | `UNAUTHORIZED` 40100, `PAYMENT_REQUIRED` 40200, `FORBIDDEN` 40300 | no | credentials or permissions |
    /// | `NOT_FOUND` 40400 family: `MESSAGE_NOT_FOUND`, `TOPIC_NOT_FOUND`, `CONSUMER_GROUP_NOT_FOUND`, `OFFSET_NOT_FOUND` | no | the resource does not exist |
    /// | `LITE_TOPIC_QUOTA_EXCEEDED` 42901, `LITE_SUBSCRIPTION_QUOTA_EXCEEDED` 42902 | no | a quota of the lite topic or of the consumer's lite subscriptions: unsubscribe first (or have the quota raised) |
    /// | `PAYLOAD_TOO_LARGE` 41300 family, `REQUEST_HEADER_FIELDS_TOO_LARGE` 43100 family, `PRECONDITION_FAILED` 42800 | no | |
    /// | `NOT_IMPLEMENTED` 50100, `UNSUPPORTED` 50500 family, `FAILED_TO_CONSUME_MESSAGE` 60000 | no | |
    /// | a code this crate does not know | yes for 5xxxx and 429xx, no for other 4xxxx | by class |
    /// | [`Error::Tls`] (certificate refused either way, not TLS) | no | a certificate or a setting must change first |
    /// | [`Error::Invalid`], [`Error::MessageTooLarge`], [`Error::Closed`] | no | |
    ///
    /// The consumer's control plane (telemetry, heartbeats, assignments) and receive loops keep
    /// trying whatever this says, with backoff: a terminal answer there (`TOPIC_NOT_FOUND`
    /// right after a proxy restart, "settings is null") makes the consumer announce its
    /// settings again first.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Rpc { source, .. } => grpc_status_is_retryable(&source.0),
            Self::Unreachable { .. } => true,
            Self::Server { code, message, .. } => server_code_is_retryable(*code, message),
            Self::Invalid { .. }
            | Self::MessageTooLarge { .. }
            | Self::Closed(_)
            | Self::Tls { .. } => false,
            Self::SendFailed { last, .. } => last.is_retryable(),
        }
    }

    /// A gRPC failure of `rpc`: [`Error::Tls`] when TLS caused it, else [`Error::Rpc`].
    pub(crate) fn rpc(rpc: &'static str, status: tonic::Status) -> Self {
        if let Some(failure) = TlsFailure::find(&status) {
            return Self::Tls {
                endpoint: failure.endpoint,
                reason: failure.reason,
            };
        }
        Self::Rpc {
            rpc,
            source: RpcStatus(Arc::new(status)),
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            what,
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

/// A TLS failure of a connection to a proxy, made by the TLS connector and carried through
/// tonic's error chain to [`Error::rpc`], which turns it into [`Error::Tls`].
#[derive(Debug, Clone)]
pub(crate) struct TlsFailure {
    /// `host:port`.
    pub(crate) endpoint: String,
    /// What was wrong and what to do.
    pub(crate) reason: String,
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TLS with {} failed: {}", self.endpoint, self.reason)
    }
}

impl std::error::Error for TlsFailure {}

impl TlsFailure {
    /// The TLS failure somewhere in `status`'s error chain: itself (a failed handshake), or
    /// the text of one inside an I/O error (an alert after the handshake; h2 keeps only the
    /// kind and the text of the I/O errors it reports, so the type is gone by then).
    fn find(status: &tonic::Status) -> Option<TlsFailure> {
        let mut next: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(status);
        while let Some(error) = next {
            if let Some(failure) = error.downcast_ref::<TlsFailure>() {
                return Some(failure.clone());
            }
            if let Some(inner) = error
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if let Some(failure) = inner.downcast_ref::<TlsFailure>() {
                    return Some(failure.clone());
                }
                if let Some(failure) = Self::parse(&inner.to_string()) {
                    return Some(failure);
                }
            }
            next = error.source();
        }
        None
    }

    /// The failure whose `Display` is `text` ("TLS with ENDPOINT failed: REASON").
    fn parse(text: &str) -> Option<TlsFailure> {
        let (endpoint, reason) = text.strip_prefix("TLS with ")?.split_once(" failed: ")?;
        (!endpoint.contains(' ')).then(|| TlsFailure {
            endpoint: endpoint.to_owned(),
            reason: reason.to_owned(),
        })
    }
}

/// Whether a gRPC-level failure may pass on a later attempt (see [`Error::is_retryable`]).
fn grpc_status_is_retryable(status: &tonic::Status) -> bool {
    use tonic::Code as G;
    let code = status.code();
    // grpc-java's answer to a request over the server's inbound limit.
    if code == G::ResourceExhausted && status.message().contains("exceeds maximum") {
        return false;
    }
    !matches!(
        code,
        G::InvalidArgument
            | G::NotFound
            | G::AlreadyExists
            | G::PermissionDenied
            | G::Unauthenticated
            | G::FailedPrecondition
            | G::OutOfRange
            | G::Unimplemented
    )
}

/// The proxy's message when the broker named in a receipt handle has no route (yet). The real
/// 5.3.3 proxy in cluster mode sends it wrapped in its exception's name
/// (`org.apache.rocketmq.proxy.common.ProxyException: cannot find broker ...`), seen in an
/// ack answer one second after a broker was killed.
fn cannot_find_broker(message: &str) -> bool {
    message.contains("cannot find broker")
}

/// The proxy's message when it cannot parse the receive's filter expression (5.3.3:
/// `INTERNAL_SERVER_ERROR` "org.apache.rocketmq.proxy.common.ProxyException: parse the consumer's
/// subscription failed", seen for the SQL92 expression `a >>> 1`).
fn unparsable_subscription(message: &str) -> bool {
    message.contains("parse the consumer's subscription failed")
}

/// Whether a RocketMQ status code may pass on a later attempt (see [`Error::is_retryable`]).
fn server_code_is_retryable(code: i32, message: &str) -> bool {
    let Ok(known) = Code::try_from(code) else {
        // By class: server errors and throttling may pass, other client errors will not.
        return code >= 50_000 || (42_900..43_000).contains(&code) || code < 40_000;
    };
    match known {
        // The 5.3.3 proxy's answer to a receive whose SQL92 filter does not parse: the same
        // receive fails the same way.
        Code::InternalServerError if unparsable_subscription(message) => false,
        Code::Unspecified
        | Code::MultipleResults
        | Code::TooManyRequests
        | Code::RequestTimeout
        | Code::InternalError
        | Code::InternalServerError
        | Code::HaNotAvailable
        | Code::ProxyTimeout
        | Code::MasterPersistenceTimeout
        | Code::SlavePersistenceTimeout => true,
        Code::InvalidReceiptHandle | Code::BadRequest => cannot_find_broker(message),
        Code::Ok
        | Code::IllegalAccessPoint
        | Code::IllegalTopic
        | Code::IllegalConsumerGroup
        | Code::IllegalMessageTag
        | Code::IllegalMessageKey
        | Code::IllegalMessageGroup
        | Code::IllegalMessagePropertyKey
        | Code::InvalidTransactionId
        | Code::IllegalMessageId
        | Code::IllegalFilterExpression
        | Code::IllegalInvisibleTime
        | Code::IllegalDeliveryTime
        | Code::MessagePropertyConflictWithType
        | Code::UnrecognizedClientType
        | Code::MessageCorrupted
        | Code::ClientIdRequired
        | Code::IllegalPollingTime
        | Code::IllegalOffset
        | Code::IllegalLiteTopic
        | Code::LiteTopicQuotaExceeded
        | Code::LiteSubscriptionQuotaExceeded
        | Code::Unauthorized
        | Code::PaymentRequired
        | Code::Forbidden
        | Code::NotFound
        | Code::MessageNotFound
        | Code::TopicNotFound
        | Code::ConsumerGroupNotFound
        | Code::OffsetNotFound
        | Code::PayloadTooLarge
        | Code::MessageBodyTooLarge
        | Code::MessageBodyEmpty
        | Code::PreconditionFailed
        | Code::RequestHeaderFieldsTooLarge
        | Code::MessagePropertiesTooLarge
        | Code::NotImplemented
        | Code::Unsupported
        | Code::VersionUnsupported
        | Code::VerifyFifoMessageUnsupported
        | Code::FailedToConsumeMessage => false,
    }
}

impl ack_batcher::Retryable for Error {
    fn is_retryable(&self) -> bool {
        Error::is_retryable(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: Code, message: &str) -> Error {
        Error::Server {
            rpc: "AckMessage",
            code: code as i32,
            message: message.into(),
        }
    }

    fn retryable(code: Code) -> bool {
        server(code, code.as_str_name()).is_retryable()
    }

    #[test]
    fn throttling_timeouts_and_server_errors_are_retryable() {
        for code in [
            Code::TooManyRequests,
            Code::RequestTimeout,
            Code::ProxyTimeout,
            Code::MasterPersistenceTimeout,
            Code::SlavePersistenceTimeout,
            Code::HaNotAvailable,
            Code::InternalError,
            Code::InternalServerError,
            Code::Unspecified,
            Code::MultipleResults,
        ] {
            assert!(retryable(code), "{code:?}");
        }
        // What a proxy answers while a broker of a two-broker cluster restarts.
        assert!(
            server(
                Code::InternalServerError,
                "connect to 192.168.0.7:10911 failed"
            )
            .is_retryable()
        );
    }

    #[test]
    fn bad_requests_and_illegal_values_are_terminal() {
        for code in [
            Code::BadRequest,
            Code::IllegalAccessPoint,
            Code::IllegalTopic,
            Code::IllegalConsumerGroup,
            Code::IllegalMessageId,
            Code::IllegalInvisibleTime,
            Code::IllegalFilterExpression,
            Code::IllegalPollingTime,
            Code::UnrecognizedClientType,
            Code::ClientIdRequired,
            Code::MessageCorrupted,
            Code::PreconditionFailed,
        ] {
            assert!(!retryable(code), "{code:?}");
        }
    }

    #[test]
    fn an_unparsable_filter_is_terminal() {
        let refused = server(
            Code::InternalServerError,
            "org.apache.rocketmq.proxy.common.ProxyException: parse the consumer's subscription \
             failed",
        );
        assert!(!refused.is_retryable());
        assert!(server(Code::InternalServerError, "anything else").is_retryable());
    }

    #[test]
    fn auth_failures_are_terminal() {
        for code in [Code::Unauthorized, Code::PaymentRequired, Code::Forbidden] {
            assert!(!retryable(code), "{code:?}");
        }
    }

    #[test]
    fn missing_resources_are_terminal() {
        for code in [
            Code::NotFound,
            Code::MessageNotFound,
            Code::TopicNotFound,
            Code::ConsumerGroupNotFound,
            Code::OffsetNotFound,
        ] {
            assert!(!retryable(code), "{code:?}");
        }
    }

    #[test]
    fn oversized_and_unsupported_requests_are_terminal() {
        for code in [
            Code::PayloadTooLarge,
            Code::MessageBodyTooLarge,
            Code::MessageBodyEmpty,
            Code::RequestHeaderFieldsTooLarge,
            Code::MessagePropertiesTooLarge,
            Code::NotImplemented,
            Code::Unsupported,
            Code::VersionUnsupported,
            Code::FailedToConsumeMessage,
        ] {
            assert!(!retryable(code), "{code:?}");
        }
    }

    #[test]
    fn invalid_receipt_handles_are_terminal_unless_the_broker_route_is_missing() {
        assert!(!server(Code::InvalidReceiptHandle, "receipt handle is expired").is_retryable());
        assert!(!retryable(Code::InvalidReceiptHandle));
        // The proxy's resolveBrokerAddrInReceiptHandle after a broker restart: 40013 with
        // this message; the same lookup elsewhere is BAD_REQUEST (INVALID_BROKER_NAME).
        assert!(server(Code::InvalidReceiptHandle, "cannot find broker broker-a").is_retryable());
        assert!(server(Code::BadRequest, "cannot find broker broker-b").is_retryable());
        // As the real proxy sends it: wrapped in the exception's name.
        assert!(
            server(
                Code::InvalidReceiptHandle,
                "org.apache.rocketmq.proxy.common.ProxyException: cannot find broker broker-a"
            )
            .is_retryable()
        );
    }

    #[test]
    fn unknown_codes_are_classified_by_class() {
        let unknown = |code: i32| Error::Server {
            rpc: "AckMessage",
            code,
            message: String::new(),
        };
        assert!(unknown(50_003).is_retryable());
        assert!(unknown(42_950).is_retryable(), "quota-style throttling");
        // Known since 5.4: a lite quota passes only once something is unsubscribed.
        assert!(!unknown(42_901).is_retryable(), "LITE_TOPIC_QUOTA_EXCEEDED");
        assert!(
            !unknown(42_902).is_retryable(),
            "LITE_SUBSCRIPTION_QUOTA_EXCEEDED"
        );
        assert!(!unknown(40_020).is_retryable(), "ILLEGAL_LITE_TOPIC");
        assert!(!unknown(40_021).is_retryable(), "INVALID_CLIENT_PROPERTIES");
        assert!(!unknown(40_499).is_retryable());
    }

    #[test]
    fn messages_say_what_to_do() {
        let too_large = Error::MessageTooLarge {
            size: 2000,
            limit: 1024,
        }
        .to_string();
        assert!(too_large.contains("2000 bytes"), "{too_large}");
        assert!(
            too_large.contains("`max_body` limit of 1024"),
            "{too_large}"
        );
        assert!(too_large.contains("split the body"), "{too_large}");
        let unreachable = Error::Unreachable {
            endpoint: "127.0.0.1:8081".into(),
            reason: "connection refused".into(),
        }
        .to_string();
        assert!(unreachable.contains("connection refused"), "{unreachable}");
        assert!(
            unreachable.contains("that the proxy is running"),
            "{unreachable}"
        );
        let closed = Error::Closed("the simple consumer").to_string();
        assert_eq!(closed, "the simple consumer is closed; build a new one");
    }

    #[test]
    fn tls_failures_are_terminal_and_found_in_the_text_h2_keeps() {
        let failure = TlsFailure {
            endpoint: "127.0.0.1:8081".into(),
            reason: "the proxy's certificate is not signed by a CA this client trusts".into(),
        };
        // As h2 hands it on: an I/O error with the text only.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, failure.to_string());
        let status = tonic::Status::from_error(Box::new(io));
        let error = Error::rpc("SendMessage", status);
        let Error::Tls { endpoint, reason } = &error else {
            panic!("not a TLS error: {error}");
        };
        assert_eq!(endpoint, "127.0.0.1:8081");
        assert_eq!(reason, &failure.reason);
        assert!(!error.is_retryable());
        // Other I/O errors stay retryable transport errors.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let error = Error::rpc("SendMessage", tonic::Status::from_error(Box::new(io)));
        assert!(matches!(error, Error::Rpc { .. }), "{error}");
        assert!(TlsFailure::parse("TLS with a b failed: x").is_none());
    }

    #[test]
    fn transport_failures_by_grpc_code() {
        let rpc = |status: tonic::Status| Error::rpc("AckMessage", status);
        assert!(rpc(tonic::Status::unavailable("connection refused")).is_retryable());
        assert!(rpc(tonic::Status::deadline_exceeded("timeout")).is_retryable());
        assert!(rpc(tonic::Status::unknown("h2 protocol error")).is_retryable());
        assert!(rpc(tonic::Status::internal("stream reset")).is_retryable());
        assert!(!rpc(tonic::Status::unimplemented("no such method")).is_retryable());
        assert!(
            !rpc(tonic::Status::out_of_range(
                "decoded message length too large"
            ))
            .is_retryable()
        );
        assert!(!rpc(tonic::Status::unauthenticated("no")).is_retryable());
        assert!(rpc(tonic::Status::resource_exhausted("quota")).is_retryable());
        assert!(
            !rpc(tonic::Status::resource_exhausted(
                "gRPC message exceeds maximum size 136314880: 140000000"
            ))
            .is_retryable()
        );
        assert!(
            Error::Unreachable {
                endpoint: "x:1".into(),
                reason: String::new()
            }
            .is_retryable()
        );
        assert!(!Error::Closed("the producer").is_retryable());
        assert_eq!(
            Error::Closed("the producer").to_string(),
            "the producer is closed; build a new one"
        );
    }
}
