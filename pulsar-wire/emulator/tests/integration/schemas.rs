//! Schemas: typed producers and consumers (JSON, Avro, Protobuf), the schema version from
//! `PRODUCER_SUCCESS` carried by every message, refusals of another schema type, undecodable
//! payloads reported with their id, and bad schemas refused before anything is sent.

use pulsar_wire::ServerError;
use pulsar_wire::{
    AvroSchema, Error, InitialPosition, JsonSchema, OutgoingMessage, Producer, ProtobufSchema,
    Schema, SchemaKind, SubType, TypedConsumer, TypedProducer,
};
use pulsar_wire_emulator::EmulatorConfig;
use serde::{Deserialize, Serialize};

use crate::support::{PATIENCE, Setup, producer_options, within};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: i64,
    item: Option<String>,
    price: f64,
}

const ORDER: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"item","type":["null","string"],"default":null},{"name":"price","type":"double"}]}"#;

#[derive(Clone, PartialEq, prost::Message)]
struct Ticket {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(string, tag = "2")]
    seat: String,
}

const TICKET: &str = r#"{"type":"record","name":"Ticket","fields":[{"name":"id","type":"long","default":0},{"name":"seat","type":"string","default":""}]}"#;

fn orders(count: i64) -> Vec<Order> {
    (0..count)
        .map(|id| Order {
            id,
            item: (id % 2 == 0).then(|| format!("item-{id}")),
            price: id as f64 / 4.0,
        })
        .collect()
}

async fn typed_consumer<S: pulsar_wire::SchemaCodec>(
    setup: &Setup,
    topic: &str,
    codec: S,
) -> TypedConsumer<S> {
    TypedConsumer::builder(&setup.client, topic, "sub", codec)
        .sub_type(SubType::Shared)
        .initial_position(InitialPosition::Earliest)
        .build()
        .await
        .expect("subscribed")
}

/// Sends `values` with a typed producer (batched by 3 when `batched`) and receives them
/// with a typed consumer: the same values, with the producer's schema version.
async fn round_trip<S>(setup: &Setup, topic: &str, codec: S, values: Vec<S::Value>, batched: bool)
where
    S: pulsar_wire::SchemaCodec + Clone,
    S::Value: PartialEq + std::fmt::Debug,
{
    let consumer = typed_consumer(setup, topic, codec.clone()).await;
    let producer = TypedProducer::builder(&setup.client, topic, codec)
        .options(producer_options(if batched { 3 } else { 0 }))
        .build()
        .await
        .expect("producer created");
    let version = producer.schema_version().expect("a schema version");
    assert_eq!(version.len(), 8);
    let sends = values.iter().map(|value| producer.send(value));
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
    for expected in &values {
        let message = within(PATIENCE, consumer.receive())
            .await
            .expect("received in time")
            .expect("decoded");
        assert_eq!(message.value(), expected);
        assert_eq!(message.message().schema_version(), Some(&version));
        consumer.ack(&message).await.expect("acked");
    }
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
}

#[tokio::test]
async fn json_values_round_trip_with_their_schema_version_batched_or_not() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let codec = JsonSchema::<Order>::new(ORDER).expect("a schema");
    round_trip(&setup, "json-batched", codec.clone(), orders(7), true).await;
    round_trip(&setup, "json-single", codec, orders(4), false).await;
}

#[tokio::test]
async fn avro_values_round_trip() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let codec = AvroSchema::<Order>::new(ORDER).expect("a schema");
    round_trip(&setup, "avro", codec, orders(5), true).await;
}

#[tokio::test]
async fn protobuf_messages_round_trip() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let codec = ProtobufSchema::<Ticket>::new(TICKET).expect("a schema");
    let tickets = (0..4)
        .map(|id| Ticket {
            id,
            seat: format!("{id}A"),
        })
        .collect();
    round_trip(&setup, "proto", codec, tickets, false).await;
}

#[tokio::test]
async fn another_schema_type_is_refused_as_incompatible_for_producers_and_consumers() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let json = JsonSchema::<Order>::new(ORDER).expect("a schema");
    let _first = TypedProducer::builder(&setup.client, "typed", json.clone())
        .build()
        .await
        .expect("the first schema is registered");
    let avro = AvroSchema::<Order>::new(ORDER).expect("a schema");
    let refused = TypedProducer::builder(&setup.client, "typed", avro.clone())
        .build()
        .await
        .expect_err("refused");
    let Error::IncompatibleSchema { topic, reason } = &refused else {
        panic!("not IncompatibleSchema: {refused}");
    };
    assert!(topic.ends_with("/typed"), "{topic}");
    assert!(
        reason.contains("exists schema type Json, new schema type Avro"),
        "{reason}"
    );
    assert!(!refused.is_retryable());
    assert_eq!(
        refused.server_error(),
        Some(ServerError::IncompatibleSchema)
    );
    assert!(
        refused.to_string().contains("pulsar-admin schemas get"),
        "{refused}"
    );
    let refused = TypedConsumer::builder(&setup.client, "typed", "avro", avro)
        .build()
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, Error::IncompatibleSchema { .. }),
        "{refused}"
    );
    // The same schema again, and a bytes producer: accepted.
    let again = TypedProducer::builder(&setup.client, "typed", json)
        .build()
        .await
        .expect("the same schema");
    assert_eq!(again.schema_version().as_deref(), Some(&[0u8; 8][..]));
    let bytes = Producer::builder(&setup.client, "typed")
        .build()
        .await
        .expect("a bytes producer");
    assert_eq!(bytes.schema_version(), None);
}

