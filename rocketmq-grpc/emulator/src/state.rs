//! In-memory topics, queues, messages and per-consumer-group consumption state: deliveries
//! with receipt handles and invisibility deadlines, redelivery, FIFO ordering, and the ledger.
//!
//! Everything here is synchronous and takes the current emulator time as an argument, so it is
//! tested without a server or a runtime. The service layer holds one lock per topic around
//! these calls.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::counters::{Counters, inc};
use super::filter::Filter;
use super::handle::ReceiptHandle;

/// The message type a topic accepts (the topic attribute `message.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TopicKind {
    /// Normal messages only (no message group).
    Normal,
    /// FIFO messages only (every message has a message group).
    Fifo,
    /// Transactional messages only: each is held as a half message until its
    /// `EndTransaction` commits it (stored) or rolls it back (dropped).
    Transaction,
    /// Delay (timed) messages only (every message has a delivery time,
    /// `message.type=DELAY`): each is delivered no earlier than its delivery time.
    Delay,
    /// Priority messages only (RocketMQ 5.4+, `message.type=PRIORITY`; every message has a
    /// priority): as the 5.5.0 broker, a message of priority `p` is stored on queue
    /// `min(p, queues - 1)` and a receive takes the highest queue first, whatever queue it
    /// names.
    Priority,
    /// Lite messages only (RocketMQ 5.4+, `message.type=LITE`; every message has a lite
    /// topic): stored on the queue the lite topic hashes to and on a light queue of its own,
    /// which the lite push consumers of a group bound to this topic receive from once they
    /// subscribed to the lite topic (`SyncLiteSubscription`).
    Lite,
}

impl TopicKind {
    pub(crate) fn message_type(self) -> rocketmq_grpc::pb::MessageType {
        match self {
            TopicKind::Normal => rocketmq_grpc::pb::MessageType::Normal,
            TopicKind::Fifo => rocketmq_grpc::pb::MessageType::Fifo,
            TopicKind::Transaction => rocketmq_grpc::pb::MessageType::Transaction,
            TopicKind::Delay => rocketmq_grpc::pb::MessageType::Delay,
            TopicKind::Priority => rocketmq_grpc::pb::MessageType::Priority,
            TopicKind::Lite => rocketmq_grpc::pb::MessageType::Lite,
        }
    }
}

/// A stored message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredMessage {
    pub(crate) message_id: String,
    /// Shared with every delivery (a copy of a sent body, not a slice of its request).
    pub(crate) body: Bytes,
    pub(crate) tag: Option<String>,
    pub(crate) keys: Vec<String>,
    pub(crate) user_properties: HashMap<String, String>,
    pub(crate) message_group: Option<Arc<str>>,
    pub(crate) born_timestamp: Option<prost_types::Timestamp>,
    pub(crate) born_host: String,
    pub(crate) store_timestamp: prost_types::Timestamp,
    /// Upper-case hex SHA-1 of the body.
    pub(crate) body_sha1: String,
    /// The delivery time as the producer sent it (returned on delivery).
    pub(crate) delivery_timestamp: Option<prost_types::Timestamp>,
    /// The emulator time (ms) before which it is not delivered: the delivery time mapped onto
    /// the emulator's clock when it was stored.
    pub(crate) due_ms: Option<u64>,
    /// The priority as the producer sent it (5.4+; returned on delivery).
    pub(crate) priority: Option<i32>,
    /// The lite topic as the producer sent it (5.4+; returned on delivery).
    pub(crate) lite_topic: Option<String>,
}

/// What the ledger knows about one message for one consumer group
/// ([`Emulator::ledger`](super::Emulator::ledger)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageRecord {
    /// Queue id.
    pub queue_id: u32,
    /// Offset in the queue.
    pub offset: u64,
    /// The message id (`SystemProperties.message_id`).
    pub message_id: String,
    /// The FIFO message group, if any.
    pub message_group: Option<String>,
    /// Deliveries so far (the last delivery's `delivery_attempt`).
    pub deliveries: u32,
    /// Whether the message is acknowledged.
    pub acked: bool,
    /// Whether the message is currently in flight (delivered, invisible, not acknowledged).
    pub in_flight: bool,
    /// `OK` answers given to ack entries for this message, including answers to repeated acks
    /// of an already acknowledged message and answers that a fault then dropped.
    pub ok_acks: u32,
    /// `OK` ack answers for this message that fault injection left out of the response.
    pub dropped_results: u32,
    /// Successful `ChangeInvisibleDuration` calls for this message.
    pub nacks: u32,
}

