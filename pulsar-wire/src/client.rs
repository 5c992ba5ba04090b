//! [`Client`]: connections per broker, topic lookups and partitioned metadata, and the factory
//! of producers, consumers and the transaction coordinator client.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::backoff::Backoff;
use crate::connection::LookupAnswer;
use crate::consumer::{Consumer, ConsumerOptions};
use crate::pb::ServerError;
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

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

struct ClientInner {
    options: ConnectOptions,
    /// Connections by `host:port`, each behind its own lock: one connect in flight per
    /// address, and an unreachable broker delays only the calls that need it.
    connections: parking_lot::Mutex<HashMap<String, Slot>>,
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
                connections: parking_lot::Mutex::new(HashMap::new()),
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

    /// Looks `topic` up and returns a connection to the broker that serves it.
    ///
    /// Follows redirects as the brokers give them (with their `authoritative` flag, so that
    /// a broker that was told it decides takes the topic: a fresh cluster's brokers otherwise
    /// send an unowned bundle back and forth), uses the service URL when a proxy serves the
    /// topic, and to the brokers' `brokerServiceUrlTls` when the client uses TLS. A broker
    /// that is not ready or is moving the topic (`ServiceNotReady`, `TooManyRequests`, "being
    /// unloaded") is asked again after a backoff ([`crate::backoff`]), within the operation
    /// timeout.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses the lookup (for example `TopicNotFound`, or
    /// `ServiceNotReady` still at the operation timeout); [`Error::Invalid`] when a TLS client
    /// is sent to a broker without a TLS URL, or after more than 8 redirects; connection
    /// errors.
    pub async fn lookup(&self, topic: &str) -> Result<Connection, Error> {
        let topic = topic_name(topic)?;
        let deadline = tokio::time::Instant::now() + self.inner.options.operation_timeout;
        let mut backoff = Backoff::default();
        loop {
            match self.lookup_once(&topic).await {
                Err(error) if lookup_retryable(&error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay >= deadline {
                        return Err(error);
                    }
                    tracing::debug!(%topic, %error, ?delay, "lookup refused for now: asking again");
                    tokio::time::sleep(delay).await;
                }
                other => return other,
            }
        }
    }

