//! Delayed delivery: the emulator's wall clock, and the entries of a Shared or Key_Shared
//! subscription that wait for their `deliver_at_time` (the broker's
//! `InMemoryDelayedDeliveryTracker` with `isDelayedDeliveryDeliverAtTimeStrict=true`: an entry
//! is never sent before its time; a broker with the default, non-strict setting may send it up
//! to `delayedDeliveryTickTimeMillis`, 1 s, early).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Milliseconds since the epoch, advancing with the runtime's clock: the wall clock when the
/// emulator started plus the runtime's time since (so that a test with paused time sees
/// delayed entries come due as it advances).
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    started_ms: i64,
    started: Instant,
}

impl Clock {
    pub(super) fn new() -> Self {
        let started_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
            });
        Self {
            started_ms,
            started: Instant::now(),
        }
    }

    /// Now, in milliseconds since the epoch.
    pub(super) fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.started_ms.saturating_add(elapsed)
    }
}

/// Entries read whose delivery time has not come, by index, with that time.
#[derive(Debug, Default)]
pub(super) struct Delayed {
    by_index: BTreeMap<u64, i64>,
}

impl Delayed {
    /// Whether entry `index`, to be delivered at `deliver_at`, waits at `now`: it is tracked
    /// if so (once, however often it is read), forgotten if not.
    pub(super) fn waits(&mut self, index: u64, deliver_at: Option<i64>, now: i64) -> bool {
        match deliver_at {
            Some(at) if at > now => {
                self.by_index.insert(index, at);
                true
            }
            _ => {
                self.by_index.remove(&index);
                false
            }
        }
    }

    /// The entries due at `now`, taken, in index order.
    pub(super) fn take_due(&mut self, now: i64) -> Vec<u64> {
        let due: Vec<u64> = self
            .by_index
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(index, _)| *index)
            .collect();
        for index in &due {
            self.by_index.remove(index);
        }
        due
    }

    /// When the next entry comes due.
    pub(super) fn next_due(&self) -> Option<i64> {
        self.by_index.values().min().copied()
    }

    /// How many entries wait.
    pub(super) fn len(&self) -> usize {
        self.by_index.len()
    }

    /// Forgets every entry (the tracker is in memory only: an unload or a restart loses it,
    /// and the entries are read again from the cursor).
    pub(super) fn clear(&mut self) {
        self.by_index.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever is read when, and however often (a rewound cursor reads again), each
        /// entry goes out once (read when due, or taken when it comes due), never before its
        /// time; every entry read goes out by the time it is due.
        #[test]
        fn each_delayed_entry_goes_out_once_and_never_early(
            dues in proptest::collection::vec(0i64..1_000, 20),
            reads in proptest::collection::vec((0usize..20, 0i64..50), 1..100),
        ) {
            let mut delayed = Delayed::default();
            let mut now = 0i64;
            let mut out: Vec<(u64, i64)> = Vec::new();
            let mut read = std::collections::HashSet::new();
            for (index, step) in reads {
                now += step;
                let entry = index as u64;
                if out.iter().any(|(i, _)| *i == entry) {
                    continue; // gone out: the cursor is past it
                }
                read.insert(entry);
                if !delayed.waits(entry, Some(dues[index]), now) {
                    out.push((entry, now)); // the read sends it
                }
                for due in delayed.take_due(now) {
                    out.push((due, now));
                }
            }
            for due in delayed.take_due(i64::MAX) {
                out.push((due, i64::MAX));
            }
            let mut entries: Vec<u64> = out.iter().map(|(i, _)| *i).collect();
            entries.sort_unstable();
            let all = entries.len();
            entries.dedup();
            proptest::prop_assert_eq!(all, entries.len(), "out twice: {:?}", out);
            proptest::prop_assert_eq!(entries.len(), read.len());
            for (entry, when) in &out {
                let due = dues[*entry as usize];
                proptest::prop_assert!(*when >= due, "{} out at {} before {}", entry, when, due);
            }
        }
    }

    #[test]
    fn entries_wait_until_due_and_are_taken_once() {
        let mut delayed = Delayed::default();
        assert!(!delayed.waits(1, None, 100));
        assert!(!delayed.waits(2, Some(100), 100), "due now: not delayed");
        assert!(delayed.waits(3, Some(300), 100));
        assert!(delayed.waits(4, Some(200), 100));
        assert!(delayed.waits(4, Some(200), 150), "read again: tracked once");
        assert_eq!((delayed.len(), delayed.next_due()), (2, Some(200)));
        assert_eq!(delayed.take_due(199), Vec::<u64>::new());
        assert_eq!(delayed.take_due(250), vec![4]);
        assert_eq!(delayed.take_due(1_000), vec![3]);
        assert_eq!((delayed.len(), delayed.next_due()), (0, None));
    }
}
