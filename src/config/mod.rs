//! Configuration, layered: built-in defaults (`defaults.toml`, the local dev stack), then a
//! TOML (or JSON) file, then `ORDERPIPE_*` environment variables, then command-line
//! flags. Nested keys use `__` in the environment:
//! `ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS=broker:9092`,
//! `ORDERPIPE_DATABASE__URL=mysql://...`.
//!
//! Secrets (database URL, registry password, SASL password) are
//! [`SecretString`]s: `Debug` prints `[REDACTED]`, so logging a config never
//! leaks them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Json, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// The default config file, read when it exists and no other is named.
pub const DEFAULT_CONFIG_FILE: &str = "orderpipe.toml";

/// Everything orderpipe can be told.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Kafka connection, shared by every client.
    pub kafka: crate::kafka::client::KafkaSettings,
    /// Producer tuning.
    pub producer: ProducerSettings,
    /// Consumer tuning.
    pub consumer: ConsumerSettings,
    /// The error tier.
    pub retry: crate::retry::RetrySettings,
    /// Fault injection of the `chaos` handler.
    pub chaos: ChaosSettings,
    /// Dead letters.
    pub dlq: DlqSettings,
    /// Broker-side group lag (`orderpipe lag`, the persister's exporter).
    #[serde(default)]
    pub lag: crate::lag::LagSettings,
    /// Downstream HTTP subscriptions.
    pub http: crate::delivery::HttpSettings,
    /// Schema registry.
    pub registry: RegistrySettings,
    /// Database.
    pub database: DatabaseSettings,
    /// Declared topics.
    pub topics: TopicsSettings,
}

/// Producer tuning.
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

/// Consumer tuning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSettings {
    /// librdkafka consumer options layered over orderpipe's.
    pub options: BTreeMap<String, String>,
    /// Records of one partition applied in one DB transaction, at most.
    pub batch_size: usize,
    /// `/health/mq` fails past this total lag.
    pub lag_threshold: i64,
    /// `/health/mq` fails when the loop has not polled for this long.
    pub max_poll_gap_secs: u64,
    /// Per-key order through retries and dead letters (`key`) or not (`none`).
    pub ordering: crate::ordering::OrderingMode,
}

/// Fault injection of the built-in `chaos` handler (demos and tests).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosSettings {
    /// Orders whose events fail transiently.
    pub transient_orders: Vec<i64>,
    /// How many executions of each such event fail before it succeeds.
    pub transient_failures: u32,
    /// Only these event names fail transiently (empty: every event).
    pub transient_events: Vec<String>,
    /// Orders whose events always fail (fatal).
    pub permanent_orders: Vec<i64>,
    /// Every event fails (fatal).
    pub permanent_all: bool,
    /// Fraction of all events (0.0 to 1.0, picked by event id) that fail
    /// transiently like `transient_orders`.
    pub transient_rate: f64,
}

/// Dead letters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqSettings {
    /// Consumer group of the persister.
    pub persister_group: String,
}

/// Schema registry (Confluent-compatible API).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// Base URL, e.g. Apicurio's `http://host:8081/apis/ccompat/v7`.
    pub url: String,
    /// Basic-auth user.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Per-request timeout.
    pub timeout_ms: u64,
    /// Register the local schema on first use (otherwise use the latest registered).
    pub auto_register: bool,
}

/// Database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `mysql://user:pass@host:port/db` or `sqlite://path`.
    pub url: SecretString,
    /// Pool size.
    pub max_connections: u32,
}

/// Declared topics; `topics ensure` reconciles the cluster to these.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsSettings {
    /// `order.events.v1`.
    pub order_events: TopicSpec,
    /// `inventory.events.v1`.
    pub inventory_events: TopicSpec,
    /// `order.events.v1.dlq`.
    pub dead_letter: TopicSpec,
}

/// One topic's declared shape.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Partition count (only ever grown).
    pub partitions: i32,
    /// Replication factor at creation.
    pub replication_factor: i32,
    /// `min.insync.replicas`.
    pub min_insync_replicas: i32,
    /// `retention.ms`.
    pub retention_ms: i64,
    /// Other topic configs to enforce.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl TopicSpec {
    /// Every config `topics ensure` enforces, including min ISR and retention.
    pub fn desired_configs(&self) -> BTreeMap<String, String> {
        let mut configs = self.configs.clone();
        configs.insert("min.insync.replicas".into(), self.min_insync_replicas.to_string());
        configs.insert("retention.ms".into(), self.retention_ms.to_string());
        configs
    }
}

