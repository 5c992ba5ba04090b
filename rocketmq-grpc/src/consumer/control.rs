//! The consumer's control plane: start-up checks, telemetry settings, heartbeats and queue
//! assignment.
//!
//! The proxy refuses heartbeats ("cannot find client settings"), assignments (`"settings" is
//! null`, `TOPIC_NOT_FOUND`) and auto-renewed receives ("client is disconnected") from a
//! client whose settings it has not seen on a telemetry stream, and a restarted proxy has
//! forgotten them. So the telemetry task owns the registration: heartbeats and assignment
//! queries wait until a stream is open and its settings answered, go out at once (heartbeat
//! first) after every new registration, and an answer saying the proxy lost the settings
//! makes the telemetry task open a new stream and announce them again. Every failing loop
//! backs off exponentially with jitter, capped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::receive;
use super::registration::registration_lost;
use super::state::{Inner, QueueKey};
use crate::backoff::Backoff;
use crate::pb::{self, ClientType, Code};
use crate::{Endpoint, Error};

const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const ASSIGNMENT_EVERY: Duration = Duration::from_secs(5);
/// Backoff of failing heartbeats and assignment queries.
const CONTROL_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));
/// Backoff of telemetry reconnection.
const TELEMETRY_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(10));
/// A telemetry stream that stayed up this long resets the reconnection backoff.
const STABLE_STREAM: Duration = Duration::from_secs(30);

/// Announces the client's settings on the telemetry stream (the proxy refuses heartbeats and
/// receives from clients whose settings it has not seen), heartbeats, checks every
/// subscription, then starts the background loops.
pub(super) async fn start(inner: &Arc<Inner>) -> Result<(), Error> {
    let stream = open_telemetry(inner)
        .await
        .map_err(|error| unreachable_if_down(inner, error))?;
    heartbeat(inner).await?;
    inner.registration.state.send_replace(Some(1));
    for subscription in &inner.subscriptions {
        let assignments = query_assignment(inner, &subscription.topic)
            .await
            .map_err(|error| unreachable_if_down(inner, error))?;
        apply_assignments(inner, &subscription.topic, assignments);
    }
    let tasks = &inner.tasks;
    tasks.spawn(telemetry(Arc::clone(inner), stream));
    tasks.spawn(control(Arc::clone(inner)));
    Ok(())
}

async fn query_assignment(inner: &Inner, topic: &str) -> Result<Vec<pb::Assignment>, Error> {
    let access = inner.session.config().endpoint().clone();
    let mut client = inner.session.client(&access)?;
    let request = pb::QueryAssignmentRequest {
        topic: Some(inner.session.resource(topic)),
        group: Some(inner.session.resource(&inner.group)),
        endpoints: Some(access.to_pb()),
    };
    let timeout = inner.session.config().request_timeout;
    let response = client
        .query_assignment(inner.session.request(request, timeout))
        .await
        .map_err(|status| Error::rpc("QueryAssignment", status))?
        .into_inner();
    Error::check("QueryAssignment", response.status.as_ref())?;
    Ok(response.assignments)
}

/// Starts a receive loop for every newly assigned queue of `topic` and stops the loops of
/// queues no longer assigned.
fn apply_assignments(inner: &Arc<Inner>, topic: &str, assignments: Vec<pb::Assignment>) {
    let access = inner.session.config().endpoint().clone();
    let mut assigned = HashSet::new();
    for queue in assignments.into_iter().filter_map(|a| a.message_queue) {
        let readable = queue.permission == pb::Permission::Read as i32
            || queue.permission == pb::Permission::ReadWrite as i32;
        if !readable {
            continue;
        }
        let endpoint = queue
            .broker
            .as_ref()
            .and_then(|b| b.endpoints.as_ref())
            .and_then(Endpoint::from_pb)
            .unwrap_or_else(|| access.clone());
        let key = QueueKey {
            topic: topic.to_owned(),
            broker: queue
                .broker
                .as_ref()
                .map(|b| b.name.clone())
                .unwrap_or_default(),
            queue_id: queue.id,
        };
        assigned.insert(key.clone());
        let mut queues = inner.queues.lock();
        if queues.contains_key(&key) {
            continue;
        }
        let stop = inner.stop.child_token();
        queues.insert(key.clone(), stop.clone());
        drop(queues);
        let fifo = queue
            .accept_message_types
            .contains(&(pb::MessageType::Fifo as i32));
        inner.tasks.spawn(receive::run(
            Arc::clone(inner),
            key,
            queue,
            endpoint,
            fifo,
            stop,
        ));
    }
    inner.queues.lock().retain(|key, stop| {
        let keep = key.topic != topic || assigned.contains(key);
        if !keep {
            stop.cancel();
        }
        keep
    });
}

