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
use pulsar_wire::{Client, ConnectOptions};
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

const SUBSCRIPTION: &str = "work";
/// Hand-over lines printed before the rest is only counted.
const SHOWN: usize = 20;

struct Args {
    service_url: Option<String>,
    admin_url: Option<String>,
    shape: Shape,
}

fn parse_args() -> Result<Args, String> {
    let mut service_url = None;
    let mut admin_url = None;
    let standard = Shape::standard();
    let (mut consumers, mut messages, mut handle_for) =
        (standard.consumers, standard.messages, standard.handle_for);
    let (mut concurrency, mut batch, mut receiver_queue) = (
        standard.concurrency,
        standard.batch,
        standard.receiver_queue,
    );
    let mut it = std::env::args().skip(1);
    let number = |value: Option<String>, flag: &str| {
        value
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n > 0)
            .ok_or(format!("{flag} takes a number above 0"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--service-url" => service_url = it.next(),
            "--admin-url" => admin_url = it.next(),
            "--consumers" => consumers = number(it.next(), "--consumers")? as usize,
            "--messages" => messages = number(it.next(), "--messages")?,
            "--handle-ms" => {
                handle_for = Duration::from_millis(u64::from(number(it.next(), "--handle-ms")?));
            }
            "--concurrency" => concurrency = number(it.next(), "--concurrency")? as usize,
            "--batch" => batch = number(it.next(), "--batch")? as usize,
            "--receiver-queue" => {
                receiver_queue = Some(number(it.next(), "--receiver-queue")?);
            }
            "-h" | "--help" => {
                return Err(
                    "usage: pulsar_work_queue [--service-url pulsar://HOST:6650] \
                     [--admin-url http://HOST:8080] [--consumers N] [--messages N] \
                     [--handle-ms N] [--concurrency N] [--batch N] [--receiver-queue N]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    let mut shape = Shape::new(consumers, messages, handle_for);
    shape.concurrency = concurrency;
    shape.batch = batch;
    shape.receiver_queue = receiver_queue;
    shape.timeout = shape.default_timeout();
    Ok(Args {
        service_url,
        admin_url,
        shape,
    })
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
    let client = Client::connect(options).await.map_err(|e| e.to_string())?;
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
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(1);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(3),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
