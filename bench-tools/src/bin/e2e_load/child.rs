//! Every client, ours included, runs as a child process, so that its CPU is its own.
//!
//! The line protocol of our children and of the Java and Python peers: `ready` when a
//! consumer that waits for messages published during its run is subscribed (the latency
//! paths: the driver starts publishing then; no other child prints it), `start` when the
//! measured window opens (connected, producer or consumer created), then
//! `result messages=N seconds=S [p50_ms=X p99_ms=Y]` when it closes (and any `note …` line,
//! printed by the driver as it comes); the child then waits
//! for its standard input to close and exits. The driver reads the child's CPU time from
//! `/proc/PID/stat` at both lines (the window's CPU) and the whole process's from `getrusage`
//! after reaping it. `pulsar-perf` speaks its own log lines instead ([`crate::perf`]).

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::time::Duration;

use broker_tools::cpu;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::oneshot;

use crate::perf::PerfLog;

/// How a child reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `start` / `result …` lines.
    Lines,
    /// `pulsar-perf produce`'s log; in steady state its warm-up and window in ms.
    PulsarPerf {
        /// The warm-up and the window ([`PerfLog::steady`]), or `None` for a counted run.
        steady: Option<(u64, u64)>,
    },
}

/// A client process to run.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) label: String,
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) protocol: Protocol,
}

/// What one child measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) messages: u64,
    pub(crate) seconds: f64,
    pub(crate) cpu_s: f64,
    pub(crate) process_cpu_s: f64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    /// Resident memory at the window's end, MiB.
    pub(crate) rss_mib: Option<f64>,
    /// The broker processes' CPU seconds within the window (`None` without broker pids, or
    /// when one could not be read at either end).
    pub(crate) broker_cpu_s: Option<f64>,
}

/// Parses `result k=v k=v …` (without the leading word) into its fields.
pub(crate) fn parse_result(rest: &str) -> Result<HashMap<&str, &str>, String> {
    rest.split_whitespace()
        .map(|field| {
            field
                .split_once('=')
                .ok_or_else(|| format!("bad field {field:?} in result line"))
        })
        .collect()
}

fn field<T: std::str::FromStr>(fields: &HashMap<&str, &str>, name: &str) -> Result<T, String> {
    let text = fields
        .get(name)
        .ok_or_else(|| format!("result line without {name}"))?;
    text.parse()
        .map_err(|_| format!("result line: bad {name} {text:?}"))
}

fn optional(fields: &HashMap<&str, &str>, name: &str) -> Option<f64> {
    fields.get(name).and_then(|v| v.parse().ok())
}

fn proc_cpu(pid: Option<u32>) -> Option<f64> {
    pid.and_then(cpu::of_process).map(|d| d.as_secs_f64())
}

/// The CPU seconds used so far by all of `pids` together: `None` when there are none or one
/// cannot be read.
fn procs_cpu(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|pid| proc_cpu(Some(*pid))).sum()
}

fn proc_rss_mib(pid: Option<u32>) -> Option<f64> {
    pid.and_then(cpu::rss_of_process)
        .map(|kib| kib as f64 / 1024.0)
}

/// How long a child may run on after its result line (it closes its clients once its stdin
/// closes): past that it is killed and its result kept. A child of ours once spun after its
/// window had ended, and the run waited for the 30-minute limit.
const EXIT_GRACE: Duration = Duration::from_secs(120);

/// Runs one client to its end within `limit`; `ready` is told when it prints `ready`. The CPU
/// of the processes `brokers` within the client's window is read at its two ends too.
pub(crate) async fn run(
    spec: &Spec,
    limit: Duration,
    ready: Option<oneshot::Sender<()>>,
    brokers: &[u32],
) -> Result<Outcome, String> {
    run_with_grace(spec, limit, ready, brokers, EXIT_GRACE).await
}

