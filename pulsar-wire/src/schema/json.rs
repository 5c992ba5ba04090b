//! [`JsonSchema`]: JSON values with serde, as the Java client's `JSONSchema` writes them.

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CodecError, Schema, SchemaCodec, SchemaKind, java_struct_properties};
use crate::error::Error;

/// JSON values of `T` (serde), under a `JSON` schema whose definition is an Avro record
/// schema in JSON, as the Java client's `JSONSchema` registers it.
///
/// The definition is given ([`JsonSchema::new`]), or with the `avro` feature derived from
/// `T`'s `apache_avro::AvroSchema` implementation ([`JsonSchema::derived`]; the
/// `#[derive(AvroSchema)]` of the `apache-avro` crate with its `derive` feature). Values are
/// written with `serde_json` (fields of `None` as `null`; the Java client leaves them out,
/// and either reads both) and read leniently: unknown fields are ignored, as the Java client
/// ignores them.
///
/// ```
/// # #[cfg(feature = "json")] {
/// use pulsar_wire::{JsonSchema, SchemaCodec};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: i64, item: Option<String> }
///
/// let codec = JsonSchema::<Order>::new(
///     r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},
///        {"name":"item","type":["null","string"],"default":null}]}"#,
/// )?;
/// let payload = codec.encode(&Order { id: 7, item: None })?;
/// assert_eq!(codec.decode(&payload)?, Order { id: 7, item: None });
/// # }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub struct JsonSchema<T> {
    schema: Schema,
    values: PhantomData<fn(T) -> T>,
}

impl<T> fmt::Debug for JsonSchema<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonSchema")
            .field("schema", &self.schema)
            .finish()
    }
}

impl<T> Clone for JsonSchema<T> {
    fn clone(&self) -> Self {
        Self {
            schema: self.schema.clone(),
            values: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> JsonSchema<T> {
    /// A `JSON` schema with `definition` (an Avro record schema in JSON) and the properties
    /// the Java client sets by default (`__alwaysAllowNull` true, `__jsr310ConversionEnabled`
    /// false).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a missing or malformed definition ([`super::SchemaBuilder::build`]).
    pub fn new(definition: impl Into<Bytes>) -> Result<Self, Error> {
        let schema = java_struct_properties(Schema::builder(SchemaKind::Json))
            .definition(definition)
            .build()?;
        Ok(Self {
            schema,
            values: PhantomData,
        })
    }

    /// A codec for a schema built by hand (its name and properties as given).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the schema's kind is not `JSON`.
    pub fn with_schema(schema: Schema) -> Result<Self, Error> {
        if schema.kind() != SchemaKind::Json {
            return Err(Error::Invalid {
                what: "schema kind",
                reason: format!("a JsonSchema needs a JSON schema, not {}", schema.kind()),
            });
        }
        Ok(Self {
            schema,
            values: PhantomData,
        })
    }

    /// A `JSON` schema whose definition is derived from `T`'s Avro schema
    /// (`apache_avro::AvroSchema`, e.g. `#[derive(AvroSchema)]`), written as JSON. Fields are
    /// nullable only where `T` says so (`Option`): the Java client's derived definitions make
    /// every field nullable, so a topic shared with Java `JSONSchema` producers may need
    /// their definition instead ([`JsonSchema::new`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the derived schema cannot be written as JSON.
    #[cfg(feature = "avro")]
    pub fn derived() -> Result<Self, Error>
    where
        T: apache_avro::AvroSchema,
    {
        let definition =
            serde_json::to_string(&T::get_schema()).map_err(|error| Error::Invalid {
                what: "schema definition",
                reason: format!("the Avro schema derived for the type cannot be written: {error}"),
            })?;
        Self::new(definition)
    }
}

impl<T> SchemaCodec for JsonSchema<T>
where
    T: Serialize + DeserializeOwned + 'static,
{
    type Value = T;

    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn encode(&self, value: &T) -> Result<Bytes, CodecError> {
        Ok(serde_json::to_vec(value)?.into())
    }

    fn decode(&self, payload: &[u8]) -> Result<T, CodecError> {
        Ok(serde_json::from_slice(payload)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: i64,
        item: Option<String>,
    }

    const ORDER: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"item","type":["null","string"],"default":null}]}"#;

    #[test]
    fn values_round_trip_and_bad_payloads_are_errors() {
        let codec = JsonSchema::<Order>::new(ORDER).unwrap();
        assert_eq!(codec.schema().kind(), SchemaKind::Json);
        assert_eq!(
            codec.schema().property(super::super::ALWAYS_ALLOW_NULL),
            Some("true")
        );
        let value = Order {
            id: 3,
            item: Some("pen".into()),
        };
        let payload = codec.encode(&value).unwrap();
        assert_eq!(&payload[..], br#"{"id":3,"item":"pen"}"#);
        assert_eq!(codec.decode(&payload).unwrap(), value);
        // As Jackson writes it: a missing null field, an unknown field.
        let java = br#"{"id":4,"extra":true}"#;
        assert_eq!(codec.decode(java).unwrap(), Order { id: 4, item: None });
        assert!(codec.decode(b"{\"id\":\"x\"}").is_err());
        assert!(codec.decode(b"\xff").is_err());
    }

    #[test]
    fn a_schema_of_another_kind_is_refused() {
        let avro = Schema::builder(SchemaKind::Avro)
            .definition(ORDER)
            .build()
            .unwrap();
        assert!(JsonSchema::<Order>::with_schema(avro).is_err());
        assert!(JsonSchema::<Order>::new("").is_err());
    }
}
