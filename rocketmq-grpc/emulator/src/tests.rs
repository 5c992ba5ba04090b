//! End-to-end tests: a started emulator and the generated client over a real tonic channel.
//!
//! Invisibility is exercised with [`Emulator::advance`], so no test waits for a deadline in
//! real time; the only real waits are long polls clamped to a few tens of milliseconds and one
//! injected 30 ms delay.

use std::time::{Duration, Instant};

use tonic::Request;
use tonic::transport::Channel;

use super::*;
use rocketmq_grpc::pb::{
    self, Code, messaging_service_client::MessagingServiceClient, receive_message_response,
    settings, telemetry_command,
};

const TOPIC: &str = "orders";
const FIFO_TOPIC: &str = "fifo-orders";
const GROUP: &str = "consumers";
const FIFO_GROUP: &str = "fifo-consumers";

/// Long polls in these tests end after at most this long.
const SHORT_POLL: Duration = Duration::from_millis(30);

fn builder() -> EmulatorBuilder {
    Emulator::builder()
        .topic(TOPIC, TopicKind::Normal, 2)
        .topic(FIFO_TOPIC, TopicKind::Fifo, 1)
        .group(GROUP, false)
        .group(FIFO_GROUP, true)
        .long_polling_range(Duration::from_millis(1), SHORT_POLL)
        // These tests call Heartbeat without a telemetry stream.
        .require_client_settings(false)
}

async fn start() -> Emulator {
    builder().start().await.expect("emulator starts")
}

/// A client with its own id and optional credentials.
struct Client {
    rpc: MessagingServiceClient<Channel>,
    id: Option<String>,
    credentials: Option<(String, String)>,
}

impl Client {
    async fn connect(emu: &Emulator, id: &str) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(emu.url())
            .expect("url")
            .connect()
            .await
            .expect("connects");
        Self {
            rpc: MessagingServiceClient::new(channel),
            id: Some(id.to_owned()),
            credentials: None,
        }
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        let md = r.metadata_mut();
        if let Some(id) = &self.id {
            md.insert("x-mq-client-id", id.parse().expect("ascii"));
        }
        md.insert("x-mq-language", "RUST".parse().expect("ascii"));
        md.insert("x-mq-client-version", "5.1.0".parse().expect("ascii"));
        if let Some((ak, sk)) = &self.credentials {
            let dt = "20260101T120000Z";
            let auth = format!(
                "MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={}",
                auth::sign(sk, dt)
            );
            md.insert("x-mq-date-time", dt.parse().expect("ascii"));
            md.insert("authorization", auth.parse().expect("ascii"));
        }
        r
    }

    async fn heartbeat(&mut self) -> pb::Status {
        let req = self.req(pb::HeartbeatRequest {
            group: Some(res(GROUP)),
            client_type: pb::ClientType::PushConsumer as i32,
        });
        self.rpc
            .heartbeat(req)
            .await
            .expect("rpc")
            .into_inner()
            .status
            .expect("status")
    }

    async fn send(&mut self, msgs: Vec<pb::Message>) -> pb::SendMessageResponse {
        let req = self.req(pb::SendMessageRequest { messages: msgs });
        self.rpc.send_message(req).await.expect("rpc").into_inner()
    }

    async fn receive(&mut self, r: pb::ReceiveMessageRequest) -> (pb::Status, Vec<pb::Message>) {
        let req = self.req(r);
        let mut stream = self
            .rpc
            .receive_message(req)
            .await
            .expect("rpc")
            .into_inner();
        let mut status = None;
        let mut messages = Vec::new();
        while let Some(frame) = stream.message().await.expect("frame") {
            match frame.content {
                Some(receive_message_response::Content::Status(st)) => {
                    assert!(status.is_none(), "one status frame");
                    status = Some(st);
                }
                Some(receive_message_response::Content::Message(m)) => {
                    assert!(status.is_some(), "status frame comes first");
                    messages.push(m);
                }
                other => panic!("unexpected frame {other:?}"),
            }
        }
        (status.expect("a status frame"), messages)
    }

    async fn ack(
        &mut self,
        topic: &str,
        group: &str,
        entries: Vec<(String, String)>,
    ) -> pb::AckMessageResponse {
        let req = self.req(pb::AckMessageRequest {
            group: Some(res(group)),
            topic: Some(res(topic)),
            entries: entries
                .into_iter()
                .map(|(message_id, receipt_handle)| pb::AckMessageEntry {
                    message_id,
                    receipt_handle,
                    lite_topic: None,
                })
                .collect(),
        });
        self.rpc.ack_message(req).await.expect("rpc").into_inner()
    }

    async fn change_invisible(
        &mut self,
        topic: &str,
        m: &(String, String),
        d: Duration,
    ) -> pb::ChangeInvisibleDurationResponse {
        let req = self.req(pb::ChangeInvisibleDurationRequest {
            group: Some(res(GROUP)),
            topic: Some(res(topic)),
            receipt_handle: m.1.clone(),
            invisible_duration: Some(clock::ms_to_proto(clock::duration_ms(d))),
            message_id: m.0.clone(),
            lite_topic: None,
            suspend: None,
        });
        self.rpc
            .change_invisible_duration(req)
            .await
            .expect("rpc")
            .into_inner()
    }
}

fn res(name: &str) -> pb::Resource {
    pb::Resource {
        resource_namespace: String::new(),
        name: name.to_owned(),
    }
}

fn message(topic: &str, id: &str, group: Option<&str>) -> pb::Message {
    pb::Message {
        topic: Some(res(topic)),
        user_properties: HashMap::from([("k".to_owned(), "v".to_owned())]),
        system_properties: Some(pb::SystemProperties {
            message_id: id.to_owned(),
            tag: Some("t".to_owned()),
            message_group: group.map(str::to_owned),
            message_type: if group.is_some() {
                pb::MessageType::Fifo as i32
            } else {
                pb::MessageType::Normal as i32
            },
            ..Default::default()
        }),
        body: format!("body of {id}").into(),
    }
}

