//! Per-order ordering through retries, the DLQ and replay
//! (`consumer.ordering = key`, the default).
//!
//! Partitioning by `order_id` keeps one order's events in order in the topic,
//! but a non-blocking retry tier breaks it again: while an order's payment
//! waits in the retry topic, its refund flows past and is applied first. So:
//!
//! * **Park**: when a record of key K leaves a group's main path (to the
//!   retry topic or the DLQ), K is parked for that group in `parked_keys`,
//!   with that record as its *head*.
//! * **Hold**: while K is parked, every later record of K (main or retry
//!   topic) that is not the head is stored in `held_records`, in arrival
//!   order, in the same transaction as the rest of its batch; its offset then
//!   moves on. Other keys keep flowing.
//! * **Release**: when the head is applied (a retry succeeds, or a replay of
//!   its dead letter), or an operator ignores it with `--release-followers`,
//!   the held records are applied one by one in order, each deleted in the
//!   transaction that applies it. One that fails becomes the new head (it is
//!   forwarded to the retry topic) and the rest stay behind it. K is unparked
//!   when none remain.
//!
//! The head is recognised by where it was first consumed (`head_origin`,
//! carried across hops by the `orderpipe.original-*` headers) or by its
//! event id (a replay to the original topic has new coordinates).
//!
//! The happy path costs no query: each consumer keeps the set of its parked
//! keys in memory (loaded when a partition is assigned) and only consults
//! the table for keys in that set and for retry-topic records. Parking and
//! holding take the parked row's lock (`SELECT ... FOR UPDATE`), so a hold
//! and the final unpark of the same key never interleave.

use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Timestamp};
use serde::{Deserialize, Serialize};

use crate::db::{Db, DbError, Dialect, Tx};
use crate::envelope::Envelope;
use crate::clock::now_ms;
use crate::kafka::record::{FailureHistory, headers_from_json, headers_json};

/// Whether a group keeps per-key order under failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OrderingMode {
    /// Park a key whose record left the main path; hold its later records.
    #[default]
    Key,
    /// Throughput first: later records of a failing key are applied while
    /// it waits in the retry topic or the DLQ (per-key order is lost then).
    None,
}

/// Why a key is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ParkState {
    /// The head waits in the retry topic.
    Retrying,
    /// The head was dead-lettered.
    Dead,
    /// An operator ignored the head and released its followers.
    Release,
}

impl ParkState {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retrying => "retrying",
            Self::Dead => "dead",
            Self::Release => "release",
        }
    }
}

/// A parked key (a `parked_keys` row).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Parked {
    /// The record key (order id).
    #[sqlx(rename = "record_key")]
    pub key: String,
    /// Partition of the key.
    #[sqlx(rename = "kafka_partition")]
    pub partition: i32,
    /// Where the head was first consumed: `topic/partition/offset`.
    pub head_origin: String,
    /// The head's event id (none for an undecodable head).
    pub head_event_id: Option<String>,
    /// The head's event name.
    pub head_event_name: Option<String>,
    /// `retrying`, `dead` or `release`.
    pub state: String,
    /// Parked since (ms since the epoch).
    pub parked_ms: i64,
}

/// What to do with a record of a key that may be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// The key is not parked: apply as usual.
    Open,
    /// The record is the parked key's head: apply it, then release.
    Head,
    /// The record waits behind the head.
    Hold,
    /// The record was applied already (a redelivery): skip it.
    Duplicate,
}

/// Where `message` was first consumed, as stored in `head_origin`.
pub fn origin_of(message: &OwnedMessage) -> String {
    let h = FailureHistory::of(message);
    origin(&h.original_topic, h.original_partition, h.original_offset)
}

