//! Lite topics (RocketMQ 5.4+, RIP-83) as the 5.5.0 broker and proxy serve them, as far as
//! they were checked there (`tests/tests/rocketmq_v55.rs`): a lite message is stored on the
//! queue of its parent topic its lite topic hashes to and on a light queue of its own
//! (`%LMQ%$parent$lite`); a lite push consumer (`LITE_PUSH_CONSUMER`, of a group bound to the
//! parent) receives from the light queues of the lite topics it subscribed to with
//! `SyncLiteSubscription`, from the start of a light queue its group never read; its acks,
//! invisibility changes and dead-lettering name the lite topic.
//!
//! Not modelled (answered `NOT_IMPLEMENTED` naming them): subscriptions starting at `MAX`, at
//! an offset, at the last N messages or at a time. Lite topics never expire, and the server
//! never sends `NotifyUnsubscribeLiteCommand`.

use std::collections::{BTreeSet, HashMap, HashSet};

use parking_lot::{Mutex, RwLock};
use rocketmq_grpc::pb::{self, Code, LiteSubscriptionAction};

/// A refusal: the code and message the proxy answers with.
pub(crate) type Refusal = (Code, String);

fn refuse(code: Code, message: impl Into<String>) -> Refusal {
    (code, message.into())
}

/// The longest lite topic name (bytes), the proxy's default `maxLiteTopicSize`.
pub(crate) const MAX_LITE_TOPIC_SIZE: usize = 64;
/// The lite subscriptions one client may hold, the default `lite.sub.client.quota`.
pub(crate) const LITE_SUBSCRIPTION_QUOTA: usize = 2000;

