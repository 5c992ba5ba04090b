//! Transactional messages: a [`Transaction`] holds a half message (stored by the broker but
//! invisible to consumers) until it is committed or rolled back with `EndTransaction`; a
//! [`TransactionChecker`](super::TransactionChecker) answers the broker's check of a transaction left open (the producer
//! crashed before ending it), which the proxy forwards on the telemetry stream as a
//! `RecoverOrphanedTransactionCommand` to a producer that announced the topic.
//!
//! As in the official Java 5 client: one message per transaction, a checker required before
//! a transaction begins, `EndTransaction` sent to the endpoint that took the half message with
//! source `SOURCE_CLIENT` (or `SOURCE_SERVER_CHECK` when answering a check).

use std::sync::Arc;

use parking_lot::Mutex;

use super::checker::TransactionResolution;
use super::state::Inner;
use crate::pb;
use crate::{Endpoint, Error, ReceivedMessage};

/// The half message a transaction sent.
#[derive(Debug, Clone)]
pub(super) struct Half {
    pub(super) topic: String,
    pub(super) message_id: String,
    pub(super) transaction_id: String,
    pub(super) endpoint: Endpoint,
}

/// Where a transaction stands.
#[derive(Debug)]
pub(super) enum Stage {
    /// Begun; the half message once sent.
    Open(Option<Half>),
    /// Committed or rolled back (the word says which).
    Ended(&'static str),
}

/// A transaction of a [`Producer`](super::Producer), from
/// [`Producer::begin_transaction`](super::Producer::begin_transaction).
///
/// Send its message with [`Producer::send_in`](super::Producer::send_in), do the local work,
/// then [`commit`](Self::commit) or [`rollback`](Self::rollback). A transaction neither
/// committed nor rolled back (the process crashed, or the transaction was dropped) is
/// decided later by the broker's check, answered by the producer's [`TransactionChecker`](super::TransactionChecker)
/// (of this process, or of the next producer of the topic).
#[derive(Debug)]
pub struct Transaction {
    pub(super) producer: Arc<Inner>,
    pub(super) stage: Mutex<Stage>,
}

impl Transaction {
    /// Commits: the message becomes visible to consumers.
    ///
    /// # Errors
    /// [`Error::Invalid`] (naming `transaction`) when the transaction already ended or
    /// has no message yet (as the Java client: most likely its send failed; the transaction
    /// stays open, so send it, or roll back);
    /// the proxy's refusal or a transport error otherwise: a retryable one
    /// ([`Error::is_retryable`]) may be retried with `commit` again, and the broker's check
    /// decides the transaction if it is never ended; [`Error::Closed`] after
    /// [`Producer::close`](super::Producer::close).
    pub async fn commit(&self) -> Result<(), Error> {
        self.end(pb::TransactionResolution::Commit, "committed")
            .await
    }

    /// Rolls back: the message is discarded. A transaction without a message rolls back
    /// nothing and just ends (so an error path may roll back whether or not the send went
    /// out; the Java client refuses that).
    ///
    /// # Errors
    /// [`Error::Invalid`] (naming `transaction`) when the transaction already ended;
    /// otherwise as [`commit`](Self::commit).
    pub async fn rollback(&self) -> Result<(), Error> {
        self.end(pb::TransactionResolution::Rollback, "rolled back")
            .await
    }

    async fn end(
        &self,
        resolution: pb::TransactionResolution,
        ended: &'static str,
    ) -> Result<(), Error> {
        self.producer.check_open()?;
        let half = match &*self.stage.lock() {
            Stage::Ended(how) => return Err(ended_error(how)),
            Stage::Open(None) if resolution == pb::TransactionResolution::Commit => {
                return Err(Error::invalid(
                    "transaction",
                    "the transaction has no message to commit (its send_in failed or was \
                     not made): send it with Producer::send_in, or roll back",
                ));
            }
            Stage::Open(half) => half.clone(),
        };
        if let Some(half) = half {
            end_transaction(
                &self.producer,
                &half,
                resolution,
                pb::TransactionSource::SourceClient,
            )
            .await?;
        }
        *self.stage.lock() = Stage::Ended(ended);
        Ok(())
    }
}

/// The error for a transaction used after it `how` (committed, rolled back).
pub(super) fn ended_error(how: &str) -> Error {
    Error::invalid(
        "transaction",
        format!("the transaction was already {how}; begin a new one"),
    )
}

/// Sends `EndTransaction` for `half` to the endpoint that took it.
pub(super) async fn end_transaction(
    inner: &Inner,
    half: &Half,
    resolution: pb::TransactionResolution,
    source: pb::TransactionSource,
) -> Result<(), Error> {
    let session = &inner.session;
    let request = pb::EndTransactionRequest {
        topic: Some(session.resource(&half.topic)),
        message_id: half.message_id.clone(),
        transaction_id: half.transaction_id.clone(),
        resolution: resolution as i32,
        source: source as i32,
        trace_context: String::new(),
    };
    let timeout = session.config().request_timeout;
    let mut client = session.client(&half.endpoint)?;
    let response = client
        .end_transaction(session.request(request, timeout))
        .await
        .map_err(|status| Error::rpc("EndTransaction", status))?
        .into_inner();
    Error::check("EndTransaction", response.status.as_ref())
}

/// Answers a `RecoverOrphanedTransactionCommand` from the proxy at `endpoint`: asks the
/// checker, then ends the transaction with source `SOURCE_SERVER_CHECK`, unless the answer is
/// [`TransactionResolution::Unknown`] (the broker asks again later) or the producer has no
/// checker (logged: the broker asks again, perhaps another producer of the topic).
pub(super) async fn recover(
    inner: Arc<Inner>,
    endpoint: Endpoint,
    command: pb::RecoverOrphanedTransactionCommand,
) {
    let Some(checker) = inner.checker.0.lock().clone() else {
        tracing::warn!(
            transaction_id = %command.transaction_id,
            "the proxy asked about an open transaction, but this producer has no transaction checker"
        );
        return;
    };
    let Some(message) = command.message else {
        tracing::warn!(transaction_id = %command.transaction_id, "an orphaned-transaction check without its message");
        return;
    };
    let topic = message
        .topic
        .as_ref()
        .map(|topic| topic.name.clone())
        .unwrap_or_default();
    let message = match ReceivedMessage::from_check(message, &endpoint) {
        Ok(message) => message,
        Err(error) => {
            tracing::warn!(transaction_id = %command.transaction_id, %error, "an orphaned-transaction check with a malformed message");
            return;
        }
    };
    let half = Half {
        topic,
        message_id: message.message_id.clone(),
        transaction_id: command.transaction_id,
        endpoint,
    };
    let resolution = match checker.check(message).await {
        TransactionResolution::Commit => pb::TransactionResolution::Commit,
        TransactionResolution::Rollback => pb::TransactionResolution::Rollback,
        TransactionResolution::Unknown => return,
    };
    if let Err(error) = end_transaction(
        &inner,
        &half,
        resolution,
        pb::TransactionSource::SourceServerCheck,
    )
    .await
    {
        tracing::warn!(message_id = %half.message_id, %error, "ending a checked transaction failed; the broker asks again");
    }
}
