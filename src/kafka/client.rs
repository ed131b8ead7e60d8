//! The librdkafka client plumbing every role shares.
//!
//! * [`KafkaSettings`] is the `[kafka]` section of the configuration; its
//!   [`KafkaSettings::client_options`] are the options every client gets.
//! * [`client_config`] turns an option map into a librdkafka `ClientConfig`.
//! * [`producer_options`] is the checked pass-through for producers: safe
//!   defaults, a map of librdkafka options layered on top, and a conflict
//!   check so an override cannot quietly turn the idempotent producer into
//!   a lossy one, or quietly send a key to another partition than Kafka's
//!   Java clients do.
//! * [`consumer_options`] is the same for consumers: orderpipe's defaults,
//!   the explicit prefetch bounds ([`Prefetch`]) and the pass-through map,
//!   refusing a pass-through key that an explicit setting already sets.
//! * [`MeasuredProducer`] is a producer whose librdkafka statistics become
//!   metrics ([`StatsContext`]).

use std::collections::BTreeMap;

use metrics::gauge;
use rdkafka::ClientConfig;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::metrics::name;

/// The `[kafka]` section of the configuration: the connection every client shares.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// librdkafka options for every client (security.protocol, sasl.mechanism, ...).
    pub options: BTreeMap<String, String>,
    /// `sasl.password`, kept out of `options` so it never prints.
    #[serde(default)]
    pub sasl_password: Option<SecretString>,
}

impl KafkaSettings {
    /// The librdkafka options every client gets: bootstrap servers, the
    /// shared pass-through map and the SASL password.
    pub fn client_options(&self) -> BTreeMap<String, String> {
        let mut options = self.options.clone();
        options.insert("bootstrap.servers".into(), self.bootstrap_servers.clone());
        if let Some(password) = &self.sasl_password {
            options.insert("sasl.password".into(), password.expose_secret().to_string());
        }
        options
    }

    /// Rejects a connection no client can make.
    pub fn validate(&self) -> Result<(), String> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err("kafka.bootstrap_servers must not be empty".into());
        }
        Ok(())
    }
}

/// Defaults for an idempotent, ordered, compressed producer.
pub const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // Idempotence keeps order with up to 5 in-flight requests per connection.
    ("max.in.flight.requests.per.connection", "5"),
    ("compression.type", "lz4"),
    ("linger.ms", "5"),
    // Same as Java's delivery.timeout.ms: a record not acknowledged by then is
    // reported as failed instead of waiting forever.
    ("message.timeout.ms", "120000"),
    // Kafka's Java clients place a keyed record by murmur2 of the key;
    // librdkafka's default (consistent_random) uses CRC32, so an order
    // produced by a Java service and by orderpipe would land in two
    // partitions. murmur2_random is murmur2 for keys, random for null keys.
    (PARTITIONER, JAVA_COMPATIBLE_PARTITIONER),
];

/// The librdkafka option that maps a key to a partition.
pub const PARTITIONER: &str = "partitioner";

/// The partitioner that places keyed records as Kafka's Java clients do.
pub const JAVA_COMPATIBLE_PARTITIONER: &str = "murmur2_random";

/// The values librdkafka accepts for [`PARTITIONER`].
pub const PARTITIONERS: &[&str] = &[
    "murmur2_random",
    "murmur2",
    "consistent_random",
    "consistent",
    "fnv1a_random",
    "fnv1a",
    "random",
];

/// Keys the map may not set because orderpipe owns them.
const RESERVED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set kafka.bootstrap_servers instead"),
    ("transactional.id", "the relay sets it per instance"),
    (
        "sasl.password",
        "set kafka.sasl_password so it stays secret",
    ),
];

/// An override that contradicts another setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("librdkafka option conflict: {0}")]
pub struct OptionConflict(pub String);

