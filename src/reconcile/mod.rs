//! Produced-vs-applied reconciliation (seed 001's 对账任务): does a consumer
//! group account for every event the order topic holds over a window?
//!
//! [`reconcile`] reads the topic over the window, partition by partition
//! ([`scan`]: `offsets_for_times`, `read_committed`, the `event_id` and
//! `event_name` headers), and asks the group's tables about each record
//! ([`accounted`]). A record is, in this order:
//!
//! | class | meaning |
//! | --- | --- |
//! | applied | the group has an `event_dedup` row for its event id |
//! | dead-lettered | a `dead_letters` row of the group was first consumed at its position (any status) |
//! | held | it waits in `held_records` behind a parked key |
//! | parked | it heads a parked key: in the group's retry topic, or dead-lettered and not persisted yet |
//! | unconsumed | at or after the group's committed offset: lag, not loss (the lag alerts cover it) |
//! | in flight | none of the above, younger than the grace period (e.g. in the retry topic with `ordering = none`) |
//! | missing | none of the above and older than the grace period: the offset moved past it, nothing applied it |
//!
//! It also reports the group's dedup rows applied from a position of the
//! window where the topic holds no such event (`applied_not_in_topic`: a
//! recreated topic, a record written elsewhere), counts per event name,
//! and the position of every missing event. [`store`] keeps each run's
//! counts in `reconcile_runs`; [`export_gauges`] exports the latest run of
//! each group from a role that runs anyway.

pub mod accounted;
pub mod scan;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::error::KafkaError;
use serde::Serialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::db::{Db, DbError};
use crate::kafka::client::KafkaSettings;
use accounted::Source;
pub use scan::{PartitionWindow, ScannedRecord};
pub use store::export_gauges;

/// Dedup rows written this long before the window's start are still
/// checked for `applied_not_in_topic`: the database's clock (`created_at`)
/// and the producers' (Kafka timestamps) need not agree.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(3600);

/// Why a reconciliation could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kafka request failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A database statement failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The topic does not exist.
    #[error("topic {0} does not exist")]
    NoTopic(String),
    /// The scan received nothing for too long.
    #[error(
        "reading {topic} stalled: nothing received for {secs} s from partitions {partitions:?}"
    )]
    Stalled {
        /// Topic.
        topic: String,
        /// Partitions not read to their end.
        partitions: Vec<i32>,
        /// Seconds without a record.
        secs: u64,
    },
    /// A blocking task died.
    #[error("reconcile task failed: {0}")]
    Task(String),
}

impl From<sqlx::Error> for ReconcileError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e.into())
    }
}

/// What to reconcile.
#[derive(Debug, Clone)]
pub struct Request {
    /// Consumer group.
    pub group: String,
    /// Topic the group reads (the order topic).
    pub topic: String,
    /// Window start (ms since the epoch, Kafka timestamps).
    pub since_ms: i64,
    /// Window end (ms since the epoch, exclusive).
    pub until_ms: i64,
    /// Unaccounted records younger than this are in flight, not missing.
    pub grace: Duration,
    /// Missing events and applied-not-in-topic rows listed, at most (the counts are exact).
    pub list_limit: usize,
}

/// How many records of the window fell in each class (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Records read.
    pub records: u64,
    /// Applied (dedup row).
    pub applied: u64,
    /// Dead-lettered (a `dead_letters` row, any status).
    pub dead_lettered: u64,
    /// Held behind a parked key.
    pub held: u64,
    /// Heads of parked keys (retrying, or dead-lettered and not persisted yet).
    pub parked: u64,
    /// At or after the group's committed offset.
    pub unconsumed: u64,
    /// Unaccounted, younger than the grace period.
    pub in_flight: u64,
    /// Unaccounted, older than the grace period.
    pub missing: u64,
}

/// A record's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Applied,
    DeadLettered,
    Held,
    Parked,
    Unconsumed,
    InFlight,
    Missing,
}

impl Counts {
    fn add(&mut self, class: Class) {
        self.records += 1;
        *match class {
            Class::Applied => &mut self.applied,
            Class::DeadLettered => &mut self.dead_lettered,
            Class::Held => &mut self.held,
            Class::Parked => &mut self.parked,
            Class::Unconsumed => &mut self.unconsumed,
            Class::InFlight => &mut self.in_flight,
            Class::Missing => &mut self.missing,
        } += 1;
    }
}

