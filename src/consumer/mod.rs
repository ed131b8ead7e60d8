//! `orderpipe consume`: consumer groups with exactly-once effects.
//!
//! The processing contract (see `DESIGN.md`):
//!
//! 1. Poll; decode (Confluent frame + Avro + envelope validation).
//! 2. In one DB transaction: insert the `event_dedup` row; if it existed,
//!    skip the record (a duplicate); else run every handler's effect. Commit.
//! 3. Only then store the Kafka offset; librdkafka commits stored offsets
//!    every second, on rebalance and on close. A crash between 2 and 3
//!    redelivers records whose dedup rows already exist: they are skipped.
//!
//! Layout:
//!
//! * `dispatch` runs the dispatcher: one `StreamConsumer`, records routed
//!   to one [`worker`] per assigned partition, so partitions run in
//!   parallel and each partition's records are applied in offset order
//!   (one order's events share a partition, so per-order order holds); it
//!   never waits on a worker: a partition whose worker's queue is full is
//!   paused instead;
//! * `pause` keeps why each partition is paused (the dispatcher's full
//!   queue, a worker's wait for a retry record's due time): it is resumed
//!   when no reason is left;
//! * [`worker`] batches a partition's records into one DB transaction and
//!   retries database failures with backoff without committing past them;
//! * [`assignment`] tracks which partitions this member owns, so a worker
//!   never commits work for a partition that was revoked;
//! * [`handler`] is the trait for effects, [`handlers`] the built-in ones;
//! * [`version`] checks `event_version` against the majors the handlers declare;
//! * [`events`] are the consumer's internal events (a log line and a metric each).
//! * [`naming`] checks a group name against the house pattern
//!   `{service}.{event}.consumer` (a warning at start).
//!
//! [`ConsumerSettings`] is the `[consumer]` section of the configuration.

pub mod assignment;
mod dispatch;
pub mod events;
pub mod handler;
pub mod handlers;
pub mod naming;
mod pause;
pub mod version;
pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::{Deserialize, Serialize};

use crate::codec::{Codec, RegistrySettings};
use crate::db::Db;
use crate::health::HealthState;
use crate::kafka::client::{KafkaSettings, Prefetch, client_config, consumer_options};
use crate::ordering::OrderingMode;
use crate::producer::ProducerSettings;
use crate::retry::{Forwarder, RetrySettings, TierTopics, retry_topic};
use crate::schema::SchemaCatalog;
use crate::topics::TopicsSettings;
use assignment::{Assignment, AssignmentContext, PartitionKey};
use handler::{Effect, Handler};
use worker::PartitionWorker;

/// The `[consumer]` section of the configuration: consumer tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    /// librdkafka consumer options layered over orderpipe's.
    pub options: BTreeMap<String, String>,
    /// Records of one partition applied in one DB transaction, at most.
    pub batch_size: usize,
    /// How long a partition's batch waits, after its first record, for
    /// more before it is applied (0: it takes what is already waiting).
    #[serde(default)]
    pub batch_linger_ms: u64,
    /// `/health/mq` fails past this total lag.
    pub lag_threshold: i64,
    /// `/health/mq` fails when the loop has not polled for this long.
    pub max_poll_gap_secs: u64,
    /// Per-key order through retries and dead letters (`key`) or not (`none`).
    pub ordering: OrderingMode,
    /// librdkafka `queued.max.messages.kbytes`: payload prefetched ahead of the workers, at most.
    pub fetch_queue_kbytes: u32,
    /// librdkafka `queued.min.messages`: records prefetched ahead of the workers before fetching stops.
    pub fetch_queue_min_messages: u32,
    /// librdkafka `fetch.message.max.bytes`: bytes one fetch brings per partition, at most.
    pub fetch_partition_max_bytes: u32,
}

impl ConsumerSettings {
    /// The prefetch bounds, as the Kafka client takes them.
    pub fn prefetch(&self) -> Prefetch {
        Prefetch {
            queue_kbytes: self.fetch_queue_kbytes,
            queue_min_messages: self.fetch_queue_min_messages,
            partition_max_bytes: self.fetch_partition_max_bytes,
        }
    }

