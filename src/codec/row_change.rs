//! The row change's wire format, as `orderpipe cdc` writes it on
//! `cdc.<db>.<table>` and every consumer decodes it: the house envelope
//! fields (`event_id`, `event_name`, `event_version`, `event_time`,
//! `producer`, `trace_id`) and the change (`data`, `old`, the binlog
//! coordinates), in the Avro schema `change.avsc`, or a per-table typed
//! schema under [`TABLES_NAMESPACE`] (`[cdc] value_format = "avro"`).
//!
//! It lives in the codec, not in `cdc`, because [`super::Codec::decode`]
//! reads row changes next to order envelopes: the source (`crate::cdc`)
//! depends on the codec, never the other way round. What is specific to the
//! binlog (column values to JSON, the per-table schemas built from a table
//! map) stays in `crate::cdc`.

use apache_avro::types::Value;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::envelope::{Envelope, EnvelopeError, EventData, EventName, RowChange};

/// The Avro schema of every `cdc.*` topic's values.
pub const CHANGE_SCHEMA: &str = include_str!("change.avsc");

/// Full name of the record in [`CHANGE_SCHEMA`]: how a decoder tells a
/// row change from an order envelope.
pub const CHANGE_RECORD: &str = "orderpipe.cdc.v1.CdcChangeEnvelope";

/// `event_version` of the changes this version writes.
pub const CHANGE_EVENT_VERSION: &str = "1.0";

/// What happened to the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// A row was inserted.
    Insert,
    /// A row was updated.
    Update,
    /// A row was deleted.
    Delete,
    /// A row as an incremental snapshot read it (`cdc snapshot start`):
    /// its state then, not a change; routed only to subscriptions of
    /// `<db>.<table>.read`.
    Read,
}

impl ChangeKind {
    /// `insert`, `update`, `delete` or `read`: the last segment of the event name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Update => "update",
            Self::Delete => "delete",
            Self::Read => "read",
        }
    }

    fn parse(text: &str) -> Result<Self, EnvelopeError> {
        match text {
            "insert" => Ok(Self::Insert),
            "update" => Ok(Self::Update),
            "delete" => Ok(Self::Delete),
            "read" => Ok(Self::Read),
            other => Err(EnvelopeError::field(
                "change",
                format!("`{other}` is not one of insert, update, delete, read"),
            )),
        }
    }
}

/// One row change, as published.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChangeEvent {
    /// Derived from source, transaction and `row_index` ([`change_id`]).
    pub event_id: Uuid,
    /// `<db>.<table>.<insert|update|delete>`.
    pub event_name: String,
    /// [`CHANGE_EVENT_VERSION`].
    pub event_version: String,
    /// Commit time from the binlog (whole seconds).
    pub event_time: DateTime<Utc>,
    /// `cdc:<source name>`.
    pub producer: String,
    /// W3C trace id derived from `event_id`.
    pub trace_id: String,
    /// Database of the table.
    pub database: String,
    /// Table name.
    pub table: String,
    /// What happened.
    pub change: ChangeKind,
    /// The primary key (also the Kafka key), see `crate::cdc::change::primary_key`.
    pub key: String,
    /// The row after the change (the deleted row for a delete), a JSON object.
    pub data: serde_json::Value,
    /// The changed columns' previous values (updates only), a JSON object.
    pub old: Option<serde_json::Value>,
    /// MariaDB GTID of the transaction (`domain-server-sequence`).
    pub gtid: Option<String>,
    /// Binlog file of the transaction.
    pub binlog_file: String,
    /// End of the transaction in `binlog_file`.
    pub binlog_pos: u64,
    /// The XID of the transaction, when the engine wrote one.
    pub xid: Option<u64>,
    /// Index of this change within its transaction.
    pub row_index: u32,
}

/// Namespace prefix of the per-table change schemas; a writer schema whose
/// full name starts with it (and a dot) is a typed row change.
pub const TABLES_NAMESPACE: &str = "orderpipe.cdc.v1.tables";

