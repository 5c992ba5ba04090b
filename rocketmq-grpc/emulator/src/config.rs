//! Settings fixed when the emulator starts (faults are adjustable at run time, see
//! [`FaultConfig`](super::FaultConfig)).

use std::collections::HashMap;
use std::time::Duration;

/// How the emulated proxy runs beside its broker (`ProxyStartup -pm local|cluster`): it
/// changes the receipt of a batch send (seen on 5.3.3 and 5.5.0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyMode {
    /// The broker runs in the proxy's process (the default): a batch's receipt is one entry
    /// with a new id for the batch.
    #[default]
    Local,
    /// The proxy reaches its brokers over remoting: a batch's receipt is one entry whose id is
    /// the messages' own ids joined by commas, in order.
    Cluster,
}

/// Proxy defaults from the reference (§4.4, §4.7) unless noted.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Broker name in routes and receipt handles.
    pub(crate) broker_name: String,
    /// `enableBatchAck`.
    pub(crate) batch_ack: bool,
    /// `enableProxyAutoRenew`.
    pub(crate) proxy_auto_renew: bool,
    /// `defaultInvisibleTimeMills` (60 s): the invisible time of auto-renewed pops.
    pub(crate) auto_renew_invisible: Duration,
    /// `renewMaxTimeMillis` (3 h): how long the proxy keeps renewing.
    pub(crate) renew_max: Duration,
    /// `minInvisibleTimeMillsForRecv` (10 s).
    pub(crate) min_invisible_recv: Duration,
    /// `maxInvisibleTimeMills` (12 h).
    pub(crate) max_invisible: Duration,
    /// `grpcClientConsumerMinLongPollingTimeoutMillis` (5 s).
    pub(crate) min_long_polling: Duration,
    /// `grpcClientConsumerMaxLongPollingTimeoutMillis` (20 s).
    pub(crate) max_long_polling: Duration,
    /// The broker's window between a pop's scan and its suspension (zero: none, and every
    /// waiting receive is woken by an arrival); see `EmulatorBuilder::pop_suspension_gap`.
    pub(crate) pop_suspension_gap: Duration,
    /// A receive the client cancels still pops, as the proxy's (see
    /// `EmulatorBuilder::cancelled_receives_pop`).
    pub(crate) cancelled_receives_pop: bool,
    /// `maxMessageSize` (4 MiB); 0 means no limit.
    pub(crate) max_body_size: usize,
    /// `enableMessageBodyEmptyCheck` (true).
    pub(crate) reject_empty_body: bool,
    /// Auto-renew receives need the client's channel (a Heartbeat or Telemetry first).
    pub(crate) require_client_channel: bool,
    pub(crate) require_client_settings: bool,
    /// Unknown consumer groups are created on first use (the broker's
    /// `autoCreateSubscriptionGroup`); off by default so that unknown groups are errors.
    pub(crate) auto_create_groups: bool,
    /// `Subscription.receive_batch_size` pushed in telemetry settings (32).
    pub(crate) receive_batch_size: i32,
    /// Upper bound applied to `ReceiveMessageRequest.batch_size` (32).
    pub(crate) max_receive_batch: usize,
    /// Consumer `RetryPolicy.max_attempts` pushed in telemetry settings (17: 16 retries).
    pub(crate) max_delivery_attempts: i32,
    /// `grpcClientProducerMaxAttempts` (3), pushed to producers in telemetry settings.
    pub(crate) producer_max_attempts: i32,
    /// `grpcClientProducerBackoffInitialMillis` (10 ms).
    pub(crate) producer_backoff_initial: Duration,
    /// `grpcClientProducerBackoffMaxMillis` (1 s).
    pub(crate) producer_backoff_max: Duration,
    /// `grpcClientProducerBackoffMultiplier` (2).
    pub(crate) producer_backoff_multiplier: f32,
    /// After NotifyClientTermination, the client's auto-renewed messages become visible after
    /// this long.
    pub(crate) release_on_termination: Duration,
    /// Access key → secret key; empty means no signature check.
    pub(crate) credentials: HashMap<String, String>,
    /// `grpcMaxInboundMessageSize` (130 MiB).
    pub(crate) max_inbound_message_size: usize,
    /// `maxDelayTimeMills` (1 day): the furthest delivery time ahead a send may ask for; zero
    /// means no limit.
    pub(crate) max_delay: Duration,
    /// How the proxy hands a batch to its broker (local: in process, cluster: remoting).
    pub(crate) proxy_mode: ProxyMode,
    /// Whether the broker keeps each batch message's own id, tag and properties (5.5.0) or
    /// gives them the first message's (5.3.3).
    pub(crate) batch_messages_apart: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            broker_name: "broker-emulator".to_owned(),
            batch_ack: false,
            proxy_auto_renew: true,
            auto_renew_invisible: Duration::from_secs(60),
            renew_max: Duration::from_secs(3 * 3600),
            min_invisible_recv: Duration::from_secs(10),
            max_invisible: Duration::from_secs(12 * 3600),
            min_long_polling: Duration::from_secs(5),
            max_long_polling: Duration::from_secs(20),
            pop_suspension_gap: Duration::ZERO,
            cancelled_receives_pop: false,
            max_body_size: 4 * 1024 * 1024,
            reject_empty_body: true,
            require_client_channel: true,
            require_client_settings: true,
            auto_create_groups: false,
            receive_batch_size: 32,
            max_receive_batch: 32,
            max_delivery_attempts: 17,
            producer_max_attempts: 3,
            producer_backoff_initial: Duration::from_millis(10),
            producer_backoff_max: Duration::from_secs(1),
            producer_backoff_multiplier: 2.0,
            release_on_termination: Duration::from_secs(1),
            credentials: HashMap::new(),
            max_inbound_message_size: 130 * 1024 * 1024,
            max_delay: Duration::from_secs(24 * 3600),
            proxy_mode: ProxyMode::Local,
            batch_messages_apart: false,
        }
    }
}
