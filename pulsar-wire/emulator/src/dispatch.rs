//! Subscriptions and consumers: permits, dispatch, acks and redelivery. Every unacked count,
//! blocked flag, pending ack and conflict comes from the subscription's
//! `txn_ack::model::SubscriptionModel` (the cursor and the transactional pending acks belong
//! to the subscription, the counts and `pendingAcks` to each consumer); this module decides
//! which entry goes to which consumer, as the broker's dispatchers do, and turns the model's
//! answers into frames.
//!
//! Shared dispatch follows `PersistentDispatcherMultipleConsumers` (4.0.8): a read takes the
//! replay set first (entries redelivered after a request, an abort or a consumer gone), else
//! new entries, at most as many entries as the consumers have permits (and at most
//! [`READ_BATCH`]); `trySendMessagesToConsumers` then hands them out in order, each consumer
//! `getNextConsumer` picks (round robin over the consumers that have permits and are not
//! blocked) taking up to `getMaxEntriesInThisBatch` entries in one `sendMessages` call. A
//! replay goes to whichever consumer is next, not to the one that held it.

use std::collections::{BTreeSet, HashMap, HashSet};

use txn_ack::model::{
    AckOutcome, ConsumerId, CursorState, Dispatch, ModelConfig, SubscriptionModel, WireAck,
};
use txn_ack::{AckKind, AckSet, EntryId, TxnId};

use super::delays::Delayed;
use super::entries::{StoredEntry, TopicView, Visibility};
use super::outgoing::{Kind, Outgoing, command};
use super::stats::{ConsumerStats, SubscriptionStats};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_ack::AckType;
use pulsar_wire::pb::command_subscribe::SubType;
use pulsar_wire::pb::{
    CommandAck, CommandActiveConsumerChange, CommandMessage, KeySharedMeta, KeySharedMode,
    MessageIdData, MessageMetadata, ServerError,
};
use pulsar_wire::wire::Frame;

/// The most entries a Key_Shared subscription reads ahead while earlier ones wait for their
/// key's consumer (the broker's look-ahead limit is of the same order).
const MAX_HELD_FOR_KEY: usize = 10_000;

/// The most entries one read takes (`dispatcherMaxReadBatchSize`, 100 by default).
pub(super) const READ_BATCH: usize = 100;

/// The most entries one consumer takes in one turn of the round robin
/// (`dispatcherMaxRoundRobinBatchSize`, 20 by default).
const ROUND_ROBIN_BATCH: usize = 20;

/// The broker's sticky-key hash of an entry: its `ordering_key`, else its `partition_key`,
/// else `NONE_KEY`.
pub(super) fn entry_key_hash(metadata: &MessageMetadata) -> u32 {
    let key = metadata
        .ordering_key
        .as_deref()
        .or_else(|| metadata.partition_key.as_deref().map(str::as_bytes))
        .unwrap_or(pulsar_wire::NONE_KEY);
    pulsar_wire::sticky_key_hash(key)
}

/// A Key_Shared subscription's policy, fixed by its first consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeySharedPolicy {
    pub(super) sticky: bool,
    pub(super) allow_out_of_order: bool,
}

impl KeySharedPolicy {
    /// The policy of a consumer's `KeySharedMeta` (AUTO_SPLIT without one, as the broker
    /// takes it), and its sticky ranges.
    pub(super) fn of(meta: Option<&KeySharedMeta>) -> Result<(Self, Vec<(u32, u32)>), String> {
        let Some(meta) = meta else {
            return Ok((
                Self {
                    sticky: false,
                    allow_out_of_order: false,
                },
                Vec::new(),
            ));
        };
        let mode = KeySharedMode::try_from(meta.key_shared_mode)
            .map_err(|_| format!("unknown keySharedMode {}", meta.key_shared_mode))?;
        let policy = Self {
            sticky: mode == KeySharedMode::Sticky,
            allow_out_of_order: meta.allow_out_of_order_delivery.unwrap_or(false),
        };
        if !policy.sticky {
            return Ok((policy, Vec::new()));
        }
        if meta.hash_ranges.is_empty() {
            return Err("Ranges for KeyShared policy must not be empty.".into());
        }
        let mut ranges = Vec::with_capacity(meta.hash_ranges.len());
        for range in &meta.hash_ranges {
            if range.start > range.end {
                return Err("Fixed hash range start > end".into());
            }
            let (Ok(start), Ok(end)) = (u32::try_from(range.start), u32::try_from(range.end))
            else {
                return Err(format!(
                    "hash range [{}, {}] is negative",
                    range.start, range.end
                ));
            };
            ranges.push((start, end));
        }
        Ok((policy, ranges))
    }

    fn mode_name(self) -> &'static str {
        if self.sticky { "STICKY" } else { "AUTO_SPLIT" }
    }
}

/// Counters kept per consumer.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ConsumerCounters {
    pub(super) dispatched_entries: u64,
    pub(super) dispatched_messages: u64,
    pub(super) ack_commands: u64,
    pub(super) acked_ids: u64,
    pub(super) acked_messages: i64,
    pub(super) conflicts: u64,
    pub(super) flow_commands: u64,
    pub(super) redeliver_all_commands: u64,
    pub(super) redeliver_ids_commands: u64,
    pub(super) validation_errors: u64,
}

