//! The checkpoint of a cdc source: the binlog position after the last
//! transaction it published, a record keyed by the source name on the
//! compacted offsets topic (`cdc.offsets`), written in the same Kafka
//! transaction as the changes it covers.
//!
//! A batch that ends inside a binlog transaction published in pieces
//! checkpoints that transaction's start with `position.inside` (its GTID
//! and how many of its changes are out); checkpoints without it (at a
//! transaction's end, and every one written before it existed) read as
//! before.
//!
//! On start the source reads its last committed checkpoint with a
//! read_committed consumer, after its producer's `init_transactions` has
//! aborted whatever a killed predecessor left open and [`seal`] has
//! decided what a broker crash left undecided: what it reads is exactly
//! what read_committed consumers of the change topics see.

use std::time::Duration;

use mysql_async::Value;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::CdcError;
use super::binlog::BinlogPosition;
use crate::kafka::client::{KafkaSettings, client_config};

/// What the offsets topic holds per source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The source's name (also the record key).
    pub source: String,
    /// Where to resume.
    pub position: BinlogPosition,
    /// When it was written (ISO 8601 UTC).
    pub committed_at: String,
    /// The incremental snapshots under way, as of `position`
    /// ([`super::incremental`]); absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotState>,
}

impl Checkpoint {
    /// A checkpoint of `source` at `position`, stamped now.
    pub fn new(source: &str, position: BinlogPosition) -> Self {
        Self {
            source: source.to_string(),
            position,
            committed_at: crate::envelope::format_utc(&chrono::Utc::now()),
            snapshot: None,
        }
    }

    /// This checkpoint, carrying `snapshot`.
    pub fn with_snapshot(self, snapshot: Option<SnapshotState>) -> Self {
        Self { snapshot, ..self }
    }

    /// The record value (JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint serializes")
    }
}

/// The incremental snapshots of a source ([`super::incremental`]), as its
/// checkpoint keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// The queue: the first is being read.
    #[serde(default)]
    pub tables: Vec<TableProgress>,
    /// Paused by a signal: no chunk is read until resumed.
    #[serde(default)]
    pub paused: bool,
    /// The id of the last signal applied; the next read starts after it.
    #[serde(default)]
    pub last_signal: i64,
}

/// One table's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableProgress {
    /// `db.table`.
    pub table: String,
    /// When it was queued (ISO 8601): part of its records' event ids, so a
    /// second snapshot of a table is not taken for the first one's repeat.
    pub started_at: String,
    /// The primary key of the last row out; `None`: none yet.
    #[serde(default)]
    pub after: Option<Vec<KeyPart>>,
    /// Rows out.
    #[serde(default)]
    pub rows: u64,
    /// Chunks out.
    #[serde(default)]
    pub chunks: u64,
    /// information_schema's estimate of the table's rows when its first
    /// chunk was read (0 before): progress and ETA, not a bound.
    #[serde(default)]
    pub estimate: u64,
}

/// One column of a primary key value, kept in the checkpoint to start the
/// next chunk from: integers as they are, anything else as the bytes the
/// server sent (hex), which it compares back the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
    /// Text, binary, decimal, temporal: the value's bytes as hex.
    Hex(String),
}

impl KeyPart {
    /// The part of a value the binary protocol returned.
    pub fn of(value: &Value) -> Self {
        let text = |t: String| Self::Hex(crate::hex::lower(t.as_bytes()));
        match value {
            Value::Int(i) => Self::Int(*i),
            Value::UInt(u) => Self::Uint(*u),
            Value::Bytes(b) => Self::Hex(crate::hex::lower(b)),
            Value::Float(f) => text(f.to_string()),
            Value::Double(d) => text(d.to_string()),
            Value::Date(y, mo, d, h, mi, s, us) => text(format!(
                "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06}"
            )),
            Value::Time(negative, days, h, mi, s, us) => text(format!(
                "{}{}:{mi:02}:{s:02}.{us:06}",
                if *negative { "-" } else { "" },
                u32::from(*h) + days * 24
            )),
            Value::NULL => Self::Hex(String::new()),
        }
    }

    /// The value to bind.
    pub fn value(&self) -> Value {
        match self {
            Self::Int(i) => Value::Int(*i),
            Self::Uint(u) => Value::UInt(*u),
            Self::Hex(h) => Value::Bytes(crate::hex::decode(h).unwrap_or_default()),
        }
    }
}

/// How long to wait for the offsets topic's metadata and records.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The key of [`seal`]'s records: a source's name and a space, which no
/// source name has, so the checkpoint reader passes them by.
fn seal_key(source: &str) -> String {
    format!("{source} seal")
}

