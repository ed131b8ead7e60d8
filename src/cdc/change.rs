//! One row change as it travels on `cdc.<db>.<table>`: the house envelope
//! fields (`event_id`, `event_name`, `event_version`, `event_time`,
//! `producer`, `trace_id`) and the change (`data`, `old`, the binlog
//! coordinates), in the Avro schema `change.avsc`.
//!
//! `data` and `old` are JSON objects written as strings: a table's columns
//! are not a schema orderpipe owns, and a column added by `ALTER TABLE`
//! then shows up in `data` without a new schema version, so every consumer
//! keeps decoding. The seed-003 HTTP body carries them as JSON anyway.
//!
//! Column values become JSON as follows: integers and floats are numbers;
//! DECIMAL is a string (exact); DATETIME is `YYYY-MM-DDTHH:MM:SS[.ffffff]`
//! (no zone, as stored), TIMESTAMP is ISO 8601 UTC with `Z`, DATE is
//! `YYYY-MM-DD`, TIME is `[-]HH:MM:SS[.ffffff]`; text is a string; bytes
//! that are not UTF-8 are hex prefixed `0x`; NULL is null.

use std::sync::OnceLock;

use apache_avro::Schema;
use apache_avro::types::Value;
use chrono::{DateTime, Utc};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::envelope::{Envelope, EnvelopeError, EventData, EventName, RowChange};
use crate::schema::TopicSchema;

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
}

impl ChangeKind {
    /// `insert`, `update` or `delete`: the last segment of the event name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }

