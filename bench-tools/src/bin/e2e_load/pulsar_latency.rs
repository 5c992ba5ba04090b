//! Pulsar latency: publish-to-receive latency at a fixed rate below saturation, in steady
//! state. On a fresh topic (its Shared subscription created first) the consumer child
//! subscribes and prints `ready`; the driver then publishes `--latency-rate` (5,000) 1 KiB
//! messages a second with our producer (default settings), each stamped with its send time
//! ([`crate::latency`]). The consumer acknowledges each message individually, as in
//! `pulsar-consume`; its window opens `--warmup` after its first message and lasts
//! `--window`, and the latency of each message in it is its receipt time less its stamp.
//! Ours (`pulsar-wire`), the Java client (`E2ePulsarLatency`), both consumers at default
//! settings.

use std::time::Duration;

use pulsar_wire::{Client, OutgoingMessage, Producer};

use crate::args::Family;
use crate::child::{Protocol, Spec};
use crate::latency::LatencyWindow;
use crate::pulsar_consume::{SUBSCRIPTION, close, connect, shared_consumer};
use crate::{Driver, stdin_closed};

/// The longest the consumer waits for a message: the publisher sends every millisecond.
const RECEIVE_LIMIT: Duration = Duration::from_secs(60);

/// `child pulsar-latency URL TOPIC SUBSCRIPTION WARMUP_SECS WINDOW_SECS`
pub(crate) async fn child(args: crate::args::Latency) -> Result<(), String> {
    let (url, topic, subscription) = (&args.target, &args.topic, &args.subscription);
    let client = connect(url).await?;
    let consumer = shared_consumer(&client, topic, subscription).await?;
    println!("ready");
    let mut window = LatencyWindow::new(
        Duration::from_secs(args.warmup_secs),
        Duration::from_secs(args.window_secs),
        || println!("start"),
    );
    let steady = loop {
        let message = tokio::time::timeout(RECEIVE_LIMIT, consumer.receive())
            .await
            .map_err(|_| format!("no message within {RECEIVE_LIMIT:?}"))?
            .map_err(|e| e.to_string())?;
        let measured = window.received(message.payload())?;
        consumer.ack(&message).await.map_err(|e| e.to_string())?;
        if let Some(steady) = measured {
            break steady;
        }
    };
    steady.print_result();
    stdin_closed().await;
    close(consumer, client).await
}

/// The consumer of `family` for `topic`: its label and spec; `None` for the families without
/// a latency consumer.
fn spec(driver: &Driver, family: Family, topic: &str) -> Option<Spec> {
    let o = &driver.options;
    let (label, program, mut args): (&str, &str, Vec<String>) = match family {
        Family::Ours => (
            "ours (pulsar-wire)",
            &driver.ourselves,
            vec!["child".into(), "pulsar-latency".into()],
        ),
        Family::Java => (
            "pulsar-client 4.0.8 (Java)",
            &o.java_peers,
            vec!["E2ePulsarLatency".into()],
        ),
        Family::Python | Family::PulsarRs => return None,
    };
    args.extend([
        o.pulsar.clone().unwrap_or_default(),
        topic.to_owned(),
        SUBSCRIPTION.into(),
        o.warmup.to_string(),
        o.window.to_string(),
    ]);
    Some(Spec {
        label: label.into(),
        program: program.to_owned(),
        args,
        env: Vec::new(),
        protocol: Protocol::Lines,
    })
}

/// Our producer for `topic`, at its default settings.
async fn publisher(url: &str, topic: &str) -> Result<(Client, Producer), String> {
    let client = connect(url).await?;
    let producer = Producer::builder(&client, topic)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    Ok((client, producer))
}

/// Run `run` of every client (ours, Java), each on its own topic, deleted after; a row of
/// the defaults table.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let admin = driver.pulsar_admin()?;
    let url = driver.options.pulsar.clone().unwrap_or_default();
    let (rate, size) = (driver.options.latency_rate, driver.options.size);
    for family in driver.options.clients.clone() {
        let topic = format!(
            "persistent://{}/e2e-latency-{}-{}",
            driver.options.namespace,
            crate::family_name(family),
            crate::admin::stamp()
        );
        let Some(spec) = spec(driver, family, &topic) else {
            continue;
        };
        crate::admin::create_topic(&admin, &topic).await?;
        crate::admin::create_subscription(&admin, &topic, SUBSCRIPTION).await?;
        let outcome = match publisher(&url, &topic).await {
            Ok((client, producer)) => {
                let outcome = crate::latency::measure_while_publishing(
                    driver,
                    &spec,
                    rate,
                    size,
                    |payload| producer.send(OutgoingMessage::new(payload)),
                )
                .await;
                if let Err(e) = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await {
                    eprintln!("e2e_load: closing the publisher of {topic}: {e}");
                }
                client.close().await;
                outcome
            }
            Err(e) => {
                driver.failed(&spec.label, &format!("the publisher of {topic}: {e}"));
                Ok(None)
            }
        };
        crate::admin::delete_topic(&admin, &topic).await?;
        // Both consumers at their defaults in every table (no setting of theirs is about
        // throughput at a rate below saturation): one measurement is the row of each.
        let outcome = outcome?;
        for settings in driver.options.settings.clone() {
            driver.record(
                settings,
                "pulsar-latency",
                &spec.label,
                0,
                run,
                outcome.clone(),
            );
        }
    }
    Ok(())
}