/// The built-in defaults, one documented file.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

impl Default for Settings {
    fn default() -> Self {
        Figment::from(Toml::string(DEFAULTS_TOML))
            .extract()
            .expect("built-in defaults are complete and valid")
    }
}

/// A config value that is present but unusable.
#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

/// What `orderpipe config` prints in place of a secret. Loading it back as
/// a value is refused ([`Settings::validate`]): the real secret must come
/// from the file or the environment, never the placeholder.
pub const REDACTED: &str = "__REDACTED__";

/// Secret fields, by their path in the config file.
const SECRET_FIELDS: [&str; 3] = ["kafka.sasl_password", "registry.password", "database.url"];

/// Tables of pass-through librdkafka options, by their path.
const OPTION_TABLES: [&str; 3] = ["kafka.options", "producer.options", "consumer.options"];

/// A librdkafka option that holds a secret (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, ...).
fn is_secret_option(name: &str) -> bool {
    name.contains("password") || name.contains("secret")
}

impl Settings {
    /// Loads defaults, then `file` (or `./orderpipe.toml` if present), then
    /// the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, &serde_json::json!({}))
    }

    /// [`Settings::load`] with `overrides` (command-line flags, as a
    /// document shaped like the config file) as the last layer.
    pub fn load_with(file: Option<&Path>, overrides: &serde_json::Value) -> Result<Self, ConfigError> {
        let settings: Settings = Self::layers(file, overrides)?.extract().map_err(|e| ConfigError(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// The configuration these layers make, as a document `--config` accepts
    /// back (TOML or JSON), with every secret replaced by [`REDACTED`]: the
    /// password of `database.url`, `kafka.sasl_password`,
    /// `registry.password`, and librdkafka options named like a password
    /// or secret.
    pub fn redacted_document(file: Option<&Path>, overrides: &serde_json::Value) -> Result<serde_json::Value, ConfigError> {
        Self::load_with(file, overrides)?;
        let mut document: serde_json::Value = Self::layers(file, overrides)?.extract().map_err(|e| ConfigError(e.to_string()))?;
        for path in SECRET_FIELDS {
            let Some(value) = document.pointer_mut(&format!("/{}", path.replace('.', "/"))) else { continue };
            let redacted = match value.as_str() {
                Some(url) if path == "database.url" => redact_url_password(url),
                _ => REDACTED.to_string(),
            };
            *value = redacted.into();
        }
        for path in OPTION_TABLES {
            if let Some(serde_json::Value::Object(options)) = document.pointer_mut(&format!("/{}", path.replace('.', "/"))) {
                for (_, value) in options.iter_mut().filter(|(name, _)| is_secret_option(name)) {
                    *value = REDACTED.into();
                }
            }
        }
        drop_nulls(&mut document);
        Ok(document)
    }

    /// Defaults, the file, the environment, then `overrides`.
    fn layers(file: Option<&Path>, overrides: &serde_json::Value) -> Result<Figment, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULTS_TOML));
        let default_file = PathBuf::from(DEFAULT_CONFIG_FILE);
        match file {
            Some(path) if !path.exists() => {
                return Err(ConfigError(format!("config file {} not found", path.display())));
            }
            // JSON too: the Helm chart renders its values as JSON, which keeps
            // integers integers (Helm's toToml writes every number as a float).
            Some(path) if path.extension().is_some_and(|e| e == "json") => figment = figment.merge(Json::file(path)),
            Some(path) => figment = figment.merge(Toml::file(path)),
            None if default_file.exists() => figment = figment.merge(Toml::file(default_file)),
            None => {}
        }
        Ok(figment
            .merge(Env::prefixed("ORDERPIPE_").split("__").ignore(&["config"]))
            .merge(Serialized::defaults(overrides)))
    }

    /// Secret values with their field names (see [`SECRET_FIELDS`]).
    fn secrets(&self) -> Vec<(String, &str)> {
        let mut secrets = Vec::new();
        for path in SECRET_FIELDS {
            let value = match path {
                "kafka.sasl_password" => self.kafka.sasl_password.as_ref(),
                "registry.password" => self.registry.password.as_ref(),
                _ => Some(&self.database.url),
            };
            if let Some(value) = value {
                secrets.push((path.to_string(), value.expose_secret()));
            }
        }
        for (path, options) in OPTION_TABLES.into_iter().zip([&self.kafka.options, &self.producer.options, &self.consumer.options]) {
            for (name, value) in options.iter().filter(|(name, _)| is_secret_option(name)) {
                secrets.push((format!("{path}.\"{name}\""), value.as_str()));
            }
        }
        secrets
    }

    /// Rejects values that would only fail later and less clearly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in self.secrets() {
            if value.contains(REDACTED) {
                let env = match field.contains('"') {
                    true => String::new(),
                    false => format!(" or with ORDERPIPE_{}", field.replace('.', "__").to_uppercase()),
                };
                return Err(ConfigError(format!(
                    "{field} holds {REDACTED}, the placeholder `orderpipe config` prints instead of a secret: \
                     set the real value in the config file{env}"
                )));
            }
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError("kafka.bootstrap_servers must not be empty".into()));
        }
        for spec in [
            &self.topics.order_events,
            &self.topics.inventory_events,
            &self.topics.dead_letter,
        ] {
            let field = |f: &str| format!("topics.{}.{f}", spec.name);
            if spec.partitions < 1 {
                return Err(ConfigError(format!("{} must be >= 1", field("partitions"))));
            }
            if spec.replication_factor < 1 {
                return Err(ConfigError(format!("{} must be >= 1", field("replication_factor"))));
            }
            if spec.min_insync_replicas < 1 || spec.min_insync_replicas > spec.replication_factor {
                return Err(ConfigError(format!(
                    "{} must be between 1 and replication_factor ({})",
                    field("min_insync_replicas"),
                    spec.replication_factor
                )));
            }
        }
        crate::retry::RetryPolicy::from_settings(&self.retry).map_err(|e| ConfigError(e.to_string()))?;
        if !(0.0..=1.0).contains(&self.chaos.transient_rate) {
            return Err(ConfigError(format!(
                "chaos.transient_rate must be between 0.0 and 1.0, got {}",
                self.chaos.transient_rate
            )));
        }
        for subscription in &self.http.subscriptions {
            subscription.validate().map_err(ConfigError)?;
        }
        self.lag.validate().map_err(ConfigError)?;
        // Every declared topic holds key messages (retry topics inherit the
        // order topic's spec): at least 30 days.
        for (key, spec, why) in [
            ("order_events", &self.topics.order_events, "order events are kept for audit"),
            ("inventory_events", &self.topics.inventory_events, "inventory events are audited with the order events"),
            ("dead_letter", &self.topics.dead_letter, "dead letters must outlive a persister outage and stay replayable"),
        ] {
            if spec.retention_ms >= 0 && spec.retention_ms < 30 * DAY_MS {
                return Err(ConfigError(format!(
                    "topics.{key}.retention_ms must be >= 30 days (2592000000) or -1 (forever), got {}: {why}",
                    spec.retention_ms
                )));
            }
        }
        if !self.database.url.expose_secret().starts_with("mysql://")
            && !self.database.url.expose_secret().starts_with("mariadb://")
            && !self.database.url.expose_secret().starts_with("sqlite:")
        {
            return Err(ConfigError(
                "database.url must start with mysql://, mariadb:// or sqlite:".into(),
            ));
        }
        Ok(())
    }

    /// The configured name of the topic a schema file (named after the
    /// default topic name) describes; tests and staging rename topics.
    pub fn topic_name_for_schema(&self, schema_topic: &str) -> String {
        [&self.topics.order_events, &self.topics.inventory_events, &self.topics.dead_letter]
            .into_iter()
            .zip(["order.events.v1", "inventory.events.v1", "order.events.v1.dlq"])
            .find(|(_, default)| *default == schema_topic)
            .map_or_else(|| schema_topic.to_string(), |(spec, _)| spec.name.clone())
    }

}

