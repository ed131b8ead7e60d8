//! `orderpipe dlq persist`: the DLQ topic into the `dead_letters` table.
//!
//! It also reads cdc's DLQ topic (`cdc.dead_letter_topic`, the row changes
//! `cdc` could not publish, see [`crate::cdc::oversize`]) when there is one:
//! such a record never reached its change topic, so it has no original
//! partition or offset (its original partition header is -1); its row is
//! keyed by where it is on the cdc DLQ topic instead (original partition
//! `-1 - p`, original offset its offset in partition `p`), which is unique
//! per record and the same at every re-read.
//!
//! Records are read in batches, upserted in one transaction (unique on
//! group + original topic/partition/offset, so re-reading after a crash
//! inserts nothing twice), and only then are the offsets stored. A database
//! outage is retried in place with backoff; nothing is skipped.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;

use super::store::{self, NewDeadLetter};
use crate::backoff::{never, until_available};
use crate::clock::now_ms;
use crate::db::Db;
use crate::kafka::client::{KafkaSettings, client_config};
use crate::kafka::record::{FailureHistory, header, header_text, headers_json};

/// Counts of a persister run.
#[derive(Debug, Default, Clone, Serialize)]
pub struct PersistSummary {
    /// DLQ records read.
    pub read: u64,
    /// Batches committed.
    pub batches: u64,
    /// Failed attempts to write a batch (retried).
    pub write_failures: u64,
}

/// How often the persister looks for cdc's DLQ topic while it does not exist.
pub const CDC_TOPIC_CHECK: Duration = Duration::from_secs(30);

/// Characters of `dead_letters.event_id` and `.event_name`.
const EVENT_ID_CHARS: usize = 64;
const EVENT_NAME_CHARS: usize = 128;

/// The table row for one DLQ record.
pub fn dead_letter_of(message: &impl Message) -> NewDeadLetter {
    let mut history = FailureHistory::of(message);
    if history.original_partition < 0 && header_text(message, header::ORIGINAL_OFFSET).is_none() {
        history.original_partition = -1 - message.partition();
        history.original_offset = message.offset();
    }
    let num = |name| header_text(message, name).and_then(|v| v.parse::<i64>().ok());
    let appended = message.timestamp().to_millis().unwrap_or_else(now_ms);
    NewDeadLetter {
        consumer_group: header_text(message, header::GROUP).unwrap_or_else(|| "(unknown)".into()),
        original_topic: history.original_topic,
        original_partition: history.original_partition,
        original_offset: history.original_offset,
        original_timestamp: history.original_timestamp,
        key: message.key().map(<[u8]>::to_vec),
        payload: message.payload().map(<[u8]>::to_vec),
        headers: headers_json(message),
        // Copies of headers for filtering; a value longer than its column
        // is not a valid id or name, and `headers` keeps it whole.
        event_id: header_text(message, header::EVENT_ID)
            .filter(|v| crate::db::fits_column(v, EVENT_ID_CHARS)),
        event_name: header_text(message, header::EVENT_NAME)
            .filter(|v| crate::db::fits_column(v, EVENT_NAME_CHARS)),
        error_class: header_text(message, header::ERROR_CLASS).unwrap_or_else(|| "unknown".into()),
        error_message: header_text(message, header::ERROR_MESSAGE).unwrap_or_default(),
        attempts: num(header::ATTEMPTS).unwrap_or(0) as i32,
        first_failure_ms: num(header::FIRST_FAILURE).unwrap_or(appended),
        last_failure_ms: num(header::LAST_FAILURE).unwrap_or(appended),
        dlq_partition: message.partition(),
        dlq_offset: message.offset(),
    }
}

/// Runs the persister until `shutdown`, or until the topic was idle
/// `until_idle`: group `dlq.persister_group`, reading `dead_letter` and
/// cdc's `cdc_dead_letter` topic once it exists (looked for again every
/// [`CDC_TOPIC_CHECK`] while it does not).
pub async fn run(
    kafka: &KafkaSettings,
    dlq: &super::DlqSettings,
    dead_letter: &crate::topics::TopicSpec,
    cdc_dead_letter: Option<&str>,
    db: &Db,
    until_idle: Option<Duration>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<PersistSummary> {
    let consumer: StreamConsumer = client_config(&kafka.client_options())
        .set("group.id", &dlq.persister_group)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.commit.interval.ms", "1000")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .create()?;
    // Read-only rights on topics: check the DLQ topic, never create it.
    crate::topics::require(
        consumer.client(),
        &kafka.bootstrap_servers,
        &[crate::topics::Required::declared(dead_letter)],
        &crate::topics::ensure_command(None),
    )?;
    // cdc's topic is created by `orderpipe cdc`; where none runs (yet) there is none,
    // and subscribing to a missing topic makes every poll an error.
    let mut cdc_missing = cdc_dead_letter;
    let mut cdc_checked = Instant::now();
    let subscribe = |cdc_missing: &mut Option<&str>| -> anyhow::Result<()> {
        let mut topics = vec![dead_letter.name.as_str()];
        if let Some(topic) = cdc_missing.filter(|t| topic_exists(&consumer, t)) {
            topics.push(topic);
            *cdc_missing = None;
        }
        tracing::info!(?topics, "dlq persist: reading");
        consumer.subscribe(&topics)?;
        Ok(())
    };
    subscribe(&mut cdc_missing)?;
    let mut summary = PersistSummary::default();
    let mut last_record = Instant::now();
    tokio::pin!(shutdown);
    loop {
        let first = tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if cdc_missing.is_some() && cdc_checked.elapsed() >= CDC_TOPIC_CHECK {
                    cdc_checked = Instant::now();
                    subscribe(&mut cdc_missing)?;
                }
                // Idle time counts from the assignment on: joining the group
                // can take longer than the idle window, and must not end the run.
                if !consumer.assignment().is_ok_and(|a| a.count() > 0) {
                    last_record = Instant::now();
                } else if until_idle.is_some_and(|idle| last_record.elapsed() >= idle) {
                    break;
                }
                continue;
            }
            m = consumer.recv() => m,
        };
        let mut batch = vec![first?.detach()];
        while batch.len() < 500 {
            match consumer.recv().now_or_never() {
                Some(Ok(m)) => batch.push(m.detach()),
                _ => break,
            }
        }
        last_record = Instant::now();
        let rows: Vec<NewDeadLetter> = batch.iter().map(dead_letter_of).collect();
        let failed = |e| {
            summary.write_failures += 1;
            async { Ok(e) }
        };
        let Ok(()) = until_available(
            "dead letters not written",
            || write(db, &rows),
            failed,
            never,
        )
        .await;
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in &batch {
            let slot = next
                .entry((m.topic().to_string(), m.partition()))
                .or_default();
            *slot = (*slot).max(m.offset() + 1);
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
            offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
        }
        consumer.store_offsets(&offsets)?;
        summary.read += batch.len() as u64;
        summary.batches += 1;
    }
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    Ok(summary)
}

/// Whether `topic` is on the cluster (a metadata failure counts as no).
fn topic_exists(consumer: &StreamConsumer, topic: &str) -> bool {
    consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .is_ok_and(|m| {
            m.topics()
                .first()
                .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty())
        })
}

async fn write(db: &Db, rows: &[NewDeadLetter]) -> Result<(), crate::db::DbError> {
    let mut tx = db.begin().await?;
    for row in rows {
        store::upsert(&mut tx, row).await?;
    }
    tx.commit().await?;
    Ok(())
}