/// A dedup row of the group at a position of the window where the topic
/// holds another event, or none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedNotInTopic {
    /// Event id of the dedup row.
    pub event_id: String,
    /// Its event name.
    pub event_name: String,
    /// Partition it says it was applied from.
    pub partition: i32,
    /// Offset it says it was applied from.
    pub offset: i64,
}

/// One partition of the window.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// The offsets read.
    #[serde(flatten)]
    pub window: PartitionWindow,
    /// The group's committed offset (None: it never committed there).
    pub committed_offset: Option<i64>,
    /// Records read.
    pub records: u64,
    /// Missing events in it.
    pub missing: u64,
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Consumer group.
    pub group: String,
    /// Topic read.
    pub topic: String,
    /// Window start (ms since the epoch).
    pub since_ms: i64,
    /// Window end (ms since the epoch, exclusive).
    pub until_ms: i64,
    /// Grace period (ms).
    pub grace_ms: i64,
    /// When the run started (ms since the epoch).
    pub started_ms: i64,
    /// When it finished (ms since the epoch).
    pub finished_ms: i64,
    /// Every record of the window, by class.
    pub totals: Counts,
    /// The same per `event_name` header (`-` for records without one).
    pub by_event_name: BTreeMap<String, Counts>,
    /// Per partition.
    pub partitions: Vec<PartitionReport>,
    /// Kafka timestamp of the oldest missing event.
    pub oldest_missing_ms: Option<i64>,
    /// Missing events by position, at most [`Request::list_limit`].
    pub missing: Vec<ScannedRecord>,
    /// Dedup rows applied from the window where the topic holds no such event.
    pub applied_not_in_topic_count: u64,
    /// Those rows by position, at most [`Request::list_limit`].
    pub applied_not_in_topic: Vec<AppliedNotInTopic>,
}

/// How far a scan got.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Records read so far.
    pub records: u64,
    /// Offsets in the window (an upper bound of its records: transaction
    /// markers and aborted records take offsets too).
    pub offsets: u64,
}

/// The key under which an event id is looked up: the UUID's canonical text
/// when it parses (as `event_dedup` stores it), else the header as is.
fn canonical_id(id: &str) -> String {
    Uuid::parse_str(id).map_or_else(|_| id.to_string(), |u| u.hyphenated().to_string())
}

