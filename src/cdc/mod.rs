//! `orderpipe cdc`: the binlog source of seed 003's change distribution.
//!
//! It connects to MariaDB/MySQL as a replica (mysql_async's binlog stream,
//! [`binlog`]), keeps the row changes of the configured tables and
//! publishes one [`change::ChangeEvent`] per row change to
//! `<topic_prefix>.<db>.<table>`, keyed by the primary key, so one row's
//! changes stay in commit order in one partition.
//!
//! Exactly once for read_committed consumers: binlog transactions are
//! gathered into a batch (what the stream holds, up to `batch_max_rows`
//! rows or `batch_max_bytes`, and `batch_linger_ms` more once it holds
//! nothing), and one Kafka transaction carries the batch's records
//! and the checkpoint — the binlog position after its last transaction —
//! to the compacted offsets topic, keyed by the source name
//! ([`checkpoint`]). A transaction larger than `batch_max_rows` or
//! `batch_max_bytes` comes from the reader in pieces, each published in its
//! own Kafka transaction with a checkpoint inside it (its start, and how
//! many of its changes are out, [`binlog::InsideTransaction`]): memory and
//! Kafka transactions stay bounded however large the database's
//! transaction, and a restart skips the changes already published.
//! A restart (or a SIGKILL) resumes from the last committed checkpoint
//! after `init_transactions` has aborted whatever the previous process left
//! open, so every change is seen once.
//!
//! Checkpoints are a binlog file and position, the `@@server_id` of the
//! server that wrote them and its GTID position (MariaDB's GTID events are
//! read from the raw event, `domain-server-sequence`; mysql_common parses
//! only MySQL's). On the same server `cdc` resumes by file and position;
//! on another one (a failover) it resumes by GTID, MariaDB's way
//! (`@slave_connect_state` before `COM_BINLOG_DUMP`), see
//! [`binlog::ResumeMode`].
//!
//! A row change that cannot be published as it is (bigger than a Kafka
//! record may be, or refused by the encoder) never stops the stream: its
//! fate is decided before the Kafka transaction begins ([`oversize`]):
//! a dead-letter record on cdc's DLQ topic in the same transaction (the
//! default), its columns cut to fit, or a stop naming the row.
//!
//! [`CdcSettings`] is the `[cdc]` section of the configuration.

pub mod binlog;
pub mod catalogue;
pub mod change;
pub mod checkpoint;
pub mod column;
pub mod incremental;
pub mod oversize;
pub mod redact;
pub mod row_image;
pub mod snapshot;
pub mod table_schema;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::codec::{Codec, CodecError, RegistrySettings};
use crate::kafka::client::{KafkaSettings, MeasuredProducer};
use crate::kafka::record::header;
use crate::kafka::size_limit::{RecordLimit, topic_max_message_bytes};
use crate::metrics::InternalEvent;
use crate::producer::ProducerSettings;
use crate::stages::{StageClock, StageTimes};
use crate::topics::{EnsureOptions, TopicAdmin, TopicSpec};
use binlog::{BinlogPosition, BinlogReader, BinlogTransaction};
use change::{CHANGE_EVENT_VERSION, ChangeEvent, change_id, topic_schema, trace_id_of};
use checkpoint::Checkpoint;

/// Metric: row changes published, by table (`db.table`) and change.
pub const CHANGES_METRIC: &str = "orderpipe_cdc_changes_total";
/// Metric: Kafka transactions committed by the source.
pub const TRANSACTIONS_METRIC: &str = "orderpipe_cdc_transactions_total";
/// Metric: seconds between the last published transaction's commit in the
/// database and its Kafka commit.
pub const LAG_METRIC: &str = "orderpipe_cdc_lag_seconds";
/// Metric: seconds a batch spends in each stage (`gather`: its first
/// transaction read to its publishing, `encode`, `produce`: the Kafka
/// transaction's sends and acknowledgements, `commit`).
pub const STAGE_METRIC: &str = "orderpipe_cdc_stage_duration_seconds";

/// `linger.ms` of the source's producer unless `producer.options` sets one.
const PUBLISH_LINGER_MS: &str = "0";

/// A batch of only change-less transactions (other tables) is checkpointed
/// this often, so the position keeps up with a busy database.
const IDLE_CHECKPOINT: Duration = Duration::from_secs(5);

/// How often a source with incremental snapshots looks at its signals and
/// its pending chunk while the stream is idle.
const SNAPSHOT_TICK: Duration = Duration::from_millis(250);

/// The control plane's pool the signals of incremental snapshots are read
/// from (`database.url`); `None` when it cannot be built (then logged).
fn signals_db(url: &SecretString) -> Option<crate::db::Db> {
    let settings = crate::db::DatabaseSettings {
        url: url.clone(),
        max_connections: Some(1),
    };
    crate::db::Db::connect(&settings, 1)
        .inspect_err(
            |e| tracing::warn!(error = %e, "cdc: snapshot signals (cdc_signals) cannot be read"),
        )
        .ok()
}

/// A batch with changes stops gathering this long past its linger even
/// while the stream still holds more (a change-less batch: at
/// [`IDLE_CHECKPOINT`]), so a stream that is never idle, a backlog, is
/// still published in bounded batches and its checkpoint moves.
const GATHER_MAX: Duration = Duration::from_millis(100);

/// The `[cdc]` section of the configuration: one binlog source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CdcSettings {
    /// Name of the source: key of its checkpoint, part of its
    /// `transactional.id` and of the events' `producer` (`cdc:<name>`).
    pub name: String,
    /// `mysql://user:password@host:port` of the source; unset: `database.url`.
    #[serde(default)]
    pub source: Option<SecretString>,
    /// The replica's `server_id`: unique among the source's replicas.
    pub server_id: u32,
    /// Tables captured, `db.table`.
    pub tables: Vec<String>,
    /// The `cdc_sources` row to capture instead of `tables`: its host,
    /// port and user, and the tables of its event definitions
    /// ([`catalogue`]); the password stays in `source` / `database.url`.
    #[serde(default)]
    pub source_name: Option<String>,
    /// Change topics are `<topic_prefix>.<db>.<table>`.
    pub topic_prefix: String,
    /// The compacted topic of the checkpoints.
    pub offsets_topic: String,
    /// Partitions of each change topic.
    pub partitions: i32,
    /// Replication factor of the topics.
    pub replication_factor: i32,
    /// `min.insync.replicas` of the topics.
    pub min_insync_replicas: i32,
    /// `retention.ms` of the change topics.
    pub retention_ms: i64,
    /// Row changes per Kafka transaction: a batch is published once it
    /// holds this many, and a binlog transaction with more is published in
    /// pieces of about this many (each with a checkpoint inside it).
    pub batch_max_rows: usize,
    /// The same bound in bytes of the binlog's rows events (the rows' size
    /// as the database wrote them, not as JSON).
    pub batch_max_bytes: usize,
    /// How long a batch with a change waits for more once the stream has
    /// nothing ready (0: published at once; a batch grows while the
    /// stream holds more, up to the bounds above).
    pub batch_linger_ms: u64,
    /// `json` (one envelope schema, data/old as JSON text) or `avro` (one
    /// schema per table, typed data/old, [`table_schema`]).
    #[serde(default)]
    pub value_format: table_schema::ValueFormat,
    /// How to ask for the binlog from the checkpoint: `auto` (by position
    /// on the server that wrote it, by GTID on another: a failover),
    /// `position` or `gtid` (`--resume`).
    #[serde(default)]
    pub resume: binlog::ResumeMode,
    /// What to do with a row change whose record is over the Kafka limit
    /// ([`oversize::OversizeAction`]): `dead_letter` (default), `truncate`
    /// or `fail`.
    #[serde(default)]
    pub oversize: oversize::OversizeAction,
    /// Per table (`db.table`), the columns `oversize = "truncate"` may cut;
    /// a table not named here: all its text and blob columns.
    #[serde(default)]
    pub truncate_columns: BTreeMap<String, Vec<String>>,
    /// cdc's dead-letter topic; unset: `<topic_prefix>.dlq`.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Per table (`db.table`), the columns to drop, hash or mask before
    /// they leave the process ([`redact`]).
    #[serde(default)]
    pub redact: BTreeMap<String, redact::ColumnRules>,
    /// The secret key of `redact`'s hashes (HMAC-SHA-256).
    #[serde(default)]
    pub hash_key: Option<SecretString>,
    /// Rows per chunk of an incremental snapshot ([`incremental`]): each
    /// chunk is one `SELECT ... LIMIT` in a consistent snapshot.
    #[serde(default = "default_chunk_rows")]
    pub snapshot_chunk_rows: usize,
}

