//! A tour of the workspace's three capabilities on the embedded emulators, in well under a
//! minute, with a short table for each:
//!
//! 1. **Batched acknowledgements** (`ack-batcher` in `rocketmq-grpc`): the same messages
//!    consumed from the RocketMQ proxy emulator twice, acknowledged one `AckMessage` RPC per
//!    message (what the official clients send) and batched per (endpoint, topic).
//! 2. **Batch-size-preserving acks** (`txn-ack` in `pulsar-wire`): batches of 3 acknowledged in
//!    transactions on the Pulsar broker emulator with a limit of 20 unacknowledged messages,
//!    once with the legacy whole-entry ack that drops `batch_size` (pulsar-client-go#1534) and
//!    once with ours. The legacy client stalls the Shared consumer; ours drains.
//! 3. **Priority consumption** (`mq-priority` in `pulsar-wire`): urgent messages queued behind
//!    a low-priority backlog on a 4-partition topic, drained without priority and with
//!    `PriorityRouter` + `PriorityConsumer`.
//!
//! ```text
//! cargo run --release -p examples --bin tour
//! ```
//!
//! The exit code is 1 when a capability does not show what the table's heading claims (CI
//! runs the tour). Each capability has its own, longer example: `rocketmq_push_consumer`,
//! `pulsar_stall` and `pulsar_priority`, which also run against real brokers.

mod acks;
mod priority;
mod stall;
mod table;

use std::process::ExitCode;
use std::time::Instant;

#[tokio::main]
async fn main() -> ExitCode {
    let started = Instant::now();
    let mut held = true;
    let sections: [(&str, fn() -> section::Future); 3] = [
        (
            "1. batched acknowledgements (RocketMQ proxy emulator)",
            || Box::pin(acks::run()),
        ),
        (
            "2. transactional acks and the Shared-consumer stall (Pulsar emulator)",
            || Box::pin(stall::run()),
        ),
        ("3. priority consumption (Pulsar emulator)", || {
            Box::pin(priority::run())
        }),
    ];
    for (title, run) in sections {
        println!("\n{title}");
        match run().await {
            Ok(claim_holds) => held &= claim_holds,
            Err(error) => {
                println!("  failed: {error}");
                held = false;
            }
        }
    }
    println!("\ntour finished in {:.1?}", started.elapsed());
    if held {
        ExitCode::SUCCESS
    } else {
        println!("a capability did not show what it claims (see above)");
        ExitCode::FAILURE
    }
}

/// What a section returns: whether its claim held, or why it could not run.
mod section {
    use std::pin::Pin;

    /// A section's run.
    pub(crate) type Future = Pin<Box<dyn std::future::Future<Output = Result<bool, String>>>>;
}
