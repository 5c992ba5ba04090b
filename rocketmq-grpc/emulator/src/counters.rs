//! Counters and the histogram of entries per `AckMessage` request, with a snapshot type.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The `MessagingService` RPCs the emulator serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Rpc {
    /// `QueryRoute`.
    QueryRoute,
    /// `Heartbeat`.
    Heartbeat,
    /// `SendMessage`.
    SendMessage,
    /// `QueryAssignment`.
    QueryAssignment,
    /// `ReceiveMessage` (server streaming).
    ReceiveMessage,
    /// `AckMessage`.
    AckMessage,
    /// `Telemetry` (bidirectional streaming).
    Telemetry,
    /// `NotifyClientTermination`.
    NotifyClientTermination,
    /// `ChangeInvisibleDuration`.
    ChangeInvisibleDuration,
    /// `EndTransaction`.
    EndTransaction,
    /// `ForwardMessageToDeadLetterQueue`.
    ForwardMessageToDeadLetterQueue,
    /// `SyncLiteSubscription` (RocketMQ 5.4+).
    SyncLiteSubscription,
}

impl Rpc {
    /// Every RPC, in declaration order.
    pub const ALL: [Rpc; 12] = [
        Rpc::QueryRoute,
        Rpc::Heartbeat,
        Rpc::SendMessage,
        Rpc::QueryAssignment,
        Rpc::ReceiveMessage,
        Rpc::AckMessage,
        Rpc::Telemetry,
        Rpc::NotifyClientTermination,
        Rpc::ChangeInvisibleDuration,
        Rpc::EndTransaction,
        Rpc::ForwardMessageToDeadLetterQueue,
        Rpc::SyncLiteSubscription,
    ];

    /// The RPC's name as in the service definition.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::QueryRoute => "QueryRoute",
            Rpc::Heartbeat => "Heartbeat",
            Rpc::SendMessage => "SendMessage",
            Rpc::QueryAssignment => "QueryAssignment",
            Rpc::ReceiveMessage => "ReceiveMessage",
            Rpc::AckMessage => "AckMessage",
            Rpc::Telemetry => "Telemetry",
            Rpc::NotifyClientTermination => "NotifyClientTermination",
            Rpc::ChangeInvisibleDuration => "ChangeInvisibleDuration",
            Rpc::EndTransaction => "EndTransaction",
            Rpc::ForwardMessageToDeadLetterQueue => "ForwardMessageToDeadLetterQueue",
            Rpc::SyncLiteSubscription => "SyncLiteSubscription",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The live counters (atomics, plus one small lock for the histogram).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    calls: [AtomicU64; Rpc::ALL.len()],
    ack_histogram: Mutex<BTreeMap<usize, u64>>,
    pub(crate) ack_entries: AtomicU64,
    pub(crate) messages_stored: AtomicU64,
    pub(crate) messages_delivered: AtomicU64,
    pub(crate) receives_empty: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) duplicate_acks: AtomicU64,
    pub(crate) redelivered: AtomicU64,
    pub(crate) invisibility_expired: AtomicU64,
    pub(crate) expired_handles: AtomicU64,
    pub(crate) invalid_handles: AtomicU64,
    pub(crate) malformed_handles: AtomicU64,
    pub(crate) nacks: AtomicU64,
    pub(crate) rejected_requests: AtomicU64,
    pub(crate) injected_unavailable: AtomicU64,
    pub(crate) injected_too_many_requests: AtomicU64,
    pub(crate) injected_delays: AtomicU64,
    pub(crate) injected_entry_errors: AtomicU64,
    pub(crate) injected_dropped_results: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Adds one to a counter.
pub(crate) fn inc(counter: &AtomicU64) {
    add(counter, 1);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Counters {
    pub(crate) fn call(&self, rpc: Rpc) {
        inc(&self.calls[rpc.index()]);
    }

    pub(crate) fn ack_request(&self, entries: usize) {
        add(&self.ack_entries, entries as u64);
        *self.ack_histogram.lock().entry(entries).or_insert(0) += 1;
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let calls = Rpc::ALL
            .iter()
            .map(|rpc| (*rpc, get(&self.calls[rpc.index()])))
            .collect();
        Stats {
            calls,
            ack_entries_histogram: self.ack_histogram.lock().clone(),
            ack_entries: get(&self.ack_entries),
            messages_stored: get(&self.messages_stored),
            messages_delivered: get(&self.messages_delivered),
            receives_empty: get(&self.receives_empty),
            acked: get(&self.acked),
            duplicate_acks: get(&self.duplicate_acks),
            redelivered: get(&self.redelivered),
            invisibility_expired: get(&self.invisibility_expired),
            expired_handles: get(&self.expired_handles),
            invalid_handles: get(&self.invalid_handles),
            malformed_handles: get(&self.malformed_handles),
            nacks: get(&self.nacks),
            rejected_requests: get(&self.rejected_requests),
            injected: InjectedFaults {
                unavailable: get(&self.injected_unavailable),
                too_many_requests: get(&self.injected_too_many_requests),
                delays: get(&self.injected_delays),
                entry_errors: get(&self.injected_entry_errors),
                dropped_results: get(&self.injected_dropped_results),
            },
        }
    }
}

/// Counts of injected faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InjectedFaults {
    /// Calls aborted with gRPC `UNAVAILABLE`.
    pub unavailable: u64,
    /// Calls answered `TOO_MANY_REQUESTS`.
    pub too_many_requests: u64,
    /// Calls delayed.
    pub delays: u64,
    /// Ack entries answered with the injected error code (not acknowledged).
    pub entry_errors: u64,
    /// Ack result entries left out of responses (acknowledged).
    pub dropped_results: u64,
}