async fn heartbeat(inner: &Inner) -> Result<(), Error> {
    let group = Some(inner.group.as_str());
    inner
        .session
        .heartbeat(group, ClientType::PushConsumer)
        .await
}

/// Heartbeats every 10 s and queries assignments every 5 s while the consumer is
/// registered; both at once (heartbeat first) after every new registration; failures back
/// off, and those that say the registration is lost ask for a new one first.
async fn control(inner: Arc<Inner>) {
    let mut registered = inner.registration.subscribe();
    let mut seen = 1;
    let now = Instant::now();
    let mut next_heartbeat = now + HEARTBEAT_EVERY;
    let mut next_assignment = now + ASSIGNMENT_EVERY;
    let mut heartbeat_backoff = Backoff::new(CONTROL_BACKOFF.0, CONTROL_BACKOFF.1);
    let mut assignment_backoff = Backoff::new(CONTROL_BACKOFF.0, CONTROL_BACKOFF.1);
    loop {
        let generation = tokio::select! {
            () = inner.stop.cancelled() => return,
            state = registered.wait_for(Option::is_some) => match state {
                Ok(state) => state.unwrap_or(seen),
                Err(_) => return,
            },
        };
        if generation != seen {
            // Settings announced again: heartbeat, then assignments, now.
            seen = generation;
            let now = Instant::now();
            next_heartbeat = now;
            next_assignment = now;
            heartbeat_backoff.reset();
            assignment_backoff.reset();
        }
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep_until(next_heartbeat.min(next_assignment)) => {}
            // Lost or renewed while waiting: look again.
            _ = registered.changed() => continue,
        }
        if next_heartbeat <= Instant::now() {
            match heartbeat(&inner).await {
                Ok(()) => {
                    heartbeat_backoff.reset();
                    next_heartbeat = Instant::now() + HEARTBEAT_EVERY;
                }
                Err(error) => {
                    let wait = heartbeat_backoff.next_delay();
                    tracing::warn!(%error, ?wait, "heartbeat failed");
                    if registration_lost(&error) {
                        inner.registration.lost(seen);
                    }
                    next_heartbeat = Instant::now() + wait;
                }
            }
            continue;
        }
        let mut failed = None;
        for subscription in &inner.subscriptions {
            match query_assignment(&inner, &subscription.topic).await {
                Ok(assignments) => apply_assignments(&inner, &subscription.topic, assignments),
                Err(error) => {
                    tracing::warn!(topic = %subscription.topic, %error, "QueryAssignment failed; keeping the current queues");
                    let lost = registration_lost(&error);
                    failed = Some(lost);
                    if lost {
                        break;
                    }
                }
            }
        }
        next_assignment = match failed {
            None => {
                assignment_backoff.reset();
                Instant::now() + ASSIGNMENT_EVERY
            }
            Some(lost) => {
                if lost {
                    inner.registration.lost(seen);
                }
                Instant::now() + assignment_backoff.next_delay()
            }
        };
    }
}

/// The settings this consumer announces on the telemetry stream.
fn settings(inner: &Inner) -> pb::TelemetryCommand {
    let subscription = pb::Subscription {
        group: Some(inner.session.resource(&inner.group)),
        subscriptions: inner
            .subscriptions
            .iter()
            .map(|s| pb::SubscriptionEntry {
                topic: Some(inner.session.resource(&s.topic)),
                expression: Some(s.filter.clone()),
            })
            .collect(),
        fifo: None,
        receive_batch_size: Some(inner.receive_batch_size),
        long_polling_timeout: prost_types::Duration::try_from(*inner.long_polling.lock()).ok(),
    };
    pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(ClientType::PushConsumer as i32),
            access_point: Some(inner.session.config().endpoint().to_pb()),
            backoff_policy: None,
            request_timeout: prost_types::Duration::try_from(
                inner.session.config().request_timeout,
            )
            .ok(),
            pub_sub: Some(pb::settings::PubSub::Subscription(subscription)),
            user_agent: Some(pb::Ua {
                language: pb::Language::Rust as i32,
                version: env!("CARGO_PKG_VERSION").into(),
                platform: std::env::consts::OS.into(),
                hostname: String::new(),
            }),
        })),
    }
}

/// A connection failure at start-up is reported as an unreachable endpoint.
fn unreachable_if_down(inner: &Inner, error: Error) -> Error {
    match error {
        Error::Rpc { source, .. } if source.code() == tonic::Code::Unavailable => {
            Error::Unreachable {
                endpoint: inner.session.config().endpoint().to_string(),
                reason: source.message().to_owned(),
            }
        }
        other => other,
    }
}

/// An open telemetry stream: the sender keeps it open, the receiver reads the server's commands.
type Telemetry = (
    tokio::sync::mpsc::Sender<pb::TelemetryCommand>,
    tonic::Streaming<pb::TelemetryCommand>,
);