fn default_chunk_rows() -> usize {
    4096
}

impl CdcSettings {
    /// Rejects values that would only fail later; names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() || self.name.contains(char::is_whitespace) {
            return Err(format!(
                "cdc.name = {:?}: must be non-empty, without spaces",
                self.name
            ));
        }
        if self.server_id == 0 {
            return Err("cdc.server_id = 0: a replica needs a server_id from 1 to 4294967295, unique among the source's replicas".into());
        }
        for (i, table) in self.tables.iter().enumerate() {
            if !crate::table_name::is_db_table(table) {
                return Err(format!(
                    "cdc.tables[{i}] = {table:?}: expected <database>.<table>, e.g. shop.table_user"
                ));
            }
        }
        for table in self.truncate_columns.keys() {
            if !crate::table_name::is_db_table(table) {
                return Err(format!(
                    "cdc.truncate_columns.{table:?}: expected <database>.<table> = [columns], e.g. \"shop.docs\" = [\"body\"]"
                ));
            }
        }
        if self
            .dead_letter_topic
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err("cdc.dead_letter_topic is empty: name a topic, or leave it unset for <topic_prefix>.dlq".into());
        }
        // The hash key is checked when cdc starts: only its pods get it.
        crate::masking::check_rules("cdc.redact", &self.redact)?;
        if self.snapshot_chunk_rows == 0 {
            return Err("cdc.snapshot_chunk_rows = 0: must be at least 1".into());
        }
        if self.batch_max_rows == 0 {
            return Err("cdc.batch_max_rows = 0: must be at least 1".into());
        }
        if self.batch_max_bytes == 0 {
            return Err("cdc.batch_max_bytes = 0: must be at least 1 (bytes of binlog rows events per Kafka transaction)".into());
        }
        if self.partitions < 1 || self.replication_factor < 1 {
            return Err("cdc.partitions and cdc.replication_factor must be at least 1".into());
        }
        if self.min_insync_replicas < 1 || self.min_insync_replicas > self.replication_factor {
            return Err(format!(
                "cdc.min_insync_replicas must be between 1 and cdc.replication_factor ({})",
                self.replication_factor
            ));
        }
        Ok(())
    }

    /// How much a Kafka transaction holds, at most about (and so the
    /// largest piece of a binlog transaction).
    pub fn piece_limit(&self) -> binlog::PieceLimit {
        binlog::PieceLimit {
            rows: self.batch_max_rows,
            bytes: self.batch_max_bytes,
        }
    }

    /// `redact` and `hash_key`, checked.
    pub fn redaction(&self) -> Result<redact::Redaction, String> {
        redact::Redaction::new(&self.redact, self.hash_key.as_ref())
    }

    /// The change topic of `table` (`db.table`).
    pub fn topic_of(&self, table: &str) -> String {
        format!("{}.{table}", self.topic_prefix)
    }

    /// cdc's dead-letter topic: `dead_letter_topic`, or `<topic_prefix>.dlq`.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.topic_prefix))
    }

    /// The topics the source writes: one per table, the offsets topic, then
    /// the dead-letter topic (one partition: its records keep their order).
    pub fn topic_specs(&self) -> Vec<TopicSpec> {
        let spec = |name: String, partitions: i32, retention_ms: i64, configs: &[(&str, &str)]| {
            TopicSpec {
                name,
                partitions,
                replication_factor: self.replication_factor,
                min_insync_replicas: self.min_insync_replicas,
                retention_ms,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }
        };
        let mut specs: Vec<TopicSpec> = self
            .tables
            .iter()
            .map(|t| spec(self.topic_of(t), self.partitions, self.retention_ms, &[]))
            .collect();
        specs.push(spec(
            self.offsets_topic.clone(),
            1,
            -1,
            &[("cleanup.policy", "compact")],
        ));
        specs.push(spec(self.dead_letter_topic(), 1, self.retention_ms, &[]));
        specs
    }
}

/// Why the source stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum CdcError {
    /// The source database: settings, tables, binlog stream.
    #[error("source: {0}")]
    Source(String),
    /// The source database does not answer; `cdc` retries with a backoff
    /// (not ready meanwhile), `cdc snapshot` stops.
    #[error("source: {0}")]
    Unreachable(String),
    /// Reading the checkpoint.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The server no longer has (or never had) the binlog at the position
    /// to resume from; reconnecting cannot fix it.
    #[error(
        "the source has no binlog at {0}: purged (binlog_expire_logs_seconds) or another server's position; \
         start a new source name with --start-position FILE:POS (SHOW MASTER STATUS), and bootstrap what was missed"
    )]
    PositionGone(String),
    /// Kafka refused a send or a transaction step.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Encoding a change (schema registry).
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Configuration or topics.
    #[error("{0}")]
    Setup(String),
    /// A row change stopped the source (`oversize = "fail"`, or an error
    /// worth a restart such as an unreachable registry); names the row.
    #[error("{0}")]
    Row(String),
}

/// What `orderpipe cdc` reads: its section and the ones it shares.
pub struct CdcSections<'a> {
    /// `[cdc]`.
    pub cdc: &'a CdcSettings,
    /// `[kafka]`.
    pub kafka: &'a KafkaSettings,
    /// `[producer]` (options, transactional id prefix).
    pub producer: &'a ProducerSettings,
    /// `[registry]`.
    pub registry: &'a RegistrySettings,
    /// `database.url`, the source when `cdc.source` is unset.
    pub database_url: &'a SecretString,
}

/// Flags of one run.
#[derive(Debug, Clone, Default)]
pub struct CdcOptions {
    /// Where to start when the source has no checkpoint yet (default: the
    /// binlog's current end).
    pub start_position: Option<BinlogPosition>,
    /// Where the run reports its readiness (see [`health`]); `None`: nowhere.
    pub health: Option<std::sync::Arc<crate::health::HealthState>>,
}

/// Readiness condition: the binlog stream is open (not while connecting
/// or reconnecting with a backoff).
pub const READY_BINLOG: &str = "binlog_stream";
/// Readiness condition: the transactional producer is initialised (the
/// previous one of the same `transactional.id` fenced).
pub const READY_PRODUCER: &str = "kafka_producer";

