//! The emulator's settings.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::Faults;
use txn_ack::model::ConflictEffects;

/// How the emulator behaves. Build it from [`EmulatorConfig::default`] with the methods
/// below.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    pub(crate) bind: SocketAddr,
    pub(crate) server_version: String,
    pub(crate) max_message_size: i32,
    pub(crate) auth_token: Option<String>,
    pub(crate) auto_topic_creation: bool,
    pub(crate) auto_created_partitions: u32,
    pub(crate) max_unacked_messages_per_consumer: u32,
    pub(crate) batch_index_ack: bool,
    pub(crate) conflict_effects: ConflictEffects,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) default_txn_timeout: Duration,
    pub(crate) transactions: bool,
    pub(crate) faults: Faults,
    pub(crate) seed: u64,
}

impl Default for EmulatorConfig {
    /// 127.0.0.1 on a free port; no authentication; topics auto-created non-partitioned;
    /// limit 50,000 unacked messages per consumer; broker batch-index acks off (the 4.0.x
    /// default); a refused transactional ack still takes its count off, as on a 4.0.x broker
    /// (`ConflictEffects::AsBroker`, confirmed by the conformance harness on 4.0.8);
    /// transactions on with a 60 s default timeout; keep-alive PINGs after 30 s of
    /// silence; no faults; seed 0.
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            server_version: concat!("pulsar-wire-emulator/", env!("CARGO_PKG_VERSION")).into(),
            max_message_size: 5 * 1024 * 1024,
            auth_token: None,
            auto_topic_creation: true,
            auto_created_partitions: 0,
            max_unacked_messages_per_consumer: 50_000,
            batch_index_ack: false,
            conflict_effects: ConflictEffects::AsBroker,
            keep_alive: Some(Duration::from_secs(30)),
            default_txn_timeout: Duration::from_secs(60),
            transactions: true,
            faults: Faults::default(),
            seed: 0,
        }
    }
}

impl EmulatorConfig {
    /// Listens on 127.0.0.1:`port` (0: any free port).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.bind = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        self
    }

    /// Listens on `addr`.
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// CONNECTED's `server_version`.
    #[must_use]
    pub fn server_version(mut self, version: impl Into<String>) -> Self {
        self.server_version = version.into();
        self
    }

    /// CONNECTED's `max_message_size`; frames larger than this plus 10 KiB close the
    /// connection.
    #[must_use]
    pub fn max_message_size(mut self, bytes: i32) -> Self {
        self.max_message_size = bytes.max(1);
        self
    }

    /// Requires CONNECT to carry `auth_method_name = "token"` and this token as `auth_data`;
    /// otherwise ERROR `AuthenticationError` and the connection is closed.
    #[must_use]
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// Whether unknown topics are created on PRODUCER and SUBSCRIBE (and reported by
    /// PARTITIONED_METADATA and LOOKUP); when off they get `TopicNotFound`.
    #[must_use]
    pub fn auto_topic_creation(mut self, enabled: bool) -> Self {
        self.auto_topic_creation = enabled;
        self
    }

    /// The partitions of a topic auto-created by PARTITIONED_METADATA (0: non-partitioned).
    #[must_use]
    pub fn auto_created_partitions(mut self, partitions: u32) -> Self {
        self.auto_created_partitions = partitions;
        self
    }

    /// The broker-wide `maxUnackedMessagesPerConsumer` (0: unlimited), used where a topic has
    /// no limit of its own.
    #[must_use]
    pub fn max_unacked_messages_per_consumer(mut self, max: u32) -> Self {
        self.max_unacked_messages_per_consumer = max;
        self
    }

    /// `acknowledgmentAtBatchIndexLevelEnabled` (off by default, as in 4.0.x).
    #[must_use]
    pub fn batch_index_ack(mut self, enabled: bool) -> Self {
        self.batch_index_ack = enabled;
        self
    }

    /// What a rejected transactional ack does to the unacked count (default: as the broker).
    #[must_use]
    pub fn conflict_effects(mut self, effects: ConflictEffects) -> Self {
        self.conflict_effects = effects;
        self
    }

    /// Sends a PING after this much silence from a client and closes the connection if the
    /// next period passes without a frame; `None` disables it.
    #[must_use]
    pub fn keep_alive(mut self, period: Option<Duration>) -> Self {
        self.keep_alive = period.filter(|p| !p.is_zero());
        self
    }

    /// The timeout of a transaction whose NEW_TXN carries none.
    #[must_use]
    pub fn default_txn_timeout(mut self, timeout: Duration) -> Self {
        self.default_txn_timeout = timeout;
        self
    }

    /// `transactionCoordinatorEnabled`: when off, TC_CLIENT_CONNECT and NEW_TXN get
    /// `TransactionCoordinatorNotFound`.
    #[must_use]
    pub fn transactions(mut self, enabled: bool) -> Self {
        self.transactions = enabled;
        self
    }

    /// The faults injected from the start.
    #[must_use]
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The seed of the fault generator.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}
