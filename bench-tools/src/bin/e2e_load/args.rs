//! The driver's command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// One measured path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Path {
    /// Pulsar produce, at 10,000 and at 1,000 messages in flight.
    PulsarProduce,
    /// Pulsar consume of a backlog: Shared subscription, individual acks.
    PulsarConsume,
    /// RocketMQ produce, 256 in flight.
    RocketmqProduce,
    /// RocketMQ produce, ours in batches (`send_batch`), 256 messages in flight.
    RocketmqProduceBatch,
    /// RocketMQ push consume of a backlog.
    RocketmqConsume,
    /// RocketMQ simple consume of a backlog (4 receive loops, acks not awaited).
    RocketmqSimple,
    /// Pulsar publish-to-receive latency at a fixed rate (Shared subscription, individual
    /// acks).
    PulsarLatency,
    /// RocketMQ publish-to-receive latency at a fixed rate (push consumer).
    RocketmqLatency,
}

impl Path {
    /// Every path, in the order they run.
    pub(crate) const ALL: [Path; 8] = [
        Path::PulsarProduce,
        Path::PulsarConsume,
        Path::RocketmqProduce,
        Path::RocketmqProduceBatch,
        Path::RocketmqConsume,
        Path::RocketmqSimple,
        Path::PulsarLatency,
        Path::RocketmqLatency,
    ];

    /// The name on the command line and in the tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::PulsarProduce => "pulsar-produce",
            Path::PulsarConsume => "pulsar-consume",
            Path::RocketmqProduce => "rocketmq-produce",
            Path::RocketmqProduceBatch => "rocketmq-produce-batch",
            Path::RocketmqConsume => "rocketmq-consume",
            Path::RocketmqSimple => "rocketmq-simple",
            Path::PulsarLatency => "pulsar-latency",
            Path::RocketmqLatency => "rocketmq-latency",
        }
    }

    /// Whether the path measures Pulsar (else RocketMQ).
    pub(crate) fn is_pulsar(self) -> bool {
        matches!(
            self,
            Path::PulsarProduce | Path::PulsarConsume | Path::PulsarLatency
        )
    }
}

/// A client family: ours, the official Java client (pulsar-perf for Pulsar produce), Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Family {
    /// `pulsar-wire` / `rocketmq-grpc`.
    Ours,
    /// The official Java clients.
    Java,
    /// The official Python `pulsar-client` wheel (Pulsar only).
    Python,
    /// The `pulsar` crate (pulsar-rs; Pulsar only), `scripts/pulsar-rs-peer`.
    PulsarRs,
}

/// How a client is configured: each at the settings its documentation recommends for
/// throughput, or each as shipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Settings {
    /// Batching window and size, sends in flight as each client's docs recommend.
    Tuned,
    /// Every client as shipped: only the sends in flight are the application's choice.
    Defaults,
}

impl Settings {
    /// The name in the tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Settings::Tuned => "tuned",
            Settings::Defaults => "defaults",
        }
    }
}

/// What the driver was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    /// Interleaved runs per (path, client).
    pub(crate) runs: usize,
    /// The paths, in the order given.
    pub(crate) paths: Vec<Path>,
    /// The client families to run.
    pub(crate) clients: Vec<Family>,
    /// Backlog per Pulsar consume measurement.
    pub(crate) backlog: usize,
    /// Backlog per RocketMQ push consume measurement.
    pub(crate) rocketmq_backlog: usize,
    /// Payload bytes per message.
    pub(crate) size: usize,
    /// Seconds a produce path's client runs before its measured window (JIT warm-up, batch
    /// sizes settling); a latency path's consumer, from its first message.
    pub(crate) warmup: u64,
    /// Seconds of a produce or latency path's measured window.
    pub(crate) window: u64,
    /// Seconds our producer sends to each broker before the first run, not recorded (the
    /// brokers' own JIT warm-up); 0 for none.
    pub(crate) broker_warmup: u64,
    /// Messages a second our producer publishes in the Pulsar latency path.
    pub(crate) latency_rate: u64,
    /// Messages a second our producer publishes in the RocketMQ latency path.
    pub(crate) rocketmq_latency_rate: u64,
    /// The settings tables, in the order given.
    pub(crate) settings: Vec<Settings>,
    /// Where the CSV files go.
    pub(crate) out: PathBuf,
    /// Pulsar binary-protocol URL.
    pub(crate) pulsar: Option<String>,
    /// Pulsar admin REST URL.
    pub(crate) admin: Option<String>,
    /// RocketMQ proxy endpoint.
    pub(crate) rocketmq: Option<String>,
    /// The Pulsar namespace the measurement topics go in.
    pub(crate) namespace: String,
    /// `bin/pulsar-perf` of the Pulsar distribution.
    pub(crate) pulsar_perf: Option<String>,
    /// The `pulsar-rs-peer` binary (`scripts/pulsar-rs-peer`); without it that client is left
    /// out.
    pub(crate) pulsar_rs: Option<String>,
    /// `scripts/java-peers/run`.
    pub(crate) java_peers: String,
    /// `scripts/python-peers/run`.
    pub(crate) python_peers: String,
    /// `scripts/brokers/rocketmq` (its `create-topic` and `delete-topic`).
    pub(crate) rocketmq_admin: String,
    /// Stop before a measurement when the disk holding `out` has less free space (GiB).
    pub(crate) min_free_gib: u64,
    /// Pid files of the Pulsar broker's processes, whose CPU within each Pulsar window is
    /// recorded beside the client's.
    pub(crate) pulsar_pid_files: Vec<PathBuf>,
    /// Pid files of the RocketMQ processes (name server, proxy, broker), the same.
    pub(crate) rocketmq_pid_files: Vec<PathBuf>,
}

