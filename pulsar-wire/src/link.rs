//! Link states: where each partition's producer or consumer stands with its broker, published
//! through a [`tokio::sync::watch`] channel ([`crate::Producer::state`],
//! [`crate::Consumer::state`]) and logged on every change.

use std::sync::Arc;

use tokio::sync::watch;

use crate::Error;

/// Where the producer or consumer of one topic (or one partition) stands with its broker.
///
/// A link starts [`LinkState::Connected`]; when its connection is lost or the broker closes
/// it (an unload, a bundle moving, a broker restarting) it is [`LinkState::Reconnecting`]
/// until it registers (producer) or subscribes (consumer) again, which it does by itself with
/// backoff. [`LinkState::Closed`] and [`LinkState::Failed`] are final.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LinkState {
    /// Registered (a producer) or subscribed (a consumer) on a live connection.
    Connected,
    /// The link was lost and is being made again; sends wait meanwhile (within the send
    /// timeout), `receive` waits for the messages.
    Reconnecting {
        /// The attempt under way or next, from 1 (the first after the loss).
        attempt: u32,
        /// Why the link was lost (attempt 1), or why the previous attempt failed.
        cause: Error,
    },
    /// Closed by the application ([`crate::Producer::close`], [`crate::Consumer::close`]).
    Closed,
    /// The broker refused to take the producer or consumer back for good (the topic was
    /// deleted or terminated, the producer was fenced, the subscription is taken): sends fail
    /// with `cause`, `receive` reports it once.
    Failed {
        /// The broker's refusal.
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

    /// The state's name, for logs.
    fn name(&self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Reconnecting { .. } => "reconnecting",
            Self::Closed => "closed",
            Self::Failed { .. } => "failed",
        }
    }
}

/// The link states of a producer's or consumer's partitions, by partition index (one entry,
/// at 0, for a topic that is not partitioned). It grows when the producer or consumer
/// attaches to partitions added to the topic.
#[derive(Debug, Clone, Default)]
pub struct LinkStates {
    partitions: Vec<LinkState>,
}

/// What [`LinkStates::overall`] answers when there is nothing to aggregate.
static CONNECTED: LinkState = LinkState::Connected;

impl LinkStates {
    /// Every partition's state, by partition index.
    pub fn partitions(&self) -> &[LinkState] {
        &self.partitions
    }

    /// The state of partition `index` (0 for a topic that is not partitioned).
    pub fn get(&self, index: usize) -> Option<&LinkState> {
        self.partitions.get(index)
    }

    /// One state for the whole producer or consumer: [`LinkState::Closed`] once it is
    /// closed; else the first partition that [`LinkState::Failed`]; else the first one
    /// [`LinkState::Reconnecting`] (with its attempt and cause); else
    /// [`LinkState::Connected`]. [`LinkStates::partitions`] says which partition is which.
    pub fn overall(&self) -> &LinkState {
        let first = |wanted: fn(&LinkState) -> bool| self.partitions.iter().find(|s| wanted(s));
        first(|s| matches!(s, LinkState::Closed))
            .or_else(|| first(|s| matches!(s, LinkState::Failed { .. })))
            .or_else(|| first(|s| matches!(s, LinkState::Reconnecting { .. })))
            .unwrap_or(&CONNECTED)
    }

    /// Whether every partition is [`LinkState::Connected`].
    pub fn is_connected(&self) -> bool {
        self.partitions.iter().all(LinkState::is_connected)
    }

    /// These states, in this order (a [`crate::PatternConsumer`]'s: one per topic).
    pub(crate) fn from_states(partitions: Vec<LinkState>) -> Self {
        Self { partitions }
    }
}

/// Publishes the link states of one producer or consumer and logs every change.
#[derive(Debug)]
pub(crate) struct LinkHub {
    /// "producer" or "consumer", for logs.
    role: &'static str,
    states: watch::Sender<LinkStates>,
}

impl LinkHub {
    pub(crate) fn new(role: &'static str) -> Arc<Self> {
        Arc::new(Self {
            role,
            states: watch::Sender::new(LinkStates::default()),
        })
    }

