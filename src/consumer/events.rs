//! The consumer's internal events: each emits its log line and its metric
//! together (see [`crate::metrics::InternalEvent`]). The metric names and
//! labels are [`crate::metrics::name`]'s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};

use crate::metrics::{InternalEvent, name};

/// A group's metrics of applied records, looked up once: a lookup per
/// record builds its label strings and hashes them (four allocations per
/// event on the hot path).
pub struct AppliedMetrics {
    group: String,
    handler_seconds: Histogram,
    end_to_end_seconds: Histogram,
    /// `orderpipe_applied_total` by event name.
    applied: Mutex<HashMap<String, Counter>>,
}

impl AppliedMetrics {
    /// The metrics of `group`.
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_string(),
            handler_seconds: histogram!(name::HANDLER_SECONDS, "group" => group.to_string()),
            end_to_end_seconds: histogram!(name::END_TO_END_SECONDS, "group" => group.to_string()),
            applied: Mutex::default(),
        }
    }

    fn applied(&self, event_name: &str) -> Counter {
        let mut by_name = self.applied.lock().expect("applied metrics lock");
        if let Some(counter) = by_name.get(event_name) {
            return counter.clone();
        }
        let counter = counter!(name::APPLIED, "group" => self.group.clone(), "event_name" => event_name.to_string());
        by_name.insert(event_name.to_string(), counter.clone());
        counter
    }
}

/// The target of this module's log lines (their module path), for a
/// caller asking whether one of them would be printed.
pub(crate) const TARGET: &str = module_path!();

/// A batch of a partition was committed.
pub struct Applied<'a> {
    /// The group's metrics.
    pub metrics: &'a AppliedMetrics,
    /// Event name.
    pub event_name: &'a str,
    /// Handlers' time for this record.
    pub handler_time: Duration,
    /// Now minus the event time.
    pub end_to_end: Option<Duration>,
}

impl InternalEvent for Applied<'_> {
    fn emit(self) {
        let metrics = self.metrics;
        tracing::debug!(
            group = metrics.group,
            event_name = self.event_name,
            "applied"
        );
        metrics.applied(self.event_name).increment(1);
        metrics
            .handler_seconds
            .record(self.handler_time.as_secs_f64());
        if let Some(e2e) = self.end_to_end {
            metrics.end_to_end_seconds.record(e2e.as_secs_f64());
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
        tracing::debug!(
            group = self.group,
            event_name = self.event_name,
            "duplicate skipped"
        );
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
        tracing::warn!(
            group = self.group,
            event_name = self.event_name,
            class = self.class,
            error = self.error,
            "processing failed"
        );
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
        tracing::warn!(
            group = self.group,
            attempt = self.attempt,
            delay_ms = self.delay.as_millis() as u64,
            class = self.class,
            error = self.error,
            "record sent to the retry topic"
        );
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
        tracing::error!(
            group = self.group,
            event_name = self.event_name,
            class = self.class,
            error = self.error,
            "record sent to the dead-letter topic"
        );
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
        tracing::info!(
            group = self.group,
            event_name = self.event_name,
            "held behind its parked key (an earlier event of the order is being retried)"
        );
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
        tracing::info!(
            group = self.group,
            event_name = self.event_name,
            "released: applied after the event it waited behind"
        );
        counter!(name::RELEASED, "group" => self.group.to_string(), "event_name" => self.event_name.to_string()).increment(1);
    }
}

/// A partition was paused because its worker's queue was full: the
/// dispatcher keeps what did not fit and fetches nothing more for it until
/// the worker catches up (see `consumer/dispatch.rs`).
pub struct PartitionPaused<'a> {
    /// Group.
    pub group: &'a str,
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
}

impl InternalEvent for PartitionPaused<'_> {
    fn emit(self) {
        tracing::debug!(
            group = self.group,
            topic = self.topic,
            partition = self.partition,
            "partition paused: its worker's queue is full"
        );
        counter!(name::QUEUE_FULL_PAUSES, "group" => self.group.to_string()).increment(1);
    }
}

/// Partitions paused now (queue full or waiting for a retry due time).
pub fn paused_partitions(group: &str, paused: usize) {
    gauge!(name::PAUSED_PARTITIONS, "group" => group.to_string()).set(paused as f64);
}

/// Whether an operator's pause of the group is in force (1) or not (0).
pub fn group_paused(group: &str, paused: bool) {
    gauge!(name::GROUP_PAUSED, "group" => group.to_string()).set(if paused { 1.0 } else { 0.0 });
}

/// A member started or stopped following an operator's pause of its group.
pub struct GroupPauseFollowed<'a> {
    /// Group.
    pub group: &'a str,
    /// Who paused it; `None`: resumed (or the pause ended by itself).
    pub paused_by: Option<&'a str>,
    /// Why.
    pub reason: &'a str,
    /// When the pause ends by itself (ms since the epoch).
    pub until_ms: Option<i64>,
}

impl InternalEvent for GroupPauseFollowed<'_> {
    fn emit(self) {
        match self.paused_by {
            Some(paused_by) => tracing::warn!(
                group = self.group,
                paused_by,
                reason = self.reason,
                until_ms = ?self.until_ms,
                "group paused by an operator: fetching stopped, records held"
            ),
            None => tracing::warn!(
                group = self.group,
                "group resumed: held records go on in order"
            ),
        }
        group_paused(self.group, self.paused_by.is_some());
    }
}

/// Exports a group's conflicting-duplicates counter at 0 from the start, so
/// `increase()` sees its first conflict (a series born at 1 shows no increase).
pub fn conflicting_duplicates_start(group: &str) {
    counter!(name::CONFLICTING_DUPLICATES, "group" => group.to_string()).increment(0);
}

/// The counter of records received from `topic`, looked up once per
/// partition route (a lookup per record costs two label strings).
pub fn consumed(group: &str, topic: &str) -> metrics::Counter {
    counter!(name::CONSUMED, "group" => group.to_string(), "topic" => topic.to_string())
}

/// The member's group handler could not find its coordinator although the
/// cluster answered; the member stops so that a new client rejoins.
pub struct CoordinatorStuck<'a> {
    /// Group.
    pub group: &'a str,
    /// What the watch saw (`coordinator_watch`).
    pub reason: &'a str,
}

impl InternalEvent for CoordinatorStuck<'_> {
    fn emit(self) {
        tracing::error!(
            group = self.group,
            reason = self.reason,
            "consumer group handler stuck; stopping this member so that a new client rejoins"
        );
        counter!(name::COORDINATOR_STUCK, "group" => self.group.to_string()).increment(1);
    }
}
