//! Priority and key order on Pulsar while the topic grows from 4 to 8 partitions.
//!
//! Every message has one of `--keys` keys (100 by default) and a priority (2 levels). A first
//! wave of `--low` low messages (100,000) then `--high` high ones (1,000) is queued; the consumer attaches and
//! drains, acknowledging each message; halfway through, the topic is raised to 8 partitions,
//! [`pulsar_wire::prioritized::follow_growth`] refreshes the producer and then the consumer,
//! and a second wave (a quarter of the low count, half of the high count) is sent and queued
//! behind what is left of the first. Each row
//! runs on a fresh topic:
//!
//! - **no priority**: Pulsar's key router (`JavaStringHash % partitions`) and a plain consumer;
//! - **ours**: `PriorityRouter` and `PriorityConsumer` with partition shares 1:3 (4 partitions:
//!   level 0 on partition 0; 8: also partition 5; growth never moves a partition) or an
//!   explicit layout (partition 0, the rest to the default level), keys placed by modulo or by
//!   jump consistent hashing, with or without the consumer's growth hold (its drain points are
//!   the old partitions' last message ids when the growth is seen).
//!
//! Per row: the high level's p50 and p99 latency (send confirmed → delivered) of each wave and
//! the p99's share of no priority's, key-order violations (messages delivered after a later
//! message of their key and level), the longest time low messages waited without a low
//! delivery (what strict with aging bounds), lost and duplicated messages. The exit code is 1 when a message is
//! lost or duplicated, when a row of ours has a high p99 above `--ratio-limit` % (10) of no
//! priority's in either wave, or when a row with the growth hold has a key-order violation.
//! (On a real broker of a 2-core machine the whole run drains at about 100,000 msg/s, so no
//! priority's second-wave p99 is only a few hundred ms and ours varies by tens of ms with the
//! new partitions' first reads: 2.7-14.7 % in five runs; CI passes `--ratio-limit 25` there.)
//!
//! ```text
//! cargo run --release -p examples --bin pulsar_priority_growth             # embedded emulator
//! cargo run --release -p examples --bin pulsar_priority_growth -- \
//!     --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080
//! ```

#[path = "../../shared/pulsar_broker.rs"]
mod pulsar_broker;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mq_priority::{
    GateConfig, KeyPlacement, LayoutSpec, Level, PriorityPolicy, RouterConfig, StickyWindow,
    Strategy, Unlisted,
};
use pulsar_broker::Broker;
use pulsar_wire::prioritized::{
    PriorityConsumer, PriorityConsumerOptions, PriorityRouter, follow_growth,
};
use pulsar_wire::{
    BatchingOptions, Client, ConnectOptions, ConsumerOptions, InitialPosition, MessageConsumer,
    OutgoingMessage, Producer, ProducerOptions,
};

const PROPERTY: &str = "priority";
const PARTITIONS: u32 = 4;
const GROWN: u32 = 8;
const QUEUE: u32 = 1_000;
const CHUNK: usize = 5_000;

