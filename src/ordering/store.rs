//! The `parked_keys` and `held_records` statements: what the partition
//! worker runs inside its transactions (lock, hold, park, unpark, release
//! one held record) and what the consumer's background task reads (the
//! parked keys of a partition, the releasable keys, the gauges). The
//! decisions around them are in [`super::gate`]; the operators' views in
//! [`crate::dlq::held`].

use std::collections::HashMap;

use metrics::gauge;
use rdkafka::Message;
use serde::Serialize;

use super::{OrderKey, Origin, ParkState};
use crate::clock::now_ms;
use crate::db::rows::{self, Bound};
use crate::db::{Db, DbError, Tx};
use crate::envelope::Envelope;
use crate::kafka::record::headers_json;
use crate::metrics::name;

/// A parked key (a `parked_keys` row).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Parked {
    /// The main topic of the key ([`OrderKey::topic`]).
    pub key_topic: String,
    /// The record key (order id).
    #[sqlx(rename = "record_key")]
    pub key: String,
    /// Partition of the key.
    #[sqlx(rename = "kafka_partition")]
    pub partition: i32,
    /// Where the head was first consumed, as text: `topic/partition/offset`
    /// (the columns below are what queries use).
    pub head_origin: String,
    /// Topic where the head was first consumed.
    pub head_topic: String,
    /// Its partition there.
    pub head_partition: i32,
    /// Its offset there.
    pub head_offset: i64,
    /// The head's event id (none for an undecodable head).
    pub head_event_id: Option<String>,
    /// The head's event name.
    pub head_event_name: Option<String>,
    /// Why the key is parked.
    #[sqlx(try_from = "String")]
    pub state: ParkState,
    /// Parked since (ms since the epoch).
    pub parked_ms: i64,
}

impl Parked {
    /// Where the head was first consumed.
    pub fn head(&self) -> Origin {
        Origin {
            topic: self.head_topic.clone(),
            partition: self.head_partition,
            offset: self.head_offset,
        }
    }

    /// The parked key.
    pub fn order_key(&self) -> OrderKey {
        OrderKey {
            topic: self.key_topic.clone(),
            key: self.key.clone(),
        }
    }
}

/// The columns of [`Parked`].
pub(crate) const PARKED_COLUMNS: &str = "key_topic, record_key, kafka_partition, head_origin, head_topic, head_partition, head_offset, \
                                         head_event_id, head_event_name, state, parked_ms";

/// The parked row of a group and key.
fn select_parked() -> String {
    format!(
        "SELECT {PARKED_COLUMNS} FROM parked_keys WHERE consumer_group = ? AND key_topic = ? AND record_key = ?"
    )
}

/// The parked row of `key`, locked until `tx` ends (SQLite locks the whole
/// database for a writer, so it needs no row lock).
pub async fn lock(tx: &mut Tx, group: &str, key: &OrderKey) -> Result<Option<Parked>, DbError> {
    let sql = tx.sql().locking(&select_parked());
    Ok(sqlx::query_as(sql)
        .bind(group)
        .bind(&key.topic)
        .bind(&key.key)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The parked rows of `keys` (distinct), locked until `tx` ends: a batch's
/// gate reads all its keys in one statement per topic and piece
/// ([`crate::db::rows`]; a batch is one partition's, so mostly one topic).
pub async fn lock_keys(
    tx: &mut Tx,
    group: &str,
    keys: &[&OrderKey],
) -> Result<HashMap<OrderKey, Parked>, DbError> {
    let mut found = HashMap::with_capacity(keys.len());
    let row_lock = tx.sql().row_lock();
    for (topic, keys) in by_topic(keys) {
        for piece in crate::db::rows::pieces(&keys) {
            let mut query = select_of_keys(PARKED_COLUMNS, "parked_keys", group, topic, piece);
            query.push(row_lock);
            let rows: Vec<Parked> = query.build_query_as().fetch_all(&mut **tx).await?;
            found.extend(rows.into_iter().map(|parked| (parked.order_key(), parked)));
        }
    }
    Ok(found)
}

/// `keys` by topic, the topics in a fixed order: two transactions lock
/// rows of two topics alike.
fn by_topic<'k>(keys: &[&'k OrderKey]) -> std::collections::BTreeMap<&'k str, Vec<&'k str>> {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<&str>> =
        std::collections::BTreeMap::new();
    for key in keys {
        by_topic
            .entry(key.topic.as_str())
            .or_default()
            .push(key.key.as_str());
    }
    by_topic
}

