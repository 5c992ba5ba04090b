//! Our consumers, run as child processes of the comparison (`--role …`) so that their CPU is
//! measured apart from the forwarders'.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pulsar_wire::{Client, ConnectOptions, ConsumerOptions, InitialPosition, SubType};
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
        if message.body.starts_with(&self.prefix)
            && self.ours.fetch_add(1, Ordering::Relaxed) + 1 == self.target
        {
            self.done.notify_one();
        }
        ConsumeResult::Success
    }
}

/// `rocketmq ENDPOINT TOPIC GROUP PREFIX COUNT batched|immediate`
pub(crate) async fn rocketmq(args: &[String]) -> Result<(), String> {
    let cpu = own_cpu();
    let [endpoint, topic, group, prefix, count, mode] = args else {
        return Err("rocketmq ENDPOINT TOPIC GROUP PREFIX COUNT batched|immediate".into());
    };
    let acks = match mode.as_str() {
        "batched" => AckSettings::default(),
        "immediate" => AckSettings::immediate(),
        other => return Err(format!("unknown ack mode {other}")),
    };
    let counter = Arc::new(Counter {
        prefix: prefix.as_bytes().to_vec(),
        target: count.parse().map_err(|e| format!("COUNT: {e}"))?,
        ours: AtomicUsize::new(0),
        done: Notify::new(),
    });
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    let consumer = PushConsumer::builder(config, group.as_str())
        .subscribe(topic.as_str(), "*")
        .acks(acks)
        .start(Arc::clone(&counter))
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
    let [url, topic, subscription, count] = args else {
        return Err("pulsar SERVICE_URL TOPIC SUBSCRIPTION COUNT".into());
    };
    let count: usize = count.parse().map_err(|e| format!("COUNT: {e}"))?;
    let options = ConnectOptions::new(url).map_err(|e| e.to_string())?;
    let client = Client::connect(options).await.map_err(|e| e.to_string())?;
    let consumer = client
        .subscribe(
            topic,
            subscription,
            ConsumerOptions::default()
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest),
        )
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
    consumer.close().await.map_err(|e| e.to_string())?;
    println!("closed cpu_ms={}", (own_cpu() - cpu).as_millis());
    Ok(())
}
