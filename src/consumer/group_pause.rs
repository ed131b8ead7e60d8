//! An operator's pause of a whole group (`orderpipe group pause|resume`):
//! a row of `group_pauses`, followed by every member within a second.
//!
//! A paused member keeps its membership, its assignment and its backlog.
//! The dispatcher holds what it had fetched and pauses each partition on
//! the consumer ([`PauseReason::Operator`](super::pause::PauseReason)), so
//! librdkafka fetches nothing more; the batch a worker already had is
//! finished. Lag is still measured from the broker's watermarks and grows;
//! `/health/mq` says paused instead of lagging; the gauge
//! `orderpipe_group_paused` says so too. The row outlives restarts and
//! rebalances: a member reads it before its first record. A pause with an
//! end (`--for 30m`) ends by itself. Resuming hands the held records on
//! first, so order is kept.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::Shared;
use super::events;
use crate::clock::now_ms;
use crate::db::Db;
use crate::metrics::InternalEvent;

/// How often a member reads its group's pause.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

/// A group's pause, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPause {
    /// The consumer group.
    pub group: String,
    /// When it was paused (ms since the epoch).
    pub paused_at_ms: i64,
    /// When the pause ends by itself, if it does.
    pub until_ms: Option<i64>,
    /// Who paused it (`--by`, the console's user).
    pub paused_by: String,
    /// Why, as the operator said.
    pub reason: String,
}

/// The columns read, in [`GroupPause`]'s order.
const COLUMNS: &str = "consumer_group, paused_at_ms, until_ms, paused_by, reason";

type Row = (String, i64, Option<i64>, String, String);

impl From<Row> for GroupPause {
    fn from((group, paused_at_ms, until_ms, paused_by, reason): Row) -> Self {
        Self {
            group,
            paused_at_ms,
            until_ms,
            paused_by,
            reason,
        }
    }
}

/// Pauses `group` (replacing a pause it had), until `until_ms` if given.
#[tracing::instrument(skip(db))]
pub async fn pause(
    db: &Db,
    group: &str,
    until_ms: Option<i64>,
    paused_by: &str,
    reason: &str,
) -> Result<GroupPause, sqlx::Error> {
    let pause = GroupPause {
        group: group.to_string(),
        paused_at_ms: now_ms(),
        until_ms,
        paused_by: paused_by.to_string(),
        reason: reason.to_string(),
    };
    // REPLACE: MariaDB's and SQLite's alike.
    sqlx::query(
        "REPLACE INTO group_pauses (consumer_group, paused_at_ms, until_ms, paused_by, reason) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(&pause.group)
    .bind(pause.paused_at_ms)
    .bind(pause.until_ms)
    .bind(&pause.paused_by)
    .bind(&pause.reason)
    .execute(&db.pool)
    .await?;
    Ok(pause)
}

/// Resumes `group`; whether it was paused (a pause that had ended by
/// itself counts as not paused).
#[tracing::instrument(skip(db))]
pub async fn resume(db: &Db, group: &str) -> Result<bool, sqlx::Error> {
    let was = active(db, group).await?.is_some();
    sqlx::query("DELETE FROM group_pauses WHERE consumer_group = ?")
        .bind(group)
        .execute(&db.pool)
        .await?;
    Ok(was)
}

/// The pauses in force now, by group.
#[tracing::instrument(skip(db))]
pub async fn list(db: &Db) -> Result<Vec<GroupPause>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM group_pauses WHERE until_ms IS NULL OR until_ms > ? ORDER BY consumer_group"
    )))
    .bind(now_ms())
    .fetch_all(&db.pool)
    .await?;
    Ok(rows.into_iter().map(GroupPause::from).collect())
}

/// `group`'s pause, if one is in force now.
pub async fn active(db: &Db, group: &str) -> Result<Option<GroupPause>, sqlx::Error> {
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM group_pauses WHERE consumer_group = ? AND (until_ms IS NULL OR until_ms > ?)"
    )))
    .bind(group)
    .bind(now_ms())
    .fetch_optional(&db.pool)
    .await?;
    Ok(row.map(GroupPause::from))
}

impl Shared {
    /// Reads the group's pause once and follows it. A database that does
    /// not answer changes nothing: the member keeps the state it knew.
    pub(super) async fn follow_group_pause_once(&self) {
        match active(&self.db, &self.options.group).await {
            Ok(pause) => {
                let paused = pause.is_some();
                if self
                    .operator_paused
                    .swap(paused, std::sync::atomic::Ordering::Relaxed)
                    != paused
                {
                    events::GroupPauseFollowed {
                        group: &self.options.group,
                        paused_by: pause.as_ref().map(|p| p.paused_by.as_str()),
                        reason: pause.as_ref().map_or("", |p| p.reason.as_str()),
                        until_ms: pause.as_ref().and_then(|p| p.until_ms),
                    }
                    .emit();
                }
                self.health.set_paused(paused);
                events::group_paused(&self.options.group, paused);
            }
            Err(e) => tracing::debug!(error = %e, "group pause not read"),
        }
    }

    /// Whether the operator paused this group, as last read.
    pub(super) fn operator_paused(&self) -> bool {
        self.operator_paused
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Follows the group's pause every second, for the member's life.
pub(super) async fn follow(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        shared.follow_group_pause_once().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pause_is_listed_until_resumed_and_one_with_an_end_ends_by_itself() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        assert!(active(&db, "g").await.unwrap().is_none());
        let paused = pause(&db, "g", None, "oncall", "ledger fix").await.unwrap();
        assert_eq!(active(&db, "g").await.unwrap(), Some(paused.clone()));
        // Pausing again replaces the pause: one row per group.
        let again = pause(&db, "g", None, "lead", "longer fix").await.unwrap();
        assert_eq!(list(&db).await.unwrap(), vec![again]);
        // A pause whose end has passed is no pause.
        pause(&db, "ended", Some(now_ms() - 1), "oncall", "")
            .await
            .unwrap();
        pause(&db, "later", Some(now_ms() + 60_000), "oncall", "")
            .await
            .unwrap();
        let groups: Vec<String> = list(&db)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.group)
            .collect();
        assert_eq!(groups, ["g", "later"]);
        assert!(!resume(&db, "ended").await.unwrap(), "had ended");
        assert!(resume(&db, "g").await.unwrap());
        assert!(!resume(&db, "g").await.unwrap(), "resumed already");
        assert!(active(&db, "g").await.unwrap().is_none());
    }
}