/// The readiness of a `cdc` process: unmet until the run has opened its
/// binlog stream and initialised its transactional producer.
pub fn health() -> std::sync::Arc<crate::health::HealthState> {
    crate::health::HealthState::conditions(&[
        (READY_BINLOG, "not yet connected to the source"),
        (READY_PRODUCER, "transactions not yet initialised"),
    ])
}

/// Counts of a run, printed at exit.
#[derive(Debug, Default, Clone, Serialize)]
pub struct CdcSummary {
    /// Row changes published.
    pub changes: u64,
    /// Binlog transactions read (with or without captured changes).
    pub binlog_transactions: u64,
    /// Kafka transactions committed.
    pub kafka_transactions: u64,
    /// Where the source resumed.
    pub started_at: Option<BinlogPosition>,
    /// The last committed checkpoint.
    pub checkpoint: Option<BinlogPosition>,
    /// Milliseconds per batch in each stage (`gather`, `encode`,
    /// `produce`, `commit`): where a change's time goes.
    pub stages_ms: BTreeMap<String, StageTimes>,
}

/// The `transactional.id` of a source's producer.
pub fn transactional_id(prefix: &str, source: &str) -> String {
    format!("{prefix}-cdc-{source}")
}

/// Publishes batches of transactions and their checkpoint, one Kafka
/// transaction each.
struct Publisher {
    producer: MeasuredProducer,
    /// Per topic: the writer schema's text (per-table schemas change with
    /// the table) and its codec.
    codecs: HashMap<String, (String, Codec)>,
    /// Registry id of the change schema per topic, once its first JSON-format
    /// record went through the registry: later ones are framed directly
    /// ([`ChangeEvent::framed_avro`]).
    change_schema_ids: HashMap<String, u32>,
    /// Per topic, for `value_format = "avro"`: the columns its records
    /// carry after `cdc.redact` and their schema, for the table layout
    /// last seen; built again when the layout changes (an ALTER TABLE), not
    /// for every record.
    typed_layouts: HashMap<String, TypedLayout>,
    registry: RegistrySettings,
    cdc: CdcSettings,
    kafka: KafkaSettings,
    /// The producer's librdkafka options (its `message.max.bytes`).
    options: BTreeMap<String, String>,
    /// Its `transactional.id`.
    transactional_id: String,
    /// Per topic, the largest record it takes: read once per topic, lowered
    /// when the broker refuses a record anyway.
    limits: HashMap<String, RecordLimit>,
    /// What the row changes become instead of change events (the
    /// log-based outbox relay); `None`: change events.
    rows: Option<Box<dyn RowRecords>>,
    /// The time per batch of each stage.
    stages: StageClock,
    /// `cdc.redact`: applied by the readers to the rows, by `encode` to
    /// the typed schema's columns.
    redaction: std::sync::Arc<redact::Redaction>,
}

/// A table layout in its typed-Avro form ([`Publisher::encode`]).
struct TypedLayout {
    /// The layout as the reader described it.
    source: std::sync::Arc<table_schema::TableColumns>,
    /// Its columns after `cdc.redact`.
    columns: table_schema::TableColumns,
    /// Their per-table schema.
    schema: crate::schema::TopicSchema,
}

/// One record of a batch's Kafka transaction: a change, a dead letter,
/// or (the log-based outbox relay, [`RowRecords`]) an outbox row's record.
pub(crate) struct Outgoing {
    pub(crate) topic: String,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) headers: OwnedHeaders,
    /// The change it carries (a change topic's record), for the metrics.
    change: Option<&'static str>,
    /// Its size as librdkafka counts it.
    pub(crate) size: usize,
}

impl Outgoing {
    /// A record of `headers` (name, value) on `topic`.
    pub(crate) fn new(topic: String, key: Vec<u8>, value: Vec<u8>, headers: OwnedHeaders) -> Self {
        let size = RecordLimit::record_size_with(&key, &value, &headers);
        Self {
            topic,
            key,
            value,
            headers,
            change: None,
            size,
        }
    }

    /// The change record of `event` on `topic`; `truncated` marks its cut columns.
    fn change(
        topic: &str,
        event: &ChangeEvent,
        value: Vec<u8>,
        truncated: Option<&oversize::Truncated>,
    ) -> Self {
        let headers = owned(&change_headers(event, truncated));
        Self {
            change: Some(event.change.as_str()),
            ..Self::new(
                topic.to_string(),
                event.key.clone().into_bytes(),
                value,
                headers,
            )
        }
    }
}

/// `headers` as librdkafka's.
fn owned(headers: &[(&'static str, Vec<u8>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_slice()),
            })
        },
    )
}

/// What `cdc`'s machinery publishes when it carries another stream than
/// the change events: the log-based outbox relay ([`crate::outbox::log_relay`])
/// reads the outbox table's inserts through it and turns each into the
/// record the polling relay would write.
pub(crate) trait RowRecords: Send {
    /// The record of `change` (of `tx`), or none (a change the stream
    /// does not publish). An error stops the stream, naming the row.
    fn record<'a>(
        &'a mut self,
        tx: &'a BinlogTransaction,
        change: &'a binlog::RowChange,
    ) -> futures::future::BoxFuture<'a, Result<Option<Outgoing>, CdcError>>;

    /// Whether the stream publishes only inserts: the reader then skips
    /// the other row events undecoded.
    fn inserts_only(&self) -> bool {
        false
    }

    /// The only columns its records read (the table's key among them): the
    /// reader renders no others. `None`: every column.
    fn columns(&self) -> Option<&'static [&'static str]> {
        None
    }

    /// After the Kafka transaction of `records` (from `batch`) committed.
    fn committed(&mut self, records: &[Outgoing], batch: &[BinlogTransaction]);

    /// On a first start (no checkpoint, no `--start-position`): what the
    /// table holds that the stream will not show, as one transaction whose
    /// `end` is the binlog position it is consistent with; the stream
    /// starts there. `None`: start at the binlog's current end.
    fn backlog<'a>(
        &'a mut self,
        _conn: &'a mut mysql_async::Conn,
    ) -> futures::future::BoxFuture<'a, Result<Option<BinlogTransaction>, CdcError>> {
        Box::pin(async { Ok(None) })
    }
}

/// The headers of a change record; `truncated` marks its cut columns.
fn change_headers(
    event: &ChangeEvent,
    truncated: Option<&oversize::Truncated>,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut id = uuid::Uuid::encode_buffer();
    let event_id = event
        .event_id
        .hyphenated()
        .encode_lower(&mut id)
        .to_string();
    let traceparent = format!(
        "00-{}-{}-01",
        event.trace_id,
        &event.event_id.simple().to_string()[..16]
    );
    let mut headers = vec![
        (header::EVENT_ID, event_id.into_bytes()),
        (header::EVENT_NAME, event.event_name.clone().into_bytes()),
        (header::TRACE_ID, event.trace_id.clone().into_bytes()),
        (header::TRACEPARENT, traceparent.into_bytes()),
        (
            header::CONTENT_TYPE,
            header::AVRO_CONFLUENT.as_bytes().to_vec(),
        ),
    ];
    if let Some(truncated) = truncated.filter(|t| !t.is_empty()) {
        headers.push((
            oversize::TRUNCATED_HEADER,
            serde_json::to_vec(truncated).expect("a map of lengths serializes"),
        ));
    }
    headers
}

/// Why a Kafka transaction failed, and the records the broker (or
/// librdkafka) refused for their size.
struct TxFailure {
    error: CdcError,
    refused: Vec<usize>,
}

