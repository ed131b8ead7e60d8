//! `orderpipe relay` with `outbox.source = "binlog"`: the outbox read from
//! the database's log instead of by queries.
//!
//! The polling relay ([`super::relay`]) claims unsent rows with a query and
//! marks each batch sent with an update: every row is written, read and
//! written again. This relay reads the inserts of `outbox_messages` from
//! the binlog through `cdc`'s reader and publisher
//! ([`crate::cdc::run_with`]) and turns each into the record the polling
//! relay would write for it ([`OutboxRecords`]): the same topic, key,
//! headers and value, byte for byte. Nothing is claimed and nothing marked.
//!
//! - **Exactly once**: as `cdc`, each Kafka transaction carries its records
//!   and the checkpoint (the binlog position after them) to
//!   `outbox.offsets_topic`; a restart resumes from the last committed one
//!   after `init_transactions` aborted what the previous process left open.
//! - **Order**: the binlog is in commit order, so a row committed late is
//!   read late; one order's events are published in the order their
//!   transactions committed. Resume by GTID (a failover of the database)
//!   works as `cdc`'s.
//! - **One active reader per source**: the relay holds a lease
//!   (`relay_source_leases`, renewed every third of `lease_ttl`) before it
//!   reads; a standby waits for the lease to expire. The lease is the
//!   orderly hand-over; fencing by `transactional.id` (`<prefix>-cdc-<name>`)
//!   is what makes a zombie's commit fail, whatever the lease says.
//! - **The table stays small**: after each Kafka commit, the published rows
//!   are deleted by id, in bounded statements, off the publishing path
//!   ([`Cleaner`]). A row deleted is still in the binlog, so a delete can
//!   never lose an event; a crash between commit and delete leaves a few
//!   published rows behind, which [`Cleaner`]'s sweep removes once they are
//!   older than `--sent-retention`.
//!
//! Updates and deletes of outbox rows (the cleanup's own deletes among
//! them) are read and skipped. A row whose record is over its topic's limit
//! is dead-lettered in the batch's transaction, as the polling relay does;
//! the later rows of its order are not held behind it (the log is read
//! once), see docs/relay.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use metrics::{counter, gauge};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::dead_letter::DeadRow;
use super::limits::Limits;
use super::relay::{RelayError, topic_codecs};
use crate::cdc::binlog::{BinlogPosition, BinlogTransaction, RowChange};
use crate::cdc::change::ChangeKind;
use crate::cdc::{CdcError, CdcOptions, CdcSections, Outgoing, RowRecords};
use crate::codec::Codec;
use crate::db::{Db, DbError};
use crate::envelope::Envelope;
use crate::health::HealthState;
use crate::metrics::name;
use crate::stages::StageTimes;

/// The outbox table the relay reads.
pub const TABLE: &str = "outbox_messages";

/// The readiness of a log-based relay: `cdc`'s (binlog stream open,
/// producer initialised) once it holds the lease. A standby that reaches
/// the database is ready too: waiting is its job, and a rolling update
/// must be able to start it while the old pod still holds the lease
/// (`orderpipe_relay_source_active` says which one reads).
pub fn health() -> Arc<HealthState> {
    crate::cdc::health()
}

/// Unsent rows a first start publishes from the table, in one Kafka
/// transaction; a larger backlog is the polling relay's to drain first.
pub const BACKLOG_MAX: usize = 50_000;

/// Published rows deleted per statement.
const DELETE_CHUNK: usize = 1000;

/// The configuration sections the log-based relay reads
/// ([`crate::startup::log_relay_sections`] picks them out of the settings).
#[derive(Clone, Copy)]
pub struct LogRelaySections<'a> {
    /// The polling relay's sections: Kafka, producer, registry, topics.
    pub relay: super::relay::RelaySections<'a>,
    /// `[outbox]`: the source's name, server id and offsets topic.
    pub outbox: &'a super::OutboxSettings,
    /// `[cdc]`: the batch bounds of the binlog reader.
    pub cdc: &'a crate::cdc::CdcSettings,
    /// `database.url`: the outbox's database, read as a replica.
    pub database_url: &'a SecretString,
}

