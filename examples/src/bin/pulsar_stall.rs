//! The Shared-consumer stall of pulsar-client-go#1534, shown and fixed.
//!
//! A broker limits each consumer to 20 unacknowledged messages. A producer sends batches of 3;
//! each batch is received and acknowledged in its own transaction, then committed.
//!
//! - Default: `pulsar-wire` acknowledges each message with an independent ack set and
//!   `batch_size = 3`, so the broker takes 3 off the unacked count per batch; everything
//!   drains and the count returns to 0.
//! - `--legacy`: one whole-entry transactional ack per batch **without `batch_size`**, as the
//!   Go client v0.21.0 sends it (built here from raw frames; the library never sends it). A
//!   4.0.x broker takes 1 off per batch, the count climbs by 2 per batch, and dispatch stops
//!   for good at batch 11 (blocked at 20, resuming only at 10).
//!
//! ```text
//! cargo run -p examples --bin pulsar_stall               # embedded emulator, fixed
//! cargo run -p examples --bin pulsar_stall -- --legacy   # embedded emulator, the stall
//! cargo run -p examples --bin pulsar_stall -- --service-url pulsar://127.0.0.1:6650 \
//!     [--admin-url http://127.0.0.1:8080] [--legacy]
//! ```
//!
//! Against a real broker (4.0.x with `transactionCoordinatorEnabled=true`,
//! `acknowledgmentAtBatchIndexLevelEnabled=true` and `maxUnackedMessagesPerConsumer=20`, as
//! `scripts/brokers/pulsar` configures it), the unacked counts come from the admin API when
//! `--admin-url` is given.

use std::process::ExitCode;
use std::time::Duration;

use broker_tools::pulsar_admin::{AdminError, PulsarAdmin};
use clap::Parser;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, Error, InitialPosition, OutgoingMessage, Producer, SubType,
};
use pulsar_wire_emulator::legacy::txn_ack_without_batch_size;
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

const LIMIT: u32 = 20;
const PER_BATCH: usize = 3;
const SUBSCRIPTION: &str = "stall";

/// The Shared-consumer stall of pulsar-client-go#1534, shown and fixed.
#[derive(Debug, Parser)]
#[command(name = "pulsar_stall", args_override_self = true)]
struct Args {
    /// One whole-entry transactional ack per batch without `batch_size`, as Go v0.21.0 sends.
    #[arg(long)]
    legacy: bool,
    /// The broker's binary-protocol URL; without it the embedded emulator.
    #[arg(long, value_name = "pulsar://HOST:6650")]
    service_url: Option<String>,
    /// The broker's admin REST URL (the unacked counts).
    #[arg(long, value_name = "http://HOST:8080")]
    admin_url: Option<String>,
    /// Batches sent.
    #[arg(long, value_name = "N", default_value_t = 30)]
    batches: usize,
}

/// Where the unacked counts come from.
enum Broker {
    Embedded(Emulator),
    Real { admin: Option<PulsarAdmin> },
}

/// The consumer's unacked count and blocked flag, if the broker tells.
async fn unacked(broker: &Broker, topic: &str) -> Option<(i64, bool)> {
    match broker {
        Broker::Embedded(emulator) => {
            let stats = emulator.stats();
            let consumer = stats.subscription(topic, SUBSCRIPTION)?.consumers.first()?;
            Some((consumer.unacked, consumer.blocked))
        }
        Broker::Real { admin } => {
            let stats = admin.as_ref()?.topic_stats(topic).await.ok()?;
            let consumer = stats.subscription(SUBSCRIPTION)?.consumers.first()?;
            Some((
                consumer.unacked_messages,
                consumer.blocked_consumer_on_unacked_msgs,
            ))
        }
    }
}

/// Creates `topic` on a real broker and sets its per-topic unacked limit (topic-level
/// policies apply asynchronously, so this waits until the broker reports the limit).
async fn limit_real_topic(admin: &PulsarAdmin, topic: &str) -> Result<(), AdminError> {
    admin.create_topic(topic).await?;
    admin
        .set_max_unacked_on_consumer(topic, LIMIT, Duration::from_secs(30))
        .await
}

fn show(counts: Option<(i64, bool)>) -> String {
    match counts {
        Some((unacked, blocked)) => format!("unacked {unacked:>2}, blocked {blocked}"),
        None => "unacked unknown (pass --admin-url)".into(),
    }
}

