//! [`ProtobufSchema`]: prost messages, as the Java client's `ProtobufSchema` writes them.

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;

use super::{CodecError, Schema, SchemaCodec, SchemaKind};
use crate::error::Error;

/// Protobuf messages of `T` (prost), under a `PROTOBUF` schema, as the Java client's
/// `ProtobufSchema` registers it: the payload is the message's protobuf encoding, the
/// definition an Avro record schema in JSON derived from the message's descriptor (Avro's
/// `ProtobufData`).
///
/// prost messages carry no descriptor, so the definition is **required**: take the one a
/// Java `ProtobufSchema` registered (`pulsar-admin schemas get <topic>`), or write the Avro
/// record by hand. The Java client also sets the property `__PARSING_INFO__` (the fields'
/// numbers, names, types and labels as JSON); the broker does not read it, and
/// [`ProtobufSchema::with_schema`] takes a schema with it where a peer wants it.
///
/// ```
/// # #[cfg(feature = "protobuf")] {
/// use pulsar_wire::{ProtobufSchema, SchemaCodec};
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct Order {
///     #[prost(int64, tag = "1")]
///     id: i64,
/// }
/// let codec = ProtobufSchema::<Order>::new(
///     r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long","default":0}]}"#,
/// )?;
/// let payload = codec.encode(&Order { id: 7 })?;
/// assert_eq!(codec.decode(&payload)?, Order { id: 7 });
/// # }
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// ```
pub struct ProtobufSchema<T> {
    schema: Schema,
    values: PhantomData<fn(T) -> T>,
}

impl<T> fmt::Debug for ProtobufSchema<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtobufSchema")
            .field("schema", &self.schema)
            .finish()
    }
}

impl<T> Clone for ProtobufSchema<T> {
    fn clone(&self) -> Self {
        Self {
            schema: self.schema.clone(),
            values: PhantomData,
        }
    }
}

impl<T: prost::Message + Default> ProtobufSchema<T> {
    /// A `PROTOBUF` schema with `definition` (the Avro record schema in JSON that describes
    /// the message) and no properties.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a missing or malformed definition ([`super::SchemaBuilder::build`]).
    pub fn new(definition: impl Into<Bytes>) -> Result<Self, Error> {
        Self::with_schema(
            Schema::builder(SchemaKind::Protobuf)
                .definition(definition)
                .build()?,
        )
    }

    /// A codec for a schema built by hand (its name and properties as given, e.g.
    /// `__PARSING_INFO__`).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the schema's kind is not `PROTOBUF`.
    pub fn with_schema(schema: Schema) -> Result<Self, Error> {
        if schema.kind() != SchemaKind::Protobuf {
            return Err(Error::Invalid {
                what: "schema kind",
                reason: format!(
                    "a ProtobufSchema needs a PROTOBUF schema, not {}",
                    schema.kind()
                ),
            });
        }
        Ok(Self {
            schema,
            values: PhantomData,
        })
    }
}

impl<T> SchemaCodec for ProtobufSchema<T>
where
    T: prost::Message + Default + 'static,
{
    type Value = T;

    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn encode(&self, value: &T) -> Result<Bytes, CodecError> {
        Ok(value.encode_to_vec().into())
    }

    fn decode(&self, payload: &[u8]) -> Result<T, CodecError> {
        Ok(T::decode(payload)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Order {
        #[prost(int64, tag = "1")]
        id: i64,
        #[prost(string, tag = "2")]
        item: String,
    }

    #[test]
    fn messages_round_trip_and_bad_payloads_are_errors() {
        let codec = ProtobufSchema::<Order>::new(
            r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long","default":0},{"name":"item","type":"string","default":""}]}"#,
        )
        .unwrap();
        assert_eq!(codec.schema().kind(), SchemaKind::Protobuf);
        let value = Order {
            id: 9,
            item: "ink".into(),
        };
        let payload = codec.encode(&value).unwrap();
        assert_eq!(codec.decode(&payload).unwrap(), value);
        assert!(codec.decode(&[0x0a, 0xff]).is_err());
        assert!(ProtobufSchema::<Order>::new("").is_err());
    }
}
