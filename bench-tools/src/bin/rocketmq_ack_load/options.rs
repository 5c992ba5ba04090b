//! The command line: [`Options`], and the internal roles' flags ([`RoleFlags`]).

use std::path::PathBuf;

use clap::Parser;

/// Load comparison of immediate and batched RocketMQ acks against the proxy emulator running in
/// a separate process.
#[derive(Debug, Clone, Parser)]
#[command(name = "rocketmq_ack_load", args_override_self = true)]
pub(crate) struct Options {
    /// Producing time per mode in (a) and (b), in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) duration: u64,
    /// Messages per second.
    #[arg(long, value_name = "N", default_value_t = 8_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rate: u64,
    /// Message body size in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 4096, value_parser = positive)]
    pub(crate) body: usize,
    /// Any of a,b,c.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "a,b,c", value_parser = scenario)]
    pub(crate) scenarios: Vec<char>,
    /// Topics of scenario (b).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) topics_b: u32,
    /// Queues of the topic of (a).
    #[arg(long, value_name = "Q", default_value_t = 4)]
    pub(crate) queues_a: u32,
    /// Queues per topic of (b).
    #[arg(long, value_name = "Q", default_value_t = 1)]
    pub(crate) queues_b: u32,
    /// Acks per path in (c).
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = positive)]
    pub(crate) c_messages: usize,
    /// Concurrent AckMessage calls of the raw ceiling in (c) (the batcher's
    /// max_in_flight_per_key).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = positive)]
    pub(crate) c_in_flight: usize,
    /// Tasks submitting acks to the batcher in (c).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive)]
    pub(crate) c_submitters: usize,
    /// Also ack N messages with one entry per call in (c) (0 = skip).
    #[arg(long, value_name = "N", default_value_t = 50_000)]
    pub(crate) c_single: usize,
    /// Also run (a)/(b) with AckSettings::follow_deadlines(SECS) and print it against the
    /// default batched mode (entries per request, exposure).
    #[arg(long, value_name = "SECS")]
    pub(crate) follow_deadlines: Option<u64>,
    /// Skip the immediate mode of (a)/(b) and its table.
    #[arg(long)]
    pub(crate) no_immediate: bool,
    /// The rocketmq_emulator binary [default: next to this executable].
    #[arg(long, value_name = "PATH", default_value_os_t = default_emulator(), hide_default_value = true)]
    pub(crate) emulator: PathBuf,
    /// Also write the tables to PATH.
    #[arg(long, value_name = "PATH")]
    pub(crate) markdown_out: Option<PathBuf>,
    /// The flags of the internal roles.
    #[command(flatten)]
    pub(crate) role: RoleFlags,
}

/// The internal roles' flags, passed by the orchestrator to its consumer and producer
/// processes (with `--rate`, `--duration`, `--body` and `--follow-deadlines` of [`Options`]).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RoleFlags {
    /// Run as one of the orchestrator's processes.
    #[arg(long, value_enum, hide = true)]
    pub(crate) role: Option<Role>,
    /// The emulator's endpoint.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) endpoint: Option<String>,
    /// The topics' prefix.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) prefix: Option<String>,
    /// Topics.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) topics: Option<u32>,
    /// Queues per topic.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) queues: Option<u32>,
    /// The consumer group.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) group: Option<String>,
    /// Batched acks (the default `AckSettings`) instead of immediate ones.
    #[arg(long, hide = true, requires = "role")]
    pub(crate) batched: bool,
}

/// The orchestrator's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// The push consumer whose CPU is measured.
    Consume,
    /// The paced producer.
    Produce,
}

fn default_emulator() -> PathBuf {
    std::env::current_exe()
        .map(|exe| exe.with_file_name("rocketmq_emulator"))
        .unwrap_or_else(|_| PathBuf::from("rocketmq_emulator"))
}