    fn parse(text: &str) -> Result<Self, EnvelopeError> {
        match text {
            "insert" => Ok(Self::Insert),
            "update" => Ok(Self::Update),
            "delete" => Ok(Self::Delete),
            other => Err(EnvelopeError::field(
                "change",
                format!("`{other}` is not one of insert, update, delete"),
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
    /// The primary key (also the Kafka key), see [`primary_key`].
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

/// The parsed change schema, as a [`TopicSchema`] for `topic` (what
/// [`crate::codec::Codec::new`] takes).
pub fn topic_schema(topic: &str) -> TopicSchema {
    static PARSED: OnceLock<Schema> = OnceLock::new();
    let parsed = PARSED
        .get_or_init(|| Schema::parse_str(CHANGE_SCHEMA).expect("the change schema is valid"));
    TopicSchema {
        topic: topic.to_string(),
        raw: CHANGE_SCHEMA.to_string(),
        parsed: parsed.clone(),
    }
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
    let mut text: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    if text.bytes().all(|b| b == b'0') {
        text.replace_range(31..32, "1");
    }
    text
}

impl ChangeEvent {
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
    /// fields too), or a per-table typed change ([`super::table_schema`]);
    /// errors name the field.
    pub fn from_avro(value: Value) -> Result<Self, EnvelopeError> {
        let Value::Record(fields) = super::table_schema::untyped_value(value) else {
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

/// The Kafka key of a row: the value of a one-column primary key as text
/// (a string as is, a number in decimal), a JSON array of the values of a
/// composite one.
pub fn primary_key(values: &[&serde_json::Value]) -> String {
    match values {
        [serde_json::Value::String(s)] => s.clone(),
        [one] => one.to_string(),
        many => serde_json::Value::Array(many.iter().map(|v| (*v).clone()).collect()).to_string(),
    }
}

/// The changed columns of an update: the previous value of every column
/// whose value differs in `after`.
pub fn changed_columns(
    before: &serde_json::Map<String, serde_json::Value>,
    after: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    before
        .iter()
        .filter(|(column, value)| after.get(*column) != Some(*value))
        .map(|(column, value)| (column.clone(), value.clone()))
        .collect()
}

/// One column value as JSON (see the module docs for the mapping);
/// `column_type` is the column's type from the table map.
pub fn json_value(value: &BinlogValue<'_>, column_type: Option<ColumnType>) -> serde_json::Value {
    use mysql_async::Value as My;
    use serde_json::Value as Json;
    let value = match value {
        BinlogValue::Value(v) => v,
        BinlogValue::Jsonb(j) => {
            return serde_json::Value::try_from(j.clone())
                .unwrap_or_else(|e| Json::String(format!("<json: {e}>")));
        }
        // Partial JSON updates only exist with binlog_row_value_options=PARTIAL_JSON (MySQL),
        // which the start-up check refuses.
        BinlogValue::JsonDiff(_) => return Json::String("<partial json update>".into()),
    };
    let is = |t: ColumnType| column_type == Some(t);
    match value {
        My::NULL => Json::Null,
        My::Int(n) => Json::from(*n),
        My::UInt(n) => Json::from(*n),
        My::Float(f) => serde_json::Number::from_f64(f64::from(*f))
            .map_or_else(|| Json::String(f.to_string()), Json::Number),
        My::Double(f) => serde_json::Number::from_f64(*f)
            .map_or_else(|| Json::String(f.to_string()), Json::Number),
        My::Bytes(bytes)
            if is(ColumnType::MYSQL_TYPE_TIMESTAMP2) || is(ColumnType::MYSQL_TYPE_TIMESTAMP) =>
        {
            // Seconds since the epoch (UTC), with a fraction when the column has one.
            let text = String::from_utf8_lossy(bytes);
            let (secs, frac) = text.split_once('.').unwrap_or((&text, ""));
            let micros: u32 = format!("{frac:0<6}")[..6].parse().unwrap_or(0);
            match secs
                .parse::<i64>()
                .ok()
                .and_then(|s| DateTime::<Utc>::from_timestamp(s, micros * 1000))
            {
                Some(at) if frac.is_empty() => {
                    Json::String(at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
                }
                Some(at) => Json::String(at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()),
                None => Json::String(text.into_owned()),
            }
        }
        My::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => Json::String(text.to_string()),
            Err(_) => Json::String(format!(
                "0x{}",
                bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
            )),
        },
        My::Date(y, m, d, ..)
            if is(ColumnType::MYSQL_TYPE_DATE) || is(ColumnType::MYSQL_TYPE_NEWDATE) =>
        {
            Json::String(format!("{y:04}-{m:02}-{d:02}"))
        }
        My::Date(y, m, d, h, i, s, us) => {
            let mut text = format!("{y:04}-{m:02}-{d:02}T{h:02}:{i:02}:{s:02}");
            if *us > 0 {
                text.push_str(&format!(".{us:06}"));
            }
            // A TIMESTAMP read by a query (the snapshot, session time zone UTC).
            if is(ColumnType::MYSQL_TYPE_TIMESTAMP) || is(ColumnType::MYSQL_TYPE_TIMESTAMP2) {
                text.push('Z');
            }
            Json::String(text)
        }
        My::Time(negative, days, h, i, s, us) => {
            let hours = u32::from(*h) + days * 24;
            let mut text = format!(
                "{}{hours:02}:{i:02}:{s:02}",
                if *negative { "-" } else { "" }
            );
            if *us > 0 {
                text.push_str(&format!(".{us:06}"));
            }
            Json::String(text)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mysql_async::Value as My;
    use serde_json::json;

    /// An update of `shop.table_user` (other modules' tests start from it).
    pub(crate) fn sample() -> ChangeEvent {
        let event_id = change_id("src", "0-1-7", 2);
        ChangeEvent {
            event_id,
            event_name: "shop.table_user.update".into(),
            event_version: CHANGE_EVENT_VERSION.into(),
            event_time: DateTime::from_timestamp(1_764_570_000, 0).unwrap(),
            producer: "cdc:src".into(),
            trace_id: trace_id_of(&event_id),
            database: "shop".into(),
            table: "table_user".into(),
            change: ChangeKind::Update,
            key: "42".into(),
            data: json!({"id": 42, "status": 2}),
            old: Some(json!({"status": 1})),
            gtid: Some("0-1-7".into()),
            binlog_file: "mariadb-bin.000002".into(),
            binlog_pos: 3127,
            xid: Some(30),
            row_index: 2,
        }
    }

    #[test]
    #[allow(deprecated)] // the one-shot datum helpers are fine in a test
    fn a_change_round_trips_through_its_schema() {
        let schema = topic_schema("cdc.shop.table_user").parsed;
        for event in [
            sample(),
            ChangeEvent {
                old: None,
                gtid: None,
                xid: None,
                change: ChangeKind::Insert,
                ..sample()
            },
        ] {
            let bytes = apache_avro::to_avro_datum(&schema, event.to_avro()).unwrap();
            let back = apache_avro::from_avro_datum(&schema, &mut &bytes[..], None).unwrap();
            assert_eq!(ChangeEvent::from_avro(back).unwrap(), event);
        }
    }

    #[test]
    fn a_change_becomes_the_envelope_the_router_delivers() {
        let envelope = sample().into_envelope().unwrap();
        assert_eq!(envelope.event_name.as_str(), "shop.table_user.update");
        assert_eq!(envelope.key(), "42", "the primary key, as published");
        assert_eq!(envelope.data.event_name(), envelope.event_name);
        let (data, old) = envelope.data.data_and_old();
        assert_eq!((data, old), (json!({"id": 42, "status": 2}), json!({"status": 1})));
        let insert = ChangeEvent { old: None, change: ChangeKind::Insert, event_name: "shop.table_user.insert".into(), ..sample() };
        assert_eq!(insert.into_envelope().unwrap().data.data_and_old().1, serde_json::Value::Null);
        // The name must be the change's routing key.
        let e = ChangeEvent { event_name: "shop.table_user.upsert".into(), ..sample() }.into_envelope().unwrap_err();
        assert!(e.to_string().contains("event_name") && e.to_string().contains("<insert|update|delete>"), "{e}");
        let e = ChangeEvent { event_name: "shop.table_user.insert".into(), ..sample() }.into_envelope().unwrap_err();
        assert!(e.to_string().contains("payload is `shop.table_user.update` but event_name is `shop.table_user.insert`"), "{e}");
        let e = ChangeEvent { data: json!([1]), ..sample() }.into_envelope().unwrap_err();
        assert!(e.to_string().contains("data"), "{e}");
    }

    #[test]
    fn a_bad_record_names_the_field() {
        let Value::Record(mut fields) = sample().to_avro() else {
            unreachable!()
        };
        fields.retain(|(name, _)| name != "binlog_pos");
        let e = ChangeEvent::from_avro(Value::Record(fields))
            .unwrap_err()
            .to_string();
        assert!(e.contains("binlog_pos"), "{e}");
        let Value::Record(mut fields) = sample().to_avro() else {
            unreachable!()
        };
        fields
            .iter_mut()
            .filter(|(n, _)| n == "change")
            .for_each(|(_, v)| *v = Value::String("upsert".into()));
        let e = ChangeEvent::from_avro(Value::Record(fields))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`change`") && e.contains("insert, update, delete"),
            "{e}"
        );
    }

    #[test]
    fn ids_are_stable_per_change_and_distinct_between_changes() {
        assert_eq!(change_id("s", "0-1-7", 0), change_id("s", "0-1-7", 0));
        assert_ne!(change_id("s", "0-1-7", 0), change_id("s", "0-1-7", 1));
        assert_ne!(change_id("s", "0-1-7", 0), change_id("t", "0-1-7", 0));
        assert_eq!(change_id("s", "0-1-7", 0).get_version_num(), 8);
        let trace = trace_id_of(&change_id("s", "0-1-7", 0));
        assert!(
            trace.len() == 32
                && trace
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{trace}"
        );
    }

    #[test]
    fn keys_and_changed_columns() {
        assert_eq!(primary_key(&[&json!(42)]), "42");
        assert_eq!(primary_key(&[&json!("a-1")]), "a-1");
        assert_eq!(primary_key(&[&json!(1), &json!("x")]), r#"[1,"x"]"#);
        let before = json!({"id": 1, "status": 1, "name": "a", "note": null});
        let after = json!({"id": 1, "status": 2, "name": "a", "note": "n"});
        let old = changed_columns(before.as_object().unwrap(), after.as_object().unwrap());
        assert_eq!(
            serde_json::Value::Object(old),
            json!({"status": 1, "note": null})
        );
    }

    #[test]
    fn column_values_become_the_documented_json() {
        let v = |value: My, t: Option<ColumnType>| json_value(&BinlogValue::Value(value), t);
        assert_eq!(v(My::NULL, None), json!(null));
        assert_eq!(v(My::Int(-3), Some(ColumnType::MYSQL_TYPE_LONG)), json!(-3));
        assert_eq!(
            v(My::UInt(u64::MAX), Some(ColumnType::MYSQL_TYPE_LONGLONG)),
            json!(u64::MAX)
        );
        assert_eq!(
            v(
                My::Bytes(b"12.50".to_vec()),
                Some(ColumnType::MYSQL_TYPE_NEWDECIMAL)
            ),
            json!("12.50")
        );
        assert_eq!(
            v(
                My::Bytes(vec![0, 0xff]),
                Some(ColumnType::MYSQL_TYPE_VARCHAR)
            ),
            json!("0x00ff")
        );
        assert_eq!(
            v(
                My::Date(2026, 12, 1, 6, 0, 0, 123_000),
                Some(ColumnType::MYSQL_TYPE_DATETIME2)
            ),
            json!("2026-12-01T06:00:00.123000")
        );
        assert_eq!(
            v(
                My::Date(2026, 12, 1, 0, 0, 0, 0),
                Some(ColumnType::MYSQL_TYPE_DATE)
            ),
            json!("2026-12-01")
        );
        assert_eq!(
            v(
                My::Bytes(b"1764568800".to_vec()),
                Some(ColumnType::MYSQL_TYPE_TIMESTAMP2)
            ),
            json!("2025-12-01T06:00:00Z")
        );
        assert_eq!(
            v(
                My::Bytes(b"1764568800.5".to_vec()),
                Some(ColumnType::MYSQL_TYPE_TIMESTAMP2)
            ),
            json!("2025-12-01T06:00:00.500000Z")
        );
        assert_eq!(
            v(
                My::Time(true, 1, 2, 3, 4, 0),
                Some(ColumnType::MYSQL_TYPE_TIME2)
            ),
            json!("-26:03:04")
        );
        // A TIMESTAMP read by the snapshot's query (session time zone UTC).
        assert_eq!(
            v(
                My::Date(2025, 12, 1, 6, 0, 0, 0),
                Some(ColumnType::MYSQL_TYPE_TIMESTAMP)
            ),
            json!("2025-12-01T06:00:00Z")
        );
    }
}