/// One reproducible end-to-end benchmark on real brokers: ours against the official clients.
#[derive(Debug, Parser)]
#[command(
    name = "e2e_load",
    args_override_self = true,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub(crate) struct Cli {
    /// A measurement's client process (started by the driver).
    #[command(subcommand)]
    pub(crate) child: Option<Command>,
    /// The driver's flags.
    #[command(flatten)]
    pub(crate) flags: Flags,
}

/// The driver's subcommand.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// One measurement of ours, in a child process of the driver.
    #[command(subcommand)]
    Child(Child),
}

/// The measurements of ours that run as a child process.
#[derive(Debug, Subcommand)]
pub(crate) enum Child {
    /// Pulsar produce: URL TOPIC MESSAGES SIZE IN_FLIGHT.
    PulsarProduce(Produce),
    /// Pulsar consume of a backlog: URL TOPIC SUBSCRIPTION MESSAGES.
    PulsarConsume(Consume),
    /// RocketMQ produce: ENDPOINT TOPIC MESSAGES SIZE IN_FLIGHT.
    RocketmqProduce(Produce),
    /// RocketMQ push consume of a backlog: ENDPOINT TOPIC GROUP MESSAGES.
    RocketmqConsume(Consume),
    /// RocketMQ simple consume of a backlog: ENDPOINT TOPIC GROUP MESSAGES WARMUP.
    RocketmqSimple(Simple),
    /// Pulsar latency consumer: URL TOPIC SUBSCRIPTION WARMUP_SECS WINDOW_SECS.
    PulsarLatency(Latency),
    /// RocketMQ latency push consumer: ENDPOINT TOPIC GROUP WARMUP_SECS WINDOW_SECS.
    RocketmqLatency(Latency),
}

/// A produce child's arguments.
#[derive(Debug, Args)]
pub(crate) struct Produce {
    /// The broker: a Pulsar URL or a RocketMQ endpoint.
    pub(crate) target: String,
    /// The topic.
    pub(crate) topic: String,
    /// Messages to send (without `--window-secs`).
    pub(crate) messages: usize,
    /// Payload bytes per message.
    pub(crate) size: usize,
    /// Sends in flight.
    pub(crate) in_flight: usize,
    /// Seconds of sending before the window opens (with `--window-secs`).
    #[arg(long, default_value_t = 0)]
    pub(crate) warmup_secs: u64,
    /// Send until this many seconds after the warm-up instead of `messages`.
    #[arg(long, default_value_t = 0)]
    pub(crate) window_secs: u64,
    /// The client as shipped (no batching settings).
    #[arg(long)]
    pub(crate) defaults: bool,
    /// Messages per send, at least 1: above 1, RocketMQ's sends are batches
    /// (`Producer::send_batch`) and `in_flight` counts messages (`in_flight / batch` sends
    /// open). Pulsar batches inside its producer: 1 there.
    #[arg(long, default_value_t = 1, value_parser = count)]
    pub(crate) batch: usize,
}

/// A consume child's arguments.
#[derive(Debug, Args)]
pub(crate) struct Consume {
    /// The broker: a Pulsar URL or a RocketMQ endpoint.
    pub(crate) target: String,
    /// The topic.
    pub(crate) topic: String,
    /// The subscription (Pulsar) or the consumer group (RocketMQ).
    pub(crate) subscription: String,
    /// Messages to consume.
    pub(crate) messages: usize,
}

