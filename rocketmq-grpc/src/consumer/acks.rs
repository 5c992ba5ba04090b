//! The consumer's ack and nack path.

use std::time::Duration;

use super::counters::Counters;
use super::state::Inner;
use crate::backoff;
use crate::pb;
use crate::{AckEntry, AckKey, Error, ReceivedMessage, SendRetryPolicy};

impl Inner {
    /// The lite topic requests about `message` carry: its own, for a lite consumer only.
    fn lite_topic_of(&self, message: &ReceivedMessage) -> Option<String> {
        self.lite.as_ref().and(message.lite_topic.clone())
    }

    /// Acknowledges a consumed message: batched, or at once for FIFO and late messages (or when
    /// batching is off). FIFO acks are awaited so that the next message of the group follows.
    pub(super) async fn ack(&self, message: ReceivedMessage) {
        let fifo = message.is_fifo();
        let options =
            self.ack_settings
                .item_options(message.received_at, message.invisible_until, fifo);
        // The message is done with: its strings move into the ack instead of being copied.
        let key = AckKey {
            endpoint: message.endpoint,
            topic: message.topic,
        };
        let entry = AckEntry {
            message_id: message.message_id,
            receipt_handle: message.receipt_handle,
            // Only a lite consumer acks on the lite topic's queue (as the Java client).
            lite_topic: self.lite.as_ref().and(message.lite_topic),
        };
        match self.acks.enqueue(key, entry, options).await {
            // Dropping a ticket does not withdraw the ack; its outcome is counted by the
            // observer.
            Ok(ticket) if fifo => {
                let _ = ticket.await;
            }
            Ok(_ticket) => {}
            Err(refused) => {
                tracing::warn!(error = %refused, "ack refused (consumer shutting down)");
                Counters::add(&self.counters.ack_abandoned, 1);
                if let Some(entry) = refused.into_item() {
                    self.unacknowledged.lock().insert(entry.message_id);
                }
            }
        }
    }

    /// Makes a failed message visible again after the retry delay for its attempt.
    pub(super) async fn nack(&self, message: &ReceivedMessage) {
        let delay = nack_delay(self.backoff.lock().as_ref(), message.delivery_attempt);
        match self
            .change_invisibility(
                message,
                &message.receipt_handle,
                message.invisible_until,
                delay,
            )
            .await
        {
            Ok(_) => Counters::add(&self.counters.nacked, 1),
            // The message becomes visible again when its invisibility ends anyway.
            Err(error) => {
                tracing::warn!(message_id = %message.message_id, %error, "nack failed; the proxy redelivers after the invisibility ends");
            }
        }
    }

    /// Sets the invisibility of `message`, whose current receipt handle is `receipt_handle`
    /// (invisible until `expires`), to `duration` from now with `ChangeInvisibleDuration`
    /// and returns the new receipt handle, retried as [`Self::retrying`] does.
    pub(super) async fn change_invisibility(
        &self,
        message: &ReceivedMessage,
        receipt_handle: &str,
        expires: tokio::time::Instant,
        duration: Duration,
    ) -> Result<String, Error> {
        let request = pb::ChangeInvisibleDurationRequest {
            group: Some(self.session.resource(&self.group)),
            topic: Some(self.session.resource(&message.topic)),
            receipt_handle: receipt_handle.to_owned(),
            invisible_duration: prost_types::Duration::try_from(duration).ok(),
            message_id: message.message_id.clone(),
            lite_topic: self.lite_topic_of(message),
            suspend: None,
        };
        let timeout = self.session.config().request_timeout;
        self.retrying(message, expires, || async {
            let mut client = self.session.client(&message.endpoint)?;
            let response = client
                .change_invisible_duration(self.session.request(request.clone(), timeout))
                .await
                .map_err(|status| Error::rpc("ChangeInvisibleDuration", status))?
                .into_inner();
            Error::check("ChangeInvisibleDuration", response.status.as_ref())?;
            Ok(response.receipt_handle)
        })
        .await
    }

