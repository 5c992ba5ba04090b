//! What other clients send that `pulsar-wire` never does, built from raw frames, so that
//! tests and examples can show what it does to this emulator or to a real broker. These
//! calls go past the consumer's own bookkeeping: use them only to reproduce another
//! client's behaviour.

use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{self, command_ack::AckType};
use pulsar_wire::wire::{ConnectionExt, ConsumerExt, command_frame};
use pulsar_wire::{Consumer, Error, Message, Transaction};

/// The transactional ack the Go client v0.21.0 sends for a completed batch
/// (pulsar-client-go#1534): one whole-entry ack of `last`'s entry with the transaction's bits
/// and a request id, but **no `batch_size`**. A 4.0.x broker takes 1 off the consumer's
/// unacked count for it instead of the batch's size.
///
/// It first adds the subscription to the transaction, as the Go client does.
///
/// # Errors
/// What the broker or the connection answered, as [`Error`].
pub async fn txn_ack_without_batch_size(
    consumer: &Consumer,
    txn: &Transaction,
    last: &Message,
) -> Result<(), Error> {
    let id = pb::MessageIdData {
        ledger_id: last.position().ledger_id(),
        entry_id: last.position().entry_id(),
        ..pb::MessageIdData::default()
    };
    raw_txn_ack(consumer, txn, last, id).await
}

/// The transactional ack of one message as the Java client sends it (an independent set and
/// the batch size, from `txn_ack::txn_ack`), put on the wire raw, past the consumer's own
/// bookkeeping: what another client of the subscription does, which this consumer cannot see.
///
/// It first adds the subscription to the transaction.
///
/// # Errors
/// What the broker or the connection answered, as [`Error`]; [`Error::Ack`] for a position
/// `txn_ack` refuses.
pub async fn txn_ack_with_batch_size(
    consumer: &Consumer,
    txn: &Transaction,
    message: &Message,
) -> Result<(), Error> {
    let ack = txn_ack::txn_ack(txn.id(), txn_ack::AckKind::Individual, message.position())?;
    let id = pb::MessageIdData {
        ledger_id: ack.id.entry().ledger_id,
        entry_id: ack.id.entry().entry_id,
        partition: (ack.id.partition() >= 0).then_some(ack.id.partition()),
        batch_index: (ack.id.batch_index() >= 0).then_some(ack.id.batch_index()),
        ack_set: ack.id.wire_ack_set().collect(),
        batch_size: ack
            .id
            .batch_size()
            .and_then(|size| i32::try_from(size).ok()),
    };
    raw_txn_ack(consumer, txn, message, id).await
}

/// Adds the subscription to `txn`, then sends a transactional `ACK` of `id` (of `message`'s
/// entry) raw on `message`'s consumer and waits for the answer.
async fn raw_txn_ack(
    consumer: &Consumer,
    txn: &Transaction,
    message: &Message,
    id: pb::MessageIdData,
) -> Result<(), Error> {
    txn.add_subscription(message.topic(), consumer.subscription())
        .await?;
    let (connection, consumer_id) = consumer.wire_of(message)?;
    let txn_id = txn.id();
    connection
        .request("ACK", |request_id| {
            command_frame(Type::Ack, |c| {
                c.ack = Some(pb::CommandAck {
                    consumer_id,
                    ack_type: AckType::Individual as i32,
                    message_id: vec![id],
                    txnid_least_bits: Some(txn_id.least_bits),
                    txnid_most_bits: Some(txn_id.most_bits),
                    request_id: Some(request_id),
                    ..pb::CommandAck::default()
                });
            })
        })
        .await
        .map(drop)
}
