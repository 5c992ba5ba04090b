//! RocketMQ push consume: a backlog of N messages on a fresh topic (written by our producer,
//! not measured), then a fresh group's push consumer drains it; every handler returns
//! success, so the client acknowledges each message. The window runs from before the
//! consumer's start to the N-th handled message. Ours (`rocketmq-grpc` `PushConsumer`, batched
//! acks, default settings), the Java push consumer (default settings).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rocketmq_grpc::{ClientConfig, ConsumeResult, MessageHandler, PushConsumer, ReceivedMessage};
use tokio::sync::Notify;

use crate::args::Settings;
use crate::child::{Protocol, Spec};
use crate::rocketmq_produce::{IN_FLIGHT, fresh_topic, producer, send_all};
use crate::{Driver, stdin_closed};

struct Counter {
    target: usize,
    handled: AtomicUsize,
    done: Notify,
}

#[async_trait::async_trait]
impl MessageHandler for Counter {
    async fn handle(&self, _message: &ReceivedMessage) -> ConsumeResult {
        if self.handled.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
        ConsumeResult::Success
    }
}

/// `child rocketmq-consume ENDPOINT TOPIC GROUP MESSAGES`
pub(crate) async fn child(args: crate::args::Consume) -> Result<(), String> {
    let (endpoint, topic, group) = (&args.target, &args.topic, &args.subscription);
    let n = args.messages;
    let counter = Arc::new(Counter {
        target: n,
        handled: AtomicUsize::new(0),
        done: Notify::new(),
    });
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    println!("start");
    let started = Instant::now();
    let consumer = push_consumer(config, group, topic, Arc::clone(&counter)).await?;
    counter.done.notified().await;
    let seconds = started.elapsed().as_secs_f64();
    println!("result messages={n} seconds={seconds:.6}");
    stdin_closed().await;
    consumer.close(Duration::from_secs(30)).await;
    Ok(())
}

/// The benchmark's push consumer: `group` on every tag of `topic`, `handler` for each
/// message, default settings.
pub(crate) async fn push_consumer(
    config: ClientConfig,
    group: &str,
    topic: &str,
    handler: impl MessageHandler,
) -> Result<PushConsumer, String> {
    PushConsumer::builder(config, group)
        .subscribe(topic, "*")
        .handler(handler)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Run `run` of every client, each on its own topic and backlog, deleted after.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    measure_path(
        driver,
        run,
        "rocketmq-consume",
        "E2eRocketMqPushConsume",
        &[],
    )
    .await
}

/// Run `run` of every client of consume path `path` (our child `path`, the Java peer
/// `java_class`), each on its own topic and backlog, deleted after; `extra` goes after the
/// child's `ENDPOINT TOPIC GROUP MESSAGES`.
pub(crate) async fn measure_path(
    driver: &mut Driver,
    run: usize,
    path: &'static str,
    java_class: &str,
    extra: &[String],
) -> Result<(), String> {
    let endpoint = driver.options.rocketmq.clone().unwrap_or_default();
    let n = driver.options.rocketmq_backlog;
    for family in driver.options.clients.clone() {
        let Some((label, program, mut args)) =
            crate::rocketmq_produce::client(driver, family, path, java_class)
        else {
            continue;
        };
        let topic = fresh_topic(driver, "consume", family).await?;
        eprintln!("e2e_load: writing a backlog of {n} to {topic}");
        let filled = async {
            let producer = producer(&endpoint, &topic).await?;
            send_all(&producer, &topic, n, driver.options.size, IN_FLIGHT).await
        }
        .await;
        args.extend([
            endpoint.clone(),
            topic.clone(),
            format!("{topic}-group"),
            n.to_string(),
        ]);
        args.extend(extra.iter().cloned());
        let spec = Spec {
            label: label.into(),
            program,
            args,
            env: Vec::new(),
            protocol: Protocol::Lines,
        };
        let outcome = match filled {
            Ok(_) => driver.measure(&spec).await,
            Err(e) => {
                eprintln!("e2e_load: FAILED: backlog of {topic}: {e}");
                Ok(None)
            }
        };
        crate::admin::rocketmq_topic(&driver.options.rocketmq_admin, "delete-topic", &topic)
            .await?;
        driver.record(Settings::Defaults, path, label, 0, run, outcome?);
    }
    Ok(())
}
