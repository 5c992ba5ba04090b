//! RocketMQ produce: N messages of SIZE bytes to a fresh topic (4 queues), at most 256
//! messages in flight; latency from each send to its receipt. Ours (`rocketmq-grpc`), the
//! RocketMQ 5 Java client (`sendAsync` under a semaphore). Two paths: `rocketmq-produce`, one
//! message per request; `rocketmq-produce-batch`, ours sending batches of
//! [`BATCH`] (`Producer::send_batch`, one `SendMessage` request each) against the same Java
//! client, which has no batch send (its `Producer` sends one message per call).

use std::time::{Duration, Instant};

use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer};

use crate::args::{Family, Settings};
use crate::child::{Protocol, Spec};
use crate::{Driver, stdin_closed};

/// Messages in flight.
pub(crate) const IN_FLIGHT: usize = 256;

/// Messages per batch in the batch path: 32 KiB of 1 KiB messages, far below the proxy's 4 MiB
/// limit on a request's bodies; [`IN_FLIGHT`] / `BATCH` (8) requests open.
pub(crate) const BATCH: usize = 32;

/// Our producer for `topic`, started (settings announced, route known).
pub(crate) async fn producer(endpoint: &str, topic: &str) -> Result<Producer, String> {
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    let producer = Producer::builder(config)
        .topic(topic)
        .build()
        .map_err(|e| e.to_string())?;
    // A busy proxy may take longer than the start's 3 s for the settings of a topic created
    // moments ago: set-up, not measured, so it is asked again.
    let mut attempt = 1;
    loop {
        match producer.start().await {
            Ok(()) => return Ok(producer),
            Err(e) if attempt < 5 => {
                eprintln!("e2e_load: producer start, attempt {attempt} of 5: {e}");
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Sends `n` messages of `size` bytes, `in_flight` at a time; the latencies in µs.
pub(crate) async fn send_all(
    producer: &Producer,
    topic: &str,
    n: usize,
    size: usize,
    in_flight: usize,
) -> Result<Vec<u32>, String> {
    // One body shared by every message (a `Bytes` clone is not a copy), as the Pulsar side.
    let body = bytes::Bytes::from(vec![b'x'; size]);
    crate::window::send_windowed(n, in_flight, || {
        producer.send(OutgoingMessage::new(topic, body.clone()))
    })
    .await
}

/// `child rocketmq-produce ENDPOINT TOPIC MESSAGES SIZE IN_FLIGHT [--warmup-secs W
/// --window-secs D] [--batch B]`
pub(crate) async fn child(args: crate::args::Produce) -> Result<(), String> {
    let (endpoint, topic) = (&args.target, &args.topic);
    let (n, size, in_flight) = (args.messages, args.size, args.in_flight);
    let producer = producer(endpoint, topic).await?;
    let body = bytes::Bytes::from(vec![b'x'; size]);
    let (warmup, window) = (
        Duration::from_secs(args.warmup_secs),
        Duration::from_secs(args.window_secs),
    );
    let measured = if args.window_secs > 0 && args.batch > 1 {
        crate::window::send_steady(
            warmup,
            window,
            (in_flight / args.batch).max(1),
            args.batch as u64,
            || {
                let batch = (0..args.batch)
                    .map(|_| OutgoingMessage::new(topic, body.clone()))
                    .collect();
                producer.send_batch(batch)
            },
            || println!("start"),
        )
        .await?
    } else if args.window_secs > 0 {
        crate::window::send_steady(
            warmup,
            window,
            in_flight,
            1,
            || producer.send(OutgoingMessage::new(topic, body.clone())),
            || println!("start"),
        )
        .await?
    } else if args.batch > 1 {
        return Err("--batch needs --window-secs (a steady-state run)".into());
    } else {
        println!("start");
        let started = Instant::now();
        let latencies = send_all(&producer, topic, n, size, in_flight).await?;
        crate::window::Steady {
            messages: n as u64,
            seconds: started.elapsed().as_secs_f64(),
            latencies,
        }
    };
    measured.print_result();
    stdin_closed().await;
    Ok(())
}

/// Creates a fresh topic and waits until our producer finds its route.
pub(crate) async fn fresh_topic(
    driver: &Driver,
    kind: &str,
    family: Family,
) -> Result<String, String> {
    let topic = format!(
        "e2e-{kind}-{}-{}",
        crate::family_name(family),
        crate::admin::stamp()
    );
    crate::admin::rocketmq_topic(&driver.options.rocketmq_admin, "create-topic", &topic).await?;
    // The proxy caches routes for 2 s: give it that before the first client looks.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(topic)
}

/// Before the first run: our producer sends to a topic of its own for `--broker-warmup`
/// seconds, not recorded (the proxy's and broker's JIT warm-up), as
/// [`crate::pulsar_produce::warm_broker`].
pub(crate) async fn warm_broker(driver: &mut Driver) -> Result<(), String> {
    let topic = fresh_topic(driver, "warmup", Family::Ours).await?;
    let endpoint = driver.options.rocketmq.clone().unwrap_or_default();
    let spec = driver.warm_up_spec("rocketmq-produce", &endpoint, &topic, IN_FLIGHT);
    let outcome = driver.measure(&spec).await;
    crate::admin::rocketmq_topic(&driver.options.rocketmq_admin, "delete-topic", &topic).await?;
    outcome.map(drop)
}

/// A RocketMQ path's client of `family`: its label, program and first arguments (ours: the
/// `child` mode `path`; Java: the peer class `java_class`); `None` for the families without
/// a RocketMQ client.
pub(crate) fn client(
    driver: &Driver,
    family: Family,
    path: &str,
    java_class: &str,
) -> Option<(&'static str, String, Vec<String>)> {
    match family {
        Family::Ours => Some((
            "ours (rocketmq-grpc)",
            driver.ourselves.clone(),
            vec!["child".into(), path.into()],
        )),
        Family::Java => Some((
            "rocketmq-client-java 5.0.8",
            driver.options.java_peers.clone(),
            vec![java_class.into()],
        )),
        Family::Python | Family::PulsarRs => None,
    }
}

/// A child's environment variables.
type Env = Vec<(String, String)>;

/// Run `run` of the path `rocketmq-produce` (`batch` 1) or `rocketmq-produce-batch`
/// ([`BATCH`]) for every client, each on its own topic, deleted after. Neither client has a
/// throughput setting (no batching within the client; the sends in flight are the
/// application's); ours runs on the runtime of each settings table
/// ([`crate::runtime::ours_env`]), so it is measured once per table, and the Java client's one
/// measurement is the row of every table asked for. The Java client has no batch send: in the
/// batch path it sends one message per call as in the other.
pub(crate) async fn measure(driver: &mut Driver, run: usize, batch: usize) -> Result<(), String> {
    let endpoint = driver.options.rocketmq.clone().unwrap_or_default();
    let path = if batch > 1 {
        "rocketmq-produce-batch"
    } else {
        "rocketmq-produce"
    };
    for family in driver.options.clients.clone() {
        let Some((label, program, first_args)) =
            client(driver, family, "rocketmq-produce", "E2eRocketMqProduce")
        else {
            continue;
        };
        let all = driver.options.settings.clone();
        let measurements: Vec<(Vec<Settings>, Env)> = match family {
            Family::Ours => all
                .iter()
                .map(|s| (vec![*s], crate::runtime::ours_env(*s)))
                .collect(),
            _ => vec![(all, Vec::new())],
        };
        for (tables, env) in measurements {
            let topic = fresh_topic(driver, "produce", family).await?;
            let mut args = first_args.clone();
            args.extend([
                endpoint.clone(),
                topic.clone(),
                "0".into(),
                driver.options.size.to_string(),
                IN_FLIGHT.to_string(),
                "--warmup-secs".into(),
                driver.options.warmup.to_string(),
                "--window-secs".into(),
                driver.options.window.to_string(),
            ]);
            if family == Family::Ours && batch > 1 {
                args.extend(["--batch".into(), batch.to_string()]);
            }
            let spec = Spec {
                label: label.into(),
                program: program.clone(),
                args,
                env,
                protocol: Protocol::Lines,
            };
            let outcome = driver.measure(&spec).await;
            crate::admin::rocketmq_topic(&driver.options.rocketmq_admin, "delete-topic", &topic)
                .await?;
            let outcome = outcome?;
            for settings in tables {
                driver.record(settings, path, label, IN_FLIGHT, run, outcome.clone());
            }
        }
    }
    Ok(())
}
