//! The idempotent, keyed event producer.
//!
//! [`EventProducer`] encodes an [`Envelope`] with the [`Codec`], keys it by
//! `order_id` (so one order's events share a partition and keep their order)
//! and attaches the headers every record carries ([`record_headers`]).
//! [`EventProducer::send_all`] keeps a bounded window of records in flight
//! and waits for every delivery report, so a run ends with an exact count
//! of what the broker acknowledged.
//!
//! The hot path does no per-record future or channel: records are handed
//! to librdkafka as they are encoded (one reused buffer, the codec's fast
//! path), and delivery reports are counted by the producer's own callback
//! ([`AckContext`]) on librdkafka's polling thread; the sender only reads
//! counters to keep the window bounded.
//!
//! [`ProducerSettings`] is the `[producer]` section of the configuration.

pub mod transactional;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use metrics::counter;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use serde::{Deserialize, Serialize};

use crate::codec::fast::StackStr;
use crate::codec::{Codec, CodecError};
use crate::envelope::Envelope;
use crate::envelope::data::KNOWN_EVENTS;
use crate::kafka::record::header;
use crate::metrics::name;

/// The `[producer]` section of the configuration: producer tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerSettings {
    /// librdkafka producer options layered over the safe defaults; checked for conflicts.
    pub options: BTreeMap<String, String>,
    /// Name written into `producer` of envelopes this process creates.
    pub service_name: String,
    /// Prefix of the relay's per-shard `transactional.id`s (`<prefix>-shard-<n>`).
    pub transactional_id_prefix: String,
}

/// Why a record was not produced.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The producer options are inconsistent.
    #[error(transparent)]
    Options(#[from] crate::kafka::client::OptionConflict),
    /// librdkafka refused the configuration or the send.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Kafka could not be reached in time.
    #[error("cannot reach Kafka at {servers} within {seconds}s: {cause}")]
    Unreachable {
        /// bootstrap.servers.
        servers: String,
        /// How long we waited.
        seconds: u64,
        /// librdkafka's error.
        cause: String,
    },
    /// The topic does not exist.
    #[error("topic {0} does not exist; run `orderpipe topics ensure` first")]
    MissingTopic(String),
    /// The envelope could not be encoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Counts of a [`EventProducer::send_all`] run.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SendReport {
    /// Records handed to the producer.
    pub sent: u64,
    /// Records the broker acknowledged.
    pub acknowledged: u64,
    /// Records that failed (encode or delivery), with a sample of reasons.
    pub failed: u64,
    /// Up to 20 failure reasons.
    pub failures: Vec<String>,
    /// Acknowledged records per event name.
    pub by_event: BTreeMap<String, u64>,
    /// Bytes of acknowledged record values (Confluent-framed Avro).
    pub value_bytes: u64,
    /// Bytes of acknowledged record keys and headers (as Kafka counts
    /// them: names and values), for comparisons at equal record size.
    pub key_header_bytes: u64,
}

/// Failure reasons kept in a [`SendReport`].
const MAX_FAILURES: usize = 20;

/// What the delivery callback has counted since the producer was created.
#[derive(Debug, Default)]
struct Acks {
    acknowledged: AtomicU64,
    failed: AtomicU64,
    value_bytes: AtomicU64,
    key_header_bytes: AtomicU64,
    by_kind: [AtomicU64; KNOWN_EVENTS.len()],
    failures: Mutex<Vec<String>>,
}

impl Acks {
    /// Records with a delivery report (acknowledged or failed).
    fn settled(&self) -> u64 {
        self.acknowledged.load(Ordering::Acquire) + self.failed.load(Ordering::Acquire)
    }

    fn fail(&self, reason: String) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() < MAX_FAILURES {
            failures.push(reason);
        }
        drop(failures);
        self.failed.fetch_add(1, Ordering::AcqRel);
    }
}

/// The producer's librdkafka context: statistics become metrics (as
/// [`crate::kafka::client::StatsContext`]), and each delivery report is
/// counted into [`Acks`]. The opaque of a record is a [`RecordTag`].
pub struct AckContext {
    acks: Arc<Acks>,
}

