//! Outbox rows the relay cannot publish: their dead-letter record, their
//! log line and metric.
//!
//! A row whose record is over its topic's [`RecordLimit`] (decided before
//! its Kafka transaction, or learnt from the broker refusing it) is not
//! retried: it would fail every transaction it is in, and stop its shard.
//! The relay writes a small record to the dead-letter topic instead, in the
//! same Kafka transaction as the rest of the batch, and marks the row dead
//! in the outbox (`dead_ms`, `dead_reason`) when that transaction committed.
//!
//! The dead-letter record is what the persister and `orderpipe dlq` read
//! (docs/operations.md, "Outbox rows over the record limit"): the row's
//! key, the envelope's headers (event id and name, trace) with the failure
//! headers of [`crate::kafka::record::header`] (group [`GROUP`], class
//! `oversized`, the row's topic as the original topic, partition -1 and
//! the outbox row id as the offset: persisting it twice after a crash
//! inserts one row), the size headers ([`header::OUTBOX_ID`],
//! [`header::RECORD_BYTES`], [`header::LIMIT_BYTES`], [`header::LIMIT_FROM`],
//! [`header::TRUNCATED_TO`]), and as its value the start of
//! the envelope's JSON, cut to fit the dead-letter topic. The whole
//! envelope stays in the outbox row, to be re-queued.

use metrics::counter;
use rdkafka::message::{Headers, OwnedHeaders};

use crate::clock::now_ms;
use crate::envelope::Envelope;
use crate::kafka::record::{direct_dead_letter_headers, header, owned_headers};
use crate::kafka::size_limit::RecordLimit;
use crate::metrics::{InternalEvent, name};

/// The `orderpipe.group` of the relay's dead letters (`dlq list --group outbox-relay`).
pub const GROUP: &str = "outbox-relay";

/// The error class of a row over the record limit.
pub const OVERSIZED: &str = "oversized";

/// The value's content type: the start of the envelope as JSON.
const JSON_PREFIX: &str = "application/json; truncated";

/// At most this much of the envelope's JSON goes into the dead-letter value.
pub const PREVIEW_BYTES: usize = 2048;

/// An outbox row that cannot be published, and why.
#[derive(Debug, Clone)]
pub struct DeadRow {
    /// The outbox row.
    pub id: i64,
    /// Its topic.
    pub topic: String,
    /// Its key (the order id).
    pub key: String,
    /// The envelope as the outbox holds it (JSON).
    pub envelope_json: String,
    /// Its event id.
    pub event_id: String,
    /// Its event name.
    pub event_name: String,
    /// The record's size ([`RecordLimit::record_size`]).
    pub size: usize,
    /// The limit it is over.
    pub limit: RecordLimit,
    /// What the broker said, when it refused the record itself.
    pub refused: Option<String>,
}

impl DeadRow {
    /// The reason, as the outbox row, the log and the dead letter say it.
    pub fn reason(&self) -> String {
        let refused = self
            .refused
            .as_deref()
            .map(|e| format!("; the broker refused it: {e}"))
            .unwrap_or_default();
        format!(
            "outbox row {} (order {}, event {} {}, topic {}): record of {} bytes exceeds the limit of {} bytes ({}){refused}",
            self.id,
            self.key,
            self.event_id,
            self.event_name,
            self.topic,
            self.size,
            self.limit.max_bytes,
            self.limit.from
        )
    }

