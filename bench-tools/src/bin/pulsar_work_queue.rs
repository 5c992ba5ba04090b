//! A plain Shared work queue on a Pulsar broker: N consumers on one Shared subscription whose
//! handlers take a while per message before an ordinary ack. Is a message one consumer holds
//! handed to another meanwhile?
//!
//! Defaults (issue 27's shape): 4 consumers, 2,000 messages produced unbatched once every
//! consumer has subscribed, 2 s per message, each consumer handling up to 50 messages at once
//! (it takes the next message from its client only when a handler is free; the rest wait in the
//! client's receiver queue), so about 20 s of handling.
//!
//! ```text
//! cargo run --release -p bench-tools --bin pulsar_work_queue -- \
//!     --service-url pulsar://127.0.0.1:6650 [--admin-url http://127.0.0.1:8080] \
//!     [--consumers 4] [--messages 2000] [--handle-ms 2000] [--concurrency 50] [--batch 1] \
//!     [--receiver-queue N]
//! ```
//!
//! Without `--service-url` it runs on the embedded emulator. It prints one `handed_over` line
//! per payload received by a second consumer while a first one held it (the first 20, then a
//! count), and one `result` line: produced, deliveries per consumer, payloads handed over,
//! received again by their holder, acknowledged more than once, never acknowledged, total time
//! (first send to the last payload's first ack), the consumers' redelivery requests, and with `--admin-url`
//! the settled unacked count and backlog. Exit 0 when nothing was handed over, acknowledged
//! twice or left unacknowledged, 3 otherwise, 1 on errors.

use std::process::ExitCode;
use std::time::Duration;

use broker_tools::pulsar_admin::PulsarAdmin;
use broker_tools::txn_steady::consumer_name;
use broker_tools::work_queue::{self, Shape};
use clap::Parser;
use pulsar_wire::ConnectOptions;
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

const SUBSCRIPTION: &str = "work";
/// Hand-over lines printed before the rest is only counted.
const SHOWN: usize = 20;

struct Args {
    service_url: Option<String>,
    admin_url: Option<String>,
    shape: Shape,
}

/// A plain Shared work queue: is a message one consumer holds handed to another meanwhile?
#[derive(Debug, Parser)]
#[command(name = "pulsar_work_queue", args_override_self = true)]
struct Cli {
    /// The broker's binary-protocol URL; without it the embedded emulator.
    #[arg(long, value_name = "pulsar://HOST:6650")]
    service_url: Option<String>,
    /// The broker's admin REST URL: the settled unacked count and backlog.
    #[arg(long, value_name = "http://HOST:8080")]
    admin_url: Option<String>,
    /// Consumers on the subscription [default: 4].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    consumers: Option<u32>,
    /// Messages produced [default: 2000].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    messages: Option<u32>,
    /// Milliseconds a handler takes per message [default: 2000].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    handle_ms: Option<u32>,
    /// Messages each consumer handles at once [default: 50].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    concurrency: Option<u32>,
    /// Messages per batch of the producer [default: 1].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    batch: Option<u32>,
    /// The consumers' receiver queue [default: the client's].
    #[arg(long, value_name = "N", value_parser = above_zero)]
    receiver_queue: Option<u32>,
}

