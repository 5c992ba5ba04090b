//! The receive loops of each assigned queue, and the handling of each received message.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::acks::nack_delay;
use super::counters::Counters;
use super::handler::ConsumeResult;
use super::registration::registration_lost;
use super::state::{Inner, QueueKey};
use crate::backoff;
use crate::pb::{self, Code};
use crate::{Endpoint, Error, ReceivedMessage, Session};

/// Backoff of a failing receive loop: from 200 ms doubling to 10 s, with jitter; a new
/// registration (settings announced again after a reconnect) ends the wait early.
const RECEIVE_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// How many receive loops long-poll a queue that is not FIFO: its loop, and a standby that
/// asks for one message at a time.
///
/// The broker (`PopLongPollingService`, 5.3.3 and 5.5.0) wakes one suspended pop when a
/// message arrives, but a message that arrives while a pop is between its scan of the queue
/// (nothing found) and its suspension wakes nobody: that pop sleeps its whole long-polling
/// time, and the message waits with it. With one loop per queue, a message sent right after
/// another one (which the loop had just received) waited the full 20 s in 5 of 1,000 pairs on
/// 5.3.3; the official Java client, one receive per queue, has the same wait. With a standby
/// poll suspended beside the loop's, the arrival wakes the standby.
pub(super) const POLLS_PER_QUEUE: usize = 2;

/// One receive loop's queue.
pub(super) struct Poll {
    /// The queue's key in the consumer's assignment.
    pub(super) key: QueueKey,
    /// The queue, as assigned.
    pub(super) queue: pb::MessageQueue,
    /// The endpoint that serves it.
    pub(super) endpoint: Endpoint,
    /// Whether it is a FIFO queue (received in order by one loop).
    pub(super) fifo: bool,
    /// This loop's number among the queue's loops: 0 for the loop that receives batches, 1
    /// and more for standbys (in its receives' attempt ids).
    pub(super) index: usize,
}

/// Whether standby polls run: each holds a permit while it long-polls, so they run only while
/// the concurrency leaves room for them beside one loop per queue (at least
/// [`POLLS_PER_QUEUE`] permits per assigned queue); with less, only the queues' loops poll, as
/// they did before standbys.
fn standbys_fit(inner: &Inner) -> bool {
    inner.concurrency >= POLLS_PER_QUEUE * inner.queues.lock().len().max(1)
}

