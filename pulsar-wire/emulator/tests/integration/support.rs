//! Shared pieces: an emulator with a client, receiving, and waiting for the broker to drain.

use std::future::Future;
use std::time::{Duration, Instant};

use pulsar_wire::{
    BatchingOptions, Client, ClientBuilder, ConnectOptions, Consumer, ConsumerOptions, Error,
    InitialPosition, Message, OutgoingMessage, Producer, ProducerOptions, SubType,
};
use pulsar_wire_emulator::{Emulator, EmulatorConfig, Stats};

/// How long a test waits for something that should happen at once.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// An emulator and a client connected to it.
pub(crate) struct Setup {
    pub(crate) emulator: Emulator,
    pub(crate) client: Client,
}

/// Producer options batching `per_batch` messages for at most 50 ms (0: no batching).
pub(crate) fn producer_options(per_batch: usize) -> ProducerOptions {
    if per_batch == 0 {
        ProducerOptions::default().no_batching()
    } else {
        ProducerOptions::default().batching(
            BatchingOptions::default()
                .max_messages(per_batch)
                .max_delay(Duration::from_millis(50)),
        )
    }
}

impl Setup {
    pub(crate) async fn new(config: EmulatorConfig) -> Self {
        let emulator = Emulator::start(config).await.expect("the emulator starts");
        let options = ConnectOptions::new(emulator.endpoint())
            .expect("a valid URL")
            .operation_timeout(Duration::from_secs(10));
        let client = ClientBuilder::from(options)
            .build()
            .await
            .expect("the client connects");
        Self { emulator, client }
    }

    /// A Shared consumer from the earliest message.
    pub(crate) async fn shared(&self, topic: &str, options: ConsumerOptions) -> Consumer {
        self.consumer(topic, options.sub_type(SubType::Shared))
            .await
    }

    pub(crate) async fn consumer(&self, topic: &str, options: ConsumerOptions) -> Consumer {
        Consumer::builder(&self.client, topic, "sub")
            .options(options.initial_position(InitialPosition::Earliest))
            .build()
            .await
            .expect("subscribed")
    }

    /// A producer batching `per_batch` messages (0: no batching).
    pub(crate) async fn producer(&self, topic: &str, per_batch: usize) -> Producer {
        Producer::builder(&self.client, topic)
            .options(producer_options(per_batch).transactional(true))
            .build()
            .await
            .expect("producer created")
    }

    pub(crate) fn stats(&self) -> Stats {
        self.emulator.stats()
    }

    /// Waits until every consumer's unacked count is 0 and nothing is blocked, and the
    /// backlog of `topic` is 0. Panics with the stats when that does not happen in time.
    pub(crate) async fn assert_drained(&self, topic: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let stats = self.stats();
            let consumers_idle = stats.consumers().all(|c| c.unacked == 0 && !c.blocked);
            if consumers_idle && stats.backlog(topic) == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{topic} did not drain: backlog {}, consumers {:#?}",
                stats.backlog(topic),
                stats.consumers().collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Dispatch was never blocked on unacked messages.
    pub(crate) fn assert_never_blocked(&self) {
        let stats = self.stats();
        for consumer in stats.consumers() {
            assert_eq!(consumer.times_blocked, 0, "{consumer:#?}");
        }
    }
}

/// Sends `count` messages `m0`, `m1`, … concurrently (so that batches fill) and returns
/// their ids in order.
pub(crate) async fn send_all(producer: &Producer, count: usize) -> Vec<pulsar_wire::MessageId> {
    let sends = (0..count).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, Error>>()
        .expect("every send succeeds")
}

/// Receives `count` messages, each within [`PATIENCE`].
pub(crate) async fn receive(consumer: &Consumer, count: usize) -> Vec<Message> {
    let mut messages = Vec::with_capacity(count);
    for i in 0..count {
        let message = within(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|| panic!("message {i} of {count} did not arrive"))
            .expect("received");
        messages.push(message);
    }
    messages
}

/// Nothing more arrives within `wait`.
pub(crate) async fn assert_quiet(consumer: &Consumer, wait: Duration) {
    if let Some(message) = within(wait, consumer.receive()).await {
        panic!("unexpected delivery: {:?}", message.map(|m| m.id()));
    }
}

/// `future`'s output, or `None` when `limit` passes first.
pub(crate) async fn within<F: Future>(limit: Duration, future: F) -> Option<F::Output> {
    tokio::time::timeout(limit, future).await.ok()
}
