//! Capability 3: urgent messages behind a low-priority backlog, without and with priority.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulsar_wire::prioritized::{
    GateConfig, LayoutSpec, Level, PriorityConsumer, PriorityPolicy, PriorityRouter, RouterConfig,
    Strategy, Unlisted,
};
use pulsar_wire::{
    BatchingOptions, Client, Consumer, ConsumerOptions, Error, InitialPosition, Message,
    OutgoingMessage, ProducerOptions,
};
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

use crate::table;

const PARTITIONS: u32 = 4;
pub(crate) const LOW: usize = 20_000;
pub(crate) const HIGH: usize = 200;
const QUEUE: u32 = 1_000;
pub(crate) const PROPERTY: &str = "priority";

/// A plain consumer or the priority consumer, received from alike.
enum Receiver {
    Plain(Box<Consumer>),
    Priority(PriorityConsumer),
}

impl Receiver {
    async fn receive(&self) -> Result<Message, Error> {
        match self {
            Receiver::Plain(c) => c.receive().await,
            Receiver::Priority(c) => c.receive().await,
        }
    }

    async fn ack(&self, message: &Message) -> Result<(), Error> {
        match self {
            Receiver::Plain(c) => c.ack(message).await,
            Receiver::Priority(c) => c.ack(message).await,
        }
    }

    async fn close(&self) -> Result<(), Error> {
        match self {
            Receiver::Plain(c) => c.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await.map(drop),
            Receiver::Priority(c) => c.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await.map(drop),
        }
    }
}

