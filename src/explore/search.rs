//! Record search over a whole topic: the records matching a key, an event
//! id, a time range and a predicate on the decoded body, written in the
//! subscriptions' filter language ([`PropertyFilter`]: `status:eq:1`,
//! `order_id:in:7,9`, `status:changed:1->2`), all of which must hold.
//!
//! A search is bounded before it starts: from each partition's first
//! offset at `from` (or its log start) to its first offset after `to` (or
//! its last stable offset then), and at most `max_scan` records in all; it
//! keeps at most `max_matches`. The scan runs on a blocking thread: the key
//! and the `event_id` header are compared on the raw record, and only the
//! records that pass them are decoded for the predicate. [`Progress`] says
//! how far it is and takes a cancel, which ends it at the next record.
//! Records are read `read_committed`, as the groups read them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{Decoder, ExploreError, REQUEST_TIMEOUT, RawRecord, reader};
use crate::kafka::client::KafkaSettings;
use crate::kafka::offsets;
use crate::kafka::record::header;
use crate::subscriptions::PropertyFilter;
use crate::subscriptions::filter::all_match;

/// Records one search reads at most, by default.
pub const DEFAULT_MAX_SCAN: u64 = 1_000_000;
/// The largest bound a search may be given.
pub const MAX_SCAN: u64 = 50_000_000;
/// Matches one search keeps at most, by default.
pub const DEFAULT_MAX_MATCHES: usize = 1_000;

/// What to find.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SearchSpec {
    /// The topic, every partition.
    pub topic: String,
    /// The record key, exactly.
    pub key: Option<String>,
    /// The `event_id` header, exactly.
    pub event_id: Option<String>,
    /// Records at or after this time (ms since the epoch).
    pub from_ms: Option<i64>,
    /// Records before this time (ms since the epoch).
    pub to_ms: Option<i64>,
    /// Conditions on the decoded body's `data` (and `old`), all of which must hold.
    #[serde(skip)]
    pub predicate: Vec<PropertyFilter>,
    /// The predicate as written, one condition per entry.
    pub predicate_text: Vec<String>,
    /// Records read at most.
    pub max_scan: u64,
    /// Matches kept at most.
    pub max_matches: usize,
}

impl SearchSpec {
    /// A search of `topic` from the form's or the flags' texts: blank ones
    /// are left out; a bad one names its field and what it accepts.
    pub fn parse(
        topic: &str,
        key: Option<&str>,
        event_id: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
        predicate: &[String],
        max_scan: Option<u64>,
    ) -> Result<Self, ExploreError> {
        let blank = |s: Option<&str>| s.map(str::trim).filter(|s| !s.is_empty()).map(String::from);
        let time = |field: &'static str, text: Option<String>| {
            text.map(|t| {
                chrono::DateTime::parse_from_rfc3339(&t)
                    .map(|t| t.timestamp_millis())
                    .map_err(|_| {
                        ExploreError::invalid(
                            field,
                            format!("`{t}` is not an RFC 3339 time (e.g. 2026-12-01T08:30:00Z)"),
                        )
                    })
            })
            .transpose()
        };
        let predicate_text: Vec<String> = predicate
            .iter()
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        let filters = predicate_text
            .iter()
            .map(|p| {
                PropertyFilter::parse(p, "where")
                    .map_err(|e| ExploreError::invalid("where", e.reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let max_scan = max_scan.unwrap_or(DEFAULT_MAX_SCAN);
        if !(1..=MAX_SCAN).contains(&max_scan) {
            return Err(ExploreError::invalid(
                "max_scan",
                format!("{max_scan} is not a number from 1 to {MAX_SCAN}"),
            ));
        }
        let spec = Self {
            topic: topic.to_string(),
            key: blank(key),
            event_id: blank(event_id),
            from_ms: time("from", blank(from))?,
            to_ms: time("to", blank(to))?,
            predicate: filters,
            predicate_text,
            max_scan,
            max_matches: DEFAULT_MAX_MATCHES,
        };
        if let (Some(from), Some(to)) = (spec.from_ms, spec.to_ms)
            && to <= from
        {
            return Err(ExploreError::invalid("to", "must be after `from`"));
        }
        Ok(spec)
    }

    /// Whether the raw record passes the key and event id.
    fn passes_raw(&self, message: &impl Message) -> bool {
        if let Some(key) = &self.key
            && message.key() != Some(key.as_bytes())
        {
            return false;
        }
        if let Some(id) = &self.event_id {
            let header = message.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == header::EVENT_ID)
                    .and_then(|h| h.value)
            });
            if header != Some(id.as_bytes()) {
                return false;
            }
        }
        true
    }
}

