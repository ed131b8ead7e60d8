//! The Avro schemas in `schemas/` and their life in the registry.
//!
//! One file per topic, `schemas/<topic>.avsc`, registered under the subject
//! `<topic>-value` (Confluent's TopicNameStrategy). The files are compiled
//! into the binary, so `orderpipe` needs no checkout at run time; `--schemas
//! DIR` reads another folder instead (to check a change before it ships).
//!
//! [`check`] answers "may I ship these schemas?" twice: locally, with Avro's
//! schema-resolution rules (naming the field that breaks), and by asking the
//! registry's own compatibility endpoint. Either saying no is a no.

use std::path::Path;

use apache_avro::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use schema_registry_converter::async_impl::schema_registry::{
    get_schema_by_subject, is_compatible_schema, post_schema,
};
use schema_registry_converter::avro_common::get_supplied_schema;
use schema_registry_converter::schema_registry_common::SubjectNameStrategy;
use serde::Serialize;

use crate::codec::{CodecError, RegistrySettings, sr_settings};
use crate::topics::TopicsSettings;

/// The topic whose schema describes [`crate::envelope::Envelope`].
pub const ORDER_EVENTS_TOPIC: &str = "order.events.v1";

/// The topic of inventory events the relay writes with order events.
pub const INVENTORY_EVENTS_TOPIC: &str = "inventory.events.v1";

const EMBEDDED: &[(&str, &str)] = &[
    (
        ORDER_EVENTS_TOPIC,
        include_str!("../schemas/order.events.v1.avsc"),
    ),
    (
        INVENTORY_EVENTS_TOPIC,
        include_str!("../schemas/inventory.events.v1.avsc"),
    ),
];

/// Errors reading schema files.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is not a valid Avro schema.
    #[error("{path} is not a valid Avro schema: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message.
        reason: String,
    },
    /// The folder has no schema for a topic orderpipe writes.
    #[error("no schema for topic {0} (expected {0}.avsc)")]
    Missing(String),
}

/// The schema of one topic's values.
#[derive(Debug, Clone)]
pub struct TopicSchema {
    /// Topic name (file stem).
    pub topic: String,
    /// The schema as written.
    pub raw: String,
    /// The parsed schema.
    pub parsed: Schema,
}

impl AsRef<Schema> for TopicSchema {
    fn as_ref(&self) -> &Schema {
        &self.parsed
    }
}

/// All topic schemas orderpipe knows.
#[derive(Debug, Clone)]
pub struct SchemaCatalog {
    schemas: Vec<TopicSchema>,
}

impl SchemaCatalog {
    /// The schemas compiled into the binary.
    pub fn embedded() -> Self {
        let schemas = EMBEDDED
            .iter()
            .map(|(topic, raw)| TopicSchema {
                topic: topic.to_string(),
                raw: raw.to_string(),
                parsed: Schema::parse_str(raw).expect("embedded schemas are valid"),
            })
            .collect();
        Self { schemas }
    }

    /// Every `*.avsc` file of `dir`; it must hold the order events schema.
    pub fn from_dir(dir: &Path) -> Result<Self, SchemaError> {
        let io = |path: &Path, source| SchemaError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut schemas = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "avsc"))
            .collect();
        entries.sort();
        for path in entries {
            let raw = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
            let parsed = Schema::parse_str(&raw).map_err(|e| SchemaError::Parse {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let topic = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            schemas.push(TopicSchema { topic, raw, parsed });
        }
        let catalog = Self { schemas };
        catalog.get(ORDER_EVENTS_TOPIC)?;
        Ok(catalog)
    }

    /// The embedded catalog, or the one in `dir` when given.
    pub fn load(dir: Option<&Path>) -> Result<Self, SchemaError> {
        match dir {
            Some(dir) => Self::from_dir(dir),
            None => Ok(Self::embedded()),
        }
    }

    /// The schema of `topic`.
    pub fn get(&self, topic: &str) -> Result<&TopicSchema, SchemaError> {
        self.schemas
            .iter()
            .find(|s| s.topic == topic)
            .ok_or_else(|| SchemaError::Missing(topic.to_string()))
    }

    /// The schema of `order.events.v1`.
    pub fn order_events(&self) -> &TopicSchema {
        self.get(ORDER_EVENTS_TOPIC)
            .expect("catalogs always hold the order events schema")
    }

    /// The schema of `inventory.events.v1`, if the catalog has one.
    pub fn inventory_events(&self) -> Result<&TopicSchema, SchemaError> {
        self.get(INVENTORY_EVENTS_TOPIC)
    }

    /// All schemas.
    pub fn iter(&self) -> impl Iterator<Item = &TopicSchema> {
        self.schemas.iter()
    }
}

