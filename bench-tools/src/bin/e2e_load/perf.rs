//! Reading `pulsar-perf produce`'s log (Pulsar 4.0.8, run with `-i 1`).
//!
//! Its final "Aggregated throughput stats" line divides by the time from the start to the end
//! of its shutdown hook, which includes seconds of idle waiting after the last receipt; so the
//! window is taken from the log's own timestamps instead: from `Created N producers` to the
//! first `Closed Producer` (the producer closes once the last send was receipted). The message
//! count is the aggregated line's `records sent` (receipted sends, a few more than `-m` asks
//! for), and p50/p99 are the "Aggregated latency stats" line's `med` and `99pct` (from each
//! `sendAsync` to its receipt; pulsar-perf records them only at each stats interval, so a run
//! shorter than its first interval (`-i 1`: 1 s) has none, and gets none here).
//!
//! In steady state (`-time`, [`PerfLog::steady`]) the window is taken from its own progress
//! lines instead, which it prints every 10 s: `Throughput produced: N msg --- … med: X … 99pct:
//! Y …` with N the messages sent since the start and the latencies of that 10 s. The window
//! opens at the first such line at least the warm-up after `Created N producers` and closes at
//! the first at least the window after that; its messages are the difference of the two N,
//! its p50 and p99 the medians of the lines' `med` and `99pct` after the opening one.

/// What the log said so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PerfLog {
    /// Milliseconds since midnight of the `Created N producers` line.
    pub(crate) started_ms: Option<u64>,
    /// Milliseconds since midnight of the first `Closed Producer` line.
    pub(crate) closed_ms: Option<u64>,
    /// `records sent` of the aggregated throughput line.
    pub(crate) records: Option<u64>,
    /// `med` of the aggregated latency line.
    pub(crate) p50_ms: Option<f64>,
    /// `99pct` of the aggregated latency line.
    pub(crate) p99_ms: Option<f64>,
    /// Steady state: the warm-up and the window, in ms.
    pub(crate) steady: Option<(u64, u64)>,
    /// The progress lines read so far.
    pub(crate) progress: Vec<Progress>,
    /// The indexes in `progress` of the lines that opened and closed the window.
    pub(crate) window: (Option<usize>, Option<usize>),
}

/// One `Throughput produced: …` line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Progress {
    /// Its time of day in ms.
    pub(crate) at_ms: u64,
    /// Messages sent since the start.
    pub(crate) total: u64,
    /// The median latency of its interval.
    pub(crate) p50_ms: f64,
    /// The 99th percentile latency of its interval.
    pub(crate) p99_ms: f64,
}

/// `to - from` in ms, with the clock wrapping past midnight.
fn elapsed_ms(from: u64, to: u64) -> u64 {
    if to >= from {
        to - from
    } else {
        to + 86_400_000 - from
    }
}

/// The time of day of a log4j line `2026-12-03T14:17:57,465+0000 [...]`, in ms.
pub(crate) fn time_of_day_ms(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once('T')?;
    let stamp = rest.get(..12)?;
    let (hms, millis) = stamp.split_once([',', '.'])?;
    let mut parts = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + s) * 1000 + millis.parse::<u64>().ok()?)
}

/// The number right after `label` in `line` (spaces skipped).
fn number_after(line: &str, label: &str) -> Option<f64> {
    let (_, rest) = line.split_once(label)?;
    let text: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    text.parse().ok()
}

/// The number right before `label` in `line`.
fn number_before(line: &str, label: &str) -> Option<f64> {
    let (before, _) = line.split_once(label)?;
    before.split_whitespace().last()?.parse().ok()
}

impl PerfLog {
    /// Takes one line of the log.
    pub(crate) fn line(&mut self, line: &str) {
        if line.contains("PerformanceProducer")
            && line.contains("Created")
            && line.contains("producers")
        {
            self.started_ms = self.started_ms.or_else(|| time_of_day_ms(line));
        } else if line.contains("Throughput produced:") {
            self.progress_line(line);
        } else if line.contains("Closed Producer") {
            self.closed_ms = self.closed_ms.or_else(|| time_of_day_ms(line));
        } else if line.contains("Aggregated throughput stats") {
            self.records = number_before(line, "records sent").map(|n| n as u64);
        } else if line.contains("Aggregated latency stats") {
            // All zeros: no stats interval passed, nothing was recorded.
            let max = number_after(line, "Max:");
            if max.is_some_and(|max| max > 0.0) {
                self.p50_ms = number_after(line, "med:");
                self.p99_ms = number_after(line, "99pct:");
            }
        }
    }