    /// Rejects prefetch bounds out of librdkafka's range, and a pass-through
    /// option (in `kafka` options or `consumer.options`) that sets one of them again.
    pub fn validate(&self, kafka: &KafkaSettings) -> Result<(), String> {
        consumer_options(&kafka.options, &self.options, self.prefetch())
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The configuration sections a consumer group member reads
/// ([`crate::startup::consumer_sections`] picks them out of the settings).
#[derive(Debug, Clone, Copy)]
pub struct ConsumerSections<'a> {
    /// The Kafka connection.
    pub kafka: &'a KafkaSettings,
    /// Consumer tuning.
    pub consumer: &'a ConsumerSettings,
    /// Options of the error tier's producer.
    pub producer: &'a ProducerSettings,
    /// The error tier's schedule.
    pub retry: &'a RetrySettings,
    /// The registry the codec uses.
    pub registry: &'a RegistrySettings,
    /// The declared topics (partition counts, the dead-letter topic).
    pub topics: &'a TopicsSettings,
}

/// Where a new group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest retained record.
    Earliest,
    /// Only records produced after the group first joins.
    Latest,
}

/// What to run.
#[derive(Clone)]
pub struct ConsumeOptions {
    /// Consumer group id.
    pub group: String,
    /// Effects applied to every record, in this order.
    pub handlers: Vec<Arc<dyn Handler>>,
    /// Topic to read (unless `reads` says otherwise), and the one the
    /// error tier is named after (retry topic `<topic>.retry.<group>`).
    pub topic: String,
    /// Topics to read instead of `topic`: a router binding's (the order
    /// topic and/or `cdc.<db>.<table>` topics), whose failures all go
    /// through the one retry topic named after `topic`. Empty: `topic`.
    pub reads: Vec<String>,
    /// Where a new group starts.
    pub start_from: StartFrom,
    /// Exit after this long without new records (and with nothing pending).
    pub until_idle: Option<Duration>,
    /// Where to serve `/health/*` (port 0 = any free port).
    pub health_addr: Option<SocketAddr>,
    /// Route failures through the retry topic and the DLQ (the default).
    /// Off only to measure the tier's cost: failures then wait in place with
    /// backoff (never skipped) and poison is logged and skipped.
    pub error_tier: bool,
    /// Keep per-key order through the error tier (see [`crate::ordering`]).
    pub ordering: OrderingMode,
    /// Test hook, false in production (only a `harness` build's
    /// `chaos.crash_before_forward_ack` sets it): abort the process once a
    /// batch is committed and its failed records are handed to the producer,
    /// before any acknowledgement, parking or offset store.
    pub crash_before_forward_ack: bool,
    /// Benchmarks only, None in production (only a `harness` build's
    /// `chaos.commit_stamps` sets it): told the event ids a batch applied
    /// right after its commit (`dev/bench-latency.sh`).
    pub commit_stamps: Option<Arc<dyn crate::clock::CommitStamps>>,
}

impl ConsumeOptions {
    /// Every topic the group reads records from (not its retry topic):
    /// `reads`, or `topic` when that is empty.
    pub fn read_topics(&self) -> impl Iterator<Item = &str> {
        let own = self.reads.is_empty().then_some(self.topic.as_str());
        own.into_iter().chain(self.reads.iter().map(String::as_str))
    }

    /// Whether failures park their key (mode `key`; only with the error
    /// tier, since without it failures wait in place and order holds anyway).
    pub fn keeps_key_order(&self) -> bool {
        self.ordering == OrderingMode::Key && self.error_tier
    }
}

/// Counts per handler.
#[derive(Debug, Default, Clone, Serialize)]
pub struct HandlerCounts {
    /// Effects written.
    pub applied: u64,
    /// Events the handler does not act on.
    pub ignored: u64,
    /// Effects the business state already held.
    pub already_done: u64,
}

