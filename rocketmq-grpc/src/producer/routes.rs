//! The route cache of the producer (writable queues) and of the simple consumer (readable
//! queues of the leader brokers): queues per topic, refreshed when a send fails (the
//! route is marked stale) and periodically, with at most one `QueryRoute` in flight per topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::pb::{self, Code};
use crate::{Error, Session};

/// How often every cached route is refreshed (the Java client's route cache period, 30 s).
pub(crate) const ROUTE_REFRESH_EVERY: Duration = Duration::from_secs(30);

/// A stale route is queried again at most this often, so that an outage does not turn every
/// failed send into a `QueryRoute`.
pub(crate) const STALE_RETRY_EVERY: Duration = Duration::from_secs(1);

/// The usable queues of one topic (writable, or readable for [`Routes::readable`]).
pub(crate) type Route = Arc<Vec<pb::MessageQueue>>;

#[derive(Debug)]
struct Entry {
    route: Route,
    stale: bool,
}

#[derive(Debug, Default)]
struct Topic {
    entry: Option<Entry>,
    /// When the last query (successful or not) started.
    last_query: Option<Instant>,
    /// Bumped by every query that completed, so a waiter can see one ran while it waited.
    generation: u64,
}

/// The route cache.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    topics: Mutex<HashMap<String, Topic>>,
    /// One async lock per topic: whoever holds it is the one `QueryRoute` in flight.
    refresh: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Completed `QueryRoute` calls (for tests and stats).
    pub(crate) queries: std::sync::atomic::AtomicU64,
    /// Keeps the readable queues of the leader brokers instead of the writable queues.
    readable: bool,
}

impl Routes {
    /// A cache of the queues a consumer receives from: readable, on a leader broker (id 0),
    /// as the Java simple consumer picks them.
    pub(crate) fn readable() -> Self {
        Self {
            readable: true,
            ..Self::default()
        }
    }

    /// The route of `topic`: the cached one unless it is missing or stale, else a fresh one.
    /// A stale route is kept (and returned) when querying again fails or was tried less than
    /// [`STALE_RETRY_EVERY`] ago, so that sends keep trying the queues they know.
    pub(crate) async fn get(&self, session: &Session, topic: &str) -> Result<Route, Error> {
        let generation = {
            let topics = self.topics.lock();
            match topics.get(topic) {
                Some(t) => match &t.entry {
                    Some(e) if !e.stale => return Ok(Arc::clone(&e.route)),
                    Some(e)
                        if t.last_query
                            .is_some_and(|q| q.elapsed() < STALE_RETRY_EVERY) =>
                    {
                        return Ok(Arc::clone(&e.route));
                    }
                    _ => t.generation,
                },
                None => 0,
            }
        };
        self.refresh(session, topic, Some(generation)).await
    }

    /// Queries the route of `topic` and caches it. With `seen = Some(generation)`, a query
    /// that completed after the caller looked (another caller's) is used instead of a new one.
    pub(crate) async fn refresh(
        &self,
        session: &Session,
        topic: &str,
        seen: Option<u64>,
    ) -> Result<Route, Error> {
        let lock = Arc::clone(self.refresh.lock().entry(topic.to_owned()).or_default());
        let _in_flight = lock.lock().await;
        if let Some(seen) = seen {
            let topics = self.topics.lock();
            if let Some(t) = topics.get(topic)
                && t.generation != seen
                && let Some(e) = &t.entry
            {
                return Ok(Arc::clone(&e.route));
            }
        }
        self.topics
            .lock()
            .entry(topic.to_owned())
            .or_default()
            .last_query = Some(Instant::now());
        let result = query_route(session, topic, self.readable).await;
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut topics = self.topics.lock();
        let t = topics.entry(topic.to_owned()).or_default();
        t.generation += 1;
        match result {
            Ok(route) => {
                t.entry = Some(Entry {
                    route: Arc::clone(&route),
                    stale: false,
                });
                Ok(route)
            }
            Err(error) => match &t.entry {
                // A refresh that fails keeps the queues we know (still stale), TOPIC_NOT_FOUND
                // included: a real 5.3.3 name server answers it for a routed topic until the
                // restarted broker registers again (seen 25 s after a proxy restart).
                Some(e) if error.is_retryable() || is_topic_not_found(&error) => {
                    tracing::debug!(topic, %error, "QueryRoute failed; keeping the cached route");
                    Ok(Arc::clone(&e.route))
                }
                _ => Err(error),
            },
        }
    }

    /// Whether a route of `topic` was ever known (then TOPIC_NOT_FOUND means "not yet again").
    pub(crate) fn known(&self, topic: &str) -> bool {
        self.topics
            .lock()
            .get(topic)
            .is_some_and(|t| t.entry.is_some())
    }

    /// Marks the route of `topic` stale: the next send queries it again.
    pub(crate) fn mark_stale(&self, topic: &str) {
        if let Some(Topic { entry: Some(e), .. }) = self.topics.lock().get_mut(topic) {
            e.stale = true;
        }
    }

    /// The topics with a cached route.
    pub(crate) fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .topics
            .lock()
            .iter()
            .filter(|(_, t)| t.entry.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        topics.sort();
        topics
    }
}

async fn query_route(session: &Session, topic: &str, readable: bool) -> Result<Route, Error> {
    let access = session.access_point();
    let mut client = session.client(&access)?;
    let request = pb::QueryRouteRequest {
        topic: Some(session.resource(topic)),
        endpoints: Some(access.to_pb()),
    };
    let timeout = session.config().request_timeout;
    let response = client
        .query_route(session.request(request, timeout))
        .await
        .map_err(|status| session.access_failed(&access, Error::rpc("QueryRoute", status)));
    session.link().observe(&response);
    let response = response?.into_inner();
    Error::check("QueryRoute", response.status.as_ref())?;
    let wanted = if readable {
        pb::Permission::Read
    } else {
        pb::Permission::Write
    };
    let usable: Vec<_> = response
        .message_queues
        .into_iter()
        .filter(|q| {
            (q.permission == wanted as i32 || q.permission == pb::Permission::ReadWrite as i32)
                && (!readable || q.broker.as_ref().is_none_or(|b| b.id == 0))
        })
        .collect();
    if usable.is_empty() {
        let what = if readable { "readable" } else { "writable" };
        return Err(Error::Server {
            rpc: "QueryRoute",
            code: Code::TopicNotFound as i32,
            message: format!("topic {topic:?} has no {what} queue"),
        });
    }
    Ok(Arc::new(usable))
}

/// TOPIC_NOT_FOUND from the proxy.
pub(crate) fn is_topic_not_found(error: &Error) -> bool {
    error.code() == Some(crate::Code::TopicNotFound)
}
