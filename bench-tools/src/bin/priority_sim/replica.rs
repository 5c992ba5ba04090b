//! A replica of the published client-side design (streamnative/pulsar-recipes PR #20, built
//! against Pulsar client 2.10), rewritten from its description, as a baseline.
//!
//! What it keeps, because that is what the design does:
//! - **Router** (`PriorityMessageRouter`): a map priority → registered partitions and a list
//!   of default partitions computed once at construction; the live partition count is never
//!   read (partitions added later get nothing); one round-robin counter shared by all levels,
//!   not incremented for a one-partition list.
//! - **Interceptor** (`PriorityConsumerInterceptor`): a partition's priority is learnt from
//!   the first message its consumer hands to the parent consumer (2.10 called `beforeConsume`
//!   at that prefetch time) and never changes; messages without the property are priority
//!   `Integer.MAX_VALUE`. Pausing is evaluated **only on acknowledgements** (and nacks /
//!   ack timeouts, which the simulation does not produce): while fewer than two levels are
//!   known nothing happens; otherwise, from the most important level down, each level is
//!   resumed until one holds more than 50 messages in its partition consumers' receiver
//!   queues, and every level below it is paused. No hysteresis, no aging.
//! - The application still reads the parent consumer's merged queue in arrival order: the
//!   design only withholds FLOW, it never reorders what is already buffered.
//!
//! On Pulsar 3.0.7 / 3.3.2 and later `beforeConsume` no longer sees the partition consumer,
//! the cast fails and the design does nothing at all; the replica models the 2.10 behaviour,
//! its best case.

use std::collections::{BTreeMap, VecDeque};

use crate::model::{MsgId, Topic};

/// The design's hard-coded "many messages" threshold.
pub(crate) const THRESHOLD: usize = 50;

/// The priority value of messages without the property (`Integer.MAX_VALUE`).
const UNSET: u32 = i32::MAX as u32;

/// The priority value a producer of the replica writes for `level`: its index, except that
/// the least important level is sent without the property (the design's default partitions).
fn priority_of(level: u8, levels: usize) -> u32 {
    if usize::from(level) + 1 >= levels {
        UNSET
    } else {
        u32::from(level)
    }
}

/// The design's partition router.
#[derive(Debug, Clone)]
pub(crate) struct ReplicaRouter {
    levels: usize,
    registered: BTreeMap<u32, Vec<u32>>,
    defaults: Vec<u32>,
    counter: i32,
}

impl ReplicaRouter {
    /// A router for `partitions` partitions where `registered[k]` are the partitions of
    /// level `k` for every level but the last (whose messages go to the default partitions,
    /// the ones not registered).
    pub(crate) fn new(levels: usize, partitions: u32, registered: &[Vec<u32>]) -> ReplicaRouter {
        let mut map = BTreeMap::new();
        for (k, parts) in registered.iter().enumerate() {
            map.insert(k as u32, parts.clone());
        }
        let defaults = (0..partitions)
            .filter(|p| !registered.iter().any(|set| set.contains(p)))
            .collect();
        ReplicaRouter {
            levels,
            registered: map,
            defaults,
            counter: 0,
        }
    }

    /// The partition for a message of `level` (`None` only when its list is empty, where the
    /// Java code would divide by zero).
    pub(crate) fn choose(&mut self, level: u8) -> Option<u32> {
        let priority = priority_of(level, self.levels);
        let list = self.registered.get(&priority).unwrap_or(&self.defaults);
        match list.len() {
            0 => None,
            1 => list.first().copied(),
            n => {
                self.counter = self.counter.wrapping_add(1);
                let i = self.counter.rem_euclid(n as i32) as usize;
                list.get(i).copied()
            }
        }
    }
}

/// The design's consumer interceptor.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplicaInterceptor {
    levels: usize,
    known: Vec<bool>,
    mapping: BTreeMap<u32, Vec<u32>>,
    /// Evaluations that ran (acks seen with at least two levels known).
    pub(crate) evaluations: u64,
}

impl ReplicaInterceptor {
    /// An interceptor for a policy of `levels` levels, knowing nothing yet.
    pub(crate) fn new(levels: usize) -> ReplicaInterceptor {
        ReplicaInterceptor {
            levels,
            ..ReplicaInterceptor::default()
        }
    }

    /// `beforeConsume` on partition `partition`'s consumer for a message of `level`: learns
    /// the partition's priority from its first message, never again.
    pub(crate) fn before_consume(&mut self, partition: u32, level: u8) {
        let i = partition as usize;
        if self.known.len() <= i {
            self.known.resize(i + 1, false);
        }
        if self.known[i] {
            return;
        }
        self.known[i] = true;
        self.mapping
            .entry(priority_of(level, self.levels))
            .or_default()
            .push(partition);
    }

    /// `onAcknowledge`: the pause/resume cascade over the partition consumers' receiver
    /// queues (`incoming[p]` is partition `p`'s).
    pub(crate) fn on_acknowledge(&mut self, incoming: &[VecDeque<MsgId>], topic: &mut Topic) {
        if self.mapping.len() == 1 {
            return;
        }
        self.evaluations += 1;
        let mut pause = false;
        for parts in self.mapping.values() {
            if pause {
                for &p in parts {
                    topic.pause(p);
                }
                continue;
            }
            let mut buffered = 0;
            for &p in parts {
                topic.resume(p);
                buffered += incoming.get(p as usize).map_or(0, VecDeque::len);
            }
            if buffered > THRESHOLD {
                pause = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_ignores_growth_and_shares_one_counter_between_levels() {
        // The published sample: 5 partitions, priority 0 on 0 and 1, the rest default.
        let mut router = ReplicaRouter::new(2, 5, &[vec![0, 1]]);
        // Strictly alternating high/low sends: every high message lands on partition 1
        // (the shared counter is always odd for them).
        let mut highs = Vec::new();
        for _ in 0..10 {
            highs.push(router.choose(0).unwrap());
            router.choose(1).unwrap();
        }
        assert!(highs.iter().all(|&p| p == 1), "{highs:?}");
        // Default partitions are fixed at construction.
        assert!((0..100).all(|_| (2..5).contains(&router.choose(1).unwrap())));
    }

    #[test]
    fn nothing_happens_before_two_levels_are_learnt_or_without_acks() {
        let mut topic = Topic::new(4);
        for p in 0..4 {
            topic.part(p).unwrap().subscribe(100);
        }
        let mut incoming = vec![VecDeque::new(); 4];
        incoming[0].extend(0..60);
        let mut replica = ReplicaInterceptor::new(2);
        replica.before_consume(2, 1);
        replica.on_acknowledge(&incoming, &mut topic);
        assert_eq!((topic.pauses, replica.evaluations), (0, 0));
        replica.before_consume(0, 0);
        replica.before_consume(2, 0); // already learnt: ignored
        replica.on_acknowledge(&incoming, &mut topic);
        assert!(topic.part(2).unwrap().is_paused());
        assert!(!topic.part(0).unwrap().is_paused());
        incoming[0].truncate(THRESHOLD);
        replica.on_acknowledge(&incoming, &mut topic);
        assert!(
            !topic.part(2).unwrap().is_paused(),
            "50 is not more than 50"
        );
    }
}
