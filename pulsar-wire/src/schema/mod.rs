//! Schemas: the description of a topic's values that producers send in `PRODUCER` and
//! consumers in `SUBSCRIBE` ([`Schema`], [`SchemaKind`]), and the codecs that turn typed
//! values into payloads and back ([`SchemaCodec`]; per format behind the `json`, `avro` and
//! `protobuf` features).
//!
//! The broker keeps a registry of schemas per topic: the first producer or consumer with a
//! schema sets it (version 0), an identical schema (same kind and definition bytes) gets the
//! same version, a different one is checked against the topic's compatibility strategy and
//! refused with [`Error::IncompatibleSchema`] when it does not pass.

#[cfg(feature = "avro")]
mod avro;
#[cfg(feature = "json")]
mod json;
#[cfg(feature = "protobuf")]
mod protobuf;

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::error::Error;
use crate::pb;

#[cfg(feature = "avro")]
pub use avro::AvroSchema;
#[cfg(feature = "json")]
pub use json::JsonSchema;
#[cfg(feature = "protobuf")]
pub use protobuf::ProtobufSchema;

/// The property the Java client's `JSONSchema`, `AvroSchema` and `ProtobufSchema` set to say
/// whether their derived definition makes every field nullable (`"true"` by default there).
pub const ALWAYS_ALLOW_NULL: &str = "__alwaysAllowNull";

/// The property the Java client's struct schemas set to say whether time values use the
/// JSR-310 logical-type conversions (`"false"` by default there).
pub const JSR310_CONVERSION_ENABLED: &str = "__jsr310ConversionEnabled";

/// The property the Java client's `ProtobufSchema` sets to the JSON list of the message's
/// fields (number, name, type, label).
pub const PARSING_INFO: &str = "__PARSING_INFO__";

/// The most bytes of a schema definition that [`SchemaBuilder::build`] accepts (the broker
/// stores schemas in BookKeeper entries; 5 MiB is its default `maxMessageSize`).
pub const MAX_SCHEMA_DEFINITION: usize = 5 * 1024 * 1024;

/// The type of a schema (`Schema.Type` of the protocol), as far as this crate sends it.
///
/// `BYTES` (no schema) is the default of every producer and consumer and is expressed by
/// setting no [`Schema`]. `KeyValue`, `AutoConsume` and the date and time kinds are not
/// supported: [`SchemaKind::from_code`] and [`SchemaKind::from_str`] refuse them with
/// [`Error::Invalid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SchemaKind {
    /// UTF-8 text (`STRING`); no definition.
    String,
    /// JSON values described by an Avro record definition (`JSON`), as the Java
    /// `JSONSchema` writes them.
    Json,
    /// Protobuf messages described by an Avro record definition derived from the message
    /// descriptor (`PROTOBUF`), as the Java `ProtobufSchema` writes them.
    Protobuf,
    /// Avro binary values (one datum, no header) described by an Avro definition (`AVRO`).
    Avro,
    /// Protobuf messages described by their file descriptor set (`PROTOBUF_NATIVE`).
    ProtobufNative,
    /// A boolean (`BOOLEAN`, one byte); no definition.
    Bool,
    /// An 8-bit integer (`INT8`); no definition.
    Int8,
    /// A 16-bit big-endian integer (`INT16`); no definition.
    Int16,
    /// A 32-bit big-endian integer (`INT32`); no definition.
    Int32,
    /// A 64-bit big-endian integer (`INT64`); no definition.
    Int64,
    /// A 32-bit IEEE 754 float (`FLOAT`); no definition.
    Float,
    /// A 64-bit IEEE 754 float (`DOUBLE`); no definition.
    Double,
}

const KINDS: [SchemaKind; 12] = [
    SchemaKind::String,
    SchemaKind::Json,
    SchemaKind::Protobuf,
    SchemaKind::Avro,
    SchemaKind::ProtobufNative,
    SchemaKind::Bool,
    SchemaKind::Int8,
    SchemaKind::Int16,
    SchemaKind::Int32,
    SchemaKind::Int64,
    SchemaKind::Float,
    SchemaKind::Double,
];

