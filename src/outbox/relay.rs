//! `orderpipe relay`: publishes outbox rows with transactional producers,
//! one per shard it leases, each shard a pipeline of its own ([`shard`]).
//!
//! A shard's pipeline, one batch at a time:
//!
//! 1. claim: read the oldest unsent rows of the shard (no row locks), in id
//!    order, completed to whole business transactions (`tx_id`);
//! 2. publish them in **one Kafka transaction** of the shard's producer
//!    (`order.events.v1` and, for events that move stock,
//!    `inventory.events.v1` together), while the next batch is claimed and
//!    encoded;
//! 3. mark the rows sent once the Kafka transaction committed, while the
//!    next batch's Kafka transaction runs.
//!
//! The shards run side by side. A crash between 2 and 3 publishes the rows
//! again when the shard restarts (same event ids): consumers skip them as
//! duplicates. A crash before 2's commit leaves open Kafka transactions
//! that the next owner of the shard aborts (or the broker, after
//! `transaction.timeout.ms`); read-committed consumers never see them.
//!
//! Identity and fencing: a `transactional.id` belongs to a shard, not to a
//! pod: `<prefix>-shard-<n>` ([`transactional_id`]). Whoever takes a shard's
//! lease builds that shard's producer and calls `init_transactions`, which
//! fences the previous owner's producer (its next send or commit fails with
//! a fatal error) and aborts the transaction it left open at once. That is
//! what makes the new owner the shard's only publisher, so the claim needs
//! no row locks: a previous owner still running can no longer commit. A
//! fenced or otherwise fatally failed producer is dropped; the relay
//! rebuilds it if it still holds the shard's lease, and exits with an error
//! after [`MAX_FATAL_IN_A_ROW`] fatal errors on one shard without a commit
//! between.
//!
//! Several relays: shards are leased (`relay_leases`, renewed every few
//! seconds, expiring after `lease_ttl`), each instance taking about an
//! equal share among the live instances (`relay_instances` heartbeats), so
//! one order's rows are published by one instance in order. A shard given
//! back is stopped first (its current transaction finished, its commits
//! marked), so its next owner does not publish those rows again.
//!
//! A row that can never be published (over the record limit) never stops
//! its shard: it is dead-lettered to `topics.dead_letter` in the batch's
//! Kafka transaction and marked dead, and the later rows of its order wait
//! behind it ([`shard`]; docs/operations.md).

mod shard;

pub use shard::MARK_DEPTH;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::SHARDS;
use super::limits::Limits;
use crate::clock::now_ms;
use crate::codec::{Codec, RegistrySettings};
use crate::db::{Db, DbError};
use crate::kafka::client::{KafkaSettings, MeasuredProducer, OptionConflict, measured_producer};
use crate::metrics::name;
use crate::producer::{ProducerSettings, transactional};
use crate::schema::SchemaCatalog;
use crate::topics::TopicsSettings;

pub use crate::producer::transactional::DEFAULT_TRANSACTION_TIMEOUT_MS;

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
    /// The order and inventory topics it writes, and the dead-letter topic
    /// of rows it cannot publish.
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
    /// Rows dead-lettered (over the record limit) and marked dead.
    pub dead_lettered: u64,
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
    /// Where a batch's time goes, per stage of the shard pipelines
    /// (`claim`, `encode`, `produce`, `commit`, `mark`), in milliseconds.
    pub stages_ms: BTreeMap<String, StageTimes>,
}

pub use crate::stages::StageTimes;

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

/// The codecs of the topics an outbox row may name (order and inventory
/// events), their schemas registered (or looked up) at once.
pub(crate) async fn topic_codecs(
    registry: &RegistrySettings,
    topics: &TopicsSettings,
) -> Result<BTreeMap<String, Codec>, RelayError> {
    let catalog = SchemaCatalog::embedded();
    let mut codecs = BTreeMap::new();
    for (topic, schema) in [
        (&topics.order_events.name, catalog.order_events()),
        (&topics.inventory_events.name, catalog.inventory_events()?),
    ] {
        let codec = Codec::new(registry, topic, schema, registry.auto_register)?;
        codec.warm_up().await?;
        codecs.insert(topic.clone(), codec);
    }
    Ok(codecs)
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

/// Whether a send or commit failed because the broker did not answer in
/// time (a delivery or request timeout), after which the producer is renewed.
fn is_timeout(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageTimedOut
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::OperationTimedOut
        )
    )
}