/// True for the full name of a per-table change record.
pub fn is_table_change(full_name: &str) -> bool {
    full_name
        .strip_prefix(TABLES_NAMESPACE)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// The id of a change: a UUID (version 8) from a SHA-256 of the source
/// name, the transaction's id (GTID, or binlog file and end position) and
/// the row's index in it. Reading the same change again gives the same id.
pub fn change_id(source: &str, transaction: &str, row_index: u32) -> Uuid {
    let digest = Sha256::digest(format!("{source}\n{transaction}\n{row_index}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// A W3C trace id derived from an event id (32 lower-case hex, never all zero).
pub fn trace_id_of(event_id: &Uuid) -> String {
    let digest = Sha256::digest(event_id.as_bytes());
    let mut text = crate::hex::lower(&digest[..16]);
    if text.bytes().all(|b| b == b'0') {
        text.replace_range(31..32, "1");
    }
    text
}

impl ChangeEvent {
    /// The Confluent-framed value of this change under [`CHANGE_SCHEMA`]
    /// registered as `schema_id`: magic byte, the id, then the Avro datum
    /// written field by field in the schema's order. The same bytes as
    /// [`Self::to_avro`] through the registry's encoder (a unit test holds
    /// them equal against apache-avro), at a fraction of the cost: no
    /// `Value` tree, no schema resolved per record. `cdc` writes every
    /// JSON-format change this way once the topic's schema id is known.
    pub fn framed_avro(&self, schema_id: u32) -> Vec<u8> {
        let data = self.data.to_string();
        let old = self.old.as_ref().map(|o| o.to_string());
        let mut out = Vec::with_capacity(192 + data.len() + old.as_ref().map_or(0, String::len));
        out.push(0);
        out.extend_from_slice(&schema_id.to_be_bytes());
        let mut id = uuid::Uuid::encode_buffer();
        for text in [
            &*self.event_id.hyphenated().encode_lower(&mut id),
            &self.event_name,
            &self.event_version,
            &crate::envelope::format_utc(&self.event_time),
            &self.producer,
            &self.trace_id,
            &self.database,
            &self.table,
            self.change.as_str(),
            &self.key,
            &data,
        ] {
            avro_string(&mut out, text);
        }
        avro_optional(&mut out, old.as_deref(), avro_string);
        avro_optional(&mut out, self.gtid.as_deref(), avro_string);
        avro_string(&mut out, &self.binlog_file);
        avro_long(&mut out, self.binlog_pos as i64);
        avro_optional(&mut out, self.xid.map(|x| x as i64), avro_long);
        avro_long(&mut out, i64::from(self.row_index as i32));
        out
    }

    /// The Avro record of `change.avsc`.
    pub fn to_avro(&self) -> Value {
        let text = |s: &str| Value::String(s.to_string());
        let nullable = |v: Option<Value>| match v {
            Some(v) => Value::Union(1, Box::new(v)),
            None => Value::Union(0, Box::new(Value::Null)),
        };
        Value::Record(vec![
            ("event_id".into(), text(&self.event_id.to_string())),
            ("event_name".into(), text(&self.event_name)),
            ("event_version".into(), text(&self.event_version)),
            (
                "event_time".into(),
                text(&crate::envelope::format_utc(&self.event_time)),
            ),
            ("producer".into(), text(&self.producer)),
            ("trace_id".into(), text(&self.trace_id)),
            ("database".into(), text(&self.database)),
            ("table".into(), text(&self.table)),
            ("change".into(), text(self.change.as_str())),
            ("key".into(), text(&self.key)),
            ("data".into(), text(&self.data.to_string())),
            (
                "old".into(),
                nullable(self.old.as_ref().map(|o| text(&o.to_string()))),
            ),
            ("gtid".into(), nullable(self.gtid.as_deref().map(text))),
            ("binlog_file".into(), text(&self.binlog_file)),
            ("binlog_pos".into(), Value::Long(self.binlog_pos as i64)),
            (
                "xid".into(),
                nullable(self.xid.map(|x| Value::Long(x as i64))),
            ),
            ("row_index".into(), Value::Int(self.row_index as i32)),
        ])
    }

    /// The change as the consumer's envelope: the house fields, and
    /// [`EventData::RowChange`] as data (`event_name` must be the routing
    /// key of `database`, `table` and `change`; checked, naming the field).
    pub fn into_envelope(self) -> Result<Envelope, EnvelopeError> {
        let row = RowChange {
            database: self.database,
            table: self.table,
            change: self.change.as_str().to_string(),
            key: self.key,
            data: self.data,
            old: self.old,
        };
        let event_name = EventName::routing_key(&self.event_name)
            .map_err(|e| EnvelopeError::field("event_name", e.to_string()))?;
        let envelope = Envelope {
            event_id: self.event_id,
            event_name,
            event_version: self.event_version,
            event_time: self.event_time,
            producer: self.producer,
            trace_id: self.trace_id,
            data: EventData::RowChange(row),
        };
        envelope.validate()?;
        Ok(envelope)
    }

    /// Reads a decoded `change.avsc` record (any later version with added
    /// fields too), or a per-table typed change ([`TABLES_NAMESPACE`]);
    /// errors name the field.
    pub fn from_avro(value: Value) -> Result<Self, EnvelopeError> {
        let Value::Record(fields) = untyped_value(value) else {
            return Err(EnvelopeError::field(
                "<root>",
                "the Avro value is not a record",
            ));
        };
        let mut fields = Fields(fields.into_iter().collect());
        let event_id = fields.required("event_id")?;
        let event_id = Uuid::parse_str(&event_id)
            .map_err(|e| EnvelopeError::field("event_id", format!("not a UUID: {e}")))?;
        let event_name = fields.required("event_name")?;
        let event_version = fields.required("event_version")?;
        let event_time = crate::envelope::parse_utc(&fields.required("event_time")?, "event_time")?;
        let producer = fields.required("producer")?;
        let trace_id = fields.required("trace_id")?;
        let database = fields.required("database")?;
        let table = fields.required("table")?;
        let change = ChangeKind::parse(&fields.required("change")?)?;
        let key = fields.required("key")?;
        let json = |name: &str, text: String| {
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| EnvelopeError::field(name, format!("not JSON: {e}")))
        };
        let data = json("data", fields.required("data")?)?;
        let old = fields.string("old")?.map(|t| json("old", t)).transpose()?;
        let gtid = fields.string("gtid")?;
        let binlog_file = fields.required("binlog_file")?;
        let binlog_pos = fields
            .long("binlog_pos")?
            .ok_or_else(|| Fields::missing("binlog_pos"))?;
        let xid = fields.long("xid")?;
        let row_index = fields
            .long("row_index")?
            .ok_or_else(|| Fields::missing("row_index"))? as u32;
        Ok(Self {
            event_id,
            event_name,
            event_version,
            event_time,
            producer,
            trace_id,
            database,
            table,
            change,
            key,
            data,
            old,
            gtid,
            binlog_file,
            binlog_pos,
            xid,
            row_index,
        })
    }
}

/// The fields of a decoded record, taken one by one; errors name the field.
struct Fields(std::collections::HashMap<String, Value>);

impl Fields {
    fn missing(name: &str) -> EnvelopeError {
        EnvelopeError::field(name, "missing required field (or of another type)")
    }

    /// The value, unwrapped from a union; None when absent or null.
    fn take(&mut self, name: &str) -> Option<Value> {
        match self.0.remove(name)? {
            Value::Union(_, inner) => match *inner {
                Value::Null => None,
                v => Some(v),
            },
            Value::Null => None,
            v => Some(v),
        }
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, EnvelopeError> {
        match self.take(name) {
            Some(Value::String(s)) => Ok(Some(s)),
            None => Ok(None),
            Some(_) => Err(Self::missing(name)),
        }
    }

    fn required(&mut self, name: &str) -> Result<String, EnvelopeError> {
        self.string(name)?.ok_or_else(|| Self::missing(name))
    }

    fn long(&mut self, name: &str) -> Result<Option<u64>, EnvelopeError> {
        match self.take(name) {
            Some(Value::Long(n)) if n >= 0 => Ok(Some(n as u64)),
            Some(Value::Int(n)) if n >= 0 => Ok(Some(n as u64)),
            None => Ok(None),
            Some(_) => Err(EnvelopeError::field(name, "not a non-negative integer")),
        }
    }
}

/// An f32 as the shortest JSON number that reads back as it (3.14159, not
/// 3.141590118408203): the JSON form of FLOAT columns.
pub fn float_json(f: f32) -> serde_json::Value {
    f.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or_else(
            || serde_json::Value::String(f.to_string()),
            serde_json::Value::Number,
        )
}

/// An integer-valued Avro decimal (scale 0) as a JSON number.
fn decimal_integer(decimal: &apache_avro::Decimal) -> serde_json::Value {
    let Ok(bytes) = Vec::<u8>::try_from(decimal) else {
        return serde_json::Value::Null;
    };
    if bytes.len() > 16 {
        return serde_json::Value::Null;
    }
    // Big-endian two's complement.
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let n = bytes
        .iter()
        .fold(if negative { -1i128 } else { 0 }, |n, &b| {
            (n << 8) | i128::from(b)
        });
    u64::try_from(n)
        .map(serde_json::Value::from)
        .or_else(|_| i64::try_from(n).map(serde_json::Value::from))
        .unwrap_or(serde_json::Value::Null)
}

/// A decoded typed change as the `change.avsc` record of the same change
/// (`data` and `old` as JSON text), for [`ChangeEvent::from_avro`].
/// Values that are not typed changes are returned as they are.
pub fn untyped_value(value: Value) -> Value {
    let Value::Record(fields) = value else {
        return value;
    };
    let unwrap = |v: Value| match v {
        Value::Union(_, inner) => *inner,
        v => v,
    };
    let is_record = |v: &Value| {
        matches!(v, Value::Record(_))
            || matches!(v, Value::Union(_, inner) if matches!(**inner, Value::Record(_)))
    };
    if !fields.iter().any(|(n, v)| n == "data" && is_record(v)) {
        return Value::Record(fields);
    }
    let changed: Option<Vec<String>> =
        fields
            .iter()
            .find(|(n, _)| n == "changed")
            .and_then(|(_, v)| match unwrap(v.clone()) {
                Value::Array(items) => Some(
                    items
                        .into_iter()
                        .filter_map(|i| match i {
                            Value::String(s) => Some(s),
                            _ => None,
                        })
                        .collect(),
                ),
                _ => None,
            });
    let json_of = |record: Value, only: Option<&[String]>| -> serde_json::Value {
        let Value::Record(columns) = record else {
            return serde_json::Value::Null;
        };
        let mut object = serde_json::Map::new();
        for (name, value) in columns {
            if only.is_some_and(|only| !only.contains(&name)) {
                continue;
            }
            let json = match unwrap(value) {
                Value::Long(n) => serde_json::Value::from(n),
                Value::Int(n) => serde_json::Value::from(n),
                // An f32 as its shortest text (as the JSON form writes FLOAT).
                Value::Float(f) => float_json(f),
                Value::Double(f) => serde_json::Number::from_f64(f)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
                // Integers beyond a long (BIGINT UNSIGNED, BIT(64)): decimal(20,0).
                Value::Decimal(d) => decimal_integer(&d),
                // Binary columns: `0x` hex, as in the JSON form.
                Value::Bytes(b) => serde_json::Value::String(crate::hex::prefixed(&b)),
                Value::String(s) => serde_json::Value::String(s),
                _ => serde_json::Value::Null,
            };
            object.insert(name, json);
        }
        serde_json::Value::Object(object)
    };
    let mut untyped = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        match name.as_str() {
            "changed" => {}
            "data" => untyped.push((
                name,
                Value::String(json_of(unwrap(value), None).to_string()),
            )),
            "old" => {
                let value = match unwrap(value) {
                    Value::Null => Value::Union(0, Box::new(Value::Null)),
                    record => Value::Union(
                        1,
                        Box::new(Value::String(
                            json_of(record, changed.as_deref()).to_string(),
                        )),
                    ),
                };
                untyped.push((name, value));
            }
            _ => untyped.push((name, value)),
        }
    }
    Value::Record(untyped)
}

/// Avro's `long` (and `int`): zig-zag, then a base-128 varint.
fn avro_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Avro's `string`: its byte length as a `long`, then the UTF-8 bytes.
fn avro_string(out: &mut Vec<u8>, s: &str) {
    avro_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

/// A `["null", T]` union: branch 0 for none, 1 then the value.
fn avro_optional<T>(out: &mut Vec<u8>, v: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => avro_long(out, 0),
        Some(v) => {
            avro_long(out, 1);
            write(out, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apache-avro's own encoding of [`ChangeEvent::to_avro`] under the
    /// registered schema is the oracle for the hand-written one.
    #[test]
    fn framed_avro_is_byte_for_byte_apache_avros_encoding() {
        let schema = apache_avro::Schema::parse_str(CHANGE_SCHEMA).unwrap();
        let base = ChangeEvent {
            event_id: change_id("src", "0-1-42", 3),
            event_name: "shop.orders.update".into(),
            event_version: CHANGE_EVENT_VERSION.into(),
            event_time: DateTime::from_timestamp(1_796_433_005, 0).unwrap(),
            producer: "cdc:src".into(),
            trace_id: trace_id_of(&change_id("src", "0-1-42", 3)),
            database: "shop".into(),
            table: "orders".into(),
            change: ChangeKind::Update,
            key: "42".into(),
            data: serde_json::json!({"id": 42, "note": "naïve ✓ \"q\"", "n": null}),
            old: Some(serde_json::json!({"note": "x"})),
            gtid: Some("0-1-42".into()),
            binlog_file: "mariadb-bin.000007".into(),
            binlog_pos: 4_294_967_296 + 17,
            xid: Some(u64::from(u32::MAX) * 9),
            row_index: 3,
        };
        let long_text = "x".repeat(70_000);
        let variants = [
            base.clone(),
            ChangeEvent {
                change: ChangeKind::Insert,
                old: None,
                gtid: None,
                xid: None,
                row_index: 0,
                binlog_pos: 4,
                ..base.clone()
            },
            ChangeEvent {
                change: ChangeKind::Read,
                key: "[1,\"a\"]".into(),
                data: serde_json::json!({"body": long_text}),
                row_index: 1_000_000,
                ..base.clone()
            },
            ChangeEvent {
                change: ChangeKind::Delete,
                data: serde_json::json!({}),
                xid: Some(0),
                ..base
            },
        ];
        for event in variants {
            let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
                .build()
                .and_then(|w| w.write_value_to_vec(event.to_avro()))
                .unwrap();
            let mut expected = vec![0, 0, 0, 0x30, 0x39];
            expected.extend_from_slice(&datum);
            assert_eq!(event.framed_avro(12_345), expected, "{:?}", event.change);
        }
    }
}