    /// A log read in steady state: the window opens `warmup_ms` after the producers were
    /// created and lasts `window_ms`.
    pub(crate) fn steady(warmup_ms: u64, window_ms: u64) -> Self {
        Self {
            steady: Some((warmup_ms, window_ms)),
            ..Self::default()
        }
    }

    fn progress_line(&mut self, line: &str) {
        let (Some(at_ms), Some(total), Some(p50_ms), Some(p99_ms)) = (
            time_of_day_ms(line),
            number_after(line, "Throughput produced:"),
            number_after(line, "med:"),
            number_after(line, "99pct:"),
        ) else {
            return;
        };
        self.progress.push(Progress {
            at_ms,
            total: total as u64,
            p50_ms,
            p99_ms,
        });
        let (Some((warmup, window)), Some(started)) = (self.steady, self.started_ms) else {
            return;
        };
        let index = self.progress.len() - 1;
        match self.window {
            (None, _) if elapsed_ms(started, at_ms) >= warmup => self.window.0 = Some(index),
            (Some(open), None) if elapsed_ms(self.progress[open].at_ms, at_ms) >= window => {
                self.window.1 = Some(index);
            }
            _ => {}
        }
    }

    /// Messages, seconds, p50 and p99 of the steady-state window, once it closed.
    fn steady_outcome(&self) -> Result<(u64, f64, Option<f64>, Option<f64>), String> {
        let (Some(open), Some(close)) = self.window else {
            return Err(format!(
                "pulsar-perf: the steady-state window did not {} ({} progress lines)",
                if self.window.0.is_none() {
                    "open"
                } else {
                    "close"
                },
                self.progress.len()
            ));
        };
        let (first, last) = (self.progress[open], self.progress[close]);
        let inside = &self.progress[open + 1..=close];
        let p50s: Vec<f64> = inside.iter().map(|p| p.p50_ms).collect();
        let p99s: Vec<f64> = inside.iter().map(|p| p.p99_ms).collect();
        Ok((
            last.total.saturating_sub(first.total),
            elapsed_ms(first.at_ms, last.at_ms).max(1) as f64 / 1000.0,
            crate::stats::median(&p50s),
            crate::stats::median(&p99s),
        ))
    }