    /// The dead-letter record: its headers and its value, cut so that the
    /// whole record fits `dlq_limit`.
    pub fn record(&self, envelope: &Envelope, dlq_limit: &RecordLimit) -> (OwnedHeaders, Vec<u8>) {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        let original = crate::producer::record_headers(envelope);
        for h in original.iter().filter(|h| h.key != header::CONTENT_TYPE) {
            pairs.push((
                h.key,
                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
            ));
        }
        pairs.push((header::CONTENT_TYPE, JSON_PREFIX.to_string()));
        pairs.extend(direct_dead_letter_headers(
            GROUP,
            &self.topic,
            OVERSIZED,
            self.reason(),
            now_ms(),
        ));
        pairs.extend([
            // The outbox row id as the offset: persisting it twice inserts one row.
            (header::ORIGINAL_OFFSET, self.id.to_string()),
            (header::OUTBOX_ID, self.id.to_string()),
            (header::RECORD_BYTES, self.size.to_string()),
            (header::LIMIT_BYTES, self.limit.max_bytes.to_string()),
            (header::LIMIT_FROM, self.limit.from.clone()),
        ]);
        // The value gets what the headers leave of the dead-letter limit
        // (the truncation header's own few bytes counted).
        let sized: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let fixed = RecordLimit::record_size(self.key.as_bytes(), &[], &sized)
            + header::TRUNCATED_TO.len()
            + 16;
        let room = dlq_limit.max_bytes.saturating_sub(fixed).min(PREVIEW_BYTES);
        let value = cut(&self.envelope_json, room).as_bytes().to_vec();
        pairs.push((header::TRUNCATED_TO, value.len().to_string()));
        let headers = owned_headers(pairs.iter().map(|(k, v)| (*k, v.as_str())));
        (headers, value)
    }
}

/// The longest start of `text` of at most `bytes` bytes, on a character boundary.
fn cut(text: &str, bytes: usize) -> &str {
    &text[..text.floor_char_boundary(bytes.min(text.len()))]
}

/// An outbox row was dead-lettered (its Kafka transaction committed).
pub struct RowDeadLettered<'a>(pub &'a DeadRow);

impl InternalEvent for RowDeadLettered<'_> {
    fn emit(self) {
        let row = self.0;
        tracing::error!(
            outbox_id = row.id,
            order_id = %row.key,
            event_id = %row.event_id,
            event_name = %row.event_name,
            topic = %row.topic,
            size = row.size,
            limit = row.limit.max_bytes,
            limit_from = %row.limit.from,
            "outbox row over the record limit: dead-lettered; later events of its order wait behind it ({})",
            row.reason()
        );
        counter!(name::OUTBOX_DEAD_LETTERED, "topic" => row.topic.clone(), "event_name" => row.event_name.clone(),
            "error_class" => OVERSIZED).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::EventData;

    #[test]
    fn the_dead_letter_record_fits_its_limit_and_says_where_it_came_from() {
        let mut envelope = Envelope::new("t", EventData::sample_created(32));
        if let EventData::Created(d) = &mut envelope.data {
            d.sku = "é".repeat(5000);
        }
        let json = serde_json::to_string(&envelope).unwrap();
        let row = DeadRow {
            id: 7,
            topic: "order.events.v1".into(),
            key: "32".into(),
            envelope_json: json.clone(),
            event_id: envelope.event_id.to_string(),
            event_name: "order.created".into(),
            size: 10_123,
            limit: RecordLimit {
                max_bytes: 3939,
                from: "topic order.events.v1 max.message.bytes = 4000".into(),
            },
            refused: None,
        };
        for max in [1_000_000, 1200] {
            let dlq = RecordLimit {
                max_bytes: max,
                from: String::new(),
            };
            let (headers, value) = row.record(&envelope, &dlq);
            let pairs: Vec<(&str, &[u8])> =
                headers.iter().map(|h| (h.key, h.value.unwrap())).collect();
            let size = RecordLimit::record_size(b"32", &value, &pairs);
            assert!(size <= max, "{size} > {max}");
            assert!(json.starts_with(std::str::from_utf8(&value).unwrap()));
            let get = |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            assert_eq!(get(header::OUTBOX_ID).as_deref(), Some("7"));
            assert_eq!(get(header::ORIGINAL_OFFSET).as_deref(), Some("7"));
            assert_eq!(get(header::TRUNCATED_TO), Some(value.len().to_string()));
            assert_eq!(get(header::CONTENT_TYPE).as_deref(), Some(JSON_PREFIX));
            let message = get(header::ERROR_MESSAGE).unwrap();
            assert!(
                message.contains("outbox row 7 (order 32")
                    && message.contains("10123 bytes exceeds the limit of 3939"),
                "{message}"
            );
        }
    }
}
