//! Commands the emulator does not model, and the one it models minimally
//! (GET_LAST_MESSAGE_ID).
//!
//! A client waiting for an answer the emulator never sends waits out its operation timeout,
//! so every command that carries a `request_id` gets an answer at once: a `CommandError` with
//! `NotAllowedError` naming the command ("the pulsar-wire emulator does not implement CONSUMER_STATS").
//! Commands without a request id have no error reply in the protocol: they are logged and
//! counted in [`Stats::unmodelled_commands`](crate::Stats::unmodelled_commands), and
//! the connection stays open. A `type` number the proto subset does not know is treated the
//! same way (its body cannot be read, so there is no request id to answer).

use super::Broker;
use crate::entries::Visibility;
use crate::outgoing::command;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::{
    CommandGetLastMessageId, CommandGetLastMessageIdResponse, MessageIdData, ServerError,
};

/// The `entryId` of "no entry" (`-1` as the broker writes it into a `uint64`).
const NO_ENTRY: u64 = u64::MAX;

impl Broker {
    /// Answers an unmodelled command that carries `request_id` with `NotAllowedError`.
    pub(super) fn not_implemented(&mut self, conn: u64, kind: Type, request_id: u64) {
        *self.unmodelled.entry(kind as i32).or_default() += 1;
        let name = kind.as_str_name();
        tracing::debug!(
            conn,
            command = name,
            request_id,
            "refusing an unmodelled command"
        );
        self.error(
            conn,
            request_id,
            (
                ServerError::NotAllowedError,
                format!("the pulsar-wire emulator does not implement {name}"),
            ),
        );
    }

    /// Logs an unmodelled command that has no request id to answer (`ty`: its type number,
    /// known to the proto subset or not).
    pub(super) fn ignore_unmodelled(&mut self, conn: u64, ty: i32, why: &str) {
        *self.unmodelled.entry(ty).or_default() += 1;
        let name = Type::try_from(ty).map_or("an unknown type", |t| t.as_str_name());
        tracing::warn!(
            conn,
            command = ty,
            name,
            why,
            "ignoring a command the emulator does not model"
        );
    }

    /// GET_LAST_MESSAGE_ID: the last readable entry of the consumer's topic (before the first
    /// entry of an open transaction, as the broker's max read position; aborted entries are
    /// never read, so they are not reported), with the largest batch index when the entry is
    /// a batch, and the subscription's mark-delete position. An empty topic reports entry
    /// `-1`.
    pub(super) fn on_get_last_message_id(&mut self, conn: u64, body: &CommandGetLastMessageId) {
        let Some(r) = self.consumers.get(&(conn, body.consumer_id)) else {
            return self.error(
                conn,
                body.request_id,
                (
                    ServerError::ConsumerNotFound,
                    format!("consumer {} is not connected", body.consumer_id),
                ),
            );
        };
        let Some(topic) = self.topics.get(&r.topic) else {
            return self.error(
                conn,
                body.request_id,
                (
                    ServerError::TopicNotFound,
                    format!("topic {} is gone", r.topic),
                ),
            );
        };
        let readable = topic
            .entries
            .iter()
            .position(|e| matches!(e.visibility, Visibility::Pending(_)))
            .unwrap_or(topic.entries.len());
        let last = topic.entries[..readable]
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| e.visibility == Visibility::Visible);
        let id = |entry_id: u64, batch_index: Option<i32>| MessageIdData {
            ledger_id: topic.ledger_id,
            entry_id,
            partition: Some(topic.partition),
            batch_index,
            ..MessageIdData::default()
        };
        let last_message_id = match last {
            Some((index, entry)) => id(
                index as u64,
                entry
                    .metadata
                    .num_messages_in_batch
                    .map(|n| n.saturating_sub(1)),
            ),
            None => id(NO_ENTRY, None),
        };
        let mark_delete = topic
            .subscriptions
            .get(&r.subscription)
            .map(|s| id(s.mark_delete_position().unwrap_or(NO_ENTRY), None));
        let mut answer = command(Type::GetLastMessageIdResponse);
        answer.get_last_message_id_response = Some(CommandGetLastMessageIdResponse {
            last_message_id,
            request_id: body.request_id,
            consumer_mark_delete_position: mark_delete,
        });
        self.reply(conn, answer);
    }
}
