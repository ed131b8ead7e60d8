//! Envelope <-> Avro value conversion for `schemas/order.events.v1.avsc`.
//!
//! The `data` field is a union of one record per event name. Decoding picks
//! the payload type from `event_name` (not from the union index), so a writer
//! that reorders or extends the union still decodes; fields the reader does
//! not know are ignored and fields it needs but the writer lacks are reported
//! by name.

use apache_avro::Schema;
use apache_avro::types::Value;
use serde::de::DeserializeOwned;

use crate::envelope::data::PayloadDecoder;
use crate::envelope::{Envelope, EnvelopeError, EnvelopeParts, EventData};

/// Why an envelope cannot be written with a schema.
#[derive(Debug, thiserror::Error)]
pub enum ToAvroError {
    /// The payload does not serialize.
    #[error(transparent)]
    Avro(#[from] apache_avro::Error),
    /// The schema's `data` union has no branch for this payload.
    #[error(
        "the topic's schema has no `{0}` branch in `data`: this event does not belong on this topic"
    )]
    NoBranch(&'static str),
}

/// Index of the `data` union branch called `record` in `schema`.
pub(crate) fn branch_index(schema: &Schema, record: &'static str) -> Result<u32, ToAvroError> {
    let Schema::Record(root) = schema else {
        return Err(ToAvroError::NoBranch(record));
    };
    let data = root.fields.iter().find(|f| f.name == "data");
    let Some(Schema::Union(union)) = data.map(|f| &f.schema) else {
        return Err(ToAvroError::NoBranch(record));
    };
    union
        .variants()
        .iter()
        .position(|v| matches!(v, Schema::Record(r) if r.name.name() == record))
        .map(|i| i as u32)
        .ok_or(ToAvroError::NoBranch(record))
}

/// The envelope as the top-level Avro record of `schema`; the payload goes
/// into the `data` branch named after its record.
pub fn to_avro(envelope: &Envelope, schema: &Schema) -> Result<Value, ToAvroError> {
    let payload = match &envelope.data {
        EventData::Created(d) => apache_avro::to_value(d)?,
        EventData::PaymentSucceeded(d) => apache_avro::to_value(d)?,
        EventData::Shipped(d) => apache_avro::to_value(d)?,
        EventData::Canceled(d) => apache_avro::to_value(d)?,
        EventData::Refunded(d) => apache_avro::to_value(d)?,
        EventData::StockReserved(d) => apache_avro::to_value(d)?,
        EventData::StockReleased(d) => apache_avro::to_value(d)?,
        // `orderpipe cdc` writes these (cdc::change::ChangeEvent::to_avro).
        EventData::RowChange(_) => return Err(ToAvroError::NoBranch("CdcChangeEnvelope")),
    };
    let index = branch_index(schema, envelope.data.record_name())?;
    let text = |s: &str| Value::String(s.to_string());
    Ok(Value::Record(vec![
        ("event_id".into(), text(&envelope.event_id.to_string())),
        ("event_name".into(), text(envelope.event_name.as_str())),
        ("event_version".into(), text(&envelope.event_version)),
        ("event_time".into(), text(&envelope.event_time_iso())),
        ("producer".into(), text(&envelope.producer)),
        ("trace_id".into(), text(&envelope.trace_id)),
        ("data".into(), Value::Union(index, Box::new(payload))),
    ]))
}

/// Builds and validates an envelope from a decoded Avro record.
pub fn from_avro(value: Value) -> Result<Envelope, EnvelopeError> {
    let Value::Record(fields) = value else {
        return Err(EnvelopeError::field(
            "<root>",
            "the Avro value is not a record",
        ));
    };
    // The envelope's string fields, in this order (no map: six names to compare).
    const STRINGS: [&str; 6] = [
        "event_id",
        "event_name",
        "event_version",
        "event_time",
        "producer",
        "trace_id",
    ];
    let mut strings: [Option<String>; 6] = Default::default();
    let mut data = None;
    for (name, value) in fields {
        match (name.as_str(), value) {
            ("data", Value::Union(_, inner)) => data = Some(*inner),
            ("data", other) => data = Some(other),
            (name, Value::String(s)) => {
                if let Some(i) = STRINGS.iter().position(|field| *field == name) {
                    strings[i] = Some(s);
                }
            }
            _ => {}
        }
    }
    let mut take = |i: usize| {
        strings[i].take().ok_or_else(|| {
            EnvelopeError::field(STRINGS[i], "missing required field (or not a string)")
        })
    };
    let parts = EnvelopeParts {
        event_id: take(0)?,
        event_name: take(1)?,
        event_version: take(2)?,
        event_time: take(3)?,
        producer: take(4)?,
        trace_id: take(5)?,
    };
    let data = data.ok_or_else(|| EnvelopeError::field("data", "missing required field"))?;
    parts.build(|name| EventData::decode_with(name, AvroPayload(data)))
}

struct AvroPayload(Value);

impl PayloadDecoder for AvroPayload {
    type Error = apache_avro::Error;
    fn decode<T: DeserializeOwned>(self) -> Result<T, Self::Error> {
        apache_avro::from_value(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaCatalog;

    #[test]
    #[allow(deprecated)] // the one-shot datum helpers are fine in a test
    fn round_trips_every_event_through_the_schema() {
        let catalog = SchemaCatalog::embedded();
        let schema = &catalog.order_events().parsed;
        for envelope in EventData::sample_lifecycle(77)
            .into_iter()
            .map(|data| Envelope::new("sample", data))
        {
            let value = to_avro(&envelope, schema).unwrap();
            let bytes = apache_avro::to_avro_datum(schema, value).unwrap();
            let back = apache_avro::from_avro_datum(schema, &mut &bytes[..], None).unwrap();
            assert_eq!(from_avro(back).unwrap(), envelope);
        }
    }
}