/// How `orderpipe relay --source binlog` runs.
#[derive(Debug, Clone)]
pub struct LogRelayOptions {
    /// Name of this instance in the lease (the pod name).
    pub instance: String,
    /// Prefix of the `transactional.id` (`<prefix>-cdc-<outbox.binlog_name>`).
    pub transactional_id_prefix: String,
    /// Lease lifetime; renewed every third of it.
    pub lease_ttl: Duration,
    /// Published rows left behind by a crash are swept once this old.
    pub sent_retention: Duration,
    /// Where to start when the source has no checkpoint yet (default: the
    /// binlog's current end).
    pub start_position: Option<BinlogPosition>,
    /// Where the run reports its readiness.
    pub health: Option<Arc<HealthState>>,
    /// Stop once nothing was published for this long (benchmarks, backfills).
    pub until_idle: Option<Duration>,
}

/// What a run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct LogRelaySummary {
    /// Outbox rows published.
    pub published: u64,
    /// Outbox rows dead-lettered (over the record limit).
    pub dead_lettered: u64,
    /// Kafka transactions committed.
    pub transactions: u64,
    /// Published rows deleted from the table.
    pub deleted: u64,
    /// Seconds from the first Kafka commit to the last.
    pub active_secs: f64,
    /// Where the relay resumed.
    pub started_at: Option<BinlogPosition>,
    /// The last committed checkpoint.
    pub checkpoint: Option<BinlogPosition>,
    /// Milliseconds per batch in each stage, as `cdc` times them.
    pub stages_ms: BTreeMap<String, StageTimes>,
}

