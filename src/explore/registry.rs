//! The schema registry as an operator reads it (the console's schemas
//! page): subjects, their versions and compatibility level, one version's
//! schema, and what changed between two versions.
//!
//! Subjects, versions and schemas come through `schema_registry_converter`
//! (the codec's client); the compatibility level (`GET /config[/subject]`,
//! which that crate does not ask) through the same base URL and
//! credentials. [`diff`] compares two schemas field by field (a union's
//! branches by name, so each event's payload is compared on its own) and
//! gives the verdict of [`crate::schema::local_compat`] both ways.

use apache_avro::Schema;
use schema_registry_converter::async_impl::schema_registry::{
    SrSettings, get_all_subjects, get_all_versions, get_schema_by_subject_and_version,
};
use secrecy::ExposeSecret;
use serde::Serialize;
use serde_json::Value;

use crate::codec::{CodecError, RegistrySettings, sr_settings};
use crate::schema::{CompatLevel, local_compat, registry_error};

/// A subject and what the registry holds of it.
#[derive(Debug, Clone, Serialize)]
pub struct SubjectSummary {
    /// The subject.
    pub subject: String,
    /// Its versions, oldest first.
    pub versions: Vec<u32>,
    /// The compatibility level that applies to it.
    pub compatibility: Compatibility,
}

/// The compatibility level that applies to a subject, and the registry's global one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Compatibility {
    /// `BACKWARD`, `FULL_TRANSITIVE`, `NONE`, ...: what applies to the subject.
    pub level: String,
    /// The registry's global level (Confluent's registry answers a subject
    /// without a level of its own with 404, Apicurio with the level that
    /// applies: a subject's own level shows as one that differs from this).
    pub global: String,
}

impl Compatibility {
    /// Whether the subject has a level other than the global one.
    pub fn own_level(&self) -> bool {
        self.level != self.global
    }
}

/// One registered version of a subject.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaVersion {
    /// The subject.
    pub subject: String,
    /// The version.
    pub version: u32,
    /// The registry's schema id (what records carry in their frame).
    pub id: u32,
    /// The schema, pretty-printed JSON.
    pub text: String,
}

/// What happened to one path of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Only in the newer version.
    Added,
    /// Only in the older version.
    Removed,
    /// In both, with another type or default.
    Changed,
}

/// One difference between two versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    /// Dotted path: field names, union branches by name (`data.OrderCreated.coupon`).
    pub path: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The older type (and default), compact JSON.
    pub old: Option<String>,
    /// The newer type (and default), compact JSON.
    pub new: Option<String>,
}

/// The difference of two versions and whether they can read each other's data.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaDiff {
    /// The older version.
    pub old: SchemaVersion,
    /// The newer version.
    pub new: SchemaVersion,
    /// Field by field.
    pub changes: Vec<FieldChange>,
    /// None: the newer schema reads data written with the older one; else why not.
    pub backward_problem: Option<String>,
    /// None: readers on the older schema read data written with the newer one; else why not.
    pub forward_problem: Option<String>,
}

/// The registry, read-only.
pub struct RegistryReader {
    settings: SrSettings,
    registry: RegistrySettings,
    http: reqwest::Client,
}

