//! The simulated Pulsar topic: partitions as FIFO logs of entries, the broker's dispatch against
//! FLOW permits, the client side of each partition consumer's permits, and a producer that
//! batches per partition.
//!
//! Pulsar semantics kept here:
//! - a consumer subscribes with a FLOW of its receiver queue size; the broker sends entries
//!   while it holds permits (an entry of N batched messages costs N permits, and the broker
//!   sends it as long as at least one permit is left, so permits can go negative);
//! - the client returns permits as it takes messages out of a receiver queue, in one FLOW once
//!   at least half the queue has been taken (`receiverQueueRefillThreshold`);
//! - `pause()` only stops FLOW: messages the broker already has permits for keep coming and
//!   messages already buffered stay buffered; `resume()` sends the withheld permits if they
//!   reach the threshold.

use std::collections::VecDeque;

/// Virtual time in ticks of one millisecond.
pub(crate) type Tick = u64;

/// A message id: its index in the run's message table.
pub(crate) type MsgId = u32;

/// One stored entry: one message, or a producer batch dispatched and counted as a unit.
pub(crate) type Entry = Vec<MsgId>;

/// One partition: the broker's log and permits, and its consumer's flow state.
#[derive(Debug, Default)]
pub(crate) struct Partition {
    log: VecDeque<Entry>,
    backlog: usize,
    subscribed: bool,
    permits: i64,
    queue: u32,
    consumed: u32,
    paused: bool,
}

impl Partition {
    /// The consumer subscribes with a receiver queue of `queue`. Like Pulsar's `startPaused`,
    /// a partition already paused withholds its first FLOW until it is resumed.
    pub(crate) fn subscribe(&mut self, queue: u32) {
        self.subscribed = true;
        self.queue = queue.max(1);
        if self.paused {
            self.consumed = self.queue;
        } else {
            self.permits = i64::from(self.queue);
        }
    }

    /// Messages stored at the broker and not yet dispatched.
    pub(crate) fn backlog(&self) -> usize {
        self.backlog
    }

    /// The consumer took one message out of this partition's receiver queue: one permit to
    /// return, sent once half the queue is owed and the partition is not paused.
    pub(crate) fn processed(&mut self) {
        self.consumed += 1;
        self.flow();
    }

    /// Stop sending FLOW.
    pub(crate) fn pause(&mut self) {
        self.paused = true;
    }

    /// Send FLOW again (the withheld permits go out if they reach the threshold).
    pub(crate) fn resume(&mut self) {
        self.paused = false;
        self.flow();
    }

    /// Whether FLOW is withheld.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    fn flow(&mut self) {
        if !self.paused && self.subscribed && self.consumed >= (self.queue / 2).max(1) {
            self.permits += i64::from(std::mem::take(&mut self.consumed));
        }
    }
}

/// The topic: its partitions, and counters of what the consumer asked of them.
#[derive(Debug, Default)]
pub(crate) struct Topic {
    parts: Vec<Partition>,
    /// Pause calls that changed a partition's state.
    pub(crate) pauses: u64,
}

impl Topic {
    /// A topic with `partitions` empty, unsubscribed partitions.
    pub(crate) fn new(partitions: u32) -> Topic {
        let mut topic = Topic::default();
        topic.grow(partitions);
        topic
    }

    /// The topic now has `partitions` partitions (never fewer: Pulsar cannot shrink).
    pub(crate) fn grow(&mut self, partitions: u32) {
        let n = partitions as usize;
        if n > self.parts.len() {
            self.parts.resize_with(n, Partition::default);
        }
    }

    /// The number of partitions.
    pub(crate) fn partitions(&self) -> u32 {
        self.parts.len() as u32
    }

    /// Partition `p`, if it exists.
    pub(crate) fn part(&mut self, p: u32) -> Option<&mut Partition> {
        self.parts.get_mut(p as usize)
    }

    /// Partition `p`'s consumer stops sending FLOW.
    pub(crate) fn pause(&mut self, p: u32) {
        if let Some(part) = self.part(p) {
            let was = part.is_paused();
            part.pause();
            if !was {
                self.pauses += 1;
            }
        }
    }

    /// Partition `p`'s consumer sends FLOW again.
    pub(crate) fn resume(&mut self, p: u32) {
        if let Some(part) = self.part(p) {
            part.resume();
        }
    }

    /// The producer appended `entry` to partition `p`.
    pub(crate) fn append(&mut self, p: u32, entry: Entry) {
        if let Some(part) = self.part(p) {
            part.backlog += entry.len();
            part.log.push_back(entry);
        }
    }

