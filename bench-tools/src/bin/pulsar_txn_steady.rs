//! Transactional acks in a steady stream with aborts, on a real Pulsar broker: `pulsar-wire`
//! against the official Java client, measured the same way.
//!
//! Default (issue 11's shape): a producer sends 140 msg/s in batches of 7; one Shared consumer
//! keeps up and acknowledges every message in a transaction (one batch index per ack); a
//! transaction ends every 5 messages and every third is aborted. The topic allows 50 unacked
//! messages per consumer. After an abort a 4.0.x broker redelivers indexes that a committed
//! transaction had acknowledged; a client that sends nothing for them stays blocked for good
//! (`--legacy`).
//!
//! `--consumers N` (issue 27's shape): N Shared consumers on one subscription, each with its
//! own loop, 300 msg/s in batches of 13, 6 acks per transaction, every fourth aborted, a limit
//! of 37 unacked messages per consumer. Whichever consumer receives an aborted transaction's
//! messages acknowledges them again; one record of commits across consumers tells which
//! payloads were committed twice, by which consumers, and how far apart their acks were.
//!
//! ```text
//! cargo run --release -p bench-tools --bin pulsar_txn_steady -- \
//!     --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080 \
//!     [--seconds 60] [--bulk 2100 | --consumers N] [--warm-up SECONDS] [--legacy] [--peer java]
//! ```
//!
//! `--warm-up S` runs the same shape for S seconds on another topic first, in the same process
//! (for `--peer java`: in the same JVM, so its code is compiled before the measured run).
//!
//! It prints one `double_commit` line per payload committed again (the two consumers, when each
//! ack was answered, how far apart), one `blocked` line per consumer (its blocked periods from
//! the admin stats every 250 ms: count, total, longest), and one `result` line per run:
//! produced and committed payloads, committed once and more than once, transactions committed
//! and aborted, acks refused (by the broker, of which `TransactionConflict`, and by the client)
//! and commits refused, time to drain, the subscription's blocked periods (any consumer
//! blocked), the longest blocked period of a single consumer, and the final unacked count and
//! backlog. Exit 0 when the run drained to unacked 0 and backlog 0 with nothing committed
//! twice, 3 when it did not (what `--legacy` is expected to show), 1 on errors.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use broker_tools::pulsar_admin::PulsarAdmin;
use broker_tools::txn_steady::{
    self, BlockedPeriods, ClientReport, Commit, DoubleCommit, SHARED_LIMIT, Shape, consumer_name,
};
use clap::Parser;
use pulsar_wire::ConnectOptions;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Issue 11's limit (`Shape::steady`, `Shape::bulk`).
const LIMIT: u32 = 50;
const SUBSCRIPTION: &str = "steady";

struct Args {
    service_url: String,
    admin_url: String,
    shape: Shape,
    limit: u32,
    warm_up: Duration,
    legacy: bool,
    java: bool,
}

/// Transactional acks in a steady stream with aborts, on a real Pulsar broker.
#[derive(Debug, Parser)]
#[command(name = "pulsar_txn_steady", args_override_self = true)]
struct Cli {
    /// The broker's binary-protocol URL (a real broker).
    #[arg(long, value_name = "pulsar://HOST:6650")]
    service_url: String,
    /// The broker's admin REST URL (the blocked periods).
    #[arg(long, value_name = "http://HOST:8080")]
    admin_url: String,
    /// Seconds of producing.
    #[arg(long, value_name = "N", default_value_t = 60)]
    seconds: u32,
    /// Produce this many messages at once instead of a steady stream.
    #[arg(long, value_name = "N", conflicts_with = "consumers")]
    bulk: Option<u32>,
    /// N Shared consumers on one subscription (issue 27's shape).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    consumers: Option<u32>,
    /// Run the same shape for this many seconds on another topic first.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    warm_up: u32,
    /// The transactional ack of a client that sends nothing for redelivered indexes.
    #[arg(long)]
    legacy: bool,
    /// Run the official client instead of ours.
    #[arg(long, value_enum)]
    peer: Option<Peer>,
}

/// The other clients `--peer` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Peer {
    /// The official Java client (`scripts/java-peers`).
    Java,
}

impl Cli {
    /// The run these options describe.
    fn into_args(self) -> Args {
        let produce_for = Duration::from_secs(u64::from(self.seconds));
        let (shape, limit) = match (self.bulk, self.consumers) {
            (Some(messages), _) => (Shape::bulk(messages), LIMIT),
            (None, Some(consumers)) => {
                (Shape::shared(consumers as usize, produce_for), SHARED_LIMIT)
            }
            (None, None) => (Shape::steady(produce_for), LIMIT),
        };
        Args {
            service_url: self.service_url,
            admin_url: self.admin_url,
            shape,
            limit,
            warm_up: Duration::from_secs(u64::from(self.warm_up)),
            legacy: self.legacy,
            java: self.peer == Some(Peer::Java),
        }
    }
}

