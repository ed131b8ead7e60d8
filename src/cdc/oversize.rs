//! Row changes `cdc` cannot publish as they are: too big for one Kafka
//! record, or refused by the encoder. One such row must never stop the
//! stream (a restart would meet it again, for good), so its fate is
//! decided before the Kafka transaction begins:
//!
//! * [`OversizeAction`] (`cdc.oversize`) says what happens to a change
//!   whose record is larger than its [`RecordLimit`]: a dead-letter record
//!   (the default: nothing is lost), its text/blob columns cut so it fits
//!   and marked ([`TRUNCATED_HEADER`]), or the old stop, with an error that
//!   says where;
//! * a change the encoder refuses (schema, value, the registry refusing
//!   the schema) is always dead-lettered: no setting makes it publishable;
//! * a dead-letter record ([`dead_letter`]) goes to cdc's own DLQ topic
//!   (`cdc.dead_letter_topic`) in the same Kafka transaction as the batch
//!   and its checkpoint, so it is written exactly once. Its value is JSON:
//!   the change event with its columns cut so the record fits, the size and
//!   the limit; its headers are the ones the DLQ persister reads (group
//!   `cdc:<source>`, the change topic as the original topic, original
//!   partition -1: it never reached that topic), so `orderpipe dlq` and the
//!   console list it (see docs/cdc.md, "Rows that cannot be published").
//!
//! Every failure names its row: `db.table`, the primary key and the binlog
//! position ([`RowPlace`]).

use std::collections::BTreeMap;

use metrics::counter;
use serde::{Deserialize, Serialize};

use super::change::ChangeEvent;
use super::column::Kind;
use super::table_schema::TableColumns;
use crate::kafka::record::{direct_dead_letter_headers, header};
use crate::kafka::size_limit::RecordLimit;
use crate::metrics::InternalEvent;

/// Metric: row changes over their record limit, by table (`db.table`) and
/// action (`dead_letter`, `truncate`, `fail`).
pub const OVERSIZE_METRIC: &str = "orderpipe_cdc_oversize_total";
/// Metric: dead-letter records cdc wrote, by table and error class.
pub const DEAD_LETTERS_METRIC: &str = "orderpipe_cdc_dead_letters_total";

/// Header of a change record whose columns were cut to fit: a JSON object
/// of each cut column and the byte length its value had (`{"body":1400000}`).
/// Not an `orderpipe.*` header: the error tier replaces those on every hop,
/// and a consumer's retry must still see it.
pub const TRUNCATED_HEADER: &str = "cdc-truncated";

/// Content type of cdc's dead-letter records.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Error class of a change the encoder refused for a reason of its own
/// (a column name Avro does not accept, a value its column type cannot hold).
pub const UNENCODABLE: &str = "unencodable";

/// Error class of a change over its record limit.
pub const OVERSIZED: &str = "oversized";

/// What `cdc` does with a change whose record exceeds the limit (`cdc.oversize`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OversizeAction {
    /// A dead-letter record on the DLQ topic, columns cut to fit; the
    /// change topic does not get it. Loses nothing the operator cannot
    /// read back from the database.
    #[default]
    DeadLetter,
    /// Cut the table's `cdc.truncate_columns` (all text/blob columns when
    /// it names none) until the record fits, and mark it
    /// ([`TRUNCATED_HEADER`]); a dead letter when that is not enough.
    Truncate,
    /// Stop with an error naming the table, key, size, limit and position.
    Fail,
}

impl OversizeAction {
    /// The setting's value, the metric's `action` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadLetter => "dead_letter",
            Self::Truncate => "truncate",
            Self::Fail => "fail",
        }
    }
}

/// Where a row change is: table, primary key, binlog position (the end
/// of its transaction, its GTID, its index in the transaction).
#[derive(Debug, Clone)]
pub struct RowPlace(String);

impl RowPlace {
    /// The place of `event`.
    pub fn of(event: &ChangeEvent) -> Self {
        let gtid = event
            .gtid
            .as_deref()
            .map(|g| format!(", GTID {g}"))
            .unwrap_or_default();
        Self(format!(
            "{}.{} key {} at binlog {}:{}{gtid}, row {}",
            event.database,
            event.table,
            event.key,
            event.binlog_file,
            event.binlog_pos,
            event.row_index
        ))
    }
}

impl std::fmt::Display for RowPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a column of this kind holds text or bytes that may be cut.
fn is_text_or_blob(kind: &Kind) -> bool {
    matches!(kind, Kind::Text { .. } | Kind::Bytes { .. })
}

