//! The emulator driven with raw frames over TCP.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;
use txn_ack::{AckKind, MessagePosition, TxnAckTracker, TxnId};

use super::{Emulator, EmulatorConfig, Faults};
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::pb::command_ack::AckType;
use pulsar_wire::pb::command_subscribe::{InitialPosition, SubType};
use pulsar_wire::pb::{
    BaseCommand, CommandAck, CommandCloseConsumer, CommandConnect, CommandEndTxn, CommandFlow,
    CommandLookupTopic, CommandNewTxn, CommandPartitionedTopicMetadata, CommandPing,
    CommandProducer, CommandRedeliverUnacknowledgedMessages, CommandSend, CommandSubscribe,
    MessageIdData, MessageMetadata, ServerError, SingleMessageMetadata, TxnAction,
};
use pulsar_wire::wire::{
    BatchedMessage, Frame, PulsarCodec, decode_batch, encode_batch, encode_frame,
};

const WAIT: Duration = Duration::from_secs(2);

fn cmd(ty: Type) -> BaseCommand {
    BaseCommand {
        r#type: ty as i32,
        ..BaseCommand::default()
    }
}

fn is_async(frame: &Frame) -> bool {
    matches!(
        Type::try_from(frame.command.r#type),
        Ok(Type::Message | Type::ActiveConsumerChange | Type::Ping)
    )
}

/// A raw protocol client.
struct Client {
    framed: Framed<TcpStream, PulsarCodec>,
    next_id: u64,
    /// MESSAGE and other unprompted frames received while waiting for something else.
    stash: VecDeque<Frame>,
}

impl Client {
    async fn raw(emulator: &Emulator) -> Self {
        let stream = TcpStream::connect(emulator.addr()).await.unwrap();
        Self {
            framed: Framed::new(stream, PulsarCodec::default()),
            next_id: 0,
            stash: VecDeque::new(),
        }
    }

    async fn connect(emulator: &Emulator) -> Self {
        let mut client = Self::raw(emulator).await;
        let connected = client.request(connect(None)).await;
        assert_eq!(connected.r#type, Type::Connected as i32, "{connected:?}");
        client
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    async fn send(&mut self, frame: Frame) {
        self.framed.send(frame).await.unwrap();
    }

    /// The next frame from the wire; `None` when the connection closed.
    async fn next(&mut self) -> Option<Frame> {
        match tokio::time::timeout(WAIT, self.framed.next()).await {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(_) => None,
            Err(_) => panic!("no frame within {WAIT:?}"),
        }
    }

    /// Sends a command and returns the first frame that is not a MESSAGE, PING or
    /// ACTIVE_CONSUMER_CHANGE (those are kept).
    async fn request(&mut self, command: BaseCommand) -> BaseCommand {
        self.send(Frame::command(command)).await;
        self.response().await
    }

    async fn response(&mut self) -> BaseCommand {
        loop {
            let frame = self.next().await.expect("the connection closed");
            if is_async(&frame) {
                self.stash.push_back(frame);
            } else {
                return frame.command;
            }
        }
    }

    /// Every MESSAGE that arrived up to now: a PING round trip proves nothing else is queued
    /// (the emulator handles a connection's frames in order and dispatches synchronously).
    async fn sync(&mut self) -> Vec<Frame> {
        let mut ping = cmd(Type::Ping);
        ping.ping = Some(CommandPing {});
        let pong = self.request(ping).await;
        assert_eq!(pong.r#type, Type::Pong as i32);
        self.stash
            .drain(..)
            .filter(|f| f.command.r#type == Type::Message as i32)
            .collect()
    }

    async fn message(&mut self) -> Frame {
        if let Some(at) = self
            .stash
            .iter()
            .position(|f| f.command.r#type == Type::Message as i32)
        {
            return self.stash.remove(at).unwrap();
        }
        loop {
            let frame = self.next().await.expect("the connection closed");
            if frame.command.r#type == Type::Message as i32 {
                return frame;
            }
            self.stash.push_back(frame);
        }
    }

    async fn producer(&mut self, topic: &str, producer_id: u64) -> BaseCommand {
        let mut c = cmd(Type::Producer);
        c.producer = Some(CommandProducer {
            topic: topic.into(),
            producer_id,
            request_id: self.id(),
            ..CommandProducer::default()
        });
        self.request(c).await
    }

    async fn send_batch(
        &mut self,
        producer_id: u64,
        sequence_id: u64,
        messages: usize,
        txn: Option<TxnId>,
    ) -> BaseCommand {
        self.send(batch_frame(producer_id, sequence_id, messages, txn))
            .await;
        self.response().await
    }

    async fn subscribe(
        &mut self,
        topic: &str,
        subscription: &str,
        sub_type: SubType,
        consumer_id: u64,
    ) -> BaseCommand {
        let mut c = cmd(Type::Subscribe);
        c.subscribe = Some(CommandSubscribe {
            topic: topic.into(),
            subscription: subscription.into(),
            sub_type: sub_type as i32,
            consumer_id,
            request_id: self.id(),
            initial_position: Some(InitialPosition::Earliest as i32),
            ..CommandSubscribe::default()
        });
        self.request(c).await
    }

    async fn flow(&mut self, consumer_id: u64, permits: u32) {
        let mut c = cmd(Type::Flow);
        c.flow = Some(CommandFlow {
            consumer_id,
            message_permits: permits,
        });
        self.send(Frame::command(c)).await;
    }

    /// Sends an ACK; with `receipt`, waits for the ACK_RESPONSE and returns its error.
    async fn ack(
        &mut self,
        consumer_id: u64,
        ack_type: AckType,
        ids: Vec<MessageIdData>,
        txn: Option<TxnId>,
        receipt: bool,
    ) -> Option<i32> {
        let request_id = receipt.then(|| self.id());
        let mut c = cmd(Type::Ack);
        c.ack = Some(CommandAck {
            consumer_id,
            ack_type: ack_type as i32,
            message_id: ids,
            txnid_most_bits: txn.map(|t| t.most_bits),
            txnid_least_bits: txn.map(|t| t.least_bits),
            request_id,
            ..CommandAck::default()
        });
        if !receipt {
            self.send(Frame::command(c)).await;
            return None;
        }
        let response = self.request(c).await;
        let ack = response.ack_response.expect("an ACK_RESPONSE");
        assert_eq!(ack.request_id, request_id);
        ack.error
    }

    async fn new_txn(&mut self, ttl_millis: u64) -> TxnId {
        let mut c = cmd(Type::NewTxn);
        c.new_txn = Some(CommandNewTxn {
            request_id: self.id(),
            txn_ttl_seconds: Some(ttl_millis),
            tc_id: Some(0),
        });
        let response = self.request(c).await.new_txn_response.unwrap();
        assert_eq!(response.error, None, "{response:?}");
        TxnId {
            most_bits: response.txnid_most_bits.unwrap(),
            least_bits: response.txnid_least_bits.unwrap(),
        }
    }

    async fn end_txn(&mut self, txn: TxnId, action: TxnAction) -> Option<i32> {
        let mut c = cmd(Type::EndTxn);
        c.end_txn = Some(CommandEndTxn {
            request_id: self.id(),
            txnid_least_bits: Some(txn.least_bits),
            txnid_most_bits: Some(txn.most_bits),
            txn_action: Some(action as i32),
        });
        self.request(c).await.end_txn_response.unwrap().error
    }
}

fn connect(token: Option<&str>) -> BaseCommand {
    let mut c = cmd(Type::Connect);
    c.connect = Some(CommandConnect {
        client_version: "raw-test".into(),
        protocol_version: Some(21),
        auth_method_name: token.map(|_| "token".into()),
        auth_data: token.map(|t| t.as_bytes().to_vec()),
        ..CommandConnect::default()
    });
    c
}

fn batch_frame(producer_id: u64, sequence_id: u64, messages: usize, txn: Option<TxnId>) -> Frame {
    let batch: Vec<BatchedMessage> = (0..messages)
        .map(|i| {
            let payload = Bytes::from(format!("m{sequence_id}-{i}"));
            BatchedMessage {
                metadata: SingleMessageMetadata {
                    payload_size: payload.len() as i32,
                    ..SingleMessageMetadata::default()
                },
                payload,
            }
        })
        .collect();
    let mut c = cmd(Type::Send);
    c.send = Some(CommandSend {
        producer_id,
        sequence_id,
        num_messages: Some(messages as i32),
        txnid_least_bits: txn.map(|t| t.least_bits),
        txnid_most_bits: txn.map(|t| t.most_bits),
        ..CommandSend::default()
    });
    Frame::with_payload(
        c,
        MessageMetadata {
            producer_name: "p".into(),
            sequence_id,
            publish_time: 1,
            num_messages_in_batch: Some(messages as i32),
            txnid_least_bits: txn.map(|t| t.least_bits),
            txnid_most_bits: txn.map(|t| t.most_bits),
            ..MessageMetadata::default()
        },
        encode_batch(&batch),
    )
}

fn entry_of(message: &Frame) -> MessageIdData {
    let id = &message.command.message.as_ref().unwrap().message_id;
    MessageIdData {
        ledger_id: id.ledger_id,
        entry_id: id.entry_id,
        ..MessageIdData::default()
    }
}

async fn emulator(config: EmulatorConfig) -> Emulator {
    Emulator::start(config.keep_alive(None)).await.unwrap()
}

#[tokio::test]
async fn connects_answers_pings_lookups_and_metadata() {
    let emulator = emulator(EmulatorConfig::default()).await;
    assert!(emulator.endpoint().starts_with("pulsar://127.0.0.1:"));
    emulator.create_topic("parts", 3).unwrap();
    assert!(emulator.create_topic("parts", 3).is_err());
    let mut client = Client::raw(&emulator).await;
    let connected = client.request(connect(None)).await.connected.unwrap();
    assert_eq!(connected.protocol_version, Some(19), "min(client 21, 19)");
    assert!(client.sync().await.is_empty(), "PING answered with PONG");

    let mut lookup = cmd(Type::Lookup);
    lookup.lookup_topic = Some(CommandLookupTopic {
        topic: "parts-partition-1".into(),
        request_id: 7,
        authoritative: None,
    });
    let answer = client.request(lookup).await.lookup_topic_response.unwrap();
    assert_eq!(answer.request_id, 7);
    assert_eq!(
        answer.broker_service_url.as_deref(),
        Some(emulator.endpoint())
    );

    for (topic, partitions) in [
        ("parts", 3),
        ("persistent://public/default/other", 0),
        (
            "persistent://pulsar/system/transaction_coordinator_assign",
            1,
        ),
    ] {
        let mut metadata = cmd(Type::PartitionedMetadata);
        metadata.partition_metadata = Some(CommandPartitionedTopicMetadata {
            topic: topic.into(),
            request_id: 8,
        });
        let answer = client.request(metadata).await;
        let answer = answer.partition_metadata_response.unwrap();
        assert_eq!(answer.partitions, Some(partitions), "{topic}");
    }
    // Producing to a partition creates it; its receipts carry the partition.
    assert_eq!(
        client.producer("parts-partition-2", 1).await.r#type,
        Type::ProducerSuccess as i32
    );
    let receipt = client.send_batch(1, 0, 1, None).await.send_receipt.unwrap();
    assert_eq!(receipt.message_id.unwrap().partition, Some(2));
    assert_eq!(
        client
            .producer("parts-partition-3", 2)
            .await
            .error
            .unwrap()
            .error,
        ServerError::TopicNotFound as i32
    );
    let stats = emulator.stats();
    assert_eq!(stats.received(Type::Ping), 1);
    assert_eq!(stats.sent(Type::Pong), 1);
    assert_eq!(stats.connections[0].frames_received, 9);
    emulator.shutdown().await;
}

#[tokio::test]
async fn auth_tokens_and_unknown_topics_are_refused() {
    let emulator = emulator(
        EmulatorConfig::default()
            .auth_token("secret")
            .auto_topic_creation(false),
    )
    .await;
    let mut wrong = Client::raw(&emulator).await;
    let answer = wrong.request(connect(Some("guess"))).await;
    assert_eq!(
        answer.error.unwrap().error,
        ServerError::AuthenticationError as i32
    );
    assert!(wrong.next().await.is_none(), "closed after the error");

    let mut right = Client::raw(&emulator).await;
    let answer = right.request(connect(Some("secret"))).await;
    assert_eq!(answer.r#type, Type::Connected as i32);
    let mut metadata = cmd(Type::PartitionedMetadata);
    metadata.partition_metadata = Some(CommandPartitionedTopicMetadata {
        topic: "nowhere".into(),
        request_id: 1,
    });
    let answer = right
        .request(metadata)
        .await
        .partition_metadata_response
        .unwrap();
    assert_eq!(answer.error, Some(ServerError::TopicNotFound as i32));
    let answer = right.producer("nowhere", 1).await;
    assert_eq!(
        answer.error.unwrap().error,
        ServerError::TopicNotFound as i32
    );
}

#[tokio::test]
async fn a_batch_of_three_is_consumed_with_permits_and_an_ordinary_ack_drains_it() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    let success = client.producer("t", 1).await.producer_success.unwrap();
    assert!(!success.producer_name.is_empty(), "a generated name");
    let receipt = client.send_batch(1, 0, 3, None).await.send_receipt.unwrap();
    let id = receipt.message_id.unwrap();
    assert_eq!((id.entry_id, id.partition), (0, Some(-1)));

    let answer = client.subscribe("t", "s", SubType::Shared, 1).await;
    assert_eq!(answer.r#type, Type::Success as i32);
    assert!(client.sync().await.is_empty(), "no permits, no message");
    client.flow(1, 1).await;
    let message = client.message().await;
    let payload = message.payload.as_ref().unwrap();
    assert!(payload.checksum_ok);
    let messages = decode_batch(&payload.metadata, payload.data.clone()).unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(&messages[2].payload[..], b"m0-2");

    let stats = emulator.stats();
    let consumer = stats.consumers().next().unwrap();
    assert_eq!((consumer.unacked, consumer.permits), (3, -2));
    assert_eq!(stats.subscription("t", "s").unwrap().backlog, 3);

    let error = client
        .ack(1, AckType::Individual, vec![entry_of(&message)], None, true)
        .await;
    assert_eq!(error, None);
    let stats = emulator.stats();
    let consumer = stats.consumers().next().unwrap();
    assert_eq!((consumer.unacked, consumer.blocked), (0, false));
    assert_eq!((consumer.ack_commands, consumer.acked_messages), (1, 3));
    assert_eq!(stats.received(Type::Ack), 1);
    assert_eq!(stats.subscription("t", "s").unwrap().backlog, 0);
}

/// The stall of apache/pulsar-client-go#1534: limit 20, batches of 3, each acknowledged in
/// its own transaction, FLOW 3 per batch. Returns the batches received.
async fn stall_run(emulator: &Emulator, topic: &str, legacy: bool) -> usize {
    emulator.set_max_unacked_messages(topic, 20).unwrap();
    let mut client = Client::connect(emulator).await;
    client.producer(topic, 1).await;
    for sequence in 0..15 {
        client.send_batch(1, sequence, 3, None).await;
    }
    client.subscribe(topic, "s", SubType::Shared, 1).await;
    let mut tracker = TxnAckTracker::default();
    let mut received = 0;
    for _ in 0..15 {
        client.flow(1, 3).await;
        let Some(message) = client.sync().await.pop() else {
            break;
        };
        received += 1;
        let entry = entry_of(&message);
        let txn = client.new_txn(60_000).await;
        if legacy {
            // A whole-entry transactional ack without batch_size (Go v0.21).
            let error = client
                .ack(1, AckType::Individual, vec![entry], Some(txn), true)
                .await;
            assert_eq!(error, None);
        } else {
            for index in 0..3 {
                let at = MessagePosition::in_batch(entry.ledger_id, entry.entry_id, -1, index, 3)
                    .unwrap();
                let ack = tracker.ack(txn, AckKind::Individual, &at).unwrap();
                let id = MessageIdData {
                    ledger_id: ack.id.entry().ledger_id,
                    entry_id: ack.id.entry().entry_id,
                    ack_set: ack.id.wire_ack_set().collect(),
                    batch_size: ack.id.batch_size().map(|s| s as i32),
                    ..MessageIdData::default()
                };
                let error = client
                    .ack(1, AckType::Individual, vec![id], Some(txn), true)
                    .await;
                assert_eq!(error, None);
            }
        }
        assert_eq!(client.end_txn(txn, TxnAction::Commit).await, None);
    }
    received
}

#[tokio::test]
async fn legacy_txn_acks_stall_at_batch_11_and_correct_ones_drain() {
    let emulator = emulator(EmulatorConfig::default()).await;
    assert_eq!(
        stall_run(&emulator, "legacy", true).await,
        10,
        "batch 11 never comes"
    );
    let stats = emulator.stats();
    let consumer = stats.subscription("legacy", "s").unwrap().consumers[0].clone();
    assert!(consumer.blocked);
    assert_eq!((consumer.unacked, consumer.permits), (20, 3));
    assert_eq!(consumer.acked_messages, 10, "1 per batch instead of 3");
    assert_eq!(stats.subscription("legacy", "s").unwrap().backlog, 15);

    assert_eq!(stall_run(&emulator, "fixed", false).await, 15);
    let stats = emulator.stats();
    let sub = stats.subscription("fixed", "s").unwrap();
    assert_eq!(sub.backlog, 0);
    assert_eq!(
        (sub.consumers[0].unacked, sub.consumers[0].blocked),
        (0, false)
    );
    assert_eq!(sub.consumers[0].times_blocked, 0);
    assert_eq!(stats.transactions.committed, 25);
}

#[tokio::test]
async fn a_second_txn_ack_of_the_same_index_is_a_conflict() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("c", 1).await;
    client.send_batch(1, 0, 3, None).await;
    client.subscribe("c", "s", SubType::Shared, 1).await;
    client.flow(1, 10).await;
    let entry = entry_of(&client.message().await);
    let index_0 = MessageIdData {
        ack_set: vec![0b110],
        batch_size: Some(3),
        ..entry.clone()
    };
    let (a, b) = (client.new_txn(0).await, client.new_txn(0).await);
    let ack = |txn| (vec![index_0.clone()], Some(txn));
    let (ids, txn) = ack(a);
    assert_eq!(
        client.ack(1, AckType::Individual, ids, txn, true).await,
        None
    );
    let (ids, txn) = ack(b);
    assert_eq!(
        client.ack(1, AckType::Individual, ids, txn, true).await,
        Some(ServerError::TransactionConflict as i32)
    );
    // Aborting `a` gives index 0 back and redelivers the entry, whole.
    assert_eq!(client.end_txn(a, TxnAction::Abort).await, None);
    let again = client.sync().await;
    assert_eq!(again.len(), 1);
    let m = again[0].command.message.as_ref().unwrap();
    assert_eq!((m.redelivery_count, m.ack_set.is_empty()), (Some(1), true));
    // Index 1 pending in `c`: a redelivery clears its bit in CommandMessage.ack_set.
    let c = client.new_txn(0).await;
    let index_1 = MessageIdData {
        ack_set: vec![0b101],
        ..index_0.clone()
    };
    let error = client
        .ack(1, AckType::Individual, vec![index_1], Some(c), true)
        .await;
    assert_eq!(error, None);
    let mut redeliver = cmd(Type::RedeliverUnacknowledgedMessages);
    redeliver.redeliver_unacknowledged_messages = Some(CommandRedeliverUnacknowledgedMessages {
        consumer_id: 1,
        ..Default::default()
    });
    client.send(Frame::command(redeliver)).await;
    let again = client.sync().await;
    assert_eq!(again[0].command.message.as_ref().unwrap().ack_set, [0b101]);
    assert_eq!(
        client.end_txn(a, TxnAction::Commit).await,
        Some(ServerError::InvalidTxnStatus as i32)
    );
    let unknown = TxnId {
        most_bits: 0,
        least_bits: 999,
    };
    assert_eq!(
        client.end_txn(unknown, TxnAction::Commit).await,
        Some(ServerError::TransactionNotFound as i32)
    );
    let stats = emulator.stats();
    assert_eq!(stats.consumers().next().unwrap().conflicts, 1);
}

#[tokio::test]
async fn exclusive_subscriptions_refuse_a_second_consumer_and_take_cumulative_acks() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("x", 1).await;
    for sequence in 0..3 {
        client.send_batch(1, sequence, 2, None).await;
    }
    assert_eq!(
        client
            .subscribe("x", "s", SubType::Exclusive, 1)
            .await
            .r#type,
        Type::Success as i32
    );
    let busy = client.subscribe("x", "s", SubType::Exclusive, 2).await;
    assert_eq!(busy.error.unwrap().error, ServerError::ConsumerBusy as i32);
    let other_type = client.subscribe("x", "s", SubType::Shared, 3).await;
    assert_eq!(
        other_type.error.unwrap().error,
        ServerError::ConsumerBusy as i32
    );

    client.flow(1, 100).await;
    let messages = client.sync().await;
    assert_eq!(messages.len(), 3);
    client
        .ack(
            1,
            AckType::Cumulative,
            vec![entry_of(&messages[2])],
            None,
            false,
        )
        .await;
    client.sync().await;
    let stats = emulator.stats();
    let sub = stats.subscription("x", "s").unwrap();
    assert_eq!((sub.backlog, sub.consumers[0].unacked), (0, 0));

    // Closing the consumer frees the subscription.
    let mut close = cmd(Type::CloseConsumer);
    close.close_consumer = Some(CommandCloseConsumer {
        consumer_id: 1,
        request_id: 50,
        ..Default::default()
    });
    assert_eq!(client.request(close).await.r#type, Type::Success as i32);
    assert_eq!(
        client
            .subscribe("x", "s", SubType::Exclusive, 4)
            .await
            .r#type,
        Type::Success as i32
    );
}

#[tokio::test]
async fn shared_round_robin_redelivery_and_transactional_sends() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("r", 1).await;
    client.subscribe("r", "s", SubType::Shared, 1).await;
    client.subscribe("r", "s", SubType::Shared, 2).await;
    client.flow(1, 10).await;
    client.flow(2, 10).await;
    for sequence in 0..4 {
        client.send_batch(1, sequence, 1, None).await;
    }
    let messages = client.sync().await;
    let consumers: Vec<u64> = messages
        .iter()
        .map(|m| m.command.message.as_ref().unwrap().consumer_id)
        .collect();
    assert_eq!(consumers, [1, 2, 1, 2]);

    // Consumer 1 asks for its entries again: the replay read goes as one batch to the
    // consumer whose turn it is (consumer 1: consumer 2 took the last entry), counted as
    // redelivered.
    let mut redeliver = cmd(Type::RedeliverUnacknowledgedMessages);
    redeliver.redeliver_unacknowledged_messages = Some(CommandRedeliverUnacknowledgedMessages {
        consumer_id: 1,
        ..Default::default()
    });
    client.send(Frame::command(redeliver)).await;
    let again = client.sync().await;
    assert_eq!(again.len(), 2);
    for message in &again {
        let m = message.command.message.as_ref().unwrap();
        assert_eq!((m.consumer_id, m.redelivery_count), (1, Some(1)));
    }

    // A transactional send is invisible until commit; an aborted one never shows.
    let txn = client.new_txn(0).await;
    client.send_batch(1, 10, 2, Some(txn)).await;
    assert!(client.sync().await.is_empty());
    assert_eq!(emulator.stats().topic("r").unwrap().pending_txn_entries, 1);
    assert_eq!(client.end_txn(txn, TxnAction::Commit).await, None);
    assert_eq!(client.sync().await.len(), 1);
    let aborted = client.new_txn(0).await;
    client.send_batch(1, 11, 2, Some(aborted)).await;
    assert_eq!(client.end_txn(aborted, TxnAction::Abort).await, None);
    client.send_batch(1, 12, 1, None).await;
    let after = client.sync().await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].payload.as_ref().unwrap().metadata.sequence_id, 12);
    assert_eq!(emulator.stats().topic("r").unwrap().aborted_entries, 1);
}

#[tokio::test]
async fn transactions_time_out() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("tt", 1).await;
    let txn = client.new_txn(30).await;
    client.send_batch(1, 0, 1, Some(txn)).await;
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(
        client.end_txn(txn, TxnAction::Commit).await,
        Some(ServerError::InvalidTxnStatus as i32)
    );
    let stats = emulator.stats();
    assert_eq!(stats.transactions.timed_out, 1);
    assert_eq!(stats.topic("tt").unwrap().aborted_entries, 1);
}

#[tokio::test]
async fn corrupted_checksums_both_ways() {
    let emulator = emulator(EmulatorConfig::default().seed(3)).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("k", 1).await;
    // A SEND whose payload was damaged in flight.
    let mut bytes = BytesMut::new();
    encode_frame(&batch_frame(1, 0, 1, None), &mut bytes);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    client.framed.get_mut().write_all(&bytes).await.unwrap();
    let answer = client.response().await.send_error.unwrap();
    assert_eq!(answer.error, ServerError::ChecksumError as i32);

    client.send_batch(1, 1, 1, None).await;
    emulator.set_faults(Faults::none().corrupt_rate(1.0));
    client.subscribe("k", "s", SubType::Shared, 1).await;
    client.flow(1, 10).await;
    let message = client.message().await;
    assert!(!message.payload.unwrap().checksum_ok);
    assert_eq!(emulator.stats().faults.corrupted_messages, 1);
    assert_eq!(emulator.stats().topic("k").unwrap().entries, 1);
}

#[tokio::test]
async fn connections_are_dropped_and_garbage_is_survived() {
    let emulator = emulator(EmulatorConfig::default()).await;
    emulator.set_faults(Faults::none().drop_after_frames(Some(3)));
    let mut client = Client::connect(&emulator).await;
    client.producer("d", 1).await;
    client.send(batch_frame(1, 0, 1, None)).await;
    assert!(
        client.next().await.is_none(),
        "dropped at the third frame, unanswered"
    );
    assert_eq!(emulator.stats().faults.dropped_connections, 1);
    assert_eq!(emulator.stats().topic("d").unwrap().entries, 0);
    assert_eq!(emulator.stats().topic("d").unwrap().producers, 0);

    emulator.set_faults(Faults::none());
    // Garbage closes that connection only.
    let mut garbage = Client::raw(&emulator).await;
    garbage
        .framed
        .get_mut()
        .write_all(&[0, 0, 0, 6, 0, 0, 0, 9, 0xff, 0xff])
        .await
        .unwrap();
    assert!(garbage.next().await.is_none());
    // A command before CONNECT, and an unknown command after it.
    let mut early = Client::raw(&emulator).await;
    early.send(Frame::command(cmd(Type::Ping))).await;
    assert!(early.next().await.is_none());
    let mut client = Client::connect(&emulator).await;
    client
        .send(Frame::command(BaseCommand {
            r#type: 99,
            ..BaseCommand::default()
        }))
        .await;
    assert!(client.sync().await.is_empty(), "still served");
    assert_eq!(emulator.disconnect_all(), 1);
    assert!(client.next().await.is_none());
    assert_eq!(emulator.stats().faults.malformed_frames, 2);
}

#[tokio::test]
async fn idle_clients_get_pings_and_delays_hold_responses() {
    let emulator = Emulator::start(
        EmulatorConfig::default()
            .keep_alive(Some(Duration::from_millis(20)))
            .faults(Faults::none().response_delay(Duration::from_millis(30))),
    )
    .await
    .unwrap();
    let mut client = Client::raw(&emulator).await;
    let started = tokio::time::Instant::now();
    let connected = client.request(connect(None)).await;
    assert_eq!(connected.r#type, Type::Connected as i32);
    assert!(started.elapsed() >= Duration::from_millis(30));
    let ping = client.next().await.unwrap();
    assert_eq!(ping.command.r#type, Type::Ping as i32);
    // A silent client is closed after the next period.
    assert!(client.next().await.is_none());
    assert_eq!(emulator.stats().faults.keep_alive_timeouts, 1);
}

/// A limit set while the consumer is connected applies to it at once, as on the real 4.0.x
/// broker: batches of 3 stop once 21 messages are unacked.
#[tokio::test]
async fn a_limit_set_after_subscribing_applies_to_the_connected_consumer() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("late", 1).await;
    client.subscribe("late", "s", SubType::Shared, 1).await;
    emulator.set_max_unacked_messages("late", 20).unwrap();
    for sequence in 0..10 {
        client.send_batch(1, sequence, 3, None).await;
    }
    client.flow(1, 1000).await;
    let received = client.sync().await;
    assert_eq!(received.len(), 7, "7 batches of 3 reach the limit of 20");
    let stats = emulator.stats();
    let consumer = &stats.subscription("late", "s").unwrap().consumers[0];
    assert_eq!(consumer.max_unacked, 20);
    assert!(consumer.blocked);
    assert_eq!(consumer.unacked, 21);
}

#[tokio::test]
async fn a_reader_starts_at_its_start_message_id() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("reader", 1).await;
    for sequence_id in 0..3 {
        client.send_batch(1, sequence_id, 1, None).await;
    }
    let reader = |consumer_id: u64, ledger_id: u64, entry_id: u64| {
        let mut c = cmd(Type::Subscribe);
        c.subscribe = Some(CommandSubscribe {
            topic: "reader".into(),
            subscription: format!("reader-{consumer_id}"),
            sub_type: SubType::Exclusive as i32,
            consumer_id,
            request_id: 100 + consumer_id,
            durable: Some(false),
            start_message_id: Some(MessageIdData {
                ledger_id,
                entry_id,
                ..MessageIdData::default()
            }),
            // A reader's initial position is Latest; the start id wins.
            initial_position: Some(InitialPosition::Latest as i32),
            ..CommandSubscribe::default()
        });
        c
    };
    let ledger_id = emulator
        .stats()
        .topics
        .iter()
        .find(|t| t.name.ends_with("/reader"))
        .expect("the topic")
        .ledger_id;
    let cases = [
        (1, u64::MAX, u64::MAX, vec![0, 1, 2]),
        (2, ledger_id, 1, vec![1, 2]),
        (3, i64::MAX as u64, i64::MAX as u64, vec![]),
    ];
    for (consumer_id, ledger, entry, expected) in cases {
        let answer = client.request(reader(consumer_id, ledger, entry)).await;
        assert_eq!(answer.r#type, Type::Success as i32);
        client.flow(consumer_id, 10).await;
        let entries: Vec<u64> = client
            .sync()
            .await
            .iter()
            .map(|f| f.command.message.as_ref().unwrap().message_id.entry_id)
            .collect();
        assert_eq!(entries, expected, "reader {consumer_id}");
    }
}

/// A restart keeps topics, entries, cursors, open transactions with their sends and pending
/// acks, and the coordinator's transactions; it drops connections (connects are refused
/// while down), consumers, producers, permits and redelivery counts; the same address
/// serves again.
#[tokio::test]
async fn a_restart_keeps_the_data_and_forgets_the_connections() {
    let emulator = emulator(EmulatorConfig::default()).await;
    let mut client = Client::connect(&emulator).await;
    client.producer("rs", 1).await;
    client.subscribe("rs", "s", SubType::Shared, 1).await;
    client.flow(1, 100).await;
    for sequence in 0..6 {
        client.send_batch(1, sequence, 1, None).await;
    }
    let delivered = client.sync().await;
    assert_eq!(delivered.len(), 6);
    let ids: Vec<MessageIdData> = delivered.iter().map(entry_of).collect();
    // Entries 0 and 1 acked; 2 acked in an open transaction; 3 in one that commits, 4 in one
    // that aborts, before the restart; 5 not acked. A send of an open transaction.
    client
        .ack(1, AckType::Individual, ids[..2].to_vec(), None, true)
        .await;
    let open = client.new_txn(600_000).await;
    let (committed, aborted) = (client.new_txn(0).await, client.new_txn(0).await);
    for (id, txn) in [(&ids[2], open), (&ids[3], committed), (&ids[4], aborted)] {
        let mut id = id.clone();
        id.batch_size = Some(1);
        let error = client
            .ack(1, AckType::Individual, vec![id], Some(txn), true)
            .await;
        assert_eq!(error, None);
    }
    assert_eq!(client.end_txn(committed, TxnAction::Commit).await, None);
    assert_eq!(client.end_txn(aborted, TxnAction::Abort).await, None);
    // The abort sent 4 again (redelivery count 1).
    let again = client.sync().await;
    assert_eq!(again.len(), 1);
    assert_eq!(entry_of(&again[0]).entry_id, ids[4].entry_id);
    client.send_batch(1, 10, 2, Some(open)).await;
    client.sync().await;

    let dropped = emulator.take_down().await;
    assert_eq!(dropped, 1);
    assert!(client.next().await.is_none(), "the connection is dropped");
    assert!(
        TcpStream::connect(emulator.addr()).await.is_err(),
        "connects are refused while down"
    );
    let stats = emulator.stats();
    assert_eq!(stats.faults.restarts, 1);
    assert_eq!(stats.consumers().count(), 0);
    assert_eq!(stats.topic("rs").unwrap().producers, 0);
    assert_eq!(stats.topic("rs").unwrap().pending_txn_entries, 1);
    assert_eq!(stats.transactions.open, 1);
    emulator.bring_up().await.unwrap();
    emulator.bring_up().await.unwrap();

    // The same address; what was not acknowledged (4, 5) comes to the next consumer, with
    // the redelivery count forgotten; 0, 1 and 3 are deleted; 2 is pending in `open`.
    let mut client = Client::connect(&emulator).await;
    client.subscribe("rs", "s", SubType::Shared, 7).await;
    client.flow(7, 100).await;
    let after: Vec<(u64, Option<u32>)> = client
        .sync()
        .await
        .iter()
        .map(|m| {
            let message = m.command.message.as_ref().unwrap();
            (message.message_id.entry_id, message.redelivery_count)
        })
        .collect();
    assert_eq!(
        after,
        [(ids[4].entry_id, Some(0)), (ids[5].entry_id, Some(0))]
    );
    // The open transaction survived: a second ack of 2 in another transaction conflicts, and
    // its commit deletes 2 and makes its send readable.
    let other = client.new_txn(0).await;
    let mut two = ids[2].clone();
    two.batch_size = Some(1);
    assert_eq!(
        client
            .ack(7, AckType::Individual, vec![two], Some(other), true)
            .await,
        Some(ServerError::TransactionConflict as i32),
        "the pending-ack store survived the restart"
    );
    assert_eq!(client.end_txn(other, TxnAction::Abort).await, None);
    assert_eq!(client.end_txn(open, TxnAction::Commit).await, None);
    let committed_send = client.sync().await;
    assert_eq!(committed_send.len(), 1);
    let readable = entry_of(&committed_send[0]);
    client
        .ack(
            7,
            AckType::Individual,
            vec![ids[4].clone(), ids[5].clone(), readable],
            None,
            true,
        )
        .await;
    let stats = emulator.stats();
    assert_eq!(stats.backlog("rs"), 0, "{stats:#?}");
    assert_eq!(stats.transactions.open, 0);
    let subscription = stats.subscription("rs", "s").unwrap();
    assert_eq!(
        (subscription.acks_of_deleted, subscription.conflicts),
        (0, 1)
    );
}

mod shared;
