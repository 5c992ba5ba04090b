//! The official Python client (`pulsar-client` from PyPI, a C++ client underneath) against the
//! embedded broker emulator: a reader from the earliest message, `get_last_message_id`, and
//! `seek` to the earliest, to an id and to a time, each answered at once and followed by the
//! messages it must deliver (`scripts/python-peers/emulator_check.py`).
//!
//! Needs Python and PyPI: runs when `PULSAR_PYTHON_PEERS` is set (scripts/test-real-brokers
//! sets it), and is skipped otherwise.

use pulsar_wire_emulator::{Emulator, EmulatorConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_gets_an_answer_from_the_emulator_at_once() {
    if std::env::var_os("PULSAR_PYTHON_PEERS").is_none() {
        eprintln!("PULSAR_PYTHON_PEERS is not set; skipping");
        return;
    }
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .expect("the emulator starts");
    let run = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/python-peers/run");
    let output = tokio::process::Command::new(run)
        .args(["emulator_check", "--url", emulator.endpoint()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {run}: {e}"));
    let printed = String::from_utf8_lossy(&output.stdout);
    println!("{printed}");
    assert!(output.status.success(), "emulator_check failed: {printed}");
    assert!(printed.contains("all checks finished at once"), "{printed}");
    assert!(
        printed.contains("reader from earliest: 3 messages: ok"),
        "{printed}"
    );
    for check in [
        "consumer.seek(earliest): ok",
        "after seek(earliest): m0 again: ok",
        "after seek(id of m0): m1: ok",
        "after seek(publish time of m1): from m1: ok",
    ] {
        assert!(printed.contains(check), "{check}: {printed}");
    }
    // Every command of the check is modelled.
    let stats = emulator.stats();
    assert!(
        stats.unmodelled_commands.is_empty(),
        "{:?}",
        stats.unmodelled_commands
    );
}
