//! [`Recall`] and the bounded memory of entries acknowledged completely that follows it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rustc_hash::FxBuildHasher;

use crate::EntryId;

/// How long entries acknowledged completely are remembered, so that the broker's late copies
/// of them are recognised.
///
/// A broker persists a subscription's acknowledgements at most once a second
/// (`managedLedgerDefaultMarkDeleteRateLimit`); killed, it loses the last second or so of
/// them and, once back, delivers those messages again. An entry is remembered for
/// [`Recall::keep_for`] after it was acknowledged (10 s by default, ten times that loss) on
/// the clock the trackers are given ([`crate::Deliveries::set_clock`] and the others), and
/// in any case the last [`Recall::at_least`] entries (4,096); never more than
/// [`Recall::at_most`] (131,072: 10 s of 13,000 entries a second). That bounds the memory:
/// measured, 276 bytes an entry for a consumer's [`crate::Deliveries`] and
/// [`crate::AckTracker`] together, so 36 MB at the bound. Without a clock, only the count
/// bounds apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recall {
    at_least: usize,
    keep_for: Duration,
    at_most: usize,
}

impl Default for Recall {
    fn default() -> Self {
        Self {
            at_least: 4096,
            keep_for: Duration::from_secs(10),
            at_most: 1 << 17,
        }
    }
}

impl Recall {
    /// Remembers the last `entries`, however old (at most [`Recall::at_most`]).
    #[must_use]
    pub fn at_least(mut self, entries: usize) -> Self {
        self.at_least = entries;
        self
    }

    /// Remembers every entry for `time` after its acknowledgement.
    #[must_use]
    pub fn keep_for(mut self, time: Duration) -> Self {
        self.keep_for = time;
        self
    }

    /// Never remembers more than `entries` (0: nothing).
    #[must_use]
    pub fn at_most(mut self, entries: usize) -> Self {
        self.at_most = entries;
        self
    }

    /// The last entries remembered however old.
    pub fn least(&self) -> usize {
        self.at_least.min(self.at_most)
    }

    /// How long an entry is remembered.
    pub fn time(&self) -> Duration {
        self.keep_for
    }

    /// The most entries remembered.
    pub fn most(&self) -> usize {
        self.at_most
    }
}

/// Entries acknowledged completely, each with a value, forgotten by a [`Recall`].
#[derive(Debug, Clone)]
pub(crate) struct Recent<V> {
    /// Each entry with its value and when it was last remembered.
    members: HashMap<EntryId, (V, Duration), FxBuildHasher>,
    /// Each entry with when it was remembered; an entry remembered again (or removed) leaves
    /// an older place behind, skipped when it comes up.
    order: VecDeque<(EntryId, Duration)>,
    recall: Recall,
    now: Duration,
}

impl<V> Recent<V> {
    pub(crate) fn new(recall: Recall) -> Self {
        let least = recall.least();
        Self {
            members: HashMap::with_capacity_and_hasher(least, FxBuildHasher),
            order: VecDeque::with_capacity(least),
            recall,
            now: Duration::ZERO,
        }
    }

    /// The time now, on the caller's clock.
    pub(crate) fn set_clock(&mut self, now: Duration) {
        self.now = now;
        self.forget();
    }

    pub(crate) fn contains(&self, entry: &EntryId) -> bool {
        self.members.contains_key(entry)
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Takes an entry out (it is no longer settled).
    pub(crate) fn remove(&mut self, entry: &EntryId) -> Option<V> {
        self.members.remove(entry).map(|(value, _)| value)
    }

    /// Remembers `entry` from now on.
    pub(crate) fn insert(&mut self, entry: EntryId, value: V) {
        if self.recall.most() == 0 {
            return;
        }
        self.members.insert(entry, (value, self.now));
        self.order.push_back((entry, self.now));
        self.forget();
    }

    /// Forgets what the recall no longer keeps.
    fn forget(&mut self) {
        while let Some(&(entry, at)) = self.order.front() {
            let current = self
                .members
                .get(&entry)
                .is_some_and(|(_, last)| *last == at);
            if current {
                let over = self.members.len() > self.recall.most();
                let old = self.members.len() > self.recall.least()
                    && self.now.saturating_sub(at) > self.recall.time();
                if !(over || old) {
                    return;
                }
                self.members.remove(&entry);
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(entry_id: u64) -> EntryId {
        EntryId {
            ledger_id: 1,
            entry_id,
        }
    }

    #[test]
    fn forgets_the_oldest_beyond_the_most() {
        let mut recent = Recent::new(Recall::default().at_least(2).at_most(2));
        recent.insert(entry(1), ());
        recent.insert(entry(2), ());
        recent.insert(entry(2), ());
        recent.insert(entry(3), ());
        assert!(!recent.contains(&entry(1)));
        assert!(recent.contains(&entry(2)) && recent.contains(&entry(3)));
    }

    #[test]
    fn keeps_every_entry_of_the_window_beyond_the_least() {
        let mut recent = Recent::new(
            Recall::default()
                .at_least(2)
                .keep_for(Duration::from_secs(10))
                .at_most(100),
        );
        for i in 0..50 {
            recent.set_clock(Duration::from_millis(i * 100));
            recent.insert(entry(i), ());
        }
        assert_eq!(recent.len(), 50, "all within 10 s");
        recent.set_clock(Duration::from_secs(16));
        // Older than 10 s: those before 6 s go, but the last two stay however old.
        assert_eq!(recent.len(), 2);
        assert!(recent.contains(&entry(48)) && recent.contains(&entry(49)));
    }

    #[test]
    fn an_entry_remembered_again_is_kept_from_its_last_time() {
        let mut recent = Recent::new(
            Recall::default()
                .at_least(0)
                .keep_for(Duration::from_secs(1)),
        );
        recent.insert(entry(1), ());
        recent.set_clock(Duration::from_millis(900));
        recent.insert(entry(1), ());
        recent.set_clock(Duration::from_millis(1500));
        assert!(recent.contains(&entry(1)));
        recent.set_clock(Duration::from_millis(2000));
        assert!(!recent.contains(&entry(1)));
    }
}
