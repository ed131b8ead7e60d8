//! `orderpipe cdc snapshot --blocking --table T`: a table's existing rows
//! as `insert` changes, between the stream's changes without a gap
//! (Maxwell's bootstrap), with the stream stopped; and [`TableRows`], how
//! both this and the incremental snapshot ([`super::incremental`]) read rows.
//!
//! 1. Take the source's producer (`init_transactions` fences a running
//!    `cdc` of the same name: stop it first; it resumes after the snapshot).
//! 2. Open a consistent snapshot on the source (`START TRANSACTION WITH
//!    CONSISTENT SNAPSHOT`) and read the binlog position it is consistent
//!    with (`binlog_snapshot_file`/`_position`, MariaDB): S.
//! 3. Publish the stream from the last checkpoint up to S, as `cdc` would
//!    (the snapshot table included): every change before S is out.
//! 4. Read the table in the snapshot and publish every row as an `insert`
//!    of `<db>.<table>`, in ONE Kafka transaction with the checkpoint S: a
//!    kill before its commit publishes none of them, and a rerun starts over.
//! 5. `cdc` started again resumes at S: changes after the snapshot follow it.
//!
//! So each key's history reads: changes up to S, the snapshot row (its
//! state at S), changes after S. One Kafka transaction holds the whole
//! table: `producer.options."transaction.timeout.ms"` must cover it.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use serde::Serialize;

use super::binlog::{self, BinlogPosition, BinlogReader, BinlogTransaction, RowChange};
use super::change::{ChangeKind, primary_key};
use super::checkpoint::{self, Checkpoint};
use super::column::{Column, INFORMATION_SCHEMA_QUERY, InformationSchemaColumn};
use super::redact::Redaction;
use super::table_schema::TableColumns;
use super::{CdcError, CdcSections, Publisher};

/// What a snapshot did.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotSummary {
    /// The table.
    pub table: String,
    /// The binlog position the rows are consistent with (the new checkpoint).
    pub position: BinlogPosition,
    /// Row changes published from the old checkpoint up to `position`.
    pub caught_up_changes: u64,
    /// Rows published as inserts.
    pub rows: u64,
}

/// Whether `a` is at or after `b` in the binlog (same file name pattern).
pub fn at_or_past(a: &BinlogPosition, b: &BinlogPosition) -> bool {
    (a.file.as_str(), a.pos) >= (b.file.as_str(), b.pos)
}

