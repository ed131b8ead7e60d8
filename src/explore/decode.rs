//! A record's value as an operator reads it: decoded through the registry
//! with its writer's schema, or what it is when it cannot be.
//!
//! [`Decoder::decode`] never fails. It decodes as the consumers do
//! ([`Codec::decode`]: an order or inventory envelope, or a `cdc.*` row
//! change, by the writer's schema), so the explorer shows a record the way a
//! consumer group would take it. A value that is not Confluent-framed (no
//! magic byte), names a schema id the registry does not know, or whose Avro
//! body does not match its schema is [`Decoded::Undecodable`], with the
//! [`CodecError::class`] the consumers dead-letter it with; Avro that decodes
//! but is no valid envelope is [`Decoded::Invalid`], with the decoded value
//! kept for the reader. A poison record is shown for what it is, never as
//! an error.

use serde::Serialize;

use crate::codec::{Codec, CodecError, RegistrySettings, schema_id};
use crate::schema::SchemaCatalog;

/// What a record's value turned out to be.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decoded {
    /// No value (a tombstone).
    Empty,
    /// An envelope (order event, inventory event or row change), checked.
    Envelope {
        /// The registry's schema id.
        schema_id: u32,
        /// Its event name.
        event_name: String,
        /// The envelope as JSON.
        json: serde_json::Value,
    },
    /// Decoded Avro that is no valid envelope (the consumers' class `invalid_envelope`).
    Invalid {
        /// The registry's schema id.
        schema_id: u32,
        /// Which field and why.
        reason: String,
        /// The decoded value as JSON.
        json: serde_json::Value,
    },
    /// Cannot be decoded: not framed, unknown schema id, bad Avro, or the registry is down.
    Undecodable {
        /// [`CodecError::class`]: `not_framed`, `unknown_schema`, `avro_decode`, `registry_unavailable`, ...
        class: &'static str,
        /// The schema id in the frame, when there is a frame.
        schema_id: Option<u32>,
        /// What is wrong.
        reason: String,
    },
}

impl Decoded {
    /// Whether the value could not be decoded (or is no valid envelope).
    pub fn is_undecodable(&self) -> bool {
        matches!(self, Self::Undecodable { .. } | Self::Invalid { .. })
    }

    /// The schema id of the frame, if the value has one.
    pub fn schema_id(&self) -> Option<u32> {
        match self {
            Self::Empty => None,
            Self::Envelope { schema_id, .. } | Self::Invalid { schema_id, .. } => Some(*schema_id),
            Self::Undecodable { schema_id, .. } => *schema_id,
        }
    }
}

/// Decodes values of any topic through one registry (the codec caches the
/// writer schemas by id).
pub struct Decoder {
    codec: Codec,
}

impl Decoder {
    /// A decoder for the registry of `registry`.
    pub fn new(registry: &RegistrySettings) -> Result<Self, CodecError> {
        // The codec decodes with the writer's schema from the registry; the
        // schema it is built with only matters for encoding, which it never does here.
        let catalog = SchemaCatalog::embedded();
        let codec = Codec::new(registry, "orderpipe.explore", catalog.order_events(), false)?;
        Ok(Self { codec })
    }

    /// What `value` is; never an error.
    pub async fn decode(&self, value: Option<&[u8]>) -> Decoded {
        let Some(bytes) = value else {
            return Decoded::Empty;
        };
        let id = match schema_id(bytes) {
            Ok(id) => id,
            Err(e) => return undecodable(e, None),
        };
        match self.codec.decode(Some(bytes)).await {
            Ok(envelope) => Decoded::Envelope {
                schema_id: id,
                event_name: envelope.event_name.as_str().to_string(),
                json: serde_json::to_value(&envelope).unwrap_or_else(|e| {
                    serde_json::Value::String(format!("(not representable as JSON: {e})"))
                }),
            },
            Err(CodecError::Invalid(reason)) => match self.codec.decode_value(Some(bytes)).await {
                Ok(value) => Decoded::Invalid {
                    schema_id: id,
                    reason: reason.to_string(),
                    json: serde_json::Value::try_from(value).unwrap_or_else(|e| {
                        serde_json::Value::String(format!("(not representable as JSON: {e})"))
                    }),
                },
                Err(e) => undecodable(e, Some(id)),
            },
            Err(e) => undecodable(e, Some(id)),
        }
    }
}

impl Decoder {
    /// `value` as the consumers take it, if it is a valid envelope.
    pub async fn envelope(&self, value: &[u8]) -> Option<crate::envelope::Envelope> {
        self.codec.decode(Some(value)).await.ok()
    }
}

/// What `value` is without asking the registry (it did not answer):
/// `not_framed` when that is plain from the bytes, else `registry_unavailable` with `why`.
pub fn registry_unavailable(value: Option<&[u8]>, why: &str) -> Decoded {
    match value.map(schema_id) {
        None => Decoded::Empty,
        Some(Err(e)) => undecodable(e, None),
        Some(Ok(id)) => undecodable(CodecError::RegistryUnavailable(why.to_string()), Some(id)),
    }
}

fn undecodable(e: CodecError, schema_id: Option<u32>) -> Decoded {
    Decoded::Undecodable {
        class: e.class(),
        schema_id,
        reason: e.to_string(),
    }
}