/// What a consume run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ConsumeSummary {
    /// Consumer group.
    pub group: String,
    /// Records received from Kafka.
    pub consumed: u64,
    /// Events applied (dedup row inserted, handlers run, committed).
    pub applied: u64,
    /// Events skipped because this group had applied them already.
    pub duplicates: u64,
    /// Records that could not be decoded or validated (poison).
    pub decode_failures: u64,
    /// Of those, records of an `event_version` the handlers do not understand
    /// (dead-lettered as `unsupported_version`).
    pub unsupported_versions: u64,
    /// Duplicates whose content differs from the event first applied under
    /// the same id (a producer reused an id; see `orderpipe dlq conflicts`).
    pub conflicting_duplicates: u64,
    /// Failed attempts to apply (batch or record; none committed past).
    pub apply_failures: u64,
    /// Records that failed, then succeeded on a local retry.
    pub recovered_locally: u64,
    /// Records sent to the group's retry topic.
    pub sent_to_retry: u64,
    /// Records sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Records held behind a parked key (mode `key`).
    pub held: u64,
    /// Held records applied after their head.
    pub released: u64,
    /// Times a partition was paused because its worker's queue was full
    /// (the dispatcher never waits on a worker).
    pub queue_full_pauses: u64,
    /// Per handler.
    pub handlers: BTreeMap<String, HandlerCounts>,
    /// Seconds from the first record received to the last batch committed.
    pub active_secs: f64,
}

impl ConsumeSummary {
    /// Adds the counts of one committed batch.
    fn merge(&mut self, delta: ConsumeSummary) {
        self.applied += delta.applied;
        self.duplicates += delta.duplicates;
        self.conflicting_duplicates += delta.conflicting_duplicates;
        self.held += delta.held;
        for (name, counts) in delta.handlers {
            let total = self.handlers.entry(name).or_default();
            total.applied += counts.applied;
            total.ignored += counts.ignored;
            total.already_done += counts.already_done;
        }
    }

    fn record_effect(&mut self, handler: &str, effect: Effect) {
        let counts = self.handlers.entry(handler.to_string()).or_default();
        match effect {
            Effect::Applied => counts.applied += 1,
            Effect::Ignored => counts.ignored += 1,
            Effect::AlreadyDone => counts.already_done += 1,
        }
    }
}

