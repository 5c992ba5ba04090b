//! The proxy's status codes as a stable enum of the crate, beside the generated one.

use crate::pb;

/// Declares [`Code`] over the generated `pb::Code` variants of the same names: the conversions
/// match the generated enum exhaustively, so a code added to the proto fails the build until it
/// is listed here.
macro_rules! codes {
    ($($name:ident,)*) => {
        /// The proxy's status codes (`apache.rocketmq.v2.Code`), as [`Error::code`] gives them.
        ///
        /// [`Code::number`] is the protocol's number (`40013` for
        /// [`Code::InvalidReceiptHandle`]), [`Code::name`] its name
        /// (`INVALID_RECEIPT_HANDLE`); [`Error::is_retryable`] says which are retried.
        /// Non-exhaustive: later versions of the protocol add codes. Each variant's
        /// discriminant is its number too (`Code::InvalidReceiptHandle as i32` is `40013`).
        ///
        /// [`Error::code`]: crate::Error::code
        /// [`Error::is_retryable`]: crate::Error::is_retryable
        #[non_exhaustive]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Code {
            $(
                #[doc = concat!("`", stringify!($name), "` (see [`Code::name`] and [`Code::number`]).")]
                $name = pb::Code::$name as isize,
            )*
        }

        impl Code {
            /// The code of a protocol number, or `None` for a number this version of the crate
            /// does not know.
            #[must_use]
            pub fn from_number(number: i32) -> Option<Self> {
                match pb::Code::try_from(number).ok()? {
                    $(pb::Code::$name => Some(Self::$name),)*
                }
            }

            /// The protocol's number, e.g. `40013` for [`Code::InvalidReceiptHandle`].
            #[must_use]
            pub fn number(self) -> i32 {
                match self {
                    $(Self::$name => pb::Code::$name as i32,)*
                }
            }

            /// The protocol's name, e.g. `INVALID_RECEIPT_HANDLE`.
            #[must_use]
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$name => pb::Code::$name.as_str_name(),)*
                }
            }
        }
    };
}

codes!(
    Unspecified,
    Ok,
    MultipleResults,
    BadRequest,
    IllegalAccessPoint,
    IllegalTopic,
    IllegalConsumerGroup,
    IllegalMessageTag,
    IllegalMessageKey,
    IllegalMessageGroup,
    IllegalMessagePropertyKey,
    InvalidTransactionId,
    IllegalMessageId,
    IllegalFilterExpression,
    IllegalInvisibleTime,
    IllegalDeliveryTime,
    InvalidReceiptHandle,
    MessagePropertyConflictWithType,
    UnrecognizedClientType,
    MessageCorrupted,
    ClientIdRequired,
    IllegalPollingTime,
    IllegalOffset,
    IllegalLiteTopic,
    Unauthorized,
    PaymentRequired,
    Forbidden,
    NotFound,
    MessageNotFound,
    TopicNotFound,
    ConsumerGroupNotFound,
    OffsetNotFound,
    RequestTimeout,
    PayloadTooLarge,
    MessageBodyTooLarge,
    MessageBodyEmpty,
    PreconditionFailed,
    TooManyRequests,
    LiteTopicQuotaExceeded,
    LiteSubscriptionQuotaExceeded,
    RequestHeaderFieldsTooLarge,
    MessagePropertiesTooLarge,
    InternalError,
    InternalServerError,
    HaNotAvailable,
    NotImplemented,
    ProxyTimeout,
    MasterPersistenceTimeout,
    SlavePersistenceTimeout,
    Unsupported,
    VersionUnsupported,
    VerifyFifoMessageUnsupported,
    FailedToConsumeMessage,
);

impl std::fmt::Display for Code {
    /// The protocol's name and number, e.g. `INVALID_RECEIPT_HANDLE (40013)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_of_the_proto_round_trips() {
        let mut known = 0;
        for number in -1..=70_000 {
            match (Code::from_number(number), pb::Code::try_from(number)) {
                (Some(code), Ok(generated)) => {
                    known += 1;
                    assert_eq!(code.number(), number);
                    assert_eq!(code.name(), generated.as_str_name());
                }
                (None, Err(_)) => {}
                (ours, theirs) => panic!("{number}: {ours:?} against {theirs:?}"),
            }
        }
        assert_eq!(known, 53);
        assert_eq!(Code::InvalidReceiptHandle.number(), 40_013);
        assert_eq!(Code::InvalidReceiptHandle as i32, 40_013);
        assert_eq!(
            Code::InvalidReceiptHandle.to_string(),
            "INVALID_RECEIPT_HANDLE (40013)"
        );
    }
}
