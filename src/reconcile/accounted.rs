//! What a group's tables say it did with the records of a window: the
//! events it applied (`event_dedup`), the records it dead-lettered
//! (`dead_letters`), holds behind a parked key (`held_records`) or has in
//! its retry topic or the DLQ topic as the head of a parked key
//! (`parked_keys`).
//!
//! Lookups are by event id for `event_dedup` (its primary key is
//! `(group_id, event_id)`; an event applied from the retry topic or a
//! replay has its dedup row at that other position) and by original
//! position for the rest (each has a unique key starting with the group and
//! the original topic, partition and offset), so every statement uses an
//! index.

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use sqlx::Row;

use crate::db::{Db, DbError};

/// A record a group accounts for other than by applying it, by where it
/// was first consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounted {
    /// Offset in the partition asked about.
    pub offset: i64,
    /// Its event id, when known.
    pub event_id: Option<String>,
}

/// The tables that account for a record by where it was first consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `dead_letters` of the group (any status: pending, replayed or ignored).
    DeadLetters,
    /// `held_records`: waiting behind a parked key.
    Held,
    /// `parked_keys` heads: in the group's retry topic, or dead-lettered and
    /// perhaps not persisted yet.
    ParkedHeads,
}

impl Source {
    /// (offset, event id) of the source's rows of one group, original topic
    /// and partition, offsets between two bounds: each an index range.
    fn sql(self) -> &'static str {
        match self {
            Self::DeadLetters => {
                "SELECT original_offset, event_id FROM dead_letters WHERE consumer_group = ? AND original_topic = ? \
                 AND original_partition = ? AND original_offset BETWEEN ? AND ?"
            }
            Self::Held => {
                "SELECT source_offset, event_id FROM held_records WHERE consumer_group = ? AND source_topic = ? \
                 AND source_partition = ? AND source_offset BETWEEN ? AND ?"
            }
            Self::ParkedHeads => {
                "SELECT head_offset, head_event_id FROM parked_keys WHERE consumer_group = ? AND head_topic = ? \
                 AND head_partition = ? AND head_offset BETWEEN ? AND ?"
            }
        }
    }
}

/// The records `source` holds for `group` that were first consumed from
/// `topic`/`partition` at an offset in `from..=to`.
pub async fn at_positions(
    db: &Db,
    source: Source,
    group: &str,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> Result<Vec<Accounted>, DbError> {
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(source.sql())
        .bind(group)
        .bind(topic)
        .bind(partition)
        .bind(from)
        .bind(to)
        .fetch_all(&db.pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(offset, event_id)| Accounted { offset, event_id })
        .collect())
}

/// A dedup row of a group, where it was applied from.
#[derive(Debug, Clone)]
pub struct AppliedRow {
    /// Event id.
    pub event_id: String,
    /// Event name.
    pub event_name: String,
    /// Partition it was applied from.
    pub partition: i32,
    /// Offset it was applied from.
    pub offset: i64,
}

/// Calls `each` with every dedup row of `group` applied from `topic` and
/// created at or after `since` (by the database's clock), streaming: the
/// rows from [`crate::dedup::seq_floor`] on, an `apply_seq` index range.
pub async fn applied_since(
    db: &Db,
    group: &str,
    topic: &str,
    since: DateTime<Utc>,
    mut each: impl FnMut(AppliedRow),
) -> Result<(), DbError> {
    let floor = crate::dedup::seq_floor(db, since).await?;
    let mut rows = sqlx::query(
        "SELECT d.event_id, d.event_type, d.kafka_partition, d.kafka_offset FROM event_dedup d \
         JOIN dedup_groups g ON g.id = d.group_id \
         WHERE d.apply_seq >= ? AND g.name = ? AND d.topic = ? AND d.created_at >= ?",
    )
    .bind(floor)
    .bind(group)
    .bind(topic)
    .bind(crate::dedup::db_time(since))
    .fetch(&db.pool);
    while let Some(row) = rows.try_next().await? {
        let id: Vec<u8> = row.try_get(0)?;
        let Ok(id) = uuid::Uuid::from_slice(&id) else {
            continue;
        };
        each(AppliedRow {
            event_id: id.to_string(),
            event_name: row.try_get(1)?,
            partition: row.try_get(2)?,
            offset: row.try_get(3)?,
        });
    }
    Ok(())
}
