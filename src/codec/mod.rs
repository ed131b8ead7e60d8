//! The Confluent wire format: magic byte `0`, a 4-byte big-endian schema id,
//! then the Avro body, and the registry client it needs.
//!
//! The codec sits below [`crate::schema`]: it takes any parsed Avro schema
//! (a `TopicSchema` is one), while `schema` (the schema files, registering,
//! compatibility checks) uses the codec's registry connection
//! ([`RegistrySettings`], [`sr_settings`]) and errors.
//!
//! [`Codec`] wraps `schema_registry_converter`'s encoder and decoder, which
//! cache schema ids and parsed schemas per process, so the registry is asked
//! once per schema, not once per record.
//!
//! * [`avro`] converts envelopes to and from Avro values.
//! * [`embedded_registry`] is an in-process Confluent-compatible registry used
//!   by `orderpipe demo` (no servers) and unit tests; the codec talks to it
//!   over HTTP exactly as it talks to Apicurio.
//!
//! [`RegistrySettings`] is the `[registry]` section of the configuration.

pub mod avro;
pub mod embedded_registry;

use std::time::Duration;

use apache_avro::types::Value;
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::avro_common::get_supplied_schema;
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::SubjectNameStrategy;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::envelope::{Envelope, EnvelopeError};

/// The `[registry]` section of the configuration: the schema registry
/// (Confluent-compatible API).
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

/// Why a record could not be encoded or decoded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CodecError {
    /// The bytes do not start with the Confluent magic byte and a schema id.
    #[error("not Confluent-framed Avro: {0}")]
    NotFramed(String),
    /// The registry does not know the schema id in the frame.
    #[error("unknown schema id {id}: {detail}")]
    UnknownSchema {
        /// The id read from the frame.
        id: u32,
        /// What the registry said.
        detail: String,
    },
    /// The registry could not be reached or failed; worth retrying.
    #[error("schema registry unavailable: {0}")]
    RegistryUnavailable(String),
    /// The registry refused the schema or answered something unusable.
    #[error("schema registry refused the request: {0}")]
    Registry(String),
    /// The Avro body does not match its schema.
    #[error("Avro decode error: {0}")]
    Avro(String),
    /// The record decoded but breaks the message spec.
    #[error("invalid envelope: {0}")]
    Invalid(#[from] EnvelopeError),
}

impl CodecError {
    /// True when the same bytes may succeed later (registry down), false
    /// when they never will (poison record).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::RegistryUnavailable(_))
    }

    /// A short, stable class name for metrics and dead-letter headers.
    pub fn class(&self) -> &'static str {
        match self {
            Self::NotFramed(_) => "not_framed",
            Self::UnknownSchema { .. } => "unknown_schema",
            Self::RegistryUnavailable(_) => "registry_unavailable",
            Self::Registry(_) => "registry_error",
            Self::Avro(_) => "avro_decode",
            Self::Invalid(_) => "invalid_envelope",
        }
    }

    fn from_registry(error: SRCError) -> Self {
        let text = registry_error_text(&error);
        if error.retriable || text.contains("error sending request") {
            Self::RegistryUnavailable(text)
        } else {
            Self::Registry(text)
        }
    }
}

fn registry_error_text(error: &SRCError) -> String {
    match &error.cause {
        Some(cause) => format!("{} ({cause})", error.error),
        None => error.error.clone(),
    }
}

/// Builds the client settings for a registry.
pub fn sr_settings(registry: &RegistrySettings) -> Result<SrSettings, CodecError> {
    let mut builder = SrSettings::new_builder(registry.url.clone());
    builder.set_timeout(Duration::from_millis(registry.timeout_ms));
    builder.no_proxy();
    if let Some(user) = &registry.username {
        let password = registry.password.as_ref().map(|p| p.expose_secret().to_string());
        builder.set_basic_authorization(user, password.as_deref());
    }
    builder
        .build()
        .map_err(|e| CodecError::Registry(registry_error_text(&e)))
}

/// Encodes and decodes envelopes of one topic in the Confluent wire format.
pub struct Codec {
    encoder: AvroEncoder,
    decoder: AvroDecoder,
    strategy: SubjectNameStrategy,
    schema: apache_avro::Schema,
}