/// Why the log-based relay stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum LogRelayError {
    /// The binlog reader or the Kafka transactions.
    #[error(transparent)]
    Cdc(#[from] CdcError),
    /// Codecs and limits of the topics.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The lease table.
    #[error("lease: {0}")]
    Db(#[from] DbError),
    /// Another instance took the lease: this one stops reading (the
    /// orchestrator restarts it as a standby).
    #[error("the lease of outbox source {name} was taken by {owner}; stopping")]
    LeaseLost {
        /// The source name.
        name: String,
        /// Who holds it now.
        owner: String,
    },
}

/// Whether the database allows the log-based relay: binlog settings as
/// `cdc` needs them, the outbox table, and the right to read the binlog's
/// position. `Err` says what is missing.
pub async fn binlog_usable(database_url: &SecretString) -> Result<(), String> {
    let url = database_url.expose_secret();
    let table = outbox_table(url).map_err(|e| e.to_string())?;
    let mut conn = crate::cdc::binlog::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    crate::cdc::binlog::check_source(&mut conn, &[table])
        .await
        .map_err(|e| e.to_string())?;
    crate::cdc::binlog::current_position(&mut conn)
        .await
        .map_err(|e| format!("{e} (the relay's user needs REPLICATION SLAVE and REPLICATION CLIENT / BINLOG MONITOR)"))?;
    Ok(())
}

/// `<database>.outbox_messages` of `database.url`.
fn outbox_table(url: &str) -> Result<String, CdcError> {
    let opts = mysql_async::Opts::from_url(url)
        .map_err(|e| CdcError::Setup(format!("database.url: not a mysql:// URL: {e}")))?;
    let db = opts.db_name().ok_or_else(|| {
        CdcError::Setup("database.url names no database: the outbox table's database is needed to read its inserts from the binlog".into())
    })?;
    Ok(format!("{db}.{TABLE}"))
}

/// The `[cdc]` settings the relay runs `cdc`'s reader with: the outbox
/// table of `database.url`, the `[outbox]` name, server id and offsets
/// topic; batch bounds as `[cdc]` has them.
fn cdc_settings(sections: &LogRelaySections<'_>) -> Result<crate::cdc::CdcSettings, CdcError> {
    let outbox = sections.outbox;
    Ok(crate::cdc::CdcSettings {
        name: outbox.binlog_name.clone(),
        source: None,
        server_id: outbox.binlog_server_id,
        tables: vec![outbox_table(sections.database_url.expose_secret())?],
        source_name: None,
        offsets_topic: outbox.offsets_topic.clone(),
        dead_letter_topic: Some(sections.relay.topics.dead_letter.name.clone()),
        ..sections.cdc.clone()
    })
}

/// Runs the log-based relay until `shutdown` (then publishes what it read
/// and returns) or an error stops it. A standby waits for the lease first.
pub async fn run(
    sections: LogRelaySections<'_>,
    db: Db,
    options: LogRelayOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<LogRelaySummary, LogRelayError> {
    let cdc = cdc_settings(&sections)?;
    let relay = sections.relay;
    let mut shutdown = std::pin::pin!(shutdown);
    let lease = Lease {
        db: db.clone(),
        source: cdc.name.clone(),
        owner: options.instance.clone(),
        ttl: options.lease_ttl,
    };
    let set_ready = |unmet: Option<String>| {
        if let Some(health) = &options.health {
            for condition in [crate::cdc::READY_BINLOG, crate::cdc::READY_PRODUCER] {
                health.set_condition(condition, unmet.clone());
            }
        }
    };
    gauge!(name::RELAY_SOURCE_ACTIVE).set(0.0);
    let mut announced = false;
    // A standby: wait for the lease (ready meanwhile, see [`health`]).
    loop {
        match lease.take().await {
            Ok(None) => break,
            Ok(Some(holder)) => {
                set_ready(None);
                if !announced {
                    eprintln!(
                        "relay {}: standby; the lease of outbox source {} is held by {holder}",
                        options.instance, cdc.name
                    );
                    announced = true;
                }
            }
            Err(e) => set_ready(Some(format!("cannot read the source lease: {e}"))),
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(LogRelaySummary::default()),
            _ = tokio::time::sleep(options.lease_ttl / 3) => {}
        }
    }
    gauge!(name::RELAY_SOURCE_ACTIVE).set(1.0);
    eprintln!(
        "relay {}: holding the lease of outbox source {}; reading {} from the binlog",
        options.instance, cdc.name, cdc.tables[0]
    );
    let (lost_tx, mut lost) = watch::channel(None::<String>);
    let renewer = tokio::spawn(lease.clone().keep(lost_tx));
    let cleaner = Cleaner::start(db.clone(), options.sent_retention);
    let records = OutboxRecords::new(relay, cleaner.ids.clone()).await?;
    let counts = records.counts.clone();
    let producer = crate::producer::ProducerSettings {
        transactional_id_prefix: options.transactional_id_prefix.clone(),
        ..relay.producer.clone()
    };
    let cdc_sections = CdcSections {
        cdc: &cdc,
        kafka: relay.kafka,
        producer: &producer,
        registry: relay.registry,
        database_url: sections.database_url,
    };
    let cdc_options = CdcOptions {
        start_position: options.start_position.clone(),
        health: options.health.clone(),
    };
    let idle = counts.clone().idle(options.until_idle);
    let stop = async {
        tokio::select! {
            _ = &mut shutdown => {}
            _ = lost.wait_for(|l| l.is_some()) => {}
            _ = idle => {}
        }
    };
    let result =
        crate::cdc::run_with(cdc_sections, cdc_options, Some(Box::new(records)), stop).await;
    renewer.abort();
    let deleted = cleaner.finish().await;
    let taken_by = lost.borrow().clone();
    if let Some(owner) = taken_by {
        return Err(LogRelayError::LeaseLost {
            name: cdc.name,
            owner,
        });
    }
    lease.release().await;
    let summary = result?;
    Ok(LogRelaySummary {
        published: counts.published.load(Ordering::Relaxed),
        dead_lettered: counts.dead_lettered.load(Ordering::Relaxed),
        transactions: summary.kafka_transactions,
        deleted,
        active_secs: counts.active_secs(),
        started_at: summary.started_at,
        checkpoint: summary.checkpoint,
        stages_ms: summary.stages_ms,
    })
}

/// Rows published and dead-lettered so far, and when (read at exit).
#[derive(Debug, Default)]
struct Counts {
    published: AtomicU64,
    dead_lettered: AtomicU64,
    /// Milliseconds since the epoch of the first and the last commit of
    /// rows (0: none yet).
    first_ms: AtomicU64,
    last_ms: AtomicU64,
    /// When the first checkpoint committed (the stream is about to open).
    started_ms: AtomicU64,
}

impl Counts {
    /// After a Kafka commit of `published` and `dead` rows.
    fn committed(&self, published: usize, dead: usize) {
        let _ = self.started_ms.compare_exchange(
            0,
            crate::clock::now_ms() as u64,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if published + dead == 0 {
            // A checkpoint of other tables' transactions only.
            return;
        }
        let now = crate::clock::now_ms() as u64;
        self.published
            .fetch_add(published as u64, Ordering::Relaxed);
        self.dead_lettered.fetch_add(dead as u64, Ordering::Relaxed);
        let _ = self
            .first_ms
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn active_secs(&self) -> f64 {
        let first = self.first_ms.load(Ordering::Relaxed);
        self.last_ms.load(Ordering::Relaxed).saturating_sub(first) as f64 / 1000.0
    }

    /// Resolves once nothing was committed for `limit` since the first
    /// checkpoint (never without a limit).
    async fn idle(self: Arc<Self>, limit: Option<Duration>) {
        let Some(limit) = limit else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = self.started_ms.load(Ordering::Relaxed);
            let last = self.last_ms.load(Ordering::Relaxed).max(started);
            if started > 0 && crate::clock::now_ms() as u64 >= last + limit.as_millis() as u64 {
                return;
            }
        }
    }
}

/// Turns the outbox table's inserts into the polling relay's records
/// ([`RowRecords`] of `cdc`'s publisher).
struct OutboxRecords {
    /// Per topic an outbox row may name.
    codecs: BTreeMap<String, Codec>,
    limits: Arc<Limits>,
    dead_letter_topic: String,
    /// The published rows' ids, for the [`Cleaner`].
    cleanup: mpsc::UnboundedSender<Vec<i64>>,
    counts: Arc<Counts>,
    /// Rows of the batch being built that became dead letters.
    dead: BTreeSet<i64>,
}

/// An outbox insert's columns, as the binlog gives them (borrowed from the
/// change: the relay reads every row twice, to build its record and to
/// count and delete it once committed, and copies neither time).
struct OutboxRow<'c> {
    id: i64,
    topic: &'c str,
    key: &'c str,
    event_name: &'c str,
    envelope: &'c str,
}

impl<'c> OutboxRow<'c> {
    /// The outbox columns a row is built from (the binlog reader renders no others).
    const COLUMNS: [&'static str; 5] = ["id", "topic", "message_key", "event_name", "envelope"];

    /// The row of an insert of the outbox table; `None` for any other change.
    fn of(change: &'c RowChange) -> Option<Result<Self, String>> {
        if change.kind != ChangeKind::Insert || change.table != TABLE {
            return None;
        }
        let text = |column: &str| {
            change.data[column]
                .as_str()
                .ok_or_else(|| format!("column {column} is not text"))
        };
        Some((|| {
            Ok(Self {
                id: change.data["id"]
                    .as_i64()
                    .ok_or("column id is not an integer")?,
                topic: text("topic")?,
                key: text("message_key")?,
                event_name: text("event_name")?,
                envelope: text("envelope")?,
            })
        })())
    }
}

impl OutboxRecords {
    async fn new(
        sections: super::relay::RelaySections<'_>,
        cleanup: mpsc::UnboundedSender<Vec<i64>>,
    ) -> Result<Self, RelayError> {
        let options = crate::producer::transactional::options(sections.kafka, sections.producer)?;
        let topics = sections.topics;
        let limits = Arc::new(Limits::new(Some(sections.kafka.clone()), options));
        limits
            .load(&[
                &topics.order_events.name,
                &topics.inventory_events.name,
                &topics.dead_letter.name,
            ])
            .await;
        Ok(Self {
            codecs: topic_codecs(sections.registry, topics).await?,
            limits,
            dead_letter_topic: topics.dead_letter.name.clone(),
            cleanup,
            counts: Arc::default(),
            dead: BTreeSet::new(),
        })
    }

    /// The record of `row`, built as the polling relay builds it; a dead
    /// letter when it is over its topic's limit.
    async fn record_of(&mut self, row: OutboxRow<'_>) -> Result<Outgoing, String> {
        let envelope = Envelope::from_json(row.envelope).map_err(|e| e.to_string())?;
        let codec = self
            .codecs
            .get(row.topic)
            .ok_or_else(|| format!("no schema for topic {}", row.topic))?;
        let payload = codec.encode(&envelope).await.map_err(|e| e.to_string())?;
        let headers = crate::producer::record_headers(&envelope);
        let record = Outgoing::new(
            row.topic.to_string(),
            row.key.as_bytes().to_vec(),
            payload,
            headers,
        );
        let mut limit = self.limits.cached(&record.topic);
        if !limit.fits(record.size) {
            limit = self
                .limits
                .confirmed(&record.topic, Duration::from_secs(1))
                .await;
        }
        if limit.fits(record.size) {
            return Ok(record);
        }
        let dead = DeadRow {
            id: row.id,
            key: String::from_utf8_lossy(&record.key).into_owned(),
            event_id: envelope.event_id.to_string(),
            event_name: envelope.event_name.as_str().to_string(),
            size: record.size,
            limit,
            refused: None,
            envelope_json: row.envelope.to_string(),
            topic: record.topic,
        };
        self.dead.insert(row.id);
        tracing::warn!(outbox_id = dead.id, reason = %dead.reason(), "relay: an outbox row is over its record limit; dead-lettering it");
        let dlq_limit = self.limits.cached(&self.dead_letter_topic);
        let (headers, value) = dead.record(&envelope, &dlq_limit);
        Ok(Outgoing::new(
            self.dead_letter_topic.clone(),
            dead.key.into_bytes(),
            value,
            headers,
        ))
    }
}

impl RowRecords for OutboxRecords {
    /// Only inserts become records (see [`OutboxRow::of`]).
    fn inserts_only(&self) -> bool {
        true
    }

    /// The columns [`OutboxRow::of`] reads.
    fn columns(&self) -> Option<&'static [&'static str]> {
        Some(&OutboxRow::COLUMNS)
    }

    fn record<'a>(
        &'a mut self,
        tx: &'a BinlogTransaction,
        change: &'a RowChange,
    ) -> BoxFuture<'a, Result<Option<Outgoing>, CdcError>> {
        Box::pin(async move {
            let Some(row) = OutboxRow::of(change) else {
                return Ok(None);
            };
            let place = || {
                format!(
                    "outbox row {} (binlog {}:{})",
                    change.key, tx.end.file, tx.end.pos
                )
            };
            let row = row.map_err(|e| CdcError::Row(format!("{}: {e}", place())))?;
            self.record_of(row)
                .await
                .map(Some)
                .map_err(|e| CdcError::Row(format!("{}: {e}", place())))
        })
    }

    /// The unsent rows a first start finds (left by the polling relay, or
    /// written before the relay ever ran), read in a consistent snapshot:
    /// published in the Kafka transaction of the first checkpoint, the
    /// snapshot's binlog position, so no row is missed and none shown twice.
    fn backlog<'a>(
        &'a mut self,
        conn: &'a mut mysql_async::Conn,
    ) -> BoxFuture<'a, Result<Option<BinlogTransaction>, CdcError>> {
        use mysql_async::prelude::Queryable;
        Box::pin(async move {
            let position = crate::cdc::snapshot::consistent_snapshot(conn).await?;
            let rows: Vec<(i64, String, String, String, String)> = conn
                .query(format!(
                    "SELECT id, topic, message_key, event_name, envelope FROM {TABLE} \
                     WHERE sent_ms IS NULL ORDER BY id LIMIT {}",
                    BACKLOG_MAX + 1
                ))
                .await
                .map_err(|e| CdcError::Source(format!("reading the unsent outbox rows: {e}")))?;
            let _ = conn.query_drop("COMMIT").await;
            if rows.len() > BACKLOG_MAX {
                return Err(CdcError::Setup(format!(
                    "the outbox holds more than {BACKLOG_MAX} unsent rows and the log-based relay has no checkpoint yet: \
                     drain them with `orderpipe relay --source poll --until-idle 5` first (stop the polling relays), then start it"
                )));
            }
            if !rows.is_empty() {
                eprintln!(
                    "relay: first start: publishing {} unsent outbox rows from the table, then the binlog from {position}",
                    rows.len()
                );
            }
            let columns = Arc::new(crate::cdc::table_schema::TableColumns {
                columns: Vec::new(),
            });
            let changes = rows
                .into_iter()
                .map(|(id, topic, key, event_name, envelope)| RowChange {
                    database: String::new(),
                    table: TABLE.to_string(),
                    kind: ChangeKind::Insert,
                    key: id.to_string(),
                    data: serde_json::json!({
                        "id": id, "topic": topic, "message_key": key,
                        "event_name": event_name, "envelope": envelope,
                    }),
                    old: None,
                    columns: columns.clone(),
                })
                .collect();
            Ok(Some(BinlogTransaction {
                end: position,
                timestamp: (crate::clock::now_ms() / 1000) as u32,
                changes,
                ..BinlogTransaction::default()
            }))
        })
    }

    fn committed(&mut self, _records: &[Outgoing], batch: &[BinlogTransaction]) {
        let rows: Vec<OutboxRow> = batch
            .iter()
            .flat_map(|tx| &tx.changes)
            .filter_map(|c| OutboxRow::of(c)?.ok())
            .collect();
        let dead = std::mem::take(&mut self.dead);
        // One counter update per topic and event name, not per row.
        let mut produced = BTreeMap::<(&str, &str), u64>::new();
        for row in rows.iter().filter(|r| !dead.contains(&r.id)) {
            *produced.entry((row.topic, row.event_name)).or_default() += 1;
        }
        for ((topic, event_name), n) in produced {
            crate::producer::produced(topic, event_name, n);
        }
        counter!(name::TRANSACTIONS, "outcome" => "committed").increment(1);
        self.counts.committed(rows.len() - dead.len(), dead.len());
        if !rows.is_empty() {
            let _ = self.cleanup.send(rows.into_iter().map(|r| r.id).collect());
        }
    }
}

