//! One consumer on one topic or partition: `SUBSCRIBE`, flow permits, and the task that
//! turns its `MESSAGE` frames into deliveries.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::future::BoxFuture;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, mpsc};
use txn_ack::{
    AckTracker, Deliveries, Delivery as Verdict, DuplicateOf, EntryId, MessagePosition, TxnId,
};

use super::Message;
use super::again::Again;
use super::chunks::{Added, Assembler, Chunk};
use super::ledger::{HeldBackAck, Ledger, Outgoing};
use super::message::{Origin, assembled, decode};
use super::options::{ConsumerOptions, InitialPosition, SubType};
use super::seek::{SeekRequest, StartAfter};
use super::stats::Counters;
use crate::backoff::Retries;
use crate::link::{LinkSlot, LinkState};
use crate::pb::base_command::Type;
use crate::pb::command_ack::ValidationError;
use crate::pb::{self, ServerError, command_subscribe};
use crate::pool::Pool;
use crate::txn::{Outcome, Participant, TxnRef};
use crate::{Connection, ConsumerEvent, Error, Frame, command_frame};

/// What the partition tasks hand to [`super::Consumer::receive`].
#[derive(Debug)]
pub(crate) enum Delivery {
    Message(Box<Message>),
    /// An entry that cannot be decoded: not acknowledged, handed over as an error.
    Undecodable(Box<Undecodable>),
    /// This partition's consumer cannot go on: subscribing again was refused for good.
    Lost(Error),
}

/// An entry that cannot be decoded, on its way to the application.
#[derive(Debug)]
pub(crate) struct Undecodable {
    /// The partition slot it came from.
    pub(crate) slot: usize,
    /// The whole entry's id.
    pub(crate) id: crate::MessageId,
    /// What was wrong.
    pub(crate) reason: String,
    /// How often the broker delivered it before.
    pub(crate) redelivery_count: u32,
    /// The flow permits it took, returned when the application takes it.
    pub(crate) permits: u32,
    /// Its payload as stored, when the frame had one.
    pub(crate) raw: Option<super::message::RawEntry>,
}

impl Undecodable {
    /// An undecodable entry of partition `slot` at `position` that took one permit.
    fn at(slot: usize, position: &MessagePosition, reason: String, redelivery_count: u32) -> Self {
        Self {
            slot,
            id: super::message::id_of(position),
            reason,
            redelivery_count,
            permits: 1,
            raw: None,
        }
    }
}

impl Undecodable {
    /// The error the application gets for it.
    pub(crate) fn error(&self) -> Error {
        Error::Undecodable {
            id: self.id,
            reason: self.reason.clone(),
            redelivery_count: self.redelivery_count,
        }
    }
}

/// The partition consumers of one consumer, by slot (the partition index on a partitioned
/// topic); it grows when the topic gains partitions.
#[derive(Debug)]
pub(crate) struct PartitionList {
    list: RwLock<Arc<[Arc<PartitionConsumer>]>>,
}

impl PartitionList {
    pub(crate) fn new(list: Vec<Arc<PartitionConsumer>>) -> Self {
        Self {
            list: RwLock::new(list.into()),
        }
    }

    pub(crate) fn get(&self, slot: usize) -> Option<Arc<PartitionConsumer>> {
        self.list.read().get(slot).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.list.read().len()
    }

    /// Every partition consumer now.
    pub(crate) fn all(&self) -> Arc<[Arc<PartitionConsumer>]> {
        Arc::clone(&self.list.read())
    }

    /// Appends the consumers of the next slots, in order.
    pub(crate) fn extend(&self, more: Vec<Arc<PartitionConsumer>>) {
        if more.is_empty() {
            return;
        }
        let mut list = self.list.write();
        let grown: Vec<Arc<PartitionConsumer>> = list.iter().cloned().chain(more).collect();
        *list = grown.into();
    }
}

/// How long a partition goes without frames before the consumer looks at whether it may be
/// blocked (and at expired chunked messages).
const QUIET: std::time::Duration = std::time::Duration::from_millis(500);

/// When a consumer whose unacked count on the broker is higher than what it holds asks the
/// broker to unblock it.
///
/// A 4.0.x broker stops dispatching to a Shared consumer whose count reached the limit, and
/// starts again only when an entry leaves the consumer's pending acks with the count at half
/// the limit or lower, or on a redelivery request. When the count drifted above what the
/// application will ever acknowledge ([`txn_ack::Deliveries::drift`]: deliveries counted
/// twice that another client's abort or a broker restart replayed), no ack can get it there.
/// The consumer then sends a `FLOW` with the permits it owes (one, lent, if it owes none),
/// which a blocked consumer's broker keeps aside, and `REDELIVER_UNACKNOWLEDGED_MESSAGES`
/// naming one id that no consumer holds: the broker unblocks the consumer, replays nothing (a
/// request without ids would hand every message the application holds to the other
/// consumers) and reads with the permits kept aside (seen on 4.0.8: without them it reads
/// nothing; a `FLOW` after the unblock re-blocks a consumer at the limit; a `FLOW` of 0
/// permits is refused and ends the connection). The first comes after
/// [`Unblocks::FIRST`] without a new delivery, each further one after twice the wait before,
/// up to [`Unblocks::MOST`]; a new delivery starts over. A consumer whose count has not
/// drifted never sends one: an idle consumer sends nothing but flow permits.
#[derive(Debug)]
struct Unblocks {
    since: tokio::time::Instant,
    wait: std::time::Duration,
}

impl Unblocks {
    const FIRST: std::time::Duration = std::time::Duration::from_secs(1);
    const MOST: std::time::Duration = std::time::Duration::from_secs(30);

    fn new() -> Self {
        Self {
            since: tokio::time::Instant::now(),
            wait: Self::FIRST,
        }
    }

    /// Something new reached the application.
    fn delivered(&mut self) {
        self.since = tokio::time::Instant::now();
        self.wait = Self::FIRST;
    }

    /// Nothing arrived for [`QUIET`]: asks the broker to unblock `consumer` when due.
    fn quiet(&mut self, consumer: &PartitionConsumer, counters: &Counters) {
        if self.since.elapsed() < self.wait || !consumer.unblock(counters) {
            return;
        }
        self.since = tokio::time::Instant::now();
        self.wait = (self.wait * 2).min(Self::MOST);
    }
}

/// The flow permits a consumer owes the broker.
#[derive(Debug, Default)]
struct Permits {
    /// Messages taken from the queue since the last `FLOW` (or withheld while paused).
    owed: u32,
    /// While paused no `FLOW` is sent; permits accumulate in `owed`.
    paused: bool,
    /// Permits granted ahead of the messages taken (to unblock a consumer that owed none),
    /// kept back from the next ones owed.
    lent: u32,
}

impl Permits {
    /// `messages` taken from the queue: owed, once what was lent is made up.
    fn take(&mut self, messages: u32) {
        let repaid = self.lent.min(messages);
        self.lent -= repaid;
        self.owed = self.owed.saturating_add(messages - repaid);
    }
}

/// What a partition consumer shares with its consumer.
#[derive(Debug)]
pub(crate) struct Parts {
    /// Its entry in the consumer's link states.
    pub(crate) state: LinkSlot,
    /// Where messages handed over again go.
    pub(crate) again: Arc<Again>,
    /// The consumer's counters.
    pub(crate) counters: Arc<Counters>,
}

