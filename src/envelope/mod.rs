//! The event envelope of the house message spec (seed 000) and its payloads.
//!
//! Every record on `order.events.v1` carries one [`Envelope`]: the metadata
//! (`event_id`, `event_name`, `event_version`, `event_time`, `producer`,
//! `trace_id`) and a typed [`EventData`] payload chosen by `event_name`.
//!
//! * [`name`] validates event names (`{domain}.{resource}.{action}`).
//! * [`data`] holds the payload structs (money in integer cents, times ISO 8601 UTC).
//! * this module ties them together and validates a whole envelope, whether it
//!   came from JSON (NDJSON input, the API) or from Avro (the codec).

pub mod data;
pub mod name;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use data::{
    EventData, InventoryStockReleased, InventoryStockReserved, OrderCanceled, OrderCreated,
    OrderPaymentSucceeded, OrderRefunded, OrderShipped, RowChange,
};
pub use name::{EventKind, EventName};

/// Version written into `event_version` for the payloads in [`data`].
pub const CURRENT_EVENT_VERSION: &str = "1.0";

/// Why an envelope was refused. The message always names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// A field is absent or has the wrong type.
    #[error("field `{field}`: {reason}")]
    Field {
        /// Dotted path of the field, e.g. `data.amount`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The event name breaks the naming rules.
    #[error("field `event_name`: {0}")]
    Name(#[from] name::EventNameError),
}

impl EnvelopeError {
    /// Shorthand for a [`EnvelopeError::Field`] error.
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// One order-domain event, validated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// Unique id of the event; consumers deduplicate on it.
    pub event_id: Uuid,
    /// `{domain}.{resource}.{action}`; always agrees with `data`.
    pub event_name: EventName,
    /// Schema version of `data`.
    pub event_version: String,
    /// When the event happened (UTC).
    #[serde(serialize_with = "serialize_utc")]
    pub event_time: DateTime<Utc>,
    /// Name of the producing service.
    pub producer: String,
    /// W3C trace id (32 lower-case hex digits).
    pub trace_id: String,
    /// The business payload.
    pub data: EventData,
}

/// The wire shape of an envelope before validation (JSON input).
#[derive(Debug, Deserialize)]
struct RawEnvelope {
    event_id: Option<String>,
    event_name: Option<String>,
    event_version: Option<String>,
    event_time: Option<String>,
    producer: Option<String>,
    trace_id: Option<String>,
    data: Option<serde_json::Value>,
}

impl Envelope {
    /// A new event with a fresh `event_id` and `trace_id`, stamped now.
    pub fn new(producer: &str, data: EventData) -> Self {
        Self::new_at(producer, data, Utc::now())
    }

    /// Like [`Envelope::new`] but with an explicit event time (kept to the
    /// millisecond, the precision of the wire format).
    pub fn new_at(producer: &str, data: EventData, event_time: DateTime<Utc>) -> Self {
        let event_time = event_time.trunc_subsecs(3);
        Self {
            event_id: time_ordered_id(event_time),
            event_name: data.event_name(),
            event_version: CURRENT_EVENT_VERSION.to_string(),
            event_time,
            producer: producer.to_string(),
            trace_id: new_trace_id(),
            data,
        }
    }

    /// The Kafka key: the order id, so one order's events share a partition
    /// (a row change's: its primary key).
    pub fn key(&self) -> String {
        match &self.data {
            EventData::RowChange(c) => c.key.clone(),
            data => data.order_id().to_string(),
        }
    }

    /// `event_time` in the canonical ISO 8601 UTC form (`2026-10-14T08:30:00.123Z`).
    pub fn event_time_iso(&self) -> String {
        format_utc(&self.event_time)
    }

    /// W3C `traceparent` header value for this event: the envelope's trace id
    /// and a span id derived from the event id (stable across re-sends).
    pub fn traceparent(&self) -> String {
        let span = &self.event_id.simple().to_string()[..16];
        format!("00-{}-{}-01", self.trace_id, span)
    }

    /// Parses and validates one JSON envelope (an NDJSON line, an API body).
    pub fn from_json(text: &str) -> Result<Self, EnvelopeError> {
        let raw: RawEnvelope = serde_json::from_str(text)
            .map_err(|e| EnvelopeError::field("<json>", e.to_string()))?;
        let data = required(raw.data, "data")?;
        let parts = EnvelopeParts {
            event_id: required(raw.event_id, "event_id")?,
            event_name: required(raw.event_name, "event_name")?,
            event_version: required(raw.event_version, "event_version")?,
            event_time: required(raw.event_time, "event_time")?,
            producer: required(raw.producer, "producer")?,
            trace_id: required(raw.trace_id, "trace_id")?,
        };
        parts.build(|name| EventData::from_json(name, data))
    }

    /// Checks every rule of the message spec on an already-built envelope.
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        if self.event_name.kind() != EventKind::Event {
            return Err(EnvelopeError::field(
                "event_name",
                format!(
                    "`{}` is a command (verb); order events must be past tense",
                    self.event_name
                ),
            ));
        }
        if self.data.event_name() != self.event_name {
            return Err(EnvelopeError::field(
                "data",
                format!(
                    "payload is `{}` but event_name is `{}`",
                    self.data.event_name(),
                    self.event_name
                ),
            ));
        }
        non_empty(&self.event_version, "event_version")?;
        non_empty(&self.producer, "producer")?;
        check_trace_id(&self.trace_id)?;
        self.data.validate()
    }
}

