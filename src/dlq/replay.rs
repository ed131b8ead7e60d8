//! `orderpipe dlq replay`: republish dead letters and mark them replayed.
//!
//! By default a dead letter goes back to the failing group's retry topic,
//! due now, with a fresh retry budget, so only that group re-runs it. Its
//! original key, value and headers are kept byte for byte, and so is its
//! origin (the `orderpipe.original-*` headers): if it fails again, the
//! persister turns the same row back to pending instead of adding one.
//! `--to-original` republishes to the original topic instead (every group
//! sees it; groups that applied it skip it as a duplicate).
//!
//! Replaying twice applies nothing twice: the event id is unchanged, so the
//! group's `event_dedup` row skips it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;

use super::store::{self, DeadLetterRecord};
use crate::config::Settings;
use crate::db::Db;
use crate::producer::config::{client_config, producer_options};
use crate::retry::{header, now_ms, retry_topic};

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

/// Where a row would go.
pub fn destination(settings: &Settings, row: &DeadLetterRecord, options: ReplayOptions) -> String {
    if options.to_original {
        row.row.original_topic.clone()
    } else {
        retry_topic(&settings.topics.order_events.name, &row.row.consumer_group)
    }
}

/// Rows republished before their statuses are updated together.
const CHUNK: usize = 500;

/// Republishes `rows`, marking them replayed once the broker acknowledged
/// them (a chunk at a time: sends in flight together, one UPDATE per chunk);
/// `progress` is called after each row.
pub async fn replay(
    settings: &Settings,
    db: &Db,
    rows: &[DeadLetterRecord],
    options: ReplayOptions,
    mut progress: impl FnMut(),
) -> anyhow::Result<ReplaySummary> {
    let producer: FutureProducer =
        client_config(&producer_options(&settings.kafka_client_options(), &settings.producer.options)?).create()?;
    let mut summary = ReplaySummary::default();
    let started = tokio::time::Instant::now();
    // With --rate, a chunk is about one second of records, so the pace holds
    // at one-second granularity.
    let chunk_size = options.rate.map_or(CHUNK, |r| (r as usize).clamp(1, CHUNK));
    for (c, chunk) in rows.chunks(chunk_size).enumerate() {
        let topics: Vec<String> = chunk.iter().map(|d| destination(settings, d, options)).collect();
        // FuturesOrdered polls every pushed send on its first poll, so the
        // whole chunk is enqueued before the first acknowledgement is awaited.
        let mut in_flight = FuturesOrdered::new();
        for (i, (dead, topic)) in chunk.iter().zip(&topics).enumerate() {
            if let Some(rate) = options.rate.filter(|r| *r > 0) {
                let n = c * chunk_size + i;
                tokio::time::sleep_until(started + Duration::from_secs_f64(n as f64 / f64::from(rate))).await;
            }
            // Enqueue now (all of the chunk in flight together), await below.
            let send = producer.send(record_for(dead, topic, options), Duration::from_secs(30));
            let id = dead.row.id;
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

/// The record to republish for a dead letter: original key, value and
/// headers, plus where it came from so a new failure updates the same row.
fn record_for<'a>(dead: &'a DeadLetterRecord, topic: &'a str, options: ReplayOptions) -> FutureRecord<'a, [u8], [u8]> {
    let original: BTreeMap<String, String> = serde_json::from_str(&dead.headers).unwrap_or_default();
    let mut ours: Vec<(&str, String)> = vec![(header::REPLAYED_FROM, dead.row.id.to_string())];
    if !options.to_original {
        ours.extend([
            (header::ORIGINAL_TOPIC, dead.row.original_topic.clone()),
            (header::ORIGINAL_PARTITION, dead.row.original_partition.to_string()),
            (header::ORIGINAL_OFFSET, dead.row.original_offset.to_string()),
            (header::GROUP, dead.row.consumer_group.clone()),
            (header::ATTEMPT, "0".into()),
            (header::ATTEMPTS, "0".into()),
            (header::DUE, now_ms().to_string()),
        ]);
    }
    let mut headers = OwnedHeaders::new();
    for (k, v) in original.iter().filter(|(k, _)| !k.starts_with(header::PREFIX)) {
        headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    for (k, v) in &ours {
        headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let mut record = FutureRecord::to(topic).headers(headers);
    if let Some(key) = &dead.key {
        record = record.key(key.as_slice());
    }
    if let Some(value) = &dead.payload {
        record = record.payload(value.as_slice());
    }
    record
}
