//! Pulsar produce: N messages of SIZE bytes to a fresh topic, batches of at most 1,000
//! messages or 10 ms, with at most IN_FLIGHT sends not yet receipted; latency from each send
//! to its receipt. Ours (`pulsar-wire`), `pulsar-perf produce` from the Pulsar distribution,
//! the Python client, the `pulsar` crate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use pulsar_wire::{BatchingOptions, Client, OutgoingMessage, Producer, ProducerOptions};

use crate::args::{Family, Settings};
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

/// `child pulsar-produce URL TOPIC MESSAGES SIZE IN_FLIGHT [--warmup-secs W --window-secs D]
/// [--defaults]`
pub(crate) async fn child(args: crate::args::Produce) -> Result<(), String> {
    let (url, topic) = (&args.target, &args.topic);
    let (n, size, in_flight) = (args.messages, args.size, args.in_flight);
    if args.batch != 1 {
        return Err("--batch: a Pulsar producer batches by itself; give 1".into());
    }
    let client = Client::builder(url)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut options = ProducerOptions::default().send_timeout(Duration::from_secs(120));
    if !args.defaults {
        options = options.batching(
            BatchingOptions::default()
                .max_messages(BATCH_MESSAGES)
                .max_bytes(BATCH_BYTES)
                .max_delay(Duration::from_millis(BATCH_DELAY_MS)),
        );
    }
    let producer = Producer::builder(&client, topic)
        .options(options)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    // One payload for every message, as `pulsar-perf` sends one byte array: static (leaked
    // once), so that giving it to each message counts no references, as the JVM counts none
    // for its array (a shared `Bytes` was 2.7 % of this child's CPU at 10,000 in flight).
    let payload = Bytes::from_static(Vec::leak(vec![b'x'; size]));
    let send = || producer.send(OutgoingMessage::new(payload.clone()));
    let measured = if args.window_secs > 0 {
        crate::window::send_steady_oldest_first(
            Duration::from_secs(args.warmup_secs),
            Duration::from_secs(args.window_secs),
            in_flight,
            send,
            || println!("start"),
        )
        .await?
    } else {
        println!("start");
        let started = Instant::now();
        let latencies = crate::window::send_windowed(n, in_flight, send).await?;
        crate::window::Steady {
            messages: n as u64,
            seconds: started.elapsed().as_secs_f64(),
            latencies,
        }
    };
    measured.print_result();
    stdin_closed().await;
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    client.close().await;
    Ok(())
}

/// The Java client's builder defaults for batching (`batchingMaxPublishDelay` 1 ms,
/// `batchingMaxMessages` 1,000, `batchingMaxBytes` 128 KiB), given to `pulsar-perf` in the
/// defaults table: its own `-bb` default is 4 MiB.
const JAVA_DEFAULT_BATCH: [&str; 6] = ["-b", "1", "-bm", "1000", "-bb", "131072"];