    async fn lookup_once(&self, topic: &str) -> Result<Connection, Error> {
        let mut connection = self.service_connection().await?;
        let mut authoritative = false;
        for _ in 0..MAX_REDIRECTS {
            match connection.lookup(topic, authoritative).await? {
                LookupAnswer::Here => return Ok(connection),
                LookupAnswer::ThroughServiceUrl => return self.service_connection().await,
                LookupAnswer::Connect(address) => return self.connection_to(&address).await,
                LookupAnswer::Redirect {
                    address,
                    authoritative: told,
                } => {
                    authoritative = told;
                    if address != connection.address() {
                        connection = self.connection_to(&address).await?;
                    }
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

    /// How long a request waits for its answer (and a lookup for a broker that is not ready).
    pub(crate) fn operation_timeout(&self) -> std::time::Duration {
        self.inner.options.operation_timeout
    }

    /// The client of the transaction coordinators (every one the cluster runs; transactions
    /// are spread over them), connected on first use.
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

    mod lookups {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;

        use futures_util::StreamExt;

        use crate::connection::fake_broker::{Peer, listen};
        use crate::pb::base_command::Type;
        use crate::pb::command_lookup_topic_response::LookupType;
        use crate::pb::{self, CommandLookupTopicResponse};
        use crate::{Client, ConnectOptions, Error, command_frame};

        type Answer = dyn Fn(&str, bool, usize) -> CommandLookupTopicResponse + Send + Sync;

        /// A broker that answers every LOOKUP with `answer(own address, authoritative, how
        /// many lookups it answered before)`.
        async fn lookup_broker(answer: Arc<Answer>) -> String {
            let (listener, address) = listen().await;
            let own = address.clone();
            let asked = Arc::new(AtomicUsize::new(0));
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (answer, own, asked) =
                        (Arc::clone(&answer), own.clone(), Arc::clone(&asked));
                    tokio::spawn(async move {
                        let mut peer = Peer::new(tcp);
                        peer.accept_connect().await;
                        while let Some(Ok(frame)) = peer.0.next().await {
                            let Some(lookup) = frame.command.lookup_topic else {
                                continue;
                            };
                            let n = asked.fetch_add(1, Ordering::SeqCst);
                            let mut response =
                                answer(&own, lookup.authoritative.unwrap_or(false), n);
                            response.request_id = lookup.request_id;
                            peer.send(command_frame(Type::LookupResponse, |c| {
                                c.lookup_topic_response = Some(response);
                            }))
                            .await;
                        }
                    });
                }
            });
            address
        }

        fn options(address: &str) -> ConnectOptions {
            ConnectOptions::new(&format!("pulsar://{address}"))
                .expect("valid")
                .operation_timeout(Duration::from_secs(5))
        }

        fn redirect(to: &str, authoritative: bool) -> CommandLookupTopicResponse {
            CommandLookupTopicResponse {
                broker_service_url: Some(format!("pulsar://{to}")),
                response: Some(LookupType::Redirect as i32),
                authoritative: Some(authoritative),
                ..Default::default()
            }
        }

        fn connect(to: &str) -> CommandLookupTopicResponse {
            CommandLookupTopicResponse {
                broker_service_url: Some(format!("pulsar://{to}")),
                response: Some(LookupType::Connect as i32),
                authoritative: Some(true),
                ..Default::default()
            }
        }

        /// A fresh two-broker cluster: A (the service URL) redirects an unowned topic to B
        /// with `authoritative`; B, asked without it, would send the lookup back to A (it is
        /// not the owner yet), and takes the topic when asked with it. The client follows
        /// the flag and ends at B. (Asking B without the flag, as before, bounced between
        /// them until "more than 8 redirects".)
        #[tokio::test]
        async fn an_authoritative_redirect_is_passed_on_so_a_fresh_cluster_settles() {
            let a_address = Arc::new(parking_lot::Mutex::new(String::new()));
            let back = Arc::clone(&a_address);
            let b = lookup_broker(Arc::new(move |own: &str, authoritative, _| {
                if authoritative {
                    connect(own)
                } else {
                    redirect(&back.lock(), false)
                }
            }))
            .await;
            let to_b = b.clone();
            let a = lookup_broker(Arc::new(move |_: &str, _, _| redirect(&to_b, true))).await;
            *a_address.lock() = a.clone();
            let client = Client::connect(options(&a)).await.expect("connected to A");
            let connection = client.lookup("fresh").await.expect("settled");
            assert_eq!(connection.address(), b);
        }

        /// One unreachable broker (it accepts the connection and never answers CONNECT)
        /// delays only the call that needs it: a lookup on the service URL meanwhile answers
        /// at once. (With one lock over every connect, it waited for the whole timeout.)
        #[tokio::test]
        async fn a_broker_that_does_not_answer_stalls_no_other_connection() {
            let (listener, silent) = listen().await;
            let (accepted, was_accepted) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.expect("accepted");
                let _ = accepted.send(());
                // Holds the connection open without a word.
                let _held = tcp;
                std::future::pending::<()>().await;
            });
            let a = lookup_broker(Arc::new(|own: &str, _, _| connect(own))).await;
            let client = Client::connect(options(&a).operation_timeout(Duration::from_secs(3)))
                .await
                .expect("connected to A");
            let stuck = {
                let client = client.clone();
                tokio::spawn(async move { client.connection_to(&silent).await })
            };
            was_accepted.await.expect("the silent broker was dialled");
            let answered =
                tokio::time::timeout(Duration::from_secs(1), client.lookup("elsewhere")).await;
            assert!(
                matches!(&answered, Ok(Ok(c)) if c.address() == a),
                "{answered:?}"
            );
            let error = stuck.await.expect("joined").expect_err("never answered");
            assert!(matches!(error, Error::Timeout { .. }), "{error}");
        }

        /// A broker moving the topic's bundle refuses lookups for a moment: the client asks
        /// again after a backoff and gets its answer; a refusal that lasts past the operation
        /// timeout is returned.
        #[tokio::test]
        async fn a_lookup_refused_while_a_bundle_moves_is_asked_again() {
            let unloading = |n: usize| CommandLookupTopicResponse {
                error: Some(if n == 0 {
                    pb::ServerError::ServiceNotReady as i32
                } else {
                    pb::ServerError::MetadataError as i32
                }),
                message: Some(
                    "Namespace bundle public/default/0x00000000_0x40000000 is being unloaded"
                        .into(),
                ),
                ..Default::default()
            };
            let a = lookup_broker(Arc::new(
                move |own: &str, _, n| {
                    if n < 2 { unloading(n) } else { connect(own) }
                },
            ))
            .await;
            let client = Client::connect(options(&a)).await.expect("connected");
            let connection = client
                .lookup("moving")
                .await
                .expect("answered at the third ask");
            assert_eq!(connection.address(), a);

            let never = lookup_broker(Arc::new(|_: &str, _, _| CommandLookupTopicResponse {
                error: Some(pb::ServerError::ServiceNotReady as i32),
                message: Some("not ready".into()),
                ..Default::default()
            }))
            .await;
            let client = Client::connect(options(&never).operation_timeout(Duration::from_secs(1)))
                .await
                .expect("connected");
            let started = tokio::time::Instant::now();
            let error = client.lookup("never").await.expect_err("still not ready");
            assert_eq!(error.server_error(), Some(pb::ServerError::ServiceNotReady));
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{:?}",
                started.elapsed()
            );
            let refused = lookup_broker(Arc::new(|_: &str, _, _| CommandLookupTopicResponse {
                error: Some(pb::ServerError::TopicNotFound as i32),
                message: Some("no such topic".into()),
                ..Default::default()
            }))
            .await;
            let client = Client::connect(options(&refused)).await.expect("connected");
            let error = client.lookup("missing").await.expect_err("not found");
            assert!(matches!(error, Error::Server { .. }), "{error}");
        }
    }
}
