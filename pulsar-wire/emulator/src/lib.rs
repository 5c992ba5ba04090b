//! An embedded Pulsar broker for examples and tests.
//!
//! [`Emulator::start`] listens on 127.0.0.1 and speaks the Pulsar binary protocol through
//! [`PulsarCodec`](pulsar_wire::wire::PulsarCodec): CONNECT (with optional token authentication), PING and
//! PONG both ways, PARTITIONED_METADATA and LOOKUP, producers and sends (transactional ones
//! included), subscriptions with FLOW permits, acks and redelivery, and a transaction
//! coordinator. The unacked accounting of every consumer — the count, blocking at
//! `maxUnackedMessagesOnConsumer` and unblocking at half of it, and the transactional
//! pending-ack conflict rules — is `txn_ack::model::SubscriptionModel` (one per
//! subscription: its cursor and pending-ack state, each consumer's count and `pendingAcks`),
//! fed with what the client actually put on the wire. So a client that drops `batch_size`
//! from transactional acks stalls here the way it stalls a 4.0.x broker, and a correct one
//! drains; and a client whose requests make the broker replay messages its application
//! holds sees them handed to its other consumers, as on the broker. [`legacy`] sends what
//! other clients send and `pulsar-wire` never does (the Go client's transactional ack without
//! `batch_size`), to show what it does here or on a real broker.
//!
//! ```no_run
//! # async fn run() -> Result<(), pulsar_wire::Error> {
//! use pulsar_wire_emulator::{Emulator, EmulatorConfig, Faults};
//!
//! let emulator = Emulator::start(EmulatorConfig::default()).await?;
//! emulator.create_topic("orders", 3)?;
//! emulator.set_max_unacked_messages("orders", 20)?;
//! println!("connect to {}", emulator.endpoint()); // pulsar://127.0.0.1:PORT
//! // ... run a client ...
//! let stats = emulator.stats();
//! assert!(stats.consumers().all(|c| c.unacked == 0 && !c.blocked));
//! emulator.set_faults(Faults::none().corrupt_rate(0.01));
//! emulator.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # What is modelled
//! - **Topics**: non-partitioned and partitioned (`name-partition-N`), created with
//!   [`Emulator::create_topic`] (partitions raised with [`Emulator::update_partitions`]) or on PRODUCER / SUBSCRIBE when auto-creation is on (auto-
//!   created topics are non-partitioned; PARTITIONED_METADATA of an unknown topic answers
//!   [`EmulatorConfig::auto_created_partitions`] and creates a partitioned topic when that is
//!   not 0). Each topic (or partition) has one ledger; an entry is one SEND: a single message
//!   or a whole batch with its `num_messages_in_batch`, kept with its metadata and payload.
//! - **Sends**: the frame's CRC32C is checked (`SEND_ERROR ChecksumError`); the receipt
//!   carries (ledger, entry, partition). A transactional send gets its position at once but
//!   is not readable until its transaction commits, and holds back every later entry of the
//!   topic meanwhile (the transaction buffer's max read position); an abort drops it.
//! - **Subscriptions**: Exclusive (a second consumer gets `ConsumerBusy`), Failover (the
//!   first connected consumer is active; ACTIVE_CONSUMER_CHANGE is sent), Shared
//!   (below), and Key_Shared (below). Initial
//!   position Latest or Earliest; a non-durable subscription (a reader) starts at its
//!   `start_message_id` instead when it has one (earliest, latest, or an entry of the ledger);
//!   non-durable subscriptions vanish with their last consumer.
//! - **Shared**, as the 4.0.8 `PersistentDispatcherMultipleConsumers`: a read takes the
//!   replay set first (entries to send again), else new entries, as many as the consumers
//!   have permits (at most 100); they are handed out in order, each consumer picked round
//!   robin among those with permits that are not blocked taking up to
//!   `getMaxEntriesInThisBatch` entries (its permits and the room below its limit in entries
//!   of the read's average size, at most 20, at least 1) in one `sendMessages` call, whose
//!   entries are all counted before the consumer is blocked. **A replay goes to whichever
//!   consumer is next, not back to the consumer that held the entry**: after a redelivery
//!   request, an abort or a consumer gone, another consumer gets the entries; after an
//!   abort the consumer that held the entry keeps it in its `pendingAcks` and its count, so
//!   two consumers hold it. Entries wholly acknowledged leave every consumer's
//!   `pendingAcks` at the next read, without a change to the counts (4.0.8's
//!   `removeAllUpTo` of the mark-delete position).
//! - **Key_Shared**: each entry goes to the consumer of its sticky key's hash (the entry's
//!   `ordering_key`, else its `partition_key`, else `NONE_KEY`, hashed with
//!   [`pulsar_wire::sticky_key_hash`], as the broker does). STICKY consumers serve the hash ranges
//!   of their `KeySharedMeta`; AUTO_SPLIT (also without a `KeySharedMeta`) cuts the hash
//!   space `0..65536` into as many equal contiguous ranges as there are connected consumers,
//!   in subscription order (the broker's consistent hashing places hashes elsewhere; only
//!   stickiness is modelled). An entry its consumer cannot take now (no permits, blocked, or a
//!   hash no STICKY consumer covers) waits, with every later entry of that hash, while other
//!   hashes go on (at most 10,000 entries wait; [`SubscriptionStats::waiting_for_key_consumer`]
//!   counts them); waiting and redelivered entries go first, in entry order, so a key's
//!   entries reach its consumer in order. As on the broker, the first consumer fixes the mode
//!   and `allowOutOfOrderDelivery` (a consumer that differs gets `ConsumerBusy`, "Subscription
//!   is of different type"), a STICKY consumer needs ranges with `start <= end` that overlap
//!   no other consumer's (`ConsumerAssignError`).
//! - **Dispatch**: MESSAGE frames carry the entry's metadata and payload with a valid CRC32C,
//!   the redelivery count, and `ack_set` when indexes of a redelivered entry are already
//!   acknowledged or pending in a transaction. An entry goes out while the consumer has
//!   permits (a batch may take them below zero) and its model does not block it. The limit is
//!   the topic's `maxUnackedMessagesOnConsumer` ([`Emulator::set_max_unacked_messages`]) or
//!   [`EmulatorConfig::max_unacked_messages_per_consumer`], for durable Shared and Key_Shared
//!   subscriptions; 0 (unlimited) otherwise, as on the broker.
//! - **Acks**: each `MessageIdData` goes to the model as a `WireAck` (ack set words,
//!   `batch_size` presence, transaction bits presence) with the consumer that sent it; the
//!   count that changes is the owner's (`getAckOwnerConsumerAndBatchSize`: the sender if
//!   the entry is in its `pendingAcks`, else the first consumer whose `pendingAcks` holds
//!   it, else the sender). Cumulative acks are ignored on Shared (as the broker does); on
//!   Exclusive and Failover they become one individual ack per entry they cover.
//!   ACK_RESPONSE answers every ack with a `request_id`, with `TransactionConflict` (23)
//!   when the model reports a conflict, `InvalidTxnStatus` / `TransactionNotFound` for a
//!   transaction that is not open.
//! - **Redelivery**: REDELIVER_UNACKNOWLEDGED_MESSAGES without ids resets the consumer's
//!   count, empties its `pendingAcks` and replays them; with ids, only those of the ids in
//!   the sender's own `pendingAcks` leave it and are replayed, and the sender is unblocked
//!   whatever the ids named. As on the broker, a request with ids that replays nothing, from
//!   a consumer to which no permits came while it was blocked, does not make the dispatcher
//!   read: the consumer stays unserved ([`ConsumerStats::idle`]) until a FLOW, a publish, a
//!   replay or an unblocking ack. A closed or disconnected consumer's `pendingAcks` are
//!   replayed to the others (without counting a redelivery); when the last consumer goes,
//!   the replay set and the redelivery counts are cleared. An abort replays what the model
//!   says, and counts a redelivery, if the subscription has a dispatcher (it has none after
//!   an unload or a restart until its first consumer comes). The first consumer of a
//!   subscription without consumers finds the replay set cleared again and the cursor
//!   rewound to its mark-delete position (`addConsumer`): what an abort replayed meanwhile
//!   is read once from the cursor. Every replay goes to any consumer (see Shared). Per consumer and per subscription,
//!   [`ConsumerStats::redeliver_all_commands`] and [`ConsumerStats::redeliver_ids_commands`]
//!   count what clients sent.
//! - **Transactions**: one coordinator (id 0; `transaction_coordinator_assign` has one
//!   partition). NEW_TXN (`txn_ttl_seconds` read as milliseconds, 0 meaning
//!   [`EmulatorConfig::default_txn_timeout`]) returns (most = 0, least = a sequence from 1);
//!   ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN commit or abort. A repeated END_TXN
//!   with the same action succeeds; the other action gets `InvalidTxnStatus`; unknown ids get
//!   `TransactionNotFound`. A transaction still open when its timeout passes is aborted
//!   (tokio time, so `tokio::time::pause` works).
//! - **Delayed delivery**: on Shared and Key_Shared subscriptions an entry whose
//!   `deliver_at_time` has not come is held and replayed when due (strictly, as a broker
//!   with `isDelayedDeliveryDeliverAtTimeStrict=true`); Exclusive and Failover deliver it at
//!   once, as the broker does.
//! - **Schemas**: the schema of `PRODUCER` and `SUBSCRIBE` goes to a registry per topic
//!   (a partitioned topic's partitions share it): the first becomes version 0 (8 bytes,
//!   big-endian, as the broker's `LongSchemaVersion`), an equal one (same type and
//!   definition; names and properties do not count) gets its version, answered in
//!   `PRODUCER_SUCCESS`; another type, or a JSON, Avro or Protobuf definition that is not a
//!   JSON object, is refused with `IncompatibleSchema`. Messages keep their producer's
//!   `schema_version` (the metadata is dispatched as sent). Simplified: no compatibility
//!   strategy (a producer's new definition of the same type becomes the next version, a
//!   consumer's is accepted, where the broker checks them, FULL by default, against the
//!   latest version), no `GET_SCHEMA`, and bytes producers and consumers are always accepted.
//! - **Other requests**: GET_LAST_MESSAGE_ID answers the last readable entry of the topic
//!   (with the largest batch index of a batch; entry `-1` when there is none) and the
//!   subscription's mark-delete position. SEEK disconnects the subscription's consumers
//!   (`CLOSE_CONSUMER`; only the active one on Exclusive and Failover), then resets its cursor to a message id (its entry
//!   first, with the ack set sent for it; `(-1, -1)` the first entry, an id past the end the
//!   end) or to the first entry published at or after a time; what was acknowledged after
//!   that comes again. GET_TOPICS_OF_NAMESPACE lists the namespace's topics
//!   (partitions by their own names) for the mode asked, unfiltered. Every other request the
//!   emulator does not model (CONSUMER_STATS, GET_SCHEMA, GET_OR_CREATE_SCHEMA,
//!   WATCH_TOPIC_LIST, ...) gets a `CommandError` with `NotAllowedError` at once, naming the
//!   command, so that a client fails fast instead of waiting out its timeout. Commands without
//!   a request id that it does not model (AUTH_RESPONSE, commands only a broker sends, type
//!   numbers the proto subset does not know) are logged and counted in
//!   [`Stats::unmodelled_commands`]; the connection stays open.
//! - **Restarts** ([`Emulator::restart`], or [`Emulator::take_down`] and
//!   [`Emulator::bring_up`]): the listener closes (connects are refused) and every connection
//!   drops; the same address serves the same data again. Topics, entries, cursors, open
//!   transactions with their sends and pending acks survive; producers, consumers, permits,
//!   dispatchers and redelivery counts do not (see [`Emulator::take_down`]).
//! - **Faults** ([`Faults`]): connections dropped after N frames or at a rate, responses
//!   delayed, MESSAGE checksums corrupted at a rate, from a generator seeded with
//!   [`EmulatorConfig::seed`] (`fastrand`).
//! - **Stats** ([`Stats`]): per consumer unacked (0 on Exclusive and Failover, where the
//!   broker does not count), blocked, permits, dispatched and acked counts; per subscription
//!   the backlog in messages and in entries (the broker's `msgBacklog` counts entries);
//!   frames per command type; frames per connection.
//!
//! # What is not modelled
//! Persistence on disk (a restart keeps the state in memory), BookKeeper ledgers rolling over, schema compatibility strategies (see Schemas above), compression checks (compressed and
//! chunked entries are stored and dispatched as sent), encryption, deduplication, retention and TTL, dead-letter topics,
//! `maxUnackedMessagesPerSubscription`, geo-replication, TLS, and authentication other than
//! one static token. Key_Shared moves hashes between AUTO_SPLIT consumers at once when
//! consumers come and go: the 4.0 broker's draining (a moved hash waits until the old consumer
//! acknowledged its messages) and `allowOutOfOrderDelivery` are not modelled. Shared
//! dispatch has no consumer priority levels, no adaptive read size and no dispatch rate
//! limits, and it reads at once on every event instead of when a read completes, so which
//! consumer a replay reaches follows the round robin exactly, where on a broker it also
//! depends on timing. Acks are handled one after the other: the 4.0.8 broker's race that
//! accepts two transactional acks of the same message arriving close together (both
//! committed, issue 27) is not reproduced; the second is a `TransactionConflict` here. A
//! topic's limit
//! set with [`Emulator::set_max_unacked_messages`] applies to connected consumers at once and
//! to those that subscribe afterwards, as on a real 4.0.x broker. The backlog counts readable entries only (not those of open or aborted
//! transactions).
//!
//! The crate's modules form no cycle (`scripts/check-module-cycles` checks it).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod broker;
mod config;
mod delays;
mod dispatch;
mod entries;
mod faults;
pub mod legacy;
mod names;
mod outgoing;
mod schemas;
mod server;
mod stats;
mod topics;
mod txn;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::EmulatorConfig;
pub use faults::Faults;
pub use stats::{
    ConnectionStats, ConsumerStats, FaultStats, Stats, SubscriptionStats, TopicStats,
    TransactionStats,
};
pub use txn_ack::model::ConflictEffects;

