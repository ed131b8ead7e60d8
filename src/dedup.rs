//! `event_dedup`: the exactly-once-in-effect guard.
//!
//! Inside the transaction that applies an event, [`claim_batch`] inserts the
//! rows `(consumer_group, event_id)` of a whole batch with one `INSERT IGNORE
//! ... RETURNING`. A returned row means this group has not applied the
//! event: run the effect. A missing one means it has: skip it. Because the row and the effect commit together, a crash at any
//! point either leaves both or neither, and a redelivery is recognised.
//!
//! Rows only need to outlive the longest time a record can be redelivered;
//! [`cleanup`] deletes older ones in small batches so no long lock is held.
//!
//! Each row keeps a [`content_digest`] of the event. A duplicate whose
//! digest differs from its row's is still skipped (the first event under the
//! id was applied), but [`check_duplicate`] records it in `event_conflicts`:
//! a producer reused an event id, and the second event was never applied.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use metrics::counter;
use serde::Serialize;
use sha2::{Digest, Sha256};

use sqlx::Row;

use crate::db::rows::{self, Bound};
use crate::db::{Db, DbError, Dialect, Tx};
use crate::envelope::{Envelope, EventData};
use crate::metrics::name;

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

/// sha256 (64 hex digits) of what an event says: `event_name`,
/// `event_time`, `producer` and `data`, as canonical JSON (fixed field order).
///
/// A true redelivery (the same record again, a retry or replay, or the relay
/// re-publishing the outbox row, even re-encoded under a newer compatible
/// writer schema) has the same digest; a reused id on another event does
/// not. Left out: `event_id` (the same by definition), `event_version` (a
/// minor bump of the same event is the same event), `trace_id` (tracing
/// context, not content) and the transport (headers, schema id, offsets).
/// Fields this build does not know (added in a newer minor) are not decoded,
/// so they are not covered.
pub fn content_digest(envelope: &Envelope) -> String {
    #[derive(Serialize)]
    struct Content<'a> {
        event_name: &'a str,
        event_time: String,
        producer: &'a str,
        data: &'a EventData,
    }
    let content = Content {
        event_name: envelope.event_name.as_str(),
        event_time: envelope.event_time_iso(),
        producer: &envelope.producer,
        data: &envelope.data,
    };
    let json = serde_json::to_vec(&content).expect("an envelope serializes to JSON");
    Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Inserts the dedup row; `true` when this group sees the event for the first time.
pub async fn claim(
    tx: &mut Tx,
    group: &str,
    envelope: &Envelope,
    origin: &RecordOrigin,
) -> Result<bool, DbError> {
    Ok(claim_batch(tx, group, &[(envelope, origin)]).await?[0])
}

/// Claims a set of events for `group`: one multi-row `INSERT IGNORE ...
/// RETURNING event_id` per chunk ([`crate::db::rows`]). For each event, in
/// order, `true` when this group sees it for the first time: the database
/// returns only the rows it inserted, so an event applied before (its row
/// exists) is not listed. Rows go in in the order given and `apply_seq`
/// numbers them in that order; an id given twice is claimed by its first
/// occurrence, the second is a duplicate.
pub async fn claim_batch(
    tx: &mut Tx,
    group: &str,
    events: &[(&Envelope, &RecordOrigin)],
) -> Result<Vec<bool>, DbError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = events.iter().map(|(e, _)| e.event_id.to_string()).collect();
    let digests: Vec<String> = events.iter().map(|(e, _)| content_digest(e)).collect();
    // apply_seq is AUTO_INCREMENT on MariaDB; SQLite numbers the rows here
    // (one writer at a time, so MAX + 1 is safe).
    let (columns, first_seq) = match tx.sql() {
        Dialect::MySql => (CLAIM_COLUMNS, None),
        Dialect::Sqlite => {
            let (max,): (i64,) =
                sqlx::query_as("SELECT COALESCE(MAX(apply_seq), 0) FROM event_dedup")
                    .fetch_one(&mut **tx)
                    .await?;
            (CLAIM_COLUMNS_NUMBERED, Some(max + 1))
        }
    };
    let verb = tx.sql().insert_ignore_verb();
    let positions: Vec<usize> = (0..events.len()).collect();
    let returned = rows::insert_returning(tx, verb, columns, "event_id", &positions, |&i| {
        let (envelope, origin) = events[i];
        let mut values = vec![
            Bound::Text(group),
            Bound::Text(&ids[i]),
            Bound::Text(&origin.topic),
            Bound::Int(i64::from(origin.partition)),
            Bound::Int(origin.offset),
            Bound::Text(envelope.event_name.as_str()),
            Bound::Text(&origin.key),
            Bound::Text(&digests[i]),
        ];
        values.extend(first_seq.map(|seq| Bound::Int(seq + i as i64)));
        values
    })
    .await?;
    let mut inserted: HashMap<String, usize> = HashMap::with_capacity(returned.len());
    for row in returned {
        *inserted.entry(row.try_get::<String, _>(0)?).or_default() += 1;
    }
    Ok(ids
        .iter()
        .map(|id| match inserted.get_mut(id) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        })
        .collect())
}