/// Why the consumer could not run.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Kafka client setup failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Schema codec setup failed.
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
    /// The health endpoint could not bind.
    #[error("health endpoint: {0}")]
    Health(#[from] std::io::Error),
    /// A topic the group reads or writes is missing or differs from its
    /// declaration (the consumer only checks; `topics ensure` fixes).
    #[error(transparent)]
    Topics(#[from] crate::topics::TopicsError),
    /// The error tier is misconfigured.
    #[error("{0}")]
    Config(String),
}

/// Shared by the dispatcher and the workers.
pub(crate) struct Shared {
    pub consumer: StreamConsumer<AssignmentContext>,
    pub codec: Codec,
    pub forwarder: Forwarder,
    pub db: Db,
    pub options: ConsumeOptions,
    pub assignment: Arc<Assignment>,
    pub summary: Mutex<ConsumeSummary>,
    pub health: Arc<HealthState>,
    /// Records dispatched and not yet finished (applied, forwarded or
    /// dropped on revoke), per partition.
    pub in_flight: Mutex<HashMap<PartitionKey, usize>>,
    pub batch_size: usize,
    /// `consumer.batch_linger_ms`.
    pub batch_linger: std::time::Duration,
    /// First record received, last batch committed.
    pub active: Mutex<Option<(Instant, Instant)>>,
    /// Keys this consumer knows to be parked (mode `key`): only records of
    /// these keys, and retry-topic records, consult `parked_keys`.
    pub parked: Mutex<crate::ordering::ParkedSet>,
    /// Partitions paused on the consumer, and why (see `pause`).
    pub pauses: Mutex<pause::Pauses>,
}

impl Shared {
    /// Adds `delta` records to a partition's in-flight count.
    pub(crate) fn in_flight_change(&self, key: &PartitionKey, delta: isize) {
        let mut map = self.in_flight.lock().expect("in-flight lock");
        let n = map.entry(key.clone()).or_default();
        *n = n.saturating_add_signed(delta);
    }

    /// Whether `key` of `topic` is in this consumer's parked set.
    pub(crate) fn is_parked(&self, topic: &str, key: &str) -> bool {
        self.parked
            .lock()
            .expect("parked lock")
            .contains(topic, key)
    }

    fn in_flight_total(&self) -> usize {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .values()
            .sum()
    }

    fn in_flight(&self, key: &PartitionKey) -> usize {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// Runs a consumer until `shutdown` resolves or, with `until_idle`, until
/// the topic has been idle that long. Returns what was done.
pub async fn run(
    settings: ConsumerSections<'_>,
    db: Db,
    options: ConsumeOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<ConsumeSummary, ConsumerError> {
    check_group_length(&options.group)?;
    crate::metrics::install();
    events::conflicting_duplicates_start(&options.group);
    let health = HealthState::consumer(
        settings.consumer.lag_threshold,
        Duration::from_secs(settings.consumer.max_poll_gap_secs.max(1)),
    );
    if let Some(addr) = options.health_addr {
        let bound = crate::health::serve(addr, health.clone()).await?;
        tracing::info!(%bound, "health endpoints listening");
        eprintln!("health endpoints on http://{bound}/health/ready");
    }
    let assignment = Arc::new(Assignment::new(health.clone()));
    let config = consumer_config(settings, &options.group, options.start_from)?;
    let consumer: StreamConsumer<AssignmentContext> =
        config.create_with_context(AssignmentContext::new(assignment.clone(), &options.group))?;
    // Read-only rights: check the topics with metadata, never create or alter them.
    crate::topics::require(
        consumer.client(),
        &settings.kafka.bootstrap_servers,
        &required_topics(settings.topics, &options),
        &crate::topics::ensure_command(Some(&options.group)),
    )?;
    let forwarder = forwarder(settings, &options)?;
    let mut subscribed: Vec<&str> = options.read_topics().collect();
    if options.error_tier {
        subscribed.push(&forwarder.topics.retry);
    }
    consumer.subscribe(&subscribed)?;

    let catalog = SchemaCatalog::embedded();
    let codec = Codec::new(
        settings.registry,
        &options.topic,
        catalog.order_events(),
        false,
    )?;
    let shared = Arc::new(Shared {
        consumer,
        codec,
        forwarder,
        db,
        summary: Mutex::new(ConsumeSummary {
            group: options.group.clone(),
            ..Default::default()
        }),
        options,
        assignment,
        health,
        in_flight: Mutex::new(HashMap::new()),
        active: Mutex::new(None),
        parked: Mutex::new(crate::ordering::ParkedSet::default()),
        pauses: Mutex::new(pause::Pauses::default()),
        batch_size: settings.consumer.batch_size.max(1),
        batch_linger: std::time::Duration::from_millis(settings.consumer.batch_linger_ms),
    });
    // Report the database state from the start, not only after the first record.
    match shared.db.ping().await {
        Ok(()) => shared.health.db_up().await,
        Err(e) => shared.health.db_down(&e.to_string()).await,
    }

    let lag_task = tokio::spawn(report_lag(shared.clone()));
    let release_task = tokio::spawn(release_parked(shared.clone()));
    dispatch::dispatch(&shared, shutdown).await;
    lag_task.abort();
    release_task.abort();
    // Workers have finished; commit what they stored before leaving.
    match shared.consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => {}
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(error = %e, "final offset commit failed; records since the last commit will be redelivered and skipped as duplicates")
        }
    }
    let mut summary = shared.summary.lock().expect("summary lock").clone();
    summary.active_secs = shared
        .active
        .lock()
        .expect("active lock")
        .map_or(0.0, |(first, last)| {
            last.duration_since(first).as_secs_f64()
        });
    Ok(summary)
}

/// The librdkafka config of a member of `group`: the shared client
/// options, orderpipe's consumer options, then the prefetch bounds and
/// `consumer.options` ([`consumer_options`]).
pub fn consumer_config(
    settings: ConsumerSections<'_>,
    group: &str,
    start_from: StartFrom,
) -> Result<rdkafka::ClientConfig, ConsumerError> {
    let layered = consumer_options(
        &settings.kafka.options,
        &settings.consumer.options,
        settings.consumer.prefetch(),
    )
    .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let mut config = client_config(&settings.kafka.client_options());
    config
        .set("group.id", group)
        // Offsets are stored by workers after the DB commit; librdkafka commits
        // what is stored every second, on rebalance and on close.
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.commit.interval.ms", "1000")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", "10000")
        .set("statistics.interval.ms", "5000")
        .set(
            "auto.offset.reset",
            match start_from {
                StartFrom::Earliest => "earliest",
                StartFrom::Latest => "latest",
            },
        );
    for (k, v) in &layered {
        config.set(k, v);
    }
    Ok(config)
}

/// The topics the group reads and writes, with their declared partition
/// counts: the main topic, and with the error tier its retry topic (declared
/// like the main topic) and the dead-letter topic.
pub fn required_topics(
    topics: &TopicsSettings,
    options: &ConsumeOptions,
) -> Vec<crate::topics::Required> {
    use crate::topics::Required;
    let declared = topics.find(&options.topic).map(|spec| spec.partitions);
    let mut required: Vec<Required> = options
        .read_topics()
        .map(|topic| Required {
            topic: topic.to_string(),
            partitions: topics.find(topic).map(|spec| spec.partitions),
        })
        .collect();
    if options.error_tier {
        required.push(Required {
            topic: retry_topic(&options.topic, &options.group),
            partitions: declared,
        });
        required.push(Required::declared(&topics.dead_letter));
    }
    required
}

/// The group's error tier: an idempotent producer to forward failures to
/// its retry topic and the DLQ topic (both checked by [`required_topics`]).
fn forwarder(
    settings: ConsumerSections<'_>,
    options: &ConsumeOptions,
) -> Result<Forwarder, ConsumerError> {
    let policy = settings
        .retry
        .policy_for(&options.group)
        .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let producer_options = crate::kafka::client::producer_options(
        &settings.kafka.client_options(),
        &settings.producer.options,
    )
    .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let producer = crate::kafka::client::measured_producer(&producer_options)?;
    Ok(Forwarder::new(
        producer,
        TierTopics::of(
            &options.topic,
            &options.group,
            &settings.topics.dead_letter.name,
        ),
        &options.group,
        policy,
    ))
}

/// Every 5 s: lag per assigned partition (high watermark minus committed
/// offset) into the gauges and, summed, into `/health/mq`. The gauges hold
/// only the partitions owned now: a revoked partition's series goes at the
/// revoke (see [`crate::lag::PartitionLagGauges`]).
///
/// A transactional producer leaves a commit marker after each transaction;
/// it takes an offset but is never delivered, so a caught-up partition
/// would show a lag of 1 forever. When nothing of a partition is in flight,
/// everything fetched so far was applied, so the fetch position (past the
/// marker) is used instead of the committed offset.
async fn report_lag(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s = shared.clone();
        let lags = tokio::task::spawn_blocking(move || {
            let assignment = s.consumer.assignment().ok()?;
            let committed = s
                .consumer
                .committed_offsets(assignment, Duration::from_secs(5))
                .ok()?;
            let positions = s.consumer.position().ok()?;
            let mut lags = Vec::new();
            for e in committed.elements() {
                let (low, high) = s
                    .consumer
                    .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(5))
                    .ok()?;
                let committed = match e.offset() {
                    rdkafka::Offset::Offset(o) => o,
                    _ => low,
                };
                let key = (e.topic().to_string(), e.partition());
                let position = positions
                    .find_partition(e.topic(), e.partition())
                    .and_then(|p| match p.offset() {
                        rdkafka::Offset::Offset(o) => Some(o),
                        _ => None,
                    });
                let from = match position {
                    Some(p) if p > committed && s.in_flight(&key) == 0 => p,
                    _ => committed,
                };
                lags.push((e.topic().to_string(), e.partition(), (high - from).max(0)));
            }
            Some(lags)
        })
        .await
        .ok()
        .flatten();
        if let Some(mut lags) = lags {
            shared.health.set_lag(lags.iter().map(|l| l.2).sum());
            // A partition revoked while this was measured gets no series back.
            lags.retain(|(topic, partition, _)| {
                shared
                    .assignment
                    .generation(&(topic.clone(), *partition))
                    .is_some()
            });
            shared.consumer.context().lag_gauges.report(&lags);
        }
    }
}

