//! The embedded Pulsar broker emulator as a separate process, for trying a client (the Java or
//! Python client, `pulsar-client`) against it by hand.
//!
//! ```sh
//! cargo run -p examples --bin pulsar_emulator -- --port 6660 --batch-index-ack
//! ```
//!
//! prints `endpoint=pulsar://127.0.0.1:6660` on stdout once it accepts connections, and serves
//! until SIGTERM, ctrl-c, a `quit` line on stdin or the end of stdin (so a parent that dies
//! takes it along; pass `--ignore-stdin` when starting it in the background with no stdin).
//! On exit it prints the frames received per command type and the commands it does not model
//! as `key=value` lines ending with a line `end`.
//!
//! Flags: `--port P` (0 = any free port, the default), `--batch-index-ack` (the broker's
//! `acknowledgmentAtBatchIndexLevelEnabled`), `--ignore-stdin`.

use std::io::BufRead as _;
use std::process::ExitCode;

use clap::Parser;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire_emulator::{Emulator, EmulatorConfig, Stats};
use tokio::sync::mpsc;

/// The embedded Pulsar broker emulator as a separate process.
#[derive(Debug, Parser)]
#[command(name = "pulsar_emulator", args_override_self = true)]
struct Options {
    /// The port (0 = any free port).
    #[arg(long, value_name = "P", default_value_t = 0)]
    port: u16,
    /// The broker's `acknowledgmentAtBatchIndexLevelEnabled`.
    #[arg(long)]
    batch_index_ack: bool,
    /// Do not read stdin (for a background process with no stdin).
    #[arg(long)]
    ignore_stdin: bool,
}

fn name(ty: i32) -> String {
    Type::try_from(ty).map_or_else(|_| format!("type_{ty}"), |t| t.as_str_name().to_lowercase())
}

fn report(stats: &Stats) {
    for (ty, count) in &stats.commands_received {
        println!("received.{}={count}", name(*ty));
    }
    for (ty, count) in &stats.unmodelled_commands {
        println!("unmodelled.{}={count}", name(*ty));
    }
    println!("end");
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = Options::parse();
    let config = EmulatorConfig::default()
        .port(options.port)
        .batch_index_ack(options.batch_index_ack);
    let emulator = match Emulator::start(config).await {
        Ok(emulator) => emulator,
        Err(error) => {
            eprintln!("the emulator did not start: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("endpoint={}", emulator.endpoint());
    let (quit_tx, mut quit_rx) = mpsc::unbounded_channel::<()>();
    if !options.ignore_stdin {
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(line) if line.trim() == "quit" => break,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let _ = quit_tx.send(());
        });
    } else {
        // Keep the sender so that the channel stays open.
        std::mem::forget(quit_tx);
    }
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                eprintln!("cannot listen for SIGTERM: {error}");
                return ExitCode::FAILURE;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        _ = quit_rx.recv() => {}
    }
    report(&emulator.stats());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_lines_of_the_docs_and_of_the_python_check_parse() {
        let parse = |a: &[&str]| Options::try_parse_from(["pulsar_emulator"].iter().chain(a));
        let o = parse(&["--port", "6660", "--batch-index-ack"]).unwrap();
        assert_eq!(
            (o.port, o.batch_index_ack, o.ignore_stdin),
            (6660, true, false)
        );
        // scripts/python-peers/emulator_check.py
        let o = parse(&["--port", "0", "--ignore-stdin"]).unwrap();
        assert_eq!(
            (o.port, o.batch_index_ack, o.ignore_stdin),
            (0, false, true)
        );
        assert!(parse(&["--port", "x"]).is_err());
    }
}