/// Runs the official Java client on the same shape (`scripts/java-peers`), its warm-up first
/// in the same JVM.
async fn run_java(args: &Args, topic: &str) -> Result<ClientReport, String> {
    let shape = &args.shape;
    if shape.produce_first {
        return Err("--peer java runs the steady shapes only".into());
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
            &shape.consumers.to_string(),
            &args.warm_up.as_secs().to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("scripts/java-peers/run: {e} (run from the repository root)"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut report = None;
    let mut doubles = Vec::new();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if let Some(fields) = line.strip_prefix("double_commit ") {
            doubles.push(parse_double_commit(fields)?);
            continue;
        }
        println!("java: {line}");
        if let Some(fields) = line.strip_prefix("result ") {
            report = Some(parse_java(fields)?);
        }
    }
    let _ = child.wait().await;
    let mut report: ClientReport =
        report.ok_or_else(|| "the Java peer printed no result line".to_owned())?;
    report.double_commits = doubles;
    Ok(report)
}

/// The `key=value` fields of a line.
fn fields(line: &str) -> impl Iterator<Item = Result<(&str, &str), String>> {
    line.split_whitespace().map(|field| {
        field
            .split_once('=')
            .ok_or_else(|| format!("bad field {field}"))
    })
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value
        .parse::<T>()
        .map_err(|e| format!("{key}={value}: {e}"))
}

fn parse_java(line: &str) -> Result<ClientReport, String> {
    let mut report = ClientReport::default();
    for field in fields(line) {
        let (key, value) = field?;
        match key {
            "produced" => report.produced = number(key, value)?,
            "committed" => report.committed = number(key, value)?,
            "duplicates" => report.duplicates = number(key, value)?,
            "committed_again" => report.committed_again = number(key, value)?,
            "txns_committed" => report.txns_committed = number(key, value)?,
            "txns_aborted" => report.txns_aborted = number(key, value)?,
            "acks_refused" => report.acks_refused = number(key, value)?,
            "ack_conflicts" => report.ack_conflicts = number(key, value)?,
            "commits_refused" => report.commits_refused = number(key, value)?,
            "drain_ms" => report.drain = Duration::from_millis(number(key, value)?),
            "drained" => report.drained = value == "true",
            "committed_by" => {
                report.committed_by = value
                    .split(',')
                    .map(|n| number(key, n))
                    .collect::<Result<_, _>>()?;
            }
            _ => {}
        }
    }
    Ok(report)
}

/// A `double_commit` line's fields (consumers as indexes, times in ms from the start).
fn parse_double_commit(line: &str) -> Result<DoubleCommit, String> {
    let (mut payload, mut first, mut second) = (None, Commit::default(), Commit::default());
    for field in fields(line) {
        let (key, value) = field?;
        match key {
            "payload" => payload = Some(value.to_owned()),
            "first" => first.consumer = number(key, value)?,
            "first_ms" => first.acked_at = Duration::from_millis(number(key, value)?),
            "second" => second.consumer = number(key, value)?,
            "second_ms" => second.acked_at = Duration::from_millis(number(key, value)?),
            _ => {}
        }
    }
    Ok(DoubleCommit {
        payload: payload.ok_or("a double_commit line without payload")?,
        first,
        second,
    })
}

fn print(
    label: &str,
    args: &Args,
    report: &ClientReport,
    blocked: &BlockedPeriods,
    counts: (i64, i64),
) {
    for double in &report.double_commits {
        println!(
            "double_commit client={label} payload={} first={} first_ms={} second={} \
             second_ms={} apart_ms={}",
            double.payload,
            consumer_name(double.first.consumer),
            double.first.acked_at.as_millis(),
            consumer_name(double.second.consumer),
            double.second.acked_at.as_millis(),
            double.apart().as_millis(),
        );
    }
    for (name, periods) in &blocked.consumers {
        println!(
            "blocked client={label} consumer={name} periods={} total_ms={} longest_ms={}",
            periods.count,
            periods.total.as_millis(),
            periods.longest.as_millis(),
        );
    }
    let across = report
        .double_commits
        .iter()
        .filter(|d| d.across_consumers())
        .count();
    let apart_max = report
        .double_commits
        .iter()
        .map(DoubleCommit::apart)
        .max()
        .unwrap_or_default();
    let consumer_longest = blocked
        .consumers
        .values()
        .map(|p| p.longest)
        .max()
        .unwrap_or_default();
    let committed_by = report
        .committed_by
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let (unacked, backlog) = counts;
    println!(
        "result client={label} consumers={} produced={} committed={} committed_once={} \
         committed_again={} duplicates={} duplicates_across_consumers={across} \
         duplicate_apart_max_ms={} txns_committed={} txns_aborted={} acks_refused={} \
         ack_conflicts={} acks_refused_by_client={} commits_refused={} \
         committed_redeliveries={} duplicates_hidden={} redelivery_requests={} unblocks={} \
          acks_held_back={} handed_again={} \
         drained={} drain_ms={} blocked_periods={} blocked_total_ms={} blocked_longest_ms={} \
         consumer_blocked_longest_ms={} max_unacked={} final_unacked={unacked} \
         final_backlog={backlog} committed_by={committed_by}",
        args.shape.consumers,
        report.produced,
        report.committed,
        report.committed - report.committed_again,
        report.committed_again,
        report.duplicates,
        apart_max.as_millis(),
        report.txns_committed,
        report.txns_aborted,
        report.acks_refused,
        report.ack_conflicts,
        report.acks_refused_by_client,
        report.commits_refused,
        report.committed_redeliveries,
        report.duplicates_hidden,
        report.redelivery_requests,
        report.unblocks,
        report.acks_held_back,
        report.handed_again,
        report.drained,
        report.drain.as_millis(),
        blocked.count,
        blocked.total.as_millis(),
        blocked.longest.as_millis(),
        consumer_longest.as_millis(),
        blocked.max_unacked,
    );
}

/// Creates `topic` with the run's limit.
async fn create_topic(admin: &PulsarAdmin, topic: &str, limit: u32) -> Result<(), String> {
    admin.create_topic(topic).await.map_err(|e| e.to_string())?;
    admin
        .set_max_unacked_on_consumer(topic, limit, Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())
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
    let shape = &args.shape;
    let topic = format!(
        "persistent://public/default/steady-{label}-{}c-{millis}",
        shape.consumers
    );
    create_topic(&admin, &topic, args.limit).await?;
    // The Java peer warms up on `{topic}-warm-up` (and so do we).
    let warm_up_topic = format!("{topic}-warm-up");
    if !args.warm_up.is_zero() {
        create_topic(&admin, &warm_up_topic, args.limit).await?;
    }
    println!(
        "{label}: topic {topic}, limit {}, {} consumer(s), {} messages at {} msg/s in batches \
         of {}, {} acks per transaction, 1 transaction in {} aborted{}{}",
        args.limit,
        shape.consumers,
        shape.messages(),
        shape.rate,
        shape.batch,
        shape.txn_every,
        shape.abort_every,
        if shape.produce_first {
            ", produced first"
        } else {
            ""
        },
        if args.warm_up.is_zero() {
            String::new()
        } else {
            format!(", after a warm-up of {:?}", args.warm_up)
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
        let client = pulsar_wire::ClientBuilder::from(options)
            .build()
            .await
            .map_err(|e| e.to_string())?;
        if !args.warm_up.is_zero() {
            let warm_up = Shape {
                produce_for: args.warm_up,
                timeout: args.warm_up + Duration::from_secs(30),
                ..shape.clone()
            };
            let report = txn_steady::run(
                &client,
                &warm_up_topic,
                SUBSCRIPTION,
                &warm_up,
                args.legacy,
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
            println!(
                "warm-up: committed {} of {}, drained {}",
                report.committed, report.produced, report.drained
            );
        }
        let report = txn_steady::run(
            &client,
            &topic,
            SUBSCRIPTION,
            shape,
            args.legacy,
            Some(&admin),
        )
        .await
        .map_err(|e| e.to_string())?;
        client.close().await;
        report
    };
    let blocked = watcher.finish().await;
    // Ours are read with the consumers connected; the Java peer's after it closed.
    let (unacked, backlog) = match (report.final_unacked, report.final_backlog) {
        (Some(unacked), Some(backlog)) => (unacked, backlog),
        _ => {
            txn_steady::settled_counts(&admin, &topic, SUBSCRIPTION, Duration::from_secs(10)).await
        }
    };
    print(label, &args, &report, &blocked, (unacked, backlog));
    Ok(report.drained && report.duplicates == 0 && unacked == 0 && backlog == 0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Cli::parse().into_args();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("not drained, or committed twice");
            ExitCode::from(3)
        }
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
        Cli::try_parse_from(["pulsar_txn_steady"].iter().chain(args)).map(Cli::into_args)
    }

    const URLS: [&str; 4] = [
        "--service-url",
        "pulsar://127.0.0.1:6650",
        "--admin-url",
        "http://127.0.0.1:8080",
    ];

    #[test]
    fn the_command_lines_of_the_script_and_the_readme_parse() {
        // scripts/bench-txn-steady.sh: with and without --consumers, with and without the peer.
        let script = [&URLS[..], &["--seconds", "60", "--warm-up", "15"]].concat();
        let args = parse(&script).unwrap();
        assert_eq!(args.service_url, "pulsar://127.0.0.1:6650");
        assert_eq!(args.admin_url, "http://127.0.0.1:8080");
        assert_eq!(args.warm_up, Duration::from_secs(15));
        assert_eq!(args.limit, LIMIT);
        assert!(!args.java && !args.legacy);
        let args = parse(&[&script[..], &["--consumers", "4", "--peer", "java"]].concat()).unwrap();
        assert!(args.java);
        assert_eq!(args.limit, SHARED_LIMIT);
        let args = parse(&[&URLS[..], &["--legacy", "--bulk", "2100"]].concat()).unwrap();
        assert!(args.legacy);
        assert_eq!(args.warm_up, Duration::ZERO);
        assert!(parse(&[&URLS[..], &["--bulk", "1", "--consumers", "2"]].concat()).is_err());
        assert!(parse(&[&URLS[..], &["--consumers", "0"]].concat()).is_err());
        assert!(parse(&[&URLS[..], &["--peer", "python"]].concat()).is_err());
        assert!(parse(&URLS[..2]).is_err());
    }
}