pub(crate) struct Outcome {
    /// Sorted latencies of the urgent messages, from the send's confirmation to delivery.
    pub(crate) urgent: Vec<Duration>,
    pub(crate) low_before_last_urgent: usize,
    pub(crate) delivered_once: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

/// Queues [`LOW`] low messages and then [`HIGH`] urgent ones, attaches one consumer and drains.
async fn drain(emulator: &Emulator, with_priority: bool) -> Result<Outcome, Error> {
    let topic = format!(
        "persistent://public/default/tour-priority-{}",
        if with_priority { "ours" } else { "none" }
    );
    emulator.create_topic(&topic, PARTITIONS)?;
    let client = Client::builder(emulator.endpoint()).build().await?;
    let policy = PriorityPolicy::builder()
        .levels(2)
        .property(PROPERTY)
        .build()?;
    // Partition 0 carries the urgent level 0; the others the default level 1.
    let layout = LayoutSpec::explicit_with([(Level::new(0), vec![0])], Unlisted::DefaultLevel);
    let consumer_options = ConsumerOptions::default()
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(QUEUE);
    let batching = BatchingOptions::default()
        .max_messages(100)
        .max_delay(Duration::from_millis(5));
    let mut producer_options = ProducerOptions::default().batching(batching);
    if with_priority {
        let router = PriorityRouter::for_topic(
            &client,
            &topic,
            policy.clone(),
            layout.clone(),
            RouterConfig::default(),
        )
        .await?;
        producer_options = producer_options.router(Arc::new(router));
    }
    // The subscription exists before the first message, so the whole backlog waits for it.
    Consumer::builder(&client, &topic, "drain")
        .options(consumer_options.clone())
        .build()
        .await?
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await?;
    let producer = pulsar_wire::Producer::builder(&client, &topic)
        .options(producer_options)
        .build()
        .await?;
    let mut confirmed: HashMap<String, Instant> = HashMap::with_capacity(HIGH);
    let names = (0..LOW)
        .map(|i| (format!("l{i}"), "1"))
        .chain((0..HIGH).map(|i| (format!("h{i}"), "0")));
    let names: Vec<_> = names.collect();
    for chunk in names.chunks(2_000) {
        let sends = chunk.iter().map(|(name, level)| {
            let message = OutgoingMessage::new(name.clone()).property(PROPERTY, *level);
            let producer = &producer;
            async move { producer.send(message).await.map(|_| (name, Instant::now())) }
        });
        for sent in futures_util::future::join_all(sends).await {
            let (name, at) = sent?;
            if name.starts_with('h') {
                confirmed.insert(name.clone(), at);
            }
        }
    }
    let receiver = if with_priority {
        let gate = GateConfig::default()
            .with_strategy(Strategy::Strict)
            .with_receiver_queue_size(QUEUE);
        Receiver::Priority(
            PriorityConsumer::builder(&client, &topic, "drain", policy, layout)
                .consumer(consumer_options)
                .gate(gate)
                .build()
                .await?,
        )
    } else {
        Receiver::Plain(Box::new(
            Consumer::builder(&client, &topic, "drain")
                .options(consumer_options)
                .build()
                .await?,
        ))
    };
    let mut urgent = Vec::with_capacity(HIGH);
    let mut seen: HashMap<String, u32> = HashMap::with_capacity(LOW + HIGH);
    let (mut low_so_far, mut low_before_last_urgent) = (0, 0);
    while seen.len() < LOW + HIGH {
        let message = receiver.receive().await?;
        let delivered = Instant::now();
        receiver.ack(&message).await?;
        let name = String::from_utf8_lossy(message.payload()).into_owned();
        if let Some(at) = confirmed.get(&name) {
            urgent.push(delivered.saturating_duration_since(*at));
            low_before_last_urgent = low_so_far;
        } else {
            low_so_far += 1;
        }
        *seen.entry(name).or_default() += 1;
    }
    receiver.close().await?;
    producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    client.close().await;
    urgent.sort_unstable();
    Ok(Outcome {
        delivered_once: seen.values().all(|&n| n == 1) && urgent.len() == HIGH,
        urgent,
        low_before_last_urgent,
    })
}

/// Runs both drains; the claim is that with priority the urgent messages come first (fewer
/// low ones before the last urgent than one receiver queue of the low partitions) and
/// everything arrives exactly once.
pub(crate) async fn run() -> Result<bool, String> {
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .map_err(|e| format!("emulator: {e}"))?;
    let none = drain(&emulator, false)
        .await
        .map_err(|e| format!("no priority: {e}"))?;
    let ours = drain(&emulator, true)
        .await
        .map_err(|e| format!("priority: {e}"))?;
    let rocketmq_none = crate::priority_rocketmq::drain(false)
        .await
        .map_err(|e| format!("RocketMQ, no priority: {e}"))?;
    let rocketmq_ours = crate::priority_rocketmq::drain(true)
        .await
        .map_err(|e| format!("RocketMQ, priority: {e}"))?;
    println!(
        "  {LOW} low messages queued, then {HIGH} urgent ones, on a {PARTITIONS}-partition \
         topic (Pulsar) or on level topics (RocketMQ; without priority one topic); one \
         consumer drains it"
    );
    let row = |name: &str, o: &Outcome| {
        vec![
            name.to_owned(),
            format!("{:.0?}", percentile(&o.urgent, 0.5)),
            format!("{:.0?}", percentile(&o.urgent, 0.99)),
            format!("{} of {LOW}", o.low_before_last_urgent),
            if o.delivered_once { "yes" } else { "no" }.to_owned(),
        ]
    };
    table::print(
        &[
            "consumption",
            "urgent p50",
            "urgent p99",
            "low before last urgent",
            "each once",
        ],
        &[
            row("no priority", &none),
            row("PriorityRouter + PriorityConsumer", &ours),
            row("RocketMQ: no priority", &rocketmq_none),
            row(
                "RocketMQ: PriorityTopics + gated PushConsumer",
                &rocketmq_ours,
            ),
        ],
    );
    Ok(none.delivered_once
        && ours.delivered_once
        && rocketmq_none.delivered_once
        && rocketmq_ours.delivered_once
        && rocketmq_ours.low_before_last_urgent < LOW / 10
        && percentile(&rocketmq_ours.urgent, 0.99) < percentile(&rocketmq_none.urgent, 0.99) / 10
        && ours.low_before_last_urgent < (PARTITIONS as usize - 1) * QUEUE as usize
        && percentile(&ours.urgent, 0.99) < percentile(&none.urgent, 0.99))
}
