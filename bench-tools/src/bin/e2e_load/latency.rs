//! The latency paths' shared parts: the send time stamped at the head of every payload, our
//! producer publishing at a fixed rate, the consumer's window over the received messages, and
//! one measurement (the consumer child started, our producer publishing from the driver once
//! the child is subscribed, until the child reports).
//!
//! A payload's first [`STAMP_BYTES`] bytes are its send time in µs since the UNIX epoch,
//! big-endian: both brokers and every consumer see the same bytes, whatever the precision of
//! a broker's own publish time. The producer and the consumer run on the same machine, so
//! they read the same clock.

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::oneshot;
use tokio::time::{Instant, MissedTickBehavior};

use crate::Driver;
use crate::child::{Outcome, Spec};
use crate::window::{Steady, SteadyClock};

/// Bytes at the head of a payload that hold its send time.
pub(crate) const STAMP_BYTES: usize = 8;

/// How often the publisher looks at how many sends are due (tokio's timer resolution).
const TICK: Duration = Duration::from_millis(1);

/// The wall-clock time in µs since the UNIX epoch (0 before it).
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A copy of `template` whose first [`STAMP_BYTES`] bytes are `micros`, big-endian (the
/// template is at least that long).
pub(crate) fn stamped(template: &[u8], micros: u64) -> Bytes {
    let mut payload = BytesMut::with_capacity(template.len().max(STAMP_BYTES));
    payload.put_u64(micros);
    payload.extend_from_slice(template.get(STAMP_BYTES..).unwrap_or_default());
    payload.freeze()
}

/// The send time stamped at the head of `payload`; `None` when it is too short to hold one.
pub(crate) fn stamp_of(payload: &[u8]) -> Option<u64> {
    let head: [u8; STAMP_BYTES] = payload.get(..STAMP_BYTES)?.try_into().ok()?;
    Some(u64::from_be_bytes(head))
}

/// How many sends are due `elapsed` after the start at `rate` a second (the first one at
/// once): the publisher's schedule. Counted from the start rather than per tick, so that a
/// late tick sends what it owes and the rate holds.
pub(crate) fn due(rate: u64, elapsed: Duration) -> u64 {
    let due = elapsed.as_micros() * u128::from(rate) / 1_000_000 + 1;
    u64::try_from(due).unwrap_or(u64::MAX)
}

/// Publishes `size`-byte payloads (each [`stamped`] with its send time) through `send` at
/// `rate` a second, without end: every millisecond it sends what [`due`] says is owed, and
/// keeps the sends open together (their receipts are awaited in any order, never one send
/// after another). Returns only on a failed send.
pub(crate) async fn publish_at_rate<F, T, E>(
    rate: u64,
    size: usize,
    mut send: impl FnMut(Bytes) -> F,
) -> Result<Infallible, String>
where
    F: Future<Output = Result<T, E>>,
    E: Display,
{
    let template = vec![b'x'; size.max(STAMP_BYTES)];
    let began = Instant::now();
    let mut ticks = tokio::time::interval(TICK);
    // The sends owed are counted from the start: a late tick catches up by itself.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut sent = 0u64;
    let mut pending: FuturesUnordered<F> = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(result) = pending.next(), if !pending.is_empty() => {
                result.map_err(|e| format!("send: {e}"))?;
            }
            _ = ticks.tick() => {
                let due = due(rate, began.elapsed());
                while sent < due {
                    // A send starts at its first poll: the next `pending.next()`, at once.
                    pending.push(send(stamped(&template, now_micros())));
                    sent += 1;
                }
            }
        }
    }
}

/// A latency consumer's window over its messages: the warm-up starts at its first message,
/// the window opens `warmup` after it and closes `window` after that; every message in the
/// window counts with its latency (its receipt time less its stamped send time).
pub(crate) struct LatencyWindow<O: FnOnce()> {
    clock: SteadyClock<O>,
}

impl<O: FnOnce()> LatencyWindow<O> {
    /// A window of `window` after `warmup`; `opened` is called when it opens (the child
    /// prints `start` there).
    pub(crate) fn new(warmup: Duration, window: Duration, opened: O) -> Self {
        Self {
            clock: SteadyClock::from_first_sample(warmup, window, opened),
        }
    }

    /// Takes one message of `payload` received at `now` (the wall clock then: `now_micros`);
    /// the result once the window has closed (once only), or an error for a payload without
    /// a stamp.
    pub(crate) fn message(
        &mut self,
        payload: &[u8],
        now: Instant,
        now_micros: u64,
    ) -> Result<Option<Steady>, String> {
        let sent = stamp_of(payload)
            .ok_or_else(|| format!("a payload of {} bytes has no send time", payload.len()))?;
        let latency = now_micros.saturating_sub(sent);
        let latency = u32::try_from(latency).unwrap_or(u32::MAX);
        Ok(self.clock.sample(now, latency))
    }

    /// As [`LatencyWindow::message`], received now.
    pub(crate) fn received(&mut self, payload: &[u8]) -> Result<Option<Steady>, String> {
        let (now, micros) = (Instant::now(), now_micros());
        self.message(payload, now, micros)
    }
}

