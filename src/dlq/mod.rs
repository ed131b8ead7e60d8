//! Dead letters: records a consumer group could not apply.
//!
//! The consumer's error tier writes them to `order.events.v1.dlq` (see
//! [`crate::retry`]), `cdc` the row changes it cannot publish to its own
//! DLQ topic (see [`crate::cdc::oversize`]); [`persist`] stores both in
//! the `dead_letters` table;
//! operators list, inspect, replay or ignore them from the CLI.
//!
//! * [`store`] is the table: upsert, filters, counts, status changes;
//! * [`persist`] is `orderpipe dlq persist`;
//! * [`replay`] is `orderpipe dlq replay`;
//! * [`progress`] is the `dlq_replays` table: bulk replays as they run,
//!   written by the CLI and the console, read by every console replica;
//! * [`ignore`] is `orderpipe dlq ignore`, which asks what happens to the
//!   records held behind a head of a parked key.
//! * [`held`] is the operators' view of the records held behind parked
//!   keys (not dead letters: they have their own table and type).
//! * [`gauges`] exports the dead-letter gauges (and every other gauge read
//!   from the database) from the roles that run anyway.
//!
//! [`DlqSettings`] is the `[dlq]` section of the configuration;
//! [`ERROR_CLASSES`] the error classes a dead letter can carry.

pub mod gauges;
pub mod held;
pub mod ignore;
pub mod persist;
pub mod progress;
pub mod replay;
pub mod store;

use serde::Deserialize;

/// The `[dlq]` section of the configuration: dead letters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlqSettings {
    /// Consumer group of the persister.
    pub persister_group: String,
    /// Seconds between two exports of the database gauges ([`gauges`]).
    #[serde(default = "default_gauge_interval_secs")]
    pub gauge_interval_secs: u64,
}

fn default_gauge_interval_secs() -> u64 {
    15
}

impl DlqSettings {
    /// Rejects a gauge interval of 0, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.gauge_interval_secs == 0 {
            return Err(
                "dlq.gauge_interval_secs must be at least 1 (seconds between two exports)".into(),
            );
        }
        Ok(())
    }
}

/// Every error class a dead letter can carry: the codec's
/// ([`crate::codec::CodecError::class`]), the handlers'
/// ([`crate::consumer::handler::HandlerError::class`]), the consumer's own
/// checks before decoding (`oversized`, `invalid_key`,
/// [`crate::consumer::version::UNSUPPORTED_VERSION`]), cdc's
/// ([`crate::cdc::oversize`]: `oversized` too, and `unencodable`) and
/// `unknown` (a DLQ record without the class header, see
/// [`persist::dead_letter_of`]). A
/// fixed set: the gauges' `class` label and `--class` take only these.
pub const ERROR_CLASSES: [&str; 17] = [
    "unavailable",
    "handler_retryable",
    "handler_fatal",
    "downstream_rejected",
    "not_framed",
    "unknown_schema",
    "registry_unavailable",
    "registry_error",
    "avro_decode",
    "invalid_envelope",
    "not_warmed_up",
    "encode_mismatch",
    "oversized",
    "invalid_key",
    crate::consumer::version::UNSUPPORTED_VERSION,
    crate::cdc::oversize::UNENCODABLE,
    "unknown",
];

/// `class` if it is one of [`ERROR_CLASSES`], else an error naming them.
pub fn known_class(class: &str) -> Result<String, String> {
    if ERROR_CLASSES.contains(&class) {
        Ok(class.to_string())
    } else {
        Err(format!(
            "`{class}` is not an error class; accepted values: {}",
            ERROR_CLASSES.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::CodecError;
    use crate::consumer::handler::HandlerError;

    /// Every class the codec and the handlers give is in the fixed set (a
    /// new variant without its class here fails this test).
    #[test]
    fn every_class_given_is_listed() {
        let text = || "x".to_string();
        let codec = [
            CodecError::NotFramed(text()),
            CodecError::UnknownSchema {
                id: 1,
                detail: text(),
            },
            CodecError::RegistryUnavailable(text()),
            CodecError::Registry(text()),
            CodecError::Avro(text()),
            CodecError::Invalid(crate::envelope::EnvelopeError::Field {
                field: text(),
                reason: text(),
            }),
            CodecError::NotWarmedUp(text()),
            CodecError::Mismatch(text()),
        ];
        let handler = [
            HandlerError::Unavailable(text()),
            HandlerError::Retryable(text()),
            HandlerError::Fatal(text()),
            HandlerError::Rejected(text()),
        ];
        for class in codec
            .iter()
            .map(CodecError::class)
            .chain(handler.iter().map(HandlerError::class))
        {
            assert!(
                known_class(class).is_ok(),
                "{class} is missing from ERROR_CLASSES"
            );
        }
        let refused = known_class("handler_fatl").unwrap_err();
        assert!(
            refused.contains("accepted values: unavailable, handler_retryable"),
            "{refused}"
        );
    }

    #[test]
    fn a_gauge_interval_of_0_is_refused_naming_the_field() {
        let settings = DlqSettings {
            persister_group: "p".into(),
            gauge_interval_secs: 0,
        };
        assert!(
            settings
                .validate()
                .unwrap_err()
                .contains("dlq.gauge_interval_secs must be at least 1")
        );
        assert!(
            DlqSettings {
                gauge_interval_secs: 1,
                ..settings
            }
            .validate()
            .is_ok()
        );
    }
}
