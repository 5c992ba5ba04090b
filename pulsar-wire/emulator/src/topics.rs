//! Topics: names, partitions, and the ledger of entries each topic keeps.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use txn_ack::{EntryId, TxnId};

use super::dispatch::Subscription;
use pulsar_wire::pb::MessageMetadata;

/// The partitioned topic whose partitions name the transaction coordinators; the emulator
/// runs one coordinator, so it has one partition.
pub(super) const TC_ASSIGN_TOPIC: &str =
    "persistent://pulsar/system/transaction_coordinator_assign";

/// Resolves a topic name as Pulsar does: `t` is `persistent://public/default/t`,
/// `tenant/ns/t` is `persistent://tenant/ns/t`.
pub(super) fn normalize(name: &str) -> Result<String, String> {
    let (domain, rest) = name.split_once("://").unwrap_or(("persistent", name));
    if domain != "persistent" && domain != "non-persistent" {
        return Err(format!(
            "topic {name:?}: the domain must be persistent or non-persistent"
        ));
    }
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().any(|part| part.is_empty()) || name.chars().any(char::is_whitespace) {
        return Err(format!("topic {name:?} has an empty part or whitespace"));
    }
    match parts.len() {
        1 => Ok(format!("{domain}://public/default/{rest}")),
        // tenant/namespace/topic, or the v1 tenant/cluster/namespace/topic.
        3 | 4 => Ok(format!("{domain}://{rest}")),
        _ => Err(format!(
            "topic {name:?} is not topic, tenant/namespace/topic or domain://tenant/namespace/topic"
        )),
    }
}

/// Splits `base-partition-N`.
pub(super) fn split_partition(name: &str) -> Option<(&str, u32)> {
    let (base, index) = name.rsplit_once("-partition-")?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, index.parse().ok()?))
}

/// Whether an entry can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Visibility {
    /// Readable.
    Visible,
    /// Sent in a transaction still open: it holds back every later entry (the transaction
    /// buffer's max read position).
    Pending(TxnId),
    /// Sent in a transaction that aborted: never read.
    Aborted,
}

/// One entry of the ledger: a single message or a whole batch.
#[derive(Debug)]
pub(super) struct StoredEntry {
    pub(super) metadata: MessageMetadata,
    pub(super) payload: Bytes,
    /// `num_messages_in_batch`, or 1 for an entry that is not a batch.
    pub(super) num_messages: i32,
    pub(super) visibility: Visibility,
}

/// A topic, or one partition of a partitioned topic.
#[derive(Debug)]
pub(super) struct Topic {
    pub(super) name: String,
    /// The partition index, -1 for a topic that is not a partition.
    pub(super) partition: i32,
    /// The topic's one ledger: entry ids are indexes into `entries`.
    pub(super) ledger_id: u64,
    pub(super) entries: Vec<StoredEntry>,
    /// `maxUnackedMessagesOnConsumer` for this topic, if set.
    pub(super) max_unacked: Option<u32>,
    pub(super) subscriptions: BTreeMap<String, Subscription>,
    /// Names of the producers connected to the topic.
    pub(super) producers: BTreeSet<String>,
}

impl Topic {
    pub(super) fn new(name: String, partition: i32, ledger_id: u64) -> Self {
        Self {
            name,
            partition,
            ledger_id,
            entries: Vec::new(),
            max_unacked: None,
            subscriptions: BTreeMap::new(),
            producers: BTreeSet::new(),
        }
    }

    /// Appends an entry and returns its index.
    pub(super) fn append(&mut self, entry: StoredEntry) -> u64 {
        self.entries.push(entry);
        (self.entries.len() - 1) as u64
    }

    /// Sends what can be sent to every subscription's consumers.
    pub(super) fn dispatch(&mut self, out: &mut Vec<super::broker::Outgoing>) {
        let view = TopicView {
            entries: &self.entries,
            ledger_id: self.ledger_id,
            partition: self.partition,
        };
        for subscription in self.subscriptions.values_mut() {
            subscription.dispatch(&view, out);
        }
    }

    /// Messages readable and stored, as (entries, messages).
    pub(super) fn visible_totals(&self) -> (u64, u64) {
        self.entries
            .iter()
            .filter(|e| e.visibility == Visibility::Visible)
            .fold((0, 0), |(entries, messages), e| {
                (entries + 1, messages + e.num_messages as u64)
            })
    }
}

/// What a subscription reads from its topic.
#[derive(Debug, Clone, Copy)]
pub(super) struct TopicView<'a> {
    pub(super) entries: &'a [StoredEntry],
    pub(super) ledger_id: u64,
    pub(super) partition: i32,
}

impl TopicView<'_> {
    pub(super) fn entry_id(&self, index: u64) -> EntryId {
        EntryId {
            ledger_id: self.ledger_id,
            entry_id: index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_like_pulsar() {
        assert_eq!(normalize("t").unwrap(), "persistent://public/default/t");
        assert_eq!(normalize("a/b/t").unwrap(), "persistent://a/b/t");
        assert_eq!(
            normalize("non-persistent://a/b/t").unwrap(),
            "non-persistent://a/b/t"
        );
        for bad in ["", "a/b", "x://a/b/t", "a//t", "a b"] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            split_partition("p://a/b/t-partition-12"),
            Some(("p://a/b/t", 12))
        );
        assert_eq!(split_partition("t-partition-"), None);
        assert_eq!(split_partition("t-partition-+1"), None);
        assert_eq!(split_partition("t"), None);
    }
}