/// The effective producer options: defaults, then `client` (shared Kafka
/// options), then `overrides`; checked for conflicts.
pub fn producer_options(
    client: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, OptionConflict> {
    for (key, why) in RESERVED {
        if overrides.contains_key(*key) {
            return Err(OptionConflict(format!(
                "`{key}` cannot be overridden here: {why}"
            )));
        }
    }
    // The shared client options also reach consumers and admin clients; a
    // partitioner there is a copied librdkafka setting, not a decision.
    if client.contains_key(PARTITIONER) {
        return Err(OptionConflict(format!(
            "`{PARTITIONER}` in kafka.options: set producer.options.{PARTITIONER} (or -X {PARTITIONER}=...) \
             if you mean to leave the Java-compatible {JAVA_COMPATIBLE_PARTITIONER}"
        )));
    }
    if let Some(value) = overrides.get(PARTITIONER) {
        if !PARTITIONERS.contains(&value.as_str()) {
            return Err(OptionConflict(format!(
                "{PARTITIONER}={value} is not a librdkafka partitioner; accepted: {}",
                PARTITIONERS.join(", ")
            )));
        }
        if !value.starts_with("murmur2") {
            tracing::warn!(
                partitioner = %value,
                "producer partitioner is not murmur2: keys may land in other partitions than Kafka's Java clients put them"
            );
        }
    }
    let mut options: BTreeMap<String, String> = PRODUCER_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    options.extend(client.iter().map(|(k, v)| (k.clone(), v.clone())));
    options.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    check_conflicts(&options)?;
    Ok(options)
}

fn check_conflicts(options: &BTreeMap<String, String>) -> Result<(), OptionConflict> {
    let get = |k: &str| options.get(k).map(|v| v.trim().to_ascii_lowercase());
    let idempotent = get("enable.idempotence").is_some_and(|v| v == "true");
    if !idempotent {
        return Ok(());
    }
    let acks = get("acks").or_else(|| get("request.required.acks"));
    if let Some(acks) = acks
        && acks != "all"
        && acks != "-1"
    {
        return Err(OptionConflict(format!(
            "acks={acks} with enable.idempotence=true: idempotence needs acks=all (or -1); \
             set enable.idempotence=false to accept possible loss or duplicates"
        )));
    }
    let in_flight = get("max.in.flight.requests.per.connection").or_else(|| get("max.in.flight"));
    if let Some(n) = in_flight {
        match n.parse::<u32>() {
            Ok(1..=5) => {}
            _ => {
                return Err(OptionConflict(format!(
                    "max.in.flight.requests.per.connection={n} with enable.idempotence=true: \
                     must be 1 to 5 to keep per-partition order"
                )));
            }
        }
    }
    if get("retries")
        .or_else(|| get("message.send.max.retries"))
        .is_some_and(|r| r == "0")
    {
        return Err(OptionConflict(
            "retries=0 with enable.idempotence=true: idempotence needs retries > 0".into(),
        ));
    }
    Ok(())
}

/// How far a consumer reads ahead of the application: librdkafka keeps
/// fetching until its queue holds `queue_min_messages` records or
/// `queue_kbytes` of payload, and one fetch brings at most
/// `partition_max_bytes` (compressed) per partition on top. Records are
/// held decompressed, so the queue's memory is several times its
/// compressed size (see docs/tuning.md, "Memory").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// `queued.max.messages.kbytes` (`consumer.fetch_queue_kbytes`).
    pub queue_kbytes: u32,
    /// `queued.min.messages` (`consumer.fetch_queue_min_messages`).
    pub queue_min_messages: u32,
    /// `fetch.message.max.bytes` (`consumer.fetch_partition_max_bytes`).
    pub partition_max_bytes: u32,
}

/// One explicit setting that is a librdkafka option: its field, the option,
/// the option's aliases, and librdkafka's accepted range.
struct MappedSetting {
    field: &'static str,
    option: &'static str,
    aliases: &'static [&'static str],
    range: (u32, u32),
}

/// The [`Prefetch`] fields, in its field order.
const PREFETCH_SETTINGS: [MappedSetting; 3] = [
    MappedSetting {
        field: "consumer.fetch_queue_kbytes",
        option: "queued.max.messages.kbytes",
        aliases: &[],
        range: (1, 2_097_151),
    },
    MappedSetting {
        field: "consumer.fetch_queue_min_messages",
        option: "queued.min.messages",
        aliases: &[],
        range: (1, 10_000_000),
    },
    MappedSetting {
        field: "consumer.fetch_partition_max_bytes",
        option: "fetch.message.max.bytes",
        aliases: &["max.partition.fetch.bytes"],
        range: (1, 1_000_000_000),
    },
];

/// Defaults for orderpipe's consumers, under the pass-through map.
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    // Once the prefetch queue is full, librdkafka waits this long before it
    // looks at a partition again (its default: 1000 ms). With a queue of a
    // few thousand records that is longer than the queue lasts at full
    // speed, and the consumer would starve between fetches.
    ("fetch.queue.backoff.ms", "20"),
    // How long the broker may hold a fetch that finds nothing new (its
    // default: 500 ms). librdkafka has one fetch in flight per broker, so
    // a partition resumed after a full queue, or asked for its lag, waits
    // for the held one to come back first: at 500 ms the workers of a
    // backlog starved for records a fifth of the time (docs/tuning.md,
    // "A held fetch").
    ("fetch.wait.max.ms", "100"),
];