/// Reconciles `request.group` over the window; `progress` is told after
/// each chunk of records. Stores nothing (see [`store::record`]).
pub async fn reconcile(
    kafka: &KafkaSettings,
    db: &Db,
    request: &Request,
    mut progress: impl FnMut(Progress),
) -> Result<Report, ReconcileError> {
    let started_ms = crate::clock::now_ms();
    let windows = {
        let (kafka, topic, since, until) = (
            kafka.clone(),
            request.topic.clone(),
            request.since_ms,
            request.until_ms,
        );
        tokio::task::spawn_blocking(move || scan::plan(&kafka, &topic, since, until))
            .await
            .map_err(|e| ReconcileError::Task(e.to_string()))??
    };
    let committed = committed_offsets(kafka, &request.group, &request.topic, &windows).await?;
    let offsets: u64 = windows
        .iter()
        .map(|w| (w.end_offset - w.start_offset) as u64)
        .sum();

    // Read and look up applied ids while the scan goes on.
    let (sender, mut chunks) = mpsc::channel(4);
    let scanner = {
        let (kafka, topic, windows) = (kafka.clone(), request.topic.clone(), windows.clone());
        tokio::task::spawn_blocking(move || scan::scan(&kafka, &topic, &windows, &sender))
    };
    // What each position of the window holds (for applied_not_in_topic).
    let mut positions: HashMap<i32, Vec<(i64, Option<Uuid>)>> = HashMap::new();
    let mut unapplied = Vec::new();
    let mut totals = Counts::default();
    let mut by_name: BTreeMap<String, Counts> = BTreeMap::new();
    let mut read = 0u64;
    let name_of = |r: &scan::ScannedRecord| r.event_name.clone().unwrap_or_else(|| "-".into());
    while let Some(chunk) = chunks.recv().await {
        let ids: Vec<String> = chunk
            .iter()
            .filter_map(|r| r.event_id.as_deref().map(canonical_id))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let applied = crate::dedup::applied_ids(db, &request.group, &ids).await?;
        for record in chunk {
            let id = record.event_id.as_deref().map(canonical_id);
            positions.entry(record.partition).or_default().push((
                record.offset,
                id.as_deref().and_then(|i| Uuid::parse_str(i).ok()),
            ));
            if id.is_some_and(|i| applied.contains(&i)) {
                totals.add(Class::Applied);
                by_name
                    .entry(name_of(&record))
                    .or_default()
                    .add(Class::Applied);
            } else {
                unapplied.push(record);
            }
            read += 1;
        }
        progress(Progress {
            records: read,
            offsets,
        });
    }
    scanner
        .await
        .map_err(|e| ReconcileError::Task(e.to_string()))??;

    // The rest: accounted for otherwise, or not.
    let now = crate::clock::now_ms();
    let grace_ms = request.grace.as_millis() as i64;
    let mut by_partition: BTreeMap<i32, Vec<scan::ScannedRecord>> = BTreeMap::new();
    for record in unapplied {
        by_partition
            .entry(record.partition)
            .or_default()
            .push(record);
    }
    let mut missing_by_partition: HashMap<i32, u64> = HashMap::new();
    let mut missing = Vec::new();
    let mut oldest_missing_ms: Option<i64> = None;
    for (partition, records) in by_partition {
        let from = records.iter().map(|r| r.offset).min().unwrap_or_default();
        let to = records.iter().map(|r| r.offset).max().unwrap_or_default();
        let (group, topic) = (request.group.as_str(), request.topic.as_str());
        // The tables that account for a record in this order of precedence.
        let mut matchers = Vec::with_capacity(3);
        for (source, class) in [
            (Source::DeadLetters, Class::DeadLettered),
            (Source::Held, Class::Held),
            (Source::ParkedHeads, Class::Parked),
        ] {
            let rows =
                accounted::at_positions(db, source, group, topic, partition, from, to).await?;
            matchers.push((Matcher::new(rows), class));
        }
        let committed = committed.get(&partition).copied().flatten();
        for record in records {
            let class = match matchers.iter().find(|(m, _)| m.matches(&record)) {
                Some((_, class)) => *class,
                None if committed.is_none_or(|c| record.offset >= c) => Class::Unconsumed,
                None if now - record.timestamp_ms < grace_ms => Class::InFlight,
                None => Class::Missing,
            };
            totals.add(class);
            by_name.entry(name_of(&record)).or_default().add(class);
            if class == Class::Missing {
                *missing_by_partition.entry(partition).or_default() += 1;
                oldest_missing_ms = Some(
                    oldest_missing_ms.map_or(record.timestamp_ms, |t| t.min(record.timestamp_ms)),
                );
                if missing.len() < request.list_limit {
                    missing.push(record);
                }
            }
        }
    }

    // Dedup rows at positions of the window that hold no such event.
    for held in positions.values_mut() {
        held.sort_unstable_by_key(|(offset, _)| *offset);
    }
    let window_of: HashMap<i32, &PartitionWindow> =
        windows.iter().map(|w| (w.partition, w)).collect();
    let since =
        chrono::DateTime::from_timestamp_millis(request.since_ms - CLOCK_MARGIN.as_millis() as i64)
            .unwrap_or_default();
    let mut applied_not_in_topic = Vec::new();
    let mut applied_not_in_topic_count = 0u64;
    accounted::applied_since(db, &request.group, &request.topic, since, |row| {
        if !window_of
            .get(&row.partition)
            .is_some_and(|w| w.contains(row.offset))
        {
            return;
        }
        let held_there = positions.get(&row.partition).and_then(|p| {
            p.binary_search_by_key(&row.offset, |(o, _)| *o)
                .ok()
                .map(|i| p[i].1)
        });
        let same = held_there
            .flatten()
            .is_some_and(|id| Uuid::parse_str(&row.event_id).is_ok_and(|r| r == id));
        if !same {
            applied_not_in_topic_count += 1;
            if applied_not_in_topic.len() < request.list_limit {
                applied_not_in_topic.push(AppliedNotInTopic {
                    event_id: row.event_id,
                    event_name: row.event_name,
                    partition: row.partition,
                    offset: row.offset,
                });
            }
        }
    })
    .await?;
    applied_not_in_topic.sort_by_key(|a| (a.partition, a.offset));

    let partitions = windows
        .iter()
        .map(|w| PartitionReport {
            window: w.clone(),
            committed_offset: committed.get(&w.partition).copied().flatten(),
            records: positions.get(&w.partition).map_or(0, |p| p.len() as u64),
            missing: missing_by_partition.get(&w.partition).copied().unwrap_or(0),
        })
        .collect();
    missing.sort_by_key(|m| (m.partition, m.offset));
    Ok(Report {
        group: request.group.clone(),
        topic: request.topic.clone(),
        since_ms: request.since_ms,
        until_ms: request.until_ms,
        grace_ms,
        started_ms,
        finished_ms: crate::clock::now_ms(),
        totals,
        by_event_name: by_name,
        partitions,
        oldest_missing_ms,
        missing,
        applied_not_in_topic_count,
        applied_not_in_topic,
    })
}