/// A receive of every queue of `topic`.
fn receive_req(
    topic: &str,
    group: &str,
    auto_renew: bool,
    invisible: Option<Duration>,
) -> pb::ReceiveMessageRequest {
    pb::ReceiveMessageRequest {
        group: Some(res(group)),
        message_queue: Some(pb::MessageQueue {
            topic: Some(res(topic)),
            id: -1,
            ..Default::default()
        }),
        filter_expression: None,
        batch_size: 32,
        invisible_duration: invisible.map(|d| clock::ms_to_proto(clock::duration_ms(d))),
        auto_renew,
        long_polling_timeout: Some(clock::ms_to_proto(20)),
        attempt_id: None,
    }
}

fn code(st: Option<&pb::Status>) -> Code {
    st.and_then(|s| Code::try_from(s.code).ok())
        .unwrap_or(Code::Unspecified)
}

/// (message id, receipt handle) of a received message.
fn id_handle(m: &pb::Message) -> (String, String) {
    let sp = m.system_properties.as_ref().expect("system properties");
    (
        sp.message_id.clone(),
        sp.receipt_handle.clone().expect("receipt handle"),
    )
}

fn entry_codes(r: &pb::AckMessageResponse) -> Vec<Code> {
    r.entries.iter().map(|e| code(e.status.as_ref())).collect()
}

#[tokio::test]
async fn send_receive_ack_ok() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Ok);

    // Route: every queue, broker endpoints = the emulator.
    let route = c
        .rpc
        .query_route(c.req(pb::QueryRouteRequest {
            topic: Some(res(TOPIC)),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(route.status.as_ref()), Code::Ok);
    assert_eq!(route.message_queues.len(), 2);
    let broker = route.message_queues[0].broker.as_ref().unwrap();
    assert_eq!(broker.name, emu.broker_name());
    let addr = &broker.endpoints.as_ref().unwrap().addresses[0];
    assert_eq!(format!("{}:{}", addr.host, addr.port), emu.endpoint());
    assert_eq!(
        route.message_queues[1].accept_message_types,
        [pb::MessageType::Normal as i32]
    );

    let assignment = c
        .rpc
        .query_assignment(c.req(pb::QueryAssignmentRequest {
            topic: Some(res(TOPIC)),
            group: Some(res(GROUP)),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(assignment.status.as_ref()), Code::Ok);
    assert_eq!(assignment.assignments.len(), 2);

    let sent = c
        .send(vec![message(TOPIC, "m1", None), message(TOPIC, "m2", None)])
        .await;
    assert_eq!(code(sent.status.as_ref()), Code::Ok);
    let entries: Vec<(bool, &str, i64)> = sent
        .entries
        .iter()
        .map(|e| {
            let new_id = !["m1", "m2"].contains(&e.message_id.as_str());
            (new_id, e.transaction_id.as_str(), e.offset)
        })
        .collect();
    // As the real 5.3.3 proxy: one entry for the request (the batch), with a new id for the
    // batch, the first message's id as transaction id and the first message's offset.
    assert_eq!(entries, [(true, "m1", 0)]);

    let (st, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    assert_eq!(code(Some(&st)), Code::Ok);
    assert_eq!(msgs.len(), 2);
    let sp = msgs[0].system_properties.as_ref().unwrap();
    assert_eq!(sp.delivery_attempt, Some(1));
    // As the real proxy: no invisible_duration; the handle's third field has it.
    assert_eq!(sp.invisible_duration, None);
    let handle = sp.receipt_handle.as_deref().unwrap();
    assert_eq!(handle.split(' ').nth(2), Some("60000"));
    assert_eq!(sp.message_type, pb::MessageType::Normal as i32);
    assert!(sp.queue_offset.is_some());
    assert_eq!(sp.tag.as_deref(), Some("t"));
    assert_eq!(
        msgs[0].user_properties.get("k").map(String::as_str),
        Some("v")
    );
    assert_eq!(msgs[0].body, "body of m1");

    let ack = c
        .ack(TOPIC, GROUP, msgs.iter().map(id_handle).collect())
        .await;
    assert_eq!(code(ack.status.as_ref()), Code::Ok);
    assert_eq!(entry_codes(&ack), [Code::Ok, Code::Ok]);

    let stats = emu.stats();
    assert_eq!(stats.acked, 2);
    assert_eq!(stats.ack_requests_with_entries(2), 1);
    assert_eq!(stats.calls(Rpc::AckMessage), 1);
    assert_eq!(stats.calls(Rpc::ReceiveMessage), 1);
    let ledger = emu.ledger(TOPIC, GROUP);
    assert_eq!(ledger.len(), 2);
    assert!(ledger.iter().all(MessageRecord::acked_exactly_once));

    // Nothing left: a short long poll answers MESSAGE_NOT_FOUND.
    let (st, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);
    assert!(msgs.is_empty());

    // One message: its own id and offset (round robin put it in the other, empty queue).
    let single = c.send(vec![message(TOPIC, "m3", None)]).await;
    let ids: Vec<(&str, i64)> = single
        .entries
        .iter()
        .map(|e| (e.message_id.as_str(), e.offset))
        .collect();
    assert_eq!(ids, [("m3", 0)]);
    emu.shutdown().await.unwrap();
}

#[tokio::test]
async fn expired_handle_and_redelivery_after_invisibility() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    emu.publish(TOPIC, PublishMessage::new("x").message_id("m1"))
        .unwrap();
    let (_, first) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    assert_eq!(first.len(), 1);
    let old = id_handle(&first[0]);

    // Still invisible just before the deadline.
    emu.advance(Duration::from_millis(9_000));
    let (st, _) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);

    // After it: the old handle is expired and the message comes again with attempt 2.
    emu.advance(Duration::from_millis(1_100));
    let ack = c.ack(TOPIC, GROUP, vec![old.clone()]).await;
    assert_eq!(code(ack.status.as_ref()), Code::InvalidReceiptHandle);
    assert_eq!(
        ack.entries[0].status.as_ref().unwrap().message,
        "receipt handle is expired"
    );
    assert_eq!(
        ack.status.as_ref().unwrap().message,
        "receipt handle is expired"
    );

    let (_, second) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    assert_eq!(second.len(), 1);
    let sp = second[0].system_properties.as_ref().unwrap();
    assert_eq!(sp.delivery_attempt, Some(2));
    let new = id_handle(&second[0]);
    assert_ne!(new.1, old.1);
    let ack = c.ack(TOPIC, GROUP, vec![new]).await;
    assert_eq!(code(ack.status.as_ref()), Code::Ok);

    let stats = emu.stats();
    assert_eq!(stats.redelivered, 1);
    assert_eq!(stats.invisibility_expired, 1);
    assert_eq!(stats.expired_handles, 1);
    assert_eq!(stats.acked, 1);
    let rec = &emu.ledger(TOPIC, GROUP)[0];
    assert_eq!((rec.deliveries, rec.ok_acks, rec.acked), (2, 1, true));
}

#[tokio::test]
async fn mixed_results_are_multiple_results_in_request_order() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    emu.publish(TOPIC, PublishMessage::new("a").message_id("a"))
        .unwrap();
    let (_, a) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    emu.advance(Duration::from_secs(11));
    emu.publish(TOPIC, PublishMessage::new("b").message_id("b"))
        .unwrap();
    // Receives a again (redelivered) and b; keep b's handle and a's old one.
    let (_, msgs) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    let b = msgs
        .iter()
        .find(|m| m.system_properties.as_ref().unwrap().message_id == "b")
        .map(id_handle)
        .unwrap();
    let ack = c
        .ack(
            TOPIC,
            GROUP,
            vec![
                id_handle(&a[0]),
                b.clone(),
                ("c".to_owned(), "not a handle".to_owned()),
            ],
        )
        .await;
    assert_eq!(code(ack.status.as_ref()), Code::MultipleResults);
    assert_eq!(
        entry_codes(&ack),
        [
            Code::InvalidReceiptHandle,
            Code::Ok,
            Code::InternalServerError
        ]
    );
    let ids: Vec<&str> = ack.entries.iter().map(|e| e.message_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(emu.stats().malformed_handles, 1);

    // Zero entries: INTERNAL_SERVER_ERROR "ack message result is empty".
    let empty = c.ack(TOPIC, GROUP, vec![]).await;
    assert_eq!(code(empty.status.as_ref()), Code::InternalServerError);
    assert_eq!(empty.status.unwrap().message, "ack message result is empty");
}

#[tokio::test]
async fn malformed_handle_in_batch_ack_mode_fails_the_whole_request() {
    let emu = builder().batch_ack(true).start().await.unwrap();
    let mut c = Client::connect(&emu, "client-1").await;
    emu.publish(TOPIC, PublishMessage::new("a").message_id("a"))
        .unwrap();
    let (_, a) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    emu.advance(Duration::from_secs(11));
    emu.publish(TOPIC, PublishMessage::new("b").message_id("b").queue(0))
        .unwrap();
    let (_, msgs) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(10)),
        ))
        .await;
    let b = msgs
        .iter()
        .find(|m| m.system_properties.as_ref().unwrap().message_id == "b")
        .map(id_handle)
        .unwrap();

    let whole = c
        .ack(TOPIC, GROUP, vec![b.clone(), ("x".into(), "1 2 3".into())])
        .await;
    assert_eq!(code(whole.status.as_ref()), Code::InternalServerError);
    assert!(whole.entries.is_empty());
    assert!(
        !emu.ledger(TOPIC, GROUP).iter().any(|r| r.acked),
        "nothing acked"
    );

    // Reordered: expired first, then the rest.
    let ack = c.ack(TOPIC, GROUP, vec![b, id_handle(&a[0])]).await;
    assert_eq!(code(ack.status.as_ref()), Code::MultipleResults);
    let got: Vec<(&str, Code)> = ack
        .entries
        .iter()
        .map(|e| (e.message_id.as_str(), code(e.status.as_ref())))
        .collect();
    assert_eq!(got, [("a", Code::InvalidReceiptHandle), ("b", Code::Ok)]);
}