impl Prefetch {
    fn values(&self) -> [u32; 3] {
        [
            self.queue_kbytes,
            self.queue_min_messages,
            self.partition_max_bytes,
        ]
    }

    /// Rejects a value librdkafka would refuse, naming the field and the range.
    pub fn validate(&self) -> Result<(), OptionConflict> {
        for (setting, value) in PREFETCH_SETTINGS.iter().zip(self.values()) {
            let (low, high) = setting.range;
            if !(low..=high).contains(&value) {
                return Err(OptionConflict(format!(
                    "{} = {value} is out of range: accepted {low} to {high} (librdkafka {})",
                    setting.field, setting.option
                )));
            }
        }
        Ok(())
    }
}

/// The consumer options orderpipe layers over the shared `client` options
/// (`kafka.options`): [`CONSUMER_DEFAULTS`], then `prefetch`, then
/// `overrides` (`consumer.options`). A key (or an alias of it) that an
/// explicit prefetch setting owns is refused in either map, naming both, so
/// two places never silently disagree about the same bound.
pub fn consumer_options(
    client: &BTreeMap<String, String>,
    overrides: &BTreeMap<String, String>,
    prefetch: Prefetch,
) -> Result<BTreeMap<String, String>, OptionConflict> {
    prefetch.validate()?;
    let mut options: BTreeMap<String, String> = CONSUMER_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (setting, value) in PREFETCH_SETTINGS.iter().zip(prefetch.values()) {
        for (table, map) in [("kafka.options", client), ("consumer.options", overrides)] {
            let key = std::iter::once(&setting.option)
                .chain(setting.aliases)
                .find(|key| map.contains_key(**key));
            if let Some(key) = key {
                return Err(OptionConflict(format!(
                    "`{key}` in {table} is what {field} sets ({field} = {value}): set {field} instead and remove `{key}` from {table}",
                    field = setting.field
                )));
            }
        }
        options.insert(setting.option.to_string(), value.to_string());
    }
    options.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(options)
}

/// A librdkafka config from an option map.
pub fn client_config(options: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in options {
        config.set(k, v);
    }
    config
}

/// A consumer that reads partitions by assignment (read_committed, from the
/// earliest offset, with end-of-partition events) and never joins its group
/// or commits: the readers of reconciliation's scans and the console's
/// topic explorer. `group_id` only names it in the broker's logs.
pub fn assignment_reader(
    kafka: &KafkaSettings,
    group_id: &str,
) -> rdkafka::error::KafkaResult<rdkafka::consumer::BaseConsumer> {
    client_config(&kafka.client_options())
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create()
}

/// librdkafka statistics that matter: queue depth and broker round trips.
pub fn kafka_statistics(stats: &rdkafka::Statistics) {
    let client = stats.client_id.clone();
    gauge!(name::KAFKA_QUEUE, "client" => client.clone()).set(stats.msg_cnt as f64);
    for broker in stats.brokers.values() {
        if let Some(rtt) = &broker.rtt {
            gauge!(name::KAFKA_RTT, "client" => client.clone(), "broker" => broker.nodename.clone())
                .set(rtt.avg as f64 / 1_000_000.0);
        }
    }
}

/// A librdkafka client context that turns the statistics callback into
/// metrics (enable it with `statistics.interval.ms`).
#[derive(Debug, Default, Clone, Copy)]
pub struct StatsContext;

impl rdkafka::ClientContext for StatsContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        kafka_statistics(&statistics);
    }
}

impl rdkafka::producer::ProducerContext for StatsContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// A producer with statistics reported as metrics every 5 s.
pub type MeasuredProducer = rdkafka::producer::FutureProducer<StatsContext>;

