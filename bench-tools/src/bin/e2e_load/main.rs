//! One reproducible end-to-end benchmark on real brokers: ours against the official clients,
//! 1 KiB messages, one topic per measurement, interleaved runs, medians.
//!
//! `scripts/bench-e2e.sh` builds this in release, brings the brokers (or uses those named by
//! `PULSAR_SERVICE_URL` / `ROCKETMQ_ENDPOINT`), builds the Java peers and the Python venv, and
//! runs it:
//!
//! ```sh
//! scripts/bench-e2e.sh --quick                 # a smoke run: small counts, 1 run
//! scripts/bench-e2e.sh --runs 3                # the full run (the defaults below)
//! scripts/bench-e2e.sh --paths pulsar-produce --clients ours,java
//! ```
//!
//! Steady state: every produce client sends without end; its window opens `--warmup` (20 s)
//! after its start (the JVM's JIT warm-up, batch sizes settling) and lasts `--window` (30 s);
//! only the receipts within the window count, and its CPU is read at the window's two ends.
//! Two settings tables in one run (`--settings`, both by default): `tuned`, each client at
//! the settings its documentation recommends for throughput (batches of at most 1,000
//! messages / 10 ms / 4 MiB), and `defaults`, each as shipped (the Java client's batching
//! defaults: 1,000 messages / 1 ms / 128 KiB; ours the same). Our produce children run on a
//! current-thread runtime when tuned (the README's recommendation for a process whose main
//! work is sending) and on `#[tokio::main]`'s multi-thread one with the defaults (`runtime.rs`).
//! Each row also has the client's resident memory at the window's end.
//!
//! Paths (`--paths`, all by default):
//! - `pulsar-produce`: to a fresh topic, at 10,000 and 1,000 sends in flight when tuned, 1,000
//!   with the defaults; ours (the sends kept in a queue, the oldest awaited: a producer's
//!   receipts come in order), `pulsar-perf produce` (`-o` in flight, `-r 100000000`, `-time`;
//!   its window from its own 10 s progress lines). The Python client and the `pulsar` crate
//!   have no time-bounded mode yet and are left out of this path. p50/p99 from each send to
//!   its receipt (pulsar-perf: the medians of its 10 s lines' own).
//! - `pulsar-consume` (defaults table; not steady state yet: the window is the backlog's
//!   drain): a `--backlog` (1,000,000) written by our producer before the consumer
//!   starts, consumed on a Shared subscription (created before the backlog), each message
//!   acknowledged individually; ours, the Java client, the Python client, the `pulsar` crate.
//! - `rocketmq-produce`: steady state as above, 256 sends in flight; ours, the RocketMQ 5
//!   Java client (`sendAsync`). Neither has a throughput setting, so one measurement is the
//!   row of both tables.
//! - `rocketmq-produce-batch`: the same, ours sending batches of 32 messages
//!   (`Producer::send_batch`: one `SendMessage` request per batch, 8 open, 256 messages in
//!   flight); the Java client as in `rocketmq-produce` (its RocketMQ 5 `Producer` has no batch
//!   send). Measured apart from `rocketmq-produce`, so that the per-message row stays the one
//!   compared.
//! - `rocketmq-consume`: a `--rocketmq-backlog` (200,000) on a fresh topic, a fresh group's
//!   push consumer; ours, the Java push consumer.
//! - `rocketmq-simple`: the same backlog drained by a fresh group's simple consumer (4 receive
//!   loops of 32 messages, acks not awaited), the window from the backlog's fifth message on
//!   (warm-up excluded); ours (its `AckMessage` requests printed as a `note` line), the Java
//!   simple consumer with `ackAsync` (one request per message).
//! - `pulsar-latency` (steady state): publish-to-receive latency at a fixed
//!   rate below saturation. On a fresh topic the consumer subscribes (Shared, each message
//!   acknowledged individually, as `pulsar-consume`) and prints `ready`; the driver then
//!   publishes `--latency-rate` (5,000) messages a second with our producer (default
//!   settings), each payload's first 8 bytes its send time in µs since the UNIX epoch
//!   (big-endian), until the consumer has reported. The consumer's window opens `--warmup`
//!   after its first message and lasts `--window`; p50/p99 of each message's receipt time
//!   less its stamp. Ours, the Java client (`E2ePulsarLatency`), both at default settings
//!   (none of their settings is about throughput below saturation): one measurement is the
//!   row of both tables.
//! - `rocketmq-latency`: the same with a fresh group's push consumer (every handler returns
//!   success) at `--rocketmq-latency-rate` (2,000) messages a second; ours, the Java push
//!   consumer (`E2eRocketMqPushLatency`), both at default settings.
//!
//! Broker warm-up: before the first run our producer sends to each broker the paths use for
//! `--broker-warmup` (60) seconds, not recorded: a broker started moments ago otherwise runs
//! its own JIT warm-up within the first client's window.
//!
//! Broker CPU: with `--pulsar-pid-file` / `--rocketmq-pid-file` (bench-e2e.sh gives those of
//! the brokers started by `scripts/brokers`), the CPU of the path's broker processes within
//! each window is read at the window's two ends as the client's, and goes in the tables as
//! `broker cores` (CPU seconds per second of window): how close the broker ran to the
//! machine's cores.
//!
//! Interleaving: `for run in 1..=runs { for path { for client { measure } } }`. Every client
//! runs as a child process (ours through `e2e_load child …`); its CPU within the measured
//! window comes from `/proc/PID/stat`, and the whole process's (start-up included) from
//! `getrusage`. Writes `runs.csv` (every measurement) and `results.csv` (medians) to `--out`
//! (`target/bench-e2e`) and prints the markdown table.
//!
//! Bounded data: Pulsar topics go in `--namespace` (`public/bench`), with retention 0, a 2 GiB
//! backlog quota (`producer_exception`) and a 1 h TTL, each force-deleted after its
//! measurement; RocketMQ topics are created and deleted per measurement through
//! `scripts/brokers/rocketmq create-topic|delete-topic`. Before each measurement the driver
//! stops if the disk holding `--out` has less than `--min-free-gib` (10) free.