    /// One dispatch pass of the broker: subscribed partitions take turns sending one entry
    /// each while they hold permits. Returns the entries in arrival order.
    pub(crate) fn dispatch(&mut self) -> Vec<(u32, Entry)> {
        let mut out = Vec::new();
        loop {
            let before = out.len();
            for (p, part) in self.parts.iter_mut().enumerate() {
                if !part.subscribed || part.permits <= 0 {
                    continue;
                }
                if let Some(entry) = part.log.pop_front() {
                    part.permits -= entry.len() as i64;
                    part.backlog -= entry.len();
                    out.push((p as u32, entry));
                }
            }
            if out.len() == before {
                return out;
            }
        }
    }
}

/// Producer batching: at most `max_messages` per entry, flushed once the oldest message of a
/// batch has waited `max_delay` ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batching {
    /// Messages per batch at most.
    pub(crate) max_messages: usize,
    /// Ticks a batch may wait for more messages.
    pub(crate) max_delay: Tick,
}

/// A producer with one batch container per partition (or none without batching).
#[derive(Debug, Default)]
pub(crate) struct Producer {
    batching: Option<Batching>,
    open: Vec<Option<(Tick, Entry)>>,
}

impl Producer {
    /// A producer, batching or not.
    pub(crate) fn new(batching: Option<Batching>) -> Producer {
        Producer {
            batching,
            open: Vec::new(),
        }
    }

    /// Sends message `id` to partition `p` at `now`.
    pub(crate) fn send(&mut self, topic: &mut Topic, p: u32, id: MsgId, now: Tick) {
        let Some(batching) = self.batching else {
            topic.append(p, vec![id]);
            return;
        };
        let i = p as usize;
        if self.open.len() <= i {
            self.open.resize_with(i + 1, || None);
        }
        let slot = &mut self.open[i];
        let (_, entry) =
            slot.get_or_insert_with(|| (now, Vec::with_capacity(batching.max_messages)));
        entry.push(id);
        if entry.len() >= batching.max_messages
            && let Some((_, full)) = slot.take()
        {
            topic.append(p, full);
        }
    }

    /// Flushes the batches whose first message has waited the batching delay.
    pub(crate) fn flush_aged(&mut self, topic: &mut Topic, now: Tick) {
        let Some(batching) = self.batching else {
            return;
        };
        for (p, slot) in self.open.iter_mut().enumerate() {
            if slot
                .as_ref()
                .is_some_and(|(since, _)| now.saturating_sub(*since) >= batching.max_delay)
                && let Some((_, entry)) = slot.take()
            {
                topic.append(p as u32, entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_sends_up_to_the_permits_and_flow_comes_back_at_half_the_queue() {
        let mut topic = Topic::new(1);
        for id in 0..10 {
            topic.append(0, vec![id]);
        }
        topic.part(0).unwrap().subscribe(4);
        assert_eq!(topic.dispatch().len(), 4);
        assert!(topic.dispatch().is_empty());
        topic.part(0).unwrap().processed();
        assert!(
            topic.dispatch().is_empty(),
            "one taken: below half the queue"
        );
        topic.part(0).unwrap().processed();
        assert_eq!(topic.dispatch().len(), 2);
        assert_eq!(topic.part(0).unwrap().backlog(), 4);
    }

    #[test]
    fn a_paused_partition_keeps_granted_permits_and_withholds_new_ones() {
        let mut topic = Topic::new(1);
        for id in 0..10 {
            topic.append(0, vec![id]);
        }
        topic.part(0).unwrap().subscribe(4);
        topic.pause(0);
        // Permits granted before the pause are honoured.
        assert_eq!(topic.dispatch().len(), 4);
        for _ in 0..4 {
            topic.part(0).unwrap().processed();
        }
        assert!(topic.dispatch().is_empty());
        topic.resume(0);
        assert_eq!(topic.dispatch().len(), 4);
        assert_eq!(topic.pauses, 1);
    }

    #[test]
    fn a_batch_is_one_entry_that_may_overdraw_the_permits() {
        let mut topic = Topic::new(1);
        let mut producer = Producer::new(Some(Batching {
            max_messages: 3,
            max_delay: 10,
        }));
        for id in 0..7 {
            producer.send(&mut topic, 0, id, 0);
        }
        assert_eq!(topic.part(0).unwrap().backlog(), 6);
        producer.flush_aged(&mut topic, 9);
        assert_eq!(topic.part(0).unwrap().backlog(), 6);
        producer.flush_aged(&mut topic, 10);
        assert_eq!(topic.part(0).unwrap().backlog(), 7);
        topic.part(0).unwrap().subscribe(2);
        let sent = topic.dispatch();
        assert_eq!(sent.len(), 1, "one entry of 3 messages for 2 permits");
        assert_eq!(sent[0].1.len(), 3);
    }
}