/// Deletes published rows by id, off the publishing path: a failed delete
/// is retried with backoff, and a crash's leftovers are swept by age.
struct Cleaner {
    ids: mpsc::UnboundedSender<Vec<i64>>,
    task: tokio::task::JoinHandle<u64>,
}

impl Cleaner {
    fn start(db: Db, retention: Duration) -> Self {
        let (ids, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(Self::run(Deletes::new(db), retention, rx));
        Self { ids, task }
    }

    /// Lets the task delete what it was given, then returns how many rows
    /// it deleted.
    async fn finish(self) -> u64 {
        drop(self.ids);
        self.task.await.unwrap_or(0)
    }

    async fn run(
        mut deletes: Deletes,
        retention: Duration,
        mut rx: mpsc::UnboundedReceiver<Vec<i64>>,
    ) -> u64 {
        let mut deleted = 0;
        let mut backoff = crate::backoff::Backoff::new();
        let mut sweep = tokio::time::interval(Duration::from_secs(60));
        loop {
            let mut ids = tokio::select! {
                ids = rx.recv() => match ids {
                    Some(ids) => ids,
                    None => return deleted,
                },
                _ = sweep.tick() => {
                    let before = crate::clock::now_ms() - retention.as_millis() as i64;
                    match deletes.older_than(before).await {
                        Ok(n) => deleted += n,
                        Err(e) => tracing::warn!(error = %e, "relay: cannot sweep old outbox rows"),
                    }
                    continue;
                }
            };
            // Coalesce what queued up meanwhile.
            while let Ok(more) = rx.try_recv() {
                ids.extend(more);
            }
            for chunk in ids.chunks(DELETE_CHUNK) {
                loop {
                    match deletes.by_id(chunk).await {
                        Ok(n) => {
                            deleted += n;
                            counter!(name::RELAY_OUTBOX_DELETED).increment(n);
                            backoff.reset();
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, rows = chunk.len(), "relay: cannot delete published outbox rows; retrying");
                            backoff.wait().await;
                        }
                    }
                }
            }
        }
    }
}