/// A number above 0.
fn above_zero(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("takes a number above 0".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl Cli {
    /// The run these options describe: `Shape::standard()` with the options given.
    fn into_args(self) -> Args {
        let standard = Shape::standard();
        let mut shape = Shape::new(
            self.consumers.map_or(standard.consumers, |n| n as usize),
            self.messages.unwrap_or(standard.messages),
            self.handle_ms.map_or(standard.handle_for, |ms| {
                Duration::from_millis(u64::from(ms))
            }),
        );
        shape.concurrency = self
            .concurrency
            .map_or(standard.concurrency, |n| n as usize);
        shape.batch = self.batch.map_or(standard.batch, |n| n as usize);
        shape.receiver_queue = self.receiver_queue.or(standard.receiver_queue);
        shape.timeout = shape.default_timeout();
        Args {
            service_url: self.service_url,
            admin_url: self.admin_url,
            shape,
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    let shape = &args.shape;
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!("persistent://public/default/work-queue-{millis}");
    let admin = args
        .admin_url
        .as_deref()
        .map(PulsarAdmin::new)
        .transpose()
        .map_err(|e| e.to_string())?;
    let (_emulator, service_url) = match &args.service_url {
        Some(url) => (None, url.clone()),
        None => {
            let emulator = Emulator::start(EmulatorConfig::default())
                .await
                .map_err(|e| e.to_string())?;
            emulator
                .create_topic(&topic, 0)
                .map_err(|e| e.to_string())?;
            let url = emulator.endpoint().to_owned();
            (Some(emulator), url)
        }
    };
    if let Some(admin) = &admin {
        admin
            .create_topic(&topic)
            .await
            .map_err(|e| e.to_string())?;
    }
    println!(
        "topic {topic}: {} consumers, {} messages{}, {:?} per message, {} at once per consumer, \
         receiver queue {}",
        shape.consumers,
        shape.messages,
        if shape.batch > 1 {
            format!(" in batches of {}", shape.batch)
        } else {
            ", unbatched".into()
        },
        shape.handle_for,
        shape.concurrency,
        shape
            .receiver_queue
            .map_or("the client's default".into(), |q| q.to_string()),
    );
    let options = ConnectOptions::new(&service_url)
        .map_err(|e| e.to_string())?
        .operation_timeout(Duration::from_secs(30));
    let client = pulsar_wire::ClientBuilder::from(options)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let report = work_queue::run(&client, &topic, SUBSCRIPTION, shape, admin.as_ref())
        .await
        .map_err(|e| e.to_string())?;
    client.close().await;
    let analysis = &report.analysis;
    for over in analysis.handed_over.iter().take(SHOWN) {
        println!(
            "handed_over payload={} holder={} held_from_ms={} held_until_ms={} other={} \
             received_at_ms={}",
            over.payload,
            consumer_name(over.holder),
            over.held_from.as_millis(),
            over.held_until
                .map_or("never".into(), |at| at.as_millis().to_string()),
            consumer_name(over.other),
            over.received_at.as_millis(),
        );
    }
    if analysis.handed_over.len() > SHOWN {
        println!("... and {} more", analysis.handed_over.len() - SHOWN);
    }
    let received_by = report
        .received_by
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let count = |value: Option<i64>| value.map_or("-".into(), |v| v.to_string());
    println!(
        "result consumers={} produced={} received={} received_by={received_by} handed_over={} \
         received_again_by_holder={} acked_more_than_once={} never_acked={} acks_failed={} \
         finished={} total_ms={} redelivery_requests={} unblocks={} final_unacked={} final_backlog={}",
        shape.consumers,
        report.produced,
        analysis.received,
        analysis.handed_over.len(),
        analysis.received_again_by_holder,
        analysis.acked_more_than_once,
        analysis.never_acked,
        report.acks_failed,
        report.finished,
        report.total.as_millis(),
        report.redelivery_requests,
        report.unblocks,
        count(report.final_unacked),
        count(report.final_backlog),
    );
    Ok(report.finished
        && analysis.handed_over.is_empty()
        && analysis.acked_more_than_once == 0
        && analysis.never_acked == 0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Cli::parse().into_args();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(["pulsar_work_queue"].iter().chain(args)).map(Cli::into_args)
    }

    #[test]
    fn the_defaults_are_the_standard_shape_and_every_flag_parses() {
        let standard = Shape::standard();
        let args = parse(&[]).unwrap();
        assert_eq!((args.service_url, args.admin_url), (None, None));
        assert_eq!(args.shape.consumers, standard.consumers);
        assert_eq!(args.shape.messages, standard.messages);
        assert_eq!(args.shape.handle_for, standard.handle_for);
        assert_eq!(args.shape.receiver_queue, standard.receiver_queue);
        let args = parse(&[
            "--service-url",
            "pulsar://127.0.0.1:6650",
            "--admin-url",
            "http://127.0.0.1:8080",
            "--consumers",
            "3",
            "--messages",
            "20",
            "--handle-ms",
            "10",
            "--concurrency",
            "5",
            "--batch",
            "2",
            "--receiver-queue",
            "50",
        ])
        .unwrap();
        assert_eq!(args.service_url.as_deref(), Some("pulsar://127.0.0.1:6650"));
        assert_eq!(args.admin_url.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!((args.shape.consumers, args.shape.messages), (3, 20));
        assert_eq!(args.shape.handle_for, Duration::from_millis(10));
        assert_eq!((args.shape.concurrency, args.shape.batch), (5, 2));
        assert_eq!(args.shape.receiver_queue, Some(50));
        assert!(parse(&["--consumers", "0"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
