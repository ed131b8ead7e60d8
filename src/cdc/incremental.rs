//! Incremental snapshots (`orderpipe cdc snapshot start --table T`): a
//! table's rows read in primary-key chunks while the stream runs, each
//! chunk put into the stream where it belongs, so a consumer's last value
//! per key ends equal to the table. Debezium's incremental snapshot and
//! Maxwell's bootstrap answer the same need.
//!
//! **Where a chunk goes.** DBLog's watermark method brackets each chunk's
//! `SELECT` with a low and a high watermark written to a signal table, and
//! drops from the chunk every key the stream changes between the two,
//! because MySQL cannot say which binlog position a `SELECT` saw. MariaDB
//! can: `START TRANSACTION WITH CONSISTENT SNAPSHOT` reports the binlog
//! position its read view is consistent with (`binlog_snapshot_file` /
//! `_position`, what `mysqldump --single-transaction --master-data` uses).
//! So each chunk is read in its own consistent snapshot at position P, and
//! the two watermarks are that one exact position: the chunk goes into the
//! stream right after the last transaction that ends at or before P and
//! before the first that ends after it. Every change the chunk's rows saw
//! is before it on the topic, every change they did not see is after it,
//! so a chunk row can neither overwrite a newer change nor hide a delete,
//! and no key needs dropping. It writes nothing to the source: the same
//! method serves a read-only replica.
//!
//! **State.** The queue of tables, each with the key of its last row out,
//! and whether the snapshots are paused ([`SnapshotState`]), travel in the
//! checkpoint, in the Kafka transaction of the chunk's records: a SIGKILL
//! or a restart continues after the last chunk committed, and a chunk
//! that was read but not committed is read again.
//!
//! **Records** are `change = "read"`, event name `<db>.<table>.read`: the
//! router delivers them only to subscriptions of that routing key.
//!
//! **Signals** ([`crate::snapshot_signals`]) are read every second, applied
//! in order, and their last id kept in the state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::CdcError;
use super::binlog::{self, BinlogPosition, BinlogTransaction, RowChange};
use super::change::ChangeKind;
use super::checkpoint::{KeyPart, SnapshotState, TableProgress};
use super::redact::Redaction;
use super::snapshot::{TableRows, at_or_past, consistent_snapshot, prepare_session};
use crate::db::Db;
use crate::metrics::InternalEvent;
use crate::snapshot_signals::{self, Signal, SignalKind};

/// Metric: 1 while a snapshot is queued and not paused.
pub const RUNNING_METRIC: &str = "orderpipe_cdc_snapshot_running";
/// Metric: 1 while the snapshots are paused.
pub const PAUSED_METRIC: &str = "orderpipe_cdc_snapshot_paused";
/// Metric: rows published by incremental snapshots, by table.
pub const ROWS_METRIC: &str = "orderpipe_cdc_snapshot_rows_total";
/// Metric: chunks published, by table.
pub const CHUNKS_METRIC: &str = "orderpipe_cdc_snapshot_chunks_total";
/// Metric: rows still to read in the queue (from information_schema's
/// estimate of each table's size).
pub const REMAINING_METRIC: &str = "orderpipe_cdc_snapshot_remaining_rows";
/// Metric: seconds until the queue is done at this process's rate so far.
pub const ETA_METRIC: &str = "orderpipe_cdc_snapshot_eta_seconds";

/// How often the signals are read.
const SIGNAL_INTERVAL: Duration = Duration::from_secs(1);
/// How long the stream waits for one read (or write-back) of the signals:
/// they are read between its batches, so a control database that does not
/// answer must not hold the stream up.
const SIGNAL_TIMEOUT: Duration = Duration::from_millis(250);
/// How long after a failed read the signals are read again.
const SIGNAL_RETRY: Duration = Duration::from_secs(30);
/// How long the stream waits for one chunk's read before it goes on
/// without it (and tries again after [`RETRY_AFTER`]).
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a chunk that could not be read waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A chunk read and not yet in the stream.
struct Chunk {
    table: String,
    /// The binlog position its read is consistent with.
    at: BinlogPosition,
    changes: Vec<RowChange>,
    /// The key of its last row; `None`: the table has no row past the
    /// previous chunk's (this one is empty), its snapshot is done.
    last: Option<Vec<KeyPart>>,
}

