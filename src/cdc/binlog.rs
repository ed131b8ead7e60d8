//! The binlog side of `orderpipe cdc`: a replica connection (mysql_async's
//! binlog stream) turned into whole transactions of row changes.
//!
//! What mysql_common parses from MariaDB 10.11 (checked against the dev
//! stack): the table maps (with column names and the primary key when
//! `binlog_row_metadata=FULL`), the rows events (`*_ROWS_EVENT_V1`), XID,
//! query, rotate and heartbeat events. It does not parse MariaDB's own
//! events (GTID 0xa2, GTID list 0xa3, binlog checkpoint 0xa1, annotate rows
//! 0xa0): they come as raw events, and the GTID event's fixed 13-byte
//! payload (sequence number, domain id, flags; the server id is in the
//! header) is read here ([`MariadbGtid`]). That is why the checkpoint is a
//! binlog file and position (what `COM_BINLOG_DUMP`, the request
//! mysql_async sends, takes) and the GTID rides along for operators and
//! event ids (see [`crate::cdc`]).
//!
//! A transaction starts at a MariaDB GTID event (or a `BEGIN` query) and
//! ends at its XID event, a `COMMIT` query, or — for a standalone GTID
//! (DDL, non-transactional statements) — its one query. The ends of whole
//! transactions are positions a reader may resume from; so is the start of
//! a transaction with a count of its changes already published
//! ([`InsideTransaction`]): a transaction with a GTID that holds more than
//! a [`PieceLimit`] of changes is handed out in pieces, so the reader never
//! holds a huge one whole, and a reader opened inside one skips the changes
//! already published.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{EventData, OptionalMetadataField, RowsEventData, TableMapEvent};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts};
use serde::{Deserialize, Serialize};

use super::CdcError;
use super::change::{ChangeKind, changed_columns, primary_key};
use super::column::{Charset, Column, INFORMATION_SCHEMA_QUERY, InformationSchemaColumn, Kind};
use super::table_schema::TableColumns;

/// MariaDB's GTID event (not parsed by mysql_common).
const MARIADB_GTID_EVENT: u8 = 0xa2;
/// The GTID event's flag for a transaction of one statement, without XID or COMMIT.
const GTID_FLAG_STANDALONE: u8 = 0x01;
/// Heartbeat period asked of the server: an idle stream still proves it is alive.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// No event (not even a heartbeat) this long: the connection is dead.
const SILENCE_LIMIT: Duration = Duration::from_secs(15);

/// How `cdc` asks for the binlog when it (re)connects (`[cdc] resume`,
/// `--resume`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ResumeMode {
    /// By file and position on the server that wrote the checkpoint; by
    /// GTID when the server answering has another `@@server_id` (a
    /// failover). Checkpoints without a server (older ones) resume by position.
    #[default]
    Auto,
    /// Always by file and position (the checkpoint's server must answer).
    Position,
    /// Always by the checkpoint's GTID state (any server of the
    /// replication topology with the GTIDs in its binlog).
    Gtid,
}

/// A position in the binlog a reader can resume from: the end of a whole
/// transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinlogPosition {
    /// Binlog file name, e.g. `mariadb-bin.000002`.
    pub file: String,
    /// Byte offset in `file`.
    pub pos: u64,
    /// The GTID of the transaction that ends here, when known.
    #[serde(default)]
    pub gtid: Option<String>,
    /// `@@server_id` of the server whose binlog `file` and `pos` are in
    /// (absent in checkpoints written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
    /// The GTID position here: the last GTID of every replication domain
    /// (`0-1-18,7-1-3`), what `@slave_connect_state` takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid_state: Option<String>,
    /// Set when this is the start of a transaction published in pieces:
    /// which one, and how many of its changes are out. Absent in
    /// checkpoints at a transaction's end (and in older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inside: Option<InsideTransaction>,
}

/// A transaction published in part: the position it is in starts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InsideTransaction {
    /// Its GTID: the transaction the stream must start with on resume.
    pub gtid: String,
    /// Its changes (of captured tables, in binlog order) already published:
    /// skipped on resume, and the row index the next change gets.
    pub published: u64,
}

/// How much of an open transaction the reader holds before it hands the
/// changes out as a piece (`cdc.batch_max_rows`, `cdc.batch_max_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceLimit {
    /// Changes.
    pub rows: usize,
    /// Bytes of the rows events they came in (the binlog's size of the rows).
    pub bytes: usize,
}

impl PieceLimit {
    /// No limit: whole transactions only.
    pub const WHOLE: Self = Self {
        rows: usize::MAX,
        bytes: usize::MAX,
    };

    /// Whether `rows` changes in `bytes` of rows events reach the limit.
    pub fn reached(&self, rows: usize, bytes: usize) -> bool {
        rows >= self.rows || bytes >= self.bytes
    }
}

impl BinlogPosition {
    /// The GTID position to resume from: the recorded state, else (older
    /// checkpoints, one replication domain) the last transaction's GTID.
    pub fn resume_gtid_state(&self) -> Option<&str> {
        self.gtid_state
            .as_deref()
            .or(self.gtid.as_deref())
            .filter(|s| !s.is_empty())
    }
}

/// True for a GTID position MariaDB takes: `domain-server-sequence`, comma separated.
fn is_gtid_state(text: &str) -> bool {
    !text.is_empty()
        && text.split(',').all(|gtid| {
            let parts: Vec<&str> = gtid.trim().split('-').collect();
            parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The GTID position of `state` (last GTID per domain), domains in order.
fn render_gtid_state(state: &std::collections::BTreeMap<u32, String>) -> Option<String> {
    (!state.is_empty()).then(|| state.values().cloned().collect::<Vec<_>>().join(","))
}

/// Reads a GTID position into its last GTID per domain.
fn parse_gtid_state(text: &str) -> std::collections::BTreeMap<u32, String> {
    text.split(',')
        .filter_map(|gtid| {
            let gtid = gtid.trim();
            let domain = gtid.split('-').next()?.parse().ok()?;
            Some((domain, gtid.to_string()))
        })
        .collect()
}

impl BinlogPosition {
    /// Parses `FILE:POS` (the `--start-position` flag).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (file, pos) = text.rsplit_once(':').ok_or_else(|| {
            format!(
                "`{text}` is not FILE:POS (e.g. mariadb-bin.000002:1588, from SHOW MASTER STATUS)"
            )
        })?;
        let pos = pos
            .parse::<u64>()
            .map_err(|_| format!("`{pos}` in `{text}` is not a byte position"))?;
        if file.is_empty() || pos < 4 {
            return Err(format!(
                "`{text}`: the file must be named and the position be at least 4"
            ));
        }
        Ok(Self {
            file: file.to_string(),
            pos,
            ..Self::default()
        })
    }
}

