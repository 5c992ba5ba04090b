//! Link states: where a session's channel to the proxy stands, published through a
//! [`tokio::sync::watch`] channel ([`crate::Producer::state`], [`crate::SimpleConsumer::state`],
//! [`crate::PushConsumer::state`], [`crate::LitePushConsumer::state`], [`crate::Session::state`])
//! and logged on every change. The names and meanings are those of `pulsar-wire`'s link states.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

use crate::Error;

/// Where a client stands with the proxy: the state of its [`Session`](crate::Session)'s channel
/// to the access point, shared by every producer and consumer of the session.
///
/// A link starts [`LinkState::Connected`] (a consumer's `build` / `start` has made the
/// telemetry handshake by then; a producer built without [`start`](crate::Producer::start)
/// has not called the proxy yet). When a call finds the proxy unreachable (a connection refused
/// or lost, gRPC `UNAVAILABLE`: [`Error::Unreachable`], or [`Error::Rpc`] with
/// [`RpcStatus::is_unavailable`](crate::RpcStatus::is_unavailable)) it is
/// [`LinkState::Reconnecting`], while the client's loops (telemetry, heartbeats, receives,
/// sends within their retry window) go on with backoff, until a call (a heartbeat, the
/// telemetry handshake, a receive, a send, a route lookup, an ack) is answered: then
/// [`LinkState::Connected`] again. Answers that are refusals (a `Server` error) count as
/// answers. [`LinkState::Closed`] and [`LinkState::Failed`] are final.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LinkState {
    /// The proxy answered the last call.
    Connected,
    /// The proxy is unreachable and the client's loops try again with backoff; sends retry
    /// within their retry window, receives and acks fail with the cause meanwhile.
    Reconnecting {
        /// The failed call in a row since the link was lost, from 1 (the loss itself).
        attempt: u32,
        /// Why the link was lost (attempt 1), or why the latest call failed.
        cause: Error,
    },
    /// Closed by the application: every client of the session was closed
    /// ([`crate::Producer::close`], [`crate::SimpleConsumer::close`],
    /// [`crate::PushConsumer::close`], [`crate::LitePushConsumer::close`]).
    Closed,
    /// The proxy refused the client for good. Kept for parity with `pulsar-wire`: this
    /// version retries every failure of its channel, so it never enters this state.
    Failed {
        /// The refusal.
        cause: Error,
    },
}

impl LinkState {
    /// Whether the link is up ([`LinkState::Connected`]).
    pub fn is_connected(&self) -> bool {
        matches!(self, Self::Connected)
    }

    /// Whether the state cannot change any more ([`LinkState::Closed`],
    /// [`LinkState::Failed`]).
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Closed | Self::Failed { .. })
    }
}

/// The link state of one session, and how many clients use it.
#[derive(Debug)]
pub(crate) struct Link {
    state: watch::Sender<LinkState>,
    /// Whether `state` is [`LinkState::Connected`], kept beside it so that every answered
    /// call (sends and acks included) does not take the channel's lock to find nothing to do.
    connected: AtomicBool,
    /// Producers and consumers attached and not closed.
    users: AtomicUsize,
}

impl Link {
    pub(crate) fn new() -> Self {
        Self {
            state: watch::Sender::new(LinkState::Connected),
            connected: AtomicBool::new(true),
            users: AtomicUsize::new(0),
        }
    }

    /// A receiver of the state, the current one marked seen.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// A producer or consumer starts using the session.
    pub(crate) fn attach(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// A producer or consumer of the session was closed: the last one closes the link.
    pub(crate) fn detach(&self) {
        let previous = self
            .users
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .unwrap_or(0);
        if previous <= 1 {
            self.set(LinkState::Closed);
        }
    }

    /// Records what a call to the proxy came to: an answer (`Ok`, or any error but an
    /// unreachable proxy) is [`LinkState::Connected`]; an unreachable proxy is
    /// [`LinkState::Reconnecting`], one attempt further.
    pub(crate) fn observe<T>(&self, result: &Result<T, Error>) {
        match result {
            Err(error) if unreachable(error) => self.lost(error),
            Err(Error::Closed(_)) => {}
            _ if self.connected.load(Ordering::Acquire) => {}
            _ => self.set(LinkState::Connected),
        }
    }

    fn lost(&self, cause: &Error) {
        let mut next = None;
        self.state.send_if_modified(|state| {
            let attempt = match state {
                LinkState::Connected => 1,
                LinkState::Reconnecting { attempt, .. } => attempt.saturating_add(1),
                LinkState::Closed | LinkState::Failed { .. } => return false,
            };
            *state = LinkState::Reconnecting {
                attempt,
                cause: cause.clone(),
            };
            self.connected.store(false, Ordering::Release);
            next = Some(attempt);
            true
        });
        if let Some(attempt) = next {
            if attempt == 1 {
                tracing::info!(%cause, "proxy link lost; reconnecting");
            } else {
                tracing::debug!(attempt, %cause, "proxy still unreachable");
            }
        }
    }

    fn set(&self, new: LinkState) {
        let changed = self.state.send_if_modified(|state| {
            let closing_failed = matches!(
                (&*state, &new),
                (LinkState::Failed { .. }, LinkState::Closed)
            );
            if (state.is_final() && !closing_failed) || (state.is_connected() && new.is_connected())
            {
                return false;
            }
            *state = new.clone();
            self.connected.store(new.is_connected(), Ordering::Release);
            true
        });
        if changed {
            match new {
                LinkState::Connected => tracing::info!("proxy link connected"),
                LinkState::Closed => tracing::info!("proxy link closed"),
                _ => {}
            }
        }
    }
}

/// Whether `error` says the proxy could not be reached (no answer came).
fn unreachable(error: &Error) -> bool {
    match error {
        Error::Unreachable { .. } => true,
        Error::Rpc { source, .. } => source.is_unavailable(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down() -> Error {
        Error::Unreachable {
            endpoint: "127.0.0.1:8081".into(),
            reason: "connection refused".into(),
        }
    }

    #[test]
    fn failures_count_attempts_until_an_answer_and_close_is_final() {
        let link = Link::new();
        let watcher = link.subscribe();
        link.attach();
        assert!(watcher.borrow().is_connected());
        link.observe::<()>(&Err(down()));
        link.observe::<()>(&Err(down()));
        assert!(matches!(
            *watcher.borrow(),
            LinkState::Reconnecting { attempt: 2, .. }
        ));
        link.observe::<()>(&Err(Error::Closed("the producer")));
        assert!(matches!(
            *watcher.borrow(),
            LinkState::Reconnecting { attempt: 2, .. }
        ));
        link.observe(&Ok(()));
        assert!(watcher.borrow().is_connected());
        link.observe::<()>(&Err(down()));
        assert!(matches!(
            *watcher.borrow(),
            LinkState::Reconnecting { attempt: 1, .. }
        ));
        link.detach();
        assert!(matches!(*watcher.borrow(), LinkState::Closed));
        link.observe(&Ok(()));
        link.observe::<()>(&Err(down()));
        assert!(matches!(*watcher.borrow(), LinkState::Closed));
    }

    #[test]
    fn the_link_closes_with_its_last_client() {
        let link = Link::new();
        link.attach();
        link.attach();
        link.detach();
        assert!(link.subscribe().borrow().is_connected());
        link.detach();
        assert!(matches!(*link.subscribe().borrow(), LinkState::Closed));
    }
}
