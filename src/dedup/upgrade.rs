//! `orderpipe dedup upgrade`: moves the rows of `event_dedup_legacy` (the
//! dedup rows of before migration 0021) into the compact `event_dedup`, in
//! bounded batches, while consumers run.
//!
//! Group after group, each batch is one short transaction over a range of
//! the legacy primary key, from where the last ended: insert the range's
//! rows converted (group name to id, event id text to its 16 bytes, digest
//! to its first 8 bytes; the `apply_seq` and `created_at` kept), then
//! delete the same range. A
//! consumer's claim reads the legacy table before it inserts (READ
//! COMMITTED): a row is in one table or the other at every commit, so a
//! redelivered event is skipped during the move as after it. When the
//! legacy table is empty it is dropped, and claims stop reading it.
//!
//! The conversion runs in the server (`UNHEX`, the group's id bound): no
//! row travels to this process.

use std::time::Instant;

use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::{AnyQuery, LEGACY};
use crate::db::{Db, DbError, Legacy};

/// Rows moved per transaction by default.
pub const UPGRADE_BATCH: u32 = 10_000;

/// Where an upgrade stands, after each batch (and once at the end).
#[derive(Debug, Clone, Serialize)]
pub struct UpgradeProgress {
    /// Legacy rows when the upgrade started.
    pub total: u64,
    /// Rows moved so far.
    pub moved: u64,
    /// Rows of those that were already in `event_dedup` (nothing to add).
    pub already_there: u64,
    /// Seconds since the start.
    pub secs: f64,
    /// Rows per second so far.
    pub rows_per_sec: f64,
    /// Seconds left at that rate.
    pub eta_secs: f64,
}

/// What an upgrade did.
#[derive(Debug, Clone, Serialize)]
pub struct UpgradeReport {
    /// The last progress.
    #[serde(flatten)]
    pub progress: UpgradeProgress,
    /// Legacy rows left (event ids that are no UUID: never written by
    /// orderpipe, reported rather than guessed at).
    pub left: u64,
    /// Whether the legacy table was dropped (it was empty).
    pub dropped: bool,
}

/// A legacy row whose event id is a UUID's text (32 hex digits): the rows
/// an upgrade moves. Any other is left and reported, never stored wrong.
const UUID_TEXT: &str =
    "LENGTH(REPLACE(l.event_id, '-', '')) = 32 AND UNHEX(REPLACE(l.event_id, '-', '')) IS NOT NULL";

/// One group's legacy rows of UUID ids with ids after `?` and up to `?`
/// (the group first): a range of the primary key. One group at a time, with
/// the group an equality, so that the server seeks the range (an `OR` over
/// two key columns made it read the whole group for each batch).
const RANGE: &str = "l.consumer_group = ? AND l.event_id > ? AND l.event_id <= ?";

