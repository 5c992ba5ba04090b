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

use clap::Parser;
use rocketmq_grpc_emulator::{Emulator, PublishMessage, Rpc, Stats, TopicKind};
use tokio::sync::mpsc;

/// The embedded RocketMQ proxy emulator as a separate process.
#[derive(Debug, Parser)]
#[command(name = "rocketmq_emulator", args_override_self = true)]
struct Options {
    /// The port (0 = any free port).
    #[arg(long, value_name = "P", default_value_t = 0)]
    port: u16,
    /// Topics, named PREFIX0, PREFIX1, ...
    #[arg(long, value_name = "N", default_value_t = 1)]
    topics: u32,
    /// The topics' name prefix.
    #[arg(long, value_name = "NAME", default_value = "t")]
    prefix: String,
    /// Queues per topic.
    #[arg(long, value_name = "Q", default_value_t = 4)]
    queues: u32,
    /// FIFO topics.
    #[arg(long)]
    fifo: bool,
    /// A consumer group (repeatable; `g` if no group is given).
    #[arg(long = "group", value_name = "G")]
    groups: Vec<String>,
    /// A FIFO consumer group (repeatable).
    #[arg(long = "fifo-group", value_name = "G")]
    fifo_groups: Vec<String>,
    /// The largest receive batch.
    #[arg(long, value_name = "M", default_value_t = 32)]
    receive_batch_max: usize,
    /// Messages stored in every topic before serving.
    #[arg(long, value_name = "N", default_value_t = 0)]
    preload: u64,
    /// The body size of preloaded messages (empty bodies are refused).
    #[arg(long, value_name = "B", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    body_size: u64,
    /// Require requests signed with this access key (with --secret-key).
    #[arg(long, value_name = "AK", requires = "secret_key")]
    access_key: Option<String>,
    /// The secret key of --access-key.
    #[arg(long, value_name = "SK", requires = "access_key")]
    secret_key: Option<String>,
    /// Also write the statistics block to PATH.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<String>,
    /// Do not read stdin (for a background process with no stdin).
    #[arg(long)]
    ignore_stdin: bool,
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
    let options = Options::parse();
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
    if options.groups.is_empty() && options.fifo_groups.is_empty() {
        builder = builder.group("g", false);
    }
    for group in &options.groups {
        builder = builder.group(group, false);
    }
    for group in &options.fifo_groups {
        builder = builder.group(group, true);
    }
    if let (Some(access_key), Some(secret_key)) = (&options.access_key, &options.secret_key) {
        builder = builder.credentials(access_key, secret_key);
    }
    let emulator = builder.start().await?;
    if options.preload > 0 {
        let body = bytes::Bytes::from(vec![b'x'; options.body_size as usize]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_lines_of_the_docs_and_of_rocketmq_ack_load_parse() {
        let parse = |a: &[&str]| Options::try_parse_from(["rocketmq_emulator"].iter().chain(a));
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.port, o.topics, o.prefix.as_str(), o.queues),
            (0, 1, "t", 4)
        );
        assert_eq!((o.receive_batch_max, o.preload, o.body_size), (32, 0, 64));
        assert!(o.groups.is_empty() && !o.fifo && !o.ignore_stdin);
        let doc = [
            "--port", "8081", "--topics", "3", "--prefix", "orders", "--queues", "4",
        ];
        let o = parse(&[&doc[..], &["--group", "order-consumers"]].concat()).unwrap();
        assert_eq!((o.port, o.topics, o.prefix.as_str()), (8081, 3, "orders"));
        assert_eq!(o.groups, ["order-consumers"]);
        // rocketmq_ack_load's scenario (c)
        let o = parse(&[
            "--topics",
            "1",
            "--prefix",
            "c",
            "--queues",
            "1",
            "--group",
            "load",
            "--receive-batch-max",
            "1024",
            "--preload",
            "2100000",
            "--body-size",
            "16",
        ])
        .unwrap();
        assert_eq!(
            (o.receive_batch_max, o.preload, o.body_size),
            (1024, 2_100_000, 16)
        );
        let o = parse(&[
            "--fifo",
            "--group",
            "a",
            "--fifo-group",
            "b",
            "--group",
            "c",
            "--access-key",
            "ak",
            "--secret-key",
            "sk",
            "--stats-file",
            "/s",
            "--ignore-stdin",
        ])
        .unwrap();
        assert_eq!(
            (o.groups, o.fifo_groups),
            (vec!["a".into(), "c".into()], vec!["b".into()])
        );
        assert!(o.fifo && o.ignore_stdin && o.stats_file.is_some());
        assert!(parse(&["--access-key", "ak"]).is_err());
        assert!(parse(&["--body-size", "0"]).is_err());
        assert!(parse(&["--port", "x"]).is_err());
    }
}
