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

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use pulsar_wire::{
    BatchingOptions, Client, ConnectOptions, ConsumerOptions, InitialPosition, OutgoingMessage,
    ProducerOptions, SubType,
};

struct Args {
    service_url: String,
    topic: String,
    rate: u32,
    seconds: u64,
    patience: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut service_url = None;
    let mut topic = None;
    let (mut rate, mut seconds, mut patience) = (20u32, 40u64, 60u64);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |flag: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{flag} takes a number"))
        };
        match arg.as_str() {
            "--service-url" => service_url = it.next(),
            "--topic" => topic = it.next(),
            "--rate" => rate = u32::try_from(number("--rate")?.max(1)).unwrap_or(u32::MAX),
            "--seconds" => seconds = number("--seconds")?,
            "--patience" => patience = number("--patience")?,
            "-h" | "--help" => {
                return Err(
                    "usage: pulsar_restart_stream --service-url pulsar://HOST:6650 \
                     --topic TOPIC [--rate N] [--seconds N] [--patience N]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(Args {
        service_url: service_url.ok_or("--service-url is required")?,
        topic: topic.ok_or("--topic is required")?,
        rate,
        seconds,
        patience,
    })
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

async fn run(args: Args) -> Result<(), pulsar_wire::Error> {
    let client = Client::connect(ConnectOptions::new(&args.service_url)?).await?;
    let consumer = client
        .subscribe(
            &args.topic,
            "restart",
            ConsumerOptions::default()
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest),
        )
        .await?;
    let producer = client
        .create_producer(
            &args.topic,
            ProducerOptions::default().batching(
                BatchingOptions::default()
                    .max_messages(10)
                    .max_delay(Duration::from_millis(20)),
            ),
        )
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
            let _ = producer.close().await;
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
    let _ = consumer.close().await;
    println!("done");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pulsar_restart_stream: {error}");
            ExitCode::FAILURE
        }
    }
}
