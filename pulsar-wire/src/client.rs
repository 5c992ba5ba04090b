//! [`Client`]: connections per broker, topic lookups and partitioned metadata, and the factory
//! of producers, consumers and the transaction coordinator client.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex, OnceCell};

use crate::consumer::{Consumer, ConsumerOptions};
use crate::producer::{Producer, ProducerOptions};
use crate::txn::TransactionCoordinator;
use crate::{ConnectOptions, Connection, Error};

/// The longest chain of lookup redirects followed.
const MAX_REDIRECTS: usize = 8;

/// A Pulsar client: one connection per broker, shared by the producers and consumers it
/// creates. Cheap to clone.
///
/// Connections are opened on demand and opened again on the next use after they were lost;
/// producers and consumers created on a lost connection are not re-created (they report the
/// loss to their callers).
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    options: ConnectOptions,
    /// Connections by `host:port`.
    connections: Mutex<HashMap<String, Connection>>,
    coordinator: OnceCell<TransactionCoordinator>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.inner.options.address())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the service URL (the `CONNECT` handshake happens here, so an unreachable
    /// broker is reported at once).
    ///
    /// # Errors
    /// As [`Connection::connect`]: [`Error::ConnectionLost`] when nothing answers at the
    /// address, [`Error::Tls`], [`Error::Authentication`] when the broker refuses the token,
    /// [`Error::Server`], [`Error::Timeout`].
    pub async fn connect(options: ConnectOptions) -> Result<Self, Error> {
        let client = Self {
            inner: Arc::new(ClientInner {
                options,
                connections: Mutex::new(HashMap::new()),
                coordinator: OnceCell::new(),
            }),
        };
        client.service_connection().await?;
        Ok(client)
    }

    /// The options the client was created with.
    pub fn options(&self) -> &ConnectOptions {
        &self.inner.options
    }

    /// The connection to the service URL, opened again if it was lost.
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub async fn service_connection(&self) -> Result<Connection, Error> {
        self.connection_to(self.inner.options.address()).await
    }

    /// The connection to a broker at `host:port`, opened if there is none (or it was lost).
    async fn connection_to(&self, address: &str) -> Result<Connection, Error> {
        let mut connections = self.inner.connections.lock().await;
        if let Some(connection) = connections.get(address)
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        let options = ConnectOptions {
            address: address.to_owned(),
            ..self.inner.options.clone()
        };
        let connection = Connection::connect(&options).await?;
        connections.insert(address.to_owned(), connection.clone());
        Ok(connection)
    }

    /// Looks `topic` up and returns a connection to the broker that serves it (following
    /// redirects to the brokers' `brokerServiceUrlTls` when the client uses TLS).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses the lookup (for example `TopicNotFound` or
    /// `ServiceNotReady`); [`Error::Invalid`] when a TLS client is sent to a broker without
    /// a TLS URL; connection errors.
    pub async fn lookup(&self, topic: &str) -> Result<Connection, Error> {
        let topic = topic_name(topic)?;
        let mut connection = self.service_connection().await?;
        for _ in 0..MAX_REDIRECTS {
            match connection.lookup(&topic).await? {
                None => return Ok(connection),
                Some(url) => {
                    let address = crate::connection::parse_service_url(&url)?.address;
                    if address == connection.address() {
                        return Ok(connection);
                    }
                    connection = self.connection_to(&address).await?;
                }
            }
        }
        Err(Error::Invalid {
            what: "lookup",
            reason: format!("{topic}: more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// The number of partitions of `topic` (0 when it is not partitioned).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses; connection errors.
    pub async fn partitions(&self, topic: &str) -> Result<u32, Error> {
        let topic = topic_name(topic)?;
        self.service_connection().await?.partitions(&topic).await
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

    /// Creates a producer on `topic` (every partition of a partitioned topic).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` when topic
    /// auto-creation is off); [`Error::Invalid`] for bad options; connection errors.
    pub async fn create_producer(
        &self,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Producer, Error> {
        Producer::create(self, topic, options).await
    }

    /// Subscribes to `topic` (every partition of a partitioned topic) as `subscription`.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses (for example `TopicNotFound` or
    /// `ConsumerBusy`); [`Error::Invalid`] for bad options; connection errors.
    pub async fn subscribe(
        &self,
        topic: &str,
        subscription: &str,
        options: ConsumerOptions,
    ) -> Result<Consumer, Error> {
        Consumer::subscribe(self, topic, subscription, options).await
    }

    /// The transaction coordinator client (coordinator 0), connected on first use.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker has no transaction coordinator (for example
    /// `TransactionCoordinatorNotFound` or `NotAllowedError`); connection errors.
    pub async fn transaction_coordinator(&self) -> Result<&TransactionCoordinator, Error> {
        self.inner
            .coordinator
            .get_or_try_init(|| TransactionCoordinator::connect(self))
            .await
    }

    /// Closes every connection; producers, consumers and transactions on them fail with
    /// [`Error::Closed`] or [`Error::ConnectionLost`] from then on. Close producers and
    /// consumers first to flush what they hold.
    pub async fn close(&self) {
        for (_, connection) in self.inner.connections.lock().await.drain() {
            connection.close();
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
