//! `rocketmq-grpc` through real faults: the proxy restarted on its data under a steady stream
//! (`scripts/brokers/rocketmq`), and one broker of a two-broker cluster stopped and started
//! again (`scripts/brokers/rocketmq-cluster`).
//!
//! The proxy tests run when `ROCKETMQ_ENDPOINT` and `ROCKETMQ_RESTARTABLE` are set (they stop
//! the proxy, so `scripts/test-real-brokers` runs them in a phase of their own); the cluster
//! tests when `ROCKETMQ_CLUSTER_ENDPOINT` is set. Otherwise every test returns at once.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::rocketmq_stream::{self, Fault, Report, Stream};
use rocketmq_grpc::{ClientConfig, Producer};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Runs a broker script with its arguments; panics if it fails.
async fn script(name: &str, args: &[&str]) {
    let path = format!("{}/../scripts/brokers/{name}", env!("CARGO_MANIFEST_DIR"));
    let status = tokio::process::Command::new(&path)
        .args(args)
        .status()
        .await
        .unwrap_or_else(|error| panic!("{path} does not run: {error}"));
    assert!(status.success(), "{path} {args:?} failed: {status}");
}

/// Runs each step (a script call) in turn, `gap` apart.
fn fault(name: &'static str, steps: Vec<Vec<&'static str>>, gap: Duration) -> Fault {
    Box::new(move || {
        Box::pin(async move {
            for (i, args) in steps.iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(gap).await;
                }
                script(name, args).await;
            }
        })
    })
}

fn print(what: &str, report: &Report) {
    println!(
        "{what}: sent {} (failed {}, {} during the fault, longest send {:?}), received {}, \
         lost {}, copies {}, copies of messages acked before the fault {} ({} redelivered by \
         the broker, {} repeated) {:?}, AckMessage requests {} ({} during the fault window \
         {:?}), acked {}, first ack {:?} after the fault, shutdown report {:?}\nack failures {}: {:?}\nconsumer: {}",
        report.sent,
        report.send_failures,
        report.sent_during_fault,
        report.longest_send,
        report.received,
        report.lost,
        report.copies,
        report.copies_of_acked.total,
        report.copies_of_acked.redelivered,
        report.copies_of_acked.repeated,
        report.copies_of_acked.detail,
        report.ack_requests,
        report.ack_requests_during_fault,
        report.fault_window,
        report.acked,
        report.first_ack_after_fault,
        report.shutdown,
        report.ack_failures,
        report.ack_errors,
        report.consumer,
    );
}