/// The connection a partition consumer is subscribed on, and its id there.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerLink {
    pub(crate) connection: Connection,
    pub(crate) consumer_id: u64,
}

/// What a partition consumer needs to subscribe again.
#[derive(Debug, Clone)]
struct Resubscribe {
    pool: Pool,
    subscription: String,
    options: ConsumerOptions,
}

/// A consumer attached to one topic (or one partition of a partitioned topic).
///
/// When its connection is lost or the broker closes it (`CLOSE_CONSUMER`: an unload, a
/// bundle moving), its pump subscribes again with backoff ([`crate::backoff`]) and grants its
/// permits afresh; the broker redelivers what is unacknowledged, and the ledger hides the
/// copies of what the application already has. Acks keep going through the same trackers
/// and grouping; `receive` waits meanwhile.
#[derive(Debug)]
pub(crate) struct PartitionConsumer {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// Where it is subscribed now: replaced when it subscribes again.
    link: RwLock<ConsumerLink>,
    /// What it subscribes again with.
    resubscribe: Resubscribe,
    /// Set by [`PartitionConsumer::close`]: a consumer closing does not subscribe again.
    closing: AtomicBool,
    permits: Mutex<Permits>,
    /// The receiver queue: the permits granted at subscription.
    pub(crate) queue_size: u32,
    refill_at: u32,
    /// Ordinary acks, accumulated per entry.
    pub(crate) acks: Mutex<AckTracker>,
    /// Transactional acks and deliveries, and the transactional acks held back.
    pub(crate) ledger: Mutex<Ledger>,
    /// Told when the transactional acks in flight or the aborts under way drop.
    ledger_changed: Notify,
    /// Whether transactional acks of partly held batches are held back (Shared and
    /// Key_Shared subscriptions, where the broker replays an aborted batch to any consumer).
    pub(crate) holds_back: bool,
    /// Where messages handed over again go (its consumer's).
    pub(crate) again: Arc<Again>,
    /// Its consumer's counters.
    counters: Arc<Counters>,
    /// Tests only: deliver duplicates and never ask to be unblocked (the behaviour before the
    /// ledger).
    legacy: bool,
    /// The largest payload a compressed entry may decompress to.
    max_uncompressed: usize,
    /// Chunked messages whose chunks are arriving.
    chunks: Mutex<Assembler>,
    /// The largest chunked message, compressed or not.
    max_chunked: usize,
    /// The other entries of undecodable chunked messages handed to the application, by the
    /// entry of their id: acknowledged or redelivered with it.
    chunk_groups: Mutex<HashMap<EntryId, Vec<MessagePosition>>>,
    /// Its entry in the consumer's link states.
    state: LinkSlot,
    /// How many times it subscribed again: bumped under the link's write lock, so that a
    /// request that found its link gone can wait for the next one
    /// ([`PartitionConsumer::relinked`]).
    generation: tokio::sync::watch::Sender<u64>,
    /// After a seek: the first link generation whose messages count (those of earlier links
    /// were sent before the cursor moved); 0 before any seek.
    seek_floor: AtomicU64,
    /// After a seek to a message id: the message itself (it comes again) and what precedes
    /// it in its batch are dropped and acknowledged.
    start_after: Mutex<Option<StartAfter>>,
}

impl PartitionConsumer {
    /// Looks the topic up, subscribes and grants the first `queue_size` permits (or, when
    /// `paused`, owes them until [`PartitionConsumer::resume`]); its link state appears in
    /// `state`'s hub once subscribed. Returns the consumer and the receiver of its frames.
    pub(crate) async fn subscribe(
        pool: &Pool,
        topic: String,
        partition: i32,
        subscription: &str,
        options: &ConsumerOptions,
        (queue_size, paused): (u32, bool),
        Parts {
            state,
            again,
            counters,
        }: Parts,
    ) -> Result<(Self, mpsc::UnboundedReceiver<ConsumerEvent>), Error> {
        let queue_size = queue_size.max(1);
        let (connection, consumer_id, events) =
            subscribe_on(pool, &topic, subscription, options, None).await?;
        let max_uncompressed = options.max_uncompressed_size.unwrap_or_else(|| {
            connection
                .max_message_size()
                .and_then(|size| usize::try_from(size).ok())
                .filter(|size| *size > 0)
                .unwrap_or(crate::DEFAULT_MAX_MESSAGE_SIZE)
        });
        let consumer = Self {
            topic,
            partition,
            link: RwLock::new(ConsumerLink {
                connection,
                consumer_id,
            }),
            resubscribe: Resubscribe {
                pool: pool.clone(),
                subscription: subscription.to_owned(),
                options: options.clone(),
            },
            closing: AtomicBool::new(false),
            permits: Mutex::new(Permits {
                owed: if paused { queue_size } else { 0 },
                paused,
                lent: 0,
            }),
            queue_size,
            refill_at: (queue_size / 2).max(1),
            acks: Mutex::new(AckTracker::new(options.partial_batches)),
            ledger: Mutex::new(Ledger::default()),
            ledger_changed: Notify::new(),
            holds_back: matches!(options.sub_type, SubType::Shared | SubType::KeyShared)
                && !options.legacy_committed_redeliveries,
            again,
            counters,
            legacy: options.legacy_committed_redeliveries,
            max_uncompressed,
            chunks: Mutex::new(Assembler::new(options.chunk_limits)),
            max_chunked: options.chunk_limits.max_bytes,
            chunk_groups: Mutex::new(HashMap::new()),
            state,
            generation: tokio::sync::watch::Sender::new(0),
            seek_floor: AtomicU64::new(0),
            start_after: Mutex::new(None),
        };
        if !paused {
            consumer.flow(queue_size)?;
        }
        consumer.state.attach();
        Ok((consumer, events))
    }

    /// The other entries that go with the undecodable chunked message whose id is at
    /// `position` (none for any other id); forgotten once taken.
    pub(crate) fn entries_with(&self, position: &MessagePosition) -> Vec<MessagePosition> {
        self.chunk_groups
            .lock()
            .remove(&position.entry())
            .unwrap_or_default()
    }

    /// Takes one chunk of a chunked message; returns what to hand to the application.
    fn take_chunk(
        &self,
        chunk: Chunk,
        origin: Origin,
        topic: &Arc<str>,
        counters: &Counters,
    ) -> Vec<Delivery> {
        let verdict = self.ledger.lock().deliveries.delivered(&chunk.position);
        if verdict.is_duplicate() {
            // A copy of an entry held (a new registration is sent them again): nothing new.
            counters.duplicates.fetch_add(1, Ordering::Relaxed);
            self.consumed(1, counters);
            return Vec::new();
        }
        let position = chunk.position;
        let redelivery_count = chunk.redelivery_count;
        let mut dropped = Vec::new();
        let added = self.chunks.lock().add(chunk, &mut dropped);
        self.redeliver_dropped(dropped, counters);
        let mut out = self.expired_chunks(origin.slot, counters);
        let (undecodable, others) = match added {
            Added::Held | Added::Dropped => {
                self.consumed(1, counters);
                return out;
            }
            Added::Complete(done) => {
                let last = done.last;
                let others = done.others.clone();
                let redelivery_count = done.redelivery_count;
                match assembled(*done, origin, topic, self.max_chunked) {
                    Ok(mut message) => {
                        counters.chunked.fetch_add(1, Ordering::Relaxed);
                        counters.received.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::received(topic, 1);
                        message.link = *self.generation.borrow();
                        out.push(Delivery::Message(Box::new(message)));
                        return out;
                    }
                    Err(reason) => (
                        Undecodable::at(origin.slot, &last, reason, redelivery_count),
                        others,
                    ),
                }
            }
            Added::Orphan(reason, others) => (
                Undecodable::at(origin.slot, &position, reason, redelivery_count),
                others,
            ),
        };
        out.push(self.undecodable_chunks(undecodable, others, counters));
        out
    }

