//! A bounded memory of entries that were acknowledged completely.

use std::collections::{HashSet, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::EntryId;

/// The last `capacity` completed entries, so that late duplicate acks are recognised. Never
/// allocates once full.
#[derive(Debug, Clone)]
pub(crate) struct RecentlyCompleted {
    order: VecDeque<EntryId>,
    members: HashSet<EntryId, FxBuildHasher>,
    capacity: usize,
}

impl RecentlyCompleted {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            order: VecDeque::with_capacity(capacity),
            members: HashSet::with_capacity_and_hasher(capacity, FxBuildHasher),
            capacity,
        }
    }

    pub(crate) fn contains(&self, entry: &EntryId) -> bool {
        self.members.contains(entry)
    }

    pub(crate) fn insert(&mut self, entry: EntryId) {
        if self.capacity == 0 || !self.members.insert(entry) {
            return;
        }
        if self.order.len() == self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.members.remove(&oldest);
        }
        self.order.push_back(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest_beyond_capacity() {
        let entry = |entry_id| EntryId {
            ledger_id: 1,
            entry_id,
        };
        let mut recent = RecentlyCompleted::with_capacity(2);
        recent.insert(entry(1));
        recent.insert(entry(2));
        recent.insert(entry(2));
        recent.insert(entry(3));
        assert!(!recent.contains(&entry(1)));
        assert!(recent.contains(&entry(2)) && recent.contains(&entry(3)));
    }
}
