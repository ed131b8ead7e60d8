//! Per-table Avro value schemas (`[cdc] value_format = "avro"`).
//!
//! The envelope is `change.avsc`'s (same fields, same order), renamed to
//! `orderpipe.cdc.v1.tables.<db>.<table>.Change`, with `data` and `old` as
//! nullable records (`...<table>.Row`) of the table's columns, every column
//! a nullable field with default null, plus `changed`: the names of the
//! columns an update changed. Columns come from the binlog's table map
//! (names need `binlog_row_metadata=FULL`), so a column added by
//! `ALTER TABLE` gives the next change a new schema: a BACKWARD-compatible
//! new version of the topic's value subject (a new optional field).
//!
//! `old` holds the changed columns' previous values; `changed` lists the
//! columns, because in a nullable record a column whose previous value was
//! NULL could not be told from an unchanged one.
//!
//! Column types ([`super::column::avro_type`], the table in `docs/cdc.md`):
//! integers, BIT and YEAR are `long`, except BIGINT UNSIGNED and BIT(64)
//! (values above 2^63-1), which are `bytes` with the `decimal` logical type
//! (precision 20, scale 0); FLOAT is `float`, DOUBLE `double`, binary
//! columns and spatial values `bytes`; everything else `string` with the
//! JSON form's text. Each Avro type stands for one JSON form, so decoding
//! ([`untyped_value`]) turns a typed change back into exactly the JSON
//! `data`/`old` the JSON form carries, and consumers see one
//! [`crate::envelope::EventData::RowChange`].

use apache_avro::Schema;
use apache_avro::types::Value;
use serde::{Deserialize, Serialize};

use super::change::CHANGE_SCHEMA;
use super::column::{Column, avro_type, avro_value};
pub use crate::codec::row_change::{TABLES_NAMESPACE, is_table_change, untyped_value};
use crate::schema::TopicSchema;

/// How `orderpipe cdc` writes the values of its change topics (`[cdc] value_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// One envelope schema for every table, `data`/`old` as JSON text.
    #[default]
    Json,
    /// One schema per table with typed `data`/`old` records.
    Avro,
}

/// A table's columns in table order, from a table map (refined by
/// `information_schema`) or, for the snapshot, from `information_schema`:
/// the one description the stream and the snapshot share.
#[derive(Debug, Clone, PartialEq)]
pub struct TableColumns {
    /// The columns.
    pub columns: Vec<Column>,
}

impl TableColumns {
    /// The column names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }
}

/// An Avro name: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_avro_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The change schema of `database.table` with `columns`, for `topic`.
/// Names that Avro does not accept are refused, naming them
/// (`value_format = "json"` carries any name).
pub fn table_schema(
    topic: &str,
    database: &str,
    table: &str,
    columns: &TableColumns,
) -> Result<TopicSchema, String> {
    for (what, name) in [("database", database), ("table", table)]
        .into_iter()
        .chain(columns.names().map(|c| ("column", c)))
    {
        if !is_avro_name(name) {
            return Err(format!(
                "{what} `{name}` of {database}.{table} is not an Avro name ([A-Za-z_][A-Za-z0-9_]*): cdc.value_format = \"avro\" cannot write it; use \"json\""
            ));
        }
    }
    let mut envelope: serde_json::Value =
        serde_json::from_str(CHANGE_SCHEMA).expect("change.avsc is JSON");
    let row_fields: Vec<serde_json::Value> = columns
        .columns
        .iter()
        .map(|c| serde_json::json!({"name": c.name, "type": ["null", avro_type(&c.kind)], "default": null}))
        .collect();
    let namespace = format!("{TABLES_NAMESPACE}.{database}.{table}");
    envelope["name"] = "Change".into();
    envelope["namespace"] = namespace.clone().into();
    envelope["doc"] = format!("One row change of {database}.{table} read from the binlog by `orderpipe cdc` (value_format avro): change.avsc's fields, data and old typed by the table's columns.").into();
    let fields = envelope["fields"].as_array_mut().expect("fields");
    let mut typed = Vec::with_capacity(fields.len() + 1);
    for field in fields.drain(..) {
        match field["name"].as_str() {
            Some("data") => typed.push(serde_json::json!({
                "name": "data", "default": null,
                "type": ["null", {"type": "record", "name": "Row", "fields": row_fields}],
                "doc": "the row after the change (for a delete, the row deleted)"})),
            Some("old") => {
                typed.push(
                    serde_json::json!({"name": "old", "type": ["null", "Row"], "default": null,
                    "doc": "updates: the changed columns' previous values (the others null)"}),
                );
                typed.push(serde_json::json!({"name": "changed", "default": null,
                    "type": ["null", {"type": "array", "items": "string"}],
                    "doc": "updates: the names of the changed columns (a previous value may be null)"}));
            }
            _ => typed.push(field),
        }
    }
    *fields = typed;
    let raw = envelope.to_string();
    let parsed =
        Schema::parse_str(&raw).map_err(|e| format!("schema of {database}.{table}: {e}"))?;
    Ok(TopicSchema {
        topic: topic.to_string(),
        raw,
        parsed,
    })
}

