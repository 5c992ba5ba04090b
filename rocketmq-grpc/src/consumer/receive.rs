//! One receive loop per assigned queue, and the handling of each received message.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::counters::Counters;
use super::handler::ConsumeResult;
use super::registration::registration_lost;
use super::state::{Inner, QueueKey};
use crate::backoff::Backoff;
use crate::pb::{self, Code};
use crate::{Endpoint, Error, ReceivedMessage, Session};

/// Backoff of a failing receive loop: from 200 ms doubling to 10 s, with jitter; a new
/// registration (settings announced again after a reconnect) ends the wait early.
const RECEIVE_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Receives from one queue until `stop`: long-polls for up to `receive_batch_size` messages
/// while the consumer has room, and hands each to the handler.
pub(super) async fn run(
    inner: Arc<Inner>,
    key: QueueKey,
    queue: pb::MessageQueue,
    endpoint: Endpoint,
    fifo: bool,
    stop: CancellationToken,
) {
    let Some(subscription) = inner.subscriptions.iter().find(|s| s.topic == key.topic) else {
        return;
    };
    let filter = subscription.filter.clone();
    let mut backoff = Backoff::new(RECEIVE_BACKOFF.0, RECEIVE_BACKOFF.1);
    let mut registered = inner.registration.subscribe();
    let mut attempt = 0u64;
    let mut idle = true;
    while !stop.is_cancelled() {
        // Room for a whole batch before asking for it: the consumer never holds more than its
        // concurrency. A receive holds its permits while it long-polls, so a queue that had
        // nothing last time (or has not received yet) asks for one message, and a busy queue
        // for at most its fair share of the concurrency: an idle queue's long poll must not
        // keep the other queues from receiving.
        let wanted = if idle {
            1
        } else {
            let queues = inner.queues.lock().len().max(1);
            let fair_share = i32::try_from(inner.concurrency / queues).unwrap_or(i32::MAX);
            inner.receive_batch_size.min(fair_share).max(1)
        };
        let permits = tokio::select! {
            () = stop.cancelled() => return,
            permits = Arc::clone(&inner.permits).acquire_many_owned(wanted as u32) => match permits {
                Ok(permits) => permits,
                Err(_) => return,
            },
        };
        attempt += 1;
        let long_polling = *inner.long_polling.lock();
        let generation = inner.registration.current();
        let request = pb::ReceiveMessageRequest {
            group: Some(inner.session.resource(&inner.group)),
            message_queue: Some(queue.clone()),
            filter_expression: Some(filter.clone()),
            batch_size: wanted,
            invisible_duration: None,
            auto_renew: true,
            long_polling_timeout: prost_types::Duration::try_from(long_polling).ok(),
            attempt_id: Some(format!(
                "{}-{}-{attempt}",
                inner.session.client_id(),
                key.queue_id
            )),
        };
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = receive(&inner.session, &endpoint, request, long_polling) => received,
        };
        idle = !matches!(&received, Ok(messages) if !messages.is_empty());
        let messages = match received {
            Ok(messages) => {
                backoff.reset();
                messages
            }
            Err(error) => {
                drop(permits);
                let wait = backoff.next_delay();
                tracing::warn!(topic = %key.topic, queue = key.queue_id, %error, ?wait, "receive failed; retrying");
                if let Some(generation) = generation
                    && registration_lost(&error)
                {
                    inner.registration.lost(generation);
                }
                registered.mark_unchanged();
                let renewed = async {
                    // Until a registration newer than the one this receive was made under.
                    let _ = registered
                        .wait_for(|state| state.is_some() && *state != generation)
                        .await;
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => continue,
                    () = renewed => continue,
                }
            }
        };
        let mut permits = permits;
        for message in messages {
            Counters::add(&inner.counters.received, 1);
            let Some(permit) = permits.split(1) else {
                break;
            };
            if fifo || message.is_fifo() {
                // In order: the next message of the queue waits for this one and its ack.
                consume(&inner, message).await;
                drop(permit);
            } else {
                let inner = Arc::clone(&inner);
                inner.tasks.clone().spawn(async move {
                    consume(&inner, message).await;
                    drop(permit);
                });
            }
        }
    }
}

/// One `ReceiveMessage` call: the messages it delivered (possibly none).
pub(super) async fn receive(
    session: &Session,
    endpoint: &Endpoint,
    request: pb::ReceiveMessageRequest,
    long_polling: Duration,
) -> Result<Vec<ReceivedMessage>, Error> {
    let mut client = session.client(endpoint)?;
    let deadline = long_polling + session.config().request_timeout;
    let mut stream = client
        .receive_message(session.request(request, deadline))
        .await
        .map_err(|status| Error::rpc("ReceiveMessage", status))?
        .into_inner();
    let mut messages = Vec::new();
    while let Some(frame) = stream
        .message()
        .await
        .map_err(|status| Error::rpc("ReceiveMessage", status))?
    {
        match frame.content {
            Some(pb::receive_message_response::Content::Status(status)) => {
                let code = status.code;
                // MESSAGE_NOT_FOUND ends a long poll that found nothing, but also says "The
                // client [...] is disconnected." when the proxy lost the client's channel: an
                // error, or the loop would spin without long polling.
                let nothing_new = code == Code::MessageNotFound as i32
                    && !status.message.contains("disconnected");
                if code != Code::Ok as i32 && !nothing_new {
                    Error::check("ReceiveMessage", Some(&status))?;
                }
            }
            Some(pb::receive_message_response::Content::Message(message)) => {
                match ReceivedMessage::from_pb(message, endpoint) {
                    Ok(message) => messages.push(message),
                    Err(error) => tracing::warn!(%error, "skipping a malformed message"),
                }
            }
            Some(pb::receive_message_response::Content::DeliveryTimestamp(_)) | None => {}
        }
    }
    Ok(messages)
}

/// Runs the handler, then acks or nacks.
async fn consume(inner: &Inner, message: ReceivedMessage) {
    match inner.handler.handle(&message).await {
        ConsumeResult::Success => {
            Counters::add(&inner.counters.consumed, 1);
            inner.ack(message).await;
        }
        ConsumeResult::Failure => {
            Counters::add(&inner.counters.failed, 1);
            inner.nack(&message).await;
        }
    }
}
