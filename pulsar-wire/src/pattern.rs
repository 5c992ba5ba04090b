//! [`PatternConsumer`]: one subscription over every topic of a namespace whose name matches a
//! regular expression, following topics as they come and go (the Java client's
//! `topicsPattern`).
//!
//! The pattern names the namespace and matches topic names within it:
//! `persistent://public/default/orders-.*` (the domain may be left out: persistent). As with
//! the Java client, a topic matches when its whole name without the domain
//! (`public/default/orders-eu`) matches, and a partitioned topic is subscribed as a whole
//! (its partitions are listed by their own names, matched by the topic's). The topics come
//! from the broker's list (`GET_TOPICS_OF_NAMESPACE`, system topics left out) at
//! subscription and then every [`PatternOptions::discovery_interval`]: topics that appear
//! are subscribed, topics that are gone are closed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use regex::Regex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::consumer::forward;
use crate::pb::command_get_topics_of_namespace::Mode;
use crate::pool::{Pool, base_topic};
use crate::{
    Consumer, ConsumerOptions, ConsumerStats, Error, LinkState, LinkStates, Message, Transaction,
};

/// The Java client's default `patternAutoDiscoveryPeriod`.
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(60);

/// The shortest discovery interval accepted.
pub const MIN_DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);

/// Which topics of the namespace a [`PatternConsumer`] considers (the Java client's
/// `RegexSubscriptionMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TopicsMode {
    /// Persistent topics only (the default).
    #[default]
    Persistent,
    /// Non-persistent topics only.
    NonPersistent,
    /// Both.
    All,
}

impl TopicsMode {
    fn wire(self) -> Mode {
        match self {
            Self::Persistent => Mode::Persistent,
            Self::NonPersistent => Mode::NonPersistent,
            Self::All => Mode::All,
        }
    }
}

/// How a [`PatternConsumer`] subscribes and discovers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PatternOptions {
    consumer: ConsumerOptions,
    mode: TopicsMode,
    discovery: Option<Duration>,
}

impl PatternOptions {
    /// Each matching topic subscribed with `consumer` options, persistent topics only,
    /// discovered every [`DEFAULT_DISCOVERY_INTERVAL`].
    pub fn new(consumer: ConsumerOptions) -> Self {
        Self {
            consumer,
            mode: TopicsMode::Persistent,
            discovery: Some(DEFAULT_DISCOVERY_INTERVAL),
        }
    }

    /// The options each matching topic is subscribed with (replacing those given to
    /// [`PatternOptions::new`]).
    #[must_use]
    pub fn consumer(mut self, options: ConsumerOptions) -> Self {
        self.consumer = options;
        self
    }

    /// Which topics are considered (default persistent ones).
    #[must_use]
    pub fn topics_mode(mut self, mode: TopicsMode) -> Self {
        self.mode = mode;
        self
    }

    /// How often the namespace is listed again (default [`DEFAULT_DISCOVERY_INTERVAL`];
    /// `None`: only on [`PatternConsumer::discover`]; at least [`MIN_DISCOVERY_INTERVAL`]).
    #[must_use]
    pub fn discovery_interval(mut self, every: Option<Duration>) -> Self {
        self.discovery = every;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if let Some(every) = self.discovery
            && every < MIN_DISCOVERY_INTERVAL
        {
            return Err(Error::Invalid {
                what: "discovery_interval",
                reason: format!(
                    "{every:?} is below {MIN_DISCOVERY_INTERVAL:?}: each discovery lists the \
                     whole namespace (default {DEFAULT_DISCOVERY_INTERVAL:?}; None turns it off)"
                ),
            });
        }
        if self.consumer.retry {
            return Err(Error::Invalid {
                what: "enable_retry",
                reason: "a pattern consumer does not read a retry-letter topic: subscribe the \
                         pattern without retry"
                    .into(),
            });
        }
        Ok(())
    }
}

