//! The control plane's records as the store returns them, the inputs that
//! create and change them, and the checks on those inputs (each error
//! names the field and the accepted values).
//!
//! The inputs (`New*`, `*Patch`) are the admin API's JSON bodies: a missing
//! `Option` field is `None` (serde's rule for `Option`), every field of a
//! patch may be missing (`#[serde(default)]` on the struct), and an unknown
//! field is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Invalid;
use super::filter::{FilterSpec, PropertyFilter};
use crate::delivery::SuccessRule;
use crate::masking::ColumnRules;
use crate::retry::RetryLayer;

/// A name: lower case letters, digits, `-` and `_`, starting with a letter
/// or digit, at most 64 characters. Consumer names and bind keys are such
/// names because they make the consumer group's name ([`group_name`]).
pub const NAME_FORM: &str =
    "1 to 64 of a-z, 0-9, - and _, starting with a letter or digit (e.g. sms, table_user)";

/// The HTTP methods a downstream consumer may take.
pub const METHODS: &str = "POST, PUT";

/// Checks a [`NAME_FORM`] name.
pub fn check_name(field: &str, value: &str) -> Result<(), Invalid> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            field,
            format!("`{value}` is not a name: {NAME_FORM}"),
        ))
    }
}

/// The consumer group serving the subscriptions of `consumer` with
/// `bind_key`: `<consumer>.<bind_key>.consumer`, the house pattern
/// ([`crate::consumer::naming`]) and seed 003's `cdc_{consumer}_{bind_key}` queue.
pub fn group_name(consumer: &str, bind_key: &str) -> String {
    format!("{consumer}.{bind_key}.consumer")
}

/// The operations of a change event, the last part of a CDC routing key
/// (`read`: a row of an incremental snapshot, delivered only where subscribed).
pub const CDC_OPERATIONS: [&str; 4] = ["insert", "update", "delete", "read"];

/// Checks a routing key: dot-separated parts of letters, digits, `_`, `-`
/// and `$`, at least two parts, at most 128 characters.
pub fn check_routing_key(field: &str, key: &str) -> Result<(), Invalid> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'$'))
    };
    if key.len() <= 128 && key.split('.').count() >= 2 && key.split('.').all(part_ok) {
        return Ok(());
    }
    Err(Invalid::new(
        field,
        format!(
            "`{key}` is not a routing key: `<db>.<table>.<insert|update|delete>` (order_db.table_user.insert) \
             or an event name (order.created); parts of letters, digits, _ - $, at most 128 characters"
        ),
    ))
}

/// The topic an event is read from when none is given: `cdc.<db>.<table>`
/// for a CDC routing key `<db>.<table>.<insert|update|delete>` (what
/// `orderpipe cdc` writes), otherwise the order topic `order_topic`.
pub fn default_topic(routing_key: &str, order_topic: &str) -> String {
    match cdc_table(routing_key) {
        Some(table) => format!("cdc.{table}"),
        None => order_topic.to_string(),
    }
}

/// The table `<db>.<table>` of a CDC routing key
/// `<db>.<table>.<insert|update|delete>`; `None` for an order event name.
pub fn cdc_table(routing_key: &str) -> Option<&str> {
    let (table, op) = routing_key.rsplit_once('.')?;
    (crate::table_name::is_db_table(table) && CDC_OPERATIONS.contains(&op)).then_some(table)
}

/// A binlog source (seed 003's `maxwell_instance`); its password lives in
/// the cdc process's configuration, never here.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    /// Row id.
    pub id: i64,
    /// Unique name, e.g. `order_db`.
    pub name: String,
    /// MySQL/MariaDB host.
    pub db_host: String,
    /// Its port.
    pub db_port: i32,
    /// The replication user.
    pub db_user: String,
    /// Off: the cdc process skips it.
    pub enabled: bool,
    /// Free text.
    pub description: String,
    /// Per table, the columns cdc drops, hashes or masks (beside `[cdc.redact]`).
    pub redact: BTreeMap<String, ColumnRules>,
    /// Created (ms since the epoch).
    pub created_ms: i64,
    /// Last changed (ms since the epoch).
    pub updated_ms: i64,
}