impl SchemaKind {
    /// The name the Java client and `pulsar-admin` use (`JSON`, `AVRO`, `PROTOBUF`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "STRING",
            Self::Json => "JSON",
            Self::Protobuf => "PROTOBUF",
            Self::Avro => "AVRO",
            Self::ProtobufNative => "PROTOBUF_NATIVE",
            Self::Bool => "BOOLEAN",
            Self::Int8 => "INT8",
            Self::Int16 => "INT16",
            Self::Int32 => "INT32",
            Self::Int64 => "INT64",
            Self::Float => "FLOAT",
            Self::Double => "DOUBLE",
        }
    }

    /// The protocol's `Schema.Type` number.
    pub fn code(self) -> i32 {
        self.wire() as i32
    }

    pub(crate) fn wire(self) -> pb::schema::Type {
        use pb::schema::Type;
        match self {
            Self::String => Type::String,
            Self::Json => Type::Json,
            Self::Protobuf => Type::Protobuf,
            Self::Avro => Type::Avro,
            Self::ProtobufNative => Type::ProtobufNative,
            Self::Bool => Type::Bool,
            Self::Int8 => Type::Int8,
            Self::Int16 => Type::Int16,
            Self::Int32 => Type::Int32,
            Self::Int64 => Type::Int64,
            Self::Float => Type::Float,
            Self::Double => Type::Double,
        }
    }

    /// The kind of the protocol's `Schema.Type` number `code`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a number that is not a schema type, or the type of a kind this
    /// crate does not support (`NONE`/bytes, `KEY_VALUE`, `AUTO_CONSUME`, dates and times).
    pub fn from_code(code: i32) -> Result<Self, Error> {
        KINDS
            .into_iter()
            .find(|kind| kind.code() == code)
            .ok_or_else(|| Error::Invalid {
                what: "schema kind",
                reason: match pb::schema::Type::try_from(code) {
                    Ok(pb::schema::Type::None) => {
                        "type 0 is NONE (bytes): set no schema for bytes".into()
                    }
                    Ok(other) => format!(
                        "type {code} ({}) is not supported; supported: {}",
                        other.as_str_name(),
                        supported_kinds()
                    ),
                    Err(_) => format!(
                        "{code} is not a schema type of the protocol; supported: {}",
                        supported_kinds()
                    ),
                },
            })
    }

    /// Whether schemas of this kind carry an Avro-style definition (JSON, Avro, Protobuf).
    pub fn is_struct(self) -> bool {
        matches!(self, Self::Json | Self::Avro | Self::Protobuf)
    }

    /// Whether schemas of this kind have a definition at all (the struct kinds and
    /// `PROTOBUF_NATIVE`).
    pub fn has_definition(self) -> bool {
        self.is_struct() || self == Self::ProtobufNative
    }
}

fn supported_kinds() -> String {
    KINDS.map(SchemaKind::as_str).join(", ")
}

impl fmt::Display for SchemaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SchemaKind {
    type Err = Error;

    /// Parses the name as [`SchemaKind::as_str`] writes it, in any case (`"json"`,
    /// `"Avro"`, `"PROTOBUF_NATIVE"`; `"BOOL"` for `BOOLEAN` too).
    fn from_str(name: &str) -> Result<Self, Error> {
        let upper = name.trim().to_ascii_uppercase();
        if upper == "BOOL" {
            return Ok(Self::Bool);
        }
        KINDS
            .into_iter()
            .find(|kind| kind.as_str() == upper)
            .ok_or_else(|| Error::Invalid {
                what: "schema kind",
                reason: if upper == "BYTES" || upper == "NONE" {
                    "bytes is the default: set no schema".into()
                } else {
                    format!(
                        "{name:?} is not supported; supported: {}",
                        supported_kinds()
                    )
                },
            })
    }
}

/// A schema as producers and consumers send it: its kind, definition, name and properties
/// (the Java client's `SchemaInfo`). Built with [`Schema::builder`], which checks it.
///
/// Two schemas are the same version in the broker's registry when their kind and definition
/// bytes are equal (the name and properties do not count); to share a topic with a Java
/// `JSONSchema`, `AvroSchema` or `ProtobufSchema`, use the definition it registered
/// (`pulsar-admin schemas get <topic>`), byte for byte, or one compatible with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    kind: SchemaKind,
    name: String,
    definition: Bytes,
    properties: Vec<(String, String)>,
}

