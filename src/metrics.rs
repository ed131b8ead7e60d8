//! Prometheus metrics: the recorder, the metric names, and the typed
//! internal events that emit a log line and a metric together.
//!
//! Every long-running role serves `/metrics` on its health address (see
//! [`crate::health`]). Names follow Prometheus conventions (`_total` for
//! counters, base units in the name); labels are bounded: topic, partition,
//! group, event name, error class, attempt — never an event or order id.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Metric names.
pub mod name {
    /// Records produced, by topic and event name.
    pub const PRODUCED: &str = "orderpipe_produced_records_total";
    /// Records the producer could not deliver, by topic.
    pub const PRODUCER_ERRORS: &str = "orderpipe_producer_errors_total";
    /// Relay Kafka transactions, by outcome (committed, aborted).
    pub const TRANSACTIONS: &str = "orderpipe_relay_transactions_total";
    /// Relay shard producers dropped after a fatal error, by reason (fenced, fatal).
    pub const RELAY_PRODUCER_FATAL: &str = "orderpipe_relay_producer_fatal_total";
    /// Shards this relay leases with a ready (fenced-in) producer.
    pub const RELAY_SHARDS: &str = "orderpipe_relay_shards";
    /// Records received, by group and topic.
    pub const CONSUMED: &str = "orderpipe_consumed_records_total";
    /// Events applied (effect committed), by group and event name.
    pub const APPLIED: &str = "orderpipe_applied_records_total";
    /// Events skipped as duplicates, by group and event name.
    pub const DUPLICATES: &str = "orderpipe_duplicate_records_total";
    /// Failed processing attempts, by group, event name and error class.
    pub const FAILURES: &str = "orderpipe_processing_failures_total";
    /// Duplicates whose content differs from the event first applied under
    /// the same id (a producer reused an id), by group.
    pub const CONFLICTING_DUPLICATES: &str = "orderpipe_conflicting_duplicates_total";
    /// Records sent to the retry topic, by group and attempt.
    pub const RETRIES: &str = "orderpipe_retries_total";
    /// Records sent to the dead-letter topic, by group, event name and error class.
    pub const DEAD_LETTERED: &str = "orderpipe_dead_lettered_records_total";
    /// Records held behind a parked key, by group and event name.
    pub const HELD: &str = "orderpipe_held_records_total";
    /// Held records applied on release, by group and event name.
    pub const RELEASED: &str = "orderpipe_released_records_total";
    /// Keys parked now (their head is in the retry topic or the DLQ), by group.
    pub const PARKED_KEYS: &str = "orderpipe_parked_keys";
    /// Records held now behind parked keys, by group.
    pub const HELD_NOW: &str = "orderpipe_held_records";
    /// Age of the oldest parked key (0 when none), by group.
    pub const PARKED_OLDEST_AGE: &str = "orderpipe_parked_key_oldest_age_seconds";
    /// Pending rows in `dead_letters` (persister).
    pub const DEAD_LETTERS_PENDING: &str = "orderpipe_dead_letters_pending";
    /// Consumer lag (high watermark minus committed offset), by group, topic and partition,
    /// for the partitions this member owns now (an owned series: see [`super::SeriesOwner`]).
    pub const LAG: &str = "orderpipe_consumer_lag_records";
    /// Broker-side lag of a configured group (log-end minus committed offset), by group,
    /// topic and partition; exported by the DLQ persister, so it is there with every member down.
    pub const GROUP_LAG: &str = "orderpipe_group_lag_records";
    /// Age of the oldest record a group has not consumed yet (0 when caught up), by group,
    /// topic and partition (persister).
    pub const GROUP_OLDEST_AGE: &str = "orderpipe_group_oldest_unconsumed_age_seconds";
    /// Live members of a configured group as the broker describes it (persister).
    pub const GROUP_MEMBERS: &str = "orderpipe_group_members";
    /// Failed measurements of the broker-side group lag (persister).
    pub const GROUP_LAG_FAILURES: &str = "orderpipe_group_lag_measure_failures_total";
    /// Handler time per record, by group.
    pub const HANDLER_SECONDS: &str = "orderpipe_handler_duration_seconds";
    /// Apply time minus event time, by group.
    pub const END_TO_END_SECONDS: &str = "orderpipe_end_to_end_latency_seconds";
    /// Unsent outbox rows.
    pub const OUTBOX_BACKLOG: &str = "orderpipe_outbox_backlog_rows";
    /// Age of the oldest unsent outbox row.
    pub const OUTBOX_OLDEST_AGE: &str = "orderpipe_outbox_oldest_age_seconds";
    /// Dedup rows removed by cleanup.
    pub const DEDUP_CLEANUP_DELETED: &str = "orderpipe_dedup_cleanup_deleted_total";
    /// API requests, by route and status.
    pub const API_REQUESTS: &str = "orderpipe_api_requests_total";
    /// librdkafka: messages in the client's queues (producer: waiting for delivery), by client.
    pub const KAFKA_QUEUE: &str = "orderpipe_kafka_queue_messages";
    /// librdkafka: average broker round-trip time, by client and broker.
    pub const KAFKA_RTT: &str = "orderpipe_kafka_broker_rtt_seconds";
}