    /// The incomplete chunked messages that expired, as undecodable deliveries.
    fn expired_chunks(&self, slot: usize, counters: &Counters) -> Vec<Delivery> {
        let expired = self.chunks.lock().expire();
        expired
            .into_iter()
            .map(|(first, reason, others)| {
                // Every chunk's permit came back when it arrived.
                let undecodable = Undecodable {
                    permits: 0,
                    ..Undecodable::at(slot, &first, reason, 0)
                };
                self.undecodable_chunks(undecodable, others, counters)
            })
            .collect()
    }

    /// Hands an undecodable chunked message over, remembering its other entries for
    /// `ack_id` and `nack_id`.
    fn undecodable_chunks(
        &self,
        undecodable: Undecodable,
        others: Vec<MessagePosition>,
        counters: &Counters,
    ) -> Delivery {
        counters.undecodable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(topic = %self.topic, id = %undecodable.id, reason = %undecodable.reason, "a chunked message that cannot be decoded: handed to the application, not acknowledged");
        if !others.is_empty() {
            self.chunk_groups
                .lock()
                .insert(position_entry(&undecodable.id), others);
        }
        Delivery::Undecodable(Box::new(undecodable))
    }

    /// Asks for `message` again now: handed over again by the consumer itself when the
    /// broker would resend its whole batch to any consumer (a batch of more than one on a
    /// Shared or Key_Shared subscription), else `REDELIVER_UNACKNOWLEDGED_MESSAGES` naming its
    /// entries.
    pub(crate) fn nack_message(&self, message: &Message, counters: &Counters) -> Result<(), Error> {
        if self.holds_back && message.position().batch_size() > 1 {
            // The broker would send the whole batch again, to any consumer, the messages of
            // it this application still holds included: it is handed over again here.
            self.again.push(message.clone());
            counters.handed_again.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        for chunk in message.chunks.iter() {
            self.nack_at(chunk)?;
        }
        self.nack_at(message.position())
    }

    pub(crate) fn nack_at(&self, position: &MessagePosition) -> Result<(), Error> {
        self.ledger.lock().deliveries.nacked(position.entry());
        self.redeliver(vec![crate::pb::MessageIdData {
            ledger_id: position.ledger_id(),
            entry_id: position.entry_id(),
            partition: (position.partition() >= 0).then_some(position.partition()),
            ..crate::pb::MessageIdData::default()
        }])
    }

    /// Asks the broker to deliver again the chunks of messages dropped by the chunk limits
    /// or out of order.
    fn redeliver_dropped(&self, dropped: Vec<MessagePosition>, counters: &Counters) {
        if dropped.is_empty() {
            return;
        }
        counters
            .chunks_dropped
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        for position in &dropped {
            let _ = self.nack_at(position);
        }
    }

    /// Stops granting permits: the broker sends what it already has permits for, then stops.
    /// Returns whether it was granting them until now.
    pub(crate) fn pause(&self) -> bool {
        !std::mem::replace(&mut self.permits.lock().paused, true)
    }

    /// Grants permits again, at once the ones withheld meanwhile when they reach the refill
    /// threshold (as the Java client's `resume`).
    pub(crate) fn resume(&self, counters: &Counters) {
        let grant = {
            let mut permits = self.permits.lock();
            if !permits.paused {
                return;
            }
            permits.paused = false;
            if permits.owed < self.refill_at {
                return;
            }
            std::mem::take(&mut permits.owed)
        };
        if self.flow(grant).is_ok() {
            counters.flow_frames.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether permits are withheld.
    pub(crate) fn is_paused(&self) -> bool {
        self.permits.lock().paused
    }

    /// Acknowledges again the redelivered messages the application had acknowledged
    /// outside a transaction: the broker did not get those acks (they went out on a
    /// connection that was lost, or were grouped when it was), and would otherwise keep
    /// them unacknowledged for good.
    fn ack_again(&self, positions: &[MessagePosition], counters: &Counters) {
        if positions.is_empty() {
            return;
        }
        let ids: Vec<pb::MessageIdData> = {
            let tracker = self.acks.lock();
            positions
                .iter()
                .filter_map(|position| tracker.acked_again(position))
                .map(|ack| crate::id::wire_id(&ack.id))
                .collect()
        };
        if let Some(count) = self.send_acks(ids, counters) {
            counters.acks_resent.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Acknowledges the messages a seek's start drops (the message sought and what
    /// precedes it in its batch): the application asked for what follows them.
    fn ack_dropped(&self, positions: &[MessagePosition], counters: &Counters) {
        if positions.is_empty() {
            return;
        }
        let ids: Vec<pb::MessageIdData> = {
            let mut tracker = self.acks.lock();
            positions
                .iter()
                .filter_map(|position| tracker.ack(position).ok().flatten())
                .map(|ack| crate::id::wire_id(&ack.id))
                .collect()
        };
        self.send_acks(ids, counters);
    }

    /// Sends one individual `ACK` of `ids` (none: nothing); how many went out.
    fn send_acks(&self, ids: Vec<pb::MessageIdData>, counters: &Counters) -> Option<u64> {
        if ids.is_empty() {
            return None;
        }
        let count = ids.len() as u64;
        let sent = self.send(|consumer_id| {
            command_frame(Type::Ack, |c| {
                c.ack = Some(pb::CommandAck {
                    consumer_id,
                    ack_type: pb::command_ack::AckType::Individual as i32,
                    message_id: ids,
                    ..pb::CommandAck::default()
                });
            })
        });
        sent.ok()?;
        counters.ack_frames.fetch_add(1, Ordering::Relaxed);
        Some(count)
    }

    /// Whether a message of link `generation` was sent before a seek moved the cursor (it
    /// is dropped).
    pub(crate) fn is_stale(&self, generation: u64) -> bool {
        generation < self.seek_floor.load(Ordering::Acquire)
    }

    /// `SEEK`: moves the subscription's cursor. Transactional acks held back go out first
    /// (the seek forgets the deliveries they wait for). From now on, messages of the current
    /// link are dropped: the broker disconnects this consumer before it moves the cursor,
    /// and what comes once it subscribed again follows the new position (the deliveries and
    /// the ack tracker start afresh then). A consumer the broker does not disconnect (a
    /// Failover standby) keeps its link and its messages.
    pub(crate) async fn seek(&self, request: &SeekRequest) -> Result<(), Error> {
        let held = self.ledger.lock().take_all();
        self.send_txn_acks(held).await;
        let (
            ConsumerLink {
                connection,
                consumer_id,
            },
            generation,
        ) = self.link_and_generation();
        let floor = self.seek_floor.swap(generation + 1, Ordering::AcqRel);
        *self.start_after.lock() = request.start_after;
        let answer = connection
            .request("SEEK", |request_id| {
                command_frame(Type::Seek, |c| {
                    c.seek = Some(request.command(consumer_id, request_id));
                })
            })
            .await;
        // CLOSE_CONSUMER comes before the answer, on the same connection.
        if connection.is_registered_consumer(consumer_id) && *self.generation.borrow() == generation
        {
            self.seek_floor.store(floor, Ordering::Release);
        }
        answer.map(drop)
    }

    /// The messages of a frame of the current link, without those a seek's start drops
    /// (acknowledged now).
    fn drop_before_start(&self, messages: &mut Vec<Message>, counters: &Counters) {
        let mut start = self.start_after.lock();
        let Some(after) = *start else {
            return;
        };
        let mut dropped = Vec::new();
        messages.retain(|message| {
            let id = message.id();
            let entry = message.position().entry();
            if after.drops(&entry, id.batch_index) {
                dropped.push(*message.position());
                return false;
            }
            if entry != after.entry || id.batch_index > after.batch_index {
                // Past the start: nothing more to drop.
                *start = None;
            }
            true
        });
        drop(start);
        self.ack_dropped(&dropped, counters);
    }

    /// Where it is subscribed now.
    pub(crate) fn link(&self) -> ConsumerLink {
        self.link.read().clone()
    }

    /// Where it is subscribed now, with the generation of that link.
    pub(crate) fn link_and_generation(&self) -> (ConsumerLink, u64) {
        let link = self.link.read();
        (link.clone(), *self.generation.borrow())
    }

    /// Waits up to the client's operation timeout until the link of `generation` was
    /// replaced (the consumer subscribed again after losing it); the new link, or `None`
    /// when that did not happen in time or the consumer is closing.
    pub(crate) async fn relinked(&self, generation: u64) -> Option<ConsumerLink> {
        let mut changes = self.generation.subscribe();
        let limit = self.resubscribe.pool.operation_timeout();
        let waited = tokio::time::timeout(limit, changes.wait_for(|g| *g > generation)).await;
        if !matches!(waited, Ok(Ok(_))) || self.closing.load(Ordering::Acquire) {
            return None;
        }
        Some(self.link())
    }

    /// Sends `frame`, made for the consumer id it is given, on the current link.
    pub(crate) fn send(&self, frame: impl FnOnce(u64) -> Frame) -> Result<(), Error> {
        let link = self.link.read();
        link.connection.send(frame(link.consumer_id))
    }

    /// Grants the broker `permits` more messages.
    fn flow(&self, permits: u32) -> Result<(), Error> {
        self.send(|consumer_id| {
            command_frame(Type::Flow, |c| {
                c.flow = Some(pb::CommandFlow {
                    consumer_id,
                    message_permits: permits,
                });
            })
        })
    }

    /// Subscribes again after the link was lost or closed by the broker: a fresh consumer
    /// id on the connection the lookup gives, the ledger told the broker's count starts over
    /// (the broker redelivers what is unacknowledged), the permits granted afresh. Returns
    /// the receiver of the new link's frames.
    async fn subscribe_again(
        &self,
        counters: &Counters,
        assigned: Option<&str>,
    ) -> Result<mpsc::UnboundedReceiver<ConsumerEvent>, Error> {
        let again = &self.resubscribe;
        let (connection, consumer_id, events) = subscribe_on(
            &again.pool,
            &self.topic,
            &again.subscription,
            &again.options,
            assigned,
        )
        .await?;
        {
            let mut link = self.link.write();
            link.connection.unregister_consumer(link.consumer_id);
            *link = ConsumerLink {
                connection,
                consumer_id,
            };
            self.generation.send_modify(|generation| *generation += 1);
        }
        if self.seek_floor.load(Ordering::Acquire) == *self.generation.borrow() {
            // The first link since a seek: what the cursor had acknowledged after the new
            // position comes again, as new messages.
            self.ledger.lock().deliveries = Deliveries::default();
            *self.acks.lock() = AckTracker::new(again.options.partial_batches);
            *self.chunks.lock() = Assembler::new(again.options.chunk_limits);
            self.chunk_groups.lock().clear();
        } else {
            let mut ledger = self.ledger.lock();
            // What the application holds now, the broker hands to any consumer.
            self.counters
                .held_at_link_loss
                .fetch_add(ledger.deliveries.held() as u64, Ordering::Relaxed);
            ledger.deliveries.count_reset();
        }
        let grant = {
            let mut permits = self.permits.lock();
            permits.lent = 0;
            if permits.paused {
                permits.owed = self.queue_size;
                None
            } else {
                permits.owed = 0;
                Some(self.queue_size)
            }
        };
        if let Some(grant) = grant
            && self.flow(grant).is_ok()
        {
            counters.flow_frames.fetch_add(1, Ordering::Relaxed);
        }
        counters.reconnects.fetch_add(1, Ordering::Relaxed);
        crate::metrics::reconnected(crate::metrics::Role::Consumer);
        Ok(events)
    }

    /// Counts messages taken off the queue; refills the permits once half the queue is used,
    /// unless paused.
    pub(crate) fn consumed(&self, messages: u32, counters: &Counters) {
        let grant = {
            let mut permits = self.permits.lock();
            permits.take(messages);
            if permits.paused || permits.owed < self.refill_at {
                return;
            }
            std::mem::take(&mut permits.owed)
        };
        if self.flow(grant).is_ok() {
            counters.flow_frames.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `REDELIVER_UNACKNOWLEDGED_MESSAGES` for these ids, or for everything unacknowledged
    /// when `ids` is empty.
    pub(crate) fn redeliver(&self, ids: Vec<pb::MessageIdData>) -> Result<(), Error> {
        self.send(|consumer_id| {
            command_frame(Type::RedeliverUnacknowledgedMessages, |c| {
                c.redeliver_unacknowledged_messages =
                    Some(pb::CommandRedeliverUnacknowledgedMessages {
                        consumer_id,
                        message_ids: ids,
                        consumer_epoch: None,
                    });
            })
        })?;
        self.counters
            .redelivery_requests
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `message` may be held by another consumer of the subscription now: this
    /// consumer subscribed again since it was delivered (the broker hands what the old
    /// registration held to any consumer) and no copy of it came back here.
    pub(crate) fn held_elsewhere(&self, ledger: &Ledger, message: &Message) -> bool {
        message.link != *self.generation.borrow()
            && !ledger.deliveries.held_and_counted(message.position())
    }

    /// The time since the pump started, for the trackers that remember acknowledged entries.
    fn set_clock(&self, now: std::time::Duration) {
        self.acks.lock().set_clock(now);
        let mut ledger = self.ledger.lock();
        ledger.txn_acks.set_clock(now);
        ledger.deliveries.set_clock(now);
    }

    /// Asks the broker to unblock this consumer without replaying anything, when its count
    /// drifted above what the application holds ([`Unblocks`]): a `FLOW` with the permits
    /// owed (at least one), then `REDELIVER_UNACKNOWLEDGED_MESSAGES` naming an entry no
    /// consumer holds. Whether it was sent.
    fn unblock(&self, counters: &Counters) -> bool {
        if self.legacy || self.ledger.lock().deliveries.drift() <= 0 {
            return false;
        }
        // Permits sent while blocked wait on the broker for the unblock, which then reads
        // with them; without any, it reads nothing. A paused consumer withholds them on
        // purpose, and is not unblocked.
        let grant = {
            let mut permits = self.permits.lock();
            if permits.paused {
                return false;
            }
            match std::mem::take(&mut permits.owed) {
                0 => {
                    permits.lent = permits.lent.saturating_add(1);
                    1
                }
                owed => owed,
            }
        };
        if self.flow(grant).is_ok() {
            counters.flow_frames.fetch_add(1, Ordering::Relaxed);
        }
        let nobody = pb::MessageIdData {
            ledger_id: u64::MAX,
            entry_id: u64::MAX,
            ..pb::MessageIdData::default()
        };
        if self.redeliver(vec![nobody]).is_err() {
            return false;
        }
        counters.unblocks.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(topic = %self.topic, "asked the broker to unblock a consumer whose count drifted");
        true
    }

    /// Sends transactional acks once no abort is under way on this partition, and waits for
    /// the answers: the result of each, in order. Each is counted in flight in its
    /// transaction meanwhile (its commit waits for it). A refused ack fails its transaction
    /// and is kept, so that an abort hands its message over again.
    ///
    /// An ack whose own transaction begins to abort while it waits is not sent: it is held
    /// back again, for the abort to hand its message over, and stops counting in flight (the
    /// abort waits for its transaction's acks in flight, this ack for the abort: each waiting
    /// for the other hung both, and every transactional ack of the partition after them).
    pub(crate) async fn send_txn_acks(&self, acks: Vec<Outgoing>) -> Vec<Result<(), Error>> {
        if acks.is_empty() {
            return Vec::new();
        }
        let mut results: Vec<Option<Result<(), Error>>> = Vec::with_capacity(acks.len());
        // Each ack going out, with its place in `results`.
        let mut sending: Vec<(usize, Outgoing)> = Vec::with_capacity(acks.len());
        {
            let mut ledger = self.ledger.lock();
            for (place, mut outgoing) in acks.into_iter().enumerate() {
                let held = &mut outgoing.held;
                if outgoing.op.is_none() {
                    // Its transaction was dropped without an end: the coordinator aborts it.
                    results.push(Some(Err(Error::Invalid {
                        what: "transactional ack",
                        reason: format!(
                            "transaction {} was dropped before the ack of message {} went                              out: the coordinator aborts it, and the message is handed over                              again",
                            held.txn.id(),
                            held.message.id()
                        ),
                    })));
                    if held.hand_over {
                        self.counters.handed_again.fetch_add(1, Ordering::Relaxed);
                        self.again.push(held.message.clone());
                    }
                } else if self.holds_back && self.held_elsewhere(&ledger, &held.message) {
                    // A message the broker may have handed to another consumer since it
                    // arrived: its ack could commit it a second time. Not sent; its
                    // transaction fails.
                    let error = handed_elsewhere(&held.message);
                    held.txn
                        .failed(format!("the ack of message {}: {error}", held.message.id()));
                    held.hand_over = false;
                    ledger.refused(outgoing.held);
                    results.push(Some(Err(error)));
                } else {
                    results.push(None);
                    sending.push((place, outgoing));
                }
            }
        }
        loop {
            let changed = self.ledger_changed.notified();
            {
                let mut ledger = self.ledger.lock();
                if !ledger.is_aborting() {
                    ledger.txn_in_flight += sending.len();
                    break;
                }
                let (aborting, waiting): (Vec<_>, Vec<_>) = sending
                    .into_iter()
                    .partition(|(_, outgoing)| ledger.is_aborting_txn(outgoing.held.txn.id()));
                let mut unfree = HashSet::new();
                for (place, outgoing) in aborting {
                    results[place] = Some(Err(aborting_txn_ack(&outgoing.held)));
                    unfree.insert(outgoing.held.position().entry());
                    ledger.hold_back(outgoing.held);
                }
                // Their messages come back to the application: their entries are no longer
                // free, and the acks of open transactions for them wait again.
                let (again, waiting): (Vec<_>, Vec<_>) =
                    waiting.into_iter().partition(|(_, outgoing)| {
                        outgoing.held.txn.is_open()
                            && unfree.contains(&outgoing.held.position().entry())
                    });
                for (place, outgoing) in again {
                    results[place] = Some(Ok(()));
                    self.counters.acks_held_back.fetch_add(1, Ordering::Relaxed);
                    ledger.hold_back(outgoing.held);
                }
                sending = waiting;
            }
            if sending.is_empty() {
                return results.into_iter().flatten().collect();
            }
            changed.await;
        }
        let answers = futures_util::future::join_all(
            sending
                .iter()
                .map(|(_, outgoing)| self.send_txn_ack(&outgoing.held)),
        )
        .await;
        {
            let mut ledger = self.ledger.lock();
            ledger.txn_in_flight -= sending.len();
            for ((place, outgoing), answer) in sending.into_iter().zip(answers) {
                let held = outgoing.held;
                results[place] = Some(match answer {
                    Ok(_) => {
                        self.counters.txn_acks.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Err(error) => {
                        let error = refused_txn_ack(error, held.message.id(), held.txn.id());
                        held.txn
                            .failed(format!("the ack of message {}: {error}", held.message.id()));
                        if error.server_error().is_some() {
                            // The broker took nothing into the transaction: the message is
                            // held again, and handed over again when the transaction aborts
                            // (now, if it ended already).
                            ledger.deliveries.ack_refused(held.position());
                            if held.txn.has_ended() {
                                if held.hand_over {
                                    self.counters.handed_again.fetch_add(1, Ordering::Relaxed);
                                    self.again.push(held.message);
                                }
                            } else {
                                ledger.refused(held);
                            }
                        }
                        Err(error)
                    }
                });
            }
        }
        self.ledger_changed.notify_waiters();
        results.into_iter().flatten().collect()
    }

    /// Sends one transactional ack and waits for the broker's answer. While the consumer is
    /// subscribing again (its connection was lost, or the broker closed it: an unload, a
    /// restart), the ack waits for the new link, up to the operation timeout, instead of
    /// going out on the old one: there it would be lost with the connection, or refused
    /// with `ConsumerNotFound`, and either would leave the transaction unable to commit.
    /// A `ConsumerNotFound` answer (the broker took nothing) is sent again on the new link.
    ///
    /// The ledger records the ack as it goes on the wire, on the registration it goes to (a
    /// registration made after the message arrived does not count it until its copy comes).
    async fn send_txn_ack(&self, held: &HeldBackAck) -> Result<pb::BaseCommand, Error> {
        let ack = &held.ack;
        let mut refused = 0;
        loop {
            let (link, generation) = self.link_and_generation();
            if link.connection.is_closed()
                && let Some(_relinked) = self.relinked(generation).await
            {
                continue;
            }
            self.ledger
                .lock()
                .deliveries
                .acked(held.position(), Some(held.txn.id()));
            let ConsumerLink {
                connection,
                consumer_id,
            } = link;
            let answer = connection
                .request("ACK", |request_id| {
                    super::txn_frame::txn_ack_frame(consumer_id, ack, request_id)
                })
                .await;
            let not_found = matches!(&answer, Err(error)
                if error.server_error() == Some(crate::ServerError::ConsumerNotFound));
            if not_found && refused < 3 && self.relinked(generation).await.is_some() {
                refused += 1;
                continue;
            }
            return answer;
        }
    }

    /// An ordinary ack of `position` was queued. It may have been the last message of its
    /// batch that the application held: the transactional acks held back for the batch go out.
    pub(crate) fn acked_plainly(self: &Arc<Self>, position: &MessagePosition) {
        let taken = {
            let mut ledger = self.ledger.lock();
            ledger.deliveries.acked(position, None);
            ledger.take_if_free(&position.entry())
        };
        self.send_released(taken);
    }

    /// Sends the acks held back for `entry` if no message of it is held otherwise any more
    /// (an ack of its last such message just went out), in the background.
    pub(crate) fn release_entry(self: &Arc<Self>, entry: &EntryId) {
        let taken = self.ledger.lock().take_if_free(entry);
        self.send_released(taken);
    }

    /// Sends acks taken from those held back in the background (those of a transaction
    /// dropped meanwhile are handed over again).
    fn send_released(self: &Arc<Self>, taken: Vec<Outgoing>) {
        if taken.is_empty() {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            this.send_txn_acks(taken).await;
        });
    }

    /// Gives back the messages of the acks of `txn` held back or refused (its abort, or its
    /// end without one): they are handed to the application again.
    fn give_back(&self, ledger: &mut Ledger, txn: TxnId) {
        let mut back = ledger.take_txn(txn);
        back.extend(ledger.take_refused(txn));
        for held in back.into_iter().filter(|held| held.hand_over) {
            self.counters.handed_again.fetch_add(1, Ordering::Relaxed);
            self.again.push(held.message);
        }
    }

    /// `GET_LAST_MESSAGE_ID`: where the partition ends now, and whether anything after the
    /// subscription's mark-delete position is left to read.
    pub(crate) async fn end_position(&self) -> Result<EndPosition, Error> {
        let ConsumerLink {
            connection,
            consumer_id,
        } = self.link();
        let answer = connection
            .request("GET_LAST_MESSAGE_ID", |request_id| {
                command_frame(Type::GetLastMessageId, |c| {
                    c.get_last_message_id = Some(pb::CommandGetLastMessageId {
                        consumer_id,
                        request_id,
                    });
                })
            })
            .await?;
        let Some(response) = answer.get_last_message_id_response else {
            return Err(Error::MalformedFrame {
                reason: "GET_LAST_MESSAGE_ID was answered without a response body".into(),
            });
        };
        let position = |id: &pb::MessageIdData| {
            // An empty ledger or topic reports entry -1 (and sometimes ledger -1).
            (id.entry_id != u64::MAX && id.ledger_id != u64::MAX)
                .then_some((id.ledger_id, id.entry_id))
        };
        let last = position(&response.last_message_id);
        let last_id = last.map(|(ledger_id, entry_id)| crate::MessageId {
            ledger_id,
            entry_id,
            partition: self.partition,
            batch_index: response.last_message_id.batch_index.unwrap_or(-1),
            batch_size: None,
        });
        let mark_delete = response
            .consumer_mark_delete_position
            .as_ref()
            .and_then(position);
        Ok(EndPosition {
            last,
            last_id,
            readable: match (last, mark_delete) {
                (None, _) => false,
                (Some(last), Some(mark)) => last > mark,
                (Some(_), None) => true,
            },
        })
    }

    /// Sends the transactional acks it holds back (their transactions' commits would find no
    /// consumer to send them on), then `CLOSE_CONSUMER`.
    pub(crate) async fn close(&self) -> Result<(), Error> {
        let taken = self.ledger.lock().take_all();
        self.send_txn_acks(taken).await;
        self.closing.store(true, Ordering::Release);
        let ConsumerLink {
            connection,
            consumer_id,
        } = self.link();
        let result = connection
            .request("CLOSE_CONSUMER", |request_id| {
                command_frame(Type::CloseConsumer, |c| {
                    c.close_consumer = Some(pb::CommandCloseConsumer {
                        consumer_id,
                        request_id,
                        ..Default::default()
                    });
                })
            })
            .await;
        connection.unregister_consumer(consumer_id);
        match result {
            // The broker forgets a connection's consumers when it ends: nothing to close.
            Ok(_) | Err(Error::ConnectionLost { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Stops routing frames to it (the consumer is dropped).
    pub(crate) fn unregister(&self) {
        self.closing.store(true, Ordering::Release);
        let link = self.link.read();
        link.connection.unregister_consumer(link.consumer_id);
    }
}

/// Where a partition ends, from `GET_LAST_MESSAGE_ID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndPosition {
    /// The last entry's (ledger, entry), `None` for an empty partition.
    pub(crate) last: Option<(u64, u64)>,
    /// The last message's id (its batch index when the entry is a batch), `None` for an
    /// empty partition.
    pub(crate) last_id: Option<crate::MessageId>,
    /// Whether entries after the subscription's mark-delete position exist (a backlog, or
    /// messages delivered and not yet acknowledged).
    pub(crate) readable: bool,
}

/// Subscribes `consumer` again until it is subscribed (the receiver of its new frames), it
/// closes, nothing receives any more, or the broker refuses for good (the application is
/// then told, and `None`).
///
/// A link that ended soon after it was made counts as a failed attempt
/// ([`Retries`]), so a broker that closes the consumer right after each subscription is not
/// asked again in a tight loop. The link state says each attempt, starting with `cause`, the
/// reason the link ended.
async fn resubscribe(
    consumer: &PartitionConsumer,
    counters: &Counters,
    deliveries: &mpsc::Sender<Delivery>,
    retries: &mut Retries,
    cause: Error,
    mut assigned: Option<String>,
) -> Option<mpsc::UnboundedReceiver<ConsumerEvent>> {
    if consumer.closing.load(Ordering::Acquire) {
        return None;
    }
    let mut attempt = 1u32;
    consumer
        .state
        .set(&consumer.topic, LinkState::Reconnecting { attempt, cause });
    tokio::time::sleep(retries.after_loss()).await;
    loop {
        if consumer.closing.load(Ordering::Acquire) || deliveries.is_closed() {
            return None;
        }
        // The broker a close named is tried first, once; then the topic is looked up.
        match consumer
            .subscribe_again(counters, assigned.take().as_deref())
            .await
        {
            Ok(events) => {
                tracing::debug!(topic = %consumer.topic, "consumer subscribed again");
                consumer.state.set(&consumer.topic, LinkState::Connected);
                retries.linked();
                return Some(events);
            }
            Err(error) if error.may_link_again(ServerError::ConsumerBusy) => {
                let delay = retries.next_delay();
                tracing::debug!(topic = %consumer.topic, %error, ?delay, "subscribing again failed for now");
                attempt = attempt.saturating_add(1);
                consumer.state.set(
                    &consumer.topic,
                    LinkState::Reconnecting {
                        attempt,
                        cause: error,
                    },
                );
                tokio::time::sleep(delay).await;
            }
            Err(error) => {
                consumer.state.set(
                    &consumer.topic,
                    LinkState::Failed {
                        cause: error.clone(),
                    },
                );
                let _ = deliveries.send(Delivery::Lost(error)).await;
                return None;
            }
        }
    }
}

/// Looks `topic` up, registers for its frames and subscribes (`SUBSCRIBE`); returns the
/// connection, the consumer id on it and the receiver of its frames.
async fn subscribe_on(
    pool: &Pool,
    topic: &str,
    subscription: &str,
    options: &ConsumerOptions,
    assigned: Option<&str>,
) -> Result<(Connection, u64, mpsc::UnboundedReceiver<ConsumerEvent>), Error> {
    let connection = pool.connection_for(topic, assigned).await?;
    let consumer_id = connection.next_id();
    let events = connection.register_consumer(consumer_id);
    let subscribed = connection
        .request("SUBSCRIBE", |request_id| {
            command_frame(Type::Subscribe, |c| {
                c.subscribe = Some(pb::CommandSubscribe {
                    topic: topic.to_owned(),
                    subscription: subscription.to_owned(),
                    sub_type: options.sub_type.wire() as i32,
                    consumer_id,
                    request_id,
                    consumer_name: options.name.clone(),
                    durable: Some(options.reader_start.is_none()),
                    start_message_id: options.reader_start.clone().flatten(),
                    initial_position: Some(options.initial_position.wire() as i32),
                    key_shared_meta: options.key_shared_meta(),
                    schema: options.schema.as_ref().map(crate::schema::Schema::wire),
                    ..pb::CommandSubscribe::default()
                });
            })
        })
        .await
        .map_err(|error| error.schema_refused(topic));
    if let Err(error) = subscribed {
        connection.unregister_consumer(consumer_id);
        return Err(error);
    }
    Ok((connection, consumer_id, events))
}

fn position_entry(id: &crate::MessageId) -> EntryId {
    EntryId {
        ledger_id: id.ledger_id,
        entry_id: id.entry_id,
    }
}

/// Turns one partition's frames into deliveries until the consumer or its connection ends.
pub(crate) async fn pump(
    consumer: Arc<PartitionConsumer>,
    origin: Origin,
    mut events: mpsc::UnboundedReceiver<ConsumerEvent>,
    deliveries: mpsc::Sender<Delivery>,
    counters: Arc<Counters>,
) {
    let topic: Arc<str> = consumer.topic.as_str().into();
    let mut unblocks = Unblocks::new();
    let started = tokio::time::Instant::now();
    let mut clock_set = started;
    let mut retries = Retries::new();
    loop {
        // The trackers remember acknowledged entries for a while (txn_ack::Recall): their
        // clock moves once a second.
        if clock_set.elapsed() >= std::time::Duration::from_secs(1) {
            clock_set = tokio::time::Instant::now();
            consumer.set_clock(clock_set - started);
        }
        let event = match tokio::time::timeout(QUIET, events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => {
                // Unregistered: the consumer was closed or dropped, or its connection ended
                // (which sends `ConnectionLost` first).
                if consumer.closing.load(Ordering::Acquire) {
                    return;
                }
                let cause = consumer.link().connection.lost_error();
                match resubscribe(&consumer, &counters, &deliveries, &mut retries, cause, None)
                    .await
                {
                    Some(more) => {
                        events = more;
                        continue;
                    }
                    None => return,
                }
            }
            Err(_) => {
                for delivery in consumer.expired_chunks(origin.slot, &counters) {
                    if deliveries.send(delivery).await.is_err() {
                        return;
                    }
                }
                unblocks.quiet(&consumer, &counters);
                continue;
            }
        };
        let frame = match event {
            ConsumerEvent::Message(_) if consumer.is_stale(*consumer.generation.borrow()) => {
                // Sent before a seek moved the cursor; the link is about to be closed.
                continue;
            }
            ConsumerEvent::Message(frame) => *frame,
            ConsumerEvent::ReachedEndOfTopic => {
                counters.reached_end_of_topic.store(true, Ordering::Relaxed);
                continue;
            }
            ConsumerEvent::Closed | ConsumerEvent::Moved(_) | ConsumerEvent::ConnectionLost(_)
                if consumer.closing.load(Ordering::Acquire) =>
            {
                return;
            }
            ConsumerEvent::Closed | ConsumerEvent::Moved(_) | ConsumerEvent::ConnectionLost(_) => {
                let (cause, assigned) = match event {
                    ConsumerEvent::ConnectionLost(error) => (error, None),
                    ConsumerEvent::Moved(address) => {
                        counters.closed_by_broker.store(true, Ordering::Relaxed);
                        counters.moved.fetch_add(1, Ordering::Relaxed);
                        let cause = Error::Closed(
                            "the consumer's subscription (CLOSE_CONSUMER naming its new broker)",
                        );
                        (cause, Some(address))
                    }
                    _ => {
                        counters.closed_by_broker.store(true, Ordering::Relaxed);
                        let cause = Error::Closed(
                            "the consumer's subscription (CLOSE_CONSUMER from the broker)",
                        );
                        (cause, None)
                    }
                };
                tracing::debug!(topic = %consumer.topic, %cause, "consumer disconnected: subscribing again");
                let resubscribed = resubscribe(
                    &consumer,
                    &counters,
                    &deliveries,
                    &mut retries,
                    cause,
                    assigned,
                );
                match resubscribed.await {
                    Some(more) => {
                        events = more;
                        continue;
                    }
                    None => return,
                }
            }
        };
        let decoded = decode(
            frame,
            consumer.partition,
            origin,
            &topic,
            consumer.max_uncompressed,
        );
        if let Some(chunk) = decoded.chunk {
            let out = consumer.take_chunk(chunk, origin, &topic, &counters);
            if !out.is_empty() {
                unblocks.delivered();
            }
            for delivery in out {
                if deliveries.send(delivery).await.is_err() {
                    return;
                }
            }
            continue;
        }
        if let Some((error, reason)) = decoded.invalid {
            if error == ValidationError::ChecksumMismatch {
                counters.checksum_mismatches.fetch_add(1, Ordering::Relaxed);
            }
            counters.undecodable.fetch_add(1, Ordering::Relaxed);
            let Some((entry, partition)) = decoded.entry else {
                // A frame that names no entry: nothing to hand over or acknowledge.
                tracing::warn!(topic = %consumer.topic, %reason, "a MESSAGE frame without an entry");
                consumer.consumed(decoded.permits, &counters);
                continue;
            };
            tracing::warn!(
                topic = %consumer.topic,
                %reason,
                ?error,
                "an entry that cannot be decoded: handed to the application, not acknowledged"
            );
            // The broker counts it unacknowledged like any delivery; the ledger follows it as
            // one whole-entry message.
            let position = MessagePosition::single(entry.ledger_id, entry.entry_id, partition);
            let verdict = consumer.ledger.lock().deliveries.delivered(&position);
            if verdict.is_duplicate() {
                counters.duplicates.fetch_add(1, Ordering::Relaxed);
                if !consumer.legacy {
                    consumer.consumed(decoded.permits, &counters);
                    continue;
                }
            }
            unblocks.delivered();
            let undecodable = Undecodable {
                slot: origin.slot,
                id: crate::MessageId {
                    ledger_id: entry.ledger_id,
                    entry_id: entry.entry_id,
                    partition,
                    batch_index: -1,
                    batch_size: None,
                },
                reason,
                redelivery_count: decoded.redelivery_count,
                permits: decoded.permits,
                raw: decoded.raw,
            };
            if deliveries
                .send(Delivery::Undecodable(Box::new(undecodable)))
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        if !decoded.skipped.is_empty() {
            // The tracker learns what the broker already has, so the entry completes when
            // the messages delivered now are acknowledged.
            let mut acks = consumer.acks.lock();
            for position in &decoded.skipped {
                let _ = acks.ack(position);
            }
            drop(acks);
            let mut ledger = consumer.ledger.lock();
            for position in &decoded.skipped {
                ledger.deliveries.skipped(position);
            }
            drop(ledger);
            counters
                .skipped
                .fetch_add(decoded.skipped.len() as u64, Ordering::Relaxed);
        }
        let mut messages = decoded.messages;
        consumer.drop_before_start(&mut messages, &counters);
        let link = *consumer.generation.borrow();
        for message in &mut messages {
            message.link = link;
        }
        let mut acked = Vec::new();
        let mut back = Vec::new();
        {
            let mut ledger = consumer.ledger.lock();
            messages.retain(|message| {
                let v = ledger.deliveries.delivered(message.position());
                let Verdict::Duplicate(of) = v else {
                    return true;
                };
                counters.duplicates.fetch_add(1, Ordering::Relaxed);
                if matches!(of, DuplicateOf::Acknowledged) {
                    acked.push(*message.position());
                }
                if of == DuplicateOf::Held && !back.contains(&message.position().entry()) {
                    // Back with this consumer (after it subscribed again): acks held back for
                    // it may go out.
                    back.push(message.position().entry());
                }
                if let DuplicateOf::PendingIn(txn) = of
                    && !consumer.legacy
                {
                    // Its transaction's abort may have sent it before the consumer heard of
                    // the abort: kept until the transaction ends.
                    ledger.keep_copy(txn, message.clone());
                }
                if matches!(of, DuplicateOf::CommittedIn(_)) {
                    counters
                        .committed_redeliveries
                        .fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(
                    topic = %consumer.topic,
                    id = %message.id(),
                    ?of,
                    "a duplicate delivery: not delivered again"
                );
                consumer.legacy
            });
        }
        if !consumer.legacy {
            consumer.ack_again(&acked, &counters);
            for entry in &back {
                consumer.release_entry(entry);
            }
        }
        let delivered = messages.len() as u32;
        if delivered > 0 {
            unblocks.delivered();
        }
        counters
            .received
            .fetch_add(u64::from(delivered), Ordering::Relaxed);
        if delivered > 0 {
            crate::metrics::received(&consumer.topic, delivered as usize);
        }
        for message in messages {
            if deliveries
                .send(Delivery::Message(Box::new(message)))
                .await
                .is_err()
            {
                return;
            }
        }
        // Permits of the messages not delivered come back now; the rest on receive.
        consumer.consumed(decoded.permits.saturating_sub(delivered), &counters);
    }
}

impl Participant for PartitionConsumer {
    fn before_commit<'a>(&'a self, txn: &'a TxnRef) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let acks = self.ledger.lock().take_txn(txn.id());
            self.send_txn_acks(acks.into_iter().map(Outgoing::new).collect())
                .await;
        })
    }

    fn before_abort<'a>(&'a self, txn: &'a TxnRef) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.ledger.lock().abort_started(txn.id());
            // Acks of this transaction waiting for another abort to end give up waiting.
            self.ledger_changed.notify_waiters();
            loop {
                let changed = self.ledger_changed.notified();
                if self.ledger.lock().txn_in_flight == 0 {
                    return;
                }
                changed.await;
            }
        })
    }

    fn ended(&self, txn: TxnId, outcome: Outcome) {
        {
            let mut ledger = self.ledger.lock();
            match outcome {
                Outcome::Committed => {
                    // Whatever it still held back went out before END_TXN.
                    ledger.take_refused(txn);
                    ledger.ended(txn, true);
                }
                Outcome::Aborted | Outcome::Abandoned => {
                    ledger.abort_ended(txn);
                    self.give_back(&mut ledger, txn);
                    for copy in ledger.ended(txn, false) {
                        self.again.push_copy(copy);
                    }
                }
                Outcome::AbortFailed => ledger.abort_ended(txn),
            }
        }
        self.ledger_changed.notify_waiters();
    }
}

/// The error of a transactional ack of a message the broker may have handed to another
/// consumer ([`PartitionConsumer::held_elsewhere`]).
pub(crate) fn handed_elsewhere(message: &Message) -> Error {
    Error::Invalid {
        what: "transactional ack",
        reason: format!(
            "message {} may have been handed to another consumer of the subscription: this \
             consumer's link was lost or closed since it arrived, and the broker gives what a \
             lost consumer held to any consumer; acknowledged in a transaction it could be \
             committed twice. Abort the transaction and leave the message (the broker delivers \
             it again), or acknowledge it outside a transaction",
            message.id()
        ),
    }
}

/// The error of a transactional ack not sent because its transaction began to abort while the
/// ack waited for another abort on its partition to end.
fn aborting_txn_ack(held: &HeldBackAck) -> Error {
    Error::Invalid {
        what: "transactional ack",
        reason: format!(
            "transaction {} began to abort before the ack of message {} could go out (it \
             waited for another abort on the partition to end): the ack was not sent, and the \
             message is handed over again once the abort ends",
            held.txn.id(),
            held.message.id()
        ),
    }
}

/// The broker's refusal of a transactional ack, with the message and the transaction named and
/// what to do.
pub(crate) fn refused_txn_ack(error: Error, id: crate::MessageId, txn: TxnId) -> Error {
    match error {
        Error::Server {
            operation,
            code,
            message: reason,
        } => Error::Server {
            operation,
            code,
            message: format!(
                "{reason} (message {id} in transaction {txn}; the broker took nothing of this \
                 ack into the transaction, which can now only be aborted: abort it, and the \
                 message is handed over again)"
            ),
        },
        Error::ConnectionLost { addr, reason } => Error::ConnectionLost {
            addr,
            reason: format!(
                "{reason} (message {id} in transaction {txn}: the broker may or may not have \
                 taken this ack into the transaction, which now refuses to commit: abort it, \
                 and the message comes again)"
            ),
        },
        other => other,
    }
}

impl SubType {
    fn wire(self) -> command_subscribe::SubType {
        match self {
            Self::Exclusive => command_subscribe::SubType::Exclusive,
            Self::Shared => command_subscribe::SubType::Shared,
            Self::Failover => command_subscribe::SubType::Failover,
            Self::KeyShared => command_subscribe::SubType::KeyShared,
        }
    }
}

impl InitialPosition {
    fn wire(self) -> command_subscribe::InitialPosition {
        match self {
            Self::Latest => command_subscribe::InitialPosition::Latest,
            Self::Earliest => command_subscribe::InitialPosition::Earliest,
        }
    }
}