/// Result of registering one subject.
#[derive(Debug, Serialize)]
pub struct Registered {
    /// The subject.
    pub subject: String,
    /// The registry's schema id.
    pub id: u32,
}

/// Registers every schema under its subject (an already registered schema
/// returns its existing id; an incompatible one is refused by the registry).
pub async fn register(
    registry: &RegistrySettings,
    topics: &TopicsSettings,
    catalog: &SchemaCatalog,
) -> Result<Vec<Registered>, CodecError> {
    let client = sr_settings(registry)?;
    let mut out = Vec::new();
    for schema in catalog.iter() {
        let subject = subject(topics, schema);
        let registered = post_schema(
            &client,
            subject.clone(),
            get_supplied_schema(&schema.parsed),
        )
        .await
        .map_err(|e| registry_error(&subject, e))?;
        out.push(Registered {
            subject,
            id: registered.id,
        });
    }
    Ok(out)
}

/// `<configured topic>-value` (Confluent's TopicNameStrategy).
pub fn subject(topics: &TopicsSettings, schema: &TopicSchema) -> String {
    format!("{}-value", topics.name_for_schema(&schema.topic))
}

/// A registry client error about `subject`: retryable (unavailable) or not.
pub(crate) fn registry_error(
    subject: &str,
    e: schema_registry_converter::error::SRCError,
) -> CodecError {
    let text = match &e.cause {
        Some(cause) => format!("{subject}: {} ({cause})", e.error),
        None => format!("{subject}: {}", e.error),
    };
    if e.retriable || text.contains("error sending request") {
        CodecError::RegistryUnavailable(text)
    } else {
        CodecError::Registry(text)
    }
}

/// Compatibility level of the local check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompatLevel {
    /// New schema reads data written with the registered one (Confluent default).
    Backward,
    /// The registered schema reads data written with the new one.
    Forward,
    /// Both.
    Full,
}

/// Verdict on one subject.
#[derive(Debug, Serialize)]
pub struct CompatReport {
    /// The subject.
    pub subject: String,
    /// Latest registered version's id, if the subject exists.
    pub registered_id: Option<u32>,
    /// Local check: `None` when compatible, else the reason (naming the field).
    pub local_problem: Option<String>,
    /// The registry's own verdict (absent for a new subject).
    pub registry_compatible: Option<bool>,
}

impl CompatReport {
    /// Both checks passed (or the subject is new).
    pub fn is_compatible(&self) -> bool {
        self.local_problem.is_none() && self.registry_compatible != Some(false)
    }
}

/// Local Avro resolution check between the registered (`old`) and local
/// (`new`) schema at `level`; the message names the field that breaks.
pub fn local_compat(old: &Schema, new: &Schema, level: CompatLevel) -> Option<String> {
    let backward = || can_read(old, new, "").err();
    let forward = || can_read(new, old, "").err();
    let problem = match level {
        CompatLevel::Backward => backward().map(|e| ("backward", e)),
        CompatLevel::Forward => forward().map(|e| ("forward", e)),
        CompatLevel::Full => backward()
            .map(|e| ("backward", e))
            .or_else(|| forward().map(|e| ("forward", e))),
    };
    problem.map(|(direction, e)| {
        let hint = match direction {
            "backward" => "the new schema cannot read data written with the registered one",
            _ => "readers on the registered schema cannot read data written with the new one",
        };
        format!("{direction} incompatible ({hint}): {e}")
    })
}

