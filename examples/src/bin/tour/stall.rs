//! Capability 2: transactional acks of batches under a limit of unacknowledged messages.

use std::time::Duration;

use pulsar_wire::{
    BatchingOptions, Client, Consumer, Error, InitialPosition, OutgoingMessage, Producer, SubType,
};
use pulsar_wire_emulator::legacy::txn_ack_without_batch_size;
use pulsar_wire_emulator::{Emulator, EmulatorConfig};

use crate::table;

const LIMIT: u32 = 20;
const PER_BATCH: usize = 3;
const BATCHES: usize = 20;
const SUBSCRIPTION: &str = "tour";

struct Outcome {
    delivered: usize,
    unacked: i64,
    blocked: bool,
}

/// What the Go client v0.21.0 sends for a completed batch in a transaction: one whole-entry
/// ack with the transaction's bits, but no `batch_size` (built from raw frames; `pulsar-wire`
/// Sends [`BATCHES`] batches of [`PER_BATCH`], each received and acknowledged in its own
/// committed transaction, until one is not delivered within a second.
async fn stream(emulator: &Emulator, legacy: bool) -> Result<Outcome, Error> {
    let topic = format!(
        "persistent://public/default/tour-stall-{}",
        if legacy { "legacy" } else { "ours" }
    );
    emulator.create_topic(&topic, 0)?;
    emulator.set_max_unacked_messages(&topic, LIMIT)?;
    let client = Client::builder(emulator.endpoint()).build().await?;
    let consumer = Consumer::builder(&client, &topic, SUBSCRIPTION)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        // The legacy client of the issue does not ask the broker to unblock it either.
        .legacy_committed_redeliveries(legacy)
        .build()
        .await?;
    let batching = BatchingOptions::default()
        .max_messages(PER_BATCH)
        .max_delay(Duration::from_millis(200));
    let producer = Producer::builder(&client, &topic)
        .transactional(true)
        .batching(batching)
        .build()
        .await?;
    let coordinator = client.transaction_coordinator().await?;
    let mut delivered = 0;
    'batches: for batch in 0..BATCHES {
        let sends =
            (0..PER_BATCH).map(|i| producer.send(OutgoingMessage::new(format!("{batch}.{i}"))));
        for sent in futures_util::future::join_all(sends).await {
            sent?;
        }
        let mut messages = Vec::with_capacity(PER_BATCH);
        while messages.len() < PER_BATCH {
            match tokio::time::timeout(Duration::from_secs(1), consumer.receive()).await {
                Ok(message) => messages.push(message?),
                Err(_) => break 'batches,
            }
        }
        let txn = coordinator.new_transaction(Duration::from_secs(60)).await?;
        if legacy {
            txn_ack_without_batch_size(&consumer, &txn, &messages[PER_BATCH - 1]).await?;
        } else {
            for message in &messages {
                consumer.ack_in(&txn, message).await?;
            }
        }
        txn.commit().await?;
        delivered += 1;
    }
    let stats = emulator.stats();
    let (unacked, blocked) = stats
        .subscription(&topic, SUBSCRIPTION)
        .and_then(|s| s.consumers.first().map(|c| (c.unacked, c.blocked)))
        .unwrap_or((-1, false));
    consumer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    producer.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE).await?;
    client.close().await;
    Ok(Outcome {
        delivered,
        unacked,
        blocked,
    })
}

/// Runs the legacy client and ours; the claim is that the legacy one stalls and ours drains.
pub(crate) async fn run() -> Result<bool, String> {
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .map_err(|e| format!("emulator: {e}"))?;
    let legacy = stream(&emulator, true)
        .await
        .map_err(|e| format!("legacy: {e}"))?;
    let ours = stream(&emulator, false)
        .await
        .map_err(|e| format!("ours: {e}"))?;
    let row = |name: &str, o: &Outcome| {
        vec![
            name.to_owned(),
            format!("{} of {BATCHES}", o.delivered),
            o.unacked.to_string(),
            o.blocked.to_string(),
            if o.delivered == BATCHES && o.unacked == 0 {
                "drained".to_owned()
            } else {
                "stalled for good".to_owned()
            },
        ]
    };
    println!(
        "  batches of {PER_BATCH}, each acked in a committed transaction; the broker blocks a \
         consumer at {LIMIT} unacked and resumes it at {}",
        LIMIT / 2
    );
    table::print(
        &[
            "transactional acks",
            "batches delivered",
            "unacked",
            "blocked",
            "outcome",
        ],
        &[
            row("legacy: whole entry, no batch_size", &legacy),
            row("ours: per message, batch_size kept", &ours),
        ],
    );
    Ok(legacy.delivered < BATCHES
        && ours.delivered == BATCHES
        && ours.unacked == 0
        && !ours.blocked)
}