/// Receives from one queue until `stop`: long-polls for up to `receive_batch_size` messages
/// (a standby: one) while the consumer has room, and hands each to the handler. A receive
/// under way when `stop` comes is finished and its messages handled; closing the consumer
/// drops it.
pub(super) async fn run(inner: Arc<Inner>, poll: Poll, stop: CancellationToken) {
    let Poll {
        key,
        queue,
        endpoint,
        fifo,
        index,
    } = poll;
    let standby = index > 0;
    let mut link = inner.session.link().subscribe();
    let Some(subscription) = inner.subscriptions.iter().find(|s| s.topic == key.topic) else {
        return;
    };
    let filter = subscription.filter.clone();
    let mut backoff = backoff::exponential(RECEIVE_BACKOFF.0, RECEIVE_BACKOFF.1);
    let mut registered = inner.registration.subscribe();
    let mut attempt = 0u64;
    let mut idle = true;
    // The priority gate's partition of this topic and its paused flag.
    let gated = inner.gate.as_ref().and_then(|gate| {
        let partition = gate.partition_of(&key.topic)?;
        Some((Arc::clone(gate), partition, gate.paused(partition)?))
    });
    let mut paused = gated.as_ref().map(|(_, _, paused)| paused.clone());
    while !stop.is_cancelled() {
        if standby && !standbys_fit(&inner) {
            // Checked again after a long poll's time: assignments change rarely.
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(*inner.long_polling.lock()) => continue,
            }
        }
        // Held back by the priority gate: wait before taking any permits, so that they go to
        // the more important levels.
        if let Some(paused) = paused.as_mut() {
            tokio::select! {
                () = stop.cancelled() => return,
                resumed = paused.wait_for(|paused| !*paused) => if resumed.is_err() { return },
            }
        }
        // Room for each message before asking for it: the consumer never holds more than its
        // concurrency. A receive holds its permits while it long-polls, so a queue that had
        // nothing last time (or has not received yet) asks for one message, and a busy queue
        // for at most its fair share of the concurrency: an idle queue's long poll must not
        // keep the other queues from receiving. A busy queue waits for one permit and takes
        // whatever more is free up to its share, instead of waiting for the whole share: an
        // idle queue's one permit would otherwise keep a busy queue whose share is half the
        // concurrency from receiving its next batch until a handler finished, which halved
        // its throughput (2 ms handlers, concurrency 64: 15,000 messages/s on one topic,
        // 3,000-7,000 with a second, idle topic on 5.3.3).
        let most = if idle || standby {
            1
        } else {
            let queues = inner.queues.lock().len().max(1);
            let fair_share = i32::try_from(inner.concurrency / queues).unwrap_or(i32::MAX);
            inner.receive_batch_size.min(fair_share).max(1)
        };
        let held_back = async {
            match paused.as_mut() {
                Some(paused) => {
                    let _ = paused.wait_for(|paused| *paused).await;
                }
                None => std::future::pending().await,
            }
        };
        let mut permits = tokio::select! {
            () = stop.cancelled() => return,
            permits = Arc::clone(&inner.permits).acquire_owned() => match permits {
                Ok(permits) => permits,
                Err(_) => return,
            },
            // Paused while waiting for permits: leave the queue to the other levels.
            () = held_back => continue,
        };
        let more = u32::try_from(most.saturating_sub(1))
            .unwrap_or(0)
            .min(u32::try_from(inner.permits.available_permits()).unwrap_or(u32::MAX));
        if more > 0
            && let Ok(extra) = Arc::clone(&inner.permits).try_acquire_many_owned(more)
        {
            permits.merge(extra);
        }
        let wanted = i32::try_from(permits.num_permits()).unwrap_or(1);
        attempt += 1;
        let long_polling = *inner.long_polling.lock();
        let generation = inner.registration.current();
        let request = pb::ReceiveMessageRequest {
            group: Some(inner.session.resource(&inner.group)),
            message_queue: Some(inner.session.queue(queue.clone())),
            filter_expression: Some(filter.to_pb()),
            batch_size: wanted,
            invisible_duration: None,
            auto_renew: true,
            long_polling_timeout: prost_types::Duration::try_from(long_polling).ok(),
            attempt_id: Some(format!(
                "{}-{}-{index}-{attempt}",
                inner.session.client_id(),
                key.queue_id
            )),
        };
        // A receive under way when the queue is no longer assigned is finished, and what it
        // brings is handled: the broker made those messages invisible when it popped them, so
        // dropped here they would come back only after their invisible time, and only if the
        // broker revives them (a 5.3.3 cluster broker short of direct memory did not: one
        // message of 5,000 never came back). The proxy pops from another broker when the
        // queue's broker has left the route, so a long poll of a broker that just failed can
        // bring messages of a healthy one. Only closing the consumer drops a receive.
        let received = tokio::select! {
            () = inner.stop.cancelled() => return,
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
                let error = crate::filter::explain_filter_error(error, &key.topic, &filter);
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
                    () = tokio::time::sleep(wait) => {}
                    () = renewed => {}
                }
                if standby {
                    // While the proxy cannot be reached, the queue's loop alone tries again.
                    link.mark_unchanged();
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = link.wait_for(crate::LinkState::is_connected) => {}
                    }
                }
                continue;
            }
        };
        let gate = gated
            .as_ref()
            .map(|(gate, partition, _)| (Arc::clone(gate), *partition));
        if let Some((gate, partition)) = &gate {
            gate.arrived(*partition, &messages);
            gate.answered(*partition, wanted as usize, messages.len());
        }
        let mut messages = messages.into_iter();
        for message in messages.by_ref() {
            Counters::add(&inner.counters.received, 1);
            let Some(permit) = permits.split(1) else {
                // More than asked for (never from the proxy): left to its invisibility.
                if let Some((gate, partition)) = &gate {
                    gate.finished(*partition, false);
                }
                break;
            };
            let gate = gate.clone();
            if fifo || message.is_fifo() {
                // In order: the next message of the queue waits for this one and its ack.
                let acked = consume(&inner, message).await;
                drop(permit);
                if let Some((gate, partition)) = gate {
                    gate.finished(partition, acked);
                }
            } else {
                let inner = Arc::clone(&inner);
                inner.tasks.clone().spawn(async move {
                    let acked = consume(&inner, message).await;
                    drop(permit);
                    if let Some((gate, partition)) = gate {
                        gate.finished(partition, acked);
                    }
                });
            }
        }
        if let Some((gate, partition)) = &gate {
            for _ in messages {
                gate.finished(*partition, false);
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
    let received = receive_once(session, endpoint, request, long_polling).await;
    session.link().observe(&received);
    received
}

async fn receive_once(
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
    // One queue's messages: one topic.
    if let Some(first) = messages.first() {
        crate::metrics::received(&first.topic, messages.len());
    }
    Ok(messages)
}

/// What became of a message after its handler and its local retries.
enum Outcome {
    /// Handled: acknowledge it.
    Success,
    /// Failed at this attempt: make it visible again after the retry policy's delay for it.
    Failure(i32),
    /// Failed every attempt the policy allows (this many): forward it to the dead-letter
    /// queue.
    DeadLetter(i32),
}

/// Runs the handler, renewing the message's invisibility while it runs, then acks, nacks or
/// dead-letters with the latest receipt handle. Returns whether the message is done with
/// (acknowledged or dead-lettered) rather than left to come back.
async fn consume(inner: &Inner, mut message: ReceivedMessage) -> bool {
    let renewed = {
        let message = &message;
        renew_while(inner, message, handle_retrying(inner, message)).await
    };
    let (outcome, latest) = renewed;
    if let Some(latest) = latest {
        // Still received when it was: a renewed message is late, and acked at once.
        message.receipt_handle = latest.receipt_handle;
        message.invisible_until = latest.invisible_until;
    }
    match outcome {
        Outcome::Success => {
            Counters::add(&inner.counters.consumed, 1);
            inner.ack(message).await;
            true
        }
        Outcome::Failure(attempt) => {
            message.delivery_attempt = attempt;
            inner.nack(&message).await;
            false
        }
        Outcome::DeadLetter(max_attempts) => {
            match inner.forward_to_dead_letters(&message, max_attempts).await {
                Ok(()) => {
                    Counters::add(&inner.counters.dead_lettered, 1);
                    true
                }
                Err(error) => {
                    tracing::warn!(message_id = %message.message_id, %error, "forwarding a message to the dead-letter queue failed; the proxy delivers it again after its invisibility");
                    false
                }
            }
        }
    }
}

/// Runs the handler on `message`, retrying a failure here after the retry policy's delay for
/// its attempt (the handler sees each attempt's number in `delivery_attempt`), until the
/// policy's attempts are used up; then the message goes to the dead-letter queue.
///
/// - A FIFO message is always retried here, as the Java client does: the rest of its queue
///   waits, so the order holds. So is a native priority message above priority 0 in a
///   priority consumer (`Inner::retry_in_place`), so that it keeps its rank.
/// - A normal message is retried here while the delay ends before the receive's invisibility
///   does, and otherwise nacked ([`Outcome::Failure`]: `ChangeInvisibleDuration` to the delay).
///   The proxy cannot make a message visible before the invisibility it was received with
///   ends: a nack of 1 s on a 20 s receive came back after 20 s on the 5.3.3 proxy (the new
///   checkpoint waits behind the receive's own in the broker's revive queue), so a nack alone
///   turns the policy's short first delays into the invisible duration. The broker counts
///   only its own deliveries: a message nacked after local attempts comes back with the
///   broker's count, and the dead-letter limit the broker applies to it counts those.
async fn handle_retrying(inner: &Inner, message: &ReceivedMessage) -> Outcome {
    // Held here for every retry: a FIFO message, and a native priority message above the
    // lowest priority (`Inner::retry_in_place`).
    let hold =
        message.is_fifo() || (inner.retry_in_place && message.priority.is_some_and(|p| p > 0));
    let mut attempt = message.clone();
    loop {
        if inner.handler.handle(&attempt).await == ConsumeResult::Success {
            return Outcome::Success;
        }
        Counters::add(&inner.counters.failed, 1);
        let (max_attempts, delay) = {
            let policy = inner.backoff.lock();
            let max_attempts = policy
                .as_ref()
                .map_or(DEFAULT_MAX_ATTEMPTS, |policy| policy.max_attempts)
                .max(1);
            (
                max_attempts,
                nack_delay(policy.as_ref(), attempt.delivery_attempt),
            )
        };
        if attempt.delivery_attempt >= max_attempts {
            return Outcome::DeadLetter(max_attempts);
        }
        let retry_at = Instant::now() + delay;
        if !hold && retry_at + LOCAL_RETRY_MARGIN > message.invisible_until {
            return Outcome::Failure(attempt.delivery_attempt);
        }
        tokio::select! {
            () = tokio::time::sleep_until(retry_at) => {}
            // Stopping: the message is left to its invisibility.
            () = inner.stop.cancelled() => return Outcome::Failure(attempt.delivery_attempt),
        }
        attempt.delivery_attempt += 1;
    }
}

/// How long before a normal message's invisibility ends a local retry must begin; later
/// ones are nacks.
const LOCAL_RETRY_MARGIN: Duration = Duration::from_secs(2);

/// The attempts of a message when the proxy announced no retry policy: the broker's
/// default for a group (16 retries) plus the first delivery.
const DEFAULT_MAX_ATTEMPTS: i32 = 17;

/// A receipt handle obtained by renewing a message's invisibility.
struct Renewed {
    receipt_handle: String,
    renewed_at: Instant,
    invisible_until: Instant,
}

/// Runs `handling` to its end; meanwhile, with renewal on, extends the message's
/// invisibility by the renewal period whenever its end comes near (see [`renew_at`]), so
/// that a slow handler's message is not delivered again to another consumer and its ack is
/// not refused as expired. Returns the handler's result and the latest renewed handle. A
/// renewal that fails for good stops the renewals (the message may then come again).
async fn renew_while(
    inner: &Inner,
    message: &ReceivedMessage,
    handling: impl Future<Output = Outcome>,
) -> (Outcome, Option<Renewed>) {
    let mut handling = std::pin::pin!(handling);
    if inner.renewal.is_zero() {
        return (handling.await, None);
    }
    let mut latest: Option<Renewed> = None;
    loop {
        let (since, until) = latest
            .as_ref()
            .map_or((message.received_at, message.invisible_until), |renewed| {
                (renewed.renewed_at, renewed.invisible_until)
            });
        tokio::select! {
            result = &mut handling => return (result, latest),
            () = tokio::time::sleep_until(renew_at(since, until)) => {}
        }
        let renewed_at = Instant::now();
        let handle = latest.as_ref().map_or_else(
            || message.receipt_handle.clone(),
            |renewed| renewed.receipt_handle.clone(),
        );
        // The handler keeps running during the renewal; if it ends first, its result waits
        // for the renewal (the handle the renewal returns is the one to ack with).
        let renewing = inner.change_invisibility(message, &handle, until, inner.renewal);
        let mut renewing = std::pin::pin!(renewing);
        let mut finished = None;
        let outcome = loop {
            tokio::select! {
                outcome = &mut renewing => break outcome,
                result = &mut handling, if finished.is_none() => finished = Some(result),
            }
        };
        match outcome {
            Ok(receipt_handle) => {
                Counters::add(&inner.counters.renewed, 1);
                latest = Some(Renewed {
                    receipt_handle,
                    renewed_at,
                    invisible_until: renewed_at + inner.renewal,
                });
                if let Some(result) = finished {
                    return (result, latest);
                }
            }
            Err(error) => {
                tracing::warn!(message_id = %message.message_id, %error, "renewing the invisibility of a message whose handler still runs failed; it may be delivered again");
                let result = match finished {
                    Some(result) => result,
                    None => handling.await,
                };
                return (result, latest);
            }
        }
    }
}

/// When to renew an invisibility that began at `since` and ends at `until`: a fifth of it
/// before the end, and at least [`RENEW_MARGIN`] before (a 20 s invisibility is renewed
/// after 16 s, a 60 s one after 48 s).
fn renew_at(since: Instant, until: Instant) -> Instant {
    let margin = (until.saturating_duration_since(since) / 5).max(RENEW_MARGIN);
    until.checked_sub(margin).unwrap_or(since).max(since)
}

/// The least time before a handle expires at which its renewal is sent.
const RENEW_MARGIN: Duration = Duration::from_secs(3);
