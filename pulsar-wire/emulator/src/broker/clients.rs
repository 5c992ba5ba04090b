//! Producers, consumers, acks and the end of transactions.

use std::collections::BTreeSet;

use txn_ack::TxnId;
use txn_ack::model::ModelConfig;

use super::{Broker, ConsumerRef, ProducerInfo, Refusal, SubRef, txn_of};
use crate::dispatch::{Consumer, KeySharedPolicy, Subscription};
use crate::entries::{StoredEntry, Visibility};
use crate::names::normalize;
use crate::outgoing::command;
use crate::schemas::Declarer;
use pulsar_wire::MAX_BATCH_MESSAGES;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_subscribe::{InitialPosition, SubType};
use pulsar_wire::pb::{
    CommandAck, CommandAckResponse, CommandProducer, CommandProducerSuccess, CommandSend,
    CommandSendError, CommandSendReceipt, CommandSubscribe, MessageIdData, ServerError,
};
use pulsar_wire::wire::Payload;

impl Broker {
    // ----- producers -----------------------------------------------------------------------

    pub(super) fn on_producer(&mut self, conn: u64, body: CommandProducer) {
        if let Some(existing) = self.producers.get(&(conn, body.producer_id)) {
            // A retried PRODUCER for the same producer succeeds again.
            if normalize(&body.topic).is_ok_and(|t| t == existing.topic) {
                let name = existing.name.clone();
                let version = existing.schema_version.clone();
                self.producer_success(conn, body.request_id, name, version);
            } else {
                self.error(
                    conn,
                    body.request_id,
                    (
                        ServerError::ProducerBusy,
                        format!(
                            "producer id {} is in use on this connection",
                            body.producer_id
                        ),
                    ),
                );
            }
            return;
        }
        let topic = match self.resolve_topic(&body.topic, true) {
            Ok(topic) => topic,
            Err(refusal) => return self.error(conn, body.request_id, refusal),
        };
        let schema_version =
            match self
                .schemas
                .declare(&topic, body.schema.as_ref(), Declarer::Producer)
            {
                Ok(version) => version,
                Err(refusal) => return self.error(conn, body.request_id, refusal),
            };
        let name = match body.producer_name.filter(|n| !n.is_empty()) {
            Some(name) => name,
            None => {
                self.next_key += 1;
                format!("emulator-{conn}-{}", self.next_key)
            }
        };
        let Some(t) = self.topics.get_mut(&topic) else {
            return;
        };
        if !t.producers.insert(name.clone()) {
            return self.error(
                conn,
                body.request_id,
                (
                    ServerError::ProducerBusy,
                    format!("a producer named {name:?} is already connected to {topic}"),
                ),
            );
        }
        self.producers.insert(
            (conn, body.producer_id),
            ProducerInfo {
                topic,
                name: name.clone(),
                schema_version: schema_version.clone(),
            },
        );
        self.producer_success(conn, body.request_id, name, schema_version);
    }

    pub(super) fn producer_success(
        &mut self,
        conn: u64,
        request_id: u64,
        producer_name: String,
        schema_version: Option<Vec<u8>>,
    ) {
        let mut cmd = command(Type::ProducerSuccess);
        cmd.producer_success = Some(CommandProducerSuccess {
            request_id,
            producer_name,
            last_sequence_id: Some(-1),
            schema_version,
            producer_ready: Some(true),
            ..Default::default()
        });
        self.reply(conn, cmd);
    }

    pub(super) fn remove_producer(&mut self, key: (u64, u64)) {
        if let Some(info) = self.producers.remove(&key)
            && let Some(topic) = self.topics.get_mut(&info.topic)
        {
            topic.producers.remove(&info.name);
        }
    }