/// The columns `truncate` may cut in a table: the ones `configured` names,
/// or every text/blob column.
pub fn cuttable_columns(columns: &TableColumns, configured: Option<&Vec<String>>) -> Vec<String> {
    match configured {
        Some(names) if !names.is_empty() => names.clone(),
        _ => columns
            .columns
            .iter()
            .filter(|c| is_text_or_blob(&c.kind))
            .map(|c| c.name.clone())
            .collect(),
    }
}

/// Cut columns and the byte length each had.
pub type Truncated = BTreeMap<String, usize>;

/// What a cut takes beyond the bytes over the limit: a string's escapes
/// and length prefixes shrink less than its bytes.
pub(crate) const SLACK: usize = 64;

/// Shortens the longest non-empty string value in `event`'s `data` and
/// `old` (of a column in `allowed`; any column when `None`) by `over`
/// bytes (the caller measures again and repeats while the record is over), at a character boundary (a whole byte of `0x` hex), and notes its
/// original length in `truncated`. False when there is none to cut.
pub(crate) fn cut_longest(
    event: &mut ChangeEvent,
    allowed: Option<&[String]>,
    over: usize,
    truncated: &mut Truncated,
) -> bool {
    let longest = [
        event.data.as_object_mut(),
        event.old.as_mut().and_then(|o| o.as_object_mut()),
    ]
    .into_iter()
    .flatten()
    .flat_map(|m| m.iter_mut())
    .filter(|(name, _)| allowed.is_none_or(|a| a.contains(name)))
    .filter_map(|(name, value)| match value {
        serde_json::Value::String(s) if !s.is_empty() => Some((name, s)),
        _ => None,
    })
    .max_by_key(|(_, s)| s.len());
    let Some((name, text)) = longest else {
        return false;
    };
    let original = text.len();
    let slot = truncated.entry(name.clone()).or_default();
    *slot = (*slot).max(original);
    let mut keep = text.floor_char_boundary(original.saturating_sub(over));
    if text.starts_with("0x") && keep > 2 && (keep - 2) % 2 == 1 {
        keep -= 1;
    }
    text.truncate(keep);
    true
}

/// Why a change becomes a dead letter.
#[derive(Debug, Clone)]
pub struct Unpublishable {
    /// An [`crate::dlq::ERROR_CLASSES`] class: [`OVERSIZED`], [`UNENCODABLE`] or the codec's.
    pub class: &'static str,
    /// What went wrong, without the place (added here).
    pub error: String,
    /// The change record's size, when it was encoded.
    pub size: Option<usize>,
    /// The limit it was over, when that is why.
    pub limit: Option<RecordLimit>,
}

/// The value of a dead-letter record.
#[derive(Debug, Serialize)]
struct DeadLetterValue<'a> {
    /// `oversized`, `unencodable`, ...
    error_class: &'a str,
    /// The error, naming the row.
    error: &'a str,
    /// The change topic it did not reach.
    topic: &'a str,
    /// The change record's size (bytes as librdkafka counts them).
    size: Option<usize>,
    /// The limit it was over.
    limit: Option<usize>,
    /// Where the limit comes from.
    limit_from: Option<&'a str>,
    /// Columns cut in `event` to make this record fit, with their lengths.
    truncated: &'a Truncated,
    /// The change event (`data`/`old` possibly cut, see `truncated`).
    event: &'a ChangeEvent,
}

/// A record for cdc's DLQ topic, ready to send.
#[derive(Debug, Clone)]
pub struct DeadLetterRecord {
    /// Key: the row's primary key (as on the change topic).
    pub key: Vec<u8>,
    /// JSON value ([`DeadLetterValue`]).
    pub value: Vec<u8>,
    /// Headers the persister reads.
    pub headers: Vec<(&'static str, Vec<u8>)>,
}

impl DeadLetterRecord {
    /// Its size as librdkafka counts it.
    pub fn size(&self) -> usize {
        let headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (*k, v.as_slice()))
            .collect();
        RecordLimit::record_size(&self.key, &self.value, &headers)
    }
}

