//! Pulsar consume: a backlog of N messages on a fresh topic (its Shared subscription created
//! first, the backlog written by our producer), then one consumer drains it, acknowledging
//! each message individually. The window runs from the consumer's subscribe to its N-th
//! acknowledgement call. Ours (`pulsar-wire`), the Java client, the Python client, the
//! `pulsar` crate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, InitialPosition, OutgoingMessage, Producer, SubType,
};

use crate::args::{Family, Settings};
use crate::child::{Protocol, Spec};
use crate::{Driver, stdin_closed};

/// The subscription every consumer uses (one topic per measurement).
pub(crate) const SUBSCRIPTION: &str = "e2e";

/// `child pulsar-consume URL TOPIC SUBSCRIPTION MESSAGES`
pub(crate) async fn child(args: crate::args::Consume) -> Result<(), String> {
    let (url, topic, subscription) = (&args.target, &args.topic, &args.subscription);
    let n = args.messages;
    let client = connect(url).await?;
    println!("start");
    let started = Instant::now();
    let consumer = shared_consumer(&client, topic, subscription).await?;
    for _ in 0..n {
        let message = consumer.receive().await.map_err(|e| e.to_string())?;
        consumer.ack(&message).await.map_err(|e| e.to_string())?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("result messages={n} seconds={seconds:.6}");
    stdin_closed().await;
    close(consumer, client).await
}

/// A client of `url`.
pub(crate) async fn connect(url: &str) -> Result<Client, String> {
    Client::builder(url)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// The benchmark's consumer: Shared, from the earliest message, default settings.
pub(crate) async fn shared_consumer(
    client: &Client,
    topic: &str,
    subscription: &str,
) -> Result<Consumer, String> {
    Consumer::builder(client, topic, subscription)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Sends `consumer`'s pending acknowledgements, closes it, then `client`.
pub(crate) async fn close(consumer: Consumer, client: Client) -> Result<(), String> {
    consumer.flush_acks().await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    client.close().await;
    Ok(())
}

/// Writes `n` messages of `size` bytes to `topic` with our producer (not measured).
async fn fill(url: &str, topic: &str, n: usize, size: usize) -> Result<(), String> {
    let client = connect(url).await?;
    let producer = Producer::builder(&client, topic)
        .send_timeout(Duration::from_secs(120))
        .batching(
            BatchingOptions::default()
                .max_messages(1000)
                .max_bytes(4 << 20)
                .max_delay(Duration::from_millis(10)),
        )
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let payload = Bytes::from(vec![b'x'; size]);
    let mut pending = FuturesUnordered::new();
    let mut next = 0;
    while next < n || !pending.is_empty() {
        while next < n && pending.len() < 10_000 {
            pending.push(producer.send(OutgoingMessage::new(payload.clone())));
            next += 1;
        }
        if let Some(result) = pending.next().await {
            result.map_err(|e| format!("backlog send: {e}"))?;
        }
    }
    drop(pending);
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .map_err(|e| e.to_string())?;
    client.close().await;
    Ok(())
}

fn specs(driver: &Driver, topic: &str) -> Vec<(Family, Spec)> {
    let o = &driver.options;
    let url = o.pulsar.clone().unwrap_or_default();
    let n = o.backlog.to_string();
    let mut specs = Vec::new();
    for family in &o.clients {
        let (label, program, args): (&str, &str, Vec<&str>) = match family {
            Family::Ours => (
                "ours (pulsar-wire)",
                &driver.ourselves,
                vec!["child", "pulsar-consume"],
            ),
            Family::Java => (
                "pulsar-client 4.0.8 (Java)",
                &o.java_peers,
                vec!["E2ePulsarConsume"],
            ),
            Family::Python => (
                "pulsar-client 3.13.0 (Python)",
                &o.python_peers,
                vec!["e2e_pulsar", "consume"],
            ),
            Family::PulsarRs => match &o.pulsar_rs {
                Some(peer) => ("pulsar 6.9.1 (Rust crate)", peer, vec!["consume"]),
                None => continue,
            },
        };
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.extend([
            url.clone(),
            topic.to_owned(),
            SUBSCRIPTION.into(),
            n.clone(),
        ]);
        specs.push((
            *family,
            Spec {
                label: label.into(),
                program: program.to_owned(),
                args,
                env: Vec::new(),
                protocol: Protocol::Lines,
            },
        ));
    }
    specs
}

/// Run `run` of every client, each on its own topic with its own backlog, deleted after.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let admin = driver.pulsar_admin()?;
    let url = driver.options.pulsar.clone().unwrap_or_default();
    for family in driver.options.clients.clone() {
        let topic = format!(
            "persistent://{}/e2e-consume-{}-{}",
            driver.options.namespace,
            crate::family_name(family),
            crate::admin::stamp()
        );
        let Some((_, spec)) = specs(driver, &topic)
            .into_iter()
            .find(|(f, _)| *f == family)
        else {
            continue;
        };
        crate::admin::create_topic(&admin, &topic).await?;
        crate::admin::create_subscription(&admin, &topic, SUBSCRIPTION).await?;
        eprintln!(
            "e2e_load: writing a backlog of {} to {topic}",
            driver.options.backlog
        );
        let outcome = match fill(&url, &topic, driver.options.backlog, driver.options.size).await {
            Ok(()) => driver.measure(&spec).await,
            Err(e) => {
                eprintln!("e2e_load: FAILED: backlog of {topic}: {e}");
                Ok(None)
            }
        };
        crate::admin::delete_topic(&admin, &topic).await?;
        driver.record(
            Settings::Defaults,
            "pulsar-consume",
            &spec.label,
            0,
            run,
            outcome?,
        );
    }
    Ok(())
}
