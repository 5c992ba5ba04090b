//! A snapshot of the emulator's state and counters.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_subscribe::SubType;

use super::names::normalize;

/// Everything the emulator can tell, taken at one instant by
/// [`Emulator::stats`](super::Emulator::stats).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Every topic and partition, by name.
    pub topics: Vec<TopicStats>,
    /// Partitioned topics and their partition counts.
    pub partitioned_topics: BTreeMap<String, u32>,
    /// Frames received, by `BaseCommand.type` number (including numbers the emulator does not
    /// know).
    pub commands_received: BTreeMap<i32, u64>,
    /// Frames sent, by `BaseCommand.type` number.
    pub commands_sent: BTreeMap<i32, u64>,
    /// Frames of commands the emulator does not model, by `BaseCommand.type` number
    /// (including numbers the proto subset does not know): those with a `request_id` were
    /// answered with `NotAllowedError`, the others only logged.
    pub unmodelled_commands: BTreeMap<i32, u64>,
    /// Every connection accepted so far, open or closed, in order.
    pub connections: Vec<ConnectionStats>,
    /// The transaction coordinator.
    pub transactions: TransactionStats,
    /// Faults injected.
    pub faults: FaultStats,
}

impl Stats {
    /// Frames of type `command` received.
    pub fn received(&self, command: Type) -> u64 {
        self.commands_received
            .get(&(command as i32))
            .copied()
            .unwrap_or(0)
    }

    /// Frames of type `command` sent.
    pub fn sent(&self, command: Type) -> u64 {
        self.commands_sent
            .get(&(command as i32))
            .copied()
            .unwrap_or(0)
    }

    /// A topic or partition by name (short names are resolved as the broker does).
    pub fn topic(&self, name: &str) -> Option<&TopicStats> {
        let name = normalize(name).ok()?;
        self.topics.iter().find(|t| t.name == name)
    }

    /// A subscription of a topic or partition.
    pub fn subscription(&self, topic: &str, subscription: &str) -> Option<&SubscriptionStats> {
        self.topic(topic)?
            .subscriptions
            .iter()
            .find(|s| s.name == subscription)
    }

    /// Every connected consumer, of every subscription.
    pub fn consumers(&self) -> impl Iterator<Item = &ConsumerStats> + '_ {
        self.topics
            .iter()
            .flat_map(|t| &t.subscriptions)
            .flat_map(|s| &s.consumers)
    }

    /// The backlog of every subscription of `topic` summed; for a partitioned topic's base
    /// name, over its partitions.
    pub fn backlog(&self, topic: &str) -> u64 {
        let Ok(name) = normalize(topic) else {
            return 0;
        };
        let prefix = format!("{name}-partition-");
        self.topics
            .iter()
            .filter(|t| t.name == name || t.name.starts_with(&prefix))
            .flat_map(|t| &t.subscriptions)
            .map(|s| s.backlog)
            .sum()
    }
}

/// One topic or partition.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TopicStats {
    /// The full name (`persistent://tenant/namespace/topic[-partition-N]`).
    pub name: String,
    /// The partition index; -1 for a topic that is not a partition.
    pub partition: i32,
    /// The topic's ledger id.
    pub ledger_id: u64,
    /// Readable entries stored.
    pub entries: u64,
    /// Readable messages stored (a batch counts its messages).
    pub messages: u64,
    /// Entries sent in transactions that are still open (not readable yet).
    pub pending_txn_entries: u64,
    /// Entries sent in transactions that aborted (never readable).
    pub aborted_entries: u64,
    /// The topic's `maxUnackedMessagesOnConsumer`, if set.
    pub max_unacked_messages: Option<u32>,
    /// Producers connected.
    pub producers: usize,
    /// The subscriptions.
    pub subscriptions: Vec<SubscriptionStats>,
}