/// Opens a consistent snapshot on `conn` (`START TRANSACTION WITH
/// CONSISTENT SNAPSHOT`) and returns the binlog position it is consistent
/// with: what the snapshot reads committed before it, what the binlog holds
/// after it committed after (MariaDB's `binlog_snapshot_file`/`_position`).
pub(crate) async fn consistent_snapshot(
    conn: &mut mysql_async::Conn,
) -> Result<BinlogPosition, CdcError> {
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await
        .map_err(|e| CdcError::Source(format!("consistent snapshot: {e}")))?;
    let status: Vec<(String, String)> = conn
        .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
        .await
        .map_err(|e| CdcError::Source(format!("consistent snapshot: {e}")))?;
    let value = |name: &str| {
        status
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    match (
        value("Binlog_snapshot_file"),
        value("Binlog_snapshot_position"),
    ) {
        (Some(file), Some(pos)) if !file.is_empty() => Ok(BinlogPosition {
            file,
            pos: pos
                .parse()
                .map_err(|_| CdcError::Source(format!("binlog_snapshot_position = {pos:?}")))?,
            ..BinlogPosition::default()
        }),
        // Not MariaDB (MySQL has no such status): nothing to retry.
        _ => Err(CdcError::Setup(
            "the source has no binlog_snapshot_file/position status (MariaDB's consistent snapshot): cannot place the snapshot in the binlog".into(),
        )),
    }
}

/// A table as both snapshots read it: its columns described as the stream
/// describes them (src/cdc/column.rs), its primary key, and its rows made
/// into row changes the stream's way (redacted).
pub(crate) struct TableRows {
    database: String,
    table: String,
    columns: std::sync::Arc<TableColumns>,
    /// The primary key's columns, in key order.
    key_columns: Vec<String>,
    /// Where each key column is in `columns`.
    key_indexes: Vec<usize>,
    /// `SELECT <every column> FROM <table>`.
    select: String,
}

/// Sets up `conn` to read rows as the stream renders them: UTC, text in
/// the column's own charset, repeatable reads.
pub(crate) async fn prepare_session(conn: &mut mysql_async::Conn) -> Result<(), CdcError> {
    for statement in [
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "SET time_zone = '+00:00'",
        // Text as stored, in the column's own charset, as the binlog
        // carries it: one decoding (src/cdc/column.rs) for both.
        "SET character_set_results = NULL",
    ] {
        conn.query_drop(statement)
            .await
            .map_err(|e| CdcError::Source(format!("{statement}: {e}")))?;
    }
    Ok(())
}

/// `name` quoted as a MariaDB identifier.
fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

impl TableRows {
    /// Reads `table`'s (`db.table`) columns and key; refuses rules of
    /// `redaction` that drop or mask a key column.
    pub(crate) async fn describe(
        conn: &mut mysql_async::Conn,
        table: &str,
        redaction: &Redaction,
    ) -> Result<Self, CdcError> {
        let sql = |e: mysql_async::Error| CdcError::Source(format!("describing {table}: {e}"));
        let (db, name) = table.split_once('.').expect("validated as db.table");
        let key_columns: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
                (db, name),
            )
            .await
            .map_err(sql)?;
        let info: Vec<mysql_async::Row> = conn
            .exec(INFORMATION_SCHEMA_QUERY, (db, name))
            .await
            .map_err(sql)?;
        if info.is_empty() {
            return Err(CdcError::Setup(format!("{table}: no such table")));
        }
        let columns = TableColumns {
            columns: info
                .iter()
                .map(|row| Column::from_information_schema(&InformationSchemaColumn::from_row(row)))
                .collect(),
        };
        redaction
            .check_key(db, name, &key_columns)
            .map_err(CdcError::Setup)?;
        let key_indexes = key_columns
            .iter()
            .filter_map(|k| columns.names().position(|c| c == k))
            .collect();
        let list: Vec<String> = columns.names().map(quoted).collect();
        Ok(Self {
            select: format!(
                "SELECT {} FROM {}.{}",
                list.join(", "),
                quoted(db),
                quoted(name)
            ),
            database: db.to_string(),
            table: name.to_string(),
            columns: std::sync::Arc::new(columns),
            key_columns,
            key_indexes,
        })
    }

    /// The primary key's columns.
    pub(crate) fn key_columns(&self) -> &[String] {
        &self.key_columns
    }

    /// Every row (the binary protocol, a prepared statement, returns typed values).
    pub(crate) async fn all(
        &self,
        conn: &mut mysql_async::Conn,
    ) -> Result<Vec<mysql_async::Row>, mysql_async::Error> {
        conn.exec(&self.select, ()).await
    }

    /// Up to `limit` rows whose key is past `after` (all from the first
    /// when `None`), in key order: one chunk of an incremental snapshot.
    /// A composite key's "past" is spelled out column by column
    /// (`a > ? OR (a = ? AND b > ?)`), which MariaDB reads as index ranges.
    pub(crate) async fn chunk(
        &self,
        conn: &mut mysql_async::Conn,
        after: Option<&[mysql_async::Value]>,
        limit: usize,
    ) -> Result<Vec<mysql_async::Row>, mysql_async::Error> {
        let keys: Vec<String> = self.key_columns.iter().map(|k| quoted(k)).collect();
        let mut params = Vec::new();
        let mut sql = self.select.clone();
        if let Some(after) = after {
            let mut terms = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                let mut term: Vec<String> = keys[..i].iter().map(|k| format!("{k} = ?")).collect();
                term.push(format!("{key} > ?"));
                params.extend(after[..=i].iter().cloned());
                terms.push(format!("({})", term.join(" AND ")));
            }
            sql.push_str(&format!(" WHERE {}", terms.join(" OR ")));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT {limit}", keys.join(", ")));
        conn.exec(sql, mysql_async::Params::Positional(params))
            .await
    }

    /// The raw values of `row`'s primary key (where the next chunk starts).
    pub(crate) fn key_of(&self, row: &mysql_async::Row) -> Vec<mysql_async::Value> {
        self.key_indexes
            .iter()
            .map(|&i| row.as_ref(i).cloned().unwrap_or(mysql_async::Value::NULL))
            .collect()
    }

    /// `row` as a row change of `kind`, redacted by `redaction`.
    pub(crate) fn change(
        &self,
        row: &mysql_async::Row,
        kind: ChangeKind,
        redaction: &Redaction,
    ) -> RowChange {
        let mut data = serde_json::Map::new();
        for (i, column) in self.columns.columns.iter().enumerate() {
            let value = row.as_ref(i).cloned().unwrap_or(mysql_async::Value::NULL);
            data.insert(column.name.clone(), column.json(&value));
        }
        redaction.apply(&self.database, &self.table, &mut data);
        let null = serde_json::Value::Null;
        let key = primary_key(
            &self
                .key_columns
                .iter()
                .map(|c| data.get(c).unwrap_or(&null))
                .collect::<Vec<_>>(),
        );
        RowChange {
            database: self.database.clone(),
            table: self.table.clone(),
            kind,
            key,
            data: serde_json::Value::Object(data),
            old: None,
            columns: self.columns.clone(),
        }
    }
}