/// The incremental snapshots of a running `cdc`: reads chunks, hands each
/// to the stream when the stream reaches its position, applies signals.
pub(crate) struct IncrementalSnapshots {
    source: String,
    url: String,
    chunk_rows: usize,
    /// The tables the stream captures: only those can be snapshotted.
    captured: Vec<String>,
    redaction: Arc<Redaction>,
    /// The control plane (`cdc_signals`); `None`: signals are not read.
    signals: Option<Db>,
    conn: Option<mysql_async::Conn>,
    /// As of the batch being built.
    state: SnapshotState,
    /// As of the last checkpoint committed.
    committed: SnapshotState,
    pending: Option<Chunk>,
    /// Since the last checkpoint: signals applied (id, outcome), and
    /// (table, rows) per chunk out, for the metrics.
    applied: Vec<(i64, String)>,
    out: Vec<(String, u64)>,
    next_poll: Instant,
    /// The last read of the signals failed (warned once).
    signals_failing: bool,
    /// No chunk is read before this (after a failed read).
    retry_at: Instant,
    /// Rows committed by this process, and since when: the ETA's rate.
    rate: (u64, Instant),
}

impl IncrementalSnapshots {
    /// The snapshots of `source` (reading from `url`), resumed from `state`.
    pub(crate) fn new(
        cdc: &super::CdcSettings,
        url: &str,
        redaction: Arc<Redaction>,
        state: Option<SnapshotState>,
        signals: Option<Db>,
    ) -> Self {
        let state = state.unwrap_or_default();
        let now = Instant::now();
        let snapshots = Self {
            source: cdc.name.clone(),
            url: url.to_string(),
            chunk_rows: cdc.snapshot_chunk_rows,
            captured: cdc.tables.clone(),
            redaction,
            signals,
            conn: None,
            committed: state.clone(),
            state,
            pending: None,
            applied: Vec::new(),
            out: Vec::new(),
            next_poll: now,
            signals_failing: false,
            retry_at: now,
            rate: (0, now),
        };
        snapshots.gauges();
        snapshots
    }

    /// The state to checkpoint; `None` while nothing was ever signalled.
    pub(crate) fn persisted(&self) -> Option<SnapshotState> {
        (self.state != SnapshotState::default()).then(|| self.state.clone())
    }

