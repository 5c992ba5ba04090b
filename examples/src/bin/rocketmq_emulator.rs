//! The embedded RocketMQ proxy emulator as a separate process, for load runs and for trying a
//! client against it by hand.
//!
//! ```sh
//! cargo run --release -p examples --bin rocketmq_emulator -- \
//!     --port 8081 --topics 3 --prefix orders --queues 4 --group order-consumers
//! ```
//!
//! creates the topics `orders0`, `orders1`, `orders2` (4 queues each) and the group, then prints
//! `endpoint=127.0.0.1:8081` on stdout once it accepts calls. It serves until SIGTERM, ctrl-c,
//! a `quit` line on stdin or the end of stdin (so a parent that dies takes it along; pass
//! `--ignore-stdin` when starting it in the background with no stdin). A `stats` line on stdin
//! prints the statistics block at once.
//!
//! On exit it prints its own CPU time (`getrusage`) and the emulator's counters as `key=value`
//! lines ending with a line `end` (also written to `--stats-file PATH` if given): ack RPCs,
//! mean entries per ack RPC, highlights of the entries-per-request histogram, acknowledged,
//! expired and redelivered messages, and calls per RPC.
//!
//! Flags: `--port P` (0 = any), `--topics N` (1), `--prefix NAME` (`t`), `--queues Q` (4),
//! `--fifo` (FIFO topics), `--group G` (repeatable; `g` if none), `--fifo-group G`,
//! `--receive-batch-max M` (largest receive batch, 32), `--preload N` (messages stored in every
//! topic before serving), `--body-size B` (of preloaded messages, 64), `--access-key AK
//! --secret-key SK` (require signed requests), `--stats-file PATH`, `--ignore-stdin`.

use std::fmt::Write as _;
use std::io::BufRead as _;
use std::process::ExitCode;
use std::time::Instant;

use rocketmq_grpc_emulator::{Emulator, PublishMessage, Rpc, Stats, TopicKind};
use tokio::sync::mpsc;

const USAGE: &str = "usage: rocketmq_emulator [--port P] [--topics N] [--prefix NAME] [--queues Q] [--fifo] \
[--group G]... [--fifo-group G]... [--receive-batch-max M] [--preload N] [--body-size B] \
[--access-key AK --secret-key SK] [--stats-file PATH] [--ignore-stdin]";

#[derive(Debug)]
struct Options {
    port: u16,
    topics: u32,
    prefix: String,
    queues: u32,
    fifo: bool,
    groups: Vec<(String, bool)>,
    receive_batch_max: usize,
    preload: u64,
    body_size: usize,
    credentials: Option<(String, String)>,
    stats_file: Option<String>,
    ignore_stdin: bool,
}

fn number<T: std::str::FromStr>(flag: &str, value: String) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} needs a number, not {value:?}"))
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        port: 0,
        topics: 1,
        prefix: "t".into(),
        queues: 4,
        fifo: false,
        groups: Vec::new(),
        receive_batch_max: 32,
        preload: 0,
        body_size: 64,
        credentials: None,
        stats_file: None,
        ignore_stdin: false,
    };
    let (mut access_key, mut secret_key) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--port" => options.port = number(&flag, value()?)?,
            "--topics" => options.topics = number(&flag, value()?)?,
            "--prefix" => options.prefix = value()?,
            "--queues" => options.queues = number(&flag, value()?)?,
            "--fifo" => options.fifo = true,
            "--group" => options.groups.push((value()?, false)),
            "--fifo-group" => options.groups.push((value()?, true)),
            "--receive-batch-max" => options.receive_batch_max = number(&flag, value()?)?,
            "--preload" => options.preload = number(&flag, value()?)?,
            "--body-size" => options.body_size = number(&flag, value()?)?,
            "--access-key" => access_key = Some(value()?),
            "--secret-key" => secret_key = Some(value()?),
            "--stats-file" => options.stats_file = Some(value()?),
            "--ignore-stdin" => options.ignore_stdin = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (access_key, secret_key) {
        (Some(ak), Some(sk)) => options.credentials = Some((ak, sk)),
        (None, None) => {}
        _ => return Err("--access-key and --secret-key go together".into()),
    }
    if options.groups.is_empty() {
        options.groups.push(("g".into(), false));
    }
    if options.body_size == 0 {
        return Err("--body-size must be at least 1 (empty bodies are refused)".into());
    }
    Ok(options)
}

/// This process's CPU time so far, user and system, in seconds, and its peak RSS in KiB.
fn own_cpu() -> (f64, f64, i64) {
    let usage = broker_tools::cpu::own_usage();
    (
        usage.user.as_secs_f64(),
        usage.system.as_secs_f64(),
        usage.max_rss_kib,
    )
}

