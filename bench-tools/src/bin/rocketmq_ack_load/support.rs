//! Small shared pieces: CPU time in seconds, key=value output, a latency histogram, argument parsing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// This process's CPU time so far (user + system), in seconds.
pub(crate) fn own_cpu_seconds() -> f64 {
    broker_tools::cpu::own().as_secs_f64()
}

/// Another process's CPU time so far (utime + stime from `/proc/PID/stat`), in seconds.
pub(crate) fn process_cpu_seconds(pid: u32) -> f64 {
    broker_tools::cpu::of_process(pid).map_or(0.0, |d| d.as_secs_f64())
}

/// `key=value` lines.
#[derive(Debug, Default, Clone)]
pub(crate) struct Kv(pub(crate) BTreeMap<String, String>);

impl Kv {
    pub(crate) fn put(&mut self, key: &str, value: impl std::fmt::Display) {
        self.0.insert(key.to_owned(), value.to_string());
    }

    pub(crate) fn f64(&self, key: &str) -> f64 {
        self.0.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    }

    pub(crate) fn u64(&self, key: &str) -> u64 {
        self.0.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    pub(crate) fn str(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Reads lines until `end` (or the end of the stream).
    pub(crate) fn read_block(reader: &mut impl BufRead) -> std::io::Result<Kv> {
        let mut kv = Kv::default();
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(kv);
            }
            let line = line.trim();
            if line == "end" {
                return Ok(kv);
            }
            if let Some((key, value)) = line.split_once('=') {
                kv.put(key, value);
            }
        }
    }

    pub(crate) fn print(&self) {
        let mut out = String::new();
        for (key, value) in &self.0 {
            let _ = writeln!(out, "{key}={value}");
        }
        out.push_str("end\n");
        print!("{out}");
        let _ = std::io::stdout().flush();
    }
}

/// Latencies in microseconds, in log-linear buckets (128 per power of two: under 1 % error).
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    pub(crate) counts: Vec<u64>,
    pub(crate) total: u64,
    pub(crate) max: u64,
}

pub(crate) const SUB_BITS: u32 = 7;
pub(crate) const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    pub(crate) fn new() -> Self {
        Self {
            counts: vec![0; (SUB * 40) as usize],
            total: 0,
            max: 0,
        }
    }

    pub(crate) fn index(value: u64) -> usize {
        if value < SUB {
            return value as usize;
        }
        let exponent = 63 - u64::from(value.leading_zeros());
        let shift = exponent - u64::from(SUB_BITS);
        let sub = (value >> shift) - SUB;
        (SUB + shift * SUB + sub) as usize
    }

    /// The largest value of bucket `index`.
    pub(crate) fn upper(index: usize) -> u64 {
        let index = index as u64;
        if index < SUB {
            return index;
        }
        let shift = (index - SUB) / SUB;
        let sub = (index - SUB) % SUB;
        ((SUB + sub + 1) << shift) - 1
    }

    pub(crate) fn record(&mut self, micros: u64) {
        let index = Self::index(micros).min(self.counts.len() - 1);
        self.counts[index] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    /// The value at quantile `q` (0..=1), in microseconds (the bucket's upper bound).
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Self::upper(index).min(self.max);
            }
        }
        self.max
    }
}

pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

pub(crate) fn topic_names(prefix: &str, topics: u32) -> Vec<String> {
    (0..topics).map(|i| format!("{prefix}{i}")).collect()
}

pub(crate) fn yes_no(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}