/// A pattern: the namespace listed, the domain prefix and the expression topics match.
#[derive(Debug)]
struct Pattern {
    text: String,
    namespace: String,
    regex: Regex,
}

impl Pattern {
    fn parse(text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::Invalid {
            what: "pattern",
            reason,
        };
        let body = text
            .strip_prefix("persistent://")
            .or_else(|| text.strip_prefix("non-persistent://"))
            .unwrap_or(text);
        let mut parts = body.splitn(3, '/');
        let (Some(tenant), Some(namespace), Some(expression)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid(format!(
                "{text:?} does not name a namespace: write \
                 persistent://<tenant>/<namespace>/<regular expression>"
            )));
        };
        let literal = |part: &str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '='))
        };
        if !literal(tenant) || !literal(namespace) || expression.is_empty() {
            return Err(invalid(format!(
                "{text:?}: the tenant and the namespace are names, not expressions, and a topic \
                 expression follows them"
            )));
        }
        let regex = Regex::new(&format!("^(?:{tenant}/{namespace}/{expression})$"))
            .map_err(|error| invalid(format!("{text:?} is not a regular expression: {error}")))?;
        Ok(Self {
            text: text.to_owned(),
            namespace: format!("{tenant}/{namespace}"),
            regex,
        })
    }

    /// Whether `topic` (a full name, a partition's or not) matches: its topic's name without
    /// the domain.
    fn matches(&self, topic: &str) -> bool {
        let name = topic.split_once("://").map_or(topic, |(_, name)| name);
        self.regex.is_match(base_topic(name))
    }
}

/// What a pattern consumer and its discovery task share.
#[derive(Debug)]
struct Topics {
    pool: Pool,
    pattern: Pattern,
    subscription: String,
    options: PatternOptions,
    /// The consumer of each topic, by full name.
    consumers: RwLock<BTreeMap<String, Arc<Consumer>>>,
    /// Each consumer's forwarding task, by topic.
    tasks: Mutex<BTreeMap<String, JoinHandle<()>>>,
    /// Where the topics' consumers forward their messages; taken at the close, so that the
    /// channel ends once their forwarding tasks are gone (a receive waiting then ends too).
    tx: Mutex<Option<mpsc::Sender<Result<Message, Error>>>>,
    /// Serialises discoveries and the close.
    discovering: tokio::sync::Mutex<()>,
    closed: AtomicBool,
    /// The consumers taken out of `consumers`, whose counters stay in the stats.
    retired: Mutex<Retired>,
    /// One link state per topic, in the order of `consumers` ([`PatternConsumer::state`]).
    links: watch::Sender<LinkStates>,
    /// Each topic consumer's task following its link state, by topic.
    watchers: Mutex<BTreeMap<String, JoinHandle<()>>>,
}

/// The consumers of topics gone (or of every topic, after the close): their counters stay in
/// [`PatternConsumer::stats`], so that the sums never go back.
#[derive(Debug, Default)]
struct Retired {
    /// Consumers being closed: their counters still move (acks going out).
    closing: Vec<Arc<Consumer>>,
    /// The counters of those closed.
    counters: ConsumerStats,
}

