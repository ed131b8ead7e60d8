//! The `dead_letters` table: insert from the DLQ topic, select by filter,
//! count, and mark rows replayed or ignored. A dead letter's [`Status`] is
//! pending, replayed or ignored; the records held behind parked keys are no
//! dead letters and have their own view ([`super::held`]), which
//! `--status held` ([`Selection::Held`]) asks for. [`purge`] deletes old
//! dead letters (`orderpipe dlq purge`).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{Any, QueryBuilder, Row, SqlSafeStr, SqlStr};

use crate::db::{Db, DbError, Tx, Upsert, rows};

/// Status of a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for an operator.
    Pending,
    /// Republished by `dlq replay`.
    Replayed,
    /// Closed by `dlq ignore`.
    Ignored,
}

impl Status {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Replayed => "replayed",
            Self::Ignored => "ignored",
        }
    }
}

/// What `--status` selects: the dead letters in one [`Status`], or `held`,
/// the records held behind parked keys' heads. Those are not dead letters
/// (they have their own table and view, [`super::held`]): a dead-letter
/// query asked for them selects no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Dead letters in this status.
    Status(Status),
    /// Records held behind parked keys.
    Held,
}

impl From<Status> for Selection {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

/// Which rows a command touches. Empty filter = every row.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Row ids.
    pub ids: Vec<i64>,
    /// Consumer group that failed the record.
    pub group: Option<String>,
    /// Event name, e.g. order.payment.succeeded.
    pub event_name: Option<String>,
    /// Status, or the held records instead.
    pub status: Option<Selection>,
    /// Last failure at or after this time (epoch ms; see [`parse_time`]).
    pub since: Option<i64>,
    /// Last failure before this time (epoch ms).
    pub until: Option<i64>,
    /// Error class or message contains this text.
    pub error_text: Option<String>,
    /// Error class is one of these (empty: any).
    pub classes: Vec<String>,
    /// Record key, i.e. the order id (`--key`).
    pub key: Option<String>,
}

/// Why a selection cannot be replayed or ignored.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// `--status held`: held records are applied when their head is.
    #[error(
        "held records are not dead letters: they are applied when the head they wait behind is \
         (replay the head, or ignore it with --release-followers); `orderpipe dlq show --held ID` names the head"
    )]
    HeldNotDead,
    /// `dlq purge --status held`: held records wait for their head.
    #[error(
        "held records are not dead letters and are never purged: they are applied when the head they wait behind is \
         (replay the head, or ignore it with --release-followers); purge takes --status pending, replayed, ignored"
    )]
    HeldNotPurged,
    /// An ignore says why: the reason is kept with each row.
    #[error("--reason must say why the dead letters are ignored")]
    NoReason,
    /// An ignore without any selection would close every dead letter.
    #[error(
        "name the dead letters to ignore: --id, or a filter (--group, --event, --status, --class, --since, --until, --older-than, --error, --key)"
    )]
    IgnoreNeedsSelection,
}

/// Parses an age (`10m`, `7d`) into the epoch ms that long ago.
pub fn parse_age(text: &str) -> Result<i64, String> {
    humantime::parse_duration(text)
        .map(|age| crate::clock::now_ms() - age.as_millis() as i64)
        .map_err(|_| format!("`{text}` is not an age (accepted forms: 30s, 10m, 2h, 7d)"))
}

/// Parses an RFC 3339 time or an age (`2h` = two hours ago) into epoch ms.
pub fn parse_time(text: &str) -> Result<i64, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    humantime::parse_duration(text)
        .map(|age| crate::clock::now_ms() - age.as_millis() as i64)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time (2026-11-30T08:00:00Z) nor an age (30m, 2h, 7d)"))
}

impl Filter {
    /// The dead letters `dlq replay` takes for this filter: not held
    /// records; without ids or a status, the pending ones (replay what is
    /// waiting, not what was already handled).
    pub fn for_replay(mut self) -> Result<Self, SelectionError> {
        if self.status == Some(Selection::Held) {
            return Err(SelectionError::HeldNotDead);
        }
        if self.ids.is_empty() && self.status.is_none() {
            self.status = Some(Status::Pending.into());
        }
        Ok(self)
    }