impl RegistryReader {
    /// A reader of `registry`.
    pub fn new(registry: &RegistrySettings) -> Result<Self, CodecError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_millis(registry.timeout_ms))
            .build()
            .map_err(|e| CodecError::Registry(e.to_string()))?;
        Ok(Self {
            settings: sr_settings(registry)?,
            registry: registry.clone(),
            http,
        })
    }

    /// Every subject with its versions and compatibility level, by name.
    pub async fn subjects(&self) -> Result<Vec<SubjectSummary>, CodecError> {
        let mut names = get_all_subjects(&self.settings)
            .await
            .map_err(|e| registry_error("subjects", e))?;
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for subject in names {
            out.push(self.subject(&subject).await?);
        }
        Ok(out)
    }

    /// One subject's versions and compatibility level.
    pub async fn subject(&self, subject: &str) -> Result<SubjectSummary, CodecError> {
        let mut versions = get_all_versions(&self.settings, subject.to_string())
            .await
            .map_err(|e| registry_error(subject, e))?;
        versions.sort_unstable();
        Ok(SubjectSummary {
            subject: subject.to_string(),
            versions,
            compatibility: self.compatibility(subject).await?,
        })
    }

    /// One version of a subject.
    pub async fn version(&self, subject: &str, version: u32) -> Result<SchemaVersion, CodecError> {
        let registered = get_schema_by_subject_and_version(&self.settings, subject, Some(version))
            .await
            .map_err(|e| registry_error(&format!("{subject} version {version}"), e))?;
        let text = serde_json::from_str::<Value>(&registered.schema)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or(registered.schema);
        Ok(SchemaVersion {
            subject: subject.to_string(),
            version,
            id: registered.id,
            text,
        })
    }

    /// The difference between two versions of a subject.
    pub async fn diff(&self, subject: &str, old: u32, new: u32) -> Result<SchemaDiff, CodecError> {
        let (old, new) = (
            self.version(subject, old).await?,
            self.version(subject, new).await?,
        );
        let parse = |v: &SchemaVersion| {
            Schema::parse_str(&v.text).map_err(|e| {
                CodecError::Registry(format!(
                    "{} version {} does not parse: {e}",
                    v.subject, v.version
                ))
            })
        };
        let (old_schema, new_schema) = (parse(&old)?, parse(&new)?);
        let json =
            |v: &SchemaVersion| serde_json::from_str::<Value>(&v.text).unwrap_or(Value::Null);
        let mut changes = Vec::new();
        compare("", &json(&old), &json(&new), &mut changes);
        Ok(SchemaDiff {
            backward_problem: local_compat(&old_schema, &new_schema, CompatLevel::Backward),
            forward_problem: local_compat(&old_schema, &new_schema, CompatLevel::Forward),
            changes,
            old,
            new,
        })
    }

    /// The level that applies to `subject`, and the global one.
    pub async fn compatibility(&self, subject: &str) -> Result<Compatibility, CodecError> {
        let base = self.registry.url.trim_end_matches('/');
        let global = self.config_level(&format!("{base}/config")).await?;
        let subject_url = format!(
            "{base}/config/{}",
            url::form_urlencoded::byte_serialize(subject.as_bytes()).collect::<String>()
        );
        let level = self.config_level(&subject_url).await?;
        Ok(Compatibility {
            level: level
                .clone()
                .or_else(|| global.clone())
                .unwrap_or_else(|| "BACKWARD".into()),
            global: global.or(level).unwrap_or_else(|| "BACKWARD".into()),
        })
    }

    /// The level a `GET /config[/subject]` answers; None for 404 (no level
    /// of the subject's own) or an answer that names none.
    async fn config_level(&self, url: &str) -> Result<Option<String>, CodecError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Config {
            compatibility_level: Option<String>,
            compatibility: Option<String>,
        }
        let mut request = self.http.get(url);
        if let Some(user) = &self.registry.username {
            request = request.basic_auth(
                user,
                self.registry
                    .password
                    .as_ref()
                    .map(|p| p.expose_secret().to_string()),
            );
        }
        let response = request
            .send()
            .await
            .map_err(|e| CodecError::RegistryUnavailable(format!("GET {url}: {e}")))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(CodecError::Registry(format!(
                "GET {url}: status {}",
                response.status()
            )));
        }
        let config: Config = response
            .json()
            .await
            .map_err(|e| CodecError::Registry(format!("GET {url}: {e}")))?;
        Ok(config.compatibility_level.or(config.compatibility))
    }
}

/// A type (and default) as compact JSON, docs left out.
fn summary(schema: &Value, default: Option<&Value>) -> String {
    let mut text = strip_docs(schema).to_string();
    if let Some(d) = default {
        text.push_str(&format!(" default {d}"));
    }
    text
}

fn strip_docs(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "doc")
                .map(|(k, v)| (k.clone(), strip_docs(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_docs).collect()),
        other => other.clone(),
    }
}

