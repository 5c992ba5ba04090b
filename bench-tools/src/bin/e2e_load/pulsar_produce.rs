//! Pulsar produce: N messages of SIZE bytes to a fresh topic, batches of at most 1,000
//! messages or 10 ms, with at most IN_FLIGHT sends not yet receipted; latency from each send
//! to its receipt. Ours (`pulsar-wire`), `pulsar-perf produce` from the Pulsar distribution,
//! the Python client, the `pulsar` crate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use pulsar_wire::{BatchingOptions, Client, OutgoingMessage, Producer, ProducerOptions};

use crate::args::Family;
use crate::child::{Protocol, Spec};
use crate::{Driver, stdin_closed};

/// The in-flight settings, each a row per client.
pub(crate) const IN_FLIGHT: [usize; 2] = [10_000, 1_000];
/// The most messages in one batch.
pub(crate) const BATCH_MESSAGES: usize = 1000;
/// The longest a message waits for its batch.
pub(crate) const BATCH_DELAY_MS: u64 = 10;
/// The most bytes in one batch (pulsar-perf's default `-bb`).
pub(crate) const BATCH_BYTES: usize = 4 << 20;

/// `child pulsar-produce URL TOPIC MESSAGES SIZE IN_FLIGHT`
pub(crate) async fn child(args: crate::args::Produce) -> Result<(), String> {
    let (url, topic) = (&args.target, &args.topic);
    let (n, size, in_flight) = (args.messages, args.size, args.in_flight);
    let client = Client::builder(url)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let options = ProducerOptions::default()
        .send_timeout(Duration::from_secs(120))
        .batching(
            BatchingOptions::default()
                .max_messages(BATCH_MESSAGES)
                .max_bytes(BATCH_BYTES)
                .max_delay(Duration::from_millis(BATCH_DELAY_MS)),
        );
    let producer = Producer::builder(&client, topic)
        .options(options)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let payload = Bytes::from(vec![b'x'; size]);
    println!("start");
    let started = Instant::now();
    let mut latencies = crate::window::send_windowed(n, in_flight, || {
        producer.send(OutgoingMessage::new(payload.clone()))
    })
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let (p50, p99) = crate::stats::p50_p99_ms(&mut latencies);
    println!(
        "result messages={n} seconds={seconds:.6} p50_ms={:.3} p99_ms={:.3}",
        p50.unwrap_or(f64::NAN),
        p99.unwrap_or(f64::NAN)
    );
    stdin_closed().await;
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    client.close().await;
    Ok(())
}

/// The clients of this path at `in_flight`, for `topic`.
fn specs(driver: &Driver, topic: &str, in_flight: usize) -> Vec<(Family, Spec)> {
    let o = &driver.options;
    let url = o.pulsar.clone().unwrap_or_default();
    let n = o.messages.to_string();
    let size = o.size.to_string();
    let flight = in_flight.to_string();
    let mut specs = Vec::new();
    for family in &o.clients {
        let spec = match family {
            Family::Ours => Spec {
                label: "ours (pulsar-wire)".into(),
                program: driver.ourselves.clone(),
                args: ["child", "pulsar-produce", &url, topic, &n, &size, &flight]
                    .map(String::from)
                    .to_vec(),
                env: Vec::new(),
                protocol: Protocol::Lines,
            },
            Family::Java => {
                let Some(perf) = &o.pulsar_perf else { continue };
                Spec {
                    label: "pulsar-perf 4.0.8 (Java)".into(),
                    program: perf.clone(),
                    args: [
                        "produce",
                        "-u",
                        &url,
                        "-r",
                        "100000000",
                        "-s",
                        &size,
                        "-m",
                        &n,
                        "-o",
                        &flight,
                        "-bm",
                        &BATCH_MESSAGES.to_string(),
                        "-b",
                        &BATCH_DELAY_MS.to_string(),
                        "-bb",
                        &BATCH_BYTES.to_string(),
                        "-i",
                        "1",
                        topic,
                    ]
                    .map(String::from)
                    .to_vec(),
                    env: vec![
                        // Its latency histograms need about 600 MB of heap.
                        (
                            "PULSAR_EXTRA_OPTS".into(),
                            "-Xms256m -Xmx1g -XX:+UseSerialGC".into(),
                        ),
                        ("PULSAR_LOG_IMMEDIATE_FLUSH".into(), "true".into()),
                    ],
                    protocol: Protocol::PulsarPerf,
                }
            }
            Family::Python => Spec {
                label: "pulsar-client 3.13.0 (Python)".into(),
                program: o.python_peers.clone(),
                args: [
                    "e2e_pulsar",
                    "produce",
                    &url,
                    topic,
                    &n,
                    &size,
                    &flight,
                    &BATCH_MESSAGES.to_string(),
                    &BATCH_DELAY_MS.to_string(),
                ]
                .map(String::from)
                .to_vec(),
                env: Vec::new(),
                protocol: Protocol::Lines,
            },
            Family::PulsarRs => {
                let Some(peer) = &o.pulsar_rs else { continue };
                Spec {
                    label: "pulsar 6.9.1 (Rust crate)".into(),
                    program: peer.clone(),
                    args: [
                        "produce",
                        &url,
                        topic,
                        &n,
                        &size,
                        &flight,
                        &BATCH_MESSAGES.to_string(),
                        &BATCH_DELAY_MS.to_string(),
                    ]
                    .map(String::from)
                    .to_vec(),
                    env: Vec::new(),
                    protocol: Protocol::Lines,
                }
            }
        };
        specs.push((*family, spec));
    }
    specs
}

/// Run `run` of every client at both in-flight settings, each on its own topic, deleted after.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let admin = driver.pulsar_admin()?;
    for in_flight in IN_FLIGHT {
        for (family, spec) in specs(driver, "TOPIC", in_flight) {
            let topic = format!(
                "persistent://{}/e2e-produce-{}-{in_flight}-{}",
                driver.options.namespace,
                crate::family_name(family),
                crate::admin::stamp()
            );
            let mut spec = spec;
            for arg in &mut spec.args {
                if arg == "TOPIC" {
                    arg.clone_from(&topic);
                }
            }
            crate::admin::create_topic(&admin, &topic).await?;
            let outcome = driver.measure(&spec).await;
            crate::admin::delete_topic(&admin, &topic).await?;
            driver.record("pulsar-produce", &spec.label, in_flight, run, outcome?);
        }
    }
    Ok(())
}