impl std::fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)?;
        if let Some(gtid) = &self.gtid {
            write!(f, " (gtid {gtid})")?;
        }
        if let Some(inside) = &self.inside {
            write!(
                f,
                " inside {} after {} changes",
                inside.gtid, inside.published
            )?;
        }
        Ok(())
    }
}

/// A MariaDB GTID: `domain-server-sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariadbGtid {
    /// Replication domain.
    pub domain: u32,
    /// Server that wrote the transaction.
    pub server: u32,
    /// Sequence number within the domain.
    pub sequence: u64,
    /// The event's flags (standalone, DDL, ...).
    pub flags: u8,
}

impl MariadbGtid {
    /// Reads the GTID event's payload (after the common header): sequence
    /// number (8 bytes LE), domain id (4 bytes LE), flags (1 byte).
    pub fn parse(server: u32, payload: &[u8]) -> Option<Self> {
        let sequence = u64::from_le_bytes(payload.get(0..8)?.try_into().ok()?);
        let domain = u32::from_le_bytes(payload.get(8..12)?.try_into().ok()?);
        let flags = *payload.get(12)?;
        Some(Self {
            domain,
            server,
            sequence,
            flags,
        })
    }

    /// A transaction of one statement, with no XID or COMMIT after it.
    pub fn is_standalone(&self) -> bool {
        self.flags & GTID_FLAG_STANDALONE != 0
    }
}

impl std::fmt::Display for MariadbGtid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.sequence)
    }
}

/// One row change of a captured table, before it becomes an event.
#[derive(Debug, Clone, PartialEq)]
pub struct RowChange {
    /// Database.
    pub database: String,
    /// Table.
    pub table: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The primary key ([`primary_key`]).
    pub key: String,
    /// The row after (the deleted row for a delete).
    pub data: serde_json::Value,
    /// The changed columns' previous values (updates).
    pub old: Option<serde_json::Value>,
    /// The table's columns, as the table map (or snapshot query) gave them.
    pub columns: std::sync::Arc<TableColumns>,
}

/// A committed transaction and the changes of captured tables in it
/// (possibly none), or a piece of one (see [`PieceLimit`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BinlogTransaction {
    /// Its GTID, when the server wrote one (always, for a piece).
    pub gtid: Option<String>,
    /// Its XID, when the engine wrote one (on its last piece).
    pub xid: Option<u64>,
    /// Where it ends: the position to resume after it. For a piece that
    /// does not end its transaction: where the piece was read up to (the
    /// end of its last rows event), not a position to resume from.
    pub end: BinlogPosition,
    /// Commit time (seconds since the epoch) from the event headers.
    pub timestamp: u32,
    /// Changes of the captured tables, in binlog order.
    pub changes: Vec<RowChange>,
    /// The index in the whole transaction of `changes[0]`: 0 but for the
    /// pieces after the first, so row indexes (and event ids) are the ones
    /// the whole transaction has.
    pub first_row: usize,
    /// Bytes of the rows events `changes` came in.
    pub bytes: usize,
    /// Set on a piece that does not end its transaction: the position to
    /// resume from (the transaction's start, with the changes published
    /// up to the end of this piece).
    pub continues: Option<BinlogPosition>,
    /// Set on a chunk of an incremental snapshot ([`super::incremental`]),
    /// not a transaction of the binlog: its id, which its rows' event ids
    /// derive from.
    pub snapshot: Option<String>,
}

impl BinlogTransaction {
    /// The checkpoint's position once this (and everything before it) is
    /// published: the end, or for a piece, inside the transaction.
    pub fn resume_point(&self) -> &BinlogPosition {
        self.continues.as_ref().unwrap_or(&self.end)
    }
}

/// The transaction being read.
#[derive(Debug, Default)]
struct Open {
    gtid: Option<MariadbGtid>,
    changes: Vec<RowChange>,
    timestamp: u32,
    /// Where it starts (its GTID event), with the GTID position before it.
    start: BinlogPosition,
    /// Its changes handed out in earlier pieces (or, resumed inside it,
    /// published by an earlier process): the row index of `changes[0]`.
    published: usize,
    /// Changes still to drop: published before the stream was opened.
    skip: usize,
    /// Bytes of the rows events of `changes`.
    bytes: usize,
    /// More changes than the limit, but no GTID to resume inside it by:
    /// already warned about.
    warned: bool,
}

