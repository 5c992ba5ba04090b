//! [`AckTimeouts`]: messages the application received and has not settled, each asked for
//! again once it has gone unacknowledged for [`ConsumerOptions::ack_timeout`](super::ConsumerOptions::ack_timeout).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use txn_ack::MessagePosition;

use super::Message;
use super::growth::Growth;

/// The messages handed to the application and not acknowledged, negatively acknowledged or
/// acknowledged in a transaction yet, with when each times out.
#[derive(Debug)]
pub(crate) struct AckTimeouts {
    timeout: Duration,
    held: Mutex<HashMap<(usize, MessagePosition), (Instant, Message)>>,
}

impl AckTimeouts {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// `message` was handed to the application now.
    pub(crate) fn track(&self, message: &Message) {
        let key = (message.origin.slot, *message.position());
        self.held
            .lock()
            .insert(key, (Instant::now() + self.timeout, message.clone()));
    }

    /// The message at `position` of partition `slot` was settled (with `cumulative`, every
    /// message of the partition up to it).
    pub(crate) fn settled(&self, slot: usize, position: &MessagePosition, cumulative: bool) {
        let mut held = self.held.lock();
        if cumulative {
            let upto = order(position);
            held.retain(|(s, p), _| *s != slot || order(p) > upto);
        } else {
            held.remove(&(slot, *position));
        }
    }

    /// Every message is settled (the application asked for all of them again).
    pub(crate) fn clear(&self) {
        self.held.lock().clear();
    }

    /// The messages timed out at `now`, taken.
    pub(crate) fn expired(&self, now: Instant) -> Vec<Message> {
        let mut held = self.held.lock();
        let keys: Vec<_> = held
            .iter()
            .filter(|(_, (due, _))| *due <= now)
            .map(|(key, _)| *key)
            .collect();
        keys.into_iter()
            .filter_map(|key| held.remove(&key).map(|(_, message)| message))
            .collect()
    }

    /// How often [`watch`] looks: a quarter of the timeout, at most a second (the Java
    /// client's tick is a second).
    fn tick(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

fn order(position: &MessagePosition) -> (u64, u64, i32) {
    (
        position.ledger_id(),
        position.entry_id(),
        position.batch_index(),
    )
}

/// Asks for the timed-out messages again while the consumer lives and is open.
pub(crate) async fn watch(growth: Weak<Growth>, timeouts: Arc<AckTimeouts>) {
    loop {
        tokio::time::sleep(timeouts.tick()).await;
        let Some(growth) = growth.upgrade() else {
            return;
        };
        if growth.closed.load(Ordering::Acquire) {
            return;
        }
        for message in timeouts.expired(Instant::now()) {
            let Some(partition) = growth.partitions.get(message.origin.slot) else {
                continue;
            };
            growth.counters.ack_timeouts.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = partition.nack_message(&message, &growth.counters) {
                tracing::debug!(%error, id = %message.id(), "a timed-out message could not be asked for again");
            }
        }
    }
}
