//! What a run measures, per level (level 0 is the most important):
//!
//! - **latency**: delivery tick − publish tick (ms), p50 and p99 over delivered messages;
//! - **bypass**: for a message m, the messages of less important levels delivered after m was
//!   published and before m was delivered; the table shows the maximum;
//! - **inversion ratio**: among pairs (m, l), l of a less important level, both published and
//!   not yet delivered at some instant, the fraction where l was delivered first. The inverted
//!   pairs of m are exactly its bypasses; the others are the less important messages still
//!   waiting when m is delivered;
//! - **longest starvation gap**: the longest time the level had published, undelivered
//!   messages without a delivery (counting a still-open gap at the end of the run);
//! - **share under overload**: the level's fraction of the deliveries made while every level
//!   had published, undelivered messages.
//!
//! Per run also: the last delivery's tick, service slots left idle while messages were
//! waiting somewhere (throughput lost), the most messages buffered in the client, and the
//! pause calls that changed a partition's state.

use crate::model::{MsgId, Tick};

#[derive(Debug, Clone, Copy)]
struct Published {
    level: u8,
    at: Tick,
    /// Deliveries of less important levels when the message was published.
    lower_before: u64,
}

/// Collects the events of one run.
#[derive(Debug)]
pub(crate) struct Recorder {
    messages: Vec<Published>,
    delivered: Vec<u64>,
    pending: Vec<u64>,
    latencies: Vec<Vec<u32>>,
    max_bypass: Vec<u64>,
    inverted: Vec<u64>,
    ordered: Vec<u64>,
    waiting_since: Vec<Option<Tick>>,
    longest_gap: Vec<Tick>,
    overload: Vec<u64>,
    idle_slots: u64,
    max_buffered: usize,
    last_delivery: Tick,
}

impl Recorder {
    /// A recorder for `levels` levels.
    pub(crate) fn new(levels: usize) -> Recorder {
        Recorder {
            messages: Vec::new(),
            delivered: vec![0; levels],
            pending: vec![0; levels],
            latencies: vec![Vec::new(); levels],
            max_bypass: vec![0; levels],
            inverted: vec![0; levels],
            ordered: vec![0; levels],
            waiting_since: vec![None; levels],
            longest_gap: vec![0; levels],
            overload: vec![0; levels],
            idle_slots: 0,
            max_buffered: 0,
            last_delivery: 0,
        }
    }

    fn lower(counts: &[u64], level: usize) -> u64 {
        counts.iter().skip(level + 1).sum()
    }

    /// A message of `level` was published at `at`; returns its id.
    pub(crate) fn publish(&mut self, level: u8, at: Tick) -> MsgId {
        let l = usize::from(level);
        let id = self.messages.len() as MsgId;
        self.messages.push(Published {
            level,
            at,
            lower_before: Recorder::lower(&self.delivered, l),
        });
        if let Some(p) = self.pending.get_mut(l) {
            if *p == 0 && self.waiting_since[l].is_none() {
                self.waiting_since[l] = Some(at);
            }
            *p += 1;
        }
        id
    }

    /// Message `id` was handed to the application at `at`.
    pub(crate) fn deliver(&mut self, id: MsgId, at: Tick) {
        let Some(m) = self.messages.get(id as usize).copied() else {
            return;
        };
        let l = usize::from(m.level);
        if l >= self.delivered.len() {
            return;
        }
        let latency = at.saturating_sub(m.at);
        self.latencies[l].push(u32::try_from(latency).unwrap_or(u32::MAX));
        let bypass = Recorder::lower(&self.delivered, l) - m.lower_before;
        self.max_bypass[l] = self.max_bypass[l].max(bypass);
        self.inverted[l] += bypass;
        self.ordered[l] += Recorder::lower(&self.pending, l);
        if self.pending.iter().all(|&p| p > 0) {
            self.overload[l] += 1;
        }
        if let Some(since) = self.waiting_since[l] {
            self.longest_gap[l] = self.longest_gap[l].max(at.saturating_sub(since));
        }
        self.delivered[l] += 1;
        self.pending[l] = self.pending[l].saturating_sub(1);
        self.waiting_since[l] = (self.pending[l] > 0).then_some(at);
        self.last_delivery = at;
    }

    /// `slots` service slots went unused at a time when messages were waiting.
    pub(crate) fn idle(&mut self, slots: u64) {
        if self.pending.iter().any(|&p| p > 0) {
            self.idle_slots += slots;
        }
    }

