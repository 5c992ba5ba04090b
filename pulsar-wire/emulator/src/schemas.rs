//! The schema registry: one list of schema versions per topic (a partitioned topic's
//! partitions share their base topic's), as producers (`PRODUCER`) and consumers
//! (`SUBSCRIBE`) declare them.
//!
//! What the broker does, simplified: the first schema declared on a topic becomes version 0;
//! a schema equal to a version (same type and definition bytes; names and properties do not
//! count, as in the broker's `SchemaHash`) gets that version; a schema of another type is
//! refused with `IncompatibleSchema`; a struct schema (JSON, Avro, Protobuf) whose
//! definition is not a JSON object (or quoted Avro primitive) is refused with
//! `IncompatibleSchema` ("Invalid schema definition data", as the broker's validator says).
//! **Not modelled**: the compatibility strategies. A producer's new definition of the same
//! type becomes the next version without the Avro compatibility check (the broker checks it
//! against the latest version, FULL by default, and may refuse it); a consumer's is accepted
//! without becoming a version. Producers and consumers without a schema (bytes) are always
//! accepted (`schemaValidationEnforced` is off by default).

use std::collections::BTreeMap;

use pulsar_wire::pb::{Schema, ServerError, schema::Type};

use super::names::split_partition;

/// `(code, message)` of a refusal.
type Refusal = (ServerError, String);

/// The versions of every topic's schema.
#[derive(Debug, Default)]
pub(super) struct Schemas {
    topics: BTreeMap<String, Vec<Schema>>,
}

/// Who declares a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Declarer {
    Producer,
    Consumer,
}

impl Schemas {
    /// Checks `schema` declared on `topic` and registers it when it is the topic's first
    /// (or a producer's new definition): the version the broker answers (8 bytes, big-endian,
    /// as `LongSchemaVersion`), `None` for no schema, or the refusal.
    pub(super) fn declare(
        &mut self,
        topic: &str,
        schema: Option<&Schema>,
        by: Declarer,
    ) -> Result<Option<Vec<u8>>, Refusal> {
        let Some(schema) = schema else {
            return Ok(None);
        };
        let kind = Type::try_from(schema.r#type).map_err(|_| {
            (
                ServerError::IncompatibleSchema,
                format!("unknown schema type {}", schema.r#type),
            )
        })?;
        validate(kind, &schema.schema_data)?;
        let base = split_partition(topic).map_or(topic, |(base, _)| base);
        let versions = self.topics.entry(base.to_owned()).or_default();
        if let Some(version) = versions
            .iter()
            .position(|v| v.r#type == schema.r#type && v.schema_data == schema.schema_data)
        {
            return Ok(Some(version_bytes(version)));
        }
        if let Some(latest) = versions.last()
            && latest.r#type != schema.r#type
        {
            let exists = Type::try_from(latest.r#type).map_or("?", |t| t.as_str_name());
            return Err((
                ServerError::IncompatibleSchema,
                format!(
                    "org.apache.pulsar.broker.service.schema.exceptions.IncompatibleSchemaException: \
                     Incompatible schema: exists schema type {exists}, new schema type {}",
                    kind.as_str_name()
                ),
            ));
        }
        if !versions.is_empty() && by == Declarer::Consumer {
            // Checked for compatibility (not modelled), not registered.
            return Ok(Some(version_bytes(versions.len() - 1)));
        }
        versions.push(schema.clone());
        Ok(Some(version_bytes(versions.len() - 1)))
    }

    /// How many versions `topic` (a partitioned topic's base name) has.
    #[cfg(test)]
    pub(super) fn versions(&self, topic: &str) -> usize {
        let base = split_partition(topic).map_or(topic, |(base, _)| base);
        self.topics.get(base).map_or(0, Vec::len)
    }
}

fn version_bytes(index: usize) -> Vec<u8> {
    (index as u64).to_be_bytes().to_vec()
}

fn validate(kind: Type, data: &[u8]) -> Result<(), Refusal> {
    if !matches!(kind, Type::Json | Type::Avro | Type::Protobuf) {
        return Ok(());
    }
    let text = std::str::from_utf8(data).unwrap_or_default().trim();
    let object = text.starts_with('{') && text.ends_with('}');
    let primitive = text.len() >= 2 && text.starts_with('"') && text.ends_with('"');
    if object || primitive {
        Ok(())
    } else {
        Err((
            ServerError::IncompatibleSchema,
            format!(
                "Invalid schema definition data for {} schema",
                kind.as_str_name().to_ascii_uppercase()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(kind: Type, data: &str) -> Schema {
        Schema {
            name: String::new(),
            schema_data: data.as_bytes().to_vec(),
            r#type: kind as i32,
            properties: Vec::new(),
        }
    }

    #[test]
    fn versions_types_and_definitions() {
        let mut schemas = Schemas::default();
        let json = schema(Type::Json, r#"{"type":"record"}"#);
        let first = schemas.declare("t-partition-1", Some(&json), Declarer::Producer);
        assert_eq!(first, Ok(Some(vec![0; 8])));
        // The same schema on another partition, with other properties: the same version.
        let mut named = json.clone();
        named.name = "x".into();
        assert_eq!(
            schemas.declare("t-partition-0", Some(&named), Declarer::Consumer),
            Ok(Some(vec![0; 8]))
        );
        let avro = schema(Type::Avro, r#"{"type":"record"}"#);
        let (code, message) = schemas
            .declare("t", Some(&avro), Declarer::Consumer)
            .unwrap_err();
        assert_eq!(code, ServerError::IncompatibleSchema);
        assert!(
            message.contains("exists schema type Json, new schema type Avro"),
            "{message}"
        );
        let newer = schema(Type::Json, r#"{"type":"record","doc":"2"}"#);
        assert_eq!(
            schemas.declare("t", Some(&newer), Declarer::Consumer),
            Ok(Some(vec![0; 8]))
        );
        assert_eq!(schemas.versions("t"), 1);
        assert_eq!(
            schemas.declare("t", Some(&newer), Declarer::Producer),
            Ok(Some(vec![0, 0, 0, 0, 0, 0, 0, 1]))
        );
        assert_eq!(schemas.versions("t-partition-3"), 2);
        assert_eq!(schemas.declare("t", None, Declarer::Producer), Ok(None));
        let (code, _) = schemas
            .declare("u", Some(&schema(Type::Protobuf, "")), Declarer::Producer)
            .unwrap_err();
        assert_eq!(code, ServerError::IncompatibleSchema);
        assert_eq!(schemas.versions("u"), 0);
    }
}