use broker::Broker;
use pulsar_wire::Error;
use server::{AcceptLoop, Shared};

/// A running emulator. Dropping it stops it (tasks end on their own); [`Emulator::shutdown`]
/// also waits for them.
#[derive(Debug)]
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    endpoint: String,
}

impl Emulator {
    /// Starts listening.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound.
    pub async fn start(config: EmulatorConfig) -> Result<Self, Error> {
        let listener = TcpListener::bind(config.bind).await?;
        let addr = listener.local_addr()?;
        let endpoint = format!("pulsar://{addr}");
        let max_frame_size = usize::try_from(config.max_message_size).unwrap_or(0) + 10 * 1024;
        let shared = Arc::new(Shared {
            keep_alive: config.keep_alive,
            broker: Mutex::new(Broker::new(config, endpoint.clone())),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            max_frame_size,
            accepting: tokio::sync::Mutex::new(None),
        });
        let accepting = AcceptLoop::spawn(listener, &shared, 0);
        *shared.accepting.lock().await = Some(accepting);
        Ok(Self {
            shared,
            addr,
            endpoint,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service URL: `pulsar://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates a topic: non-partitioned with `partitions = 0`, else partitioned (its
    /// partitions appear as `topic-partition-N` when first used).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name, a partition's name, or a topic that exists.
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), Error> {
        self.shared.broker.lock().create_topic(topic, partitions)
    }

    /// Raises a partitioned topic's partition count (as `pulsar-admin topics
    /// update-partitioned-topic`): PARTITIONED_METADATA answers the new count at once, and the
    /// new partitions can be produced to and subscribed. The durable subscriptions of the
    /// existing partitions are created on the new ones from their first entry (the broker
    /// creates a partitioned topic's subscriptions on the partitions it adds), so messages
    /// sent there before a consumer attaches are not missed.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name, a topic that is not partitioned, or a count that is
    /// not larger than the current one (Pulsar cannot shrink a partitioned topic).
    pub fn update_partitions(&self, topic: &str, partitions: u32) -> Result<(), Error> {
        self.shared
            .broker
            .lock()
            .update_partitions(topic, partitions)
    }

    /// Sets the topic's `maxUnackedMessagesOnConsumer` (for a partitioned topic, of all its
    /// partitions); 0 means unlimited. Connected consumers of durable Shared and Key_Shared
    /// subscriptions take it at once (the next dispatch blocks at it), as do consumers that
    /// subscribe afterwards.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name.
    pub fn set_max_unacked_messages(&self, topic: &str, max: u32) -> Result<(), Error> {
        self.shared.broker.lock().set_max_unacked(topic, max)
    }

    /// A snapshot of everything.
    pub fn stats(&self) -> Stats {
        self.shared.broker.lock().stats()
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.shared.broker.lock().faults().clone()
    }

    /// Replaces the faults in force (connections already open are affected too).
    pub fn set_faults(&self, faults: Faults) {
        self.shared.broker.lock().set_faults(faults);
    }

    /// Unloads a topic (and its partitions) as `pulsar-admin topics unload` does: its
    /// producers and consumers are closed (`CLOSE_PRODUCER`, `CLOSE_CONSUMER`) on connections
    /// that stay open, unacknowledged messages go back to their subscriptions, the data stays.
    /// The topic is loaded again: its subscriptions keep their cursors and the pending acks
    /// of open transactions, and lose their dispatchers (replay sets, redelivery counts).
    /// Returns how many producers and consumers were closed.
    pub fn unload(&self, topic: &str) -> (usize, usize) {
        self.shared.broker.lock().unload(topic, None)
    }

    /// As [`Emulator::unload`], but the closes name the broker that serves the topic now
    /// (`assignedBrokerServiceUrl`, PIP-307, as a 4.x broker with the extensible load manager
    /// sends when it moves a bundle): `service_url`, another emulator's
    /// [`Emulator::endpoint`] say, where clients that follow PIP-307 go without a lookup.
    pub fn unload_to(&self, topic: &str, service_url: &str) -> (usize, usize) {
        self.shared
            .broker
            .lock()
            .unload(topic, Some(service_url.to_owned()))
    }

    /// Closes every open connection abruptly; returns how many.
    pub fn disconnect_all(&self) -> usize {
        self.shared.broker.lock().disconnect_all()
    }

    /// Stops the broker as a crash or `pulsar-broker` stop does, keeping its data: the
    /// listener is closed (a client's connect is refused until [`Emulator::bring_up`]) and
    /// every connection is dropped at once, without CLOSE_PRODUCER or CLOSE_CONSUMER.
    /// Returns how many connections were dropped. Does nothing more when already down.
    ///
    /// What survives, as on a real 4.0.x broker that recovers its managed ledgers, cursors,
    /// transaction buffer, pending-ack store and transaction coordinator log: topics and
    /// every entry (those of open transactions too, still unreadable until they commit),
    /// subscriptions with their cursors (mark-delete, individually deleted entries,
    /// batch-deleted indexes), what committed and aborted transactions did, open
    /// transactions (they can still be committed or aborted, and their timeouts still run),
    /// their sends and their pending acks, topic policies and partition counts. What does
    /// not: producers, consumers, permits, the unacked counts and blocked state of
    /// consumers, the subscriptions' dispatchers (replay sets, redelivery counts): every
    /// message not acknowledged (nor pending in an open transaction) is delivered again to
    /// the next consumer of its subscription. Non-durable subscriptions go with their
    /// consumers. Stats keep counting through restarts ([`FaultStats::restarts`]).
    pub async fn take_down(&self) -> usize {
        let mut accepting = self.shared.accepting.lock().await;
        let Some(running) = accepting.take() else {
            return 0;
        };
        running.stop().await;
        self.shared.broker.lock().restart()
    }

    /// Starts the broker again on the same address and data after [`Emulator::take_down`];
    /// does nothing when it is up.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound again (another process took the
    /// port); [`Error::Closed`] after the emulator was shut down.
    pub async fn bring_up(&self) -> Result<(), Error> {
        let mut accepting = self.shared.accepting.lock().await;
        if accepting.is_some() {
            return Ok(());
        }
        if self.shared.shutdown.is_cancelled() {
            return Err(Error::Closed("the emulator"));
        }
        // SO_REUSEADDR (tokio sets it) lets the port be bound again at once despite the
        // connections in TIME_WAIT; a bind can still race with the old socket's release, so
        // try a few times.
        let mut attempt = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(error) if attempt < 50 => {
                    tracing::debug!(%error, "binding the emulator's address again");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        let epoch = self.shared.broker.lock().epoch();
        *accepting = Some(AcceptLoop::spawn(listener, &self.shared, epoch));
        Ok(())
    }

    /// Restarts the broker on the same address and data: [`Emulator::take_down`], `down` of
    /// (tokio) time during which connects are refused, then [`Emulator::bring_up`]. Returns
    /// how many connections were dropped.
    ///
    /// # Errors
    /// As [`Emulator::bring_up`]; [`Error::Closed`] when the emulator is shut down meanwhile.
    pub async fn restart(&self, down: Duration) -> Result<usize, Error> {
        let dropped = self.take_down().await;
        tokio::select! {
            () = tokio::time::sleep(down) => {}
            () = self.shared.shutdown.cancelled() => return Err(Error::Closed("the emulator")),
        }
        self.bring_up().await?;
        Ok(dropped)
    }

    /// Stops accepting, closes every connection and waits for the emulator's tasks to end.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