/// Buckets for the latency histograms: fine below a second (P99 SLAs of
/// consumers are usually 100 ms to 2 s), coarse up to a minute (retries).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();

/// Renders `/metrics`: the recorder's metrics, then the owned series.
#[derive(Clone)]
pub struct MetricsHandle(PrometheusHandle);

impl MetricsHandle {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut text = self.0.render();
        render_owned(&mut text);
        text
    }
}

/// Installs the global recorder once and returns the handle that renders it.
pub fn install() -> MetricsHandle {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("buckets are valid")
                .install_recorder()
                .expect("the metrics recorder is installed once");
            let upkeep = handle.clone();
            std::thread::spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                }
            });
            MetricsHandle(handle)
        })
        .clone()
}

/// Something that happened, logged and counted in one place.
pub trait InternalEvent {
    /// Emits the log line and the metric.
    fn emit(self);
}

/// A batch of a partition was committed.
pub struct Applied<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name.
    pub event_name: &'a str,
    /// Handlers' time for this record.
    pub handler_time: Duration,
    /// Now minus the event time.
    pub end_to_end: Option<Duration>,
}

impl InternalEvent for Applied<'_> {
    fn emit(self) {
        tracing::debug!(group = self.group, event_name = self.event_name, "applied");
        counter!(name::APPLIED, "group" => self.group.to_string(), "event_name" => self.event_name.to_string()).increment(1);
        histogram!(name::HANDLER_SECONDS, "group" => self.group.to_string()).record(self.handler_time.as_secs_f64());
        if let Some(e2e) = self.end_to_end {
            histogram!(name::END_TO_END_SECONDS, "group" => self.group.to_string()).record(e2e.as_secs_f64());
        }
    }
}

/// A record was skipped because its group applied it before.
pub struct DuplicateSkipped<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name.
    pub event_name: &'a str,
}

impl InternalEvent for DuplicateSkipped<'_> {
    fn emit(self) {
        tracing::debug!(group = self.group, event_name = self.event_name, "duplicate skipped");
        counter!(name::DUPLICATES, "group" => self.group.to_string(), "event_name" => self.event_name.to_string()).increment(1);
    }
}

/// A duplicate was skipped whose content differs from the event applied
/// under its id first: a producer reused an event id.
pub struct ConflictingDuplicate<'a> {
    /// The conflict, with both positions.
    pub conflict: &'a crate::dedup::Conflict,
}

impl InternalEvent for ConflictingDuplicate<'_> {
    fn emit(self) {
        let c = self.conflict;
        tracing::error!(group = %c.consumer_group, event_id = %c.event_id, event_name = %c.event_name,
            first = %format_args!("{}/{}@{}", c.first_topic, c.first_partition, c.first_offset),
            this = %format_args!("{}/{}@{}", c.topic, c.partition, c.offset),
            first_digest = %c.first_digest, digest = %c.digest,
            "event id reused with different content: skipped as a duplicate, never applied (orderpipe dlq conflicts)");
        counter!(name::CONFLICTING_DUPLICATES, "group" => c.consumer_group.clone()).increment(1);
    }
}