/// A number above 0.
fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A scenario's letter.
fn scenario(text: &str) -> Result<char, String> {
    match text.trim() {
        "a" => Ok('a'),
        "b" => Ok('b'),
        "c" => Ok('c'),
        other => Err(format!("unknown scenario {other:?} (a, b, c)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(["rocketmq_ack_load"].iter().chain(args))
    }

    #[test]
    fn the_defaults_and_the_documented_command_lines() {
        let o = parse(&[]).unwrap();
        assert_eq!((o.duration, o.rate, o.body), (60, 8_000, 4096));
        assert_eq!(o.scenarios, ['a', 'b', 'c']);
        assert_eq!((o.topics_b, o.queues_a, o.queues_b), (1000, 4, 1));
        assert_eq!(
            (o.c_messages, o.c_in_flight, o.c_submitters, o.c_single),
            (1_000_000, 4, 1, 50_000)
        );
        assert_eq!(
            (o.follow_deadlines, o.no_immediate, o.markdown_out),
            (None, false, None)
        );
        assert!(o.emulator.ends_with("rocketmq_emulator"));
        assert_eq!(o.role.role, None);
        // scripts/bench-rocketmq-acks.sh and its docs
        let o = parse(&[
            "--markdown-out",
            "/tmp/t.md",
            "--duration",
            "10",
            "--scenarios",
            "a,c",
        ])
        .unwrap();
        assert_eq!(o.markdown_out, Some(PathBuf::from("/tmp/t.md")));
        assert_eq!((o.duration, o.scenarios), (10, vec!['a', 'c']));
        // BENCHMARKS.md
        let o = parse(&[
            "--scenarios",
            "b",
            "--no-immediate",
            "--follow-deadlines",
            "25",
            "--duration",
            "150",
            "--rate",
            "2000",
        ])
        .unwrap();
        assert_eq!(
            (o.scenarios, o.no_immediate, o.follow_deadlines),
            (vec!['b'], true, Some(25))
        );
        assert_eq!((o.duration, o.rate), (150, 2000));
        let o = parse(&[
            "--body",
            "100",
            "--topics-b",
            "10",
            "--queues-a",
            "2",
            "--queues-b",
            "3",
            "--c-messages",
            "5",
            "--c-in-flight",
            "2",
            "--c-submitters",
            "3",
            "--c-single",
            "0",
            "--emulator",
            "/e",
        ])
        .unwrap();
        assert_eq!(
            (o.body, o.topics_b, o.queues_a, o.queues_b),
            (100, 10, 2, 3)
        );
        assert_eq!(
            (o.c_messages, o.c_in_flight, o.c_submitters, o.c_single),
            (5, 2, 3, 0)
        );
        assert_eq!(o.emulator, PathBuf::from("/e"));
        assert!(parse(&["--scenarios", "a,d"]).is_err());
        assert!(parse(&["--duration", "0"]).is_err());
        assert!(parse(&["--c-in-flight", "0"]).is_err());
        assert!(parse(&["--endpoint", "h:1"]).is_err());
    }

    #[test]
    fn the_roles_parse_what_the_orchestrator_passes() {
        // load_runs.rs
        let o = parse(&[
            "--role",
            "consume",
            "--endpoint",
            "127.0.0.1:1",
            "--prefix",
            "a",
            "--topics",
            "1",
            "--queues",
            "4",
            "--group",
            "g",
            "--batched",
            "--follow-deadlines",
            "25",
        ])
        .unwrap();
        assert_eq!(o.role.role, Some(Role::Consume));
        assert_eq!(o.role.endpoint.as_deref(), Some("127.0.0.1:1"));
        assert_eq!((o.role.topics, o.role.queues), (Some(1), Some(4)));
        assert!(o.role.batched);
        assert_eq!(o.follow_deadlines, Some(25));
        let o = parse(&[
            "--role",
            "produce",
            "--endpoint",
            "e",
            "--prefix",
            "b",
            "--topics",
            "1000",
            "--rate",
            "8000",
            "--duration",
            "60",
            "--body",
            "4096",
        ])
        .unwrap();
        assert_eq!(o.role.role, Some(Role::Produce));
        assert_eq!((o.rate, o.duration, o.body), (8000, 60, 4096));
        assert!(parse(&["--role", "relay"]).is_err());
    }
}