/// The metric and log label of a fatal error.
fn fatal_reason(error: &KafkaError) -> &'static str {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced) => "fenced",
        _ => "fatal",
    }
}

/// How one shard's Kafka transaction ended.
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
    /// The pipeline of each leased shard, with its producer fenced in on
    /// taking the lease.
    shards: BTreeMap<i64, ShardHandle>,
    /// What every shard pipeline shares (database, codecs, wake-ups).
    shared: Arc<shard::ShardShared>,
    /// Bumped on a wake-up: idle shards claim at once.
    wake: watch::Sender<u64>,
    /// Reports of the shard tasks.
    events: mpsc::UnboundedReceiver<shard::ShardEvent>,
    events_tx: mpsc::UnboundedSender<shard::ShardEvent>,
    /// Shards that had a producer once (a later build is a rebuild).
    built: BTreeSet<i64>,
    /// Fatal errors per shard since its last commit.
    fatal_in_a_row: BTreeMap<i64, u32>,
    /// Set when a shard's producer failed fatally too often.
    give_up: Option<RelayError>,
    options: RelayOptions,
    owned: Vec<i64>,
    /// Fewer shards than our share, or a leased shard without a pipeline:
    /// the leases are checked every second instead of every `lease_ttl/3`.
    short: bool,
    renewed_at: Option<Instant>,
    /// What the relay did so far.
    pub summary: RelaySummary,
}

/// A running shard pipeline.
struct ShardHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<shard::ShardExit>,
}

