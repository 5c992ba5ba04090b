//! A counting gRPC forwarder in front of a RocketMQ proxy, for benchmarks that compare
//! clients request by request (`scripts/bench-rocketmq-restart.sh`). It outlives proxy
//! restarts: requests made while the proxy is down are answered `UNAVAILABLE` and counted.
//!
//! ```text
//! cargo run --release -p bench-tools --bin rocketmq_forward -- --upstream 127.0.0.1:8081
//! ```
//!
//! It prints `listening HOST:PORT` (point the client there), then once a second
//! `counts MS METHOD=N ... ack_entries=N unavailable=N`: the Unix time in milliseconds and the
//! requests per gRPC method so far, the `AckMessage` entries so far, and how many requests
//! were answered `UNAVAILABLE`. It runs until killed.

// Shared with peer_compare, which uses the whole module.
#[allow(dead_code)]
#[path = "peer_compare/grpc_count.rs"]
mod grpc_count;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let upstream: Option<SocketAddr> = match (args.next().as_deref(), args.next()) {
        (Some("--upstream"), Some(address)) => address.parse().ok(),
        _ => None,
    };
    let Some(upstream) = upstream else {
        eprintln!("usage: rocketmq_forward --upstream IP:PORT");
        return ExitCode::from(2);
    };
    let (address, counts) = match grpc_count::start(upstream).await {
        Ok(started) => started,
        Err(error) => {
            eprintln!("cannot listen: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening {address}");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let counts = counts.lock().clone();
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut line = format!("counts {ms}");
        for (method, n) in &counts.requests {
            line.push_str(&format!(" {method}={n}"));
        }
        let unavailable: u64 = counts.unavailable.values().sum();
        line.push_str(&format!(
            " ack_entries={} unavailable={unavailable}",
            counts.ack_entries
        ));
        println!("{line}");
    }
}
