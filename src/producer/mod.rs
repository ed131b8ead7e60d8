//! The idempotent, keyed event producer.
//!
//! [`EventProducer`] encodes an [`Envelope`] with the [`Codec`], keys it by
//! `order_id` (so one order's events share a partition and keep their order)
//! and attaches the headers every record carries. [`EventProducer::send_all`]
//! keeps a bounded window of records in flight and waits for every delivery
//! report, so a run ends with an exact count of what the broker acknowledged.
//!
//! [`ProducerSettings`] is the `[producer]` section of the configuration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use futures::stream::FuturesUnordered;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use metrics::counter;
use serde::{Deserialize, Serialize};

use crate::codec::{Codec, CodecError};
use crate::envelope::Envelope;
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

/// Where one record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Size of the record value in bytes.
    pub value_bytes: usize,
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
}

/// Produces envelopes to one topic.
pub struct EventProducer {
    producer: crate::kafka::client::MeasuredProducer,
    codec: Arc<Codec>,
    topic: String,
    servers: String,
}

/// Records in flight at once in [`EventProducer::send_all`].
const SEND_WINDOW: usize = 50_000;

impl EventProducer {
    /// A producer for `topic` with the Kafka connection and the producer's options.
    pub fn new(
        kafka: &crate::kafka::client::KafkaSettings,
        settings: &ProducerSettings,
        codec: Arc<Codec>,
        topic: &str,
    ) -> Result<Self, ProducerError> {
        let options = crate::kafka::client::producer_options(&kafka.client_options(), &settings.options)?;
        let producer = crate::kafka::client::measured_producer(&options)?;
        Ok(Self {
            producer,
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
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(t.partitions().len()),
            _ => Err(ProducerError::MissingTopic(self.topic.clone())),
        }
    }

    /// Encodes and sends one envelope and waits for its acknowledgement.
    pub async fn send(&self, envelope: &Envelope) -> Result<Delivery, ProducerError> {
        let payload = self.codec.encode(envelope).await?;
        let key = envelope.key();
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .payload(&payload)
            .headers(record_headers(envelope));
        // Waits for queue space instead of failing when the local queue is full.
        match self.producer.send(record, rdkafka::util::Timeout::Never).await {
            Ok(d) => Ok(Delivery {
                partition: d.partition,
                offset: d.offset,
                value_bytes: payload.len(),
            }),
            Err((e, _)) => Err(e.into()),
        }
    }

    /// Sends every envelope, keeping up to [`SEND_WINDOW`] in flight, and waits
    /// for all delivery reports. `on_ack` sees each acknowledged record in the
    /// order the acknowledgements arrive.
    pub async fn send_all(
        &self,
        envelopes: impl Stream<Item = Envelope>,
        mut on_ack: impl FnMut(&Envelope, Delivery),
    ) -> SendReport {
        let mut report = SendReport::default();
        let mut in_flight = FuturesUnordered::new();
        let mut settle = |report: &mut SendReport, result: (Envelope, Result<Delivery, ProducerError>)| {
            match result {
                (env, Ok(delivery)) => {
                    report.acknowledged += 1;
                    report.value_bytes += delivery.value_bytes as u64;
                    *report.by_event.entry(env.event_name.to_string()).or_default() += 1;
                    on_ack(&env, delivery);
                }
                (env, Err(e)) => {
                    report.failed += 1;
                    if report.failures.len() < 20 {
                        report.failures.push(format!("event {}: {e}", env.event_id));
                    }
                }
            }
        };
        let mut envelopes = std::pin::pin!(envelopes);
        while let Some(envelope) = envelopes.next().await {
            report.sent += 1;
            in_flight.push(async move {
                let result = self.send(&envelope).await;
                (envelope, result)
            });
            while in_flight.len() >= SEND_WINDOW {
                if let Some(done) = in_flight.next().await {
                    settle(&mut report, done);
                }
            }
            // Drain finished sends without waiting, so memory stays bounded
            // by the window rather than by the input.
            while let Some(Some(done)) = futures::FutureExt::now_or_never(in_flight.next()) {
                settle(&mut report, done);
            }
        }
        while let Some(done) = in_flight.next().await {
            settle(&mut report, done);
        }
        report
    }

    /// Waits until everything queued is delivered or `timeout` passes.
    pub fn flush(&self, timeout: Duration) -> Result<(), ProducerError> {
        self.producer.flush(timeout).map_err(ProducerError::from)
    }
}

/// The headers every record carries.
pub fn record_headers(envelope: &Envelope) -> OwnedHeaders {
    let event_id = envelope.event_id.to_string();
    let traceparent = envelope.traceparent();
    let pairs: [(&str, &str); 7] = [
        (header::EVENT_ID, &event_id),
        (header::EVENT_NAME, envelope.event_name.as_str()),
        (header::EVENT_VERSION, &envelope.event_version),
        (header::TRACE_ID, &envelope.trace_id),
        (header::TRACEPARENT, &traceparent),
        (header::PRODUCER, &envelope.producer),
        (header::CONTENT_TYPE, header::AVRO_CONFLUENT),
    ];
    pairs.iter().fold(OwnedHeaders::new_with_capacity(pairs.len()), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(value.as_bytes()),
        })
    })
}

/// Records were produced and acknowledged.
pub fn produced(topic: &str, event_name: &str, n: u64) {
    counter!(name::PRODUCED, "topic" => topic.to_string(), "event_name" => event_name.to_string()).increment(n);
}

/// A record could not be produced.
pub fn producer_error(topic: &str) {
    counter!(name::PRODUCER_ERRORS, "topic" => topic.to_string()).increment(1);
}
