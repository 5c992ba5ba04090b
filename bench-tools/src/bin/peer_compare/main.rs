//! Our consumers against the official Java clients, on the same real brokers in one run: ack
//! requests and client CPU per 10,000 consumed messages.
//!
//! Start the brokers (`scripts/brokers/rocketmq start`, `scripts/brokers/pulsar start`), then:
//!
//! ```sh
//! scripts/bench-peers.sh            # builds this and the Java peers, runs it, prints the tables
//! ```
//!
//! or directly:
//!
//! ```sh
//! cargo run --release -p bench-tools --bin peer_compare -- \
//!     [--rocketmq 127.0.0.1:8081] [--pulsar pulsar://127.0.0.1:6650] [--messages 10000]
//! ```
//!
//! Every client talks to the broker through a counting forwarder in this process (a gRPC/HTTP/2
//! forwarder for RocketMQ, a Pulsar frame forwarder that keeps clients on it by rewriting lookup
//! answers), so requests are counted the same way for every client. Each consumer runs in its
//! own process: ours through `--role`, the Java ones through `scripts/java-peers/run`. A
//! consumer reports the CPU it used from before connecting to after its shutdown (which flushes
//! its acks); the operating system's figure for the whole process, JVM start-up included, is
//! reported too.
//!
//! - RocketMQ: one fresh topic per consumer (`peer-batched`, `peer-immediate`, `peer-java`,
//!   created by the broker script), a fresh group, N messages sent once the consumer is ready.
//!   Ours acks in batches (the default: 1,024 entries or 5 s per topic) or one message per
//!   request (`AckSettings::immediate()`); the Java push consumer (rocketmq-client-java 5.0.8)
//!   acks each message with its own `AckMessage` request.
//! - Pulsar: one topic with N messages in batches of 100 (sent by our producer), one Shared
//!   subscription per consumer, each message acknowledged individually; ours groups acks as
//!   configured by default, the Java client (pulsar-client 4.0.8) with its default 100 ms ack
//!   grouping.

mod child;
mod grpc_count;
mod ours;
mod pulsar_count;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{CommandFactory, Parser};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::{BatchingOptions, Client, OutgoingMessage, ProducerOptions};
use rocketmq_grpc::{ClientConfig, Producer};

/// Our consumers against the official Java clients on the same real brokers: ack requests and
/// client CPU per 10,000 consumed messages.
#[derive(Debug, Parser)]
#[command(name = "peer_compare", args_override_self = true)]
struct Cli {
    /// The RocketMQ proxy.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "role")]
    rocketmq: Option<String>,
    /// The Pulsar broker.
    #[arg(long, value_name = "pulsar://HOST:PORT", conflicts_with = "role")]
    pulsar: Option<String>,
    /// Messages per consumer.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    messages: u32,
    /// `scripts/java-peers/run` [default: the repository's].
    #[arg(long, value_name = "PATH", hide_default_value = true,
        default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/java-peers/run"))]
    java_peers: String,
    /// One of our consumers, in a child process of the comparison (the role's arguments
    /// follow).
    #[arg(long, value_enum, requires = "role_args")]
    role: Option<Role>,
    /// The role's arguments.
    #[arg(
        value_name = "ARGS",
        requires = "role",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    role_args: Vec<String>,
}

/// The consumers of ours that run in a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// A RocketMQ push consumer: ENDPOINT TOPIC GROUP PREFIX COUNT batched|immediate.
    Rocketmq,
    /// A Pulsar Shared consumer: SERVICE_URL TOPIC SUBSCRIPTION COUNT.
    Pulsar,
}

/// What the comparison was asked to do.
struct Options {
    rocketmq: Option<String>,
    pulsar: Option<String>,
    messages: usize,
    java_peers: String,
}