#[tokio::test]
async fn missing_client_id_is_client_id_required() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "x").await;
    for id in [None, Some("   ".to_owned())] {
        c.id = id;
        let st = c.heartbeat().await;
        assert_eq!(code(Some(&st)), Code::ClientIdRequired);
        let ack = c.ack(TOPIC, GROUP, vec![("a".into(), "b".into())]).await;
        assert_eq!(code(ack.status.as_ref()), Code::ClientIdRequired);
        assert!(ack.entries.is_empty());
        let sent = c.send(vec![message(TOPIC, "m", None)]).await;
        assert_eq!(code(sent.status.as_ref()), Code::ClientIdRequired);
        let (st, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
        assert_eq!(code(Some(&st)), Code::ClientIdRequired);
        assert!(msgs.is_empty());
    }
    assert_eq!(emu.topic_info(TOPIC).unwrap().messages_per_queue, [0, 0]);
    assert_eq!(emu.stats().rejected_requests, 8);
}

#[tokio::test]
async fn signature_is_checked_only_with_credentials() {
    let secured = builder().credentials("ak", "sk").start().await.unwrap();
    let mut c = Client::connect(&secured, "client-1").await;
    // Unsigned.
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Unauthorized);
    // Wrong secret, unknown key.
    for (ak, sk) in [("ak", "wrong"), ("other", "sk")] {
        c.credentials = Some((ak.into(), sk.into()));
        assert_eq!(code(Some(&c.heartbeat().await)), Code::Unauthorized);
    }
    // Right.
    c.credentials = Some(("ak".into(), "sk".into()));
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Ok);
    // Auth is checked before the client id, as in the proxy pipeline.
    c.id = None;
    c.credentials = None;
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Unauthorized);

    let open = start().await;
    let mut c = Client::connect(&open, "client-1").await;
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Ok);
    c.credentials = Some(("any".into(), "thing".into()));
    assert_eq!(code(Some(&c.heartbeat().await)), Code::Ok);
}

