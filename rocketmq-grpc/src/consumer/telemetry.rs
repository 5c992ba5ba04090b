//! The telemetry stream every consumer keeps open: it announces the consumer's settings (the
//! proxy refuses heartbeats and receives from a client whose settings it has not seen), takes
//! the server's, reopens after it ends, and tells the proxy when the client leaves. Shared by
//! the push and the simple consumer through [`Announcer`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::registration::Registration;
use super::state::Subscription;
use crate::backoff;
use crate::pb::{self, ClientType};
use crate::telemetry::{self, Telemetry};
use crate::{Error, Session};

/// Backoff of telemetry reconnection.
const TELEMETRY_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(10));
/// A telemetry stream that stayed up this long resets the reconnection backoff.
const STABLE_STREAM: Duration = Duration::from_secs(30);

/// What a consumer gives the telemetry stream: its session, the settings it announces, what
/// it does with the server's, its registration state and its stop signal.
pub(super) trait Announcer: Send + Sync + 'static {
    fn session(&self) -> &Session;
    fn settings(&self) -> pb::TelemetryCommand;
    fn take_settings(&self, command: pb::TelemetryCommand);
    fn registration(&self) -> &Registration;
    fn stop(&self) -> &CancellationToken;
}

/// The settings command of a consumer of `group`, as `client_type`, with its subscriptions.
pub(super) fn settings_command(
    session: &Session,
    client_type: ClientType,
    group: &str,
    subscriptions: &[Subscription],
    receive_batch_size: Option<i32>,
    long_polling: Option<Duration>,
) -> pb::TelemetryCommand {
    let subscription = pb::Subscription {
        group: Some(session.resource(group)),
        subscriptions: subscriptions
            .iter()
            .map(|s| pb::SubscriptionEntry {
                topic: Some(session.resource(&s.topic)),
                expression: Some(s.filter.to_pb()),
            })
            .collect(),
        fifo: None,
        receive_batch_size,
        long_polling_timeout: long_polling.and_then(|d| prost_types::Duration::try_from(d).ok()),
        lite_subscription_quota: None,
        max_lite_topic_size: None,
    };
    pb::TelemetryCommand {
        status: None,
        command: Some(pb::telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(client_type as i32),
            access_point: Some(session.access_points_pb()),
            backoff_policy: None,
            request_timeout: prost_types::Duration::try_from(session.config().request_timeout).ok(),
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
pub(super) fn unreachable_if_down(session: &Session, error: Error) -> Error {
    match error {
        Error::Rpc { source, .. } if source.is_unavailable() => Error::Unreachable {
            endpoint: session.access_point().to_string(),
            reason: source.message().to_owned(),
        },
        other => other,
    }
}

/// Opens the telemetry stream, announces the settings and waits for the server's answer; an
/// unavailable access point is followed by the next, each tried once.
pub(super) async fn open<A: Announcer + ?Sized>(announcer: &A) -> Result<Telemetry, Error> {
    let tries = announcer.session().config().endpoints().len();
    let mut tried = 1;
    loop {
        let opened = open_once(announcer).await;
        announcer.session().link().observe(&opened);
        match opened {
            Err(error) if tried < tries && crate::session::is_unavailable(&error) => tried += 1,
            other => return other,
        }
    }
}

async fn open_once<A: Announcer + ?Sized>(announcer: &A) -> Result<Telemetry, Error> {
    let session = announcer.session();
    let (outbound, mut inbound) = telemetry::open(session, announcer.settings()).await?;
    let timeout = session.config().request_timeout;
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
        announcer.take_settings(command);
    }
    Ok((outbound, inbound))
}

/// Keeps the telemetry stream open, and takes the server's settings. When the stream ends,
/// or the consumer finds the registration lost, it opens a new stream and announces the
/// settings again, backing off (with jitter, capped) while that fails; each accepted stream
/// is a new registration generation.
pub(super) async fn run<A: Announcer>(inner: Arc<A>, first: Telemetry) {
    let mut stream = Some(first);
    let mut generation = 1;
    let mut backoff = backoff::exponential(TELEMETRY_BACKOFF.0, TELEMETRY_BACKOFF.1);
    let mut registered = inner.registration().subscribe();
    loop {
        let (outbound, mut inbound) = match stream.take() {
            Some(open) => open,
            None => {
                tokio::select! {
                    () = inner.stop().cancelled() => return,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
                match open(inner.as_ref()).await {
                    Ok(open) => {
                        generation += 1;
                        crate::metrics::reconnected(crate::metrics::Role::Consumer);
                        inner.registration().state.send_replace(Some(generation));
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
                () = inner.stop().cancelled() => return,
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
                Ok(Some(command)) => inner.take_settings(command),
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(%status, "telemetry stream ended");
                    inner
                        .session()
                        .link()
                        .observe::<()>(&Err(Error::rpc("Telemetry", status)));
                    break;
                }
            }
        }
        inner.registration().state.send_if_modified(|state| {
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

/// Tells the proxy the client of `group` is leaving (best effort).
pub(super) async fn notify_termination(session: &Session, group: &str) {
    let access = session.access_point();
    let Ok(mut client) = session.client(&access) else {
        return;
    };
    let request = pb::NotifyClientTerminationRequest {
        group: Some(session.resource(group)),
    };
    let timeout = session.config().request_timeout;
    match client
        .notify_client_termination(session.request(request, timeout))
        .await
    {
        Ok(response) => {
            if let Err(error) = Error::check(
                "NotifyClientTermination",
                response.get_ref().status.as_ref(),
            ) && error.code() != Some(crate::Code::Ok)
            {
                tracing::debug!(%error, "NotifyClientTermination refused");
            }
        }
        Err(status) => tracing::debug!(%status, "NotifyClientTermination failed"),
    }
}