impl Relay {
    /// Checks the producer options and builds the codecs of the topics it
    /// writes. Shard producers are built (fencing their previous owners) as
    /// the relay takes the shards' leases.
    pub async fn new(
        settings: RelaySections<'_>,
        db: Db,
        options: RelayOptions,
    ) -> Result<Self, RelayError> {
        let prefix = &options.transactional_id_prefix;
        if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(OptionConflict(format!(
                "--transactional-id-prefix {prefix:?}: must be non-empty, without spaces (ids are <prefix>-shard-<0..{}>)",
                SHARDS - 1
            ))
            .into());
        }
        let producer_options = transactional::options(settings.kafka, settings.producer)?;
        // A bad option fails here, at start, not at the first lease.
        let _ = measured_producer(&producer_options)?;
        let limits = Arc::new(Limits::new(
            Some(settings.kafka.clone()),
            producer_options.clone(),
        ));
        let topics = settings.topics;
        limits
            .load(&[
                &topics.order_events.name,
                &topics.inventory_events.name,
                &topics.dead_letter.name,
            ])
            .await;
        let codecs = topic_codecs(settings.registry, settings.topics).await?;
        let (wake, wake_rx) = watch::channel(0u64);
        let (events_tx, events) = mpsc::unbounded_channel();
        let shared = Arc::new(shard::ShardShared {
            db: db.clone(),
            codecs,
            limits,
            dead_letter_topic: topics.dead_letter.name.clone(),
            batch_size: options.batch_size.max(1) as usize,
            poll_interval: options.poll_interval,
            stop_grace: options.lease_ttl / 3,
            wake: wake_rx,
            stages: crate::stages::StageClock::new(name::RELAY_STAGE_SECONDS),
            busy: AtomicUsize::new(0),
        });
        Ok(Self {
            db,
            producer_options,
            shards: BTreeMap::new(),
            shared,
            wake,
            events,
            events_tx,
            built: BTreeSet::new(),
            fatal_in_a_row: BTreeMap::new(),
            give_up: None,
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
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<RelaySummary, RelayError> {
        tokio::pin!(shutdown);
        let mut last_work = Instant::now();
        let mut first_publish = None;
        let mut last_purge = Instant::now();
        let mut last_backlog = Instant::now() - Duration::from_secs(10);
        // Counting a large backlog reads every unsent entry of the index
        // (1M rows: ~1.5 s of MariaDB): measured again after at least ten
        // times the last count's duration, so it takes at most a tenth of
        // a database core away from publishing.
        let mut backlog_every = Duration::from_secs(5);
        // Wake-ups from the API end the idle waits of every shard.
        let forward_wakes = self.options.wake.clone().map(|listener| {
            let wake = self.wake.clone();
            tokio::spawn(async move {
                loop {
                    if listener.wait(Duration::from_secs(3600)).await {
                        wake.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
            })
        });
        let result = loop {
            if let Err(e) = self.balance_leases().await {
                tracing::warn!(error = %e, "relay leases not renewed; retrying");
            }
            if self.reap_finished_shards().await {
                // A shard to rebuild is work pending, however long ago the
                // last commit was (a relay stopped by SIGSTOP or a paused
                // VM wakes to fenced shards and an old clock).
                last_work = Instant::now();
            }
            if let Some(fatal) = self.give_up.take() {
                tracing::error!(error = %fatal, "relay gives up");
                break Err(fatal);
            }
            if self.shared.busy.load(Ordering::Relaxed) > 0 {
                last_work = Instant::now();
            } else if self
                .options
                .until_idle
                .is_some_and(|idle| last_work.elapsed() >= idle)
            {
                break Ok(());
            }
            if last_backlog.elapsed() > backlog_every {
                last_backlog = Instant::now();
                if let Ok(backlog) = super::backlog(&self.db).await {
                    backlog.report();
                }
                backlog_every = (last_backlog.elapsed() * 10).max(Duration::from_secs(5));
            }
            if last_purge.elapsed() > Duration::from_secs(60) {
                last_purge = Instant::now();
                match super::purge_sent(
                    &self.db,
                    self.options.sent_retention.as_millis() as i64,
                    1000,
                )
                .await
                {
                    Ok(n) => self.summary.purged += n,
                    Err(e) => tracing::warn!(error = %e, "purging sent outbox rows failed"),
                }
            }
            // The leases and the shard tasks are looked after every 200 ms;
            // the shards publish on their own meanwhile.
            tokio::select! {
                _ = &mut shutdown => break Ok(()),
                Some(event) = self.events.recv() => {
                    if self.record(event) {
                        last_work = Instant::now();
                        let first = *first_publish.get_or_insert(last_work);
                        self.summary.active_secs = first.elapsed().as_secs_f64();
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        };
        if let Some(task) = forward_wakes {
            task.abort();
        }
        self.stop_all_shards().await;
        while let Ok(event) = self.events.try_recv() {
            self.record(event);
        }
        self.summary.stages_ms = self.shared.stages.take();
        self.release_leases().await;
        result.map(|()| self.summary)
    }

    /// Adds a shard's report to the summary; true when rows were published.
    fn record(&mut self, event: shard::ShardEvent) -> bool {
        match event {
            shard::ShardEvent::Committed {
                shard,
                rows,
                dead,
                by_topic,
            } => {
                self.fatal_in_a_row.remove(&shard);
                self.summary.published += rows;
                self.summary.dead_lettered += dead;
                self.summary.transactions += 1;
                for (topic, n) in by_topic {
                    *self.summary.by_topic.entry(topic).or_default() += n;
                }
                true
            }
            shard::ShardEvent::Aborted => {
                self.summary.aborted += 1;
                false
            }
        }
    }

    /// Collects the shard tasks that ended on their own (a fatal producer
    /// error): their producers are dropped and rebuilt at the next lease
    /// check if the shard is still ours. True when one of them is to be
    /// rebuilt.
    async fn reap_finished_shards(&mut self) -> bool {
        let mut rebuild = false;
        let finished: Vec<i64> = self
            .shards
            .iter()
            .filter(|(_, h)| h.task.is_finished())
            .map(|(s, _)| *s)
            .collect();
        for shard in finished {
            let handle = self.shards.remove(&shard).expect("listed");
            match handle.task.await {
                Ok(shard::ShardExit::Stopped) => continue,
                Ok(shard::ShardExit::Fatal(e)) => self.drop_fatal_producer(shard, &e),
                Ok(shard::ShardExit::TimedOut(e)) => self.renew_timed_out_producer(shard, &e),
                Err(panic) => {
                    tracing::error!(shard, error = %panic, "shard task panicked; rebuilt at the next lease check");
                    self.renewed_at = None;
                }
            }
            rebuild = true;
        }
        relay_shards(self.shards.len());
        rebuild
    }

    /// Stops a shard's pipeline after its current Kafka transaction, with
    /// the marks of what it committed, and waits for it.
    async fn stop_shard(&mut self, shard: i64) {
        if let Some(handle) = self.shards.remove(&shard) {
            handle.stop.send_replace(true);
            match handle.task.await {
                Ok(shard::ShardExit::Fatal(e)) => self.drop_fatal_producer(shard, &e),
                Ok(shard::ShardExit::TimedOut(e)) => self.renew_timed_out_producer(shard, &e),
                _ => {}
            }
        }
    }

    async fn stop_all_shards(&mut self) {
        let shards: Vec<i64> = self.shards.keys().copied().collect();
        for handle in self.shards.values() {
            handle.stop.send_replace(true);
        }
        for shard in shards {
            self.stop_shard(shard).await;
        }
        relay_shards(0);
    }

    /// Drops a shard's producer after a fatal error; the next lease check
    /// rebuilds it if the shard is still ours.
    fn drop_fatal_producer(&mut self, shard: i64, error: &KafkaError) {
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
        self.summary.aborted += 1;
        self.count_fatal(shard, error.to_string());
        // Check the lease now rather than at the next renewal.
        self.renewed_at = None;
    }

    /// Drops a shard's producer after a timed-out transaction; the next
    /// lease check builds a new one (a new epoch). Not a fatal error: a long
    /// broker outage times out every transaction, and the relay rides it out.
    fn renew_timed_out_producer(&mut self, shard: i64, error: &KafkaError) {
        tracing::warn!(
            shard,
            transactional_id = %transactional_id(&self.options.transactional_id_prefix, shard),
            error = %error,
            "Kafka transaction timed out and was aborted: the shard's producer is renewed"
        );
        relay_producer_fatal("timed_out");
        self.renewed_at = None;
    }

    /// One more fatal error on `shard` without a commit between; too many
    /// and the relay gives up.
    fn count_fatal(&mut self, shard: i64, last: String) {
        let n = self.fatal_in_a_row.entry(shard).or_default();
        *n += 1;
        if *n >= MAX_FATAL_IN_A_ROW && self.give_up.is_none() {
            self.give_up = Some(RelayError::Fatal {
                shard,
                transactional_id: transactional_id(&self.options.transactional_id_prefix, shard),
                last,
            });
        }
    }

    /// Starts (fencing in their producers) the pipelines of the shards we
    /// lease and run none for, and of `fresh` shards (leased again after a
    /// lapse: whoever held them meanwhile fenced our old producer); stops
    /// those of shards we no longer lease.
    async fn sync_shards(&mut self, fresh: &BTreeSet<i64>) {
        let owned: BTreeSet<i64> = self.owned.iter().copied().collect();
        let gone: Vec<i64> = self
            .shards
            .keys()
            .filter(|s| !owned.contains(s) || fresh.contains(s))
            .copied()
            .collect();
        for shard in gone {
            self.stop_shard(shard).await;
        }
        let missing: Vec<i64> = owned
            .iter()
            .filter(|s| !self.shards.contains_key(s))
            .copied()
            .collect();
        let options = &self.producer_options;
        let prefix = &self.options.transactional_id_prefix;
        let built = futures::future::join_all(missing.iter().map(|&shard| async move {
            (
                shard,
                transactional::fenced(options, &transactional_id(prefix, shard)).await,
            )
        }))
        .await;
        let mut started = Vec::new();
        for (shard, result) in built {
            match result {
                Ok(producer) => started.push((shard, producer)),
                Err(e) => {
                    tracing::warn!(shard, error = %e, "shard producer not built; retrying at the next lease check");
                    if matches!(&e, KafkaError::Transaction(t) if t.is_fatal()) {
                        self.count_fatal(shard, e.to_string());
                    }
                }
            }
        }
        // A crash point (tests) catches the shards started first, together.
        let gate = match self.options.crash_at.take() {
            Some(point) if !started.is_empty() => {
                Some(Arc::new(shard::CrashGate::new(point, started.len())))
            }
            other => {
                self.options.crash_at = other;
                None
            }
        };
        for (shard, producer) in started {
            if !self.built.insert(shard) {
                self.summary.rebuilt += 1;
            }
            let (stop, stop_rx) = watch::channel(false);
            // Busy until the shard finds its outbox empty (see shard::run).
            self.shared.busy.fetch_add(1, Ordering::Relaxed);
            let task = tokio::spawn(shard::run(
                shard,
                producer,
                self.shared.clone(),
                stop_rx,
                self.events_tx.clone(),
                gate.clone(),
            ));
            self.shards.insert(shard, ShardHandle { stop, task });
        }
        relay_shards(self.shards.len());
    }

    /// Renews this instance's leases and moves toward an equal share of the
    /// shards among live instances.
    async fn balance_leases(&mut self) -> Result<(), DbError> {
        let ttl = self.options.lease_ttl;
        let every = if self.short {
            (ttl / 3).min(Duration::from_secs(1))
        } else {
            ttl / 3
        };
        if self.renewed_at.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        let me = self.options.instance.clone();
        let me = &me;
        let now = now_ms();
        let expires = now + ttl.as_millis() as i64;
        // Presence first: an instance without leases still counts as live.
        let heartbeat = self.db.sql().upsert(
            "relay_instances",
            "owner, heartbeat_ms",
            "owner",
            &["heartbeat_ms"],
        );
        sqlx::query(heartbeat)
            .bind(me)
            .bind(now)
            .execute(&self.db.pool)
            .await?;
        let live: Vec<(String,)> =
            sqlx::query_as("SELECT owner FROM relay_instances WHERE heartbeat_ms > ?")
                .bind(now - ttl.as_millis() as i64)
                .fetch_all(&self.db.pool)
                .await?;
        let leases: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT shard, owner, expires_ms FROM relay_leases ORDER BY shard")
                .fetch_all(&self.db.pool)
                .await?;
        let live = live.len().max(1);
        let target = (SHARDS as usize).div_ceil(live);
        let mut mine: Vec<i64> = leases
            .iter()
            .filter(|(_, owner, exp)| owner == me && *exp > now)
            .map(|(shard, ..)| *shard)
            .collect();
        // Give back what is above our share (its pipeline stopped first,
        // with its marks, so the next owner does not publish it again),
        // then renew the rest.
        while mine.len() > target {
            let shard = mine.pop().expect("non-empty");
            self.stop_shard(shard).await;
            sqlx::query(
                "UPDATE relay_leases SET owner = '', expires_ms = 0 WHERE shard = ? AND owner = ?",
            )
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
        self.sync_shards(&fresh).await;
        self.short = self.owned.len() < target || self.shards.len() < self.owned.len();
        Ok(())
    }

    /// Gives every lease back (the shard pipelines are stopped first).
    async fn release_leases(&mut self) {
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

    #[test]
    fn transactional_ids_belong_to_shards() {
        assert_eq!(
            transactional_id("orderpipe-relay", 7),
            "orderpipe-relay-shard-7"
        );
    }
}
