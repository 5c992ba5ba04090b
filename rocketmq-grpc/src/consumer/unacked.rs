//! The ids of consumed messages whose ack failed for good: bounded, and corrected when a
//! redelivered copy is acknowledged later.

use std::collections::{HashMap, VecDeque};

/// How many ids [`Unacked`] lists at most (the most recent ones).
pub(super) const UNACKED_CAP: usize = 10_000;

/// An insertion-ordered set of message ids capped at `cap`: when full, the oldest id leaves
/// the list and is counted in `dropped`. An id acknowledged later (its redelivery was
/// acknowledged) is removed.
#[derive(Debug)]
pub(super) struct Unacked {
    cap: usize,
    /// Id → the sequence number of its entry in `order`.
    ids: HashMap<String, u64>,
    /// Insertion order; entries whose id was removed or re-added are stale and skipped.
    order: VecDeque<(u64, String)>,
    next: u64,
    dropped: u64,
}

impl Unacked {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            ids: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            dropped: 0,
        }
    }

    /// Lists `id` (again: it moves to the most recent end).
    pub(super) fn insert(&mut self, id: String) {
        let seq = self.next;
        self.next += 1;
        self.ids.insert(id.clone(), seq);
        self.order.push_back((seq, id));
        while self.ids.len() > self.cap {
            let Some((seq, id)) = self.order.pop_front() else {
                break;
            };
            if self.ids.get(&id) == Some(&seq) {
                self.ids.remove(&id);
                self.dropped += 1;
            }
        }
        self.compact();
    }

    /// `id` was acknowledged after all.
    pub(super) fn remove(&mut self, id: &str) {
        if self.ids.remove(id).is_some() {
            self.compact();
        }
    }

    /// Keeps the stale entries of `order` below the number of live ones (bounded memory).
    fn compact(&mut self) {
        if self.order.len() > 2 * self.ids.len() + 64 {
            let ids = &self.ids;
            self.order.retain(|(seq, id)| ids.get(id) == Some(seq));
        }
    }

    /// The listed ids, oldest first, and how many left the list because it was full.
    pub(super) fn take(&mut self) -> (Vec<String>, u64) {
        let ids = std::mem::take(&mut self.ids);
        let listed = std::mem::take(&mut self.order)
            .into_iter()
            .filter(|(seq, id)| ids.get(id) == Some(seq))
            .map(|(_, id)| id)
            .collect();
        (listed, std::mem::take(&mut self.dropped))
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledged_later_leaves_the_list() {
        let mut u = Unacked::new(10);
        u.insert("a".into());
        u.insert("b".into());
        u.insert("c".into());
        u.remove("b");
        u.remove("unknown");
        assert_eq!(u.take(), (vec!["a".to_owned(), "c".to_owned()], 0));
        assert_eq!(u.take(), (vec![], 0));
    }

    #[test]
    fn the_list_keeps_the_most_recent_ids_and_counts_the_others() {
        let mut u = Unacked::new(3);
        for id in ["1", "2", "3", "4", "5"] {
            u.insert(id.into());
        }
        // A re-listed id moves to the end and is not counted twice.
        u.insert("4".into());
        let (listed, dropped) = u.take();
        assert_eq!(listed, ["3", "5", "4"]);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn memory_stays_bounded_under_churn() {
        let mut u = Unacked::new(100);
        for i in 0..100_000 {
            u.insert(format!("m{i}"));
            if i % 2 == 0 {
                u.remove(&format!("m{i}"));
            }
            u.insert(format!("m{}", i % 7));
            assert!(u.entries() <= 2 * 100 + 64 + 2, "{}", u.entries());
        }
        let (listed, dropped) = u.take();
        assert_eq!(listed.len(), 100);
        assert!(dropped > 0);
    }
}