/// Opens the telemetry stream, announces the settings and waits for the server's answer.
async fn open_telemetry(inner: &Inner) -> Result<Telemetry, Error> {
    let access = inner.session.config().endpoint().clone();
    let mut client = inner.session.client(&access)?;
    let (outbound, rx) = tokio::sync::mpsc::channel(4);
    let _ = outbound.send(settings(inner)).await;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    inner.session.stamp(request.metadata_mut());
    let timeout = inner.session.config().request_timeout;
    let mut inbound = tokio::time::timeout(timeout, client.telemetry(request))
        .await
        .map_err(|_| Error::rpc("Telemetry", tonic::Status::deadline_exceeded("no answer")))?
        .map_err(|status| Error::rpc("Telemetry", status))?
        .into_inner();
    let first = tokio::time::timeout(timeout, inbound.message())
        .await
        .map_err(|_| {
            Error::rpc(
                "Telemetry",
                tonic::Status::deadline_exceeded("no settings answer"),
            )
        })?
        .map_err(|status| Error::rpc("Telemetry", status))?;
    if let Some(command) = first {
        if let Some(status) = &command.status {
            Error::check("Telemetry", Some(status))?;
        }
        take_settings(inner, command);
    }
    Ok((outbound, inbound))
}

/// Applies what the server announced: its redelivery backoff and long-polling timeout.
fn take_settings(inner: &Inner, command: pb::TelemetryCommand) {
    let Some(pb::telemetry_command::Command::Settings(settings)) = command.command else {
        return;
    };
    if settings.backoff_policy.is_some() {
        *inner.backoff.lock() = settings.backoff_policy;
    }
    if let Some(pb::settings::PubSub::Subscription(subscription)) = settings.pub_sub
        && let Some(polling) = subscription
            .long_polling_timeout
            .and_then(|d| Duration::try_from(d).ok())
            .filter(|d| !d.is_zero())
    {
        *inner.long_polling.lock() = polling;
    }
}

/// Keeps the telemetry stream open, and takes the server's settings. When the stream ends,
/// or the control plane finds the registration lost, it opens a new stream and announces the
/// settings again, backing off (with jitter, capped) while that fails; each accepted stream
/// is a new registration generation.
async fn telemetry(inner: Arc<Inner>, first: Telemetry) {
    let mut stream = Some(first);
    let mut generation = 1;
    let mut backoff = Backoff::new(TELEMETRY_BACKOFF.0, TELEMETRY_BACKOFF.1);
    let mut registered = inner.registration.subscribe();
    loop {
        let (outbound, mut inbound) = match stream.take() {
            Some(open) => open,
            None => {
                tokio::select! {
                    () = inner.stop.cancelled() => return,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
                match open_telemetry(&inner).await {
                    Ok(open) => {
                        generation += 1;
                        inner.registration.state.send_replace(Some(generation));
                        tracing::debug!(generation, "settings announced again");
                        open
                    }
                    Err(error) => {
                        tracing::debug!(%error, "telemetry stream could not be reopened");
                        continue;
                    }
                }
            }
        };
        let opened = Instant::now();
        registered.mark_unchanged();
        loop {
            let command = tokio::select! {
                () = inner.stop.cancelled() => return,
                changed = registered.changed() => {
                    if changed.is_err() || registered.borrow_and_update().is_none() {
                        tracing::debug!("the proxy lost the consumer's settings; announcing them again");
                        break;
                    }
                    continue;
                }
                command = inbound.message() => command,
            };
            match command {
                Ok(Some(command)) => take_settings(&inner, command),
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(%status, "telemetry stream ended");
                    break;
                }
            }
        }
        inner.registration.state.send_if_modified(|state| {
            let live = *state == Some(generation);
            if live {
                *state = None;
            }
            live
        });
        drop(outbound);
        if opened.elapsed() >= STABLE_STREAM {
            backoff.reset();
        }
    }
}

/// Tells the proxy this client is leaving (best effort).
pub(super) async fn notify_termination(inner: &Inner) {
    let access = inner.session.config().endpoint().clone();
    let Ok(mut client) = inner.session.client(&access) else {
        return;
    };
    let request = pb::NotifyClientTerminationRequest {
        group: Some(inner.session.resource(&inner.group)),
    };
    let timeout = inner.session.config().request_timeout;
    match client
        .notify_client_termination(inner.session.request(request, timeout))
        .await
    {
        Ok(response) => {
            if let Err(error) = Error::check(
                "NotifyClientTermination",
                response.get_ref().status.as_ref(),
            ) && error.code() != Some(Code::Ok)
            {
                tracing::debug!(%error, "NotifyClientTermination refused");
            }
        }
        Err(status) => tracing::debug!(%status, "NotifyClientTermination failed"),
    }
}
