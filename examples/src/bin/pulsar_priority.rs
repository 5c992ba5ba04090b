//! Priority consumption on Pulsar: urgent messages overtake a low-priority backlog.
//!
//! A 4-partition topic; partition 0 carries the high level, the others (and any added later)
//! the low one. 100,000 low-priority messages are queued, then 1,000 high-priority ones, then
//! one consumer drains the topic as fast as it can, acknowledging each message. Halfway
//! through, the topic grows from 4 to 8 partitions; the producer and the consumer attach to the
//! new partitions and 1,000 more low and 100 more high messages are sent through them. The
//! run is made twice:
//!
//! - **no priority**: the default round-robin router and a plain consumer: the high messages
//!   sit at the end of every partition, behind the whole backlog;
//! - **ours**: `pulsar_wire::prioritized::PriorityRouter` routes by the `priority` property and
//!   `PriorityConsumer` takes messages in the gate's order, withholding the low partitions'
//!   `FLOW` permits while the high level is under pressure (the low level has half the high
//!   level's receiver queue).
//!
//! With `--live` the consumer is attached before the first message is sent and drains while
//! both waves are sent, as a consumer that is always running does.
//!
//! For each run it prints per-level latency (from the send's confirmation to delivery) p50,
//! p99 and max of the first wave, the low messages delivered before the last high one, the low
//! messages delivered while a high one waited (confirmed to the producer and not yet
//! delivered: at the broker, on the wire or buffered), and whether every message arrived
//! exactly once. The exit code is 1 when a message is lost or duplicated, or when "ours"
//! delivers more than one low receiver queue (500) of low messages before its last high one
//! (queued runs only: in a live run the low messages sent before the high ones are rightly
//! delivered first, and the consumer keeps up, so there is little to reorder; its bypass count
//! is dominated by high messages still on their way from the broker).
//!
//! ```text
//! cargo run --release -p examples --bin pulsar_priority            # embedded emulator
//! cargo run --release -p examples --bin pulsar_priority -- \
//!     --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080
//! cargo run --release -p examples --bin pulsar_priority -- --low 10000 --high 500 [--live]
//! ```
//!
//! A real broker needs `--admin-url` to create the partitioned topic and raise its partition
//! count (admin REST API, `PUT`/`POST .../partitions`).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../shared/pulsar_broker.rs"]
mod pulsar_broker;
use clap::{CommandFactory, Parser};
use mq_priority::{
    GateConfig, LayoutSpec, Level, PriorityPolicy, RouterConfig, StickyWindow, Strategy, Unlisted,
};
use pulsar_broker::Broker;
use pulsar_wire::prioritized::{PriorityConsumer, PriorityRouter, follow_growth};
use pulsar_wire::{
    BatchingOptions, Client, ClientBuilder, ConnectOptions, Consumer, ConsumerOptions,
    InitialPosition, MessageConsumer, OutgoingMessage, Producer, ProducerOptions,
};

const PROPERTY: &str = "priority";
const PARTITIONS: u32 = 4;
const GROWN: u32 = 8;
/// The high level's receiver queue (the low level gets half per partition).
const QUEUE: u32 = 1_000;
/// Sends in flight at once.
const CHUNK: usize = 5_000;

/// Priority consumption on Pulsar: urgent messages overtake a low-priority backlog.
#[derive(Debug, Parser)]
#[command(name = "pulsar_priority", args_override_self = true)]
struct Args {
    /// The broker's binary-protocol URL; without it the embedded emulator.
    #[arg(long, value_name = "pulsar://HOST:6650", requires = "admin_url")]
    service_url: Option<String>,
    /// The broker's admin REST URL (creates the partitioned topic and grows it).
    #[arg(long, value_name = "http://HOST:8080")]
    admin_url: Option<String>,
    /// Low-priority messages of the first wave (`_` may group digits).
    #[arg(long, value_name = "N", default_value = "100000", value_parser = count)]
    low: usize,
    /// High-priority messages of the first wave, at least 1.
    #[arg(long, value_name = "N", default_value = "1000", value_parser = count)]
    high: usize,
    /// The consumer is attached before the first message is sent and drains while both waves
    /// are sent.
    #[arg(long)]
    live: bool,
}

/// A count; `_` may group its digits.
fn count(text: &str) -> Result<usize, String> {
    text.replace('_', "").parse().map_err(|e| format!("{e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoPriority,
    Ours,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoPriority => "no priority",
            Mode::Ours => "ours",
        }
    }
}