mod admin;
mod args;
mod child;
mod latency;
mod perf;
mod pulsar_consume;
mod pulsar_latency;
mod pulsar_produce;
mod report;
mod rocketmq_consume;
mod rocketmq_latency;
mod rocketmq_produce;
mod rocketmq_simple;
mod runtime;
mod stats;
mod window;

use std::process::ExitCode;
use std::time::Duration;

use broker_tools::pulsar_admin::PulsarAdmin;
use clap::{CommandFactory, Parser};
use tokio::io::AsyncReadExt;

use args::{Family, Options, Path, Settings};
use child::{Outcome, Spec};
use report::Run;

/// How often, and how long apart, the driver looks again for free disk before a measurement.
const FREE_DISK_CHECKS: u32 = 10;
const FREE_DISK_PAUSE: Duration = Duration::from_secs(30);

/// Blocks until standard input is closed: the driver's signal to shut down.
pub(crate) async fn stdin_closed() {
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

/// The short name of a client family in topic names.
pub(crate) fn family_name(family: Family) -> &'static str {
    match family {
        Family::Ours => "ours",
        Family::Java => "java",
        Family::Python => "python",
        Family::PulsarRs => "pulsar-rs",
    }
}

/// The driver's state: its options, this binary's path, the runs so far.
pub(crate) struct Driver {
    pub(crate) options: Options,
    pub(crate) ourselves: String,
    /// The path being measured: its broker's processes are observed.
    path: Option<Path>,
    runs: Vec<Run>,
    failures: Vec<String>,
}

impl Driver {
    /// The Pulsar admin client of `--admin`.
    pub(crate) fn pulsar_admin(&self) -> Result<PulsarAdmin, String> {
        let url = self.options.admin.as_deref().ok_or("no --admin")?;
        PulsarAdmin::new(url).map_err(|e| e.to_string())
    }

    /// Runs one client. `Err` only when the benchmark must stop (the disk is nearly full);
    /// a failing client is reported and gives `Ok(None)`.
    pub(crate) async fn measure(&mut self, spec: &Spec) -> Result<Option<Outcome>, String> {
        self.measure_notifying(spec, None).await
    }