/// A [`BinlogReader`] on a task of its own, reading ahead of the publisher
/// by up to one batch: parsing the next transactions (CPU) overlaps the
/// current batch's Kafka transaction (waits on the broker). Transactions
/// come in stream order, each once. The reader holds at most a
/// [`PieceLimit`] of rows and bytes not yet taken (a bigger transaction
/// alone), and stops with the first error, which it hands on. Dropping this
/// stops the task and closes its replica connection (a reconnect opens a
/// new reader at the checkpoint).
pub(crate) struct ReadAhead {
    received: tokio::sync::mpsc::Receiver<(Result<BinlogTransaction, CdcError>, u32, u32)>,
    rows: std::sync::Arc<tokio::sync::Semaphore>,
    bytes: std::sync::Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadAhead {
    /// Starts reading `reader` ahead, in transactions or pieces of `limit`.
    pub(crate) fn start(mut reader: BinlogReader, limit: PieceLimit) -> Self {
        // Bounds of the read-ahead, as semaphore permits (u32 each).
        let cap = |n: usize| n.clamp(1, 1 << 24) as u32;
        let (row_cap, byte_cap) = (cap(limit.rows), cap(limit.bytes));
        let rows = std::sync::Arc::new(tokio::sync::Semaphore::new(row_cap as usize));
        let bytes = std::sync::Arc::new(tokio::sync::Semaphore::new(byte_cap as usize));
        // Transactions are counted, not only rows: a stream of empty ones
        // (other tables') stays bounded too.
        let (sender, received) = tokio::sync::mpsc::channel(row_cap as usize);
        let (task_rows, task_bytes) = (rows.clone(), bytes.clone());
        let task = tokio::spawn(async move {
            loop {
                let result = reader.next_transaction(limit).await;
                let (r, b) = match &result {
                    Ok(tx) => (
                        cap(tx.changes.len()).min(row_cap),
                        cap(tx.bytes).min(byte_cap),
                    ),
                    Err(_) => (0, 0),
                };
                let stop = result.is_err();
                // Closed semaphores never happen: they live as long as this task's owner.
                if let (Ok(p), Ok(q)) = (
                    task_rows.acquire_many(r).await,
                    task_bytes.acquire_many(b).await,
                ) {
                    p.forget();
                    q.forget();
                }
                if sender.send((result, r, b)).await.is_err() || stop {
                    break;
                }
            }
        });
        Self {
            received,
            rows,
            bytes,
            task,
        }
    }

    /// The next transaction or piece, as [`BinlogReader::next_transaction`]
    /// gives it. Cancel-safe.
    pub(crate) async fn next_transaction(&mut self) -> Result<BinlogTransaction, CdcError> {
        match self.received.recv().await {
            Some((result, rows, bytes)) => {
                self.rows.add_permits(rows as usize);
                self.bytes.add_permits(bytes as usize);
                result
            }
            None => Err(CdcError::Source("the binlog reader task ended".into())),
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads whole transactions from a replica connection.
pub struct BinlogReader {
    stream: BinlogStream,
    tables: HashSet<String>,
    /// The columns dropped, hashed or masked before the rows go on.
    redaction: std::sync::Arc<super::redact::Redaction>,
    file: String,
    open: Option<Open>,
    /// Bytes of checksum after each event (4 with CRC32, else 0): the first
    /// (artificial) rotate event comes before the format description that
    /// says so, and mysql_common then leaves them at the end of its name.
    checksum_len: usize,
    /// A format description event was read (later events parse exactly).
    seen_format: bool,
    /// Where this stream started.
    start: BinlogPosition,
    /// `@@server_id` of the server streaming.
    source_server: u32,
    /// The GTID position this stream started from, when it asked by GTID.
    by_gtid: Option<String>,
    /// The last GTID of each replication domain read so far.
    gtid_state: std::collections::BTreeMap<u32, String>,
    /// Opened inside a transaction published in part: the first
    /// transaction must be that one, and its first changes are dropped.
    resume_inside: Option<InsideTransaction>,
    /// The captured tables' columns, by table id ([`BinlogReader::describe_tables`]).
    tables_described: TableDescriptions,
    /// Only inserts are wanted ([`BinlogReader::inserts_only`]).
    inserts_only: bool,
    /// Only these columns are rendered ([`BinlogReader::columns_only`]).
    columns_only: Option<&'static [&'static str]>,
}

/// What the table maps of captured tables say, with what only
/// `information_schema` knows, cached per table id (a new table map id
/// follows every DDL). Looked up through a second connection, between
/// events: a lookup cancelled with `next_transaction` loses no event.
struct TableDescriptions {
    url: String,
    conn: Option<Conn>,
    /// Collation id -> character set name (`information_schema.COLLATIONS`).
    collations: std::collections::HashMap<u16, String>,
    /// Table ids mapped but not described yet.
    pending: Vec<u64>,
    /// The lookup running for the first of them.
    lookup: Option<(u64, tokio::task::JoinHandle<Result<Looked, CdcError>>)>,
    layouts: std::collections::HashMap<u64, std::sync::Arc<TableLayout>>,
}

/// Server settings `orderpipe cdc` needs, with the value it needs.
const REQUIRED_VARIABLES: &[(&str, &str)] = &[
    ("log_bin", "1"),
    ("binlog_format", "ROW"),
    ("binlog_row_image", "FULL"),
    ("binlog_row_metadata", "FULL"),
];

/// Connects to `url` (a `mysql://` URL).
pub async fn connect(url: &str) -> Result<Conn, CdcError> {
    let opts = Opts::from_url(url)
        .map_err(|e| CdcError::Source(format!("cdc.source: not a mysql:// URL: {e}")))?;
    Conn::new(opts)
        .await
        .map_err(|e| CdcError::Unreachable(format!("cannot connect to the source database: {e}")))
}

/// Checks the server's binlog settings and that every table exists and
/// has a primary key; errors name the variable or table and what is needed.
pub async fn check_source(conn: &mut Conn, tables: &[String]) -> Result<(), CdcError> {
    for (variable, needed) in REQUIRED_VARIABLES {
        let value: Option<Option<String>> = conn
            .query_first(format!("SELECT CAST(@@{variable} AS CHAR)"))
            .await
            .map_err(|e| CdcError::Source(format!("cannot read @@{variable}: {e} (binlog_row_metadata needs MariaDB 10.5+ or MySQL 8.0.14+)")))?;
        let value = value.flatten().unwrap_or_default();
        // log_bin reads as ON (MariaDB) or 1 (MySQL).
        let on = *needed == "1" && value.eq_ignore_ascii_case("ON");
        if !value.eq_ignore_ascii_case(needed) && !on {
            return Err(CdcError::Source(format!(
                "the source database has {variable}={value}; orderpipe cdc needs {variable}={needed} \
                 (server options: log_bin, binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL)"
            )));
        }
    }
    for table in tables {
        let (db, name) = table.split_once('.').unwrap_or(("", table));
        let key_columns: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY'",
                (db, name),
            )
            .await
            .map_err(|e| {
                CdcError::Source(format!("cannot read the primary key of {table}: {e}"))
            })?;
        if key_columns.is_empty() {
            let exists: Option<String> = conn
                .exec_first(
                    "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (db, name),
                )
                .await
                .map_err(|e| CdcError::Source(format!("cannot look up {table}: {e}")))?;
            return Err(CdcError::Source(match exists {
                None => format!("cdc.tables: table {table} does not exist"),
                Some(_) => format!(
                    "cdc.tables: table {table} has no primary key; its changes would have no key to keep them in order"
                ),
            }));
        }
    }
    Ok(())
}

/// The server's current binlog end (`SHOW MASTER STATUS`), with its GTID position.
pub async fn current_position(conn: &mut Conn) -> Result<BinlogPosition, CdcError> {
    let row: Option<mysql_async::Row> = conn
        .query_first("SHOW MASTER STATUS")
        .await
        .map_err(|e| CdcError::Source(format!("SHOW MASTER STATUS: {e}")))?;
    let row = row.ok_or_else(|| {
        CdcError::Source("SHOW MASTER STATUS is empty: the binlog is off (log_bin)".into())
    })?;
    let file: String = row
        .get(0)
        .ok_or_else(|| CdcError::Source("SHOW MASTER STATUS has no file".into()))?;
    let pos: u64 = row
        .get(1)
        .ok_or_else(|| CdcError::Source("SHOW MASTER STATUS has no position".into()))?;
    let gtid: Option<Option<String>> = conn
        .query_first("SELECT @@gtid_binlog_pos")
        .await
        .unwrap_or(None);
    let gtid = gtid.flatten().filter(|g| !g.is_empty());
    Ok(BinlogPosition {
        file,
        pos,
        gtid_state: gtid.clone(),
        gtid,
        server_id: Some(server_id(conn).await?),
        inside: None,
    })
}

/// The server's `@@server_id`: which server's binlog a position is in.
pub async fn server_id(conn: &mut Conn) -> Result<u32, CdcError> {
    let id: Option<u32> = conn
        .query_first("SELECT @@server_id")
        .await
        .map_err(|e| CdcError::Source(format!("cannot read @@server_id: {e}")))?;
    id.ok_or_else(|| CdcError::Source("@@server_id is empty".into()))
}

impl BinlogReader {
    /// Opens a replica connection as `server_id` reading from `from`, keeping
    /// the changes of `tables` (`db.table`). By file and position, or by
    /// `from`'s GTID position (MariaDB's `@slave_connect_state`) as `resume`
    /// says; [`ResumeMode::Auto`] asks by GTID when the server answering is
    /// not the one that wrote `from` (a failover).
    pub async fn open(
        url: &str,
        server_id: u32,
        from: &BinlogPosition,
        resume: ResumeMode,
        tables: &[String],
        redaction: std::sync::Arc<super::redact::Redaction>,
    ) -> Result<Self, CdcError> {
        let mut conn = connect(url).await?;
        let source_server = self::server_id(&mut conn).await?;
        let by_gtid = match resume {
            ResumeMode::Position => false,
            ResumeMode::Gtid => true,
            ResumeMode::Auto => from.server_id.is_some_and(|s| s != source_server),
        };
        let by_gtid = if by_gtid {
            let state = from.resume_gtid_state().ok_or_else(|| {
                CdcError::Setup(format!(
                    "cannot resume by GTID on server {source_server}: the checkpoint {from} has no GTID; \
                     start a new source name with --start-position FILE:POS on this server"
                ))
            })?;
            if !is_gtid_state(state) {
                return Err(CdcError::Setup(format!(
                    "the checkpoint's GTID position {state:?} is not domain-server-sequence[,...]"
                )));
            }
            Some(state.to_string())
        } else {
            None
        };
        // The GTID position at `from` (every domain, not only the last
        // transaction's), so the next checkpoints carry a whole one.
        let gtid_state = match &by_gtid {
            Some(state) => parse_gtid_state(state),
            None => {
                let at: Option<Option<String>> = conn
                    .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (&from.file, from.pos))
                    .await
                    .unwrap_or(None);
                at.flatten()
                    .filter(|s| !s.is_empty())
                    .or_else(|| from.resume_gtid_state().map(str::to_string))
                    .map(|s| parse_gtid_state(&s))
                    .unwrap_or_default()
            }
        };
        let checksum: Option<String> = conn
            .query_first("SELECT @@binlog_checksum")
            .await
            .map_err(|e| CdcError::Source(format!("cannot read @@binlog_checksum: {e}")))?;
        let checksum_len = if checksum.is_some_and(|c| c.eq_ignore_ascii_case("CRC32")) {
            4
        } else {
            0
        };
        // MariaDB: send its GTID events (capability 4 = GTID) instead of
        // rewriting them as BEGIN queries, and heartbeats while idle.
        let mut sets = vec![
            "SET @mariadb_slave_capability = 4".to_string(),
            format!("SET @master_heartbeat_period = {}", HEARTBEAT.as_nanos()),
        ];
        if let Some(state) = &by_gtid {
            // MariaDB's GTID resume: the server starts after these GTIDs
            // (checked to be digits and dashes above), and in strict mode
            // refuses a state its binlog does not hold instead of guessing.
            sets.push(format!("SET @slave_connect_state = '{state}'"));
            sets.push("SET @slave_gtid_strict_mode = 1".to_string());
            tracing::info!(gtid = %state, server_id = source_server, checkpoint = %from, "cdc: resuming by GTID");
        }
        for set in sets {
            conn.query_drop(&set)
                .await
                .map_err(|e| CdcError::Source(format!("{set}: {e}")))?;
        }
        // With @slave_connect_state set, MariaDB ignores the file and
        // position of COM_BINLOG_DUMP; mysql_async sends an empty file name
        // unless one is given (its GTID request is MySQL's COM_BINLOG_DUMP_GTID).
        let request = match &by_gtid {
            Some(_) => BinlogStreamRequest::new(server_id).with_pos(4),
            None => BinlogStreamRequest::new(server_id)
                .with_filename(from.file.as_bytes())
                .with_pos(from.pos),
        };
        let stream = conn.get_binlog_stream(request).await.map_err(|e| {
            CdcError::Source(format!(
                "binlog dump from {} as server_id {server_id}: {e}",
                by_gtid
                    .as_ref()
                    .map_or(from.to_string(), |s| format!("GTID {s}"))
            ))
        })?;
        Ok(Self {
            stream,
            tables: tables.iter().cloned().collect(),
            redaction,
            file: from.file.clone(),
            open: None,
            checksum_len,
            seen_format: false,
            start: from.clone(),
            source_server,
            by_gtid,
            gtid_state,
            resume_inside: from.inside.clone(),
            inserts_only: false,
            columns_only: None,
            tables_described: TableDescriptions {
                url: url.to_string(),
                conn: None,
                collations: std::collections::HashMap::new(),
                pending: Vec::new(),
                lookup: None,
                layouts: std::collections::HashMap::new(),
            },
        })
    }

    /// Describes the captured tables whose table maps came since the last
    /// call ([`TableLayout::of`]): asks `information_schema` what the
    /// table map cannot say. Called before the next event is read; the
    /// lookup runs in its own task, so a `next_transaction` cancelled while
    /// it runs loses neither an event nor the connection's state.
    async fn describe_tables(&mut self) -> Result<(), CdcError> {
        while let Some(&table_id) = self.tables_described.pending.first() {
            let Some(tme) = self.stream.get_tme(table_id) else {
                self.tables_described.pending.remove(0);
                continue;
            };
            let (database, table) = (
                tme.database_name().into_owned(),
                tme.table_name().into_owned(),
            );
            let described = &mut self.tables_described;
            if described
                .lookup
                .as_ref()
                .is_none_or(|(id, _)| *id != table_id)
            {
                let (url, conn, need_collations) = (
                    described.url.clone(),
                    described.conn.take(),
                    described.collations.is_empty(),
                );
                let (db, name) = (database.clone(), table.clone());
                described.lookup = Some((
                    table_id,
                    tokio::spawn(lookup(url, conn, need_collations, db, name)),
                ));
            }
            let (_, handle) = described.lookup.as_mut().expect("started above");
            let looked_up = handle.await;
            described.lookup = None;
            let (conn, collations, info) = looked_up.map_err(|e| {
                CdcError::Source(format!(
                    "the column lookup of {database}.{table} failed: {e}"
                ))
            })??;
            described.conn = Some(conn);
            if let Some(collations) = collations {
                described.collations = collations;
            }
            let tme = self.stream.get_tme(table_id).expect("looked up above");
            let layout = TableLayout::of(
                tme,
                &database,
                &table,
                &info,
                &self.tables_described.collations,
            )?;
            let described = &mut self.tables_described;
            // Older ids of the same table are not mapped again.
            described.layouts.retain(|_, l| {
                (l.database.as_str(), l.table.as_str()) != (database.as_str(), table.as_str())
            });
            described
                .layouts
                .insert(table_id, std::sync::Arc::new(layout));
            described.pending.remove(0);
        }
        Ok(())
    }

    /// Notes the table map of a captured table not described yet.
    fn table_mapped(&mut self, tme: &TableMapEvent<'_>) {
        let name = format!("{}.{}", tme.database_name(), tme.table_name());
        let id = tme.table_id();
        let described = &mut self.tables_described;
        if self.tables.contains(&name)
            && !described.layouts.contains_key(&id)
            && !described.pending.contains(&id)
        {
            described.pending.push(id);
        }
    }

    /// The GTID position this stream was asked from, when it was asked by GTID.
    pub fn resumed_by_gtid(&self) -> Option<&str> {
        self.by_gtid.as_deref()
    }

    /// `@@server_id` of the server streaming.
    pub fn source_server(&self) -> u32 {
        self.source_server
    }

    /// Where this stream was asked from, for errors.
    fn asked_at(&self) -> String {
        match &self.by_gtid {
            Some(state) => format!("GTID {state} (server {})", self.source_server),
            None => format!("{}:{}", self.start.file, self.start.pos),
        }
    }

    /// At the first transaction of a stream opened inside one: checks it
    /// is that one and returns how many of its changes to drop.
    fn resumed_into(&mut self, gtid: Option<&MariadbGtid>) -> Result<usize, CdcError> {
        let Some(inside) = self.resume_inside.take() else {
            return Ok(0);
        };
        let found = gtid.map_or("a transaction without GTID".to_string(), |g| g.to_string());
        if found != inside.gtid {
            return Err(CdcError::PositionGone(format!(
                "{}: the checkpoint is inside transaction {} after {} of its changes, but the stream starts with {found}",
                self.asked_at(),
                inside.gtid,
                inside.published
            )));
        }
        Ok(inside.published as usize)
    }

    /// The next whole transaction, or the next piece of one: a transaction
    /// with a GTID is handed out as soon as the changes read of it reach
    /// `limit` (then the next call goes on with it), so the reader holds at
    /// most about `limit` of a huge one. Cancel-safe: a transaction read
    /// halfway stays in the reader and the next call goes on with it.
    pub async fn next_transaction(
        &mut self,
        limit: PieceLimit,
    ) -> Result<BinlogTransaction, CdcError> {
        loop {
            self.describe_tables().await?;
            let event = match tokio::time::timeout(SILENCE_LIMIT, self.stream.next()).await {
                Err(_) => {
                    return Err(CdcError::Source(format!(
                        "no binlog event or heartbeat for {SILENCE_LIMIT:?}"
                    )));
                }
                Ok(None) => {
                    return Err(CdcError::Source(
                        "the source closed the binlog stream".into(),
                    ));
                }
                // 1236 (ER_MASTER_FATAL_ERROR_READING_BINLOG): the position
                // is not in the server's binlog (purged, or another server's).
                Ok(Some(Err(mysql_async::Error::Server(e)))) if e.code == 1236 => {
                    return Err(CdcError::PositionGone(format!(
                        "{}: {}",
                        self.asked_at(),
                        e.message
                    )));
                }
                Ok(Some(Err(e))) => return Err(CdcError::Source(format!("binlog stream: {e}"))),
                Ok(Some(Ok(event))) => event,
            };
            let header = event.header();
            tracing::trace!(
                event_type = header.event_type_raw(),
                log_pos = header.log_pos(),
                "cdc: binlog event"
            );
            if header.event_type_raw() == MARIADB_GTID_EVENT {
                let gtid =
                    MariadbGtid::parse(header.server_id(), event.data()).ok_or_else(|| {
                        CdcError::Source("a MariaDB GTID event shorter than 13 bytes".into())
                    })?;
                // The transaction starts at its GTID event, after the GTID
                // position without it: a checkpoint inside it resumes there.
                let start = BinlogPosition {
                    file: self.file.clone(),
                    pos: u64::from(header.log_pos()).saturating_sub(u64::from(header.event_size())),
                    gtid: self.gtid_state.get(&gtid.domain).cloned(),
                    server_id: Some(self.source_server),
                    gtid_state: render_gtid_state(&self.gtid_state),
                    inside: None,
                };
                self.gtid_state.insert(gtid.domain, gtid.to_string());
                let skip = self.resumed_into(Some(&gtid))?;
                self.open = Some(Open {
                    gtid: Some(gtid),
                    timestamp: header.timestamp(),
                    start,
                    published: skip,
                    skip,
                    ..Open::default()
                });
                continue;
            }
            let data = event
                .read_data()
                .map_err(|e| CdcError::Source(format!("cannot parse a binlog event: {e}")))?;
            let end = |reader: &mut Self, xid: Option<u64>| {
                let open = reader.open.take().unwrap_or_default();
                let gtid = open.gtid.map(|g| g.to_string());
                BinlogTransaction {
                    end: BinlogPosition {
                        file: reader.file.clone(),
                        pos: u64::from(header.log_pos()),
                        gtid: gtid.clone(),
                        server_id: Some(reader.source_server),
                        gtid_state: render_gtid_state(&reader.gtid_state),
                        inside: None,
                    },
                    gtid,
                    xid,
                    timestamp: if open.timestamp > 0 {
                        open.timestamp
                    } else {
                        header.timestamp()
                    },
                    changes: open.changes,
                    first_row: open.published,
                    bytes: open.bytes,
                    continues: None,
                    snapshot: None,
                }
            };
            match data {
                Some(EventData::RotateEvent(rotate)) => {
                    let mut name = rotate.name_raw().to_vec();
                    if !self.seen_format {
                        name.truncate(name.len().saturating_sub(self.checksum_len));
                    }
                    self.file = String::from_utf8(name).map_err(|e| {
                        CdcError::Source(format!(
                            "a rotate event names a file that is not UTF-8: {e}"
                        ))
                    })?;
                }
                Some(EventData::FormatDescriptionEvent(_)) => self.seen_format = true,
                Some(EventData::TableMapEvent(tme)) => self.table_mapped(&tme),
                Some(EventData::XidEvent(xid)) => return Ok(end(self, Some(xid.xid))),
                Some(EventData::QueryEvent(query)) => {
                    let text = query.query();
                    let text = text.trim();
                    if text.eq_ignore_ascii_case("BEGIN") {
                        if self.open.is_none() {
                            self.resumed_into(None)?;
                        }
                        self.open.get_or_insert_with(|| Open {
                            timestamp: header.timestamp(),
                            ..Open::default()
                        });
                    } else if text.eq_ignore_ascii_case("COMMIT")
                        || self
                            .open
                            .as_ref()
                            .is_none_or(|o| o.gtid.is_some_and(|g| g.is_standalone()))
                    {
                        // COMMIT, or a statement that is its own transaction (DDL).
                        return Ok(end(self, None));
                    }
                }
                Some(EventData::RowsEvent(rows)) => {
                    // Name where: the event's end position in its file.
                    let mut changes = self.changes_of(&rows).map_err(|e| match e {
                        CdcError::Source(why) => CdcError::Source(format!(
                            "{why} (rows event ending at binlog {}:{})",
                            self.file,
                            header.log_pos()
                        )),
                        e => e,
                    })?;
                    if self.open.is_none() {
                        self.resumed_into(None)?;
                    }
                    let open = self.open.get_or_insert_with(|| Open {
                        timestamp: header.timestamp(),
                        ..Open::default()
                    });
                    // Published before this stream was opened inside the transaction.
                    let skipped = open.skip.min(changes.len());
                    changes.drain(..skipped);
                    open.skip -= skipped;
                    if changes.is_empty() {
                        continue;
                    }
                    open.bytes += header.event_size() as usize;
                    open.changes.extend(changes);
                    if !limit.reached(open.changes.len(), open.bytes) {
                        continue;
                    }
                    let Some(gtid) = open.gtid.map(|g| g.to_string()) else {
                        // Without a GTID a later stream could not tell it
                        // is back in this transaction: it stays whole.
                        if !open.warned {
                            open.warned = true;
                            tracing::warn!(
                                changes = open.changes.len(),
                                "cdc: a transaction without GTID over cdc.batch_max_rows/batch_max_bytes is held whole"
                            );
                        }
                        continue;
                    };
                    let changes = std::mem::take(&mut open.changes);
                    let first_row = open.published;
                    open.published += changes.len();
                    let continues = BinlogPosition {
                        inside: Some(InsideTransaction {
                            gtid: gtid.clone(),
                            published: open.published as u64,
                        }),
                        ..open.start.clone()
                    };
                    return Ok(BinlogTransaction {
                        end: BinlogPosition {
                            file: self.file.clone(),
                            pos: u64::from(header.log_pos()),
                            gtid: Some(gtid.clone()),
                            server_id: Some(self.source_server),
                            gtid_state: render_gtid_state(&self.gtid_state),
                            inside: None,
                        },
                        gtid: Some(gtid),
                        xid: None,
                        timestamp: open.timestamp,
                        changes,
                        first_row,
                        bytes: std::mem::take(&mut open.bytes),
                        continues: Some(continues),
                        snapshot: None,
                    });
                }
                _ => {}
            }
        }
    }

    /// With `only`, reads only the captured tables' inserts: their updates
    /// and deletes are skipped undecoded, as the other tables' rows are. The
    /// log-based relay's own deletes of published rows are as many as its
    /// inserts; decoding their full images only to drop them cost it CPU
    /// per row.
    pub(crate) fn inserts_only(mut self, only: bool) -> Self {
        self.inserts_only = only;
        self
    }

    /// With `Some(columns)`, a change's row holds only those columns (the
    /// key's among them): the others are decoded from the row image but
    /// never rendered. The log-based relay reads five of the outbox's
    /// columns; building and dropping a JSON object of every column was a
    /// fifth of its CPU.
    pub(crate) fn columns_only(mut self, columns: Option<&'static [&'static str]>) -> Self {
        self.columns_only = columns;
        self
    }

