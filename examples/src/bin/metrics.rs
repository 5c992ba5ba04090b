//! The adapters' metrics (feature `metrics`) as a platform scrapes them: a round trip on each
//! embedded emulator (RocketMQ: a producer and a simple consumer; Pulsar: a producer and a
//! consumer), recorded by `metrics-exporter-prometheus` and printed in Prometheus' text
//! format.
//!
//! ```sh
//! cargo run -p examples --features metrics --bin metrics
//! ```
//!
//! The recorder is installed with `PrometheusBuilder::install_recorder` and rendered from its
//! handle (no HTTP listener: a service would serve `handle.render()` on its `/metrics` route).
//! Exits with 1 when a counter of either adapter that the round trip must move (messages sent,
//! received and acknowledged, ack requests) is missing or zero, so that CI can run it as a
//! check.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Messages each adapter sends, receives and acknowledges.
const MESSAGES: usize = 20;

/// The counters the round trip must move, per adapter.
const CHECKED: [&str; 4] = [
    "mq_client_messages_sent_total",
    "mq_client_messages_received_total",
    "mq_client_ack_entries_total",
    "mq_client_ack_requests_total",
];

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn rocketmq() -> Result<(), Failure> {
    use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer, SimpleConsumer};
    use rocketmq_grpc_emulator::{Emulator, TopicKind};

    let emulator = Emulator::builder()
        .topic("orders", TopicKind::Normal, 4)
        .group("billing", false)
        .start()
        .await?;
    let config = ClientConfig::new(&emulator.endpoint())?;
    let producer = Producer::builder(config.clone())
        .topic("orders")
        .start()
        .await?;
    for i in 0..MESSAGES {
        producer
            .send(OutgoingMessage::new("orders", format!("order {i}")))
            .await?;
    }
    let consumer = Arc::new(
        SimpleConsumer::builder(config, "billing")
            .subscribe("orders", "*")
            .build()
            .await?,
    );
    let mut received = Vec::new();
    while received.len() < MESSAGES {
        received.extend(consumer.receive(32, Duration::from_secs(30)).await?);
    }
    // Acks join one batch per (endpoint, topic): acknowledge concurrently.
    let acks: Vec<_> = received
        .into_iter()
        .map(|message| {
            let consumer = Arc::clone(&consumer);
            tokio::spawn(async move { consumer.ack(&message).await })
        })
        .collect();
    for ack in acks {
        ack.await??;
    }
    consumer.close(Duration::from_secs(10)).await;
    drop(producer);
    Ok(())
}

async fn pulsar() -> Result<(), Failure> {
    use pulsar_wire::{Client, InitialPosition, OutgoingMessage};
    use pulsar_wire_emulator::{Emulator, EmulatorConfig};

    let emulator = Emulator::start(EmulatorConfig::default()).await?;
    let client = Client::builder(emulator.endpoint()).build().await?;
    let consumer = pulsar_wire::Consumer::builder(&client, "orders", "billing")
        .initial_position(InitialPosition::Earliest)
        .build()
        .await?;
    let producer = pulsar_wire::Producer::builder(&client, "orders")
        .build()
        .await?;
    for i in 0..MESSAGES {
        producer
            .send(OutgoingMessage::new(format!("order {i}")))
            .await?;
    }
    for _ in 0..MESSAGES {
        let message = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .map_err(|_| "a Pulsar message did not arrive within 10 s")??;
        consumer.ack(&message).await?;
    }
    consumer.flush_acks().await;
    consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    client.close().await;
    Ok(())
}

/// The value of each line of `name` with `client="<client>"` in `text`, summed.
fn value(text: &str, name: &str, client: &str) -> f64 {
    let label = format!("client=\"{client}\"");
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
        .filter(|line| line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn install() -> Result<PrometheusHandle, Failure> {
    // Latencies and waits as Prometheus histograms (summaries by default), 0.5 ms to 10 s.
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;
    rocketmq_grpc::describe_metrics();
    pulsar_wire::describe_metrics();
    Ok(handle)
}

#[tokio::main]
async fn main() -> ExitCode {
    let handle = match install() {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("installing the Prometheus recorder failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    let (rocketmq, pulsar) = tokio::join!(rocketmq(), pulsar());
    let mut failed = false;
    for (client, outcome) in [("rocketmq", rocketmq), ("pulsar", pulsar)] {
        if let Err(error) = outcome {
            eprintln!("the {client} round trip failed: {error}");
            failed = true;
        }
    }
    let text = handle.render();
    print!("{text}");
    println!();
    println!("check                                   rocketmq  pulsar");
    for name in CHECKED {
        let (r, p) = (value(&text, name, "rocketmq"), value(&text, name, "pulsar"));
        let ok = r > 0.0 && p > 0.0;
        failed |= !ok;
        println!(
            "{name:<38}  {r:>8}  {p:>6}{}",
            if ok { "" } else { "  <- zero" }
        );
    }
    if failed {
        eprintln!("FAILED: a counter of an adapter is zero or missing");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