    pub(super) fn on_send(&mut self, conn: u64, body: CommandSend, payload: Payload) {
        let refuse = |code: ServerError, message: String| {
            let mut cmd = command(Type::SendError);
            cmd.send_error = Some(CommandSendError {
                producer_id: body.producer_id,
                sequence_id: body.sequence_id,
                error: code as i32,
                message,
            });
            cmd
        };
        let Some(info) = self.producers.get(&(conn, body.producer_id)) else {
            let cmd = refuse(
                ServerError::UnknownError,
                format!("no producer {} on this connection", body.producer_id),
            );
            return self.reply(conn, cmd);
        };
        let topic_name = info.topic.clone();
        if !payload.checksum_ok {
            let cmd = refuse(
                ServerError::ChecksumError,
                "the CRC32C does not match the metadata and payload".into(),
            );
            return self.reply(conn, cmd);
        }
        let num_messages = payload.metadata.num_messages_in_batch.unwrap_or(1);
        if !(1..=MAX_BATCH_MESSAGES).contains(&num_messages) {
            let cmd = refuse(
                ServerError::UnknownError,
                format!("num_messages_in_batch {num_messages} is not in 1..={MAX_BATCH_MESSAGES}"),
            );
            return self.reply(conn, cmd);
        }
        let txn = txn_of(body.txnid_most_bits, body.txnid_least_bits);
        if let Some(txn) = txn
            && let Err((code, message)) = self.tc.open(txn)
        {
            let cmd = refuse(code, message);
            return self.reply(conn, cmd);
        }
        let Some(topic) = self.topics.get_mut(&topic_name) else {
            return;
        };
        let index = topic.append(StoredEntry {
            metadata: payload.metadata,
            payload: payload.data,
            num_messages,
            visibility: txn.map_or(Visibility::Visible, Visibility::Pending),
        });
        let message_id = MessageIdData {
            ledger_id: topic.ledger_id,
            entry_id: index,
            partition: Some(topic.partition),
            ..MessageIdData::default()
        };
        let mut cmd = command(Type::SendReceipt);
        cmd.send_receipt = Some(CommandSendReceipt {
            producer_id: body.producer_id,
            sequence_id: body.sequence_id,
            message_id: Some(message_id),
            highest_sequence_id: body.highest_sequence_id,
        });
        self.reply(conn, cmd);
        match txn.map(|txn| self.tc.open(txn)) {
            // A transactional entry is read once the transaction commits.
            Some(Ok(t)) => {
                t.partitions.insert(topic_name.clone());
                t.sends.push((topic_name, index));
            }
            Some(Err(_)) => {}
            None => {
                if let Some(topic) = self.topics.get_mut(&topic_name) {
                    topic.published();
                }
                self.dispatch_topics([topic_name]);
            }
        }
    }

    // ----- consumers -----------------------------------------------------------------------

    /// The consumer's topic name, its subscription (with the topic's ledger) and its key.
    pub(super) fn consumer(
        &mut self,
        conn: u64,
        consumer_id: u64,
    ) -> Option<(String, SubRef<'_>, u64)> {
        let r = self.consumers.get(&(conn, consumer_id))?;
        let topic = self.topics.get_mut(&r.topic)?;
        let ledger_id = topic.ledger_id;
        let subscription = topic.subscriptions.get_mut(&r.subscription)?;
        Some((
            r.topic.clone(),
            SubRef {
                ledger_id,
                subscription,
            },
            r.key,
        ))
    }