impl rdkafka::ClientContext for AckContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        crate::kafka::client::kafka_statistics(&statistics);
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: usize) {
        let (kind, key_header_bytes) = RecordTag::unpack(tag);
        match result {
            Ok(message) => {
                let acks = &self.acks;
                acks.value_bytes
                    .fetch_add(message.payload_len() as u64, Ordering::Relaxed);
                acks.key_header_bytes
                    .fetch_add(key_header_bytes as u64, Ordering::Relaxed);
                if let Some(n) = acks.by_kind.get(kind) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                acks.acknowledged.fetch_add(1, Ordering::AcqRel);
            }
            Err((error, message)) => {
                let event = message
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == header::EVENT_ID))
                    .and_then(|h| h.value)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                self.acks.fail(format!("event {event}: {error}"));
            }
        }
    }
}

/// What the delivery callback needs to know of a record, packed into its
/// opaque (a `usize`, so no allocation per record): the event's index in
/// [`KNOWN_EVENTS`] in the low byte, the record's key and header bytes
/// (names and values) above it.
struct RecordTag;

impl RecordTag {
    fn pack(kind: usize, key_header_bytes: usize) -> usize {
        (key_header_bytes << 8) | kind.min(0xff)
    }

    fn unpack(tag: usize) -> (usize, usize) {
        (tag & 0xff, tag >> 8)
    }
}

/// Produces envelopes to one topic.
pub struct EventProducer {
    producer: Arc<ThreadedProducer<AckContext>>,
    acks: Arc<Acks>,
    codec: Arc<Codec>,
    topic: String,
    servers: String,
}

/// Records in flight at once in [`EventProducer::send_all`]: enough for
/// several linger windows of every partition at full speed (~0.1 s at
/// 200k records/s), few enough that their copies in librdkafka stay
/// within a few tens of MB.
pub const SEND_WINDOW: u64 = 20_000;

/// How often (records) [`EventProducer::send_all`] reports progress.
const PROGRESS_EVERY: u64 = 4_096;

impl EventProducer {
    /// A producer for `topic` with the Kafka connection and the producer's options.
    pub fn new(
        kafka: &crate::kafka::client::KafkaSettings,
        settings: &ProducerSettings,
        codec: Arc<Codec>,
        topic: &str,
    ) -> Result<Self, ProducerError> {
        let options =
            crate::kafka::client::producer_options(&kafka.client_options(), &settings.options)?;
        let mut config = crate::kafka::client::client_config(&options);
        // As every measured producer: librdkafka statistics every 5 s.
        config.set("statistics.interval.ms", "5000");
        let acks = Arc::new(Acks::default());
        let producer = Arc::new(config.create_with_context(AckContext { acks: acks.clone() })?);
        Ok(Self {
            producer,
            acks,
            codec,
            topic: topic.to_string(),
            servers: kafka.bootstrap_servers.clone(),
        })
    }

