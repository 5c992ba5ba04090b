//! The frame of a transactional ack.

use txn_ack::{AckKind, TxnAck};

use crate::id::wire_id;
use crate::pb;
use crate::pb::base_command::Type;
use crate::pb::command_ack::AckType;
use crate::{Frame, command_frame};

/// The `CommandAck` of a transactional ack: the transaction's bits, a request id (the broker
/// answers `ACK_RESPONSE`), one id with its independent set and batch size.
pub(crate) fn txn_ack_frame(consumer_id: u64, ack: &TxnAck, request_id: u64) -> Frame {
    command_frame(Type::Ack, |c| {
        c.ack = Some(pb::CommandAck {
            consumer_id,
            ack_type: match ack.kind {
                AckKind::Individual => AckType::Individual,
                AckKind::Cumulative => AckType::Cumulative,
            } as i32,
            message_id: vec![wire_id(&ack.id)],
            txnid_least_bits: Some(ack.txn.least_bits),
            txnid_most_bits: Some(ack.txn.most_bits),
            request_id: Some(request_id),
            ..pb::CommandAck::default()
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use txn_ack::{MessagePosition, TxnAckTracker, TxnId};

    fn at(entry: u64, index: i32, size: i32) -> MessagePosition {
        MessagePosition::in_batch(3, entry, -1, index, size).unwrap()
    }

    #[test]
    fn txn_acks_carry_the_bits_the_batch_size_and_a_request_id() {
        let txn = TxnId {
            most_bits: 1,
            least_bits: 2,
        };
        let mut tracker = TxnAckTracker::default();
        for index in 0..3 {
            let ack = tracker
                .ack(txn, AckKind::Individual, &at(4, index, 3))
                .unwrap();
            let frame = txn_ack_frame(8, &ack, 99);
            let command = frame.command.ack.unwrap();
            assert_eq!(command.txnid_most_bits, Some(1));
            assert_eq!(command.txnid_least_bits, Some(2));
            assert_eq!(command.request_id, Some(99));
            assert_eq!(command.message_id.len(), 1);
            let id = &command.message_id[0];
            assert_eq!(id.batch_size, Some(3), "the last index too");
            assert_eq!(id.ack_set, [0b111 & !(1 << index)], "independent sets");
        }
    }
}
