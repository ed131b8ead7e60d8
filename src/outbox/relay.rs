//! `orderpipe relay`: publishes outbox rows with transactional producers,
//! one per shard it leases.
//!
//! One cycle:
//!
//! 1. claim: in a DB transaction, `SELECT ... FOR UPDATE` the oldest unsent
//!    rows of the shards this instance leases, in id order (completed to
//!    whole business transactions, `tx_id`);
//! 2. publish each shard's rows in **one Kafka transaction** of that shard's
//!    producer (`order.events.v1` and, for events that move stock,
//!    `inventory.events.v1` together); the shards' transactions run side by
//!    side;
//! 3. mark the rows of the shards whose Kafka transaction committed as sent,
//!    and commit the DB transaction.
//!
//! A crash between 2 and 3 publishes the rows again on the next cycle (same
//! event ids): consumers skip them as duplicates. A crash before 2's commit
//! leaves open Kafka transactions that the next owner of the shard aborts
//! (or the broker, after `transaction.timeout.ms`); read-committed consumers
//! never see them.
//!
//! Identity and fencing: a `transactional.id` belongs to a shard, not to a
//! pod: `<prefix>-shard-<n>` ([`transactional_id`]). Whoever takes a shard's
//! lease builds that shard's producer and calls `init_transactions`, which
//! fences the previous owner's producer (its next send or commit fails with
//! a fatal error) and aborts the transaction it left open at once. A fenced
//! or otherwise fatally failed producer is dropped; the relay rebuilds it if
//! it still holds the shard's lease, and exits with an error after
//! [`MAX_FATAL_IN_A_ROW`] fatal errors on one shard without a commit between.
//!
//! Several relays: shards are leased (`relay_leases`, renewed every few
//! seconds, expiring after `lease_ttl`), each instance taking about an equal
//! share among the live instances (`relay_instances` heartbeats), so one order's rows are published by one
//! instance in order. The claim uses a blocking `FOR UPDATE`, not `SKIP
//! LOCKED`: during a lease handover the new owner waits for the old one's
//! batch instead of skipping past a locked row, which could publish a later
//! event of the same order first. It waits at most a third of the lease
//! lifetime, so a relay blocked behind a stalled one keeps renewing its
//! leases.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use serde::Serialize;
use sqlx::Row;

use super::SHARDS;
use crate::backoff::Backoff;
use crate::codec::{Codec, RegistrySettings};
use crate::db::{Db, DbError};
use crate::envelope::Envelope;
use crate::kafka::client::{KafkaSettings, MeasuredProducer, OptionConflict, measured_producer, producer_options};
use crate::metrics::name;
use crate::producer::{ProducerSettings, record_headers};
use crate::clock::now_ms;
use crate::schema::SchemaCatalog;
use crate::topics::TopicsSettings;

/// Default `transaction.timeout.ms` of the relay's producers. The broker
/// aborts a transaction left open this long, checking every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s by
/// default), so a relay that dies inside a transaction blocks read-committed
/// consumers for at most 5 + 10 s even when no relay takes over its shards.
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 5_000;

/// Fatal producer errors on one shard, without a commit between them, after
/// which the relay exits (non-zero) instead of rebuilding the producer again.
pub const MAX_FATAL_IN_A_ROW: u32 = 3;

/// The `transactional.id` of a shard's producer.
pub fn transactional_id(prefix: &str, shard: i64) -> String {
    format!("{prefix}-shard-{shard}")
}

/// Where the relay may be told to crash (tests of the crash guarantees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashPoint {
    /// After producing a batch, before committing the Kafka transaction.
    BeforeKafkaCommit,
    /// After committing the Kafka transaction, before marking rows sent.
    AfterKafkaCommit,
    /// After producing a batch, stop the process (SIGSTOP) before committing
    /// the Kafka transaction; it goes on when continued (SIGCONT) or dies
    /// there when killed. Tests use it to kill a relay, or to freeze a
    /// zombie, inside a transaction.
    StallBeforeKafkaCommit,
}

/// What the relay prints on stderr when it stalls at
/// [`CrashPoint::StallBeforeKafkaCommit`].
pub const STALL_MARKER: &str = "relay stalled inside the Kafka transaction";

