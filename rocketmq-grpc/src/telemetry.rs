//! Opening the `Telemetry` stream, the one bidirectional stream a client keeps with the
//! proxy (settings announced, the proxy's settings and commands back), for the producer and
//! the consumers alike.

use tokio_stream::wrappers::ReceiverStream;

use crate::pb;
use crate::{Error, Session};

/// An open telemetry stream: the sender keeps it open, the receiver reads the proxy's
/// commands.
pub(crate) type Telemetry = (
    tokio::sync::mpsc::Sender<pb::TelemetryCommand>,
    tonic::Streaming<pb::TelemetryCommand>,
);

/// Opens the stream on the session's access point with `settings` as its first command,
/// within the request timeout. An access point that refuses is marked as failed, so that the
/// next attempt tries the next one.
pub(crate) async fn open(
    session: &Session,
    settings: pb::TelemetryCommand,
) -> Result<Telemetry, Error> {
    let access = session.access_point();
    let mut client = session.client(&access)?;
    let (outbound, rx) = tokio::sync::mpsc::channel(4);
    let _ = outbound.send(settings).await;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    session.stamp(request.metadata_mut());
    let timeout = session.config().request_timeout;
    let inbound = tokio::time::timeout(timeout, client.telemetry(request))
        .await
        .map_err(|_| Error::rpc("Telemetry", tonic::Status::deadline_exceeded("no answer")))?
        .map_err(|status| session.access_failed(&access, Error::rpc("Telemetry", status)))?
        .into_inner();
    Ok((outbound, inbound))
}