/// Every 2 s (mode `key`): the parked-key gauges, and releases that no
/// worker will start by itself: heads an operator ignored with
/// `--release-followers`, and heads applied just before a crash.
async fn release_parked(shared: Arc<Shared>) {
    if !shared.options.keeps_key_order() {
        return;
    }
    let group = shared.options.group.clone();
    loop {
        match crate::ordering::gauges(&shared.db, &group).await {
            Ok(gauges) => gauges.report(&group),
            Err(e) => tracing::debug!(error = %e, "parked-key gauges not read"),
        }
        let keys = crate::ordering::releasable(&shared.db, &group)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "releasable keys not read");
                Vec::new()
            });
        for (key, partition) in keys {
            // Only the owner of the key's partition (of its topic) releases it.
            let pk = (key.topic.clone(), partition);
            if let Some(generation) = shared.assignment.generation(&pk) {
                // Revoked meanwhile: the partition's next owner releases it.
                let _ = PartitionWorker::new(shared.clone(), pk, generation)
                    .release([key])
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Refuses a group name longer than the `consumer_group` columns: writing it
/// with `INSERT IGNORE` would cut it to fit, into another group's dedup rows.
fn check_group_length(group: &str) -> Result<(), ConsumerError> {
    let chars = group.chars().count();
    if crate::db::fits_column(group, crate::db::CONSUMER_GROUP_CHARS) {
        return Ok(());
    }
    Err(ConsumerError::Config(format!(
        "consumer group `{}...` is {chars} characters long; the limit is {} (the consumer_group column of event_dedup, \
         dead_letters, parked_keys and held_records): choose a shorter group name",
        group.chars().take(40).collect::<String>(),
        crate::db::CONSUMER_GROUP_CHARS
    )))
}

/// Connections beyond one per partition worker: the parked-key release task
/// and the health check's ping.
const POOL_MARGIN: u32 = 2;

/// Database connections a member of `group` reading `topic` can use at
/// once: one per partition worker (every partition of the topic and, with
/// the error tier, of its retry topic, declared alike) plus a margin. With
/// a smaller pool workers queue for a connection, and a wait past the
/// acquire timeout reads as the database being down.
pub fn connections_needed(topics: &TopicsSettings, topic: &str, error_tier: bool) -> u32 {
    declared_partitions(topics, topic) * if error_tier { 2 } else { 1 } + POOL_MARGIN
}

/// [`connections_needed`] of a group that reads several topics
/// (`options.reads`, a router binding's): one per partition of each, and
/// with the error tier of its retry topic (declared like `options.topic`),
/// plus the margin.
pub fn connections_needed_for(topics: &TopicsSettings, options: &ConsumeOptions) -> u32 {
    let read: u32 = options
        .read_topics()
        .map(|t| declared_partitions(topics, t))
        .sum();
    let retry = if options.error_tier {
        declared_partitions(topics, &options.topic)
    } else {
        0
    };
    read + retry + POOL_MARGIN
}

/// Partitions of `topic` as declared; a topic `[topics]` does not declare
/// (a `cdc.*` one) is counted like the order topic.
fn declared_partitions(topics: &TopicsSettings, topic: &str) -> u32 {
    topics
        .find(topic)
        .unwrap_or(&topics.order_events)
        .partitions
        .max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn a_group_reading_several_topics_gets_a_connection_per_partition_of_each() {
        let settings = Settings::default();
        let order = settings.topics.order_events.name.clone();
        let partitions = settings.topics.order_events.partitions as u32;
        let mut options = ConsumeOptions {
            group: "g".into(),
            handlers: Vec::new(),
            topic: order.clone(),
            reads: Vec::new(),
            start_from: StartFrom::Earliest,
            until_idle: None,
            health_addr: None,
            error_tier: true,
            ordering: OrderingMode::Key,
            crash_before_forward_ack: false,
            commit_stamps: None,
        };
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            connections_needed(&settings.topics, &order, true)
        );
        assert_eq!(options.read_topics().collect::<Vec<_>>(), [order.as_str()]);
        // A router binding: the order topic and an undeclared cdc topic, one retry topic.
        options.reads = vec![order.clone(), "cdc.shop.table_user".into()];
        assert_eq!(
            options.read_topics().collect::<Vec<_>>(),
            [order.as_str(), "cdc.shop.table_user"]
        );
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            3 * partitions + POOL_MARGIN
        );
        options.reads = vec!["cdc.shop.table_user".into()];
        options.error_tier = false;
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            partitions + POOL_MARGIN
        );
    }

    #[test]
    fn prefetch_bounds_reach_librdkafka() {
        let mut settings = Settings::default();
        settings.consumer.fetch_queue_kbytes = 4096;
        settings.consumer.fetch_queue_min_messages = 3000;
        settings.consumer.fetch_partition_max_bytes = 131_072;
        settings
            .consumer
            .options
            .insert("fetch.queue.backoff.ms".into(), "50".into());
        let config = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Earliest,
        )
        .unwrap();
        assert_eq!(config.get("queued.max.messages.kbytes"), Some("4096"));
        // librdkafka itself holds them (it parsed and accepted each value).
        let native = config.create_native_config().unwrap();
        assert_eq!(native.get("queued.max.messages.kbytes").unwrap(), "4096");
        assert_eq!(native.get("queued.min.messages").unwrap(), "3000");
        assert_eq!(native.get("fetch.message.max.bytes").unwrap(), "131072");
        assert_eq!(native.get("fetch.queue.backoff.ms").unwrap(), "50");
        assert_eq!(native.get("group.id").unwrap(), "g");
    }

    #[test]
    fn the_default_prefetch_is_bounded() {
        let settings = Settings::default();
        let config = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Latest,
        )
        .unwrap();
        let native = config.create_native_config().unwrap();
        // librdkafka's own defaults are 65536 KB and 100000 records, 1 MB per partition.
        assert_eq!(
            native.get("queued.max.messages.kbytes").unwrap(),
            settings.consumer.fetch_queue_kbytes.to_string()
        );
        assert!(settings.consumer.fetch_queue_kbytes < 65_536);
        assert!(settings.consumer.fetch_queue_min_messages < 100_000);
        assert!(settings.consumer.fetch_partition_max_bytes < 1_048_576);
        assert_eq!(native.get("fetch.queue.backoff.ms").unwrap(), "20");
    }

    #[test]
    fn a_conflicting_or_out_of_range_prefetch_is_refused_at_validation() {
        let mut settings = Settings::default();
        settings
            .kafka
            .options
            .insert("queued.min.messages".into(), "100".into());
        let e = settings.validate().unwrap_err().to_string();
        assert!(
            e.contains("`queued.min.messages` in kafka.options")
                && e.contains("consumer.fetch_queue_min_messages"),
            "{e}"
        );
        let mut settings = Settings::default();
        settings.consumer.fetch_queue_kbytes = 0;
        let e = settings.validate().unwrap_err().to_string();
        assert!(
            e.contains("consumer.fetch_queue_kbytes = 0 is out of range: accepted 1 to 2097151"),
            "{e}"
        );
        let e = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Latest,
        )
        .unwrap_err();
        assert!(e.to_string().contains("consumer.fetch_queue_kbytes"), "{e}");
    }
}