/// The configuration sections the relay reads
/// ([`crate::startup::relay_sections`] picks them out of the settings).
#[derive(Debug, Clone, Copy)]
pub struct RelaySections<'a> {
    /// The Kafka connection.
    pub kafka: &'a KafkaSettings,
    /// Producer options, checked and layered with the relay's timeouts.
    pub producer: &'a ProducerSettings,
    /// The registry the codecs use.
    pub registry: &'a RegistrySettings,
    /// The order and inventory topics it writes.
    pub topics: &'a TopicsSettings,
}

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Name of this instance in the shard leases (the pod name); unique
    /// among running relays.
    pub instance: String,
    /// Prefix of the per-shard `transactional.id`s (see [`transactional_id`]).
    pub transactional_id_prefix: String,
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
    /// Ends an idle wait early when the API commits new rows (see
    /// [`super::wake`]); None: the relay finds them at its next poll.
    pub wake: Option<std::sync::Arc<super::wake::WakeListener>>,
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
    /// Shard producers dropped after a fatal error (fenced by a newer owner
    /// of the shard, or failed fatally).
    pub fatal: u64,
    /// Shard producers built (`init_transactions`) after the first build of
    /// each shard: rebuilt after a fatal error or re-leased.
    pub rebuilt: u64,
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
    Options(#[from] crate::kafka::client::OptionConflict),
    /// Codec setup failed.
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
    /// Schema missing.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// A shard's producer kept failing fatally; the orchestrator restarts us.
    #[error(
        "shard {shard} (transactional.id {transactional_id}): {MAX_FATAL_IN_A_ROW} fatal producer errors without a commit, \
         last: {last}; is another deployment using the same --transactional-id-prefix, or are the TransactionalId ACLs missing?"
    )]
    Fatal {
        /// The shard.
        shard: i64,
        /// Its producer's transactional id.
        transactional_id: String,
        /// The last error.
        last: String,
    },
}

struct Row_ {
    id: i64,
    shard: i64,
    topic: String,
    key: String,
    envelope: String,
}

/// A row ready to send.
struct Encoded<'a> {
    row: &'a Row_,
    envelope: Envelope,
    payload: Vec<u8>,
}

/// The relay's producer options: the producer options with a
/// transaction timeout ([`DEFAULT_TRANSACTION_TIMEOUT_MS`] unless
/// `producer.options` sets `transaction.timeout.ms`) and a message timeout
/// no longer than it (librdkafka refuses a longer one).
pub fn relay_producer_options(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
) -> Result<BTreeMap<String, String>, OptionConflict> {
    let mut options = producer_options(&kafka.client_options(), &producer.options)?;
    let millis = |key: &str, value: &str| {
        value.trim().parse::<u64>().map_err(|_| {
            OptionConflict(format!("`{key}` = {value:?} is not a whole number of milliseconds"))
        })
    };
    let transaction_timeout = match options.get("transaction.timeout.ms") {
        Some(v) => millis("transaction.timeout.ms", v)?,
        None => DEFAULT_TRANSACTION_TIMEOUT_MS,
    };
    options.insert("transaction.timeout.ms".into(), transaction_timeout.to_string());
    match producer.options.get("message.timeout.ms") {
        Some(v) if millis("message.timeout.ms", v)? > transaction_timeout => {
            return Err(OptionConflict(format!(
                "message.timeout.ms={v} is longer than the relay's transaction.timeout.ms={transaction_timeout}: \
                 it must be at most that (or set a longer transaction.timeout.ms, which lets a dead relay block \
                 read-committed consumers longer)"
            )));
        }
        Some(_) => {}
        None => {
            options.insert("message.timeout.ms".into(), transaction_timeout.to_string());
        }
    }
    Ok(options)
}

/// Builds the transactional producer of `shard` and fences every earlier
/// producer of it: `init_transactions` aborts the transaction a previous
/// owner left open and makes that owner's next send or commit fail.
async fn fenced_shard_producer(
    options: &BTreeMap<String, String>,
    prefix: &str,
    shard: i64,
) -> Result<MeasuredProducer, KafkaError> {
    let id = transactional_id(prefix, shard);
    let mut options = options.clone();
    options.insert("transactional.id".into(), id.clone());
    // The statistics and the broker's logs then name the shard.
    options.entry("client.id".into()).or_insert(id);
    let producer = measured_producer(&options)?;
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30)))
        .await
        .expect("init task does not panic")?;
    Ok(producer)
}

