//! Role `consume`: a `PushConsumer` with a latency observer, in its own process.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ack_batcher::Observer;
use ack_batcher::{BatchInfo, FlushReason, ItemReply, ItemView, Next};
use rocketmq_grpc::{
    AckEntry, AckKey, AckSettings, ClientConfig, ConsumeResult, MessageHandler, PushConsumer,
    ReceivedMessage,
};

use crate::support::{BoxError, Histogram, Kv, own_cpu_seconds, runtime, topic_names};

#[derive(Debug)]
pub(crate) struct ConsumeArgs {
    pub(crate) endpoint: String,
    pub(crate) prefix: String,
    pub(crate) topics: u32,
    pub(crate) queues: u32,
    pub(crate) group: String,
    pub(crate) batched: bool,
    /// `AckSettings::follow_deadlines` with this `max_delay` in seconds (batched only).
    pub(crate) follow_deadlines: Option<u64>,
}

/// Handler-return times by message id, sharded to keep lock contention low.
pub(crate) struct Latency {
    pub(crate) started: Vec<Mutex<HashMap<String, Instant>>>,
    pub(crate) hasher: std::collections::hash_map::RandomState,
    pub(crate) histogram: Mutex<Histogram>,
    pub(crate) requests_by_reason: Mutex<BTreeMap<&'static str, u64>>,
    /// Errors that led to a retry or a final failure, by message (first 60 characters).
    pub(crate) errors: Mutex<BTreeMap<String, u64>>,
    pub(crate) confirmed: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Sum of the consume-to-confirmed latencies (µs), for the mean.
    pub(crate) latency_sum_us: AtomicU64,
    /// Entries handed to the transport for the first time (retries not counted): handled
    /// messages minus this are the acks a crash would lose.
    pub(crate) sent: AtomicU64,
}

impl Latency {
    pub(crate) fn new() -> Self {
        Self {
            started: (0..64).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            histogram: Mutex::new(Histogram::new()),
            requests_by_reason: Mutex::new(BTreeMap::new()),
            errors: Mutex::new(BTreeMap::new()),
            confirmed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency_sum_us: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    pub(crate) fn shard(&self, id: &str) -> &Mutex<HashMap<String, Instant>> {
        let hash = self.hasher.hash_one(id) as usize;
        &self.started[hash % self.started.len()]
    }

    pub(crate) fn handled(&self, id: &str) {
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
        if batch.reason != FlushReason::Retry {
            self.sent.fetch_add(batch.len as u64, Ordering::Relaxed);
        }
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
            self.latency_sum_us.fetch_add(micros, Ordering::Relaxed);
            histogram.record(micros);
        }
    }
}

/// Counts, keeps the first and last handling times, and starts the ack latency clock.
pub(crate) struct LoadHandler(pub(crate) Arc<HandlerState>);

pub(crate) struct HandlerState {
    pub(crate) latency: Arc<Latency>,
    pub(crate) base: Instant,
    pub(crate) consumed: AtomicU64,
    pub(crate) checksum: AtomicU64,
    /// Nanoseconds since `base` (+1, so that 0 means "none yet").
    pub(crate) first: AtomicU64,
    pub(crate) last: AtomicU64,
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
        let byte = message.body().last().copied().unwrap_or(0);
        state.checksum.fetch_add(u64::from(byte), Ordering::Relaxed);
        let now = state.base.elapsed().as_nanos() as u64 + 1;
        let _ = state
            .first
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        state.last.fetch_max(now, Ordering::Relaxed);
        state.latency.handled(message.message_id());
        state.consumed.fetch_add(1, Ordering::Relaxed);
        ConsumeResult::Success
    }
}

pub(crate) fn consume_role(args: ConsumeArgs) -> Result<(), BoxError> {
    let rt = runtime()?;
    rt.block_on(consume(args))
}

pub(crate) async fn consume(args: ConsumeArgs) -> Result<(), BoxError> {
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
    let acks = if let Some(secs) = args.follow_deadlines.filter(|_| args.batched) {
        AckSettings::default().follow_deadlines(Duration::from_secs(secs))
    } else if args.batched {
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
    let consumer = builder
        .handler(LoadHandler(Arc::clone(&handler)))
        .build()
        .await?;

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

    // Redelivery exposure: handled messages whose acks were not sent yet (lost in a crash),
    // sampled every 100 ms until the shutdown.
    let exposure = Arc::new(Mutex::new((0u64, 0u64, 0u64))); // (samples, sum, max)
    let sampler = {
        let (handler, latency, exposure) = (
            Arc::clone(&handler),
            Arc::clone(&latency),
            Arc::clone(&exposure),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let consumed = handler.consumed.load(Ordering::Relaxed);
                if consumed == 0 {
                    continue; // the producer has not started
                }
                let unsent = consumed.saturating_sub(latency.sent.load(Ordering::Relaxed));
                let mut e = exposure.lock().unwrap_or_else(PoisonError::into_inner);
                e.0 += 1;
                e.1 += unsent;
                e.2 = e.2.max(unsent);
            }
        })
    };
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
    sampler.abort();
    let (samples, unsent_sum, unsent_max) =
        *exposure.lock().unwrap_or_else(PoisonError::into_inner);
    let report = consumer.close(Duration::from_secs(30)).await;
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
    kv.put(
        "mode",
        match (args.batched, args.follow_deadlines) {
            (true, Some(_)) => "follow_deadlines",
            (true, None) => "batched",
            (false, _) => "immediate",
        },
    );
    kv.put(
        "unsent_mean",
        format!("{:.1}", unsent_sum as f64 / samples.max(1) as f64),
    );
    kv.put("unsent_max", unsent_max);
    kv.put(
        "lat_mean_ms",
        format!(
            "{:.3}",
            latency.latency_sum_us.load(Ordering::Relaxed) as f64
                / histogram.total.max(1) as f64
                / 1000.0
        ),
    );
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
