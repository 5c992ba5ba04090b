//! Topics and partitions: the ledger of entries each keeps, and their subscriptions.

use std::collections::{BTreeMap, BTreeSet};

use super::dispatch::Subscription;
use super::entries::{StoredEntry, TopicView, Visibility};
use super::outgoing::Outgoing;

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

    /// Entries may have become readable (a publish, a transaction's sends committed or
    /// aborted): every subscription's dispatcher reads.
    pub(super) fn published(&mut self) {
        for subscription in self.subscriptions.values_mut() {
            subscription.published();
        }
    }

    /// Sends what can be sent to every subscription's consumers.
    pub(super) fn dispatch(&mut self, out: &mut Vec<Outgoing>, now_ms: i64) {
        let view = TopicView {
            entries: &self.entries,
            ledger_id: self.ledger_id,
            partition: self.partition,
            now_ms,
        };
        for subscription in self.subscriptions.values_mut() {
            subscription.dispatch(&view, out);
        }
    }

    /// When the next delayed entry of a subscription comes due.
    pub(super) fn next_due(&self) -> Option<i64> {
        self.subscriptions
            .values()
            .filter_map(Subscription::next_due)
            .min()
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