/// One consumer of a subscription; its accounting is in the subscription's model, under
/// `ConsumerId(key)`.
#[derive(Debug)]
pub(super) struct Consumer {
    /// Unique in the emulator.
    pub(super) key: u64,
    pub(super) conn: u64,
    pub(super) consumer_id: u64,
    pub(super) name: String,
    pub(super) permits: i64,
    pub(super) counters: ConsumerCounters,
    /// The hash ranges of a STICKY Key_Shared consumer, inclusive.
    pub(super) hash_ranges: Vec<(u32, u32)>,
    /// Whether FLOW permits arrived while the consumer was blocked
    /// (`permitsReceivedWhileConsumerBlocked > 0`): a redelivery request with ids then makes
    /// the dispatcher read even when it replays nothing.
    flowed_while_blocked: bool,
}

impl Consumer {
    pub(super) fn new(key: u64, conn: u64, consumer_id: u64, name: String) -> Self {
        Self {
            key,
            conn,
            consumer_id,
            name,
            permits: 0,
            counters: ConsumerCounters::default(),
            hash_ranges: Vec::new(),
            flowed_while_blocked: false,
        }
    }

    fn id(&self) -> ConsumerId {
        ConsumerId(self.key)
    }
}

/// What became of an entry offered to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    /// On the wire.
    Delivered,
    /// Nothing left to send (acknowledged, or pending in a transaction).
    Consumed,
    /// The consumer cannot take it now.
    Refused,
}

/// The result of one ACK frame.
#[derive(Debug, Default)]
pub(super) struct AckResult {
    /// The first error, for `ACK_RESPONSE`.
    pub(super) error: Option<(ServerError, String)>,
}

/// A subscription: its cursor, its consumers and their accounting.
#[derive(Debug)]
pub(super) struct Subscription {
    pub(super) name: String,
    pub(super) sub_type: SubType,
    pub(super) durable: bool,
    /// The broker's accounting: the cursor, the transactional pending acks, and each
    /// consumer's count, blocked flag and `pendingAcks`.
    model: SubscriptionModel,
    /// The next entry never sent.
    read_pos: u64,
    /// The dispatcher's replay set (`redeliveryMessages`): entries to send again, to any
    /// consumer.
    redeliver: BTreeSet<u64>,
    /// The dispatcher's redelivery counts (`InMemoryRedeliveryTracker`).
    redelivery_counts: HashMap<u64, u32>,
    /// Every entry below is deleted (acknowledged) or outside the subscription.
    mark_delete: u64,
    /// Deleted entries at or above `mark_delete`.
    deleted: BTreeSet<u64>,
    /// `mark_delete` when the consumers' `pendingAcks` were last pruned up to it
    /// (`lastMarkDeletePositionBeforeReadMoreEntries`).
    pruned_to: u64,
    /// Whether the subscription has a dispatcher: the broker makes one for the first
    /// consumer of a subscription loaded without one, keeps it when the consumers go, and
    /// has none after the topic is loaded again (an unload, a restart). Without one, an
    /// abort replays nothing and counts no redelivery
    /// (`PersistentSubscription.redeliverUnacknowledgedMessages` does nothing).
    dispatcher: bool,
    /// Connected consumers in subscription order: the first is the active one for
    /// Exclusive and Failover.
    pub(super) consumers: Vec<Consumer>,
    /// The next Shared consumer to try (`currentConsumerRoundRobinIndex`).
    round_robin: usize,
    /// Consumers a redelivery request unblocked without making the dispatcher read (it named
    /// no entry of the consumer's `pendingAcks` and no permits arrived while it was blocked):
    /// they get nothing until something makes the dispatcher read (a FLOW, a publish, a
    /// replay, an unblocking ack, a transaction's end, a consumer coming or going).
    idle: BTreeSet<u64>,
    /// Shared and Key_Shared: entries read whose `deliver_at_time` has not come; the
    /// dispatcher replays each when it is due (`getMessagesToReplayNow`).
    delayed: Delayed,
    /// Key_Shared: the policy the first connected consumer set.
    key_shared: Option<KeySharedPolicy>,
    /// Key_Shared: entries read but not sent yet, waiting for their key's consumer (no
    /// permits, blocked, or no consumer covers the key's hash).
    held: BTreeSet<u64>,
    /// Message ids acknowledged (plainly or in a transaction) whose entry the cursor had
    /// already deleted, over the subscription's life.
    acks_of_deleted: u64,
    /// Transactional acks refused as conflicts, over the subscription's life.
    conflicts: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES without ids, over the subscription's life.
    redeliver_all_commands: u64,
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES with ids, over the subscription's life.
    redeliver_ids_commands: u64,
}

impl Subscription {
    pub(super) fn new(
        name: String,
        sub_type: SubType,
        durable: bool,
        start: u64,
        config: ModelConfig,
    ) -> Self {
        Self {
            name,
            sub_type,
            durable,
            model: SubscriptionModel::new(config),
            read_pos: start,
            redeliver: BTreeSet::new(),
            redelivery_counts: HashMap::new(),
            mark_delete: start,
            deleted: BTreeSet::new(),
            pruned_to: start,
            dispatcher: false,
            consumers: Vec::new(),
            round_robin: 0,
            idle: BTreeSet::new(),
            delayed: Delayed::default(),
            key_shared: None,
            held: BTreeSet::new(),
            acks_of_deleted: 0,
            conflicts: 0,
            redeliver_all_commands: 0,
            redeliver_ids_commands: 0,
        }
    }

    /// The topic was unloaded or the broker restarted (its consumers already removed): the
    /// subscription is loaded again from its cursor, without a dispatcher, and what the
    /// broker kept only in memory is forgotten: the replay set, the redelivery counts
    /// (`InMemoryRedeliveryTracker`), the round robin. The cursor and the open transactions'
    /// pending acks (the pending-ack store) stay.
    pub(super) fn reloaded(&mut self) {
        self.dispatcher = false;
        self.redeliver.clear();
        self.redelivery_counts.clear();
        self.held.clear();
        self.delayed.clear();
        self.round_robin = 0;
        self.idle.clear();
    }