/// The proxy (with its broker: local mode) stopped for 30 s and started again on its data
/// under a steady stream of 100 msg/s: nothing is lost, no message acknowledged before the
/// outage is handled again unless the broker delivered it again, and few are (after TERM, see
/// [`assert_acked_stay_acked`]; -9 may lose the broker's last seconds of consume progress),
/// at most 100 `AckMessage` requests go out during the outage (a
/// constant 1 s backoff made 56,028 of a 34 s restart), every send made during the outage is
/// retried until the proxy is back and succeeds, and the shutdown report lists nothing.
async fn the_stream_survives_a_proxy_restart(kill: bool) {
    let (Some(endpoint), Some(_)) = (var("ROCKETMQ_ENDPOINT"), var("ROCKETMQ_RESTARTABLE")) else {
        eprintln!("ROCKETMQ_ENDPOINT or ROCKETMQ_RESTARTABLE is not set; skipping");
        return;
    };
    let config = ClientConfig::new(&endpoint).unwrap();
    // The proxy is down 30 s, plus its stop (up to 13 s) and start (up to 15 s), plus up to
    // 21 s until the broker's routes are back: a retry window of 2 min covers it.
    let producer = Producer::builder(config.clone())
        .retry_window(Duration::from_secs(120))
        .build()
        .unwrap();
    let producer = Arc::new(producer);
    let mut stop = vec!["stop-proxy"];
    if kill {
        stop.push("--kill");
    }
    let faults = vec![(
        Duration::from_secs(15),
        fault(
            "rocketmq",
            vec![stop, vec!["start-proxy"]],
            Duration::from_secs(30),
        ),
    )];
    let tag = format!(
        "{}-{}",
        if kill { "kill" } else { "term" },
        std::process::id()
    );
    let report = rocketmq_stream::run(
        config,
        "it-normal-2",
        &format!("it-restart-{tag}"),
        producer,
        Stream {
            rate: 100,
            produce_for: Duration::from_secs(60),
            patience: Duration::from_secs(60),
            prefix: format!("restart-{tag}-"),
            settle: Duration::from_secs(25),
            invisible: Duration::from_secs(20),
        },
        faults,
    )
    .await;
    print(&format!("proxy restart ({tag})"), &report);
    assert_no_shortfalls(&report, kill);
    if !kill {
        assert_acked_stay_acked(&report);
    }
    assert!(
        report.ack_requests_during_fault <= 100,
        "{} AckMessage requests during the outage",
        report.ack_requests_during_fault
    );
    assert!(
        report.sent_during_fault > 0,
        "no send started during the outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_30_s_proxy_restart() {
    the_stream_survives_a_proxy_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_30_s_proxy_outage_after_kill_9() {
    the_stream_survives_a_proxy_restart(true).await;
}

/// The most messages the shutdown report may list after a kill -9 (proxy or cluster broker).
///
/// Why: after a kill -9 the 5.3.3 broker did not redeliver, within the stream's settle time,
/// the messages whose receipt handles expired in the outage (their acks were refused as
/// expired, and the broker's pop revive did not bring them back in time); the shutdown report
/// lists them, which is the truth the client knows, and every payload still arrived.
///
/// Measured (every observation in the history):
/// - proxy kill -9 (`a_stream_survives_a_30_s_proxy_outage_after_kill_9`): 189 and 184 in two
///   CI runs (ac3dda9, 2026-12-02). The 184 were of 501 expired-handle messages, still
///   missing 25 s after the stream (b5cb8b1, earlier that day); b5cb8b1 then waited up to
///   50 s more for them, and the 189 (presumably the run after it) were still missing 75 s
///   after; a2c949c removed that wait;
/// - broker-a kill -9 in the cluster (`a_stream_survives_a_broker_of_the_cluster_killed`): 365
///   in one CI run (a2c949c, 2026-12-02);
/// - the same proxy kill -9 under the `rocketmq-restart` benchmark (BENCHMARKS-archive.md, run
///   of 2026-12-02 03:20 UTC, one local run): 0.
///
/// Bound: about 2x the largest seen (365), rounded up to 750. It was 1,000 before, a round
/// number above the observations rather than one derived from them. One bound for both kills,
/// as before; for the proxy kill alone it is about 4x the largest seen.
const MAX_UNACKNOWLEDGED_AFTER_KILL: usize = 750;

/// Every shortfall fails the run, with one exception after a kill -9: the shutdown report may
/// list up to [`MAX_UNACKNOWLEDGED_AFTER_KILL`] messages whose receipt handles expired in the
/// outage and that the broker did not redeliver within the settle time (see there).
fn assert_no_shortfalls(report: &Report, kill: bool) {
    let shortfalls: Vec<String> = report
        .shortfalls()
        .into_iter()
        .filter(|s| !(kill && s.starts_with("the shutdown report lists")))
        .collect();
    assert!(shortfalls.is_empty(), "{shortfalls:?}");
    assert!(
        report.shutdown.unacknowledged.len() <= MAX_UNACKNOWLEDGED_AFTER_KILL,
        "the shutdown report lists {} unacknowledged messages, more than {}",
        report.shutdown.unacknowledged.len(),
        MAX_UNACKNOWLEDGED_AFTER_KILL
    );
}

/// The most acknowledged messages the broker may deliver again (a higher delivery attempt)
/// after a TERM of the proxy or of a cluster broker.
///
/// Why: the 5.3.3 broker revives a few acknowledged pop checkpoints when it comes back after
/// TERM. In a local run a run of one queue's messages was handled within 1 s and acked 4 s
/// later, OK per entry, then delivered again from the retry queue with attempt 2 after the
/// restart.
///
/// Measured (every observation in the history, d164ba1, 2026-12-04): 99 in one CI run (stop
/// 25's `a_stream_survives_a_30_s_proxy_restart`, which failed on the old bound of 0), and 24
/// in one of six local runs (the commit gives no count for the other five).
/// None is recorded for the cluster's broker TERM.
///
/// Bound: about 2x the largest seen (99), rounded up to 200 (2 s of the 100 msg/s stream). It
/// was 500 (5 s of the stream) before, a round figure rather than one derived from the
/// observations.
const MAX_REDELIVERED_AFTER_TERM: u64 = 200;

/// After TERM, no message whose ack the proxy confirmed before the fault is handed to the
/// handler again unless the broker delivered it again (a higher delivery attempt): a repeat
/// would be the client's doing, or a consume offset the broker lost. The broker's own
/// redeliveries are accepted up to [`MAX_REDELIVERED_AFTER_TERM`] (why and how measured: see
/// there).
fn assert_acked_stay_acked(report: &Report) {
    let copies = &report.copies_of_acked;
    assert_eq!(
        copies.repeated, 0,
        "messages acknowledged before the fault were handed to the handler again without a \
         new delivery: {copies:?}"
    );
    assert!(
        copies.redelivered <= MAX_REDELIVERED_AFTER_TERM,
        "the broker delivered {} acknowledged messages again (at most {} accepted): \
         {copies:?}",
        copies.redelivered,
        MAX_REDELIVERED_AFTER_TERM
    );
}

/// One broker of the two stopped (TERM, or killed with -9) mid-stream for 20 s and started
/// again: sends are retried on the other broker and none fails, no ack is given up while its
/// receipt handle is valid, nothing is lost. After TERM acknowledged messages come back only
/// as the broker's few redeliveries ([`assert_acked_stay_acked`]); after -9 more do (the
/// broker loses the consume progress of its last seconds; counted and printed, not asserted).
async fn the_stream_survives_a_broker_stop(kill: bool) {
    let Some(endpoint) = var("ROCKETMQ_CLUSTER_ENDPOINT") else {
        eprintln!("ROCKETMQ_CLUSTER_ENDPOINT is not set; skipping");
        return;
    };
    let config = ClientConfig::new(&endpoint).unwrap();
    // A 30 s retry window instead of the default 10 s. After broker-a was killed the cluster
    // proxy answered no SendMessage for some 10 s (one CI run: 12 of 4,988 sends failed after
    // 3 attempts in 9.6-9.9 s, each attempt timing out). In the TERM run after it the brokers
    // refused sends with TOO_MANY_REQUESTS (TIMEOUT_CLEAN_QUEUE, "broker busy") for about
    // 10 s at the start of the stream on a loaded 2-core machine (3 of 5,000 failed after 9
    // attempts in 8.9-10.2 s). Both commits: a2c949c and 4d17f61, 2026-12-02. Those failures
    // show the proxy or brokers refused for at least 9.9 s and 10.2 s, not for how long: the
    // window is about 3x that lower bound and is kept until the outage itself is measured
    // (`longest send` in the printed report).
    let producer = Arc::new(
        Producer::builder(config.clone())
            .retry_window(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    let mut stop = vec!["stop-broker", "broker-a"];
    if kill {
        stop.push("--kill");
    }
    let faults = vec![(
        Duration::from_secs(15),
        fault(
            "rocketmq-cluster",
            vec![stop, vec!["start-broker", "broker-a"]],
            Duration::from_secs(20),
        ),
    )];
    let tag = format!(
        "{}-{}",
        if kill { "kill" } else { "term" },
        std::process::id()
    );
    let report = rocketmq_stream::run(
        config,
        "it-cluster",
        &format!("it-cluster-{tag}"),
        producer,
        Stream {
            rate: 100,
            produce_for: Duration::from_secs(50),
            patience: Duration::from_secs(60),
            prefix: format!("cluster-{tag}-"),
            settle: Duration::from_secs(25),
            invisible: Duration::from_secs(20),
        },
        faults,
    )
    .await;
    print(&format!("broker-a stopped ({tag})"), &report);
    assert_no_shortfalls(&report, kill);
    if !kill {
        assert_acked_stay_acked(&report);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_broker_of_the_cluster_stopping() {
    the_stream_survives_a_broker_stop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_broker_of_the_cluster_killed() {
    the_stream_survives_a_broker_stop(true).await;
}
