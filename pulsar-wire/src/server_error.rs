//! The broker's error codes as a stable enum of the crate, beside the generated one.

use crate::pb;

/// Declares [`ServerError`] over the generated `pb::ServerError` variants of the same names:
/// the conversions match the generated enum exhaustively, so a code added to the protocol fails
/// the build until it is listed here.
macro_rules! server_errors {
    ($($name:ident,)*) => {
        /// The broker's error codes (`pulsar.proto`'s `ServerError`), as
        /// [`Error::server_error`] gives them.
        ///
        /// [`ServerError::number`] is the protocol's number, [`ServerError::name`] its name;
        /// [`Error::is_retryable`] says which are retried. Non-exhaustive: later versions of
        /// the protocol add codes. Each variant's discriminant is its number too
        /// (`ServerError::TopicNotFound as i32` is `11`).
        ///
        /// [`Error::server_error`]: crate::Error::server_error
        /// [`Error::is_retryable`]: crate::Error::is_retryable
        #[non_exhaustive]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ServerError {
            $(
                #[doc = concat!("`", stringify!($name), "` (see [`ServerError::number`]).")]
                $name = pb::ServerError::$name as isize,
            )*
        }

        impl ServerError {
            /// The code of a protocol number, or `None` for a number this version of the crate
            /// does not know.
            #[must_use]
            pub fn from_number(number: i32) -> Option<Self> {
                match pb::ServerError::try_from(number).ok()? {
                    $(pb::ServerError::$name => Some(Self::$name),)*
                }
            }

            /// The protocol's number, e.g. `11` for [`ServerError::TopicNotFound`].
            #[must_use]
            pub fn number(self) -> i32 {
                match self {
                    $(Self::$name => pb::ServerError::$name as i32,)*
                }
            }

            /// The protocol's name, e.g. `TopicNotFound`.
            #[must_use]
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$name => pb::ServerError::$name.as_str_name(),)*
                }
            }
        }
    };
}

server_errors!(
    UnknownError,
    MetadataError,
    PersistenceError,
    AuthenticationError,
    AuthorizationError,
    ConsumerBusy,
    ServiceNotReady,
    ProducerBlockedQuotaExceededError,
    ProducerBlockedQuotaExceededException,
    ChecksumError,
    UnsupportedVersionError,
    TopicNotFound,
    SubscriptionNotFound,
    ConsumerNotFound,
    TooManyRequests,
    TopicTerminatedError,
    ProducerBusy,
    InvalidTopicName,
    IncompatibleSchema,
    ConsumerAssignError,
    TransactionCoordinatorNotFound,
    InvalidTxnStatus,
    NotAllowedError,
    TransactionConflict,
    TransactionNotFound,
    ProducerFenced,
);

impl std::fmt::Display for ServerError {
    /// The protocol's name, e.g. `TopicNotFound`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_of_the_protocol_round_trips() {
        let mut known = 0;
        for number in -1..=100 {
            match (
                ServerError::from_number(number),
                pb::ServerError::try_from(number),
            ) {
                (Some(code), Ok(generated)) => {
                    known += 1;
                    assert_eq!(code.number(), number);
                    assert_eq!(code.name(), generated.as_str_name());
                }
                (None, Err(_)) => {}
                (ours, theirs) => panic!("{number}: {ours:?} against {theirs:?}"),
            }
        }
        assert_eq!(known, 26);
        assert_eq!(ServerError::TopicNotFound.number(), 11);
        assert_eq!(ServerError::TopicNotFound as i32, 11);
        assert_eq!(ServerError::TopicNotFound.to_string(), "TopicNotFound");
    }
}