/// Times a batch is built again after records were refused for their size
/// (each time with a lower limit for their topics, so they are dead-lettered).
const SIZE_REFUSAL_RETRIES: usize = 8;

fn is_size_refusal(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

/// The source's producer options: the transactional producers' with
/// `linger.ms` [`PUBLISH_LINGER_MS`] unless `producer.options` sets a
/// linger. A batch is handed to librdkafka whole and its acknowledgements
/// awaited, so a linger only delays it; what queues while a request is in
/// flight still goes out together. Measured in docs/cdc.md ("No linger"):
/// p50 9–12 ms against 19–21 ms with 5 ms, catch-up no slower.
fn publisher_options(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
) -> Result<BTreeMap<String, String>, CdcError> {
    let mut options = crate::producer::transactional::options(kafka, producer)
        .map_err(|e| CdcError::Setup(e.to_string()))?;
    if !["linger.ms", "queue.buffering.max.ms"]
        .iter()
        .any(|key| producer.options.contains_key(*key))
    {
        options.insert("linger.ms".into(), PUBLISH_LINGER_MS.into());
    }
    Ok(options)
}

impl Publisher {
    /// Builds the source's transactional producer and fences its
    /// predecessor: `init_transactions` aborts what that one left open,
    /// and [`checkpoint::seal`] decides what a broker crash left undecided.
    /// `change_events`: whether it publishes row changes (and so applies
    /// `cdc.redact`), not another stream's records ([`RowRecords`]).
    async fn new(sections: &CdcSections<'_>, change_events: bool) -> Result<Self, CdcError> {
        let options = publisher_options(sections.kafka, sections.producer)?;
        let id = transactional_id(
            &sections.producer.transactional_id_prefix,
            &sections.cdc.name,
        );
        let producer = crate::producer::transactional::fenced(&options, &id).await?;
        checkpoint::seal(&producer, &sections.cdc.offsets_topic, &sections.cdc.name).await?;
        Ok(Self {
            producer,
            codecs: HashMap::new(),
            change_schema_ids: HashMap::new(),
            typed_layouts: HashMap::new(),
            registry: sections.registry.clone(),
            cdc: sections.cdc.clone(),
            kafka: sections.kafka.clone(),
            options,
            transactional_id: id,
            limits: HashMap::new(),
            rows: None,
            stages: StageClock::new(STAGE_METRIC),
            redaction: std::sync::Arc::new(match change_events {
                true => sections.cdc.redaction().map_err(CdcError::Setup)?,
                false => redact::Redaction::default(),
            }),
        })
    }

    /// The event of the `index`-th change of `tx`.
    fn event(
        &self,
        tx: &BinlogTransaction,
        index: usize,
        change: &binlog::RowChange,
    ) -> ChangeEvent {
        let transaction = tx
            .snapshot
            .clone()
            .or_else(|| tx.gtid.clone())
            .unwrap_or_else(|| format!("{}:{}", tx.end.file, tx.end.pos));
        // The index in the whole transaction, however it was cut in pieces.
        let index = tx.first_row + index;
        let event_id = change_id(&self.cdc.name, &transaction, index as u32);
        ChangeEvent {
            event_id,
            event_name: format!(
                "{}.{}.{}",
                change.database,
                change.table,
                change.kind.as_str()
            ),
            event_version: CHANGE_EVENT_VERSION.into(),
            event_time: chrono::DateTime::from_timestamp(i64::from(tx.timestamp), 0)
                .unwrap_or_default(),
            producer: format!("cdc:{}", self.cdc.name),
            trace_id: trace_id_of(&event_id),
            database: change.database.clone(),
            table: change.table.clone(),
            change: change.kind,
            key: change.key.clone(),
            data: change.data.clone(),
            old: change.old.clone(),
            gtid: tx.gtid.clone(),
            binlog_file: tx.end.file.clone(),
            binlog_pos: tx.end.pos,
            xid: tx.xid,
            row_index: index as u32,
        }
    }

    /// Encodes `event` for `topic`: with the one change schema, or (value
    /// format avro) with the schema of `change`'s table as its table map
    /// has it now. A new schema text (a column added) gets a new codec,
    /// which registers it as the subject's next version.
    async fn encode(
        &mut self,
        topic: &str,
        change: &binlog::RowChange,
        event: &ChangeEvent,
    ) -> Result<Vec<u8>, CdcError> {
        let json = self.cdc.value_format == table_schema::ValueFormat::Json;
        if let Some(id) = self.change_schema_ids.get(topic).filter(|_| json) {
            return Ok(event.framed_avro(*id));
        }
        let (schema, value) = match self.cdc.value_format {
            table_schema::ValueFormat::Json => (
                std::borrow::Cow::Owned(topic_schema(topic)),
                event.to_avro(),
            ),
            table_schema::ValueFormat::Avro => {
                let stale = self.typed_layouts.get(topic).is_none_or(|l| {
                    !std::sync::Arc::ptr_eq(&l.source, &change.columns)
                        && *l.source != *change.columns
                });
                if stale {
                    let columns = self
                        .redaction
                        .columns(&change.database, &change.table, &change.columns)
                        .into_owned();
                    let schema = table_schema::table_schema(
                        topic,
                        &change.database,
                        &change.table,
                        &columns,
                    )
                    .map_err(CdcError::Setup)?;
                    let source = change.columns.clone();
                    self.typed_layouts.insert(
                        topic.to_string(),
                        TypedLayout {
                            source,
                            columns,
                            schema,
                        },
                    );
                }
                let layout = &self.typed_layouts[topic];
                let value = table_schema::typed_value(
                    event.to_avro(),
                    &event.data,
                    event.old.as_ref(),
                    &layout.columns,
                )
                .map_err(|e| {
                    CdcError::Setup(format!("{}.{}: {e}", change.database, change.table))
                })?;
                (std::borrow::Cow::Borrowed(&layout.schema), value)
            }
        };
        if self
            .codecs
            .get(topic)
            .is_none_or(|(raw, _)| *raw != schema.raw)
        {
            let codec = Codec::new(&self.registry, topic, &*schema, self.registry.auto_register)?;
            self.codecs
                .insert(topic.to_string(), (schema.raw.clone(), codec));
        }
        let framed = self.codecs[topic].1.encode_value(value).await?;
        if json {
            self.change_schema_ids
                .insert(topic.to_string(), crate::codec::schema_id(&framed)?);
        }
        Ok(framed)
    }

    /// The largest record `topic` takes (its `max.message.bytes` is read
    /// once, at its first record).
    async fn limit(&mut self, topic: &str) -> RecordLimit {
        if let Some(limit) = self.limits.get(topic) {
            return limit.clone();
        }
        let topic_max = topic_max_message_bytes(&self.kafka, topic)
            .await
            .map(|max| (topic.to_string(), max));
        let limit = RecordLimit::new(&self.options, topic_max);
        self.limits.insert(topic.to_string(), limit.clone());
        limit
    }

    /// After the broker refused `refused` records for their size: reads
    /// their topics' limits again, so those over the new limit are
    /// dead-lettered when the batch is built again. The broker refuses a
    /// whole produce batch, small records with the big one; when the limit
    /// read again still admits every refused record (it cannot be read, or
    /// librdkafka batched records together past it: see `batch.size` in
    /// docs/cdc.md), the largest refused record's size becomes the limit,
    /// so each attempt dead-letters at least one record and the stream goes on.
    async fn relearn_limits(&mut self, records: &[Outgoing], refused: &[usize]) {
        let mut by_topic: BTreeMap<&str, usize> = BTreeMap::new();
        for record in refused.iter().map(|&i| &records[i]) {
            let largest = by_topic.entry(&record.topic).or_default();
            *largest = (*largest).max(record.size);
        }
        for (topic, largest) in by_topic {
            let read = topic_max_message_bytes(&self.kafka, topic).await;
            let mut limit =
                RecordLimit::new(&self.options, read.map(|max| (topic.to_string(), max)));
            if limit.fits(largest) {
                limit = RecordLimit {
                    max_bytes: largest - 1,
                    from: format!(
                        "the broker refused a record of {largest} bytes on {topic} ({} admits it)",
                        limit.from
                    ),
                };
            } else {
                limit.from = format!(
                    "{}, read again after the broker refused a record of {largest} bytes",
                    limit.from
                );
            }
            tracing::warn!(%topic, largest, limit = limit.max_bytes, limit_from = %limit.from, "cdc: the broker refused records for their size; building the batch again with this limit");
            self.limits.insert(topic.to_string(), limit);
        }
    }

    /// The record of the `index`-th change of `tx`: on its change topic
    /// when it can be, else what `cdc.oversize` says, or a dead letter
    /// when the encoder refuses it. Errors name the row.
    async fn record_of(
        &mut self,
        tx: &BinlogTransaction,
        index: usize,
        change: &binlog::RowChange,
    ) -> Result<Outgoing, CdcError> {
        let event = self.event(tx, index, change);
        let topic = self
            .cdc
            .topic_of(&format!("{}.{}", change.database, change.table));
        let value = match self.encode(&topic, change, &event).await {
            Ok(value) => value,
            Err(e) => {
                let why = match e {
                    // The registry is away, not the row at fault: a restart retries it.
                    CdcError::Codec(e @ CodecError::RegistryUnavailable(_)) => {
                        return Err(CdcError::Row(format!(
                            "{}: {e}",
                            oversize::RowPlace::of(&event)
                        )));
                    }
                    CdcError::Codec(e) => oversize::Unpublishable {
                        class: e.class(),
                        error: e.to_string(),
                        size: None,
                        limit: None,
                    },
                    CdcError::Setup(e) => oversize::Unpublishable {
                        class: oversize::UNENCODABLE,
                        error: e,
                        size: None,
                        limit: None,
                    },
                    e => {
                        return Err(CdcError::Row(format!(
                            "{}: {e}",
                            oversize::RowPlace::of(&event)
                        )));
                    }
                };
                return Ok(self.dead_letter(&topic, &event, why).await);
            }
        };
        let record = Outgoing::change(&topic, &event, value, None);
        let limit = self.limit(&topic).await;
        if limit.fits(record.size) {
            return Ok(record);
        }
        self.oversized(topic, change, event, record.size, limit)
            .await
    }

    /// What `cdc.oversize` says for a change whose record (`size`) is over `limit`.
    async fn oversized(
        &mut self,
        topic: String,
        change: &binlog::RowChange,
        event: ChangeEvent,
        size: usize,
        limit: RecordLimit,
    ) -> Result<Outgoing, CdcError> {
        let place = oversize::RowPlace::of(&event);
        let table = format!("{}.{}", change.database, change.table);
        let action = self.cdc.oversize;
        oversize::OversizeRow {
            place: &place,
            table: table.clone(),
            size,
            limit: &limit,
            action,
        }
        .emit();
        let over = format!(
            "record of {size} bytes is over the limit of {} bytes ({})",
            limit.max_bytes, limit.from
        );
        let mut why = oversize::Unpublishable {
            class: oversize::OVERSIZED,
            error: over,
            size: Some(size),
            limit: Some(limit.clone()),
        };
        match action {
            oversize::OversizeAction::Fail => {
                return Err(CdcError::Row(format!(
                    "{place}: {}; cdc.oversize = \"fail\" stops here (\"dead_letter\" or \"truncate\" would go on)",
                    why.error
                )));
            }
            oversize::OversizeAction::DeadLetter => {}
            oversize::OversizeAction::Truncate => {
                let columns = oversize::cuttable_columns(
                    &change.columns,
                    self.cdc.truncate_columns.get(&table),
                );
                let mut cut = event.clone();
                let mut truncated = oversize::Truncated::new();
                let mut over = size - limit.max_bytes + oversize::SLACK;
                while oversize::cut_longest(&mut cut, Some(&columns), over, &mut truncated) {
                    let value = self.encode(&topic, change, &cut).await?;
                    let record = Outgoing::change(&topic, &cut, value, Some(&truncated));
                    if limit.fits(record.size) {
                        return Ok(record);
                    }
                    over = record.size - limit.max_bytes + oversize::SLACK;
                }
                why.error = format!(
                    "{}; cutting its columns {columns:?} (cdc.truncate_columns) is not enough",
                    why.error
                );
            }
        }
        Ok(self.dead_letter(&topic, &event, why).await)
    }

    /// The dead-letter record of `event` (headed for `topic`) on cdc's DLQ topic.
    async fn dead_letter(
        &mut self,
        topic: &str,
        event: &ChangeEvent,
        why: oversize::Unpublishable,
    ) -> Outgoing {
        let dead_letter_topic = self.cdc.dead_letter_topic();
        let limit = self.limit(&dead_letter_topic).await;
        let group = format!("cdc:{}", self.cdc.name);
        let record =
            oversize::dead_letter(&group, topic, event, &why, &limit, crate::clock::now_ms());
        let place = oversize::RowPlace::of(event);
        let table = format!("{}.{}", event.database, event.table);
        oversize::RowDeadLettered {
            place: &place,
            table,
            why: &why,
            topic: &dead_letter_topic,
        }
        .emit();
        Outgoing {
            size: record.size(),
            topic: dead_letter_topic,
            key: record.key,
            headers: owned(&record.headers),
            value: record.value,
            change: None,
        }
    }

    /// One Kafka transaction: every change of `batch` (or its dead
    /// letter), then `checkpoint`. Every record's fate is decided before
    /// the transaction begins; should the broker refuse one for its size
    /// anyway (its limit lowered since it was read), the transaction is
    /// aborted, the limit learnt again ([`Self::relearn_limits`]), the
    /// producer renewed and the batch built again, so the refused change
    /// becomes a dead letter and the stream goes on. Returns the number of
    /// records of changes.
    async fn publish(
        &mut self,
        batch: &[BinlogTransaction],
        checkpoint: &Checkpoint,
    ) -> Result<u64, CdcError> {
        let mut attempt = 0;
        let records = loop {
            // Encode first (the registry is asked once per topic), then send
            // without waiting inside the transaction.
            let encoding = Instant::now();
            // Sized once: a batch holds thousands of records, and growing
            // the vector copies them and churns the allocator.
            let mut records = Vec::with_capacity(batch.iter().map(|tx| tx.changes.len()).sum());
            for tx in batch {
                for (index, change) in tx.changes.iter().enumerate() {
                    let record = match self.rows.as_mut() {
                        Some(rows) => rows.record(tx, change).await?,
                        None => Some(self.record_of(tx, index, change).await?),
                    };
                    records.extend(record);
                }
            }
            self.stages.record("encode", encoding);
            tracing::debug!(records = records.len(), checkpoint = %checkpoint.position, "cdc: publishing a batch");
            self.producer.begin_transaction()?;
            let result = self.send_and_commit(&records, checkpoint).await;
            tracing::debug!(ok = result.is_ok(), "cdc: Kafka transaction done");
            let Err(failure) = result else { break records };
            tracing::warn!(error = %failure.error, "cdc: Kafka transaction failed; aborting it");
            let p = self.producer.clone();
            let _ =
                tokio::task::spawn_blocking(move || p.abort_transaction(Duration::from_secs(30)))
                    .await;
            attempt += 1;
            if failure.refused.is_empty() || attempt > SIZE_REFUSAL_RETRIES {
                return Err(failure.error);
            }
            self.relearn_limits(&records, &failure.refused).await;
            // A refused record leaves a gap in the idempotent producer's
            // sequence numbers that the abort does not close (the next
            // transaction fails with OUT_OF_ORDER_SEQUENCE_NUMBER): a new
            // producer of the same transactional.id starts a new epoch.
            self.producer =
                crate::producer::transactional::fenced(&self.options, &self.transactional_id)
                    .await?;
        };
        if let Some(rows) = self.rows.as_mut() {
            rows.committed(&records, batch);
        }
        for record in &records {
            if let Some(change) = record.change {
                counter!(CHANGES_METRIC, "topic" => record.topic.clone(), "change" => change)
                    .increment(1);
            }
        }
        counter!(TRANSACTIONS_METRIC).increment(1);
        if let Some(last) = batch.last() {
            gauge!(LAG_METRIC)
                .set((chrono::Utc::now().timestamp() - i64::from(last.timestamp)).max(0) as f64);
        }
        Ok(records.iter().filter(|r| r.change.is_some()).count() as u64)
    }

    /// Sends `records` and the checkpoint and commits. On failure, the
    /// records refused for their size (by librdkafka at once, or by the
    /// broker in their delivery report).
    async fn send_and_commit(
        &self,
        records: &[Outgoing],
        checkpoint: &Checkpoint,
    ) -> Result<(), TxFailure> {
        let failed = |error: CdcError| TxFailure {
            error,
            refused: Vec::new(),
        };
        let producing = Instant::now();
        let mut deliveries = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let sent = self
                .send(
                    FutureRecord::to(&record.topic)
                        .key(record.key.as_slice())
                        .payload(record.value.as_slice())
                        .headers(record.headers.clone()),
                )
                .await;
            match sent {
                Ok(delivery) => deliveries.push((index, delivery)),
                Err(e) if is_size_refusal(&e) => {
                    return Err(TxFailure {
                        error: e.into(),
                        refused: vec![index],
                    });
                }
                Err(e) => return Err(failed(e.into())),
            }
        }
        let value = checkpoint.to_bytes();
        let checkpoint_delivery = self
            .send(
                FutureRecord::to(&self.cdc.offsets_topic)
                    .key(checkpoint.source.as_bytes())
                    .payload(value.as_slice()),
            )
            .await
            .map_err(|e| failed(e.into()))?;
        // Every acknowledgement before the commit, as the relay does. The
        // commit flushes first, and rdkafka's flush, finding reports its
        // own polling thread has not yet served, polls in 100 ms steps: a
        // commit called before the reports were in waited out a step, so
        // every transaction took ~100 ms and a lone change ~170 ms to reach
        // a consumer (docs/cdc.md, "Latency").
        // Awaited in order: the reports arrive in about that order, and a
        // `join_all` over thousands of futures costs more than the wait.
        let mut failure = None;
        let mut refused = Vec::new();
        let deliveries = deliveries
            .into_iter()
            .map(|(index, delivery)| (Some(index), delivery))
            .chain([(None, checkpoint_delivery)]);
        for (index, delivery) in deliveries {
            let error = match delivery.await {
                Ok(Ok(_)) => continue,
                Ok(Err((e, _))) => e,
                Err(_canceled) => KafkaError::Canceled,
            };
            if let Some(index) = index.filter(|_| is_size_refusal(&error)) {
                refused.push(index);
            }
            failure.get_or_insert(error);
        }
        if let Some(error) = failure {
            return Err(TxFailure {
                error: error.into(),
                refused,
            });
        }
        self.stages.record("produce", producing);
        let committing = Instant::now();
        crate::producer::transactional::commit(&self.producer, Duration::from_secs(60))
            .await
            .map_err(|e| failed(e.into()))?;
        self.stages.record("commit", committing);
        Ok(())
    }

    /// Hands a record to librdkafka, waiting (not failing) while its queue
    /// is full; returns its delivery report, which `send_and_commit` awaits
    /// before it commits.
    async fn send(
        &self,
        mut record: FutureRecord<'_, [u8], [u8]>,
    ) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// Creates the source's topics when missing (change topics, offsets
/// topic); refuses to start when one differs in a way `ensure` will not fix.
pub async fn ensure_topics(kafka: &KafkaSettings, cdc: &CdcSettings) -> Result<(), CdcError> {
    ensure(kafka, cdc.topic_specs()).await
}

/// Creates `specs` when missing; refuses a topic `ensure` will not fix.
async fn ensure(kafka: &KafkaSettings, specs: Vec<TopicSpec>) -> Result<(), CdcError> {
    let admin = TopicAdmin::new(kafka).map_err(|e| CdcError::Setup(e.to_string()))?;
    let changes = admin
        .ensure(&specs.iter().collect::<Vec<_>>(), EnsureOptions::default())
        .await
        .map_err(|e| CdcError::Setup(e.to_string()))?;
    if let Some(refused) = changes.iter().find(|c| c.is_refused()) {
        return Err(CdcError::Setup(format!("cdc topics: {refused:?}")));
    }
    Ok(())
}

/// A source ready to read: its URL, a connection that passed the checks,
/// its fenced-in producer.
struct Started {
    url: String,
    conn: mysql_async::Conn,
    publisher: Publisher,
}

/// The start-up both `cdc` and `cdc snapshot` do: check the source's
/// settings and tables, create the topics, fence the previous producer.
/// For another stream than change events (`only_offsets`, [`RowRecords`])
/// only the offsets topic is cdc's to create.
async fn start(sections: &CdcSections<'_>, only_offsets: bool) -> Result<Started, CdcError> {
    let cdc = sections.cdc;
    let url = cdc
        .source
        .as_ref()
        .unwrap_or(sections.database_url)
        .expose_secret()
        .to_string();
    let mut conn = binlog::connect(&url).await?;
    binlog::check_source(&mut conn, &cdc.tables).await?;
    let mut specs = cdc.topic_specs();
    if only_offsets {
        specs.retain(|s| s.name == cdc.offsets_topic);
    }
    ensure(sections.kafka, specs).await?;
    let publisher = Publisher::new(sections, !only_offsets).await?;
    Ok(Started {
        url,
        conn,
        publisher,
    })
}

/// Runs the source until `shutdown` resolves (then publishes what it has
/// read and returns) or a Kafka error stops it. Binlog errors reconnect
/// from the last checkpoint with a backoff.
pub async fn run(
    sections: CdcSections<'_>,
    options: CdcOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<CdcSummary, CdcError> {
    run_with(sections, options, None, shutdown).await
}

/// [`run`], publishing what `rows` makes of the row changes (`None`:
/// change events).
pub(crate) async fn run_with(
    sections: CdcSections<'_>,
    options: CdcOptions,
    rows: Option<Box<dyn RowRecords>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<CdcSummary, CdcError> {
    let cdc = sections.cdc;
    cdc.validate().map_err(CdcError::Setup)?;
    if cdc.tables.is_empty() {
        return Err(CdcError::Setup("cdc.tables is empty: name the tables to capture (db.table), e.g. --table shop.table_user".into()));
    }
    let ready = |name: &'static str, unmet: Option<String>| {
        if let Some(health) = &options.health {
            health.set_condition(name, unmet);
        }
    };
    let mut summary = CdcSummary::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = crate::backoff::Backoff::new();
    // An unreachable source is waited for (live, not ready); a signal meanwhile stops at once.
    let Started {
        url,
        mut conn,
        mut publisher,
    } = loop {
        let started = tokio::select! {
            _ = &mut shutdown => return Ok(summary),
            started = start(&sections, rows.is_some()) => started,
        };
        match started {
            Ok(started) => break started,
            Err(CdcError::Unreachable(why)) => {
                let delay = backoff.delay();
                tracing::warn!(error = %why, retry_in_ms = delay.as_millis() as u64, "cdc: the source does not answer; retrying");
                ready(
                    READY_BINLOG,
                    Some(format!("{why}; retrying in {} ms", delay.as_millis())),
                );
                tokio::select! {
                    _ = &mut shutdown => return Ok(summary),
                    _ = backoff.wait() => {}
                }
            }
            Err(e) => return Err(e),
        }
    };
    backoff.reset();
    publisher.rows = rows;
    ready(READY_PRODUCER, None);
    let last = checkpoint::last_committed(sections.kafka, &cdc.offsets_topic, &cdc.name).await?;
    // Incremental snapshots are of change events only (not the log relay's rows).
    let mut snapshots = publisher.rows.is_none().then(|| {
        incremental::IncrementalSnapshots::new(
            cdc,
            &url,
            publisher.redaction.clone(),
            last.as_ref().and_then(|c| c.snapshot.clone()),
            signals_db(sections.database_url),
        )
    });
    let mut committed = match last {
        Some(checkpoint) => checkpoint.position,
        None => {
            let backlog = match (&options.start_position, publisher.rows.as_mut()) {
                (None, Some(rows)) => rows.backlog(&mut conn).await?,
                _ => None,
            };
            let start = match (options.start_position, &backlog) {
                (Some(p), _) => p,
                (None, Some(backlog)) => backlog.end.clone(),
                (None, None) => binlog::current_position(&mut conn).await?,
            };
            // Durable before the first change (with the backlog, in
            // its Kafka transaction): a restart resumes here, not at a
            // later "current".
            publisher
                .publish(
                    backlog.as_slice(),
                    &Checkpoint::new(&cdc.name, start.clone()),
                )
                .await?;
            start
        }
    };
    drop(conn);
    summary.started_at = Some(committed.clone());
    tracing::info!(source = %cdc.name, from = %committed, tables = ?cdc.tables, "cdc: reading the binlog");
    eprintln!(
        "cdc {}: reading {} from {committed}",
        cdc.name,
        cdc.tables.join(", ")
    );
    let linger = Duration::from_millis(cdc.batch_linger_ms);
    let limit = cdc.piece_limit();
    let inserts_only = publisher.rows.as_ref().is_some_and(|r| r.inserts_only());
    let columns = publisher.rows.as_ref().and_then(|r| r.columns());
    'connect: loop {
        let reader = tokio::select! {
            _ = &mut shutdown => break 'connect,
            reader = BinlogReader::open(&url, cdc.server_id, &committed, cdc.resume, &cdc.tables, publisher.redaction.clone()) => match reader {
                Ok(reader) => reader.inserts_only(inserts_only).columns_only(columns),
                // A checkpoint without a usable GTID: reconnecting cannot fix it.
                Err(e @ CdcError::Setup(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, from = %committed, "cdc: cannot open the binlog stream; retrying");
                    ready(READY_BINLOG, Some(format!("{e}; retrying in {} ms", backoff.delay().as_millis())));
                    tokio::select! {
                        _ = &mut shutdown => break 'connect,
                        _ = backoff.wait() => {}
                    }
                    continue 'connect;
                }
            },
        };
        ready(READY_BINLOG, None);
        if let Some(state) = reader.resumed_by_gtid() {
            eprintln!(
                "cdc {}: resuming by GTID {state} on server {} (checkpoint {committed}, server {})",
                cdc.name,
                reader.source_server(),
                committed
                    .server_id
                    .map_or("unknown".to_string(), |s| s.to_string())
            );
        }
        let mut reader = binlog::ReadAhead::start(reader, limit);
        let mut batch: Vec<BinlogTransaction> = Vec::new();
        let (mut rows, mut bytes) = (0usize, 0usize);
        // Changes, or the end of a transaction published in pieces (its
        // checkpoint is inside it until then): published after the linger.
        let mut due = false;
        let mut since: Option<Instant> = None;
        // Where the stream has read to: the resume point of the batch's
        // last transaction (a snapshot chunk goes in there).
        let mut read_to = committed.clone();
        if let Some(snapshots) = snapshots.as_mut() {
            snapshots.reset();
        }
        // Wakes the loop for the snapshots' signals and chunks while the
        // stream is idle.
        let mut tick = tokio::time::interval(SNAPSHOT_TICK);
        loop {
            // The snapshots: signals, then a chunk when the batch has room;
            // a chunk goes in when the stream has reached its position.
            let mut full = false;
            if let Some(snapshots) = snapshots.as_mut() {
                if snapshots.poll_signals().await {
                    due = true;
                    since.get_or_insert_with(Instant::now);
                }
                if snapshots.wants_chunk()
                    && !limit.reached(rows, bytes)
                    && snapshots.read_chunk().await
                {
                    due = true;
                    since.get_or_insert_with(Instant::now);
                }
                // Not straight to the next chunk: the stream's ready
                // transactions join the batch first, so a change waits at
                // most one chunk's Kafka transaction.
                if let Some(chunk) = snapshots.reached(&read_to) {
                    rows += chunk.changes.len();
                    due = true;
                    since.get_or_insert_with(Instant::now);
                    batch.push(chunk);
                    full = limit.reached(rows, bytes);
                }
            }
            let wait = since.map(|s| s + if due { linger } else { IDLE_CHECKPOINT });
            let flush_due = async {
                match wait {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let overdue = wait.is_some_and(|at| {
                Instant::now() >= at + if due { GATHER_MAX } else { Duration::ZERO }
            });
            let snapshotting = snapshots.is_some();
            let ticking = async {
                match snapshotting {
                    true => tick.tick().await,
                    false => std::future::pending().await,
                }
            };
            // Biased: a transaction the stream already holds is taken
            // before a due flush, so a batch grows while changes keep
            // coming and is published once the stream has nothing ready,
            // at the batch limit or when overdue; a lone change waits no
            // linger.
            let (stop, next) = if overdue || full {
                (false, None)
            } else {
                tokio::select! {
                    biased;
                    _ = &mut shutdown => (true, None),
                    tx = reader.next_transaction() => (false, Some(tx)),
                    _ = flush_due => (false, None),
                    _ = ticking => continue,
                }
            };
            match next {
                Some(Ok(tx)) => {
                    backoff.reset();
                    if let Some(chunk) = snapshots.as_mut().and_then(|s| s.before(&tx, &read_to)) {
                        rows += chunk.changes.len();
                        due = true;
                        batch.push(chunk);
                    }
                    if tx.continues.is_none() {
                        summary.binlog_transactions += 1;
                    }
                    rows += tx.changes.len();
                    bytes += tx.bytes;
                    due |= !tx.changes.is_empty() || tx.first_row > 0;
                    since.get_or_insert_with(Instant::now);
                    read_to = tx.resume_point().clone();
                    batch.push(tx);
                    if !limit.reached(rows, bytes) {
                        continue;
                    }
                }
                Some(Err(e @ CdcError::PositionGone(_))) => return Err(e),
                Some(Err(e)) => {
                    // What was read is not published: the next stream starts at the checkpoint.
                    tracing::warn!(error = %e, from = %committed, "cdc: binlog stream failed; reconnecting");
                    ready(
                        READY_BINLOG,
                        Some(format!(
                            "{e}; reconnecting in {} ms",
                            backoff.delay().as_millis()
                        )),
                    );
                    tokio::select! {
                        _ = &mut shutdown => break 'connect,
                        _ = backoff.wait() => {}
                    }
                    continue 'connect;
                }
                None => {}
            }
            if let Some(last) = batch.last() {
                // A batch of only other tables' transactions waits
                // IDLE_CHECKPOINT by design: not a change's time.
                if let Some(since) = since.filter(|_| due) {
                    publisher.stages.record("gather", since);
                }
                let position = last.resume_point().clone();
                let state = snapshots.as_ref().and_then(|s| s.persisted());
                summary.changes += publisher
                    .publish(
                        &batch,
                        &Checkpoint::new(&cdc.name, position.clone()).with_snapshot(state),
                    )
                    .await?;
                summary.kafka_transactions += 1;
                committed = position;
                summary.checkpoint = Some(committed.clone());
            } else if due && let Some(snapshots) = snapshots.as_ref() {
                // Only signals changed the state: a checkpoint where the stream is.
                publisher
                    .publish(
                        &[],
                        &Checkpoint::new(&cdc.name, committed.clone())
                            .with_snapshot(snapshots.persisted()),
                    )
                    .await?;
            }
            if let Some(snapshots) = snapshots.as_mut().filter(|_| due || !batch.is_empty()) {
                snapshots.committed().await;
            }
            batch.clear();
            (rows, bytes, due) = (0, 0, false);
            since = None;
            if stop {
                break 'connect;
            }
        }
    }
    summary.stages_ms = publisher.stages.take();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CdcSettings {
        crate::config::Settings::default().cdc
    }

    #[test]
    fn bad_settings_name_the_field_and_what_is_accepted() {
        let mut s = settings();
        s.tables = vec!["shop.table_user".into(), "table_user".into()];
        let e = s.validate().unwrap_err();
        assert!(
            e.contains("cdc.tables[1]") && e.contains("<database>.<table>"),
            "{e}"
        );
        let mut s = settings();
        s.server_id = 0;
        assert!(s.validate().unwrap_err().contains("cdc.server_id"));
        let mut s = settings();
        s.name = "two words".into();
        assert!(s.validate().unwrap_err().contains("cdc.name"));
        settings().validate().unwrap();
    }

    #[test]
    fn the_producer_lingers_only_when_told_to() {
        let mut s = crate::config::Settings::default();
        let options = publisher_options(&s.kafka, &s.producer).unwrap();
        assert_eq!(options["linger.ms"], "0");
        assert_eq!(options["acks"], "all");
        s.producer.options.insert("linger.ms".into(), "20".into());
        let options = publisher_options(&s.kafka, &s.producer).unwrap();
        assert_eq!(options["linger.ms"], "20");
    }

    #[test]
    fn the_source_url_is_a_secret_printed_without_its_password() {
        let overrides = serde_json::json!({"cdc": {"source": "mysql://repl:s3cret@db:3306"}});
        let document = crate::config::Settings::redacted_document(None, &overrides).unwrap();
        assert_eq!(
            document["cdc"]["source"],
            "mysql://repl:__REDACTED__@db:3306"
        );
        let settings = crate::config::Settings::load_with(None, &overrides).unwrap();
        assert!(!format!("{:?}", settings.cdc).contains("s3cret"));
    }

    #[test]
    fn value_format_is_json_by_default_and_a_bad_one_names_the_field_and_the_choices() {
        let load = |v: serde_json::Value| crate::config::Settings::load_with(None, &v);
        let settings = load(serde_json::json!({})).unwrap();
        assert_eq!(settings.cdc.value_format, table_schema::ValueFormat::Json);
        let settings = load(serde_json::json!({"cdc": {"value_format": "avro"}})).unwrap();
        assert_eq!(settings.cdc.value_format, table_schema::ValueFormat::Avro);
        let e = load(serde_json::json!({"cdc": {"value_format": "xml"}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("value_format") && e.contains("json") && e.contains("avro"),
            "{e}"
        );
    }

    #[test]
    fn resume_is_auto_by_default_and_a_bad_one_names_the_field_and_the_choices() {
        let load = |v: serde_json::Value| crate::config::Settings::load_with(None, &v);
        let settings = load(serde_json::json!({})).unwrap();
        assert_eq!(settings.cdc.resume, binlog::ResumeMode::Auto);
        let settings = load(serde_json::json!({"cdc": {"resume": "gtid"}})).unwrap();
        assert_eq!(settings.cdc.resume, binlog::ResumeMode::Gtid);
        let e = load(serde_json::json!({"cdc": {"resume": "file"}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resume")
                && e.contains("auto")
                && e.contains("position")
                && e.contains("gtid"),
            "{e}"
        );
    }

    #[test]
    fn oversize_is_dead_letter_by_default_and_a_bad_one_names_the_field_and_the_choices() {
        let load = |v: serde_json::Value| crate::config::Settings::load_with(None, &v);
        let settings = load(serde_json::json!({})).unwrap();
        assert_eq!(settings.cdc.oversize, oversize::OversizeAction::DeadLetter);
        assert_eq!(settings.cdc.dead_letter_topic(), "cdc.dlq");
        let settings = load(serde_json::json!({"cdc": {"oversize": "truncate", "truncate_columns": {"shop.docs": ["body"]}}})).unwrap();
        assert_eq!(settings.cdc.oversize, oversize::OversizeAction::Truncate);
        assert_eq!(settings.cdc.truncate_columns["shop.docs"], ["body"]);
        let e = load(serde_json::json!({"cdc": {"oversize": "drop"}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("oversize")
                && e.contains("dead_letter")
                && e.contains("truncate")
                && e.contains("fail"),
            "{e}"
        );
        let e = load(serde_json::json!({"cdc": {"truncate_columns": {"docs": ["body"]}}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cdc.truncate_columns.\"docs\"") && e.contains("<database>.<table>"),
            "{e}"
        );
    }

    #[test]
    fn topics_are_one_per_table_and_a_compacted_offsets_topic() {
        let mut s = settings();
        s.tables = vec!["shop.table_user".into()];
        let specs = s.topic_specs();
        assert_eq!(specs[0].name, "cdc.shop.table_user");
        assert_eq!(specs[1].name, "cdc.offsets");
        assert_eq!(
            (
                specs[1].partitions,
                specs[1].configs["cleanup.policy"].as_str()
            ),
            (1, "compact")
        );
        assert_eq!(
            (specs[2].name.as_str(), specs[2].partitions),
            ("cdc.dlq", 1)
        );
        assert_eq!(
            transactional_id("orderpipe-relay", "shop"),
            "orderpipe-relay-cdc-shop"
        );
    }
}