/// The string fields of an envelope as they arrive, before validation. Both
/// decoders (JSON and Avro) fill this and call [`EnvelopeParts::build`], so the
/// rules live in one place.
#[derive(Debug, Clone)]
pub struct EnvelopeParts {
    /// Raw `event_id`.
    pub event_id: String,
    /// Raw `event_name`.
    pub event_name: String,
    /// Raw `event_version`.
    pub event_version: String,
    /// Raw `event_time`.
    pub event_time: String,
    /// Raw `producer`.
    pub producer: String,
    /// Raw `trace_id`.
    pub trace_id: String,
}

impl EnvelopeParts {
    /// Validates the parts and builds the envelope; `data` decodes the payload
    /// once the event name is known to be valid.
    pub fn build(
        self,
        data: impl FnOnce(&EventName) -> Result<EventData, EnvelopeError>,
    ) -> Result<Envelope, EnvelopeError> {
        let event_id = Uuid::parse_str(&self.event_id)
            .map_err(|e| EnvelopeError::field("event_id", format!("not a UUID: {e}")))?;
        let event_name = EventName::parse(&self.event_name)?;
        let event_time = parse_utc(&self.event_time, "event_time")?;
        let data = data(&event_name)?;
        let envelope = Envelope {
            event_id,
            event_name,
            event_version: self.event_version,
            event_time,
            producer: self.producer,
            trace_id: self.trace_id,
            data,
        };
        envelope.validate()?;
        Ok(envelope)
    }
}

fn required<T>(value: Option<T>, field: &str) -> Result<T, EnvelopeError> {
    value.ok_or_else(|| EnvelopeError::field(field, "missing required field"))
}

pub(crate) fn non_empty(value: &str, field: &str) -> Result<(), EnvelopeError> {
    if value.trim().is_empty() {
        return Err(EnvelopeError::field(field, "must not be empty"));
    }
    Ok(())
}

fn check_trace_id(trace_id: &str) -> Result<(), EnvelopeError> {
    let hex = trace_id.len() == 32
        && trace_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex || trace_id.bytes().all(|b| b == b'0') {
        return Err(EnvelopeError::field(
            "trace_id",
            "must be a W3C trace id: 32 lower-case hex digits, not all zero",
        ));
    }
    Ok(())
}

/// A fresh random W3C trace id.
pub fn new_trace_id() -> String {
    // rand's thread-local CSPRNG: uuid's own generator makes a getrandom
    // syscall per id (measured here: ~550 ns for an event's two ids, ~70 ns
    // from rand; ~10% of `orderpipe produce`'s CPU).
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
}

/// Parses an ISO 8601 timestamp that must be in UTC (`Z` or `+00:00`).
pub fn parse_utc(text: &str, field: &str) -> Result<DateTime<Utc>, EnvelopeError> {
    let parsed = DateTime::parse_from_rfc3339(text).map_err(|e| {
        EnvelopeError::field(
            field,
            format!(
                "`{text}` is not an ISO 8601 timestamp ({e}); expected e.g. 2026-10-14T08:30:00Z"
            ),
        )
    })?;
    if parsed.offset().local_minus_utc() != 0 {
        return Err(EnvelopeError::field(
            field,
            format!("`{text}` is not UTC; times are ISO 8601 UTC (suffix Z)"),
        ));
    }
    Ok(parsed.with_timezone(&Utc))
}