    /// Reads the signals when a second has passed since the last read, and
    /// applies them; whether the state changed (a checkpoint is then due).
    pub(crate) async fn poll_signals(&mut self) -> bool {
        let Some(db) = self
            .signals
            .as_ref()
            .filter(|_| Instant::now() >= self.next_poll)
        else {
            return false;
        };
        self.next_poll = Instant::now() + SIGNAL_INTERVAL;
        let read = tokio::time::timeout(
            SIGNAL_TIMEOUT,
            snapshot_signals::after(db, &self.source, self.state.last_signal),
        )
        .await;
        let signals = match read {
            Ok(Ok(signals)) => signals,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {} ms", SIGNAL_TIMEOUT.as_millis()),
                };
                self.next_poll = Instant::now() + SIGNAL_RETRY;
                // Once per outage: the stream does not depend on it.
                if !std::mem::replace(&mut self.signals_failing, true) {
                    tracing::warn!(source = %self.source, %error, retry_in_s = SIGNAL_RETRY.as_secs(), "cdc: snapshot signals (cdc_signals in database.url) not read; the stream goes on (orderpipe migrate?)");
                }
                return false;
            }
        };
        if std::mem::replace(&mut self.signals_failing, false) {
            tracing::info!(source = %self.source, "cdc: snapshot signals read again");
        }
        for signal in &signals {
            let outcome = self.apply(signal);
            SignalApplied {
                source: &self.source,
                signal,
                outcome: &outcome,
            }
            .emit();
            self.applied.push((signal.id, outcome));
        }
        !signals.is_empty()
    }

    /// Applies one signal to the state; what became of it.
    fn apply(&mut self, signal: &Signal) -> String {
        self.state.last_signal = self.state.last_signal.max(signal.id);
        let kind = match SignalKind::parse(&signal.kind) {
            Ok(kind) => kind,
            Err(e) => return format!("refused: {e}"),
        };
        let tables = match signal.tables() {
            Ok(tables) => tables,
            Err(e) => return format!("refused: {e}"),
        };
        match kind {
            SignalKind::Start => {
                if tables.is_empty() {
                    return "refused: execute-snapshot names no table (data-collections)".into();
                }
                if let Some(t) = tables.iter().find(|t| !self.captured.contains(t)) {
                    return format!(
                        "refused: {t} is not captured by this source (it captures {})",
                        self.captured.join(", ")
                    );
                }
                let mut queued = Vec::new();
                for table in tables {
                    if self.state.tables.iter().any(|t| t.table == table) {
                        continue;
                    }
                    self.state.tables.push(TableProgress {
                        table: table.clone(),
                        started_at: crate::envelope::format_utc(&chrono::Utc::now()),
                        after: None,
                        rows: 0,
                        chunks: 0,
                        estimate: 0,
                    });
                    queued.push(table);
                }
                match queued.is_empty() {
                    true => "already queued".into(),
                    false => format!("queued {}", queued.join(", ")),
                }
            }
            SignalKind::Stop => {
                let before = self.state.tables.len();
                self.state
                    .tables
                    .retain(|t| !tables.is_empty() && !tables.contains(&t.table));
                if self
                    .pending
                    .as_ref()
                    .is_some_and(|c| !self.state.tables.iter().any(|t| t.table == c.table))
                {
                    self.pending = None;
                }
                format!("stopped {} snapshot(s)", before - self.state.tables.len())
            }
            SignalKind::Pause => {
                self.state.paused = true;
                "paused".into()
            }
            SignalKind::Resume => {
                self.state.paused = false;
                "resumed".into()
            }
        }
    }

    /// Whether a chunk should be read now.
    pub(crate) fn wants_chunk(&self) -> bool {
        self.pending.is_none()
            && !self.state.paused
            && !self.state.tables.is_empty()
            && Instant::now() >= self.retry_at
    }

    /// Reads the next chunk of the first queued table in a consistent
    /// snapshot. A failure is logged and tried again later, the stream
    /// going on meanwhile; a table that cannot be snapshotted (gone, no
    /// primary key, rules that drop a key column) leaves the queue, and
    /// then the state changed: whether it did.
    pub(crate) async fn read_chunk(&mut self) -> bool {
        let Some(progress) = self.state.tables.first().cloned() else {
            return false;
        };
        let read = tokio::time::timeout(CHUNK_TIMEOUT, self.try_read_chunk(&progress))
            .await
            .unwrap_or_else(|_| {
                Err(CdcError::Source(format!(
                    "no chunk within {} s",
                    CHUNK_TIMEOUT.as_secs()
                )))
            });
        match read {
            Ok(chunk) => {
                self.pending = Some(chunk);
                false
            }
            Err(e @ CdcError::Setup(_)) => {
                self.state.tables.remove(0);
                tracing::error!(source = %self.source, table = %progress.table, error = %e, "cdc: the table cannot be snapshotted; it leaves the queue");
                true
            }
            Err(e) => {
                self.conn = None;
                self.retry_at = Instant::now() + RETRY_AFTER;
                tracing::warn!(source = %self.source, table = %progress.table, error = %e, retry_in_s = RETRY_AFTER.as_secs(), "cdc: a snapshot chunk could not be read; the stream goes on");
                false
            }
        }
    }

    async fn try_read_chunk(&mut self, progress: &TableProgress) -> Result<Chunk, CdcError> {
        let sql =
            |e: mysql_async::Error| CdcError::Source(format!("chunk of {}: {e}", progress.table));
        if self.conn.is_none() {
            let mut conn = binlog::connect(&self.url).await?;
            prepare_session(&mut conn).await?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        // Described for each chunk: a column added or dropped while the
        // snapshot runs is in the next chunk as it is in the stream.
        let rows = TableRows::describe(conn, &progress.table, &self.redaction).await?;
        if rows.key_columns().is_empty() {
            return Err(CdcError::Setup(format!(
                "{} has no primary key: an incremental snapshot reads by key (cdc snapshot --blocking reads it whole)",
                progress.table
            )));
        }
        if progress.estimate == 0 {
            let (db, name) = progress.table.split_once('.').expect("db.table");
            let estimate: Option<u64> = conn
                .exec_first(
                    "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (db, name),
                )
                .await
                .map_err(sql)?;
            if let Some(first) = self.state.tables.first_mut() {
                first.estimate = estimate.unwrap_or(0).max(1);
            }
        }
        let at = consistent_snapshot(conn).await?;
        let after: Option<Vec<Value>> = progress
            .after
            .as_ref()
            .map(|parts| parts.iter().map(KeyPart::value).collect());
        let read = rows.chunk(conn, after.as_deref(), self.chunk_rows).await;
        let _ = conn.query_drop("COMMIT").await;
        let read = read.map_err(sql)?;
        let last = read
            .last()
            .map(|row| rows.key_of(row).iter().map(KeyPart::of).collect());
        Ok(Chunk {
            table: progress.table.clone(),
            at,
            changes: read
                .iter()
                .map(|row| rows.change(row, ChangeKind::Read, &self.redaction))
                .collect(),
            last,
        })
    }

    /// The pending chunk, when `next` (a transaction or piece the stream
    /// read) ends past its position: it goes before `next`, at `read_to`.
    pub(crate) fn before(
        &mut self,
        next: &BinlogTransaction,
        read_to: &BinlogPosition,
    ) -> Option<BinlogTransaction> {
        let past = self
            .pending
            .as_ref()
            .is_some_and(|c| !at_or_past(&c.at, &next.end));
        past.then(|| self.emit(read_to))
    }

    /// The pending chunk, when the stream has read up to its position
    /// (`read_to`, the end of the last whole transaction read).
    pub(crate) fn reached(&mut self, read_to: &BinlogPosition) -> Option<BinlogTransaction> {
        let reached = self
            .pending
            .as_ref()
            .is_some_and(|c| at_or_past(read_to, &c.at));
        reached.then(|| self.emit(read_to))
    }

    /// The pending chunk as a transaction of the stream at `read_to`; the
    /// state moves past it.
    fn emit(&mut self, read_to: &BinlogPosition) -> BinlogTransaction {
        let chunk = self.pending.take().expect("a chunk is pending");
        let progress = self
            .state
            .tables
            .first_mut()
            .filter(|t| t.table == chunk.table)
            .expect("stopping a table drops its pending chunk");
        let id = format!(
            "snapshot:{}:{}:{}",
            progress.table, progress.started_at, progress.chunks
        );
        progress.rows += chunk.changes.len() as u64;
        progress.chunks += 1;
        self.out
            .push((chunk.table.clone(), chunk.changes.len() as u64));
        match chunk.last {
            Some(last) => progress.after = Some(last),
            None => {
                let done = self.state.tables.remove(0);
                tracing::info!(source = %self.source, table = %done.table, rows = done.rows, chunks = done.chunks, "cdc: incremental snapshot done");
            }
        }
        BinlogTransaction {
            end: read_to.clone(),
            timestamp: chrono::Utc::now().timestamp() as u32,
            changes: chunk.changes,
            snapshot: Some(id),
            ..BinlogTransaction::default()
        }
    }

    /// After a checkpoint with [`Self::persisted`] committed: the state is
    /// durable, the metrics count it, the signals' rows say what became of them.
    pub(crate) async fn committed(&mut self) {
        self.committed = self.state.clone();
        for (table, rows) in self.out.drain(..) {
            counter!(ROWS_METRIC, "table" => table.clone()).increment(rows);
            counter!(CHUNKS_METRIC, "table" => table).increment(1);
            self.rate.0 += rows;
        }
        self.gauges();
        if let Some(db) = &self.signals {
            for (id, outcome) in self.applied.drain(..) {
                let written = tokio::time::timeout(
                    SIGNAL_TIMEOUT,
                    snapshot_signals::applied(db, id, &outcome),
                )
                .await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::warn!(id, %outcome, "cdc: a signal's outcome not written to cdc_signals (it is applied)");
                }
            }
        }
    }

    /// After the stream restarted from the last checkpoint: what was not
    /// committed is undone (its chunk is read again, its signals applied again).
    pub(crate) fn reset(&mut self) {
        self.state = self.committed.clone();
        self.pending = None;
        self.applied.clear();
        self.out.clear();
    }

    fn gauges(&self) {
        let running = !self.state.tables.is_empty() && !self.state.paused;
        gauge!(RUNNING_METRIC).set(f64::from(u8::from(running)));
        gauge!(PAUSED_METRIC).set(f64::from(u8::from(self.state.paused)));
        let remaining: u64 = self
            .state
            .tables
            .iter()
            .map(|t| t.estimate.saturating_sub(t.rows))
            .sum();
        gauge!(REMAINING_METRIC).set(remaining as f64);
        let elapsed = self.rate.1.elapsed().as_secs_f64();
        let eta = match (running, self.rate.0) {
            (false, _) | (true, 0) => 0.0,
            (true, done) => remaining as f64 * elapsed / done as f64,
        };
        gauge!(ETA_METRIC).set(eta);
    }
}