#[tokio::test]
async fn long_poll_wakes_on_publish_and_on_advance() {
    let emu = builder()
        .long_polling_range(Duration::from_millis(1), Duration::from_secs(20))
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    let mut req = receive_req(TOPIC, GROUP, true, None);
    req.long_polling_timeout = Some(clock::ms_to_proto(20_000));

    // A publish wakes the poll long before its 20 s.
    let started = Instant::now();
    let (st, msgs) = tokio::join!(c.receive(req.clone()), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        emu.publish(TOPIC, PublishMessage::new("late")).unwrap();
    })
    .0;
    assert_eq!(code(Some(&st)), Code::Ok);
    assert_eq!(msgs.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(5));

    // Advancing the clock past the poll's end answers MESSAGE_NOT_FOUND at once.
    let started = Instant::now();
    let (st, _) = tokio::join!(c.receive(req), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        emu.advance(Duration::from_secs(21));
    })
    .0;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(emu.stats().receives_empty, 1);
}

#[tokio::test]
async fn telemetry_echoes_settings_and_stays_open() {
    let emu = start().await;
    let c = Client::connect(&emu, "client-t").await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut rpc = c.rpc.clone();
    let mut replies = rpc
        .telemetry(c.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let settings = |group: &str| pb::TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::PushConsumer as i32),
            pub_sub: Some(settings::PubSub::Subscription(pb::Subscription {
                group: Some(res(group)),
                subscriptions: vec![pb::SubscriptionEntry {
                    topic: Some(res(FIFO_TOPIC)),
                    expression: None,
                }],
                ..Default::default()
            })),
            ..Default::default()
        })),
    };
    for (group, fifo) in [(FIFO_GROUP, true), (GROUP, false)] {
        tx.send(settings(group)).await.unwrap();
        let reply = replies.message().await.unwrap().expect("a reply");
        assert_eq!(code(reply.status.as_ref()), Code::Ok);
        let Some(telemetry_command::Command::Settings(s)) = reply.command else {
            panic!("settings expected")
        };
        let Some(settings::PubSub::Subscription(sub)) = s.pub_sub else {
            panic!("subscription expected")
        };
        assert_eq!(sub.fifo, Some(fifo));
        assert_eq!(sub.receive_batch_size, Some(32));
        assert!(sub.long_polling_timeout.is_some());
        assert_eq!(sub.subscriptions.len(), 1);
        assert_eq!(s.backoff_policy.map(|b| b.max_attempts), Some(17));
    }
    assert_eq!(emu.clients(), ["client-t"]);
    // A command without settings is ignored; closing our side ends the stream.
    tx.send(pb::TelemetryCommand::default()).await.unwrap();
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
}

#[tokio::test]
async fn fifo_group_gets_next_message_after_ack() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    // One send each: a batch would store them all with the first one's group (as the proxy).
    for (id, group) in [("a1", "A"), ("a2", "A"), ("b1", "B")] {
        let sent = c.send(vec![message(FIFO_TOPIC, id, Some(group))]).await;
        assert_eq!(code(sent.status.as_ref()), Code::Ok);
    }
    let (_, first) = c
        .receive(receive_req(FIFO_TOPIC, FIFO_GROUP, true, None))
        .await;
    let ids: Vec<String> = first.iter().map(|m| id_handle(m).0).collect();
    assert_eq!(ids, ["a1", "b1"]);
    let sp = first[0].system_properties.as_ref().unwrap();
    assert_eq!(sp.message_group.as_deref(), Some("A"));
    assert_eq!(sp.message_type, pb::MessageType::Fifo as i32);

    let (st, _) = c
        .receive(receive_req(FIFO_TOPIC, FIFO_GROUP, true, None))
        .await;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);
    let ack = c
        .ack(FIFO_TOPIC, FIFO_GROUP, vec![id_handle(&first[0])])
        .await;
    assert_eq!(code(ack.status.as_ref()), Code::Ok);
    let (_, next) = c
        .receive(receive_req(FIFO_TOPIC, FIFO_GROUP, true, None))
        .await;
    let ids: Vec<String> = next.iter().map(|m| id_handle(m).0).collect();
    assert_eq!(ids, ["a2"]);
}

#[tokio::test]
async fn send_validation() {
    let emu = builder().max_body_size(64).start().await.unwrap();
    let mut c = Client::connect(&emu, "p").await;
    let cases: Vec<(Vec<pb::Message>, Code)> = vec![
        (vec![], Code::MessageCorrupted),
        (vec![message("nope", "m", None)], Code::TopicNotFound),
        (vec![message("bad topic", "m", None)], Code::IllegalTopic),
        (
            vec![message(FIFO_TOPIC, "m", None)],
            Code::MessagePropertyConflictWithType,
        ),
        (
            vec![message(TOPIC, "m", Some("g"))],
            Code::MessagePropertyConflictWithType,
        ),
        (vec![message(TOPIC, " ", None)], Code::IllegalMessageId),
        (
            vec![
                message(TOPIC, "m", None),
                message(FIFO_TOPIC, "n", Some("g")),
            ],
            Code::MessageCorrupted,
        ),
        (
            vec![pb::Message {
                body: vec![0; 65].into(),
                ..message(TOPIC, "m", None)
            }],
            Code::MessageBodyTooLarge,
        ),
        (
            vec![pb::Message {
                body: bytes::Bytes::new(),
                ..message(TOPIC, "m", None)
            }],
            Code::MessageBodyEmpty,
        ),
        (
            vec![pb::Message {
                system_properties: None,
                ..message(TOPIC, "m", None)
            }],
            Code::IllegalMessageId,
        ),
    ];
    for (msgs, want) in cases {
        let r = c.send(msgs.clone()).await;
        assert_eq!(code(r.status.as_ref()), want, "{msgs:?}");
        assert!(r.entries.is_empty());
    }
    assert_eq!(emu.stats().messages_stored, 0);
    // The largest allowed body goes through.
    let ok = c
        .send(vec![pb::Message {
            body: vec![1; 64].into(),
            ..message(TOPIC, "m", None)
        }])
        .await;
    assert_eq!(code(ok.status.as_ref()), Code::Ok);
}