struct Args {
    service_url: Option<String>,
    admin_url: Option<String>,
    low: usize,
    high: usize,
    keys: usize,
    /// The largest high p99 of ours, in % of no priority's, that passes.
    ratio_limit: f64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        service_url: None,
        admin_url: None,
        low: 100_000,
        high: 1_000,
        keys: 100,
        ratio_limit: 10.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{name} needs a number, got {v:?}"))
        };
        match arg.as_str() {
            "--service-url" => args.service_url = Some(value("--service-url")?),
            "--admin-url" => args.admin_url = Some(value("--admin-url")?),
            "--low" => args.low = number("--low", value("--low")?)?,
            "--high" => args.high = number("--high", value("--high")?)?,
            "--keys" => args.keys = number("--keys", value("--keys")?)?,
            "--ratio-limit" => {
                args.ratio_limit = number("--ratio-limit", value("--ratio-limit")?)? as f64
            }
            "-h" | "--help" => {
                return Err(
                    "usage: pulsar_priority_growth [--service-url URL --admin-url URL] \
                            [--low N] [--high N] [--keys N] [--ratio-limit PERCENT]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if args.service_url.is_some() && args.admin_url.is_none() {
        return Err("a real broker needs --admin-url to create and grow the topic".into());
    }
    if args.high < 2 || args.low < 4 || args.keys == 0 {
        return Err("--high needs at least 2, --low at least 4 and --keys at least 1".into());
    }
    Ok(args)
}

/// One row: `None` layout is no priority.
#[derive(Debug, Clone)]
struct Row {
    layout: Option<LayoutSpec>,
    placement: KeyPlacement,
    hold: bool,
    strategy: Strategy,
    label: &'static str,
}

fn rows() -> Vec<Row> {
    let shares = LayoutSpec::partition_shares([1, 3]);
    let explicit = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
    let row = |layout: Option<&LayoutSpec>, placement, hold, strategy, label| Row {
        layout: layout.cloned(),
        placement,
        hold,
        strategy,
        label,
    };
    vec![
        row(
            None,
            KeyPlacement::Modulo,
            false,
            Strategy::Strict,
            "no priority (key hash % partitions)",
        ),
        row(
            Some(&shares),
            KeyPlacement::Modulo,
            false,
            Strategy::Strict,
            "shares 1:3, modulo, strict",
        ),
        row(
            Some(&shares),
            KeyPlacement::Jump,
            true,
            Strategy::Strict,
            "shares 1:3, jump + hold, strict",
        ),
        row(
            Some(&shares),
            KeyPlacement::Jump,
            true,
            Strategy::delivery_shares(),
            "shares 1:3, jump + hold, delivery shares",
        ),
        row(
            Some(&explicit),
            KeyPlacement::Jump,
            true,
            Strategy::StrictAging {
                max_wait: Duration::from_millis(50),
            },
            "explicit, jump + hold, aging 50 ms",
        ),
        row(
            Some(&explicit),
            KeyPlacement::Jump,
            true,
            Strategy::StrictAging {
                max_wait: Duration::from_millis(5),
            },
            "explicit, jump + hold, aging 5 ms",
        ),
    ]
}

/// What one row measured.
struct Report {
    label: &'static str,
    hold: bool,
    ours: bool,
    high_p99: [Duration; 2],
    high_p50: [Duration; 2],
    /// The longest time the consumer went without a low delivery while it was receiving (the
    /// low backlog waits from the first receive to the end; the pause while the second wave
    /// is sent does not count).
    low_gap: Duration,
    violations: usize,
    lost: usize,
    duplicated: usize,
    elapsed: Duration,
}

/// A message's identity in its payload: wave, level, key, sequence within (level, key).
fn payload(wave: u8, level: u8, key: usize, seq: usize) -> String {
    format!("{wave}/{level}/{key}/{seq}")
}

fn parse(payload: &[u8]) -> Option<(u8, u8, usize, usize)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split('/');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    ))
}

/// Sends a wave: `low` low messages then `high` high ones, keys in turn; returns each
/// message's receipt time by payload.
async fn send_wave(
    producer: &Producer,
    wave: u8,
    counts: [usize; 2],
    keys: usize,
    next_seq: &mut [Vec<usize>; 2],
    receipts: &mut HashMap<String, Instant>,
) -> Result<(), String> {
    for level in [1u8, 0] {
        let count = counts[usize::from(level)];
        let mut messages = Vec::with_capacity(count);
        for i in 0..count {
            let key = i % keys;
            let seq = next_seq[usize::from(level)][key];
            next_seq[usize::from(level)][key] += 1;
            messages.push((payload(wave, level, key, seq), key));
        }
        for chunk in messages.chunks(CHUNK) {
            let sends = chunk.iter().map(|(name, key)| {
                let message = OutgoingMessage::new(name.clone())
                    .property(PROPERTY, level.to_string())
                    .key(format!("key-{key}"));
                async move { (name, producer.send(message).await.map(|_| Instant::now())) }
            });
            for (name, sent) in futures_util::future::join_all(sends).await {
                let at = sent.map_err(|e| format!("sending {name}: {e}"))?;
                receipts.insert(name.clone(), at);
            }
        }
    }
    Ok(())
}