/// An event a subscription can name (seed 003's `event`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventDefinition {
    /// Row id.
    pub id: i64,
    /// `<db>.<table>.<insert|update|delete>` or an order event name; the
    /// envelope's `event_name`.
    pub routing_key: String,
    /// The topic its records are in.
    pub topic: String,
    /// The source's name, if it comes from one.
    pub source: Option<String>,
    /// Free text, e.g. "user table insert".
    pub description: String,
    /// The columns cdc drops, hashes or masks in its table's rows (a CDC
    /// routing key's table only; every definition of a table the same).
    pub redact: ColumnRules,
    /// Created (ms since the epoch).
    pub created_ms: i64,
    /// Last changed (ms since the epoch).
    pub updated_ms: i64,
}

/// A downstream HTTP service (seed 003's `consumer`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Consumer {
    /// Row id.
    pub id: i64,
    /// Unique [`NAME_FORM`] name; part of its groups' names, so it never changes.
    pub name: String,
    /// `POST` or `PUT`.
    pub method: String,
    /// Where changes are delivered.
    pub url: String,
    /// Per-request timeout.
    pub timeout_ms: i64,
    /// The retry schedule over the group's `[retry]` layers (None: those decide).
    pub retry: Option<RetryLayer>,
    /// `channel_id` of the seed-003 body.
    pub channel_id: String,
    /// Which answers are deliveries.
    pub success: SuccessRule,
    /// Off: none of its subscriptions is served.
    pub enabled: bool,
    /// Free text.
    pub description: String,
    /// Created (ms since the epoch).
    pub created_ms: i64,
    /// Last changed (ms since the epoch).
    pub updated_ms: i64,
}

/// A subscription: event -> consumer, with its bind key and filters (seed
/// 003's `sub_event` with its `event_property_setting`s).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Subscription {
    /// Row id.
    pub id: i64,
    /// The event's routing key.
    pub event: String,
    /// The event's topic.
    pub topic: String,
    /// The consumer's name.
    pub consumer: String,
    /// Subscriptions of one consumer with one bind key share a consumer group.
    pub bind_key: String,
    /// The group that serves it ([`group_name`]).
    pub group: String,
    /// Off: not served (its group stops when no enabled subscription is left).
    pub enabled: bool,
    /// All must hold for a change to be delivered.
    pub filters: Vec<PropertyFilter>,
    /// Free text.
    pub description: String,
    /// Created (ms since the epoch).
    pub created_ms: i64,
    /// Last changed (ms since the epoch).
    pub updated_ms: i64,
}

/// A new source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSource {
    /// [`NAME_FORM`].
    pub name: String,
    /// Host.
    pub db_host: String,
    /// Port (default 3306).
    pub db_port: Option<i32>,
    /// Replication user.
    pub db_user: String,
    /// Default true.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
    /// Per table, the columns cdc drops, hashes or masks; default none.
    #[serde(default)]
    pub redact: Option<BTreeMap<String, ColumnRules>>,
}

/// Changes to a source; unset fields stay.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourcePatch {
    /// Host.
    pub db_host: Option<String>,
    /// Port.
    pub db_port: Option<i32>,
    /// Replication user.
    pub db_user: Option<String>,
    /// Enabled.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
    /// The whole set of column rules (`{}`: none).
    pub redact: Option<BTreeMap<String, ColumnRules>>,
}

/// A new event definition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    /// See [`check_routing_key`].
    pub routing_key: String,
    /// Default: [`default_topic`].
    pub topic: Option<String>,
    /// A source's name.
    pub source: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// The columns cdc drops, hashes or masks in its table's rows; default none.
    #[serde(default)]
    pub redact: Option<ColumnRules>,
}

/// Changes to an event definition; unset fields stay.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventPatch {
    /// The topic.
    pub topic: Option<String>,
    /// A source's name; `""` detaches it.
    pub source: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// The whole set of column rules (`{}`: none).
    pub redact: Option<ColumnRules>,
}