impl Schema {
    /// Starts a schema of `kind`.
    pub fn builder(kind: SchemaKind) -> SchemaBuilder {
        SchemaBuilder {
            kind,
            name: String::new(),
            definition: Bytes::new(),
            properties: Vec::new(),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> SchemaKind {
        self.kind
    }

    /// Its name (empty by default, as the Java client sends it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its definition (`schema_data`): for the struct kinds an Avro schema in JSON.
    pub fn definition(&self) -> &Bytes {
        &self.definition
    }

    /// Its properties, sorted by key.
    pub fn properties(&self) -> &[(String, String)] {
        &self.properties
    }

    /// A property's value.
    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The protocol's `Schema`.
    pub(crate) fn wire(&self) -> pb::Schema {
        pb::Schema {
            name: self.name.clone(),
            schema_data: self.definition.to_vec(),
            r#type: self.kind.code(),
            properties: self
                .properties
                .iter()
                .map(|(key, value)| pb::KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

/// Builds a [`Schema`] ([`Schema::builder`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct SchemaBuilder {
    kind: SchemaKind,
    name: String,
    definition: Bytes,
    properties: Vec<(String, String)>,
}

impl SchemaBuilder {
    /// The definition (`schema_data`): for JSON, Avro and Protobuf an Avro schema in JSON
    /// (a record, as the Java client derives it from a class); for `PROTOBUF_NATIVE` the
    /// JSON the Java client writes (descriptor set, root message, file name); nothing for
    /// the other kinds.
    pub fn definition(mut self, definition: impl Into<Bytes>) -> Self {
        self.definition = definition.into();
        self
    }

    /// The name (empty by default; the broker does not compare names).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets a property (replacing an earlier value of the key).
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into();
        let value = value.into();
        match self.properties.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.properties.push((key, value)),
        }
        self
    }

    /// Checks and returns the schema.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`what: "schema definition"`) when a kind with a definition
    /// (JSON, Avro, Protobuf, Protobuf native) has none, one larger than
    /// [`MAX_SCHEMA_DEFINITION`], one that is not UTF-8 JSON of the expected shape (an
    /// object, or for Avro a quoted primitive name), or when a kind without a definition has
    /// one. With the `avro` feature, the definitions of the struct kinds are also parsed as
    /// Avro schemas, as the broker does; without it only their JSON shape is checked and the
    /// broker's refusal ([`Error::IncompatibleSchema`], "Invalid schema definition") comes at
    /// `PRODUCER` or `SUBSCRIBE`.
    pub fn build(mut self) -> Result<Schema, Error> {
        check_definition(self.kind, &self.definition)?;
        self.properties.sort();
        Ok(Schema {
            kind: self.kind,
            name: self.name,
            definition: self.definition,
            properties: self.properties,
        })
    }
}

fn invalid(reason: String) -> Error {
    Error::Invalid {
        what: "schema definition",
        reason,
    }
}

fn check_definition(kind: SchemaKind, definition: &[u8]) -> Result<(), Error> {
    if !kind.has_definition() {
        return if definition.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!(
                "a {kind} schema has no definition ({} bytes given)",
                definition.len()
            )))
        };
    }
    if definition.is_empty() {
        return Err(invalid(format!(
            "a {kind} schema needs a definition{}",
            if kind.is_struct() {
                ": an Avro schema in JSON, such as {\"type\":\"record\",\"name\":\"Order\",\"fields\":[…]}"
            } else {
                ""
            }
        )));
    }
    if definition.len() > MAX_SCHEMA_DEFINITION {
        return Err(invalid(format!(
            "{} bytes exceed the limit of {MAX_SCHEMA_DEFINITION}",
            definition.len()
        )));
    }
    let Ok(text) = std::str::from_utf8(definition) else {
        return Err(invalid(format!("the {kind} definition is not UTF-8")));
    };
    let text = text.trim();
    let object = text.starts_with('{') && text.ends_with('}');
    let primitive =
        kind == SchemaKind::Avro && text.len() >= 2 && text.starts_with('"') && text.ends_with('"');
    if !(object || primitive) {
        return Err(invalid(format!(
            "the {kind} definition is not a JSON object: {}",
            excerpt(text)
        )));
    }
    #[cfg(feature = "avro")]
    if kind.is_struct() {
        apache_avro::Schema::parse_str(text).map_err(|error| {
            invalid(format!(
                "the {kind} definition is not an Avro schema ({error}): {}",
                excerpt(text)
            ))
        })?;
    }
    Ok(())
}

/// The start of `text`, for an error message.
fn excerpt(text: &str) -> String {
    let mut end = text.len().min(80);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{}…", &text[..end])
    } else {
        text.to_owned()
    }
}