    /// The changes of one rows event, if its table is captured.
    fn changes_of(&self, rows: &RowsEventData<'_>) -> Result<Vec<RowChange>, CdcError> {
        let insert = matches!(
            rows,
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_)
        );
        if self.inserts_only && !insert {
            return Ok(Vec::new());
        }
        let tme = self.stream.get_tme(rows.table_id()).ok_or_else(|| {
            CdcError::Source(format!(
                "rows event for table id {} without its table map",
                rows.table_id()
            ))
        })?;
        let (database, table) = (
            tme.database_name().into_owned(),
            tme.table_name().into_owned(),
        );
        if !self.tables.contains(&format!("{database}.{table}")) {
            return Ok(Vec::new());
        }
        let layout = match self.tables_described.layouts.get(&rows.table_id()) {
            Some(layout) => layout.clone(),
            // Not described (cannot happen: a table map comes first): the table map alone.
            None => std::sync::Arc::new(TableLayout::of(
                tme,
                &database,
                &table,
                &[],
                &Default::default(),
            )?),
        };
        let images = super::row_image::rows(rows, tme, &layout.columns.columns).map_err(|e| {
            CdcError::Source(format!("cannot decode a row of {database}.{table}: {e}"))
        })?;
        self.redaction
            .check_key(&database, &table, &layout.key)
            .map_err(CdcError::Setup)?;
        let redact = |row: &mut serde_json::Map<String, serde_json::Value>| {
            self.redaction.apply(&database, &table, row)
        };
        let mut changes = Vec::new();
        for (before, after) in images {
            let before = before.map(|r| layout.json(&r, self.columns_only));
            let after = after.map(|r| layout.json(&r, self.columns_only));
            // `old` from the values as stored (a masked column that changed
            // is in it, masked), then every image redacted, the key last.
            let (kind, mut data, mut old) = match (before, after) {
                (None, Some(after)) => (ChangeKind::Insert, after, None),
                (Some(before), Some(after)) => {
                    let old = changed_columns(&before, &after);
                    (ChangeKind::Update, after, Some(old))
                }
                (Some(before), None) => (ChangeKind::Delete, before, None),
                (None, None) => continue,
            };
            redact(&mut data);
            if let Some(old) = old.as_mut() {
                redact(old);
            }
            let old = old.map(serde_json::Value::Object);
            let key = layout.key(&data);
            changes.push(RowChange {
                database: database.clone(),
                table: table.clone(),
                kind,
                key,
                data: serde_json::Value::Object(data),
                old,
                columns: layout.columns.clone(),
            });
        }
        Ok(changes)
    }
}