impl MessageRecord {
    /// Acknowledged, and no more `OK` ack answers than one plus the answers that were dropped
    /// (a client retrying an ack whose answer was lost is answered `OK` again; a client acking
    /// twice for no reason is not "exactly once").
    pub fn acked_exactly_once(&self) -> bool {
        self.acked && self.ok_acks.saturating_sub(self.dropped_results) <= 1
    }
}

/// One queue's log and the consumption state of each consumer group on it.
#[derive(Debug, Default)]
pub(crate) struct QueueState {
    pub(crate) log: Vec<Arc<StoredMessage>>,
    consumers: HashMap<String, Consumption>,
}

/// A topic's queues.
#[derive(Debug)]
pub(crate) struct TopicInner {
    pub(crate) queues: Vec<QueueState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum RecState {
    /// Never delivered, or visible again.
    #[default]
    Ready,
    InFlight,
    Acked,
}

#[derive(Debug, Default)]
struct Record {
    /// Sequence number of the latest delivery (or supersession); 0 before the first delivery.
    latest_seq: u64,
    attempts: u32,
    state: RecState,
    /// When the in-flight message becomes visible again (the index key in `deadlines`).
    deadline_ms: u64,
    /// The revive time of the broker's latest checkpoint of this delivery (the receive's
    /// invisible time, or the last `ChangeInvisibleDuration`): a change cannot make the
    /// message visible before it.
    floor_ms: u64,
    /// The client whose proxy-side auto-renewal keeps this delivery alive.
    renew_client: Option<Arc<str>>,
    ok_acks: u32,
    dropped_results: u32,
    nacks: u32,
}

#[derive(Debug, Default)]
struct FifoGroup {
    /// Unacknowledged offsets of this message group, in order.
    pending: VecDeque<u64>,
    in_flight: bool,
}

/// One consumer group's state on one queue.
#[derive(Debug)]
struct Consumption {
    /// Orderly (FIFO) consumption: a message group's next message is delivered only after the
    /// previous one is acknowledged.
    orderly: bool,
    /// One record per ingested log entry (index = offset).
    records: Vec<Record>,
    /// Concurrent mode: the next never-delivered offset.
    cursor: u64,
    /// Concurrent mode: offsets visible again.
    ready: BTreeSet<u64>,
    /// Orderly mode: state per message group.
    fifo_groups: HashMap<Arc<str>, FifoGroup>,
    /// Orderly mode: heads of message groups that may be delivered now.
    fifo_ready: BTreeSet<(u64, Arc<str>)>,
    /// In-flight messages by deadline.
    deadlines: BTreeSet<(u64, u64)>,
    /// Concurrent mode: offsets passed by the cursor that are not due yet, by due time.
    scheduled: BTreeSet<(u64, u64)>,
}

fn fifo_key(m: &StoredMessage) -> Arc<str> {
    m.message_group.clone().unwrap_or_else(|| Arc::from(""))
}

fn idx(offset: u64) -> usize {
    usize::try_from(offset).unwrap_or(usize::MAX)
}

impl Consumption {
    fn new(orderly: bool) -> Self {
        Self {
            orderly,
            records: Vec::new(),
            cursor: 0,
            ready: BTreeSet::new(),
            fifo_groups: HashMap::new(),
            fifo_ready: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            scheduled: BTreeSet::new(),
        }
    }

    /// Concurrent mode: scheduled messages whose delivery time has come become ready.
    fn release_due(&mut self, now_ms: u64) {
        while let Some(&(due, offset)) = self.scheduled.first() {
            if due > now_ms {
                break;
            }
            self.scheduled.pop_first();
            self.ready.insert(offset);
        }
    }

    /// Takes in log entries appended since the last call.
    fn sync(&mut self, log: &[Arc<StoredMessage>]) {
        while self.records.len() < log.len() {
            let offset = self.records.len() as u64;
            self.records.push(Record::default());
            if self.orderly {
                let key = fifo_key(&log[self.records.len() - 1]);
                let g = self.fifo_groups.entry(key.clone()).or_default();
                g.pending.push_back(offset);
                if !g.in_flight && g.pending.len() == 1 {
                    self.fifo_ready.insert((offset, key));
                }
            }
        }
    }

    /// Makes in-flight messages whose deadline passed visible again.
    fn reap(&mut self, now_ms: u64, log: &[Arc<StoredMessage>], counters: &Counters) {
        while let Some(&(deadline, offset)) = self.deadlines.first() {
            if deadline > now_ms {
                break;
            }
            self.deadlines.pop_first();
            let Some(rec) = self.records.get_mut(idx(offset)) else {
                continue;
            };
            if rec.state != RecState::InFlight || rec.deadline_ms != deadline {
                continue;
            }
            rec.state = RecState::Ready;
            rec.renew_client = None;
            inc(&counters.invisibility_expired);
            self.make_ready(offset, log);
        }
    }

