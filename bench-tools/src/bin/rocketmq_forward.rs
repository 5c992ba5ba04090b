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

use clap::Parser;

/// A counting gRPC forwarder in front of a RocketMQ proxy; runs until killed.
#[derive(Debug, Parser)]
#[command(name = "rocketmq_forward", args_override_self = true)]
struct Args {
    /// The proxy's gRPC endpoint.
    #[arg(long, value_name = "IP:PORT")]
    upstream: SocketAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let upstream = Args::parse().upstream;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_of_the_restart_script_parses() {
        // scripts/bench-rocketmq-restart.sh
        let args = Args::try_parse_from(["rocketmq_forward", "--upstream", "127.0.0.1:8081"]);
        assert_eq!(args.unwrap().upstream, "127.0.0.1:8081".parse().unwrap());
        assert!(Args::try_parse_from(["rocketmq_forward", "--upstream", "localhost"]).is_err());
        assert!(Args::try_parse_from(["rocketmq_forward"]).is_err());
    }
}