/// What Go v0.21.0 sends for a completed batch in a transaction: one whole-entry ack with the
#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, Error> {
    let mode = if args.legacy { "legacy" } else { "fixed" };
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!("persistent://public/default/stall-{mode}-{millis}");
    let (broker, url) = match args.service_url {
        Some(url) => {
            let admin = args
                .admin_url
                .as_deref()
                .map(PulsarAdmin::new)
                .transpose()
                .map_err(|e| Error::Invalid {
                    what: "admin URL",
                    reason: e.to_string(),
                })?;
            if let Some(admin) = &admin {
                limit_real_topic(admin, &topic)
                    .await
                    .map_err(|e| Error::Invalid {
                        what: "admin URL",
                        reason: e.to_string(),
                    })?;
            }
            (Broker::Real { admin }, url)
        }
        None => {
            let emulator = Emulator::start(EmulatorConfig::default()).await?;
            emulator.create_topic(&topic, 0)?;
            emulator.set_max_unacked_messages(&topic, LIMIT)?;
            let url = emulator.endpoint().to_owned();
            (Broker::Embedded(emulator), url)
        }
    };
    println!(
        "{mode} mode against {url}: limit {LIMIT} unacked messages per consumer, batches of \
         {PER_BATCH}, each acknowledged in its own transaction and committed"
    );
    let client = Client::builder(&url).build().await?;
    // The legacy mode is the Go client of the issue: its acks go out raw, past this crate's
    // ledger, and nothing asks the broker to unblock the consumer behind them.
    let consumer = Consumer::builder(&client, &topic, SUBSCRIPTION)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .legacy_committed_redeliveries(args.legacy)
        .build()
        .await?;
    let producer = Producer::builder(&client, &topic)
        .transactional(true)
        .batching(
            BatchingOptions::default()
                .max_messages(PER_BATCH)
                .max_delay(Duration::from_millis(200)),
        )
        .build()
        .await?;
    let coordinator = client.transaction_coordinator().await?;

    for batch in 1..=args.batches {
        let (a, b, c) = tokio::join!(
            producer.send(OutgoingMessage::new(format!("{batch}.0"))),
            producer.send(OutgoingMessage::new(format!("{batch}.1"))),
            producer.send(OutgoingMessage::new(format!("{batch}.2"))),
        );
        let (_, _, _) = (a?, b?, c?);
        let mut messages = Vec::with_capacity(PER_BATCH);
        while messages.len() < PER_BATCH {
            match tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await {
                Ok(message) => messages.push(message?),
                Err(_) => {
                    let counts = unacked(&broker, &topic).await;
                    println!(
                        "batch {batch:>2}: not delivered within 2 s: {}",
                        show(counts)
                    );
                    println!(
                        "dispatch stopped at batch {batch}: each legacy ack took 1 off the \
                         count instead of {PER_BATCH}, so it climbed to the limit of {LIMIT}; \
                         the broker resumes only at {}, which never comes.",
                        LIMIT / 2
                    );
                    return Ok(if args.legacy {
                        println!("the stall is reproduced (run without --legacy for the fix)");
                        ExitCode::SUCCESS
                    } else {
                        println!("unexpected: the fixed client stalled");
                        ExitCode::FAILURE
                    });
                }
            }
        }
        let received = unacked(&broker, &topic).await;
        let txn = coordinator.new_transaction(Duration::from_secs(60)).await?;
        if args.legacy {
            txn_ack_without_batch_size(&consumer, &txn, &messages[PER_BATCH - 1]).await?;
        } else {
            for message in &messages {
                consumer.ack_in(&txn, message).await?;
            }
        }
        txn.commit().await?;
        println!(
            "batch {batch:>2}: received {PER_BATCH} ({}), acked in txn {} and committed ({})",
            show(received),
            txn.id(),
            show(unacked(&broker, &topic).await)
        );
    }

    let counts = unacked(&broker, &topic).await;
    let backlog = match &broker {
        Broker::Embedded(emulator) => Some(emulator.stats().backlog(&topic)),
        Broker::Real { .. } => None,
    };
    consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    println!(
        "all {} batches delivered: {}{}",
        args.batches,
        show(counts),
        backlog.map_or(String::new(), |b| format!(", backlog {b}"))
    );
    if args.legacy {
        println!(
            "the legacy mode did not stall within {} batches (a broker that counts \
             whole-entry transactional acks itself, newer than 4.0.x, does not stall)",
            args.batches
        );
        // Exit code 3: the check that the legacy client stalls did not hold.
        return Ok(ExitCode::from(3));
    }
    let drained = counts.is_none_or(|(unacked, blocked)| unacked == 0 && !blocked)
        && backlog.is_none_or(|b| b == 0);
    Ok(if drained {
        println!("drained: every message acknowledged, unacked back to 0");
        ExitCode::SUCCESS
    } else {
        println!("not drained");
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_lines_of_the_docs_and_of_test_real_brokers_parse() {
        let parse = |a: &[&str]| Args::try_parse_from(["pulsar_stall"].iter().chain(a));
        let args = parse(&[]).unwrap();
        assert!(!args.legacy && args.service_url.is_none() && args.admin_url.is_none());
        assert_eq!(args.batches, 30);
        assert!(parse(&["--legacy"]).unwrap().legacy);
        // scripts/test-real-brokers, with and without --legacy
        let urls = [
            "--service-url",
            "pulsar://127.0.0.1:6650",
            "--admin-url",
            "http://h:8080",
        ];
        let args = parse(&[&["--legacy"][..], &urls].concat()).unwrap();
        assert!(args.legacy);
        assert_eq!(args.service_url.as_deref(), Some("pulsar://127.0.0.1:6650"));
        assert_eq!(args.admin_url.as_deref(), Some("http://h:8080"));
        assert_eq!(
            parse(&[&urls[..], &["--batches", "5"]].concat())
                .unwrap()
                .batches,
            5
        );
        assert!(parse(&["--batches", "x"]).is_err());
    }
}