    /// As [`Driver::measure`]; `ready` is told when the client prints `ready` (a latency
    /// path's consumer, subscribed).
    pub(crate) async fn measure_notifying(
        &mut self,
        spec: &Spec,
        ready: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<Option<Outcome>, String> {
        // A deleted Pulsar topic's bytes stay until the bookie's garbage collection (every
        // minute with bench-e2e.sh's broker): wait for it before giving up.
        let mut free = admin::free_bytes(&self.options.out).await?;
        for _ in 0..FREE_DISK_CHECKS {
            if free >= self.options.min_free_gib << 30 {
                break;
            }
            eprintln!(
                "e2e_load: {:.1} GiB free, below --min-free-gib {}: waiting for the brokers to \
                 reclaim deleted topics",
                free as f64 / f64::from(1u32 << 30),
                self.options.min_free_gib
            );
            tokio::time::sleep(FREE_DISK_PAUSE).await;
            free = admin::free_bytes(&self.options.out).await?;
        }
        if free < self.options.min_free_gib << 30 {
            return Err(format!(
                "stopping: only {:.1} GiB free on the disk of {} (--min-free-gib {}) after \
                 waiting {:?} for it",
                free as f64 / f64::from(1u32 << 30),
                self.options.out.display(),
                self.options.min_free_gib,
                FREE_DISK_PAUSE * FREE_DISK_CHECKS
            ));
        }
        eprintln!("e2e_load: {} ...", spec.label);
        let brokers = self.broker_pids();
        match child::run(spec, Duration::from_secs(1800), ready, &brokers).await {
            Ok(outcome) => Ok(Some(outcome)),
            Err(e) => {
                self.failed(&spec.label, &e);
                Ok(None)
            }
        }
    }

    /// The pids of the current path's broker processes, read from `--pulsar-pid-file` or
    /// `--rocketmq-pid-file` now (a restarted broker has a new pid); none when a file cannot
    /// be read (no broker CPU in the row then).
    fn broker_pids(&self) -> Vec<u32> {
        let files = match self.path {
            Some(path) if path.is_pulsar() => &self.options.pulsar_pid_files,
            Some(_) => &self.options.rocketmq_pid_files,
            None => return Vec::new(),
        };
        let pids: Option<Vec<u32>> = files
            .iter()
            .map(|file| std::fs::read_to_string(file).ok()?.trim().parse().ok())
            .collect();
        pids.unwrap_or_else(|| {
            eprintln!("e2e_load: a broker pid file cannot be read: no broker CPU in this row");
            Vec::new()
        })
    }

    /// The broker warm-up's client: our `child` of the produce path `mode` (tuned) sending to
    /// `target`'s `topic` with `in_flight` open for `--broker-warmup` seconds, then a 1 s
    /// window; its result is not recorded.
    pub(crate) fn warm_up_spec(
        &self,
        mode: &str,
        target: &str,
        topic: &str,
        in_flight: usize,
    ) -> Spec {
        let args = [
            "child",
            mode,
            target,
            topic,
            "0",
            &self.options.size.to_string(),
            &in_flight.to_string(),
            "--warmup-secs",
            &self.options.broker_warmup.to_string(),
            "--window-secs",
            "1",
        ];
        Spec {
            label: format!("{mode} broker warm-up (ours, not recorded)"),
            program: self.ourselves.clone(),
            args: args.map(String::from).to_vec(),
            env: runtime::ours_env(Settings::Tuned),
            protocol: child::Protocol::Lines,
        }
    }

    /// Reports the failed measurement of `label` (printed now, listed at the end).
    pub(crate) fn failed(&mut self, label: &str, error: &str) {
        eprintln!("e2e_load: FAILED: {error}");
        self.failures
            .push(format!("{label}: {}", error.lines().next().unwrap_or("")));
    }

    /// Records a measurement (nothing for a failed one) and writes the CSV files so far.
    pub(crate) fn record(
        &mut self,
        settings: Settings,
        path: &'static str,
        client: &str,
        in_flight: usize,
        run: usize,
        outcome: Option<Outcome>,
    ) {
        let Some(o) = outcome else { return };
        let row = Run {
            settings: settings.name(),
            path,
            client: client.to_owned(),
            in_flight,
            run,
            messages: o.messages,
            size: self.options.size,
            seconds: o.seconds,
            cpu_s: o.cpu_s,
            process_cpu_s: o.process_cpu_s,
            p50_ms: o.p50_ms,
            p99_ms: o.p99_ms,
            rss_mib: o.rss_mib,
            broker_cpu_s: o.broker_cpu_s,
        };
        eprintln!(
            "e2e_load: {} {path} {client} run {run}: {:.0} msg/s, {:.2} CPU s per M, p50 {} p99 {}, \
             RSS {}, broker {}",
            row.settings,
            row.msgs_per_s(),
            row.cpu_s_per_million(),
            row.p50_ms.map_or("-".into(), |v| format!("{v:.1} ms")),
            row.p99_ms.map_or("-".into(), |v| format!("{v:.1} ms")),
            row.rss_mib.map_or("-".into(), |v| format!("{v:.0} MiB")),
            row.broker_cores()
                .map_or("-".into(), |v| format!("{v:.2} cores")),
        );
        self.runs.push(row);
        if let Err(e) = report::write(&self.options.out, &self.runs) {
            eprintln!("e2e_load: {e}");
        }
    }
}

async fn drive(options: Options) -> Result<(), String> {
    let ourselves = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .to_string_lossy()
        .into_owned();
    let mut driver = Driver {
        options,
        ourselves,
        path: None,
        runs: Vec::new(),
        failures: Vec::new(),
    };
    std::fs::create_dir_all(&driver.options.out)
        .map_err(|e| format!("{}: {e}", driver.options.out.display()))?;
    let o = &driver.options;
    if o.paths.iter().any(|p| p.is_pulsar()) {
        admin::prepare_namespace(&driver.pulsar_admin()?, &o.namespace).await?;
    }
    println!(
        "e2e_load: {} run(s) of {:?} at {:?} settings, {} B messages; produce and latency: {} s \
         of warm-up, then a {} s window; consume backlogs: pulsar {}, rocketmq {}; latency \
         rates: pulsar {}/s, rocketmq {}/s",
        o.runs,
        o.paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
        o.settings.iter().map(|s| s.name()).collect::<Vec<_>>(),
        o.size,
        o.warmup,
        o.window,
        o.backlog,
        o.rocketmq_backlog,
        o.latency_rate,
        o.rocketmq_latency_rate
    );
    let paths = o.paths.clone();
    let mut stopped = None;
    if driver.options.broker_warmup > 0 {
        if let Some(path) = paths.iter().find(|p| p.is_pulsar()) {
            driver.path = Some(*path);
            pulsar_produce::warm_broker(&mut driver).await?;
        }
        if let Some(path) = paths.iter().find(|p| !p.is_pulsar()) {
            driver.path = Some(*path);
            rocketmq_produce::warm_broker(&mut driver).await?;
        }
    }
    'runs: for run in 1..=driver.options.runs {
        for path in &paths {
            driver.path = Some(*path);
            let result = match path {
                Path::PulsarProduce => pulsar_produce::measure(&mut driver, run).await,
                Path::PulsarConsume => pulsar_consume::measure(&mut driver, run).await,
                Path::RocketmqProduce => rocketmq_produce::measure(&mut driver, run, 1).await,
                Path::RocketmqProduceBatch => {
                    rocketmq_produce::measure(&mut driver, run, rocketmq_produce::BATCH).await
                }
                Path::RocketmqConsume => rocketmq_consume::measure(&mut driver, run).await,
                Path::RocketmqSimple => rocketmq_simple::measure(&mut driver, run).await,
                Path::PulsarLatency => pulsar_latency::measure(&mut driver, run).await,
                Path::RocketmqLatency => rocketmq_latency::measure(&mut driver, run).await,
            };
            if let Err(e) = result {
                stopped = Some(e);
                break 'runs;
            }
        }
    }
    let summaries = report::summarize(&driver.runs);
    report::write(&driver.options.out, &driver.runs)?;
    println!();
    print!("{}", report::markdown(&summaries));
    println!();
    println!(
        "every run: {}; medians: {}",
        driver.options.out.join("runs.csv").display(),
        driver.options.out.join("results.csv").display()
    );
    for failure in &driver.failures {
        println!("failed: {failure}");
    }
    match stopped {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    match runtime::build() {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("e2e_load: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The driver, or a child (on the runtime [`runtime::build`] made).
async fn run() -> ExitCode {
    let cli = args::Cli::parse();
    let result = match cli.child {
        Some(args::Command::Child(child)) => match child {
            args::Child::PulsarProduce(args) => pulsar_produce::child(args).await,
            args::Child::PulsarConsume(args) => pulsar_consume::child(args).await,
            args::Child::RocketmqProduce(args) => rocketmq_produce::child(args).await,
            args::Child::RocketmqConsume(args) => rocketmq_consume::child(args).await,
            args::Child::RocketmqSimple(args) => rocketmq_simple::child(args).await,
            args::Child::PulsarLatency(args) => pulsar_latency::child(args).await,
            args::Child::RocketmqLatency(args) => rocketmq_latency::child(args).await,
        },
        None => match cli.flags.into_options() {
            Ok(options) => drive(options).await,
            Err(e) => args::Cli::command()
                .error(clap::error::ErrorKind::ValueValidation, e)
                .exit(),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("e2e_load: {error}");
            ExitCode::FAILURE
        }
    }
}
