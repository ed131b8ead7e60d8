//! Reading the order topic over a time window, partition by partition.
//!
//! [`plan`] turns the window into an offset range per partition: the first
//! offset whose timestamp is at or after `since` (Kafka's `offsets_for_times`,
//! i.e. `ListOffsets` by timestamp), up to the first at or after `until`,
//! bounded by the log start and the last stable offset. [`scan`] then reads
//! those ranges with `read_committed` (records of aborted or open
//! transactions are never seen, as the consumer groups never see them) and
//! hands the records over in chunks, so the comparison runs while the scan
//! goes on and memory stays bounded by the chunk, not by the window.
//!
//! Of each record only its position, timestamp and the envelope's
//! `event_id` and `event_name` headers are kept: the payload is not decoded
//! (no registry round trip, and a record that cannot be decoded still has a
//! position to report).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use tokio::sync::mpsc;

use super::ReconcileError;
use crate::kafka::client::KafkaSettings;
use crate::kafka::offsets;
use crate::kafka::record::{header, header_text};

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A scan that receives nothing for this long while ranges remain unread fails.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Records handed over at once.
pub const CHUNK: usize = 2_000;

/// The part of one partition a window covers: offsets `start_offset..end_offset`.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionWindow {
    /// Partition.
    pub partition: i32,
    /// First offset read (the first record at or after `since`).
    pub start_offset: i64,
    /// First offset not read (the first record at or after `until`, or
    /// the last stable offset).
    pub end_offset: i64,
}

impl PartitionWindow {
    /// Whether `offset` lies in the window.
    pub fn contains(&self, offset: i64) -> bool {
        (self.start_offset..self.end_offset).contains(&offset)
    }
}

/// One record of the window, as far as reconciliation needs it (and as a
/// missing event is reported).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScannedRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The `event_id` header (None: the record has none).
    pub event_id: Option<String>,
    /// The `event_name` header (None: the record has none).
    pub event_name: Option<String>,
    /// Kafka timestamp (ms since the epoch).
    pub timestamp_ms: i64,
}

impl ScannedRecord {
    fn of(message: &impl Message) -> Self {
        Self {
            partition: message.partition(),
            offset: message.offset(),
            event_id: header_text(message, header::EVENT_ID),
            event_name: header_text(message, header::EVENT_NAME),
            timestamp_ms: message
                .timestamp()
                .to_millis()
                .unwrap_or_else(crate::clock::now_ms),
        }
    }
}

/// A consumer that reads by assignment and never joins or commits for a group.
fn reader(kafka: &KafkaSettings) -> Result<BaseConsumer, KafkaError> {
    crate::kafka::client::assignment_reader(kafka, "orderpipe.reconcile.scan")
}

/// The offset range of each partition of `topic` between `since_ms` and
/// `until_ms` (ms since the epoch).
pub fn plan(
    kafka: &KafkaSettings,
    topic: &str,
    since_ms: i64,
    until_ms: i64,
) -> Result<Vec<PartitionWindow>, ReconcileError> {
    let consumer = reader(kafka)?;
    // read_committed: `high` is the last stable offset.
    let ranges = offsets::partition_ranges(&consumer, topic, REQUEST_TIMEOUT)?
        .ok_or_else(|| ReconcileError::NoTopic(topic.to_string()))?;
    // No record at or after the time: the range starts (or ends) at the log end.
    let since = offsets::first_offsets_at(&consumer, topic, &ranges, since_ms, REQUEST_TIMEOUT)?;
    let until = offsets::first_offsets_at(&consumer, topic, &ranges, until_ms, REQUEST_TIMEOUT)?;
    Ok(ranges
        .iter()
        .zip(since.into_iter().zip(until))
        .map(|(range, (start_offset, end_offset))| PartitionWindow {
            partition: range.partition,
            start_offset,
            end_offset: end_offset.max(start_offset),
        })
        .collect())
}