    fn make_ready(&mut self, offset: u64, log: &[Arc<StoredMessage>]) {
        if self.orderly {
            let Some(msg) = log.get(idx(offset)) else {
                return;
            };
            let key = fifo_key(msg);
            if let Some(g) = self.fifo_groups.get_mut(&key) {
                g.in_flight = false;
                if let Some(&head) = g.pending.front() {
                    self.fifo_ready.insert((head, key));
                }
            }
        } else {
            self.ready.insert(offset);
        }
    }

    fn next_ready(&mut self, now_ms: u64, log: &[Arc<StoredMessage>]) -> Option<u64> {
        if self.orderly {
            let (offset, key) = self.fifo_ready.pop_first()?;
            if let Some(g) = self.fifo_groups.get_mut(&key) {
                g.in_flight = true;
            }
            Some(offset)
        } else if let Some(offset) = self.ready.pop_first() {
            Some(offset)
        } else {
            while idx(self.cursor) < self.records.len() {
                let offset = self.cursor;
                self.cursor += 1;
                match log.get(idx(offset)).and_then(|m| m.due_ms) {
                    Some(due) if due > now_ms => {
                        self.scheduled.insert((due, offset));
                    }
                    _ => return Some(offset),
                }
            }
            None
        }
    }

    /// Sets a new deadline for an in-flight record, keeping the index in step.
    fn set_deadline(&mut self, offset: u64, deadline_ms: u64) {
        if let Some(rec) = self.records.get_mut(idx(offset)) {
            if rec.state == RecState::InFlight {
                self.deadlines.remove(&(rec.deadline_ms, offset));
            }
            rec.state = RecState::InFlight;
            rec.deadline_ms = deadline_ms;
            self.deadlines.insert((deadline_ms, offset));
        }
    }

    /// After an ack in orderly mode: the group's next message may go.
    fn release_fifo_after_ack(&mut self, offset: u64, log: &[Arc<StoredMessage>]) -> bool {
        if !self.orderly {
            return false;
        }
        let Some(msg) = log.get(idx(offset)) else {
            return false;
        };
        let key = fifo_key(msg);
        let Some(g) = self.fifo_groups.get_mut(&key) else {
            return false;
        };
        if let Some(pos) = g.pending.iter().position(|&o| o == offset) {
            g.pending.remove(pos);
        }
        g.in_flight = false;
        match g.pending.front() {
            Some(&head) => {
                self.fifo_ready.insert((head, key));
                true
            }
            None => {
                self.fifo_groups.remove(&key);
                false
            }
        }
    }
}

/// Parameters of one pop (one `ReceiveMessage` call, after validation).
#[derive(Debug)]
pub(crate) struct PopRequest<'a> {
    pub(crate) group: &'a str,
    pub(crate) orderly: bool,
    /// Queues to take from, in order.
    pub(crate) queues: Vec<usize>,
    pub(crate) max: usize,
    /// The invisible time written into the handle.
    pub(crate) invisible_ms: u64,
    /// Proxy auto-renewal: the client, and how long after the pop renewal stops.
    pub(crate) renew: Option<(Arc<str>, u64)>,
    pub(crate) now_ms: u64,
    pub(crate) broker_name: &'a str,
    /// The subscription's filter: a message it rejects is passed over for the group for good
    /// (as the broker's pop does), counted as acknowledged in the ledger.
    pub(crate) filter: &'a Filter,
}

/// One delivered message.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) queue_id: usize,
    pub(crate) offset: u64,
    pub(crate) message: Arc<StoredMessage>,
    pub(crate) attempt: u32,
    pub(crate) handle: String,
}

/// What a pop found.
#[derive(Debug, Default)]
pub(crate) struct PopOutcome {
    pub(crate) deliveries: Vec<Delivery>,
    /// The earliest in-flight deadline or delivery time of a scheduled message among the
    /// queues looked at (when to look again).
    pub(crate) next_deadline_ms: Option<u64>,
}

/// How an ack or ChangeInvisibleDuration entry's handle resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `INVALID_RECEIPT_HANDLE` "receipt handle is expired".
    Expired,
    /// `INVALID_RECEIPT_HANDLE` with this explanation (superseded or unknown delivery).
    Invalid(&'static str),
    /// `INTERNAL_SERVER_ERROR` with this explanation.
    Error(String),
    /// The handle names this message's current delivery (or the proxy maps it there).
    Target { queue: usize, offset: u64 },
}