/// The [`Cleaner`]'s two deletes, and how the binlog records them.
///
/// Nobody reads these deletes (the relay skips them; a deleted row was
/// published already), so MariaDB is asked to log each one's primary key
/// alone (`binlog_row_image = MINIMAL` for the statement): the row's
/// envelope is not written to the binlog a second time, nor sent to the
/// replicas and to every binlog reader (this relay among them). That
/// halves the binlog the outbox costs (docs/relay.md). It needs MariaDB's
/// BINLOG ADMIN privilege; without it, or on MySQL (no `SET STATEMENT`),
/// the first refusal switches to plain deletes, which log the whole row.
struct Deletes {
    db: Db,
    minimal_image: bool,
}

impl Deletes {
    fn new(db: Db) -> Self {
        Self {
            db,
            minimal_image: true,
        }
    }

    /// Deletes `ids` (primary-key lookups: row locks only, no gap locks
    /// that would hold the API's inserts back).
    #[tracing::instrument(skip_all, fields(rows = ids.len()))]
    async fn by_id(&mut self, ids: &[i64]) -> Result<u64, DbError> {
        self.execute(|prefix| {
            let mut query =
                sqlx::QueryBuilder::new(format!("{prefix}DELETE FROM {TABLE} WHERE id"));
            crate::db::rows::push_in(&mut query, ids.iter().copied());
            query
        })
        .await
    }