/// Moves every legacy row, `batch` per transaction, calling `progress`
/// after each; drops the legacy table when it is empty. Nothing to do when
/// there is no legacy table (a fresh install, or an upgrade done before).
#[tracing::instrument(skip(db, progress))]
pub async fn upgrade(
    db: &Db,
    batch: u32,
    mut progress: impl FnMut(&UpgradeProgress),
) -> Result<UpgradeReport, DbError> {
    let exists = |table: &'static str| async move {
        let (n,): (i64,) = sqlx::query_as(db.sql().table_exists())
            .bind(table)
            .fetch_one(&db.pool)
            .await?;
        Ok::<_, DbError>(n > 0)
    };
    if !exists("dedup_groups").await? {
        return Err(DbError::Other(
            "the compact dedup tables are missing: run `orderpipe migrate` first".into(),
        ));
    }
    let started = Instant::now();
    let mut state = UpgradeProgress {
        total: 0,
        moved: 0,
        already_there: 0,
        secs: 0.0,
        rows_per_sec: 0.0,
        eta_secs: 0.0,
    };
    if !exists(LEGACY).await? {
        db.memo.set_legacy(Legacy::Gone);
        progress(&state);
        return Ok(UpgradeReport {
            progress: state,
            left: 0,
            dropped: false,
        });
    }
    let (total,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM event_dedup_legacy")
        .fetch_one(&db.pool)
        .await?;
    state.total = total as u64;
    let insert = format!(
        "{} INTO event_dedup (group_id, event_id, apply_seq, topic, kafka_partition, kafka_offset, event_type, \
         record_key, payload_digest, created_at) \
         SELECT ?, UNHEX(REPLACE(l.event_id, '-', '')), l.apply_seq, l.topic, l.kafka_partition, l.kafka_offset, \
         l.event_type, l.record_key, UNHEX(SUBSTR(l.payload_digest, 1, 16)), l.created_at \
         FROM event_dedup_legacy l WHERE {RANGE} AND {UUID_TEXT}",
        db.sql().insert_ignore_verb(),
    );
    let delete = format!(
        "DELETE FROM event_dedup_legacy WHERE {}",
        format!("{RANGE} AND {UUID_TEXT}").replace("l.", "")
    );
    // The primary key's first column: a loose index scan.
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT consumer_group FROM event_dedup_legacy ORDER BY consumer_group",
    )
    .fetch_all(&db.pool)
    .await?;
    for (name,) in names {
        // Registered by the migration, or now if an earlier release's
        // consumers went on writing after it.
        let group = super::group(db, &name).await?;
        // Before every id.
        let mut after = String::new();
        loop {
            // The range's last id: the batch-th after the last range (or
            // the group's last, when fewer are left).
            let last: Option<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT l.event_id FROM event_dedup_legacy l WHERE l.consumer_group = ? AND l.event_id > ? \
                 AND {UUID_TEXT} ORDER BY l.event_id LIMIT 1 OFFSET ?"
            )))
            .bind(&name)
            .bind(&after)
            .bind(i64::from(batch.max(1)) - 1)
            .fetch_optional(&db.pool)
            .await?;
            let last = match last {
                Some((last,)) => last,
                None => {
                    let tail: Option<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
                        "SELECT l.event_id FROM event_dedup_legacy l WHERE l.consumer_group = ? AND l.event_id > ? \
                         AND {UUID_TEXT} ORDER BY l.event_id DESC LIMIT 1"
                    )))
                    .bind(&name)
                    .bind(&after)
                    .fetch_optional(&db.pool)
                    .await?;
                    match tail {
                        Some((tail,)) => tail,
                        None => break,
                    }
                }
            };
            // The insert binds the group's id first; both then bind the range.
            let mut tx = db.begin().await?;
            let in_range = |query: AnyQuery<'static>| {
                query
                    .bind(name.clone())
                    .bind(after.clone())
                    .bind(last.clone())
            };
            let inserted = in_range(sqlx::query(AssertSqlSafe(insert.clone())).bind(group.id))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let deleted = in_range(sqlx::query(AssertSqlSafe(delete.clone())))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            after = last;
            state.moved += deleted;
            state.already_there += deleted.saturating_sub(inserted);
            state.secs = started.elapsed().as_secs_f64();
            state.rows_per_sec = state.moved as f64 / state.secs.max(1e-9);
            state.eta_secs =
                state.total.saturating_sub(state.moved) as f64 / state.rows_per_sec.max(1e-9);
            progress(&state);
            tokio::task::yield_now().await;
        }
    }
    let (left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM event_dedup_legacy")
        .fetch_one(&db.pool)
        .await?;
    let dropped = left == 0;
    if dropped {
        sqlx::query("DROP TABLE event_dedup_legacy")
            .execute(&db.pool)
            .await?;
        db.memo.set_legacy(Legacy::Gone);
    }
    tracing::info!(moved = state.moved, left, dropped, "dedup upgrade finished");
    Ok(UpgradeReport {
        progress: state,
        left: left as u64,
        dropped,
    })
}