/// How far a search is; shared with whoever watches it, who may cancel it.
#[derive(Debug, Default)]
pub struct Progress {
    scanned: AtomicU64,
    total: AtomicU64,
    matched: AtomicU64,
    cancelled: AtomicBool,
}

impl Progress {
    /// Records read so far.
    pub fn scanned(&self) -> u64 {
        self.scanned.load(Ordering::Relaxed)
    }

    /// Records the search will read at most (known once it started).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Matches so far.
    pub fn matched(&self) -> u64 {
        self.matched.load(Ordering::Relaxed)
    }

    /// Ends the search at its next record.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// Why a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// Every partition was read to its bound.
    Complete,
    /// Cancelled.
    Cancelled,
    /// `max_scan` records were read.
    ScanBound,
    /// `max_matches` records matched.
    MatchBound,
}

/// What a search found.
#[derive(Debug, Clone, Serialize)]
pub struct SearchOutcome {
    /// Why it ended.
    pub ended: Ended,
    /// Records read.
    pub scanned: u64,
    /// Records it would have read to the bounds.
    pub total: u64,
    /// Where each partition stopped (the next offset to read), to go on from.
    pub next_offsets: BTreeMap<i32, i64>,
    /// The matches, in the order read (offset order within a partition).
    pub matches: Vec<RawRecord>,
}

/// Runs `spec`, reporting to `progress`.
pub async fn search(
    kafka: &KafkaSettings,
    decoder: &Decoder,
    spec: &SearchSpec,
    progress: &std::sync::Arc<Progress>,
) -> Result<SearchOutcome, ExploreError> {
    // Records that passed the raw filters go to the decoder (for the
    // predicate) through a bounded channel; the scan waits when it is full.
    let (candidates, mut received) = tokio::sync::mpsc::channel::<RawRecord>(1_024);
    let scan = {
        let (kafka, spec, progress) = (kafka.clone(), spec.clone(), progress.clone());
        tokio::task::spawn_blocking(move || scan(&kafka, &spec, &progress, &candidates))
    };
    let mut matches = Vec::new();
    while let Some(record) = received.recv().await {
        if matches.len() >= spec.max_matches {
            continue;
        }
        if !spec.predicate.is_empty() {
            let Some(envelope) = decoder
                .envelope(record.value.as_deref().unwrap_or_default())
                .await
            else {
                continue;
            };
            let (data, old) = envelope.data.data_and_old();
            if !all_match(&spec.predicate, &data, &old) {
                continue;
            }
        }
        matches.push(record);
        progress.matched.fetch_add(1, Ordering::Relaxed);
        if matches.len() >= spec.max_matches {
            // Stops the scan; what is in the channel is drained and dropped.
            progress.cancel();
        }
    }
    let (mut ended, next_offsets) = scan
        .await
        .map_err(|e| ExploreError::Task(e.to_string()))??;
    if matches.len() >= spec.max_matches {
        ended = Ended::MatchBound;
    }
    Ok(SearchOutcome {
        ended,
        scanned: progress.scanned(),
        total: progress.total(),
        next_offsets,
        matches,
    })
}