/// Positions and event ids a group accounts for in one partition.
struct Matcher {
    offsets: HashSet<i64>,
    ids: HashSet<String>,
}

impl Matcher {
    fn new(rows: Vec<accounted::Accounted>) -> Self {
        Self {
            offsets: rows.iter().map(|r| r.offset).collect(),
            ids: rows
                .into_iter()
                .filter_map(|r| r.event_id.map(|i| canonical_id(&i)))
                .collect(),
        }
    }

    /// By position, or by event id (the same event published twice).
    fn matches(&self, record: &scan::ScannedRecord) -> bool {
        self.offsets.contains(&record.offset)
            || record
                .event_id
                .as_deref()
                .is_some_and(|i| self.ids.contains(&canonical_id(i)))
    }
}

/// The group's committed offset on each partition of the window.
async fn committed_offsets(
    kafka: &KafkaSettings,
    group: &str,
    topic: &str,
    windows: &[PartitionWindow],
) -> Result<HashMap<i32, Option<i64>>, ReconcileError> {
    let mut wanted = TopicPartitionList::new();
    for w in windows {
        wanted.add_partition(topic, w.partition);
    }
    let (kafka, group) = (kafka.clone(), group.to_string());
    let committed =
        tokio::task::spawn_blocking(move || crate::lag::committed_offsets(&kafka, &group, &wanted))
            .await
            .map_err(|e| ReconcileError::Task(e.to_string()))??;
    Ok(committed.into_iter().map(|((_, p), o)| (p, o)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, event_id: Option<&str>) -> scan::ScannedRecord {
        scan::ScannedRecord {
            partition: 0,
            offset,
            event_id: event_id.map(str::to_string),
            event_name: None,
            timestamp_ms: 0,
        }
    }

    #[test]
    fn ids_are_looked_up_in_their_canonical_form() {
        assert_eq!(
            canonical_id("0190A3C2-0000-7000-8000-00000000000A"),
            "0190a3c2-0000-7000-8000-00000000000a"
        );
        assert_eq!(
            canonical_id("0190a3c200007000800000000000000a"),
            "0190a3c2-0000-7000-8000-00000000000a"
        );
        assert_eq!(canonical_id("not-a-uuid"), "not-a-uuid");
    }

    #[test]
    fn a_record_is_accounted_for_by_its_position_or_its_event_id() {
        let id = "0190a3c2-0000-7000-8000-00000000000a";
        let m = Matcher::new(vec![accounted::Accounted {
            offset: 7,
            event_id: Some(id.to_uppercase()),
        }]);
        assert!(m.matches(&record(7, None)));
        assert!(
            m.matches(&record(9, Some(id))),
            "the same event at another offset"
        );
        assert!(!m.matches(&record(8, Some("0190a3c2-0000-7000-8000-00000000000b"))));
        assert!(!m.matches(&record(8, None)));
    }

    #[test]
    fn counts_add_to_their_class_and_to_the_records() {
        let mut c = Counts::default();
        for class in [
            Class::Applied,
            Class::Applied,
            Class::Missing,
            Class::InFlight,
            Class::Held,
        ] {
            c.add(class);
        }
        assert_eq!(
            (
                c.records,
                c.applied,
                c.missing,
                c.in_flight,
                c.held,
                c.dead_lettered
            ),
            (5, 2, 1, 1, 1, 0)
        );
    }
}