/// Runs a snapshot of `table` (`db.table`) for the source of `sections`.
pub async fn run(sections: CdcSections<'_>, table: &str) -> Result<SnapshotSummary, CdcError> {
    let mut cdc = sections.cdc.clone();
    if !cdc.tables.iter().any(|t| t == table) {
        cdc.tables.push(table.to_string());
    }
    cdc.validate().map_err(CdcError::Setup)?;
    let sections = CdcSections {
        cdc: &cdc,
        ..sections
    };
    let super::Started {
        url,
        mut conn,
        mut publisher,
    } = super::start(&sections, false).await?;
    let last = checkpoint::last_committed(sections.kafka, &cdc.offsets_topic, &cdc.name).await?;
    // An incremental snapshot under way goes on where it was.
    let incremental = last.as_ref().and_then(|c| c.snapshot.clone());
    let from = match last {
        Some(c) => c.position,
        None => binlog::current_position(&mut conn).await?,
    };
    // The consistent snapshot and the binlog position it matches.
    let sql = |e: mysql_async::Error| CdcError::Source(format!("snapshot of {table}: {e}"));
    prepare_session(&mut conn).await?;
    let rows = TableRows::describe(&mut conn, table, &publisher.redaction).await?;
    let position = consistent_snapshot(&mut conn).await?;
    // Everything before the snapshot goes out first.
    let caught_up_changes =
        catch_up(&mut publisher, &url, &cdc, &from, &position, &incremental).await?;
    // The rows, as of the snapshot, in one Kafka transaction with its checkpoint.
    let read = rows.all(&mut conn).await.map_err(sql)?;
    conn.query_drop("COMMIT").await.map_err(sql)?;
    let changes: Vec<RowChange> = read
        .iter()
        .map(|row| rows.change(row, ChangeKind::Insert, &publisher.redaction))
        .collect();
    let rows = changes.len() as u64;
    let snapshot = BinlogTransaction {
        gtid: None,
        xid: None,
        end: position.clone(),
        timestamp: chrono::Utc::now().timestamp() as u32,
        changes,
        ..BinlogTransaction::default()
    };
    publisher
        .publish(
            std::slice::from_ref(&snapshot),
            &Checkpoint::new(&cdc.name, position.clone()).with_snapshot(incremental),
        )
        .await?;
    Ok(SnapshotSummary {
        table: table.to_string(),
        position,
        caught_up_changes,
        rows,
    })
}

/// Publishes the stream from `from` up to `to` (a transaction boundary);
/// returns the number of changes.
async fn catch_up(
    publisher: &mut Publisher,
    url: &str,
    cdc: &super::CdcSettings,
    from: &BinlogPosition,
    to: &BinlogPosition,
    incremental: &Option<checkpoint::SnapshotState>,
) -> Result<u64, CdcError> {
    if at_or_past(from, to) {
        return Ok(0);
    }
    let mut reader = BinlogReader::open(
        url,
        cdc.server_id,
        from,
        cdc.resume,
        &cdc.tables,
        publisher.redaction.clone(),
    )
    .await?;
    let limit = cdc.piece_limit();
    let (mut batch, mut rows, mut bytes, mut published) = (Vec::new(), 0usize, 0usize, 0u64);
    loop {
        let tx = tokio::time::timeout(Duration::from_secs(60), reader.next_transaction(limit))
            .await
            .map_err(|_| {
                CdcError::Source(format!(
                    "no transaction ends at the snapshot's position {to} within 60 s"
                ))
            })??;
        let done = tx.continues.is_none() && tx.end.file == to.file && tx.end.pos == to.pos;
        if !done && at_or_past(&tx.end, to) {
            return Err(CdcError::Source(format!(
                "the snapshot's position {to} is not a transaction boundary (read past it to {})",
                tx.end
            )));
        }
        rows += tx.changes.len();
        bytes += tx.bytes;
        batch.push(tx);
        if done || limit.reached(rows, bytes) {
            let end = batch.last().expect("a transaction was pushed");
            let end = end.resume_point().clone();
            published += publisher
                .publish(
                    &batch,
                    &Checkpoint::new(&cdc.name, end).with_snapshot(incremental.clone()),
                )
                .await?;
            batch.clear();
            (rows, bytes) = (0, 0);
        }
        if done {
            return Ok(published);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_by_file_then_offset() {
        let p = |file: &str, pos| BinlogPosition {
            file: file.into(),
            pos,
            ..BinlogPosition::default()
        };
        assert!(at_or_past(
            &p("mariadb-bin.000002", 4),
            &p("mariadb-bin.000001", 900)
        ));
        assert!(at_or_past(
            &p("mariadb-bin.000001", 900),
            &p("mariadb-bin.000001", 900)
        ));
        assert!(!at_or_past(
            &p("mariadb-bin.000001", 899),
            &p("mariadb-bin.000001", 900)
        ));
    }
}