#[tokio::test]
async fn body_over_the_default_4_mib_is_message_body_too_large() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "p").await;
    let big = pb::Message {
        body: vec![7; 4 * 1024 * 1024 + 1].into(),
        ..message(TOPIC, "big", None)
    };
    let r = c.send(vec![big]).await;
    assert_eq!(code(r.status.as_ref()), Code::MessageBodyTooLarge);
    assert_eq!(
        r.status.unwrap().message,
        "message body cannot exceed the max 4194304"
    );
    let max = pb::Message {
        body: vec![7; 4 * 1024 * 1024].into(),
        ..message(TOPIC, "max", None)
    };
    assert_eq!(code(c.send(vec![max]).await.status.as_ref()), Code::Ok);
}

#[tokio::test]
async fn unknown_topics_groups_and_illegal_names() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    let route = c
        .rpc
        .query_route(c.req(pb::QueryRouteRequest {
            topic: Some(res("missing")),
            endpoints: None,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(route.status.as_ref()), Code::TopicNotFound);
    let assign = |topic: &str, group: &str| pb::QueryAssignmentRequest {
        topic: Some(res(topic)),
        group: Some(res(group)),
        endpoints: None,
    };
    for (req, want) in [
        (assign(TOPIC, "missing"), Code::ConsumerGroupNotFound),
        (assign("missing", GROUP), Code::TopicNotFound),
        (assign(TOPIC, ""), Code::IllegalConsumerGroup),
        (assign("", GROUP), Code::IllegalTopic),
    ] {
        let r = c
            .rpc
            .query_assignment(c.req(req))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(r.status.as_ref()), want);
    }
    for (topic, group, want) in [
        ("", GROUP, Code::IllegalTopic),
        (TOPIC, "", Code::IllegalConsumerGroup),
        ("missing", GROUP, Code::TopicNotFound),
        (TOPIC, "missing", Code::ConsumerGroupNotFound),
    ] {
        let r = c.ack(topic, group, vec![("a".into(), "b".into())]).await;
        assert_eq!(code(r.status.as_ref()), want);
        assert!(r.entries.is_empty());
        let (st, _) = c.receive(receive_req(topic, group, true, None)).await;
        assert_eq!(code(Some(&st)), want);
    }
}

#[tokio::test]
async fn invisible_time_validation_and_nack() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    let (st, _) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(1)),
        ))
        .await;
    assert_eq!(code(Some(&st)), Code::IllegalInvisibleTime);
    let (st, _) = c.receive(receive_req(TOPIC, GROUP, false, None)).await;
    assert_eq!(code(Some(&st)), Code::IllegalInvisibleTime);

    emu.publish(TOPIC, PublishMessage::new("x").message_id("m"))
        .unwrap();
    let (_, msgs) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(30)),
        ))
        .await;
    let m = id_handle(&msgs[0]);
    let too_long = c
        .change_invisible(TOPIC, &m, Duration::from_secs(13 * 3600))
        .await;
    assert_eq!(code(too_long.status.as_ref()), Code::IllegalInvisibleTime);
    let garbage = c
        .change_invisible(
            TOPIC,
            &("m".into(), "garbage".into()),
            Duration::from_secs(1),
        )
        .await;
    assert_eq!(code(garbage.status.as_ref()), Code::InternalServerError);

    // Nack: new handle, the old one is superseded, redelivery after the new invisible time,
    // but not before the receive's own 30 s (as on the 5.3.3 proxy).
    let nack = c.change_invisible(TOPIC, &m, Duration::from_secs(5)).await;
    assert_eq!(code(nack.status.as_ref()), Code::Ok);
    assert_ne!(nack.receipt_handle, m.1);
    let old = c.ack(TOPIC, GROUP, vec![m.clone()]).await;
    assert_eq!(code(old.status.as_ref()), Code::InvalidReceiptHandle);
    let again = c.change_invisible(TOPIC, &m, Duration::from_secs(5)).await;
    assert_eq!(code(again.status.as_ref()), Code::InvalidReceiptHandle);
    emu.advance(Duration::from_secs(5));
    let (_, early) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(30)),
        ))
        .await;
    assert!(
        early.is_empty(),
        "not before the receive's invisibility ends"
    );
    emu.advance(Duration::from_secs(25));
    let (_, redelivered) = c
        .receive(receive_req(
            TOPIC,
            GROUP,
            false,
            Some(Duration::from_secs(30)),
        ))
        .await;
    assert_eq!(
        redelivered[0]
            .system_properties
            .as_ref()
            .unwrap()
            .delivery_attempt,
        Some(2)
    );
    let stats = emu.stats();
    assert_eq!((stats.nacks, stats.redelivered), (1, 1));
    assert_eq!(emu.ledger(TOPIC, GROUP)[0].nacks, 1);
}

#[tokio::test]
async fn auto_renew_needs_a_channel_and_maps_handles_for_its_client() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    emu.publish(TOPIC, PublishMessage::new("x").message_id("m"))
        .unwrap();
    let (st, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);
    assert!(st.message.contains("disconnected"));
    assert!(msgs.is_empty());

    c.heartbeat().await;
    let (_, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    let m = id_handle(&msgs[0]);
    // Past the handle's own 60 s: another client id has no mapping, so it is expired...
    emu.advance(Duration::from_secs(120));
    let mut other = Client::connect(&emu, "client-2").await;
    let r = other.ack(TOPIC, GROUP, vec![m.clone()]).await;
    assert_eq!(code(r.status.as_ref()), Code::InvalidReceiptHandle);
    // ...while the receiving client's handle is mapped to the renewed one.
    let r = c.ack(TOPIC, GROUP, vec![m]).await;
    assert_eq!(code(r.status.as_ref()), Code::Ok);
    assert_eq!(emu.stats().invisibility_expired, 0);
}

