//! The record limits of the topics the outbox writes, per topic, for the
//! relay (before a row's Kafka transaction) and the order API (before a
//! request writes anything).
//!
//! A topic's limit is [`RecordLimit::new`] over the producer's options and
//! the topic's `max.message.bytes` as the broker describes it. It is read
//! once at start ([`Limits::load`]) and again when a row looks too big and
//! the known limit is older than the caller allows
//! ([`Limits::confirmed`]): an operator who raises a topic's limit gets the
//! rows re-queued after it published without restarting anything. Without
//! Kafka settings (the embedded demo), or when the broker cannot be asked,
//! only the producer's limit is known.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::message::Headers;

use crate::envelope::Envelope;
use crate::kafka::client::KafkaSettings;
use crate::kafka::size_limit::{RecordLimit, topic_max_message_bytes};

/// Known limits by topic, each with when the broker was last asked.
pub struct Limits {
    kafka: Option<KafkaSettings>,
    producer_options: BTreeMap<String, String>,
    known: Mutex<BTreeMap<String, (RecordLimit, Option<Instant>)>>,
}

impl Limits {
    /// Limits from `producer_options`; topics' own limits are asked of the
    /// broker through `kafka` (None: the producer's limit only).
    pub fn new(kafka: Option<KafkaSettings>, producer_options: BTreeMap<String, String>) -> Self {
        Self {
            kafka,
            producer_options,
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// Asks the broker for the limit of each of `topics` now.
    pub async fn load(&self, topics: &[&str]) {
        for topic in topics {
            self.refresh(topic).await;
        }
    }

    /// The limit known for `topic` (the producer's until the broker was asked).
    pub fn cached(&self, topic: &str) -> RecordLimit {
        let known = self.known.lock().expect("not poisoned");
        match known.get(topic) {
            Some((limit, _)) => limit.clone(),
            None => RecordLimit::new(&self.producer_options, None),
        }
    }

    /// The limit of `topic`, asked of the broker again first when it was
    /// asked longer than `max_age` ago (or never).
    pub async fn confirmed(&self, topic: &str, max_age: Duration) -> RecordLimit {
        let asked = self
            .known
            .lock()
            .expect("not poisoned")
            .get(topic)
            .and_then(|(_, at)| *at);
        if self.kafka.is_some() && asked.is_none_or(|at| at.elapsed() >= max_age) {
            return self.refresh(topic).await;
        }
        self.cached(topic)
    }

    /// Forgets when `topic`'s limit was read (the broker refused a record
    /// that looked small enough): the next [`Self::confirmed`] asks again.
    pub fn forget(&self, topic: &str) {
        if let Some((_, at)) = self.known.lock().expect("not poisoned").get_mut(topic) {
            *at = None;
        }
    }

    async fn refresh(&self, topic: &str) -> RecordLimit {
        let topic_max = match &self.kafka {
            Some(kafka) => topic_max_message_bytes(kafka, topic).await,
            None => None,
        };
        let limit = RecordLimit::new(
            &self.producer_options,
            topic_max.map(|max| (topic.to_string(), max)),
        );
        let asked = self.kafka.as_ref().map(|_| Instant::now());
        self.known
            .lock()
            .expect("not poisoned")
            .insert(topic.to_string(), (limit.clone(), asked));
        limit
    }
}

/// The size of the record the relay makes of `envelope` for a topic of
/// `schema`, without a registry: Confluent framing (magic byte, schema id)
/// and the Avro body written with `schema`, the envelope's key and the
/// headers every record carries ([`crate::producer::record_headers`]).
pub fn record_size_of(envelope: &Envelope, schema: &apache_avro::Schema) -> Result<usize, String> {
    let value = crate::codec::avro::to_avro(envelope, schema).map_err(|e| e.to_string())?;
    let body = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .map_err(|e| e.to_string())?;
    let headers = crate::producer::record_headers(envelope);
    let pairs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|h| (h.key, h.value.unwrap_or_default()))
        .collect();
    // What the relay sends: 1 magic byte and a 4-byte schema id before the body.
    Ok(RecordLimit::record_size(envelope.key().as_bytes(), &[], &pairs) + 5 + body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size computed without a registry is the size of the record the
    /// relay's codec writes (through a Confluent-compatible registry).
    #[tokio::test]
    async fn the_size_without_a_registry_is_the_relays() {
        let registry = crate::codec::embedded_registry::EmbeddedRegistry::start()
            .await
            .unwrap();
        let settings = crate::codec::RegistrySettings {
            url: registry.url().to_string(),
            username: None,
            password: None,
            timeout_ms: 5000,
            auto_register: true,
        };
        let schema = crate::schema::SchemaCatalog::embedded()
            .order_events()
            .clone();
        let codec = crate::codec::Codec::new(&settings, "order.events.v1", &schema, true).unwrap();
        for data in crate::envelope::EventData::sample_lifecycle(123_456_789) {
            let envelope = Envelope::new("orderpipe-api", data);
            let payload = codec.encode(&envelope).await.unwrap();
            let headers = crate::producer::record_headers(&envelope);
            let pairs: Vec<(&str, &[u8])> = headers
                .iter()
                .map(|h| (h.key, h.value.unwrap_or_default()))
                .collect();
            let relay = RecordLimit::record_size(envelope.key().as_bytes(), &payload, &pairs);
            assert_eq!(
                record_size_of(&envelope, schema.as_ref()).unwrap(),
                relay,
                "{}",
                envelope.event_name
            );
        }
    }

    #[tokio::test]
    async fn without_kafka_the_producer_limit_stands() {
        let options = BTreeMap::from([("message.max.bytes".to_string(), "2000".to_string())]);
        let limits = Limits::new(None, options);
        assert_eq!(limits.cached("t").max_bytes, 2000);
        let limit = limits.confirmed("t", Duration::ZERO).await;
        assert_eq!(
            (limit.max_bytes, limit.from.as_str()),
            (2000, "producer message.max.bytes = 2000")
        );
    }
}
