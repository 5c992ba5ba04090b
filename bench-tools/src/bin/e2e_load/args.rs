//! The driver's command line.

use std::path::PathBuf;

/// One measured path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Pulsar produce, at 10,000 and at 1,000 messages in flight.
    PulsarProduce,
    /// Pulsar consume of a backlog: Shared subscription, individual acks.
    PulsarConsume,
    /// RocketMQ produce, 256 in flight.
    RocketmqProduce,
    /// RocketMQ push consume of a backlog.
    RocketmqConsume,
    /// RocketMQ simple consume of a backlog (4 receive loops, acks not awaited).
    RocketmqSimple,
}

impl Path {
    /// Every path, in the order they run.
    pub(crate) const ALL: [Path; 5] = [
        Path::PulsarProduce,
        Path::PulsarConsume,
        Path::RocketmqProduce,
        Path::RocketmqConsume,
        Path::RocketmqSimple,
    ];

    /// The name on the command line and in the tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::PulsarProduce => "pulsar-produce",
            Path::PulsarConsume => "pulsar-consume",
            Path::RocketmqProduce => "rocketmq-produce",
            Path::RocketmqConsume => "rocketmq-consume",
            Path::RocketmqSimple => "rocketmq-simple",
        }
    }

    fn parse(name: &str) -> Result<Self, String> {
        Path::ALL
            .into_iter()
            .find(|path| path.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Path::ALL.iter().map(|p| p.name()).collect();
                format!("unknown path {name:?} (one of {})", names.join(", "))
            })
    }
}

/// A client family: ours, the official Java client (pulsar-perf for Pulsar produce), Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Family {
    fn parse(name: &str) -> Result<Self, String> {
        match name {
            "ours" => Ok(Family::Ours),
            "java" => Ok(Family::Java),
            "python" => Ok(Family::Python),
            "pulsar-rs" => Ok(Family::PulsarRs),
            other => Err(format!(
                "unknown client {other:?} (ours, java, python, pulsar-rs)"
            )),
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
    /// Messages per Pulsar produce measurement.
    pub(crate) messages: usize,
    /// Backlog per Pulsar consume measurement.
    pub(crate) backlog: usize,
    /// Messages per RocketMQ produce measurement.
    pub(crate) rocketmq_messages: usize,
    /// Backlog per RocketMQ push consume measurement.
    pub(crate) rocketmq_backlog: usize,
    /// Payload bytes per message.
    pub(crate) size: usize,
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
}

/// The usage text.
pub(crate) const USAGE: &str = "usage: e2e_load [--runs N] [--paths LIST] [--clients ours,java,python,pulsar-rs] \
[--messages N] [--backlog N] [--rocketmq-messages N] [--rocketmq-backlog N] [--size BYTES] [--quick] \
[--out DIR] [--pulsar URL] [--admin URL] [--rocketmq HOST:PORT] [--namespace TENANT/NS] \
[--pulsar-perf PATH] [--pulsar-rs PATH] [--java-peers PATH] [--python-peers PATH] [--rocketmq-admin PATH] [--min-free-gib N]
       e2e_load child pulsar-produce|pulsar-consume|rocketmq-produce|rocketmq-consume|rocketmq-simple ARGS...";

fn repo_path(relative: &str) -> String {
    format!("{}/../{relative}", env!("CARGO_MANIFEST_DIR"))
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runs: 3,
            paths: Path::ALL.to_vec(),
            clients: vec![Family::Ours, Family::Java, Family::Python, Family::PulsarRs],
            messages: 500_000,
            backlog: 1_000_000,
            rocketmq_messages: 100_000,
            rocketmq_backlog: 200_000,
            size: 1024,
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
        }
    }
}

fn count(flag: &str, value: &str) -> Result<usize, String> {
    let n: usize = value
        .replace(['_', ','], "")
        .parse()
        .map_err(|e| format!("{flag} {value:?}: {e}"))?;
    if n == 0 {
        return Err(format!("{flag} must be at least 1"));
    }
    Ok(n)
}

fn list<T>(value: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse)
        .collect()
}