/// Result of applying an ack to a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckApplied {
    /// The message went from in flight to acknowledged.
    Acked {
        /// A FIFO message group may now deliver its next message.
        unblocked: bool,
    },
    /// The message was already acknowledged; answered `OK` again.
    Duplicate,
    /// The message is no longer in flight (its invisibility ended).
    Expired,
}

/// Result of applying ChangeInvisibleDuration to a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeApplied {
    /// New handle.
    Changed(String),
    /// The message is already acknowledged.
    AlreadyAcked,
    /// The message is no longer in flight.
    Expired,
}

impl TopicInner {
    pub(crate) fn new(queues: usize) -> Self {
        Self {
            queues: (0..queues).map(|_| QueueState::default()).collect(),
        }
    }

    /// Appends messages to one queue; returns their offsets.
    pub(crate) fn append(&mut self, queue: usize, msgs: Vec<StoredMessage>) -> Vec<u64> {
        let Some(q) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        msgs.into_iter()
            .map(|m| {
                q.log.push(Arc::new(m));
                (q.log.len() - 1) as u64
            })
            .collect()
    }

    /// Reaps expired deliveries of `group` on every queue.
    pub(crate) fn reap_group(&mut self, group: &str, now_ms: u64, counters: &Counters) {
        for q in &mut self.queues {
            if let Some(c) = q.consumers.get_mut(group) {
                c.sync(&q.log);
                c.reap(now_ms, &q.log, counters);
            }
        }
    }

    /// Delivers up to `req.max` messages.
    pub(crate) fn pop(
        &mut self,
        req: &PopRequest<'_>,
        seq: &AtomicU64,
        counters: &Counters,
    ) -> PopOutcome {
        let mut out = PopOutcome::default();
        for &queue_id in &req.queues {
            let Some(q) = self.queues.get_mut(queue_id) else {
                continue;
            };
            let QueueState { log, consumers } = q;
            let c = consumers
                .entry(req.group.to_owned())
                .or_insert_with(|| Consumption::new(req.orderly));
            c.sync(log);
            c.reap(req.now_ms, log, counters);
            c.release_due(req.now_ms);
            while out.deliveries.len() < req.max {
                let Some(offset) = c.next_ready(req.now_ms, log) else {
                    break;
                };
                let Some(message) = log.get(idx(offset)).cloned() else {
                    break;
                };
                if !req
                    .filter
                    .matches(message.tag.as_deref(), &message.user_properties)
                {
                    if let Some(rec) = c.records.get_mut(idx(offset)) {
                        rec.state = RecState::Acked;
                    }
                    c.release_fifo_after_ack(offset, log);
                    continue;
                }
                let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
                let deadline = match &req.renew {
                    Some((_, renew_max)) => req.now_ms.saturating_add(*renew_max),
                    None => req.now_ms.saturating_add(req.invisible_ms),
                };
                let Some(rec) = c.records.get_mut(idx(offset)) else {
                    break;
                };
                rec.attempts = rec.attempts.saturating_add(1);
                rec.latest_seq = s;
                rec.renew_client = req.renew.as_ref().map(|(client, _)| client.clone());
                rec.floor_ms = req.now_ms.saturating_add(req.invisible_ms);
                let attempt = rec.attempts;
                c.set_deadline(offset, deadline);
                inc(&counters.messages_delivered);
                if attempt > 1 {
                    inc(&counters.redelivered);
                }
                out.deliveries.push(Delivery {
                    queue_id,
                    offset,
                    message,
                    attempt,
                    handle: ReceiptHandle::encode(
                        req.now_ms,
                        req.invisible_ms,
                        req.broker_name,
                        queue_id,
                        offset,
                        s,
                    ),
                });
            }
            let first_deadline = c.deadlines.first().map(|&(d, _)| d);
            let first_due = c.scheduled.first().map(|&(d, _)| d);
            for d in first_deadline.into_iter().chain(first_due) {
                out.next_deadline_ms = Some(out.next_deadline_ms.map_or(d, |x| x.min(d)));
            }
        }
        out
    }

