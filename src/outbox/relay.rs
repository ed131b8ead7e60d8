//! `orderpipe relay`: publishes outbox rows with a transactional producer.
//!
//! One cycle:
//!
//! 1. claim: in a DB transaction, `SELECT ... FOR UPDATE` the oldest unsent
//!    rows of the shards this instance leases, in id order (completed to
//!    whole business transactions, `tx_id`);
//! 2. publish them in **one Kafka transaction** (`order.events.v1` and, for
//!    events that move stock, `inventory.events.v1` together), commit it;
//! 3. mark the rows sent and commit the DB transaction.
//!
//! A crash between 2 and 3 publishes the rows again on the next cycle (same
//! event ids): consumers skip them as duplicates. A crash before 2's commit
//! leaves an open Kafka transaction that the restarted instance (same
//! `transactional.id`) aborts; read-committed consumers never see it.
//!
//! Several relays: shards are leased (`relay_leases`, renewed every few
//! seconds, expiring after `lease_ttl`), each instance taking about an equal
//! share among the live instances (`relay_instances` heartbeats), so one order's rows are published by one
//! instance in order. The claim uses a blocking `FOR UPDATE`, not `SKIP
//! LOCKED`: during a lease handover the new owner waits for the old one's
//! batch instead of skipping past a locked row, which could publish a later
//! event of the same order first.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureRecord, Producer};

use crate::metrics::{MeasuredProducer, measured_producer};
use serde::Serialize;
use sqlx::Row;

use super::SHARDS;
use crate::codec::Codec;
use crate::config::Settings;
use crate::db::{Db, DbError, Dialect};
use crate::envelope::Envelope;
use crate::producer::config::producer_options;
use crate::producer::record_headers;
use crate::retry::now_ms;
use crate::schema::SchemaCatalog;

/// Where the relay may be told to crash (tests of the crash guarantees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashPoint {
    /// After producing a batch, before committing the Kafka transaction.
    BeforeKafkaCommit,
    /// After committing the Kafka transaction, before marking rows sent.
    AfterKafkaCommit,
}

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Stable name of this instance; `transactional.id` is `orderpipe-relay-<instance>`.
    pub instance: String,
    /// Rows per Kafka transaction (completed to whole business transactions).
    pub batch_size: i64,
    /// Wait between polls of an empty outbox.
    pub poll_interval: Duration,
    /// Lease lifetime; renewed every third of it.
    pub lease_ttl: Duration,
    /// Purge sent rows older than this.
    pub sent_retention: Duration,
    /// Exit after this long with nothing to publish.
    pub until_idle: Option<Duration>,
    /// Abort the process at this point of the first batch (tests only).
    pub crash_at: Option<CrashPoint>,
}

/// What a relay run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RelaySummary {
    /// Rows published and marked sent.
    pub published: u64,
    /// Kafka transactions committed.
    pub transactions: u64,
    /// Kafka transactions aborted.
    pub aborted: u64,
    /// Records per topic.
    pub by_topic: BTreeMap<String, u64>,
    /// Sent rows purged.
    pub purged: u64,
    /// Seconds from the first publish to the last.
    pub active_secs: f64,
}

/// Relay failures that stop it.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Kafka setup failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// Producer options conflict.
    #[error(transparent)]
    Options(#[from] crate::producer::config::OptionConflict),
    /// Codec setup failed.
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
    /// Schema missing.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
}

struct Row_ {
    id: i64,
    topic: String,
    key: String,
    envelope: String,
}

/// The relay's state.
pub struct Relay {
    db: Db,
    producer: MeasuredProducer,
    codecs: BTreeMap<String, Codec>,
    options: RelayOptions,
    owned: Vec<i64>,
    renewed_at: Option<Instant>,
    /// What the relay did so far.
    pub summary: RelaySummary,
}