    /// The dead letters `dlq ignore` takes for this filter, closed for
    /// `reason`: not held records, a reason that says something, and never
    /// every row for want of a filter.
    pub fn for_ignore(self, reason: &str) -> Result<Self, SelectionError> {
        if self.status == Some(Selection::Held) {
            return Err(SelectionError::HeldNotDead);
        }
        if reason.trim().is_empty() {
            return Err(SelectionError::NoReason);
        }
        if self.is_empty() {
            return Err(SelectionError::IgnoreNeedsSelection);
        }
        Ok(self)
    }

    /// The filter as JSON, its set fields only (the `dlq_replays` row's
    /// selection, audit rows).
    pub fn to_json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        let mut put = |name: &str, value: serde_json::Value| {
            out.insert(name.to_string(), value);
        };
        if !self.ids.is_empty() {
            put("ids", self.ids.clone().into());
        }
        for (name, value) in [
            ("group", &self.group),
            ("event", &self.event_name),
            ("error", &self.error_text),
            ("key", &self.key),
        ] {
            if let Some(v) = value {
                put(name, v.clone().into());
            }
        }
        match self.status {
            Some(Selection::Status(s)) => put("status", s.as_str().into()),
            Some(Selection::Held) => put("status", "held".into()),
            None => {}
        }
        if let Some(t) = self.since {
            put("since_ms", t.into());
        }
        if let Some(t) = self.until {
            put("until_ms", t.into());
        }
        if !self.classes.is_empty() {
            put("classes", self.classes.clone().into());
        }
        serde_json::Value::Object(out)
    }

    /// True when the filter selects every row.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
            && self.group.is_none()
            && self.event_name.is_none()
            && self.status.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.error_text.is_none()
            && self.classes.is_empty()
            && self.key.is_none()
    }

    fn push_where(&self, q: &mut QueryBuilder<Any>) {
        q.push(" WHERE 1 = 1");
        if !self.ids.is_empty() {
            q.push(" AND id");
            rows::push_in(q, self.ids.iter().copied());
        }
        if let Some(g) = &self.group {
            q.push(" AND consumer_group = ").push_bind(g.clone());
        }
        if let Some(e) = &self.event_name {
            q.push(" AND event_name = ").push_bind(e.clone());
        }
        match self.status {
            Some(Selection::Status(s)) => {
                q.push(" AND status = ").push_bind(s.as_str());
            }
            // Held records are no dead letters.
            Some(Selection::Held) => {
                q.push(" AND 1 = 0");
            }
            None => {}
        }
        if let Some(t) = self.since {
            q.push(" AND last_failure_ms >= ").push_bind(t);
        }
        if let Some(t) = self.until {
            q.push(" AND last_failure_ms < ").push_bind(t);
        }
        if let Some(text) = &self.error_text {
            let like = format!("%{text}%");
            q.push(" AND (error_message LIKE ").push_bind(like.clone());
            q.push(" OR error_class LIKE ").push_bind(like).push(")");
        }
        if let Some(key) = &self.key {
            q.push(" AND record_key = ")
                .push_bind(key.as_bytes().to_vec());
        }
        if !self.classes.is_empty() {
            q.push(" AND error_class");
            rows::push_in(q, self.classes.iter().cloned());
        }
    }
}

/// A dead letter as listed.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Row id.
    pub id: i64,
    /// Group that failed it.
    pub consumer_group: String,
    /// Where it was first consumed.
    pub original_topic: String,
    /// Partition there.
    pub original_partition: i32,
    /// Offset there.
    pub original_offset: i64,
    /// Event id (from the headers).
    pub event_id: Option<String>,
    /// Event name (from the headers).
    pub event_name: Option<String>,
    /// Error class.
    pub error_class: String,
    /// Error message.
    pub error_message: String,
    /// Handler executions.
    pub attempts: i32,
    /// First failure (ms).
    pub first_failure_ms: i64,
    /// Last failure (ms).
    pub last_failure_ms: i64,
    /// pending / replayed / ignored.
    pub status: String,
    /// Times replayed.
    pub replay_count: i32,
    /// Last replay (ms); None: never replayed.
    pub last_replayed_ms: Option<i64>,
    /// Why it was ignored.
    pub ignored_reason: Option<String>,
    /// The record key, i.e. the order id (as text; None: no key).
    pub key: Option<String>,
}

