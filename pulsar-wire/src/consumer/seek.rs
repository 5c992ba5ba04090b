//! [`SeekTo`]: where [`Consumer::seek`](super::Consumer::seek) moves a subscription, and the
//! `SEEK` request that says it.
//!
//! # What the broker does (4.0.8, `PersistentSubscription.resetCursor`)
//! It disconnects the subscription's consumers (`CLOSE_CONSUMER`; on Exclusive and Failover
//! subscriptions only the active one), moves the cursor and answers. The consumers subscribe
//! again and get what follows the new position, whatever was acknowledged there before.
//! - To a message id: reading starts at the message's entry; the request carries the batch
//!   indexes from the message's own on (as the Java client does), so the broker marks those
//!   before it acknowledged. The message itself comes again and the consumer drops it and
//!   acknowledges it: the next message received is the one **after** the id, as with the
//!   Java client's `seek(MessageId)` (its `startMessageIdInclusive` off, the default).
//! - To a publish time: reading starts at the first entry published at or after it (all the
//!   messages of a batch share their entry's publish time).

use std::time::SystemTime;

use txn_ack::{AckSet, EntryId};

use crate::pb::{CommandSeek, MessageIdData};
use crate::{Error, MessageId};

/// Where [`Consumer::seek`](super::Consumer::seek) moves the subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeekTo {
    /// Before the first message the topic keeps (every partition).
    Earliest,
    /// After the last message published (every partition): only what is published from now
    /// on comes.
    Latest,
    /// Just after this message, in its partition: the next message received is the one that
    /// follows it.
    After(MessageId),
    /// At the first message published at or after this time (every partition).
    Time(SystemTime),
}

impl From<MessageId> for SeekTo {
    fn from(id: MessageId) -> Self {
        Self::After(id)
    }
}

impl From<SystemTime> for SeekTo {
    fn from(time: SystemTime) -> Self {
        Self::Time(time)
    }
}

/// After a seek to a message id, the message itself comes again: it is dropped (and
/// acknowledged), with the earlier indexes of its batch if they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StartAfter {
    pub(crate) entry: EntryId,
    /// The last index dropped (-1 for a message without a batch: the whole entry).
    pub(crate) batch_index: i32,
}

impl StartAfter {
    /// Whether the message at `entry`, `batch_index` comes before the start.
    pub(crate) fn drops(&self, entry: &EntryId, batch_index: i32) -> bool {
        *entry == self.entry && batch_index <= self.batch_index
    }
}

/// The `SEEK` request of one partition consumer, and what it drops afterwards.
#[derive(Debug, Clone)]
pub(crate) struct SeekRequest {
    pub(crate) message_id: Option<MessageIdData>,
    pub(crate) publish_time: Option<u64>,
    pub(crate) start_after: Option<StartAfter>,
}

impl SeekRequest {
    /// The request for `to`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a time before the epoch or beyond what fits in milliseconds.
    pub(crate) fn new(to: &SeekTo) -> Result<Self, Error> {
        let at = |ledger_id: u64, entry_id: u64| MessageIdData {
            ledger_id,
            entry_id,
            ..MessageIdData::default()
        };
        Ok(match *to {
            // The Java client's MessageId.earliest (-1, -1) and latest (i64::MAX, i64::MAX).
            SeekTo::Earliest => Self::at_id(at(u64::MAX, u64::MAX)),
            SeekTo::Latest => Self::at_id(at(i64::MAX as u64, i64::MAX as u64)),
            SeekTo::After(id) => {
                let mut data = at(id.ledger_id, id.entry_id);
                if let Some(size) = id.batch_size
                    && id.batch_index >= 0
                    && let Ok(mut set) = AckSet::outstanding(size)
                {
                    // The indexes from the message's own on are outstanding (an index
                    // beyond the batch leaves the whole entry so: the drop below covers it).
                    if let Some(before) = (id.batch_index as u32).checked_sub(1) {
                        let _ = set.ack_up_to(before);
                    }
                    data.ack_set = set.wire_words().collect();
                }
                Self {
                    message_id: Some(data),
                    publish_time: None,
                    start_after: Some(StartAfter {
                        entry: EntryId {
                            ledger_id: id.ledger_id,
                            entry_id: id.entry_id,
                        },
                        batch_index: id.batch_index,
                    }),
                }
            }
            SeekTo::Time(time) => {
                let millis = time
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .ok()
                    .and_then(|since| u64::try_from(since.as_millis()).ok())
                    .ok_or_else(|| Error::Invalid {
                        what: "SeekTo::Time",
                        reason: format!(
                            "{time:?} is before 1970 or too far ahead; give a publish time \
                             after the epoch"
                        ),
                    })?;
                Self {
                    message_id: None,
                    publish_time: Some(millis),
                    start_after: None,
                }
            }
        })
    }

    fn at_id(id: MessageIdData) -> Self {
        Self {
            message_id: Some(id),
            publish_time: None,
            start_after: None,
        }
    }

    /// The `SEEK` command for `consumer_id`.
    pub(crate) fn command(&self, consumer_id: u64, request_id: u64) -> CommandSeek {
        CommandSeek {
            consumer_id,
            request_id,
            message_id: self.message_id.clone(),
            message_publish_time: self.publish_time,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(batch_index: i32, batch_size: Option<u32>) -> MessageId {
        MessageId {
            ledger_id: 7,
            entry_id: 3,
            partition: -1,
            batch_index,
            batch_size,
        }
    }

    #[test]
    fn a_seek_to_a_batch_index_sends_the_indexes_from_it_on_as_the_java_client() {
        let request = SeekRequest::new(&SeekTo::After(id(2, Some(5)))).unwrap();
        let data = request.message_id.unwrap();
        // Bits 2, 3 and 4 set: 0b11100.
        assert_eq!(data.ack_set, vec![0b11100]);
        assert_eq!((data.ledger_id, data.entry_id), (7, 3));
        let start = request.start_after.unwrap();
        assert!(start.drops(&start.entry, 2));
        assert!(!start.drops(&start.entry, 3));
    }

    #[test]
    fn a_seek_to_the_first_index_or_a_message_without_a_batch() {
        let first = SeekRequest::new(&SeekTo::After(id(0, Some(3)))).unwrap();
        assert_eq!(first.message_id.unwrap().ack_set, vec![0b111]);
        let single = SeekRequest::new(&SeekTo::After(id(-1, None))).unwrap();
        assert!(single.message_id.unwrap().ack_set.is_empty());
        let start = single.start_after.unwrap();
        assert!(start.drops(&start.entry, -1));
    }

    #[test]
    fn earliest_latest_and_time() {
        let earliest = SeekRequest::new(&SeekTo::Earliest).unwrap();
        let data = earliest.message_id.unwrap();
        assert_eq!((data.ledger_id, data.entry_id), (u64::MAX, u64::MAX));
        assert!(earliest.start_after.is_none());
        let latest = SeekRequest::new(&SeekTo::Latest)
            .unwrap()
            .message_id
            .unwrap();
        assert_eq!(latest.ledger_id, i64::MAX as u64);
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_234);
        let time = SeekRequest::new(&SeekTo::Time(at)).unwrap();
        assert_eq!((time.message_id, time.publish_time), (None, Some(1_234)));
        let before = SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert!(matches!(
            SeekRequest::new(&SeekTo::Time(before)),
            Err(Error::Invalid { .. })
        ));
    }
}