/// An attempt to process a record failed.
pub struct ProcessingFailed<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name (`unknown` for undecodable records).
    pub event_name: &'a str,
    /// Error class.
    pub class: &'a str,
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for ProcessingFailed<'_> {
    fn emit(self) {
        tracing::warn!(group = self.group, event_name = self.event_name, class = self.class, error = self.error, "processing failed");
        counter!(name::FAILURES, "group" => self.group.to_string(), "event_name" => self.event_name.to_string(),
            "error_class" => self.class.to_string()).increment(1);
    }
}

/// A record was sent to the group's retry topic.
pub struct SentToRetry<'a> {
    /// Group.
    pub group: &'a str,
    /// Delayed attempt number.
    pub attempt: u32,
    /// Wait before it.
    pub delay: Duration,
    /// Error class.
    pub class: &'a str,
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for SentToRetry<'_> {
    fn emit(self) {
        tracing::warn!(group = self.group, attempt = self.attempt, delay_ms = self.delay.as_millis() as u64,
            class = self.class, error = self.error, "record sent to the retry topic");
        counter!(name::RETRIES, "group" => self.group.to_string(), "attempt" => self.attempt.to_string()).increment(1);
    }
}

/// A record was sent to the dead-letter topic.
pub struct DeadLettered<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name (`unknown` for undecodable records).
    pub event_name: &'a str,
    /// Error class.
    pub class: &'a str,
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for DeadLettered<'_> {
    fn emit(self) {
        tracing::error!(group = self.group, event_name = self.event_name, class = self.class, error = self.error,
            "record sent to the dead-letter topic");
        counter!(name::DEAD_LETTERED, "group" => self.group.to_string(), "event_name" => self.event_name.to_string(),
            "error_class" => self.class.to_string()).increment(1);
    }
}

/// A record was held behind its parked key.
pub struct Held<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name.
    pub event_name: &'a str,
}

impl InternalEvent for Held<'_> {
    fn emit(self) {
        tracing::info!(group = self.group, event_name = self.event_name, "held behind its parked key (an earlier event of the order is being retried)");
        counter!(name::HELD, "group" => self.group.to_string(), "event_name" => self.event_name.to_string()).increment(1);
    }
}

/// A held record was applied after its head.
pub struct Released<'a> {
    /// Group.
    pub group: &'a str,
    /// Event name.
    pub event_name: &'a str,
}

impl InternalEvent for Released<'_> {
    fn emit(self) {
        tracing::info!(group = self.group, event_name = self.event_name, "released: applied after the event it waited behind");
        counter!(name::RELEASED, "group" => self.group.to_string(), "event_name" => self.event_name.to_string()).increment(1);
    }
}

/// Parked keys, held records and the oldest parked age of a group.
pub fn ordering(group: &str, gauges: &crate::ordering::OrderingGauges) {
    gauge!(name::PARKED_KEYS, "group" => group.to_string()).set(gauges.parked_keys as f64);
    gauge!(name::HELD_NOW, "group" => group.to_string()).set(gauges.held_records as f64);
    let age = gauges.oldest_parked_ms.map_or(0.0, |t| ((crate::clock::now_ms() - t).max(0) as f64) / 1000.0);
    gauge!(name::PARKED_OLDEST_AGE, "group" => group.to_string()).set(age);
}

/// Records were produced and acknowledged.
pub fn produced(topic: &str, event_name: &str, n: u64) {
    counter!(name::PRODUCED, "topic" => topic.to_string(), "event_name" => event_name.to_string()).increment(n);
}

/// A record could not be produced.
pub fn producer_error(topic: &str) {
    counter!(name::PRODUCER_ERRORS, "topic" => topic.to_string()).increment(1);
}

/// A relay transaction ended.
pub fn transaction(outcome: &'static str) {
    counter!(name::TRANSACTIONS, "outcome" => outcome).increment(1);
}

/// A relay shard producer failed fatally and was dropped.
pub fn relay_producer_fatal(reason: &'static str) {
    counter!(name::RELAY_PRODUCER_FATAL, "reason" => reason).increment(1);
}