/// `SELECT {columns} FROM {table}` of `group`'s rows of `keys` in `topic`,
/// open for what follows the `WHERE`.
fn select_of_keys(
    columns: &str,
    table: &str,
    group: &str,
    topic: &str,
    keys: &[&str],
) -> sqlx::QueryBuilder<sqlx::Any> {
    let mut query = sqlx::QueryBuilder::<sqlx::Any>::new(format!(
        "SELECT {columns} FROM {table} WHERE consumer_group = "
    ));
    query
        .push_bind(group.to_string())
        .push(" AND key_topic = ")
        .push_bind(topic.to_string())
        .push(" AND record_key");
    rows::push_in(&mut query, keys.iter().map(|key| key.to_string()));
    query
}

/// The parked row of `key`, if parked (no lock).
pub async fn parked(db: &Db, group: &str, key: &OrderKey) -> Result<Option<Parked>, DbError> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(select_parked()))
        .bind(group)
        .bind(&key.topic)
        .bind(&key.key)
        .fetch_optional(&db.pool)
        .await?)
}

/// A new head of a parked key: where it was first consumed and what it is.
#[derive(Debug, Clone)]
pub struct Head {
    /// Where it was first consumed.
    pub origin: Origin,
    /// Its event id (none when undecodable).
    pub event_id: Option<String>,
    /// Its event name.
    pub event_name: Option<String>,
    /// Why the key is parked.
    pub state: ParkState,
}

/// A key to park ([`park_keys`]): the partition of its topic, and its head.
#[derive(Debug, Clone)]
pub struct NewPark<'a> {
    /// The key.
    pub key: &'a OrderKey,
    /// Its partition.
    pub partition: i32,
    /// The record that becomes, or updates, its head.
    pub head: Head,
    /// `head.origin` as text (the `head_origin` column).
    pub origin: String,
}

/// The columns of `parked_keys` a park writes, in [`park_keys`]'s order.
const PARK_COLUMNS: &str = "consumer_group, key_topic, record_key, kafka_partition, head_origin, head_topic, head_partition, \
                            head_offset, head_event_id, head_event_name, state, parked_ms, updated_ms";

/// What a park of a parked key changes: its head, and when.
const HEAD_COLUMNS: &[&str] = &[
    "head_origin",
    "head_topic",
    "head_partition",
    "head_offset",
    "head_event_id",
    "head_event_name",
    "state",
    "updated_ms",
];