impl Codec {
    /// A codec for values of `topic` written with `schema` (a
    /// [`crate::schema::TopicSchema`], or any parsed Avro schema). With
    /// `auto_register` the schema is registered (or found) under
    /// `<topic>-value` on first use; without it, the subject's latest
    /// registered version is used and must exist.
    pub fn new(
        registry: &RegistrySettings,
        topic: &str,
        schema: &impl AsRef<apache_avro::Schema>,
        auto_register: bool,
    ) -> Result<Self, CodecError> {
        let settings = sr_settings(registry)?;
        let strategy = if auto_register {
            SubjectNameStrategy::TopicNameStrategyWithSchema(
                topic.to_string(),
                false,
                get_supplied_schema(schema.as_ref()),
            )
        } else {
            SubjectNameStrategy::TopicNameStrategy(topic.to_string(), false)
        };
        Ok(Self {
            encoder: AvroEncoder::new(settings.clone()),
            decoder: AvroDecoder::new(settings),
            strategy,
            schema: schema.as_ref().clone(),
        })
    }

    /// Resolves the schema id now, so a missing or unreachable registry is
    /// reported at start-up instead of on the first record.
    pub async fn warm_up(&self) -> Result<u32, CodecError> {
        let subject = self.strategy.get_subject().map_err(|e| CodecError::from_registry(e))?;
        let schema = self
            .encoder
            .get_schema_and_id(&subject, self.strategy.clone())
            .await
            .map_err(|e| {
                // Failures are cached by the encoder; clear them so a later
                // attempt asks the registry again.
                self.encoder.remove_errors_from_cache();
                CodecError::from_registry(e)
            })?;
        Ok(schema.id)
    }

    /// Encodes an envelope: magic byte, schema id, Avro body.
    pub async fn encode(&self, envelope: &Envelope) -> Result<Vec<u8>, CodecError> {
        let value = avro::to_avro(envelope, &self.schema).map_err(|e| CodecError::Avro(e.to_string()))?;
        self.encode_value(value).await
    }

    /// Encodes a raw Avro value with the topic's schema (tests use this to
    /// write records the envelope type would refuse).
    pub async fn encode_value(&self, value: Value) -> Result<Vec<u8>, CodecError> {
        self.encoder
            .encode_value(value, &self.strategy)
            .await
            .map_err(|e| {
                self.encoder.remove_errors_from_cache();
                CodecError::from_registry(e)
            })
    }

    /// Decodes and validates one record value.
    pub async fn decode(&self, payload: Option<&[u8]>) -> Result<Envelope, CodecError> {
        let bytes = payload.ok_or_else(|| CodecError::NotFramed("record has no value".into()))?;
        let id = schema_id(bytes)?;
        let decoded = self.decoder.decode(Some(bytes)).await.map_err(|e| {
            let text = registry_error_text(&e);
            if e.retriable || text.contains("error sending request") {
                self.decoder.remove_errors_from_cache();
                CodecError::RegistryUnavailable(text)
            } else if text.contains("schema registry failed") || text.contains("status 404") {
                CodecError::UnknownSchema { id, detail: text }
            } else {
                CodecError::Avro(text)
            }
        })?;
        Ok(avro::from_avro(decoded.value)?)
    }
}

/// Reads the schema id from a Confluent frame, or says why it is not one.
pub fn schema_id(bytes: &[u8]) -> Result<u32, CodecError> {
    match bytes {
        [0, a, b, c, d, ..] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        [] => Err(CodecError::NotFramed("empty value".into())),
        [magic, ..] if *magic != 0 => Err(CodecError::NotFramed(format!(
            "magic byte is {magic:#04x}, expected 0x00"
        ))),
        _ => Err(CodecError::NotFramed(format!(
            "{} bytes is shorter than the 5-byte header",
            bytes.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_errors_say_what_is_wrong() {
        assert_eq!(schema_id(&[0, 0, 0, 1, 2, 9]).unwrap(), 258);
        assert!(schema_id(&[]).unwrap_err().to_string().contains("empty"));
        assert!(schema_id(&[7, 0, 0, 0, 1]).unwrap_err().to_string().contains("0x07"));
        assert!(schema_id(&[0, 1]).unwrap_err().to_string().contains("shorter"));
    }
}