/// The dead-letter record of `event` (headed for `topic`), its columns
/// cut until the record fits `limit` (the DLQ topic's); `group` is
/// `cdc:<source>`.
pub fn dead_letter(
    group: &str,
    topic: &str,
    event: &ChangeEvent,
    why: &Unpublishable,
    limit: &RecordLimit,
    now_ms: i64,
) -> DeadLetterRecord {
    let place = RowPlace::of(event);
    let error = format!("{place}: {}", why.error);
    let build = |event: &ChangeEvent, truncated: &Truncated| {
        let value = DeadLetterValue {
            error_class: why.class,
            error: &error,
            topic,
            size: why.size,
            limit: why.limit.as_ref().map(|l| l.max_bytes),
            limit_from: why.limit.as_ref().map(|l| l.from.as_str()),
            truncated,
            event,
        };
        let mut id = uuid::Uuid::encode_buffer();
        let headers: Vec<(&'static str, Vec<u8>)> = [
            (
                header::EVENT_ID,
                event
                    .event_id
                    .hyphenated()
                    .encode_lower(&mut id)
                    .to_string(),
            ),
            (header::EVENT_NAME, event.event_name.clone()),
            (header::TRACE_ID, event.trace_id.clone()),
            (header::CONTENT_TYPE, JSON_CONTENT_TYPE.to_string()),
        ]
        .into_iter()
        // It never reached the change topic: no partition, no offset there.
        .chain(direct_dead_letter_headers(
            group,
            topic,
            why.class,
            error.chars().take(1000).collect(),
            now_ms,
        ))
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
        DeadLetterRecord {
            key: event.key.as_bytes().to_vec(),
            value: serde_json::to_vec(&value).expect("a dead letter serializes"),
            headers,
        }
    };
    let mut event = event.clone();
    let mut truncated = Truncated::new();
    let mut record = build(&event, &truncated);
    // Cut the longest value by what is over until it fits; every column may be cut.
    while !limit.fits(record.size()) {
        let over = record.size() - limit.max_bytes + SLACK;
        if !cut_longest(&mut event, None, over, &mut truncated) {
            // Not its values: its key or its non-text columns. Keep the place and the key only.
            event.data = serde_json::Value::Null;
            event.old = None;
            truncated.insert("*".into(), 0);
            record = build(&event, &truncated);
            break;
        }
        record = build(&event, &truncated);
    }
    record
}

/// A change over its limit, logged and counted.
pub struct OversizeRow<'a> {
    /// Where it is.
    pub place: &'a RowPlace,
    /// `db.table`.
    pub table: String,
    /// Its record's size.
    pub size: usize,
    /// The limit.
    pub limit: &'a RecordLimit,
    /// What was done.
    pub action: OversizeAction,
}

impl InternalEvent for OversizeRow<'_> {
    fn emit(self) {
        tracing::warn!(
            row = %self.place,
            size = self.size,
            limit = self.limit.max_bytes,
            limit_from = %self.limit.from,
            action = self.action.as_str(),
            "cdc: row change over the record limit"
        );
        counter!(OVERSIZE_METRIC, "table" => self.table, "action" => self.action.as_str())
            .increment(1);
    }
}

/// A dead-letter record written for a change, logged and counted.
pub struct RowDeadLettered<'a> {
    /// Where it is.
    pub place: &'a RowPlace,
    /// `db.table`.
    pub table: String,
    /// Why.
    pub why: &'a Unpublishable,
    /// The DLQ topic.
    pub topic: &'a str,
}

