//! Load comparison of immediate and batched RocketMQ acks against the proxy emulator running
//! in a separate process (`rocketmq_emulator`, found next to this executable).
//!
//! ```sh
//! cargo build --release -p bench-tools -p examples --bin rocketmq_ack_load --bin rocketmq_emulator
//! target/release/rocketmq_ack_load --duration 60            # the full run (about 10 minutes)
//! target/release/rocketmq_ack_load --duration 10 --scenarios a,c   # a quick look
//! ```
//!
//! Scenarios, each run once per ack mode (immediate: one entry per `AckMessage`, what the
//! official clients send; batched: the default `AckSettings`, 1,024 entries or 5 s per
//! (endpoint, topic)):
//!
//! - **(a)** one topic, **(b)** 1,000 topics: 4 KiB messages at a target rate (8,000 msg/s)
//!   for a duration (60 s). Every mode gets a fresh emulator process, a consumer process
//!   (`--role consume`: a `PushConsumer` subscribed to every topic) and a producer process
//!   (`--role produce`: a `Producer` over gRPC, paced). The consumer measures its own CPU time
//!   (`getrusage`) from the moment it is subscribed, before the first message is sent, until its
//!   shutdown has flushed the last ack; the producer's CPU is reported separately and not
//!   counted as client CPU. Consume-to-ack-confirmed latency is taken by an `AckObserver`: from
//!   the moment the handler returns to the moment the ack's own result arrives.
//! - **(c)** ack-path saturation: one topic, 1,000,000 messages received with raw
//!   `ReceiveMessage` calls, then acknowledged through the consumer's ack path (an
//!   `ack_batcher::Batcher` with the `AckFlusher` and the same settings as
//!   `AckSettings::default()`), against the ceiling of raw 1,024-entry `AckMessage` calls for
//!   another 1,000,000 received messages, measured in the same run and against the same
//!   emulator process.
//!
//! With `--follow-deadlines SECS`, (a) and (b) also run the batched mode with
//! `AckSettings::default().follow_deadlines(SECS)` and print a second table against the
//! default batched mode: entries per `AckMessage` request, ack RPCs per message, the ack
//! delay (handler return to confirmed ack) and the redelivery exposure (handled messages whose
//! acks were not sent yet, sampled every 100 ms: what a crash would redeliver).
//! `--no-immediate` skips the immediate mode and its table.
//!
//! It prints a markdown table per scenario with the targets of the issue and whether each was
//! met (`--markdown-out PATH` also writes them to a file). Run `--help` for every flag.

mod ack_path;
mod consume;
mod emulator;
mod load_runs;
mod options;
mod produce;
mod support;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use crate::ack_path::scenario_c;
use crate::consume::{ConsumeArgs, consume_role};
use crate::load_runs::{deadline_table, flow_table, run_mode};
use crate::options::{Options, Role};
use crate::produce::{ProduceArgs, produce_role};
use crate::support::BoxError;
use clap::Parser;

fn orchestrate(options: &Options) -> Result<String, BoxError> {
    if !options.emulator.exists() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p bench-tools -p examples --bin rocketmq_ack_load --bin rocketmq_emulator`, or pass --emulator PATH",
            options.emulator.display()
        )
        .into());
    }
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "{} msg/s of {} B for {} s per mode; a fresh emulator, consumer and producer process per mode. \
         Client CPU is the consumer process's own `getrusage` from subscription to the end of its \
         shutdown; the producer's CPU is listed apart.\n",
        options.rate, options.body, options.duration
    );
    for scenario in &options.scenarios {
        let section = match scenario {
            'a' | 'b' => {
                let (prefix, topics, queues, title, one_topic) = if *scenario == 'a' {
                    let title = format!("(a) one topic, {} queues", options.queues_a);
                    ("a", 1, options.queues_a, title, true)
                } else {
                    let title = format!(
                        "(b) {} topics, {} queue(s) each",
                        options.topics_b, options.queues_b
                    );
                    ("b", options.topics_b, options.queues_b, title, false)
                };
                let immediate = if options.no_immediate {
                    None
                } else {
                    Some(run_mode(options, prefix, topics, queues, false, None)?)
                };
                let batched = run_mode(options, prefix, topics, queues, true, None)?;
                let mut section = match &immediate {
                    Some(immediate) => flow_table(&title, one_topic, options, immediate, &batched),
                    None => String::new(),
                };
                if let Some(secs) = options.follow_deadlines {
                    let follow = run_mode(options, prefix, topics, queues, true, Some(secs))?;
                    section.push_str(&deadline_table(&title, secs, &batched, &follow));
                }
                section
            }
            _ => scenario_c(options)?,
        };
        println!("{section}");
        markdown.push_str(&section);
    }
    Ok(markdown)
}

fn main() -> ExitCode {
    let options = Options::parse();
    let result = if let Some(role_name) = options.role.role {
        role(role_name, &options)
    } else {
        orchestrate(&options).and_then(|markdown| {
            if let Some(path) = &options.markdown_out {
                std::fs::write(path, markdown)?;
            }
            Ok(())
        })
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The internal roles, started by the orchestrator.
fn role(role: Role, options: &Options) -> Result<(), BoxError> {
    let flags = &options.role;
    fn required<T: Clone>(value: &Option<T>, flag: &str) -> Result<T, BoxError> {
        value
            .clone()
            .ok_or_else(|| format!("{flag} is required").into())
    }
    let endpoint = required(&flags.endpoint, "--endpoint")?;
    let prefix = required(&flags.prefix, "--prefix")?;
    let topics = required(&flags.topics, "--topics")?;
    match role {
        Role::Consume => consume_role(ConsumeArgs {
            endpoint,
            prefix,
            topics,
            queues: required(&flags.queues, "--queues")?,
            group: required(&flags.group, "--group")?,
            batched: flags.batched,
            follow_deadlines: options.follow_deadlines,
        }),
        Role::Produce => produce_role(ProduceArgs {
            endpoint,
            prefix,
            topics,
            rate: options.rate,
            duration: Duration::from_secs(options.duration),
            body: options.body,
        }),
    }
}