#[tokio::test]
async fn client_termination_releases_auto_renewed_messages() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    emu.publish(TOPIC, PublishMessage::new("x").message_id("m"))
        .unwrap();
    let (_, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    let m = id_handle(&msgs[0]);
    let r = c
        .rpc
        .notify_client_termination(c.req(pb::NotifyClientTerminationRequest {
            group: Some(res(GROUP)),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.status.as_ref()), Code::Ok);
    assert!(emu.clients().is_empty());
    let r = c.ack(TOPIC, GROUP, vec![m]).await;
    assert_eq!(code(r.status.as_ref()), Code::InvalidReceiptHandle);
    emu.advance(Duration::from_secs(1));
    let mut c2 = Client::connect(&emu, "client-2").await;
    c2.heartbeat().await;
    let (_, again) = c2.receive(receive_req(TOPIC, GROUP, true, None)).await;
    assert_eq!(again.len(), 1);
}

/// Receives everything published on `TOPIC` (auto-renew) and returns (id, handle) pairs.
async fn receive_all(c: &mut Client, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        let (st, msgs) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
        assert_eq!(code(Some(&st)), Code::Ok);
        out.extend(msgs.iter().map(id_handle));
    }
    out
}

#[tokio::test]
async fn ack_histogram_sees_requests_of_1024_entries() {
    let emu = builder()
        .receive_batch_size(32, 1024)
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    for i in 0..1024 {
        emu.publish(TOPIC, PublishMessage::new("x").message_id(format!("m{i}")))
            .unwrap();
    }
    let mut req = receive_req(TOPIC, GROUP, true, None);
    req.batch_size = 2048;
    let mut all = Vec::new();
    while all.len() < 1024 {
        let (_, msgs) = c.receive(req.clone()).await;
        all.extend(msgs.iter().map(id_handle));
    }
    let ack = c.ack(TOPIC, GROUP, all).await;
    assert_eq!(code(ack.status.as_ref()), Code::Ok);
    assert_eq!(ack.entries.len(), 1024);
    let stats = emu.stats();
    assert_eq!(stats.ack_requests_with_entries(1024), 1);
    assert_eq!(stats.acked, 1024);
    assert!(
        emu.ledger(TOPIC, GROUP)
            .iter()
            .all(MessageRecord::acked_exactly_once)
    );
}

#[tokio::test]
async fn injected_entry_errors_missing_results_and_flow_limits() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    for i in 0..4 {
        emu.publish(TOPIC, PublishMessage::new("x").message_id(format!("m{i}")))
            .unwrap();
    }
    let msgs = receive_all(&mut c, 4).await;

    // Every entry fails: nothing is acknowledged.
    emu.set_faults(FaultConfig::none().ack_entry_errors(1.0, Code::InternalServerError));
    let r = c.ack(TOPIC, GROUP, msgs[..2].to_vec()).await;
    assert_eq!(code(r.status.as_ref()), Code::InternalServerError);
    assert_eq!(entry_codes(&r), [Code::InternalServerError; 2]);
    assert!(!emu.ledger(TOPIC, GROUP).iter().any(|r| r.acked));

    // Every result is dropped: acknowledged, but the answer has no entries.
    emu.set_faults(FaultConfig::none().ack_missing_results(1.0));
    let r = c.ack(TOPIC, GROUP, msgs[..2].to_vec()).await;
    assert_eq!(code(r.status.as_ref()), Code::InternalServerError);
    assert!(r.entries.is_empty());
    assert_eq!(
        emu.ledger(TOPIC, GROUP).iter().filter(|r| r.acked).count(),
        2
    );

    // A retry is answered OK again and still counts as exactly once.
    emu.set_faults(FaultConfig::none());
    let r = c.ack(TOPIC, GROUP, msgs[..2].to_vec()).await;
    assert_eq!(entry_codes(&r), [Code::Ok; 2]);
    let ledger = emu.ledger(TOPIC, GROUP);
    let done: Vec<&MessageRecord> = ledger.iter().filter(|r| r.acked).collect();
    assert!(
        done.iter()
            .all(|r| r.ok_acks == 2 && r.dropped_results == 1)
    );
    assert!(done.iter().all(|r| r.acked_exactly_once()));

    // Flow limit and dropped connections for the whole request.
    emu.set_faults(FaultConfig::none().too_many_requests(1.0));
    let r = c.ack(TOPIC, GROUP, msgs[2..].to_vec()).await;
    assert_eq!(code(r.status.as_ref()), Code::TooManyRequests);
    assert_eq!(r.status.unwrap().message, "flow limit");
    emu.set_faults(FaultConfig::none().unavailable(1.0));
    let req = c.req(pb::AckMessageRequest {
        group: Some(res(GROUP)),
        topic: Some(res(TOPIC)),
        entries: vec![],
    });
    let err = c.rpc.ack_message(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    // Faults are per RPC: receive is not affected.
    let (st, _) = c.receive(receive_req(TOPIC, GROUP, true, None)).await;
    assert_eq!(code(Some(&st)), Code::MessageNotFound);

    // A delay.
    emu.set_faults(FaultConfig::none().delay(
        1.0,
        Duration::from_millis(30),
        Duration::from_millis(30),
    ));
    let started = Instant::now();
    let r = c.ack(TOPIC, GROUP, msgs[2..].to_vec()).await;
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert_eq!(code(r.status.as_ref()), Code::Ok);

    let injected = emu.stats().injected;
    assert_eq!(
        (
            injected.entry_errors,
            injected.dropped_results,
            injected.too_many_requests,
            injected.unavailable,
            injected.delays
        ),
        (2, 2, 1, 1, 1)
    );
    assert!(
        emu.ledger(TOPIC, GROUP)
            .iter()
            .all(MessageRecord::acked_exactly_once)
    );
}

#[tokio::test]
async fn fault_choices_are_reproducible_with_a_seed() {
    async fn run(seed: u64) -> Vec<Code> {
        let faults = FaultConfig::none().ack_entry_errors(0.5, Code::InternalServerError);
        let emu = builder().seed(seed).faults(faults).start().await.unwrap();
        let mut c = Client::connect(&emu, "client-1").await;
        c.heartbeat().await;
        for i in 0..32 {
            emu.publish(TOPIC, PublishMessage::new("x").message_id(format!("m{i}")))
                .unwrap();
        }
        let mut msgs = receive_all(&mut c, 32).await;
        msgs.sort();
        entry_codes(&c.ack(TOPIC, GROUP, msgs).await)
    }
    let a = run(7).await;
    assert_eq!(a, run(7).await);
    assert_ne!(a, run(8).await);
    assert!(a.contains(&Code::Ok) && a.contains(&Code::InternalServerError));
}