/// The error type of a [`SchemaCodec`]'s encoding and decoding.
pub type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// Turns values of one type into payloads and back, for one [`Schema`]: what a typed
/// producer ([`crate::TypedProducer`]) and consumer ([`crate::TypedConsumer`]) use.
///
/// This crate implements it for JSON (`JsonSchema`, feature `json`), Avro
/// (`AvroSchema`, feature `avro`) and Protobuf (`ProtobufSchema`, feature `protobuf`);
/// implement it for any other format.
pub trait SchemaCodec: Send + Sync + 'static {
    /// The values.
    type Value;

    /// The schema sent in `PRODUCER` and `SUBSCRIBE`.
    fn schema(&self) -> &Schema;

    /// A value's payload.
    ///
    /// # Errors
    /// What made the value impossible to write (the typed producer reports it as
    /// [`Error::SchemaEncode`]).
    fn encode(&self, value: &Self::Value) -> Result<Bytes, CodecError>;

    /// The value of a payload.
    ///
    /// # Errors
    /// What made the payload impossible to read (the typed consumer reports it as
    /// [`Error::SchemaDecode`], with the message's id).
    fn decode(&self, payload: &[u8]) -> Result<Self::Value, CodecError>;
}

/// The properties the Java client sets on its `JSONSchema` and `AvroSchema` by default.
#[cfg(any(feature = "json", feature = "avro"))]
fn java_struct_properties(builder: SchemaBuilder) -> SchemaBuilder {
    builder
        .property(ALWAYS_ALLOW_NULL, "true")
        .property(JSR310_CONVERSION_ENABLED, "false")
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORD: &str =
        r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}"#;

    #[test]
    fn kinds_round_trip_by_code_and_name() {
        for kind in KINDS {
            assert_eq!(SchemaKind::from_code(kind.code()).unwrap(), kind);
            assert_eq!(kind.as_str().parse::<SchemaKind>().unwrap(), kind);
            assert_eq!(
                kind.as_str().to_lowercase().parse::<SchemaKind>().unwrap(),
                kind
            );
        }
        assert_eq!(SchemaKind::Json.code(), 2);
        assert_eq!(SchemaKind::Protobuf.code(), 3);
        assert_eq!(SchemaKind::Avro.code(), 4);
        assert_eq!(SchemaKind::ProtobufNative.code(), 20);
    }

    #[test]
    fn unknown_and_unsupported_kinds_are_refused() {
        for (code, says) in [
            (0, "set no schema"),
            (15, "KeyValue"),
            (21, "AutoConsume"),
            (99, "not a schema type"),
            (-1, "not a schema type"),
        ] {
            let error = SchemaKind::from_code(code).unwrap_err();
            assert!(matches!(
                error,
                Error::Invalid {
                    what: "schema kind",
                    ..
                }
            ));
            assert!(error.to_string().contains(says), "{error}");
        }
        for name in ["xml", "", "key_value"] {
            let error = name.parse::<SchemaKind>().unwrap_err();
            assert!(
                error.to_string().contains("supported: STRING, JSON"),
                "{error}"
            );
        }
        assert!(
            "bytes"
                .parse::<SchemaKind>()
                .unwrap_err()
                .to_string()
                .contains("no schema")
        );
    }

    #[test]
    fn definitions_are_checked() {
        for kind in [SchemaKind::Json, SchemaKind::Avro, SchemaKind::Protobuf] {
            let error = Schema::builder(kind).build().unwrap_err();
            assert!(error.to_string().contains("needs a definition"), "{error}");
            let error = Schema::builder(kind)
                .definition("not json")
                .build()
                .unwrap_err();
            assert!(error.to_string().contains("not a JSON object"), "{error}");
            let error = Schema::builder(kind)
                .definition(vec![0xff, 0xfe])
                .build()
                .unwrap_err();
            assert!(error.to_string().contains("not UTF-8"), "{error}");
            let schema = Schema::builder(kind).definition(RECORD).build().unwrap();
            assert_eq!(schema.definition(), RECORD.as_bytes());
        }
        let error = Schema::builder(SchemaKind::String)
            .definition("x")
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("has no definition"), "{error}");
        assert!(Schema::builder(SchemaKind::String).build().is_ok());
        assert!(
            Schema::builder(SchemaKind::Avro)
                .definition("\"string\"")
                .build()
                .is_ok()
        );
    }

    #[cfg(feature = "avro")]
    #[test]
    fn struct_definitions_are_parsed_as_avro() {
        let error = Schema::builder(SchemaKind::Json)
            .definition(r#"{"type":"record","name":"Order"}"#)
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("not an Avro schema"), "{error}");
    }

    #[test]
    fn the_wire_schema_has_sorted_properties() {
        let schema = Schema::builder(SchemaKind::Json)
            .definition(RECORD)
            .property("b", "2")
            .property("a", "1")
            .property("b", "3")
            .build()
            .unwrap();
        let wire = schema.wire();
        assert_eq!(wire.r#type, 2);
        assert_eq!(wire.name, "");
        assert_eq!(wire.schema_data, RECORD.as_bytes());
        let keys: Vec<_> = wire
            .properties
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(keys, [("a", "1"), ("b", "3")]);
    }
}
