//! Transactional acks in a steady stream with aborts, on a real Pulsar broker: `pulsar-wire`
//! against the official Java client, measured the same way.
//!
//! A producer sends 140 msg/s in batches of 7; one Shared consumer keeps up and acknowledges
//! every message in a transaction (one batch index per ack); a transaction ends every 5
//! messages and every third is aborted. The topic allows 50 unacked messages per consumer.
//! After an abort a 4.0.x broker redelivers indexes that a committed transaction had
//! acknowledged; a client that sends nothing for them stays blocked for good (`--legacy`).
//!
//! ```text
//! cargo run --release -p examples --bin pulsar_txn_steady -- \
//!     --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080 \
//!     [--seconds 60] [--bulk 2100] [--legacy] [--peer java]
//! ```
//!
//! It prints one `result` line per run: produced and committed payloads, transactions
//! committed and aborted, acks and commits refused, time to drain, the consumer's blocked
//! periods (count, total, longest, from the admin stats every 250 ms), and the final unacked
//! count and backlog. Exit 0 when the run drained to unacked 0 and backlog 0, 3 when it did
//! not (what `--legacy` is expected to show), 1 on errors.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use broker_tools::pulsar_admin::PulsarAdmin;
use broker_tools::txn_steady::{self, BlockedPeriods, ClientReport, Shape};
use pulsar_wire::{Client, ConnectOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

const LIMIT: u32 = 50;
const SUBSCRIPTION: &str = "steady";

struct Args {
    service_url: String,
    admin_url: String,
    shape: Shape,
    legacy: bool,
    java: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut service_url = None;
    let mut admin_url = None;
    let mut shape = Shape::steady(Duration::from_secs(60));
    let mut legacy = false;
    let mut java = false;
    let mut it = std::env::args().skip(1);
    let number = |value: Option<String>, flag: &str| {
        value
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or(format!("{flag} takes a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--service-url" => service_url = it.next(),
            "--admin-url" => admin_url = it.next(),
            "--seconds" => {
                let seconds = number(it.next(), "--seconds")?;
                shape = Shape::steady(Duration::from_secs(u64::from(seconds)));
            }
            "--bulk" => shape = Shape::bulk(number(it.next(), "--bulk")?),
            "--legacy" => legacy = true,
            "--peer" => match it.next().as_deref() {
                Some("java") => java = true,
                other => return Err(format!("--peer takes java, not {other:?}")),
            },
            "-h" | "--help" => {
                return Err("usage: pulsar_txn_steady --service-url pulsar://HOST:6650 \
                     --admin-url http://HOST:8080 [--seconds N | --bulk N] [--legacy] \
                     [--peer java]"
                    .into());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(Args {
        service_url: service_url.ok_or("--service-url is required (a real broker)")?,
        admin_url: admin_url.ok_or("--admin-url is required (the blocked periods)")?,
        shape,
        legacy,
        java,
    })
}

/// Runs the official Java client on the same shape (`scripts/java-peers`).
async fn run_java(args: &Args, topic: &str) -> Result<ClientReport, String> {
    let shape = &args.shape;
    if shape.produce_first {
        return Err("--peer java runs the steady shape only".into());
    }
    let mut child = tokio::process::Command::new("scripts/java-peers/run")
        .args([
            "PulsarTxnSteady",
            &args.service_url,
            topic,
            SUBSCRIPTION,
            &shape.produce_for.as_secs().to_string(),
            &shape.rate.to_string(),
            &shape.batch.to_string(),
            &shape.txn_every.to_string(),
            &shape.abort_every.to_string(),
            &shape.timeout.as_secs().to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("scripts/java-peers/run: {e} (run from the repository root)"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut report = None;
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        println!("java: {line}");
        if let Some(fields) = line.strip_prefix("result ") {
            report = Some(parse_java(fields)?);
        }
    }
    let _ = child.wait().await;
    report.ok_or_else(|| "the Java peer printed no result line".into())
}

fn parse_java(fields: &str) -> Result<ClientReport, String> {
    let mut report = ClientReport::default();
    for field in fields.split_whitespace() {
        let (key, value) = field.split_once('=').ok_or(format!("bad field {field}"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{field}: {e}"));
        match key {
            "produced" => report.produced = number()?,
            "committed" => report.committed = number()?,
            "duplicates" => report.duplicates = number()?,
            "txns_committed" => report.txns_committed = number()?,
            "txns_aborted" => report.txns_aborted = number()?,
            "acks_refused" => report.acks_refused = number()?,
            "commits_refused" => report.commits_refused = number()?,
            "drain_ms" => report.drain = Duration::from_millis(number()?),
            "drained" => report.drained = value == "true",
            _ => {}
        }
    }
    Ok(report)
}

fn print(label: &str, report: &ClientReport, blocked: &BlockedPeriods, unacked: i64, backlog: i64) {
    println!(
        "result client={label} produced={} committed={} duplicates={} txns_committed={} \
         txns_aborted={} acks_refused={} acks_refused_by_client={} commits_refused={} \
         committed_redeliveries={} duplicates_hidden={} redelivery_requests={} acks_held_back={} handed_again={} drained={} drain_ms={} blocked_periods={} blocked_total_ms={} \
         blocked_longest_ms={} max_unacked={} final_unacked={unacked} final_backlog={backlog}",
        report.produced,
        report.committed,
        report.duplicates,
        report.txns_committed,
        report.txns_aborted,
        report.acks_refused,
        report.acks_refused_by_client,
        report.commits_refused,
        report.committed_redeliveries,
        report.duplicates_hidden,
        report.redelivery_requests,
        report.acks_held_back,
        report.handed_again,
        report.drained,
        report.drain.as_millis(),
        blocked.count,
        blocked.total.as_millis(),
        blocked.longest.as_millis(),
        blocked.max_unacked,
    );
}

async fn run(args: Args) -> Result<bool, String> {
    let admin = PulsarAdmin::new(&args.admin_url).map_err(|e| e.to_string())?;
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let label = match (args.java, args.legacy) {
        (true, _) => "java",
        (false, true) => "pulsar-wire-legacy",
        (false, false) => "pulsar-wire",
    };
    let topic = format!("persistent://public/default/steady-{label}-{millis}");
    admin
        .create_topic(&topic)
        .await
        .map_err(|e| e.to_string())?;
    admin
        .set_max_unacked_on_consumer(&topic, LIMIT, Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "{label}: topic {topic}, limit {LIMIT}, {} messages at {} msg/s in batches of {}, \
         {} acks per transaction, every {}rd aborted{}",
        args.shape.messages(),
        args.shape.rate,
        args.shape.batch,
        args.shape.txn_every,
        args.shape.abort_every,
        if args.shape.produce_first {
            ", produced first"
        } else {
            ""
        }
    );
    let watcher = txn_steady::watch(
        admin.clone(),
        topic.clone(),
        SUBSCRIPTION.into(),
        Duration::from_millis(250),
    );
    let report = if args.java {
        run_java(&args, &topic).await?
    } else {
        let options = ConnectOptions::new(&args.service_url)
            .map_err(|e| e.to_string())?
            .operation_timeout(Duration::from_secs(30));
        let client = Client::connect(options).await.map_err(|e| e.to_string())?;
        let report = txn_steady::run(
            &client,
            &topic,
            SUBSCRIPTION,
            &args.shape,
            args.legacy,
            Some(&admin),
        )
        .await
        .map_err(|e| e.to_string())?;
        client.close().await;
        report
    };
    let blocked = watcher.finish().await;
    // Ours are read with the consumer connected; the Java peer's after it closed.
    let (unacked, backlog) = match (report.final_unacked, report.final_backlog) {
        (Some(unacked), Some(backlog)) => (unacked, backlog),
        _ => {
            txn_steady::settled_counts(&admin, &topic, SUBSCRIPTION, Duration::from_secs(10)).await
        }
    };
    print(label, &report, &blocked, unacked, backlog);
    Ok(report.drained && report.duplicates == 0 && unacked == 0 && backlog == 0)
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
        Ok(false) => {
            println!("not drained");
            ExitCode::from(3)
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
