//! Sends with a fixed number in flight, as every produce path's own client does.

use std::collections::VecDeque;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::task::{Poll, ready};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

/// Runs `n` sends made by `send`, keeping `in_flight` of them open; returns each send's
/// latency in µs (from its first poll to its result), or the first failure.
pub(crate) async fn send_windowed<F, T, E>(
    n: usize,
    in_flight: usize,
    mut send: impl FnMut() -> F,
) -> Result<Vec<u32>, String>
where
    F: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut latencies = Vec::with_capacity(n);
    let mut pending = FuturesUnordered::new();
    let mut next = 0;
    while next < n || !pending.is_empty() {
        while next < n && pending.len() < in_flight.max(1) {
            let sent = send();
            pending.push(async move {
                let started = Instant::now();
                let result = sent.await;
                (started.elapsed(), result)
            });
            next += 1;
        }
        if let Some((latency, result)) = pending.next().await {
            result.map_err(|e| format!("send: {e}"))?;
            latencies.push(latency.as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }
    Ok(latencies)
}

/// What a produce run measured: the receipts that came within its window.
#[derive(Debug, Default)]
pub(crate) struct Steady {
    /// Receipts within the window.
    pub(crate) messages: u64,
    /// The window's length in seconds, as measured.
    pub(crate) seconds: f64,
    /// The latency in µs of each receipt within the window.
    pub(crate) latencies: Vec<u32>,
}

impl Steady {
    /// Prints the child's `result` line ([`crate::child`]'s protocol) with p50 and p99.
    pub(crate) fn print_result(mut self) {
        let (p50, p99) = crate::stats::p50_p99_ms(&mut self.latencies);
        println!(
            "result messages={} seconds={:.6} p50_ms={:.3} p99_ms={:.3}",
            self.messages,
            self.seconds,
            p50.unwrap_or(f64::NAN),
            p99.unwrap_or(f64::NAN)
        );
    }
}

/// The accounting of a steady-state run: the window opens `warmup` after the start (the
/// clock's creation, or its first sample: [`SteadyClock::from_first_sample`]) and closes
/// `window` after it opened; the samples in between are counted. The sample that opens the
/// window and the one that closes it are not counted.
pub(crate) struct SteadyClock<O: FnOnce()> {
    began: Option<Instant>,
    warmup: Duration,
    window: Duration,
    opened: Option<O>,
    open_at: Option<Instant>,
    closed: bool,
    steady: Steady,
}

impl<O: FnOnce()> SteadyClock<O> {
    /// A clock whose warm-up starts now; `opened` is called when the window opens.
    pub(crate) fn new(warmup: Duration, window: Duration, opened: O) -> Self {
        let mut clock = Self::from_first_sample(warmup, window, opened);
        clock.began = Some(Instant::now());
        clock
    }

    /// A clock whose warm-up starts at its first sample (a consumer's first message).
    pub(crate) fn from_first_sample(warmup: Duration, window: Duration, opened: O) -> Self {
        Self {
            began: None,
            warmup,
            window,
            opened: Some(opened),
            open_at: None,
            closed: false,
            steady: Steady::default(),
        }
    }

    /// Takes one receipt of a send started at `started`, come at `now`; the run's result once
    /// the window has closed.
    fn receipt(&mut self, started: Instant, now: Instant) -> Option<Steady> {
        self.receipts(started, now, 1)
    }

    /// Takes the receipts of the `messages` messages of one send (a batch) started at
    /// `started`, come at `now`: as many samples, each with the send's latency.
    fn receipts(&mut self, started: Instant, now: Instant, messages: u64) -> Option<Steady> {
        let latency = now.duration_since(started);
        let latency_us = latency.as_micros().min(u128::from(u32::MAX)) as u32;
        (0..messages).find_map(|_| self.sample(now, latency_us))
    }

    /// Takes one sample of `latency_us` µs taken at `now`: the run's result at the first
    /// sample after the window has closed, `None` before and after that one.
    pub(crate) fn sample(&mut self, now: Instant, latency_us: u32) -> Option<Steady> {
        if self.closed {
            return None;
        }
        let began = *self.began.get_or_insert(now);
        match self.open_at {
            None if now.duration_since(began) >= self.warmup => {
                if let Some(opened) = self.opened.take() {
                    opened();
                }
                self.open_at = Some(now);
            }
            None => {}
            Some(at) if now.duration_since(at) >= self.window => {
                self.closed = true;
                self.steady.seconds = now.duration_since(at).as_secs_f64();
                return Some(std::mem::take(&mut self.steady));
            }
            Some(_) => {
                self.steady.messages += 1;
                self.steady.latencies.push(latency_us);
            }
        }
        None
    }
}

/// Sends made by `send` without end, `in_flight` open at a time, each awaited on its own
/// (receipts in any order), each of `per_send` messages (a batch send's size, else 1): after
/// `warmup` it calls `opened` (the child prints `start` there) and counts every message
/// receipted until `window` has passed since, then returns at once (the sends still open are
/// dropped: their receipts come after the window). A failed send ends the run.
pub(crate) async fn send_steady<F, T, E>(
    warmup: Duration,
    window: Duration,
    in_flight: usize,
    per_send: u64,
    mut send: impl FnMut() -> F,
    opened: impl FnOnce(),
) -> Result<Steady, String>
where
    F: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut clock = SteadyClock::new(warmup, window, opened);
    let mut pending = FuturesUnordered::new();
    loop {
        while pending.len() < in_flight.max(1) {
            let sent = send();
            pending.push(async move {
                let started = Instant::now();
                let result = sent.await;
                (started, result)
            });
        }
        let Some((started, result)) = pending.next().await else {
            continue;
        };
        result.map_err(|e| format!("send: {e}"))?;
        if let Some(steady) = clock.receipts(started, Instant::now(), per_send) {
            return Ok(steady);
        }
    }
}

