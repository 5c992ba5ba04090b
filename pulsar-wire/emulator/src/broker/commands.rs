//! The answer to each command: the handshake, lookups, and the routing of every other
//! command to the producer, consumer or transaction code.

use txn_ack::TxnId;

use super::{Broker, Effects, Refusal};
use crate::faults::chance;
use crate::names::normalize;
use crate::outgoing::{Kind, command};
use crate::txn::{Coordinator, TxnError};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_lookup_topic_response::LookupType as LookupResponse;
use pulsar_wire::pb::command_partitioned_topic_metadata_response::LookupType as MetadataResponse;
use pulsar_wire::pb::{
    CommandAddPartitionToTxnResponse, CommandAddSubscriptionToTxnResponse, CommandConnect,
    CommandConnected, CommandEndTxnResponse, CommandLookupTopicResponse, CommandNewTxnResponse,
    CommandPartitionedTopicMetadataResponse, CommandPong, CommandTcClientConnectResponse,
    ServerError, TxnAction,
};
use pulsar_wire::wire::Frame;

impl Broker {
    // ----- commands ------------------------------------------------------------------------

    /// Handles one frame from connection `conn`.
    pub(crate) fn handle(&mut self, conn: u64, frame: Frame) -> Effects {
        let mut effects = Effects::default();
        let ty = frame.command.r#type;
        *self.received.entry(ty).or_default() += 1;
        let Some(c) = self.conns.get_mut(&conn).filter(|c| c.tx.is_some()) else {
            // Unknown, or closed by a restart while this frame was on its way in.
            effects.close_now = true;
            return effects;
        };
        c.stats.frames_received += 1;
        let (count, connected) = (c.stats.frames_received, c.stats.connected);
        if self
            .faults
            .dropped_after_frames()
            .is_some_and(|n| count >= n)
            || chance(&mut self.rng, self.faults.dropped_rate())
        {
            self.fault_stats.dropped_connections += 1;
            effects.close_now = true;
            return effects;
        }
        let result = match Type::try_from(ty) {
            Err(_) => {
                // Its body is not in the proto subset: there is no request id to answer.
                self.ignore_unmodelled(conn, ty, "a type number the proto subset does not know");
                Ok(())
            }
            Ok(Type::Connect) if !connected => self.on_connect(conn, frame.command.connect),
            Ok(Type::Connect) => Err("a second CONNECT".to_string()),
            Ok(_) if !connected => Err(format!("command {ty} before CONNECT")),
            Ok(kind) => self.on_command(conn, kind, frame, &mut effects),
        };
        if let Err(reason) = result {
            tracing::debug!(conn, %reason, "closing a connection that broke the protocol");
            self.fault_stats.malformed_frames += 1;
            effects.close_now = true;
        }
        self.flush();
        effects.wake = self.schedule_wake();
        effects
    }