/// What one run measured.
struct Report {
    mode: Mode,
    /// Latencies of the first wave, high level then low level.
    latencies: [Vec<Duration>; 2],
    low_before_last_high: usize,
    /// Low messages delivered while a high one was waiting (sent and not yet delivered).
    bypasses: usize,
    lost: usize,
    duplicated: usize,
    /// Messages of the second wave delivered from partitions added mid-run.
    from_new_partitions: usize,
    elapsed: Duration,
}

fn policy() -> Result<PriorityPolicy, mq_priority::Error> {
    PriorityPolicy::builder()
        .levels(2)
        .property(PROPERTY)
        .build()
}

fn layout() -> LayoutSpec {
    LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel)
}

/// Sends `count` messages named `{prefix}{i}` of one level; returns each one's receipt time.
async fn send_wave(
    producer: &Producer,
    prefix: &str,
    high: bool,
    count: usize,
    receipts: &mut HashMap<String, Instant>,
) -> Result<(), String> {
    let level = if high { "0" } else { "1" };
    for start in (0..count).step_by(CHUNK) {
        let sends = (start..(start + CHUNK).min(count)).map(|i| {
            let name = format!("{prefix}{i}");
            let message = OutgoingMessage::new(name.clone()).property(PROPERTY, level);
            async move {
                let sent = producer.send(message).await;
                (name, sent.map(|_| Instant::now()))
            }
        });
        for (name, sent) in futures_util::future::join_all(sends).await {
            let at = sent.map_err(|e| format!("sending {name}: {e}"))?;
            receipts.insert(name, at);
        }
    }
    Ok(())
}