    /// Deletes rows created before `before_ms` (a crash's leftovers:
    /// published, not deleted), a bounded number at a time. Dead rows are
    /// the polling relay's and stay.
    #[tracing::instrument(skip(self))]
    async fn older_than(&mut self, before_ms: i64) -> Result<u64, DbError> {
        self.execute(|prefix| {
            let mut query = sqlx::QueryBuilder::new(format!(
                "{prefix}DELETE FROM {TABLE} WHERE dead_ms IS NULL AND created_ms < "
            ));
            query
                .push_bind(before_ms)
                .push(format!(" LIMIT {DELETE_CHUNK}"));
            query
        })
        .await
    }

    /// Runs the delete `build` makes for a statement prefix, with the
    /// minimal row image while the server accepts it. A refusal counts only
    /// when the same delete without the prefix then succeeds: any other
    /// failure is not the image's, and the next delete asks again.
    async fn execute(
        &mut self,
        build: impl Fn(&str) -> sqlx::QueryBuilder<sqlx::Any>,
    ) -> Result<u64, DbError> {
        let pool = &self.db.pool;
        if !self.minimal_image {
            return Ok(build("").build().execute(pool).await?.rows_affected());
        }
        let minimal = build("SET STATEMENT binlog_row_image = MINIMAL FOR ")
            .build()
            .execute(pool)
            .await;
        let refused = match minimal.map_err(DbError::from) {
            Ok(done) => return Ok(done.rows_affected()),
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => e,
        };
        let deleted = build("").build().execute(pool).await?.rows_affected();
        tracing::info!(error = %refused, "relay: deletes of published outbox rows log the whole row (the minimal row image needs MariaDB and its BINLOG ADMIN privilege)");
        self.minimal_image = false;
        Ok(deleted)
    }
}