/// The clients of this path at `in_flight` and `settings`, for `topic`. Every client runs
/// for the warm-up and the window; the Python client and the `pulsar` crate's peer have no
/// time-bounded mode and are left out (said on stderr).
fn specs(
    driver: &Driver,
    topic: &str,
    in_flight: usize,
    settings: Settings,
) -> Vec<(Family, Spec)> {
    let o = &driver.options;
    let url = o.pulsar.clone().unwrap_or_default();
    let size = o.size.to_string();
    let flight = in_flight.to_string();
    let (warmup, window) = (o.warmup.to_string(), o.window.to_string());
    let mut specs = Vec::new();
    for family in &o.clients {
        let spec = match family {
            Family::Ours => {
                let mut args: Vec<String> = [
                    "child",
                    "pulsar-produce",
                    &url,
                    topic,
                    "0",
                    &size,
                    &flight,
                    "--warmup-secs",
                    &warmup,
                    "--window-secs",
                    &window,
                ]
                .map(String::from)
                .to_vec();
                if settings == Settings::Defaults {
                    args.push("--defaults".into());
                }
                Spec {
                    label: "ours (pulsar-wire)".into(),
                    program: driver.ourselves.clone(),
                    args,
                    env: crate::runtime::ours_env(settings),
                    protocol: Protocol::Lines,
                }
            }
            Family::Java => {
                let Some(perf) = &o.pulsar_perf else { continue };
                // Its progress lines come every 10 s: time for the one after the window's end.
                let duration = (o.warmup + o.window + 25).to_string();
                let mut args: Vec<String> = [
                    "produce",
                    "-u",
                    &url,
                    "-r",
                    "100000000",
                    "-s",
                    &size,
                    "-time",
                    &duration,
                    "-o",
                    &flight,
                    // The Java client's stats interval (60 s), so that it logs no more often.
                    "-i",
                    "60",
                ]
                .map(String::from)
                .to_vec();
                match settings {
                    Settings::Tuned => args.extend([
                        "-bm".to_owned(),
                        BATCH_MESSAGES.to_string(),
                        "-b".to_owned(),
                        BATCH_DELAY_MS.to_string(),
                        "-bb".to_owned(),
                        BATCH_BYTES.to_string(),
                    ]),
                    Settings::Defaults => args.extend(JAVA_DEFAULT_BATCH.map(String::from)),
                }
                args.push(topic.to_owned());
                Spec {
                    label: "pulsar-perf 4.0.8 (Java)".into(),
                    program: perf.clone(),
                    args,
                    env: vec![
                        // Its latency histograms need about 600 MB of heap.
                        (
                            "PULSAR_EXTRA_OPTS".into(),
                            "-Xms256m -Xmx1g -XX:+UseSerialGC".into(),
                        ),
                        ("PULSAR_LOG_IMMEDIATE_FLUSH".into(), "true".into()),
                    ],
                    protocol: Protocol::PulsarPerf {
                        steady: Some((o.warmup * 1000, o.window * 1000)),
                    },
                }
            }
            Family::Python | Family::PulsarRs => {
                eprintln!(
                    "e2e_load: pulsar-produce: the {} peer has no time-bounded mode: left out",
                    crate::family_name(*family)
                );
                continue;
            }
        };
        specs.push((*family, spec));
    }
    specs
}

/// The in-flight settings of a table: both when tuned; 1,000 (`pulsar-perf`'s and the Python
/// client's default pending limit) with every client as shipped.
fn in_flight_of(settings: Settings) -> &'static [usize] {
    match settings {
        Settings::Tuned => &IN_FLIGHT,
        Settings::Defaults => &IN_FLIGHT[1..],
    }
}

/// Before the first run: our producer (tuned, 1,000 in flight) sends to a topic of its own for
/// `--broker-warmup` seconds, not recorded, so that a broker started moments ago has run its
/// JIT warm-up before the first measurement. Measured without it (a broker started by the
/// script): the first client measured ran at 243,000 msg/s with the broker busy on 1.25 cores,
/// the next at 321,000 with 0.95.
pub(crate) async fn warm_broker(driver: &mut Driver) -> Result<(), String> {
    let admin = driver.pulsar_admin()?;
    let topic = format!(
        "persistent://{}/e2e-broker-warmup-{}",
        driver.options.namespace,
        crate::admin::stamp()
    );
    let url = driver.options.pulsar.clone().unwrap_or_default();
    let spec = driver.warm_up_spec("pulsar-produce", &url, &topic, IN_FLIGHT[1]);
    crate::admin::create_topic(&admin, &topic).await?;
    let outcome = driver.measure(&spec).await;
    crate::admin::delete_topic(&admin, &topic).await?;
    outcome.map(drop)
}

/// Run `run` of every client at each settings table and in-flight setting, each on its own
/// topic, deleted after.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let admin = driver.pulsar_admin()?;
    for settings in driver.options.settings.clone() {
        for &in_flight in in_flight_of(settings) {
            for (family, spec) in specs(driver, "TOPIC", in_flight, settings) {
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
                driver.record(
                    settings,
                    "pulsar-produce",
                    &spec.label,
                    in_flight,
                    run,
                    outcome?,
                );
            }
        }
    }
    Ok(())
}
