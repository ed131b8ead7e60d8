//! Which `ORDERPIPE_*` environment variables are settings.
//!
//! A pod's environment holds more than orderpipe's settings: the kubelet
//! injects service-link variables for every Service of the namespace
//! (`ORDERPIPE_API_PORT=tcp://10.0.0.1:8080` for a Service `orderpipe-api`),
//! and `dev/stack.sh` reads knobs of its own (`ORDERPIPE_STACK_DIR`). Such a
//! variable must not crash-loop the process as an unknown setting.
//!
//! So a variable is a setting only when it names a top-level key of
//! [`Settings`] (`ORDERPIPE_KAFKA`) or a key inside a section, with `__`
//! (`ORDERPIPE_CONSUMER__BATCH_SIZE`). Every other `ORDERPIPE_*` variable is
//! foreign: ignored, and listed in one debug line. A misspelled key inside
//! a section is still refused, naming the field and its near matches
//! ([`explain`]).

use figment::providers::Env;
use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::Settings;

/// The prefix of every setting's variable.
pub(crate) const PREFIX: &str = "ORDERPIPE_";

/// The `ORDERPIPE_*` variables that are settings, as figment's provider
/// (`__` separates nested keys; `ORDERPIPE_CONFIG` names the file, it is
/// not a setting).
pub(crate) fn provider() -> Env {
    Env::prefixed(PREFIX)
        .split("__")
        .ignore(&["config"])
        .filter(|key| is_setting(key.as_str()))
}

/// The `ORDERPIPE_*` variables of this process that are not settings
/// (service links, other tools' knobs), sorted.
pub(crate) fn foreign_variables() -> Vec<String> {
    let mut foreign: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.strip_prefix(PREFIX).is_some_and(|key| {
                !key.eq_ignore_ascii_case("config")
                    && !is_setting(&key.replace("__", ".").to_lowercase())
            })
        })
        .collect();
    foreign.sort();
    foreign
}

/// Whether `key` (prefix stripped, lower case, `__` already turned into
/// `.`) is a setting: a top-level key of [`Settings`], or a dotted path.
fn is_setting(key: &str) -> bool {
    key.contains('.') || top_level_keys().iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// The top-level keys of [`Settings`], as serde sees them (its field list,
/// so a new section needs no second list here).
fn top_level_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let mut fields: &'static [&'static str] = &[];
        let _ = Settings::deserialize(FieldNames(&mut fields));
        fields
    })
}

/// A deserializer that only records the field names of the struct asked
/// of it, then stops (the error is expected and dropped).
struct FieldNames<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names read")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        *self.0 = fields;
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// figment's error, with the near matches of an unknown field
/// (`batchsize`: did you mean `batch_size`?).
pub(crate) fn explain(error: figment::Error) -> String {
    let hint = match &error.kind {
        figment::error::Kind::UnknownField(found, expected) => {
            let mut near: Vec<(f64, &str)> = expected
                .iter()
                .map(|e| (strsim::jaro_winkler(&found.to_lowercase(), e), *e))
                .filter(|(score, _)| *score >= 0.8)
                .collect();
            near.sort_by(|a, b| b.0.total_cmp(&a.0));
            match near.as_slice() {
                [] => String::new(),
                near => format!(
                    "; did you mean {}?",
                    near.iter()
                        .take(3)
                        .map(|(_, e)| format!("`{e}`"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            }
        }
        _ => String::new(),
    };
    format!("{error}{hint}")
}

#[cfg(test)]
// figment::Jail's closures return figment::Error, whose size is figment's choice.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn the_top_level_keys_are_the_sections_of_settings() {
        let keys = top_level_keys();
        for section in [
            "kafka", "consumer", "database", "cdc", "console", "chaos", "lag",
        ] {
            assert!(keys.contains(&section), "{section} in {keys:?}");
        }
    }

    #[test]
    fn service_links_and_tool_knobs_are_foreign_sections_and_known_keys_are_settings() {
        for foreign in [
            "api_port",
            "api_port_8080_tcp_addr",
            "metrics_service_host",
            "stack_dir",
            "kafka_port",
        ] {
            assert!(!is_setting(foreign), "{foreign}");
        }
        for setting in [
            "kafka",
            "consumer.batch_size",
            "consumer.batchsize",
            "topics.order_events.name",
        ] {
            assert!(is_setting(setting), "{setting}");
        }
    }

    #[test]
    fn a_kubelet_environment_loads_and_a_misspelled_setting_names_its_near_match() {
        figment::Jail::expect_with(|jail| {
            // What the kubelet injects for a Service `orderpipe-api` (docker-link style variables).
            jail.set_env("ORDERPIPE_API_SERVICE_HOST", "10.0.0.1");
            jail.set_env("ORDERPIPE_API_SERVICE_PORT", "8080");
            jail.set_env("ORDERPIPE_API_PORT", "tcp://10.0.0.1:8080");
            jail.set_env("ORDERPIPE_API_PORT_8080_TCP", "tcp://10.0.0.1:8080");
            jail.set_env("ORDERPIPE_API_PORT_8080_TCP_PROTO", "tcp");
            jail.set_env("ORDERPIPE_CONSUMER__BATCH_SIZE", "7");
            let settings = Settings::load(None).map_err(|e| e.to_string())?;
            assert_eq!(
                settings.consumer.batch_size, 7,
                "a real setting beside the links is read"
            );
            let foreign = foreign_variables();
            assert!(
                foreign.contains(&"ORDERPIPE_API_PORT".to_string()),
                "{foreign:?}"
            );
            assert!(!foreign.iter().any(|v| v.contains("__")), "{foreign:?}");

            jail.set_env("ORDERPIPE_CONSUMER__BATCHSIZE", "7");
            let e = Settings::load(None).unwrap_err().to_string();
            assert!(
                e.contains("batchsize") && e.contains("did you mean `batch_size`"),
                "{e}"
            );
            Ok(())
        });
    }
}
