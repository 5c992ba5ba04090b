//! The `pulsar` crate (pulsar-rs 6.9.1) as a peer of the end-to-end benchmark.
//!
//! ```text
//! pulsar-rs-peer produce SERVICE_URL TOPIC COUNT SIZE IN_FLIGHT BATCH_MAX BATCH_DELAY_MS
//! pulsar-rs-peer consume SERVICE_URL TOPIC SUBSCRIPTION COUNT
//! ```
//!
//! Line protocol (bench-tools/src/bin/e2e_load/child.rs): `start` when the measured window opens,
//! `result messages=N seconds=S [p50_ms=X p99_ms=Y]` when it closes, then it waits for standard
//! input to close. Produce: batching (at most BATCH_MAX messages / BATCH_DELAY_MS / 4 MiB), at
//! most IN_FLIGHT receipts outstanding, latency from each `send_non_blocking` call to its
//! receipt. Consume: Shared subscription from the earliest message, each message acknowledged.

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use pulsar::consumer::InitialPosition;
use pulsar::{Consumer, ConsumerOptions, ProducerOptions, Pulsar, SubType, TokioExecutor};
use tokio::io::AsyncReadExt;

type Result<T> = std::result::Result<T, String>;

/// The command line: what to do, and its arguments in the order the driver passes them.
#[derive(Debug, Parser)]
#[command(
    name = "pulsar-rs-peer",
    about = "The `pulsar` crate as a peer of the end-to-end benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Produce COUNT messages of SIZE bytes, batched, with at most IN_FLIGHT outstanding.
    Produce(ProduceArgs),
    /// Consume COUNT messages on a Shared subscription from the earliest, acknowledging each.
    Consume(ConsumeArgs),
}

#[derive(Debug, clap::Args)]
struct ProduceArgs {
    /// The broker's service URL (pulsar://host:port).
    service_url: String,
    /// The topic.
    topic: String,
    /// How many messages.
    count: usize,
    /// The payload size in bytes.
    size: usize,
    /// How many receipts may be outstanding.
    in_flight: usize,
    /// At most this many messages per batch.
    batch_max: u32,
    /// A batch goes out after this many milliseconds at the latest.
    batch_delay_ms: u64,
}

#[derive(Debug, clap::Args)]
struct ConsumeArgs {
    /// The broker's service URL (pulsar://host:port).
    service_url: String,
    /// The topic.
    topic: String,
    /// The subscription's name.
    subscription: String,
    /// How many messages.
    count: usize,
}

fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

async fn finish(line: String) {
    println!("{line}");
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

async fn connect(url: &str) -> Result<Pulsar<TokioExecutor>> {
    Pulsar::builder(url, TokioExecutor)
        .build()
        .await
        .map_err(|e| format!("connect: {e}"))
}

async fn produce(args: ProduceArgs) -> Result<()> {
    let ProduceArgs {
        service_url,
        topic,
        count: n,
        size,
        in_flight,
        batch_max,
        batch_delay_ms,
    } = args;
    let pulsar = connect(&service_url).await?;
    let mut producer = pulsar
        .producer()
        .with_topic(topic.as_str())
        .with_options(ProducerOptions {
            batch_size: Some(batch_max),
            batch_byte_size: Some(4 << 20),
            batch_timeout: Some(Duration::from_millis(batch_delay_ms)),
            ..Default::default()
        })
        .build()
        .await
        .map_err(|e| format!("producer: {e}"))?;
    let payload = vec![b'x'; size];
    println!("start");
    let started = Instant::now();
    let mut latencies: Vec<u64> = Vec::with_capacity(n);
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        while pending.len() >= in_flight {
            let latency: Duration = pending.next().await.ok_or("no pending send")??;
            latencies.push(latency.as_micros() as u64);
        }
        let sent = Instant::now();
        let receipt = producer
            .send_non_blocking(payload.clone())
            .await
            .map_err(|e| format!("send: {e}"))?;
        pending.push(async move {
            receipt.await.map_err(|e| format!("receipt: {e}"))?;
            Ok::<_, String>(sent.elapsed())
        });
    }
    // What is still in an unsealed batch goes out now.
    producer
        .send_batch()
        .await
        .map_err(|e| format!("flush: {e}"))?;
    while let Some(latency) = pending.next().await {
        latencies.push(latency?.as_micros() as u64);
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    finish(format!(
        "result messages={n} seconds={seconds:.6} p50_ms={:.3} p99_ms={:.3}",
        percentile_ms(&latencies, 0.50),
        percentile_ms(&latencies, 0.99)
    ))
    .await;
    let _ = producer.close().await;
    Ok(())
}

async fn consume(args: ConsumeArgs) -> Result<()> {
    let ConsumeArgs {
        service_url,
        topic,
        subscription,
        count: n,
    } = args;
    let pulsar = connect(&service_url).await?;
    println!("start");
    let started = Instant::now();
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> = pulsar
        .consumer()
        .with_topic(topic.as_str())
        .with_subscription(subscription.as_str())
        .with_subscription_type(SubType::Shared)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .build()
        .await
        .map_err(|e| format!("consumer: {e}"))?;
    for i in 0..n {
        let message = consumer
            .try_next()
            .await
            .map_err(|e| format!("receive: {e}"))?
            .ok_or(format!("the stream ended after {i} messages"))?;
        consumer
            .ack(&message)
            .await
            .map_err(|e| format!("ack: {e}"))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    finish(format!("result messages={n} seconds={seconds:.6}")).await;
    let _ = consumer.close().await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Produce(args) => produce(args).await,
        Command::Consume(args) => consume(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pulsar-rs-peer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_s_command_lines_parse() {
        let cli = Cli::try_parse_from([
            "pulsar-rs-peer",
            "produce",
            "pulsar://127.0.0.1:6650",
            "t",
            "1000",
            "256",
            "64",
            "1000",
            "5",
        ])
        .unwrap();
        let Command::Produce(args) = cli.command else {
            panic!("not produce: {cli:?}");
        };
        assert_eq!((args.count, args.size, args.in_flight), (1000, 256, 64));
        assert_eq!((args.batch_max, args.batch_delay_ms), (1000, 5));
        let cli = Cli::try_parse_from([
            "pulsar-rs-peer",
            "consume",
            "pulsar://h:6650",
            "t",
            "s",
            "10",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Consume(ConsumeArgs { count: 10, .. })
        ));
        assert!(Cli::try_parse_from(["pulsar-rs-peer", "consume", "u", "t", "s", "ten"]).is_err());
        assert!(Cli::try_parse_from(["pulsar-rs-peer", "produce", "u", "t"]).is_err());
    }
}
