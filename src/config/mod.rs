//! Configuration, layered: built-in defaults (`defaults.toml`, the local dev stack), then a
//! TOML (or JSON) file, then `ORDERPIPE_*` environment variables, then command-line
//! flags. Nested keys use `__` in the environment:
//! `ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS=broker:9092`,
//! `ORDERPIPE_DATABASE__URL=mysql://...`. Other `ORDERPIPE_*` variables (a
//! pod's service links, `dev/stack.sh`'s knobs) are not settings and are
//! ignored ([`env`]).
//!
//! Secrets (database URL, registry password, SASL password) are
//! [`SecretString`](secrecy::SecretString)s: `Debug` prints `[REDACTED]`, so
//! logging a config never leaks them.
//!
//! Each section's type lives with the component that reads it
//! (`[kafka]`: [`crate::kafka::client::KafkaSettings`], `[database]`:
//! [`crate::db::DatabaseSettings`], `[topics]`: [`crate::topics::TopicsSettings`],
//! ...), with the checks that concern that section alone. This module
//! composes them into [`Settings`], layers and validates them, and redacts
//! secrets; components never import it ([`crate::startup`] hands each role
//! its sections).
//!
//! The exceptions sit above this module and read the whole [`Settings`]:
//! the CLI, [`crate::startup`], the router and the console. A section of
//! theirs lives here ([`console::ConsoleSettings`]), so this module never
//! imports them (`dev/import-cycles.py` checks it).

pub mod console;
mod env;

use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Json, Serialized, Toml};
use secrecy::ExposeSecret;
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
    pub producer: crate::producer::ProducerSettings,
    /// Consumer tuning.
    pub consumer: crate::consumer::ConsumerSettings,
    /// The error tier.
    pub retry: crate::retry::RetrySettings,
    /// `[chaos]`, fault injection for demos and tests, kept raw: only a
    /// build with the cargo feature `harness` has the `chaos` handler that
    /// reads it (`harness::chaos::ChaosSettings`); [`Settings::validate`]
    /// refuses the section in any other build.
    #[serde(default)]
    pub chaos: Option<figment::value::Value>,
    /// Dead letters.
    pub dlq: crate::dlq::DlqSettings,
    /// Broker-side group lag (`orderpipe lag`, the persister's exporter).
    #[serde(default)]
    pub lag: crate::lag::LagSettings,
    /// Downstream HTTP subscriptions.
    pub http: crate::delivery::HttpSettings,
    /// Schema registry.
    pub registry: crate::codec::RegistrySettings,
    /// Database.
    pub database: crate::db::DatabaseSettings,
    /// Declared topics.
    pub topics: crate::topics::TopicsSettings,
    /// Where the relay reads the outbox, and its wake-up (`[outbox]`).
    #[serde(default)]
    pub outbox: crate::outbox::OutboxSettings,
    /// The control plane's admin API (`[admin]`: address, token).
    #[serde(default)]
    pub admin: crate::subscriptions::admin::AdminSettings,
    /// The binlog source (`[cdc]`, `orderpipe cdc`).
    pub cdc: crate::cdc::CdcSettings,
    /// The operator console (`[console]`, `orderpipe console`).
    #[serde(default)]
    pub console: console::ConsoleSettings,
}