/// A signal applied, logged (the counter is the rows' metrics).
struct SignalApplied<'a> {
    source: &'a str,
    signal: &'a Signal,
    outcome: &'a str,
}

impl InternalEvent for SignalApplied<'_> {
    fn emit(self) {
        tracing::info!(
            source = self.source,
            id = self.signal.id,
            signal = %self.signal.kind,
            data = %self.signal.data,
            by = %self.signal.requested_by,
            outcome = self.outcome,
            "cdc: snapshot signal applied"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshots(tables: &[&str]) -> IncrementalSnapshots {
        let mut cdc = crate::config::Settings::default().cdc;
        cdc.tables = tables.iter().map(|t| t.to_string()).collect();
        IncrementalSnapshots::new(&cdc, "mysql://x", Arc::default(), None, None)
    }

    fn signal(id: i64, kind: &str, tables: &[&str]) -> Signal {
        Signal {
            id,
            source: "s".into(),
            kind: kind.into(),
            data: serde_json::json!({ "data-collections": tables }).to_string(),
            requested_by: "test".into(),
            created_at_ms: 0,
            applied_at_ms: None,
            outcome: None,
        }
    }

    fn position(pos: u64) -> BinlogPosition {
        BinlogPosition {
            file: "mariadb-bin.000001".into(),
            pos,
            ..BinlogPosition::default()
        }
    }

    #[test]
    fn signals_queue_pause_resume_and_stop_and_refuse_what_is_not_captured() {
        let mut s = snapshots(&["shop.a", "shop.b"]);
        assert_eq!(s.persisted(), None, "nothing to checkpoint yet");
        assert_eq!(
            s.apply(&signal(1, "execute-snapshot", &["shop.a", "shop.b"])),
            "queued shop.a, shop.b"
        );
        assert_eq!(
            s.apply(&signal(2, "execute-snapshot", &["shop.a"])),
            "already queued"
        );
        let refused = s.apply(&signal(3, "execute-snapshot", &["shop.c"]));
        assert!(
            refused.starts_with("refused: shop.c is not captured"),
            "{refused}"
        );
        assert!(s.wants_chunk());
        s.apply(&signal(4, "pause-snapshot", &[]));
        assert!(!s.wants_chunk(), "paused");
        s.apply(&signal(5, "resume-snapshot", &[]));
        assert!(s.wants_chunk());
        assert_eq!(
            s.apply(&signal(6, "stop-snapshot", &["shop.a"])),
            "stopped 1 snapshot(s)"
        );
        let bad = s.apply(&signal(7, "snapshot-now", &[]));
        assert!(bad.contains("execute-snapshot"), "{bad}");
        let state = s.persisted().unwrap();
        assert_eq!(state.last_signal, 7, "every signal counts as applied once");
        assert_eq!(
            state
                .tables
                .iter()
                .map(|t| t.table.as_str())
                .collect::<Vec<_>>(),
            ["shop.b"]
        );
        assert_eq!(
            s.apply(&signal(8, "stop-snapshot", &[])),
            "stopped 1 snapshot(s)",
            "no table named: all of them"
        );
        assert!(!s.wants_chunk());
    }

    #[tokio::test]
    async fn a_chunk_goes_into_the_stream_at_its_position_and_the_state_moves_past_it() {
        let mut s = snapshots(&["shop.a"]);
        s.apply(&signal(1, "execute-snapshot", &["shop.a"]));
        s.committed().await;
        let pending = |last| Chunk {
            table: "shop.a".into(),
            at: position(500),
            changes: Vec::new(),
            last,
        };
        s.pending = Some(pending(Some(vec![KeyPart::Int(10)])));
        let tx = |end| BinlogTransaction {
            end: position(end),
            ..BinlogTransaction::default()
        };
        // Transactions the chunk's read saw come first.
        assert!(s.before(&tx(400), &position(300)).is_none());
        assert!(s.before(&tx(500), &position(400)).is_none());
        assert!(s.reached(&position(400)).is_none());
        // The stream at its position: out, at the stream's position.
        let out = s.reached(&position(500)).unwrap();
        assert_eq!(out.end, position(500));
        assert!(
            out.snapshot
                .as_deref()
                .unwrap()
                .starts_with("snapshot:shop.a:")
        );
        assert_eq!(s.state.tables[0].after, Some(vec![KeyPart::Int(10)]));
        assert_eq!(s.state.tables[0].chunks, 1);
        // A transaction past its position: the chunk goes before it.
        s.pending = Some(pending(None));
        let out = s.before(&tx(600), &position(480)).unwrap();
        assert_eq!(out.end, position(480));
        assert!(s.state.tables.is_empty(), "an empty chunk ends the table");
        // A reconnect undoes what was not committed.
        s.reset();
        assert_eq!(s.state.tables.len(), 1);
        assert_eq!(s.state.tables[0].after, None);
    }

    /// A control database that does not answer (a blackhole address)
    /// holds the stream up for at most the timeout, then not for a while.
    #[tokio::test]
    async fn signals_that_cannot_be_read_hold_the_stream_up_for_the_timeout_only() {
        let mut cdc = crate::config::Settings::default().cdc;
        cdc.tables = vec!["shop.a".into()];
        // TEST-NET-1: routed nowhere, so a connect waits rather than fails.
        let db = crate::db::Db::connect(
            &crate::db::DatabaseSettings {
                url: "mysql://u:p@192.0.2.1:3306/x".to_string().into(),
                max_connections: Some(1),
            },
            1,
        )
        .unwrap();
        let mut s = IncrementalSnapshots::new(&cdc, "mysql://x", Arc::default(), None, Some(db));
        let started = Instant::now();
        assert!(!s.poll_signals().await);
        let waited = started.elapsed();
        // Without the timeout: the pool's 5 s acquire timeout, every second.
        assert!(waited < SIGNAL_TIMEOUT * 4, "{waited:?}");
        let again = Instant::now();
        assert!(!s.poll_signals().await);
        assert!(again.elapsed() < Duration::from_millis(50), "backed off");
        assert!(s.next_poll > Instant::now() + SIGNAL_RETRY / 2);
    }

    #[test]
    fn key_parts_bind_back_to_the_values_they_were_read_from() {
        for value in [
            Value::Int(-5),
            Value::UInt(u64::MAX),
            Value::Bytes(b"k\x00\xff".to_vec()),
        ] {
            assert_eq!(KeyPart::of(&value).value(), value);
        }
        assert_eq!(
            KeyPart::of(&Value::Date(2026, 12, 4, 1, 2, 3, 4)).value(),
            Value::Bytes(b"2026-12-04 01:02:03.000004".to_vec())
        );
        let json = serde_json::to_string(&KeyPart::Hex("6b".into())).unwrap();
        assert_eq!(json, r#"{"hex":"6b"}"#);
    }
}