/// One latency measurement of the consumer child `spec`: once it prints `ready` (subscribed),
/// the driver publishes through `send` at `rate` a second ([`publish_at_rate`], `size`-byte
/// payloads) until the child has reported and exited. A failed send ends the measurement as a
/// failure (`Ok(None)`, the child stopped).
pub(crate) async fn measure_while_publishing<F, T, E>(
    driver: &mut Driver,
    spec: &Spec,
    rate: u64,
    size: usize,
    send: impl FnMut(Bytes) -> F,
) -> Result<Option<Outcome>, String>
where
    F: Future<Output = Result<T, E>>,
    E: Display,
{
    let (ready, subscribed) = oneshot::channel();
    let publishing = async move {
        if subscribed.await.is_err() {
            // The child ended without subscribing: its own outcome says why.
            return std::future::pending().await;
        }
        eprintln!("e2e_load: publishing {rate} msg/s");
        publish_at_rate(rate, size, send).await
    };
    let failure = tokio::select! {
        outcome = driver.measure_notifying(spec, Some(ready)) => return outcome,
        Err(e) = publishing => e,
    };
    driver.failed(&spec.label, &format!("publishing: {failure}"));
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn the_send_time_rides_at_the_head_of_the_payload() {
        let template = vec![b'x'; 1024];
        let payload = stamped(&template, 1_765_000_000_123_456);
        assert_eq!(payload.len(), 1024);
        assert_eq!(&payload[..8], &1_765_000_000_123_456u64.to_be_bytes());
        assert!(payload[8..].iter().all(|&b| b == b'x'));
        assert_eq!(stamp_of(&payload), Some(1_765_000_000_123_456));
        assert_eq!(stamp_of(&[0, 0, 0, 0, 0, 0, 1, 2]), Some(258));
        assert_eq!(stamp_of(b"short"), None);
        // A template shorter than a stamp still gets a whole one.
        assert_eq!(stamped(b"ab", 7).len(), STAMP_BYTES);
        assert!(now_micros() > 1_700_000_000_000_000);
    }

    #[test]
    fn the_schedule_counts_from_the_start() {
        assert_eq!(due(5000, Duration::ZERO), 1);
        assert_eq!(due(5000, Duration::from_millis(1)), 6);
        assert_eq!(due(5000, Duration::from_secs(1)), 5001);
        assert_eq!(due(2000, Duration::from_micros(499)), 1);
        assert_eq!(due(2000, Duration::from_micros(500)), 2);
        assert_eq!(due(3, Duration::from_secs(10)), 31);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_holds_and_sends_overlap() {
        let sent = Rc::new(Cell::new(0u64));
        let open = Rc::new(Cell::new(0usize));
        let most_open = Rc::new(Cell::new(0usize));
        let publishing = publish_at_rate(5000, 1024, |payload| {
            assert_eq!(payload.len(), 1024);
            assert!(stamp_of(&payload).is_some());
            let (sent, open, most_open) = (sent.clone(), open.clone(), most_open.clone());
            sent.set(sent.get() + 1);
            async move {
                open.set(open.get() + 1);
                most_open.set(most_open.get().max(open.get()));
                // Every receipt takes 20 ms of virtual time: one send after another would
                // reach 50 a second.
                tokio::time::sleep(Duration::from_millis(20)).await;
                open.set(open.get() - 1);
                Ok::<_, String>(())
            }
        });
        let ran = tokio::time::timeout(Duration::from_secs(10), publishing).await;
        assert!(ran.is_err(), "no send failed");
        // 5,000 a second for 10 s, give or take a tick's worth.
        assert!((49_990..=50_010).contains(&sent.get()), "{}", sent.get());
        // 20 ms of sends in flight at once.
        assert!(most_open.get() >= 95, "{}", most_open.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_send_ends_the_publishing() {
        let mut count = 0;
        let failed = publish_at_rate(1000, 16, |_| {
            count += 1;
            let fail = count == 100;
            async move { if fail { Err("refused") } else { Ok(()) } }
        })
        .await;
        assert_eq!(failed.err(), Some("send: refused".to_owned()));
    }

    #[test]
    fn the_window_opens_after_the_first_message_and_counts_latencies() {
        let opened = Cell::new(false);
        let mut window = LatencyWindow::new(Duration::from_secs(2), Duration::from_secs(3), || {
            opened.set(true);
        });
        let first = Instant::now();
        let wall = 1_765_000_000_000_000u64;
        let mut result = None;
        // A message every 10 ms from 5 s after the first one's wall clock, each 1.5 ms late
        // (every tenth one 20 ms).
        for i in 0..1000u64 {
            let late = if i % 10 == 9 { 20_000 } else { 1_500 };
            let received = wall + i * 10_000;
            let payload = stamped(&[0; 64], received - late);
            let at = first + Duration::from_millis(i * 10);
            if let Some(steady) = window.message(&payload, at, received).unwrap() {
                assert!(result.is_none(), "one result only");
                result = Some(steady);
            }
            if i < 200 {
                assert!(!opened.get(), "opened at message {i}");
            }
        }
        assert!(opened.get());
        let mut steady = result.expect("the window closed");
        // Opened by message 200 (at 2 s), closed by message 500 (at 5 s).
        assert_eq!(steady.messages, 299);
        assert!((steady.seconds - 3.0).abs() < 1e-9, "{}", steady.seconds);
        let (p50, p99) = crate::stats::p50_p99_ms(&mut steady.latencies);
        assert_eq!((p50, p99), (Some(1.5), Some(20.0)));
        let empty = window.message(b"1234", first, wall);
        assert!(empty.is_err());
    }
}
