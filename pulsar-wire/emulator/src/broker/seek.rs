//! `SEEK`: a subscription's cursor reset to a message id or a publish time, as the broker's
//! `PersistentSubscription.resetCursor` does it.
//!
//! The broker first disconnects the subscription's consumers (`CLOSE_CONSUMER` to each of a
//! Shared or Key_Shared subscription, to the active one of an Exclusive or Failover one;
//! their clients subscribe again), then moves the cursor and answers `SUCCESS`:
//! - to a message id: reading starts at its entry (inclusive); an `ack_set` given with it
//!   marks the entry's other indexes acknowledged (the Java client sends the indexes from the
//!   message's own on, so that the message itself comes again). `(-1, -1)` (the Java client's
//!   `MessageId.earliest`) and ids before the topic's ledger mean the first entry; ids after
//!   it (`MessageId.latest` is `(i64::MAX, i64::MAX)`) the end.
//! - to a publish time: reading starts at the first entry published at or after it (the
//!   broker's `PersistentMessageFinder` finds the last entry published before, and the cursor
//!   goes to the next), the end when there is none.
//!
//! Whatever the cursor had acknowledged after the new position comes again. A non-durable
//! subscription (a reader's) ends with its last consumer, as on the broker: its client
//! subscribes again at the position it sought.

use super::{Broker, Refusal};
use crate::entries::Visibility;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{CommandCloseConsumer, CommandSeek, MessageIdData, ServerError};
use txn_ack::AckSet;

use crate::outgoing::{Kind, command};

/// Where a seek moves the cursor: the entry index reading starts at, and the ack set of that
/// entry (its size and the indexes outstanding) when the seek gave one.
type Target = (u64, Option<(i32, AckSet)>);

impl Broker {
    pub(super) fn on_seek(&mut self, conn: u64, body: &CommandSeek) {
        match self.seek(conn, body) {
            Ok(()) => self.success(conn, body.request_id),
            Err(refusal) => self.error(conn, body.request_id, refusal),
        }
    }

    fn seek(&mut self, conn: u64, body: &CommandSeek) -> Result<(), Refusal> {
        let r = self
            .consumers
            .get(&(conn, body.consumer_id))
            .cloned()
            .ok_or_else(|| {
                (
                    ServerError::ConsumerNotFound,
                    format!("consumer {} is not connected", body.consumer_id),
                )
            })?;
        let target = {
            let topic = self.topics.get(&r.topic).ok_or_else(|| {
                (
                    ServerError::TopicNotFound,
                    format!("topic {} is gone", r.topic),
                )
            })?;
            match (&body.message_id, body.message_publish_time) {
                (Some(id), _) => target_of_id(id, topic.ledger_id, &topic.entries),
                (None, Some(time)) => (first_published_at(&topic.entries, time), None),
                (None, None) => {
                    return Err((
                        ServerError::MetadataError,
                        "Message id and timestamp were not present".into(),
                    ));
                }
            }
        };
        // resetCursor: the subscription's consumers are disconnected first (only the active
        // one of an Exclusive or Failover subscription: disconnectActiveConsumers).
        let single_active = self
            .topics
            .get(&r.topic)
            .and_then(|topic| topic.subscriptions.get(&r.subscription))
            .is_some_and(|subscription| !subscription.shared());
        let mut on_subscription: Vec<(u64, u64, u64)> = self
            .consumers
            .iter()
            .filter(|(_, c)| c.topic == r.topic && c.subscription == r.subscription)
            .map(|(&(conn, id), c)| (conn, id, c.key))
            .collect();
        if single_active {
            let active = self
                .topics
                .get(&r.topic)
                .and_then(|topic| topic.subscriptions.get(&r.subscription))
                .and_then(|subscription| subscription.consumers.first())
                .map(|consumer| consumer.key);
            on_subscription.retain(|&(_, _, key)| Some(key) == active);
        }
        for &(conn, consumer_id, _) in &on_subscription {
            let mut close = command(Type::CloseConsumer);
            close.close_consumer = Some(CommandCloseConsumer {
                consumer_id,
                request_id: 0,
                ..Default::default()
            });
            self.push(conn, close, Kind::Other);
            self.remove_consumer((conn, consumer_id));
        }
        if let Some(topic) = self.topics.get_mut(&r.topic) {
            let ledger_id = topic.ledger_id;
            if let Some(subscription) = topic.subscriptions.get_mut(&r.subscription) {
                let (to, start) = target;
                subscription.seek(to, start, ledger_id);
            }
        }
        Ok(())
    }
}

/// The entry a seek to `id` starts at, with the ack set it gives for that entry.
fn target_of_id(
    id: &MessageIdData,
    ledger_id: u64,
    entries: &[crate::entries::StoredEntry],
) -> Target {
    let end = entries.len() as u64;
    // (-1, -1) is the earliest position; an id of an earlier ledger is before the first
    // entry, one of a later ledger after the last.
    if id.ledger_id == u64::MAX || id.ledger_id < ledger_id {
        return (0, None);
    }
    if id.ledger_id > ledger_id || id.entry_id >= end {
        return (end, None);
    }
    let to = id.entry_id;
    let start = (!id.ack_set.is_empty())
        .then(|| {
            let entry = &entries[to as usize];
            let size = u32::try_from(entry.num_messages).ok()?;
            let set = AckSet::from_wire(size, &id.ack_set).ok()?;
            Some((entry.num_messages, set))
        })
        .flatten();
    (to, start)
}

/// The first entry published at or after `time` (milliseconds since the epoch), or the end.
fn first_published_at(entries: &[crate::entries::StoredEntry], time: u64) -> u64 {
    entries
        .iter()
        .position(|e| e.visibility != Visibility::Aborted && e.metadata.publish_time >= time)
        .map_or(entries.len() as u64, |at| at as u64)
}
