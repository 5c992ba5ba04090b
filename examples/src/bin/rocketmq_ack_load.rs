//! Load comparison of immediate and batched RocketMQ acks against the proxy emulator running
//! in a separate process (`rocketmq_emulator`, found next to this executable).
//!
//! ```sh
//! cargo build --release -p examples -p rocketmq-grpc-emulator --bins
//! target/release/rocketmq_ack_load --duration 60            # the full run (about 10 minutes)
//! target/release/rocketmq_ack_load --duration 10 --scenarios a,c   # a quick look
//! ```
//!
//! Scenarios, each run once per ack mode (immediate: one entry per `AckMessage`, what the
//! official clients send; batched: the default `AckSettings`, 1,024 entries or 5 s per
//! (endpoint, topic)):
//!
//! - **(a)** one topic, **(b)** 1,000 topics: 4 KiB messages at a target rate (8,000 msg/s)
//!   for a duration (60 s). Every mode gets a fresh emulator process, a consumer process
//!   (`--role consume`: a `PushConsumer` subscribed to every topic) and a producer process
//!   (`--role produce`: a `Producer` over gRPC, paced). The consumer measures its own CPU time
//!   (`getrusage`) from the moment it is subscribed, before the first message is sent, until its
//!   shutdown has flushed the last ack; the producer's CPU is reported separately and not
//!   counted as client CPU. Consume-to-ack-confirmed latency is taken by an `AckObserver`: from
//!   the moment the handler returns to the moment the ack's own result arrives.
//! - **(c)** ack-path saturation: one topic, 1,000,000 messages received with raw
//!   `ReceiveMessage` calls, then acknowledged through the consumer's ack path (an
//!   `ack_batcher::Batcher` with the `AckFlusher` and the same settings as
//!   `AckSettings::default()`), against the ceiling of raw 1,024-entry `AckMessage` calls for
//!   another 1,000,000 received messages, measured in the same run and against the same
//!   emulator process.
//!
//! It prints a markdown table per scenario with the targets of the issue and whether each was
//! met (`--markdown-out PATH` also writes them to a file). Run `--help` for every flag.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ack_batcher::{BatchInfo, Batcher, FlushReason, ItemOptions, ItemReply, ItemView, Next};
use ack_batcher::{Observer, RetryPolicy};
use rocketmq_grpc::pb;
use rocketmq_grpc::{
    AckEntry, AckFlusher, AckKey, AckSettings, ClientConfig, ConsumeResult, Endpoint,
    MessageHandler, OutgoingMessage, Producer, PushConsumer, ReceivedMessage, Session, wire,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: rocketmq_ack_load [options]
  --duration SECS        producing time per mode in (a) and (b) (default 60)
  --rate N               messages per second (default 8000)
  --body BYTES           message body size (default 4096)
  --scenarios LIST       any of a,b,c (default a,b,c)
  --topics-b N           topics of scenario (b) (default 1000)
  --queues-a Q           queues of the topic of (a) (default 4)
  --queues-b Q           queues per topic of (b) (default 1)
  --c-messages N         acks per path in (c) (default 1000000)
  --c-in-flight N        concurrent AckMessage calls of the raw ceiling in (c) (default 4, the
                         batcher's max_in_flight_per_key)
  --c-submitters N       tasks submitting acks to the batcher in (c) (default 1)
  --c-single N           also ack N messages with one entry per call in (c) (default 50000; 0 = skip)
  --emulator PATH        the rocketmq_emulator binary (default: next to this executable)
  --markdown-out PATH    also write the tables to PATH
";

// ---------------------------------------------------------------------------------------------
// Small shared pieces: CPU time, key=value output, a latency histogram.

/// This process's CPU time so far (user + system), in seconds.
fn own_cpu_seconds() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is zero-initialised plain
    // data of the right type.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Another process's CPU time so far (utime + stime from `/proc/PID/stat`), in seconds.
fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may contain spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    (ticks(14).unwrap_or(0.0) + ticks(15).unwrap_or(0.0)) / hz
}

/// `key=value` lines.
#[derive(Debug, Default, Clone)]
struct Kv(BTreeMap<String, String>);

impl Kv {
    fn put(&mut self, key: &str, value: impl std::fmt::Display) {
        self.0.insert(key.to_owned(), value.to_string());
    }

    fn f64(&self, key: &str) -> f64 {
        self.0.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    }

    fn u64(&self, key: &str) -> u64 {
        self.0.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    fn str(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Reads lines until `end` (or the end of the stream).
    fn read_block(reader: &mut impl BufRead) -> std::io::Result<Kv> {
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

    fn print(&self) {
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
struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    fn new() -> Self {
        Self {
            counts: vec![0; (SUB * 40) as usize],
            total: 0,
            max: 0,
        }
    }

    fn index(value: u64) -> usize {
        if value < SUB {
            return value as usize;
        }
        let exponent = 63 - u64::from(value.leading_zeros());
        let shift = exponent - u64::from(SUB_BITS);
        let sub = (value >> shift) - SUB;
        (SUB + shift * SUB + sub) as usize
    }

    /// The largest value of bucket `index`.
    fn upper(index: usize) -> u64 {
        let index = index as u64;
        if index < SUB {
            return index;
        }
        let shift = (index - SUB) / SUB;
        let sub = (index - SUB) % SUB;
        ((SUB + sub + 1) << shift) - 1
    }

    fn record(&mut self, micros: u64) {
        let index = Self::index(micros).min(self.counts.len() - 1);
        self.counts[index] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    /// The value at quantile `q` (0..=1), in microseconds (the bucket's upper bound).
    fn quantile(&self, q: f64) -> u64 {
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

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value
        .parse()
        .map_err(|_| format!("{flag} needs a number, not {value:?}"))
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn topic_names(prefix: &str, topics: u32) -> Vec<String> {
    (0..topics).map(|i| format!("{prefix}{i}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Role `consume`: a PushConsumer with a latency observer, in its own process.

#[derive(Debug)]
struct ConsumeArgs {
    endpoint: String,
    prefix: String,
    topics: u32,
    queues: u32,
    group: String,
    batched: bool,
}

/// Handler-return times by message id, sharded to keep lock contention low.
struct Latency {
    started: Vec<Mutex<HashMap<String, Instant>>>,
    hasher: std::collections::hash_map::RandomState,
    histogram: Mutex<Histogram>,
    requests_by_reason: Mutex<BTreeMap<&'static str, u64>>,
    /// Errors that led to a retry or a final failure, by message (first 60 characters).
    errors: Mutex<BTreeMap<String, u64>>,
    confirmed: AtomicU64,
    failed: AtomicU64,
}

impl Latency {
    fn new() -> Self {
        Self {
            started: (0..64).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            histogram: Mutex::new(Histogram::new()),
            requests_by_reason: Mutex::new(BTreeMap::new()),
            errors: Mutex::new(BTreeMap::new()),
            confirmed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, Instant>> {
        let hash = self.hasher.hash_one(id) as usize;
        &self.started[hash % self.started.len()]
    }

    fn handled(&self, id: &str) {
        self.shard(id)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), Instant::now());
    }
}

impl std::fmt::Debug for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latency")
            .field("confirmed", &self.confirmed)
            .finish_non_exhaustive()
    }
}

impl Observer<AckKey, AckEntry, (), rocketmq_grpc::Error> for Latency {
    fn before_flush(&self, _key: &AckKey, batch: &BatchInfo, _items: &[AckEntry]) {
        *self
            .requests_by_reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(batch.reason.as_str())
            .or_default() += 1;
    }

    fn after_flush(
        &self,
        _key: &AckKey,
        _batch: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), rocketmq_grpc::Error>],
    ) {
        let now = Instant::now();
        let mut latencies = Vec::with_capacity(items.len());
        for view in items {
            let error = match view.reply {
                ItemReply::Ok(()) => continue,
                ItemReply::Err(error) => error.to_string(),
                ItemReply::Missing => "result missing".to_owned(),
            };
            let error: String = error.chars().take(60).collect();
            *self
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(error)
                .or_default() += 1;
        }
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            let started = self
                .shard(&view.item.message_id)
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&view.item.message_id);
            if matches!(view.reply, ItemReply::Ok(())) {
                self.confirmed.fetch_add(1, Ordering::Relaxed);
                if let Some(started) = started {
                    latencies.push(now.saturating_duration_since(started).as_micros() as u64);
                }
            } else {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut histogram = self
            .histogram
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for micros in latencies {
            histogram.record(micros);
        }
    }
}

/// Counts, keeps the first and last handling times, and starts the ack latency clock.
struct LoadHandler(Arc<HandlerState>);

struct HandlerState {
    latency: Arc<Latency>,
    base: Instant,
    consumed: AtomicU64,
    checksum: AtomicU64,
    /// Nanoseconds since `base` (+1, so that 0 means "none yet").
    first: AtomicU64,
    last: AtomicU64,
}

impl std::fmt::Debug for HandlerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerState")
            .field("consumed", &self.consumed)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl MessageHandler for LoadHandler {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let state = &self.0;
        // Touch the body, as an application would.
        let byte = message.body.last().copied().unwrap_or(0);
        state.checksum.fetch_add(u64::from(byte), Ordering::Relaxed);
        let now = state.base.elapsed().as_nanos() as u64 + 1;
        let _ = state
            .first
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        state.last.fetch_max(now, Ordering::Relaxed);
        state.latency.handled(&message.message_id);
        state.consumed.fetch_add(1, Ordering::Relaxed);
        ConsumeResult::Success
    }
}

fn consume_role(args: ConsumeArgs) -> Result<(), BoxError> {
    let rt = runtime()?;
    rt.block_on(consume(args))
}

async fn consume(args: ConsumeArgs) -> Result<(), BoxError> {
    let topics = topic_names(&args.prefix, args.topics);
    let latency = Arc::new(Latency::new());
    let handler = Arc::new(HandlerState {
        latency: Arc::clone(&latency),
        base: Instant::now(),
        consumed: AtomicU64::new(0),
        checksum: AtomicU64::new(0),
        first: AtomicU64::new(0),
        last: AtomicU64::new(0),
    });
    let acks = if args.batched {
        AckSettings::default()
    } else {
        AckSettings::immediate()
    };
    // Every receive loop reserves a whole receive batch (32) before long-polling; with fewer
    // permits than loops × 32 idle loops would starve the busy ones.
    let loops = (args.topics * args.queues) as usize;
    let concurrency = (loops * 32).clamp(256, 65_536);
    let mut builder = PushConsumer::builder(ClientConfig::new(&args.endpoint)?, &args.group)
        .concurrency(concurrency)
        .acks(acks.observer(latency.clone()));
    for topic in &topics {
        builder = builder.subscribe(topic, "*");
    }
    let consumer = builder.start(LoadHandler(Arc::clone(&handler))).await?;

    // Told how many messages to expect on stdin once the producer is done.
    let (expect_tx, mut expect_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if let Some(n) = line.trim().strip_prefix("expect ")
                && let Ok(n) = n.trim().parse()
            {
                let _ = expect_tx.send(n);
            }
        }
    });

    let cpu_start = own_cpu_seconds();
    let wall_start = Instant::now();
    println!("ready");
    let _ = std::io::stdout().flush();

    let expected = expect_rx.recv().await.unwrap_or(u64::MAX);
    // Wait until everything is consumed, or nothing moved for 30 s.
    let mut last_progress = (handler.consumed.load(Ordering::Relaxed), Instant::now());
    while handler.consumed.load(Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let consumed = handler.consumed.load(Ordering::Relaxed);
        if consumed != last_progress.0 {
            last_progress = (consumed, Instant::now());
        } else if last_progress.1.elapsed() > Duration::from_secs(30) {
            eprintln!("consumer: stuck at {consumed} of {expected} messages; shutting down");
            break;
        }
    }
    let before = consumer.stats();
    let report = consumer.shutdown(Duration::from_secs(30)).await;
    let cpu = own_cpu_seconds() - cpu_start;
    let wall = wall_start.elapsed().as_secs_f64();

    let consumed = handler.consumed.load(Ordering::Relaxed);
    let first = handler.first.load(Ordering::Relaxed);
    let last = handler.last.load(Ordering::Relaxed);
    let span = if first > 0 && last > first {
        (last - first) as f64 / 1e9
    } else {
        0.0
    };
    let histogram = latency
        .histogram
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let ms = |micros: u64| format!("{:.3}", micros as f64 / 1000.0);
    let mut kv = Kv::default();
    kv.put("mode", if args.batched { "batched" } else { "immediate" });
    kv.put("expected", expected);
    kv.put("consumed", consumed);
    kv.put("received", before.received);
    kv.put("confirmed", latency.confirmed.load(Ordering::Relaxed));
    kv.put("ack_failed", latency.failed.load(Ordering::Relaxed));
    kv.put("unacknowledged", report.unacknowledged.len());
    kv.put("abandoned", report.acks.abandoned);
    kv.put("pending_at_shutdown", report.acks.pending_at_close);
    kv.put("handlers_finished", report.handlers_finished);
    kv.put("cpu_s", format!("{cpu:.3}"));
    kv.put("wall_s", format!("{wall:.3}"));
    kv.put("consume_span_s", format!("{span:.3}"));
    kv.put(
        "throughput",
        format!(
            "{:.1}",
            if span > 0.0 {
                consumed as f64 / span
            } else {
                0.0
            }
        ),
    );
    kv.put("concurrency", concurrency);
    kv.put("latency_samples", histogram.total);
    kv.put("lat_p50_ms", ms(histogram.quantile(0.50)));
    kv.put("lat_p90_ms", ms(histogram.quantile(0.90)));
    kv.put("lat_p99_ms", ms(histogram.quantile(0.99)));
    kv.put("lat_p999_ms", ms(histogram.quantile(0.999)));
    kv.put("lat_max_ms", ms(histogram.max));
    let reasons = latency
        .requests_by_reason
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let reasons: Vec<String> = reasons.iter().map(|(r, n)| format!("{r}:{n}")).collect();
    kv.put("flush_reasons", reasons.join(","));
    let errors = latency
        .errors
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let errors: Vec<String> = errors
        .iter()
        .map(|(e, n)| format!("{n}x {}", e.replace(['\n', ','], " ")))
        .collect();
    kv.put("ack_errors", errors.join("; "));
    kv.put("checksum", handler.checksum.load(Ordering::Relaxed));
    kv.print();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Role `produce`: a paced Producer over gRPC, in its own process.

#[derive(Debug)]
struct ProduceArgs {
    endpoint: String,
    prefix: String,
    topics: u32,
    rate: u64,
    duration: Duration,
    body: usize,
}

fn produce_role(args: ProduceArgs) -> Result<(), BoxError> {
    let rt = runtime()?;
    rt.block_on(produce(args))
}

async fn produce(args: ProduceArgs) -> Result<(), BoxError> {
    let topics: Arc<Vec<String>> = Arc::new(topic_names(&args.prefix, args.topics));
    let producer = Arc::new(Producer::new(Session::new(ClientConfig::new(
        &args.endpoint,
    )?)?));
    // Learn every route before the clock starts (one message per topic is not sent here).
    let warm = Arc::new(tokio::sync::Semaphore::new(32));
    let mut warmups = tokio::task::JoinSet::new();
    for topic in topics.iter() {
        let producer = Arc::clone(&producer);
        let permit = Arc::clone(&warm).acquire_owned().await?;
        let topic = topic.clone();
        warmups.spawn(async move {
            let _permit = permit;
            // An empty-body message is refused before it is sent, after the route is known.
            let _ = producer.send(OutgoingMessage::new(topic, Vec::new())).await;
        });
    }
    while warmups.join_next().await.is_some() {}

    let total = args.rate * args.duration.as_secs();
    let body = Arc::new(vec![b'm'; args.body]);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(512));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let cpu_start = own_cpu_seconds();
    let start = Instant::now();
    let mut started = 0u64;
    while started < total {
        let due = ((start.elapsed().as_secs_f64() * args.rate as f64) as u64).min(total);
        while started < due {
            let permit = Arc::clone(&in_flight).acquire_owned().await?;
            let producer = Arc::clone(&producer);
            let message = OutgoingMessage::new(
                topics[(started % topics.len() as u64) as usize].clone(),
                body.as_ref().clone(),
            );
            let (sent, failed, first_error) = (
                Arc::clone(&sent),
                Arc::clone(&failed),
                Arc::clone(&first_error),
            );
            tokio::spawn(async move {
                let _permit = permit;
                match producer.send(message).await {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        first_error
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert_with(|| error.to_string());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            });
            started += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _all = in_flight.acquire_many(512).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut kv = Kv::default();
    let sent = sent.load(Ordering::Relaxed);
    kv.put("sent", sent);
    kv.put("failed", failed.load(Ordering::Relaxed));
    kv.put("elapsed_s", format!("{elapsed:.3}"));
    kv.put("rate", format!("{:.1}", sent as f64 / elapsed));
    kv.put("cpu_s", format!("{:.3}", own_cpu_seconds() - cpu_start));
    if let Some(error) = first_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        kv.put("first_error", error.replace('\n', " "));
    }
    kv.print();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The emulator child process.

struct EmulatorProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    endpoint: String,
}

impl EmulatorProcess {
    fn start(path: &PathBuf, args: &[String]) -> Result<Self, BoxError> {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", path.display()))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no emulator stdout")?);
        let mut line = String::new();
        loop {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                return Err("the emulator exited before printing its endpoint".into());
            }
            if let Some(endpoint) = line.trim().strip_prefix("endpoint=") {
                let endpoint = endpoint.to_owned();
                return Ok(Self {
                    child,
                    stdin,
                    stdout,
                    endpoint,
                });
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stats(&mut self) -> Result<Kv, BoxError> {
        let stdin = self.stdin.as_mut().ok_or("emulator stdin closed")?;
        stdin.write_all(b"stats\n")?;
        stdin.flush()?;
        Ok(Kv::read_block(&mut self.stdout)?)
    }

    /// Closes stdin (the emulator stops) and returns its final statistics.
    fn finish(mut self) -> Result<Kv, BoxError> {
        drop(self.stdin.take());
        let kv = Kv::read_block(&mut self.stdout)?;
        let _ = self.child.wait();
        Ok(kv)
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios (a) and (b).

#[derive(Debug, Clone)]
struct Options {
    duration: u64,
    rate: u64,
    body: usize,
    scenarios: Vec<char>,
    topics_b: u32,
    queues_a: u32,
    queues_b: u32,
    c_messages: usize,
    c_in_flight: usize,
    c_submitters: usize,
    c_single: usize,
    emulator: PathBuf,
    markdown_out: Option<PathBuf>,
}

/// One mode of (a) or (b).
#[derive(Debug)]
struct ModeResult {
    producer: Kv,
    consumer: Kv,
    emulator: Kv,
}

fn run_mode(
    options: &Options,
    prefix: &str,
    topics: u32,
    queues: u32,
    batched: bool,
) -> Result<ModeResult, BoxError> {
    let mode = if batched { "batched" } else { "immediate" };
    eprintln!("== {prefix}: {topics} topic(s) x {queues} queue(s), {mode} acks");
    let group = "load";
    let emulator = EmulatorProcess::start(
        &options.emulator,
        &[
            "--topics".into(),
            topics.to_string(),
            "--prefix".into(),
            prefix.into(),
            "--queues".into(),
            queues.to_string(),
            "--group".into(),
            group.into(),
        ],
    )?;
    let exe = std::env::current_exe()?;
    let mut consumer_args: Vec<String> = vec![
        "--role".into(),
        "consume".into(),
        "--endpoint".into(),
        emulator.endpoint.clone(),
        "--prefix".into(),
        prefix.into(),
        "--topics".into(),
        topics.to_string(),
        "--queues".into(),
        queues.to_string(),
        "--group".into(),
        group.into(),
    ];
    if batched {
        consumer_args.push("--batched".into());
    }
    let mut consumer = Command::new(&exe)
        .args(&consumer_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut consumer_in = consumer.stdin.take().ok_or("no consumer stdin")?;
    let mut consumer_out = BufReader::new(consumer.stdout.take().ok_or("no consumer stdout")?);
    let mut line = String::new();
    loop {
        line.clear();
        if consumer_out.read_line(&mut line)? == 0 {
            return Err("the consumer exited before it was ready".into());
        }
        if line.trim() == "ready" {
            break;
        }
    }
    eprintln!(
        "   consumer subscribed; producing for {} s",
        options.duration
    );
    let producer_out = Command::new(&exe)
        .args([
            "--role".into(),
            "produce".into(),
            "--endpoint".into(),
            emulator.endpoint.clone(),
            "--prefix".into(),
            prefix.into(),
            "--topics".into(),
            topics.to_string(),
            "--rate".into(),
            options.rate.to_string(),
            "--duration".into(),
            options.duration.to_string(),
            "--body".into(),
            options.body.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let producer = Kv::read_block(&mut producer_out.stdout.as_slice())?;
    eprintln!(
        "   produced {} messages at {} msg/s ({} failed{})",
        producer.u64("sent"),
        producer.str("rate"),
        producer.u64("failed"),
        match producer.str("first_error") {
            "" => String::new(),
            error => format!(": {error}"),
        }
    );
    writeln!(consumer_in, "expect {}", producer.u64("sent"))?;
    consumer_in.flush()?;
    let consumer_kv = Kv::read_block(&mut consumer_out)?;
    drop(consumer_in);
    let _ = consumer.wait();
    let emulator = emulator.finish()?;
    eprintln!(
        "   consumed {} at {} msg/s; client CPU {} s; {} ack RPCs; p99 {} ms",
        consumer_kv.u64("consumed"),
        consumer_kv.str("throughput"),
        consumer_kv.str("cpu_s"),
        emulator.u64("ack_rpcs"),
        consumer_kv.str("lat_p99_ms")
    );
    Ok(ModeResult {
        producer,
        consumer: consumer_kv,
        emulator,
    })
}

fn yes_no(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

fn none_if_empty(text: &str) -> String {
    if text.is_empty() {
        "none".into()
    } else {
        text.replace('|', "/")
    }
}

fn pct_change(before: f64, after: f64) -> String {
    if before == 0.0 {
        return "n/a".into();
    }
    format!("{:+.1} %", (after - before) / before * 100.0)
}

/// The markdown table of one scenario, immediate against batched.
fn flow_table(
    title: &str,
    one_topic: bool,
    options: &Options,
    immediate: &ModeResult,
    batched: &ModeResult,
) -> String {
    let (i, b) = (immediate, batched);
    let mut out = String::new();
    let _ = writeln!(out, "#### {title}\n");
    let _ = writeln!(
        out,
        "| metric | immediate | batched | change | target | met? |\n| --- | ---: | ---: | ---: | --- | --- |"
    );
    let mut row = |metric: &str, a: String, b: String, change: String, target: &str, met: &str| {
        let _ = writeln!(
            out,
            "| {metric} | {a} | {b} | {change} | {target} | {met} |"
        );
    };
    row(
        "messages produced (achieved rate, msg/s)",
        format!("{} ({})", i.producer.u64("sent"), i.producer.str("rate")),
        format!("{} ({})", b.producer.u64("sent"), b.producer.str("rate")),
        String::new(),
        &format!("{} msg/s for {} s", options.rate, options.duration),
        "",
    );
    row(
        "messages consumed",
        i.consumer.u64("consumed").to_string(),
        b.consumer.u64("consumed").to_string(),
        String::new(),
        "all produced",
        yes_no(
            i.consumer.u64("consumed") >= i.producer.u64("sent")
                && b.consumer.u64("consumed") >= b.producer.u64("sent"),
        ),
    );
    let (ti, tb) = (i.consumer.f64("throughput"), b.consumer.f64("throughput"));
    row(
        "consume throughput (msg/s)",
        format!("{ti:.0}"),
        format!("{tb:.0}"),
        pct_change(ti, tb),
        "unchanged (batched ≥ 98 % of immediate)",
        yes_no(tb >= 0.98 * ti),
    );
    let (ri, rb) = (
        i.emulator.u64("ack_rpcs") as f64,
        b.emulator.u64("ack_rpcs") as f64,
    );
    // Compared per acknowledged message, so that a baseline that did not acknowledge everything
    // (or retried a lot) is neither flattered nor penalised; equal to the plain ratio of RPCs
    // when both modes acknowledged every message.
    let per_ack = |rpcs: f64, kv: &Kv| rpcs / (kv.u64("acked").max(1) as f64);
    let (pi, pb) = (per_ack(ri, &i.emulator), per_ack(rb, &b.emulator));
    let reduction = if pi > 0.0 { 1.0 - pb / pi } else { 0.0 };
    let full = b.emulator.u64("ack_requests_1024");
    let (target, met) = if one_topic {
        (
            "≥ 99.9 % fewer, requests of exactly 1,024 entries seen",
            reduction >= 0.999 && full > 0,
        )
    } else {
        ("≥ 97 % fewer", reduction >= 0.97)
    };
    row(
        "ack RPCs",
        format!("{ri:.0}"),
        format!("{rb:.0}"),
        pct_change(ri, rb),
        "",
        "",
    );
    row(
        "ack RPCs per acknowledged message",
        format!("{pi:.4}"),
        format!("{pb:.4}"),
        format!("{:.2} % fewer", reduction * 100.0),
        target,
        yes_no(met),
    );
    row(
        "mean entries per ack RPC",
        i.emulator.str("mean_entries_per_ack_rpc").into(),
        b.emulator.str("mean_entries_per_ack_rpc").into(),
        String::new(),
        "",
        "",
    );
    row(
        "ack RPCs of exactly 1,024 entries",
        i.emulator.u64("ack_requests_1024").to_string(),
        full.to_string(),
        String::new(),
        "",
        "",
    );
    row(
        "batched flushes by reason (client)",
        i.consumer.str("flush_reasons").into(),
        b.consumer.str("flush_reasons").into(),
        String::new(),
        "",
        "",
    );
    let (ci, cb) = (i.consumer.f64("cpu_s"), b.consumer.f64("cpu_s"));
    let per_msg = |kv: &Kv| kv.f64("cpu_s") / (kv.u64("consumed").max(1) as f64);
    let per_10k_acks = |kv: &Kv| kv.f64("cpu_s") / (kv.u64("confirmed").max(1) as f64) * 1e4;
    row(
        "client (consumer process) CPU s",
        format!("{ci:.2}"),
        format!("{cb:.2}"),
        pct_change(ci, cb),
        "",
        "",
    );
    row(
        "client CPU s per 10,000 acks",
        format!("{:.3}", per_10k_acks(&i.consumer)),
        format!("{:.3}", per_10k_acks(&b.consumer)),
        pct_change(per_10k_acks(&i.consumer), per_10k_acks(&b.consumer)),
        "",
        "",
    );
    let (mi, mb) = (per_msg(&i.consumer), per_msg(&b.consumer));
    row(
        "client CPU µs per consumed message",
        format!("{:.1}", mi * 1e6),
        format!("{:.1}", mb * 1e6),
        pct_change(mi, mb),
        "≥ 30 % lower",
        yes_no(mb <= 0.7 * mi),
    );
    row(
        "producer process CPU s (not client CPU above)",
        i.producer.str("cpu_s").into(),
        b.producer.str("cpu_s").into(),
        pct_change(i.producer.f64("cpu_s"), b.producer.f64("cpu_s")),
        "",
        "",
    );
    row(
        "emulator process CPU s",
        i.emulator.str("cpu_s").into(),
        b.emulator.str("cpu_s").into(),
        pct_change(i.emulator.f64("cpu_s"), b.emulator.f64("cpu_s")),
        "",
        "",
    );
    row(
        "ack confirmation p50 (ms)",
        i.consumer.str("lat_p50_ms").into(),
        b.consumer.str("lat_p50_ms").into(),
        String::new(),
        "",
        "",
    );
    let p99 = b.consumer.f64("lat_p99_ms");
    row(
        "ack confirmation p99 (ms)",
        i.consumer.str("lat_p99_ms").into(),
        b.consumer.str("lat_p99_ms").into(),
        String::new(),
        "batched ≤ 5,000 + 100",
        yes_no(p99 <= 5_100.0 && b.consumer.u64("latency_samples") > 0),
    );
    row(
        "ack confirmation max (ms)",
        i.consumer.str("lat_max_ms").into(),
        b.consumer.str("lat_max_ms").into(),
        String::new(),
        "",
        "",
    );
    let (ei, eb) = (
        i.emulator.u64("expired_handles"),
        b.emulator.u64("expired_handles"),
    );
    row(
        "expired receipt handles",
        ei.to_string(),
        eb.to_string(),
        String::new(),
        "0",
        yes_no(ei == 0 && eb == 0),
    );
    row(
        "redelivered / unacknowledged after shutdown",
        format!(
            "{} / {}",
            i.emulator.u64("redelivered"),
            i.consumer.u64("unacknowledged")
        ),
        format!(
            "{} / {}",
            b.emulator.u64("redelivered"),
            b.consumer.u64("unacknowledged")
        ),
        String::new(),
        "",
        "",
    );
    row(
        "delivered (emulator) / received (consumer)",
        format!(
            "{} / {}",
            i.emulator.u64("messages_delivered"),
            i.consumer.u64("received")
        ),
        format!(
            "{} / {}",
            b.emulator.u64("messages_delivered"),
            b.consumer.u64("received")
        ),
        String::new(),
        "",
        "",
    );
    row(
        "ack errors seen by the observer (retried or final)",
        none_if_empty(i.consumer.str("ack_errors")),
        none_if_empty(b.consumer.str("ack_errors")),
        String::new(),
        "",
        "",
    );
    row(
        "acknowledged (emulator)",
        i.emulator.u64("acked").to_string(),
        b.emulator.u64("acked").to_string(),
        String::new(),
        "",
        "",
    );
    out.push('\n');
    out
}

// ---------------------------------------------------------------------------------------------
// Scenario (c): ack-path saturation.

/// Counts final outcomes, like the consumer's own observer.
#[derive(Debug, Default)]
struct Resolved {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Observer<AckKey, AckEntry, (), rocketmq_grpc::Error> for Resolved {
    fn after_flush(
        &self,
        _key: &AckKey,
        _batch: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), rocketmq_grpc::Error>],
    ) {
        let mut ok = 0;
        let mut failed = 0;
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            if matches!(view.reply, ItemReply::Ok(())) {
                ok += 1;
            } else {
                failed += 1;
            }
        }
        self.ok.fetch_add(ok, Ordering::Relaxed);
        self.failed.fetch_add(failed, Ordering::Relaxed);
    }
}

/// A received message as the consumer keeps it for its ack.
#[derive(Debug, Clone)]
struct Held {
    message_id: String,
    receipt_handle: String,
}

async fn receive_all(
    session: &Session,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    count: usize,
) -> Result<Vec<Held>, BoxError> {
    let mut client = wire::client(session, endpoint)?;
    let mut held = Vec::with_capacity(count);
    let mut empty = 0;
    while held.len() < count {
        let request = pb::ReceiveMessageRequest {
            group: Some(wire::resource(session, group)),
            message_queue: Some(pb::MessageQueue {
                topic: Some(wire::resource(session, topic)),
                id: 0,
                permission: pb::Permission::ReadWrite as i32,
                broker: None,
                accept_message_types: vec![pb::MessageType::Normal as i32],
            }),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 1024,
            invisible_duration: Duration::from_secs(3600).try_into().ok(),
            auto_renew: false,
            long_polling_timeout: Duration::from_secs(5).try_into().ok(),
            attempt_id: None,
        };
        let mut stream = client
            .receive_message(wire::request(session, request, Duration::from_secs(10)))
            .await?
            .into_inner();
        let before = held.len();
        while let Some(frame) = stream.message().await? {
            if let Some(pb::receive_message_response::Content::Message(message)) = frame.content
                && let Some(system) = message.system_properties
            {
                held.push(Held {
                    message_id: system.message_id,
                    receipt_handle: system.receipt_handle.unwrap_or_default(),
                });
            }
        }
        if held.len() == before {
            empty += 1;
            if empty >= 3 {
                return Err(
                    format!("only {} of {count} messages could be received", held.len()).into(),
                );
            }
        }
    }
    Ok(held)
}

/// Acks `held` with raw `AckMessage` calls of `per_call` entries, `in_flight` at a time.
/// Returns (entries answered OK, seconds).
async fn raw_acks(
    session: &Arc<Session>,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    held: Arc<Vec<Held>>,
    per_call: usize,
    in_flight: usize,
) -> Result<(u64, f64), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (session, next, ok, held) = (
            Arc::clone(session),
            Arc::clone(&next),
            Arc::clone(&ok),
            Arc::clone(&held),
        );
        let mut client = wire::client(&session, endpoint)?;
        let (topic, group) = (
            wire::resource(&session, topic),
            wire::resource(&session, group),
        );
        tasks.spawn(async move {
            loop {
                let from = next.fetch_add(per_call, Ordering::Relaxed);
                if from >= held.len() {
                    return Ok::<(), BoxError>(());
                }
                let chunk = &held[from..(from + per_call).min(held.len())];
                let request = pb::AckMessageRequest {
                    group: Some(group.clone()),
                    topic: Some(topic.clone()),
                    entries: chunk
                        .iter()
                        .map(|h| pb::AckMessageEntry {
                            message_id: h.message_id.clone(),
                            receipt_handle: h.receipt_handle.clone(),
                        })
                        .collect(),
                };
                let response = client
                    .ack_message(wire::request(&session, request, Duration::from_secs(10)))
                    .await?
                    .into_inner();
                let n = response
                    .entries
                    .iter()
                    .filter(|e| {
                        e.status
                            .as_ref()
                            .is_some_and(|s| s.code == pb::Code::Ok as i32)
                    })
                    .count();
                ok.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok((ok.load(Ordering::Relaxed), start.elapsed().as_secs_f64()))
}

/// Acks `held` through the consumer's ack path: the batcher with the `AckFlusher`, set up as
/// `AckSettings::default()` sets it up, each ack built and enqueued as the consumer does.
/// Returns (acks confirmed, seconds).
async fn batcher_acks(
    session: &Arc<Session>,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    held: Vec<Held>,
    submitters: usize,
) -> Result<(u64, f64, ack_batcher::Stats), BoxError> {
    let resolved = Arc::new(Resolved::default());
    let batcher = Arc::new(
        Batcher::builder()
            .max_items(1024)
            .max_delay(Duration::from_secs(5))
            .deadline_margin(Duration::from_secs(1))
            .max_pending(65_536)
            .retry(
                RetryPolicy::default()
                    .backoff(Duration::from_secs(1))
                    .max_attempts(10_000),
            )
            .observer(resolved.clone())
            .build(AckFlusher::new(Arc::clone(session), group))?,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3000);
    let per_task = held.len().div_ceil(submitters.max(1));
    let mut shares: Vec<Vec<Held>> = Vec::new();
    let mut held = held;
    while !held.is_empty() {
        let rest = held.split_off(per_task.min(held.len()));
        shares.push(held);
        held = rest;
    }
    let endpoint = endpoint.clone();
    let topic = topic.to_owned();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for share in shares {
        let (batcher, endpoint, topic) = (Arc::clone(&batcher), endpoint.clone(), topic.clone());
        tasks.spawn(async move {
            for message in &share {
                // As `PushConsumer` does per consumed message: a key and an entry, cloned from
                // the received message, and the ticket dropped (the observer sees the result).
                let key = AckKey {
                    endpoint: endpoint.clone(),
                    topic: topic.clone(),
                };
                let entry = AckEntry {
                    message_id: message.message_id.clone(),
                    receipt_handle: message.receipt_handle.clone(),
                };
                if batcher
                    .enqueue(key, entry, ItemOptions::new().deadline(deadline))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // The last partial batch goes on close, as at a consumer's shutdown.
    let report = batcher.close(Duration::from_secs(60)).await;
    let seconds = start.elapsed().as_secs_f64();
    if report.abandoned > 0 || resolved.failed.load(Ordering::Relaxed) > 0 {
        eprintln!(
            "   batcher: {} abandoned, {} failed",
            report.abandoned,
            resolved.failed.load(Ordering::Relaxed)
        );
    }
    Ok((
        resolved.ok.load(Ordering::Relaxed),
        seconds,
        batcher.stats(),
    ))
}

fn scenario_c(options: &Options) -> Result<String, BoxError> {
    let m = options.c_messages;
    let single = options.c_single;
    let total = 2 * m + single;
    eprintln!("== c: preloading {total} messages into one topic");
    let prefix = "c";
    let topic = "c0";
    let group = "load";
    let mut emulator = EmulatorProcess::start(
        &options.emulator,
        &[
            "--topics".into(),
            "1".into(),
            "--prefix".into(),
            prefix.into(),
            "--queues".into(),
            "1".into(),
            "--group".into(),
            group.into(),
            "--receive-batch-max".into(),
            "1024".into(),
            "--preload".into(),
            total.to_string(),
            "--body-size".into(),
            "16".into(),
        ],
    )?;
    let endpoint = Endpoint::parse(&emulator.endpoint)?;
    let session = Session::new(
        ClientConfig::new(&emulator.endpoint)?.request_timeout(Duration::from_secs(10)),
    )?;
    let rt = runtime()?;
    let received_at = Instant::now();
    let mut held = rt.block_on(receive_all(&session, &endpoint, topic, group, total))?;
    eprintln!(
        "   received {} messages in {:.1} s",
        held.len(),
        received_at.elapsed().as_secs_f64()
    );
    let single_held: Vec<Held> = held.split_off(2 * m);
    let batched_held: Vec<Held> = held.split_off(m);
    let raw_held = Arc::new(held);
    let pid = emulator.pid();

    let phase = |label: &str| {
        eprintln!("   {label}");
        (own_cpu_seconds(), process_cpu_seconds(pid))
    };
    let before = phase("raw 1,024-entry AckMessage calls");
    let (raw_ok, raw_s) = rt.block_on(raw_acks(
        &session,
        &endpoint,
        topic,
        group,
        raw_held,
        1024,
        options.c_in_flight,
    ))?;
    let raw_cpu = (
        own_cpu_seconds() - before.0,
        process_cpu_seconds(pid) - before.1,
    );
    let stats_raw = emulator.stats()?;

    let before = phase("the consumer's ack path (batcher + AckFlusher)");
    let (batched_ok, batched_s, batcher_stats) = rt.block_on(batcher_acks(
        &session,
        &endpoint,
        topic,
        group,
        batched_held,
        options.c_submitters,
    ))?;
    let batched_cpu = (
        own_cpu_seconds() - before.0,
        process_cpu_seconds(pid) - before.1,
    );
    let stats_batched = emulator.stats()?;

    let mut single_row = None;
    if single > 0 {
        let before = phase("raw 1-entry AckMessage calls");
        let (ok, s) = rt.block_on(raw_acks(
            &session,
            &endpoint,
            topic,
            group,
            Arc::new(single_held),
            1,
            options.c_in_flight,
        ))?;
        single_row = Some((
            ok,
            s,
            own_cpu_seconds() - before.0,
            process_cpu_seconds(pid) - before.1,
        ));
    }
    let final_stats = emulator.finish()?;
    drop(rt);

    let raw_rate = raw_ok as f64 / raw_s;
    let batched_rate = batched_ok as f64 / batched_s;
    let ratio = batched_rate / raw_rate;
    let rpcs_batched = stats_batched.u64("ack_rpcs") - stats_raw.u64("ack_rpcs");
    let full_batched = stats_batched.u64("ack_requests_1024") - stats_raw.u64("ack_requests_1024");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#### (c) ack-path saturation: one topic, {m} received messages per path\n"
    );
    let _ = writeln!(
        out,
        "| path | acks confirmed | seconds | acks/s | AckMessage calls | client CPU s | emulator CPU s | of ceiling | target | met? |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    );
    let _ = writeln!(
        out,
        "| raw 1,024-entry `AckMessage`, {} in flight (ceiling) | {raw_ok} | {raw_s:.2} | {raw_rate:.0} | {} | {:.2} | {:.2} | 100 % | | |",
        options.c_in_flight,
        stats_raw.u64("ack_rpcs"),
        raw_cpu.0,
        raw_cpu.1,
    );
    let _ = writeln!(
        out,
        "| consumer ack path: `Batcher` + `AckFlusher`, {} submitting tasks | {batched_ok} | {batched_s:.2} | {batched_rate:.0} | {rpcs_batched} ({full_batched} of 1,024) | {:.2} | {:.2} | {:.1} % | ≥ 70 % | {} |",
        options.c_submitters,
        batched_cpu.0,
        batched_cpu.1,
        ratio * 100.0,
        yes_no(ratio >= 0.70 && batched_ok == m as u64),
    );
    if let Some((ok, s, client, emu)) = single_row {
        let _ = writeln!(
            out,
            "| raw 1-entry `AckMessage`, {} in flight (for reference) | {ok} | {s:.2} | {:.0} | {} | {client:.2} | {emu:.2} | {:.1} % | | |",
            options.c_in_flight,
            ok as f64 / s,
            final_stats.u64("ack_rpcs") - stats_batched.u64("ack_rpcs"),
            ok as f64 / s / raw_rate * 100.0,
        );
    }
    let _ = writeln!(
        out,
        "\nBatcher flushes: {}; expired receipt handles: {}.\n",
        FlushReason::ALL
            .iter()
            .filter(|r| batcher_stats.batches(**r) > 0)
            .map(|r| format!("{} {r}", batcher_stats.batches(*r)))
            .collect::<Vec<_>>()
            .join(", "),
        final_stats.u64("expired_handles"),
    );
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Orchestration.

fn parse_options(args: Vec<String>) -> Result<Options, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut options = Options {
        duration: 60,
        rate: 8_000,
        body: 4096,
        scenarios: vec!['a', 'b', 'c'],
        topics_b: 1000,
        queues_a: 4,
        queues_b: 1,
        c_messages: 1_000_000,
        c_in_flight: 4,
        c_submitters: 1,
        c_single: 50_000,
        emulator: exe.with_file_name("rocketmq_emulator"),
        markdown_out: None,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--duration" => options.duration = number(&flag, args.next())?,
            "--rate" => options.rate = number(&flag, args.next())?,
            "--body" => options.body = number(&flag, args.next())?,
            "--scenarios" => {
                let list = args.next().ok_or("--scenarios needs a value")?;
                options.scenarios = list
                    .split(',')
                    .map(|s| match s.trim() {
                        "a" => Ok('a'),
                        "b" => Ok('b'),
                        "c" => Ok('c'),
                        other => Err(format!("unknown scenario {other:?} (a, b, c)")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--topics-b" => options.topics_b = number(&flag, args.next())?,
            "--queues-a" => options.queues_a = number(&flag, args.next())?,
            "--queues-b" => options.queues_b = number(&flag, args.next())?,
            "--c-messages" => options.c_messages = number(&flag, args.next())?,
            "--c-in-flight" => options.c_in_flight = number(&flag, args.next())?,
            "--c-submitters" => options.c_submitters = number(&flag, args.next())?,
            "--c-single" => options.c_single = number(&flag, args.next())?,
            "--emulator" => options.emulator = args.next().ok_or("--emulator needs a path")?.into(),
            "--markdown-out" => {
                options.markdown_out =
                    Some(args.next().ok_or("--markdown-out needs a path")?.into());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.duration == 0 || options.rate == 0 || options.body == 0 {
        return Err("--duration, --rate and --body must be positive".into());
    }
    if options.c_in_flight == 0 || options.c_submitters == 0 || options.c_messages == 0 {
        return Err("--c-messages, --c-in-flight and --c-submitters must be positive".into());
    }
    Ok(options)
}

fn orchestrate(options: &Options) -> Result<String, BoxError> {
    if !options.emulator.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p examples -p rocketmq-grpc-emulator --bins`, or pass --emulator PATH",
            options.emulator.display()
        )
        .into());
    }
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "{} msg/s of {} B for {} s per mode; a fresh emulator, consumer and producer process per mode. \
         Client CPU is the consumer process's own `getrusage` from subscription to the end of its \
         shutdown; the producer's CPU is listed apart.\n",
        options.rate, options.body, options.duration
    );
    for scenario in &options.scenarios {
        let section = match scenario {
            'a' => {
                let immediate = run_mode(options, "a", 1, options.queues_a, false)?;
                let batched = run_mode(options, "a", 1, options.queues_a, true)?;
                flow_table(
                    &format!("(a) one topic, {} queues", options.queues_a),
                    true,
                    options,
                    &immediate,
                    &batched,
                )
            }
            'b' => {
                let immediate = run_mode(options, "b", options.topics_b, options.queues_b, false)?;
                let batched = run_mode(options, "b", options.topics_b, options.queues_b, true)?;
                flow_table(
                    &format!(
                        "(b) {} topics, {} queue(s) each",
                        options.topics_b, options.queues_b
                    ),
                    false,
                    options,
                    &immediate,
                    &batched,
                )
            }
            _ => scenario_c(options)?,
        };
        println!("{section}");
        markdown.push_str(&section);
    }
    Ok(markdown)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = if args.first().map(String::as_str) == Some("--role") {
        role(args)
    } else {
        match parse_options(args) {
            Ok(options) => orchestrate(&options).and_then(|markdown| {
                if let Some(path) = &options.markdown_out {
                    std::fs::write(path, markdown)?;
                }
                Ok(())
            }),
            Err(error) => {
                eprintln!("error: {error}\n{USAGE}");
                return ExitCode::FAILURE;
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The internal roles, started by the orchestrator.
fn role(args: Vec<String>) -> Result<(), BoxError> {
    let mut args = args.into_iter().skip(1);
    let role = args.next().ok_or("--role needs a value")?;
    let mut kv: HashMap<String, String> = HashMap::new();
    let mut batched = false;
    while let Some(flag) = args.next() {
        if flag == "--batched" {
            batched = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        kv.insert(flag.trim_start_matches("--").to_owned(), value);
    }
    let get = |key: &str| -> Result<String, BoxError> {
        kv.get(key)
            .cloned()
            .ok_or_else(|| format!("--{key} is required").into())
    };
    let num = |key: &str| -> Result<u64, BoxError> {
        get(key)?
            .parse()
            .map_err(|_| format!("--{key} needs a number").into())
    };
    match role.as_str() {
        "consume" => consume_role(ConsumeArgs {
            endpoint: get("endpoint")?,
            prefix: get("prefix")?,
            topics: num("topics")? as u32,
            queues: num("queues")? as u32,
            group: get("group")?,
            batched,
        }),
        "produce" => produce_role(ProduceArgs {
            endpoint: get("endpoint")?,
            prefix: get("prefix")?,
            topics: num("topics")? as u32,
            rate: num("rate")?,
            duration: Duration::from_secs(num("duration")?),
            body: num("body")? as usize,
        }),
        other => Err(format!("unknown role {other:?}").into()),
    }
}