#[tokio::test]
async fn garbage_input_gets_answers_not_panics() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    emu.publish(TOPIC, PublishMessage::new("x")).unwrap();
    // Receive with everything missing or odd.
    let odd = [
        pb::ReceiveMessageRequest::default(),
        pb::ReceiveMessageRequest {
            batch_size: -5,
            long_polling_timeout: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: -1,
            }),
            invisible_duration: Some(prost_types::Duration {
                seconds: i64::MIN,
                nanos: i32::MIN,
            }),
            ..receive_req(TOPIC, GROUP, false, None)
        },
        pb::ReceiveMessageRequest {
            message_queue: Some(pb::MessageQueue {
                topic: Some(res(TOPIC)),
                id: 999,
                permission: 77,
                accept_message_types: vec![12345],
                ..Default::default()
            }),
            ..receive_req(TOPIC, GROUP, true, None)
        },
    ];
    for r in odd {
        let (st, _) = c.receive(r).await;
        assert_ne!(code(Some(&st)), Code::Unspecified);
    }
    // Send with unknown enum values.
    let mut m = message(TOPIC, "weird", None);
    if let Some(sp) = m.system_properties.as_mut() {
        sp.message_type = 999;
        sp.body_encoding = -3;
    }
    assert_eq!(code(c.send(vec![m]).await.status.as_ref()), Code::Ok);
    // Acks with empty or hostile handles.
    let handles = [
        String::new(),
        " ".repeat(20),
        "1 0 0 4 5 broker-emulator -1 -1 -1".to_owned(),
        format!("0 {} {} 0 0 broker-emulator 0 0 999", i64::MAX, i64::MAX),
        "0 0 9223372036854775807 0 0 other 0 0 1".to_owned(),
    ];
    let r = c
        .ack(
            TOPIC,
            GROUP,
            handles.iter().map(|h| (String::new(), h.clone())).collect(),
        )
        .await;
    assert_eq!(r.entries.len(), handles.len());
    assert_eq!(
        entry_codes(&r),
        [
            Code::InternalServerError,
            Code::InternalServerError,
            Code::InvalidReceiptHandle,
            Code::InvalidReceiptHandle,
            Code::InternalServerError,
        ]
    );
    // Heartbeat without group, with an unknown client type.
    let hb = c
        .rpc
        .heartbeat(c.req(pb::HeartbeatRequest {
            group: None,
            client_type: 4242,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(hb.status.as_ref()), Code::Ok);
}

#[tokio::test]
async fn shutdown_ends_long_polls_and_telemetry() {
    let emu = builder()
        .long_polling_range(Duration::from_secs(5), Duration::from_secs(20))
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(&emu, "client-1").await;
    c.heartbeat().await;
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::TelemetryCommand>(1);
    let mut telemetry = c
        .rpc
        .clone()
        .telemetry(c.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let mut req = receive_req(TOPIC, GROUP, true, None);
    req.long_polling_timeout = Some(clock::ms_to_proto(20_000));
    let mut rpc = c.rpc.clone();
    let poll = tokio::spawn({
        let req = c.req(req);
        async move { rpc.receive_message(req).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    emu.shutdown().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(4));
    let _ = poll.await.unwrap();
    // The telemetry stream ended (or the connection went away).
    let ended = matches!(telemetry.message().await, Ok(None) | Err(_));
    assert!(ended);
}

#[tokio::test]
async fn admin_api() {
    let emu = start().await;
    assert_eq!(emu.topics(), [FIFO_TOPIC, TOPIC]);
    emu.create_topic("t2", TopicKind::Normal, 3).unwrap();
    emu.create_topic("t2", TopicKind::Normal, 3).unwrap();
    assert!(matches!(
        emu.create_topic("t2", TopicKind::Fifo, 3),
        Err(crate::Error::AlreadyExists(_))
    ));
    assert!(matches!(
        emu.create_topic("bad name", TopicKind::Normal, 1),
        Err(crate::Error::Invalid { .. })
    ));
    assert!(emu.create_topic("t3", TopicKind::Normal, 0).is_err());
    emu.create_group("g2", true).unwrap();
    assert!(emu.create_group("g2", false).is_err());
    assert!(emu.groups().contains(&("g2".to_owned(), true)));

    let p = emu
        .publish("t2", PublishMessage::new("x").queue(2))
        .unwrap();
    assert_eq!((p.queue_id, p.offset), (2, 0));
    assert!(!p.message_id.is_empty());
    assert!(
        emu.publish("t2", PublishMessage::new("x").queue(3))
            .is_err()
    );
    assert!(
        emu.publish("t2", PublishMessage::new("x").message_group("g"))
            .is_err()
    );
    assert!(emu.publish(FIFO_TOPIC, PublishMessage::new("x")).is_err());
    assert!(matches!(
        emu.publish("missing", PublishMessage::new("x")),
        Err(crate::Error::UnknownTopic(_))
    ));
    let info = emu.topic_info("t2").unwrap();
    assert_eq!(
        (info.kind, info.messages_per_queue),
        (TopicKind::Normal, vec![0, 0, 1])
    );
    assert!(emu.ledger("missing", GROUP).is_empty());
    let before = emu.now();
    emu.advance(Duration::from_secs(3600));
    assert!(emu.now() >= before + Duration::from_secs(3600));
    assert!(
        Emulator::builder()
            .broker_name("has space")
            .start()
            .await
            .is_err()
    );
    // run_until: starts, reports, stops on the signal.
    let mut seen = None;
    Emulator::builder()
        .run_until(async {}, |e| seen = Some(e.endpoint()))
        .await
        .unwrap();
    assert!(seen.unwrap().starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn heartbeat_needs_the_clients_settings_first() {
    let emu = Emulator::builder()
        .group(GROUP, false)
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(&emu, "client-1").await;
    let status = c.heartbeat().await;
    assert_eq!(code(Some(&status)), Code::UnrecognizedClientType);
    assert_eq!(
        status.message,
        "cannot find client settings for this client"
    );
}

#[tokio::test]
async fn producer_settings_come_back_with_the_proxys_retry_policy() {
    let emu = start().await;
    let c = Client::connect(&emu, "producer-1").await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c
        .rpc
        .clone()
        .telemetry(c.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::Producer as i32),
            pub_sub: Some(settings::PubSub::Publishing(pb::Publishing {
                topics: vec![res(TOPIC)],
                ..Default::default()
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let reply = replies.message().await.unwrap().expect("a reply");
    let Some(telemetry_command::Command::Settings(s)) = reply.command else {
        panic!("settings expected")
    };
    let policy = s.backoff_policy.expect("a producer retry policy");
    assert_eq!(policy.max_attempts, 3);
    let Some(pb::retry_policy::Strategy::ExponentialBackoff(e)) = policy.strategy else {
        panic!("exponential back-off expected")
    };
    assert_eq!(e.initial, Some(clock::ms_to_proto(10)));
    assert_eq!(e.max, Some(clock::ms_to_proto(1_000)));
    assert!((e.multiplier - 2.0).abs() < f32::EPSILON);
    let Some(settings::PubSub::Publishing(p)) = s.pub_sub else {
        panic!("publishing expected")
    };
    assert_eq!(p.max_body_size, 4 * 1024 * 1024);
    assert!(p.validate_message_type);
}

#[tokio::test]
async fn consumer_settings_carry_the_proxys_long_polling_maximum() {
    // The proxy pushes grpcClientConsumerMaxLongPollingTimeoutMillis: 20 s by default.
    let emu = builder()
        .long_polling_range(Duration::from_secs(5), Duration::from_secs(20))
        .start()
        .await
        .unwrap();
    let c = Client::connect(&emu, "consumer-1").await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c
        .rpc
        .clone()
        .telemetry(c.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::PushConsumer as i32),
            pub_sub: Some(settings::PubSub::Subscription(pb::Subscription {
                group: Some(res(GROUP)),
                ..Default::default()
            })),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let reply = replies.message().await.unwrap().expect("a reply");
    let Some(telemetry_command::Command::Settings(s)) = reply.command else {
        panic!("settings expected")
    };
    let Some(settings::PubSub::Subscription(sub)) = s.pub_sub else {
        panic!("subscription expected")
    };
    assert_eq!(sub.long_polling_timeout, Some(clock::ms_to_proto(20_000)));
    assert!(matches!(
        s.backoff_policy.and_then(|p| p.strategy),
        Some(pb::retry_policy::Strategy::CustomizedBackoff(_))
    ));
}

#[tokio::test]
async fn scripted_failures_hit_the_next_calls_and_the_send_log_shows_them() {
    let emu = start().await;
    let mut c = Client::connect(&emu, "p").await;
    emu.fail_next(
        Rpc::SendMessage,
        1,
        ScriptedFailure::Code(Code::InternalServerError),
    );
    emu.fail_next(Rpc::SendMessage, 1, ScriptedFailure::Unavailable);
    let with_queue = |id: &str, queue_id: i32| {
        let mut m = message(TOPIC, id, None);
        if let Some(sp) = m.system_properties.as_mut() {
            sp.queue_id = queue_id;
        }
        m
    };
    let first = c.send(vec![with_queue("a", 1)]).await;
    assert_eq!(code(first.status.as_ref()), Code::InternalServerError);
    assert!(first.entries.is_empty());
    let second = c
        .rpc
        .send_message(c.req(pb::SendMessageRequest {
            messages: vec![with_queue("a", 0)],
        }))
        .await;
    assert_eq!(second.unwrap_err().code(), tonic::Code::Unavailable);
    let third = c.send(vec![with_queue("a", 1)]).await;
    assert_eq!(code(third.status.as_ref()), Code::Ok);
    let log: Vec<(Vec<String>, i32, Code)> = emu
        .send_log()
        .into_iter()
        .map(|r| (r.message_ids, r.queue_id, r.code))
        .collect();
    let a = || vec!["a".to_owned()];
    assert_eq!(
        log,
        [
            (a(), 1, Code::InternalServerError),
            (a(), 0, Code::Unspecified),
            (a(), 1, Code::Ok)
        ]
    );
    assert_eq!(emu.stats().messages_stored, 1);
}

#[tokio::test]
async fn the_service_goes_down_and_comes_back_on_the_same_port() {
    let mut emu = builder()
        .require_client_settings(true)
        .start()
        .await
        .unwrap();
    let endpoint = emu.endpoint();
    let mut c = Client::connect(&emu, "p").await;
    assert_eq!(
        code(
            c.send(vec![message(TOPIC, "before", None)])
                .await
                .status
                .as_ref()
        ),
        Code::Ok
    );
    // A producer's settings, so that the emulator knows the client.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c
        .rpc
        .clone()
        .telemetry(c.req(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::TelemetryCommand {
        status: None,
        command: Some(telemetry_command::Command::Settings(pb::Settings {
            client_type: Some(pb::ClientType::Producer as i32),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    assert!(replies.message().await.unwrap().is_some());
    assert_eq!(emu.clients(), ["p"]);

    emu.stop_serving().await.unwrap();
    assert!(!emu.is_serving());
    // The telemetry stream ended, new calls fail at the transport level, and the restarted
    // proxy forgot the client.
    assert!(matches!(replies.message().await, Ok(None) | Err(_)));
    let down = c
        .rpc
        .send_message(c.req(pb::SendMessageRequest {
            messages: vec![message(TOPIC, "during", None)],
        }))
        .await;
    assert!(down.is_err());
    assert!(emu.clients().is_empty());

    emu.resume_serving().await.unwrap();
    assert!(emu.is_serving());
    assert_eq!(emu.endpoint(), endpoint);
    let mut c = Client::connect(&emu, "p").await;
    assert_eq!(
        code(
            c.send(vec![message(TOPIC, "after", None)])
                .await
                .status
                .as_ref()
        ),
        Code::Ok
    );
    assert_eq!(
        code(Some(&c.heartbeat().await)),
        Code::UnrecognizedClientType
    );
    assert_eq!(
        emu.stats().messages_stored,
        2,
        "messages survive the restart"
    );
    emu.resume_serving().await.unwrap();
    emu.shutdown().await.unwrap();
}