/// Reads every record of `windows` and sends them to `chunks`, [`CHUNK`] at
/// a time, in offset order within a partition. Stops early (Ok) when the
/// receiver is gone. Blocking: run it on a blocking thread.
pub fn scan(
    kafka: &KafkaSettings,
    topic: &str,
    windows: &[PartitionWindow],
    chunks: &mpsc::Sender<Vec<ScannedRecord>>,
) -> Result<(), ReconcileError> {
    let consumer = reader(kafka)?;
    let mut assignment = TopicPartitionList::new();
    let mut open: BTreeMap<i32, i64> = BTreeMap::new();
    for w in windows.iter().filter(|w| w.end_offset > w.start_offset) {
        assignment.add_partition_offset(topic, w.partition, Offset::Offset(w.start_offset))?;
        open.insert(w.partition, w.end_offset);
    }
    if open.is_empty() {
        return Ok(());
    }
    consumer.assign(&assignment)?;
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut last_progress = Instant::now();
    while !open.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                last_progress = Instant::now();
                let partition = message.partition();
                let Some(&end) = open.get(&partition) else {
                    continue;
                };
                if message.offset() >= end {
                    done(&consumer, topic, &mut open, partition)?;
                    continue;
                }
                chunk.push(ScannedRecord::of(&message));
                if message.offset() + 1 >= end {
                    done(&consumer, topic, &mut open, partition)?;
                }
                if chunk.len() >= CHUNK
                    && chunks
                        .blocking_send(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK)))
                        .is_err()
                {
                    return Ok(());
                }
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                last_progress = Instant::now();
                done(&consumer, topic, &mut open, partition)?;
            }
            Some(Err(e)) => tracing::debug!(error = %e, "reconcile scan"),
            None => {
                if last_progress.elapsed() > STALL_TIMEOUT {
                    return Err(ReconcileError::Stalled {
                        topic: topic.to_string(),
                        partitions: open.keys().copied().collect(),
                        secs: STALL_TIMEOUT.as_secs(),
                    });
                }
            }
        }
    }
    if !chunk.is_empty() {
        let _ = chunks.blocking_send(chunk);
    }
    Ok(())
}

/// Partition `partition` is read: at its end offset, or at its end of log
/// (what lies between is transaction markers or aborted records, never
/// delivered). It is paused so no more of it is fetched.
fn done(
    consumer: &BaseConsumer,
    topic: &str,
    open: &mut BTreeMap<i32, i64>,
    partition: i32,
) -> Result<(), KafkaError> {
    if open.remove(&partition).is_some() {
        let mut paused = TopicPartitionList::new();
        paused.add_partition(topic, partition);
        consumer.pause(&paused)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

    #[test]
    fn a_record_keeps_its_position_time_and_event_headers() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: header::EVENT_ID,
                value: Some("0190a3c2-0000-7000-8000-000000000001"),
            })
            .insert(Header {
                key: header::EVENT_NAME,
                value: Some("order.created"),
            });
        let message = OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::CreateTime(1_234),
            5,
            99,
            Some(headers),
        );
        let r = ScannedRecord::of(&message);
        assert_eq!((r.partition, r.offset, r.timestamp_ms), (5, 99, 1_234));
        assert_eq!(
            r.event_id.as_deref(),
            Some("0190a3c2-0000-7000-8000-000000000001")
        );
        assert_eq!(r.event_name.as_deref(), Some("order.created"));
        let bare = OwnedMessage::new(None, None, "t".into(), Timestamp::CreateTime(1), 0, 0, None);
        assert_eq!(ScannedRecord::of(&bare).event_id, None);
    }

    #[test]
    fn a_window_holds_its_start_not_its_end() {
        let w = PartitionWindow {
            partition: 0,
            start_offset: 10,
            end_offset: 12,
        };
        assert!(!w.contains(9) && w.contains(10) && w.contains(11) && !w.contains(12));
    }
}