fn percentile(mut values: Vec<Duration>, p: f64) -> Duration {
    values.sort_unstable();
    if values.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

async fn run(client: &Client, broker: &Broker, row: &Row, args: &Args) -> Result<Report, String> {
    let err =
        |what: &'static str| move |e: pulsar_wire::Error| format!("{}: {what}: {e}", row.label);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let topic = format!("persistent://public/default/priority-growth-{stamp}");
    broker.create_topic(&topic, PARTITIONS).await?;
    let policy = PriorityPolicy::builder()
        .levels(2)
        .property(PROPERTY)
        .build()
        .map_err(|e| e.to_string())?;
    let consumer_options = ConsumerOptions::default()
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(QUEUE);
    let mut producer_options = ProducerOptions::default()
        .batching(
            BatchingOptions::default()
                .max_messages(100)
                .max_delay(Duration::from_millis(5)),
        )
        .partitions_refresh(None);
    if let Some(layout) = &row.layout {
        let config = RouterConfig {
            placement: row.placement,
            sticky: StickyWindow::default(),
            ..RouterConfig::default()
        };
        let router =
            PriorityRouter::for_topic(client, &topic, policy.clone(), layout.clone(), config)
                .await
                .map_err(err("router"))?;
        producer_options = producer_options.router(Arc::new(router));
    }
    client
        .subscribe(&topic, "drain", consumer_options.clone())
        .await
        .map_err(err("subscribe"))?
        .close()
        .await
        .map_err(err("close"))?;
    let producer = Arc::new(
        client
            .create_producer(&topic, producer_options)
            .await
            .map_err(err("producer"))?,
    );

    let started = Instant::now();
    let mut receipts = HashMap::new();
    let mut next_seq = [vec![0; args.keys], vec![0; args.keys]];
    let first = [args.high, args.low];
    let second = [args.high / 2, args.low / 4];
    send_wave(&producer, 0, first, args.keys, &mut next_seq, &mut receipts).await?;
    let consumer: Box<dyn MessageConsumer> = match &row.layout {
        None => Box::new(
            client
                .subscribe(&topic, "drain", consumer_options.clone())
                .await
                .map_err(err("subscribe"))?,
        ),
        Some(layout) => {
            let gate = GateConfig {
                strategy: row.strategy.clone(),
                receiver_queue_size: QUEUE,
                growth_hold: row.hold.then_some(Duration::from_secs(60)),
                ..GateConfig::default()
            };
            let options = PriorityConsumerOptions::new(policy.clone(), layout.clone())
                .consumer(consumer_options.clone())
                .gate(gate)
                .partitions_refresh(None);
            Box::new(
                PriorityConsumer::subscribe(client, &topic, "drain", options)
                    .await
                    .map_err(err("subscribe"))?,
            )
        }
    };
    let total = first.iter().chain(&second).sum::<usize>();
    let mut delivered: Vec<(String, Instant)> = Vec::with_capacity(total);
    let mut grown = false;
    let mut low_since = Instant::now();
    let mut low_gap = Duration::ZERO;
    while delivered.len() < total {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .map_err(|_| {
                format!(
                    "{}: nothing arrived for 30 s after {} of {total} messages",
                    row.label,
                    delivered.len()
                )
            })?
            .map_err(err("receive"))?;
        let at = Instant::now();
        consumer.ack(&message).await.map_err(err("ack"))?;
        if parse(message.payload()).is_some_and(|(_, level, _, _)| level == 1) {
            low_gap = low_gap.max(at.saturating_duration_since(low_since));
            low_since = at;
        }
        delivered.push((String::from_utf8_lossy(message.payload()).into_owned(), at));
        if !grown && delivered.len() == (args.low + args.high) / 2 {
            broker.grow(&topic, GROWN).await?;
            follow_growth(&producer, consumer.as_ref())
                .await
                .map_err(err("follow the growth"))?;
            // Queued behind what is left of the first wave.
            send_wave(
                &producer,
                1,
                second,
                args.keys,
                &mut next_seq,
                &mut receipts,
            )
            .await?;
            grown = true;
            low_since = low_since.max(Instant::now());
        }
    }
    let elapsed = started.elapsed();
    consumer.close().await.map_err(err("close"))?;
    producer.close().await.map_err(err("close producer"))?;

    let mut seen: HashMap<&str, u32> = HashMap::with_capacity(total);
    let mut last_seq: HashMap<(u8, usize), usize> = HashMap::new();
    let mut high = [Vec::new(), Vec::new()];
    let mut violations = 0;
    for (name, at) in &delivered {
        *seen.entry(name.as_str()).or_default() += 1;
        let Some((wave, level, key, seq)) = parse(name.as_bytes()) else {
            continue;
        };
        let last = last_seq.entry((level, key)).or_insert(seq);
        if seq < *last {
            violations += 1;
        } else {
            *last = seq;
        }
        if level == 0
            && let Some(sent) = receipts.get(name)
        {
            high[usize::from(wave.min(1))].push(at.saturating_duration_since(*sent));
        }
    }
    let lost = receipts
        .keys()
        .filter(|n| !seen.contains_key(n.as_str()))
        .count();
    let duplicated = seen.values().map(|&n| n.saturating_sub(1) as usize).sum();
    let [h0, h1] = high;
    Ok(Report {
        low_gap,
        label: row.label,
        hold: row.hold,
        ours: row.layout.is_some(),
        high_p50: [percentile(h0.clone(), 50.0), percentile(h1.clone(), 50.0)],
        high_p99: [percentile(h0, 99.0), percentile(h1, 99.0)],
        violations,
        lost,
        duplicated,
        elapsed,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// Prints the table and says whether every check holds.
fn print(reports: &[Report], args: &Args, broker: &str) -> bool {
    println!(
        "\n{broker}: {} low then {} high messages over {} keys on {PARTITIONS} partitions, raised \
         to {GROWN} halfway (producer, then consumer), then {} low and {} high more\n",
        args.low,
        args.high,
        args.keys,
        args.low / 4,
        args.high / 2
    );
    println!(
        "| row | high p50 ms wave 1 / wave 2 | high p99 ms wave 1 / wave 2 | p99 % of no priority | key-order violations | longest low gap ms | lost | duplicated | drained in s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let base = reports.first().map(|r| r.high_p99);
    let mut ok = true;
    for r in reports {
        let pct = |i: usize| {
            base.filter(|b| !b[i].is_zero()).map_or(0.0, |b| {
                r.high_p99[i].as_secs_f64() * 100.0 / b[i].as_secs_f64()
            })
        };
        println!(
            "| {} | {} / {} | {} / {} | {:.1} / {:.1} | {} | {:.1} | {} | {} | {:.1} |",
            r.label,
            ms(r.high_p50[0]),
            ms(r.high_p50[1]),
            ms(r.high_p99[0]),
            ms(r.high_p99[1]),
            pct(0),
            pct(1),
            r.violations,
            r.low_gap.as_secs_f64() * 1000.0,
            r.lost,
            r.duplicated,
            r.elapsed.as_secs_f64()
        );
        let mut fail = |why: String| {
            ok = false;
            eprintln!("FAIL {}: {why}", r.label);
        };
        if r.lost > 0 || r.duplicated > 0 {
            fail(format!("{} lost, {} duplicated", r.lost, r.duplicated));
        }
        if r.ours && (pct(0) > args.ratio_limit || pct(1) > args.ratio_limit) {
            fail(format!(
                "high p99 at {:.1} % / {:.1} % of no priority",
                pct(0),
                pct(1)
            ));
        }
        if r.hold && r.violations > 0 {
            fail(format!(
                "{} key-order violations with the hold",
                r.violations
            ));
        }
    }
    ok
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match main_with(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn main_with(args: &Args) -> Result<bool, String> {
    let (broker, url) =
        Broker::choose(args.service_url.as_deref(), args.admin_url.as_deref()).await?;
    let name = match &broker {
        Broker::Emulator(_) => format!("embedded emulator at {url}"),
        Broker::Real { .. } => format!("broker at {url}"),
    };
    let options = ConnectOptions::new(&url)
        .map_err(|e| e.to_string())?
        .operation_timeout(Duration::from_secs(30));
    let client = Client::connect(options).await.map_err(|e| e.to_string())?;
    let mut reports = Vec::new();
    for row in rows() {
        reports.push(run(&client, &broker, &row, args).await?);
    }
    Ok(print(&reports, args, &name))
}
