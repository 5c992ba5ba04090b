//! The connection pool and lookups under producers, consumers and transactions: one
//! connection per broker, topic lookups with their redirects, partitioned metadata, and the
//! names of topics and partitions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::backoff;
use crate::connection::{ConnectOptions, Connection, LookupAnswer};
use crate::error::Error;
use crate::pb::ServerError;

/// The longest chain of lookup redirects followed.
const MAX_REDIRECTS: usize = 8;

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

/// The connections of a client, one per broker, and the lookups that find them. Cheap to
/// clone: producers, consumers and transactions each hold one.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    options: ConnectOptions,
    /// Connections by `host:port`, each behind its own lock: one connect in flight per
    /// address, and an unreachable broker delays only the calls that need it.
    connections: parking_lot::Mutex<HashMap<String, Slot>>,
    /// Set by [`Pool::close`]: no connection is opened any more.
    closed: AtomicBool,
    /// The service host that answered last (an index into the multi-host URL's hosts).
    service_host: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("service", &self.inner.options.address())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool with no connection yet.
    pub(crate) fn new(options: ConnectOptions) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                options,
                connections: parking_lot::Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
                service_host: std::sync::atomic::AtomicUsize::new(0),
            }),
        }
    }

    /// The options the client was created with.
    pub(crate) fn options(&self) -> &ConnectOptions {
        &self.inner.options
    }

    /// The connection to the service URL, opened again if it was lost. A multi-host URL's
    /// hosts are tried in turn, from the one that answered last, until one connects.
    pub(crate) async fn service_connection(&self) -> Result<Connection, Error> {
        let options = &self.inner.options;
        let hosts: Vec<&str> = std::iter::once(options.address())
            .chain(options.other_hosts.iter().map(String::as_str))
            .collect();
        let first = self.inner.service_host.load(Ordering::Relaxed) % hosts.len();
        let mut last_error = None;
        for turn in 0..hosts.len() {
            let index = (first + turn) % hosts.len();
            match self.connection_to(hosts[index]).await {
                Ok(connection) => {
                    self.inner.service_host.store(index, Ordering::Relaxed);
                    return Ok(connection);
                }
                Err(error @ Error::Closed(_)) => return Err(error),
                Err(error) => {
                    tracing::debug!(host = hosts[index], %error, "a service host did not answer");
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or(Error::Closed("the client")))
    }

    /// The connection to a broker at `host:port`, opened if there is none (or it was lost).
    pub(crate) async fn connection_to(&self, address: &str) -> Result<Connection, Error> {
        self.check_open()?;
        let slot = Arc::clone(
            self.inner
                .connections
                .lock()
                .entry(address.to_owned())
                .or_default(),
        );
        let mut slot = slot.lock().await;
        if let Some(connection) = slot.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        let options = ConnectOptions {
            address: address.to_owned(),
            ..self.inner.options.clone()
        };
        let connection = Connection::connect(&options).await?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// [`Error::Closed`] once the client was closed.
    pub(crate) fn check_open(&self) -> Result<(), Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the client (Client::close was called)"));
        }
        Ok(())
    }

    /// Looks `topic` up and returns a connection to the broker that serves it.
    ///
    /// Follows redirects as the brokers give them (with their `authoritative` flag, so that
    /// a broker that was told it decides takes the topic: a fresh cluster's brokers otherwise
    /// send an unowned bundle back and forth), uses the service URL when a proxy serves the
    /// topic, and to the brokers' `brokerServiceUrlTls` when the client uses TLS. A broker
    /// that is not ready or is moving the topic (`ServiceNotReady`, `TooManyRequests`, "being
    /// unloaded"), or that the lookup names but that cannot be reached (it was killed, and
    /// the cluster has not moved its topics yet), is asked again after a backoff
    /// ([`crate::backoff`]) with a fresh lookup, within the operation timeout.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses the lookup (for example `TopicNotFound`, or
    /// `ServiceNotReady` still at the operation timeout); [`Error::Invalid`] when a TLS client
    /// is sent to a broker without a TLS URL, or after more than 8 redirects; connection
    /// errors.
    pub(crate) async fn lookup(&self, topic: &str) -> Result<Connection, Error> {
        let topic = topic_name(topic)?;
        let deadline = tokio::time::Instant::now() + self.inner.options.operation_timeout;
        let mut backoff = backoff::lookups();
        loop {
            match self.lookup_once(&topic).await {
                Err((error, unreachable)) if unreachable || lookup_retryable(&error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay >= deadline {
                        return Err(error);
                    }
                    tracing::debug!(%topic, %error, ?delay, "lookup refused for now: asking again");
                    tokio::time::sleep(delay).await;
                }
                other => return other.map_err(|(error, _)| error),
            }
        }
    }

    /// The connection to serve `topic` on: to `assigned` (the broker a close named, PIP-307)
    /// when given and reachable, without a lookup; else [`Pool::lookup`]'s.
    pub(crate) async fn connection_for(
        &self,
        topic: &str,
        assigned: Option<&str>,
    ) -> Result<Connection, Error> {
        if let Some(address) = assigned {
            match self.connection_to(address).await {
                Ok(connection) => return Ok(connection),
                Err(error) => {
                    tracing::debug!(%topic, %address, %error, "the assigned broker cannot be reached: looking the topic up");
                }
            }
        }
        self.lookup(topic).await
    }

    /// One lookup; a failure says whether it was reaching a broker the lookup named (a
    /// broker killed is named until the cluster gives its topics to another: asked again).
    async fn lookup_once(&self, topic: &str) -> Result<Connection, (Error, bool)> {
        let named = |error: Error| {
            let unreachable = matches!(
                error,
                Error::ConnectionLost { .. } | Error::Io(_) | Error::Timeout { .. }
            );
            (error, unreachable)
        };
        let mut connection = self.service_connection().await.map_err(|e| (e, false))?;
        let mut authoritative = false;
        for _ in 0..MAX_REDIRECTS {
            match connection
                .lookup(topic, authoritative)
                .await
                .map_err(|e| (e, false))?
            {
                LookupAnswer::Here => return Ok(connection),
                LookupAnswer::ThroughServiceUrl => {
                    return self.service_connection().await.map_err(|e| (e, false));
                }
                LookupAnswer::Connect(address) => {
                    return self.connection_to(&address).await.map_err(named);
                }
                LookupAnswer::Redirect {
                    address,
                    authoritative: told,
                } => {
                    authoritative = told;
                    if address != connection.address() {
                        connection = self.connection_to(&address).await.map_err(named)?;
                    }
                }
            }
        }
        Err((
            Error::Invalid {
                what: "lookup",
                reason: format!("{topic}: more than {MAX_REDIRECTS} redirects"),
            },
            false,
        ))
    }

    /// The number of partitions of `topic` (0 when it is not partitioned).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses; connection errors.
    pub(crate) async fn partitions(&self, topic: &str) -> Result<u32, Error> {
        let topic = topic_name(topic)?;
        self.service_connection().await?.partitions(&topic).await
    }

    /// The topics of a namespace (see `Connection::topics_of_namespace`).
    pub(crate) async fn topics_of_namespace(
        &self,
        namespace: &str,
        mode: crate::pb::command_get_topics_of_namespace::Mode,
        pattern: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        self.service_connection()
            .await?
            .topics_of_namespace(namespace, mode, pattern)
            .await
    }

    /// The full names of the topics to attach to: `topic` itself when it is not partitioned,
    /// else one per partition (`<topic>-partition-<i>`).
    pub(crate) async fn partition_topics(&self, topic: &str) -> Result<Vec<String>, Error> {
        let topic = topic_name(topic)?;
        let partitions = self.partitions(&topic).await?;
        if partitions == 0 {
            return Ok(vec![topic]);
        }
        Ok((0..partitions)
            .map(|i| partition_topic(&topic, i))
            .collect())
    }

    /// How long a request waits for its answer (and a lookup for a broker that is not ready).
    pub(crate) fn operation_timeout(&self) -> std::time::Duration {
        self.inner.options.operation_timeout
    }

    /// Closes every connection (see [`Client::close`](crate::Client::close)).
    pub(crate) async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let slots: Vec<Slot> = self
            .inner
            .connections
            .lock()
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            if let Some(connection) = slot.lock().await.take() {
                connection.close();
            }
        }
    }
}