    pub(super) fn on_connect(
        &mut self,
        conn: u64,
        body: Option<CommandConnect>,
    ) -> Result<(), String> {
        let body = body.ok_or("CONNECT without its body")?;
        if let Some(token) = &self.config.auth_token {
            let ok = body.auth_method_name.as_deref() == Some("token")
                && body.auth_data.as_deref() == Some(token.as_bytes());
            if !ok {
                // The broker answers a failed authentication with request id -1.
                self.error(
                    conn,
                    u64::MAX,
                    (
                        ServerError::AuthenticationError,
                        "authentication failed: expected auth_method_name \"token\" and the configured token".into(),
                    ),
                );
                self.closing.push(conn);
                return Ok(());
            }
        }
        let version = body.protocol_version.unwrap_or(0).clamp(0, 19);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.stats.connected = true;
        }
        let mut cmd = command(Type::Connected);
        cmd.connected = Some(CommandConnected {
            server_version: self.config.server_version.clone(),
            protocol_version: Some(version),
            max_message_size: Some(self.config.max_message_size),
            feature_flags: None,
        });
        self.reply(conn, cmd);
        Ok(())
    }

    pub(super) fn on_command(
        &mut self,
        conn: u64,
        kind: Type,
        frame: Frame,
        effects: &mut Effects,
    ) -> Result<(), String> {
        let missing = |name: &str| format!("{name} without its body");
        let cmd = frame.command;
        match kind {
            Type::Ping => {
                let mut pong = command(Type::Pong);
                pong.pong = Some(CommandPong {});
                self.push(conn, pong, Kind::Other);
            }
            Type::Pong => {}
            Type::PartitionedMetadata => {
                let body = cmd
                    .partition_metadata
                    .ok_or_else(|| missing("PARTITIONED_METADATA"))?;
                let mut response = CommandPartitionedTopicMetadataResponse {
                    request_id: body.request_id,
                    ..Default::default()
                };
                match self.partitions_of(&body.topic) {
                    Ok(n) => {
                        response.partitions = Some(n);
                        response.response = Some(MetadataResponse::Success as i32);
                    }
                    Err((code, message)) => {
                        response.response = Some(MetadataResponse::Failed as i32);
                        response.error = Some(code as i32);
                        response.message = Some(message);
                    }
                }
                let mut answer = command(Type::PartitionedMetadataResponse);
                answer.partition_metadata_response = Some(response);
                self.reply(conn, answer);
            }
            Type::Lookup => {
                let body = cmd.lookup_topic.ok_or_else(|| missing("LOOKUP"))?;
                let mut response = CommandLookupTopicResponse {
                    request_id: body.request_id,
                    ..Default::default()
                };
                match self.lookup(&body.topic) {
                    Ok(()) => {
                        response.response = Some(LookupResponse::Connect as i32);
                        response.broker_service_url = Some(self.endpoint.clone());
                        response.authoritative = Some(true);
                        response.proxy_through_service_url = Some(false);
                    }
                    Err((code, message)) => {
                        response.response = Some(LookupResponse::Failed as i32);
                        response.error = Some(code as i32);
                        response.message = Some(message);
                    }
                }
                let mut answer = command(Type::LookupResponse);
                answer.lookup_topic_response = Some(response);
                self.reply(conn, answer);
            }
            Type::Producer => {
                let body = cmd.producer.ok_or_else(|| missing("PRODUCER"))?;
                self.on_producer(conn, body);
            }
            Type::Send => {
                let body = cmd.send.ok_or_else(|| missing("SEND"))?;
                let payload = frame.payload.ok_or("SEND without a payload")?;
                self.on_send(conn, body, payload);
            }
            Type::CloseProducer => {
                let body = cmd
                    .close_producer
                    .ok_or_else(|| missing("CLOSE_PRODUCER"))?;
                self.remove_producer((conn, body.producer_id));
                self.success(conn, body.request_id);
            }
            Type::Subscribe => {
                let body = cmd.subscribe.ok_or_else(|| missing("SUBSCRIBE"))?;
                self.on_subscribe(conn, body);
            }
            Type::Flow => {
                let body = cmd.flow.ok_or_else(|| missing("FLOW"))?;
                if let Some((topic, sub, key)) = self.consumer(conn, body.consumer_id) {
                    sub.subscription.flow(key, body.message_permits);
                    self.dispatch_topics([topic]);
                }
            }
            Type::Ack => {
                let body = cmd.ack.ok_or_else(|| missing("ACK"))?;
                self.on_ack(conn, body);
            }
            Type::RedeliverUnacknowledgedMessages => {
                let body = cmd
                    .redeliver_unacknowledged_messages
                    .ok_or_else(|| missing("REDELIVER_UNACKNOWLEDGED_MESSAGES"))?;
                if let Some((topic, sub, key)) = self.consumer(conn, body.consumer_id) {
                    let ledger_id = sub.ledger_id;
                    sub.subscription
                        .redeliver_unacknowledged(key, &body.message_ids, ledger_id);
                    self.dispatch_topics([topic]);
                }
            }
            Type::CloseConsumer => {
                let body = cmd
                    .close_consumer
                    .ok_or_else(|| missing("CLOSE_CONSUMER"))?;
                if let Some(topic) = self.remove_consumer((conn, body.consumer_id)) {
                    self.dispatch_topics([topic]);
                }
                self.success(conn, body.request_id);
            }
            Type::Unsubscribe => {
                let body = cmd.unsubscribe.ok_or_else(|| missing("UNSUBSCRIBE"))?;
                match self.unsubscribe((conn, body.consumer_id)) {
                    Ok(()) => self.success(conn, body.request_id),
                    Err(refusal) => self.error(conn, body.request_id, refusal),
                }
            }
            Type::TcClientConnectRequest => {
                let body = cmd
                    .tc_client_connect_request
                    .ok_or_else(|| missing("TC_CLIENT_CONNECT_REQUEST"))?;
                let mut response = CommandTcClientConnectResponse {
                    request_id: body.request_id,
                    ..Default::default()
                };
                if let Err((code, message)) = self.coordinator(body.tc_id) {
                    response.error = Some(code as i32);
                    response.message = Some(message);
                }
                let mut answer = command(Type::TcClientConnectResponse);
                answer.tc_client_connect_response = Some(response);
                self.reply(conn, answer);
            }
            Type::NewTxn => {
                let body = cmd.new_txn.ok_or_else(|| missing("NEW_TXN"))?;
                let mut response = CommandNewTxnResponse {
                    request_id: body.request_id,
                    ..Default::default()
                };
                let tc_id = body.tc_id.unwrap_or(0);
                match self.coordinator(tc_id).and_then(|()| self.tc.create(tc_id)) {
                    Ok(txn) => {
                        response.txnid_most_bits = Some(txn.most_bits);
                        response.txnid_least_bits = Some(txn.least_bits);
                        effects.txn_timeout = Some((
                            txn,
                            Coordinator::timeout(
                                body.txn_ttl_seconds,
                                self.config.default_txn_timeout,
                            ),
                        ));
                    }
                    Err((code, message)) => {
                        response.error = Some(code as i32);
                        response.message = Some(message);
                    }
                }
                let mut answer = command(Type::NewTxnResponse);
                answer.new_txn_response = Some(response);
                self.reply(conn, answer);
            }
            Type::AddPartitionToTxn => {
                let body = cmd
                    .add_partition_to_txn
                    .ok_or_else(|| missing("ADD_PARTITION_TO_TXN"))?;
                let txn = TxnId {
                    most_bits: body.txnid_most_bits.unwrap_or(0),
                    least_bits: body.txnid_least_bits.unwrap_or(0),
                };
                let result = self.tc.open(txn).map(|t| {
                    t.partitions.extend(body.partitions);
                });
                let (error, message) = split(result);
                let mut answer = command(Type::AddPartitionToTxnResponse);
                answer.add_partition_to_txn_response = Some(CommandAddPartitionToTxnResponse {
                    request_id: body.request_id,
                    txnid_least_bits: Some(txn.least_bits),
                    txnid_most_bits: Some(txn.most_bits),
                    error,
                    message,
                });
                self.reply(conn, answer);
            }
            Type::AddSubscriptionToTxn => {
                let body = cmd
                    .add_subscription_to_txn
                    .ok_or_else(|| missing("ADD_SUBSCRIPTION_TO_TXN"))?;
                let txn = TxnId {
                    most_bits: body.txnid_most_bits.unwrap_or(0),
                    least_bits: body.txnid_least_bits.unwrap_or(0),
                };
                let result = self.tc.open(txn).map(|t| {
                    for s in body.subscription {
                        let topic = normalize(&s.topic).unwrap_or(s.topic);
                        t.subscriptions.insert((topic, s.subscription));
                    }
                });
                let (error, message) = split(result);
                let mut answer = command(Type::AddSubscriptionToTxnResponse);
                answer.add_subscription_to_txn_response =
                    Some(CommandAddSubscriptionToTxnResponse {
                        request_id: body.request_id,
                        txnid_least_bits: Some(txn.least_bits),
                        txnid_most_bits: Some(txn.most_bits),
                        error,
                        message,
                    });
                self.reply(conn, answer);
            }
            Type::EndTxn => {
                let body = cmd.end_txn.ok_or_else(|| missing("END_TXN"))?;
                let txn = TxnId {
                    most_bits: body.txnid_most_bits.unwrap_or(0),
                    least_bits: body.txnid_least_bits.unwrap_or(0),
                };
                let result = match TxnAction::try_from(body.txn_action.unwrap_or(0)) {
                    Ok(action) => self.end_txn(txn, action == TxnAction::Commit, false),
                    Err(_) => Err((
                        ServerError::UnknownError,
                        format!("unknown txn_action {:?}", body.txn_action),
                    )),
                };
                let (error, message) = split(result);
                let mut answer = command(Type::EndTxnResponse);
                answer.end_txn_response = Some(CommandEndTxnResponse {
                    request_id: body.request_id,
                    txnid_least_bits: Some(txn.least_bits),
                    txnid_most_bits: Some(txn.most_bits),
                    error,
                    message,
                });
                self.reply(conn, answer);
            }
            Type::GetLastMessageId => {
                let body = cmd
                    .get_last_message_id
                    .ok_or_else(|| missing("GET_LAST_MESSAGE_ID"))?;
                self.on_get_last_message_id(conn, &body);
            }
            Type::Seek => {
                let body = cmd.seek.ok_or_else(|| missing("SEEK"))?;
                self.on_seek(conn, &body);
            }
            // Requests the emulator does not model: an error at once, not a client timeout.
            Type::ConsumerStats => {
                let body = cmd
                    .consumer_stats
                    .ok_or_else(|| missing("CONSUMER_STATS"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::GetTopicsOfNamespace => {
                let body = cmd
                    .get_topics_of_namespace
                    .ok_or_else(|| missing("GET_TOPICS_OF_NAMESPACE"))?;
                self.on_get_topics_of_namespace(conn, &body);
            }
            Type::GetSchema => {
                let body = cmd.get_schema.ok_or_else(|| missing("GET_SCHEMA"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::GetOrCreateSchema => {
                let body = cmd
                    .get_or_create_schema
                    .ok_or_else(|| missing("GET_OR_CREATE_SCHEMA"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::EndTxnOnPartition => {
                let body = cmd
                    .end_txn_on_partition
                    .ok_or_else(|| missing("END_TXN_ON_PARTITION"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::EndTxnOnSubscription => {
                let body = cmd
                    .end_txn_on_subscription
                    .ok_or_else(|| missing("END_TXN_ON_SUBSCRIPTION"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::WatchTopicList => {
                let body = cmd
                    .watch_topic_list
                    .ok_or_else(|| missing("WATCH_TOPIC_LIST"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            Type::WatchTopicListClose => {
                let body = cmd
                    .watch_topic_list_close
                    .ok_or_else(|| missing("WATCH_TOPIC_LIST_CLOSE"))?;
                self.not_implemented(conn, kind, body.request_id);
            }
            // No request id, and the emulator never sends AUTH_CHALLENGE.
            Type::AuthResponse => {
                self.ignore_unmodelled(conn, kind as i32, "no AUTH_CHALLENGE was sent");
            }
            // Commands only a broker sends. Answering a response with an error would only
            // confuse a peer that is not a client; nobody waits for an answer to them.
            // `handle` answers CONNECT before this is reached.
            Type::Connect => {}
            Type::Connected
            | Type::AuthChallenge
            | Type::SendReceipt
            | Type::SendError
            | Type::Message
            | Type::Success
            | Type::Error
            | Type::ProducerSuccess
            | Type::PartitionedMetadataResponse
            | Type::LookupResponse
            | Type::ReachedEndOfTopic
            | Type::GetLastMessageIdResponse
            | Type::ActiveConsumerChange
            | Type::AckResponse
            | Type::NewTxnResponse
            | Type::AddPartitionToTxnResponse
            | Type::AddSubscriptionToTxnResponse
            | Type::EndTxnResponse
            | Type::TcClientConnectResponse
            | Type::GetTopicsOfNamespaceResponse => {
                self.ignore_unmodelled(conn, kind as i32, "a command only a broker sends");
            }
        }
        Ok(())
    }

    pub(super) fn coordinator(&self, tc_id: u64) -> Result<(), TxnError> {
        if !self.config.transactions {
            return Err((
                ServerError::TransactionCoordinatorNotFound,
                "transactions are disabled in this emulator".into(),
            ));
        }
        if tc_id != 0 {
            return Err((
                ServerError::TransactionCoordinatorNotFound,
                format!(
                    "transaction coordinator {tc_id} does not exist (the emulator runs coordinator 0)"
                ),
            ));
        }
        Ok(())
    }
}

fn split(result: Result<(), Refusal>) -> (Option<i32>, Option<String>) {
    match result {
        Ok(()) => (None, None),
        Err((code, message)) => (Some(code as i32), Some(message)),
    }
}
