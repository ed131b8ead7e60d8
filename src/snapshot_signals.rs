//! The signals that start, stop, pause and resume a cdc source's
//! incremental snapshots: rows of the control plane's `cdc_signals`,
//! Debezium's signal table in shape (`type`, `data` with
//! `data-collections`).
//!
//! `orderpipe cdc snapshot start|stop|pause|resume`, the admin API and
//! plain SQL all insert a row; the `cdc` process of the source reads the
//! rows past the last one it applied every second ([`crate::cdc::incremental`]),
//! applies them in id order, keeps that id in its checkpoint (so each is
//! applied once, whatever restarts), and writes what became of each back to
//! its row. The table is in orderpipe's own database, not the source's, so
//! a source that is a read-only replica takes signals too.
//!
//! ```sql
//! INSERT INTO cdc_signals (source, type, data, requested_by, created_at_ms)
//! VALUES ('orderpipe', 'execute-snapshot', '{"data-collections": ["shop.orders"]}', 'sql', 0);
//! ```

use serde::Serialize;

use crate::clock::now_ms;
use crate::db::Db;

/// What a signal asks for: Debezium's signal types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SignalKind {
    /// Queue incremental snapshots of the tables (`execute-snapshot`).
    Start,
    /// Drop the tables' snapshots from the queue, all of them when none
    /// is named (`stop-snapshot`).
    Stop,
    /// Stop reading chunks until resumed (`pause-snapshot`).
    Pause,
    /// Read chunks again (`resume-snapshot`).
    Resume,
}

/// The `type` values, in [`SignalKind`]'s order.
pub const TYPES: [&str; 4] = [
    "execute-snapshot",
    "stop-snapshot",
    "pause-snapshot",
    "resume-snapshot",
];

impl SignalKind {
    /// Its `type` in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => TYPES[0],
            Self::Stop => TYPES[1],
            Self::Pause => TYPES[2],
            Self::Resume => TYPES[3],
        }
    }

    /// The kind of a `type`, or an error naming the accepted ones.
    pub fn parse(text: &str) -> Result<Self, String> {
        match TYPES.iter().position(|t| *t == text) {
            Some(0) => Ok(Self::Start),
            Some(1) => Ok(Self::Stop),
            Some(2) => Ok(Self::Pause),
            Some(3) => Ok(Self::Resume),
            _ => Err(format!("type `{text}` is not one of {}", TYPES.join(", "))),
        }
    }
}

/// One row of `cdc_signals`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Signal {
    /// Row id: signals apply in this order.
    pub id: i64,
    /// The cdc source it is for (`cdc.name`).
    pub source: String,
    /// Its `type`, as written (checked when applied).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its `data`, as written: `{"data-collections": ["db.table", ...]}`.
    pub data: String,
    /// Who asked (`--by`, the admin API, `sql`).
    pub requested_by: String,
    /// When it was written (ms since the epoch).
    pub created_at_ms: i64,
    /// When the source applied it; `None`: not yet.
    pub applied_at_ms: Option<i64>,
    /// What became of it (`queued shop.orders`, or why it was refused).
    pub outcome: Option<String>,
}

impl Signal {
    /// The tables its `data` names (`data-collections`), or why it names
    /// none readable.
    pub fn tables(&self) -> Result<Vec<String>, String> {
        if self.data.trim().is_empty() {
            return Ok(Vec::new());
        }
        let data: serde_json::Value = serde_json::from_str(&self.data)
            .map_err(|e| format!("data is not JSON ({e}): {:?}", self.data))?;
        match data.get("data-collections") {
            None | Some(serde_json::Value::Null) => Ok(Vec::new()),
            Some(serde_json::Value::Array(tables)) => tables
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("data-collections holds {t}, not a table name"))
                })
                .collect(),
            Some(other) => Err(format!(
                "data-collections is {other}, not a list of <db>.<table>"
            )),
        }
    }
}

const COLUMNS: &str = "id, source, type, data, requested_by, created_at_ms, applied_at_ms, outcome";

type Row = (
    i64,
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
);

fn signal(row: Row) -> Signal {
    let (id, source, kind, data, requested_by, created_at_ms, applied_at_ms, outcome) = row;
    Signal {
        id,
        source,
        kind,
        data,
        requested_by,
        created_at_ms,
        applied_at_ms,
        outcome,
    }
}

/// Why a signal was not written.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// A bad input: the field (`tables[1]`) and what it accepts.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// Why, and what is accepted.
        reason: String,
    },
    /// The database.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Checks what a signal of `kind` names: `<db>.<table>` each, and at least
/// one for a start. The source checks the rest when it applies it (a table
/// it does not capture is refused on the signal's row).
fn check(kind: SignalKind, tables: &[String]) -> Result<(), SendError> {
    let invalid = |field: String, reason: String| Err(SendError::Invalid { field, reason });
    if kind == SignalKind::Start && tables.is_empty() {
        return invalid(
            "tables".into(),
            "execute-snapshot needs the tables to snapshot, <db>.<table>".into(),
        );
    }
    for (i, table) in tables.iter().enumerate() {
        if !crate::table_name::is_db_table(table) {
            return invalid(
                format!("tables[{i}]"),
                format!("{table:?} is not <db>.<table>, e.g. shop.orders"),
            );
        }
    }
    Ok(())
}

