//! The console's own history, for the charts when no Prometheus is
//! configured: every `console.sample_interval_secs` (60) it writes each
//! group's overview figures ([`crate::console::overview::collect`]) to
//! `console_samples`, and deletes what is older than [`KEEP`]. The time is
//! rounded down to the interval, so two consoles write the same rows.

use std::time::Duration;

use super::source::{Metric, Range, Series};
use crate::console::{ConsoleError, ConsoleState, overview};
use crate::db::{Db, DbError};

/// How long samples are kept: the longest window, and some.
pub const KEEP: Duration = Duration::from_secs(25 * 3_600);

/// Samples in the background while the console lives (it holds the state
/// weakly); does nothing when the charts read Prometheus.
pub(crate) fn start(state: &ConsoleState) {
    if state.settings().console.prometheus_url.is_some() {
        return;
    }
    let interval = Duration::from_secs(state.settings().console.sample_interval_secs.max(1) as u64);
    let weak = state.downgrade();
    tokio::spawn(async move {
        loop {
            let Some(state) = ConsoleState::upgrade(&weak) else {
                return;
            };
            match sample_once(&state, interval).await {
                Ok(groups) => tracing::debug!(groups, "console sample written"),
                Err(e) => {
                    tracing::warn!(error = %e, "console sample not written; next one in the next interval")
                }
            }
            drop(state);
            tokio::time::sleep(interval).await;
        }
    });
}

/// Writes one sample of every group; returns how many groups.
#[tracing::instrument(skip(state))]
pub async fn sample_once(state: &ConsoleState, interval: Duration) -> Result<usize, ConsoleError> {
    let overview = overview::collect(state).await?;
    let step = interval.as_millis().max(1) as i64;
    let now = crate::clock::now_ms();
    let at = now / step * step;
    let db = state.db();
    for card in &overview.groups {
        let outcomes = card.applied_in_window + card.failed_in_window;
        let window_secs = overview::WINDOW.as_secs_f64();
        sqlx::query(
            "REPLACE INTO console_samples (sampled_ms, consumer_group, lag_records, applied_per_sec, \
             failure_rate_pct, dead_letters_per_min, parked_keys) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(at)
        .bind(&card.group)
        .bind(card.lag_measured.then_some(card.total_lag))
        .bind(card.applied_in_window as f64 / window_secs)
        .bind((outcomes > 0).then(|| 100.0 * card.failed_in_window as f64 / outcomes as f64))
        .bind(card.failed_in_window as f64 * 60.0 / window_secs)
        .bind(card.parked_keys)
        .execute(&db.pool)
        .await
        .map_err(DbError::from)?;
    }
    sqlx::query("DELETE FROM console_samples WHERE sampled_ms < ?")
        .bind(now - KEEP.as_millis() as i64)
        .execute(&db.pool)
        .await
        .map_err(DbError::from)?;
    Ok(overview.groups.len())
}

/// The samples of `metric` in `range`, one series per group (`group` only when given).
pub(crate) async fn read(
    db: &Db,
    metric: Metric,
    range: Range,
    group: Option<&str>,
) -> Result<Vec<Series>, DbError> {
    let rows: Vec<(String, i64, Option<f64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT consumer_group, sampled_ms, CAST({} AS DOUBLE) FROM console_samples \
         WHERE sampled_ms >= ? AND sampled_ms <= ? AND (? IS NULL OR consumer_group = ?) \
         ORDER BY consumer_group, sampled_ms",
        metric.column()
    )))
    .bind(range.start_secs * 1000)
    .bind(range.end_secs * 1000)
    .bind(group)
    .bind(group)
    .fetch_all(&db.pool)
    .await?;
    let mut series: Vec<Series> = Vec::new();
    for (group, at, value) in rows {
        let Some(value) = value else { continue };
        match series.last_mut() {
            Some(s) if s.group == group => s.points.push((at, value)),
            _ => series.push(Series {
                group,
                points: vec![(at, value)],
            }),
        }
    }
    Ok(series)
}