async fn run(client: &Client, broker: &Broker, mode: Mode, args: &Args) -> Result<Report, String> {
    let err = |what: &str| {
        let what = what.to_owned();
        move |e: pulsar_wire::Error| format!("{}: {what}: {e}", mode.name())
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!(
        "persistent://public/default/priority-{}-{stamp}",
        if mode == Mode::Ours { "ours" } else { "none" }
    );
    broker.create_topic(&topic, PARTITIONS).await?;
    let policy = policy().map_err(|e| e.to_string())?;
    let consumer_options = ConsumerOptions::default()
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(QUEUE);
    let batching = BatchingOptions::default()
        .max_messages(100)
        .max_delay(Duration::from_millis(5));
    let mut producer_options = ProducerOptions::default()
        .batching(batching)
        .partitions_refresh(None);
    if mode == Mode::Ours {
        let router = PriorityRouter::for_topic(
            client,
            &topic,
            policy.clone(),
            layout(),
            RouterConfig {
                sticky: StickyWindow {
                    max_messages: 100,
                    max_duration: Duration::from_millis(10),
                },
                ..RouterConfig::default()
            },
        )
        .await
        .map_err(err("router"))?;
        producer_options = producer_options.router(Arc::new(router));
    }
    // The subscription exists before the first message (its consumer leaves at once, so
    // that the whole backlog is queued at the broker when the run's consumer attaches).
    Consumer::builder(client, &topic, "drain")
        .options(consumer_options.clone())
        .build()
        .await
        .map_err(err("subscribe"))?
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(err("close"))?;
    let producer = Arc::new(
        Producer::builder(client, &topic)
            .options(producer_options)
            .build()
            .await
            .map_err(err("producer"))?,
    );
    // The consumer of the run, plain or gated: the loop below only needs the trait.
    let attach = || async {
        match mode {
            Mode::NoPriority => Ok(Box::new(
                Consumer::builder(client, &topic, "drain")
                    .options(consumer_options.clone())
                    .build()
                    .await
                    .map_err(err("subscribe"))?,
            ) as Box<dyn MessageConsumer>),
            Mode::Ours => {
                let gate = GateConfig::default()
                    .with_strategy(Strategy::Strict)
                    .with_receiver_queue_size(QUEUE);
                Ok::<_, String>(Box::new(
                    PriorityConsumer::builder(client, &topic, "drain", policy.clone(), layout())
                        .consumer(consumer_options.clone())
                        .gate(gate)
                        .partitions_refresh(None)
                        .build()
                        .await
                        .map_err(err("subscribe"))?,
                ) as Box<dyn MessageConsumer>)
            }
        }
    };

    let started = Instant::now();
    let (low, high) = (args.low, args.high);
    let first_wave = {
        let producer = Arc::clone(&producer);
        async move {
            let mut receipts = HashMap::with_capacity(low + high);
            send_wave(&producer, "l", false, low, &mut receipts).await?;
            send_wave(&producer, "h", true, high, &mut receipts).await?;
            Ok::<_, String>(receipts)
        }
    };
    // Queued: the consumer attaches once everything is at the broker. Live: it is attached
    // first and drains while the waves are sent.
    let (receiver, first_wave) = if args.live {
        let receiver = attach().await?;
        (receiver, tokio::spawn(first_wave))
    } else {
        let receipts = first_wave.await?;
        (attach().await?, tokio::spawn(async move { Ok(receipts) }))
    };
    let (extra_low, extra_high) = (1_000, 100);
    let total = args.low + args.high + extra_low + extra_high;

    let mut deliveries: Vec<(String, Instant)> = Vec::with_capacity(total);
    let mut second_wave = HashMap::new();
    let mut from_new_partitions = 0;
    let mut grown = false;
    while deliveries.len() < total {
        let received = deliveries.len();
        let message = tokio::time::timeout(Duration::from_secs(30), receiver.receive())
            .await
            .map_err(|_| {
                format!(
                    "{}: nothing arrived for 30 s after {received} of {total} messages",
                    mode.name()
                )
            })?
            .map_err(err("receive"))?;
        let delivered = Instant::now();
        receiver.ack(&message).await.map_err(err("ack"))?;
        let name = String::from_utf8_lossy(message.payload()).into_owned();
        if name.starts_with('x') && message.id().partition() >= PARTITIONS as i32 {
            from_new_partitions += 1;
        }
        deliveries.push((name, delivered));
        if !grown && deliveries.len() == (args.low + args.high) / 2 {
            grown = true;
            broker.grow(&topic, GROWN).await?;
            // The producer first, then the consumer (see `follow_growth`).
            follow_growth(&producer, receiver.as_ref())
                .await
                .map_err(err("refresh after the growth"))?;
            send_wave(&producer, "xl", false, extra_low, &mut second_wave).await?;
            send_wave(&producer, "xh", true, extra_high, &mut second_wave).await?;
        }
    }
    let elapsed = started.elapsed();
    let mut receipts = first_wave
        .await
        .map_err(|e| format!("{}: the sending task failed: {e}", mode.name()))??;
    receiver
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(err("close"))?;
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(err("close producer"))?;

    let expected = (0..args.low)
        .map(|i| format!("l{i}"))
        .chain((0..args.high).map(|i| format!("h{i}")))
        .chain((0..extra_low).map(|i| format!("xl{i}")))
        .chain((0..extra_high).map(|i| format!("xh{i}")));
    let mut seen: HashMap<&str, u32> = HashMap::with_capacity(total);
    for (name, _) in &deliveries {
        *seen.entry(name.as_str()).or_default() += 1;
    }
    let lost = expected
        .filter(|name| !seen.contains_key(name.as_str()))
        .count();
    let duplicated = seen.values().map(|&n| n.saturating_sub(1) as usize).sum();

    // First-wave latencies and order; bypasses over both waves.
    let mut latencies = [Vec::with_capacity(args.high), Vec::with_capacity(args.low)];
    let mut order = Vec::with_capacity(args.low + args.high);
    for (name, delivered) in &deliveries {
        if let Some(published) = receipts.get(name) {
            let high = name.starts_with('h');
            latencies[usize::from(!high)].push(delivered.saturating_duration_since(*published));
            order.push(high);
        }
    }
    receipts.extend(second_wave);
    let bypasses = bypasses(&deliveries, &receipts);
    let last_high = order.iter().rposition(|&high| high).unwrap_or(0);
    let low_before_last_high = order[..last_high].iter().filter(|&&high| !high).count();
    for level in &mut latencies {
        level.sort_unstable();
    }
    Ok(Report {
        mode,
        latencies,
        low_before_last_high,
        bypasses,
        lost,
        duplicated,
        from_new_partitions,
        elapsed,
    })
}

/// Low messages delivered while a high message was waiting: published (its send confirmed)
/// and not yet delivered.
fn bypasses(deliveries: &[(String, Instant)], receipts: &HashMap<String, Instant>) -> usize {
    let is_high = |name: &str| name.starts_with('h') || name.starts_with("xh");
    let mut waits: Vec<(Instant, Instant)> = deliveries
        .iter()
        .filter(|(name, _)| is_high(name))
        .filter_map(|(name, delivered)| Some((*receipts.get(name)?, *delivered)))
        .collect();
    waits.sort_unstable();
    let mut lows: Vec<Instant> = deliveries
        .iter()
        .filter(|(name, _)| !is_high(name))
        .map(|(_, at)| *at)
        .collect();
    lows.sort_unstable();
    let (mut next, mut open_until, mut count) = (0, None::<Instant>, 0);
    for at in lows {
        while let Some(&(published, delivered)) = waits.get(next)
            && published <= at
        {
            open_until = open_until.max(Some(delivered));
            next += 1;
        }
        if open_until.is_some_and(|until| until > at) {
            count += 1;
        }
    }
    count
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn print(reports: &[Report], args: &Args) {
    println!(
        "\n{} low then {} high messages on a {PARTITIONS}-partition topic, raised to {GROWN} halfway\n",
        args.low, args.high
    );
    println!(
        "{:<12} {:<5} {:>11} {:>11} {:>11}",
        "mode", "level", "p50", "p99", "max"
    );
    for report in reports {
        for (level, name) in [(0, "high"), (1, "low")] {
            let l = &report.latencies[level];
            println!(
                "{:<12} {:<5} {:>11} {:>11} {:>11}",
                if level == 0 { report.mode.name() } else { "" },
                name,
                ms(percentile(l, 50.0)),
                ms(percentile(l, 99.0)),
                ms(l.last().copied().unwrap_or_default()),
            );
        }
    }
    println!();
    for report in reports {
        println!(
            "{:<12} low messages delivered before the last high one: {:>7}; while a high one \
             waited: {:>7}; lost {}, duplicated {}; {} second-wave messages from the new \
             partitions; sent and drained in {:.2} s",
            report.mode.name(),
            report.low_before_last_high,
            report.bypasses,
            report.lost,
            report.duplicated,
            report.from_new_partitions,
            report.elapsed.as_secs_f64()
        );
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.high == 0 {
        Args::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                "--high must be at least 1",
            )
            .exit();
    }
    match main_with(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn main_with(args: &Args) -> Result<bool, String> {
    let (broker, url) =
        Broker::choose(args.service_url.as_deref(), args.admin_url.as_deref()).await?;
    println!(
        "broker: {}",
        match &broker {
            Broker::Emulator(_) => format!("embedded emulator at {url}"),
            Broker::Real { .. } =>
                format!("{url} (admin {})", args.admin_url.as_deref().unwrap_or("")),
        }
    );
    let options = ConnectOptions::new(&url)
        .map_err(|e| e.to_string())?
        .operation_timeout(Duration::from_secs(30));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let mut reports = Vec::new();
    for mode in [Mode::NoPriority, Mode::Ours] {
        reports.push(run(&client, &broker, mode, args).await?);
    }
    client.close().await;
    print(&reports, args);
    let ours = reports.iter().find(|r| r.mode == Mode::Ours);
    let bound = (QUEUE / 2) as usize;
    // Queued: every high message comes before all but one low receiver queue. Live: the
    // consumer keeps up, so there is little to reorder; the bypasses are shown, not judged:
    // they count low messages delivered while a high one was still on its way from the
    // broker, which no client-side gate can overtake.
    let ours_within = args.live || ours.is_some_and(|r| r.low_before_last_high <= bound);
    let ok = ours_within && reports.iter().all(|r| r.lost == 0 && r.duplicated == 0);
    if args.live {
        println!(
            "\nours: {} (nothing lost or duplicated; live runs judge nothing else)",
            if ok { "PASS" } else { "FAIL" }
        );
    } else {
        println!(
            "\nours: {} (at most one low receiver queue, {bound}, of low messages before the last \
             high one; nothing lost or duplicated)",
            if ok { "PASS" } else { "FAIL" }
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_command_lines_parse() {
        let parse = |a: &[&str]| Args::try_parse_from(["pulsar_priority"].iter().chain(a));
        let args = parse(&[]).unwrap();
        assert_eq!((args.low, args.high, args.live), (100_000, 1_000, false));
        let urls = [
            "--service-url",
            "pulsar://127.0.0.1:6650",
            "--admin-url",
            "http://h:8080",
        ];
        let args = parse(&urls).unwrap();
        assert_eq!(args.service_url.as_deref(), Some("pulsar://127.0.0.1:6650"));
        assert_eq!(args.admin_url.as_deref(), Some("http://h:8080"));
        let args = parse(&["--low", "10_000", "--high", "500", "--live"]).unwrap();
        assert_eq!((args.low, args.high, args.live), (10_000, 500, true));
        assert!(parse(&urls[..2]).is_err());
        assert!(parse(&["--low", "many"]).is_err());
    }
}