impl InternalEvent for RowDeadLettered<'_> {
    fn emit(self) {
        tracing::warn!(
            row = %self.place,
            class = self.why.class,
            error = %self.why.error,
            size = self.why.size.map_or("-".to_string(), |s| s.to_string()),
            dead_letter_topic = self.topic,
            "cdc: row change dead-lettered"
        );
        counter!(DEAD_LETTERS_METRIC, "table" => self.table, "class" => self.why.class)
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc::change::{ChangeKind, change_id, trace_id_of};
    use crate::cdc::column::{Charset, Column};

    fn event(data: serde_json::Value, old: Option<serde_json::Value>) -> ChangeEvent {
        let event_id = change_id("s", "0-1-5", 1);
        ChangeEvent {
            event_id,
            event_name: "shop.docs.update".into(),
            event_version: "1".into(),
            event_time: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            producer: "cdc:s".into(),
            trace_id: trace_id_of(&event_id),
            database: "shop".into(),
            table: "docs".into(),
            change: ChangeKind::Update,
            key: "42".into(),
            data,
            old,
            gtid: Some("0-1-5".into()),
            binlog_file: "mariadb-bin.000003".into(),
            binlog_pos: 1234,
            xid: Some(9),
            row_index: 1,
        }
    }

    #[test]
    fn the_place_names_table_key_position_gtid_and_row() {
        let e = event(serde_json::json!({}), None);
        assert_eq!(
            RowPlace::of(&e).to_string(),
            "shop.docs key 42 at binlog mariadb-bin.000003:1234, GTID 0-1-5, row 1"
        );
    }

    /// What `Publisher::oversized` does with `truncate`: cut, measure, repeat.
    fn cut_to_fit(e: &mut ChangeEvent, columns: &[String], max: usize) -> Option<Truncated> {
        let mut truncated = Truncated::new();
        loop {
            let size = serde_json::to_vec(&*e).unwrap().len();
            if size <= max {
                return Some(truncated);
            }
            if !cut_longest(e, Some(columns), size - max + SLACK, &mut truncated) {
                return None;
            }
        }
    }

    #[test]
    fn cuts_take_the_longest_allowed_column_first_at_character_and_byte_boundaries() {
        let body = "é".repeat(5_000);
        let mut e = event(
            serde_json::json!({"id": 42, "title": "t".repeat(3000), "body": body, "bin": format!("0x{}", "ab".repeat(4000))}),
            Some(serde_json::json!({"body": "b".repeat(4000)})),
        );
        let columns = vec!["body".to_string(), "bin".to_string()];
        let cut = cut_to_fit(&mut e, &columns, 6_000).unwrap();
        assert!(serde_json::to_vec(&e).unwrap().len() <= 6_000);
        // The title is not allowed; body is the longest (in data and old), so it is cut first.
        assert_eq!(e.data["title"].as_str().unwrap().len(), 3000);
        assert_eq!(cut["body"], 10_000);
        assert!(body.starts_with(e.data["body"].as_str().unwrap()));
        assert_eq!(cut["bin"], 8002);
        assert_eq!(
            e.data["bin"].as_str().unwrap().len() % 2,
            0,
            "hex keeps whole bytes"
        );
        // Already fits: nothing cut. Only a column not allowed is big: no fit.
        assert!(cut_to_fit(&mut e, &columns, 100_000).unwrap().is_empty());
        let mut e = event(serde_json::json!({"title": "t".repeat(9000)}), None);
        assert!(cut_to_fit(&mut e, &columns, 6_000).is_none());
    }

    #[test]
    fn a_dead_letter_fits_its_limit_and_says_where_what_and_how_big() {
        let e = event(
            serde_json::json!({"id": 42, "body": "x".repeat(50_000)}),
            None,
        );
        let limit = RecordLimit {
            max_bytes: 10_000,
            from: "producer message.max.bytes = 10000".into(),
        };
        let why = Unpublishable {
            class: OVERSIZED,
            error: "record of 50200 bytes".into(),
            size: Some(50_200),
            limit: Some(limit.clone()),
        };
        let record = dead_letter("cdc:s", "cdc.shop.docs", &e, &why, &limit, 7);
        assert!(limit.fits(record.size()), "{}", record.size());
        let value: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
        assert_eq!(value["size"], 50_200);
        assert_eq!(value["limit"], 10_000);
        assert_eq!(value["truncated"]["body"], 50_000);
        assert_eq!(value["event"]["key"], "42");
        assert_eq!(value["event"]["binlog_pos"], 1234);
        assert!(
            value["error"]
                .as_str()
                .unwrap()
                .starts_with("shop.docs key 42 at binlog mariadb-bin.000003:1234")
        );
        let headers: BTreeMap<&str, String> = record
            .headers
            .iter()
            .map(|(k, v)| (*k, String::from_utf8(v.clone()).unwrap()))
            .collect();
        assert_eq!(headers[header::GROUP], "cdc:s");
        assert_eq!(headers[header::ORIGINAL_TOPIC], "cdc.shop.docs");
        assert_eq!(headers[header::ORIGINAL_PARTITION], "-1");
        assert_eq!(headers[header::ERROR_CLASS], "oversized");
        // A key too big for any value cut: the place and key are kept, the columns dropped.
        let mut e = event(serde_json::json!({"n": 1}), None);
        e.key = "k".repeat(9_000);
        let record = dead_letter("cdc:s", "cdc.shop.docs", &e, &why, &limit, 7);
        let value: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
        assert!(value["event"]["data"].is_null() && value["truncated"]["*"] == 0);
    }

    #[test]
    fn only_text_and_blob_columns_are_cut_unless_named() {
        let column = |name: &str, kind: Kind| Column {
            name: name.into(),
            kind,
            generated: None,
        };
        let columns = TableColumns {
            columns: vec![
                column(
                    "id",
                    Kind::Int {
                        bits: 32,
                        unsigned: false,
                    },
                ),
                column(
                    "title",
                    Kind::Text {
                        charset: Charset::Utf8,
                    },
                ),
                column("body", Kind::Bytes { pad_to: None }),
            ],
        };
        assert_eq!(cuttable_columns(&columns, None), vec!["title", "body"]);
        assert_eq!(
            cuttable_columns(&columns, Some(&vec!["body".into()])),
            vec!["body"]
        );
    }
}