/// A snapshot of the emulator's counters ([`Emulator::stats`](super::Emulator::stats)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls per RPC, including rejected ones (bad headers, injected faults).
    pub calls: BTreeMap<Rpc, u64>,
    /// Number of `AckMessage` requests per entry count (key: entries in the request). Counts
    /// every request that passed the header checks and injected request-level faults.
    pub ack_entries_histogram: BTreeMap<usize, u64>,
    /// Sum of entries over the requests in the histogram.
    pub ack_entries: u64,
    /// Messages stored (SendMessage and [`Emulator::publish`](super::Emulator::publish)).
    pub messages_stored: u64,
    /// Message deliveries (first deliveries and redeliveries).
    pub messages_delivered: u64,
    /// `ReceiveMessage` calls answered `MESSAGE_NOT_FOUND` after long polling.
    pub receives_empty: u64,
    /// Messages whose state went from in flight to acknowledged (at most once per message and
    /// consumer group).
    pub acked: u64,
    /// `OK` answers for messages that were already acknowledged (retries after lost answers,
    /// or double acks).
    pub duplicate_acks: u64,
    /// Deliveries with a delivery attempt above 1.
    pub redelivered: u64,
    /// In-flight messages whose invisibility ended without an ack (they become visible again).
    pub invisibility_expired: u64,
    /// Ack and ChangeInvisibleDuration entries answered `INVALID_RECEIPT_HANDLE` "receipt
    /// handle is expired".
    pub expired_handles: u64,
    /// Ack and ChangeInvisibleDuration entries answered `INVALID_RECEIPT_HANDLE` for a handle
    /// that is not expired but does not name the current delivery (superseded by a redelivery
    /// or a ChangeInvisibleDuration, or unknown).
    pub invalid_handles: u64,
    /// Malformed receipt handles seen (each answered `INTERNAL_SERVER_ERROR`, per entry or for
    /// the whole request in batch-ack mode).
    pub malformed_handles: u64,
    /// Successful `ChangeInvisibleDuration` calls.
    pub nacks: u64,
    /// Calls rejected before processing by the header checks (`CLIENT_ID_REQUIRED`,
    /// `UNAUTHORIZED`).
    pub rejected_requests: u64,
    /// Injected faults.
    pub injected: InjectedFaults,
}

impl Stats {
    /// Calls of one RPC.
    pub fn calls(&self, rpc: Rpc) -> u64 {
        self.calls.get(&rpc).copied().unwrap_or(0)
    }

    /// `AckMessage` requests that carried exactly `entries` entries.
    pub fn ack_requests_with_entries(&self, entries: usize) -> u64 {
        self.ack_entries_histogram
            .get(&entries)
            .copied()
            .unwrap_or(0)
    }

    /// `AckMessage` requests counted in the histogram.
    pub fn ack_requests(&self) -> u64 {
        self.ack_entries_histogram.values().sum()
    }

    /// Mean entries per `AckMessage` request (0 when there were none).
    pub fn mean_ack_entries(&self) -> f64 {
        let n = self.ack_requests();
        if n == 0 {
            return 0.0;
        }
        #[allow(clippy::cast_precision_loss)]
        let mean = self.ack_entries as f64 / n as f64;
        mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reports_calls_and_histogram() {
        let c = Counters::default();
        c.call(Rpc::AckMessage);
        c.call(Rpc::AckMessage);
        c.call(Rpc::Telemetry);
        c.ack_request(1024);
        c.ack_request(1024);
        c.ack_request(3);
        inc(&c.acked);
        let s = c.snapshot();
        assert_eq!(s.calls(Rpc::AckMessage), 2);
        assert_eq!(s.calls(Rpc::Telemetry), 1);
        assert_eq!(s.calls(Rpc::QueryRoute), 0);
        assert_eq!(s.ack_requests_with_entries(1024), 2);
        assert_eq!(s.ack_requests_with_entries(3), 1);
        assert_eq!(s.ack_requests(), 3);
        assert_eq!(s.ack_entries, 2051);
        assert!((s.mean_ack_entries() - 2051.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.acked, 1);
        assert_eq!(Stats::default().mean_ack_entries(), 0.0);
    }

    #[test]
    fn rpc_indices_match_all() {
        for (i, rpc) in Rpc::ALL.iter().enumerate() {
            assert_eq!(rpc.index(), i);
        }
        assert_eq!(Rpc::AckMessage.to_string(), "AckMessage");
    }
}
