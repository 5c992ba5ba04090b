//! Subscriptions and consumers: permits, dispatch, acks and redelivery. Every unacked count,
//! blocked flag, pending ack and conflict comes from each consumer's `txn_ack::model::
//! ConsumerModel`; this module only decides which entry goes to which consumer and turns the
//! model's answers into frames.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use txn_ack::model::{AckOutcome, ConsumerModel, CursorState, Dispatch, ModelConfig, WireAck};
use txn_ack::{AckKind, AckSet, EntryId, TxnId};

use super::entries::{TopicView, Visibility};
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

/// Counters kept per consumer beside its model.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ConsumerCounters {
    pub(super) dispatched_entries: u64,
    pub(super) dispatched_messages: u64,
    pub(super) ack_commands: u64,
    pub(super) acked_ids: u64,
    pub(super) acked_messages: i64,
    pub(super) conflicts: u64,
    pub(super) flow_commands: u64,
    pub(super) redeliver_commands: u64,
    pub(super) validation_errors: u64,
}

/// One consumer of a subscription.
#[derive(Debug)]
pub(super) struct Consumer {
    /// Unique in the emulator.
    pub(super) key: u64,
    pub(super) conn: u64,
    pub(super) consumer_id: u64,
    pub(super) name: String,
    /// The broker's accounting for this consumer.
    pub(super) model: ConsumerModel,
    pub(super) permits: i64,
    pub(super) connected: bool,
    pub(super) counters: ConsumerCounters,
    /// The hash ranges of a STICKY Key_Shared consumer, inclusive.
    pub(super) hash_ranges: Vec<(u32, u32)>,
}

impl Consumer {
    pub(super) fn new(
        key: u64,
        conn: u64,
        consumer_id: u64,
        name: String,
        config: ModelConfig,
    ) -> Self {
        Self {
            key,
            conn,
            consumer_id,
            name,
            model: ConsumerModel::new(config),
            permits: 0,
            connected: true,
            counters: ConsumerCounters::default(),
            hash_ranges: Vec::new(),
        }
    }

    fn eligible(&self) -> bool {
        self.permits > 0 && !self.model.is_blocked()
    }

    fn stats(&self) -> ConsumerStats {
        ConsumerStats {
            connection: self.conn,
            consumer_id: self.consumer_id,
            name: self.name.clone(),
            unacked: self.model.unacked(),
            blocked: self.model.is_blocked(),
            max_unacked: self.model.config().max_unacked_messages,
            permits: self.permits,
            dispatched_entries: self.counters.dispatched_entries,
            dispatched_messages: self.counters.dispatched_messages,
            ack_commands: self.counters.ack_commands,
            acked_ids: self.counters.acked_ids,
            acked_messages: self.counters.acked_messages,
            conflicts: self.counters.conflicts,
            flow_commands: self.counters.flow_commands,
            redeliver_commands: self.counters.redeliver_commands,
            validation_errors: self.counters.validation_errors,
            times_blocked: self.model.counters().blocked,
        }
    }
}

/// What became of an entry offered to a consumer.
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

/// A subscription: its cursor and its consumers.
#[derive(Debug)]
pub(super) struct Subscription {
    pub(super) name: String,
    pub(super) sub_type: SubType,
    pub(super) durable: bool,
    /// The next entry never sent.
    read_pos: u64,
    /// Entries to send again, with the consumer they must go back to (the one whose
    /// accounting holds their state) if it is still connected.
    redeliver: BTreeMap<u64, Option<u64>>,
    redelivery_counts: HashMap<u64, u32>,
    /// Every entry below is deleted (acknowledged) or outside the subscription.
    mark_delete: u64,
    /// Deleted entries at or above `mark_delete`.
    deleted: BTreeSet<u64>,
    /// The cursor's batch-deleted indexes (`batchDeletedIndexes`: the indexes still
    /// outstanding) of entries acknowledged in part through a consumer that has gone: a
    /// consumer that receives such an entry is given them first, so that the indexes already
    /// acknowledged are neither sent nor counted again.
    batch_deleted: HashMap<u64, AckSet>,
    /// The consumer whose model last received each entry not yet deleted.
    home: HashMap<u64, u64>,
    /// Connected consumers in subscription order: the first is the active one for
    /// Exclusive and Failover.
    pub(super) consumers: Vec<Consumer>,
    /// Closed consumers whose models still hold open transactions' acks.
    retired: Vec<Consumer>,
    /// The next Shared consumer to try.
    round_robin: usize,
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
}