impl Topics {
    /// Lists the namespace and subscribes the matching topics not subscribed yet; closes the
    /// consumers of topics gone. Returns the topics subscribed now.
    async fn discover(self: &Arc<Self>) -> Result<Vec<String>, Error> {
        let _serial = self.discovering.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the pattern consumer"));
        }
        let listed = self
            .pool
            .topics_of_namespace(
                &self.pattern.namespace,
                self.options.mode.wire(),
                Some(&self.pattern.text),
            )
            .await?;
        let wanted: BTreeSet<String> = listed
            .iter()
            .filter(|topic| self.pattern.matches(topic))
            .map(|topic| base_topic(topic).to_owned())
            .collect();
        let have: BTreeSet<String> = self.consumers.read().keys().cloned().collect();
        for topic in have.difference(&wanted) {
            let gone = self.take(topic);
            if let Some(task) = self.tasks.lock().remove(topic) {
                task.abort();
            }
            if let Some(task) = self.watchers.lock().remove(topic) {
                task.abort();
            }
            self.publish_links();
            if let Some(consumer) = gone {
                tracing::info!(%topic, "a topic of the pattern is gone: its consumer closes");
                let _ = consumer.close(crate::DEFAULT_CLOSE_DEADLINE).await;
                self.retire(&consumer);
            }
        }
        for topic in wanted.difference(&have) {
            let consumer = Consumer::subscribe(
                &self.pool,
                topic,
                &self.subscription,
                self.options.consumer.clone(),
            )
            .await?;
            let consumer = Arc::new(consumer);
            let Some(tx) = self.tx.lock().clone() else {
                let _ = consumer.close(crate::DEFAULT_CLOSE_DEADLINE).await;
                return Err(Error::Closed("the pattern consumer"));
            };
            let task = forward(Arc::clone(&consumer), tx);
            self.tasks.lock().insert(topic.clone(), task);
            let watcher = tokio::spawn(watch_links(Arc::downgrade(self), consumer.state()));
            self.watchers.lock().insert(topic.clone(), watcher);
            self.consumers.write().insert(topic.clone(), consumer);
            self.publish_links();
            tracing::info!(%topic, pattern = %self.pattern.text, "subscribed a topic of the pattern");
        }
        Ok(self.consumers.read().keys().cloned().collect())
    }

    /// Takes the consumer of `topic` out of the topics; its counters stay in the stats.
    fn take(&self, topic: &str) -> Option<Arc<Consumer>> {
        let mut consumers = self.consumers.write();
        let consumer = consumers.remove(topic)?;
        self.retired.lock().closing.push(Arc::clone(&consumer));
        Some(consumer)
    }

    /// `consumer`, taken out by [`Topics::take`], is closed: its final counters are kept.
    fn retire(&self, consumer: &Arc<Consumer>) {
        let mut retired = self.retired.lock();
        retired
            .closing
            .retain(|other| !Arc::ptr_eq(other, consumer));
        retired.counters.add_counters(&consumer.stats());
    }

    /// The counters of every topic's consumer, those of topics gone included, summed; the
    /// flags of the topics subscribed now.
    fn stats(&self) -> ConsumerStats {
        let consumers = self.consumers.read();
        let retired = self.retired.lock();
        let mut stats = retired.counters.clone();
        for consumer in &retired.closing {
            stats.add_counters(&consumer.stats());
        }
        for consumer in consumers.values() {
            let one = consumer.stats();
            stats.add_counters(&one);
            stats.closed_by_broker |= one.closed_by_broker;
            stats.reached_end_of_topic |= one.reached_end_of_topic;
        }
        stats
    }

    /// Publishes the link state of every topic's consumer (its [`LinkStates::overall`]), in
    /// the order of the topics; nothing once the pattern consumer is closed.
    fn publish_links(&self) {
        // Read under the channel's lock, so that concurrent publications cannot leave an
        // older reading last; and the close's last publication takes that lock after
        // marking the consumer closed, so nothing overwrites it.
        self.links.send_if_modified(|links| {
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            let states: Vec<LinkState> = self
                .consumers
                .read()
                .values()
                .map(|consumer| consumer.state().borrow().overall().clone())
                .collect();
            *links = LinkStates::from_states(states);
            true
        });
    }
}

/// Publishes the pattern consumer's link states again whenever those of one topic's consumer
/// change, while both live.
async fn watch_links(topics: Weak<Topics>, mut states: watch::Receiver<LinkStates>) {
    while states.changed().await.is_ok() {
        let Some(topics) = topics.upgrade() else {
            return;
        };
        topics.publish_links();
    }
}

/// Rediscovers every `every` while the pattern consumer lives; a failed discovery is tried
/// again at the next turn.
async fn follow(topics: Weak<Topics>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(topics) = topics.upgrade() else {
            return;
        };
        if topics.closed.load(Ordering::Acquire) {
            return;
        }
        if let Err(error) = topics.discover().await {
            tracing::debug!(pattern = %topics.pattern.text, %error, "discovery failed");
        }
    }
}