/// Writes a signal of `kind` for `source` naming `tables`, checked first.
#[tracing::instrument(skip(db))]
pub async fn send(
    db: &Db,
    source: &str,
    kind: SignalKind,
    tables: &[String],
    requested_by: &str,
) -> Result<Signal, SendError> {
    check(kind, tables)?;
    let data = serde_json::json!({ "data-collections": tables }).to_string();
    let created_at_ms = now_ms();
    sqlx::query(
        "INSERT INTO cdc_signals (source, type, data, requested_by, created_at_ms) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(source)
    .bind(kind.as_str())
    .bind(&data)
    .bind(requested_by)
    .bind(created_at_ms)
    .execute(&db.pool)
    .await?;
    // The row just written: the newest of this source with these values
    // (sqlx::Any has no portable last-insert id).
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM cdc_signals WHERE source = ? AND type = ? AND created_at_ms = ? \
         AND requested_by = ? ORDER BY id DESC LIMIT 1"
    )))
    .bind(source)
    .bind(kind.as_str())
    .bind(created_at_ms)
    .bind(requested_by)
    .fetch_one(&db.pool)
    .await?;
    Ok(signal(row))
}

/// The signals of `source` after `id`, oldest first (at most 100).
pub async fn after(db: &Db, source: &str, id: i64) -> Result<Vec<Signal>, sqlx::Error> {
    select(db, source, "AND id > ? ORDER BY id LIMIT 100", id).await
}

/// The newest `limit` signals of `source`, newest first.
pub async fn recent(db: &Db, source: &str, limit: i64) -> Result<Vec<Signal>, sqlx::Error> {
    select(db, source, "ORDER BY id DESC LIMIT ?", limit).await
}

/// The signals of `source` that `tail` (after `WHERE source = ?`, with one
/// `?` for `value`) selects.
async fn select(db: &Db, source: &str, tail: &str, value: i64) -> Result<Vec<Signal>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM cdc_signals WHERE source = ? {tail}"
    )))
    .bind(source)
    .bind(value)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows.into_iter().map(signal).collect())
}

/// Records what became of signal `id`.
pub async fn applied(db: &Db, id: i64, outcome: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE cdc_signals SET applied_at_ms = ?, outcome = ? WHERE id = ?")
        .bind(now_ms())
        .bind(outcome)
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn signals_are_read_in_order_past_the_last_applied_and_carry_their_outcome() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let tables = ["shop.orders".to_string(), "shop.users".to_string()];
        let start = send(&db, "src", SignalKind::Start, &tables, "oncall")
            .await
            .unwrap();
        assert_eq!(start.tables().unwrap(), tables);
        let pause = send(&db, "src", SignalKind::Pause, &[], "oncall")
            .await
            .unwrap();
        send(&db, "other", SignalKind::Stop, &[], "oncall")
            .await
            .unwrap();
        let pending = after(&db, "src", 0).await.unwrap();
        assert_eq!(
            pending.iter().map(|s| s.id).collect::<Vec<_>>(),
            [start.id, pause.id]
        );
        assert_eq!(
            after(&db, "src", start.id).await.unwrap(),
            std::slice::from_ref(&pause)
        );
        applied(&db, pause.id, "paused").await.unwrap();
        let newest = &recent(&db, "src", 1).await.unwrap()[0];
        assert_eq!(newest.outcome.as_deref(), Some("paused"));
        assert!(newest.applied_at_ms.is_some());
    }

    #[tokio::test]
    async fn a_bad_table_or_a_start_without_one_is_refused_naming_the_field() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let field = |kind, tables: &[&str]| {
            let tables: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
            match check(kind, &tables) {
                Err(SendError::Invalid { field, .. }) => field,
                other => panic!("{tables:?}: {other:?}"),
            }
        };
        assert_eq!(field(SignalKind::Start, &[]), "tables");
        assert_eq!(field(SignalKind::Stop, &["shop.a", "orders"]), "tables[1]");
        assert_eq!(field(SignalKind::Start, &["shop."]), "tables[0]");
        let e = send(&db, "src", SignalKind::Start, &["a.b.c".into()], "t")
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with("tables[0]: "), "{e}");
        assert!(
            after(&db, "src", 0).await.unwrap().is_empty(),
            "nothing written"
        );
        assert!(
            check(SignalKind::Stop, &[]).is_ok(),
            "a stop of every table"
        );
    }

    #[test]
    fn types_and_data_are_debeziums_and_bad_ones_say_what_is_accepted() {
        assert_eq!(
            SignalKind::parse("execute-snapshot").unwrap(),
            SignalKind::Start
        );
        let e = SignalKind::parse("snapshot").unwrap_err();
        assert!(
            e.contains("execute-snapshot") && e.contains("resume-snapshot"),
            "{e}"
        );
        let with = |data: &str| Signal {
            id: 1,
            source: "s".into(),
            kind: "execute-snapshot".into(),
            data: data.into(),
            requested_by: "sql".into(),
            created_at_ms: 0,
            applied_at_ms: None,
            outcome: None,
        };
        assert_eq!(
            with(r#"{"data-collections": ["a.b"], "type": "incremental"}"#)
                .tables()
                .unwrap(),
            ["a.b"]
        );
        assert!(with("").tables().unwrap().is_empty());
        assert!(with("{").tables().unwrap_err().contains("not JSON"));
        assert!(
            with(r#"{"data-collections": "a.b"}"#)
                .tables()
                .unwrap_err()
                .contains("not a list")
        );
    }
}