impl Subscription {
    pub(super) fn new(name: String, sub_type: SubType, durable: bool, start: u64) -> Self {
        Self {
            name,
            sub_type,
            durable,
            read_pos: start,
            redeliver: BTreeMap::new(),
            redelivery_counts: HashMap::new(),
            mark_delete: start,
            deleted: BTreeSet::new(),
            batch_deleted: HashMap::new(),
            home: HashMap::new(),
            consumers: Vec::new(),
            retired: Vec::new(),
            round_robin: 0,
            key_shared: None,
            held: BTreeSet::new(),
            acks_of_deleted: 0,
            conflicts: 0,
        }
    }

    /// The broker restarted (its consumers already removed): what it kept only in memory is
    /// forgotten. The dispatcher's redelivery counts (`InMemoryRedeliveryTracker`) start
    /// again from 0; the cursor, the entries queued to be sent again, the Key_Shared entries
    /// waiting for their key's consumer and the closed consumers' open transactional acks
    /// (the pending-ack store) stay.
    pub(super) fn restarted(&mut self) {
        self.redelivery_counts.clear();
        self.round_robin = 0;
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

    pub(super) fn consumer_mut(&mut self, key: u64) -> Option<&mut Consumer> {
        self.consumers.iter_mut().find(|c| c.key == key)
    }

    fn any_model(&self, key: u64) -> Option<&ConsumerModel> {
        self.consumers
            .iter()
            .chain(&self.retired)
            .find(|c| c.key == key)
            .map(|c| &c.model)
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
        self.home.remove(&index);
        self.batch_deleted.remove(&index);
        self.held.remove(&index);
        self.redeliver.remove(&index);
        self.redelivery_counts.remove(&index);
    }

    fn queue_redelivery(&mut self, index: u64, to: Option<u64>) {
        if self.is_deleted(index) {
            return;
        }
        self.redeliver.insert(index, to);
        *self.redelivery_counts.entry(index).or_default() += 1;
    }

    /// Adds a consumer; for Failover, tells every consumer which one is active.
    pub(super) fn add_consumer(&mut self, consumer: Consumer, out: &mut Vec<Outgoing>) {
        self.consumers.push(consumer);
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

    /// Removes a consumer (closed, unsubscribed or disconnected): what it had not
    /// acknowledged goes to the other consumers. Its model is kept while transactions hold
    /// acks in it, so that their commit or abort still lands.
    pub(super) fn remove_consumer(&mut self, key: u64, out: &mut Vec<Outgoing>) {
        let Some(position) = self.consumers.iter().position(|c| c.key == key) else {
            return;
        };
        let mut consumer = self.consumers.remove(position);
        consumer.connected = false;
        // The cursor keeps what was acknowledged at batch-index level (it belongs to the
        // subscription, not to the consumer).
        for view in consumer.model.entries() {
            if let CursorState::Partial(set) = view.cursor {
                self.batch_deleted.insert(view.entry.entry_id, set.clone());
            }
        }
        let unacked: Vec<EntryId> = consumer.model.pending_acks().map(|(e, _)| e).collect();
        for entry in unacked {
            self.queue_redelivery(entry.entry_id, None);
        }
        for to in self.redeliver.values_mut() {
            if *to == Some(key) {
                *to = None;
            }
        }
        if consumer.model.open_transactions().next().is_some() {
            self.retired.push(consumer);
        }
        if self.round_robin >= self.consumers.len() {
            self.round_robin = 0;
        }
        if position == 0 {
            self.notify_active(out);
        }
    }

    /// The consumer that takes the next entry, by index into `consumers`.
    fn pick(&mut self, sticky: Option<u64>) -> Option<usize> {
        if !self.shared() {
            return self.consumers.first().filter(|c| c.eligible()).map(|_| 0);
        }
        if let Some(key) = sticky
            && let Some(i) = self.consumers.iter().position(|c| c.key == key)
        {
            return self.consumers[i].eligible().then_some(i);
        }
        let n = self.consumers.len();
        for offset in 0..n {
            let i = (self.round_robin + offset) % n;
            if self.consumers[i].eligible() {
                self.round_robin = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    fn any_eligible(&self) -> bool {
        if self.shared() {
            self.consumers.iter().any(Consumer::eligible)
        } else {
            self.consumers.first().is_some_and(Consumer::eligible)
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

    /// Sends redeliveries first, then entries never sent, while consumers have permits and
    /// their models allow it.
    pub(super) fn dispatch(&mut self, topic: &TopicView<'_>, out: &mut Vec<Outgoing>) {
        if !self.any_eligible() {
            return;
        }
        if self.sub_type == SubType::KeyShared {
            return self.dispatch_by_key(topic, out);
        }
        if !self.redeliver.is_empty() {
            let queued: Vec<(u64, Option<u64>)> =
                self.redeliver.iter().map(|(i, to)| (*i, *to)).collect();
            for (index, to) in queued {
                if !self.any_eligible() {
                    return;
                }
                if self.is_deleted(index) {
                    self.redeliver.remove(&index);
                    continue;
                }
                let Some(consumer) = self.pick(to) else {
                    continue;
                };
                match self.send(consumer, index, topic, out) {
                    Offer::Delivered | Offer::Consumed => {
                        self.redeliver.remove(&index);
                    }
                    Offer::Refused => {}
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
            let Some(consumer) = self.pick(None) else {
                break;
            };
            match self.send(consumer, self.read_pos, topic, out) {
                Offer::Delivered | Offer::Consumed => self.read_pos += 1,
                Offer::Refused => break,
            }
        }
    }

    /// Key_Shared dispatch: every entry goes to the consumer of its key's hash
    /// ([`Subscription::key_owner`]). An entry that consumer cannot take now (no permits,
    /// blocked, or no consumer covers the hash) waits, and so does every later entry of the
    /// same hash, while entries of other hashes go on (up to [`MAX_HELD_FOR_KEY`] waiting):
    /// a key's entries reach its consumer in order. Waiting and redelivered entries go first,
    /// in entry order.
    fn dispatch_by_key(&mut self, topic: &TopicView<'_>, out: &mut Vec<Outgoing>) {
        // Hashes whose consumer refused an entry in this pass: their later entries wait.
        let mut stalled: HashSet<u32> = HashSet::new();
        let waiting: BTreeSet<u64> = self
            .redeliver
            .keys()
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
            let hash = entry_key_hash(&entry.metadata);
            if stalled.contains(&hash) {
                self.held.insert(index);
                continue;
            }
            if let Offer::Refused = self.offer_by_key(hash, index, topic, out) {
                stalled.insert(hash);
                self.held.insert(index);
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
            Some(consumer) if self.consumers[consumer].eligible() => {
                self.send(consumer, index, topic, out)
            }
            _ => Offer::Refused,
        }
    }

    fn send(
        &mut self,
        consumer: usize,
        index: u64,
        topic: &TopicView<'_>,
        out: &mut Vec<Outgoing>,
    ) -> Offer {
        let Some(entry) = topic.entries.get(index as usize) else {
            return Offer::Consumed;
        };
        let id = topic.entry_id(index);
        let key = self.consumers[consumer].key;
        // An entry whose state another consumer's model holds: do not send what that model
        // says is acknowledged or wholly pending in a transaction.
        if let Some(&home) = self.home.get(&index)
            && home != key
            && let Some(view) = self.any_model(home).and_then(|m| m.entry(&id))
        {
            if view.cursor.is_deleted() {
                self.mark_deleted(index);
                return Offer::Consumed;
            }
            if view
                .pending
                .as_ref()
                .is_some_and(|p| p.ack_set.as_ref().is_none_or(|s| s.iter().all(|w| *w == 0)))
            {
                return Offer::Consumed;
            }
        }
        let redelivery_count = self.redelivery_counts.get(&index).copied().unwrap_or(0);
        let target = &mut self.consumers[consumer];
        if let Some(outstanding) = self.batch_deleted.get(&index)
            && let Err(error) = target
                .model
                .restore_cursor(id, entry.num_messages, outstanding)
        {
            tracing::warn!(%error, entry = %id, "the model refused the cursor's batch-deleted indexes");
        }
        match target.model.dispatch(id, entry.num_messages) {
            Ok(Dispatch::Dispatched {
                counted, ack_set, ..
            }) => {
                target.permits -= counted;
                target.counters.dispatched_entries += 1;
                target.counters.dispatched_messages += counted.max(0) as u64;
                let mut cmd = command(Type::Message);
                cmd.message = Some(CommandMessage {
                    consumer_id: target.consumer_id,
                    message_id: MessageIdData {
                        ledger_id: id.ledger_id,
                        entry_id: id.entry_id,
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
                self.home.insert(index, key);
                Offer::Delivered
            }
            Ok(Dispatch::Blocked) => Offer::Refused,
            Ok(Dispatch::Skipped(_)) => {
                if target
                    .model
                    .entry(&id)
                    .is_some_and(|v| v.cursor.is_deleted())
                {
                    self.mark_deleted(index);
                }
                Offer::Consumed
            }
            Err(error) => {
                tracing::warn!(%error, entry = %id, "the model refused to dispatch an entry");
                Offer::Consumed
            }
        }
    }

    /// A FLOW.
    pub(super) fn flow(&mut self, key: u64, permits: u32) {
        if let Some(consumer) = self.consumer_mut(key) {
            consumer.counters.flow_commands += 1;
            consumer.permits = consumer.permits.saturating_add(i64::from(permits));
            consumer.model.flow_permits();
        }
    }

    /// A REDELIVER_UNACKNOWLEDGED_MESSAGES: the named entries (all, without ids) are sent
    /// again, to this consumer since its model holds their state.
    pub(super) fn redeliver_unacknowledged(
        &mut self,
        key: u64,
        ids: &[MessageIdData],
        ledger_id: u64,
    ) {
        let Some(consumer) = self.consumer_mut(key) else {
            return;
        };
        consumer.counters.redeliver_commands += 1;
        let redelivered = if ids.is_empty() {
            consumer.model.redeliver_all()
        } else {
            let entries: Vec<EntryId> = ids
                .iter()
                .filter(|id| id.ledger_id == ledger_id)
                .map(|id| EntryId {
                    ledger_id: id.ledger_id,
                    entry_id: id.entry_id,
                })
                .collect();
            consumer.model.redeliver_unacknowledged(&entries)
        };
        for entry in redelivered.entries {
            self.queue_redelivery(entry.entry_id, Some(key));
        }
    }

    /// Where an ack of `entry` is accounted: the consumer holding it in `pendingAcks` (the
    /// acker first), else the acker if it knows the entry, else the consumer that last
    /// received it (possibly closed), else the acker.
    fn owner(&mut self, acker: usize, entry: &EntryId) -> &mut Consumer {
        let pending = |c: &Consumer| c.model.entry(entry).is_some_and(|v| v.in_pending_acks);
        let known = |c: &Consumer| c.model.entry(entry).is_some();
        let at = if pending(&self.consumers[acker]) {
            Some((false, acker))
        } else if let Some(i) = self.consumers.iter().position(pending) {
            Some((false, i))
        } else if known(&self.consumers[acker]) {
            Some((false, acker))
        } else {
            self.home.get(&entry.entry_id).and_then(|home| {
                self.consumers
                    .iter()
                    .position(|c| c.key == *home)
                    .map(|i| (false, i))
                    .or_else(|| {
                        self.retired
                            .iter()
                            .position(|c| c.key == *home)
                            .map(|i| (true, i))
                    })
            })
        };
        match at {
            Some((true, i)) => &mut self.retired[i],
            Some((false, i)) => &mut self.consumers[i],
            None => &mut self.consumers[acker],
        }
    }

    /// An ACK from consumer `key`. Each message id goes to the model that accounts for its
    /// entry; a cumulative ack on an Exclusive or Failover subscription becomes one
    /// individual ack per entry it covers (the model follows Shared rules, where cumulative
    /// acks are ignored).
    pub(super) fn ack(&mut self, key: u64, ack: &CommandAck, ledger_id: u64) -> AckResult {
        let mut result = AckResult::default();
        let Some(acker) = self.consumers.iter().position(|c| c.key == key) else {
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
        let covered: Vec<(EntryId, u32)> = self.consumers[acker]
            .model
            .pending_acks()
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
        let owner = self.owner(acker, &wire.entry);
        let outcome = owner.model.ack(wire);
        match outcome {
            Ok(AckOutcome::Acked(effect)) => {
                self.consumers[acker].counters.acked_messages -= effect.unacked_delta;
                if effect.entry_deleted {
                    self.mark_deleted(index);
                }
            }
            Ok(AckOutcome::Ignored(_)) => {}
            Ok(AckOutcome::Conflict(conflict)) => {
                self.conflicts += 1;
                let counters = &mut self.consumers[acker].counters;
                counters.conflicts += 1;
                counters.acked_messages -= conflict.effect.unacked_delta;
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

    /// A transaction ended: each model commits or aborts it; commits delete entries, aborts
    /// send entries again (to the consumer whose model holds them, if connected).
    pub(super) fn end_txn(&mut self, txn: TxnId, commit: bool) {
        let mut deleted = Vec::new();
        let mut redeliver = Vec::new();
        for consumer in self.consumers.iter_mut().chain(self.retired.iter_mut()) {
            if commit {
                if let Ok(committed) = consumer.model.commit(txn) {
                    deleted.extend(committed.deleted);
                }
            } else if let Ok(aborted) = consumer.model.abort(txn) {
                let to = consumer.connected.then_some(consumer.key);
                redeliver.extend(aborted.redeliver.into_iter().map(|e| (e, to)));
            }
        }
        for entry in deleted {
            self.mark_deleted(entry.entry_id);
        }
        for (entry, to) in redeliver {
            self.queue_redelivery(entry.entry_id, to);
        }
        self.retired
            .retain(|c| c.model.open_transactions().next().is_some());
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
            let id = topic.entry_id(index);
            let outstanding = self
                .home
                .get(&index)
                .and_then(|home| self.any_model(*home))
                .and_then(|model| model.entry(&id))
                .map(|view| match view.cursor {
                    CursorState::Outstanding => entry.num_messages as u64,
                    CursorState::Partial(set) => u64::from(set.outstanding_count()),
                    CursorState::Deleted => 0,
                })
                .or_else(|| {
                    self.batch_deleted
                        .get(&index)
                        .map(|set| u64::from(set.outstanding_count()))
                })
                .unwrap_or(entry.num_messages as u64);
            messages += outstanding;
            entries += u64::from(outstanding > 0);
        }
        (messages, entries)
    }

    pub(super) fn stats(&self, topic: &TopicView<'_>) -> SubscriptionStats {
        let (backlog, backlog_entries) = self.backlog(topic);
        let shared = self.shared();
        SubscriptionStats {
            name: self.name.clone(),
            sub_type: self.sub_type,
            backlog,
            backlog_entries,
            pending_redelivery: self.redeliver.len(),
            waiting_for_key_consumer: self.held.len(),
            consumers: self
                .consumers
                .iter()
                .map(|consumer| {
                    let mut stats = consumer.stats();
                    if !shared {
                        // The broker counts unacked messages only in the individual-ack
                        // modes (`Consumer.incrementUnackedMessages`); an Exclusive or
                        // Failover consumer reports 0.
                        stats.unacked = 0;
                    }
                    stats
                })
                .collect(),
            retired_consumers: self.retired.len(),
            acks_of_deleted: self.acks_of_deleted,
            conflicts: self.conflicts,
        }
    }
}