/// A union branch's name: its record/enum/fixed name, else its type.
fn branch_name(schema: &Value) -> String {
    match schema {
        Value::Object(map) => map
            .get("name")
            .or_else(|| map.get("type"))
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_default(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn fields(schema: &Value) -> Option<&Vec<Value>> {
    (schema.get("type")? == "record").then(|| schema.get("fields")?.as_array())?
}

/// Appends the differences of `old` and `new` at `path` to `out`.
fn compare(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    let join = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    if let (Some(old_fields), Some(new_fields)) = (fields(old), fields(new)) {
        let name = |f: &Value| {
            f.get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        for o in old_fields {
            let at = join(&name(o));
            match new_fields.iter().find(|n| name(n) == name(o)) {
                None => out.push(FieldChange {
                    path: at,
                    kind: ChangeKind::Removed,
                    old: Some(summary(&o["type"], o.get("default"))),
                    new: None,
                }),
                Some(n) => {
                    let before = out.len();
                    compare(&at, &o["type"], &n["type"], out);
                    if out.len() == before && o.get("default") != n.get("default") {
                        out.push(FieldChange {
                            path: at,
                            kind: ChangeKind::Changed,
                            old: Some(summary(&o["type"], o.get("default"))),
                            new: Some(summary(&n["type"], n.get("default"))),
                        });
                    }
                }
            }
        }
        for n in new_fields
            .iter()
            .filter(|n| !old_fields.iter().any(|o| name(o) == name(n)))
        {
            out.push(FieldChange {
                path: join(&name(n)),
                kind: ChangeKind::Added,
                old: None,
                new: Some(summary(&n["type"], n.get("default"))),
            });
        }
        return;
    }
    if let (Value::Array(old_branches), Value::Array(new_branches)) = (old, new) {
        for o in old_branches {
            match new_branches
                .iter()
                .find(|n| branch_name(n) == branch_name(o))
            {
                Some(n) => compare(&join(&branch_name(o)), o, n, out),
                None => out.push(FieldChange {
                    path: join(&branch_name(o)),
                    kind: ChangeKind::Removed,
                    old: Some(summary(o, None)),
                    new: None,
                }),
            }
        }
        for n in new_branches.iter().filter(|n| {
            !old_branches
                .iter()
                .any(|o| branch_name(o) == branch_name(n))
        }) {
            out.push(FieldChange {
                path: join(&branch_name(n)),
                kind: ChangeKind::Added,
                old: None,
                new: Some(summary(n, None)),
            });
        }
        return;
    }
    if strip_docs(old) != strip_docs(new) {
        out.push(FieldChange {
            path: if path.is_empty() {
                "<root>".into()
            } else {
                path.to_string()
            },
            kind: ChangeKind::Changed,
            old: Some(summary(old, None)),
            new: Some(summary(new, None)),
        });
    }
}

/// The field-by-field difference of two schema texts (for tests and callers with texts at hand).
pub fn diff_texts(old: &str, new: &str) -> Result<Vec<FieldChange>, serde_json::Error> {
    let mut out = Vec::new();
    compare(
        "",
        &serde_json::from_str(old)?,
        &serde_json::from_str(new)?,
        &mut out,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_names_added_removed_and_changed_fields_inside_union_branches() {
        let old = r#"{"type":"record","name":"E","fields":[
            {"name":"id","type":"string","doc":"x"},
            {"name":"gone","type":"int"},
            {"name":"data","type":[{"type":"record","name":"A","fields":[{"name":"n","type":"int"}]},
                                   {"type":"record","name":"B","fields":[]}]}]}"#;
        let new = r#"{"type":"record","name":"E","fields":[
            {"name":"id","type":"string","doc":"changed doc only"},
            {"name":"data","type":[{"type":"record","name":"A","fields":[{"name":"n","type":"long"},
                                        {"name":"coupon","type":["null","string"],"default":null}]},
                                   {"type":"record","name":"C","fields":[]}]}]}"#;
        let changes = diff_texts(old, new).unwrap();
        let brief: Vec<(String, ChangeKind)> =
            changes.iter().map(|c| (c.path.clone(), c.kind)).collect();
        assert_eq!(
            brief,
            [
                ("gone".to_string(), ChangeKind::Removed),
                ("data.A.n".to_string(), ChangeKind::Changed),
                ("data.A.coupon".to_string(), ChangeKind::Added),
                ("data.B".to_string(), ChangeKind::Removed),
                ("data.C".to_string(), ChangeKind::Added),
            ]
        );
        assert_eq!(changes[1].old.as_deref(), Some(r#""int""#));
        assert_eq!(
            changes[2].new.as_deref(),
            Some(r#"["null","string"] default null"#)
        );
        assert!(diff_texts(old, old).unwrap().is_empty());
    }
}
