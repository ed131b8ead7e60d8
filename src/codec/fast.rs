//! The encode hot path: an envelope straight to Confluent-framed Avro bytes.
//!
//! [`FastWriter`] is resolved once per [`super::Codec`] (at `warm_up` or the
//! first `encode`): the schema id and the schema the registry holds under
//! it, with its named types resolved. Each record is then serialized by
//! apache-avro's schema-aware serde serializer directly into a reused
//! buffer, behind the 5-byte frame (magic `0`, big-endian schema id): no
//! `Value` tree, no full validation, no schema or subject-strategy clone,
//! no registry lookup. The serializer still refuses a field the schema does
//! not have or of another type, so a wrong writer fails loudly, not silently.
//!
//! What it skips is checked on a sample ([`VERIFY_EVERY`]): per event name,
//! the first record a codec encodes and every 1,000th after it is
//! re-encoded by the validated `Value` path (the one
//! `schema_registry_converter` uses) and compared byte for byte, decoded
//! back with the writer's schema, and decoded into an envelope as a
//! consumer would and compared with the input. A difference is a
//! [`super::CodecError::Mismatch`] naming the schema id, the event and what
//! differs; the record is not sent, and from then on the codec refuses
//! every record (a writer found wrong once is not trusted again until the
//! process restarts), so a mismatch stops the stream at the first sampled
//! record instead of letting the records between samples through.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::{NamesRef, ResolvedSchema};
use apache_avro::writer::datum::GenericDatumWriter;
use serde::Serialize;
use serde::ser::SerializeStruct;

use super::avro;
use super::{CodecError, FRAME_LEN};
use crate::envelope::data::KNOWN_EVENTS;
use crate::envelope::{Envelope, EventData, format_utc};

/// One record in this many of each event name goes through the sampled
/// check (the first of each event name always does). The check costs about
/// as much as ten fast encodes, so at 1,000 it adds ~1% to the encode time.
pub const VERIFY_EVERY: u64 = 1_000;

/// The writer of one codec: schema id and resolved registered schema.
pub(super) struct FastWriter {
    id: u32,
    schema: &'static Schema,
    /// The schema's named types, which its references resolve to.
    names: NamesRef<'static>,
    /// Records encoded so far per event ([`KNOWN_EVENTS`] index); picks the sampled ones.
    encoded: [AtomicU64; KNOWN_EVENTS.len()],
    /// Why the check failed, once it has: every later record is refused.
    refused: OnceLock<String>,
}

/// Every distinct schema a writer was built for, kept for the process's
/// life: apache-avro's serializer borrows the schema and its resolved
/// names (its owning form is private), and a process writes a handful of
/// schemas, so each is kept once rather than resolved per record.
fn interned(schema: &Schema) -> Result<&'static Schema, CodecError> {
    static SCHEMAS: Mutex<Option<HashMap<String, &'static Schema>>> = Mutex::new(None);
    // The full JSON form: defaults and docs included, so two schemas that
    // differ only in a default are not taken for one another.
    let key = serde_json::to_string(schema)
        .map_err(|e| CodecError::Registry(format!("schema does not serialize: {e}")))?;
    let mut schemas = SCHEMAS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok(*schemas
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| Box::leak(Box::new(schema.clone()))))
}

impl FastWriter {
    /// A writer for the schema the registry holds under `id`.
    pub(super) fn new(id: u32, schema: &Schema) -> Result<Self, CodecError> {
        let schema = interned(schema)?;
        let names = ResolvedSchema::try_from(schema)
            .map_err(|e| CodecError::Registry(format!("schema id {id} does not resolve: {e}")))?
            .get_names()
            .clone();
        Ok(Self {
            id,
            schema,
            names,
            encoded: Default::default(),
            refused: OnceLock::new(),
        })
    }

    /// The schema id written into every frame.
    pub(super) fn id(&self) -> u32 {
        self.id
    }

