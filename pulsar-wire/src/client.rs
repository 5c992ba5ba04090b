//! [`Client`]: the facade over the connection pool ([`crate::pool`]) that creates producers,
//! consumers and the transaction coordinator client, each holding the pool, not the client.

use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::connection::{ConnectOptions, Connection};
use crate::error::Error;
use crate::pool::Pool;
use crate::txn::TransactionCoordinator;

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
    pool: Pool,
    coordinator: OnceCell<TransactionCoordinator>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.inner.pool.options().address())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects with `options`: what [`crate::ClientBuilder::build`] does.
    pub(crate) async fn open(options: ConnectOptions) -> Result<Self, Error> {
        options.validate()?;
        let client = Self {
            inner: Arc::new(ClientInner {
                pool: Pool::new(options),
                coordinator: OnceCell::new(),
            }),
        };
        client.service_connection().await?;
        Ok(client)
    }

    /// The options the client was created with.
    pub fn options(&self) -> &ConnectOptions {
        self.inner.pool.options()
    }

    /// The connection to the service URL, opened again if it was lost.
    ///
    /// # Errors
    /// As [`crate::ClientBuilder::build`].
    pub async fn service_connection(&self) -> Result<Connection, Error> {
        self.inner.pool.service_connection().await
    }

    /// Looks `topic` up and returns a connection to the broker that serves it.
    ///
    /// Follows redirects as the brokers give them (with their `authoritative` flag, so that
    /// a broker that was told it decides takes the topic: a fresh cluster's brokers otherwise
    /// send an unowned bundle back and forth), uses the service URL when a proxy serves the
    /// topic, and to the brokers' `brokerServiceUrlTls` when the client uses TLS. A broker
    /// that is not ready or is moving the topic (`ServiceNotReady`, `TooManyRequests`, "being
    /// unloaded") is asked again after a backoff (100 ms doubling up to 30 s, with jitter), within the operation
    /// timeout.
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses the lookup (for example `TopicNotFound`, or
    /// `ServiceNotReady` still at the operation timeout); [`Error::Invalid`] when a TLS client
    /// is sent to a broker without a TLS URL, or after more than 8 redirects; connection
    /// errors.
    pub async fn lookup(&self, topic: &str) -> Result<Connection, Error> {
        self.inner.pool.lookup(topic).await
    }

    /// The number of partitions of `topic` (0 when it is not partitioned).
    ///
    /// # Errors
    /// [`Error::Server`] when the broker refuses; connection errors.
    pub async fn partitions(&self, topic: &str) -> Result<u32, Error> {
        self.inner.pool.partitions(topic).await
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
            .get_or_try_init(|| TransactionCoordinator::connect(&self.inner.pool))
            .await
    }

    /// Closes the client: every connection is closed, and from then on creating a producer
    /// or consumer, sending, receiving, acknowledging and opening a transaction fail with
    /// [`Error::Closed`] (operations under way when it closes fail with
    /// [`Error::ConnectionLost`] or [`Error::Closed`]). Close producers and consumers first to
    /// flush what they hold.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    /// The pool the client's producers, consumers and transactions hang on.
    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }
}

#[cfg(test)]
mod tests {
    mod lookups {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;

        use futures_util::StreamExt;

        use crate::connection::fake_broker::{Peer, listen};
        use crate::pb::base_command::Type;
        use crate::pb::command_lookup_topic_response::LookupType;
        use crate::pb::{self, CommandLookupTopicResponse};
        use crate::{ClientBuilder, ConnectOptions, Error, command_frame};

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
            let client = ClientBuilder::from(options(&a))
                .build()
                .await
                .expect("connected to A");
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
            let client = ClientBuilder::from(options(&a).operation_timeout(Duration::from_secs(3)))
                .build()
                .await
                .expect("connected to A");
            let stuck = {
                let client = client.clone();
                tokio::spawn(async move { client.pool().connection_to(&silent).await })
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
            let client = ClientBuilder::from(options(&a))
                .build()
                .await
                .expect("connected");
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
            let client =
                ClientBuilder::from(options(&never).operation_timeout(Duration::from_secs(1)))
                    .build()
                    .await
                    .expect("connected");
            let started = tokio::time::Instant::now();
            let error = client.lookup("never").await.expect_err("still not ready");
            assert_eq!(
                error.server_error(),
                Some(crate::ServerError::ServiceNotReady)
            );
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
            let client = ClientBuilder::from(options(&refused))
                .build()
                .await
                .expect("connected");
            let error = client.lookup("missing").await.expect_err("not found");
            assert!(matches!(error, Error::Server { .. }), "{error}");
        }
    }
}