impl Relay {
    /// Builds the transactional producer (fencing any previous incarnation
    /// of this instance) and the codecs of the topics it writes.
    pub async fn new(settings: &Settings, db: Db, options: RelayOptions) -> Result<Self, RelayError> {
        let mut producer_settings = producer_options(&settings.kafka_client_options(), &settings.producer.options)?;
        producer_settings.insert("transactional.id".into(), format!("orderpipe-relay-{}", options.instance));
        // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
        if !producer_settings.contains_key("transaction.timeout.ms") {
            let message_timeout = producer_settings.get("message.timeout.ms").cloned().unwrap_or_else(|| "120000".into());
            producer_settings.insert("transaction.timeout.ms".into(), message_timeout);
        }
        let producer = measured_producer(&producer_settings)?;
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30)))
            .await
            .expect("init task does not panic")?;
        let catalog = SchemaCatalog::embedded();
        let mut codecs = BTreeMap::new();
        for (topic, schema) in [
            (&settings.topics.order_events.name, catalog.order_events()),
            (&settings.topics.inventory_events.name, catalog.inventory_events()?),
        ] {
            let codec = Codec::new(&settings.registry, topic, schema, settings.registry.auto_register)?;
            codec.warm_up().await?;
            codecs.insert(topic.clone(), codec);
        }
        Ok(Self {
            db,
            producer,
            codecs,
            options,
            owned: Vec::new(),
            renewed_at: None,
            summary: RelaySummary::default(),
        })
    }

    /// Runs until `shutdown` or, with `until_idle`, until nothing was
    /// published for that long.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> RelaySummary {
        tokio::pin!(shutdown);
        let mut last_work = Instant::now();
        let mut first_publish = None;
        let mut last_purge = Instant::now();
        let mut last_backlog = Instant::now() - Duration::from_secs(10);
        let mut backoff = Duration::from_millis(100);
        loop {
            if futures::FutureExt::now_or_never(&mut shutdown).is_some() {
                break;
            }
            if let Err(e) = self.balance_leases().await {
                tracing::warn!(error = %e, "relay leases not renewed; retrying");
            }
            match self.cycle().await {
                Ok(0) => {
                    backoff = Duration::from_millis(100);
                    if self.options.until_idle.is_some_and(|idle| last_work.elapsed() >= idle) {
                        break;
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(self.options.poll_interval) => {}
                    }
                }
                Ok(n) => {
                    backoff = Duration::from_millis(100);
                    last_work = Instant::now();
                    let first = *first_publish.get_or_insert(last_work);
                    self.summary.published += n;
                    self.summary.active_secs = first.elapsed().as_secs_f64();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay cycle failed; retrying with backoff");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            if last_backlog.elapsed() > Duration::from_secs(5) {
                last_backlog = Instant::now();
                if let Ok(backlog) = super::backlog(&self.db).await {
                    crate::metrics::outbox(&backlog);
                }
            }
            if last_purge.elapsed() > Duration::from_secs(60) {
                last_purge = Instant::now();
                match super::purge_sent(&self.db, self.options.sent_retention.as_millis() as i64, 1000).await {
                    Ok(n) => self.summary.purged += n,
                    Err(e) => tracing::warn!(error = %e, "purging sent outbox rows failed"),
                }
            }
        }
        self.release_leases().await;
        self.summary
    }

    /// Claims, publishes and marks one batch; returns how many rows.
    async fn cycle(&mut self) -> Result<u64, CycleError> {
        if self.owned.is_empty() {
            return Ok(0);
        }
        let mut tx = self.db.begin().await?;
        let rows = claim(&mut tx, self.db.dialect, &self.owned, self.options.batch_size).await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        self.publish(&rows).await?;
        let mut update = sqlx::QueryBuilder::<sqlx::Any>::new("UPDATE outbox_messages SET sent_ms = ");
        update.push_bind(now_ms()).push(" WHERE id IN (");
        let mut ids = update.separated(", ");
        for row in &rows {
            ids.push_bind(row.id);
        }
        update.push(")");
        update.build().execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    /// One Kafka transaction for the rows.
    async fn publish(&mut self, rows: &[Row_]) -> Result<(), CycleError> {
        // Encode first: a row that cannot be encoded fails the cycle before
        // any transaction is opened.
        let mut encoded = Vec::with_capacity(rows.len());
        for row in rows {
            let envelope = Envelope::from_json(&row.envelope).map_err(|e| CycleError::Row(row.id, e.to_string()))?;
            let codec = self
                .codecs
                .get(&row.topic)
                .ok_or_else(|| CycleError::Row(row.id, format!("no schema for topic {}", row.topic)))?;
            let payload = codec.encode(&envelope).await.map_err(|e| CycleError::Row(row.id, e.to_string()))?;
            encoded.push((row, envelope, payload));
        }
        self.producer.begin_transaction()?;
        let mut deliveries = Vec::with_capacity(rows.len());
        for (row, envelope, payload) in &encoded {
            let record = FutureRecord::to(&row.topic)
                .key(&row.key)
                .payload(&payload)
                .headers(record_headers(envelope));
            match self.producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => {
                    self.abort().await;
                    return Err(e.into());
                }
            }
            *self.summary.by_topic.entry(row.topic.clone()).or_default() += 1;
        }
        if self.options.crash_at == Some(CrashPoint::BeforeKafkaCommit) {
            let _ = self.producer.flush(Duration::from_secs(10));
            tracing::error!("crash point before_kafka_commit: aborting the process");
            std::process::abort();
        }
        let p = self.producer.clone();
        let committed = tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(60)))
            .await
            .expect("commit task does not panic");
        if let Err(e) = committed {
            self.abort().await;
            return Err(e.into());
        }
        for d in deliveries {
            if let Ok(Err((e, _))) = d.await {
                return Err(CycleError::Kafka(e));
            }
        }
        self.summary.transactions += 1;
        crate::metrics::transaction("committed");
        for (row, envelope, _) in &encoded {
            crate::metrics::produced(&row.topic, envelope.event_name.as_str(), 1);
        }
        if self.options.crash_at == Some(CrashPoint::AfterKafkaCommit) {
            tracing::error!("crash point after_kafka_commit: aborting the process");
            std::process::abort();
        }
        Ok(())
    }

    async fn abort(&mut self) {
        let p = self.producer.clone();
        let aborted = tokio::task::spawn_blocking(move || p.abort_transaction(Duration::from_secs(30)))
            .await
            .expect("abort task does not panic");
        if let Err(e) = aborted {
            tracing::warn!(error = %e, "aborting the Kafka transaction failed");
        }
        self.summary.aborted += 1;
        crate::metrics::transaction("aborted");
    }

    /// Renews this instance's leases and moves toward an equal share of the
    /// shards among live instances.
    async fn balance_leases(&mut self) -> Result<(), DbError> {
        let ttl = self.options.lease_ttl;
        if self.renewed_at.is_some_and(|t| t.elapsed() < ttl / 3) {
            return Ok(());
        }
        let me = &self.options.instance;
        let now = now_ms();
        let expires = now + ttl.as_millis() as i64;
        // Presence first: an instance without leases still counts as live.
        let heartbeat = match self.db.dialect {
            Dialect::MySql => {
                "INSERT INTO relay_instances (owner, heartbeat_ms) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE heartbeat_ms = VALUES(heartbeat_ms)"
            }
            Dialect::Sqlite => {
                "INSERT INTO relay_instances (owner, heartbeat_ms) VALUES (?, ?) \
                 ON CONFLICT (owner) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms"
            }
        };
        sqlx::query(heartbeat).bind(me).bind(now).execute(&self.db.pool).await?;
        let live: Vec<(String,)> = sqlx::query_as("SELECT owner FROM relay_instances WHERE heartbeat_ms > ?")
            .bind(now - ttl.as_millis() as i64)
            .fetch_all(&self.db.pool)
            .await?;
        let leases: Vec<(i64, String, i64)> = sqlx::query_as("SELECT shard, owner, expires_ms FROM relay_leases ORDER BY shard")
            .fetch_all(&self.db.pool)
            .await?;
        let live = live.len().max(1);
        let target = (SHARDS as usize).div_ceil(live);
        let mut mine: Vec<i64> = leases
            .iter()
            .filter(|(_, owner, exp)| owner == me && *exp > now)
            .map(|(shard, ..)| *shard)
            .collect();
        // Give back what is above our share, then renew the rest.
        while mine.len() > target {
            let shard = mine.pop().expect("non-empty");
            sqlx::query("UPDATE relay_leases SET owner = '', expires_ms = 0 WHERE shard = ? AND owner = ?")
                .bind(shard)
                .bind(me)
                .execute(&self.db.pool)
                .await?;
        }
        sqlx::query("UPDATE relay_leases SET expires_ms = ? WHERE owner = ? AND expires_ms > ?")
            .bind(expires)
            .bind(me)
            .bind(now)
            .execute(&self.db.pool)
            .await?;
        for (shard, _, exp) in &leases {
            if mine.len() >= target {
                break;
            }
            if *exp <= now {
                let r = sqlx::query("UPDATE relay_leases SET owner = ?, expires_ms = ? WHERE shard = ? AND expires_ms <= ?")
                    .bind(me)
                    .bind(expires)
                    .bind(*shard)
                    .bind(now)
                    .execute(&self.db.pool)
                    .await?;
                if r.rows_affected() == 1 {
                    mine.push(*shard);
                }
            }
        }
        mine.sort_unstable();
        if mine != self.owned {
            tracing::info!(shards = ?mine, "relay shards");
        }
        self.owned = mine;
        self.renewed_at = Some(Instant::now());
        Ok(())
    }

    async fn release_leases(&self) {
        let _ = sqlx::query("UPDATE relay_leases SET owner = '', expires_ms = 0 WHERE owner = ?")
            .bind(&self.options.instance)
            .execute(&self.db.pool)
            .await;
        let _ = sqlx::query("DELETE FROM relay_instances WHERE owner = ?")
            .bind(&self.options.instance)
            .execute(&self.db.pool)
            .await;
    }
}

