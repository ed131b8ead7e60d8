//! One row change as it travels on `cdc.<db>.<table>`, from the binlog's
//! side: column values to JSON, the primary key, the changed columns, and
//! the change schema as a [`TopicSchema`]. The wire format itself (the
//! envelope fields, `change.avsc`, encoding and decoding) is
//! [`crate::codec::row_change`], re-exported here: every consumer decodes
//! it, so it sits below both this source and the consumers.
//!
//! `data` and `old` are JSON objects written as strings: a table's columns
//! are not a schema orderpipe owns, and a column added by `ALTER TABLE`
//! then shows up in `data` without a new schema version, so every consumer
//! keeps decoding. The seed-003 HTTP body carries them as JSON anyway.
//!
//! Column values become JSON in [`super::column`] (the database's value
//! per type; the table is in `docs/cdc.md`).

use std::sync::OnceLock;

use apache_avro::Schema;

pub use crate::codec::row_change::{
    CHANGE_EVENT_VERSION, CHANGE_RECORD, CHANGE_SCHEMA, ChangeEvent, ChangeKind, change_id,
    trace_id_of,
};
use crate::schema::TopicSchema;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use apache_avro::types::Value;
    use chrono::DateTime;
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
        assert_eq!(
            (data, old),
            (json!({"id": 42, "status": 2}), json!({"status": 1}))
        );
        let insert = ChangeEvent {
            old: None,
            change: ChangeKind::Insert,
            event_name: "shop.table_user.insert".into(),
            ..sample()
        };
        assert_eq!(
            insert.into_envelope().unwrap().data.data_and_old().1,
            serde_json::Value::Null
        );
        // The name must be the change's routing key.
        let e = ChangeEvent {
            event_name: "shop.table_user.upsert".into(),
            ..sample()
        }
        .into_envelope()
        .unwrap_err();
        assert!(
            e.to_string().contains("event_name")
                && e.to_string().contains("<insert|update|delete>"),
            "{e}"
        );
        let e = ChangeEvent {
            event_name: "shop.table_user.insert".into(),
            ..sample()
        }
        .into_envelope()
        .unwrap_err();
        assert!(
            e.to_string().contains(
                "payload is `shop.table_user.update` but event_name is `shop.table_user.insert`"
            ),
            "{e}"
        );
        let e = ChangeEvent {
            data: json!([1]),
            ..sample()
        }
        .into_envelope()
        .unwrap_err();
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
}
