//! `reconcile_runs`: each run's result, and the gauges exported from it.
//!
//! `orderpipe reconcile` runs as a CronJob, gone before Prometheus could
//! scrape it. So each run stores its counts ([`record`]) and the roles that
//! run anyway export the latest run of each group ([`export_gauges`], on
//! each tick of [`crate::dlq::gauges`]):
//! [`name::RECONCILE_MISSING`], [`name::RECONCILE_APPLIED_NOT_IN_TOPIC`] and
//! [`name::RECONCILE_LAST_RUN`], labelled by group only.

use serde::Serialize;

use super::Report;
use crate::db::{Db, DbError};
use crate::metrics::{Labels, SeriesOwner, name};

/// Runs are kept this long; each [`record`] deletes older ones.
pub const KEEP_RUNS_MS: i64 = 30 * 86_400_000;

/// Rows deleted per statement when old runs go.
const PRUNE_BATCH: i64 = 1_000;

/// Stores a run's result and deletes runs older than [`KEEP_RUNS_MS`].
pub async fn record(db: &Db, report: &Report) -> Result<(), DbError> {
    let t = &report.totals;
    sqlx::query(
        "INSERT INTO reconcile_runs (consumer_group, topic, since_ms, until_ms, grace_ms, records, applied, \
         dead_lettered, held, parked, unconsumed, in_flight, missing, applied_not_in_topic, oldest_missing_ms, \
         started_ms, finished_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&report.group)
    .bind(&report.topic)
    .bind(report.since_ms)
    .bind(report.until_ms)
    .bind(report.grace_ms)
    .bind(t.records as i64)
    .bind(t.applied as i64)
    .bind(t.dead_lettered as i64)
    .bind(t.held as i64)
    .bind(t.parked as i64)
    .bind(t.unconsumed as i64)
    .bind(t.in_flight as i64)
    .bind(t.missing as i64)
    .bind(report.applied_not_in_topic_count as i64)
    .bind(report.oldest_missing_ms)
    .bind(report.started_ms)
    .bind(report.finished_ms)
    .execute(&db.pool)
    .await?;
    let cutoff = report.finished_ms - KEEP_RUNS_MS;
    let prune = db
        .sql()
        .delete_limited("reconcile_runs", "id", "finished_ms < ?");
    while sqlx::query(prune.clone())
        .bind(cutoff)
        .bind(PRUNE_BATCH)
        .execute(&db.pool)
        .await?
        .rows_affected() as i64
        == PRUNE_BATCH
    {}
    Ok(())
}

/// The latest stored run of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LatestRun {
    /// Consumer group.
    pub group: String,
    /// Missing events it found.
    pub missing: i64,
    /// Applied-but-not-in-topic rows it found.
    pub applied_not_in_topic: i64,
    /// When it finished (ms since the epoch).
    pub finished_ms: i64,
}

/// The latest run of each group (of `group` only, when given).
pub async fn latest(db: &Db, group: Option<&str>) -> Result<Vec<LatestRun>, DbError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT r.consumer_group, r.missing, r.applied_not_in_topic, r.finished_ms FROM reconcile_runs r \
         JOIN (SELECT MAX(id) AS id FROM reconcile_runs WHERE (? IS NULL OR consumer_group = ?) GROUP BY consumer_group) l \
         ON r.id = l.id ORDER BY r.consumer_group",
    )
    .bind(group)
    .bind(group)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(group, missing, applied_not_in_topic, finished_ms)| LatestRun {
                group,
                missing,
                applied_not_in_topic,
                finished_ms,
            },
        )
        .collect())
}

/// Exports the latest run of each group (of `group` only, when given) as
/// gauges through `owner`, replacing what it exported before. Called on
/// each tick of the database-gauge exporter ([`crate::dlq::gauges`]) of the
/// roles that run anyway: the DLQ persister for every group, each
/// `consume`/`deliver` for its own. On an error nothing is replaced: the
/// last values stay exported.
pub async fn export_gauges(
    db: &Db,
    group: Option<&str>,
    owner: &SeriesOwner,
) -> Result<Vec<LatestRun>, DbError> {
    let runs = latest(db, group).await?;
    let series = |value: fn(&LatestRun) -> f64| -> Vec<(Labels, f64)> {
        runs.iter()
            .map(|r| (vec![("group", r.group.clone())], value(r)))
            .collect()
    };
    owner.replace(name::RECONCILE_MISSING, series(|r| r.missing as f64));
    owner.replace(
        name::RECONCILE_APPLIED_NOT_IN_TOPIC,
        series(|r| r.applied_not_in_topic as f64),
    );
    owner.replace(
        name::RECONCILE_LAST_RUN,
        series(|r| r.finished_ms as f64 / 1000.0),
    );
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Counts;

    fn report(group: &str, missing: u64, finished_ms: i64) -> Report {
        Report {
            group: group.into(),
            topic: "t".into(),
            since_ms: finished_ms - 3_600_000,
            until_ms: finished_ms,
            grace_ms: 300_000,
            started_ms: finished_ms - 1_000,
            finished_ms,
            totals: Counts {
                records: 10,
                applied: 10 - missing,
                missing,
                ..Counts::default()
            },
            by_event_name: Default::default(),
            partitions: Vec::new(),
            oldest_missing_ms: (missing > 0).then_some(finished_ms - 600_000),
            missing: Vec::new(),
            applied_not_in_topic_count: 1,
            applied_not_in_topic: Vec::new(),
        }
    }

    /// The SQLite twin of the migration, the runs kept and pruned, the latest per group.
    #[tokio::test]
    async fn sqlite_keeps_runs_prunes_old_ones_and_reads_the_latest_per_group() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let now = crate::clock::now_ms();
        record(&db, &report("a", 2, now - KEEP_RUNS_MS - 1))
            .await
            .unwrap();
        record(&db, &report("a", 3, now - 60_000)).await.unwrap();
        record(&db, &report("a", 0, now)).await.unwrap();
        record(&db, &report("b", 5, now)).await.unwrap();
        let (kept,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM reconcile_runs")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(kept, 3, "the run older than {KEEP_RUNS_MS} ms is gone");
        let latest_of = |group: &str, missing| LatestRun {
            group: group.into(),
            missing,
            applied_not_in_topic: 1,
            finished_ms: now,
        };
        assert_eq!(
            latest(&db, None).await.unwrap(),
            [latest_of("a", 0), latest_of("b", 5)]
        );
        let owner = SeriesOwner::default();
        assert_eq!(
            export_gauges(&db, Some("b"), &owner).await.unwrap(),
            [latest_of("b", 5)]
        );
    }
}
