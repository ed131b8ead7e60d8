//! `orderpipe dlq replay`: republish dead letters and mark them replayed.
//!
//! By default a dead letter goes back to the failing group's retry topic,
//! due now, with a fresh retry budget, so only that group re-runs it. That
//! is the retry topic of the topic the group reads (the row's original
//! topic), not of the configured order topic: a group run with
//! `consume --topic X` gets its replays on `X.retry.<group>`. Its original
//! key, value and headers are kept byte for byte, and it carries the
//! failure headers a forwarded record does (the one writer is
//! [`crate::retry::tier_record`]), its origin (`orderpipe.original-*`)
//! included: if it fails again, the persister turns the same row back to
//! pending instead of adding one. `--to-original` republishes to the
//! original topic instead (every group sees it; groups that applied it
//! skip it as a duplicate).
//!
//! Replaying twice applies nothing twice: the event id is unchanged, so the
//! group's `event_dedup` row skips it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use rdkafka::producer::FutureProducer;
use serde::Serialize;

use super::store::{self, DeadLetterRecord};
use crate::db::Db;
use crate::kafka::client::{KafkaSettings, client_config, producer_options};
use crate::producer::ProducerSettings;
use crate::clock::now_ms;
use crate::kafka::record::FailureHistory;
use crate::retry::{Hop, LastFailure, TierRecord, TierTopics, tier_record, topic_read_by};

/// How to replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Republish to the original topic instead of the group's retry topic.
    pub to_original: bool,
    /// Records per second at most (None = unpaced).
    pub rate: Option<u32>,
}

/// What a replay did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReplaySummary {
    /// Rows republished and marked replayed.
    pub replayed: u64,
    /// Rows that could not be republished, with the reason.
    pub failed: Vec<String>,
    /// Republished per destination topic.
    pub by_topic: BTreeMap<String, u64>,
}

/// A row's record as `dlq replay` republishes it: to the retry topic of
/// the topic its group reads (or to that topic, `--to-original`), with the
/// headers a forwarded record carries (see [`crate::retry::tier_record`]);
/// `dead_letter_topic` is where it goes if it fails again.
pub fn replayed_record(dead_letter_topic: &str, dead: &DeadLetterRecord, options: ReplayOptions, now_ms: i64) -> TierRecord {
    let row = &dead.row;
    let history = FailureHistory {
        original_topic: row.original_topic.clone(),
        original_partition: row.original_partition,
        original_offset: row.original_offset,
        original_timestamp: dead.original_timestamp,
        attempt: 0,
        executions: 0,
        first_failure_ms: Some(row.first_failure_ms),
    };
    let hop = if options.to_original {
        Hop::ReplayToOriginal { row_id: row.id }
    } else {
        Hop::Replay { row_id: row.id, due_ms: now_ms }
    };
    let last = LastFailure { class: &row.error_class, message: &row.error_message, at_ms: row.last_failure_ms };
    let read = topic_read_by(&row.original_topic, &row.consumer_group);
    let topics = TierTopics::of(read, &row.consumer_group, dead_letter_topic);
    let original: BTreeMap<String, String> = serde_json::from_str(&dead.headers).unwrap_or_default();
    let original = original.iter().map(|(k, v)| (k.as_str(), Some(v.as_bytes())));
    tier_record(original, &history, &row.consumer_group, hop, last, &topics)
}

/// Where a row would go.
fn destination(dead_letter_topic: &str, row: &DeadLetterRecord, options: ReplayOptions) -> String {
    replayed_record(dead_letter_topic, row, options, 0).topic
}

/// A row of `dlq replay --dry-run`: a dead letter and where it would go.
/// (Fields in name order: the order its JSON always printed.)
#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    /// Event id (from the headers).
    pub event_id: Option<String>,
    /// Event name (from the headers).
    pub event_name: Option<String>,
    /// Group that failed it.
    pub group: String,
    /// Row id.
    pub id: i64,
    /// The topic it would be republished to.
    pub to: String,
}

/// What replaying `rows` would do, changing nothing.
pub fn plan(dead_letter_topic: &str, rows: &[DeadLetterRecord], options: ReplayOptions) -> Vec<Planned> {
    rows.iter()
        .map(|r| Planned {
            event_id: r.row.event_id.clone(),
            event_name: r.row.event_name.clone(),
            group: r.row.consumer_group.clone(),
            id: r.row.id,
            to: destination(dead_letter_topic, r, options),
        })
        .collect()
}

/// Rows republished before their statuses are updated together.
const CHUNK: usize = 500;

/// Republishes `rows`, marking them replayed once the broker acknowledged
/// them (a chunk at a time: sends in flight together, one UPDATE per chunk);
/// `progress` is called after each row. The producer is built from `kafka`
/// and `producer`; `dead_letter_topic` is the `topics.dead_letter` name.
pub async fn replay(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
    dead_letter_topic: &str,
    db: &Db,
    rows: &[DeadLetterRecord],
    options: ReplayOptions,
    mut progress: impl FnMut(),
) -> anyhow::Result<ReplaySummary> {
    let producer: FutureProducer =
        client_config(&producer_options(&kafka.client_options(), &producer.options)?).create()?;
    let mut summary = ReplaySummary::default();
    let started = tokio::time::Instant::now();
    // With --rate, a chunk is about one second of records, so the pace holds
    // at one-second granularity.
    let chunk_size = options.rate.map_or(CHUNK, |r| (r as usize).clamp(1, CHUNK));
    for (c, chunk) in rows.chunks(chunk_size).enumerate() {
        let now = now_ms();
        let records: Vec<TierRecord> = chunk.iter().map(|d| replayed_record(dead_letter_topic, d, options, now)).collect();
        // FuturesOrdered polls every pushed send on its first poll, so the
        // whole chunk is enqueued before the first acknowledgement is awaited.
        let mut in_flight = FuturesOrdered::new();
        for (i, (dead, record)) in chunk.iter().zip(&records).enumerate() {
            if let Some(rate) = options.rate.filter(|r| *r > 0) {
                let n = c * chunk_size + i;
                tokio::time::sleep_until(started + Duration::from_secs_f64(n as f64 / f64::from(rate))).await;
            }
            // Enqueue now (all of the chunk in flight together), await below.
            let send = producer.send(record.to_send(dead.key.as_deref(), dead.payload.as_deref()), Duration::from_secs(30));
            let (id, topic) = (dead.row.id, &record.topic);
            in_flight.push_back(async move { (id, topic, send.await) });
        }
        let mut done = Vec::with_capacity(chunk.len());
        while let Some((id, topic, delivered)) = in_flight.next().await {
            match delivered {
                Ok(_) => {
                    done.push(id);
                    *summary.by_topic.entry(topic.clone()).or_default() += 1;
                }
                Err((e, _)) => summary.failed.push(format!("dead letter {id}: {e}")),
            }
            progress();
        }
        store::mark_replayed(db, &done).await?;
        summary.replayed += done.len() as u64;
    }
    Ok(summary)
}