/// A new downstream consumer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewConsumer {
    /// [`NAME_FORM`].
    pub name: String,
    /// http(s) URL.
    pub url: String,
    /// [`METHODS`] (default POST).
    pub method: Option<String>,
    /// Default 5000.
    pub timeout_ms: Option<i64>,
    /// Retry schedule ([`RetryLayer`]: `{"delays": ["5s","30s","5m"]}`, `{"profile": "5s-30s-5m"}`).
    pub retry: Option<RetryLayer>,
    /// Default `orderpipe`.
    pub channel_id: Option<String>,
    /// Which answers are deliveries (default `2xx`).
    pub success: Option<SuccessRule>,
    /// Default true.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
}

/// Changes to a consumer; unset fields stay (the name never changes).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerPatch {
    /// http(s) URL.
    pub url: Option<String>,
    /// [`METHODS`].
    pub method: Option<String>,
    /// Per-request timeout.
    pub timeout_ms: Option<i64>,
    /// A new retry schedule.
    pub retry: Option<RetryLayer>,
    /// True: drop the retry schedule (the group's `[retry]` layers decide).
    pub clear_retry: bool,
    /// `channel_id`.
    pub channel_id: Option<String>,
    /// Which answers are deliveries.
    pub success: Option<SuccessRule>,
    /// Enabled.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
}

/// A new subscription. The event definition is created (with its
/// [`default_topic`]) when none has this routing key; the consumer must exist.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    /// Routing key of the event.
    pub event: String,
    /// Consumer name.
    pub consumer: String,
    /// [`NAME_FORM`]; chosen by the operator, as seed 003 advises.
    pub bind_key: String,
    /// Conditions, all of which must hold.
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
    /// Default true.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
}

/// Changes to a subscription; unset fields stay. `filters` replaces them all.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubscriptionPatch {
    /// A new bind key (moves it to another group, which starts from that group's offsets).
    pub bind_key: Option<String>,
    /// The new filters (`[]` removes them all).
    pub filters: Option<Vec<FilterSpec>>,
    /// Enabled.
    pub enabled: Option<bool>,
    /// Free text.
    pub description: Option<String>,
}

/// Checks a URL and a method of a consumer.
pub fn check_endpoint(url: Option<&str>, method: Option<&str>) -> Result<(), Invalid> {
    if let Some(url) = url {
        let parsed = url::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        if parsed.is_none() || url.len() > 512 {
            return Err(Invalid::new(
                "url",
                format!("`{url}` is not an http(s) URL of at most 512 characters"),
            ));
        }
    }
    if let Some(method) = method
        && !METHODS.split(", ").any(|m| m == method)
    {
        return Err(Invalid::new(
            "method",
            format!("`{method}` is not one of {METHODS}"),
        ));
    }
    Ok(())
}

/// Checks a timeout: 1 ms to 10 minutes.
pub fn check_timeout(timeout_ms: Option<i64>) -> Result<(), Invalid> {
    match timeout_ms {
        Some(t) if !(1..=600_000).contains(&t) => Err(Invalid::new(
            "timeout_ms",
            format!("{t} is outside 1 to 600000 (ms)"),
        )),
        _ => Ok(()),
    }
}

/// Checks a retry layer on its own (delay syntax, profile names, ranges).
pub fn check_retry(retry: Option<&RetryLayer>) -> Result<(), Invalid> {
    match retry {
        Some(layer) => layer.check("retry").map_err(|e| {
            let text = e.to_string();
            match text.split_once(": ") {
                Some((field, reason)) => Invalid::new(field, reason),
                None => Invalid::new("retry", text),
            }
        }),
        None => Ok(()),
    }
}

/// Checks free text against its column.
pub fn check_text(field: &str, value: Option<&str>, max_chars: usize) -> Result<(), Invalid> {
    match value {
        Some(v) if v.chars().count() > max_chars => Err(Invalid::new(
            field,
            format!("{} characters; at most {max_chars}", v.chars().count()),
        )),
        _ => Ok(()),
    }
}