const COLUMNS: &str = "id, consumer_group, original_topic, original_partition, original_offset, event_id, \
     event_name, error_class, error_message, attempts, first_failure_ms, last_failure_ms, status, \
     replay_count, last_replayed_ms, ignored_reason, record_key";

fn row_to_dead_letter(r: &sqlx::any::AnyRow) -> Result<DeadLetter, sqlx::Error> {
    Ok(DeadLetter {
        id: r.try_get(0)?,
        consumer_group: r.try_get(1)?,
        original_topic: r.try_get(2)?,
        original_partition: r.try_get(3)?,
        original_offset: r.try_get(4)?,
        event_id: r.try_get(5)?,
        event_name: r.try_get(6)?,
        error_class: r.try_get(7)?,
        error_message: r.try_get(8)?,
        attempts: r.try_get(9)?,
        first_failure_ms: r.try_get(10)?,
        last_failure_ms: r.try_get(11)?,
        status: r.try_get(12)?,
        replay_count: r.try_get(13)?,
        // MariaDB's column holds 0 for never (NOT NULL keeps a mark in
        // place: sql/mysql/0028), SQLite's NULL.
        last_replayed_ms: r.try_get::<Option<i64>, _>(14)?.filter(|ms| *ms > 0),
        ignored_reason: r.try_get(15)?,
        key: r
            .try_get::<Option<Vec<u8>>, _>(16)?
            .map(|k| String::from_utf8_lossy(&k).into_owned()),
    })
}

/// Rows matching `filter`, oldest first, at most `limit`.
pub async fn list(db: &Db, filter: &Filter, limit: i64) -> Result<Vec<DeadLetter>, DbError> {
    let mut q = QueryBuilder::<Any>::new(format!("SELECT {COLUMNS} FROM dead_letters"));
    filter.push_where(&mut q);
    q.push(" ORDER BY id LIMIT ").push_bind(limit);
    let rows = q.build().fetch_all(&db.pool).await?;
    Ok(rows
        .iter()
        .map(row_to_dead_letter)
        .collect::<Result<_, _>>()?)
}