/// Removes `null`s (a JSON file may hold them; TOML has none, and an
/// absent optional field reads the same).
fn drop_nulls(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// `url` with its password (if any) replaced by [`REDACTED`]; user, host
/// and database stay, so the printed file still says where to connect.
fn redact_url_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some(REDACTED));
            parsed.to_string()
        }
        Ok(_) => url.to_string(),
        // Unparsable: print none of it rather than risk a secret.
        Err(_) => REDACTED.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_point_at_the_dev_stack_and_validate() {
        let s = Settings::default();
        s.validate().unwrap();
        assert_eq!(s.kafka.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(s.topics.order_events.partitions, 12);
    }

    #[test]
    fn secrets_never_print() {
        let mut s = Settings::default();
        s.kafka.sasl_password = Some(SecretString::from("hunter2"));
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"));
        assert!(!shown.contains("orderpipe:orderpipe@"), "{shown}");
    }

    #[test]
    fn file_then_env_layers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[kafka]\nbootstrap_servers = \"file:9092\"\n[producer.options]\n\"linger.ms\" = \"20\"\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("ORDERPIPE_REGISTRY__URL", "http://env:1");
            jail.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__NAME", "t1.order.events.v1");
            let s = Settings::load(Some(&path)).unwrap();
            assert_eq!(s.kafka.bootstrap_servers, "file:9092");
            assert_eq!(s.producer.options["linger.ms"], "20");
            assert_eq!(s.registry.url, "http://env:1");
            // A nested override keeps the other defaults of that table.
            assert_eq!(s.topics.order_events.name, "t1.order.events.v1");
            assert_eq!(s.topics.order_events.partitions, 12);
            assert_eq!(s.topic_name_for_schema("order.events.v1"), "t1.order.events.v1");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_short_retention_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[kafka]\nbootstrap = \"x\"\n").unwrap();
        let err = Settings::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("bootstrap"), "{err}");
        let mut s = Settings::default();
        s.topics.order_events.retention_ms = DAY_MS;
        assert!(s.validate().unwrap_err().to_string().contains("retention_ms"));
        for key in ["inventory_events", "dead_letter"] {
            let with_retention = |ms: i64| {
                let mut s = Settings::default();
                match key {
                    "dead_letter" => s.topics.dead_letter.retention_ms = ms,
                    _ => s.topics.inventory_events.retention_ms = ms,
                }
                s.validate()
            };
            let err = with_retention(DAY_MS).unwrap_err().to_string();
            assert!(err.contains(&format!("topics.{key}.retention_ms must be >= 30 days")), "{err}");
            with_retention(-1).unwrap();
        }
    }
    #[test]
    fn the_redacted_document_hides_every_secret_and_its_placeholder_is_refused_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[kafka]\nsasl_password = \"hunter2\"\n[kafka.options]\n\"ssl.key.password\" = \"keypass\"\n\"security.protocol\" = \"SASL_SSL\"\n\
             [database]\nurl = \"mysql://app:dbpass@db:3306/orders\"\n",
        )
        .unwrap();
        // In a Jail: no other test's ORDERPIPE_* variables meanwhile.
        figment::Jail::expect_with(|_| {
            redacted_round_trip(&path);
            Ok(())
        });
    }

    fn redacted_round_trip(path: &Path) {
        let document = Settings::redacted_document(Some(path), &serde_json::json!({})).unwrap();
        let text = document.to_string();
        for secret in ["hunter2", "keypass", "dbpass"] {
            assert!(!text.contains(secret), "{secret} printed: {text}");
        }
        assert_eq!(document["database"]["url"], "mysql://app:__REDACTED__@db:3306/orders");
        assert_eq!(document["kafka"]["options"]["security.protocol"], "SASL_SSL");

        std::fs::write(path, toml::to_string(&document).unwrap()).unwrap();
        let err = Settings::load(Some(path)).unwrap_err().to_string();
        assert!(err.contains("__REDACTED__") && err.contains("ORDERPIPE_"), "{err}");
        assert_eq!(redact_url_password("sqlite::memory:"), "sqlite::memory:");
        assert_eq!(redact_url_password("mysql://app@db/orders"), "mysql://app@db/orders");
    }
}