    /// Sends `message` (its latest receipt handle) to the group's dead-letter queue with
    /// `ForwardMessageToDeadLetterQueue`, as the Java client does for a FIFO message whose
    /// attempts are used up, retried as [`Self::retrying`] does.
    pub(super) async fn forward_to_dead_letters(
        &self,
        message: &ReceivedMessage,
        max_attempts: i32,
    ) -> Result<(), Error> {
        let request = pb::ForwardMessageToDeadLetterQueueRequest {
            group: Some(self.session.resource(&self.group)),
            topic: Some(self.session.resource(&message.topic)),
            receipt_handle: message.receipt_handle.clone(),
            message_id: message.message_id.clone(),
            delivery_attempt: message.delivery_attempt,
            max_delivery_attempts: max_attempts,
            lite_topic: self.lite_topic_of(message),
        };
        let timeout = self.session.config().request_timeout;
        self.retrying(message, message.invisible_until, || async {
            let mut client = self.session.client(&message.endpoint)?;
            let response = client
                .forward_message_to_dead_letter_queue(
                    self.session.request(request.clone(), timeout),
                )
                .await
                .map_err(|status| Error::rpc("ForwardMessageToDeadLetterQueue", status))?
                .into_inner();
            Error::check("ForwardMessageToDeadLetterQueue", response.status.as_ref())
        })
        .await
    }

    /// Runs `call` about `message` until it succeeds, retrying retryable failures with
    /// exponential backoff and jitter (from
    /// [`AckSettings::retry_backoff`](super::AckSettings::retry_backoff) to
    /// [`AckSettings::max_retry_backoff`](super::AckSettings::max_retry_backoff)) while the
    /// receipt handle is valid (until `expires`). A stopped consumer gives up (the message
    /// is left to its invisibility).
    async fn retrying<T, F, Fut>(
        &self,
        message: &ReceivedMessage,
        expires: tokio::time::Instant,
        mut call: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut backoff = backoff::exponential(
            self.ack_settings.retry_backoff,
            self.ack_settings.max_retry_backoff,
        );
        loop {
            let error = match call().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let wait = backoff.next_delay();
            if !error.is_retryable() || tokio::time::Instant::now() + wait >= expires {
                return Err(error);
            }
            tracing::debug!(message_id = %message.message_id, %error, ?wait, "retrying");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.stop.cancelled() => return Err(error),
            }
        }
    }
}

/// The redelivery delay for a failed delivery attempt: from the server's backoff policy
/// (announced on the telemetry stream) when it sent one, else exponential from 1 s, capped at
/// 60 s.
pub(super) fn nack_delay(policy: Option<&pb::RetryPolicy>, delivery_attempt: i32) -> Duration {
    let attempt = u32::try_from(delivery_attempt.max(1)).unwrap_or(1);
    policy
        .and_then(SendRetryPolicy::from_pb)
        .map(|policy| policy.backoff_delay(attempt))
        .unwrap_or_else(|| {
            let exponent = attempt.clamp(1, 7) - 1;
            Duration::from_secs(1 << exponent).min(Duration::from_secs(60))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: s,
            nanos: 0,
        })
    }

    #[test]
    fn nack_delays_follow_the_servers_policy() {
        assert_eq!(nack_delay(None, 1), Duration::from_secs(1));
        assert_eq!(nack_delay(None, 3), Duration::from_secs(4));
        assert_eq!(nack_delay(None, 30), Duration::from_secs(60));
        let exponential = pb::RetryPolicy {
            max_attempts: 16,
            strategy: Some(pb::retry_policy::Strategy::ExponentialBackoff(
                pb::ExponentialBackoff {
                    initial: secs(2),
                    max: secs(10),
                    multiplier: 3.0,
                },
            )),
        };
        let delays: Vec<_> = (1..=4)
            .map(|a| nack_delay(Some(&exponential), a).as_secs())
            .collect();
        assert_eq!(delays, [2, 6, 10, 10]);
        let customized = pb::RetryPolicy {
            max_attempts: 16,
            strategy: Some(pb::retry_policy::Strategy::CustomizedBackoff(
                pb::CustomizedBackoff {
                    next: vec![secs(1).unwrap(), secs(5).unwrap()],
                },
            )),
        };
        let delays: Vec<_> = (1..=3)
            .map(|a| nack_delay(Some(&customized), a).as_secs())
            .collect();
        assert_eq!(delays, [1, 5, 5]);
        let empty = pb::RetryPolicy {
            max_attempts: 16,
            strategy: Some(pb::retry_policy::Strategy::CustomizedBackoff(
                pb::CustomizedBackoff { next: vec![] },
            )),
        };
        assert_eq!(
            nack_delay(Some(&empty), 2),
            Duration::from_secs(2),
            "falls back"
        );
    }
}