#[tokio::test]
async fn a_payload_the_codec_cannot_read_is_an_error_with_its_id_and_is_not_acknowledged() {
    let setup = Setup::new(EmulatorConfig::default()).await;
    let consumer = typed_consumer(
        &setup,
        "bad-json",
        JsonSchema::<Order>::new(ORDER).expect("a schema"),
    )
    .await;
    let raw = Producer::builder(&setup.client, "bad-json")
        .no_batching()
        .build()
        .await
        .expect("producer");
    let bad = raw
        .send(OutgoingMessage::new("not json"))
        .await
        .expect("sent");
    let typed = TypedProducer::builder(
        &setup.client,
        "bad-json",
        JsonSchema::<Order>::new(ORDER).expect("a schema"),
    )
    .no_batching()
    .build()
    .await
    .expect("producer");
    typed.send(&orders(1)[0]).await.expect("sent");
    let error = within(PATIENCE, consumer.receive())
        .await
        .expect("in time")
        .expect_err("undecodable");
    let Error::SchemaDecode { id, format, .. } = &error else {
        panic!("not SchemaDecode: {error}");
    };
    assert_eq!(*id, bad);
    assert_eq!(*format, "JSON");
    assert!(!error.is_retryable());
    // The next message comes next; the bad one is settled by id.
    let good = within(PATIENCE, consumer.receive())
        .await
        .expect("in time")
        .expect("decoded");
    assert_eq!(good.value(), &orders(1)[0]);
    assert_eq!(good.message().schema_version().map(|v| v.len()), Some(8));
    consumer.ack(&good).await.expect("acked");
    consumer.consumer().ack_id(id).await.expect("acked by id");
    setup.assert_drained("bad-json").await;
}

#[test]
fn bad_schemas_are_refused_before_anything_is_sent() {
    for (kind, definition, says) in [
        (SchemaKind::Json, "", "needs a definition"),
        (SchemaKind::Avro, "{ not avro", "not a JSON object"),
        (SchemaKind::Protobuf, "[1, 2]", "not a JSON object"),
        (
            SchemaKind::Avro,
            r#"{"type":"record"}"#,
            "not an Avro schema",
        ),
    ] {
        let error = Schema::builder(kind)
            .definition(definition)
            .build()
            .expect_err("refused");
        assert!(
            matches!(
                error,
                Error::Invalid {
                    what: "schema definition",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains(says), "{kind}: {error}");
    }
    let error = "XML".parse::<SchemaKind>().expect_err("unknown");
    assert!(
        error.to_string().contains("supported: STRING, JSON"),
        "{error}"
    );
    assert!(
        SchemaKind::from_code(15).is_err(),
        "KeyValue is not supported"
    );
}

/// A typed consumer's stream yields the decoded values in order, an undecodable payload as a
/// `SchemaDecode` item with its id (the stream goes on), and ends once the consumer closes.
#[tokio::test]
async fn a_typed_stream_yields_values_and_decode_errors_and_ends_at_the_close() {
    use futures_util::StreamExt;

    let setup = Setup::new(EmulatorConfig::default()).await;
    let codec = JsonSchema::<Order>::new(ORDER).expect("a schema");
    let consumer = typed_consumer(&setup, "typed-stream", codec.clone()).await;
    let producer = TypedProducer::builder(&setup.client, "typed-stream", codec)
        .options(producer_options(0))
        .build()
        .await
        .expect("producer created");
    let values = orders(2);
    producer.send(&values[0]).await.expect("sent");
    let bad = producer
        .send_message(OutgoingMessage::new("not json"))
        .await
        .expect("sent");
    producer.send(&values[1]).await.expect("sent");
    let mut stream = consumer.stream();
    let first = within(PATIENCE, stream.next())
        .await
        .expect("in time")
        .expect("an item")
        .expect("decoded");
    assert_eq!(first.value(), &values[0]);
    consumer.ack(&first).await.expect("acked");
    let error = within(PATIENCE, stream.next())
        .await
        .expect("in time")
        .expect("an item")
        .expect_err("undecodable");
    assert!(
        matches!(&error, Error::SchemaDecode { id, .. } if *id == bad),
        "{error}"
    );
    consumer.consumer().ack_id(&bad).await.expect("acked by id");
    let second = within(PATIENCE, stream.next())
        .await
        .expect("in time")
        .expect("an item")
        .expect("decoded");
    assert_eq!(second.value(), &values[1]);
    consumer.ack(&second).await.expect("acked");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    assert!(
        within(PATIENCE, stream.next())
            .await
            .expect("in time")
            .is_none(),
        "the stream ends at the close"
    );
}