/// Whether a producer error leaves the producer unusable: fenced by a newer
/// producer with the same `transactional.id`, or in librdkafka's fatal state.
fn is_fatal(error: &KafkaError, producer: &MeasuredProducer) -> bool {
    let fatal_code = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        )
    );
    fatal_code
        || matches!(error, KafkaError::Transaction(e) if e.is_fatal())
        || producer.client().fatal_error().is_some()
}

/// The metric and log label of a fatal error.
fn fatal_reason(error: &KafkaError) -> &'static str {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced) => "fenced",
        _ => "fatal",
    }
}

/// How one shard's Kafka transaction of a cycle ended.
enum ShardOutcome {
    Committed,
    /// Aborted; the producer stays usable.
    Aborted(KafkaError),
    /// The producer is unusable and must be dropped.
    Fatal(KafkaError),
}

/// The relay's state.
pub struct Relay {
    db: Db,
    producer_options: BTreeMap<String, String>,
    /// The producer of each leased shard, fenced in on taking the lease.
    producers: BTreeMap<i64, MeasuredProducer>,
    /// Shards that had a producer once (a later build is a rebuild).
    built: BTreeSet<i64>,
    /// Fatal errors per shard since its last commit.
    fatal_in_a_row: BTreeMap<i64, u32>,
    /// Set when a shard's producer failed fatally too often.
    give_up: Option<RelayError>,
    codecs: BTreeMap<String, Codec>,
    options: RelayOptions,
    owned: Vec<i64>,
    /// Fewer shards than our share, or a leased shard without a producer:
    /// the leases are checked every second instead of every `lease_ttl/3`.
    short: bool,
    renewed_at: Option<Instant>,
    /// What the relay did so far.
    pub summary: RelaySummary,
}