/// Why a build without the `harness` feature refuses `[chaos]`.
#[cfg(not(feature = "harness"))]
const NO_CHAOS: &str = "chaos: fault injection (the `chaos` handler) exists only in a build with the cargo feature \
    `harness` (make run, make test); this build has no chaos handler: remove the [chaos] section from the config \
    file and unset the ORDERPIPE_CHAOS__* variables";

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
const SECRET_FIELDS: [&str; 8] = [
    "kafka.sasl_password",
    "registry.password",
    "database.url",
    "admin.token",
    "cdc.source",
    "cdc.hash_key",
    "console.viewer_token",
    "console.operator_token",
];

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
    pub fn load_with(
        file: Option<&Path>,
        overrides: &serde_json::Value,
    ) -> Result<Self, ConfigError> {
        let foreign = env::foreign_variables();
        if !foreign.is_empty() {
            tracing::debug!(variables = ?foreign, "ORDERPIPE_* variables that name no setting (service links, other tools' knobs): ignored");
        }
        let settings: Settings = Self::layers(file, overrides)?
            .extract()
            .map_err(|e| ConfigError(env::explain(e)))?;
        settings.validate()?;
        Ok(settings)
    }

    /// The configuration these layers make, as a document `--config` accepts
    /// back (TOML or JSON), with every secret replaced by [`REDACTED`]: the
    /// password of `database.url`, `kafka.sasl_password`,
    /// `registry.password`, and librdkafka options named like a password
    /// or secret.
    pub fn redacted_document(
        file: Option<&Path>,
        overrides: &serde_json::Value,
    ) -> Result<serde_json::Value, ConfigError> {
        Self::load_with(file, overrides)?;
        let mut document: serde_json::Value = Self::layers(file, overrides)?
            .extract()
            .map_err(|e| ConfigError(env::explain(e)))?;
        for path in SECRET_FIELDS {
            let Some(value) = document.pointer_mut(&format!("/{}", path.replace('.', "/"))) else {
                continue;
            };
            let redacted = match value.as_str() {
                Some(url) if path == "database.url" || path == "cdc.source" => {
                    redact_url_password(url)
                }
                _ => REDACTED.to_string(),
            };
            *value = redacted.into();
        }
        for path in OPTION_TABLES {
            if let Some(serde_json::Value::Object(options)) =
                document.pointer_mut(&format!("/{}", path.replace('.', "/")))
            {
                for (_, value) in options
                    .iter_mut()
                    .filter(|(name, _)| is_secret_option(name))
                {
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
                return Err(ConfigError(format!(
                    "config file {} not found",
                    path.display()
                )));
            }
            // JSON too: the Helm chart renders its values as JSON, which keeps
            // integers integers (Helm's toToml writes every number as a float).
            Some(path) if path.extension().is_some_and(|e| e == "json") => {
                figment = figment.merge(Json::file(path))
            }
            Some(path) => figment = figment.merge(Toml::file(path)),
            None if default_file.exists() => figment = figment.merge(Toml::file(default_file)),
            None => {}
        }
        Ok(figment
            .merge(env::provider())
            .merge(Serialized::defaults(overrides)))
    }

    /// Secret values with their field names (see [`SECRET_FIELDS`]).
    fn secrets(&self) -> Vec<(String, &str)> {
        let mut secrets = Vec::new();
        for path in SECRET_FIELDS {
            let value = match path {
                "kafka.sasl_password" => self.kafka.sasl_password.as_ref(),
                "registry.password" => self.registry.password.as_ref(),
                "admin.token" => self.admin.token.as_ref(),
                "cdc.source" => self.cdc.source.as_ref(),
                "cdc.hash_key" => self.cdc.hash_key.as_ref(),
                "console.viewer_token" => self.console.viewer_token.as_ref(),
                "console.operator_token" => self.console.operator_token.as_ref(),
                _ => Some(&self.database.url),
            };
            if let Some(value) = value {
                secrets.push((path.to_string(), value.expose_secret()));
            }
        }
        for (path, options) in OPTION_TABLES.into_iter().zip([
            &self.kafka.options,
            &self.producer.options,
            &self.consumer.options,
        ]) {
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
                    false => format!(
                        " or with ORDERPIPE_{}",
                        field.replace('.', "__").to_uppercase()
                    ),
                };
                return Err(ConfigError(format!(
                    "{field} holds {REDACTED}, the placeholder `orderpipe config` prints instead of a secret: \
                     set the real value in the config file{env}"
                )));
            }
        }
        self.kafka.validate().map_err(ConfigError)?;
        self.consumer.validate(&self.kafka).map_err(ConfigError)?;
        self.topics.validate_layout().map_err(ConfigError)?;
        self.retry
            .validate()
            .map_err(|e| ConfigError(e.to_string()))?;
        #[cfg(not(feature = "harness"))]
        if self.chaos.is_some() {
            return Err(ConfigError(NO_CHAOS.into()));
        }
        self.http.validate().map_err(ConfigError)?;
        self.http.validate_retry(&self.retry).map_err(ConfigError)?;
        self.lag.validate().map_err(ConfigError)?;
        self.dlq.validate().map_err(ConfigError)?;
        self.topics.validate_retention().map_err(ConfigError)?;
        self.database.validate().map_err(ConfigError)?;
        self.outbox.validate().map_err(ConfigError)?;
        self.admin.validate().map_err(ConfigError)?;
        self.cdc.validate().map_err(ConfigError)?;
        self.console.validate().map_err(ConfigError)?;
        Ok(())
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
// figment::Jail's closures return figment::Error, whose size is figment's choice.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use secrecy::SecretString;

    const DAY_MS: i64 = 24 * 60 * 60 * 1000;

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
            assert_eq!(
                s.topics.name_for_schema("order.events.v1"),
                "t1.order.events.v1"
            );
            Ok(())
        });
    }

    #[cfg(not(feature = "harness"))]
    #[test]
    fn a_chaos_section_is_refused_without_the_harness() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[chaos]\npermanent_all = true\n").unwrap();
        figment::Jail::expect_with(|_| {
            let err = Settings::load(Some(&path)).unwrap_err().to_string();
            assert!(
                err.contains("chaos: fault injection") && err.contains("cargo feature `harness`"),
                "{err}"
            );
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
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("retention_ms")
        );
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
            assert!(
                err.contains(&format!("topics.{key}.retention_ms must be >= 30 days")),
                "{err}"
            );
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
             [database]\nurl = \"mysql://app:dbpass@db:3306/orders\"\n[cdc]\nhash_key = \"hashkey1\"\n",
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
        for secret in ["hunter2", "keypass", "dbpass", "hashkey1"] {
            assert!(!text.contains(secret), "{secret} printed: {text}");
        }
        assert_eq!(
            document["database"]["url"],
            "mysql://app:__REDACTED__@db:3306/orders"
        );
        assert_eq!(
            document["kafka"]["options"]["security.protocol"],
            "SASL_SSL"
        );

        std::fs::write(path, toml::to_string(&document).unwrap()).unwrap();
        let err = Settings::load(Some(path)).unwrap_err().to_string();
        assert!(
            err.contains("__REDACTED__") && err.contains("ORDERPIPE_"),
            "{err}"
        );
        assert_eq!(redact_url_password("sqlite::memory:"), "sqlite::memory:");
        assert_eq!(
            redact_url_password("mysql://app@db/orders"),
            "mysql://app@db/orders"
        );
    }
}