/// Why a cycle failed (it is retried).
#[derive(Debug, thiserror::Error)]
enum CycleError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("outbox row {0}: {1}")]
    Row(i64, String),
}

impl From<sqlx::Error> for CycleError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e.into())
    }
}

/// The oldest unsent rows of `shards` (locked), completed to whole business
/// transactions.
async fn claim(tx: &mut crate::db::Tx, dialect: Dialect, shards: &[i64], limit: i64) -> Result<Vec<Row_>, DbError> {
    let lock = match dialect {
        Dialect::MySql => " FOR UPDATE",
        Dialect::Sqlite => "", // one writer at a time
    };
    let mut q = sqlx::QueryBuilder::<sqlx::Any>::new(
        "SELECT id, tx_id, topic, message_key, envelope FROM outbox_messages WHERE sent_ms IS NULL AND shard IN (",
    );
    let mut list = q.separated(", ");
    for s in shards {
        list.push_bind(*s);
    }
    q.push(") ORDER BY id LIMIT ").push_bind(limit).push(lock);
    let mut rows = Vec::new();
    let mut last_tx = None;
    for r in q.build().fetch_all(&mut **tx).await? {
        last_tx = Some(r.try_get::<String, _>(1)?);
        rows.push(Row_ {
            id: r.try_get(0)?,
            topic: r.try_get(2)?,
            key: r.try_get(3)?,
            envelope: r.try_get(4)?,
        });
    }
    if let (Some(tx_id), Some(last)) = (last_tx, rows.last().map(|r| r.id)) {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT id, topic, message_key, envelope FROM outbox_messages \
             WHERE tx_id = ? AND id > ? AND sent_ms IS NULL ORDER BY id{lock}"
        ));
        for r in sqlx::query(sql).bind(tx_id).bind(last).fetch_all(&mut **tx).await? {
            rows.push(Row_ {
                id: r.try_get(0)?,
                topic: r.try_get(1)?,
                key: r.try_get(2)?,
                envelope: r.try_get(3)?,
            });
        }
    }
    Ok(rows)
}