/// One subscription.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SubscriptionStats {
    /// Its name.
    pub name: String,
    /// Its type.
    pub sub_type: SubType,
    /// Messages not yet acknowledged: readable entries from the subscription's start that the
    /// cursor has not deleted, each counting its messages minus the indexes its cursor holds
    /// as acknowledged.
    pub backlog: u64,
    /// Entries not yet wholly acknowledged, as the broker's `msgBacklog` counts them (a batch
    /// with some indexes acknowledged still counts 1).
    pub backlog_entries: u64,
    /// Entries waiting to be sent again (redelivery, abort, a consumer gone).
    pub pending_redelivery: usize,
    /// Key_Shared: entries read but waiting for the consumer of their key (it has no
    /// permits or is blocked, or, STICKY, no consumer covers the key's hash).
    pub waiting_for_key_consumer: usize,
    /// Shared and Key_Shared: entries read whose `deliver_at_time` has not come (they are sent
    /// when it has, never before).
    pub delayed: usize,
    /// The connected consumers, the active one first for Exclusive and Failover.
    pub consumers: Vec<ConsumerStats>,
    /// Message ids acknowledged (plainly or in a transaction) whose entry the cursor had
    /// already deleted, counted over the subscription's life (through consumers that came
    /// and went, and restarts): a client that acknowledges nothing twice keeps it at 0.
    pub acks_of_deleted: u64,
    /// Transactional acks refused as `TransactionConflict`, over the subscription's life.
    pub conflicts: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES frames without message ids ("redeliver everything
    /// I hold"), from every consumer over the subscription's life (through consumers that
    /// came and went).
    pub redeliver_all_commands: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES frames with message ids, from every consumer over
    /// the subscription's life.
    pub redeliver_ids_commands: u64,
}

/// One consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The connection (see [`ConnectionStats::id`]).
    pub connection: u64,
    /// `consumer_id` on that connection.
    pub consumer_id: u64,
    /// `consumer_name`, or a generated one.
    pub name: String,
    /// The broker's unacked count for the consumer (may go negative with broken clients, as
    /// on a 4.0.x broker); always 0 on Exclusive and Failover subscriptions, where the broker
    /// does not count.
    pub unacked: i64,
    /// Whether dispatch is blocked on unacked messages.
    pub blocked: bool,
    /// The consumer's `maxUnackedMessages` (0: unlimited).
    pub max_unacked: u32,
    /// Permits left (may be negative after a batch larger than the permits).
    pub permits: i64,
    /// Entries sent.
    pub dispatched_entries: u64,
    /// Messages sent (a batch counts its messages not yet acknowledged).
    pub dispatched_messages: u64,
    /// ACK frames received from the consumer.
    pub ack_commands: u64,
    /// Message ids in those frames.
    pub acked_ids: u64,
    /// Messages those acks took off the unacked count (what the broker believes was
    /// acknowledged).
    pub acked_messages: i64,
    /// Transactional acks rejected as conflicts.
    pub conflicts: u64,
    /// FLOW frames received.
    pub flow_commands: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES frames received, with or without ids.
    pub redeliver_commands: u64,
    /// Of those, frames without message ids (the broker resets the consumer's count and
    /// replays its whole `pendingAcks`, to any consumer).
    pub redeliver_all_commands: u64,
    /// Of those, frames with message ids (the broker replays those of the ids that are in
    /// this consumer's `pendingAcks`, to any consumer).
    pub redeliver_ids_commands: u64,
    /// Acks that reported a validation error (for example a checksum mismatch).
    pub validation_errors: u64,
    /// Times the consumer became blocked.
    pub times_blocked: u64,
    /// Entries in the consumer's `pendingAcks` (dispatched to it and not acknowledged or
    /// redelivered; an entry an abort replayed to another consumer is in both).
    pub pending_acks: usize,
    /// Whether a redelivery request left the consumer unblocked but unserved: it named no
    /// entry of the consumer's `pendingAcks` and no permits had arrived while it was blocked,
    /// so the broker does not read for it until a FLOW, a publish, a replay or another
    /// unblocking event.
    pub idle: bool,
}

/// One connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// The emulator's id for it.
    pub id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    /// Whether it is still open.
    pub open: bool,
    /// Whether CONNECT succeeded.
    pub connected: bool,
    /// Frames received.
    pub frames_received: u64,
    /// Frames sent.
    pub frames_sent: u64,
}

/// The transaction coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionStats {
    /// Transactions created.
    pub created: u64,
    /// Open now.
    pub open: u64,
    /// Committed.
    pub committed: u64,
    /// Aborted by the client.
    pub aborted: u64,
    /// Aborted because their timeout passed.
    pub timed_out: u64,
}

/// Faults injected so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Connections closed by [`Faults`](super::Faults) (frame count or rate).
    pub dropped_connections: u64,
    /// Connections closed by [`Emulator::disconnect_all`](super::Emulator::disconnect_all).
    pub disconnected_by_admin: u64,
    /// Connections closed because they did not answer a PING.
    pub keep_alive_timeouts: u64,
    /// MESSAGE frames sent with a wrong checksum.
    pub corrupted_messages: u64,
    /// Responses held back.
    pub delayed_responses: u64,
    /// Connections closed because a frame was malformed.
    pub malformed_frames: u64,
    /// Restarts ([`Emulator::take_down`](super::Emulator::take_down) or
    /// [`Emulator::restart`](super::Emulator::restart)).
    pub restarts: u64,
}