/// The lease of one outbox source: who reads its binlog.
#[derive(Debug, Clone)]
struct Lease {
    db: Db,
    source: String,
    owner: String,
    ttl: Duration,
}

impl Lease {
    /// Takes (or renews) the lease when it is free, expired or ours:
    /// `None`; else `Some(holder)`.
    #[tracing::instrument(skip(self), fields(source = %self.source))]
    async fn take(&self) -> Result<Option<String>, DbError> {
        let now = crate::clock::now_ms();
        sqlx::query(
            "INSERT IGNORE INTO relay_source_leases (source, owner, expires_ms) VALUES (?, '', 0)",
        )
        .bind(&self.source)
        .execute(&self.db.pool)
        .await?;
        let taken = sqlx::query(
            "UPDATE relay_source_leases SET owner = ?, expires_ms = ? \
             WHERE source = ? AND (owner = ? OR expires_ms <= ?)",
        )
        .bind(&self.owner)
        .bind(now + self.ttl.as_millis() as i64)
        .bind(&self.source)
        .bind(&self.owner)
        .bind(now)
        .execute(&self.db.pool)
        .await?
        .rows_affected();
        if taken == 1 {
            return Ok(None);
        }
        let (holder,): (String,) =
            sqlx::query_as("SELECT owner FROM relay_source_leases WHERE source = ?")
                .bind(&self.source)
                .fetch_one(&self.db.pool)
                .await?;
        Ok(Some(holder))
    }

    /// Renews the lease every third of its lifetime; sets `lost` to the
    /// new holder when another instance has it (or when it could not be
    /// renewed before it expired).
    async fn keep(self, lost: watch::Sender<Option<String>>) {
        let mut renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.ttl / 3).await;
            match self.take().await {
                Ok(None) => renewed = tokio::time::Instant::now(),
                Ok(Some(holder)) => {
                    let _ = lost.send(Some(holder));
                    return;
                }
                Err(e) if renewed.elapsed() >= self.ttl => {
                    let _ = lost.send(Some(format!("nobody (not renewed in time: {e})")));
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay: cannot renew the source lease; retrying")
                }
            }
        }
    }

    /// Gives the lease back at a clean stop, so a standby takes over at once.
    async fn release(&self) {
        let _ = sqlx::query(
            "UPDATE relay_source_leases SET expires_ms = 0 WHERE source = ? AND owner = ?",
        )
        .bind(&self.source)
        .bind(&self.owner)
        .execute(&self.db.pool)
        .await;
    }
}