/// Creates a [`MeasuredProducer`] from librdkafka options.
pub fn measured_producer(
    options: &BTreeMap<String, String>,
) -> rdkafka::error::KafkaResult<MeasuredProducer> {
    let mut config = client_config(options);
    config.set("statistics.interval.ms", "5000");
    config.create_with_context(StatsContext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<BTreeMap<String, String>, OptionConflict> {
        let overrides = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        producer_options(&BTreeMap::new(), &overrides)
    }

    #[test]
    fn defaults_are_idempotent_and_overridable() {
        let o = with(&[("linger.ms", "50")]).unwrap();
        assert_eq!(o["enable.idempotence"], "true");
        assert_eq!(o["acks"], "all");
        assert_eq!(o["linger.ms"], "50");
    }

    #[test]
    fn conflicting_overrides_are_named() {
        let e = with(&[("acks", "1")]).unwrap_err().to_string();
        assert!(
            e.contains("acks=1") && e.contains("enable.idempotence"),
            "{e}"
        );
        let e = with(&[("max.in.flight.requests.per.connection", "10")]).unwrap_err();
        assert!(e.to_string().contains("max.in.flight"));
        assert!(with(&[("retries", "0")]).is_err());
        assert!(
            with(&[("transactional.id", "x")])
                .unwrap_err()
                .to_string()
                .contains("relay")
        );
        // Turning idempotence off makes acks=1 a legitimate (documented) choice.
        with(&[("enable.idempotence", "false"), ("acks", "1")]).unwrap();
    }

    const PREFETCH: Prefetch = Prefetch {
        queue_kbytes: 8192,
        queue_min_messages: 10_000,
        partition_max_bytes: 262_144,
    };

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn prefetch_bounds_become_librdkafka_options_under_the_pass_through() {
        let o = consumer_options(
            &BTreeMap::new(),
            &map(&[("fetch.queue.backoff.ms", "100")]),
            PREFETCH,
        )
        .unwrap();
        assert_eq!(o["queued.max.messages.kbytes"], "8192");
        assert_eq!(o["queued.min.messages"], "10000");
        assert_eq!(o["fetch.message.max.bytes"], "262144");
        // A default is overridable; an explicit setting is not.
        assert_eq!(o["fetch.queue.backoff.ms"], "100");
        let o = consumer_options(&BTreeMap::new(), &BTreeMap::new(), PREFETCH).unwrap();
        assert_eq!(o["fetch.queue.backoff.ms"], "20");
        assert_eq!(o["fetch.wait.max.ms"], "100");
    }

    #[test]
    fn a_pass_through_of_an_explicit_prefetch_bound_is_refused_by_name() {
        let e = consumer_options(
            &BTreeMap::new(),
            &map(&[("queued.min.messages", "5")]),
            PREFETCH,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`queued.min.messages` in consumer.options")
                && e.contains("consumer.fetch_queue_min_messages"),
            "{e}"
        );
        // Aliases too, and in the shared map.
        let e = consumer_options(
            &map(&[("max.partition.fetch.bytes", "1")]),
            &BTreeMap::new(),
            PREFETCH,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`max.partition.fetch.bytes` in kafka.options")
                && e.contains("consumer.fetch_partition_max_bytes"),
            "{e}"
        );
        let e = consumer_options(
            &BTreeMap::new(),
            &map(&[("queued.max.messages.kbytes", "1")]),
            PREFETCH,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("consumer.fetch_queue_kbytes = 8192")
                && e.contains("remove `queued.max.messages.kbytes`"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_prefetch_bounds_name_the_field_and_the_accepted_range() {
        let e = Prefetch {
            queue_kbytes: 0,
            ..PREFETCH
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("consumer.fetch_queue_kbytes = 0") && e.contains("accepted 1 to 2097151"),
            "{e}"
        );
        let e = Prefetch {
            queue_min_messages: 20_000_000,
            ..PREFETCH
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("consumer.fetch_queue_min_messages = 20000000")
                && e.contains("accepted 1 to 10000000"),
            "{e}"
        );
        let e = consumer_options(
            &BTreeMap::new(),
            &BTreeMap::new(),
            Prefetch {
                partition_max_bytes: 0,
                ..PREFETCH
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("consumer.fetch_partition_max_bytes = 0")
                && e.contains("fetch.message.max.bytes"),
            "{e}"
        );
    }

    #[test]
    fn partitioner_is_java_compatible_unless_overridden_explicitly() {
        assert_eq!(with(&[]).unwrap()[PARTITIONER], "murmur2_random");
        assert_eq!(
            with(&[("partitioner", "consistent_random")]).unwrap()[PARTITIONER],
            "consistent_random"
        );
        let e = with(&[("partitioner", "crc32")]).unwrap_err().to_string();
        assert!(
            e.contains("partitioner=crc32") && e.contains("murmur2_random, murmur2"),
            "{e}"
        );
        let shared = BTreeMap::from([("partitioner".to_string(), "consistent".to_string())]);
        let e = producer_options(&shared, &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kafka.options") && e.contains("producer.options.partitioner"),
            "{e}"
        );
    }
}
