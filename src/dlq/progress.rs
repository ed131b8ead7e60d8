//! Progress of bulk replays, shared by the CLI and the console: the table
//! `dlq_replays`, one row per replay as it runs.
//!
//! `orderpipe dlq replay` and the console's "replay a filter" both open a
//! [`Tracker`] before sending: it writes the row (who, the selection, the
//! rows counted), counts delivery reports as [`super::replay::replay`]
//! settles them ([`Tracker::settle`], the `progress` callback), writes the
//! count about once a second, and closes the row with the summary
//! ([`Tracker::finish`]). Any console replica reads the rows
//! ([`recent`], [`get`]), so a replay started from the CLI or another
//! replica shows there too. A process killed mid-replay leaves its row
//! `running` with an old `updated_ms`: [`ReplayRow::stalled`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinHandle;

use super::replay::ReplaySummary;
use crate::clock::now_ms;
use crate::db::{Db, DbError};

/// How often a running replay writes its count.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// A running replay whose row has not moved for this long is shown stalled.
pub const STALLED_AFTER_MS: i64 = 10_000;

/// Where a replay was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `orderpipe dlq replay`.
    Cli,
    /// The console's "replay a filter".
    Console,
}

impl Origin {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cli => "cli",
            Self::Console => "console",
        }
    }
}

/// One running replay's row and count.
pub struct Tracker {
    /// The row's id (the console's `/dead-letters/replays/{id}`).
    pub id: i64,
    db: Db,
    settled: Arc<AtomicU64>,
    reporter: JoinHandle<()>,
}

impl Tracker {
    /// Writes the row of a replay of `total` rows of `selection` (JSON) by
    /// `who` and starts writing its count every [`REPORT_EVERY`].
    pub async fn start(
        db: &Db,
        origin: Origin,
        who: &str,
        selection: &serde_json::Value,
        total: u64,
    ) -> Result<Self, DbError> {
        let now = now_ms();
        let mut tx = db.begin().await?;
        sqlx::query(
            "INSERT INTO dlq_replays (origin, started_by, selection, total, state, started_ms, updated_ms) \
             VALUES (?, ?, ?, ?, 'running', ?, ?)",
        )
        .bind(origin.as_str())
        .bind(who)
        .bind(selection.to_string())
        .bind(total as i64)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // The id in the same transaction (SQLite's and MariaDB's spelling differ).
        let (id,): (i64,) = sqlx::query_as(match db.sql() {
            crate::db::Dialect::MySql => "SELECT LAST_INSERT_ID()",
            crate::db::Dialect::Sqlite => "SELECT last_insert_rowid()",
        })
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let settled = Arc::new(AtomicU64::new(0));
        let reporter = tokio::spawn(report(db.clone(), id, settled.clone()));
        Ok(Self {
            id,
            db: db.clone(),
            settled,
            reporter,
        })
    }

    /// Counts one delivery report (acknowledged or failed).
    pub fn settle(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
    }

    /// Closes the row: `done` with the summary, or `stopped` with why.
    pub async fn finish(self, result: &anyhow::Result<ReplaySummary>) -> Result<(), DbError> {
        self.reporter.abort();
        let settled = self.settled.load(Ordering::Relaxed) as i64;
        let (state, replayed, failed, error) = match result {
            Ok(s) => (
                "done",
                s.replayed as i64,
                s.failed.len() as i64,
                s.failed.first().map(|f| format!("first failure: {f}")),
            ),
            Err(e) => ("stopped", 0, 0, Some(format!("{e:#}"))),
        };
        let now = now_ms();
        sqlx::query(
            "UPDATE dlq_replays SET settled = ?, replayed = ?, failed = ?, state = ?, error = ?, updated_ms = ?, finished_ms = ? WHERE id = ?",
        )
        .bind(settled)
        .bind(replayed)
        .bind(failed)
        .bind(state)
        .bind(error)
        .bind(now)
        .bind(now)
        .bind(self.id)
        .execute(&self.db.pool)
        .await?;
        Ok(())
    }
}

/// Writes `settled` to row `id` every [`REPORT_EVERY`] (a failed write is
/// retried at the next tick: progress is a view, the replay goes on).
async fn report(db: Db, id: i64, settled: Arc<AtomicU64>) {
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let n = settled.load(Ordering::Relaxed) as i64;
        if let Err(e) = sqlx::query(
            "UPDATE dlq_replays SET settled = ?, updated_ms = ? WHERE id = ? AND state = 'running'",
        )
        .bind(n)
        .bind(now_ms())
        .bind(id)
        .execute(&db.pool)
        .await
        {
            tracing::debug!(error = %e, replay = id, "replay progress not written");
        }
    }
}

