//! Schemas on the real broker of `scripts/brokers/pulsar` (issue 28, item 5), with the
//! official Java client on the other side (`scripts/java-peers`: `PulsarSchemaProduce`,
//! `PulsarSchemaConsume`): Java `JSONSchema`, `AvroSchema` and `ProtobufSchema` producers to
//! our typed consumers and ours to Java consumers, field for field; incompatible schemas
//! refused with [`Error::IncompatibleSchema`]. Skipped unless `PULSAR_SERVICE_URL` and
//! `PULSAR_ADMIN_URL` are set.
//!
//! Our codecs use the definition the Java client derives (printed by the peer), byte for
//! byte: the broker then finds the same schema (same version) whichever side came first.

use std::time::Duration;

use integration_tests::real_pulsar::{RealPulsar, java_peer};
use pulsar_wire::{
    AvroSchema, Error, InitialPosition, JsonSchema, ProtobufSchema, Schema, SchemaCodec,
    SchemaKind, SubType, TypedConsumer, TypedProducer,
};
use serde::{Deserialize, Serialize};

/// How many values each direction sends.
const COUNT: usize = 6;

/// The Java peers' `SchemaOrder`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: i64,
    item: Option<String>,
    price: f64,
}

impl Order {
    /// The peers' value `i`.
    fn numbered(i: usize) -> Self {
        Self {
            id: i as i64,
            item: i.is_multiple_of(2).then(|| format!("item-{i}")),
            price: i as f64 / 4.0,
        }
    }

    /// The line the Java peers print for it.
    fn line(&self) -> String {
        format!(
            "id={} item={} price={:?}",
            self.id,
            self.item.as_deref().unwrap_or("null"),
            self.price
        )
    }
}

/// The Java peers' `peers.Ticket` (src/main/proto/ticket.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct Ticket {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(string, tag = "2")]
    seat: String,
    #[prost(double, tag = "3")]
    price: f64,
}

impl Ticket {
    fn numbered(i: usize) -> Self {
        Self {
            id: i as i64,
            seat: format!("{i}A"),
            price: i as f64 / 4.0,
        }
    }

    fn line(&self) -> String {
        format!("id={} seat={} price={:?}", self.id, self.seat, self.price)
    }
}

/// The schema a Java peer of `format` registers: its kind, definition and properties, as
/// `PulsarSchemaProduce` prints them (with no broker contacted for a count of 0).
async fn java_schema(format: &str) -> Schema {
    let out = java_peer("PulsarSchemaProduce", &["-", "-", format, "0"]).await;
    schema_of(&out)
}