/// Whether a lookup refused this way may succeed a little later: the broker is starting, is
/// moving the topic's bundle, or sheds load.
fn lookup_retryable(error: &Error) -> bool {
    error.is_bundle_moving()
        || matches!(
            error,
            Error::Server { code, .. }
                if matches!(
                    ServerError::try_from(*code),
                    Ok(ServerError::ServiceNotReady | ServerError::TooManyRequests)
                )
        )
}

/// The full name of a topic: `persistent://public/default/<name>` for a bare name,
/// `persistent://<tenant>/<namespace>/<name>` for a three-part one, unchanged for a full one.
///
/// # Errors
/// [`Error::Invalid`] for an empty name, an unknown domain, or the wrong number of parts.
pub fn topic_name(topic: &str) -> Result<String, Error> {
    let invalid = |reason: &str| Error::Invalid {
        what: "topic name",
        reason: format!("{topic:?}: {reason}"),
    };
    let topic = topic.trim();
    if topic.is_empty() {
        return Err(invalid("empty"));
    }
    let (domain, rest) = match topic.split_once("://") {
        Some((domain @ ("persistent" | "non-persistent"), rest)) => (domain, rest),
        Some(_) => {
            return Err(invalid(
                "the domain is not persistent:// or non-persistent://",
            ));
        }
        None => ("persistent", topic),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(invalid("a part of the name is empty"));
    }
    match parts.len() {
        1 if !topic.contains("://") => Ok(format!("persistent://public/default/{rest}")),
        3 => Ok(format!("{domain}://{rest}")),
        _ => Err(invalid(
            "expected <name>, <tenant>/<namespace>/<name> or <domain>://<tenant>/<namespace>/<name>",
        )),
    }
}

