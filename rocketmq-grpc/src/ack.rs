//! Acknowledgements through `ack-batcher`: one `AckMessage` request per (endpoint, topic) batch,
//! results mapped back per message id.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{Flush, FlushResult, ItemReply, Matched};

use crate::pb;
use crate::{Endpoint, Error, Session};

/// The batching key of an ack: a request carries one topic and goes to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AckKey {
    /// Where the message was received from (acks go back there).
    pub endpoint: Endpoint,
    /// The message's original topic (the proxy derives the retry topic from the handle).
    pub topic: String,
}

/// One message to acknowledge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckEntry {
    /// `SystemProperties.message_id`: results are matched by it.
    pub message_id: String,
    /// The receipt handle exactly as received.
    pub receipt_handle: String,
    /// The message's lite topic, for a lite consumer's ack (`AckMessageEntry.lite_topic`,
    /// RocketMQ 5.4+): the proxy then acks on the lite topic's queue, one entry at a time.
    /// `None` for every other consumer.
    pub lite_topic: Option<String>,
}

/// Sends batches of acks as `AckMessage` requests for one consumer group.
#[derive(Debug, Clone)]
pub struct AckFlusher {
    session: Arc<Session>,
    group: pb::Resource,
    timeout: Duration,
}

impl AckFlusher {
    /// Acks for `group` over `session`, each request with the session's request timeout.
    pub fn new(session: Arc<Session>, group: &str) -> Self {
        let group = session.resource(group);
        let timeout = session.config().request_timeout;
        Self {
            session,
            group,
            timeout,
        }
    }

    /// Builds the request for one batch.
    pub(crate) fn request(&self, key: &AckKey, entries: &[AckEntry]) -> pb::AckMessageRequest {
        pb::AckMessageRequest {
            group: Some(self.group.clone()),
            topic: Some(self.session.resource(&key.topic)),
            entries: entries
                .iter()
                .map(|entry| pb::AckMessageEntry {
                    message_id: entry.message_id.clone(),
                    receipt_handle: entry.receipt_handle.clone(),
                    lite_topic: entry.lite_topic.clone(),
                })
                .collect(),
        }
    }
}

impl Flush<AckKey, AckEntry> for AckFlusher {
    type Output = ();
    type Error = Error;

    async fn flush(&self, key: &AckKey, entries: &[AckEntry]) -> FlushResult<(), Error> {
        let mut client = self.session.client(&key.endpoint)?;
        let request = self
            .session
            .request(self.request(key, entries), self.timeout);
        let response = client
            .ack_message(request)
            .await
            .map_err(|status| Error::rpc("AckMessage", status));
        self.session.link().observe(&response);
        let response = response?.into_inner();
        map_ack_response(entries, response)
    }
}

/// Maps an `AckMessageResponse` onto the entries of its request, following the proxy's rules:
/// - with result entries, each message gets the entry with its id (in any order; duplicates in
///   submission order); a message without one is missing, hence retried;
/// - without result entries, a non-OK top-level status fails the whole batch, and an OK one
///   means the results are missing (retried).
///
/// Public through `wire` (`unstable-wire`).
#[cfg_attr(not(feature = "unstable-wire"), allow(unreachable_pub))]
pub fn map_ack_response(
    entries: &[AckEntry],
    response: pb::AckMessageResponse,
) -> FlushResult<(), Error> {
    if response.entries.is_empty() {
        return match Error::check("AckMessage", response.status.as_ref()) {
            Ok(()) => Ok(vec![ItemReply::Missing; entries.len()]),
            Err(error) => Err(error),
        };
    }
    let matched = Matched::by_id(
        entries.iter().map(|entry| entry.message_id.as_str()),
        response
            .entries
            .iter()
            .map(|result| (result.message_id.as_str(), result.status.as_ref())),
    );
    if !matched.extras.is_empty() {
        tracing::warn!(
            extras = matched.extras.len(),
            "AckMessage answered for message ids that were not in the request; ignored"
        );
    }
    Ok(matched.into_replies(|status| Error::check("AckMessage", status)))
}

