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

use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use pulsar::consumer::InitialPosition;
use pulsar::{Consumer, ConsumerOptions, ProducerOptions, Pulsar, SubType, TokioExecutor};
use tokio::io::AsyncReadExt;

type Result<T> = std::result::Result<T, String>;

fn number<T: std::str::FromStr>(text: &str, what: &str) -> Result<T> {
    text.parse()
        .map_err(|_| format!("{what}: {text:?} is not a number"))
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

async fn produce(args: &[String]) -> Result<()> {
    let [url, topic, count, size, in_flight, batch_max, delay_ms] = args else {
        return Err(
            "produce SERVICE_URL TOPIC COUNT SIZE IN_FLIGHT BATCH_MAX BATCH_DELAY_MS".into(),
        );
    };
    let n: usize = number(count, "COUNT")?;
    let size: usize = number(size, "SIZE")?;
    let in_flight: usize = number(in_flight, "IN_FLIGHT")?;
    let pulsar = connect(url).await?;
    let mut producer = pulsar
        .producer()
        .with_topic(topic.as_str())
        .with_options(ProducerOptions {
            batch_size: Some(number(batch_max, "BATCH_MAX")?),
            batch_byte_size: Some(4 << 20),
            batch_timeout: Some(Duration::from_millis(number(delay_ms, "BATCH_DELAY_MS")?)),
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

async fn consume(args: &[String]) -> Result<()> {
    let [url, topic, subscription, count] = args else {
        return Err("consume SERVICE_URL TOPIC SUBSCRIPTION COUNT".into());
    };
    let n: usize = number(count, "COUNT")?;
    let pulsar = connect(url).await?;
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("produce") => produce(rest).await,
        Some("consume") => consume(rest).await,
        _ => Err("usage: pulsar-rs-peer produce|consume ARGS...".into()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pulsar-rs-peer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