/// Formats a UTC time as ISO 8601 with millisecond precision and a `Z`.
pub fn format_utc(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn serialize_utc<S: serde::Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_utc(time))
}

/// A new event id: a UUID v7, whose leading 48 bits are `at` in
/// milliseconds, so ids of later events sort later and `event_dedup` and the
/// handlers' event-id indexes grow at their right end instead of at random
/// pages (74 random bits keep ids unique).
pub fn time_ordered_id(at: DateTime<Utc>) -> Uuid {
    let ms = at.timestamp_millis().max(0) as u64;
    // As `Uuid::new_v7` without a counter, the random bits from rand's
    // thread-local CSPRNG (see `new_trace_id`).
    uuid::Builder::from_unix_timestamp_millis(ms, &rand::random()).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_event_ids_are_v7_and_sort_by_event_time() {
        let at = Utc::now();
        let first = Envelope::new_at("p", EventData::sample_created(1), at);
        let later = Envelope::new_at(
            "p",
            EventData::sample_created(1),
            at + chrono::Duration::milliseconds(2),
        );
        assert_eq!(first.event_id.get_version_num(), 7);
        assert!(first.event_id < later.event_id);
        let (secs, nanos) = first.event_id.get_timestamp().unwrap().to_unix();
        assert_eq!(
            secs as i64 * 1000 + i64::from(nanos / 1_000_000),
            at.timestamp_millis()
        );
        // Unique within one millisecond.
        assert_ne!(
            Envelope::new_at("p", EventData::sample_created(1), at).event_id,
            first.event_id
        );
        assert_eq!(first.event_id.get_variant(), uuid::Variant::RFC4122);
        // Trace ids: random (v4 bits), 32 lower-case hex digits, valid.
        let trace = Uuid::parse_str(&first.trace_id).unwrap();
        assert_eq!(
            (trace.get_version_num(), trace.get_variant()),
            (4, uuid::Variant::RFC4122)
        );
        assert_ne!(first.trace_id, later.trace_id);
        check_trace_id(&first.trace_id).unwrap();
    }

    fn created_json(amount: i64) -> String {
        format!(
            r#"{{"event_id":"550e8400-e29b-41d4-a716-446655440000","event_name":"order.created",
            "event_version":"1.0","event_time":"2026-10-14T08:30:00Z","producer":"order-service",
            "trace_id":"7f3a9c2e1b4d4e8f9a0b1c2d3e4f5a6b","data":{{"order_id":1001,"user_id":7,
            "sku":"SKU-1","quantity":2,"amount":{amount},"currency":"CNY","created_at":"2026-10-14T08:29:58Z"}}}}"#
        )
    }

    #[test]
    fn parses_a_valid_envelope() {
        let env = Envelope::from_json(&created_json(1299)).unwrap();
        assert_eq!(env.event_name.as_str(), "order.created");
        assert_eq!(env.key(), "1001");
        assert_eq!(
            env.traceparent(),
            "00-7f3a9c2e1b4d4e8f9a0b1c2d3e4f5a6b-550e8400e29b41d4-01"
        );
    }

    #[test]
    fn negative_amount_names_the_field() {
        let err = Envelope::from_json(&created_json(-5)).unwrap_err();
        assert!(err.to_string().contains("data.amount"), "{err}");
    }

    #[test]
    fn missing_field_names_the_field() {
        let text = created_json(10).replace(r#""producer":"order-service","#, "");
        let err = Envelope::from_json(&text).unwrap_err();
        assert_eq!(
            err,
            EnvelopeError::field("producer", "missing required field")
        );
        let text = created_json(10).replace(r#""amount":10,"#, "");
        let err = Envelope::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("amount"), "{err}");
    }

    #[test]
    fn name_and_payload_must_agree() {
        let text = created_json(10).replace("\"order.created\"", "\"order.shipped\"");
        let err = Envelope::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("data"), "{err}");
    }

    #[test]
    fn non_utc_time_is_refused() {
        let text = created_json(10).replace("2026-10-14T08:30:00Z", "2026-10-14T08:30:00+08:00");
        let err = Envelope::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("event_time"), "{err}");
    }

    #[test]
    fn bad_trace_id_is_refused() {
        let text = created_json(10).replace("7f3a9c2e1b4d4e8f9a0b1c2d3e4f5a6b", "xyz");
        let err = Envelope::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("trace_id"), "{err}");
    }

    #[test]
    fn new_envelopes_validate() {
        let env = Envelope::new("svc", EventData::sample_created(1));
        env.validate().unwrap();
    }
}
