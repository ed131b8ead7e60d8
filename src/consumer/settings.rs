//! The `[consumer]` section of the configuration, the sections a group
//! member reads, the librdkafka config built from them, and the database
//! connections a member needs.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::ConsumerError;
use super::options::{ConsumeOptions, StartFrom};
use crate::codec::RegistrySettings;
use crate::kafka::client::{KafkaSettings, Prefetch, client_config, consumer_options};
use crate::ordering::OrderingMode;
use crate::producer::ProducerSettings;
use crate::retry::RetrySettings;
use crate::topics::TopicsSettings;

/// The `[consumer]` section of the configuration: consumer tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    /// librdkafka consumer options layered over orderpipe's.
    pub options: BTreeMap<String, String>,
    /// Records of one partition applied in one DB transaction, at most.
    pub batch_size: usize,
    /// How long a partition's batch waits, after its first record, for
    /// more before it is applied (0: it takes what is already waiting).
    pub batch_linger_ms: u64,
    /// Records a partition may hold beyond its queue, in batches, before it
    /// is paused on the consumer (0: paused at the first that does not fit).
    pub overflow_batches: usize,
    /// `/health/mq` fails past this total lag.
    pub lag_threshold: i64,
    /// `/health/mq` fails when the loop has not polled for this long.
    pub max_poll_gap_secs: u64,
    /// Per-key order through retries and dead letters (`key`) or not (`none`).
    pub ordering: OrderingMode,
    /// librdkafka `queued.max.messages.kbytes`: payload prefetched ahead of the workers, at most.
    pub fetch_queue_kbytes: u32,
    /// librdkafka `queued.min.messages`: records prefetched ahead of the workers before fetching stops.
    pub fetch_queue_min_messages: u32,
    /// librdkafka `fetch.message.max.bytes`: bytes one fetch brings per partition, at most.
    pub fetch_partition_max_bytes: u32,
}

impl ConsumerSettings {
    /// The prefetch bounds, as the Kafka client takes them.
    pub fn prefetch(&self) -> Prefetch {
        Prefetch {
            queue_kbytes: self.fetch_queue_kbytes,
            queue_min_messages: self.fetch_queue_min_messages,
            partition_max_bytes: self.fetch_partition_max_bytes,
        }
    }

    /// Rejects prefetch bounds out of librdkafka's range, and a pass-through
    /// option (in `kafka` options or `consumer.options`) that sets one of them again.
    pub fn validate(&self, kafka: &KafkaSettings) -> Result<(), String> {
        consumer_options(&kafka.options, &self.options, self.prefetch())
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The configuration sections a consumer group member reads
/// ([`crate::startup::consumer_sections`] picks them out of the settings).
#[derive(Debug, Clone, Copy)]
pub struct ConsumerSections<'a> {
    /// The Kafka connection.
    pub kafka: &'a KafkaSettings,
    /// Consumer tuning.
    pub consumer: &'a ConsumerSettings,
    /// Options of the error tier's producer.
    pub producer: &'a ProducerSettings,
    /// The error tier's schedule.
    pub retry: &'a RetrySettings,
    /// The registry the codec uses.
    pub registry: &'a RegistrySettings,
    /// The declared topics (partition counts, the dead-letter topic).
    pub topics: &'a TopicsSettings,
}

/// The librdkafka config of a member of `group`: the shared client
/// options, orderpipe's consumer options, then the prefetch bounds and
/// `consumer.options` ([`consumer_options`]).
pub fn consumer_config(
    settings: ConsumerSections<'_>,
    group: &str,
    start_from: StartFrom,
) -> Result<rdkafka::ClientConfig, ConsumerError> {
    let layered = consumer_options(
        &settings.kafka.options,
        &settings.consumer.options,
        settings.consumer.prefetch(),
    )
    .map_err(|e| ConsumerError::Config(e.to_string()))?;
    let mut config = client_config(&settings.kafka.client_options());
    config
        .set("group.id", group)
        // Offsets are stored by workers after the DB commit; librdkafka commits
        // what is stored every second, on rebalance and on close.
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.commit.interval.ms", "1000")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", "10000")
        .set("statistics.interval.ms", "5000")
        .set(
            "auto.offset.reset",
            match start_from {
                StartFrom::Earliest => "earliest",
                StartFrom::Latest => "latest",
            },
        );
    for (k, v) in &layered {
        config.set(k, v);
    }
    Ok(config)
}

/// Connections beyond one per partition worker: the parked-key release task
/// and the health check's ping.
const POOL_MARGIN: u32 = 2;

/// Database connections a member of `group` reading `topic` can use at
/// once: one per partition worker (every partition of the topic and, with
/// the error tier, of its retry topic, declared alike) plus a margin. With
/// a smaller pool workers queue for a connection, and a wait past the
/// acquire timeout reads as the database being down.
pub fn connections_needed(topics: &TopicsSettings, topic: &str, error_tier: bool) -> u32 {
    declared_partitions(topics, topic) * if error_tier { 2 } else { 1 } + POOL_MARGIN
}

