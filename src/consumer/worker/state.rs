//! What every stage of a partition worker shares: the partition it works
//! for ([`PartitionState`]: ownership, counts, spans, the offset store, the
//! unit of order), the record the stages pass along ([`Item`]), and the
//! way out of every step ([`Revoked`]).
//!
//! This file calls no stage: the stages build on it, never the other way.

use std::fmt;
use std::sync::Arc;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::backoff::until_available;
use crate::consumer::assignment::PartitionKey;
use crate::consumer::{ConsumeSummary, Shared};
use crate::envelope::Envelope;
use crate::kafka::record::{header, header_text};
use crate::ordering::{self, OrderKey};

/// The partition is no longer this worker's: stop. Its next owner re-reads
/// the records whose offsets were not stored and redoes their work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revoked;

/// A record and its decoded envelope (None = poison, already dead-lettered).
#[derive(Clone)]
pub(super) struct Item {
    pub message: ConsumedRecord,
    pub envelope: Option<Envelope>,
    /// Set when the record is being released from `held_records`: it skips
    /// the parked-key gate and its held row is deleted as it is applied.
    pub held_id: Option<i64>,
}

/// Names a retried step and where it runs, for its log line:
/// `cannot park the key (order.events.v1/3)`; formatted only when logged.
pub(super) struct At<'a> {
    pub what: &'a str,
    pub partition: &'a PartitionKey,
    pub offset: Option<i64>,
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}/{}",
            self.what, self.partition.0, self.partition.1
        )?;
        if let Some(offset) = self.offset {
            write!(f, " at offset {offset}")?;
        }
        f.write_str(")")
    }
}

/// One assigned partition, as every stage of its worker sees it: the
/// consumer's shared state, the partition, and the generation it was
/// assigned in (ownership is checked against it).
pub(super) struct PartitionState {
    pub shared: Arc<Shared>,
    pub key: PartitionKey,
    pub generation: u64,
}

impl PartitionState {
    /// Ok while the partition is still this worker's.
    pub fn still_owned(&self) -> Result<(), Revoked> {
        if self
            .shared
            .assignment
            .is_current(&self.key, self.generation)
        {
            Ok(())
        } else {
            Err(Revoked)
        }
    }

    pub fn is_retry_partition(&self) -> bool {
        self.key.0 == self.shared.forwarder.topics.retry
    }

    pub fn count(&self, f: impl FnOnce(&mut ConsumeSummary)) {
        f(&mut self.shared.summary.lock().expect("summary lock"));
    }

    pub fn ordered(&self) -> bool {
        self.shared.options.keeps_key_order()
    }

    pub fn at<'a>(&'a self, what: &'a str) -> At<'a> {
        At {
            what,
            partition: &self.key,
            offset: None,
        }
    }

    /// Runs a database step until it succeeds, waiting with backoff and
    /// reporting the database down meanwhile (its next owner re-reads the
    /// records and redoes the step if the partition is revoked first).
    pub async fn until_db_ok<T, F: Future<Output = Result<T, crate::db::DbError>>>(
        &self,
        what: &str,
        step: impl FnMut() -> F,
    ) -> Result<T, Revoked> {
        let health = &self.shared.health;
        let report = |e: crate::db::DbError| async move {
            health.db_down(&e.to_string()).await;
            Ok(e)
        };
        until_available(self.at(what), step, report, || self.still_owned()).await
    }

    /// The span of one record: trace id (from the envelope, else the
    /// `trace_id` header), event id and where the record sits. Exported over
    /// OTLP as a child of the record's `traceparent`.
    pub fn span(&self, message: &ConsumedRecord, envelope: Option<&Envelope>) -> tracing::Span {
        let trace_id = envelope
            .map(|e| e.trace_id.clone())
            .or_else(|| header_text(message, header::TRACE_ID))
            .unwrap_or_default();
        let event_id = envelope
            .map(|e| e.event_id.to_string())
            .or_else(|| header_text(message, header::EVENT_ID))
            .unwrap_or_default();
        let span = tracing::info_span!(
            "record",
            trace_id = %trace_id,
            event_id = %event_id,
            group = %self.shared.options.group,
            topic = %self.key.0,
            partition = self.key.1,
            offset = message.offset()
        );
        crate::telemetry::continue_trace(&span, || header_text(message, header::TRACEPARENT));
        span
    }

    /// The record's span around an event logged at DEBUG (an applied
    /// record, a duplicate skipped): [`tracing::Span::none`] unless that
    /// line would be printed (DEBUG on for the events' own target) or OTLP
    /// spans are on. The happy path emits one such event per record, and
    /// building a span costs its fields' formatting whether or not the
    /// line inside is printed.
    pub fn debug_span(&self, message: &ConsumedRecord, envelope: &Envelope) -> tracing::Span {
        use crate::consumer::events::TARGET;
        if tracing::enabled!(target: TARGET, tracing::Level::DEBUG) || crate::telemetry::exporting()
        {
            self.span(message, Some(envelope))
        } else {
            tracing::Span::none()
        }
    }

    /// Stores `offset + 1` as the next offset to commit for this partition.
    pub fn store_offset(&self, offset: i64) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(&self.key.0, self.key.1, Offset::Offset(offset + 1))
            .is_ok()
            && let Err(e) = self.shared.consumer.store_offsets(&list)
        {
            // The partition was revoked after the commit: the next owner
            // re-reads these records and skips them as duplicates.
            tracing::debug!(partition = self.key.1, error = %e, "offset not stored");
        }
    }

    /// The unit of order of a record of `key`: the key within the record's
    /// main topic ([`ordering::key_topic`]).
    pub fn order_key(&self, message: &ConsumedRecord, key: String) -> OrderKey {
        let group = self.shared.options.group.as_str();
        OrderKey {
            topic: ordering::key_topic(message, &self.shared.forwarder.topics.retry, group),
            key,
        }
    }

    /// Whether a record of `key` asks the ordering gate: with per-key
    /// ordering, on the retry topic, or when the key may be parked.
    pub fn gated(&self, key: &OrderKey) -> bool {
        self.ordered() && (self.is_retry_partition() || self.shared.is_parked(&key.topic, &key.key))
    }
}