/// Checks a lite topic name as the proxy does (`ILLEGAL_LITE_TOPIC` otherwise).
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("lite topic cannot be the char sequence of whitespace".into());
    }
    if name.len() > MAX_LITE_TOPIC_SIZE {
        return Err(format!(
            "lite topic exceed the max size {MAX_LITE_TOPIC_SIZE}"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(
            "lite topic can only contain alphanumeric characters, hyphens(-), and underscores(_)"
                .into(),
        );
    }
    Ok(())
}

/// The lite groups, clients, subscriptions and light queues.
#[derive(Debug, Default)]
pub(crate) struct LiteRegistry {
    /// Lite consumer group → its bind (parent) topic (`lite.bind.topic`).
    binds: RwLock<HashMap<String, String>>,
    /// Clients that announced themselves as lite push consumers.
    clients: Mutex<HashSet<String>>,
    /// (group, client) → the lite topics it subscribed to.
    subscriptions: Mutex<HashMap<(String, String), BTreeSet<String>>>,
}

impl LiteRegistry {
    /// Binds `group` to the lite topic `parent`.
    pub(crate) fn bind(&self, group: &str, parent: &str) {
        self.binds
            .write()
            .insert(group.to_owned(), parent.to_owned());
    }

    /// The parent topic `group` is bound to, for a lite group.
    pub(crate) fn bind_topic(&self, group: &str) -> Option<String> {
        self.binds.read().get(group).cloned()
    }

    /// Records the client type a client announced; the proxy's answer (`ILLEGAL_CONSUMER_GROUP`)
    /// when it does not match its group: a lite client of a regular group, or the other way.
    pub(crate) fn announce(
        &self,
        client_id: &str,
        group: &str,
        client_type: i32,
    ) -> Result<(), Refusal> {
        let lite = client_type == pb::ClientType::LitePushConsumer as i32;
        let bound = self.bind_topic(group).is_some();
        if lite && !bound {
            return Err(refuse(
                Code::IllegalConsumerGroup,
                format!("regular group cannot use LITE mode: {group}"),
            ));
        }
        let consumer = client_type == pb::ClientType::PushConsumer as i32
            || client_type == pb::ClientType::SimpleConsumer as i32;
        if consumer && bound {
            return Err(refuse(
                Code::IllegalConsumerGroup,
                format!("lite group must use LITE mode: {group}"),
            ));
        }
        let mut clients = self.clients.lock();
        if lite {
            clients.insert(client_id.to_owned());
        } else {
            clients.remove(client_id);
        }
        Ok(())
    }

    /// Whether the client announced itself as a lite push consumer.
    pub(crate) fn is_lite_client(&self, client_id: &str) -> bool {
        self.clients.lock().contains(client_id)
    }

    /// Forgets a client's subscriptions (it terminated).
    pub(crate) fn forget(&self, client_id: &str) {
        self.clients.lock().remove(client_id);
        self.subscriptions
            .lock()
            .retain(|(_, client), _| client != client_id);
    }

    /// The lite topics a client of `group` subscribed to.
    pub(crate) fn subscribed(&self, group: &str, client_id: &str) -> Vec<String> {
        self.subscriptions
            .lock()
            .get(&(group.to_owned(), client_id.to_owned()))
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Applies a `SyncLiteSubscription` of `client_id`.
    /// (`topic_exists`: whether its topic exists).
    pub(crate) fn sync(
        &self,
        topic_exists: bool,
        client_id: &str,
        req: &pb::SyncLiteSubscriptionRequest,
    ) -> Result<(), Refusal> {
        let group = req.group.as_ref().map_or("", |g| g.name.as_str());
        let topic = req.topic.as_ref().map_or("", |t| t.name.as_str());
        if !topic_exists {
            return Err(refuse(
                Code::TopicNotFound,
                format!("topic [{topic}] does not exist"),
            ));
        }
        match self.bind_topic(group) {
            Some(bind) if bind == topic => {}
            Some(bind) => {
                return Err(refuse(
                    Code::IllegalConsumerGroup,
                    format!("group {group} is bound to {bind}, not {topic}"),
                ));
            }
            None => {
                return Err(refuse(
                    Code::IllegalConsumerGroup,
                    format!("regular group cannot use LITE mode: {group}"),
                ));
            }
        }
        let action = LiteSubscriptionAction::try_from(req.action).map_err(|_| {
            refuse(
                Code::BadRequest,
                format!("unknown LiteSubscriptionAction: {}", req.action),
            )
        })?;
        if action == LiteSubscriptionAction::PartialAdd {
            for lite in &req.lite_topic_set {
                check_name(lite).map_err(|m| refuse(Code::IllegalLiteTopic, m))?;
            }
            if let Some(option) = req.offset_option.as_ref().and_then(|o| o.offset_type) {
                use pb::offset_option::{OffsetType, Policy};
                let supported = matches!(option, OffsetType::Policy(p)
                    if p == Policy::Min as i32 || p == Policy::Last as i32);
                if !supported {
                    return Err(refuse(
                        Code::NotImplemented,
                        format!(
                            "the emulator does not model SyncLiteSubscription from {option:?} \
                             (only from the start: MIN, LAST or none)"
                        ),
                    ));
                }
            }
        }
        let mut subscriptions = self.subscriptions.lock();
        let set = subscriptions
            .entry((group.to_owned(), client_id.to_owned()))
            .or_default();
        match action {
            LiteSubscriptionAction::PartialAdd => {
                let new = req
                    .lite_topic_set
                    .iter()
                    .filter(|lite| !set.contains(*lite))
                    .count();
                if set.len() + new > LITE_SUBSCRIPTION_QUOTA {
                    return Err(refuse(
                        Code::LiteSubscriptionQuotaExceeded,
                        format!("lite subscription quota {LITE_SUBSCRIPTION_QUOTA} exceeded"),
                    ));
                }
                set.extend(req.lite_topic_set.iter().cloned());
            }
            LiteSubscriptionAction::PartialRemove => {
                for lite in &req.lite_topic_set {
                    set.remove(lite);
                }
            }
            LiteSubscriptionAction::CompleteAdd => {
                *set = req.lite_topic_set.iter().cloned().collect();
            }
            LiteSubscriptionAction::CompleteRemove => set.clear(),
        }
        Ok(())
    }
}
