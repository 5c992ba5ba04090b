//! Our consumers, run as child processes of the comparison (`--role …`) so that their CPU is
//! measured apart from the forwarders'.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pulsar_wire::{ConnectOptions, InitialPosition, SubType};
use rocketmq_grpc::{
    AckSettings, ClientConfig, ConsumeResult, MessageHandler, PushConsumer, ReceivedMessage,
};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use broker_tools::cpu::own as own_cpu;

/// Blocks until standard input is closed: the driver's signal to shut down.
async fn stdin_closed() {
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

struct Counter {
    prefix: Vec<u8>,
    target: usize,
    ours: AtomicUsize,
    done: Notify,
}

#[async_trait::async_trait]
impl MessageHandler for Counter {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        if message.body().starts_with(&self.prefix)
            && self.ours.fetch_add(1, Ordering::Relaxed) + 1 == self.target
        {
            self.done.notify_one();
        }
        ConsumeResult::Success
    }
}

/// The arguments of `--role rocketmq`.
#[derive(Debug, clap::Parser)]
#[command(name = "peer_compare --role rocketmq")]
pub(crate) struct RocketmqRole {
    /// The proxy (the counting forwarder).
    endpoint: String,
    /// The topic.
    topic: String,
    /// The consumer group.
    group: String,
    /// The payloads' prefix of this run.
    prefix: String,
    /// Messages to consume.
    count: usize,
    /// How the consumer acknowledges.
    #[arg(value_enum)]
    mode: AckMode,
}

/// How the RocketMQ consumer acknowledges.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum AckMode {
    /// The default `AckSettings`.
    Batched,
    /// `AckSettings::immediate()`.
    Immediate,
}

impl RocketmqRole {
    /// Parses the role's arguments.
    pub(crate) fn from_args(args: &[String]) -> Result<Self, String> {
        let args = std::iter::once("rocketmq").chain(args.iter().map(String::as_str));
        <Self as clap::Parser>::try_parse_from(args).map_err(|e| e.to_string())
    }
}

/// The arguments of `--role pulsar`.
#[derive(Debug, clap::Parser)]
#[command(name = "peer_compare --role pulsar")]
pub(crate) struct PulsarRole {
    /// The broker (the counting forwarder).
    service_url: String,
    /// The topic.
    topic: String,
    /// The Shared subscription.
    subscription: String,
    /// Messages to consume.
    count: usize,
}

impl PulsarRole {
    /// Parses the role's arguments.
    pub(crate) fn from_args(args: &[String]) -> Result<Self, String> {
        let args = std::iter::once("pulsar").chain(args.iter().map(String::as_str));
        <Self as clap::Parser>::try_parse_from(args).map_err(|e| e.to_string())
    }
}

/// `rocketmq ENDPOINT TOPIC GROUP PREFIX COUNT batched|immediate`
pub(crate) async fn rocketmq(args: &[String]) -> Result<(), String> {
    let cpu = own_cpu();
    let RocketmqRole {
        endpoint,
        topic,
        group,
        prefix,
        count,
        mode,
    } = RocketmqRole::from_args(args)?;
    let acks = match mode {
        AckMode::Batched => AckSettings::default(),
        AckMode::Immediate => AckSettings::immediate(),
    };
    let counter = Arc::new(Counter {
        prefix: prefix.as_bytes().to_vec(),
        target: count,
        ours: AtomicUsize::new(0),
        done: Notify::new(),
    });
    let config = ClientConfig::new(&endpoint).map_err(|e| e.to_string())?;
    let consumer = PushConsumer::builder(config, group.as_str())
        .subscribe(topic.as_str(), "*")
        .acks(acks)
        .handler(Arc::clone(&counter))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    println!("ready");
    counter.done.notified().await;
    println!("consumed={count}");
    stdin_closed().await;
    let report = consumer.close(Duration::from_secs(30)).await;
    if !report.unacknowledged.is_empty() {
        return Err(format!(
            "{} messages unacknowledged",
            report.unacknowledged.len()
        ));
    }
    println!("closed cpu_ms={}", (own_cpu() - cpu).as_millis());
    Ok(())
}

/// `pulsar SERVICE_URL TOPIC SUBSCRIPTION COUNT`
pub(crate) async fn pulsar(args: &[String]) -> Result<(), String> {
    let cpu = own_cpu();
    let PulsarRole {
        service_url: url,
        topic,
        subscription,
        count,
    } = PulsarRole::from_args(args)?;
    let options = ConnectOptions::new(&url).map_err(|e| e.to_string())?;
    let client = pulsar_wire::ClientBuilder::from(options)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let consumer = pulsar_wire::Consumer::builder(&client, &topic, &subscription)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    println!("ready");
    for _ in 0..count {
        let message = consumer.receive().await.map_err(|e| e.to_string())?;
        consumer.ack(&message).await.map_err(|e| e.to_string())?;
    }
    println!("consumed={count}");
    stdin_closed().await;
    consumer.flush_acks().await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    println!("closed cpu_ms={}", (own_cpu() - cpu).as_millis());
    Ok(())
}