/// As [`send_steady`], for a producer whose receipts come in the order of its sends (one
/// Pulsar producer: its batches are answered in order): the sends wait in a queue, the
/// oldest is awaited, and the receipts of the rest of its batch are then taken as they are
/// found ready. No allocation and no wake-up of its own per send, and one clock reading per
/// receipt (the sends made right after it start at that reading).
pub(crate) async fn send_steady_oldest_first<F, T, E>(
    warmup: Duration,
    window: Duration,
    in_flight: usize,
    mut send: impl FnMut() -> F,
    opened: impl FnOnce(),
) -> Result<Steady, String>
where
    F: Future<Output = Result<T, E>> + Unpin,
    E: Display,
{
    let mut clock = SteadyClock::new(warmup, window, opened);
    let mut pending: VecDeque<(Instant, F)> = VecDeque::with_capacity(in_flight.max(1));
    // One clock reading per receipt: it is also the start of the sends that refill the
    // window right after it (they start within the same poll, microseconds later; the window
    // is full whenever the poll waits, so no refill follows a wait).
    let mut now = Instant::now();
    loop {
        let (started, result) = std::future::poll_fn(|cx| {
            while pending.len() < in_flight.max(1) {
                let mut sent = send();
                // A future does nothing until polled: the first poll starts the send.
                match Pin::new(&mut sent).poll(cx) {
                    Poll::Ready(result) => return Poll::Ready((now, result)),
                    Poll::Pending => pending.push_back((now, sent)),
                }
            }
            let Some((started, oldest)) = pending.front_mut() else {
                return Poll::Pending;
            };
            let result = ready!(Pin::new(oldest).poll(cx));
            let started = *started;
            pending.pop_front();
            Poll::Ready((started, result))
        })
        .await;
        now = Instant::now();
        result.map_err(|e| format!("send: {e}"))?;
        if let Some(steady) = clock.receipt(started, now) {
            return Ok(steady);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[tokio::test]
    async fn at_most_the_window_is_open_and_a_failure_ends_the_run() {
        let open = Rc::new(Cell::new(0usize));
        let most = Rc::new(Cell::new(0usize));
        let latencies = send_windowed(10, 3, || {
            let (open, most) = (Rc::clone(&open), Rc::clone(&most));
            async move {
                open.set(open.get() + 1);
                most.set(most.get().max(open.get()));
                // Lets the other open sends start before this one ends.
                tokio::task::yield_now().await;
                open.set(open.get() - 1);
                Ok::<_, String>(())
            }
        })
        .await
        .expect("every send succeeds");
        assert_eq!(latencies.len(), 10);
        assert_eq!(most.get(), 3);
        let mut count = 0;
        let failed = send_windowed(10, 3, || {
            count += 1;
            let fail = count == 4;
            async move { if fail { Err("refused") } else { Ok(()) } }
        })
        .await;
        assert_eq!(failed, Err("send: refused".to_owned()));
    }

    /// A send that takes 10 ms.
    async fn ten_ms() -> Result<(), String> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_run_counts_only_the_window() {
        let mut opened_at = None;
        let began = tokio::time::Instant::now();
        let steady = send_steady(
            Duration::from_secs(2),
            Duration::from_secs(3),
            4,
            1,
            // Each send takes 10 ms of virtual time: 4 in flight, 400 receipts a second.
            ten_ms,
            || opened_at = Some(began.elapsed()),
        )
        .await
        .expect("no send fails");
        let opened_at = opened_at.expect("the window opened");
        assert!(opened_at >= Duration::from_secs(2), "{opened_at:?}");
        assert!((3.0..3.05).contains(&steady.seconds), "{}", steady.seconds);
        // 400 a second for 3 s, give or take one round of 4 at each end.
        assert!(
            (1192..=1208).contains(&steady.messages),
            "{}",
            steady.messages
        );
        assert_eq!(steady.latencies.len() as u64, steady.messages);
        let ordered = send_steady_oldest_first(
            Duration::from_secs(2),
            Duration::from_secs(3),
            4,
            || Box::pin(ten_ms()),
            || {},
        )
        .await
        .expect("no send fails");
        assert!(
            (1192..=1208).contains(&ordered.messages),
            "{}",
            ordered.messages
        );
        // Each send's latency is its 10 ms: a refill starts at the reading of the receipt
        // before it.
        assert!(
            ordered.latencies.iter().all(|&us| us == 10_000),
            "{:?}",
            &ordered.latencies[..8]
        );
        let batched = send_steady(
            Duration::from_secs(2),
            Duration::from_secs(3),
            4,
            32,
            ten_ms,
            || {},
        )
        .await
        .expect("no send fails");
        // 400 sends a second of 32 messages each, for 3 s, give or take a round at each end.
        assert!(
            (1192 * 32..=1208 * 32).contains(&batched.messages),
            "{}",
            batched.messages
        );
        assert_eq!(batched.latencies.len() as u64, batched.messages);
        let failed = send_steady(
            Duration::from_secs(1),
            Duration::from_secs(1),
            2,
            1,
            || async { Err::<(), _>("refused") },
            || {},
        )
        .await;
        assert_eq!(failed.err(), Some("send: refused".to_owned()));
    }
}
