//! Prometheus metrics: the recorder, the metric names, the internal-event
//! pattern (a log line and a metric emitted together) and owned series.
//!
//! This module imports no domain module. Each typed event or emitter lives
//! with the component that emits it: the consumer's in
//! `crate::consumer::events`, the ordering gauges in `crate::ordering`, the
//! outbox backlog and relay counters in `crate::outbox`, the lag gauges in
//! `crate::lag`, and so on; they all use the names below.
//!
//! Every long-running role serves `/metrics` on its health address (see
//! [`crate::health`]). Names follow Prometheus conventions (`_total` for
//! counters, base units in the name); labels are bounded: topic, partition,
//! group, event name, error class, attempt — never an event or order id.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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
    /// 1 while this log-based relay holds its source's lease (reads the
    /// binlog), 0 while it is a standby.
    pub const RELAY_SOURCE_ACTIVE: &str = "orderpipe_relay_source_active";
    /// Published outbox rows the log-based relay deleted.
    pub const RELAY_OUTBOX_DELETED: &str = "orderpipe_relay_outbox_deleted_total";
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
    /// Times a partition was paused because its worker's queue was full, by group.
    pub const QUEUE_FULL_PAUSES: &str = "orderpipe_consumer_queue_full_pauses_total";
    /// Members stopped because their group handler could not find its
    /// coordinator although the cluster answered (a new client rejoins).
    pub const COORDINATOR_STUCK: &str = "orderpipe_consumer_coordinator_stuck_total";
    /// Partitions paused now (queue full or waiting for a retry due time), by group.
    pub const PAUSED_PARTITIONS: &str = "orderpipe_consumer_paused_partitions";
    /// 1 while an operator's pause of the group is in force (`orderpipe
    /// group pause`), else 0, by group; exported by each member.
    pub const GROUP_PAUSED: &str = "orderpipe_group_paused";
    /// Pending rows in `dead_letters` (persister).
    pub const DEAD_LETTERS_PENDING: &str = "orderpipe_dead_letters_pending";
    /// Events of the order topic the group neither applied nor accounts for
    /// (dead letter, held, parked head), older than the grace period, in its
    /// latest `orderpipe reconcile` run, by group (exported from `reconcile_runs`).
    pub const RECONCILE_MISSING: &str = "orderpipe_reconcile_missing_events";
    /// Dedup rows of the group at a position of the window where the topic
    /// holds no such event, in its latest reconcile run, by group.
    pub const RECONCILE_APPLIED_NOT_IN_TOPIC: &str = "orderpipe_reconcile_applied_not_in_topic";
    /// When the group's latest reconcile run finished (seconds since the epoch), by group.
    pub const RECONCILE_LAST_RUN: &str = "orderpipe_reconcile_last_run_timestamp_seconds";
    /// Consumer lag (high watermark minus committed offset), by group, topic and partition,
    /// for the partitions this member owns now (an owned series: see [`super::SeriesOwner`]).
    pub const LAG: &str = "orderpipe_consumer_lag_records";
    /// Broker-side lag of a configured group (log-end minus committed offset), by group,
    /// topic and partition; exported by the DLQ persister, so it is there with every member down.
    pub const GROUP_LAG: &str = "orderpipe_group_lag_records";
    /// Age of the oldest record a group has not consumed yet (0 when caught up), by group,
    /// topic and partition (persister).
    pub const GROUP_OLDEST_AGE: &str = "orderpipe_group_oldest_unconsumed_age_seconds";
    /// How long the oldest open transaction of a partition has held its last
    /// stable offset below the high watermark (0: none), by topic and
    /// partition, from the persister's lag measurement (`lag.groups`).
    pub const OPEN_TRANSACTION_AGE: &str = "orderpipe_open_transaction_age_seconds";
    /// Live members of a configured group as the broker describes it (persister).
    pub const GROUP_MEMBERS: &str = "orderpipe_group_members";
    /// Failed measurements of the broker-side group lag (persister).
    pub const GROUP_LAG_FAILURES: &str = "orderpipe_group_lag_measure_failures_total";
    /// Handler time per record, by group.
    pub const HANDLER_SECONDS: &str = "orderpipe_handler_duration_seconds";
    /// Apply time minus event time, by group.
    pub const END_TO_END_SECONDS: &str = "orderpipe_end_to_end_latency_seconds";
    /// Time a relay shard's `commit_transaction` takes (its records are
    /// acknowledged before it is called).
    pub const RELAY_COMMIT_SECONDS: &str = "orderpipe_relay_commit_duration_seconds";
    /// Time a relay shard spends per batch in each stage of its pipeline
    /// (`claim`, `encode`, `produce`: send and acknowledgements, `mark`).
    pub const RELAY_STAGE_SECONDS: &str = "orderpipe_relay_stage_duration_seconds";
    /// Unsent outbox rows.
    pub const OUTBOX_BACKLOG: &str = "orderpipe_outbox_backlog_rows";
    /// Age of the oldest unsent outbox row.
    pub const OUTBOX_OLDEST_AGE: &str = "orderpipe_outbox_oldest_age_seconds";
    /// Outbox rows the relay dead-lettered (over the record limit), by topic, event name and error class.
    pub const OUTBOX_DEAD_LETTERED: &str = "orderpipe_outbox_dead_lettered_rows_total";
    /// Dedup rows removed by cleanup.
    pub const DEDUP_CLEANUP_DELETED: &str = "orderpipe_dedup_cleanup_deleted_total";
    /// API requests, by route and status.
    pub const API_REQUESTS: &str = "orderpipe_api_requests_total";
    /// Admin API requests (`orderpipe subs serve`), by resource, method and status (401/403: refused).
    pub const ADMIN_REQUESTS: &str = "orderpipe_admin_requests_total";
    /// Console requests (`orderpipe console`), by page, method and status (401/403: refused).
    pub const CONSOLE_REQUESTS: &str = "orderpipe_console_requests_total";
    /// Console time to answer a request (query + render), by page.
    pub const CONSOLE_RENDER: &str = "orderpipe_console_render_seconds";
    /// Console state changes written to the audit table, by action.
    pub const CONSOLE_ACTIONS: &str = "orderpipe_console_actions_total";
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