/// The blocking scan: every partition within its bounds, raw filters
/// applied, candidates sent on. Returns why it ended and where each
/// partition stopped.
fn scan(
    kafka: &KafkaSettings,
    spec: &SearchSpec,
    progress: &Progress,
    candidates: &tokio::sync::mpsc::Sender<RawRecord>,
) -> Result<(Ended, BTreeMap<i32, i64>), ExploreError> {
    let consumer = reader(kafka)?;
    let ranges = offsets::partition_ranges(&consumer, &spec.topic, REQUEST_TIMEOUT)?
        .ok_or_else(|| ExploreError::NoTopic(spec.topic.clone()))?;
    let starts = match spec.from_ms {
        Some(ms) => {
            offsets::first_offsets_at(&consumer, &spec.topic, &ranges, ms, REQUEST_TIMEOUT)?
        }
        None => ranges.iter().map(|r| r.low).collect(),
    };
    let ends = match spec.to_ms {
        Some(ms) => {
            offsets::first_offsets_at(&consumer, &spec.topic, &ranges, ms, REQUEST_TIMEOUT)?
        }
        None => ranges.iter().map(|r| r.high).collect(),
    };
    // Where each partition is, and where it ends.
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut end: BTreeMap<i32, i64> = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for ((range, start), stop) in ranges.iter().zip(&starts).zip(&ends) {
        next.insert(range.partition, *start);
        end.insert(range.partition, *stop);
        if start < stop {
            assignment.add_partition_offset(
                &spec.topic,
                range.partition,
                Offset::Offset(*start),
            )?;
        }
    }
    let total: u64 = next
        .iter()
        .map(|(p, start)| (end[p] - start).max(0) as u64)
        .sum();
    progress
        .total
        .store(total.min(spec.max_scan), Ordering::Relaxed);
    let mut open = assignment.count();
    if open == 0 {
        return Ok((Ended::Complete, next));
    }
    consumer.assign(&assignment)?;
    let finish = |partition: i32| -> Result<(), KafkaError> {
        let mut done = TopicPartitionList::new();
        done.add_partition(&spec.topic, partition);
        consumer.pause(&done)
    };
    loop {
        if progress.is_cancelled() {
            return Ok((Ended::Cancelled, next));
        }
        if progress.scanned() >= spec.max_scan {
            return Ok((Ended::ScanBound, next));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                let partition = message.partition();
                if message.offset() >= end[&partition] {
                    // Past the bound (read ahead before the pause took).
                    continue;
                }
                progress.scanned.fetch_add(1, Ordering::Relaxed);
                next.insert(partition, message.offset() + 1);
                if spec.passes_raw(&message)
                    && candidates.blocking_send(RawRecord::of(&message)).is_err()
                {
                    // The receiver is gone: nobody waits for the result.
                    return Ok((Ended::Cancelled, next));
                }
                if message.offset() + 1 >= end[&partition] {
                    finish(partition)?;
                    open -= 1;
                }
            }
            // Aborted records or markers up to the end.
            Some(Err(KafkaError::PartitionEOF(partition)))
                if next[&partition] < end[&partition] =>
            {
                next.insert(partition, end[&partition]);
                finish(partition)?;
                open -= 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
        if open == 0 {
            return Ok((Ended::Complete, next));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_is_parsed_from_texts_and_bad_ones_name_the_field() {
        let spec = SearchSpec::parse(
            "t",
            Some(" 42 "),
            Some(""),
            Some("2026-12-01T08:00:00Z"),
            None,
            &["status:eq:1".into(), " ".into()],
            None,
        )
        .unwrap();
        assert_eq!(spec.key.as_deref(), Some("42"));
        assert_eq!(spec.event_id, None);
        assert_eq!(spec.from_ms, Some(1_796_112_000_000));
        assert_eq!(spec.predicate.len(), 1);
        assert_eq!(spec.max_scan, DEFAULT_MAX_SCAN);
        let error = |r: Result<SearchSpec, ExploreError>| r.unwrap_err().to_string();
        let bad_where = error(SearchSpec::parse(
            "t",
            None,
            None,
            None,
            None,
            &["status:gt:1".into()],
            None,
        ));
        assert!(
            bad_where.starts_with("where:") && bad_where.contains("eq"),
            "{bad_where}"
        );
        assert!(
            error(SearchSpec::parse(
                "t",
                None,
                None,
                Some("today"),
                None,
                &[],
                None
            ))
            .starts_with("from: `today`")
        );
        assert!(
            error(SearchSpec::parse(
                "t",
                None,
                None,
                Some("2026-12-01T08:00:00Z"),
                Some("2026-12-01T07:00:00Z"),
                &[],
                None
            ))
            .starts_with("to: must be after")
        );
        assert!(
            error(SearchSpec::parse("t", None, None, None, None, &[], Some(0)))
                .starts_with("max_scan: 0")
        );
    }
}
