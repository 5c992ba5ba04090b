//! One side of the restart benchmark (`scripts/bench-restart.sh`): a batching producer and a
//! Shared consumer on one topic, streaming at a fixed rate while the broker is restarted
//! under them. Nothing in here reconnects anything: that is the client's job.
//!
//! ```text
//! cargo run --release -p bench-tools --bin pulsar_restart_stream -- \
//!     --service-url pulsar://127.0.0.1:6650 --topic persistent://public/default/t \
//!     [--rate 20] [--seconds 40] [--patience 60]
//! ```
//!
//! It prints one line per event, with the Unix time in milliseconds: `sent MS PAYLOAD` when a
//! send has its receipt, `send-error MS PAYLOAD ERROR`, `recv MS PAYLOAD` for every delivery
//! (each is acknowledged), `recv-error MS ERROR`, and `done` once every sent payload arrived or
//! the patience ran out after the last send. The script reads the same lines from the Java
//! and Python peers.

use clap::Parser;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use pulsar_wire::{
    BatchingOptions, Client, Consumer, InitialPosition, OutgoingMessage, Producer, SubType,
};

/// A batching producer and a Shared consumer streaming on one topic while the broker restarts.
#[derive(Debug, Parser)]
#[command(name = "pulsar_restart_stream", args_override_self = true)]
struct Args {
    /// The broker's binary-protocol URL.
    #[arg(long, value_name = "pulsar://HOST:6650")]
    service_url: String,
    /// The topic.
    #[arg(long, value_name = "TOPIC")]
    topic: String,
    /// Messages sent per second.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Seconds of sending.
    #[arg(long, value_name = "N", default_value_t = 40)]
    seconds: u64,
    /// Seconds to wait for the last deliveries after the last send.
    #[arg(long, value_name = "N", default_value_t = 60)]
    patience: u64,
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

async fn run(args: Args) -> Result<(), pulsar_wire::Error> {
    let client = Client::builder(&args.service_url).build().await?;
    let consumer = Consumer::builder(&client, &args.topic, "restart")
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await?;
    let producer = Producer::builder(&client, &args.topic)
        .batching(
            BatchingOptions::default()
                .max_messages(10)
                .max_delay(Duration::from_millis(20)),
        )
        .build()
        .await?;
    println!("ready");
    let sent = Arc::new(Mutex::new(HashSet::new()));
    let total = u64::from(args.rate) * args.seconds;
    let every = Duration::from_secs(1) / args.rate;
    let started = Instant::now();
    let producing = tokio::spawn({
        let sent = Arc::clone(&sent);
        async move {
            let mut sends = Vec::new();
            for i in 0..total {
                tokio::time::sleep_until((started + every * i as u32).into()).await;
                let producer = producer.clone();
                let sent = Arc::clone(&sent);
                sends.push(tokio::spawn(async move {
                    let payload = format!("m{i}");
                    match producer.send(OutgoingMessage::new(payload.clone())).await {
                        Ok(_) => {
                            println!("sent {} {payload}", now_ms());
                            sent.lock().insert(payload);
                        }
                        Err(error) => println!("send-error {} {payload} {error}", now_ms()),
                    }
                }));
            }
            for send in sends {
                let _ = send.await;
            }
            let _ = producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
        }
    });
    let mut seen = HashSet::new();
    let deadline = started + Duration::from_secs(args.seconds + args.patience);
    loop {
        if producing.is_finished() && sent.lock().iter().all(|p| seen.contains(p)) {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), consumer.receive()).await {
            Err(_) => {}
            Ok(Ok(message)) => {
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                println!("recv {} {payload}", now_ms());
                seen.insert(payload);
                let _ = consumer.ack(&message).await;
            }
            Ok(Err(error)) => {
                println!("recv-error {} {error}", now_ms());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let _ = producing.await;
    consumer.flush_acks().await;
    let _ = consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await;
    println!("done");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pulsar_restart_stream: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_of_the_restart_script_parses() {
        // scripts/bench-restart.sh
        let args = Args::try_parse_from([
            "pulsar_restart_stream",
            "--service-url",
            "pulsar://127.0.0.1:6650",
            "--topic",
            "persistent://public/default/t",
            "--rate",
            "20",
            "--seconds",
            "40",
            "--patience",
            "60",
        ])
        .unwrap();
        assert_eq!(args.service_url, "pulsar://127.0.0.1:6650");
        assert_eq!(args.topic, "persistent://public/default/t");
        assert_eq!((args.rate, args.seconds, args.patience), (20, 40, 60));
        let args = Args::try_parse_from([
            "pulsar_restart_stream",
            "--service-url",
            "u",
            "--topic",
            "t",
        ])
        .unwrap();
        assert_eq!((args.rate, args.seconds, args.patience), (20, 40, 60));
        assert!(Args::try_parse_from(["pulsar_restart_stream", "--topic", "t"]).is_err());
    }
}
