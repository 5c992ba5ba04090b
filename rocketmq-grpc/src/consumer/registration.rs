//! Whether the proxy holds the consumer's settings, shared by the control plane (which owns
//! it) and the receive loops (which report when the proxy lost it).

use tokio::sync::watch;

use crate::Error;
use crate::pb::Code;

/// Whether the proxy holds the consumer's settings: `Some(generation)` while a telemetry
/// stream is open and its settings were answered (the generation counts the streams), `None`
/// while the consumer is (re)connecting.
#[derive(Debug)]
pub(super) struct Registration {
    pub(super) state: watch::Sender<Option<u64>>,
}

impl Registration {
    pub(super) fn new() -> Self {
        Self {
            state: watch::Sender::new(None),
        }
    }

    /// Watches the registration.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<u64>> {
        self.state.subscribe()
    }

    /// The current generation, if registered.
    pub(super) fn current(&self) -> Option<u64> {
        *self.state.borrow()
    }

    /// The proxy answered a request made under registration `generation` as if it did not
    /// know the consumer: the telemetry task announces the settings again on a new stream
    /// before anything else. A generation already replaced is left alone (the answer came
    /// from before the new registration).
    pub(super) fn lost(&self, generation: u64) {
        self.state.send_if_modified(|state| {
            let current = *state == Some(generation);
            if current {
                *state = None;
            }
            current
        });
    }
}

/// Whether an error of a heartbeat, an assignment query or a receive means the proxy lost
/// (or never had) the consumer's settings or channel, or the connection is gone: the
/// settings must be announced again.
pub(super) fn registration_lost(error: &Error) -> bool {
    match error {
        Error::Unreachable { .. } => true,
        Error::Rpc { source, .. } => source.is_unavailable(),
        Error::Server { code, message, .. } => match Code::try_from(*code) {
            Ok(
                Code::UnrecognizedClientType | Code::TopicNotFound | Code::ConsumerGroupNotFound,
            ) => true,
            Ok(Code::InternalServerError) => message.contains("settings"),
            Ok(Code::MessageNotFound) => message.contains("disconnected"),
            _ => false,
        },
        _ => false,
    }
}
