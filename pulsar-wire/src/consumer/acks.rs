//! Putting ordinary acks on the wire, grouped through `ack-batcher` (one `CommandAck` carries
//! many ids).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ack_batcher::{Batcher, Flush, FlushResult, ItemReply, RetryPolicy};
use txn_ack::{AckId, EntryId};

use super::partition::PartitionList;
use super::stats::Counters;
use crate::id::wire_id;
use crate::pb::base_command::Type;
use crate::pb::command_ack::AckType;
use crate::pb::{self, MessageIdData};
use crate::{Error, command_frame};

/// The batch an ack joins: one per partition consumer and ack type (a cumulative ack carries
/// exactly one id, so cumulative acks never share a frame with individual ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AckKey {
    pub(crate) slot: usize,
    pub(crate) cumulative: bool,
}

/// The `ack-batcher` transport: one `CommandAck` per batch.
#[derive(Debug)]
pub(crate) struct AckFlusher {
    pub(crate) partitions: Arc<PartitionList>,
    pub(crate) receipts: bool,
    pub(crate) counters: Arc<Counters>,
}

impl Flush<AckKey, AckId> for AckFlusher {
    type Output = ();
    type Error = Error;

    async fn flush(&self, key: &AckKey, items: &[AckId]) -> FlushResult<(), Error> {
        let consumer = self
            .partitions
            .get(key.slot)
            .ok_or(Error::Closed("the consumer's partition"))?;
        let (ack_type, ids) = if key.cumulative {
            // Cumulative acks only move forward: the last one covers the others.
            let last = items.last().map(wire_id).into_iter().collect();
            (AckType::Cumulative, last)
        } else {
            (AckType::Individual, merge(items))
        };
        let count = ids.len() as u64;
        let link = consumer.link();
        let ack = |request_id: Option<u64>| {
            command_frame(Type::Ack, |c| {
                c.ack = Some(pb::CommandAck {
                    consumer_id: link.consumer_id,
                    ack_type: ack_type as i32,
                    message_id: ids.clone(),
                    request_id,
                    ..pb::CommandAck::default()
                });
            })
        };
        let sent = if self.receipts {
            link.connection
                .request("ACK", |request_id| ack(Some(request_id)))
                .await
                .map(drop)
        } else {
            link.connection.send(ack(None))
        };
        crate::metrics::acks(&consumer.topic, items.len(), sent.is_ok());
        sent?;
        self.counters.ack_frames.fetch_add(1, Ordering::Relaxed);
        self.counters.acked_ids.fetch_add(count, Ordering::Relaxed);
        Ok(vec![ItemReply::Ok(()); items.len()])
    }
}

/// Builds the consumer's ack batcher: `group_time` / `group_max` as the Java client's
/// `acknowledgementsGroupTime` / `maxAcknowledgmentGroupSize`; a zero group time sends every
/// ack at once.
pub(crate) fn batcher(
    flusher: AckFlusher,
    group_time: Duration,
    group_max: usize,
) -> Result<Batcher<AckKey, AckId, AckFlusher>, Error> {
    let (max_items, max_delay) = if group_time.is_zero() {
        (1, Duration::from_millis(1))
    } else {
        (group_max.max(1), group_time)
    };
    Batcher::builder()
        .max_items(max_items)
        .max_delay(max_delay)
        .max_pending(max_items.max(65_536))
        // A lost connection makes the broker deliver again what it did not see acknowledged.
        .retry(RetryPolicy::never())
        .build(flusher)
        .map_err(|e| crate::error::batcher_error(e, "the consumer's acks"))
}

/// One id per entry: the acks of an entry are merged (a message stays outstanding only if
/// every ack leaves it outstanding; a whole-entry ack covers everything). Entries keep the
/// order of their first ack.
fn merge(items: &[AckId]) -> Vec<MessageIdData> {
    let mut merged: Vec<AckId> = Vec::with_capacity(items.len());
    let mut index: std::collections::HashMap<EntryId, usize> =
        std::collections::HashMap::with_capacity(items.len());
    for item in items {
        match index.get(&item.entry()) {
            None => {
                index.insert(item.entry(), merged.len());
                merged.push(item.clone());
            }
            Some(&at) => {
                if merged[at].merge(item).is_err() {
                    // Different sizes cannot come from one entry: send both as they are.
                    merged.push(item.clone());
                }
            }
        }
    }
    merged.iter().map(wire_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use txn_ack::{AckTracker, MessagePosition, PartialBatches};

    fn at(entry: u64, index: i32, size: i32) -> MessagePosition {
        MessagePosition::in_batch(3, entry, -1, index, size).unwrap()
    }

    #[test]
    fn grouped_acks_merge_per_entry() {
        let mut tracker = AckTracker::new(PartialBatches::SendAckSet);
        let mut ids = Vec::new();
        for (entry, index) in [(1, 0), (2, 1), (1, 2), (5, 0)] {
            ids.push(tracker.ack(&at(entry, index, 4)).unwrap().unwrap().id);
        }
        ids.push(
            tracker
                .ack(&MessagePosition::single(3, 9, -1))
                .unwrap()
                .unwrap()
                .id,
        );
        let wire = merge(&ids);
        let entries: Vec<_> = wire.iter().map(|id| id.entry_id).collect();
        assert_eq!(entries, [1, 2, 5, 9]);
        assert_eq!(wire[0].ack_set, [0b1010], "indexes 0 and 2 acknowledged");
        assert_eq!(wire[0].batch_size, Some(4));
        assert_eq!(wire[3].ack_set, Vec::<i64>::new());
        assert_eq!(
            wire[3].batch_size, None,
            "a plain message has no batch size"
        );
        // Completing entry 1 in the same group collapses it into a whole-entry id.
        ids.push(tracker.ack(&at(1, 1, 4)).unwrap().unwrap().id);
        ids.push(tracker.ack(&at(1, 3, 4)).unwrap().unwrap().id);
        let wire = merge(&ids);
        assert!(wire[0].ack_set.is_empty());
        assert_eq!((wire[0].batch_index, wire[0].batch_size), (None, Some(4)));
    }
}