    /// Resolves an entry's handle as the proxy would: the proxy-side mapping of auto-renewed
    /// handles first, then expiry, then whether the handle names the current delivery.
    pub(crate) fn evaluate(
        &self,
        group: &str,
        handle: &ReceiptHandle,
        message_id: &str,
        client_id: &str,
        broker_name: &str,
        now_ms: u64,
    ) -> Verdict {
        let located = usize::try_from(handle.queue_id)
            .ok()
            .zip(u64::try_from(handle.offset).ok())
            .and_then(|(queue, offset)| {
                let q = self.queues.get(queue)?;
                let c = q.consumers.get(group)?;
                let rec = c.records.get(idx(offset))?;
                let msg = q.log.get(idx(offset))?;
                Some((queue, offset, rec, msg))
            });
        if let Some((queue, offset, rec, msg)) = located {
            let mapped = rec.state == RecState::InFlight
                && rec.renew_client.as_deref() == Some(client_id)
                && msg.message_id == message_id;
            if mapped {
                return Verdict::Target { queue, offset };
            }
        }
        if handle.is_expired(now_ms) {
            return Verdict::Expired;
        }
        if handle.broker_name != broker_name {
            return Verdict::Error(format!("broker {} not found", handle.broker_name));
        }
        let Some((queue, offset, rec, _)) = located else {
            return Verdict::Invalid("receipt handle does not match any delivery");
        };
        let seq = handle.seq.and_then(|s| u64::try_from(s).ok());
        if seq != Some(rec.latest_seq) {
            return Verdict::Invalid(
                "receipt handle was superseded by a redelivery or an invisible-time change",
            );
        }
        match rec.state {
            RecState::Ready => Verdict::Expired,
            RecState::InFlight | RecState::Acked => Verdict::Target { queue, offset },
        }
    }

    /// Acknowledges a target returned by [`evaluate`](Self::evaluate).
    pub(crate) fn apply_ack(
        &mut self,
        group: &str,
        queue: usize,
        offset: u64,
        counters: &Counters,
    ) -> AckApplied {
        let Some(q) = self.queues.get_mut(queue) else {
            return AckApplied::Expired;
        };
        let QueueState { log, consumers } = q;
        let Some(c) = consumers.get_mut(group) else {
            return AckApplied::Expired;
        };
        let Some(rec) = c.records.get_mut(idx(offset)) else {
            return AckApplied::Expired;
        };
        match rec.state {
            RecState::Ready => AckApplied::Expired,
            RecState::Acked => {
                rec.ok_acks = rec.ok_acks.saturating_add(1);
                inc(&counters.duplicate_acks);
                AckApplied::Duplicate
            }
            RecState::InFlight => {
                let deadline = rec.deadline_ms;
                rec.state = RecState::Acked;
                rec.renew_client = None;
                rec.ok_acks = rec.ok_acks.saturating_add(1);
                c.deadlines.remove(&(deadline, offset));
                inc(&counters.acked);
                let unblocked = c.release_fifo_after_ack(offset, log);
                AckApplied::Acked { unblocked }
            }
        }
    }

    /// Notes that the `OK` answer for this message was dropped by fault injection.
    pub(crate) fn note_dropped_result(&mut self, group: &str, queue: usize, offset: u64) {
        if let Some(rec) = self
            .queues
            .get_mut(queue)
            .and_then(|q| q.consumers.get_mut(group))
            .and_then(|c| c.records.get_mut(idx(offset)))
        {
            rec.dropped_results = rec.dropped_results.saturating_add(1);
        }
    }

