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

use pulsar_wire::pb::base_command::Type;
use pulsar_wire_emulator::{Emulator, EmulatorConfig, Stats};
use tokio::sync::mpsc;

const USAGE: &str = "usage: pulsar_emulator [--port P] [--batch-index-ack] [--ignore-stdin]";

#[derive(Debug)]
struct Options {
    port: u16,
    batch_index_ack: bool,
    ignore_stdin: bool,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        port: 0,
        batch_index_ack: false,
        ignore_stdin: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--port" => {
                let value = args.next().ok_or("--port needs a value")?;
                options.port = value
                    .parse()
                    .map_err(|_| format!("--port needs a number, not {value:?}"))?;
            }
            "--batch-index-ack" => options.batch_index_ack = true,
            "--ignore-stdin" => options.ignore_stdin = true,
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(options)
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
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("{message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
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
