//! `event_dedup`: the exactly-once-in-effect guard.
//!
//! Inside the transaction that applies an event, [`claim`] inserts the row
//! `(consumer_group, event_id)` with `INSERT IGNORE`. One affected row means
//! this group has not applied the event: run the effect. Zero means it has:
//! skip it. Because the row and the effect commit together, a crash at any
//! point either leaves both or neither, and a redelivery is recognised.
//!
//! Rows only need to outlive the longest time a record can be redelivered;
//! [`cleanup`] deletes older ones in small batches so no long lock is held.

use std::time::Duration;

use chrono::Utc;

use crate::db::{Db, DbError, Dialect, Tx};
use crate::envelope::Envelope;

/// Where a record came from, stored with its dedup row.
#[derive(Debug, Clone)]
pub struct RecordOrigin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record key (the order id).
    pub key: String,
}

/// Inserts the dedup row; `true` when this group sees the event for the first time.
pub async fn claim(
    tx: &mut Tx,
    dialect: Dialect,
    group: &str,
    envelope: &Envelope,
    origin: &RecordOrigin,
) -> Result<bool, DbError> {
    let sql = match dialect {
        Dialect::MySql => {
            "INSERT IGNORE INTO event_dedup \
             (consumer_group, event_id, topic, kafka_partition, kafka_offset, event_type, record_key) \
             VALUES (?, ?, ?, ?, ?, ?, ?)"
        }
        // SQLite has no AUTO_INCREMENT on a non-key column; one writer at a
        // time makes MAX()+1 safe.
        Dialect::Sqlite => {
            "INSERT OR IGNORE INTO event_dedup \
             (consumer_group, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, apply_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?, (SELECT COALESCE(MAX(apply_seq), 0) + 1 FROM event_dedup))"
        }
    };
    let result = sqlx::query(sql)
        .bind(group)
        .bind(envelope.event_id.to_string())
        .bind(&origin.topic)
        .bind(origin.partition)
        .bind(origin.offset)
        .bind(envelope.event_name.as_str())
        .bind(&origin.key)
        .execute(&mut **tx)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Whether `group` applied the event already (its dedup row exists), for
/// checks that must not insert the row.
pub async fn applied(tx: &mut Tx, group: &str, event_id: &str) -> Result<bool, DbError> {
    let row = sqlx::query("SELECT 1 FROM event_dedup WHERE consumer_group = ? AND event_id = ?")
        .bind(group)
        .bind(event_id)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.is_some())
}

/// Rows deleted per statement by [`cleanup`].
pub const CLEANUP_BATCH: u32 = 1000;

/// Deletes dedup rows older than `older_than`, `batch` rows per statement
/// (each its own short transaction); returns how many were removed.
pub async fn cleanup(db: &Db, older_than: Duration, batch: u32) -> Result<u64, DbError> {
    let cutoff = Utc::now() - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
    let cutoff = cutoff.format("%Y-%m-%d %H:%M:%S%.3f").to_string();
    let sql = match db.dialect {
        Dialect::MySql => "DELETE FROM event_dedup WHERE created_at < ? LIMIT ?",
        Dialect::Sqlite => {
            "DELETE FROM event_dedup WHERE rowid IN \
             (SELECT rowid FROM event_dedup WHERE created_at < ? LIMIT ?)"
        }
    };
    let mut removed = 0;
    loop {
        let result = sqlx::query(sql)
            .bind(&cutoff)
            .bind(i64::from(batch))
            .execute(&db.pool)
            .await?;
        removed += result.rows_affected();
        if result.rows_affected() < u64::from(batch) {
            return Ok(removed);
        }
        // Let other writers in between batches.
        tokio::task::yield_now().await;
    }
}