/// A lookup's result: the connection (kept for the next), the collations
/// when they were asked for, the table's columns.
type Looked = (
    Conn,
    Option<std::collections::HashMap<u16, String>>,
    Vec<InformationSchemaColumn>,
);

/// Asks `information_schema` for `database.table`'s columns (and the
/// collations' charsets when `need_collations`), on `conn` or a new connection.
async fn lookup(
    url: String,
    conn: Option<Conn>,
    need_collations: bool,
    database: String,
    table: String,
) -> Result<Looked, CdcError> {
    let sql = |e: mysql_async::Error| {
        CdcError::Source(format!(
            "cannot read the columns of {database}.{table} from information_schema: {e}"
        ))
    };
    let mut conn = match conn {
        Some(conn) => conn,
        None => connect(&url).await?,
    };
    let collations = if need_collations {
        // MariaDB 10.10+ lists collations without an id too.
        let rows: Vec<(u16, String)> = conn
            .query(
                "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS \
                 WHERE ID IS NOT NULL AND CHARACTER_SET_NAME IS NOT NULL",
            )
            .await
            .map_err(sql)?;
        Some(rows.into_iter().collect())
    } else {
        None
    };
    let rows: Vec<mysql_async::Row> = conn
        .exec(INFORMATION_SCHEMA_QUERY, (&database, &table))
        .await
        .map_err(sql)?;
    let info = rows.iter().map(InformationSchemaColumn::from_row).collect();
    Ok((conn, collations, info))
}

