//! The producer's control plane: its settings on the telemetry stream (and the retry policy
//! the proxy answers with), heartbeats, and the periodic route refresh.

use std::sync::Arc;
use std::time::Duration;

use super::policy::SendRetryPolicy;
use super::routes::ROUTE_REFRESH_EVERY;
use super::state::Inner;
use crate::Error;
use crate::backoff;
use crate::pb::{self, ClientType};
use crate::telemetry::{self, Telemetry};

/// Heartbeat period (the Java client's 10 s).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// First delay before reopening a broken telemetry stream; doubles up to the maximum.
const REOPEN_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay before reopening a broken telemetry stream.
const REOPEN_MAX: Duration = Duration::from_secs(5);

/// Starts the background tasks: telemetry (with heartbeats) and route refresh.
pub(super) fn spawn(inner: &Arc<Inner>) {
    tokio::spawn(telemetry(Arc::clone(inner)));
    tokio::spawn(refresh_routes(Arc::clone(inner)));
}

/// The settings this producer announces: its topics, request timeout, current retry policy
/// and user agent.
fn settings(inner: &Inner) -> pb::TelemetryCommand {
    let topics = inner
        .topics
        .lock()
        .iter()
        .map(|t| inner.session.resource(t))
        .collect();
    pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(ClientType::Producer as i32),
            access_point: Some(inner.session.access_points_pb()),
            backoff_policy: Some(inner.policy.lock().to_pb()),
            request_timeout: prost_types::Duration::try_from(
                inner.session.config().request_timeout,
            )
            .ok(),
            pub_sub: Some(pb::settings::PubSub::Publishing(pb::Publishing {
                topics,
                max_body_size: i32::try_from(*inner.max_body.lock()).unwrap_or(i32::MAX),
                validate_message_type: false,
            })),
            user_agent: Some(pb::Ua {
                language: pb::Language::Rust as i32,
                version: env!("CARGO_PKG_VERSION").into(),
                platform: std::env::consts::OS.into(),
                hostname: String::new(),
            }),
        })),
    }
}

/// Applies what the proxy answered: its retry policy (keeping the attempts the application
/// fixed, if it did).
pub(super) fn take_settings(inner: &Inner, command: pb::TelemetryCommand) {
    if let Some(status) = &command.status
        && let Err(error) = Error::check("Telemetry", Some(status))
    {
        tracing::warn!(%error, "the proxy refused the producer's settings");
        return;
    }
    let Some(pb::telemetry_command::Command::Settings(settings)) = command.command else {
        return;
    };
    if let Some(announced) = settings
        .backoff_policy
        .as_ref()
        .and_then(SendRetryPolicy::from_pb)
    {
        let mut policy = inner.policy.lock();
        let max_attempts = inner.max_attempts.lock().unwrap_or(announced.max_attempts);
        *policy = SendRetryPolicy::new(max_attempts, announced.backoff);
    }
    // Counted before the waiters wake: `Producer::start` looks at the count when woken.
    inner
        .settings_answers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    inner.settled.notify_waiters();
}

/// Opens the stream with the settings as its first command, and records the outcome in the
/// link state.
async fn open(inner: &Inner) -> Result<Telemetry, Error> {
    let opened = telemetry::open(&inner.session, settings(inner)).await;
    inner.session.link().observe(&opened);
    opened
}

async fn heartbeat(inner: &Inner) -> Result<(), Error> {
    inner.session.heartbeat(None, ClientType::Producer).await
}

/// Keeps the telemetry stream open: settings first, then the proxy's answers; the settings
/// again when a new topic is used; heartbeats every 10 s once the proxy has answered; after
/// the stream breaks, reopens it with exponential back-off and jitter.
async fn telemetry(inner: Arc<Inner>) {
    let mut reopen = backoff::exponential(REOPEN_INITIAL, REOPEN_MAX);
    let mut opened_before = false;
    loop {
        let (outbound, mut inbound) = match open(&inner).await {
            Ok(open) => {
                if opened_before {
                    crate::metrics::reconnected(crate::metrics::Role::Producer);
                }
                opened_before = true;
                open
            }
            Err(error) => {
                tracing::debug!(%error, "the producer's telemetry stream could not be opened");
                let delay = reopen.next_delay();
                tokio::select! {
                    () = inner.stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let mut answered = false;
        let mut heartbeats = tokio::time::interval(HEARTBEAT_EVERY);
        heartbeats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = inner.stop.cancelled() => return,
                () = inner.topics_changed.notified() => {
                    if outbound.send(settings(&inner)).await.is_err() {
                        break;
                    }
                }
                _ = heartbeats.tick(), if answered => {
                    if let Err(error) = heartbeat(&inner).await {
                        tracing::debug!(%error, "producer heartbeat failed");
                    }
                }
                command = inbound.message() => match command {
                    Ok(Some(pb::TelemetryCommand {
                        command: Some(pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(check)),
                        ..
                    })) => {
                        let endpoint = inner.session.access_point();
                        tokio::spawn(super::transaction::recover(Arc::clone(&inner), endpoint, check));
                    }
                    Ok(Some(command)) => {
                        take_settings(&inner, command);
                        if !answered {
                            answered = true;
                            reopen.reset();
                            heartbeats.reset_immediately();
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "the producer's telemetry stream ended");
                        inner.session.link().observe::<()>(&Err(Error::rpc("Telemetry", status)));
                        break;
                    }
                },
            }
        }
        drop(outbound);
        let delay = reopen.next_delay();
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// Refreshes every cached route every 30 s.
async fn refresh_routes(inner: Arc<Inner>) {
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + ROUTE_REFRESH_EVERY,
        ROUTE_REFRESH_EVERY,
    );
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            _ = every.tick() => {}
        }
        for topic in inner.routes.topics() {
            if let Err(error) = inner.routes.refresh(&inner.session, &topic, None).await {
                tracing::debug!(topic, %error, "periodic QueryRoute failed");
            }
        }
    }
}