/// [`run`], the child killed `grace` after its result line if it is still running.
async fn run_with_grace(
    spec: &Spec,
    limit: Duration,
    mut ready: Option<oneshot::Sender<()>>,
    brokers: &[u32],
    grace: Duration,
) -> Result<Outcome, String> {
    let label = &spec.label;
    let children_before = cpu::children();
    let mut child = Command::new(&spec.program)
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{label}: cannot start {}: {e}", spec.program))?;
    let pid = child.id();
    let mut stdin = child.stdin.take();
    if matches!(spec.protocol, Protocol::PulsarPerf { .. }) {
        drop(stdin.take());
    }
    let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut stderr = BufReader::new(child.stderr.take().ok_or("no stderr")?).lines();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut keep = |line: String| {
        if tail.len() == 40 {
            tail.pop_front();
        }
        tail.push_back(line);
    };

    let mut window_start: Option<f64> = None;
    let mut window_end: Option<f64> = None;
    let mut brokers_start: Option<f64> = None;
    let mut brokers_end: Option<f64> = None;
    let mut rss_mib: Option<f64> = None;
    let mut measured: Option<(u64, f64, Option<f64>, Option<f64>)> = None;
    let mut perf = match spec.protocol {
        Protocol::PulsarPerf {
            steady: Some((warmup, window)),
        } => PerfLog::steady(warmup, window),
        _ => PerfLog::default(),
    };
    let mut killed_after_result = false;
    let exchange = async {
        let mut stderr_open = true;
        let mut exit_by: Option<tokio::time::Instant> = None;
        loop {
            let grace_over = tokio::time::sleep_until(
                exit_by.unwrap_or_else(|| tokio::time::Instant::now() + limit),
            );
            tokio::select! {
                () = grace_over, if exit_by.is_some() => {
                    eprintln!(
                        "e2e_load: {label}: still running {grace:?} after its result: killed \
                         (its result is kept)"
                    );
                    let _ = child.start_kill();
                    killed_after_result = true;
                    break;
                }
                line = stdout.next_line() => {
                    let Some(line) = line.map_err(|e| format!("{label}: {e}"))? else { break };
                    match spec.protocol {
                        Protocol::Lines => {
                            if line.trim() == "ready" {
                                if let Some(ready) = ready.take() {
                                    let _ = ready.send(());
                                }
                            } else if line.trim() == "start" {
                                window_start = proc_cpu(pid);
                                brokers_start = procs_cpu(brokers);
                            } else if let Some(rest) = line.strip_prefix("result ") {
                                window_end = proc_cpu(pid);
                                brokers_end = procs_cpu(brokers);
                                rss_mib = proc_rss_mib(pid);
                                let fields = parse_result(rest)?;
                                measured = Some((
                                    field(&fields, "messages")?,
                                    field(&fields, "seconds")?,
                                    optional(&fields, "p50_ms"),
                                    optional(&fields, "p99_ms"),
                                ));
                                drop(stdin.take());
                                exit_by = Some(tokio::time::Instant::now() + grace);
                            } else if let Some(note) = line.strip_prefix("note ") {
                                eprintln!("e2e_load: {label}: {note}");
                            } else {
                                keep(line);
                            }
                        }
                        Protocol::PulsarPerf { steady } => {
                            // Counted: from the producers' creation to the first close;
                            // steady: the progress lines that open and close the window.
                            let marks = |p: &PerfLog| match steady {
                                None => (p.started_ms.is_some(), p.closed_ms.is_some()),
                                Some(_) => (p.window.0.is_some(), p.window.1.is_some()),
                            };
                            let before = marks(&perf);
                            perf.line(&line);
                            let after = marks(&perf);
                            if !before.0 && after.0 {
                                window_start = proc_cpu(pid);
                                brokers_start = procs_cpu(brokers);
                            }
                            if !before.1 && after.1 {
                                window_end = proc_cpu(pid);
                                brokers_end = procs_cpu(brokers);
                                rss_mib = proc_rss_mib(pid);
                            }
                            keep(line);
                        }
                    }
                }
                line = stderr.next_line(), if stderr_open => match line {
                    Ok(Some(line)) => keep(line),
                    _ => stderr_open = false,
                },
            }
        }
        child.wait().await.map_err(|e| format!("{label}: {e}"))
    };
    let status = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("{label}: not done within {limit:?}"));
    let failure = |what: String| {
        let lines: Vec<String> = tail.iter().map(|l| format!("    {l}")).collect();
        format!("{what}; its last lines:\n{}", lines.join("\n"))
    };
    let status = status.and_then(|s| s).map_err(&failure)?;
    if !status.success() && !killed_after_result {
        return Err(failure(format!("{label} exited with {status}")));
    }
    let process_cpu_s = cpu::children()
        .saturating_sub(children_before)
        .as_secs_f64();
    let (messages, seconds, p50_ms, p99_ms) = match spec.protocol {
        Protocol::Lines => measured.ok_or_else(|| failure(format!("{label}: no result line")))?,
        Protocol::PulsarPerf { .. } => perf
            .outcome()
            .map_err(|e| failure(format!("{label}: {e}")))?,
    };
    let cpu_s = match (window_start, window_end) {
        (Some(start), Some(end)) => end - start,
        // Without both readings: the whole process's.
        _ => process_cpu_s,
    };
    Ok(Outcome {
        messages,
        seconds,
        cpu_s,
        process_cpu_s,
        p50_ms,
        p99_ms,
        rss_mib,
        broker_cpu_s: brokers_start
            .zip(brokers_end)
            .map(|(start, end)| end - start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that prints its result and then never exits (nor reads its stdin) is killed
    /// after the grace and its result kept: the run goes on. Real time (a real process); the
    /// grace starts only at the result line, so a slow machine cannot make it fail.
    #[tokio::test]
    async fn a_child_that_runs_on_after_its_result_is_killed_and_its_result_kept() {
        let spec = Spec {
            label: "spinner".into(),
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "echo start; echo 'result messages=7 seconds=1.5'; exec sleep 100000".into(),
            ],
            env: Vec::new(),
            protocol: Protocol::Lines,
        };
        // This test's own process stands for a broker: its CPU is read at both lines.
        let outcome = run_with_grace(
            &spec,
            Duration::from_secs(1800),
            None,
            &[std::process::id()],
            Duration::from_millis(300),
        )
        .await
        .unwrap();
        assert_eq!((outcome.messages, outcome.seconds), (7, 1.5));
        assert!(outcome.broker_cpu_s.is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn result_lines() {
        let fields = parse_result("messages=1000 seconds=1.5 p50_ms=2.25").unwrap();
        assert_eq!(field::<u64>(&fields, "messages"), Ok(1000));
        assert_eq!(field::<f64>(&fields, "seconds"), Ok(1.5));
        assert_eq!(optional(&fields, "p50_ms"), Some(2.25));
        assert_eq!(optional(&fields, "p99_ms"), None);
        assert!(field::<u64>(&fields, "bytes").is_err());
        assert!(parse_result("messages").is_err());
    }
}
