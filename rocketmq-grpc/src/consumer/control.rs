//! The consumer's control plane: start-up checks, telemetry settings, heartbeats and queue
//! assignment.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;

use super::Inner;
use super::receive::{self, QueueKey};
use crate::pb::{self, ClientType, Code};
use crate::{Endpoint, Error};

const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const ASSIGNMENT_EVERY: Duration = Duration::from_secs(5);

/// Announces the client's settings on the telemetry stream (the proxy refuses heartbeats and
/// receives from clients whose settings it has not seen), checks every subscription, then
/// starts the background loops.
pub(super) async fn start(inner: &Arc<Inner>) -> Result<(), Error> {
    let stream = open_telemetry(inner)
        .await
        .map_err(|error| unreachable_if_down(inner, error))?;
    for subscription in &inner.subscriptions {
        let assignments = query_assignment(inner, &subscription.topic)
            .await
            .map_err(|error| unreachable_if_down(inner, error))?;
        apply_assignments(inner, &subscription.topic, assignments);
    }
    heartbeat(inner).await?;
    let tasks = &inner.tasks;
    tasks.spawn(telemetry(Arc::clone(inner), stream));
    tasks.spawn(heartbeats(Arc::clone(inner)));
    tasks.spawn(assignments(Arc::clone(inner)));
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

async fn assignments(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(ASSIGNMENT_EVERY) => {}
        }
        for subscription in &inner.subscriptions {
            match query_assignment(&inner, &subscription.topic).await {
                Ok(assignments) => apply_assignments(&inner, &subscription.topic, assignments),
                Err(error) => {
                    tracing::warn!(topic = %subscription.topic, %error, "QueryAssignment failed; keeping the current queues")
                }
            }
        }
    }
}

async fn heartbeat(inner: &Inner) -> Result<(), Error> {
    let access = inner.session.config().endpoint().clone();
    let mut client = inner.session.client(&access)?;
    let request = pb::HeartbeatRequest {
        group: Some(inner.session.resource(&inner.group)),
        client_type: ClientType::PushConsumer as i32,
    };
    let timeout = inner.session.config().request_timeout;
    let response = client
        .heartbeat(inner.session.request(request, timeout))
        .await
        .map_err(|status| Error::rpc("Heartbeat", status))?
        .into_inner();
    Error::check("Heartbeat", response.status.as_ref())
}

async fn heartbeats(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(HEARTBEAT_EVERY) => {}
        }
        if let Err(error) = heartbeat(&inner).await {
            tracing::warn!(%error, "heartbeat failed");
        }
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

/// Keeps the telemetry stream open, reopening it when it ends, and takes the server's settings.
async fn telemetry(inner: Arc<Inner>, first: Telemetry) {
    let mut stream = Some(first);
    loop {
        let (outbound, mut inbound) = match stream.take() {
            Some(open) => open,
            None => match open_telemetry(&inner).await {
                Ok(open) => open,
                Err(error) => {
                    tracing::debug!(%error, "telemetry stream could not be reopened");
                    tokio::select! {
                        () = inner.stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        loop {
            let command = tokio::select! {
                () = inner.stop.cancelled() => return,
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
        drop(outbound);
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
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