impl Cli {
    /// The comparison's options, or what is wrong with them.
    fn into_options(self) -> Result<Options, String> {
        if self.rocketmq.is_none() && self.pulsar.is_none() {
            return Err("give --rocketmq, --pulsar or both".into());
        }
        Ok(Options {
            rocketmq: self.rocketmq,
            pulsar: self.pulsar,
            messages: self.messages as usize,
            java_peers: self.java_peers,
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.role {
        Some(Role::Rocketmq) => ours::rocketmq(&cli.role_args).await,
        Some(Role::Pulsar) => ours::pulsar(&cli.role_args).await,
        None => match cli.into_options() {
            Ok(options) => compare(options).await,
            Err(e) => Cli::command()
                .error(clap::error::ErrorKind::MissingRequiredArgument, e)
                .exit(),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("peer_compare: {error}");
            ExitCode::FAILURE
        }
    }
}

fn address(text: &str) -> Result<SocketAddr, String> {
    let host_port = text.trim_start_matches("pulsar://").trim_end_matches('/');
    host_port
        .to_socket_addrs()
        .map_err(|e| format!("{text}: {e}"))?
        .next()
        .ok_or(format!("{text} resolves to nothing"))
}

fn run_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{}-{millis}", std::process::id())
}

fn per_10k(count: u64, messages: usize) -> f64 {
    count as f64 * 10_000.0 / messages as f64
}

fn ms_per_10k(cpu: Duration, messages: usize) -> f64 {
    cpu.as_secs_f64() * 1000.0 * 10_000.0 / messages as f64
}

async fn compare(options: Options) -> Result<(), String> {
    let ourselves = std::env::current_exe().map_err(|e| e.to_string())?;
    let ourselves = ourselves.to_string_lossy().into_owned();
    println!(
        "peer_compare: {} messages per consumer, run {}",
        options.messages,
        run_id()
    );
    if let Some(endpoint) = &options.rocketmq {
        rocketmq(&options, endpoint, &ourselves).await?;
    }
    if let Some(url) = &options.pulsar {
        pulsar(&options, url, &ourselves).await?;
    }
    Ok(())
}

async fn rocketmq(options: &Options, endpoint: &str, ourselves: &str) -> Result<(), String> {
    let (forwarder, counts) = grpc_count::start(address(endpoint)?)
        .await
        .map_err(|e| e.to_string())?;
    let forwarder = forwarder.to_string();
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    let producer = Producer::builder(config)
        .build()
        .map_err(|e| e.to_string())?;
    let n = options.messages;
    let mut rows = Vec::new();
    for (label, topic, mode) in [
        ("ours, batched acks", "peer-batched", Some("batched")),
        ("ours, immediate acks", "peer-immediate", Some("immediate")),
        (
            "rocketmq-client-java 5.0.8 push consumer",
            "peer-java",
            None,
        ),
    ] {
        let run = run_id();
        let group = format!("peer-{run}");
        let prefix = format!("peer {run} ");
        let (program, args) = match mode {
            Some(mode) => (
                ourselves.to_owned(),
                vec![
                    "--role".into(),
                    "rocketmq".into(),
                    forwarder.clone(),
                    topic.into(),
                    group,
                    prefix.clone(),
                    n.to_string(),
                    mode.into(),
                ],
            ),
            None => (
                options.java_peers.clone(),
                vec![
                    "RocketMqPushConsume".into(),
                    forwarder.clone(),
                    topic.into(),
                    group,
                    prefix.clone(),
                    n.to_string(),
                ],
            ),
        };
        *counts.lock() = Default::default();
        println!("rocketmq: {label}: starting");
        let consumer = child::Consumer::start(label, &program, &args).await?;
        send_rocketmq(&producer, topic, &prefix, n).await?;
        let cpu = consumer.finish(Duration::from_secs(600)).await?;
        let seen = counts.lock().clone();
        println!("rocketmq: {label}: {seen:?} {cpu:?}");
        rows.push((label, seen, cpu));
    }
    println!();
    // A fresh group starts at the topic's first message: earlier runs' messages are consumed
    // and acked too, so everything is per acknowledged message.
    println!(
        "| RocketMQ consumer | messages acked | AckMessage requests per 10,000 acked | \
         ack entries per request | consumer CPU per 10,000 (ms) | whole-process CPU per 10,000 (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, seen, cpu) in &rows {
        let requests = seen.requests_of("AckMessage");
        let acked = seen.ack_entries.max(1) as usize;
        println!(
            "| {label} | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
            seen.ack_entries,
            per_10k(requests, acked),
            seen.ack_entries as f64 / requests.max(1) as f64,
            ms_per_10k(cpu.own, acked),
            ms_per_10k(cpu.process, acked),
        );
    }
    println!();
    Ok(())
}

async fn send_rocketmq(
    producer: &Producer,
    topic: &str,
    prefix: &str,
    n: usize,
) -> Result<(), String> {
    use futures_util::StreamExt;
    let sends = futures_util::stream::iter(0..n)
        .map(|i| {
            producer.send(rocketmq_grpc::OutgoingMessage::new(
                topic,
                format!("{prefix}{i}"),
            ))
        })
        .buffer_unordered(64);
    let failed = sends
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    if failed > 0 {
        return Err(format!("{failed} of {n} sends to {topic} failed"));
    }
    Ok(())
}

async fn pulsar(options: &Options, url: &str, ourselves: &str) -> Result<(), String> {
    let (forwarder, counts) = pulsar_count::start(address(url)?)
        .await
        .map_err(|e| e.to_string())?;
    let forwarder = format!("pulsar://{forwarder}");
    let n = options.messages;
    let java_peers = &options.java_peers;
    let client = Client::builder(url)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (layout, per_batch) in [("batches of 100", 100), ("not batched", 0)] {
        let topic = format!("persistent://public/default/peer-compare-{}", run_id());
        let producer_options = if per_batch == 0 {
            ProducerOptions::default().no_batching()
        } else {
            ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(per_batch)
                    .max_delay(Duration::from_millis(10)),
            )
        };
        let producer = pulsar_wire::Producer::builder(&client, &topic)
            .options(producer_options)
            .build()
            .await
            .map_err(|e| e.to_string())?;
        let sends = (0..n).map(|i| producer.send(OutgoingMessage::new(format!("m{i}"))));
        for result in futures_util::future::join_all(sends).await {
            result.map_err(|e| format!("send: {e}"))?;
        }
        for (client_label, ours) in [
            ("ours (pulsar-wire)", true),
            ("pulsar-client 4.0.8 (Java)", false),
        ] {
            let label = format!("{client_label}, {layout}");
            let subscription = format!("peer-{}", run_id());
            let mut args: Vec<String> = if ours {
                vec![ourselves.to_owned(), "--role".into(), "pulsar".into()]
            } else {
                vec![java_peers.clone(), "PulsarConsume".into()]
            };
            args.extend([
                forwarder.clone(),
                topic.clone(),
                subscription,
                n.to_string(),
            ]);
            let program = args.remove(0);
            *counts.lock() = Default::default();
            println!("pulsar: {label}: starting");
            let consumer = child::Consumer::start(&label, &program, &args).await?;
            let cpu = consumer.finish(Duration::from_secs(600)).await?;
            let seen = counts.lock().clone();
            println!("pulsar: {label}: {seen:?} {cpu:?}");
            rows.push((label, seen, cpu));
        }
    }
    println!();
    println!(
        "| Pulsar consumer ({n} messages, each acked individually) | ACK frames per 10,000 | \
         message ids per ACK frame | FLOW frames | consumer CPU per 10,000 (ms) | whole-process CPU per 10,000 (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, seen, cpu) in &rows {
        let acks = seen.frames_of(Type::Ack);
        println!(
            "| {label} | {:.1} | {:.1} | {} | {:.0} | {:.0} |",
            per_10k(acks, n),
            seen.acked_ids as f64 / acks.max(1) as f64,
            seen.frames_of(Type::Flow),
            ms_per_10k(cpu.own, n),
            ms_per_10k(cpu.process, n),
        );
    }
    println!();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["peer_compare"].iter().chain(args))
    }

    #[test]
    fn the_command_lines_of_the_script_and_the_roles_parse() {
        // scripts/bench-peers.sh
        let options = parse(&[
            "--rocketmq",
            "127.0.0.1:8081",
            "--pulsar",
            "pulsar://127.0.0.1:6650",
            "--messages",
            "2000",
        ])
        .unwrap()
        .into_options()
        .unwrap();
        assert_eq!(options.rocketmq.as_deref(), Some("127.0.0.1:8081"));
        assert_eq!(options.pulsar.as_deref(), Some("pulsar://127.0.0.1:6650"));
        assert_eq!(options.messages, 2000);
        assert!(options.java_peers.ends_with("scripts/java-peers/run"));
        let options = parse(&["--pulsar", "pulsar://h:6650", "--java-peers", "/j"]).unwrap();
        let options = options.into_options().unwrap();
        assert_eq!(
            (options.messages, options.java_peers.as_str()),
            (10_000, "/j")
        );
        assert!(parse(&[]).unwrap().into_options().is_err());
        assert!(parse(&["--pulsar", "p", "--messages", "0"]).is_err());
        // What the comparison passes to its own child processes.
        let cli = parse(&["--role", "rocketmq", "h:1", "t", "g", "p-", "10", "batched"]).unwrap();
        assert_eq!(cli.role, Some(Role::Rocketmq));
        assert_eq!(cli.role_args, ["h:1", "t", "g", "p-", "10", "batched"]);
        assert!(ours::RocketmqRole::from_args(&cli.role_args).is_ok());
        let cli = parse(&["--role", "pulsar", "pulsar://h:1", "t", "s", "10"]).unwrap();
        assert_eq!(cli.role, Some(Role::Pulsar));
        assert!(ours::PulsarRole::from_args(&cli.role_args).is_ok());
        assert!(ours::PulsarRole::from_args(&cli.role_args[..3]).is_err());
        assert!(parse(&["--role", "kafka", "x"]).is_err());
        assert!(parse(&["--role", "pulsar", "--pulsar", "p"]).is_err());
    }
}