/// Checks every filter spec, naming each by its index (`filters[0].op`).
pub fn check_filters(specs: &[FilterSpec]) -> Result<Vec<PropertyFilter>, Invalid> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.check(&format!("filters[{i}]")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_routing_keys_and_topics() {
        check_name("name", "sms").unwrap();
        check_name("bind_key", "table_user").unwrap();
        for bad in ["", "SMS", "-x", "a.b", "a b", &"x".repeat(65)] {
            let err = check_name("bind_key", bad).unwrap_err();
            assert_eq!(err.field, "bind_key");
            assert!(err.reason.contains(NAME_FORM), "{bad}: {err}");
        }
        assert_eq!(group_name("sms", "user"), "sms.user.consumer");
        crate::consumer::naming::check(&group_name("sms", "table_user")).unwrap();
        check_routing_key("event", "order_db.table_user.insert").unwrap();
        check_routing_key("event", "order.created").unwrap();
        for bad in ["order", "a..b", "a.b c", ""] {
            assert!(
                check_routing_key("event", bad)
                    .unwrap_err()
                    .reason
                    .contains("<db>.<table>.<insert|update|delete>")
            );
        }
        assert_eq!(
            default_topic("order_db.table_user.insert", "order.events.v1"),
            "cdc.order_db.table_user"
        );
        assert_eq!(
            cdc_table("order_db.table_user.update"),
            Some("order_db.table_user")
        );
        for not_cdc in ["order.created", "a.b.c.insert", "a.b.upsert", ".b.insert"] {
            assert_eq!(cdc_table(not_cdc), None, "{not_cdc}");
        }
        assert_eq!(
            default_topic("order.payment.succeeded", "order.events.v1"),
            "order.events.v1"
        );
    }

    /// The bodies' rules: optional fields may be missing, required ones may
    /// not, unknown ones are refused.
    #[test]
    fn inputs_take_missing_options_and_refuse_unknown_fields() {
        use serde_json::json;
        let patch: ConsumerPatch = serde_json::from_value(json!({})).unwrap();
        assert!(patch.url.is_none() && patch.retry.is_none() && !patch.clear_retry);
        let patch: SubscriptionPatch = serde_json::from_value(json!({"enabled": false})).unwrap();
        assert_eq!((patch.enabled, patch.filters), (Some(false), None));
        let new: NewSubscription =
            serde_json::from_value(json!({"event": "a.b", "consumer": "c", "bind_key": "k"}))
                .unwrap();
        assert!(new.filters.is_empty() && new.enabled.is_none() && new.description.is_none());
        let new: NewSource =
            serde_json::from_value(json!({"name": "s", "db_host": "h", "db_user": "u"})).unwrap();
        assert!(new.db_port.is_none() && new.enabled.is_none());
        let missing = serde_json::from_value::<NewConsumer>(json!({"url": "http://x"}));
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("missing field `name`")
        );
        let unknown = serde_json::from_value::<EventPatch>(json!({"topc": "t"}));
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `topc`")
        );
    }

    #[test]
    fn endpoints_timeouts_and_retries_name_the_field() {
        check_endpoint(Some("http://sms.internal/send"), Some("POST")).unwrap();
        let err = check_endpoint(Some("ftp://x"), None).unwrap_err();
        assert_eq!(err.field, "url");
        let err = check_endpoint(None, Some("GET")).unwrap_err();
        assert_eq!(err.to_string(), "method: `GET` is not one of POST, PUT");
        assert_eq!(check_timeout(Some(0)).unwrap_err().field, "timeout_ms");
        let layer: RetryLayer =
            serde_json::from_value(serde_json::json!({"delays": ["1 minute"]})).unwrap();
        let err = check_retry(Some(&layer)).unwrap_err();
        assert_eq!(err.field, "retry.delays[0]");
        assert!(err.reason.contains("accepted forms"), "{err}");
        let layer: RetryLayer =
            serde_json::from_value(serde_json::json!({"profile": "nope"})).unwrap();
        let err = check_retry(Some(&layer)).unwrap_err();
        assert!(
            err.field.starts_with("retry.profile")
                && err
                    .reason
                    .contains("5s-30s-5m (older names: seed000, seed001, seed003)"),
            "{err}"
        );
    }
}