/// Whether `reader` can read everything `writer` wrote, field by field.
///
/// Avro's own checker accepts a union when *one* branch matches; here every
/// writer branch must be readable by the reader's branch of the same name,
/// so a field added without a default inside one event's payload is caught.
fn can_read(writer: &Schema, reader: &Schema, path: &str) -> Result<(), String> {
    let join = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    match (writer, reader) {
        (Schema::Record(w), Schema::Record(r)) => {
            for field in &r.fields {
                let field_path = join(&field.name);
                match w.fields.iter().find(|f| f.name == field.name) {
                    Some(wf) => can_read(&wf.schema, &field.schema, &field_path)?,
                    None if field.default.is_some() => {}
                    None => {
                        return Err(format!(
                            "field `{field_path}` is new and has no default; add a default so data written without it can be read"
                        ));
                    }
                }
            }
            Ok(())
        }
        (Schema::Union(w), Schema::Union(r)) => {
            for branch in w.variants() {
                let name = branch_name(branch);
                let counterpart = r.variants().iter().find(|b| branch_name(b) == name);
                match counterpart {
                    Some(b) => can_read(branch, b, &join(&name))?,
                    None => {
                        return Err(format!(
                            "`{path}` no longer has the union branch `{name}` that existing data uses"
                        ));
                    }
                }
            }
            Ok(())
        }
        _ => SchemaCompatibility::can_read(writer, reader)
            .map(|_| ())
            .map_err(|e| format!("`{path}`: {e}")),
    }
}

/// A union branch's identity: the record name, or the type for primitives.
fn branch_name(schema: &Schema) -> String {
    match schema {
        Schema::Record(r) => r.name.name().to_string(),
        Schema::Enum(e) => e.name.name().to_string(),
        Schema::Fixed(f) => f.name.name().to_string(),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)),
    }
}

/// Compares every local schema with the latest registered version.
pub async fn check(
    registry: &RegistrySettings,
    topics: &TopicsSettings,
    catalog: &SchemaCatalog,
    level: CompatLevel,
) -> Result<Vec<CompatReport>, CodecError> {
    let client = sr_settings(registry)?;
    let mut out = Vec::new();
    for schema in catalog.iter() {
        let subject = subject(topics, schema);
        let topic = topics.name_for_schema(&schema.topic);
        let strategy = SubjectNameStrategy::TopicNameStrategy(topic, false);
        let latest = match get_schema_by_subject(&client, &strategy).await {
            Ok(latest) => latest,
            Err(e) if !e.retriable && format!("{e}").contains("404") => {
                out.push(CompatReport {
                    subject,
                    registered_id: None,
                    local_problem: None,
                    registry_compatible: None,
                });
                continue;
            }
            Err(e) => return Err(registry_error(&subject, e)),
        };
        let old = Schema::parse_str(&latest.schema).map_err(|e| {
            CodecError::Registry(format!("{subject}: registered schema does not parse: {e}"))
        })?;
        let local_problem = local_compat(&old, &schema.parsed, level);
        let registry_compatible = is_compatible_schema(
            &client,
            subject.clone(),
            get_supplied_schema(&schema.parsed),
        )
        .await
        .map_err(|e| registry_error(&subject, e))?;
        out.push(CompatReport {
            subject,
            registered_id: Some(latest.id),
            local_problem,
            registry_compatible: Some(registry_compatible),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_field(extra: &str) -> Schema {
        let raw = SchemaCatalog::embedded().order_events().raw.replace(
            r#"{"name": "paid_at", "type": "string", "doc": "ISO 8601 UTC"}"#,
            &format!(r#"{{"name": "paid_at", "type": "string"}}, {extra}"#),
        );
        Schema::parse_str(&raw).unwrap()
    }

    #[test]
    fn added_field_needs_a_default() {
        let old = SchemaCatalog::embedded().order_events().parsed.clone();
        let bad = with_field(r#"{"name": "channel", "type": "string"}"#);
        let problem = local_compat(&old, &bad, CompatLevel::Backward).unwrap();
        assert!(problem.contains("channel"), "{problem}");
        let good = with_field(r#"{"name": "channel", "type": "string", "default": "card"}"#);
        assert_eq!(local_compat(&old, &good, CompatLevel::Full), None);
    }
}