/// One subscription over the topics matching a pattern ([`PatternConsumer::builder`]): their
/// messages come through one [`PatternConsumer::receive`], each acknowledged through the
/// topic's consumer.
#[derive(Debug)]
pub struct PatternConsumer {
    topics: Arc<Topics>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Result<Message, Error>>>,
    follow: Option<JoinHandle<()>>,
    /// The error a batch receive met after gathering messages, for the next one.
    deferred: Mutex<Option<Error>>,
}

impl PatternConsumer {
    pub(crate) async fn subscribe(
        pool: &Pool,
        pattern: &str,
        subscription: &str,
        options: PatternOptions,
    ) -> Result<Self, Error> {
        options.validate()?;
        options.consumer.validate()?;
        if subscription.is_empty() {
            return Err(Error::Invalid {
                what: "subscription",
                reason: "the name is empty".into(),
            });
        }
        let pattern = Pattern::parse(pattern)?;
        // Room for a message per topic consumer's forwarding task, and as many waiting.
        let (tx, rx) = mpsc::channel(64);
        let discovery = options.discovery;
        let topics = Arc::new(Topics {
            pool: pool.clone(),
            pattern,
            subscription: subscription.to_owned(),
            options,
            consumers: RwLock::new(BTreeMap::new()),
            tasks: Mutex::new(BTreeMap::new()),
            tx: Mutex::new(Some(tx)),
            discovering: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            retired: Mutex::new(Retired::default()),
            links: watch::Sender::new(LinkStates::default()),
            watchers: Mutex::new(BTreeMap::new()),
        });
        if let Err(error) = topics.discover().await {
            let _ = close_all(&topics, crate::DEFAULT_CLOSE_DEADLINE).await;
            return Err(error);
        }
        let follow = discovery.map(|every| tokio::spawn(follow(Arc::downgrade(&topics), every)));
        Ok(Self {
            topics,
            rx: tokio::sync::Mutex::new(rx),
            follow,
            deferred: Mutex::new(None),
        })
    }