/// A latency consumer child's arguments.
#[derive(Debug, Args)]
pub(crate) struct Latency {
    /// The broker: a Pulsar URL or a RocketMQ endpoint.
    pub(crate) target: String,
    /// The topic.
    pub(crate) topic: String,
    /// The subscription (Pulsar) or the consumer group (RocketMQ).
    pub(crate) subscription: String,
    /// Seconds from the first message to the window's opening.
    pub(crate) warmup_secs: u64,
    /// Seconds of the measured window.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) window_secs: u64,
}

/// The simple-consume child's arguments.
#[derive(Debug, Args)]
pub(crate) struct Simple {
    /// The RocketMQ endpoint.
    pub(crate) endpoint: String,
    /// The topic.
    pub(crate) topic: String,
    /// The consumer group.
    pub(crate) group: String,
    /// Messages to consume.
    pub(crate) messages: usize,
    /// Messages before the measured window.
    pub(crate) warmup: usize,
}

/// The driver's flags; `--quick` sets small counts and one run, and flags given explicitly
/// win over it.
#[derive(Debug, Args)]
pub(crate) struct Flags {
    /// Interleaved runs per (path, client) [default: 3; --quick: 1].
    #[arg(long, value_name = "N", value_parser = count)]
    runs: Option<usize>,
    /// The paths, in the order given [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    paths: Option<Vec<Path>>,
    /// The client families to run [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    clients: Option<Vec<Family>>,
    /// Backlog per Pulsar consume measurement [default: 1000000; --quick: 20000].
    #[arg(long, value_name = "N", value_parser = count)]
    backlog: Option<usize>,
    /// Backlog per RocketMQ consume measurement [default: 200000; --quick: 5000].
    #[arg(long, value_name = "N", value_parser = count)]
    rocketmq_backlog: Option<usize>,
    /// Payload bytes per message.
    #[arg(long, value_name = "BYTES", value_parser = count, default_value = "1024")]
    size: usize,
    /// Seconds a produce client sends (a latency consumer receives) before its window opens
    /// [default: 20; --quick: 5].
    #[arg(long, value_name = "SECS")]
    warmup: Option<u64>,
    /// Seconds of a produce or latency client's measured window [default: 30; --quick: 5].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    window: Option<u64>,
    /// Seconds our producer sends to each broker before the first run, not recorded: a
    /// broker freshly started runs its own JIT warm-up, which otherwise falls in the first
    /// measurement (after 30 s a Pulsar broker was still slow) [default: 60; --quick: 0]; 0
    /// for none.
    #[arg(long, value_name = "SECS")]
    broker_warmup: Option<u64>,
    /// Messages a second published in the Pulsar latency path.
    #[arg(long, value_name = "N", value_parser = count, default_value = "5000")]
    latency_rate: usize,
    /// Messages a second published in the RocketMQ latency path.
    #[arg(long, value_name = "N", value_parser = count, default_value = "2000")]
    rocketmq_latency_rate: usize,
    /// The settings tables [default: tuned,defaults].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    settings: Option<Vec<Settings>>,
    /// Small counts and one run: a smoke run.
    #[arg(long)]
    quick: bool,
    /// Where the CSV files go.
    #[arg(long, value_name = "DIR", default_value = "target/bench-e2e")]
    out: PathBuf,
    /// Pulsar binary-protocol URL.
    #[arg(long, value_name = "URL")]
    pulsar: Option<String>,
    /// Pulsar admin REST URL.
    #[arg(long, value_name = "URL")]
    admin: Option<String>,
    /// RocketMQ proxy endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    rocketmq: Option<String>,
    /// The Pulsar namespace the measurement topics go in.
    #[arg(long, value_name = "TENANT/NS", default_value = "public/bench")]
    namespace: String,
    /// `bin/pulsar-perf` of the Pulsar distribution.
    #[arg(long, value_name = "PATH")]
    pulsar_perf: Option<String>,
    /// The `pulsar-rs-peer` binary; without it that client is left out.
    #[arg(long, value_name = "PATH")]
    pulsar_rs: Option<String>,
    /// `scripts/java-peers/run` [default: the repository's].
    #[arg(long, value_name = "PATH")]
    java_peers: Option<String>,
    /// `scripts/python-peers/run` [default: the repository's].
    #[arg(long, value_name = "PATH")]
    python_peers: Option<String>,
    /// `scripts/brokers/rocketmq` [default: the repository's].
    #[arg(long, value_name = "PATH")]
    rocketmq_admin: Option<String>,
    /// Stop before a measurement when the disk holding --out has less free space (GiB).
    #[arg(long, value_name = "N", default_value_t = 10)]
    min_free_gib: u64,
    /// A pid file of a Pulsar broker process (repeatable): its CPU within each Pulsar window
    /// goes in the tables (`broker cores`).
    #[arg(long, value_name = "PATH")]
    pulsar_pid_file: Vec<PathBuf>,
    /// A pid file of a RocketMQ process (repeatable: name server, proxy, broker), the same.
    #[arg(long, value_name = "PATH")]
    rocketmq_pid_file: Vec<PathBuf>,
}