/// A captured table as a table map describes it: its columns (refined by
/// `information_schema`) and its primary key.
struct TableLayout {
    database: String,
    table: String,
    columns: std::sync::Arc<TableColumns>,
    key: Vec<String>,
}

impl TableLayout {
    /// The layout of `tme`: names, primary key, types with their metadata,
    /// signedness, charsets and ENUM/SET labels from the table map
    /// (`binlog_row_metadata=FULL`), refined by `info` (the table's
    /// `information_schema.COLUMNS`: UUID, INET6, INET4, generated columns);
    /// `collations` names the charset of a collation id.
    fn of(
        tme: &TableMapEvent<'_>,
        database: &str,
        table: &str,
        info: &[InformationSchemaColumn],
        collations: &std::collections::HashMap<u16, String>,
    ) -> Result<Self, CdcError> {
        let mut names = Vec::new();
        let mut key_indexes = Vec::new();
        let (mut enum_labels, mut set_labels) = (Vec::new(), Vec::new());
        let bad =
            |e: std::io::Error| CdcError::Source(format!("table map of {database}.{table}: {e}"));
        for field in tme.iter_optional_meta() {
            match field.map_err(bad)? {
                OptionalMetadataField::ColumnName(columns) => {
                    for name in columns.iter_names() {
                        names.push(name.map_err(bad)?.name().into_owned());
                    }
                }
                OptionalMetadataField::SimplePrimaryKey(key) => {
                    for index in key.iter_indexes() {
                        key_indexes.push(index.map_err(bad)? as usize);
                    }
                }
                OptionalMetadataField::PrimaryKeyWithPrefix(key) => {
                    for k in key.iter_keys() {
                        key_indexes.push(k.map_err(bad)?.column_index() as usize);
                    }
                }
                OptionalMetadataField::EnumStrValue(values) => {
                    for labels in values.iter_values() {
                        let labels = labels.map_err(bad)?;
                        enum_labels.push(
                            labels
                                .values()
                                .iter()
                                .map(|l| l.value_raw().to_vec())
                                .collect::<Vec<_>>(),
                        );
                    }
                }
                OptionalMetadataField::SetStrValue(values) => {
                    for labels in values.iter_values() {
                        let labels = labels.map_err(bad)?;
                        set_labels.push(
                            labels
                                .values()
                                .iter()
                                .map(|l| l.value_raw().to_vec())
                                .collect::<Vec<_>>(),
                        );
                    }
                }
                _ => {}
            }
        }
        let count = tme.columns_count() as usize;
        if names.len() != count {
            return Err(CdcError::Source(format!(
                "the binlog's table map of {database}.{table} carries no column names: set binlog_row_metadata=FULL on the source"
            )));
        }
        let key: Vec<String> = key_indexes
            .iter()
            .filter_map(|&i| names.get(i).cloned())
            .collect();
        if key.is_empty() {
            return Err(CdcError::Source(format!(
                "{database}.{table} has no primary key in the binlog's table map"
            )));
        }
        let extractor =
            mysql_async::binlog::events::OptionalMetaExtractor::new(tme.iter_optional_meta())
                .map_err(bad)?;
        let mut unsigned = extractor.iter_signedness();
        let mut charsets = extractor.iter_charset();
        let mut enum_set_charsets = extractor.iter_enum_and_set_charset();
        let (mut enums, mut sets) = (enum_labels.into_iter(), set_labels.into_iter());
        let mut columns = Vec::with_capacity(count);
        for (i, name) in names.iter().enumerate() {
            let info = info.iter().find(|c| &c.name == name);
            let column_type = tme.get_column_type(i).ok().flatten();
            let meta = tme.get_column_metadata(i).unwrap_or(&[]);
            let unsigned = match column_type {
                Some(t) if t.is_numeric_type() => unsigned.next().unwrap_or(false),
                _ => false,
            };
            // The collation id of the table map, else information_schema's charset.
            let charset_of = |id: Option<Result<u16, std::io::Error>>| {
                id.and_then(Result::ok)
                    .and_then(|id| collations.get(&id))
                    .map(|name| Charset::named(name))
                    .or_else(|| info.and_then(|i| i.charset.as_deref()).map(Charset::named))
                    .unwrap_or(Charset::Binary)
            };
            let charset = match column_type {
                Some(t) if t.is_character_type() => Some(charset_of(charsets.next())),
                Some(t) if t.is_enum_or_set_type() => Some(charset_of(enum_set_charsets.next())),
                _ => None,
            };
            let kind = kind_of(column_type, meta, unsigned, charset, &mut enums, &mut sets);
            columns.push(
                Column {
                    name: name.clone(),
                    kind,
                    generated: None,
                }
                .refined(info),
            );
        }
        Ok(Self {
            database: database.to_string(),
            table: table.to_string(),
            columns: std::sync::Arc::new(TableColumns { columns }),
            key,
        })
    }