/// Commits one transaction of a small record on each partition of the
/// offsets topic before the checkpoint is read. A single broker that
/// restarts after a crash can complete a transaction yet skip its markers
/// on partitions it does not know the leader of yet ("likely deleted
/// already and hence can be skipped" in its log): the predecessor's last
/// checkpoint is then neither committed nor aborted, a read_committed read
/// stops before it, and the source resumed from the one before and
/// published a batch twice (a CI run, 14 duplicate changes). Kafka decides
/// such records with their producer's next marker on the partition, and
/// the fenced producer keeps the predecessor's producer id: this commit
/// decides them now, as the source's next checkpoint would have later.
pub(super) async fn seal(
    producer: &crate::kafka::client::MeasuredProducer,
    topic: &str,
    source: &str,
) -> Result<(), CdcError> {
    use rdkafka::producer::{FutureRecord, Producer};
    let kafka_error = |e: KafkaError| CdcError::Checkpoint(format!("sealing {topic}: {e}"));
    let partitions = {
        let (p, t) = (producer.clone(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            p.client()
                .fetch_metadata(Some(&t), READ_TIMEOUT)
                .map(|m| m.topics().first().map_or(0, |t| t.partitions().len()))
        })
        .await
        .expect("metadata task does not panic")
        .map_err(kafka_error)?
    };
    let (key, value) = (
        seal_key(source),
        crate::envelope::format_utc(&chrono::Utc::now()),
    );
    producer.begin_transaction().map_err(kafka_error)?;
    let mut deliveries = Vec::with_capacity(partitions);
    for partition in 0..partitions as i32 {
        let record = FutureRecord::to(topic)
            .partition(partition)
            .key(key.as_bytes())
            .payload(value.as_bytes());
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| kafka_error(e))?,
        );
    }
    for delivery in futures::future::join_all(deliveries).await {
        match delivery {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(kafka_error(e)),
            Err(_canceled) => return Err(kafka_error(KafkaError::Canceled)),
        }
    }
    crate::producer::transactional::commit(producer, READ_TIMEOUT)
        .await
        .map_err(kafka_error)
}

/// The last committed checkpoint of `source` on `topic`, or None.
pub async fn last_committed(
    kafka: &KafkaSettings,
    topic: &str,
    source: &str,
) -> Result<Option<Checkpoint>, CdcError> {
    let (kafka, topic, source) = (kafka.clone(), topic.to_string(), source.to_string());
    tokio::task::spawn_blocking(move || read_last(&kafka, &topic, &source))
        .await
        .expect("checkpoint read does not panic")
}

