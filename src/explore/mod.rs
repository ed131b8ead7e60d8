//! Looking into topics as an operator does (the console's topic explorer):
//! the records of one partition from an offset or a time, the records of
//! one order (its key hashed to its partition with the producers'
//! partitioner), each decoded through the registry or shown for what it is.
//! Read-only: a reader that never joins a group and never commits.
//!
//! * [`partition`]: key -> partition with the partitioner the producers use.
//! * [`decode`]: a value -> envelope, row change, other Avro, or undecodable (and why).
//! * [`registry`]: the registry's subjects, versions, compatibility levels, and the diff of two versions.
//! * [`search`]: the records of a whole topic matching a key, an event id, a
//!   time range and a predicate, over a bounded scan with progress and cancel.
//!
//! Records are read `read_committed`, as the consumer groups read them:
//! records of aborted or open transactions are not shown, and the end of a
//! partition is its last stable offset.

pub mod decode;
pub mod partition;
pub mod registry;
pub mod search;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::codec::{CodecError, RegistrySettings};
use crate::kafka::client::{KafkaSettings, OptionConflict};
use crate::kafka::offsets;
pub use crate::kafka::offsets::PartitionRange;
use crate::producer::ProducerSettings;
pub use decode::{Decoded, Decoder};
pub use partition::Partitioner;

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one read may take in all.
const READ_DEADLINE: Duration = Duration::from_secs(15);

/// Most records shown at once.
pub const MAX_LIMIT: usize = 200;

/// Most records one search by key reads before it stops and says where to go on.
pub const SCAN_LIMIT: u64 = 100_000;

/// Why the explorer could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ExploreError {
    /// An input that cannot be used; names the field and what is accepted.
    #[error("{field}: {reason}")]
    Invalid {
        /// The form field.
        field: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The topic does not exist.
    #[error("topic: `{0}` does not exist on the broker")]
    NoTopic(String),
    /// A broker request failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The producer options name no usable partitioner.
    #[error(transparent)]
    Partitioner(#[from] OptionConflict),
    /// The registry client could not be built.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The blocking task died.
    #[error("explorer task failed: {0}")]
    Task(String),
}

impl ExploreError {
    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// A topic and its partitions.
#[derive(Debug, Clone, Serialize)]
pub struct TopicSummary {
    /// Name.
    pub name: String,
    /// Its partitions, in order.
    pub partitions: Vec<PartitionRange>,
}

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// The log start.
    Beginning,
    /// The last `limit` records before the end.
    Tail,
    /// This offset (clamped to the partition's range).
    Offset(i64),
    /// The first record at or after this time (ms since the epoch); the end if none.
    Time(i64),
}

impl Start {
    /// Parses the form's `from` (`beginning`, `tail`), `offset` and `time`
    /// (RFC 3339) fields: an offset or a time wins over `from`; both is an error.
    pub fn parse(
        from: Option<&str>,
        offset: Option<&str>,
        time: Option<&str>,
    ) -> Result<Self, ExploreError> {
        fn blank(s: Option<&str>) -> Option<&str> {
            s.map(str::trim).filter(|s| !s.is_empty())
        }
        match (blank(offset), blank(time)) {
            (Some(_), Some(_)) => Err(ExploreError::invalid(
                "offset",
                "give an offset or a time, not both",
            )),
            (Some(o), None) => match o.parse::<i64>() {
                Ok(o) if o >= 0 => Ok(Self::Offset(o)),
                _ => Err(ExploreError::invalid(
                    "offset",
                    format!("`{o}` is not an offset (a whole number >= 0)"),
                )),
            },
            (None, Some(t)) => DateTime::parse_from_rfc3339(t)
                .map(|t| Self::Time(t.with_timezone(&Utc).timestamp_millis()))
                .map_err(|_| {
                    ExploreError::invalid(
                        "time",
                        format!("`{t}` is not an RFC 3339 time (e.g. 2026-12-01T08:30:00Z)"),
                    )
                }),
            (None, None) => match blank(from).unwrap_or("tail") {
                "beginning" => Ok(Self::Beginning),
                "tail" => Ok(Self::Tail),
                other => Err(ExploreError::invalid(
                    "from",
                    format!("`{other}` is not one of beginning, tail"),
                )),
            },
        }
    }
}

/// The number of records to show: 1..=[`MAX_LIMIT`], 50 when blank.
pub fn parse_limit(text: Option<&str>) -> Result<usize, ExploreError> {
    match text.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(50),
        Some(t) => match t.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ExploreError::invalid(
                "limit",
                format!("`{t}` is not a number from 1 to {MAX_LIMIT}"),
            )),
        },
    }
}