    /// The row as a JSON object: every column, or only those of `wanted`.
    fn json(
        &self,
        row: &[Option<mysql_async::Value>],
        wanted: Option<&[&str]>,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut object = serde_json::Map::new();
        for (column, value) in self.columns.columns.iter().zip(row) {
            // FULL row images hold every column; a missing one is left out rather than invented.
            if let Some(value) = value
                && wanted.is_none_or(|w| w.contains(&column.name.as_str()))
            {
                object.insert(column.name.clone(), column.json(value));
            }
        }
        object
    }

    fn key(&self, row: &serde_json::Map<String, serde_json::Value>) -> String {
        let null = serde_json::Value::Null;
        let values: Vec<&serde_json::Value> = self
            .key
            .iter()
            .map(|c| row.get(c).unwrap_or(&null))
            .collect();
        primary_key(&values)
    }
}

/// The kind of a table map column: its type and metadata bytes, the
/// signedness and charset of the optional metadata, and the next ENUM or
/// SET labels.
fn kind_of(
    column_type: Option<mysql_async::consts::ColumnType>,
    meta: &[u8],
    unsigned: bool,
    charset: Option<Charset>,
    enums: &mut impl Iterator<Item = Vec<Vec<u8>>>,
    sets: &mut impl Iterator<Item = Vec<Vec<u8>>>,
) -> Kind {
    use mysql_async::consts::ColumnType::*;
    let meta_at = |i: usize| meta.get(i).copied().unwrap_or(0);
    let charset = charset.unwrap_or(Charset::Binary);
    let Some(column_type) = column_type else {
        return Kind::Unknown;
    };
    match column_type {
        MYSQL_TYPE_TINY => Kind::Int { bits: 8, unsigned },
        MYSQL_TYPE_SHORT => Kind::Int { bits: 16, unsigned },
        MYSQL_TYPE_INT24 => Kind::Int { bits: 24, unsigned },
        MYSQL_TYPE_LONG => Kind::Int { bits: 32, unsigned },
        MYSQL_TYPE_LONGLONG => Kind::Int { bits: 64, unsigned },
        MYSQL_TYPE_NEWDECIMAL => Kind::Decimal {
            precision: meta_at(0),
            scale: meta_at(1),
        },
        MYSQL_TYPE_FLOAT => Kind::Float,
        MYSQL_TYPE_DOUBLE => Kind::Double,
        MYSQL_TYPE_BIT => Kind::Bit {
            bits: meta_at(1) * 8 + meta_at(0),
        },
        MYSQL_TYPE_YEAR => Kind::Year,
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => Kind::Date,
        MYSQL_TYPE_DATETIME => Kind::DateTime { fsp: 0 },
        MYSQL_TYPE_DATETIME2 => Kind::DateTime { fsp: meta_at(0) },
        MYSQL_TYPE_TIMESTAMP => Kind::Timestamp { fsp: 0 },
        MYSQL_TYPE_TIMESTAMP2 => Kind::Timestamp { fsp: meta_at(0) },
        MYSQL_TYPE_TIME => Kind::Time { fsp: 0 },
        MYSQL_TYPE_TIME2 => Kind::Time { fsp: meta_at(0) },
        MYSQL_TYPE_ENUM => Kind::Enum {
            labels: enums.next().unwrap_or_default(),
            charset,
        },
        MYSQL_TYPE_SET => Kind::Set {
            labels: sets.next().unwrap_or_default(),
            charset,
        },
        MYSQL_TYPE_STRING => match charset {
            Charset::Binary => Kind::Bytes {
                pad_to: Some(super::row_image::string_length(meta)),
            },
            charset => Kind::Text { charset },
        },
        MYSQL_TYPE_VARCHAR
        | MYSQL_TYPE_VAR_STRING
        | MYSQL_TYPE_BLOB
        | MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB => match charset {
            Charset::Binary => Kind::Bytes { pad_to: None },
            charset => Kind::Text { charset },
        },
        MYSQL_TYPE_GEOMETRY => Kind::Geometry,
        MYSQL_TYPE_JSON => Kind::Json,
        _ => Kind::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mariadb_gtid_event_payload_reads_as_domain_server_sequence() {
        // As captured from MariaDB 10.11: seq 0x11, domain 0, flags 0x0c, then padding.
        let payload = [
            0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0c, 0, 0, 0, 0, 0, 0,
        ];
        let gtid = MariadbGtid::parse(1, &payload).unwrap();
        assert_eq!(gtid.to_string(), "0-1-17");
        assert!(!gtid.is_standalone());
        // An ALTER TABLE's GTID: standalone | DDL | allow-parallel.
        let ddl = MariadbGtid::parse(1, &[0x14, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0x29]).unwrap();
        assert_eq!(ddl.to_string(), "2-1-20");
        assert!(ddl.is_standalone());
        assert_eq!(MariadbGtid::parse(1, &[1, 2, 3]), None);
    }

    #[test]
    fn a_gtid_position_is_the_last_gtid_of_every_domain_and_only_digits_and_dashes_pass() {
        let state = parse_gtid_state("0-1-18,7-2-3");
        assert_eq!(render_gtid_state(&state).as_deref(), Some("0-1-18,7-2-3"));
        assert!(is_gtid_state("0-1-18,7-2-3") && is_gtid_state("0-1-18"));
        for bad in ["", "0-1", "0-1-x", "0-1-1'; DROP TABLE t; --", "0-1-1,"] {
            assert!(!is_gtid_state(bad), "{bad}");
        }
        // Older checkpoints have only the last transaction's GTID.
        let old: BinlogPosition =
            serde_json::from_str(r#"{"file":"b.000001","pos":9,"gtid":"0-1-5"}"#).unwrap();
        assert_eq!(
            (old.server_id, old.resume_gtid_state()),
            (None, Some("0-1-5"))
        );
        let new = BinlogPosition {
            gtid_state: Some("0-1-5,1-1-2".into()),
            ..old
        };
        assert_eq!(new.resume_gtid_state(), Some("0-1-5,1-1-2"));
    }

    #[test]
    fn start_positions_parse_or_say_what_is_expected() {
        let p = BinlogPosition::parse("mariadb-bin.000002:1588").unwrap();
        assert_eq!((p.file.as_str(), p.pos), ("mariadb-bin.000002", 1588));
        assert!(
            BinlogPosition::parse("mariadb-bin.000002")
                .unwrap_err()
                .contains("FILE:POS")
        );
        assert!(
            BinlogPosition::parse("f:x")
                .unwrap_err()
                .contains("byte position")
        );
        assert!(BinlogPosition::parse(":10").is_err());
    }
}
