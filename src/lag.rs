//! Consumer group lag as the broker sees it: committed offsets, log-end
//! offsets and the age of the oldest record a group has not consumed.
//!
//! A consumer reports only its own partitions' lag, so a group with no live
//! member reports nothing. This module asks the broker instead; `orderpipe
//! lag` prints what [`measure`] returns and the DLQ persister exports it
//! every `lag.export_interval_secs` ([`export`]), so the lag alert fires
//! with every member of a group down.
//!
//! Offsets are read with `read_committed`: the log end is the last stable
//! offset (records of open transactions are not counted yet). Lag counts
//! offsets, as Kafka's own tools do, so a transaction marker after the
//! committed offset counts one; when only markers or aborted records
//! follow the committed offset, the record probe finds nothing to consume
//! and the lag is 0.
//!
//! The lag gauges live here too: a member's own partitions
//! ([`PartitionLagGauges`]) and the exporter's broker-side view
//! ([`GroupLagMeasured`], [`GroupLagFailed`]).

use std::collections::BTreeMap;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use metrics::counter;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::kafka::client::{KafkaSettings, client_config};
use crate::metrics::{InternalEvent, SeriesOwner, name};
use crate::retry::retry_topic;

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `[lag]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LagSettings {
    /// Groups `orderpipe lag` shows and the persister exports; empty: every
    /// group the broker lists that has committed offsets on the order topic.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Seconds between two exports of the broker-side lag by the persister.
    #[serde(default = "default_export_interval_secs")]
    pub export_interval_secs: u64,
}

fn default_export_interval_secs() -> u64 {
    15
}

impl Default for LagSettings {
    fn default() -> Self {
        Self {
            groups: Vec::new(),
            export_interval_secs: default_export_interval_secs(),
        }
    }
}

impl LagSettings {
    /// Rejects an interval of 0 and empty group names, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.export_interval_secs == 0 {
            return Err(
                "lag.export_interval_secs must be at least 1 (seconds between two exports)".into(),
            );
        }
        if let Some(i) = self.groups.iter().position(|g| g.trim().is_empty()) {
            return Err(format!(
                "lag.groups[{i}] is empty: name a consumer group id"
            ));
        }
        Ok(())
    }
}

/// Why lag could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum LagError {
    /// A Kafka request failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The topic the groups read does not exist.
    #[error("topic {0} does not exist (run `orderpipe topics ensure`)")]
    NoTopic(String),
    /// The blocking measurement task died.
    #[error("lag measurement task failed: {0}")]
    Task(String),
}

/// What the broker knows about a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupStatus {
    /// Committed offsets and at least one live member.
    Consuming,
    /// Committed offsets, no live member: nobody consumes it.
    NoMembers,
    /// The broker knows the group, but it has committed nothing on these topics.
    NoCommittedOffsets,
    /// The broker does not know the group (never ran, or its offsets expired).
    Unknown,
}

/// One partition of a group.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionLag {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset; None when it never committed on this
    /// partition (it then starts at the log start, so lag counts from there).
    pub committed_offset: Option<i64>,
    /// First retained offset.
    pub log_start_offset: i64,
    /// Log-end offset for `read_committed` (the last stable offset).
    pub log_end_offset: i64,
    /// The high watermark: above `log_end_offset` while a transaction is
    /// open on the partition (its records are not readable committed yet).
    pub high_watermark: i64,
    /// How long the oldest transaction open on the partition has held the
    /// last stable offset (the age of its first record), when one does: a
    /// producer that never commits nor aborts holds every `read_committed`
    /// consumer there until the broker's transaction timeout.
    pub open_transaction_age_seconds: Option<f64>,
    /// The `transactional.id` of the producer holding it, when the brokers
    /// tell ([`crate::kafka::transactions`]: PLAINTEXT listeners only).
    pub open_transactional_id: Option<String>,
    /// Offsets between the committed (or start) offset and the log end.
    pub lag: i64,
    /// Timestamp (ms since the epoch) of the first record not consumed yet.
    pub oldest_unconsumed_timestamp_ms: Option<i64>,
    /// Its age in seconds at measurement time; None when the lag is 0.
    pub oldest_unconsumed_age_seconds: Option<f64>,
}

impl PartitionLag {
    /// What holds an open transaction's partition, after its age:
    /// `(high watermark N, transactional.id ID)`.
    pub fn open_transaction_holder(&self) -> String {
        match &self.open_transactional_id {
            Some(id) => format!(
                "(high watermark {}, transactional.id {id})",
                self.high_watermark
            ),
            None => format!("(high watermark {})", self.high_watermark),
        }
    }
}

/// One group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupLag {
    /// Group id.
    pub group: String,
    /// What the broker knows.
    pub status: GroupStatus,
    /// The broker's group state (`Stable`, `Empty`, `Dead`, ...).
    pub state: String,
    /// Live members.
    pub members: usize,
    /// Sum of the partitions' lag.
    pub total_lag: i64,
    /// Partitions of the order topic and of the group's retry topic; empty
    /// when the group has no committed offsets there.
    pub partitions: Vec<PartitionLag>,
}

/// The groups to measure: `wanted` if given, else `lag.groups`, else the
/// groups the broker lists but `persister_group` (only those with committed
/// offsets on the order topic are kept by [`measure`] then).
pub async fn groups_to_measure(
    kafka: &KafkaSettings,
    lag: &LagSettings,
    persister_group: &str,
    wanted: &[String],
) -> Result<(Vec<String>, bool), LagError> {
    if !wanted.is_empty() {
        return Ok((wanted.to_vec(), true));
    }
    if !lag.groups.is_empty() {
        return Ok((lag.groups.clone(), true));
    }
    let kafka = kafka.clone();
    let persister_group = persister_group.to_string();
    let listed = tokio::task::spawn_blocking(move || -> Result<Vec<String>, LagError> {
        let probe = probe(&kafka)?;
        let list = probe.fetch_group_list(None, REQUEST_TIMEOUT)?;
        let mut names: Vec<String> = list
            .groups()
            .iter()
            .filter(|g| g.protocol_type() == "consumer" || g.protocol_type().is_empty())
            .map(|g| g.name().to_string())
            .filter(|name| *name != persister_group)
            .collect();
        names.sort();
        Ok(names)
    })
    .await
    .map_err(|e| LagError::Task(e.to_string()))??;
    Ok((listed, false))
}

/// Measures `groups` on `topic` and each group's retry topic. With
/// `keep_empty` false, groups without committed offsets are left out
/// (used for groups listed by the broker, most of which read other topics).
pub async fn measure(
    kafka: &KafkaSettings,
    topic: &str,
    groups: &[String],
    keep_empty: bool,
) -> Result<Vec<GroupLag>, LagError> {
    let kafka = kafka.clone();
    let topic = topic.to_string();
    let groups = groups.to_vec();
    tokio::task::spawn_blocking(move || measure_blocking(&kafka, &topic, &groups, keep_empty))
        .await
        .map_err(|e| LagError::Task(e.to_string()))?
}

/// A consumer that never joins a group: metadata, watermarks, group list,
/// and reading the first unconsumed records.
pub(crate) fn probe(kafka: &KafkaSettings) -> Result<BaseConsumer, KafkaError> {
    probe_reading(kafka, "read_committed")
}

/// [`probe`] with `isolation` (`read_uncommitted`: its watermark is the
/// high watermark, and it reads an open transaction's records).
fn probe_reading(kafka: &KafkaSettings, isolation: &str) -> Result<BaseConsumer, KafkaError> {
    client_config(&kafka.client_options())
        .set("group.id", "orderpipe.lag.probe")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        // Only the first record of each partition is wanted.
        .set("max.partition.fetch.bytes", "65536")
        .set("queued.min.messages", "1")
        .create()
}

/// Partition count of `topic`, None if it does not exist.
fn partitions(probe: &BaseConsumer, topic: &str) -> Result<Option<i32>, KafkaError> {
    crate::kafka::offsets::partition_count(probe, topic, REQUEST_TIMEOUT)
}

/// Groups measured at once: each asks the broker a few round trips, and a
/// cluster may list hundreds of groups.
const PARALLEL_GROUPS: usize = 8;

fn measure_blocking(
    kafka: &KafkaSettings,
    topic: &str,
    groups: &[String],
    keep_empty: bool,
) -> Result<Vec<GroupLag>, LagError> {
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let chunk = groups.len().div_ceil(PARALLEL_GROUPS);
    // Asked of the brokers once per measurement, by the first worker that
    // finds a partition held open.
    let holders = OnceLock::new();
    let holders = &holders;
    std::thread::scope(|scope| {
        let workers: Vec<_> = groups
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || measure_groups(kafka, topic, part, keep_empty, holders))
            })
            .collect();
        let mut result = Vec::new();
        for worker in workers {
            result.extend(
                worker
                    .join()
                    .map_err(|_| LagError::Task("a lag worker panicked".into()))??,
            );
        }
        Ok(result)
    })
}

/// Measures `groups` one after the other with one probe consumer.
fn measure_groups(
    kafka: &KafkaSettings,
    topic: &str,
    groups: &[String],
    keep_empty: bool,
    holders: &OnceLock<BTreeMap<(String, i32), String>>,
) -> Result<Vec<GroupLag>, LagError> {
    let probe = probe(kafka)?;
    let uncommitted = probe_reading(kafka, "read_uncommitted")?;
    let Some(topic_partitions) = partitions(&probe, topic)? else {
        return Err(LagError::NoTopic(topic.to_string()));
    };
    // (log start, last stable offset, high watermark) per partition.
    let mut watermarks: BTreeMap<(String, i32), (i64, i64, i64)> = BTreeMap::new();
    let mut result = Vec::new();
    for group in groups {
        let (state, members) = describe_group(&probe, group)?;
        let members = members.len();
        let mut wanted = TopicPartitionList::new();
        for p in 0..topic_partitions {
            wanted.add_partition(topic, p);
        }
        let retry = retry_topic(topic, group);
        if let Some(n) = partitions(&probe, &retry)? {
            for p in 0..n {
                wanted.add_partition(&retry, p);
            }
        }
        let committed = committed_offsets(kafka, group, &wanted)?;
        let any_committed = committed.values().any(Option::is_some);
        let mut partitions = Vec::new();
        if any_committed {
            for ((t, p), committed_offset) in &committed {
                let key = (t.clone(), *p);
                let (low, high, high_watermark) = match watermarks.get(&key) {
                    Some(w) => *w,
                    None => {
                        let (low, stable) = probe.fetch_watermarks(t, *p, REQUEST_TIMEOUT)?;
                        let (_, high) = uncommitted.fetch_watermarks(t, *p, REQUEST_TIMEOUT)?;
                        let w = (low, stable, high.max(stable));
                        watermarks.insert(key, w);
                        w
                    }
                };
                let from = committed_offset.unwrap_or(low).max(low);
                partitions.push(PartitionLag {
                    topic: t.clone(),
                    partition: *p,
                    committed_offset: *committed_offset,
                    log_start_offset: low,
                    log_end_offset: high,
                    high_watermark,
                    open_transaction_age_seconds: None,
                    open_transactional_id: None,
                    lag: (high - from).max(0),
                    oldest_unconsumed_timestamp_ms: None,
                    oldest_unconsumed_age_seconds: None,
                });
            }
            oldest_unconsumed(&probe, &mut partitions)?;
            open_transactions(&uncommitted, &mut partitions)?;
            if partitions
                .iter()
                .any(|p| p.open_transaction_age_seconds.is_some())
            {
                let holders = holders.get_or_init(|| transaction_holders(kafka, &probe, topic));
                for p in &mut partitions {
                    if p.open_transaction_age_seconds.is_some() {
                        p.open_transactional_id =
                            holders.get(&(p.topic.clone(), p.partition)).cloned();
                    }
                }
            }
        }
        let status = match (any_committed, members) {
            (true, 0) => GroupStatus::NoMembers,
            (true, _) => GroupStatus::Consuming,
            (false, 0) if state == "Dead" => GroupStatus::Unknown,
            (false, _) => GroupStatus::NoCommittedOffsets,
        };
        if !keep_empty && !any_committed {
            continue;
        }
        result.push(GroupLag {
            group: group.clone(),
            status,
            state,
            members,
            total_lag: partitions.iter().map(|p| p.lag).sum(),
            partitions,
        });
    }
    Ok(result)
}

/// The broker's state of `group` (`Stable`, `Empty`, `Dead`, ...) and its
/// live members, each as `client_id@host (member id)`; `("Dead", [])` when
/// the broker does not know the group. Blocking (also used by `crate::rewind`).
pub(crate) fn describe_group(
    probe: &BaseConsumer,
    group: &str,
) -> Result<(String, Vec<String>), KafkaError> {
    let described = retry_coordinator(|| probe.fetch_group_list(Some(group), REQUEST_TIMEOUT))?;
    Ok(described
        .groups()
        .iter()
        .find(|g| g.name() == group)
        .map_or(("Dead".to_string(), Vec::new()), |g| {
            let members = g
                .members()
                .iter()
                .map(|m| {
                    format!(
                        "{}@{} ({})",
                        m.client_id(),
                        m.client_host().trim_start_matches('/'),
                        m.id()
                    )
                })
                .collect();
            (g.state().to_string(), members)
        }))
}

/// Runs a group request again while the group's coordinator is moving or
/// loading (a group seen for the first time, a broker restart): up to 5 s.
pub(crate) fn retry_coordinator<T>(
    mut request: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    use rdkafka::types::RDKafkaErrorCode::{
        CoordinatorLoadInProgress, CoordinatorNotAvailable, NotCoordinator,
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match request() {
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.rdkafka_error_code(),
                        Some(NotCoordinator | CoordinatorLoadInProgress | CoordinatorNotAvailable)
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// The group's committed offsets (None: nothing committed on that partition).
/// A consumer with the group's id asks without joining, so it never
/// disturbs the group's members. Blocking (also used by `crate::reconcile`).
pub fn committed_offsets(
    kafka: &KafkaSettings,
    group: &str,
    wanted: &TopicPartitionList,
) -> Result<BTreeMap<(String, i32), Option<i64>>, KafkaError> {
    let reader: BaseConsumer = client_config(&kafka.client_options())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let committed =
        retry_coordinator(|| reader.committed_offsets(wanted.clone(), REQUEST_TIMEOUT))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            ((e.topic().to_string(), e.partition()), offset)
        })
        .collect())
}

/// Reads the first record at each lagging partition's committed offset
/// for its timestamp. A partition whose probe reaches the log end without a
/// record holds only transaction markers or aborted records there: lag 0.
fn oldest_unconsumed(
    probe: &BaseConsumer,
    partitions: &mut [PartitionLag],
) -> Result<(), KafkaError> {
    let topics: Vec<String> = partitions
        .iter()
        .map(|p| p.topic.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // One topic at a time: librdkafka's end-of-partition event names only the partition.
    for topic in topics {
        let mut assignment = TopicPartitionList::new();
        for p in partitions.iter().filter(|p| p.lag > 0 && p.topic == topic) {
            let from = p
                .committed_offset
                .unwrap_or(p.log_start_offset)
                .max(p.log_start_offset);
            assignment.add_partition_offset(&p.topic, p.partition, Offset::Offset(from))?;
        }
        if assignment.count() == 0 {
            continue;
        }
        let first = first_records(probe, &assignment)?;
        let now = crate::clock::now_ms();
        for p in partitions
            .iter_mut()
            .filter(|p| p.lag > 0 && p.topic == topic)
        {
            match first.get(&p.partition) {
                Some(Some(timestamp)) => {
                    p.oldest_unconsumed_timestamp_ms = Some(*timestamp);
                    p.oldest_unconsumed_age_seconds =
                        Some(((now - timestamp).max(0) as f64) / 1000.0);
                }
                // Only markers or aborted records until the log end.
                Some(None) => p.lag = 0,
                None => tracing::warn!(
                    topic = p.topic,
                    partition = p.partition,
                    "no record read at the committed offset in time; age unknown"
                ),
            }
        }
    }
    Ok(())
}

/// Reads, with the `read_uncommitted` probe, the first record at the last
/// stable offset of each partition whose high watermark is above it: the
/// first record of the oldest open transaction, whose age is how long that
/// transaction has held `read_committed` readers.
fn open_transactions(
    uncommitted: &BaseConsumer,
    partitions: &mut [PartitionLag],
) -> Result<(), KafkaError> {
    let open = |p: &PartitionLag| p.high_watermark > p.log_end_offset;
    let topics: std::collections::BTreeSet<String> = partitions
        .iter()
        .filter(|p| open(p))
        .map(|p| p.topic.clone())
        .collect();
    for topic in topics {
        let mut assignment = TopicPartitionList::new();
        for p in partitions.iter().filter(|p| open(p) && p.topic == topic) {
            assignment.add_partition_offset(
                &p.topic,
                p.partition,
                Offset::Offset(p.log_end_offset),
            )?;
        }
        let first = first_records(uncommitted, &assignment)?;
        let now = crate::clock::now_ms();
        for p in partitions
            .iter_mut()
            .filter(|p| open(p) && p.topic == topic)
        {
            if let Some(Some(timestamp)) = first.get(&p.partition) {
                p.open_transaction_age_seconds = Some(((now - timestamp).max(0) as f64) / 1000.0);
            }
        }
    }
    Ok(())
}

/// The `transactional.id` of the oldest open transaction on each partition
/// it wrote to, as the brokers' transaction coordinators describe them;
/// empty (and logged) when they cannot be asked.
fn transaction_holders(
    kafka: &KafkaSettings,
    probe: &BaseConsumer,
    topic: &str,
) -> BTreeMap<(String, i32), String> {
    use crate::kafka::transactions;
    // One topic's metadata lists every broker too, without every topic's partitions.
    let brokers: Vec<String> = match probe.fetch_metadata(Some(topic), REQUEST_TIMEOUT) {
        Ok(m) => m
            .brokers()
            .iter()
            .map(|b| format!("{}:{}", b.host(), b.port()))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "no broker list: open transactions shown without their id");
            return BTreeMap::new();
        }
    };
    let protocol = kafka
        .client_options()
        .get("security.protocol")
        .cloned()
        .unwrap_or_else(|| "plaintext".into());
    match transactions::open_transactions(&brokers, &protocol, REQUEST_TIMEOUT) {
        Ok(open) => transactions::by_partition(&open)
            .into_iter()
            .map(|(p, t)| (p, t.transactional_id.clone()))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "open transactions shown without their transactional id");
            BTreeMap::new()
        }
    }
}

/// The timestamp of the first record from each assigned position of one
/// topic, by partition; None for a partition that reached its end first.
fn first_records(
    probe: &BaseConsumer,
    assignment: &TopicPartitionList,
) -> Result<BTreeMap<i32, Option<i64>>, KafkaError> {
    probe.assign(assignment)?;
    let mut first: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    while first.len() < assignment.count() && Instant::now() < deadline {
        match probe.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                let timestamp = message
                    .timestamp()
                    .to_millis()
                    .unwrap_or_else(crate::clock::now_ms);
                first.entry(message.partition()).or_insert(Some(timestamp));
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                first.entry(partition).or_insert(None);
            }
            Some(Err(e)) => tracing::debug!(error = %e, "lag probe"),
            None => {}
        }
    }
    probe.unassign()?;
    Ok(first)
}

/// The persister's exporter: every `lag.export_interval_secs`, measures
/// the groups of `lag.groups` on `topic` (the order topic) and exports
/// [`GroupLagMeasured`].
/// Without configured groups it exports nothing: listing every group of a
/// shared cluster each time would be heavy and would alert on groups that
/// are gone for good.
pub async fn export(kafka: KafkaSettings, lag: LagSettings, topic: String) {
    if lag.groups.is_empty() {
        tracing::warn!(
            "lag.groups is empty: no broker-side group lag exported (list the consumer groups to watch)"
        );
        return;
    }
    let every = Duration::from_secs(lag.export_interval_secs);
    loop {
        match measure(&kafka, &topic, &lag.groups, true).await {
            Ok(groups) => GroupLagMeasured { groups: &groups }.emit(),
            Err(e) => GroupLagFailed {
                error: &e.to_string(),
            }
            .emit(),
        }
        tokio::time::sleep(every).await;
    }
}

/// The group lag exporter's series ([`GroupLagMeasured`]): they live as
/// long as the process.
static EXPORTED: LazyLock<SeriesOwner> = LazyLock::new(SeriesOwner::default);

/// A consumer member's per-partition lag gauges ([`name::LAG`]): only the
/// partitions it owns now, so nothing stale remains after a rebalance.
pub struct PartitionLagGauges {
    group: String,
    owner: SeriesOwner,
}

impl PartitionLagGauges {
    /// The gauges of one member of `group`; its series go when it is dropped.
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_string(),
            owner: SeriesOwner::default(),
        }
    }

    /// The lag (records) of each (topic, partition) the member owns now;
    /// series of partitions not listed go.
    pub fn report(&self, lags: &[(String, i32, i64)]) {
        let series = lags.iter().map(|(topic, partition, lag)| {
            (
                vec![
                    ("group", self.group.clone()),
                    ("topic", topic.clone()),
                    ("partition", partition.to_string()),
                ],
                *lag as f64,
            )
        });
        self.owner.replace(name::LAG, series);
    }

    /// A partition was revoked: its series goes now.
    pub fn revoked(&self, topic: &str, partition: i32) {
        self.owner.remove(
            name::LAG,
            &[("topic", topic), ("partition", &partition.to_string())],
        );
    }
}

/// The broker-side lag of the configured groups was measured.
pub struct GroupLagMeasured<'a> {
    /// Every measured group.
    pub groups: &'a [GroupLag],
}

impl InternalEvent for GroupLagMeasured<'_> {
    fn emit(self) {
        let mut lags = Vec::new();
        let mut ages = Vec::new();
        let mut members = Vec::new();
        // By partition: groups reading the same partition see the same transaction.
        let mut open: BTreeMap<(String, i32), f64> = BTreeMap::new();
        for group in self.groups {
            tracing::debug!(group = group.group, members = group.members, lag = group.total_lag, status = ?group.status, "group lag measured");
            members.push((vec![("group", group.group.clone())], group.members as f64));
            for p in &group.partitions {
                let labels = vec![
                    ("group", group.group.clone()),
                    ("topic", p.topic.clone()),
                    ("partition", p.partition.to_string()),
                ];
                lags.push((labels.clone(), p.lag as f64));
                ages.push((labels, p.oldest_unconsumed_age_seconds.unwrap_or(0.0)));
                open.insert(
                    (p.topic.clone(), p.partition),
                    p.open_transaction_age_seconds.unwrap_or(0.0),
                );
            }
        }
        let open = open.into_iter().map(|((topic, partition), age)| {
            (
                vec![("topic", topic), ("partition", partition.to_string())],
                age,
            )
        });
        // Groups or partitions no longer measured lose their series.
        EXPORTED.replace(name::GROUP_MEMBERS, members);
        EXPORTED.replace(name::GROUP_LAG, lags);
        EXPORTED.replace(name::GROUP_OLDEST_AGE, ages);
        EXPORTED.replace(name::OPEN_TRANSACTION_AGE, open);
    }
}

/// The broker-side group lag could not be measured; the last values stay.
pub struct GroupLagFailed<'a> {
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for GroupLagFailed<'_> {
    fn emit(self) {
        tracing::warn!(
            error = self.error,
            "group lag not measured; the last values stay exported"
        );
        counter!(name::GROUP_LAG_FAILURES).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lag_settings_are_named() {
        let mut lag = LagSettings::default();
        lag.validate().unwrap();
        lag.export_interval_secs = 0;
        assert!(
            lag.validate()
                .unwrap_err()
                .contains("lag.export_interval_secs")
        );
        lag.export_interval_secs = 15;
        lag.groups = vec!["a".into(), " ".into()];
        assert!(lag.validate().unwrap_err().contains("lag.groups[1]"));
    }
}