    /// The client holds `buffered` messages now.
    pub(crate) fn buffered(&mut self, buffered: usize) {
        self.max_buffered = self.max_buffered.max(buffered);
    }

    /// Published messages not yet delivered.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.iter().sum()
    }

    /// The report of the run, which ended at `end`.
    pub(crate) fn finish(mut self, strategy: &str, end: Tick, pauses: u64) -> Report {
        let overload_total: u64 = self.overload.iter().sum();
        let levels = (0..self.delivered.len())
            .map(|l| {
                let lat = &mut self.latencies[l];
                lat.sort_unstable();
                let gap = match self.waiting_since[l] {
                    Some(since) => self.longest_gap[l].max(end.saturating_sub(since)),
                    None => self.longest_gap[l],
                };
                let pairs = self.inverted[l] + self.ordered[l];
                LevelReport {
                    delivered: self.delivered[l],
                    left: self.pending[l],
                    p50: percentile(lat, 50),
                    p99: percentile(lat, 99),
                    max_bypass: self.max_bypass[l],
                    inversion: (l + 1 < self.delivered.len() && pairs > 0)
                        .then(|| self.inverted[l] as f64 / pairs as f64),
                    longest_gap: gap,
                    share: (overload_total > 0)
                        .then(|| self.overload[l] as f64 / overload_total as f64),
                }
            })
            .collect();
        Report {
            strategy: strategy.to_string(),
            levels,
            last_delivery: self.last_delivery,
            idle_slots: self.idle_slots,
            max_buffered: self.max_buffered,
            pauses,
        }
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[u32], pct: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * pct).div_ceil(100).max(1);
    u64::from(sorted[rank.min(sorted.len()) - 1])
}

/// One level's results.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LevelReport {
    /// Messages delivered.
    pub(crate) delivered: u64,
    /// Messages published but not delivered when the run ended.
    pub(crate) left: u64,
    /// Median latency (ms).
    pub(crate) p50: u64,
    /// 99th percentile latency (ms).
    pub(crate) p99: u64,
    /// The most less-important messages delivered while one message of this level waited.
    pub(crate) max_bypass: u64,
    /// Inversion ratio against all less important levels (none for the last level).
    pub(crate) inversion: Option<f64>,
    /// Longest starvation gap (ms).
    pub(crate) longest_gap: u64,
    /// Share of deliveries while every level was waiting (none if that never happened).
    pub(crate) share: Option<f64>,
}

/// One strategy's results in one scenario.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    /// The strategy's label.
    pub(crate) strategy: String,
    /// Per level, most important first.
    pub(crate) levels: Vec<LevelReport>,
    /// Tick of the last delivery.
    pub(crate) last_delivery: Tick,
    /// Service slots unused while messages waited.
    pub(crate) idle_slots: u64,
    /// Most messages buffered in the client at once.
    pub(crate) max_buffered: usize,
    /// Pause calls that changed a partition's state.
    pub(crate) pauses: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bypass_inversion_gap_and_share() {
        let mut r = Recorder::new(2);
        let low_a = r.publish(1, 0);
        let high = r.publish(0, 1);
        let low_b = r.publish(1, 2);
        r.deliver(low_a, 3); // bypasses the waiting high message
        r.deliver(high, 4); // low_b still waiting: one ordered pair
        r.deliver(low_b, 10);
        let rep = r.finish("t", 10, 0);
        let h = &rep.levels[0];
        assert_eq!((h.max_bypass, h.p50), (1, 3));
        assert_eq!(h.inversion, Some(0.5));
        assert_eq!(rep.levels[1].inversion, None);
        // low: pending from 0, deliveries at 3 and 10 → gaps 3 and 7.
        assert_eq!(rep.levels[1].longest_gap, 7);
        // Both levels waited at the first two deliveries only.
        assert_eq!(h.share, Some(0.5));
        assert_eq!(percentile(&[1, 2, 3, 4], 50), 2);
        assert_eq!(percentile(&[], 99), 0);
    }

    #[test]
    fn an_open_gap_counts_at_the_end() {
        let mut r = Recorder::new(2);
        r.publish(1, 5);
        let rep = r.finish("t", 100, 0);
        assert_eq!(rep.levels[1].longest_gap, 95);
        assert_eq!(rep.levels[1].left, 1);
    }
}