/// The shards a relay publishes now.
pub fn relay_shards(n: usize) {
    gauge!(name::RELAY_SHARDS).set(n as f64);
}

/// Exports a group's conflicting-duplicates counter at 0 from the start, so
/// `increase()` sees its first conflict (a series born at 1 shows no increase).
pub fn conflicting_duplicates_start(group: &str) {
    counter!(name::CONFLICTING_DUPLICATES, "group" => group.to_string()).increment(0);
}

/// Records received.
pub fn consumed(group: &str, topic: &str) {
    counter!(name::CONSUMED, "group" => group.to_string(), "topic" => topic.to_string()).increment(1);
}

/// Labels of one owned series, in the order they are printed.
pub type Labels = Vec<(&'static str, String)>;

/// Owned series by metric name, then labels: (owner, value).
type OwnedSeries = BTreeMap<&'static str, BTreeMap<Labels, (u64, f64)>>;

static OWNED: Mutex<OwnedSeries> = Mutex::new(BTreeMap::new());

/// Owner ids; 0 is the group lag exporter ([`GroupLagMeasured`]).
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
const EXPORTER_OWNER: u64 = 0;

/// Gauge series that belong to something that can go away: a partition a
/// member owns, a group the exporter measures. The `metrics` crate cannot
/// remove a series (and the exporter's only way, a global idle timeout,
/// would also drop every gauge that is set once and left alone), so these
/// are kept here and printed after the recorder's metrics. A series goes
/// from `/metrics` when its owner replaces or removes it, or is dropped.
pub struct SeriesOwner(u64);

impl Default for SeriesOwner {
    fn default() -> Self {
        Self(NEXT_OWNER.fetch_add(1, Ordering::Relaxed))
    }
}

impl SeriesOwner {
    /// Replaces every series of `name` this owner holds with `series`.
    pub fn replace(&self, name: &'static str, series: impl IntoIterator<Item = (Labels, f64)>) {
        replace_owned(self.0, name, series);
    }

    /// Removes this owner's series of `name` whose labels include every pair of `matching`.
    pub fn remove(&self, name: &'static str, matching: &[(&str, &str)]) {
        let mut owned = OWNED.lock().expect("owned series lock");
        if let Some(by_labels) = owned.get_mut(name) {
            by_labels.retain(|labels, (owner, _)| {
                *owner != self.0 || !matching.iter().all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            });
        }
    }
}

impl Drop for SeriesOwner {
    fn drop(&mut self) {
        let mut owned = OWNED.lock().expect("owned series lock");
        for by_labels in owned.values_mut() {
            by_labels.retain(|_, (owner, _)| *owner != self.0);
        }
    }
}

fn replace_owned(owner: u64, name: &'static str, series: impl IntoIterator<Item = (Labels, f64)>) {
    let mut owned = OWNED.lock().expect("owned series lock");
    let by_labels = owned.entry(name).or_default();
    by_labels.retain(|_, (o, _)| *o != owner);
    for (labels, value) in series {
        by_labels.insert(labels, (owner, value));
    }
}

/// Appends the owned series in the text exposition format.
fn render_owned(text: &mut String) {
    use std::fmt::Write;
    let owned = OWNED.lock().expect("owned series lock");
    for (name, by_labels) in owned.iter().filter(|(_, s)| !s.is_empty()) {
        let _ = writeln!(text, "# TYPE {name} gauge");
        for (labels, (_, value)) in by_labels {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
            let _ = writeln!(text, "{name}{{{}}} {value}", labels.join(","));
        }
        text.push('\n');
    }
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A consumer member's per-partition lag gauges ([`name::LAG`]): only the
/// partitions it owns now, so nothing stale remains after a rebalance.
pub struct PartitionLagGauges {
    group: String,
    owner: SeriesOwner,
}

impl PartitionLagGauges {
    /// The gauges of one member of `group`; its series go when it is dropped.
    pub fn new(group: &str) -> Self {
        Self { group: group.to_string(), owner: SeriesOwner::default() }
    }

    /// The lag (records) of each (topic, partition) the member owns now;
    /// series of partitions not listed go.
    pub fn report(&self, lags: &[(String, i32, i64)]) {
        let series = lags.iter().map(|(topic, partition, lag)| {
            (vec![("group", self.group.clone()), ("topic", topic.clone()), ("partition", partition.to_string())], *lag as f64)
        });
        self.owner.replace(name::LAG, series);
    }

    /// A partition was revoked: its series goes now.
    pub fn revoked(&self, topic: &str, partition: i32) {
        self.owner.remove(name::LAG, &[("topic", topic), ("partition", &partition.to_string())]);
    }
}

/// The broker-side lag of the configured groups was measured (see [`crate::lag`]).
pub struct GroupLagMeasured<'a> {
    /// Every measured group.
    pub groups: &'a [crate::lag::GroupLag],
}

impl InternalEvent for GroupLagMeasured<'_> {
    fn emit(self) {
        let mut lags = Vec::new();
        let mut ages = Vec::new();
        let mut members = Vec::new();
        for group in self.groups {
            tracing::debug!(group = group.group, members = group.members, lag = group.total_lag, status = ?group.status, "group lag measured");
            members.push((vec![("group", group.group.clone())], group.members as f64));
            for p in &group.partitions {
                let labels = vec![("group", group.group.clone()), ("topic", p.topic.clone()), ("partition", p.partition.to_string())];
                lags.push((labels.clone(), p.lag as f64));
                ages.push((labels, p.oldest_unconsumed_age_seconds.unwrap_or(0.0)));
            }
        }
        // Groups or partitions no longer measured lose their series.
        replace_owned(EXPORTER_OWNER, name::GROUP_MEMBERS, members);
        replace_owned(EXPORTER_OWNER, name::GROUP_LAG, lags);
        replace_owned(EXPORTER_OWNER, name::GROUP_OLDEST_AGE, ages);
    }
}

