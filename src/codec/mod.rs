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
//! once per schema, not once per record. Encoding envelopes takes the fast
//! path of [`fast`]: the schema id and writer are resolved once per codec,
//! records are serialized straight into a reused buffer, and a sample of
//! them ([`fast::VERIFY_EVERY`]) is checked against the validated path (a
//! failed check stops the codec).
//!
//! * [`avro`] converts envelopes to and from Avro values.
//! * [`fast`] is the encode hot path and its sampled check.
//! * `reader` is the decode hot path: per schema id, the writer schema
//!   resolved once (the converter's decoder only fetches it).
//! * [`embedded_registry`] is an in-process Confluent-compatible registry used
//!   by `orderpipe demo` (no servers) and unit tests; the codec talks to it
//!   over HTTP exactly as it talks to Apicurio.
//!
//! [`RegistrySettings`] is the `[registry]` section of the configuration.

pub mod avro;
pub mod embedded_registry;
pub mod fast;
mod reader;
pub mod row_change;

use std::sync::OnceLock;
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
    /// [`Codec::encode_into`] before the schema id was resolved.
    #[error(
        "codec for {0} is not warmed up: call Codec::warm_up (or encode once) before encode_into"
    )]
    NotWarmedUp(String),
    /// The sampled check found the fast encode path writing something the
    /// validated path or a consumer would not (see [`fast::VERIFY_EVERY`]).
    #[error("encode check failed: {0}")]
    Mismatch(String),
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
            Self::NotWarmedUp(_) => "not_warmed_up",
            Self::Mismatch(_) => "encode_mismatch",
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
        let password = registry
            .password
            .as_ref()
            .map(|p| p.expose_secret().to_string());
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
    /// The fast path's writer, resolved by the first `warm_up` or `encode`.
    writer: OnceLock<fast::FastWriter>,
    /// The writer schemas of the records decoded so far, by schema id.
    schemas: reader::WriterSchemas,
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
            writer: OnceLock::new(),
            schemas: reader::WriterSchemas::default(),
        })
    }

    /// Resolves the schema id and the fast path's writer now, so a missing
    /// or unreachable registry is reported at start-up instead of on the
    /// first record. Later calls return the resolved id at once.
    pub async fn warm_up(&self) -> Result<u32, CodecError> {
        if let Some(writer) = self.writer.get() {
            return Ok(writer.id());
        }
        let subject = self
            .strategy
            .get_subject()
            .map_err(CodecError::from_registry)?;
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
        // The schema the id stands for (the registry's text, not the local
        // file): what `encode_value` writes with, so both paths agree.
        let writer = fast::FastWriter::new(schema.id, &schema.parsed)?;
        Ok(self.writer.get_or_init(|| writer).id())
    }

    /// Encodes an envelope: magic byte, schema id, Avro body. Resolves the
    /// writer on first use; the work per record is [`Codec::encode_into`]'s.
    pub async fn encode(&self, envelope: &Envelope) -> Result<Vec<u8>, CodecError> {
        self.warm_up().await?;
        let mut buf = Vec::with_capacity(256);
        self.encode_into(envelope, &mut buf)?;
        Ok(buf)
    }

    /// Encodes an envelope into `buf` (cleared first), without waiting:
    /// the hot path of producers and the relay. Needs a codec that was
    /// warmed up ([`Codec::warm_up`], or one [`Codec::encode`]); before that
    /// it is [`CodecError::NotWarmedUp`]. A sample of records is checked
    /// ([`fast::VERIFY_EVERY`]); a failed check is [`CodecError::Mismatch`].
    pub fn encode_into(&self, envelope: &Envelope, buf: &mut Vec<u8>) -> Result<(), CodecError> {
        let writer = self.writer.get().ok_or_else(|| {
            CodecError::NotWarmedUp(self.strategy.get_subject().unwrap_or_default())
        })?;
        writer.encode_into(envelope, buf)
    }

    /// Encodes a raw Avro value with the topic's schema through
    /// `schema_registry_converter`, validating it in full (tests use this to
    /// write records the envelope type would refuse, and to compare with
    /// the fast path).
    pub async fn encode_value(&self, value: Value) -> Result<Vec<u8>, CodecError> {
        self.encoder
            .encode_value(value, &self.strategy)
            .await
            .map_err(|e| {
                self.encoder.remove_errors_from_cache();
                CodecError::from_registry(e)
            })
    }

    /// Decodes and validates one record value: an order envelope, or a
    /// row change of a `cdc.*` topic (written with `CdcChangeEnvelope`,
    /// [`row_change`], or a per-table schema in
    /// [`row_change::TABLES_NAMESPACE`]) as an envelope whose data is
    /// [`crate::envelope::EventData::RowChange`]. The writer's schema (from
    /// the frame's id) says which, so a group's retry topic may hold both.
    pub async fn decode(&self, payload: Option<&[u8]>) -> Result<Envelope, CodecError> {
        let (writer, value) = self.read(payload).await?;
        if writer.is_row_change {
            return Ok(row_change::ChangeEvent::from_avro(value)?.into_envelope()?);
        }
        Ok(avro::from_avro(value)?)
    }

    /// Decodes one record value with its writer's schema (from the
    /// registry) into an Avro value, without the envelope's checks: for
    /// values that are not order envelopes (`cdc.*` changes).
    pub async fn decode_value(&self, payload: Option<&[u8]>) -> Result<Value, CodecError> {
        Ok(self.read(payload).await?.1)
    }

    /// Reads one record value with its writer's schema: the schema of the
    /// frame's id, asked of the registry on the first record of that id
    /// ([`reader`]).
    async fn read(
        &self,
        payload: Option<&[u8]>,
    ) -> Result<(std::sync::Arc<reader::WriterSchema>, Value), CodecError> {
        let bytes = payload.ok_or_else(|| CodecError::NotFramed("record has no value".into()))?;
        let id = schema_id(bytes)?;
        let writer = match self.schemas.get(id) {
            Some(writer) => writer,
            None => {
                let schema = self.decoder.get_schema(id).await.map_err(|e| {
                    let text = registry_error_text(&e);
                    if e.retriable || text.contains("error sending request") {
                        self.decoder.remove_errors_from_cache();
                        CodecError::RegistryUnavailable(text)
                    } else if text.contains("schema registry failed") || text.contains("status 404")
                    {
                        CodecError::UnknownSchema { id, detail: text }
                    } else {
                        CodecError::Avro(text)
                    }
                })?;
                self.schemas.insert(id, &schema.parsed)?
            }
        };
        let value = writer.read(&bytes[FRAME_LEN..])?;
        Ok((writer, value))
    }
}