    /// A receiver of the states, the current one marked seen.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkStates> {
        self.states.subscribe()
    }

    /// The place of `partition` (-1 for a topic that is not partitioned), not attached yet.
    pub(crate) fn slot(self: &Arc<Self>, partition: i32) -> LinkSlot {
        LinkSlot {
            hub: Arc::clone(self),
            index: usize::try_from(partition).unwrap_or(0),
        }
    }

    /// Every partition closed by the application.
    pub(crate) fn close_all(&self, topic: &str) {
        let changed = self.states.send_if_modified(|states| {
            let mut changed = false;
            for state in &mut states.partitions {
                if !matches!(state, LinkState::Closed) {
                    *state = LinkState::Closed;
                    changed = true;
                }
            }
            changed
        });
        if changed {
            tracing::info!(%topic, role = self.role, "{} closed", self.role);
        }
    }
}

/// One partition's entry in a [`LinkHub`].
#[derive(Debug, Clone)]
pub(crate) struct LinkSlot {
    hub: Arc<LinkHub>,
    index: usize,
}

impl LinkSlot {
    /// The partition is linked for the first time: its entry appears, connected.
    pub(crate) fn attach(&self) {
        self.hub.states.send_modify(|states| {
            if states.partitions.len() <= self.index {
                states
                    .partitions
                    .resize(self.index + 1, LinkState::Connected);
            } else {
                states.partitions[self.index] = LinkState::Connected;
            }
        });
    }

    /// The partition's link changed to `state` (ignored once it is final, but for a failed
    /// link closed by the application); logs the change at info, or at warn for a failure.
    pub(crate) fn set(&self, topic: &str, state: LinkState) {
        let index = self.index;
        let changed = self.hub.states.send_if_modified(|states| {
            let Some(slot) = states.partitions.get_mut(index) else {
                return false;
            };
            let closing_failed = matches!(
                (&*slot, &state),
                (LinkState::Failed { .. }, LinkState::Closed)
            );
            if slot.is_final() && !closing_failed {
                return false;
            }
            *slot = state.clone();
            true
        });
        if !changed {
            return;
        }
        let role = self.hub.role;
        let name = state.name();
        match &state {
            LinkState::Reconnecting { attempt, cause } => {
                tracing::info!(%topic, role, partition = index, attempt, %cause, "{role} {name}");
            }
            LinkState::Failed { cause } => {
                tracing::warn!(%topic, role, partition = index, %cause, "{role} {name}: the broker refused it for good");
            }
            LinkState::Connected | LinkState::Closed => {
                tracing::info!(%topic, role, partition = index, "{role} {name}");
            }
        }
    }

    /// The state now.
    pub(crate) fn current(&self) -> Option<LinkState> {
        self.hub.states.borrow().get(self.index).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> Error {
        Error::ConnectionLost {
            addr: "127.0.0.1:6650".into(),
            reason: "reset".into(),
        }
    }

    #[test]
    fn partitions_appear_connected_and_the_overall_state_names_the_worst() {
        let hub = LinkHub::new("producer");
        let watcher = hub.subscribe();
        let (zero, one) = (hub.slot(0), hub.slot(1));
        zero.attach();
        one.attach();
        assert_eq!(watcher.borrow().partitions().len(), 2);
        assert!(watcher.borrow().is_connected());
        one.set(
            "t",
            LinkState::Reconnecting {
                attempt: 2,
                cause: lost(),
            },
        );
        assert!(!watcher.borrow().is_connected());
        assert!(matches!(
            watcher.borrow().overall(),
            LinkState::Reconnecting { attempt: 2, .. }
        ));
        assert!(watcher.borrow().get(0).is_some_and(LinkState::is_connected));
        zero.set("t", LinkState::Failed { cause: lost() });
        assert!(matches!(
            watcher.borrow().overall(),
            LinkState::Failed { .. }
        ));
        hub.close_all("t");
        assert!(matches!(watcher.borrow().overall(), LinkState::Closed));
        assert!(
            watcher
                .borrow()
                .partitions()
                .iter()
                .all(|s| matches!(s, LinkState::Closed))
        );
    }

    #[test]
    fn a_final_state_stays_but_a_failed_link_can_be_closed() {
        let hub = LinkHub::new("consumer");
        let slot = hub.slot(-1);
        slot.attach();
        slot.set("t", LinkState::Failed { cause: lost() });
        slot.set("t", LinkState::Connected);
        assert!(matches!(slot.current(), Some(LinkState::Failed { .. })));
        slot.set("t", LinkState::Closed);
        slot.set(
            "t",
            LinkState::Reconnecting {
                attempt: 1,
                cause: lost(),
            },
        );
        assert!(matches!(slot.current(), Some(LinkState::Closed)));
    }

    #[test]
    fn an_empty_set_of_states_is_connected() {
        let states = LinkStates::default();
        assert!(states.overall().is_connected());
        assert!(states.get(0).is_none());
    }
}