fn read_last(
    kafka: &KafkaSettings,
    topic: &str,
    source: &str,
) -> Result<Option<Checkpoint>, CdcError> {
    let kafka_error = |e: KafkaError| CdcError::Checkpoint(format!("reading {topic}: {e}"));
    let consumer: BaseConsumer = client_config(&kafka.client_options())
        .set("group.id", format!("orderpipe-cdc-checkpoint-{source}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(kafka_error)?;
    // A topic `cdc` has just created may not show in a busy broker's
    // metadata yet (seen while it deleted thousands of partitions): look
    // again until READ_TIMEOUT before calling it missing.
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    let partitions = loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), READ_TIMEOUT)
            .map_err(kafka_error)?;
        let partitions = metadata
            .topics()
            .first()
            .filter(|t| t.error().is_none())
            .map_or(0, |t| t.partitions().len());
        if partitions > 0 {
            break partitions;
        }
        if std::time::Instant::now() >= deadline {
            return Err(CdcError::Checkpoint(format!(
                "the offsets topic {topic} does not exist (not in the broker's metadata for {READ_TIMEOUT:?})"
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut assignment = TopicPartitionList::new();
    // Per partition: the offset to read up to. For read_committed the
    // high watermark is past the last stable offset only while a
    // transaction is open; our own predecessor's was aborted before this.
    let mut ends = Vec::new();
    for partition in 0..partitions as i32 {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, READ_TIMEOUT)
            .map_err(kafka_error)?;
        if high > low {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(kafka_error)?;
            ends.push((partition, high));
        }
    }
    if ends.is_empty() {
        return Ok(None);
    }
    consumer.assign(&assignment).map_err(kafka_error)?;
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    let mut last = None;
    let mut done = vec![false; ends.len()];
    while !done.iter().all(|d| *d) {
        if std::time::Instant::now() > deadline {
            return Err(CdcError::Checkpoint(format!(
                "reading {topic} did not reach its end within {READ_TIMEOUT:?}"
            )));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            // Aborted records and transaction markers are skipped without a
            // message: the position says how far the partition is read.
            for (i, (partition, high)) in ends.iter().enumerate() {
                if let Ok(Offset::Offset(at)) = consumer.position().map(|p| {
                    p.find_partition(topic, *partition)
                        .map_or(Offset::Invalid, |e| e.offset())
                }) {
                    done[i] |= at >= *high;
                }
            }
            continue;
        };
        let message = match message {
            Err(KafkaError::PartitionEOF(partition)) => {
                if let Some(i) = ends.iter().position(|(p, _)| *p == partition) {
                    done[i] = true;
                    warn_if_short(&consumer, topic, ends[i]);
                }
                continue;
            }
            other => other.map_err(kafka_error)?,
        };
        if let Some(value) = message
            .payload()
            .filter(|_| message.key() == Some(source.as_bytes()))
        {
            let checkpoint: Checkpoint = serde_json::from_slice(value).map_err(|e| {
                CdcError::Checkpoint(format!(
                    "{topic} offset {}: not a checkpoint: {e}",
                    message.offset()
                ))
            })?;
            last = Some(checkpoint);
        }
        if let Some(i) = ends.iter().position(|(p, _)| *p == message.partition()) {
            done[i] |= message.offset() + 1 >= ends[i].1;
        }
    }
    Ok(last)
}

/// A read_committed read ends at the last stable offset: short of the
/// high watermark when a transaction there is still open, which after
/// [`seal`] is another producer's (an older `transactional_id_prefix`, a
/// hanging transaction): the checkpoint read may be older than the last.
fn warn_if_short(consumer: &BaseConsumer, topic: &str, (partition, high): (i32, i64)) {
    let at = consumer.position().ok().and_then(|p| {
        p.find_partition(topic, partition)
            .and_then(|e| e.offset().to_raw())
    });
    if let Some(at) = at.filter(|at| *at < high) {
        tracing::warn!(
            topic,
            partition,
            stable_offset = at,
            high_watermark = high,
            "cdc: the offsets topic has a transaction open at the checkpoint read's end that is not this \
             source's; the checkpoint read may be older than the last (kafka-transactions.sh find-hanging)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_json_with_its_position() {
        let position = BinlogPosition {
            file: "mariadb-bin.000002".into(),
            pos: 3127,
            gtid: Some("0-1-18".into()),
            ..BinlogPosition::default()
        };
        let checkpoint = Checkpoint::new("shop", position.clone());
        let back: Checkpoint = serde_json::from_slice(&checkpoint.to_bytes()).unwrap();
        assert_eq!(back, checkpoint);
        let text = String::from_utf8(checkpoint.to_bytes()).unwrap();
        assert!(
            text.contains(r#""file":"mariadb-bin.000002","pos":3127"#),
            "{text}"
        );
    }

    #[test]
    fn a_checkpoint_without_inside_reads_as_before_and_one_inside_a_transaction_round_trips() {
        // As written before a transaction could be published in pieces (docs/cdc.md).
        let old = r#"{"source":"shop","position":{"file":"mariadb-bin.000002","pos":3127,"gtid":"0-1-18","server_id":1,"gtid_state":"0-1-18"},"committed_at":"2026-12-01T09:00:00Z"}"#;
        let old: Checkpoint = serde_json::from_str(old).unwrap();
        assert_eq!(old.position.inside, None);
        assert_eq!(old.position.resume_gtid_state(), Some("0-1-18"));
        // Older still: no server, no GTID position.
        let oldest: Checkpoint = serde_json::from_str(
            r#"{"source":"shop","position":{"file":"b.000001","pos":9,"gtid":null},"committed_at":"x"}"#,
        )
        .unwrap();
        assert_eq!(
            (oldest.position.inside, oldest.position.server_id),
            (None, None)
        );
        // At a transaction's end the record is what it was: no `inside` key.
        let text =
            String::from_utf8(Checkpoint::new("shop", old.position.clone()).to_bytes()).unwrap();
        assert!(!text.contains("inside"), "{text}");
        // Inside transaction 0-1-19 (starting at 3127) after 5000 changes.
        let inside = BinlogPosition {
            inside: Some(super::super::binlog::InsideTransaction {
                gtid: "0-1-19".into(),
                published: 5000,
            }),
            ..old.position.clone()
        };
        let checkpoint = Checkpoint::new("shop", inside.clone());
        let text = String::from_utf8(checkpoint.to_bytes()).unwrap();
        assert!(
            text.contains(r#""inside":{"gtid":"0-1-19","published":5000}"#),
            "{text}"
        );
        let back: Checkpoint = serde_json::from_slice(&checkpoint.to_bytes()).unwrap();
        assert_eq!(back.position, inside);
        assert_eq!(
            inside.to_string(),
            "mariadb-bin.000002:3127 (gtid 0-1-18) inside 0-1-19 after 5000 changes"
        );
    }
}