/// A replay's row.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ReplayRow {
    /// Row id.
    pub id: i64,
    /// `cli` or `console`.
    pub origin: String,
    /// Who started it (the console's user, or the CLI's `$USER`).
    pub started_by: String,
    /// The selection, as JSON.
    pub selection: String,
    /// Rows counted when it started.
    pub total: i64,
    /// Delivery reports settled (acknowledged or failed) so far.
    pub settled: i64,
    /// Rows marked replayed (when it ended).
    pub replayed: i64,
    /// Rows that failed to send (when it ended; they stay pending).
    pub failed: i64,
    /// `running`, `done` or `stopped`.
    pub state: String,
    /// Why it stopped, or its first failure.
    pub error: Option<String>,
    /// Started (ms).
    pub started_ms: i64,
    /// Last written (ms).
    pub updated_ms: i64,
    /// Ended (ms).
    pub finished_ms: Option<i64>,
}

impl ReplayRow {
    /// Running, but its process has not written for [`STALLED_AFTER_MS`].
    pub fn stalled(&self, now_ms: i64) -> bool {
        self.state == "running" && now_ms - self.updated_ms > STALLED_AFTER_MS
    }

    /// Percent of the rows counted that are settled.
    pub fn percent(&self) -> i64 {
        (self.settled * 100)
            .checked_div(self.total)
            .unwrap_or(100)
            .clamp(0, 100)
    }
}

const COLUMNS: &str = "id, origin, started_by, selection, total, settled, replayed, failed, state, error, started_ms, updated_ms, finished_ms";

/// The newest replays, newest first.
pub async fn recent(db: &Db, limit: i64) -> Result<Vec<ReplayRow>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM dlq_replays ORDER BY id DESC LIMIT ?"
    ));
    Ok(sqlx::query_as(sql).bind(limit).fetch_all(&db.pool).await?)
}

/// Replays still running (newest first), stalled ones included.
pub async fn running(db: &Db) -> Result<Vec<ReplayRow>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM dlq_replays WHERE state = 'running' ORDER BY id DESC LIMIT 20"
    ));
    Ok(sqlx::query_as(sql).fetch_all(&db.pool).await?)
}

/// One replay's row.
pub async fn get(db: &Db, id: i64) -> Result<Option<ReplayRow>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM dlq_replays WHERE id = ?"));
    Ok(sqlx::query_as(sql)
        .bind(id)
        .fetch_optional(&db.pool)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On SQLite (MariaDB's is tests/it/console_dlq.rs): a row while it
    /// runs, its count written within a second or two, and its end.
    #[tokio::test]
    async fn a_tracked_replay_writes_its_row_count_and_end() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let selection = serde_json::json!({"group": "g"});
        let tracker = Tracker::start(&db, Origin::Cli, "alice", &selection, 3)
            .await
            .unwrap();
        let id = tracker.id;
        let row = get(&db, id).await.unwrap().unwrap();
        assert_eq!(
            (
                row.origin.as_str(),
                row.started_by.as_str(),
                row.total,
                row.state.as_str()
            ),
            ("cli", "alice", 3, "running")
        );
        assert_eq!(running(&db).await.unwrap().len(), 1);
        tracker.settle();
        tracker.settle();
        tokio::time::sleep(REPORT_EVERY * 2 + Duration::from_millis(300)).await;
        let row = get(&db, id).await.unwrap().unwrap();
        assert_eq!(
            (row.settled, row.percent()),
            (2, 66),
            "written while it runs"
        );
        assert!(!row.stalled(now_ms()) && row.stalled(now_ms() + STALLED_AFTER_MS + 1));
        tracker.settle();
        let summary = ReplaySummary {
            replayed: 2,
            failed: vec!["dead letter 9: refused".into()],
            ..Default::default()
        };
        tracker.finish(&Ok(summary)).await.unwrap();
        let row = get(&db, id).await.unwrap().unwrap();
        assert_eq!(
            (row.settled, row.replayed, row.failed, row.state.as_str()),
            (3, 2, 1, "done")
        );
        assert_eq!(
            row.error.as_deref(),
            Some("first failure: dead letter 9: refused")
        );
        assert!(running(&db).await.unwrap().is_empty());
        let stopped = Tracker::start(&db, Origin::Console, "bob", &selection, 1)
            .await
            .unwrap();
        stopped
            .finish(&Err(anyhow::anyhow!("database gone")))
            .await
            .unwrap();
        let rows = recent(&db, 10).await.unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| (r.id, r.state.as_str()))
                .collect::<Vec<_>>(),
            [(id + 1, "stopped"), (id, "done")]
        );
        assert_eq!(rows[0].error.as_deref(), Some("database gone"));
    }
}