/// `record` (a JSON object) as a value of the `Row` record of `columns`;
/// an error names the column.
fn row_value(
    record: &serde_json::Value,
    columns: &TableColumns,
    only: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Value, String> {
    let null = Value::Union(0, Box::new(Value::Null));
    let mut fields = Vec::with_capacity(columns.columns.len());
    for column in &columns.columns {
        let name = &column.name;
        let json = match only {
            Some(only) => only.get(name),
            None => record.get(name),
        };
        let value = match json {
            None | Some(serde_json::Value::Null) => null.clone(),
            Some(j) => Value::Union(
                1,
                Box::new(avro_value(&column.kind, j).map_err(|e| format!("column `{name}`: {e}"))?),
            ),
        };
        fields.push((name.clone(), value));
    }
    Ok(Value::Record(fields))
}

/// The typed record of `change_avro` (a `change.avsc` record, see
/// [`super::change::ChangeEvent::to_avro`]) for [`table_schema`]: `data`,
/// `old` and `changed` replaced. Errors name the column.
pub fn typed_value(
    change_avro: Value,
    data: &serde_json::Value,
    old: Option<&serde_json::Value>,
    columns: &TableColumns,
) -> Result<Value, String> {
    let Value::Record(fields) = change_avro else {
        return Err("a change is a record".into());
    };
    let some = |v: Value| Value::Union(1, Box::new(v));
    let none = || Value::Union(0, Box::new(Value::Null));
    let mut typed = Vec::with_capacity(fields.len() + 1);
    for (name, value) in fields {
        match name.as_str() {
            "data" => typed.push((name, some(row_value(data, columns, None)?))),
            "old" => match old.and_then(|o| o.as_object()) {
                Some(old) => {
                    typed.push((
                        name,
                        some(row_value(&serde_json::Value::Null, columns, Some(old))?),
                    ));
                    let names = old.keys().map(|k| Value::String(k.clone())).collect();
                    typed.push(("changed".into(), some(Value::Array(names))));
                }
                None => {
                    typed.push((name, none()));
                    typed.push(("changed".into(), none()));
                }
            },
            _ => typed.push((name, value)),
        }
    }
    Ok(Value::Record(typed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc::change::{ChangeEvent, ChangeKind};
    use serde_json::json;

    fn columns(extra: bool) -> TableColumns {
        use crate::cdc::column::{Charset, Kind};
        let column = |name: &str, kind| Column {
            name: name.into(),
            kind,
            generated: None,
        };
        let mut columns = vec![
            column(
                "id",
                Kind::Int {
                    bits: 64,
                    unsigned: false,
                },
            ),
            column(
                "status",
                Kind::Int {
                    bits: 8,
                    unsigned: false,
                },
            ),
            column(
                "name",
                Kind::Text {
                    charset: Charset::Utf8,
                },
            ),
            column("price", Kind::Double),
            column(
                "big",
                Kind::Int {
                    bits: 64,
                    unsigned: true,
                },
            ),
            column("raw", Kind::Bytes { pad_to: None }),
            column("ratio", Kind::Float),
        ];
        if extra {
            columns.push(column(
                "note",
                Kind::Text {
                    charset: Charset::Utf8,
                },
            ));
        }
        TableColumns { columns }
    }

    fn update() -> ChangeEvent {
        ChangeEvent {
            data: json!({"id": 42, "status": 2, "name": null, "price": 1.5, "big": u64::MAX, "raw": "0x00ff", "ratio": crate::cdc::column::float_json(1.23456)}),
            old: Some(json!({"status": 1, "name": "was", "big": 0})),
            ..crate::cdc::change::tests::sample()
        }
    }

    #[test]
    #[allow(deprecated)] // the one-shot datum helpers are fine in a test
    fn a_typed_change_round_trips_to_the_json_change() {
        let schema =
            table_schema("cdc.shop.table_user", "shop", "table_user", &columns(false)).unwrap();
        assert!(is_table_change(&format!(
            "{TABLES_NAMESPACE}.shop.table_user.Change"
        )));
        assert!(!is_table_change("orderpipe.cdc.v1.CdcChangeEnvelope"));
        let null_to = ChangeEvent {
            old: Some(json!({"name": null})),
            data: json!({"id": 42, "status": 2, "name": "now", "price": 1.5, "big": 9_223_372_036_854_775_808u64, "raw": "0x", "ratio": -0.0}),
            ..update()
        };
        let insert = ChangeEvent {
            old: None,
            change: ChangeKind::Insert,
            event_name: "shop.table_user.insert".into(),
            ..update()
        };
        for event in [update(), null_to, insert] {
            let value = typed_value(
                event.to_avro(),
                &event.data,
                event.old.as_ref(),
                &columns(false),
            )
            .unwrap();
            let bytes = apache_avro::to_avro_datum(&schema.parsed, value).unwrap();
            let back = apache_avro::from_avro_datum(&schema.parsed, &mut &bytes[..], None).unwrap();
            assert_eq!(ChangeEvent::from_avro(back).unwrap(), event);
        }
    }

    #[test]
    fn an_added_column_is_a_backward_compatible_version() {
        let v1 = table_schema("t", "shop", "table_user", &columns(false)).unwrap();
        let v2 = table_schema("t", "shop", "table_user", &columns(true)).unwrap();
        assert_ne!(v1.raw, v2.raw);
        assert_eq!(
            crate::schema::local_compat(
                &v1.parsed,
                &v2.parsed,
                crate::schema::CompatLevel::Backward
            ),
            None
        );
    }

    #[test]
    fn names_avro_cannot_carry_and_values_that_do_not_fit_are_refused_by_name() {
        let unknown = |name: &str| Column {
            name: name.into(),
            kind: crate::cdc::column::Kind::Unknown,
            generated: None,
        };
        let bad = TableColumns {
            columns: vec![unknown("id"), unknown("my-col")],
        };
        let e = table_schema("t", "shop", "u", &bad).unwrap_err();
        assert!(
            e.contains("column `my-col`") && e.contains("\"json\""),
            "{e}"
        );
        let event = ChangeEvent {
            data: json!({"id": u64::MAX}),
            old: None,
            ..update()
        };
        let e = typed_value(event.to_avro(), &event.data, None, &columns(false)).unwrap_err();
        assert!(e.contains("column `id`"), "{e}");
    }
}