    /// Writes the framed record into `buf` (cleared first), checking a
    /// sample of records (see [`VERIFY_EVERY`]).
    pub(super) fn encode_into(
        &self,
        envelope: &Envelope,
        buf: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        if let Some(reason) = self.refused.get() {
            return Err(CodecError::Mismatch(format!(
                "refused: an earlier record failed the check ({reason}); this codec writes nothing more until restarted"
            )));
        }
        if let EventData::RowChange(_) = &envelope.data {
            return Err(CodecError::Avro(
                avro::ToAvroError::NoBranch("CdcChangeEnvelope").to_string(),
            ));
        }
        self.write(envelope, buf)?;
        let encoded = &self.encoded[envelope.data.kind_index()];
        if encoded
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(VERIFY_EVERY)
            && let Err(e) = self.verify(envelope, &buf[FRAME_LEN..])
        {
            let _ = self.refused.set(e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// The unchecked write: frame, then the Avro body.
    fn write(&self, envelope: &Envelope, buf: &mut Vec<u8>) -> Result<(), CodecError> {
        buf.clear();
        buf.push(0);
        buf.extend_from_slice(&self.id.to_be_bytes());
        let root = self.schema;
        apache_avro::write_avro_datum_ref(root, &self.names, &WireEnvelope(envelope), buf)
            .map_err(|e| {
                // The serializer's message for a missing union branch is about
                // serde; say what it means here.
                match avro::branch_index(root, envelope.data.record_name()) {
                    Err(no_branch) => CodecError::Avro(no_branch.to_string()),
                    Ok(_) => CodecError::Avro(format!("schema id {}: {e}", self.id)),
                }
            })?;
        Ok(())
    }

    /// The sampled check of one record's `body` (the bytes after the frame).
    fn verify(&self, envelope: &Envelope, body: &[u8]) -> Result<(), CodecError> {
        let mismatch = |what: String| {
            let error = CodecError::Mismatch(format!(
                "schema id {}, event {} ({}): {what}",
                self.id, envelope.event_id, envelope.event_name
            ));
            tracing::error!(%error, "fast encode path disagrees with the schema; record not sent");
            error
        };
        let root = self.schema;
        // 1. The validated path (Value tree, full validation) writes the same bytes.
        let value = avro::to_avro(envelope, root)
            .map_err(|e| mismatch(format!("the validated path refuses it: {e}")))?;
        let validated = GenericDatumWriter::builder(root)
            .build()
            .and_then(|w| w.write_value_to_vec(value))
            .map_err(|e| mismatch(format!("the validated path refuses it: {e}")))?;
        if validated != body {
            return Err(mismatch(format!(
                "{} bytes written, the validated path writes {} other bytes",
                body.len(),
                validated.len()
            )));
        }
        // 2. The writer's schema reads every byte back.
        let mut rest = body;
        let decoded = GenericDatumReader::builder(root)
            .build()
            .and_then(|r| r.read_value(&mut rest))
            .map_err(|e| mismatch(format!("does not decode with its own schema: {e}")))?;
        if !rest.is_empty() {
            return Err(mismatch(format!(
                "{} bytes left after decoding",
                rest.len()
            )));
        }
        // 3. A consumer reads the same envelope back. An envelope the spec
        //    refuses (tests write such records on purpose) cannot round-trip.
        if envelope.validate().is_ok() {
            match avro::from_avro(decoded) {
                Ok(back) if back == *envelope => {}
                Ok(back) => return Err(mismatch(format!("decodes to another envelope: {back:?}"))),
                Err(e) => return Err(mismatch(format!("a consumer cannot decode it: {e}"))),
            }
        }
        Ok(())
    }
}

/// The envelope as the top-level record of the topic's schema, serialized
/// without allocating: strings borrowed or formatted on the stack.
struct WireEnvelope<'a>(&'a Envelope);

impl Serialize for WireEnvelope<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let mut id = uuid::Uuid::encode_buffer();
        let event_id: &str = e.event_id.hyphenated().encode_lower(&mut id);
        let time = IsoTime::of(e);
        let mut record = serializer.serialize_struct("OrderEventEnvelope", 7)?;
        record.serialize_field("event_id", event_id)?;
        record.serialize_field("event_name", e.event_name.as_str())?;
        record.serialize_field("event_version", &e.event_version)?;
        record.serialize_field("event_time", time.as_str())?;
        record.serialize_field("producer", &e.producer)?;
        record.serialize_field("trace_id", &e.trace_id)?;
        // Each payload serializes as a struct named after its Avro record,
        // which picks the `data` union branch of that name.
        match &e.data {
            EventData::Created(d) => record.serialize_field("data", d)?,
            EventData::PaymentSucceeded(d) => record.serialize_field("data", d)?,
            EventData::Shipped(d) => record.serialize_field("data", d)?,
            EventData::Canceled(d) => record.serialize_field("data", d)?,
            EventData::Refunded(d) => record.serialize_field("data", d)?,
            EventData::StockReserved(d) => record.serialize_field("data", d)?,
            EventData::StockReleased(d) => record.serialize_field("data", d)?,
            EventData::RowChange(_) => {
                return Err(serde::ser::Error::custom(
                    "a row change has no branch in the order schemas' `data`",
                ));
            }
        }
        record.end()
    }
}

/// `event_time` as [`format_utc`] writes it, on the stack for the years
/// 0000-9999 (allocated otherwise, where chrono's format changes).
enum IsoTime {
    Stack(StackStr<24>),
    Heap(String),
}

impl IsoTime {
    fn of(envelope: &Envelope) -> Self {
        use chrono::{Datelike, Timelike};
        let t = envelope.event_time;
        let mut s = StackStr::<24>::default();
        if (0..=9999).contains(&t.year())
            && write!(
                s,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                t.year(),
                t.month(),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                // A leap second's nanoseconds run past 1e9; chrono prints them as :60 — leave those to it.
                t.nanosecond() / 1_000_000
            )
            .is_ok()
            && t.nanosecond() < 1_000_000_000
        {
            Self::Stack(s)
        } else {
            Self::Heap(format_utc(&t))
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Self::Stack(s) => s.as_str(),
            Self::Heap(s) => s,
        }
    }
}

/// A fixed-capacity string on the stack (formatting fails when full).
pub(crate) struct StackStr<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for StackStr<N> {
    fn default() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> StackStr<N> {
    /// The text written so far.
    pub(crate) fn as_str(&self) -> &str {
        // Only whole `&str`s are ever copied in.
        std::str::from_utf8(&self.buf[..self.len]).expect("StackStr holds UTF-8")
    }
}

impl<const N: usize> std::fmt::Write for StackStr<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > N {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn event_time_on_the_stack_is_what_format_utc_writes() {
        let data = EventData::sample_lifecycle(1).remove(0);
        for millis in [
            0i64,
            1,
            999,
            1_700_000_000_123,
            253_402_300_799_999,
            -62_167_219_200_000,
        ] {
            let mut e = Envelope::new("t", data.clone());
            e.event_time = Utc.timestamp_millis_opt(millis).unwrap();
            assert_eq!(
                IsoTime::of(&e).as_str(),
                format_utc(&e.event_time),
                "{millis}"
            );
        }
    }

    #[test]
    fn a_full_stack_string_refuses_more() {
        let mut s = StackStr::<4>::default();
        assert!(write!(s, "abcd").is_ok());
        assert!(write!(s, "e").is_err());
        assert_eq!(s.as_str(), "abcd");
    }
}
