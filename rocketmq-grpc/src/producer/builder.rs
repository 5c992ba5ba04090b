//! [`ProducerBuilder`]: a producer configured in one expression, as the consumers are
//! ([`PushConsumer::builder`](crate::PushConsumer::builder),
//! [`SimpleConsumer::builder`](crate::SimpleConsumer::builder)).

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::RetryBudget;

use super::Producer;
use super::checker::TransactionChecker;
use crate::{ClientConfig, Error, Session};

/// Configures a [`Producer`]; [`build`](Self::build) makes it, [`start`](Self::start) makes it
/// and waits until the proxy has answered its settings (its routes fetched, its retry policy
/// known), as the Java client's `ProducerBuilder::build` does.
///
/// ```no_run
/// # async fn demo() -> Result<(), rocketmq_grpc::Error> {
/// use std::time::Duration;
/// use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer};
///
/// let producer = Producer::builder(ClientConfig::new("127.0.0.1:8081")?)
///     .topic("orders")
///     .retry_window(Duration::from_secs(60))
///     .start()
///     .await?;
/// let receipt = producer.send(OutgoingMessage::new("orders", "order 17")).await?;
/// println!("sent {}", receipt.message_id());
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` or `start`"]
pub struct ProducerBuilder {
    config: ClientConfig,
    session: Option<Arc<Session>>,
    topics: Vec<String>,
    max_body: Option<usize>,
    retry_window: Option<Duration>,
    retry_budget: Option<RetryBudget>,
    max_attempts: Option<u32>,
    checker: Option<Arc<dyn TransactionChecker>>,
}

impl std::fmt::Debug for ProducerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerBuilder")
            .field("endpoint", self.config.endpoint())
            .field("topics", &self.topics)
            .field("max_body", &self.max_body)
            .field("retry_window", &self.retry_window)
            .field("max_attempts", &self.max_attempts)
            .field("transaction_checker", &self.checker.is_some())
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// Starts configuring a producer on the proxy described by `config` (its own
    /// [`Session`]; [`ProducerBuilder::session`] shares one instead).
    pub fn builder(config: ClientConfig) -> ProducerBuilder {
        ProducerBuilder {
            config,
            session: None,
            topics: Vec::new(),
            max_body: None,
            retry_window: None,
            retry_budget: None,
            max_attempts: None,
            checker: None,
        }
    }
}

impl ProducerBuilder {
    /// Uses `session` (its connections and client id, shared with other producers or
    /// consumers) instead of a session of its own over the builder's config.
    pub fn session(mut self, session: Arc<Session>) -> Self {
        self.session = Some(session);
        self
    }

    /// Announces `topic` in the producer's settings from the start; call it once per topic
    /// (see [`Producer::topic`]).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// The body size limit checked before sending (see [`Producer::max_body`]); at least 1,
    /// checked at [`build`](Self::build).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = Some(bytes);
        self
    }

    /// How long retryable failures keep being retried (see [`Producer::retry_window`]).
    pub fn retry_window(mut self, window: Duration) -> Self {
        self.retry_window = Some(window);
        self
    }

    /// The retry budget of sends (see [`Producer::retry_budget`]); checked at
    /// [`build`](Self::build).
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.retry_budget = Some(budget);
        self
    }

    /// Fixes the attempts of the retry policy (see [`Producer::max_attempts`]); at least 1,
    /// checked at [`build`](Self::build).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// The checker of transactions left open (see [`Producer::transaction_checker`]).
    pub fn transaction_checker(mut self, checker: impl TransactionChecker) -> Self {
        self.checker = Some(Arc::new(checker));
        self
    }

    /// The producer; nothing is sent until its first send or [`Producer::start`].
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting: the config (see [`Session::new`]), or
    /// `retry_budget` out of range, `max_body` or `max_attempts` of 0.
    // The deprecated second path does the work: one piece of code for both until it goes.
    #[allow(deprecated)]
    pub fn build(self) -> Result<Producer, Error> {
        // Before the session: a bad setting is refused without connecting anything.
        if let Some(bytes) = self.max_body {
            super::check_max_body(bytes)?;
        }
        if let Some(attempts) = self.max_attempts {
            super::check_max_attempts(attempts)?;
        }
        let session = match self.session {
            Some(session) => session,
            None => Session::new(self.config)?,
        };
        let mut producer = Producer::new(session);
        for topic in self.topics {
            producer = producer.topic(topic);
        }
        if let Some(bytes) = self.max_body {
            producer = producer.max_body(bytes)?;
        }
        if let Some(window) = self.retry_window {
            producer = producer.retry_window(window);
        }
        if let Some(budget) = self.retry_budget {
            producer = producer.retry_budget(budget)?;
        }
        if let Some(attempts) = self.max_attempts {
            producer = producer.max_attempts(attempts)?;
        }
        if let Some(checker) = self.checker {
            producer = producer.transaction_checker(checker);
        }
        Ok(producer)
    }

    /// The producer, started: the telemetry stream is open and the proxy has answered its
    /// settings (see [`Producer::start`]).
    ///
    /// # Errors
    /// As [`build`](Self::build), then as [`Producer::start`].
    pub async fn start(self) -> Result<Producer, Error> {
        let producer = self.build()?;
        producer.start().await?;
        Ok(producer)
    }
}