/// Parks every key of `parks` in one statement per piece
/// ([`crate::db::rows`]): a key not parked yet is parked behind its head.
/// A parked key takes the new head if `rehead` (a released record failed
/// and takes its head's place); otherwise only if the new head is its head
/// already (the same origin, or the same event: a state change from
/// retrying to dead; [`super::gate::is_head`]'s rule, in SQL), so a
/// forwarded record that is not the head leaves it.
/// Keys go in order, so two transactions lock the rows alike.
pub async fn park_keys(
    tx: &mut Tx,
    group: &str,
    parks: &mut [NewPark<'_>],
    rehead: bool,
) -> Result<(), DbError> {
    parks.sort_by(|a, b| a.key.cmp(b.key));
    let matching: &[&[&str]] = if rehead {
        &[]
    } else {
        &[
            &["head_topic", "head_partition", "head_offset"],
            &["head_event_id"],
        ]
    };
    let then = tx.sql().on_duplicate(
        "parked_keys",
        "consumer_group, key_topic, record_key",
        HEAD_COLUMNS,
        matching,
    );
    let now = now_ms();
    crate::db::rows::insert_pieces(
        tx,
        "INSERT",
        &format!("parked_keys ({PARK_COLUMNS})"),
        &then,
        parks,
        |p| {
            vec![
                Bound::Text(group),
                Bound::Text(&p.key.topic),
                Bound::Text(&p.key.key),
                Bound::Int(p.partition.into()),
                Bound::Text(&p.origin),
                Bound::Text(&p.head.origin.topic),
                Bound::Int(p.head.origin.partition.into()),
                Bound::Int(p.head.origin.offset),
                Bound::MaybeText(p.head.event_id.as_deref()),
                Bound::MaybeText(p.head.event_name.as_deref()),
                Bound::Text(p.head.state.as_str()),
                Bound::Int(now),
                Bound::Int(now),
            ]
        },
    )
    .await?;
    Ok(())
}

/// Unparks `key` (its head is done and nothing is held behind it).
pub async fn unpark(tx: &mut Tx, group: &str, key: &OrderKey) -> Result<(), DbError> {
    sqlx::query(
        "DELETE FROM parked_keys WHERE consumer_group = ? AND key_topic = ? AND record_key = ?",
    )
    .bind(group)
    .bind(&key.topic)
    .bind(&key.key)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Releases the followers of a parked key whose head an operator ignored:
/// the consumer applies them in order and then unparks the key.
pub async fn mark_release(db: &Db, group: &str, key: &OrderKey) -> Result<(), DbError> {
    sqlx::query("UPDATE parked_keys SET state = ?, updated_ms = ? WHERE consumer_group = ? AND key_topic = ? AND record_key = ?")
        .bind(ParkState::Release.as_str())
        .bind(now_ms())
        .bind(group)
        .bind(&key.topic)
        .bind(&key.key)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Holds `message` behind its parked key (idempotent per source record).
pub async fn hold(
    tx: &mut Tx,
    group: &str,
    key: &OrderKey,
    message: &impl Message,
    event: Option<&Envelope>,
) -> Result<(), DbError> {
    let sql = tx.sql().insert_ignore(
        "INTO held_records (consumer_group, key_topic, record_key, source_topic, source_partition, source_offset, \
         source_timestamp, event_id, event_name, payload, headers, held_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    sqlx::query(sql)
        .bind(group)
        .bind(&key.topic)
        .bind(&key.key)
        .bind(message.topic())
        .bind(message.partition())
        .bind(message.offset())
        .bind(message.timestamp().to_millis())
        .bind(event.map(|e| e.event_id.to_string()))
        .bind(event.map(|e| e.event_name.to_string()))
        .bind(message.payload().unwrap_or_default().to_vec())
        .bind(headers_json(message))
        .bind(now_ms())
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
    /// The main topic of its key ([`OrderKey::topic`]; `source_topic` may
    /// be the group's retry topic).
    pub key_topic: String,
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

/// The columns of [`HeldRecord`].
pub(crate) const HELD_COLUMNS: &str = "id, consumer_group, key_topic, record_key, source_topic, source_partition, source_offset, \
                                       source_timestamp, event_id, event_name, payload, headers, held_ms";

/// The oldest record held behind `key`.
pub async fn first_held(
    tx: &mut Tx,
    group: &str,
    key: &OrderKey,
) -> Result<Option<HeldRecord>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {HELD_COLUMNS} FROM held_records WHERE consumer_group = ? AND key_topic = ? AND record_key = ? ORDER BY id LIMIT 1"
    ));
    Ok(sqlx::query_as(sql)
        .bind(group)
        .bind(&key.topic)
        .bind(&key.key)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The records held behind `keys`, oldest first, at most `limit` per
/// statement (one per topic and piece, so each key's are a prefix of its
/// held records), and whether that was all of them.
pub async fn held_of(
    tx: &mut Tx,
    group: &str,
    keys: &[&OrderKey],
    limit: usize,
) -> Result<(Vec<HeldRecord>, bool), DbError> {
    let (mut held, mut complete) = (Vec::new(), true);
    for (topic, keys) in by_topic(keys) {
        for piece in crate::db::rows::pieces(&keys) {
            let mut query = select_of_keys(HELD_COLUMNS, "held_records", group, topic, piece);
            query.push(" ORDER BY id LIMIT ").push_bind(limit as i64);
            let rows: Vec<HeldRecord> = query.build_query_as().fetch_all(&mut **tx).await?;
            complete &= rows.len() < limit;
            held.extend(rows);
        }
    }
    held.sort_by_key(|h| h.id);
    Ok((held, complete))
}

/// Deletes a held record (applied, or made the new head); false if it was gone.
pub async fn delete_held(tx: &mut Tx, id: i64) -> Result<bool, DbError> {
    let r = sqlx::query("DELETE FROM held_records WHERE id = ?")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(r.rows_affected() > 0)
}

/// Deletes the held records `ids` (released records that failed again and
/// head their keys now), in one statement.
pub async fn delete_held_all(tx: &mut Tx, ids: &[i64]) -> Result<(), DbError> {
    crate::db::rows::delete_in(tx, "held_records", "id", ids).await?;
    Ok(())
}

/// Parked keys of one partition of `topic`, to load a consumer's in-memory
/// set when the partition is assigned.
pub async fn keys_of_partition(
    db: &Db,
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<Vec<OrderKey>, DbError> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT record_key FROM parked_keys WHERE consumer_group = ? AND key_topic = ? AND kafka_partition = ?")
            .bind(group)
            .bind(topic)
            .bind(partition)
            .fetch_all(&db.pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(key,)| OrderKey {
            topic: topic.to_string(),
            key,
        })
        .collect())
}

/// Parked keys whose followers can be released now: the head was applied
/// (a crash came between its commit and the release) or an operator
/// released them. With their partition (of the key's topic).
pub async fn releasable(db: &Db, group: &str) -> Result<Vec<(OrderKey, i32)>, DbError> {
    let rows: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT p.key_topic, p.record_key, p.kafka_partition FROM parked_keys p WHERE p.consumer_group = ? AND (p.state = ? \
         OR EXISTS (SELECT 1 FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id \
         WHERE g.name = p.consumer_group AND d.event_id = unhex(replace(p.head_event_id, '-', ''))))",
    )
    .bind(group)
    .bind(ParkState::Release.as_str())
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, key, partition)| (OrderKey { topic, key }, partition))
        .collect())
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

impl OrderingGauges {
    /// Exports these gauges of `group`.
    pub fn report(&self, group: &str) {
        gauge!(name::PARKED_KEYS, "group" => group.to_string()).set(self.parked_keys as f64);
        gauge!(name::HELD_NOW, "group" => group.to_string()).set(self.held_records as f64);
        let age = self.oldest_parked_ms.map_or(0.0, |t| {
            ((crate::clock::now_ms() - t).max(0) as f64) / 1000.0
        });
        gauge!(name::PARKED_OLDEST_AGE, "group" => group.to_string()).set(age);
    }
}

/// Current gauges of `group`.
pub async fn gauges(db: &Db, group: &str) -> Result<OrderingGauges, DbError> {
    let (parked_keys, oldest_parked_ms): (i64, Option<i64>) =
        sqlx::query_as("SELECT COUNT(*), MIN(parked_ms) FROM parked_keys WHERE consumer_group = ?")
            .bind(group)
            .fetch_one(&db.pool)
            .await?;
    let (held_records,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM held_records WHERE consumer_group = ?")
            .bind(group)
            .fetch_one(&db.pool)
            .await?;
    Ok(OrderingGauges {
        parked_keys,
        held_records,
        oldest_parked_ms,
    })
}