/// The statistics block: `key=value` lines, then `end`.
fn stats_block(stats: &Stats, started: Instant) -> String {
    let (user, system, max_rss_kib) = own_cpu();
    let mut out = String::new();
    let mut put = |key: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(out, "{key}={value}");
    };
    put(
        "uptime_s",
        &format!("{:.3}", started.elapsed().as_secs_f64()),
    );
    put("cpu_user_s", &format!("{user:.3}"));
    put("cpu_sys_s", &format!("{system:.3}"));
    put("cpu_s", &format!("{:.3}", user + system));
    put("max_rss_kib", &max_rss_kib);
    put("ack_rpcs", &stats.calls(Rpc::AckMessage));
    put("ack_requests", &stats.ack_requests());
    put("ack_entries", &stats.ack_entries);
    put(
        "mean_entries_per_ack_rpc",
        &format!("{:.2}", stats.mean_ack_entries()),
    );
    put("ack_requests_1", &stats.ack_requests_with_entries(1));
    put("ack_requests_1024", &stats.ack_requests_with_entries(1024));
    let histogram = &stats.ack_entries_histogram;
    put(
        "ack_entries_min",
        &histogram.keys().next().copied().unwrap_or(0),
    );
    put(
        "ack_entries_max",
        &histogram.keys().next_back().copied().unwrap_or(0),
    );
    // The request-weighted median size.
    let half = stats.ack_requests().div_ceil(2);
    let mut seen = 0;
    let median = histogram
        .iter()
        .find(|(_, n)| {
            seen += **n;
            seen >= half
        })
        .map_or(0, |(size, _)| *size);
    put("ack_entries_p50", &median);
    // The 16 most frequent sizes, as size:requests.
    let mut top: Vec<(usize, u64)> = histogram.iter().map(|(s, n)| (*s, *n)).collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(16);
    let top: Vec<String> = top.iter().map(|(s, n)| format!("{s}:{n}")).collect();
    put("ack_hist_top", &top.join(","));
    put("acked", &stats.acked);
    put("duplicate_acks", &stats.duplicate_acks);
    put("expired_handles", &stats.expired_handles);
    put("invalid_handles", &stats.invalid_handles);
    put("malformed_handles", &stats.malformed_handles);
    put("invisibility_expired", &stats.invisibility_expired);
    put("redelivered", &stats.redelivered);
    put("messages_stored", &stats.messages_stored);
    put("messages_delivered", &stats.messages_delivered);
    put("receives_empty", &stats.receives_empty);
    put("nacks", &stats.nacks);
    put("rejected_requests", &stats.rejected_requests);
    for rpc in Rpc::ALL {
        put(&format!("calls_{}", rpc.name()), &stats.calls(rpc));
    }
    out.push_str("end\n");
    out
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("error: {error}");
            }
            eprintln!("{USAGE}");
            return if error.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    let code = match run(options).await {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    };
    // The stdin reader thread may still be blocked in a read: leave without waiting for it.
    std::process::exit(code);
}

async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let kind = if options.fifo {
        TopicKind::Fifo
    } else {
        TopicKind::Normal
    };
    let mut builder = Emulator::builder()
        .port(options.port)
        .receive_batch_size(32, options.receive_batch_max);
    let topics: Vec<String> = (0..options.topics)
        .map(|i| format!("{}{i}", options.prefix))
        .collect();
    for topic in &topics {
        builder = builder.topic(topic, kind, options.queues);
    }
    for (group, fifo) in &options.groups {
        builder = builder.group(group, *fifo);
    }
    if let Some((access_key, secret_key)) = &options.credentials {
        builder = builder.credentials(access_key, secret_key);
    }
    let emulator = builder.start().await?;
    if options.preload > 0 {
        let body = bytes::Bytes::from(vec![b'x'; options.body_size]);
        for topic in &topics {
            for i in 0..options.preload {
                let mut message = PublishMessage::new(body.clone());
                if options.fifo {
                    message = message.message_group(format!("group-{}", i % 64));
                }
                emulator.publish(topic, message)?;
            }
        }
        eprintln!(
            "preloaded {} messages of {} bytes into each of {} topics",
            options.preload,
            options.body_size,
            topics.len()
        );
    }
    println!("endpoint={}", emulator.endpoint());

    // Stdin lines arrive on a channel; its end (or `quit`) stops the emulator.
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
    if !options.ignore_stdin {
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(line) => {
                        if lines_tx.send(line).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break "SIGINT",
            _ = terminate.recv() => break "SIGTERM",
            line = lines.recv(), if !options.ignore_stdin => match line.as_deref().map(str::trim) {
                None => break "end of stdin",
                Some("quit") => break "quit",
                Some("stats") => print!("{}", stats_block(&emulator.stats(), started)),
                Some("") => {}
                Some(other) => eprintln!("unknown command {other:?} (stats, quit)"),
            },
        }
    };
    eprintln!("stopping ({stop})");
    let stats = emulator.stats();
    emulator.shutdown().await?;
    let block = stats_block(&stats, started);
    print!("{block}");
    if let Some(path) = &options.stats_file {
        std::fs::write(path, &block)?;
    }
    Ok(())
}