/// The name of partition `index` of a partitioned topic.
pub fn partition_topic(topic: &str, index: u32) -> String {
    format!("{topic}-partition-{index}")
}

/// The topic a partition belongs to (`topic` itself when it names no partition).
pub(crate) fn base_topic(topic: &str) -> &str {
    match topic.rfind("-partition-") {
        Some(at) if topic[at + 11..].parse::<u32>().is_ok() => &topic[..at],
        _ => topic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_suffixes_come_off() {
        assert_eq!(
            base_topic("persistent://p/n/t-partition-3"),
            "persistent://p/n/t"
        );
        assert_eq!(base_topic("persistent://p/n/t"), "persistent://p/n/t");
        assert_eq!(
            base_topic("persistent://p/n/t-partition-x"),
            "persistent://p/n/t-partition-x"
        );
    }

    #[test]
    fn topic_names_are_completed() {
        assert_eq!(
            topic_name("orders").unwrap(),
            "persistent://public/default/orders"
        );
        assert_eq!(
            topic_name("t/ns/orders").unwrap(),
            "persistent://t/ns/orders"
        );
        assert_eq!(
            topic_name("non-persistent://t/ns/x").unwrap(),
            "non-persistent://t/ns/x"
        );
        for bad in [
            "",
            "a/b",
            "http://t/ns/x",
            "persistent://x",
            "t//x",
            "a/b/c/d",
        ] {
            assert!(topic_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            partition_topic("persistent://public/default/o", 2),
            "persistent://public/default/o-partition-2"
        );
    }
}