/// One page of the rows matching `filter`, newest first (keyset on the id:
/// rows with `id < before`, or the newest ones), at most `limit`. A page is
/// one index range read however many rows match, so the console's list
/// costs the same on page 1 and page 2,000.
pub async fn page_newest_first(
    db: &Db,
    filter: &Filter,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetter>, DbError> {
    let mut q = QueryBuilder::<Any>::new(format!("SELECT {COLUMNS} FROM dead_letters"));
    filter.push_where(&mut q);
    if let Some(before) = before {
        q.push(" AND id < ").push_bind(before);
    }
    q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
    let rows = q.build().fetch_all(&db.pool).await?;
    Ok(rows
        .iter()
        .map(row_to_dead_letter)
        .collect::<Result<_, _>>()?)
}

/// Rows matching `filter` (the console's "N dead letters match").
pub async fn count(db: &Db, filter: &Filter) -> Result<i64, DbError> {
    let mut q = QueryBuilder::<Any>::new("SELECT COUNT(*) FROM dead_letters");
    filter.push_where(&mut q);
    Ok(q.build().fetch_one(&db.pool).await?.try_get(0)?)
}

/// A full row with the record bytes, for `show` and `replay`.
#[derive(Debug, Clone)]
pub struct DeadLetterRecord {
    /// Listed fields.
    pub row: DeadLetter,
    /// Original key.
    pub key: Option<Vec<u8>>,
    /// Original value.
    pub payload: Option<Vec<u8>>,
    /// Original headers (JSON object of name -> text).
    pub headers: String,
    /// Timestamp of the record where it was first consumed (ms).
    pub original_timestamp: Option<i64>,
}

impl DeadLetterRecord {
    /// The value as JSON when its content type says it is (cdc's dead
    /// letters, [`crate::cdc::oversize`]); `None` for Avro envelopes.
    pub fn json_value(&self) -> Option<serde_json::Value> {
        let headers: BTreeMap<String, String> = serde_json::from_str(&self.headers).ok()?;
        if headers
            .get(crate::kafka::record::header::CONTENT_TYPE)?
            .as_str()
            != crate::cdc::oversize::JSON_CONTENT_TYPE
        {
            return None;
        }
        serde_json::from_slice(self.payload.as_deref()?).ok()
    }
}

/// Rows with their record bytes.
pub async fn records(
    db: &Db,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<DeadLetterRecord>, DbError> {
    select_records(db, filter, None, limit).await
}

/// The rows a replay takes, fixed when it starts: the filter's first
/// `limit` rows (by id) at that moment, as their count and highest id.
/// Reading up to `last_id` only keeps the replay finite: a dead letter
/// persisted meanwhile gets a higher id and waits for the next replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// Rows selected when the bound was taken.
    pub rows: i64,
    /// Highest id among them (None: nothing selected).
    pub last_id: Option<i64>,
}

/// The [`Bound`] of `filter`'s first `limit` rows, now.
pub async fn bound(db: &Db, filter: &Filter, limit: i64) -> Result<Bound, DbError> {
    let mut q =
        QueryBuilder::<Any>::new("SELECT COUNT(*), MAX(id) FROM (SELECT id FROM dead_letters");
    filter.push_where(&mut q);
    q.push(" ORDER BY id LIMIT ")
        .push_bind(limit)
        .push(") selected");
    let row = q.build().fetch_one(&db.pool).await?;
    Ok(Bound {
        rows: row.try_get(0)?,
        last_id: row.try_get(1)?,
    })
}

/// One page of a keyset scan: `filter`'s rows with `after_id < id <= last_id`,
/// by id, at most `limit`, with their record bytes. The filter is applied
/// as the page is read (a row ignored meanwhile is not taken).
pub async fn records_page(
    db: &Db,
    filter: &Filter,
    after_id: i64,
    last_id: i64,
    limit: i64,
) -> Result<Vec<DeadLetterRecord>, DbError> {
    select_records(db, filter, Some((after_id, last_id)), limit).await
}

async fn select_records(
    db: &Db,
    filter: &Filter,
    ids: Option<(i64, i64)>,
    limit: i64,
) -> Result<Vec<DeadLetterRecord>, DbError> {
    let mut q = QueryBuilder::<Any>::new(format!(
        "SELECT {COLUMNS}, payload, headers, original_timestamp FROM dead_letters"
    ));
    filter.push_where(&mut q);
    if let Some((after, last)) = ids {
        q.push(" AND id > ")
            .push_bind(after)
            .push(" AND id <= ")
            .push_bind(last);
    }
    q.push(" ORDER BY id LIMIT ").push_bind(limit);
    let rows = q.build().fetch_all(&db.pool).await?;
    rows.iter()
        .map(|r| {
            Ok(DeadLetterRecord {
                row: row_to_dead_letter(r)?,
                // record_key is the last of COLUMNS.
                key: r.try_get(16)?,
                payload: r.try_get(17)?,
                headers: r.try_get(18)?,
                original_timestamp: r.try_get(19)?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(DbError::from)
}

/// Counts by one dimension.
#[derive(Debug, Clone, Serialize)]
pub struct Count {
    /// Dimension (group, event_name, error_class, status).
    pub by: &'static str,
    /// Its value.
    pub value: String,
    /// Rows.
    pub rows: i64,
}

/// Counts of matching rows by group, event name, error class and status.
pub async fn stats(db: &Db, filter: &Filter) -> Result<Vec<Count>, DbError> {
    let mut out = Vec::new();
    for (by, column) in [
        ("group", "consumer_group"),
        ("event_name", "COALESCE(event_name, '(undecodable)')"),
        ("error_class", "error_class"),
        ("status", "status"),
    ] {
        let mut q =
            QueryBuilder::<Any>::new(format!("SELECT {column}, COUNT(*) FROM dead_letters"));
        filter.push_where(&mut q);
        q.push(format!(" GROUP BY {column} ORDER BY COUNT(*) DESC"));
        for r in q.build().fetch_all(&db.pool).await? {
            out.push(Count {
                by,
                value: r.try_get(0)?,
                rows: r.try_get(1)?,
            });
        }
    }
    Ok(out)
}

/// Marks rows replayed now, in one statement.
pub async fn mark_replayed(db: &Db, ids: &[i64]) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let now = crate::clock::now_ms();
    let mut q = QueryBuilder::<Any>::new(
        "UPDATE dead_letters SET status = 'replayed', replay_count = replay_count + 1, last_replayed_ms = ",
    );
    q.push_bind(now)
        .push(", updated_ms = ")
        .push_bind(now)
        .push(" WHERE id");
    rows::push_in(&mut q, ids.iter().copied());
    q.build().execute(&db.pool).await?;
    Ok(())
}

/// Marks a row ignored with a reason.
pub async fn mark_ignored(db: &Db, id: i64, reason: &str) -> Result<(), DbError> {
    sqlx::query("UPDATE dead_letters SET status = 'ignored', ignored_reason = ?, updated_ms = ? WHERE id = ?")
        .bind(reason)
        .bind(crate::clock::now_ms())
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// What `dlq purge` deletes: dead letters of `statuses` (of `group`, if
/// given) whose row last changed (failed, was replayed or ignored:
/// `updated_ms`) before `before_ms`.
#[derive(Debug, Clone)]
pub struct Purge {
    /// Statuses to delete; `dlq purge` defaults to replayed and ignored.
    pub statuses: Vec<Status>,
    /// Only this consumer group.
    pub group: Option<String>,
    /// Rows whose `updated_ms` is before this (epoch ms).
    pub before_ms: i64,
    /// Rows per DELETE statement.
    pub batch: u32,
}

/// What a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PurgeSummary {
    /// Rows deleted (would be, in a dry run) per status.
    pub deleted: BTreeMap<&'static str, u64>,
    /// Rows selected but kept because they head a parked key: the records
    /// held behind them wait for their replay or ignore.
    pub kept_heads: u64,
    /// Nothing was deleted.
    pub dry_run: bool,
}

impl PurgeSummary {
    /// Rows deleted, all statuses.
    pub fn total(&self) -> u64 {
        self.deleted.values().sum()
    }
}

/// The purge's condition on `dead_letters` (bound: status, cutoff, group),
/// with or without the heads of parked keys. A head is never deleted: its
/// parked key would wait for a dead letter nobody can replay any more.
fn purge_condition(group: bool, heads: bool) -> String {
    let group = if group { " AND consumer_group = ?" } else { "" };
    let heads = if heads { "EXISTS" } else { "NOT EXISTS" };
    format!(
        "status = ? AND updated_ms < ?{group} AND {heads} (SELECT 1 FROM parked_keys p \
         WHERE p.consumer_group = dead_letters.consumer_group AND p.head_topic = dead_letters.original_topic \
         AND p.head_partition = dead_letters.original_partition AND p.head_offset = dead_letters.original_offset)"
    )
}

/// Deletes what `purge` selects, status by status, `purge.batch` rows per
/// statement (each a short transaction of its own, so the persister and
/// operators are never blocked for long); `progress(status, deleted so
/// far, status done)` after each batch. A dry run counts instead and
/// deletes nothing.
pub async fn purge(
    db: &Db,
    purge: &Purge,
    dry_run: bool,
    mut progress: impl FnMut(&'static str, u64, bool),
) -> Result<PurgeSummary, DbError> {
    let mut summary = PurgeSummary {
        dry_run,
        ..Default::default()
    };
    let delete = db.sql().delete_limited(
        "dead_letters",
        "id",
        &purge_condition(purge.group.is_some(), false),
    );
    for status in &purge.statuses {
        let bind = |sql: SqlStr| {
            let q = sqlx::query::<Any>(sql)
                .bind(status.as_str())
                .bind(purge.before_ms);
            match &purge.group {
                Some(g) => q.bind(g.clone()),
                None => q,
            }
        };
        let count = |heads| {
            sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM dead_letters WHERE {}",
                purge_condition(purge.group.is_some(), heads)
            ))
            .into_sql_str()
        };
        summary.kept_heads += bind(count(true))
            .fetch_one(&db.pool)
            .await?
            .try_get::<i64, _>(0)? as u64;
        let deleted = summary.deleted.entry(status.as_str()).or_default();
        if dry_run {
            *deleted = bind(count(false))
                .fetch_one(&db.pool)
                .await?
                .try_get::<i64, _>(0)? as u64;
            continue;
        }
        loop {
            let n = bind(delete.clone())
                .bind(i64::from(purge.batch))
                .execute(&db.pool)
                .await?
                .rows_affected();
            *deleted += n;
            let done = n < u64::from(purge.batch);
            progress(status.as_str(), *deleted, done);
            if done {
                break;
            }
            // Let other writers in between batches.
            tokio::task::yield_now().await;
        }
    }
    Ok(summary)
}

/// One dead letter as read from the DLQ topic, ready to insert.
#[derive(Debug, Clone)]
pub struct NewDeadLetter {
    /// Group.
    pub consumer_group: String,
    /// Original topic.
    pub original_topic: String,
    /// Original partition.
    pub original_partition: i32,
    /// Original offset.
    pub original_offset: i64,
    /// Original timestamp (ms).
    pub original_timestamp: Option<i64>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub payload: Option<Vec<u8>>,
    /// Headers as a JSON object.
    pub headers: String,
    /// Event id header.
    pub event_id: Option<String>,
    /// Event name header.
    pub event_name: Option<String>,
    /// Error class.
    pub error_class: String,
    /// Error message.
    pub error_message: String,
    /// Handler executions.
    pub attempts: i32,
    /// First failure (ms).
    pub first_failure_ms: i64,
    /// Last failure (ms).
    pub last_failure_ms: i64,
    /// Partition in the DLQ topic.
    pub dlq_partition: i32,
    /// Offset in the DLQ topic.
    pub dlq_offset: i64,
}

/// A dead letter keyed by where it was first consumed; a later DLQ record
/// of the same origin (`dlq_partition`, `dlq_offset`) turns it back to pending.
const DEAD_LETTER_UPSERT: Upsert = Upsert {
    table: "dead_letters",
    columns: "consumer_group, original_topic, original_partition, original_offset, original_timestamp, record_key, \
              payload, headers, event_id, event_name, error_class, error_message, attempts, first_failure_ms, \
              last_failure_ms, dlq_partition, dlq_offset, created_ms, updated_ms",
    key: "consumer_group, original_topic, original_partition, original_offset",
    reset: &[("status", "'pending'")],
    take: &[
        "error_class",
        "error_message",
        "attempts",
        "last_failure_ms",
        "updated_ms",
    ],
    position: ("dlq_partition", "dlq_offset"),
};

/// Inserts a dead letter. Re-reading the same DLQ record changes nothing; a
/// newer DLQ record of the same origin (it failed again after a replay)
/// turns the row back to pending with the new failure.
pub async fn upsert(tx: &mut Tx, d: &NewDeadLetter) -> Result<(), DbError> {
    let sql = tx.sql().upsert_newer(&DEAD_LETTER_UPSERT);
    let now = crate::clock::now_ms();
    sqlx::query(sql)
        .bind(&d.consumer_group)
        .bind(&d.original_topic)
        .bind(d.original_partition)
        .bind(d.original_offset)
        .bind(d.original_timestamp)
        .bind(d.key.clone())
        .bind(d.payload.clone())
        .bind(&d.headers)
        .bind(d.event_id.clone())
        .bind(d.event_name.clone())
        .bind(&d.error_class)
        .bind(&d.error_message)
        .bind(d.attempts)
        .bind(d.first_failure_ms)
        .bind(d.last_failure_ms)
        .bind(d.dlq_partition)
        .bind(d.dlq_offset)
        .bind(now)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_letter(dlq_offset: i64, error: &str) -> NewDeadLetter {
        NewDeadLetter {
            consumer_group: "g".into(),
            original_topic: "order.events.v1".into(),
            original_partition: 0,
            original_offset: 7,
            original_timestamp: None,
            key: Some(b"42".to_vec()),
            payload: None,
            headers: "{}".into(),
            event_id: None,
            event_name: Some("order.created".into()),
            error_class: "handler_fatal".into(),
            error_message: error.into(),
            attempts: 1,
            first_failure_ms: 1,
            last_failure_ms: dlq_offset,
            dlq_partition: 0,
            dlq_offset,
        }
    }

    async fn upsert_one(db: &Db, row: &NewDeadLetter) {
        let mut tx = db.begin().await.unwrap();
        upsert(&mut tx, row).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// The SQLite upsert end to end (MariaDB's is covered by tests/it/dlq.rs
    /// and tests/it/operator.rs): a re-read changes nothing, a later DLQ
    /// record of the same origin turns an ignored row back to pending.
    #[tokio::test]
    async fn sqlite_upsert_keeps_a_reread_and_takes_a_later_failure() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        upsert_one(&db, &dead_letter(10, "first")).await;
        mark_ignored(&db, 1, "known").await.unwrap();
        upsert_one(&db, &dead_letter(10, "re-read")).await;
        let rows = list(&db, &Filter::default(), 10).await.unwrap();
        assert_eq!(
            (
                rows.len(),
                rows[0].status.as_str(),
                rows[0].error_message.as_str()
            ),
            (1, "ignored", "first")
        );
        upsert_one(&db, &dead_letter(11, "again")).await;
        let rows = list(&db, &Filter::default(), 10).await.unwrap();
        assert_eq!(
            (
                rows.len(),
                rows[0].status.as_str(),
                rows[0].error_message.as_str()
            ),
            (1, "pending", "again")
        );
        let held = Filter {
            status: Some(Selection::Held),
            ..Default::default()
        };
        assert!(
            list(&db, &held, 10).await.unwrap().is_empty(),
            "held records are no dead letters"
        );
    }

    /// The purge on SQLite (MariaDB's is covered by tests/it/dlq_retention.rs):
    /// SQLite's limited delete (by id) with the parked-head guard, counted
    /// per status; a dry run deletes nothing.
    #[tokio::test]
    async fn sqlite_purge_deletes_old_rows_of_its_statuses_in_batches_and_keeps_a_parked_head() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        for offset in 0..6 {
            upsert_one(
                &db,
                &NewDeadLetter {
                    original_offset: offset,
                    ..dead_letter(offset, "x")
                },
            )
            .await;
        }
        // Rows 1..=4 replayed long ago, 5 ignored long ago, 6 pending long ago; row 4 heads a parked key.
        sqlx::query("UPDATE dead_letters SET status = CASE WHEN id <= 4 THEN 'replayed' WHEN id = 5 THEN 'ignored' ELSE 'pending' END, updated_ms = 10")
            .execute(&db.pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO parked_keys (consumer_group, record_key, kafka_partition, head_origin, state, parked_ms, updated_ms, \
             head_topic, head_partition, head_offset) VALUES ('g', '42', 0, 'order.events.v1/0/3', 'dead', 1, 1, 'order.events.v1', 0, 3)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let purge = Purge {
            statuses: vec![Status::Replayed, Status::Ignored],
            group: Some("g".into()),
            before_ms: 11,
            batch: 2,
        };
        let dry = super::purge(&db, &purge, true, |_, _, _| {}).await.unwrap();
        assert_eq!(
            (dry.deleted.clone(), dry.kept_heads),
            (BTreeMap::from([("replayed", 3), ("ignored", 1)]), 1)
        );
        assert_eq!(
            list(&db, &Filter::default(), 10).await.unwrap().len(),
            6,
            "a dry run deletes nothing"
        );
        let mut batches = Vec::new();
        let done = super::purge(&db, &purge, false, |status, n, last| {
            batches.push((status, n, last))
        })
        .await
        .unwrap();
        assert_eq!((done.total(), done.kept_heads), (4, 1));
        assert_eq!(
            batches,
            [
                ("replayed", 2, false),
                ("replayed", 3, true),
                ("ignored", 1, true)
            ],
            "batches of 2, counted as they go"
        );
        let left: Vec<(i64, String)> = list(&db, &Filter::default(), 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.status))
            .collect();
        assert_eq!(
            left,
            [(4, "replayed".to_string()), (6, "pending".to_string())]
        );
        let young = Purge {
            before_ms: 10,
            statuses: vec![Status::Pending],
            ..purge
        };
        assert_eq!(
            super::purge(&db, &young, false, |_, _, _| {})
                .await
                .unwrap()
                .total(),
            0,
            "younger than the cutoff"
        );
    }

    /// On SQLite (MariaDB's is tests/it/console_dlq.rs): the console's
    /// pages walk the filter newest first by id; the key filter takes one
    /// order's rows only.
    #[tokio::test]
    async fn pages_newest_first_walk_the_filter_and_the_key_selects_one_order() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        for offset in 0..7 {
            let key = format!("order-{}", offset % 2).into_bytes();
            upsert_one(
                &db,
                &NewDeadLetter {
                    original_offset: offset,
                    key: Some(key),
                    ..dead_letter(offset, "x")
                },
            )
            .await;
        }
        mark_ignored(&db, 6, "known").await.unwrap();
        let pending = Filter {
            status: Some(Status::Pending.into()),
            ..Default::default()
        };
        let ids = |rows: Vec<DeadLetter>| rows.iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(page_newest_first(&db, &pending, None, 3).await.unwrap()),
            [7, 5, 4]
        );
        assert_eq!(
            ids(page_newest_first(&db, &pending, Some(4), 3).await.unwrap()),
            [3, 2, 1]
        );
        assert!(
            page_newest_first(&db, &pending, Some(1), 3)
                .await
                .unwrap()
                .is_empty()
        );
        let order_0 = Filter {
            key: Some("order-0".into()),
            ..pending.clone()
        };
        assert_eq!(
            ids(page_newest_first(&db, &order_0, None, 10).await.unwrap()),
            [7, 5, 3, 1]
        );
        assert_eq!(
            page_newest_first(&db, &order_0, None, 1).await.unwrap()[0]
                .key
                .as_deref(),
            Some("order-0")
        );
        assert!(!order_0.is_empty());
        assert_eq!(count(&db, &order_0).await.unwrap(), 4);
        assert_eq!(
            order_0.to_json(),
            serde_json::json!({"key": "order-0", "status": "pending"})
        );
        assert_eq!(
            bound(&db, &order_0, i64::MAX).await.unwrap(),
            Bound {
                rows: 4,
                last_id: Some(7)
            },
            "the dry-run count"
        );
    }

    /// On SQLite (MariaDB's is covered by tests/it/replay.rs): the bound
    /// holds the first `limit` rows of the filter; pages walk them by id and
    /// take neither a row past the bound nor one that left the filter.
    #[tokio::test]
    async fn pages_walk_the_bounded_selection_by_id() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        for offset in 0..6 {
            upsert_one(
                &db,
                &NewDeadLetter {
                    original_offset: offset,
                    ..dead_letter(offset, "x")
                },
            )
            .await;
        }
        let pending = Filter {
            status: Some(Status::Pending.into()),
            ..Default::default()
        };
        assert_eq!(
            bound(
                &db,
                &Filter {
                    group: Some("none".into()),
                    ..Default::default()
                },
                10
            )
            .await
            .unwrap(),
            Bound {
                rows: 0,
                last_id: None
            }
        );
        mark_ignored(&db, 2, "known").await.unwrap();
        let fixed = bound(&db, &pending, 4).await.unwrap();
        assert_eq!(
            fixed,
            Bound {
                rows: 4,
                last_id: Some(5)
            },
            "ids 1, 3, 4, 5"
        );
        mark_ignored(&db, 4, "meanwhile").await.unwrap();
        let ids = |rows: Vec<DeadLetterRecord>| rows.iter().map(|r| r.row.id).collect::<Vec<_>>();
        assert_eq!(
            ids(records_page(&db, &pending, i64::MIN, 5, 2).await.unwrap()),
            [1, 3]
        );
        assert_eq!(
            ids(records_page(&db, &pending, 3, 5, 2).await.unwrap()),
            [5],
            "4 left the filter, 6 is past the bound"
        );
        assert!(
            records_page(&db, &pending, 5, 5, 2)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