    /// The next message of any matching topic.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`PatternConsumer::close`]; what a topic's
    /// [`Consumer::receive`] returns.
    pub async fn receive(&self) -> Result<Message, Error> {
        if self.topics.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the pattern consumer"));
        }
        let mut rx = self.rx.lock().await;
        match rx.recv().await {
            Some(received) => received,
            None => Err(Error::Closed("the pattern consumer")),
        }
    }

    /// The messages as a [`futures_util::Stream`] ([`crate::Messages`]).
    pub fn stream(&self) -> crate::Messages<'_> {
        crate::Messages::new(self)
    }

    /// Receives a batch, as [`Consumer::batch_receive`].
    ///
    /// # Errors
    /// As [`Consumer::batch_receive`].
    pub async fn batch_receive(&self, limits: crate::BatchReceive) -> Result<Vec<Message>, Error> {
        crate::receiving::batch_receive(self, limits, &self.deferred).await
    }

    /// The consumer of the topic `message` came from.
    fn owner(&self, message: &Message) -> Result<Arc<Consumer>, Error> {
        let key = message.origin.consumer;
        self.topics
            .consumers
            .read()
            .values()
            .find(|consumer| consumer.key() == key)
            .cloned()
            .ok_or_else(|| Error::Invalid {
                what: "message",
                reason: format!(
                    "{} is not a message of this pattern consumer's topics now (another \
                     consumer's, or of a topic that is gone)",
                    message.id()
                ),
            })
    }

    /// Acknowledges a message, as [`Consumer::ack`].
    ///
    /// # Errors
    /// [`Error::Invalid`] for a message of another consumer or of a topic gone; as
    /// [`Consumer::ack`].
    pub async fn ack(&self, message: &Message) -> Result<(), Error> {
        self.owner(message)?.ack(message).await
    }

    /// Acknowledges a message in a transaction, as [`Consumer::ack_in`].
    ///
    /// # Errors
    /// As [`PatternConsumer::ack`] and [`Consumer::ack_in`].
    pub async fn ack_in(&self, txn: &Transaction, message: &Message) -> Result<(), Error> {
        self.owner(message)?.ack_in(txn, message).await
    }

    /// Gives a message back for a new delivery, as [`Consumer::nack`].
    ///
    /// # Errors
    /// As [`PatternConsumer::ack`] and [`Consumer::nack`].
    pub fn nack(&self, message: &Message) -> Result<(), Error> {
        self.owner(message)?.nack(message)
    }

    /// Sends the acks queued on every topic's consumer.
    pub async fn flush_acks(&self) {
        let consumers: Vec<Arc<Consumer>> =
            self.topics.consumers.read().values().cloned().collect();
        for consumer in consumers {
            consumer.flush_acks().await;
        }
    }

    /// Lists the namespace now: subscribes the matching topics that appeared and closes the
    /// consumers of those gone. Returns the topics subscribed.
    ///
    /// # Errors
    /// [`Error::Closed`]; the listing's or a subscription's errors (topics subscribed before
    /// the failure stay).
    pub async fn discover(&self) -> Result<Vec<String>, Error> {
        self.topics.discover().await
    }

    /// The topics subscribed now (full names; a partitioned topic by its own name).
    pub fn topics(&self) -> Vec<String> {
        self.topics.consumers.read().keys().cloned().collect()
    }

    /// The pattern, as given.
    pub fn pattern(&self) -> &str {
        &self.topics.pattern.text
    }

    /// The counters of the topics' consumers (see [`Consumer::stats`]), summed: every counter
    /// is the sum over the consumers of every topic subscribed since the subscription, those
    /// of topics gone since (and, after [`PatternConsumer::close`], of every topic) included,
    /// so that no counter goes back. The flags `closed_by_broker` and `reached_end_of_topic`
    /// say whether they hold for any topic subscribed now.
    pub fn stats(&self) -> ConsumerStats {
        self.topics.stats()
    }

    /// The link states: one entry per topic subscribed now, in the order of
    /// [`PatternConsumer::topics`], each the [`LinkStates::overall`] state of the topic's
    /// consumer (the worst of its partitions, with its attempt and cause; see
    /// [`Consumer::state`]). A topic that comes adds an entry, one that is gone takes its
    /// entry away (its consumer's close is not the pattern consumer's). So
    /// [`LinkStates::overall`] is [`LinkState::Failed`] or [`LinkState::Reconnecting`] when
    /// any topic's consumer is, and [`LinkState::Connected`] when every one is connected or
    /// no topic matches; after [`PatternConsumer::close`] every entry is
    /// [`LinkState::Closed`] (one entry when no topic was subscribed).
    pub fn state(&self) -> watch::Receiver<LinkStates> {
        self.topics.links.subscribe()
    }

    /// Closes every topic's consumer (their acks go out first, all within `deadline`) and
    /// stops discovering. The report sums the consumers' reports ([`Consumer::close`]).
    ///
    /// # Errors
    /// The first consumer's close error; every consumer is closed anyway.
    pub async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        if let Some(follow) = &self.follow {
            follow.abort();
        }
        let _serial = self.topics.discovering.lock().await;
        close_all(&self.topics, deadline).await
    }
}