/// The broker-side group lag could not be measured; the last values stay.
pub struct GroupLagFailed<'a> {
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for GroupLagFailed<'_> {
    fn emit(self) {
        tracing::warn!(error = self.error, "group lag not measured; the last values stay exported");
        counter!(name::GROUP_LAG_FAILURES).increment(1);
    }
}

/// The outbox backlog.
pub fn outbox(backlog: &crate::outbox::Backlog) {
    gauge!(name::OUTBOX_BACKLOG).set(backlog.unsent as f64);
    gauge!(name::OUTBOX_OLDEST_AGE).set(backlog.oldest_age_ms as f64 / 1000.0);
}

/// Pending dead letters.
pub fn dead_letters_pending(n: i64) {
    gauge!(name::DEAD_LETTERS_PENDING).set(n as f64);
}

/// Dedup rows removed.
pub fn dedup_cleanup(n: u64) {
    counter!(name::DEDUP_CLEANUP_DELETED).increment(n);
}

/// An API request finished.
pub fn api_request(route: &'static str, status: u16) {
    counter!(name::API_REQUESTS, "route" => route, "status" => status.to_string()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(name: &str) -> Vec<String> {
        let mut text = String::new();
        render_owned(&mut text);
        text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).map(str::to_string).collect()
    }

    #[test]
    fn owned_series_go_when_revoked_replaced_or_dropped() {
        let gauges = PartitionLagGauges::new("g-owned");
        gauges.report(&[("t".into(), 0, 5), ("t".into(), 1, 7)]);
        let other = PartitionLagGauges::new("g-other");
        other.report(&[("t".into(), 2, 1)]);
        let mine = |lines: Vec<String>| lines.into_iter().filter(|l| l.contains("g-owned")).collect::<Vec<_>>();
        assert_eq!(
            mine(rendered(name::LAG)),
            [r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="0"} 5"#,
             r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="1"} 7"#]
        );
        gauges.revoked("t", 0);
        assert_eq!(mine(rendered(name::LAG)).len(), 1);
        gauges.report(&[("t".into(), 3, 2)]);
        assert_eq!(mine(rendered(name::LAG)), [r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="3"} 2"#]);
        drop(gauges);
        assert!(mine(rendered(name::LAG)).is_empty());
        assert!(rendered(name::LAG).iter().any(|l| l.contains("g-other")), "another owner's series stay");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