    pub(super) fn on_subscribe(&mut self, conn: u64, body: CommandSubscribe) {
        let request_id = body.request_id;
        if let Some(existing) = self.consumers.get(&(conn, body.consumer_id)) {
            if normalize(&body.topic).is_ok_and(|t| t == existing.topic)
                && existing.subscription == body.subscription
            {
                return self.success(conn, request_id);
            }
            return self.error(
                conn,
                request_id,
                (
                    ServerError::ConsumerBusy,
                    format!(
                        "consumer id {} is in use on this connection",
                        body.consumer_id
                    ),
                ),
            );
        }
        let Ok(sub_type) = SubType::try_from(body.sub_type) else {
            return self.error(
                conn,
                request_id,
                (
                    ServerError::UnknownError,
                    format!("unknown subType {}", body.sub_type),
                ),
            );
        };
        if body.subscription.is_empty() {
            return self.error(
                conn,
                request_id,
                (
                    ServerError::UnknownError,
                    "the subscription name is empty".into(),
                ),
            );
        }
        let topic_name =
            match self.resolve_topic(&body.topic, body.force_topic_creation.unwrap_or(true)) {
                Ok(name) => name,
                Err(refusal) => return self.error(conn, request_id, refusal),
            };
        let durable = body.durable.unwrap_or(true);
        let Some(topic) = self.topics.get(&topic_name) else {
            return;
        };
        if let Some(sub) = topic.subscriptions.get(&body.subscription) {
            if sub.sub_type != sub_type {
                return self.error(
                    conn,
                    request_id,
                    (
                        ServerError::ConsumerBusy,
                        format!(
                            "subscription {} is {}, not {}",
                            body.subscription,
                            sub.sub_type.as_str_name(),
                            sub_type.as_str_name()
                        ),
                    ),
                );
            }
            if sub_type == SubType::Exclusive && !sub.consumers.is_empty() {
                return self.error(
                    conn,
                    request_id,
                    (
                        ServerError::ConsumerBusy,
                        format!(
                            "Exclusive consumer is already connected to {}",
                            body.subscription
                        ),
                    ),
                );
            }
        }
        // Key_Shared: the consumer's KeySharedMeta (AUTO_SPLIT without one) must fit the
        // subscription's and, STICKY, its ranges those of the other consumers.
        let key_shared = if sub_type == SubType::KeyShared {
            let (policy, ranges) = match KeySharedPolicy::of(body.key_shared_meta.as_ref()) {
                Ok(parsed) => parsed,
                Err(reason) => {
                    return self.error(
                        conn,
                        request_id,
                        (ServerError::ConsumerAssignError, reason),
                    );
                }
            };
            if let Some(sub) = topic.subscriptions.get(&body.subscription)
                && let Err(refusal) = sub.admits(policy, &ranges)
            {
                return self.error(conn, request_id, refusal);
            }
            Some((policy, ranges))
        } else {
            None
        };
        if let Err(refusal) =
            self.schemas
                .declare(&topic_name, body.schema.as_ref(), Declarer::Consumer)
        {
            return self.error(conn, request_id, refusal);
        }
        let model = self.model_config(topic.max_unacked, sub_type, durable);
        self.next_key += 1;
        let key = self.next_key;
        let name = body
            .consumer_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("consumer-{key}"));
        self.success(conn, request_id);
        let Some(topic) = self.topics.get_mut(&topic_name) else {
            return;
        };
        let end = topic.entries.len() as u64;
        let start = match (&body.start_message_id, durable) {
            // A reader's non-durable cursor starts at `start_message_id`: earliest is
            // (-1, -1); (i64::MAX, i64::MAX) is latest; an entry of the topic's ledger is read
            // from that entry on (the broker steps back one entry and the client drops what
            // precedes its start in a batch).
            (Some(id), false) => {
                if id.ledger_id == u64::MAX && id.entry_id == u64::MAX {
                    0
                } else if id.ledger_id == topic.ledger_id {
                    id.entry_id.min(end)
                } else if id.ledger_id < topic.ledger_id {
                    0
                } else {
                    end
                }
            }
            _ => match body.initial_position.map(InitialPosition::try_from) {
                Some(Ok(InitialPosition::Earliest)) => 0,
                _ => end,
            },
        };
        let sub = topic
            .subscriptions
            .entry(body.subscription.clone())
            .or_insert_with(|| {
                Subscription::new(body.subscription.clone(), sub_type, durable, start, model)
            });
        let mut consumer = Consumer::new(key, conn, body.consumer_id, name);
        if let Some((policy, ranges)) = key_shared {
            sub.set_key_shared(policy);
            consumer.hash_ranges = ranges;
        }
        sub.add_consumer(consumer, &mut self.out);
        self.consumers.insert(
            (conn, body.consumer_id),
            ConsumerRef {
                topic: topic_name,
                subscription: body.subscription,
                key,
            },
        );
    }

    /// The accounting rules of a subscription of `sub_type` on a topic whose
    /// `maxUnackedMessagesOnConsumer` is `topic_max`: the limit applies to durable Shared and
    /// Key_Shared subscriptions only (0, unlimited, otherwise, as on the broker).
    pub(super) fn model_config(
        &self,
        topic_max: Option<u32>,
        sub_type: SubType,
        durable: bool,
    ) -> ModelConfig {
        let shared = matches!(sub_type, SubType::Shared | SubType::KeyShared);
        let max_unacked = if shared && durable {
            topic_max.unwrap_or(self.config.max_unacked_messages_per_consumer)
        } else {
            0
        };
        ModelConfig::new(max_unacked)
            .with_batch_index_ack(self.config.batch_index_ack)
            .with_conflict_effects(self.config.conflict_effects)
    }

    /// Removes a consumer; returns its topic.
    pub(super) fn remove_consumer(&mut self, key: (u64, u64)) -> Option<String> {
        let r = self.consumers.remove(&key)?;
        let topic = self.topics.get_mut(&r.topic)?;
        if let Some(sub) = topic.subscriptions.get_mut(&r.subscription) {
            sub.remove_consumer(r.key, &mut self.out);
            if !sub.durable && sub.consumers.is_empty() {
                topic.subscriptions.remove(&r.subscription);
            }
        }
        Some(r.topic)
    }

    pub(super) fn unsubscribe(&mut self, key: (u64, u64)) -> Result<(), Refusal> {
        let Some(r) = self.consumers.get(&key).cloned() else {
            return Err((
                ServerError::ConsumerNotFound,
                format!("consumer {} is not connected", key.1),
            ));
        };
        let others = self
            .topics
            .get(&r.topic)
            .and_then(|t| t.subscriptions.get(&r.subscription))
            .is_some_and(|s| s.consumers.iter().any(|c| c.key != r.key));
        if others {
            return Err((
                ServerError::ConsumerBusy,
                format!("other consumers are connected to {}", r.subscription),
            ));
        }
        self.consumers.remove(&key);
        if let Some(topic) = self.topics.get_mut(&r.topic) {
            topic.subscriptions.remove(&r.subscription);
        }
        Ok(())
    }

    pub(super) fn on_ack(&mut self, conn: u64, body: CommandAck) {
        let respond = |broker: &mut Self, refusal: Option<Refusal>| {
            if let Some(request_id) = body.request_id {
                let (error, message) = match refusal {
                    Some((code, message)) => (Some(code as i32), Some(message)),
                    None => (None, None),
                };
                let mut cmd = command(Type::AckResponse);
                cmd.ack_response = Some(CommandAckResponse {
                    consumer_id: body.consumer_id,
                    error,
                    message,
                    request_id: Some(request_id),
                    ..Default::default()
                });
                broker.reply(conn, cmd);
            }
        };
        let Some(r) = self.consumers.get(&(conn, body.consumer_id)).cloned() else {
            return respond(
                self,
                Some((
                    ServerError::ConsumerNotFound,
                    format!("consumer {} is not connected", body.consumer_id),
                )),
            );
        };
        let txn = txn_of(body.txnid_most_bits, body.txnid_least_bits);
        if let Some(txn) = txn {
            match self.tc.open(txn) {
                Ok(t) => {
                    t.subscriptions
                        .insert((r.topic.clone(), r.subscription.clone()));
                }
                Err(refusal) => return respond(self, Some(refusal)),
            }
        }
        let Some(topic) = self.topics.get_mut(&r.topic) else {
            return;
        };
        let ledger_id = topic.ledger_id;
        let Some(sub) = topic.subscriptions.get_mut(&r.subscription) else {
            return;
        };
        let result = sub.ack(r.key, &body, ledger_id);
        respond(self, result.error);
        self.dispatch_topics([r.topic]);
    }

    // ----- transactions --------------------------------------------------------------------

    /// Ends a transaction: its sends become readable (commit) or are dropped (abort), and the
    /// subscriptions it acknowledged in commit or abort it.
    pub(super) fn end_txn(
        &mut self,
        txn: TxnId,
        commit: bool,
        timed_out: bool,
    ) -> Result<(), Refusal> {
        let Some(ending) = self.tc.end(txn, commit, timed_out)? else {
            return Ok(());
        };
        let mut touched = BTreeSet::new();
        for (topic, index) in ending.sends {
            if let Some(entry) = self
                .topics
                .get_mut(&topic)
                .and_then(|t| t.entries.get_mut(index as usize))
            {
                entry.visibility = if ending.commit {
                    Visibility::Visible
                } else {
                    Visibility::Aborted
                };
            }
            if let Some(topic) = self.topics.get_mut(&topic) {
                topic.published();
            }
            touched.insert(topic);
        }
        for (topic, subscription) in ending.subscriptions {
            if let Some(sub) = self
                .topics
                .get_mut(&topic)
                .and_then(|t| t.subscriptions.get_mut(&subscription))
            {
                sub.end_txn(txn, ending.commit);
            }
            touched.insert(topic);
        }
        self.dispatch_topics(touched);
        Ok(())
    }

    /// The timeout of `txn` passed: abort it if it is still open.
    pub(crate) fn expire(&mut self, txn: TxnId) {
        if self.tc.open(txn).is_ok() {
            let _ = self.end_txn(txn, false, true);
            self.flush();
        }
    }
}
