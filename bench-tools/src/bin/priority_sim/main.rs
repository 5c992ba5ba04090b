//! `priority_sim`: a deterministic simulator that measures message priority on a partitioned
//! Pulsar topic, comparing no priority, a replica of the published client-side design
//! (streamnative/pulsar-recipes PR #20) and the `priority` crate's gate and router in each
//! strategy (strict, delivery shares, strict with aging).
//!
//! Everything runs in virtual time (1 ms ticks) with a seeded generator: no threads, no
//! sleeping, the same output on every run. The model keeps Pulsar's flow control: receiver
//! queues, FLOW permits returned at half a queue, pause = no new permits while granted ones
//! are still honoured and buffered messages stay, batches dispatched as one entry.
//!
//! Scenarios: a 100:1 low backlog then a high burst; sustained overload; 4 levels; a
//! partition count change mid-run; batching; a consumer that never acks; cold start; and the
//! growth table (`growth-keys`, `growth-keys-even`: keyed messages, the layout kinds and key
//! options, see `growth`). For each
//! it prints Markdown tables of per-level latency p50/p99, bypass count, inversion ratio,
//! longest starvation gap and delivered share under overload (see `metrics`).
//!
//! Run it with `cargo run --release -p bench-tools --bin priority_sim` (all scenarios, full
//! size), optionally followed by scenario names to run only those, and `--quick` for the
//! smaller test-size scenarios. The acceptance checks are the tests of this binary:
//! `cargo test -p bench-tools --bin priority_sim`.

#[cfg(test)]
mod acceptance;
mod growth;
mod metrics;
mod model;
mod replica;
mod rng;
mod scenarios;
mod sim;
mod strategies;
mod table;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// The names of the growth table's scenarios (see `growth`).
const GROWTH: [&str; 2] = ["growth-keys", "growth-keys-even"];

/// A deterministic simulator of message priority on a partitioned Pulsar topic.
#[derive(Debug, Parser)]
#[command(name = "priority_sim", args_override_self = true)]
struct Args {
    /// The smaller test-size scenarios.
    #[arg(long)]
    quick: bool,
    /// The scenarios to run (all by default).
    #[arg(value_name = "SCENARIO")]
    names: Vec<String>,
}

fn main() -> ExitCode {
    let Args { quick, names } = Args::parse();
    let shrink = if quick {
        scenarios::TEST
    } else {
        scenarios::FULL
    };
    let all = scenarios::all(shrink);
    if let Some(unknown) = names
        .iter()
        .find(|n| !GROWTH.contains(&n.as_str()) && !all.iter().any(|s| s.name == n.as_str()))
    {
        let known: Vec<_> = all.iter().map(|s| s.name).chain(GROWTH).collect();
        Args::command()
            .error(
                clap::error::ErrorKind::InvalidValue,
                format!("unknown scenario {unknown:?}; known: {}", known.join(", ")),
            )
            .exit();
    }
    for scenario in all
        .iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name))
    {
        let mut reports = Vec::new();
        let mut specs = strategies::all();
        if scenario.growth.is_some() {
            specs.push(strategies::explicit_layout());
        }
        for strategy in specs {
            match sim::run(scenario, &strategy) {
                Ok(report) => reports.push(report),
                Err(e) => {
                    eprintln!("{} / {}: {e}", scenario.name, strategy.name);
                    return ExitCode::FAILURE;
                }
            }
        }
        println!("{}", table::render(scenario, &reports));
    }
    for s in growth::scenarios(shrink)
        .iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name))
    {
        let mut reports = Vec::new();
        for row in growth::rows() {
            match growth::run(s, &row) {
                Ok(report) => reports.push(report),
                Err(e) => {
                    eprintln!("{}: {e}", s.name);
                    return ExitCode::FAILURE;
                }
            }
        }
        println!("{}", growth::render(s, &reports));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod args_tests {
    use super::*;

    #[test]
    fn quick_and_scenario_names_parse_in_any_order() {
        let args = Args::try_parse_from(["priority_sim", "growth-keys", "--quick"]).unwrap();
        assert!(args.quick);
        assert_eq!(args.names, ["growth-keys"]);
        let args = Args::try_parse_from(["priority_sim"]).unwrap();
        assert!(!args.quick && args.names.is_empty());
        assert!(Args::try_parse_from(["priority_sim", "--fast"]).is_err());
    }
}