impl Relay {
    /// Checks the producer options and builds the codecs of the topics it
    /// writes. Shard producers are built (fencing their previous owners) as
    /// the relay takes the shards' leases.
    pub async fn new(settings: RelaySections<'_>, db: Db, options: RelayOptions) -> Result<Self, RelayError> {
        let prefix = &options.transactional_id_prefix;
        if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(OptionConflict(format!(
                "--transactional-id-prefix {prefix:?}: must be non-empty, without spaces (ids are <prefix>-shard-<0..{}>)",
                SHARDS - 1
            ))
            .into());
        }
        let producer_options = relay_producer_options(settings.kafka, settings.producer)?;
        // A bad option fails here, at start, not at the first lease.
        let _ = measured_producer(&producer_options)?;
        let catalog = SchemaCatalog::embedded();
        let mut codecs = BTreeMap::new();
        for (topic, schema) in [
            (&settings.topics.order_events.name, catalog.order_events()),
            (&settings.topics.inventory_events.name, catalog.inventory_events()?),
        ] {
            let codec = Codec::new(settings.registry, topic, schema, settings.registry.auto_register)?;
            codec.warm_up().await?;
            codecs.insert(topic.clone(), codec);
        }
        Ok(Self {
            db,
            producer_options,
            producers: BTreeMap::new(),
            built: BTreeSet::new(),
            fatal_in_a_row: BTreeMap::new(),
            give_up: None,
            codecs,
            options,
            owned: Vec::new(),
            short: true,
            renewed_at: None,
            summary: RelaySummary::default(),
        })
    }

    /// Runs until `shutdown` or, with `until_idle`, until nothing was
    /// published for that long. Fails when a shard's producer keeps failing
    /// fatally ([`RelayError::Fatal`]), after giving its leases back.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<RelaySummary, RelayError> {
        tokio::pin!(shutdown);
        let mut last_work = Instant::now();
        let mut first_publish = None;
        let mut last_purge = Instant::now();
        let mut last_backlog = Instant::now() - Duration::from_secs(10);
        // Backing off longer than a third of the lease lifetime would let our
        // leases lapse while we sleep. Not `backoff::until_available`: the
        // leases are renewed between two attempts.
        let mut backoff = Backoff::capped((self.options.lease_ttl / 3).min(Duration::from_secs(30)));
        loop {
            if futures::FutureExt::now_or_never(&mut shutdown).is_some() {
                break;
            }
            if let Err(e) = self.balance_leases().await {
                tracing::warn!(error = %e, "relay leases not renewed; retrying");
            }
            if let Some(fatal) = self.give_up.take() {
                tracing::error!(error = %fatal, "relay gives up");
                self.release_leases().await;
                return Err(fatal);
            }
            match self.cycle().await {
                Ok(0) => {
                    backoff.reset();
                    if self.options.until_idle.is_some_and(|idle| last_work.elapsed() >= idle) {
                        break;
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = super::wake::idle(self.options.wake.as_deref(), self.options.poll_interval) => {}
                    }
                }
                Ok(n) => {
                    backoff.reset();
                    last_work = Instant::now();
                    let first = *first_publish.get_or_insert(last_work);
                    self.summary.published += n;
                    self.summary.active_secs = first.elapsed().as_secs_f64();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay cycle failed; retrying with backoff");
                    backoff.wait().await;
                }
            }
            if last_backlog.elapsed() > Duration::from_secs(5) {
                last_backlog = Instant::now();
                if let Ok(backlog) = super::backlog(&self.db).await {
                    backlog.report();
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
        Ok(self.summary)
    }

    /// Claims a batch of the shards with a producer, publishes each shard's
    /// rows in its own Kafka transaction and marks the committed ones sent;
    /// returns how many rows.
    async fn cycle(&mut self) -> Result<u64, CycleError> {
        let shards: Vec<i64> = self.producers.keys().copied().collect();
        if shards.is_empty() {
            return Ok(0);
        }
        let mut tx = self.db.begin().await?;
        // Rows locked by a stalled relay: give up after a third of the
        // lease lifetime (and retry) rather than let our leases lapse.
        tx.lock_wait_timeout((self.options.lease_ttl.as_secs() / 3).max(1)).await?;
        let rows = claim(&mut tx, &shards, self.options.batch_size).await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        let encoded = self.encode(&rows).await?;
        let outcomes = self.publish(&encoded).await;
        let committed: Vec<i64> = encoded
            .iter()
            .filter(|e| matches!(outcomes.get(&e.row.shard), Some(ShardOutcome::Committed)))
            .map(|e| e.row.id)
            .collect();
        if !committed.is_empty() {
            let mut update = sqlx::QueryBuilder::<sqlx::Any>::new("UPDATE outbox_messages SET sent_ms = ");
            update.push_bind(now_ms()).push(" WHERE id IN (");
            let mut ids = update.separated(", ");
            for id in &committed {
                ids.push_bind(*id);
            }
            update.push(")");
            update.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        let mut failure = None;
        for (shard, outcome) in outcomes {
            match outcome {
                ShardOutcome::Committed => {
                    self.fatal_in_a_row.remove(&shard);
                }
                ShardOutcome::Aborted(e) => {
                    tracing::warn!(shard, error = %e, "Kafka transaction aborted; its rows stay unsent and are retried");
                    failure = Some(e);
                }
                ShardOutcome::Fatal(e) => {
                    self.drop_fatal_producer(shard, &e);
                    failure = Some(e);
                }
            }
        }
        match failure {
            Some(e) if committed.is_empty() => Err(CycleError::Kafka(e)),
            _ => Ok(committed.len() as u64),
        }
    }

    /// Encodes every row first: a row that cannot be encoded fails the cycle
    /// before any transaction is opened.
    async fn encode<'a>(&self, rows: &'a [Row_]) -> Result<Vec<Encoded<'a>>, CycleError> {
        let mut encoded = Vec::with_capacity(rows.len());
        for row in rows {
            let envelope = Envelope::from_json(&row.envelope).map_err(|e| CycleError::Row(row.id, e.to_string()))?;
            let codec = self
                .codecs
                .get(&row.topic)
                .ok_or_else(|| CycleError::Row(row.id, format!("no schema for topic {}", row.topic)))?;
            let payload = codec.encode(&envelope).await.map_err(|e| CycleError::Row(row.id, e.to_string()))?;
            encoded.push(Encoded { row, envelope, payload });
        }
        Ok(encoded)
    }

    /// One Kafka transaction per shard for the rows, all shards side by side.
    async fn publish(&mut self, encoded: &[Encoded<'_>]) -> BTreeMap<i64, ShardOutcome> {
        let mut by_shard: BTreeMap<i64, Vec<&Encoded<'_>>> = BTreeMap::new();
        for e in encoded {
            by_shard.entry(e.row.shard).or_default().push(e);
        }
        let mut outcomes = BTreeMap::new();
        // Produce: open each shard's transaction and queue its records.
        let mut open: Vec<(i64, MeasuredProducer, Vec<DeliveryFuture>)> = Vec::new();
        for (&shard, batch) in &by_shard {
            // A business transaction spanning orders of several shards can
            // pull in a row of a shard we do not publish: its owner will.
            let Some(producer) = self.producers.get(&shard).cloned() else { continue };
            match produce(&producer, batch) {
                Ok(deliveries) => open.push((shard, producer, deliveries)),
                Err(e) => {
                    outcomes.insert(shard, abort_or_fatal(&producer, e).await);
                }
            }
        }
        if matches!(
            self.options.crash_at,
            Some(CrashPoint::BeforeKafkaCommit | CrashPoint::StallBeforeKafkaCommit)
        ) && !open.is_empty()
        {
            for (_, producer, _) in &open {
                let _ = producer.flush(Duration::from_secs(10));
            }
            if self.options.crash_at == Some(CrashPoint::BeforeKafkaCommit) {
                tracing::error!("crash point before_kafka_commit: aborting the process");
                std::process::abort();
            }
            self.options.crash_at = None;
            eprintln!("{STALL_MARKER} (pid {})", std::process::id());
            // SAFETY: raise only sends a signal to this process.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        // Commit: each shard's transaction, together. Its records'
        // acknowledgements are awaited first: the client's commit flushes
        // before committing, and that flush polls in 100 ms steps while
        // anything is in flight, a fixed ~100 ms per transaction. With every
        // record acknowledged it returns at once. A record the broker refused
        // aborts the transaction (nothing of it becomes visible).
        let commits = open.into_iter().map(|(shard, producer, deliveries)| async move {
            let started = std::time::Instant::now();
            let refused = futures::future::join_all(deliveries).await.into_iter().find_map(|delivery| match delivery {
                Ok(Ok(_)) => None,
                Ok(Err((e, _))) => Some(e),
                Err(_canceled) => Some(KafkaError::Canceled),
            });
            if let Some(e) = refused {
                return (shard, abort_or_fatal(&producer, e).await);
            }
            let p = producer.clone();
            let committed = tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(60)))
                .await
                .expect("commit task does not panic");
            let outcome = match committed {
                Ok(()) => {
                    commit_time(started.elapsed());
                    ShardOutcome::Committed
                }
                Err(e) => abort_or_fatal(&producer, e).await,
            };
            (shard, outcome)
        });
        for (shard, outcome) in futures::future::join_all(commits).await {
            outcomes.insert(shard, outcome);
        }
        for (shard, outcome) in &outcomes {
            match outcome {
                ShardOutcome::Committed => {
                    self.summary.transactions += 1;
                    transaction("committed");
                    for e in &by_shard[shard] {
                        *self.summary.by_topic.entry(e.row.topic.clone()).or_default() += 1;
                        crate::producer::produced(&e.row.topic, e.envelope.event_name.as_str(), 1);
                    }
                }
                ShardOutcome::Aborted(_) | ShardOutcome::Fatal(_) => {
                    self.summary.aborted += 1;
                    transaction("aborted");
                }
            }
        }
        if self.options.crash_at == Some(CrashPoint::AfterKafkaCommit) {
            tracing::error!("crash point after_kafka_commit: aborting the process");
            std::process::abort();
        }
        outcomes
    }

    /// Drops a shard's producer after a fatal error; the next lease check
    /// rebuilds it if the shard is still ours.
    fn drop_fatal_producer(&mut self, shard: i64, error: &KafkaError) {
        self.producers.remove(&shard);
        let reason = fatal_reason(error);
        tracing::error!(
            shard,
            transactional_id = %transactional_id(&self.options.transactional_id_prefix, shard),
            reason,
            error = %error,
            "shard producer failed fatally: dropped; rebuilt if the shard's lease is still ours"
        );
        relay_producer_fatal(reason);
        self.summary.fatal += 1;
        let n = self.fatal_in_a_row.entry(shard).or_default();
        *n += 1;
        if *n >= MAX_FATAL_IN_A_ROW && self.give_up.is_none() {
            self.give_up = Some(RelayError::Fatal {
                shard,
                transactional_id: transactional_id(&self.options.transactional_id_prefix, shard),
                last: error.to_string(),
            });
        }
        // Check the lease now rather than at the next renewal.
        self.renewed_at = None;
    }

    /// Builds (fencing in) the producers of the shards we lease and have none
    /// for, and of `fresh` shards (leased again after a lapse: whoever held
    /// them meanwhile fenced our old producer); drops those of shards we no
    /// longer lease.
    async fn sync_producers(&mut self, fresh: &BTreeSet<i64>) {
        let owned: BTreeSet<i64> = self.owned.iter().copied().collect();
        self.producers.retain(|shard, _| owned.contains(shard) && !fresh.contains(shard));
        let missing: Vec<i64> = owned.iter().filter(|s| !self.producers.contains_key(s)).copied().collect();
        let options = &self.producer_options;
        let prefix = &self.options.transactional_id_prefix;
        let built = futures::future::join_all(
            missing.iter().map(|&shard| async move { (shard, fenced_shard_producer(options, prefix, shard).await) }),
        )
        .await;
        for (shard, result) in built {
            match result {
                Ok(producer) => {
                    if !self.built.insert(shard) {
                        self.summary.rebuilt += 1;
                    }
                    self.producers.insert(shard, producer);
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "shard producer not built; retrying at the next lease check");
                    if matches!(&e, KafkaError::Transaction(t) if t.is_fatal()) {
                        let n = self.fatal_in_a_row.entry(shard).or_default();
                        *n += 1;
                        if *n >= MAX_FATAL_IN_A_ROW && self.give_up.is_none() {
                            self.give_up = Some(RelayError::Fatal {
                                shard,
                                transactional_id: transactional_id(prefix, shard),
                                last: e.to_string(),
                            });
                        }
                    }
                }
            }
        }
        relay_shards(self.producers.len());
    }

    /// Renews this instance's leases and moves toward an equal share of the
    /// shards among live instances.
    async fn balance_leases(&mut self) -> Result<(), DbError> {
        let ttl = self.options.lease_ttl;
        let every = if self.short { (ttl / 3).min(Duration::from_secs(1)) } else { ttl / 3 };
        if self.renewed_at.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        let me = &self.options.instance;
        let now = now_ms();
        let expires = now + ttl.as_millis() as i64;
        // Presence first: an instance without leases still counts as live.
        let heartbeat = self.db.sql().upsert("relay_instances", "owner, heartbeat_ms", "owner", &["heartbeat_ms"]);
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
        let mut fresh = BTreeSet::new();
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
                    fresh.insert(*shard);
                }
            }
        }
        mine.sort_unstable();
        if mine != self.owned {
            tracing::info!(shards = ?mine, "relay shards");
        }
        self.owned = mine;
        self.renewed_at = Some(Instant::now());
        self.sync_producers(&fresh).await;
        self.short = self.owned.len() < target || self.producers.len() < self.owned.len();
        Ok(())
    }

    async fn release_leases(&mut self) {
        // No transaction is open between cycles: the producers just close.
        self.producers.clear();
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

/// Opens a transaction on `producer` and queues `batch` in it.
fn produce(producer: &MeasuredProducer, batch: &[&Encoded<'_>]) -> Result<Vec<DeliveryFuture>, KafkaError> {
    producer.begin_transaction()?;
    let mut deliveries = Vec::with_capacity(batch.len());
    for e in batch {
        let record = FutureRecord::to(&e.row.topic)
            .key(&e.row.key)
            .payload(&e.payload)
            .headers(record_headers(&e.envelope));
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    Ok(deliveries)
}

/// After a failed send or commit: a fatal error leaves the producer to be
/// dropped; otherwise the transaction is aborted, and a producer that cannot
/// even abort is treated as fatally failed too (rebuilding it aborts the
/// transaction on the broker).
async fn abort_or_fatal(producer: &MeasuredProducer, error: KafkaError) -> ShardOutcome {
    if is_fatal(&error, producer) {
        return ShardOutcome::Fatal(error);
    }
    let p = producer.clone();
    let aborted = tokio::task::spawn_blocking(move || p.abort_transaction(Duration::from_secs(30)))
        .await
        .expect("abort task does not panic");
    match aborted {
        Ok(()) => ShardOutcome::Aborted(error),
        Err(abort_error) => {
            tracing::warn!(error = %abort_error, "aborting the Kafka transaction failed");
            ShardOutcome::Fatal(abort_error)
        }
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
async fn claim(tx: &mut crate::db::Tx, shards: &[i64], limit: i64) -> Result<Vec<Row_>, DbError> {
    let mut q = sqlx::QueryBuilder::<sqlx::Any>::new(
        "SELECT id, tx_id, topic, message_key, envelope, shard FROM outbox_messages WHERE sent_ms IS NULL AND shard IN (",
    );
    let mut list = q.separated(", ");
    for s in shards {
        list.push_bind(*s);
    }
    q.push(") ORDER BY id LIMIT ").push_bind(limit).push(tx.sql().row_lock());
    let mut rows = Vec::new();
    let mut last_tx = None;
    for r in q.build().fetch_all(&mut **tx).await? {
        last_tx = Some(r.try_get::<String, _>(1)?);
        rows.push(Row_ {
            id: r.try_get(0)?,
            topic: r.try_get(2)?,
            key: r.try_get(3)?,
            envelope: r.try_get(4)?,
            shard: r.try_get(5)?,
        });
    }
    if let (Some(tx_id), Some(last)) = (last_tx, rows.last().map(|r| r.id)) {
        let sql = tx.sql().locking(
            "SELECT id, topic, message_key, envelope, shard FROM outbox_messages \
             WHERE tx_id = ? AND id > ? AND sent_ms IS NULL ORDER BY id",
        );
        for r in sqlx::query(sql).bind(tx_id).bind(last).fetch_all(&mut **tx).await? {
            rows.push(Row_ {
                id: r.try_get(0)?,
                topic: r.try_get(1)?,
                key: r.try_get(2)?,
                envelope: r.try_get(3)?,
                shard: r.try_get(4)?,
            });
        }
    }
    Ok(rows)
}


/// A shard's Kafka transaction committed: the time from its last record
/// queued to the commit's return (acknowledgements plus the commit itself).
fn commit_time(elapsed: Duration) {
    histogram!(name::RELAY_COMMIT_SECONDS).record(elapsed.as_secs_f64());
}

/// A relay transaction ended.
fn transaction(outcome: &'static str) {
    counter!(name::TRANSACTIONS, "outcome" => outcome).increment(1);
}

/// A relay shard producer failed fatally and was dropped.
fn relay_producer_fatal(reason: &'static str) {
    counter!(name::RELAY_PRODUCER_FATAL, "reason" => reason).increment(1);
}

/// The shards a relay publishes now.
fn relay_shards(n: usize) {
    gauge!(name::RELAY_SHARDS).set(n as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn options_with(pairs: &[(&str, &str)]) -> Result<BTreeMap<String, String>, OptionConflict> {
        let mut settings = Settings::default();
        settings.producer.options = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        relay_producer_options(&settings.kafka, &settings.producer)
    }

    #[test]
    fn the_transaction_timeout_bounds_the_message_timeout() {
        let o = options_with(&[]).unwrap();
        assert_eq!(o["transaction.timeout.ms"], DEFAULT_TRANSACTION_TIMEOUT_MS.to_string());
        assert_eq!(o["message.timeout.ms"], DEFAULT_TRANSACTION_TIMEOUT_MS.to_string());
        let o = options_with(&[("transaction.timeout.ms", "20000")]).unwrap();
        assert_eq!(o["message.timeout.ms"], "20000");
        let o = options_with(&[("message.timeout.ms", "3000")]).unwrap();
        assert_eq!((o["transaction.timeout.ms"].as_str(), o["message.timeout.ms"].as_str()), ("5000", "3000"));
        let e = options_with(&[("message.timeout.ms", "120000")]).unwrap_err().to_string();
        assert!(e.contains("message.timeout.ms=120000") && e.contains("transaction.timeout.ms=5000"), "{e}");
        let e = options_with(&[("transaction.timeout.ms", "10s")]).unwrap_err().to_string();
        assert!(e.contains("transaction.timeout.ms") && e.contains("milliseconds"), "{e}");
    }

    #[test]
    fn transactional_ids_belong_to_shards() {
        assert_eq!(transactional_id("orderpipe-relay", 7), "orderpipe-relay-shard-7");
    }
}
