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
//! 3. **Priority consumption** (`mq-priority` in `pulsar-wire` and `rocketmq-grpc`): urgent
//!    messages queued behind a low-priority backlog on a 4-partition topic, drained without
//!    priority and with `PriorityRouter` + `PriorityConsumer`; then the same on the RocketMQ
//!    proxy emulator, one topic against level topics (`PriorityTopics`) and a push consumer
//!    with the priority gate.
//!
//! ```text
//! cargo run --release -p examples --bin tour
//! ```
//!
//! The exit code is 1 when a capability does not show what the table's heading claims (CI
//! runs the tour). Each capability has its own, longer example: `rocketmq_push_consumer`,
//! `pulsar_stall`, `pulsar_priority` and `rocketmq_priority`, which also run against real brokers.

mod acks;
mod priority;
mod priority_rocketmq;
mod stall;
mod table;

use std::process::ExitCode;
use std::time::Instant;

#[tokio::main]
async fn main() -> ExitCode {
    let started = Instant::now();
    println!("\n1. batched acknowledgements (RocketMQ proxy emulator)");
    let mut held = holds(acks::run().await);
    println!("\n2. transactional acks and the Shared-consumer stall (Pulsar emulator)");
    held &= holds(stall::run().await);
    println!("\n3. priority consumption (Pulsar and RocketMQ emulators)");
    held &= holds(priority::run().await);
    println!("\ntour finished in {:.1?}", started.elapsed());
    if held {
        ExitCode::SUCCESS
    } else {
        println!("a capability did not show what it claims (see above)");
        ExitCode::FAILURE
    }
}

/// Whether a section's claim held; a section that could not run says why.
fn holds(outcome: Result<bool, String>) -> bool {
    outcome.unwrap_or_else(|error| {
        println!("  failed: {error}");
        false
    })
}