    /// Changes the invisible time of a target returned by [`evaluate`](Self::evaluate): new
    /// handle, new deadline, no more auto-renewal.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_change_invisible(
        &mut self,
        group: &str,
        queue: usize,
        offset: u64,
        invisible_ms: u64,
        now_ms: u64,
        broker_name: &str,
        seq: &AtomicU64,
        counters: &Counters,
    ) -> ChangeApplied {
        let Some(c) = self
            .queues
            .get_mut(queue)
            .and_then(|q| q.consumers.get_mut(group))
        else {
            return ChangeApplied::Expired;
        };
        let Some(rec) = c.records.get_mut(idx(offset)) else {
            return ChangeApplied::Expired;
        };
        match rec.state {
            RecState::Ready => ChangeApplied::Expired,
            RecState::Acked => ChangeApplied::AlreadyAcked,
            RecState::InFlight => {
                let s = seq.fetch_add(1, Ordering::Relaxed) + 1;
                rec.latest_seq = s;
                rec.renew_client = None;
                rec.nacks = rec.nacks.saturating_add(1);
                // As on the 5.3.3 proxy: a change to a time before the latest checkpoint's
                // (a 1 s nack right after a 20 s receive) takes effect only then (the message
                // came back after 20 s): the broker's revive queue reaches the new checkpoint
                // only after the one before it.
                let deadline = now_ms.saturating_add(invisible_ms).max(rec.floor_ms);
                rec.floor_ms = deadline;
                c.set_deadline(offset, deadline);
                inc(&counters.nacks);
                ChangeApplied::Changed(ReceiptHandle::encode(
                    now_ms,
                    invisible_ms,
                    broker_name,
                    queue,
                    offset,
                    s,
                ))
            }
        }
    }

    /// A client terminated: its auto-renewed deliveries (of `group`, or of every group) stop
    /// being renewed, become visible after `release_ms`, and their handles are superseded, as
    /// the proxy returns managed handles when a client goes away.
    pub(crate) fn release_client(
        &mut self,
        group: Option<&str>,
        client_id: &str,
        now_ms: u64,
        release_ms: u64,
        seq: &AtomicU64,
    ) -> usize {
        let mut released = 0;
        for q in &mut self.queues {
            for (g, c) in &mut q.consumers {
                if group.is_some_and(|want| want != g) {
                    continue;
                }
                let offsets: Vec<u64> = c
                    .deadlines
                    .iter()
                    .filter(|(_, off)| {
                        c.records.get(idx(*off)).is_some_and(|r| {
                            r.state == RecState::InFlight
                                && r.renew_client.as_deref() == Some(client_id)
                        })
                    })
                    .map(|(_, off)| *off)
                    .collect();
                for off in offsets {
                    if let Some(rec) = c.records.get_mut(idx(off)) {
                        rec.renew_client = None;
                        rec.latest_seq = seq.fetch_add(1, Ordering::Relaxed) + 1;
                    }
                    c.set_deadline(off, now_ms.saturating_add(release_ms));
                    released += 1;
                }
            }
        }
        released
    }

    /// The ledger of `group` on this topic: one record per stored message.
    pub(crate) fn ledger(&self, group: &str) -> Vec<MessageRecord> {
        let mut out = Vec::new();
        for (queue_id, q) in self.queues.iter().enumerate() {
            let c = q.consumers.get(group);
            for (i, msg) in q.log.iter().enumerate() {
                let rec = c.and_then(|c| c.records.get(i));
                out.push(MessageRecord {
                    queue_id: u32::try_from(queue_id).unwrap_or(u32::MAX),
                    offset: i as u64,
                    message_id: msg.message_id.clone(),
                    message_group: msg.message_group.as_deref().map(str::to_owned),
                    deliveries: rec.map_or(0, |r| r.attempts),
                    acked: rec.is_some_and(|r| r.state == RecState::Acked),
                    in_flight: rec.is_some_and(|r| r.state == RecState::InFlight),
                    ok_acks: rec.map_or(0, |r| r.ok_acks),
                    dropped_results: rec.map_or(0, |r| r.dropped_results),
                    nacks: rec.map_or(0, |r| r.nacks),
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKER: &str = "broker-emu";

    fn msg(id: &str, group: Option<&str>) -> StoredMessage {
        StoredMessage {
            message_id: id.to_owned(),
            body: Bytes::copy_from_slice(id.as_bytes()),
            tag: None,
            keys: Vec::new(),
            user_properties: HashMap::new(),
            message_group: group.map(Arc::from),
            born_timestamp: None,
            born_host: String::new(),
            store_timestamp: prost_types::Timestamp::default(),
            body_sha1: String::new(),
            delivery_timestamp: None,
            due_ms: None,
            priority: None,
            lite_topic: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn pop(
        t: &mut TopicInner,
        group: &str,
        orderly: bool,
        max: usize,
        invisible_ms: u64,
        now_ms: u64,
        seq: &AtomicU64,
        counters: &Counters,
    ) -> PopOutcome {
        let queues = (0..t.queues.len()).collect();
        t.pop(
            &PopRequest {
                group,
                orderly,
                queues,
                max,
                invisible_ms,
                renew: None,
                now_ms,
                broker_name: BROKER,
                filter: &Filter::All,
            },
            seq,
            counters,
        )
    }

    fn decode(d: &Delivery) -> ReceiptHandle {
        ReceiptHandle::decode(&d.handle).unwrap()
    }

    #[test]
    fn deliver_ack_and_ledger() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(2);
        assert_eq!(
            t.append(0, vec![msg("a", None), msg("b", None)]),
            vec![0, 1]
        );
        assert_eq!(t.append(1, vec![msg("c", None)]), vec![0]);
        let out = pop(&mut t, "g", false, 32, 30_000, 0, &seq, &counters);
        assert_eq!(out.deliveries.len(), 3);
        assert_eq!(out.next_deadline_ms, Some(30_000));
        for d in &out.deliveries {
            let h = decode(d);
            let v = t.evaluate("g", &h, &d.message.message_id, "c1", BROKER, 1_000);
            let Verdict::Target { queue, offset } = v else {
                panic!("{v:?}")
            };
            assert_eq!(
                t.apply_ack("g", queue, offset, &counters),
                AckApplied::Acked { unblocked: false }
            );
        }
        let ledger = t.ledger("g");
        assert_eq!(ledger.len(), 3);
        assert!(ledger.iter().all(MessageRecord::acked_exactly_once));
        assert_eq!(counters.snapshot().acked, 3);
        // Another group sees everything again.
        let out = pop(&mut t, "other", false, 32, 30_000, 0, &seq, &counters);
        assert_eq!(out.deliveries.len(), 3);
        assert!(t.ledger("g").iter().all(|r| r.acked));
        // Nothing left for g.
        let out = pop(&mut t, "g", false, 32, 30_000, 2_000, &seq, &counters);
        assert!(out.deliveries.is_empty());
    }

    #[test]
    fn expiry_redelivery_and_superseded_handles() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(1);
        t.append(0, vec![msg("a", None)]);
        let first = pop(&mut t, "g", false, 1, 10_000, 0, &seq, &counters).deliveries;
        assert_eq!(first[0].attempt, 1);
        // Still invisible at 9.999 s.
        assert!(
            pop(&mut t, "g", false, 1, 10_000, 9_999, &seq, &counters)
                .deliveries
                .is_empty()
        );
        // Expired handle.
        let h1 = decode(&first[0]);
        assert_eq!(
            t.evaluate("g", &h1, "a", "c", BROKER, 10_000),
            Verdict::Expired
        );
        // Redelivered with attempt 2.
        let second = pop(&mut t, "g", false, 1, 60_000, 10_000, &seq, &counters).deliveries;
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].attempt, 2);
        let s = counters.snapshot();
        assert_eq!((s.redelivered, s.invisibility_expired), (1, 1));
        // The old handle is expired; a forged non-expired copy of it is superseded.
        let mut forged = h1.clone();
        forged.invisible_ms = 1_000_000;
        assert!(matches!(
            t.evaluate("g", &forged, "a", "c", BROKER, 10_001),
            Verdict::Invalid(_)
        ));
        // The new handle acks.
        let h2 = decode(&second[0]);
        let Verdict::Target { queue, offset } = t.evaluate("g", &h2, "a", "c", BROKER, 10_001)
        else {
            panic!()
        };
        assert!(matches!(
            t.apply_ack("g", queue, offset, &counters),
            AckApplied::Acked { .. }
        ));
        // Acking the same handle again is OK (duplicate) and shows in the ledger.
        let Verdict::Target { queue, offset } = t.evaluate("g", &h2, "a", "c", BROKER, 10_002)
        else {
            panic!()
        };
        assert_eq!(
            t.apply_ack("g", queue, offset, &counters),
            AckApplied::Duplicate
        );
        let rec = &t.ledger("g")[0];
        assert_eq!((rec.deliveries, rec.ok_acks), (2, 2));
        assert!(!rec.acked_exactly_once());
        t.note_dropped_result("g", 0, 0);
        assert!(t.ledger("g")[0].acked_exactly_once());
    }

    #[test]
    fn unknown_and_foreign_handles() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(1);
        t.append(0, vec![msg("a", None)]);
        let d = pop(&mut t, "g", false, 1, 10_000, 0, &seq, &counters).deliveries;
        let h = decode(&d[0]);
        // Another group, another queue, another broker.
        assert!(matches!(
            t.evaluate("x", &h, "a", "c", BROKER, 1),
            Verdict::Invalid(_)
        ));
        let mut other_queue = h.clone();
        other_queue.queue_id = 5;
        assert!(matches!(
            t.evaluate("g", &other_queue, "a", "c", BROKER, 1),
            Verdict::Invalid(_)
        ));
        let mut negative = h.clone();
        negative.offset = -1;
        assert!(matches!(
            t.evaluate("g", &negative, "a", "c", BROKER, 1),
            Verdict::Invalid(_)
        ));
        assert!(matches!(
            t.evaluate("g", &h, "a", "c", "other-broker", 1),
            Verdict::Error(_)
        ));
        let mut no_seq = h.clone();
        no_seq.seq = None;
        assert!(matches!(
            t.evaluate("g", &no_seq, "a", "c", BROKER, 1),
            Verdict::Invalid(_)
        ));
        // Out-of-range targets do not panic.
        assert_eq!(t.apply_ack("g", 9, 0, &counters), AckApplied::Expired);
        assert_eq!(t.apply_ack("g", 0, 99, &counters), AckApplied::Expired);
        assert!(t.append(7, vec![msg("z", None)]).is_empty());
    }

    #[test]
    fn fifo_group_waits_for_ack() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(1);
        t.append(
            0,
            vec![
                msg("a1", Some("A")),
                msg("a2", Some("A")),
                msg("b1", Some("B")),
                msg("a3", Some("A")),
            ],
        );
        let out = pop(&mut t, "g", true, 32, 10_000, 0, &seq, &counters).deliveries;
        let ids: Vec<&str> = out.iter().map(|d| d.message.message_id.as_str()).collect();
        assert_eq!(ids, ["a1", "b1"]);
        assert!(
            pop(&mut t, "g", true, 32, 10_000, 1, &seq, &counters)
                .deliveries
                .is_empty()
        );
        // Ack a1 → a2 is next.
        let h = decode(&out[0]);
        let Verdict::Target { queue, offset } = t.evaluate("g", &h, "a1", "c", BROKER, 2) else {
            panic!()
        };
        assert_eq!(
            t.apply_ack("g", queue, offset, &counters),
            AckApplied::Acked { unblocked: true }
        );
        let out2 = pop(&mut t, "g", true, 32, 10_000, 3, &seq, &counters).deliveries;
        let ids: Vec<&str> = out2.iter().map(|d| d.message.message_id.as_str()).collect();
        assert_eq!(ids, ["a2"]);
        // a2 expires → redelivered before a3.
        let out3 = pop(&mut t, "g", true, 32, 10_000, 10_003, &seq, &counters).deliveries;
        let ids: Vec<(&str, u32)> = out3
            .iter()
            .map(|d| (d.message.message_id.as_str(), d.attempt))
            .collect();
        // b1 expired too (delivered at 0, invisible 10 s); heads go in offset order.
        assert_eq!(ids, [("a2", 2), ("b1", 2)]);
    }

    #[test]
    fn change_invisible_duration_supersedes_and_moves_deadline() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(1);
        t.append(0, vec![msg("a", None)]);
        let d = pop(&mut t, "g", false, 1, 30_000, 0, &seq, &counters).deliveries;
        let h = decode(&d[0]);
        let Verdict::Target { queue, offset } = t.evaluate("g", &h, "a", "c", BROKER, 10) else {
            panic!()
        };
        let ChangeApplied::Changed(new) =
            t.apply_change_invisible("g", queue, offset, 0, 10, BROKER, &seq, &counters)
        else {
            panic!()
        };
        // Old handle is superseded, new one expires immediately (0 s).
        assert!(matches!(
            t.evaluate("g", &h, "a", "c", BROKER, 10),
            Verdict::Invalid(_)
        ));
        let nh = ReceiptHandle::decode(&new).unwrap();
        assert_eq!(t.evaluate("g", &nh, "a", "c", BROKER, 10), Verdict::Expired);
        // Visible again only when the receive's 30 s are over, as on the 5.3.3 proxy.
        let early = pop(&mut t, "g", false, 1, 30_000, 10, &seq, &counters).deliveries;
        assert!(early.is_empty());
        let again = pop(&mut t, "g", false, 1, 30_000, 30_000, &seq, &counters).deliveries;
        assert_eq!(again[0].attempt, 2);
        assert_eq!(t.ledger("g")[0].nacks, 1);
        assert_eq!(counters.snapshot().nacks, 1);
    }

    #[test]
    fn auto_renew_mapping_and_client_release() {
        let counters = Counters::default();
        let seq = AtomicU64::new(0);
        let mut t = TopicInner::new(1);
        t.append(0, vec![msg("a", None), msg("b", None)]);
        let req = PopRequest {
            group: "g",
            orderly: false,
            queues: vec![0],
            max: 2,
            invisible_ms: 60_000,
            renew: Some((Arc::from("c1"), 3 * 3_600_000)),
            now_ms: 0,
            broker_name: BROKER,
            filter: &Filter::All,
        };
        let d = t.pop(&req, &seq, &counters).deliveries;
        let ha = decode(&d[0]);
        // Two minutes later the handle's own deadline passed, but the proxy renewed it for c1.
        t.reap_group("g", 120_000, &counters);
        assert!(matches!(
            t.evaluate("g", &ha, "a", "c1", BROKER, 120_000),
            Verdict::Target { .. }
        ));
        // Another client has no mapping: expired.
        assert_eq!(
            t.evaluate("g", &ha, "a", "c2", BROKER, 120_000),
            Verdict::Expired
        );
        // c1 terminates: b is released and its handle superseded.
        assert_eq!(t.release_client(Some("g"), "c1", 120_000, 1_000, &seq), 2);
        let hb = decode(&d[1]);
        assert_eq!(
            t.evaluate("g", &hb, "b", "c1", BROKER, 120_000),
            Verdict::Expired
        );
        let again = pop(&mut t, "g", false, 2, 10_000, 121_000, &seq, &counters).deliveries;
        assert_eq!(again.len(), 2);
    }
}