/// Marks the consumer closed and closes every topic's consumer.
async fn close_all(
    topics: &Topics,
    deadline: std::time::Duration,
) -> Result<crate::ConsumerCloseReport, Error> {
    let started = tokio::time::Instant::now();
    topics.closed.store(true, Ordering::Release);
    topics.tx.lock().take();
    for (_, task) in std::mem::take(&mut *topics.tasks.lock()) {
        task.abort();
    }
    for (_, task) in std::mem::take(&mut *topics.watchers.lock()) {
        task.abort();
    }
    let consumers: Vec<Arc<Consumer>> = {
        let mut subscribed = topics.consumers.write();
        let mut retired = topics.retired.lock();
        let consumers: Vec<_> = std::mem::take(&mut *subscribed).into_values().collect();
        retired.closing.extend(consumers.iter().cloned());
        consumers
    };
    let mut result = Ok(());
    let mut report = crate::ConsumerCloseReport::default();
    for consumer in &consumers {
        match consumer
            .close(crate::close::remaining(deadline, started))
            .await
        {
            Ok(closed) => report.add(&closed),
            Err(error) if result.is_ok() => result = Err(error),
            Err(_) => {}
        }
        topics.retire(consumer);
    }
    topics.links.send_modify(|links| {
        let closed = links.partitions().len().max(1);
        *links = LinkStates::from_states(vec![LinkState::Closed; closed]);
    });
    result.map(|()| report)
}

impl Drop for PatternConsumer {
    fn drop(&mut self) {
        if let Some(follow) = &self.follow {
            follow.abort();
        }
        for task in self.topics.tasks.lock().values() {
            task.abort();
        }
        for task in self.topics.watchers.lock().values() {
            task.abort();
        }
    }
}

#[crate::async_trait]
impl crate::MessageConsumer for PatternConsumer {
    async fn receive(&self) -> Result<Message, Error> {
        PatternConsumer::receive(self).await
    }

    async fn ack(&self, message: &Message) -> Result<(), Error> {
        PatternConsumer::ack(self, message).await
    }

    fn nack(&self, message: &Message) -> Result<(), Error> {
        PatternConsumer::nack(self, message)
    }

    /// Discovers the namespace's topics again; returns how many are subscribed.
    async fn refresh_partitions(&self) -> Result<usize, Error> {
        Ok(self.discover().await?.len())
    }

    async fn close(
        &self,
        deadline: std::time::Duration,
    ) -> Result<crate::ConsumerCloseReport, Error> {
        PatternConsumer::close(self, deadline).await
    }

    fn has_ended(&self) -> bool {
        self.topics.closed.load(Ordering::Acquire)
    }

    fn topic(&self) -> &str {
        self.pattern()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_a_namespace_and_match_whole_names() {
        let pattern = Pattern::parse("persistent://public/default/orders-.*").unwrap();
        assert_eq!(pattern.namespace, "public/default");
        assert!(pattern.matches("persistent://public/default/orders-eu"));
        assert!(pattern.matches("persistent://public/default/orders-eu-partition-3"));
        assert!(!pattern.matches("persistent://public/default/my-orders-eu"));
        assert!(!pattern.matches("persistent://public/other/orders-eu"));
        let bare = Pattern::parse("public/default/(a|b)").unwrap();
        assert!(bare.matches("persistent://public/default/a"));
        assert!(bare.matches("persistent://public/default/b"));
        assert!(!bare.matches("persistent://public/default/ab"));
        // As with the Java client, the whole name matches the whole pattern: an alternation
        // outside a group takes the namespace into its first branch only.
        let loose = Pattern::parse("public/default/a|b").unwrap();
        assert!(loose.matches("persistent://public/default/a"));
        assert!(!loose.matches("persistent://public/default/b"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "orders-.*",
            "public/orders",
            "public/.*/orders",
            "persistent://public/default/",
            "persistent://public/default/orders-(",
        ] {
            assert!(
                matches!(
                    Pattern::parse(bad),
                    Err(Error::Invalid {
                        what: "pattern",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn options_are_checked() {
        let options = PatternOptions::new(ConsumerOptions::default());
        assert!(options.validate().is_ok());
        assert!(
            options
                .clone()
                .discovery_interval(Some(Duration::ZERO))
                .validate()
                .is_err()
        );
        assert!(options.clone().discovery_interval(None).validate().is_ok());
        let retry = PatternOptions::new(ConsumerOptions::default().enable_retry(true));
        assert!(retry.validate().is_err());
    }
}