/// One record as read, undecoded.
#[derive(Debug, Clone, Serialize)]
pub struct RawRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Kafka timestamp (ms since the epoch), when the record has one.
    pub timestamp_ms: Option<i64>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Headers in order; a value is None for a null header.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
}

impl RawRecord {
    /// A copy of `message`.
    pub fn of(message: &impl Message) -> Self {
        Self {
            partition: message.partition(),
            offset: message.offset(),
            timestamp_ms: message.timestamp().to_millis(),
            key: message.key().map(<[u8]>::to_vec),
            headers: message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
            value: message.payload().map(<[u8]>::to_vec),
        }
    }
}

/// What one read found.
#[derive(Debug, Clone, Serialize)]
pub struct Page<R> {
    /// Topic.
    pub topic: String,
    /// The partition read.
    pub partition: i32,
    /// Its offsets when the read started.
    pub range: PartitionRange,
    /// The offset reading started at.
    pub start_offset: i64,
    /// Where to go on from (the offset after the last record read).
    pub next_offset: i64,
    /// Records read, matching or not (a key search reads more than it shows).
    pub scanned: u64,
    /// Whether the read reached the end of the partition.
    pub reached_end: bool,
    /// The records (matching the key, for a key search).
    pub records: Vec<R>,
}

/// A reader of one partition that never joins a group or commits.
pub(crate) fn reader(kafka: &KafkaSettings) -> Result<BaseConsumer, KafkaError> {
    crate::kafka::client::assignment_reader(kafka, "orderpipe.console.explore")
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<i32, ExploreError> {
    offsets::partition_count(consumer, topic, REQUEST_TIMEOUT)?
        .ok_or_else(|| ExploreError::NoTopic(topic.to_string()))
}

/// A topic's name and partition count.
#[derive(Debug, Clone, Serialize)]
pub struct TopicName {
    /// Name.
    pub name: String,
    /// Partitions.
    pub partitions: usize,
}

/// Every topic of the broker (internal `__*` ones left out), by name, with
/// its partition count: one metadata request, however many topics. Blocking.
pub fn topics(kafka: &KafkaSettings) -> Result<Vec<TopicName>, ExploreError> {
    let consumer = reader(kafka)?;
    let metadata = consumer.fetch_metadata(None, REQUEST_TIMEOUT)?;
    let mut out: Vec<TopicName> = metadata
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__") && t.error().is_none())
        .map(|t| TopicName {
            name: t.name().to_string(),
            partitions: t.partitions().len(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One topic with each partition's offsets. Blocking.
pub fn describe(kafka: &KafkaSettings, topic: &str) -> Result<TopicSummary, ExploreError> {
    let consumer = reader(kafka)?;
    let partitions = offsets::partition_ranges(&consumer, topic, REQUEST_TIMEOUT)?
        .ok_or_else(|| ExploreError::NoTopic(topic.to_string()))?;
    Ok(TopicSummary {
        name: topic.to_string(),
        partitions,
    })
}

/// Reads up to `limit` records of `topic`'s `partition` from `start`; with
/// `key`, only records with that key are kept, reading at most
/// [`SCAN_LIMIT`] records. Blocking.
pub fn read(
    kafka: &KafkaSettings,
    topic: &str,
    partition: i32,
    start: Start,
    limit: usize,
    key: Option<&[u8]>,
) -> Result<Page<RawRecord>, ExploreError> {
    let consumer = reader(kafka)?;
    let count = partition_count(&consumer, topic)?;
    if !(0..count).contains(&partition) {
        return Err(ExploreError::invalid(
            "partition",
            format!(
                "{partition} is not a partition of {topic} (0 to {})",
                count - 1
            ),
        ));
    }
    let range = PartitionRange::fetch(&consumer, topic, partition, REQUEST_TIMEOUT)?;
    let (low, high) = (range.low, range.high);
    let start_offset = match start {
        Start::Beginning => low,
        Start::Tail => (high - limit as i64).max(low),
        Start::Offset(o) => o.clamp(low, high),
        // No record at or after the time: the end (an empty page).
        Start::Time(ms) => {
            offsets::first_offsets_at(&consumer, topic, &[range], ms, REQUEST_TIMEOUT)?[0]
        }
    };
    let mut page = Page {
        topic: topic.to_string(),
        partition,
        range,
        start_offset,
        next_offset: start_offset,
        scanned: 0,
        reached_end: start_offset >= high,
        records: Vec::new(),
    };
    if page.reached_end {
        return Ok(page);
    }
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, partition, Offset::Offset(start_offset))?;
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + READ_DEADLINE;
    while page.records.len() < limit && Instant::now() < deadline {
        if key.is_some() && page.scanned >= SCAN_LIMIT {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                page.scanned += 1;
                page.next_offset = message.offset() + 1;
                if key.is_none_or(|k| message.key() == Some(k)) {
                    page.records.push(RawRecord::of(&message));
                }
                if page.next_offset >= high {
                    page.reached_end = true;
                    break;
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // Only transaction markers or aborted records up to the end.
                page.next_offset = page.next_offset.max(high);
                page.reached_end = true;
                break;
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(page)
}

/// One record as the explorer shows it: position, key, headers as text, and the decoded value.
#[derive(Debug, Clone, Serialize)]
pub struct RecordView {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Kafka timestamp as ISO 8601 UTC, when the record has one.
    pub time: Option<String>,
    /// The key as text (bytes that are not UTF-8 as `0x` hex).
    pub key: Option<String>,
    /// Headers as text (same rule), in order.
    pub headers: Vec<(String, String)>,
    /// Value size in bytes.
    pub value_bytes: usize,
    /// The first bytes of the value in hex, for values that do not decode.
    pub value_hex: String,
    /// What the value is.
    pub decoded: Decoded,
}

/// Bytes as text: UTF-8 as is, anything else as `0x` hex.
pub fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => crate::hex::prefixed(bytes),
    }
}

/// Bytes of a value shown in hex when it does not decode.
const HEX_PREVIEW: usize = 64;

/// An order's search: where its key goes and what was found there.
#[derive(Debug, Clone, Serialize)]
pub struct OrderSearch {
    /// The order id, as the key.
    pub order_id: String,
    /// The partitioner used (the producers').
    pub partitioner: Partitioner,
    /// The records of the order found.
    pub page: Page<RecordView>,
}

/// The topic explorer: Kafka, the registry, and the producers' partitioner.
pub struct Explorer {
    kafka: KafkaSettings,
    decoder: Decoder,
    partitioner: Partitioner,
}

impl Explorer {
    /// An explorer of `kafka`'s topics, decoding through `registry`, placing
    /// keys with the partitioner of `producer`'s effective options.
    pub fn new(
        kafka: &KafkaSettings,
        producer: &ProducerSettings,
        registry: &RegistrySettings,
    ) -> Result<Self, ExploreError> {
        Ok(Self {
            kafka: kafka.clone(),
            decoder: Decoder::new(registry)?,
            partitioner: Partitioner::of_producer(kafka, producer)?,
        })
    }

    /// The partitioner keys are placed with.
    pub fn partitioner(&self) -> &Partitioner {
        &self.partitioner
    }

    /// Every topic with its partition count.
    pub async fn topics(&self) -> Result<Vec<TopicName>, ExploreError> {
        let kafka = self.kafka.clone();
        blocking(move || topics(&kafka)).await
    }

    /// One topic with its partitions' offsets.
    pub async fn describe(&self, topic: &str) -> Result<TopicSummary, ExploreError> {
        let (kafka, topic) = (self.kafka.clone(), topic.to_string());
        blocking(move || describe(&kafka, &topic)).await
    }

    /// Up to `limit` records of a partition from `start`, decoded.
    pub async fn read(
        &self,
        topic: &str,
        partition: i32,
        start: Start,
        limit: usize,
    ) -> Result<Page<RecordView>, ExploreError> {
        let (kafka, topic) = (self.kafka.clone(), topic.to_string());
        let page = blocking(move || read(&kafka, &topic, partition, start, limit, None)).await?;
        Ok(self.view(page).await)
    }

    /// The records of order `order_id` (its key) in `topic`: its partition
    /// by the producers' partitioner, read from `start`, decoded.
    pub async fn find_order(
        &self,
        topic: &str,
        order_id: &str,
        start: Start,
        limit: usize,
    ) -> Result<OrderSearch, ExploreError> {
        let order_id = order_id.trim();
        if order_id.is_empty()
            || !order_id.bytes().all(|b| b.is_ascii_digit())
            || order_id.len() > 19
        {
            return Err(ExploreError::invalid(
                "order_id",
                format!("`{order_id}` is not an order id (a whole number, the records' key)"),
            ));
        }
        let kafka = self.kafka.clone();
        let (name, partitioner) = (topic.to_string(), self.partitioner.clone());
        let key = order_id.to_string();
        let page = blocking(move || {
            let count = partition_count(&reader(&kafka)?, &name)?;
            let partition = partitioner.partition(key.as_bytes(), count).ok_or_else(|| {
                ExploreError::invalid(
                    "order_id",
                    format!("the producers' partitioner `{}` places records at random: an order has no one partition", partitioner.name),
                )
            })?;
            read(&kafka, &name, partition, start, limit, Some(key.as_bytes()))
        })
        .await?;
        Ok(OrderSearch {
            order_id: order_id.to_string(),
            partitioner: self.partitioner.clone(),
            page: self.view(page).await,
        })
    }

    /// Decodes each record of `page`.
    pub async fn view(&self, page: Page<RawRecord>) -> Page<RecordView> {
        Page {
            records: self.views(&page.records).await,
            topic: page.topic,
            partition: page.partition,
            range: page.range,
            start_offset: page.start_offset,
            next_offset: page.next_offset,
            scanned: page.scanned,
            reached_end: page.reached_end,
        }
    }

    /// Runs a [`search::SearchSpec`] over its topic, reporting to `progress`.
    pub async fn search(
        &self,
        spec: &search::SearchSpec,
        progress: &std::sync::Arc<search::Progress>,
    ) -> Result<search::SearchOutcome, ExploreError> {
        search::search(&self.kafka, &self.decoder, spec, progress).await
    }

    /// Decodes each of `records`.
    pub async fn views(&self, raw: &[RawRecord]) -> Vec<RecordView> {
        let mut records = Vec::with_capacity(raw.len());
        // Once the registry does not answer, the rest is not sent to it: a
        // hung registry would cost its timeout per record.
        let mut registry_down: Option<String> = None;
        for r in raw {
            let decoded = match &registry_down {
                Some(why) => decode::registry_unavailable(r.value.as_deref(), why),
                None => self.decoder.decode(r.value.as_deref()).await,
            };
            if let Decoded::Undecodable {
                class: "registry_unavailable",
                reason,
                ..
            } = &decoded
            {
                registry_down.get_or_insert_with(|| {
                    format!(
                        "not asked: the registry did not answer for offset {} ({reason})",
                        r.offset
                    )
                });
            }
            let value = r.value.as_deref().unwrap_or_default();
            records.push(RecordView {
                partition: r.partition,
                offset: r.offset,
                time: r
                    .timestamp_ms
                    .and_then(DateTime::from_timestamp_millis)
                    .map(|t| crate::envelope::format_utc(&t)),
                key: r.key.as_deref().map(bytes_text),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_deref()
                                .map(bytes_text)
                                .unwrap_or_else(|| "(null)".into()),
                        )
                    })
                    .collect(),
                value_bytes: value.len(),
                value_hex: if decoded.is_undecodable() {
                    crate::hex::prefixed(&value[..value.len().min(HEX_PREVIEW)])
                } else {
                    String::new()
                },
                decoded,
            });
        }
        records
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ExploreError> + Send + 'static,
) -> Result<T, ExploreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ExploreError::Task(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_is_an_offset_a_time_or_a_word_and_bad_ones_name_the_field() {
        assert_eq!(Start::parse(None, None, None).unwrap(), Start::Tail);
        assert_eq!(
            Start::parse(Some("beginning"), Some(" "), Some("")).unwrap(),
            Start::Beginning
        );
        assert_eq!(
            Start::parse(Some("tail"), Some("17"), None).unwrap(),
            Start::Offset(17)
        );
        assert_eq!(
            Start::parse(None, None, Some("2026-12-01T08:30:00Z")).unwrap(),
            Start::Time(1_796_113_800_000)
        );
        let e = |r: Result<Start, ExploreError>| r.unwrap_err().to_string();
        assert!(
            e(Start::parse(None, Some("-1"), None)).starts_with("offset: `-1` is not an offset")
        );
        assert!(
            e(Start::parse(None, Some("1"), Some("2026-12-01T08:30:00Z")))
                .starts_with("offset: give an offset or a time")
        );
        assert!(
            e(Start::parse(None, None, Some("yesterday")))
                .starts_with("time: `yesterday` is not an RFC 3339 time")
        );
        assert!(e(Start::parse(Some("end"), None, None)).contains("one of beginning, tail"));
        assert_eq!(parse_limit(None).unwrap(), 50);
        assert_eq!(parse_limit(Some("200")).unwrap(), 200);
        assert!(
            parse_limit(Some("0"))
                .unwrap_err()
                .to_string()
                .starts_with("limit: `0` is not a number from 1 to 200")
        );
    }

    #[test]
    fn bytes_show_as_text_or_hex() {
        assert_eq!(bytes_text(b"42"), "42");
        assert_eq!(bytes_text(&[0xff, 0x00]), "0xff00");
    }
}