/// [`connections_needed`] of a group that reads several topics
/// (`options.reads`, a router binding's): one per partition of each, and
/// with the error tier of its retry topic (declared like `options.topic`),
/// plus the margin.
pub fn connections_needed_for(topics: &TopicsSettings, options: &ConsumeOptions) -> u32 {
    let read: u32 = options
        .read_topics()
        .map(|t| declared_partitions(topics, t))
        .sum();
    let retry = if options.error_tier {
        declared_partitions(topics, &options.topic)
    } else {
        0
    };
    read + retry + POOL_MARGIN
}

/// Partitions of `topic` as declared; a topic `[topics]` does not declare
/// (a `cdc.*` one) is counted like the order topic.
fn declared_partitions(topics: &TopicsSettings, topic: &str) -> u32 {
    topics
        .find(topic)
        .unwrap_or(&topics.order_events)
        .partitions
        .max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn a_group_reading_several_topics_gets_a_connection_per_partition_of_each() {
        let settings = Settings::default();
        let order = settings.topics.order_events.name.clone();
        let partitions = settings.topics.order_events.partitions as u32;
        let mut options = ConsumeOptions {
            group: "g".into(),
            handlers: Vec::new(),
            topic: order.clone(),
            reads: Vec::new(),
            start_from: StartFrom::Earliest,
            until_idle: None,
            health_addr: None,
            error_tier: true,
            ordering: OrderingMode::Key,
            crash_before_forward_ack: false,
            commit_stamps: None,
        };
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            connections_needed(&settings.topics, &order, true)
        );
        assert_eq!(options.read_topics().collect::<Vec<_>>(), [order.as_str()]);
        // A router binding: the order topic and an undeclared cdc topic, one retry topic.
        options.reads = vec![order.clone(), "cdc.shop.table_user".into()];
        assert_eq!(
            options.read_topics().collect::<Vec<_>>(),
            [order.as_str(), "cdc.shop.table_user"]
        );
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            3 * partitions + POOL_MARGIN
        );
        options.reads = vec!["cdc.shop.table_user".into()];
        options.error_tier = false;
        assert_eq!(
            connections_needed_for(&settings.topics, &options),
            partitions + POOL_MARGIN
        );
    }

    #[test]
    fn prefetch_bounds_reach_librdkafka() {
        let mut settings = Settings::default();
        settings.consumer.fetch_queue_kbytes = 4096;
        settings.consumer.fetch_queue_min_messages = 3000;
        settings.consumer.fetch_partition_max_bytes = 131_072;
        settings
            .consumer
            .options
            .insert("fetch.queue.backoff.ms".into(), "50".into());
        settings
            .consumer
            .options
            .insert("fetch.wait.max.ms".into(), "500".into());
        let config = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Earliest,
        )
        .unwrap();
        assert_eq!(config.get("queued.max.messages.kbytes"), Some("4096"));
        // librdkafka itself holds them (it parsed and accepted each value).
        let native = config.create_native_config().unwrap();
        assert_eq!(native.get("queued.max.messages.kbytes").unwrap(), "4096");
        assert_eq!(native.get("queued.min.messages").unwrap(), "3000");
        assert_eq!(native.get("fetch.message.max.bytes").unwrap(), "131072");
        assert_eq!(native.get("fetch.queue.backoff.ms").unwrap(), "50");
        assert_eq!(native.get("fetch.wait.max.ms").unwrap(), "500");
        assert_eq!(native.get("group.id").unwrap(), "g");
    }

    #[test]
    fn the_default_prefetch_is_bounded() {
        let settings = Settings::default();
        let config = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Latest,
        )
        .unwrap();
        let native = config.create_native_config().unwrap();
        // librdkafka's own defaults are 65536 KB and 100000 records, 1 MB per partition.
        assert_eq!(
            native.get("queued.max.messages.kbytes").unwrap(),
            settings.consumer.fetch_queue_kbytes.to_string()
        );
        assert!(settings.consumer.fetch_queue_kbytes < 65_536);
        assert!(settings.consumer.fetch_queue_min_messages < 100_000);
        assert!(settings.consumer.fetch_partition_max_bytes < 1_048_576);
        assert_eq!(native.get("fetch.queue.backoff.ms").unwrap(), "20");
        // librdkafka's own default is 500 ms.
        assert_eq!(native.get("fetch.wait.max.ms").unwrap(), "100");
    }

    #[test]
    fn a_conflicting_or_out_of_range_prefetch_is_refused_at_validation() {
        let mut settings = Settings::default();
        settings
            .kafka
            .options
            .insert("queued.min.messages".into(), "100".into());
        let e = settings.validate().unwrap_err().to_string();
        assert!(
            e.contains("`queued.min.messages` in kafka.options")
                && e.contains("consumer.fetch_queue_min_messages"),
            "{e}"
        );
        let mut settings = Settings::default();
        settings.consumer.fetch_queue_kbytes = 0;
        let e = settings.validate().unwrap_err().to_string();
        assert!(
            e.contains("consumer.fetch_queue_kbytes = 0 is out of range: accepted 1 to 2097151"),
            "{e}"
        );
        let e = consumer_config(
            crate::startup::consumer_sections(&settings),
            "g",
            StartFrom::Latest,
        )
        .unwrap_err();
        assert!(e.to_string().contains("consumer.fetch_queue_kbytes"), "{e}");
    }
}