fn repo_path(relative: &str) -> String {
    format!("{}/../{relative}", env!("CARGO_MANIFEST_DIR"))
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runs: 3,
            paths: Path::ALL.to_vec(),
            clients: vec![Family::Ours, Family::Java, Family::Python, Family::PulsarRs],
            backlog: 1_000_000,
            rocketmq_backlog: 200_000,
            size: 1024,
            warmup: 20,
            broker_warmup: 60,
            window: 30,
            latency_rate: 5000,
            rocketmq_latency_rate: 2000,
            settings: vec![Settings::Tuned, Settings::Defaults],
            out: PathBuf::from("target/bench-e2e"),
            pulsar: None,
            admin: None,
            rocketmq: None,
            namespace: "public/bench".into(),
            pulsar_perf: None,
            pulsar_rs: None,
            java_peers: repo_path("scripts/java-peers/run"),
            python_peers: repo_path("scripts/python-peers/run"),
            rocketmq_admin: repo_path("scripts/brokers/rocketmq"),
            min_free_gib: 10,
            pulsar_pid_files: Vec::new(),
            rocketmq_pid_files: Vec::new(),
        }
    }
}

/// A count of at least 1; `_` and `,` may group its digits.
fn count(value: &str) -> Result<usize, String> {
    let n: usize = value
        .replace(['_', ','], "")
        .parse()
        .map_err(|e| format!("{e}"))?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

impl Flags {
    /// The options these flags describe, or what is wrong with them.
    pub(crate) fn into_options(self) -> Result<Options, String> {
        let mut options = Options::default();
        if self.quick {
            options.runs = 1;
            options.backlog = 20_000;
            options.rocketmq_backlog = 5_000;
            options.warmup = 5;
            options.window = 5;
            options.broker_warmup = 0;
        }
        let keep = |value: Option<usize>, default: usize| value.unwrap_or(default);
        options.runs = keep(self.runs, options.runs);
        options.backlog = keep(self.backlog, options.backlog);
        options.rocketmq_backlog = keep(self.rocketmq_backlog, options.rocketmq_backlog);
        options.paths = self.paths.unwrap_or(options.paths);
        options.clients = self.clients.unwrap_or(options.clients);
        options.size = self.size;
        options.warmup = self.warmup.unwrap_or(options.warmup);
        options.window = self.window.unwrap_or(options.window);
        options.broker_warmup = self.broker_warmup.unwrap_or(options.broker_warmup);
        options.latency_rate = self.latency_rate as u64;
        options.rocketmq_latency_rate = self.rocketmq_latency_rate as u64;
        options.settings = self.settings.unwrap_or(options.settings);
        options.out = self.out;
        options.pulsar = self.pulsar;
        options.admin = self.admin;
        options.rocketmq = self.rocketmq;
        options.namespace = self.namespace;
        options.pulsar_perf = self.pulsar_perf;
        options.pulsar_rs = self.pulsar_rs;
        options.java_peers = self.java_peers.unwrap_or(options.java_peers);
        options.python_peers = self.python_peers.unwrap_or(options.python_peers);
        options.rocketmq_admin = self.rocketmq_admin.unwrap_or(options.rocketmq_admin);
        options.min_free_gib = self.min_free_gib;
        options.pulsar_pid_files = self.pulsar_pid_file;
        options.rocketmq_pid_files = self.rocketmq_pid_file;
        options.check()
    }
}

impl Options {
    /// These options, or what is wrong with them.
    fn check(self) -> Result<Options, String> {
        let options = self;
        if options.paths.is_empty() || options.clients.is_empty() || options.settings.is_empty() {
            return Err("--paths, --clients and --settings need at least one entry".into());
        }
        if !options.namespace.contains('/') {
            return Err(format!(
                "--namespace {:?} is not TENANT/NAMESPACE",
                options.namespace
            ));
        }
        let pulsar = options.paths.iter().any(|p| p.is_pulsar());
        if pulsar && (options.pulsar.is_none() || options.admin.is_none()) {
            return Err("the Pulsar paths need --pulsar and --admin".into());
        }
        let rocketmq = options.paths.iter().any(|p| !p.is_pulsar());
        if rocketmq && options.rocketmq.is_none() {
            return Err("the RocketMQ paths need --rocketmq".into());
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Options, String> {
        let args = std::iter::once("e2e_load").chain(text.split_whitespace());
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        assert!(cli.child.is_none());
        cli.flags.into_options()
    }

    const BROKERS: &str = "--pulsar pulsar://h:6650 --admin http://h:8080 --rocketmq h:8081";

    #[test]
    fn defaults_and_flags() {
        let options = parse(BROKERS).unwrap();
        assert_eq!(options.runs, 3);
        assert_eq!(options.paths, Path::ALL.to_vec());
        assert_eq!(options.backlog, 1_000_000);
        assert_eq!(options.pulsar.as_deref(), Some("pulsar://h:6650"));
        assert_eq!(
            (options.latency_rate, options.rocketmq_latency_rate),
            (5000, 2000)
        );
        let options = parse(&format!(
            "{BROKERS} --paths pulsar-latency,rocketmq-latency --latency-rate 1,000 \
             --rocketmq-latency-rate 500"
        ))
        .unwrap();
        assert_eq!(options.paths, [Path::PulsarLatency, Path::RocketmqLatency]);
        assert_eq!(
            (options.latency_rate, options.rocketmq_latency_rate),
            (1000, 500)
        );

        let options = parse(&format!(
            "{BROKERS} --runs 5 --paths pulsar-consume,rocketmq-produce --clients ours,java,pulsar-rs \
             --pulsar-rs /bin/peer --backlog 2,000 --out /tmp/x --size 100"
        ))
        .unwrap();
        assert_eq!(options.runs, 5);
        assert_eq!(
            options.paths,
            vec![Path::PulsarConsume, Path::RocketmqProduce]
        );
        assert_eq!(
            options.clients,
            vec![Family::Ours, Family::Java, Family::PulsarRs]
        );
        assert_eq!(options.pulsar_rs.as_deref(), Some("/bin/peer"));
        assert_eq!(options.backlog, 2000);
        assert_eq!(options.size, 100);
        assert_eq!(options.out, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn quick_sets_small_counts_and_explicit_flags_win() {
        let options = parse(&format!("--backlog 7 {BROKERS} --quick")).unwrap();
        assert_eq!(options.runs, 1);
        assert_eq!((options.warmup, options.window), (5, 5));
        assert_eq!(options.broker_warmup, 0);
        assert_eq!(options.backlog, 7);
        assert_eq!(options.rocketmq_backlog, 5_000);
    }

    #[test]
    fn errors() {
        assert!(parse(&format!("{BROKERS} --runs 0")).is_err());
        assert!(parse(&format!("{BROKERS} --runs")).is_err());
        assert!(parse(&format!("{BROKERS} --paths kafka")).is_err());
        assert!(parse(&format!("{BROKERS} --clients go")).is_err());
        assert!(parse(&format!("{BROKERS} --bogus 1")).is_err());
        assert!(parse(&format!("{BROKERS} --window 0")).is_err());
        assert!(parse(&format!("{BROKERS} --settings fast")).is_err());
        assert!(parse("--paths pulsar-produce --rocketmq h:1").is_err());
        assert!(parse("--paths rocketmq-produce --rocketmq h:1").is_ok());
        assert!(parse("--paths pulsar-latency --rocketmq h:1").is_err());
        assert!(parse("--paths rocketmq-latency --pulsar u --admin a").is_err());
        assert!(parse(&format!("{BROKERS} --latency-rate 0")).is_err());
        assert!(parse(&format!("{BROKERS} --namespace bench")).is_err());
    }

    #[test]
    fn the_command_line_of_the_bench_script_parses() {
        // scripts/bench-e2e.sh, with the arguments its docs pass on.
        let script = "--out /r/target/bench-e2e --java-peers /r/scripts/java-peers/run \
             --python-peers /r/scripts/python-peers/run --rocketmq-admin /r/scripts/brokers/rocketmq \
             --pulsar pulsar://127.0.0.1:6650 --admin http://127.0.0.1:8080 \
             --pulsar-perf /r/bin/pulsar-perf --rocketmq 127.0.0.1:8081 --pulsar-rs /r/peer";
        let options = parse(&format!("{script} --quick")).unwrap();
        assert_eq!(options.out, PathBuf::from("/r/target/bench-e2e"));
        assert_eq!(options.java_peers, "/r/scripts/java-peers/run");
        assert_eq!(options.python_peers, "/r/scripts/python-peers/run");
        assert_eq!(options.rocketmq_admin, "/r/scripts/brokers/rocketmq");
        assert_eq!(options.pulsar_perf.as_deref(), Some("/r/bin/pulsar-perf"));
        assert_eq!(options.rocketmq.as_deref(), Some("127.0.0.1:8081"));
        assert_eq!((options.runs, options.rocketmq_backlog), (1, 5_000));
        let options = parse(&format!("{script} --runs 3 --min-free-gib 20")).unwrap();
        assert_eq!((options.runs, options.min_free_gib), (3, 20));
        // The script's own --out, then the caller's (BENCHMARKS.md): the last one wins.
        let options = parse(&format!("{script} --runs 2 --out target/bench-simple")).unwrap();
        assert_eq!(options.out, PathBuf::from("target/bench-simple"));
        let options = parse(&format!(
            "{script} --paths pulsar-produce --clients ours,java"
        ))
        .unwrap();
        assert_eq!(options.paths, [Path::PulsarProduce]);
        assert_eq!(options.clients, [Family::Ours, Family::Java]);
        let options = parse(&format!(
            "{script} --warmup 9 --window 31 --rocketmq-backlog 8 --namespace a/b --settings defaults"
        ))
        .unwrap();
        assert_eq!(
            (options.warmup, options.window, options.rocketmq_backlog),
            (9, 31, 8)
        );
        assert_eq!(options.settings, [Settings::Defaults]);
        assert_eq!(options.namespace, "a/b");
        let options = parse("--paths rocketmq-simple --rocketmq h:1").unwrap();
        assert!(options.java_peers.ends_with("scripts/java-peers/run"));
        assert_eq!(options.min_free_gib, 10);
    }

    #[test]
    fn the_children_parse_what_the_driver_passes() {
        let child = |text: &str| {
            let args = ["e2e_load", "child"]
                .into_iter()
                .chain(text.split_whitespace());
            match Cli::try_parse_from(args).map_err(|e| e.to_string())?.child {
                Some(Command::Child(child)) => Ok(child),
                None => Err("no child".to_owned()),
            }
        };
        match child("pulsar-produce pulsar://h:6650 t 1000 1024 10000").unwrap() {
            Child::PulsarProduce(p) => {
                assert_eq!(
                    (p.target.as_str(), p.topic.as_str()),
                    ("pulsar://h:6650", "t")
                );
                assert_eq!((p.messages, p.size, p.in_flight), (1000, 1024, 10000));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(child("pulsar-consume u t s 5"), Ok(Child::PulsarConsume(c)) if c.messages == 5)
        );
        assert!(
            matches!(child("rocketmq-produce e t 5 6 7"), Ok(Child::RocketmqProduce(p)) if p.in_flight == 7 && p.batch == 1)
        );
        assert!(
            matches!(child("rocketmq-produce e t 0 6 256 --window-secs 3 --batch 32"), Ok(Child::RocketmqProduce(p)) if p.batch == 32)
        );
        assert!(child("rocketmq-produce e t 0 6 256 --batch 0").is_err());
        assert!(
            matches!(child("rocketmq-consume e t g 5"), Ok(Child::RocketmqConsume(c)) if c.subscription == "g")
        );
        assert!(
            matches!(child("rocketmq-simple e t g 5 4"), Ok(Child::RocketmqSimple(c)) if c.warmup == 4)
        );
        assert!(child("rocketmq-simple e t g 5").is_err());
        assert!(
            matches!(child("pulsar-latency u t s 20 30"), Ok(Child::PulsarLatency(l)) if (l.warmup_secs, l.window_secs) == (20, 30))
        );
        assert!(
            matches!(child("rocketmq-latency e t g 0 5"), Ok(Child::RocketmqLatency(l)) if l.subscription == "g")
        );
        assert!(child("rocketmq-latency e t g 5 0").is_err());
        assert!(child("pulsar-produce u t many 1 1").is_err());
        assert!(child("kafka-produce u t 1 1 1").is_err());
    }
}