/// Parses the driver's arguments. `--quick` sets small counts and one run; flags given
/// explicitly win over it, wherever they stand.
pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let quick = args.iter().any(|a| a == "--quick");
    if quick {
        options.runs = 1;
        options.messages = 200_000;
        options.backlog = 20_000;
        options.rocketmq_messages = 5_000;
        options.rocketmq_backlog = 5_000;
    }
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            continue;
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .as_str();
        match flag.as_str() {
            "--runs" => options.runs = count(flag, value)?,
            "--paths" => options.paths = list(value, Path::parse)?,
            "--clients" => options.clients = list(value, Family::parse)?,
            "--messages" => options.messages = count(flag, value)?,
            "--backlog" => options.backlog = count(flag, value)?,
            "--rocketmq-messages" => options.rocketmq_messages = count(flag, value)?,
            "--rocketmq-backlog" => options.rocketmq_backlog = count(flag, value)?,
            "--size" => options.size = count(flag, value)?,
            "--out" => options.out = PathBuf::from(value),
            "--pulsar" => options.pulsar = Some(value.into()),
            "--admin" => options.admin = Some(value.into()),
            "--rocketmq" => options.rocketmq = Some(value.into()),
            "--namespace" => options.namespace = value.into(),
            "--pulsar-perf" => options.pulsar_perf = Some(value.into()),
            "--pulsar-rs" => options.pulsar_rs = Some(value.into()),
            "--java-peers" => options.java_peers = value.into(),
            "--python-peers" => options.python_peers = value.into(),
            "--rocketmq-admin" => options.rocketmq_admin = value.into(),
            "--min-free-gib" => {
                options.min_free_gib = value
                    .parse()
                    .map_err(|e| format!("--min-free-gib {value:?}: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if options.paths.is_empty() || options.clients.is_empty() {
        return Err("--paths and --clients need at least one entry".into());
    }
    if !options.namespace.contains('/') {
        return Err(format!(
            "--namespace {:?} is not TENANT/NAMESPACE",
            options.namespace
        ));
    }
    let pulsar = options
        .paths
        .iter()
        .any(|p| matches!(p, Path::PulsarProduce | Path::PulsarConsume));
    if pulsar && (options.pulsar.is_none() || options.admin.is_none()) {
        return Err("the Pulsar paths need --pulsar and --admin".into());
    }
    let rocketmq = options.paths.iter().any(|p| {
        matches!(
            p,
            Path::RocketmqProduce | Path::RocketmqConsume | Path::RocketmqSimple
        )
    });
    if rocketmq && options.rocketmq.is_none() {
        return Err("the RocketMQ paths need --rocketmq".into());
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    const BROKERS: &str = "--pulsar pulsar://h:6650 --admin http://h:8080 --rocketmq h:8081";

    #[test]
    fn defaults_and_flags() {
        let options = parse(&args(BROKERS)).unwrap();
        assert_eq!(options.runs, 3);
        assert_eq!(options.paths, Path::ALL.to_vec());
        assert_eq!(options.backlog, 1_000_000);
        assert_eq!(options.pulsar.as_deref(), Some("pulsar://h:6650"));

        let options = parse(&args(&format!(
            "{BROKERS} --runs 5 --paths pulsar-consume,rocketmq-produce --clients ours,java,pulsar-rs \
             --pulsar-rs /bin/peer --messages 1_000 --backlog 2,000 --out /tmp/x --size 100"
        )))
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
        assert_eq!((options.messages, options.backlog), (1000, 2000));
        assert_eq!(options.size, 100);
        assert_eq!(options.out, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn quick_sets_small_counts_and_explicit_flags_win() {
        let options = parse(&args(&format!("--backlog 7 {BROKERS} --quick"))).unwrap();
        assert_eq!(options.runs, 1);
        assert_eq!(options.messages, 200_000);
        assert_eq!(options.backlog, 7);
        assert_eq!(options.rocketmq_backlog, 5_000);
    }

    #[test]
    fn errors() {
        assert!(parse(&args(&format!("{BROKERS} --runs 0"))).is_err());
        assert!(parse(&args(&format!("{BROKERS} --runs"))).is_err());
        assert!(parse(&args(&format!("{BROKERS} --paths kafka"))).is_err());
        assert!(parse(&args(&format!("{BROKERS} --clients go"))).is_err());
        assert!(parse(&args(&format!("{BROKERS} --bogus 1"))).is_err());
        assert!(parse(&args("--paths pulsar-produce --rocketmq h:1")).is_err());
        assert!(parse(&args("--paths rocketmq-produce --rocketmq h:1")).is_ok());
        assert!(parse(&args(&format!("{BROKERS} --namespace bench"))).is_err());
    }
}