    /// Checks within `timeout` that the broker answers and the topic exists;
    /// returns its partition count.
    pub async fn check_ready(&self, timeout: Duration) -> Result<usize, ProducerError> {
        let producer = self.producer.clone();
        let topic = self.topic.clone();
        let metadata = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(Some(&topic), timeout)
        })
        .await
        .expect("metadata task does not panic")
        .map_err(|e| ProducerError::Unreachable {
            servers: self.servers.clone(),
            seconds: timeout.as_secs(),
            cause: e.to_string(),
        })?;
        let topic = metadata.topics().iter().find(|t| t.name() == self.topic);
        match topic {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                Ok(t.partitions().len())
            }
            _ => Err(ProducerError::MissingTopic(self.topic.clone())),
        }
    }

    /// Hands one encoded record to librdkafka, waiting (not failing) while
    /// its local queue is full.
    async fn enqueue(
        &self,
        envelope: &Envelope,
        value: &[u8],
        key: &str,
    ) -> Result<(), KafkaError> {
        let kind = envelope.data.kind_index();
        let (headers, header_bytes) = sized_record_headers(envelope);
        let mut record = BaseRecord::with_opaque_to(
            &self.topic,
            RecordTag::pack(kind, key.len() + header_bytes),
        )
        .key(key)
        .payload(value)
        .headers(headers);
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Sends every envelope, keeping up to [`SEND_WINDOW`] in flight, and
    /// waits for all delivery reports. `progress` is called now and then
    /// with the number of records acknowledged so far in this run. One run
    /// at a time per producer (the counts are the producer's).
    pub async fn send_all(
        &self,
        envelopes: impl Stream<Item = Envelope>,
        mut progress: impl FnMut(u64),
    ) -> SendReport {
        let acks = &self.acks;
        let before = Snapshot::of(acks);
        let mut report = SendReport::default();
        // Failures before librdkafka took the record (encode, enqueue).
        let mut refused = 0u64;
        let mut local_failures = Vec::new();
        let warm = self.codec.warm_up().await.err();
        let (mut value, mut key) = (Vec::with_capacity(512), String::with_capacity(24));
        let mut envelopes = std::pin::pin!(envelopes);
        while let Some(envelope) = envelopes.next().await {
            report.sent += 1;
            key.clear();
            let _ = write!(key, "{}", envelope.data.order_id());
            let result = match &warm {
                Some(e) => Err(ProducerError::Codec(e.clone())),
                None => match self.codec.encode_into(&envelope, &mut value) {
                    Ok(()) => self
                        .enqueue(&envelope, &value, &key)
                        .await
                        .map_err(ProducerError::from),
                    Err(e) => Err(e.into()),
                },
            };
            if let Err(e) = result {
                refused += 1;
                if local_failures.len() < MAX_FAILURES {
                    local_failures.push(format!("event {}: {e}", envelope.event_id));
                }
            }
            // Bounded memory: wait while the window is full.
            while report.sent - refused - (acks.settled() - before.settled) >= SEND_WINDOW {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if report.sent.is_multiple_of(PROGRESS_EVERY) {
                progress(acks.acknowledged.load(Ordering::Relaxed) - before.acknowledged);
            }
        }
        // Every record gets a report within message.timeout.ms.
        while report.sent - refused > acks.settled() - before.settled {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let after = Snapshot::of(acks);
        report.acknowledged = after.acknowledged - before.acknowledged;
        report.failed = refused + (after.failed - before.failed);
        report.value_bytes = after.value_bytes - before.value_bytes;
        report.key_header_bytes = after.key_header_bytes - before.key_header_bytes;
        for (i, (name, _)) in KNOWN_EVENTS.iter().enumerate() {
            let n = after.by_kind[i] - before.by_kind[i];
            if n > 0 {
                report.by_event.insert(name.to_string(), n);
            }
        }
        report.failures = local_failures;
        let delivery_failures =
            std::mem::take(&mut *acks.failures.lock().unwrap_or_else(|p| p.into_inner()));
        report.failures.extend(delivery_failures);
        report.failures.truncate(MAX_FAILURES);
        progress(report.acknowledged);
        report
    }

    /// Waits until everything queued is delivered or `timeout` passes.
    pub fn flush(&self, timeout: Duration) -> Result<(), ProducerError> {
        self.producer.flush(timeout).map_err(ProducerError::from)
    }
}

/// [`Acks`] at one moment.
struct Snapshot {
    acknowledged: u64,
    failed: u64,
    value_bytes: u64,
    key_header_bytes: u64,
    by_kind: [u64; KNOWN_EVENTS.len()],
    settled: u64,
}

impl Snapshot {
    fn of(acks: &Acks) -> Self {
        // `failed` and `acknowledged` last: they are bumped last.
        let value_bytes = acks.value_bytes.load(Ordering::Acquire);
        let key_header_bytes = acks.key_header_bytes.load(Ordering::Acquire);
        let by_kind = std::array::from_fn(|i| acks.by_kind[i].load(Ordering::Acquire));
        let (acknowledged, failed) = (
            acks.acknowledged.load(Ordering::Acquire),
            acks.failed.load(Ordering::Acquire),
        );
        Self {
            acknowledged,
            failed,
            value_bytes,
            key_header_bytes,
            by_kind,
            settled: acknowledged + failed,
        }
    }
}

/// The headers every record carries (docs/architecture.md, "Record
/// headers"): `event_id`, `event_name`, `trace_id`, `traceparent` and
/// `content-type`. Built without heap allocations on the Rust side.
pub fn record_headers(envelope: &Envelope) -> OwnedHeaders {
    sized_record_headers(envelope).0
}

/// [`record_headers`] and their size in bytes (names and values).
fn sized_record_headers(envelope: &Envelope) -> (OwnedHeaders, usize) {
    let mut id = uuid::Uuid::encode_buffer();
    let event_id: &str = envelope.event_id.hyphenated().encode_lower(&mut id);
    let traceparent = Traceparent::of(envelope);
    let pairs: [(&str, &str); 5] = [
        (header::EVENT_ID, event_id),
        (header::EVENT_NAME, envelope.event_name.as_str()),
        (header::TRACE_ID, &envelope.trace_id),
        (header::TRACEPARENT, traceparent.as_str()),
        (header::CONTENT_TYPE, header::AVRO_CONFLUENT),
    ];
    let size = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    (crate::kafka::record::owned_headers(pairs.into_iter()), size)
}

/// [`Envelope::traceparent`] on the stack when the trace id has its W3C
/// length (always, for a valid envelope).
enum Traceparent {
    Stack(StackStr<64>),
    Heap(String),
}

impl Traceparent {
    fn of(envelope: &Envelope) -> Self {
        let mut simple = uuid::Uuid::encode_buffer();
        let span = &envelope.event_id.simple().encode_lower(&mut simple)[..16];
        let mut s = StackStr::<64>::default();
        match write!(s, "00-{}-{span}-01", envelope.trace_id) {
            Ok(()) => Self::Stack(s),
            Err(_) => Self::Heap(envelope.traceparent()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Self::Stack(s) => s.as_str(),
            Self::Heap(s) => s,
        }
    }
}

/// Records were produced and acknowledged.
pub fn produced(topic: &str, event_name: &str, n: u64) {
    counter!(name::PRODUCED, "topic" => topic.to_string(), "event_name" => event_name.to_string())
        .increment(n);
}

/// A record could not be produced.
pub fn producer_error(topic: &str) {
    counter!(name::PRODUCER_ERRORS, "topic" => topic.to_string()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::EventData;

    fn text(headers: &OwnedHeaders, key: &str) -> Option<String> {
        headers
            .iter()
            .find(|h| h.key == key)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn headers_are_the_documented_five_with_the_envelopes_values() {
        let envelope = Envelope::new("checkout", EventData::sample_created(9));
        let headers = record_headers(&envelope);
        let keys: Vec<&str> = headers.iter().map(|h| h.key).collect();
        assert_eq!(
            keys,
            [
                "event_id",
                "event_name",
                "trace_id",
                "traceparent",
                "content-type"
            ]
        );
        assert_eq!(
            text(&headers, "event_id"),
            Some(envelope.event_id.to_string())
        );
        assert_eq!(
            text(&headers, "event_name").as_deref(),
            Some("order.created")
        );
        assert_eq!(text(&headers, "trace_id"), Some(envelope.trace_id.clone()));
        assert_eq!(text(&headers, "traceparent"), Some(envelope.traceparent()));
        assert_eq!(
            text(&headers, "content-type").as_deref(),
            Some("application/vnd.confluent.avro")
        );
        let counted: usize = headers
            .iter()
            .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
            .sum();
        assert_eq!(sized_record_headers(&envelope).1, counted);
    }

    #[test]
    fn a_record_tag_carries_the_event_and_its_key_and_header_bytes() {
        assert_eq!(RecordTag::unpack(RecordTag::pack(6, 230)), (6, 230));
        assert_eq!(
            RecordTag::unpack(RecordTag::pack(usize::MAX, 1 << 20)),
            (0xff, 1 << 20)
        );
    }

    #[test]
    fn an_overlong_trace_id_still_gets_the_envelopes_traceparent() {
        let mut envelope = Envelope::new("checkout", EventData::sample_created(9));
        envelope.trace_id = "f".repeat(80);
        assert_eq!(
            text(&record_headers(&envelope), "traceparent"),
            Some(envelope.traceparent())
        );
    }
}
