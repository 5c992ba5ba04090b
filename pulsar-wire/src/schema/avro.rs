//! [`AvroSchema`]: Avro values with serde and `apache-avro`, as the Java client's
//! `AvroSchema` writes them.

use std::fmt;
use std::marker::PhantomData;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CodecError, Schema, SchemaCodec, SchemaKind, java_struct_properties};
use crate::error::Error;

/// Avro values of `T` (serde), under an `AVRO` schema, as the Java client's `AvroSchema`
/// writes them: each payload is one Avro binary datum of the definition (no container
/// header, no single-object marker).
///
/// The definition is given ([`AvroSchema::new`]) or derived from `T`'s
/// `apache_avro::AvroSchema` implementation ([`AvroSchema::derived`]). Payloads are read
/// with the same definition: a message written with another version of the topic's schema
/// (see [`crate::Message::schema_version`]) is read as if written with this one, which
/// works for identical definitions only; this codec does not fetch the writer's schema from
/// the registry.
///
/// ```
/// # #[cfg(feature = "avro")] {
/// use pulsar_wire::{AvroSchema, SchemaCodec};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Order { id: i64, item: Option<String> }
///
/// let codec = AvroSchema::<Order>::new(
///     r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},
///        {"name":"item","type":["null","string"],"default":null}]}"#,
/// )?;
/// let payload = codec.encode(&Order { id: 7, item: Some("pen".into()) })?;
/// assert_eq!(codec.decode(&payload)?, Order { id: 7, item: Some("pen".into()) });
/// # }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub struct AvroSchema<T> {
    schema: Schema,
    avro: apache_avro::Schema,
    values: PhantomData<fn(T) -> T>,
}

impl<T> fmt::Debug for AvroSchema<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AvroSchema")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl<T> Clone for AvroSchema<T> {
    fn clone(&self) -> Self {
        Self {
            schema: self.schema.clone(),
            avro: self.avro.clone(),
            values: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> AvroSchema<T> {
    /// An `AVRO` schema with `definition` (an Avro schema in JSON) and the properties the
    /// Java client sets by default (`__alwaysAllowNull` true, `__jsr310ConversionEnabled`
    /// false).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a missing definition or one that is not an Avro schema.
    pub fn new(definition: impl Into<Bytes>) -> Result<Self, Error> {
        Self::with_schema(
            java_struct_properties(Schema::builder(SchemaKind::Avro))
                .definition(definition)
                .build()?,
        )
    }

    /// A codec for a schema built by hand (its name and properties as given).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the schema's kind is not `AVRO`.
    pub fn with_schema(schema: Schema) -> Result<Self, Error> {
        if schema.kind() != SchemaKind::Avro {
            return Err(Error::Invalid {
                what: "schema kind",
                reason: format!("an AvroSchema needs an AVRO schema, not {}", schema.kind()),
            });
        }
        let text = std::str::from_utf8(schema.definition()).unwrap_or_default();
        let avro = apache_avro::Schema::parse_str(text).map_err(|error| Error::Invalid {
            what: "schema definition",
            reason: format!("not an Avro schema: {error}"),
        })?;
        Ok(Self {
            schema,
            avro,
            values: PhantomData,
        })
    }

    /// An `AVRO` schema derived from `T`'s Avro schema (`apache_avro::AvroSchema`, e.g.
    /// `#[derive(AvroSchema)]` of `apache-avro` with its `derive` feature), in its canonical
    /// JSON. Fields are nullable only where `T` says so (`Option`): the Java client's
    /// derived definitions make every field nullable, so a topic shared with Java
    /// `AvroSchema` producers may need their definition instead ([`AvroSchema::new`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the derived schema cannot be written.
    pub fn derived() -> Result<Self, Error>
    where
        T: apache_avro::AvroSchema,
    {
        let definition = T::get_schema().canonical_form();
        Self::new(definition)
    }
}

impl<T> SchemaCodec for AvroSchema<T>
where
    T: Serialize + DeserializeOwned + 'static,
{
    type Value = T;

    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn encode(&self, value: &T) -> Result<Bytes, CodecError> {
        let value = apache_avro::to_value(value)?.resolve(&self.avro)?;
        let writer = GenericDatumWriter::builder(&self.avro).build()?;
        Ok(writer.write_value_to_vec(value)?.into())
    }

    fn decode(&self, payload: &[u8]) -> Result<T, CodecError> {
        let reader = GenericDatumReader::builder(&self.avro).build()?;
        let mut input = payload;
        let value = reader.read_value(&mut input)?;
        if !input.is_empty() {
            return Err(format!(
                "{} bytes left after the Avro datum of {} bytes",
                input.len(),
                payload.len() - input.len()
            )
            .into());
        }
        Ok(apache_avro::from_value(&value)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq, apache_avro::AvroSchema)]
    struct Order {
        id: i64,
        item: Option<String>,
        price: f64,
    }

    const ORDER: &str = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"item","type":["null","string"],"default":null},{"name":"price","type":"double"}]}"#;

    #[test]
    fn values_round_trip_as_plain_datums() {
        let codec = AvroSchema::<Order>::new(ORDER).unwrap();
        let value = Order {
            id: 1,
            item: Some("a".into()),
            price: 2.5,
        };
        let payload = codec.encode(&value).unwrap();
        // long 1 (zig-zag 2), union branch 1 (2), string "a" (len 2, 'a'), double 2.5.
        assert_eq!(&payload[..5], &[2, 2, 2, b'a', 0]);
        assert_eq!(payload.len(), 4 + 8);
        assert_eq!(codec.decode(&payload).unwrap(), value);
        let none = Order {
            item: None,
            ..value
        };
        assert_eq!(codec.decode(&codec.encode(&none).unwrap()).unwrap(), none);
    }

    #[test]
    fn bad_payloads_and_definitions_are_errors() {
        let codec = AvroSchema::<Order>::new(ORDER).unwrap();
        assert!(codec.decode(&[2]).is_err());
        assert!(codec.decode(&[2, 4]).is_err());
        let mut long = codec
            .encode(&Order {
                id: 1,
                item: None,
                price: 0.0,
            })
            .unwrap()
            .to_vec();
        long.push(0);
        assert!(
            codec
                .decode(&long)
                .unwrap_err()
                .to_string()
                .contains("left after")
        );
        assert!(AvroSchema::<Order>::new(r#"{"type":"nope"}"#).is_err());
        assert!(AvroSchema::<Order>::new("").is_err());
    }

    #[test]
    fn derived_definitions_match_the_type() {
        let codec = AvroSchema::<Order>::derived().unwrap();
        let value = Order {
            id: -5,
            item: None,
            price: 1.0,
        };
        assert_eq!(codec.decode(&codec.encode(&value).unwrap()).unwrap(), value);
        let json = crate::schema::Schema::builder(SchemaKind::Json)
            .definition(codec.schema().definition().clone())
            .build();
        assert!(json.is_ok());
    }
}