/// The `event_dedup` columns a claim writes (`apply_seq` is AUTO_INCREMENT).
const CLAIM_COLUMNS: &str = "event_dedup (consumer_group, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest)";
/// The same with `apply_seq` given (SQLite has no auto-increment on a non-key column).
const CLAIM_COLUMNS_NUMBERED: &str = "event_dedup (consumer_group, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest, apply_seq)";

/// A duplicate whose content differs from the event first applied under
/// its id, as stored in `event_conflicts`.
#[derive(Debug, Clone, Serialize)]
pub struct Conflict {
    /// Row id (0 before it is stored).
    pub id: i64,
    /// Group that skipped it.
    pub consumer_group: String,
    /// The reused event id.
    pub event_id: String,
    /// Event name of the skipped record.
    pub event_name: String,
    /// Topic of the event applied under this id.
    pub first_topic: String,
    /// Its partition.
    pub first_partition: i32,
    /// Its offset.
    pub first_offset: i64,
    /// Its content digest.
    pub first_digest: String,
    /// Topic of the skipped record.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its content digest.
    pub digest: String,
    /// When it was detected (ms since the epoch).
    pub detected_ms: i64,
}

/// For a record [`claim`] found to be a duplicate: compares its content
/// digest with its dedup row's. A differing digest is stored in
/// `event_conflicts` (once per record) and returned; a true duplicate, or a
/// row written before digests existed (no digest: unknown), gives None.
pub async fn check_duplicate(
    tx: &mut Tx,
    group: &str,
    envelope: &Envelope,
    origin: &RecordOrigin,
) -> Result<Option<Conflict>, DbError> {
    let event_id = envelope.event_id.to_string();
    let first: Option<(String, i32, i64, Option<String>)> = sqlx::query_as(
        "SELECT topic, kafka_partition, kafka_offset, payload_digest FROM event_dedup WHERE consumer_group = ? AND event_id = ?",
    )
    .bind(group)
    .bind(&event_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((first_topic, first_partition, first_offset, Some(first_digest))) = first else {
        return Ok(None);
    };
    let digest = content_digest(envelope);
    if digest == first_digest {
        return Ok(None);
    }
    let conflict = Conflict {
        id: 0,
        consumer_group: group.to_string(),
        event_id,
        event_name: envelope.event_name.as_str().to_string(),
        first_topic,
        first_partition,
        first_offset,
        first_digest,
        topic: origin.topic.clone(),
        partition: origin.partition,
        offset: origin.offset,
        digest,
        detected_ms: crate::clock::now_ms(),
    };
    let sql = tx.sql().insert_ignore(
        "INTO event_conflicts (consumer_group, event_id, event_name, first_topic, first_partition, first_offset, \
         first_digest, topic, kafka_partition, kafka_offset, digest, detected_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    sqlx::query(sql)
        .bind(&conflict.consumer_group)
        .bind(&conflict.event_id)
        .bind(&conflict.event_name)
        .bind(&conflict.first_topic)
        .bind(conflict.first_partition)
        .bind(conflict.first_offset)
        .bind(&conflict.first_digest)
        .bind(&conflict.topic)
        .bind(conflict.partition)
        .bind(conflict.offset)
        .bind(&conflict.digest)
        .bind(conflict.detected_ms)
        .execute(&mut **tx)
        .await?;
    Ok(Some(conflict))
}

/// Stored conflicting duplicates (of `group`, or all), newest first, at most `limit`.
pub async fn conflicts(db: &Db, group: Option<&str>, limit: i64) -> Result<Vec<Conflict>, DbError> {
    type Row = (
        i64,
        String,
        String,
        String,
        String,
        i32,
        i64,
        String,
        String,
        i32,
        i64,
        String,
        i64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, consumer_group, event_id, event_name, first_topic, first_partition, first_offset, first_digest, \
         topic, kafka_partition, kafka_offset, digest, detected_ms FROM event_conflicts \
         WHERE (? IS NULL OR consumer_group = ?) ORDER BY id DESC LIMIT ?",
    )
    .bind(group)
    .bind(group)
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Conflict {
            id: r.0,
            consumer_group: r.1,
            event_id: r.2,
            event_name: r.3,
            first_topic: r.4,
            first_partition: r.5,
            first_offset: r.6,
            first_digest: r.7,
            topic: r.8,
            partition: r.9,
            offset: r.10,
            digest: r.11,
            detected_ms: r.12,
        })
        .collect())
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
    let cutoff =
        Utc::now() - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
    let cutoff = cutoff.format("%Y-%m-%d %H:%M:%S%.3f").to_string();
    let sql = db
        .sql()
        .delete_limited("event_dedup", "rowid", "created_at < ?");
    let mut removed = 0;
    loop {
        let result = sqlx::query(sql.clone())
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

/// Dedup rows removed by cleanup (counted).
pub fn cleanup_deleted(n: u64) {
    counter!(name::DEDUP_CLEANUP_DELETED).increment(n);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created() -> Envelope {
        Envelope::new("order-service", EventData::sample_created(42))
    }

    #[test]
    fn digest_covers_content_not_transport_or_tracing() {
        let first = created();
        let digest = content_digest(&first);
        assert_eq!(digest.len(), 64);
        assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
        // A redelivery by an upgraded producer (minor bump, new trace) is the same event.
        let mut again = first.clone();
        again.event_version = "1.7".into();
        again.trace_id = crate::envelope::new_trace_id();
        assert_eq!(content_digest(&again), digest);
        // Another event under the same id is not.
        let mut other = first.clone();
        if let EventData::Created(d) = &mut other.data {
            d.amount += 1;
        }
        assert_ne!(content_digest(&other), digest);
        let mut later = first.clone();
        later.event_time += chrono::Duration::seconds(1);
        assert_ne!(content_digest(&later), digest);
        let mut elsewhere = first;
        elsewhere.producer = "another-service".into();
        assert_ne!(content_digest(&elsewhere), digest);
    }

    /// The SQLite dialect end to end (MariaDB is covered by tests/it/integrity.rs).
    #[tokio::test]
    async fn sqlite_records_a_reused_id_once_and_not_a_true_or_pre_digest_duplicate() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let origin = |offset| RecordOrigin {
            topic: "t".into(),
            partition: 3,
            offset,
            key: "42".into(),
        };
        let first = created();
        let mut reused = first.clone();
        if let EventData::Created(d) = &mut reused.data {
            d.quantity += 1;
        }
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, "g", &first, &origin(10)).await.unwrap());
        assert!(!claim(&mut tx, "g", &first, &origin(11)).await.unwrap());
        assert!(
            check_duplicate(&mut tx, "g", &first, &origin(11))
                .await
                .unwrap()
                .is_none()
        );
        assert!(!claim(&mut tx, "g", &reused, &origin(12)).await.unwrap());
        let conflict = check_duplicate(&mut tx, "g", &reused, &origin(12))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((conflict.first_offset, conflict.offset), (10, 12));
        // The same conflicting record redelivered is listed once.
        check_duplicate(&mut tx, "g", &reused, &origin(12))
            .await
            .unwrap()
            .unwrap();
        // A row from before the migration has no digest: unknown, not a conflict.
        sqlx::query("UPDATE event_dedup SET payload_digest = NULL")
            .execute(&mut *tx)
            .await
            .unwrap();
        assert!(
            check_duplicate(&mut tx, "g", &reused, &origin(13))
                .await
                .unwrap()
                .is_none()
        );
        tx.commit().await.unwrap();
        let listed = conflicts(&db, Some("g"), 10).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (
                listed[0].first_partition,
                listed[0].first_offset,
                listed[0].offset
            ),
            (3, 10, 12)
        );
        assert_eq!(listed[0].first_digest, content_digest(&first));
        assert_eq!(listed[0].digest, content_digest(&reused));
        assert!(conflicts(&db, Some("other"), 10).await.unwrap().is_empty());
        assert_eq!(conflicts(&db, None, 10).await.unwrap().len(), 1);
    }
}