/// Whether an ack error means the receipt handle is no longer valid (never retried).
///
/// `INVALID_RECEIPT_HANDLE` "cannot find broker ..." is not: the proxy says that when its
/// route to the broker named in the handle is missing (the broker restarts), and the handle
/// may still be valid (see [`Error::is_retryable`]).
pub fn is_invalid_receipt_handle(error: &Error) -> bool {
    error.code() == Some(crate::Code::InvalidReceiptHandle) && !error.is_retryable()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::Code;

    fn entry(id: &str) -> AckEntry {
        AckEntry {
            message_id: id.into(),
            receipt_handle: format!("rh-{id}"),
            lite_topic: None,
        }
    }

    fn status(code: Code) -> Option<pb::Status> {
        Some(pb::Status {
            code: code as i32,
            message: code.as_str_name().into(),
        })
    }

    fn result(id: &str, code: Code) -> pb::AckMessageResultEntry {
        pb::AckMessageResultEntry {
            message_id: id.into(),
            receipt_handle: String::new(),
            status: status(code),
        }
    }

    #[test]
    fn mixed_results_are_mapped_by_id_in_any_order() {
        let entries = [entry("a"), entry("b"), entry("c")];
        let replies = map_ack_response(
            &entries,
            pb::AckMessageResponse {
                status: status(Code::MultipleResults),
                entries: vec![
                    result("c", Code::InternalServerError),
                    result("a", Code::InvalidReceiptHandle),
                ],
            },
        )
        .unwrap();
        assert!(
            matches!(&replies[0], ItemReply::Err(e) if is_invalid_receipt_handle(e) && !e.is_retryable())
        );
        assert!(matches!(&replies[1], ItemReply::Missing));
        assert!(matches!(&replies[2], ItemReply::Err(e) if e.is_retryable()));
    }

    #[test]
    fn a_missing_broker_route_is_retried_an_expired_handle_is_not() {
        let entries = [entry("a"), entry("b"), entry("c")];
        let with = |code: Code, message: &str, id: &str| pb::AckMessageResultEntry {
            message_id: id.into(),
            receipt_handle: String::new(),
            status: Some(pb::Status {
                code: code as i32,
                message: message.into(),
            }),
        };
        // Right after broker-a restarted on a two-broker cluster.
        let replies = map_ack_response(
            &entries,
            pb::AckMessageResponse {
                status: status(Code::MultipleResults),
                entries: vec![
                    with(
                        Code::InvalidReceiptHandle,
                        "cannot find broker broker-a",
                        "a",
                    ),
                    with(
                        Code::InternalServerError,
                        "connect to 10.0.0.7:10911 failed",
                        "b",
                    ),
                    with(Code::InvalidReceiptHandle, "receipt handle is expired", "c"),
                ],
            },
        )
        .unwrap();
        let error = |i: usize| match &replies[i] {
            ItemReply::Err(e) => e.clone(),
            other => panic!("{other:?}"),
        };
        assert!(error(0).is_retryable() && !is_invalid_receipt_handle(&error(0)));
        assert!(error(1).is_retryable());
        assert!(!error(2).is_retryable() && is_invalid_receipt_handle(&error(2)));
    }

    #[test]
    fn top_level_status_without_entries() {
        let entries = [entry("a"), entry("b")];
        let missing = map_ack_response(
            &entries,
            pb::AckMessageResponse {
                status: status(Code::Ok),
                entries: vec![],
            },
        )
        .unwrap();
        assert!(missing.iter().all(|r| matches!(r, ItemReply::Missing)));
        let refused = map_ack_response(
            &entries,
            pb::AckMessageResponse {
                status: status(Code::TooManyRequests),
                entries: vec![],
            },
        )
        .unwrap_err();
        assert_eq!(refused.code(), Some(crate::Code::TooManyRequests));
        assert!(refused.is_retryable());
        assert!(
            refused.to_string().contains("TOO_MANY_REQUESTS"),
            "{refused}"
        );
    }

    #[test]
    fn all_ok_results() {
        let entries = [entry("a"), entry("a")];
        let replies = map_ack_response(
            &entries,
            pb::AckMessageResponse {
                status: status(Code::Ok),
                entries: vec![result("a", Code::Ok), result("a", Code::Ok)],
            },
        )
        .unwrap();
        assert!(replies.iter().all(|r| matches!(r, ItemReply::Ok(()))));
    }
}