    /// Applies a new `maxUnackedMessagesOnConsumer` to the connected consumers at once, as on
    /// a real 4.0.x broker.
    pub(super) fn set_max_unacked_messages(&mut self, max: u32) {
        self.model.set_max_unacked_messages(max);
    }

    /// Whether a Key_Shared consumer with `policy` and `ranges` may join, as the broker
    /// decides: the connected consumers fixed the mode and out-of-order setting
    /// (`ConsumerBusy` otherwise), and sticky ranges may not overlap another consumer's
    /// (`ConsumerAssignError`).
    pub(super) fn admits(
        &self,
        policy: KeySharedPolicy,
        ranges: &[(u32, u32)],
    ) -> Result<(), (ServerError, String)> {
        if let Some(active) = self.key_shared.filter(|_| !self.consumers.is_empty()) {
            let busy = |detail: String| {
                Err((
                    ServerError::ConsumerBusy,
                    format!("Subscription is of different type. {detail}"),
                ))
            };
            if active.sticky != policy.sticky {
                return busy(format!(
                    "Active subscription key_shared mode of '{}' is different than the \
                     connecting consumer's key_shared mode '{}'.",
                    active.mode_name(),
                    policy.mode_name()
                ));
            }
            if active.allow_out_of_order != policy.allow_out_of_order {
                return busy(if active.allow_out_of_order {
                    "Active subscription allows out of order delivery while the connecting \
                     consumer does not allow it."
                        .into()
                } else {
                    "Active subscription does not allow out of order delivery while the \
                     connecting consumer allows it."
                        .into()
                });
            }
        }
        for (start, end) in ranges {
            for other in &self.consumers {
                if other
                    .hash_ranges
                    .iter()
                    .any(|(s, e)| start <= e && s <= end)
                {
                    return Err((
                        ServerError::ConsumerAssignError,
                        format!("Range conflict with consumer {}", other.name),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Sets the Key_Shared policy when no consumer is connected (the first one fixes it).
    pub(super) fn set_key_shared(&mut self, policy: KeySharedPolicy) {
        if self.consumers.is_empty() {
            self.key_shared = Some(policy);
        }
    }

    /// The entry of the cursor's mark-delete position (every entry up to it is deleted), or
    /// `None` when no entry is.
    pub(super) fn mark_delete_position(&self) -> Option<u64> {
        self.mark_delete.checked_sub(1)
    }

    pub(super) fn shared(&self) -> bool {
        matches!(self.sub_type, SubType::Shared | SubType::KeyShared)
    }

    fn position(&self, key: u64) -> Option<usize> {
        self.consumers.iter().position(|c| c.key == key)
    }

    fn is_deleted(&self, index: u64) -> bool {
        index < self.mark_delete || self.deleted.contains(&index)
    }

    fn mark_deleted(&mut self, index: u64) {
        if self.is_deleted(index) {
            return;
        }
        self.deleted.insert(index);
        while self.deleted.remove(&self.mark_delete) {
            self.mark_delete += 1;
        }
        self.held.remove(&index);
        self.redeliver.remove(&index);
        self.redelivery_counts.remove(&index);
    }

    /// Something makes the dispatcher read (`readMoreEntries`): consumers left idle by a
    /// redelivery request are considered again.
    fn read_triggered(&mut self) {
        self.idle.clear();
    }

    /// `addMessageToReplay`: the entry joins the replay set unless the cursor deleted it or
    /// the subscription has no dispatcher; `counted`: the dispatcher's redelivery count goes
    /// up (a redelivery request or an abort; not a consumer gone, nor entries read that no
    /// consumer could take).
    fn replay(&mut self, index: u64, counted: bool) {
        if self.is_deleted(index) || !self.dispatcher {
            return;
        }
        self.redeliver.insert(index);
        if counted {
            *self.redelivery_counts.entry(index).or_default() += 1;
        }
    }

    /// Adds a consumer; for Failover, tells every consumer which one is active. The first
    /// consumer of a subscription that has none makes its dispatcher if it has none, and
    /// finds the cursor rewound to its mark-delete position and the replay set empty
    /// (`PersistentDispatcherMultipleConsumers.addConsumer`: `cursor.rewind()`,
    /// `redeliveryMessages.clear()`; a single-active dispatcher rewinds for its new active
    /// consumer): what an abort added to the replay set while no consumer was connected is
    /// read again from the cursor, once, not replayed as well. The redelivery counts stay.
    pub(super) fn add_consumer(&mut self, consumer: Consumer, out: &mut Vec<Outgoing>) {
        if self.consumers.is_empty() {
            self.dispatcher = true;
            self.redeliver.clear();
            self.held.clear();
            self.read_pos = self.first_not_deleted();
        }
        self.model.add_consumer(consumer.id());
        self.consumers.push(consumer);
        self.read_triggered();
        self.notify_active(out);
    }

    fn notify_active(&self, out: &mut Vec<Outgoing>) {
        if self.sub_type != SubType::Failover {
            return;
        }
        for (i, consumer) in self.consumers.iter().enumerate() {
            let mut cmd = command(Type::ActiveConsumerChange);
            cmd.active_consumer_change = Some(CommandActiveConsumerChange {
                consumer_id: consumer.consumer_id,
                is_active: Some(i == 0),
            });
            out.push(Outgoing {
                conn: consumer.conn,
                frame: Box::new(Frame::command(cmd)),
                kind: Kind::Other,
            });
        }
    }

    /// Removes a consumer (closed, unsubscribed or disconnected): the entries of its
    /// `pendingAcks` join the replay set, for the other consumers
    /// (`PersistentDispatcherMultipleConsumers.removeConsumer`, which does not count them as
    /// redelivered). The subscription keeps its cursor and the pending acks of open
    /// transactions.
    pub(super) fn remove_consumer(&mut self, key: u64, out: &mut Vec<Outgoing>) {
        let Some(position) = self.position(key) else {
            return;
        };
        self.consumers.remove(position);
        self.idle.remove(&key);
        if let Some(removed) = self.model.remove_consumer(ConsumerId(key)) {
            for entry in removed.entries {
                self.replay(entry.entry_id, false);
            }
        }
        if self.consumers.is_empty() {
            // clearComponentsAfterRemovedAllConsumers: the replay set and the redelivery
            // counts go (the dispatcher stays); the next consumer finds the cursor rewound
            // (`add_consumer`), so every entry not deleted is read again, in order.
            self.redeliver.clear();
            self.redelivery_counts.clear();
            self.held.clear();
        }
        if self.round_robin >= self.consumers.len() {
            self.round_robin = 0;
        }
        self.read_triggered();
        if position == 0 {
            self.notify_active(out);
        }
    }

    /// `resetCursor` (a `SEEK`), once its consumers were removed: the mark-delete position
    /// goes to just before `to` and reading starts there, whether that is before or after
    /// where the cursor stood; what the cursor had deleted is forgotten (every entry from `to`
    /// on is outstanding again), and so is what the dispatcher kept in memory (the replay set,
    /// the redelivery counts, delayed entries). `start` is the ack set of entry `to`
    /// (`(num_messages, outstanding indexes)`): its other indexes count as acknowledged. The
    /// pending acks of open transactions stay. Returns `false` while a consumer is
    /// connected (the broker disconnects them first).
    pub(super) fn seek(&mut self, to: u64, start: Option<(i32, AckSet)>, ledger_id: u64) -> bool {
        if !self.model.reset_cursor() {
            return false;
        }
        self.mark_delete = to;
        self.read_pos = to;
        self.pruned_to = to;
        self.deleted.clear();
        self.redeliver.clear();
        self.redelivery_counts.clear();
        self.held.clear();
        self.delayed.clear();
        self.idle.clear();
        if let Some((num_messages, outstanding)) = start {
            let entry = EntryId {
                ledger_id,
                entry_id: to,
            };
            // An ack set of another size than the entry's is the client's mistake: the
            // broker keeps it as given; the model refuses it, and the entry stays whole.
            let _ = self.model.restore_cursor(entry, num_messages, &outstanding);
        }
        true
    }

    /// The first entry the cursor has not deleted.
    fn first_not_deleted(&self) -> u64 {
        let mut at = self.mark_delete;
        while self.deleted.contains(&at) {
            at += 1;
        }
        at
    }

    /// `isConsumerAvailable`: permits, not blocked, and not left idle by a request.
    fn eligible(&self, consumer: &Consumer) -> bool {
        consumer.permits > 0
            && !self.model.is_blocked(consumer.id()).unwrap_or(true)
            && !self.idle.contains(&consumer.key)
    }

    /// The consumer that takes the next entries (`getNextConsumer`), by index into
    /// `consumers`: round robin over the eligible ones for Shared, the active (first) one
    /// for Exclusive and Failover.
    fn pick(&mut self) -> Option<usize> {
        if !self.shared() {
            return self
                .consumers
                .first()
                .filter(|c| self.eligible(c))
                .map(|_| 0);
        }
        let n = self.consumers.len();
        for offset in 0..n {
            let i = (self.round_robin + offset) % n;
            if self.eligible(&self.consumers[i]) {
                self.round_robin = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    fn any_eligible(&self) -> bool {
        if self.shared() {
            self.consumers.iter().any(|c| self.eligible(c))
        } else {
            self.consumers.first().is_some_and(|c| self.eligible(c))
        }
    }

    /// Key_Shared: the consumer that owns `hash`. STICKY: the consumer whose ranges hold it,
    /// if any. AUTO_SPLIT (as the emulator does it): the hash space `0..65536` is cut into as
    /// many equal contiguous ranges as there are connected consumers, in subscription order.
    fn key_owner(&self, hash: u32) -> Option<usize> {
        if self.key_shared.is_some_and(|p| p.sticky) {
            return self.consumers.iter().position(|c| {
                c.hash_ranges
                    .iter()
                    .any(|(start, end)| (*start..=*end).contains(&hash))
            });
        }
        let n = self.consumers.len() as u64;
        (n > 0)
            .then(|| (u64::from(hash) * n / u64::from(pulsar_wire::KEY_HASH_RANGE_SIZE)) as usize)
    }

    /// Sends what the dispatcher would send now. Entries wholly acknowledged leave every
    /// consumer's `pendingAcks` first, as `readMoreEntries` prunes them up to the mark-delete
    /// position (without touching the counts, as 4.0.8 does).
    pub(super) fn dispatch(&mut self, topic: &TopicView<'_>, out: &mut Vec<Outgoing>) {
        if self.shared()
            && self.mark_delete > self.pruned_to
            && let Some(last) = self.mark_delete_position()
        {
            self.model.remove_pending_acks_up_to(topic.entry_id(last));
            self.pruned_to = self.mark_delete;
        }
        for consumer in &mut self.consumers {
            if !self.model.is_blocked(consumer.id()).unwrap_or(false) {
                // flowConsumerBlockedPermits moved them when it was unblocked.
                consumer.flowed_while_blocked = false;
            }
        }
        if self.shared() {
            // Delayed entries due now join the replay set.
            for index in self.delayed.take_due(topic.now_ms) {
                if !self.is_deleted(index) {
                    self.redeliver.insert(index);
                }
            }
        }
        if !self.any_eligible() {
            return;
        }
        if self.sub_type == SubType::KeyShared {
            return self.dispatch_by_key(topic, out);
        }
        loop {
            if !self.any_eligible() {
                return;
            }
            // calculateToRead: as many entries as the consumers have permits, at most a read
            // batch.
            let permits: i64 = self
                .consumers
                .iter()
                .filter(|c| self.eligible(c))
                .map(|c| c.permits.max(0))
                .sum();
            let to_read = usize::try_from(permits)
                .unwrap_or(usize::MAX)
                .clamp(1, READ_BATCH);
            let deleted: Vec<u64> = self
                .redeliver
                .iter()
                .copied()
                .filter(|i| self.is_deleted(*i))
                .collect();
            for index in deleted {
                self.redeliver.remove(&index);
            }
            let replay: Vec<u64> = self.redeliver.iter().copied().take(to_read).collect();
            if !replay.is_empty() {
                if self.hand_out(&replay, true, topic, out) == 0 {
                    return;
                }
                continue;
            }
            let mut read = Vec::new();
            let mut at = self.read_pos;
            while read.len() < to_read {
                let Some(entry) = topic.entries.get(at as usize) else {
                    break;
                };
                match entry.visibility {
                    Visibility::Pending(_) => break,
                    Visibility::Aborted => {}
                    // A rewound cursor skips what it deleted.
                    Visibility::Visible if self.is_deleted(at) => {}
                    Visibility::Visible if self.waits(at, entry, topic.now_ms) => {}
                    Visibility::Visible => read.push(at),
                }
                at += 1;
            }
            if read.is_empty() {
                // Only aborted entries up to here (or nothing): skip them.
                self.read_pos = at;
                return;
            }
            let handed = self.hand_out(&read, false, topic, out);
            self.read_pos = match read.get(handed) {
                Some(next) => *next,
                None => at,
            };
            if handed == 0 {
                return;
            }
        }
    }

    /// Whether entry `index`, just read, waits for its delivery time (Shared and Key_Shared
    /// only: `trackDelayedDelivery`; Exclusive and Failover deliver it at once).
    fn waits(&mut self, index: u64, entry: &StoredEntry, now_ms: i64) -> bool {
        self.shared()
            && self
                .delayed
                .waits(index, entry.metadata.deliver_at_time, now_ms)
    }

    /// When the next delayed entry comes due.
    pub(super) fn next_due(&self) -> Option<i64> {
        self.delayed.next_due()
    }

    /// `trySendMessagesToConsumers`: hands the entries read out in order, each consumer
    /// picked taking up to `getMaxEntriesInThisBatch` of them in one `sendMessages` call.
    /// Returns how many (from the first) were handed out; the rest wait (replays stay in
    /// the replay set, new entries are read again).
    fn hand_out(
        &mut self,
        read: &[u64],
        replay: bool,
        topic: &TopicView<'_>,
        out: &mut Vec<Outgoing>,
    ) -> usize {
        let size = |index: &u64| {
            topic
                .entries
                .get(*index as usize)
                .map_or(1, |e| i64::from(e.num_messages.max(1)))
        };
        let mut remaining: i64 = read.iter().map(size).sum();
        let average = (remaining / read.len().max(1) as i64).max(1);
        let mut start = 0;
        while start < read.len() {
            let Some(consumer) = self.pick() else {
                break;
            };
            let take = self.entries_for(consumer, remaining, average);
            let chunk = &read[start..(start + take).min(read.len())];
            if replay {
                for index in chunk {
                    self.redeliver.remove(index);
                }
            }
            let offers = self.send(consumer, chunk, topic, out);
            for (index, offer) in chunk.iter().zip(&offers) {
                match offer {
                    Offer::Delivered => remaining -= size(index),
                    Offer::Consumed => {}
                    // Unreachable: the consumer picked is not blocked. Keep the entry.
                    Offer::Refused => self.replay(*index, false),
                }
            }
            start += chunk.len();
        }
        if start > 0 {
            // The dispatcher read, and reads again after sending: every available consumer
            // is considered from now on.
            self.read_triggered();
        }
        start
    }

    /// `getMaxEntriesInThisBatch`: the entries consumer `c` takes in one turn: the messages
    /// left in the read, its permits and the room below its limit, in entries of the read's
    /// average size, at most [`ROUND_ROBIN_BATCH`], at least 1.
    fn entries_for(&self, c: usize, remaining: i64, average: i64) -> usize {
        let consumer = &self.consumers[c];
        let mut messages = remaining.min(consumer.permits.max(0));
        let max = i64::from(self.model.config().max_unacked_messages);
        if max > 0 {
            let unacked = self.model.unacked(consumer.id()).unwrap_or(0);
            messages = messages.min((max - unacked).max(0));
        }
        let entries = (messages + average - 1) / average;
        usize::try_from(entries)
            .unwrap_or(0)
            .clamp(1, ROUND_ROBIN_BATCH)
    }

    /// Key_Shared dispatch: every entry goes to the consumer of its key's hash
    /// ([`Subscription::key_owner`]), replays included (the broker computes the hash of a
    /// replayed entry and sends it to that hash's consumer, so a key keeps its consumer). An
    /// entry that consumer cannot take now (no permits, blocked, or no consumer covers the
    /// hash) waits, and so does every later entry of the same hash, while entries of other
    /// hashes go on (up to [`MAX_HELD_FOR_KEY`] waiting): a key's entries reach its consumer
    /// in order. Waiting and redelivered entries go first, in entry order.
    fn dispatch_by_key(&mut self, topic: &TopicView<'_>, out: &mut Vec<Outgoing>) {
        // Hashes whose consumer refused an entry in this pass: their later entries wait.
        let mut stalled: HashSet<u32> = HashSet::new();
        let waiting: BTreeSet<u64> = self
            .redeliver
            .iter()
            .chain(self.held.iter())
            .copied()
            .collect();
        for index in waiting {
            if !self.any_eligible() {
                return;
            }
            let Some(entry) = topic.entries.get(index as usize) else {
                self.redeliver.remove(&index);
                self.held.remove(&index);
                continue;
            };
            if self.is_deleted(index) {
                self.redeliver.remove(&index);
                self.held.remove(&index);
                continue;
            }
            let hash = entry_key_hash(&entry.metadata);
            if stalled.contains(&hash) {
                continue;
            }
            match self.offer_by_key(hash, index, topic, out) {
                Offer::Delivered | Offer::Consumed => {
                    self.redeliver.remove(&index);
                    self.held.remove(&index);
                }
                Offer::Refused => {
                    stalled.insert(hash);
                }
            }
        }
        while let Some(entry) = topic.entries.get(self.read_pos as usize) {
            match entry.visibility {
                Visibility::Pending(_) => break,
                Visibility::Aborted => {
                    self.read_pos += 1;
                    continue;
                }
                Visibility::Visible => {}
            }
            if !self.any_eligible() || self.held.len() >= MAX_HELD_FOR_KEY {
                break;
            }
            let index = self.read_pos;
            self.read_pos += 1;
            if self.is_deleted(index) || self.waits(index, entry, topic.now_ms) {
                // A rewound cursor skips what it deleted; a delayed entry waits.
                continue;
            }
            let hash = entry_key_hash(&entry.metadata);
            if stalled.contains(&hash) {
                self.held.insert(index);
                continue;
            }
            if let Offer::Refused = self.offer_by_key(hash, index, topic, out) {
                stalled.insert(hash);
                self.held.insert(index);
            } else {
                // The dispatcher read: every available consumer is considered from now on.
                self.read_triggered();
            }
        }
    }

    /// Offers entry `index` to the consumer of `hash`.
    fn offer_by_key(
        &mut self,
        hash: u32,
        index: u64,
        topic: &TopicView<'_>,
        out: &mut Vec<Outgoing>,
    ) -> Offer {
        match self.key_owner(hash) {
            Some(consumer) if self.eligible(&self.consumers[consumer]) => self
                .send(consumer, &[index], topic, out)
                .first()
                .copied()
                .unwrap_or(Offer::Consumed),
            _ => Offer::Refused,
        }
    }

    /// One `sendMessages` call: `chunk` goes to consumer `c`, filtered as
    /// `filterEntriesForConsumer` does (entries acknowledged or wholly pending in a
    /// transaction are not sent; the others carry the cursor's and the pending acks' ack
    /// set). Returns what became of each entry.
    fn send(
        &mut self,
        c: usize,
        chunk: &[u64],
        topic: &TopicView<'_>,
        out: &mut Vec<Outgoing>,
    ) -> Vec<Offer> {
        let id = self.consumers[c].id();
        let mut offers = vec![Offer::Consumed; chunk.len()];
        let mut batch = Vec::with_capacity(chunk.len());
        let mut at = Vec::with_capacity(chunk.len());
        for (i, index) in chunk.iter().enumerate() {
            if let Some(entry) = topic.entries.get(*index as usize) {
                batch.push((topic.entry_id(*index), entry.num_messages));
                at.push(i);
            }
        }
        let answers = match self.model.dispatch_all(id, &batch) {
            Ok(answers) => answers,
            Err(error) => {
                // Unreachable: sends are validated, so every entry has a valid size.
                tracing::warn!(%error, "the model refused to dispatch entries");
                return offers;
            }
        };
        for ((i, (entry_id, _)), answer) in at.into_iter().zip(&batch).zip(answers) {
            let index = chunk[i];
            offers[i] = match answer {
                Dispatch::Dispatched {
                    counted, ack_set, ..
                } => {
                    let Some(entry) = topic.entries.get(index as usize) else {
                        continue;
                    };
                    let redelivery_count = self.redelivery_counts.get(&index).copied().unwrap_or(0);
                    let target = &mut self.consumers[c];
                    target.permits -= counted;
                    target.counters.dispatched_entries += 1;
                    target.counters.dispatched_messages += counted.max(0) as u64;
                    let mut cmd = command(Type::Message);
                    cmd.message = Some(CommandMessage {
                        consumer_id: target.consumer_id,
                        message_id: MessageIdData {
                            ledger_id: entry_id.ledger_id,
                            entry_id: entry_id.entry_id,
                            partition: Some(topic.partition),
                            ..MessageIdData::default()
                        },
                        redelivery_count: Some(redelivery_count),
                        ack_set,
                        consumer_epoch: None,
                    });
                    out.push(Outgoing {
                        conn: target.conn,
                        frame: Box::new(Frame::with_payload(
                            cmd,
                            entry.metadata.clone(),
                            entry.payload.clone(),
                        )),
                        kind: Kind::Message,
                    });
                    Offer::Delivered
                }
                Dispatch::Blocked => Offer::Refused,
                Dispatch::Skipped(_) => {
                    if self
                        .model
                        .entry(entry_id)
                        .is_some_and(|v| v.cursor.is_deleted())
                    {
                        self.mark_deleted(index);
                    }
                    Offer::Consumed
                }
            };
        }
        offers
    }

    /// A FLOW: the permits, and the dispatcher reads (`consumerFlow`).
    pub(super) fn flow(&mut self, key: u64, permits: u32) {
        let Some(at) = self.position(key) else {
            return;
        };
        let blocked = self.model.is_blocked(ConsumerId(key)).unwrap_or(false);
        let consumer = &mut self.consumers[at];
        consumer.counters.flow_commands += 1;
        consumer.permits = consumer.permits.saturating_add(i64::from(permits));
        consumer.flowed_while_blocked |= blocked && permits > 0;
        let _ = self.model.flow_permits(ConsumerId(key));
        self.read_triggered();
    }

    /// A REDELIVER_UNACKNOWLEDGED_MESSAGES from consumer `key`. Without ids: its count goes
    /// to 0, it is unblocked and every entry of its `pendingAcks` joins the replay set. With
    /// ids: only the named entries that are in **its** `pendingAcks` leave them and join the
    /// replay set, its count goes down by them, and it is unblocked; the dispatcher reads only
    /// if something joined the replay set or permits arrived while it was blocked
    /// (`Consumer.redeliverUnacknowledgedMessages(List)`), so a request naming nothing of its
    /// own leaves it unblocked and idle until something else makes the dispatcher read. The
    /// replays go to any consumer.
    pub(super) fn redeliver_unacknowledged(
        &mut self,
        key: u64,
        ids: &[MessageIdData],
        ledger_id: u64,
    ) {
        let Some(at) = self.position(key) else {
            return;
        };
        let id = ConsumerId(key);
        let was_blocked = self.model.is_blocked(id).unwrap_or(false);
        let redelivered = if ids.is_empty() {
            self.consumers[at].counters.redeliver_all_commands += 1;
            self.redeliver_all_commands += 1;
            self.model.redeliver_all(id)
        } else {
            self.consumers[at].counters.redeliver_ids_commands += 1;
            self.redeliver_ids_commands += 1;
            let entries: Vec<EntryId> = ids
                .iter()
                .filter(|id| id.ledger_id == ledger_id)
                .map(|id| EntryId {
                    ledger_id: id.ledger_id,
                    entry_id: id.entry_id,
                })
                .collect();
            self.model.redeliver_unacknowledged(id, &entries)
        };
        let Ok(redelivered) = redelivered else {
            return;
        };
        let replayed = redelivered
            .entries
            .iter()
            .any(|e| !self.is_deleted(e.entry_id));
        for entry in &redelivered.entries {
            self.replay(entry.entry_id, true);
        }
        let flowed = std::mem::take(&mut self.consumers[at].flowed_while_blocked);
        if ids.is_empty() || replayed || flowed {
            self.read_triggered();
        } else if was_blocked {
            // Unblocked, but the dispatcher, which stopped reading for it, is not told.
            self.idle.insert(key);
        }
    }

    /// An ACK from consumer `key`. Each message id goes to the model with the consumer that
    /// sent it (the model finds the consumer whose count it changes); a cumulative ack on an
    /// Exclusive or Failover subscription becomes one individual ack per entry of the
    /// consumer's `pendingAcks` it covers (the model follows Shared rules, where cumulative
    /// acks are ignored).
    pub(super) fn ack(&mut self, key: u64, ack: &CommandAck, ledger_id: u64) -> AckResult {
        let mut result = AckResult::default();
        let Some(acker) = self.position(key) else {
            result.error = Some((
                ServerError::ConsumerNotFound,
                format!("consumer {} is not connected", ack.consumer_id),
            ));
            return result;
        };
        let counters = &mut self.consumers[acker].counters;
        counters.ack_commands += 1;
        counters.acked_ids += ack.message_id.len() as u64;
        if ack.validation_error.is_some() {
            counters.validation_errors += 1;
        }
        let txn = match (ack.txnid_most_bits, ack.txnid_least_bits) {
            (Some(most_bits), Some(least_bits)) => Some(TxnId {
                most_bits,
                least_bits,
            }),
            _ => None,
        };
        let kind = if ack.ack_type == AckType::Cumulative as i32 {
            AckKind::Cumulative
        } else {
            AckKind::Individual
        };
        if kind == AckKind::Cumulative && !self.shared() && ack.message_id.len() != 1 {
            // The 4.0 broker ignores a cumulative ack that does not carry exactly one id.
            return result;
        }
        for id in &ack.message_id {
            if id.ledger_id != ledger_id {
                continue;
            }
            let entry = EntryId {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
            };
            let wire = WireAck {
                kind,
                entry,
                ack_set: id.ack_set.clone(),
                batch_size: id.batch_size,
                txn,
            };
            if kind == AckKind::Cumulative && !self.shared() {
                self.cumulative(acker, &wire, &mut result);
            } else {
                self.apply(acker, &wire, &mut result);
            }
        }
        result
    }

    fn cumulative(&mut self, acker: usize, upto: &WireAck, result: &mut AckResult) {
        let covered: Vec<(EntryId, u32)> = self
            .model
            .pending_acks(self.consumers[acker].id())
            .filter(|(e, _)| {
                e.ledger_id == upto.entry.ledger_id && e.entry_id <= upto.entry.entry_id
            })
            .collect();
        for (entry, size) in covered {
            let last = entry == upto.entry;
            let batch_size = match (upto.txn, last) {
                (None, _) => None,
                (Some(_), true) => upto.batch_size.or(Some(size as i32)),
                (Some(_), false) => Some(size as i32),
            };
            let wire = WireAck {
                kind: AckKind::Individual,
                entry,
                ack_set: if last {
                    upto.ack_set.clone()
                } else {
                    Vec::new()
                },
                batch_size,
                txn: upto.txn,
            };
            self.apply(acker, &wire, result);
        }
    }

    fn apply(&mut self, acker: usize, wire: &WireAck, result: &mut AckResult) {
        let index = wire.entry.entry_id;
        if self.is_deleted(index) {
            self.acks_of_deleted += 1;
        }
        let outcome = self.model.ack(self.consumers[acker].id(), wire);
        match outcome {
            Ok(AckOutcome::Acked(effect)) => {
                self.consumers[acker].counters.acked_messages -= effect.unacked_delta;
                if effect.entry_deleted {
                    self.mark_deleted(index);
                }
                if effect.unblocked {
                    // updateBlockedConsumerOnUnackedMsgs → flowConsumerBlockedPermits.
                    self.read_triggered();
                }
            }
            Ok(AckOutcome::Ignored(_)) => {}
            Ok(AckOutcome::Conflict(conflict)) => {
                self.conflicts += 1;
                let counters = &mut self.consumers[acker].counters;
                counters.conflicts += 1;
                counters.acked_messages -= conflict.effect.unacked_delta;
                if conflict.effect.unblocked {
                    self.read_triggered();
                }
                result.error.get_or_insert((
                    ServerError::TransactionConflict,
                    format!(
                        "{}:{}: {}",
                        wire.entry.ledger_id, wire.entry.entry_id, conflict.reason
                    ),
                ));
            }
            Err(txn_ack::Error::UnknownEntry { .. }) => {
                // The broker acknowledges positions it never sent without complaint.
            }
            Err(error @ txn_ack::Error::TransactionEnded { .. }) => {
                result
                    .error
                    .get_or_insert((ServerError::InvalidTxnStatus, error.to_string()));
            }
            Err(error) => {
                result
                    .error
                    .get_or_insert((ServerError::UnknownError, error.to_string()));
            }
        }
    }

    /// A transaction ended: commits delete entries; aborts give the indexes back and add the
    /// entries to the replay set (`PendingAckHandleImpl` → `redeliverUnacknowledgedMessages`),
    /// for any consumer.
    pub(super) fn end_txn(&mut self, txn: TxnId, commit: bool) {
        if commit {
            if let Ok(committed) = self.model.commit(txn) {
                for entry in committed.deleted {
                    self.mark_deleted(entry.entry_id);
                }
            }
        } else if let Ok(aborted) = self.model.abort(txn) {
            for entry in aborted.redeliver {
                self.replay(entry.entry_id, true);
            }
        }
        self.read_triggered();
    }

    /// New entries may be readable (a publish, a transaction's sends committed): the
    /// dispatcher reads.
    pub(super) fn published(&mut self) {
        self.read_triggered();
    }

    /// Messages not acknowledged, and entries not wholly acknowledged (the broker's
    /// `msgBacklog`).
    fn backlog(&self, topic: &TopicView<'_>) -> (u64, u64) {
        let (mut messages, mut entries) = (0, 0);
        for index in self.mark_delete..topic.entries.len() as u64 {
            let entry = &topic.entries[index as usize];
            if entry.visibility != Visibility::Visible || self.is_deleted(index) {
                continue;
            }
            let outstanding = self
                .model
                .entry(&topic.entry_id(index))
                .map(|view| match view.cursor {
                    CursorState::Outstanding => entry.num_messages as u64,
                    CursorState::Partial(set) => u64::from(set.outstanding_count()),
                    CursorState::Deleted => 0,
                })
                .unwrap_or(entry.num_messages as u64);
            messages += outstanding;
            entries += u64::from(outstanding > 0);
        }
        (messages, entries)
    }

    fn consumer_stats(&self, consumer: &Consumer) -> ConsumerStats {
        let view = self.model.consumer(consumer.id());
        let counters = &consumer.counters;
        ConsumerStats {
            connection: consumer.conn,
            consumer_id: consumer.consumer_id,
            name: consumer.name.clone(),
            // The broker counts unacked messages only in the individual-ack modes
            // (`Consumer.incrementUnackedMessages`); an Exclusive or Failover consumer
            // reports 0.
            unacked: if self.shared() {
                view.map_or(0, |v| v.unacked)
            } else {
                0
            },
            blocked: view.is_some_and(|v| v.blocked),
            max_unacked: self.model.config().max_unacked_messages,
            permits: consumer.permits,
            dispatched_entries: counters.dispatched_entries,
            dispatched_messages: counters.dispatched_messages,
            ack_commands: counters.ack_commands,
            acked_ids: counters.acked_ids,
            acked_messages: counters.acked_messages,
            conflicts: counters.conflicts,
            flow_commands: counters.flow_commands,
            redeliver_commands: counters.redeliver_all_commands + counters.redeliver_ids_commands,
            redeliver_all_commands: counters.redeliver_all_commands,
            redeliver_ids_commands: counters.redeliver_ids_commands,
            validation_errors: counters.validation_errors,
            times_blocked: view.map_or(0, |v| v.counters.blocked),
            idle: self.idle.contains(&consumer.key),
            pending_acks: self.model.pending_acks(consumer.id()).count(),
        }
    }

    pub(super) fn stats(&self, topic: &TopicView<'_>) -> SubscriptionStats {
        let (backlog, backlog_entries) = self.backlog(topic);
        SubscriptionStats {
            name: self.name.clone(),
            sub_type: self.sub_type,
            backlog,
            backlog_entries,
            pending_redelivery: self.redeliver.len(),
            waiting_for_key_consumer: self.held.len(),
            delayed: self.delayed.len(),
            consumers: self
                .consumers
                .iter()
                .map(|consumer| self.consumer_stats(consumer))
                .collect(),
            acks_of_deleted: self.acks_of_deleted,
            conflicts: self.conflicts,
            redeliver_all_commands: self.redeliver_all_commands,
            redeliver_ids_commands: self.redeliver_ids_commands,
        }
    }
}
