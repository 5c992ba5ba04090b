//! The frames the broker queues for its connections, and how the fault injector treats them.

use pulsar_wire::pb::BaseCommand;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::wire::Frame;

/// How a queued frame is treated by the fault injector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// An answer to a request: may be delayed.
    Response,
    /// A dispatched MESSAGE: its checksum may be corrupted.
    Message,
    /// Anything else.
    Other,
}

/// A frame for one connection.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub(super) conn: u64,
    pub(super) frame: Box<Frame>,
    pub(super) kind: Kind,
}

/// A command of type `ty` with no body yet.
pub(super) fn command(ty: Type) -> BaseCommand {
    BaseCommand {
        r#type: ty as i32,
        ..BaseCommand::default()
    }
}