fn schema_of(out: &str) -> Schema {
    let field = |prefix: &str| {
        out.lines()
            .find_map(|line| line.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in the peer's output:\n{out}"))
            .to_owned()
    };
    let kind: SchemaKind = field("type=").parse().expect("a schema kind");
    let mut builder = Schema::builder(kind).definition(field("definition="));
    for (key, value) in out
        .lines()
        .filter_map(|line| line.strip_prefix("property "))
        .filter_map(|line| line.split_once('='))
    {
        builder = builder.property(key, value);
    }
    builder.build().expect("the Java schema passes our checks")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Receives `expected.len()` values with a typed consumer of `codec` from the earliest
/// message, and checks each, field for field, and its schema version.
async fn consume_ours<S>(broker: &RealPulsar, codec: S, expected: &[S::Value])
where
    S: SchemaCodec,
    S::Value: PartialEq + std::fmt::Debug,
{
    let consumer = TypedConsumer::builder(&broker.client, &broker.topic, "ours", codec)
        .options(
            integration_tests::real_pulsar::consumer_options()
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
        .expect("our typed consumer subscribes with the Java schema");
    for value in expected {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.receive())
            .await
            .expect("received in time")
            .expect("decoded");
        assert_eq!(message.value(), value);
        let version = message
            .message()
            .schema_version()
            .expect("a schema version");
        assert_eq!(hex(version), "0000000000000000", "the topic's first schema");
        consumer.ack(&message).await.expect("acked");
    }
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
}

/// Sends `values` with a typed producer of `codec` and has the Java consumer of `format`
/// read them: it must print `lines`, each with our producer's schema version.
async fn produce_ours<S: SchemaCodec>(
    broker: &RealPulsar,
    format: &str,
    codec: S,
    values: &[S::Value],
    lines: &[String],
) {
    let producer = TypedProducer::builder(&broker.client, &broker.topic, codec)
        .no_batching()
        .build()
        .await
        .expect("our typed producer registers the schema");
    let version = hex(&producer.schema_version().expect("a schema version"));
    for value in values {
        producer.send(value).await.expect("sent");
    }
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    let count = values.len().to_string();
    let out = java_peer(
        "PulsarSchemaConsume",
        &[&broker.service_url, &broker.topic, "java", format, &count],
    )
    .await;
    let received: Vec<&str> = out
        .lines()
        .filter_map(|line| line.strip_prefix("value "))
        .collect();
    let expected: Vec<String> = lines
        .iter()
        .map(|line| format!("{line} version={version}"))
        .collect();
    assert_eq!(received, expected, "the Java consumer's values:\n{out}");
}

/// A Java producer of `format` sends COUNT values on the broker's topic; returns the schema
/// it registered.
async fn produce_java(broker: &RealPulsar, format: &str) -> Schema {
    let out = java_peer(
        "PulsarSchemaProduce",
        &[
            &broker.service_url,
            &broker.topic,
            format,
            &COUNT.to_string(),
        ],
    )
    .await;
    assert!(out.contains(&format!("produced={COUNT}")), "{out}");
    schema_of(&out)
}

fn orders() -> Vec<Order> {
    (0..COUNT).map(Order::numbered).collect()
}

fn tickets() -> Vec<Ticket> {
    (0..COUNT).map(Ticket::numbered).collect()
}

#[tokio::test]
async fn java_json_producer_to_our_typed_consumer() {
    let Some(broker) = RealPulsar::new("schema-json-in", 0).await else {
        return;
    };
    let schema = produce_java(&broker, "json").await;
    let codec = JsonSchema::<Order>::with_schema(schema).expect("a JSON schema");
    consume_ours(&broker, codec, &orders()).await;
}

#[tokio::test]
async fn java_avro_producer_to_our_typed_consumer() {
    let Some(broker) = RealPulsar::new("schema-avro-in", 0).await else {
        return;
    };
    let schema = produce_java(&broker, "avro").await;
    let codec = AvroSchema::<Order>::with_schema(schema).expect("an Avro schema");
    consume_ours(&broker, codec, &orders()).await;
}

#[tokio::test]
async fn java_protobuf_producer_to_our_typed_consumer() {
    let Some(broker) = RealPulsar::new("schema-proto-in", 0).await else {
        return;
    };
    let schema = produce_java(&broker, "protobuf").await;
    let codec = ProtobufSchema::<Ticket>::with_schema(schema).expect("a Protobuf schema");
    consume_ours(&broker, codec, &tickets()).await;
}

#[tokio::test]
async fn our_json_producer_to_a_java_consumer() {
    let Some(broker) = RealPulsar::new("schema-json-out", 0).await else {
        return;
    };
    let codec = JsonSchema::<Order>::with_schema(java_schema("json").await).expect("JSON");
    let lines: Vec<String> = orders().iter().map(Order::line).collect();
    produce_ours(&broker, "json", codec, &orders(), &lines).await;
}

#[tokio::test]
async fn our_avro_producer_to_a_java_consumer() {
    let Some(broker) = RealPulsar::new("schema-avro-out", 0).await else {
        return;
    };
    let codec = AvroSchema::<Order>::with_schema(java_schema("avro").await).expect("Avro");
    let lines: Vec<String> = orders().iter().map(Order::line).collect();
    produce_ours(&broker, "avro", codec, &orders(), &lines).await;
}

#[tokio::test]
async fn our_protobuf_producer_to_a_java_consumer() {
    let Some(broker) = RealPulsar::new("schema-proto-out", 0).await else {
        return;
    };
    let codec =
        ProtobufSchema::<Ticket>::with_schema(java_schema("protobuf").await).expect("Protobuf");
    let lines: Vec<String> = tickets().iter().map(Ticket::line).collect();
    produce_ours(&broker, "protobuf", codec, &tickets(), &lines).await;
}

/// Asserts that `result` is the broker's IncompatibleSchema refusal, and shows it.
fn assert_incompatible<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    let error = result.expect_err(what);
    eprintln!("{what}: {error}");
    assert!(
        matches!(error, Error::IncompatibleSchema { .. }),
        "{what}: not IncompatibleSchema: {error}"
    );
    assert!(!error.is_retryable(), "{what}");
    assert!(error.to_string().contains("incompatible"), "{error}");
}

#[tokio::test]
async fn an_incompatible_schema_is_refused_with_an_error_that_says_so() {
    let Some(broker) = RealPulsar::new("schema-incompatible", 0).await else {
        return;
    };
    let json = produce_java(&broker, "json").await;
    let topic = &broker.topic;
    let client = &broker.client;
    // Another type.
    let avro = AvroSchema::<Order>::new(json.definition().clone()).expect("Avro");
    assert_incompatible(
        "an AVRO producer on a JSON topic",
        TypedProducer::builder(client, topic, avro.clone())
            .build()
            .await,
    );
    assert_incompatible(
        "an AVRO consumer on a JSON topic",
        TypedConsumer::builder(client, topic, "avro", avro)
            .options(integration_tests::real_pulsar::consumer_options())
            .build()
            .await,
    );
    // The same type, with a field the old values lack and no default: not FULL-compatible
    // (the broker's default strategy).
    let required = r#"{"type":"record","name":"SchemaOrder","namespace":"peers","fields":[{"name":"id","type":"long"},{"name":"item","type":["null","string"],"default":null},{"name":"price","type":"double"},{"name":"quantity","type":"int"}]}"#;
    let changed = JsonSchema::<Order>::new(required).expect("JSON");
    assert_incompatible(
        "a JSON producer with a new required field",
        TypedProducer::builder(client, topic, changed).build().await,
    );
    // The Java schema itself is still accepted, with its version.
    let same = TypedProducer::builder(
        client,
        topic,
        JsonSchema::<Order>::with_schema(json).expect("JSON"),
    )
    .build()
    .await
    .expect("the topic's own schema");
    assert_eq!(
        same.schema_version().as_deref().map(hex).as_deref(),
        Some("0000000000000000")
    );
    same.close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
}