    /// Messages, seconds, p50 and p99, once the whole log was read.
    pub(crate) fn outcome(&self) -> Result<(u64, f64, Option<f64>, Option<f64>), String> {
        if self.steady.is_some() {
            return self.steady_outcome();
        }
        let (Some(start), Some(end)) = (self.started_ms, self.closed_ms) else {
            return Err("pulsar-perf: no `Created … producers` or `Closed Producer` line".into());
        };
        let records = self
            .records
            .ok_or("pulsar-perf: no aggregated throughput line")?;
        let elapsed = elapsed_ms(start, end);
        Ok((
            records,
            (elapsed.max(1)) as f64 / 1000.0,
            self.p50_ms,
            self.p99_ms,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-12-03T14:17:57,465+0000 [pulsar-perf-producer-exec-1-1] INFO  org.apache.pulsar.testclient.PerformanceProducer - Created 1 producers
2026-12-03T14:17:58,398+0000 [pulsar-timer-8-1] INFO  org.apache.pulsar.client.impl.ProducerStatsRecorderImpl - [t] [standalone-0-3] --- Publish throughput: 26782.06 msg/s --- 209.23 Mbit/s --- Latency: med: 18.000 ms - 95pct: 43.000 ms - 99pct: 85.000 ms
2026-12-03T14:18:01,284+0000 [pulsar-perf-producer-exec-1-1] INFO  org.apache.pulsar.testclient.PerformanceProducer - ------------- DONE (reached the maximum number: 200000 of production) --------------
2026-12-03T14:18:01,292+0000 [pulsar-client-io-2-1] INFO  org.apache.pulsar.client.impl.ProducerImpl - [t] [standalone-0-3] Closed Producer
2026-12-03T14:18:06,484+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient.PerformanceProducer - Aggregated throughput stats --- 200864 records sent --- 20061.107 msg/s --- 156.727 Mbit/s 
2026-12-03T14:18:06,622+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient.PerformanceProducer - Aggregated latency stats --- Latency: mean:  16.672 ms - med:  12.751 - 95pct:  39.077 - 99pct:  84.277 - 99.9pct:  86.716 - 99.99pct:  86.913 - 99.999pct:  89.914 - Max: 102.235
";

    #[test]
    fn reads_the_window_count_and_latency() {
        let mut log = PerfLog::default();
        for line in LOG.lines() {
            log.line(line);
        }
        assert_eq!(log.started_ms, time_of_day_ms("xT14:17:57,465+0000"));
        let (records, seconds, p50, p99) = log.outcome().unwrap();
        assert_eq!(records, 200_864);
        assert!((seconds - 3.827).abs() < 1e-9, "{seconds}");
        assert_eq!((p50, p99), (Some(12.751), Some(84.277)));
    }

    #[test]
    fn timestamps_and_gaps() {
        assert_eq!(
            time_of_day_ms("2026-12-03T01:02:03,004+0000 [main]"),
            Some(3_723_004)
        );
        assert_eq!(time_of_day_ms("no time here"), None);
        let mut log = PerfLog::default();
        log.line(LOG.lines().next().unwrap());
        assert!(log.outcome().is_err());
        log.line("2026-12-03T14:17:22,341+0000 [x] INFO  x - Aggregated latency stats --- Latency: mean:   0.000 ms - med:   0.000 - 95pct:   0.000 - 99pct:   0.000 - Max:   0.000");
        assert_eq!((log.p50_ms, log.p99_ms), (None, None));
        let wrapped = PerfLog {
            started_ms: Some(86_399_000),
            closed_ms: Some(1_000),
            records: Some(10),
            ..PerfLog::default()
        };
        assert_eq!(wrapped.outcome().unwrap().1, 2.0);
    }

    #[test]
    fn a_steady_window_from_the_progress_lines() {
        let progress = |at: &str, total: u64, p50: f64, p99: f64| {
            format!(
                "2026-12-07T06:{at}+0000 [main] INFO  org.apache.pulsar.testclient.PerformanceProducer - Throughput produced: {total} msg --- 163658.4 msg/s ---   1278.6 Mbit/s  --- failure      0.0 msg/s --- Latency: mean:   5.127 ms - med:   {p50:.3} - 95pct:   9.114 - 99pct:  {p99:.3} - 99.9pct:  68.365 - 99.99pct:  71.689 - Max:  76.260"
            )
        };
        let mut log = PerfLog::steady(20_000, 30_000);
        log.line("2026-12-07T06:05:37,823+0000 [x] INFO  org.apache.pulsar.testclient.PerformanceProducer - Created 1 producers");
        log.line(&progress("05:47,220", 1_000_000, 9.0, 90.0));
        log.line(&progress("05:57,220", 2_000_000, 8.0, 80.0));
        assert_eq!(log.window, (None, None), "19.4 s: still warming up");
        assert!(log.outcome().is_err());
        log.line(&progress("06:07,220", 3_000_000, 4.0, 40.0));
        assert_eq!(log.window, (Some(2), None));
        log.line(&progress("06:17,220", 4_000_000, 3.0, 30.0));
        log.line(&progress("06:27,220", 5_000_000, 5.0, 50.0));
        assert!(log.outcome().unwrap_err().contains("did not close"));
        log.line(&progress("06:37,221", 6_500_000, 4.5, 45.0));
        assert_eq!(log.window, (Some(2), Some(5)));
        log.line(&progress("06:47,220", 9_000_000, 1.0, 1.0));
        let (messages, seconds, p50, p99) = log.outcome().unwrap();
        assert_eq!(messages, 3_500_000);
        assert!((seconds - 30.001).abs() < 1e-9, "{seconds}");
        assert_eq!((p50, p99), (Some(4.5), Some(45.0)));
    }
}