/// The Confluent frame: magic byte, then the schema id (big-endian).
const FRAME_LEN: usize = 5;

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
        assert!(
            schema_id(&[7, 0, 0, 0, 1])
                .unwrap_err()
                .to_string()
                .contains("0x07")
        );
        assert!(
            schema_id(&[0, 1])
                .unwrap_err()
                .to_string()
                .contains("shorter")
        );
    }

    use crate::envelope::{EventData, InventoryStockReleased, InventoryStockReserved};
    use crate::schema::SchemaCatalog;

    fn settings(registry: &embedded_registry::EmbeddedRegistry) -> RegistrySettings {
        RegistrySettings {
            url: registry.url().to_string(),
            username: None,
            password: None,
            timeout_ms: 5_000,
            auto_register: true,
        }
    }

    /// One codec decodes both kinds a router group reads: order envelopes
    /// and `cdc.*` row changes (told apart by the writer's schema).
    #[tokio::test]
    async fn decode_reads_order_envelopes_and_row_changes() {
        let registry = embedded_registry::EmbeddedRegistry::start().await.unwrap();
        let catalog = SchemaCatalog::embedded();
        let order = Codec::new(
            &settings(&registry),
            "t.order",
            catalog.order_events(),
            true,
        )
        .unwrap();
        let envelope = crate::envelope::Envelope::new("test", EventData::sample_created(5));
        let bytes = order.encode(&envelope).await.unwrap();
        let cdc_topic = "t.cdc.shop.table_user";
        let cdc = Codec::new(
            &settings(&registry),
            cdc_topic,
            &crate::cdc::change::topic_schema(cdc_topic),
            true,
        )
        .unwrap();
        let id = crate::cdc::change::change_id("src", "0-1-9", 0);
        let change = crate::cdc::change::ChangeEvent {
            event_id: id,
            event_name: "shop.table_user.insert".into(),
            event_version: crate::cdc::change::CHANGE_EVENT_VERSION.into(),
            event_time: chrono::DateTime::from_timestamp(1_764_570_000, 0).unwrap(),
            producer: "cdc:src".into(),
            trace_id: crate::cdc::change::trace_id_of(&id),
            database: "shop".into(),
            table: "table_user".into(),
            change: crate::cdc::change::ChangeKind::Insert,
            key: "9".into(),
            data: serde_json::json!({"id": 9, "mobile": "138"}),
            old: None,
            gtid: None,
            binlog_file: "b.000001".into(),
            binlog_pos: 4,
            xid: None,
            row_index: 0,
        };
        let change_bytes = cdc.encode_value(change.to_avro()).await.unwrap();
        // Either codec reads either record.
        for codec in [&order, &cdc] {
            assert_eq!(codec.decode(Some(&bytes)).await.unwrap(), envelope);
            let decoded = codec.decode(Some(&change_bytes)).await.unwrap();
            assert_eq!(decoded.event_name.as_str(), "shop.table_user.insert");
            assert_eq!(decoded.key(), "9");
            let EventData::RowChange(row) = &decoded.data else {
                panic!("{decoded:?}")
            };
            assert_eq!(row.data, serde_json::json!({"id": 9, "mobile": "138"}));
        }
        // A row change is never written with an order schema.
        let wrong = order
            .encode(&order.decode(Some(&change_bytes)).await.unwrap())
            .await
            .unwrap_err();
        assert!(wrong.to_string().contains("CdcChangeEnvelope"), "{wrong}");
    }

    /// Every event of both topics, through both paths.
    #[tokio::test]
    async fn the_fast_path_writes_the_bytes_of_the_validated_path_for_every_event() {
        let registry = embedded_registry::EmbeddedRegistry::start().await.unwrap();
        let catalog = SchemaCatalog::embedded();
        let inventory = catalog.inventory_events().unwrap();
        let stock = |order_id| {
            let at = crate::envelope::format_utc(&chrono::Utc::now());
            vec![
                EventData::StockReserved(InventoryStockReserved {
                    order_id,
                    sku: "sku-1".into(),
                    quantity: 2,
                    reserved_at: at.clone(),
                }),
                EventData::StockReleased(InventoryStockReleased {
                    order_id,
                    sku: "sku-1".into(),
                    quantity: 2,
                    released_at: at,
                }),
            ]
        };
        let topics = [
            (
                "t.order",
                catalog.order_events(),
                EventData::sample_lifecycle(41),
            ),
            ("t.inventory", inventory, stock(42)),
        ];
        for (topic, schema, events) in topics {
            let codec = Codec::new(&settings(&registry), topic, schema, true).unwrap();
            let id = codec.warm_up().await.unwrap();
            let mut buf = Vec::new();
            for envelope in events.into_iter().map(|d| Envelope::new("svc", d)) {
                // More than one sampled record per event type, and records in between.
                for _ in 0..=fast::VERIFY_EVERY {
                    codec.encode_into(&envelope, &mut buf).unwrap();
                }
                let validated = codec
                    .encode_value(avro::to_avro(&envelope, &schema.parsed).unwrap())
                    .await
                    .unwrap();
                assert_eq!(
                    buf, validated,
                    "{topic} {}: fast and validated bytes differ",
                    envelope.event_name
                );
                assert_eq!(schema_id(&buf).unwrap(), id);
                assert_eq!(codec.encode(&envelope).await.unwrap(), validated);
                assert_eq!(
                    codec.decode(Some(&buf)).await.unwrap(),
                    envelope,
                    "{topic}: round trip"
                );
            }
        }
    }

    #[tokio::test]
    async fn encode_into_needs_a_warm_codec_and_an_event_of_the_topic() {
        let registry = embedded_registry::EmbeddedRegistry::start().await.unwrap();
        let catalog = SchemaCatalog::embedded();
        let codec =
            Codec::new(&settings(&registry), "t.cold", catalog.order_events(), true).unwrap();
        let envelope = Envelope::new("svc", EventData::sample_created(1));
        let e = codec.encode_into(&envelope, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(e, CodecError::NotWarmedUp(_)) && e.to_string().contains("t.cold-value"),
            "{e}"
        );
        codec.warm_up().await.unwrap();
        let stock = EventData::StockReserved(InventoryStockReserved {
            order_id: 1,
            sku: "s".into(),
            quantity: 1,
            reserved_at: "2026-01-01T00:00:00.000Z".into(),
        });
        let e = codec
            .encode_into(&Envelope::new("svc", stock), &mut Vec::new())
            .unwrap_err();
        assert!(
            e.to_string().contains("no `InventoryStockReserved` branch"),
            "{e}"
        );
    }

    /// The registry's schema types `event_id` as an Avro `uuid`: the fast
    /// writer serializes the string without complaint, but consumers read
    /// a uuid where they expect a string and dead-letter every record. The
    /// sampled check stops the first record, and the codec every later one.
    #[tokio::test]
    async fn the_sampled_check_stops_a_record_consumers_could_not_read() {
        let registry = embedded_registry::EmbeddedRegistry::start().await.unwrap();
        let catalog = SchemaCatalog::embedded();
        let anchor = r#"{"name": "event_id", "type": "string""#;
        let raw = catalog.order_events().raw.replacen(
            anchor,
            r#"{"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}"#,
            1,
        );
        assert_ne!(raw, catalog.order_events().raw, "schema anchor moved");
        let uuid_typed = apache_avro::Schema::parse_str(&raw).unwrap();
        let uuid_typed = crate::schema::TopicSchema {
            topic: "t.mismatch".into(),
            parsed: uuid_typed,
            raw,
        };
        let codec = Codec::new(&settings(&registry), "t.mismatch", &uuid_typed, true).unwrap();
        codec.warm_up().await.unwrap();
        let envelope = Envelope::new("svc", EventData::sample_created(7));
        let mut buf = Vec::new();
        let e = codec.encode_into(&envelope, &mut buf).unwrap_err();
        assert!(matches!(e, CodecError::Mismatch(_)), "{e}");
        assert!(
            e.to_string().contains(&envelope.event_id.to_string())
                && e.to_string().contains("cannot decode"),
            "{e}"
        );
        assert_eq!(e.class(), "encode_mismatch");
        // The writer is not trusted again: every later record is refused
        // too, sampled or not, of any event.
        let paid = Envelope::new("svc", EventData::sample_lifecycle(7).remove(1));
        for e in [&envelope, &paid] {
            let later = codec.encode_into(e, &mut buf).unwrap_err();
            assert!(
                later
                    .to_string()
                    .contains("an earlier record failed the check"),
                "{later}"
            );
        }
        assert!(codec.encode(&envelope).await.is_err());
        // The same envelope with the topic's own schema passes the check.
        let good =
            Codec::new(&settings(&registry), "t.good", catalog.order_events(), true).unwrap();
        good.encode(&envelope).await.unwrap();
    }
}
