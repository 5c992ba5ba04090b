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
use tokio_util::sync::CancellationToken;

use super::lite;
use super::receive;
use super::registration::{Registration, registration_lost};
use super::state::{Inner, QueueKey};
use super::telemetry::{self, Announcer};
use crate::backoff;
use crate::pb;
use crate::{Endpoint, Error, Session};

const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const ASSIGNMENT_EVERY: Duration = Duration::from_secs(5);
/// Backoff of failing heartbeats and assignment queries.
const CONTROL_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));
/// Announces the client's settings on the telemetry stream (the proxy refuses heartbeats and
/// receives from clients whose settings it has not seen), heartbeats, checks every
/// subscription, then starts the background loops.
pub(super) async fn start(inner: &Arc<Inner>) -> Result<(), Error> {
    let stream = telemetry::open(inner.as_ref())
        .await
        .map_err(|error| telemetry::unreachable_if_down(&inner.session, error))?;
    heartbeat(inner).await?;
    inner.registration.state.send_replace(Some(1));
    for subscription in &inner.subscriptions {
        let assignments = query_assignment(inner, &subscription.topic)
            .await
            .map_err(|error| telemetry::unreachable_if_down(&inner.session, error))?;
        apply_assignments(inner, &subscription.topic, assignments);
    }
    let tasks = &inner.tasks;
    tasks.spawn(telemetry::run(Arc::clone(inner), stream));
    tasks.spawn(control(Arc::clone(inner)));
    if inner.lite.is_some() {
        // The set is empty at start: subscriptions come later (subscribe_lite).
        tasks.spawn(lite::full_sync_loop(Arc::clone(inner)));
    }
    Ok(())
}

async fn query_assignment(inner: &Inner, topic: &str) -> Result<Vec<pb::Assignment>, Error> {
    let access = inner.session.access_point();
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
        .map_err(|status| {
            inner
                .session
                .access_failed(&access, Error::rpc("QueryAssignment", status))
        })?
        .into_inner();
    Error::check("QueryAssignment", response.status.as_ref())?;
    Ok(response.assignments)
}

/// Starts a receive loop for every newly assigned queue of `topic` and stops the loops of
/// queues no longer assigned.
fn apply_assignments(inner: &Arc<Inner>, topic: &str, assignments: Vec<pb::Assignment>) {
    let access = inner.session.access_point();
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
        // A FIFO queue is received in order by one loop; another queue keeps a second long
        // poll suspended at the broker (see `receive::POLLS_PER_QUEUE`).
        let polls = if fifo { 1 } else { receive::POLLS_PER_QUEUE };
        for poll in 0..polls {
            inner.tasks.spawn(receive::run(
                Arc::clone(inner),
                receive::Poll {
                    key: key.clone(),
                    queue: queue.clone(),
                    endpoint: endpoint.clone(),
                    fifo,
                    index: poll,
                },
                stop.clone(),
            ));
        }
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
    inner.session.heartbeat(group, inner.client_type()).await
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
    let mut heartbeat_backoff = backoff::exponential(CONTROL_BACKOFF.0, CONTROL_BACKOFF.1);
    let mut assignment_backoff = backoff::exponential(CONTROL_BACKOFF.0, CONTROL_BACKOFF.1);
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
    telemetry::settings_command(
        &inner.session,
        inner.client_type(),
        &inner.group,
        &inner.subscriptions,
        Some(inner.receive_batch_size),
        Some(*inner.long_polling.lock()),
    )
}

impl Announcer for Inner {
    fn session(&self) -> &Session {
        &self.session
    }

    fn settings(&self) -> pb::TelemetryCommand {
        settings(self)
    }

    /// Applies what the server announced: its redelivery backoff and long-polling timeout.
    fn take_settings(&self, command: pb::TelemetryCommand) {
        let settings = match command.command {
            Some(pb::telemetry_command::Command::Settings(settings)) => settings,
            Some(pb::telemetry_command::Command::NotifyUnsubscribeLiteCommand(notice)) => {
                lite::unsubscribed_by_server(self, &notice.lite_topic);
                return;
            }
            _ => return,
        };
        if settings.backoff_policy.is_some() {
            *self.backoff.lock() = settings.backoff_policy;
        }
        if let (Some(lite), Some(pb::settings::PubSub::Subscription(subscription))) =
            (&self.lite, &settings.pub_sub)
        {
            lite.take_limits(subscription);
        }
        if let Some(pb::settings::PubSub::Subscription(subscription)) = settings.pub_sub
            && let Some(polling) = subscription
                .long_polling_timeout
                .and_then(|d| Duration::try_from(d).ok())
                .filter(|d| !d.is_zero())
        {
            *self.long_polling.lock() = polling;
        }
    }

    fn registration(&self) -> &Registration {
        &self.registration
    }

    fn stop(&self) -> &CancellationToken {
        &self.stop
    }
}

/// Tells the proxy this client is leaving (best effort).
pub(super) async fn notify_termination(inner: &Inner) {
    telemetry::notify_termination(&inner.session, &inner.group).await;
}
