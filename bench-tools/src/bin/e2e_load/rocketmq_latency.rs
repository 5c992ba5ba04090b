//! RocketMQ latency: publish-to-receive latency at a fixed rate below saturation, in steady
//! state. On a fresh topic a fresh group's push consumer subscribes and prints `ready`; the
//! driver then publishes `--rocketmq-latency-rate` (2,000) 1 KiB messages a second with our
//! producer, each stamped with its send time ([`crate::latency`]). Every handler returns
//! success (the client acknowledges each message), as in `rocketmq-consume`; the window
//! opens `--warmup` after the first message and lasts `--window`, and the latency of each
//! message in it is its receipt time less its stamp. Ours (`rocketmq-grpc` `PushConsumer`),
//! the Java push consumer (`E2eRocketMqPushLatency`), both at default settings.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_grpc::{ClientConfig, ConsumeResult, MessageHandler, ReceivedMessage};
use tokio::sync::Notify;

use crate::child::{Protocol, Spec};
use crate::latency::LatencyWindow;
use crate::rocketmq_consume::push_consumer;
use crate::rocketmq_produce::{fresh_topic, producer};
use crate::window::Steady;
use crate::{Driver, stdin_closed};

/// What the window calls when it opens: prints `start`.
type Opened = Box<dyn FnOnce() + Send>;

/// The push consumer's handler: every message goes through the window; the result is kept
/// for the child's main task, told through `done`.
struct Recorder {
    window: Mutex<LatencyWindow<Opened>>,
    result: Mutex<Option<Result<Steady, String>>>,
    done: Notify,
}

impl Recorder {
    fn finish(&self, result: Result<Steady, String>) {
        let mut slot = self.result.lock();
        if slot.is_none() {
            *slot = Some(result);
            self.done.notify_one();
        }
    }
}

#[async_trait::async_trait]
impl MessageHandler for Recorder {
    async fn handle(&self, message: &ReceivedMessage) -> ConsumeResult {
        let measured = self.window.lock().received(message.body());
        match measured {
            Ok(Some(steady)) => self.finish(Ok(steady)),
            Ok(None) => {}
            Err(e) => self.finish(Err(e)),
        }
        ConsumeResult::Success
    }
}

/// `child rocketmq-latency ENDPOINT TOPIC GROUP WARMUP_SECS WINDOW_SECS`
pub(crate) async fn child(args: crate::args::Latency) -> Result<(), String> {
    let (endpoint, topic, group) = (&args.target, &args.topic, &args.subscription);
    let recorder = Arc::new(Recorder {
        window: Mutex::new(LatencyWindow::new(
            Duration::from_secs(args.warmup_secs),
            Duration::from_secs(args.window_secs),
            Box::new(|| println!("start")),
        )),
        result: Mutex::new(None),
        done: Notify::new(),
    });
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    let consumer = push_consumer(config, group, topic, Arc::clone(&recorder)).await?;
    println!("ready");
    recorder.done.notified().await;
    let steady = recorder.result.lock().take().ok_or("no result")??;
    steady.print_result();
    stdin_closed().await;
    consumer.close(Duration::from_secs(30)).await;
    Ok(())
}

/// Run `run` of every client (ours, Java), each on its own topic and group, deleted after; a
/// row of the defaults table.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let endpoint = driver.options.rocketmq.clone().unwrap_or_default();
    let (rate, size) = (driver.options.rocketmq_latency_rate, driver.options.size);
    for family in driver.options.clients.clone() {
        let Some((label, program, mut args)) = crate::rocketmq_produce::client(
            driver,
            family,
            "rocketmq-latency",
            "E2eRocketMqPushLatency",
        ) else {
            continue;
        };
        let topic = fresh_topic(driver, "latency", family).await?;
        args.extend([
            endpoint.clone(),
            topic.clone(),
            format!("{topic}-group"),
            driver.options.warmup.to_string(),
            driver.options.window.to_string(),
        ]);
        let spec = Spec {
            label: label.into(),
            program,
            args,
            env: Vec::new(),
            protocol: Protocol::Lines,
        };
        let outcome = match producer(&endpoint, &topic).await {
            Ok(producer) => {
                crate::latency::measure_while_publishing(driver, &spec, rate, size, |payload| {
                    producer.send(rocketmq_grpc::OutgoingMessage::new(&topic, payload))
                })
                .await
            }
            Err(e) => {
                driver.failed(label, &format!("the publisher of {topic}: {e}"));
                Ok(None)
            }
        };
        crate::admin::rocketmq_topic(&driver.options.rocketmq_admin, "delete-topic", &topic)
            .await?;
        // Both consumers at their defaults in every table (no setting of theirs is about
        // throughput at a rate below saturation): one measurement is the row of each.
        let outcome = outcome?;
        for settings in driver.options.settings.clone() {
            driver.record(settings, "rocketmq-latency", label, 0, run, outcome.clone());
        }
    }
    Ok(())
}