/// `topic/partition/offset`, the form of `head_origin`.
pub fn origin(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

const COLUMNS: &str = "record_key, kafka_partition, head_origin, head_event_id, head_event_name, state, parked_ms";

/// The parked row of `key`, locked until `tx` ends (SQLite locks the whole
/// database for a writer, so it needs no row lock).
pub async fn lock(tx: &mut Tx, dialect: Dialect, group: &str, key: &str) -> Result<Option<Parked>, DbError> {
    let lock = match dialect {
        Dialect::MySql => " FOR UPDATE",
        Dialect::Sqlite => "",
    };
    Ok(sqlx::query_as(select_parked(lock)).bind(group).bind(key).fetch_optional(&mut **tx).await?)
}

/// The parked row of a group and key, plus `suffix` (a lock clause).
fn select_parked(suffix: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM parked_keys WHERE consumer_group = ? AND record_key = ?{suffix}"))
}

/// Decides what happens to a record of `key` (`event` is None when it could
/// not be decoded) if the key may be parked.
pub async fn gate(
    tx: &mut Tx,
    dialect: Dialect,
    group: &str,
    key: &str,
    message: &OwnedMessage,
    event: Option<&Envelope>,
) -> Result<Gate, DbError> {
    let Some(parked) = lock(tx, dialect, group, key).await? else {
        return Ok(Gate::Open);
    };
    let event_id = event.map(|e| e.event_id.to_string());
    if is_head(&parked, message, event_id.as_deref()) {
        return Ok(Gate::Head);
    }
    match event_id {
        Some(id) if crate::dedup::applied(tx, group, &id).await? => Ok(Gate::Duplicate),
        _ => Ok(Gate::Hold),
    }
}

/// Whether `message` is the head of `parked` (same origin, or same event).
fn is_head(parked: &Parked, message: &OwnedMessage, event_id: Option<&str>) -> bool {
    parked.head_origin == origin_of(message) || (event_id.is_some() && parked.head_event_id.as_deref() == event_id)
}

/// Whether the parked key's head is done with: applied, or released by an operator.
pub async fn head_done(tx: &mut Tx, group: &str, parked: &Parked) -> Result<bool, DbError> {
    if parked.state == ParkState::Release.as_str() {
        return Ok(true);
    }
    match &parked.head_event_id {
        Some(id) => crate::dedup::applied(tx, group, id).await,
        None => Ok(false),
    }
}

/// Holds `message` behind its parked key (idempotent per source record).
pub async fn hold(
    tx: &mut Tx,
    dialect: Dialect,
    group: &str,
    key: &str,
    message: &OwnedMessage,
    event: Option<&Envelope>,
) -> Result<(), DbError> {
    let sql = dialect.insert_ignore(
        "INTO held_records (consumer_group, record_key, source_topic, source_partition, source_offset, \
         source_timestamp, event_id, event_name, payload, headers, held_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    let timestamp = message.timestamp().to_millis();
    sqlx::query(sql)
        .bind(group)
        .bind(key)
        .bind(message.topic())
        .bind(message.partition())
        .bind(message.offset())
        .bind(timestamp)
        .bind(event.map(|e| e.event_id.to_string()))
        .bind(event.map(|e| e.event_name.to_string()))
        .bind(message.payload().unwrap_or_default().to_vec())
        .bind(headers_json(message))
        .bind(now_ms())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Parks `key` with `message` as its head, once the record was forwarded
/// to the retry topic or the DLQ. If the key is parked already, only its
/// head's state is updated, unless `rehead` (a released record failed and
/// takes the head's place): a forwarded record that is not the head comes
/// back from the retry topic to be held behind the head.
#[allow(clippy::too_many_arguments)] // one per column of the head
pub async fn park(
    tx: &mut Tx,
    dialect: Dialect,
    group: &str,
    key: &str,
    message: &OwnedMessage,
    event: Option<&Envelope>,
    state: ParkState,
    rehead: bool,
) -> Result<(), DbError> {
    let now = now_ms();
    let origin = origin_of(message);
    let event_id = event.map(|e| e.event_id.to_string());
    let event_name = event.map(|e| e.event_name.to_string());
    let inserted = sqlx::query(dialect.insert_ignore(
        "INTO parked_keys (consumer_group, record_key, kafka_partition, head_origin, head_event_id, head_event_name, \
         state, parked_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    ))
    .bind(group)
    .bind(key)
    .bind(message.partition())
    .bind(&origin)
    .bind(&event_id)
    .bind(&event_name)
    .bind(state.as_str())
    .bind(now)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    if inserted.rows_affected() == 0 {
        let current = lock(tx, dialect, group, key).await?;
        if !rehead && current.is_some_and(|p| !is_head(&p, message, event_id.as_deref())) {
            return Ok(());
        }
        sqlx::query(
            "UPDATE parked_keys SET head_origin = ?, head_event_id = ?, head_event_name = ?, state = ?, updated_ms = ? \
             WHERE consumer_group = ? AND record_key = ?",
        )
        .bind(&origin)
        .bind(&event_id)
        .bind(&event_name)
        .bind(state.as_str())
        .bind(now)
        .bind(group)
        .bind(key)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Unparks `key` (its head is done and nothing is held behind it).
pub async fn unpark(tx: &mut Tx, group: &str, key: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM parked_keys WHERE consumer_group = ? AND record_key = ?")
        .bind(group)
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A record held behind a parked key (a `held_records` row).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct HeldRecord {
    /// Row id (arrival order).
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// The record key (order id).
    #[sqlx(rename = "record_key")]
    pub key: String,
    /// Where it was consumed.
    pub source_topic: String,
    /// Partition there.
    pub source_partition: i32,
    /// Offset there.
    pub source_offset: i64,
    /// Its timestamp there (ms).
    pub source_timestamp: Option<i64>,
    /// Event id (none for an undecodable record).
    pub event_id: Option<String>,
    /// Event name.
    pub event_name: Option<String>,
    /// The record value as consumed.
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Its headers as consumed (JSON object).
    #[serde(skip)]
    pub headers: String,
    /// Held since (ms).
    pub held_ms: i64,
}

impl HeldRecord {
    /// The record as it was consumed, to apply or forward it again.
    pub fn to_message(&self) -> OwnedMessage {
        let timestamp = self.source_timestamp.map_or(Timestamp::NotAvailable, Timestamp::CreateTime);
        OwnedMessage::new(
            Some(self.payload.clone()),
            Some(self.key.clone().into_bytes()),
            self.source_topic.clone(),
            timestamp,
            self.source_partition,
            self.source_offset,
            Some(headers_from_json(&self.headers)),
        )
    }
}

const HELD_COLUMNS: &str = "id, consumer_group, record_key, source_topic, source_partition, source_offset, source_timestamp, \
                            event_id, event_name, payload, headers, held_ms";

/// The oldest record held behind `key`.
pub async fn first_held(tx: &mut Tx, group: &str, key: &str) -> Result<Option<HeldRecord>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {HELD_COLUMNS} FROM held_records WHERE consumer_group = ? AND record_key = ? ORDER BY id LIMIT 1"
    ));
    Ok(sqlx::query_as(sql).bind(group).bind(key).fetch_optional(&mut **tx).await?)
}

/// Deletes a held record (applied, or made the new head); false if it was gone.
pub async fn delete_held(tx: &mut Tx, id: i64) -> Result<bool, DbError> {
    let r = sqlx::query("DELETE FROM held_records WHERE id = ?").bind(id).execute(&mut **tx).await?;
    Ok(r.rows_affected() > 0)
}

/// Parked keys of one partition, to load a consumer's in-memory set when
/// the partition is assigned.
pub async fn keys_of_partition(db: &Db, group: &str, partition: i32) -> Result<Vec<String>, DbError> {
    let rows: Vec<(String,)> = sqlx::query_as("SELECT record_key FROM parked_keys WHERE consumer_group = ? AND kafka_partition = ?")
        .bind(group)
        .bind(partition)
        .fetch_all(&db.pool)
        .await?;
    Ok(rows.into_iter().map(|(k,)| k).collect())
}

/// Parked keys whose followers can be released now: the head was applied
/// (a crash came between its commit and the release) or an operator
/// released them. With their partition.
pub async fn releasable(db: &Db, group: &str) -> Result<Vec<(String, i32)>, DbError> {
    let rows: Vec<(String, i32)> = sqlx::query_as(
        "SELECT p.record_key, p.kafka_partition FROM parked_keys p WHERE p.consumer_group = ? AND (p.state = 'release' \
         OR EXISTS (SELECT 1 FROM event_dedup d WHERE d.consumer_group = p.consumer_group AND d.event_id = p.head_event_id))",
    )
    .bind(group)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows)
}

/// Parked keys, held records and the oldest parked time of one group.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OrderingGauges {
    /// Keys parked.
    pub parked_keys: i64,
    /// Records held behind them.
    pub held_records: i64,
    /// The oldest parked key's `parked_ms` (None when none is parked).
    pub oldest_parked_ms: Option<i64>,
}

/// Current gauges of `group`.
pub async fn gauges(db: &Db, group: &str) -> Result<OrderingGauges, DbError> {
    let (parked_keys, oldest_parked_ms): (i64, Option<i64>) =
        sqlx::query_as("SELECT COUNT(*), MIN(parked_ms) FROM parked_keys WHERE consumer_group = ?")
            .bind(group)
            .fetch_one(&db.pool)
            .await?;
    let (held_records,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM held_records WHERE consumer_group = ?")
        .bind(group)
        .fetch_one(&db.pool)
        .await?;
    Ok(OrderingGauges { parked_keys, held_records, oldest_parked_ms })
}

/// Held records, oldest first, optionally of one group.
async fn held(db: &Db, group: Option<&str>, limit: i64) -> Result<Vec<HeldRecord>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {HELD_COLUMNS} FROM held_records WHERE (? IS NULL OR consumer_group = ?) ORDER BY id LIMIT ?"
    ));
    Ok(sqlx::query_as(sql)
        .bind(group)
        .bind(group)
        .bind(limit)
        .fetch_all(&db.pool)
        .await?)
}

/// The parked key of `group` and `key`, if parked.
pub async fn parked(db: &Db, group: &str, key: &str) -> Result<Option<Parked>, DbError> {
    Ok(sqlx::query_as(select_parked("")).bind(group).bind(key).fetch_optional(&db.pool).await?)
}

/// The key a dead letter heads, if it does: the group's parked row whose
/// head is the dead letter (by origin or event id).
pub async fn headed_by(
    db: &Db,
    group: &str,
    key: &str,
    origin: &str,
    event_id: Option<&str>,
) -> Result<Option<Parked>, DbError> {
    Ok(parked(db, group, key)
        .await?
        .filter(|p| p.head_origin == origin || (event_id.is_some() && p.head_event_id.as_deref() == event_id)))
}

/// Releases the followers of a parked key whose head an operator ignored:
/// the consumer applies them in order and then unparks the key.
pub async fn mark_release(db: &Db, group: &str, key: &str) -> Result<(), DbError> {
    sqlx::query("UPDATE parked_keys SET state = 'release', updated_ms = ? WHERE consumer_group = ? AND record_key = ?")
        .bind(now_ms())
        .bind(group)
        .bind(key)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// A held record with the head it waits behind, for operators.
#[derive(Debug, Clone, Serialize)]
pub struct HeldView {
    /// The held record.
    #[serde(flatten)]
    pub held: HeldRecord,
    /// The parked key's head (None if the key was unparked meanwhile).
    pub head: Option<Parked>,
    /// The head's dead-letter row, when it was dead-lettered and persisted.
    pub head_dead_letter: Option<i64>,
}

/// The dead-letter row of a head (by group and origin), if persisted.
pub async fn dead_letter_of_head(db: &Db, group: &str, head: &Parked) -> Result<Option<i64>, DbError> {
    let mut parts = head.head_origin.rsplitn(3, '/');
    let (Some(offset), Some(partition), Some(topic)) = (parts.next(), parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (Ok(offset), Ok(partition)) = (offset.parse::<i64>(), partition.parse::<i32>()) else {
        return Ok(None);
    };
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT id FROM dead_letters WHERE consumer_group = ? AND original_topic = ? \
         AND original_partition = ? AND original_offset = ?",
    )
    .bind(group)
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .fetch_optional(&db.pool)
    .await?;
    Ok(row.map(|(id,)| id))
}

/// Held records (oldest first) with the head each waits behind.
pub async fn held_views(db: &Db, group: Option<&str>, limit: i64) -> Result<Vec<HeldView>, DbError> {
    let mut views = Vec::new();
    for record in held(db, group, limit).await? {
        views.push(with_head(db, record).await?);
    }
    Ok(views)
}

/// A held record with its key's head and the head's dead-letter row.
async fn with_head(db: &Db, held: HeldRecord) -> Result<HeldView, DbError> {
    let head = parked(db, &held.consumer_group, &held.key).await?;
    let head_dead_letter = match &head {
        Some(h) => dead_letter_of_head(db, &held.consumer_group, h).await?,
        None => None,
    };
    Ok(HeldView { held, head, head_dead_letter })
}

/// Records held behind `key` for `group`.
pub async fn held_count(db: &Db, group: &str, key: &str) -> Result<i64, DbError> {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM held_records WHERE consumer_group = ? AND record_key = ?")
        .bind(group)
        .bind(key)
        .fetch_one(&db.pool)
        .await?;
    Ok(n)
}

/// One held record with its head, by id.
pub async fn held_view(db: &Db, id: i64) -> Result<Option<HeldView>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!("SELECT {HELD_COLUMNS} FROM held_records WHERE id = ?"));
    match sqlx::query_as(sql).bind(id).fetch_optional(&db.pool).await? {
        Some(held) => Ok(Some(with_head(db, held).await?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::record::{header, with_headers};
    use rdkafka::message::{Header, OwnedHeaders};

    fn record(topic: &str, offset: i64, headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(Some(b"v".to_vec()), Some(b"42".to_vec()), topic.into(), Timestamp::CreateTime(1), 3, offset, Some(headers))
    }

    #[test]
    fn a_head_keeps_its_origin_across_retry_hops() {
        let first = record("order.events.v1", 77, OwnedHeaders::new());
        assert_eq!(origin_of(&first), "order.events.v1/3/77");
        let hop = with_headers(
            &first,
            &[(header::ORIGINAL_TOPIC, "order.events.v1".into()), (header::ORIGINAL_PARTITION, "3".into()), (header::ORIGINAL_OFFSET, "77".into())],
        );
        let retried = record("order.events.v1.retry.g", 5, hop);
        assert_eq!(origin_of(&retried), origin_of(&first), "the same head on the retry topic");
    }

    #[test]
    fn held_headers_round_trip() {
        let message = record("t", 1, OwnedHeaders::new().insert(Header { key: "event_id", value: Some("e-1") }));
        let back = headers_from_json(&headers_json(&message));
        let restored = record("t", 1, back);
        assert_eq!(crate::kafka::record::header_text(&restored, "event_id").as_deref(), Some("e-1"));
    }
}