/// Labels of one owned series, in the order they are printed.
pub type Labels = Vec<(&'static str, String)>;

/// Owned series by metric name, then labels: (owner, value).
type OwnedSeries = BTreeMap<&'static str, BTreeMap<Labels, (u64, f64)>>;

static OWNED: Mutex<OwnedSeries> = Mutex::new(BTreeMap::new());

/// The next owner id.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

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
        let mut owned = OWNED.lock().expect("owned series lock");
        let by_labels = owned.entry(name).or_default();
        by_labels.retain(|_, (o, _)| *o != self.0);
        for (labels, value) in series {
            by_labels.insert(labels, (self.0, value));
        }
    }

    /// Removes this owner's series of `name` whose labels include every pair of `matching`.
    pub fn remove(&self, name: &'static str, matching: &[(&str, &str)]) {
        let mut owned = OWNED.lock().expect("owned series lock");
        if let Some(by_labels) = owned.get_mut(name) {
            by_labels.retain(|labels, (owner, _)| {
                *owner != self.0
                    || !matching
                        .iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
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

/// Appends the owned series in the text exposition format.
fn render_owned(text: &mut String) {
    use std::fmt::Write;
    let owned = OWNED.lock().expect("owned series lock");
    for (name, by_labels) in owned.iter().filter(|(_, s)| !s.is_empty()) {
        let _ = writeln!(text, "# TYPE {name} gauge");
        for (labels, (_, value)) in by_labels {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(text, "{name}{{{}}} {value}", labels.join(","));
        }
        text.push('\n');
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lag::PartitionLagGauges;

    fn rendered(name: &str) -> Vec<String> {
        let mut text = String::new();
        render_owned(&mut text);
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn owned_series_go_when_revoked_replaced_or_dropped() {
        let gauges = PartitionLagGauges::new("g-owned");
        gauges.report(&[("t".into(), 0, 5), ("t".into(), 1, 7)]);
        let other = PartitionLagGauges::new("g-other");
        other.report(&[("t".into(), 2, 1)]);
        let mine = |lines: Vec<String>| {
            lines
                .into_iter()
                .filter(|l| l.contains("g-owned"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            mine(rendered(name::LAG)),
            [
                r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="0"} 5"#,
                r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="1"} 7"#
            ]
        );
        gauges.revoked("t", 0);
        assert_eq!(mine(rendered(name::LAG)).len(), 1);
        gauges.report(&[("t".into(), 3, 2)]);
        assert_eq!(
            mine(rendered(name::LAG)),
            [r#"orderpipe_consumer_lag_records{group="g-owned",topic="t",partition="3"} 2"#]
        );
        drop(gauges);
        assert!(mine(rendered(name::LAG)).is_empty());
        assert!(
            rendered(name::LAG).iter().any(|l| l.contains("g-other")),
            "another owner's series stay"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
