//! Per-order ordering through retries, the DLQ and replay
//! (`consumer.ordering = key`, the default).
//!
//! Partitioning by `order_id` keeps one order's events in order in the topic,
//! but a non-blocking retry tier breaks it again: while an order's payment
//! waits in the retry topic, its refund flows past and is applied first. So:
//!
//! * **Park**: when a record of key K leaves a group's main path (to the
//!   retry topic or the DLQ), K is parked for that group in `parked_keys`,
//!   with that record as its *head*.
//! * **Hold**: while K is parked, every later record of K (main or retry
//!   topic) that is not the head is stored in `held_records`, in arrival
//!   order, in the same transaction as the rest of its batch; its offset then
//!   moves on. Other keys keep flowing.
//! * **Release**: when the head is applied (a retry succeeds, or a replay of
//!   its dead letter), or an operator ignores it with `--release-followers`,
//!   the held records are applied one by one in order, each deleted in the
//!   transaction that applies it. One that fails becomes the new head (it is
//!   forwarded to the retry topic) and the rest stay behind it. K is unparked
//!   when none remain.
//!
//! The head is recognised by where it was first consumed (its [`Origin`],
//! carried across hops by the `orderpipe.original-*` headers and stored in
//! the `head_topic`, `head_partition`, `head_offset` columns) or by its
//! event id (a replay to the original topic has new coordinates).
//!
//! The happy path costs no query: each consumer keeps the set of its parked
//! keys in memory (loaded when a partition is assigned) and only consults
//! the table for keys in that set and for retry-topic records. Parking and
//! holding take the parked row's lock (`SELECT ... FOR UPDATE`), so a hold
//! and the final unpark of the same key never interleave.
//!
//! By audience:
//!
//! * [`gate`]: the partition worker's decisions (open, head, hold,
//!   duplicate; park or re-head; whether a head is done);
//! * [`store`]: the `parked_keys` and `held_records` statements, for the
//!   worker's transactions and the consumer's background releaser and gauges;
//! * the operators' views of held records and heads live beside the dead
//!   letters, in [`crate::dlq::held`].

pub mod gate;
pub mod store;

use std::fmt;

use rdkafka::message::OwnedMessage;
use rdkafka::Timestamp;
use serde::{Deserialize, Serialize};

use crate::kafka::record::{FailureHistory, headers_from_json};

pub use gate::{Gate, decide, gate, head_done, park};
pub use store::{
    HeldRecord, OrderingGauges, Parked, delete_held, first_held, gauges, hold, keys_of_partition, lock, lock_keys, mark_release, releasable,
    unpark,
};

/// Whether a group keeps per-key order under failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OrderingMode {
    /// Park a key whose record left the main path; hold its later records.
    #[default]
    Key,
    /// Throughput first: later records of a failing key are applied while
    /// it waits in the retry topic or the DLQ (per-key order is lost then).
    None,
}

/// Why a key is parked (`parked_keys.state`, stored as its text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ParkState {
    /// The head waits in the retry topic.
    Retrying,
    /// The head was dead-lettered.
    Dead,
    /// An operator ignored the head and released its followers.
    Release,
}

impl ParkState {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retrying => "retrying",
            Self::Dead => "dead",
            Self::Release => "release",
        }
    }
}

impl fmt::Display for ParkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `parked_keys.state` this build does not know (written by a newer one).
#[derive(Debug, thiserror::Error)]
#[error("unknown parked-key state `{0}` (known: retrying, dead, release)")]
pub struct UnknownParkState(String);

impl TryFrom<String> for ParkState {
    type Error = UnknownParkState;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        match text.as_str() {
            "retrying" => Ok(Self::Retrying),
            "dead" => Ok(Self::Dead),
            "release" => Ok(Self::Release),
            _ => Err(UnknownParkState(text)),
        }
    }
}

/// Where a record was first consumed: stable across retry hops (the
/// `orderpipe.original-*` headers) and kept by a dead letter
/// (`original_topic`, `original_partition`, `original_offset`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

impl Origin {
    /// Where `message` was first consumed.
    pub fn of(message: &OwnedMessage) -> Self {
        let h = FailureHistory::of(message);
        Self { topic: h.original_topic, partition: h.original_partition, offset: h.original_offset }
    }
}

/// `topic/partition/offset`, as also written to `parked_keys.head_origin`.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

impl HeldRecord {
    /// The record as it was consumed, to apply or forward it again.
    pub fn to_message(&self) -> OwnedMessage {
        let timestamp = self.source_timestamp.map_or(Timestamp::NotAvailable, Timestamp::CreateTime);
        OwnedMessage::new(
            Some(self.payload.clone()),
            Some(self.key.clone().into_bytes()),
            self.source_topic.clone(),
            timestamp,
            self.source_partition,
            self.source_offset,
            Some(headers_from_json(&self.headers)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::record::{header, headers_json, with_headers};
    use rdkafka::message::{Header, OwnedHeaders};

    fn record(topic: &str, offset: i64, headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(Some(b"v".to_vec()), Some(b"42".to_vec()), topic.into(), Timestamp::CreateTime(1), 3, offset, Some(headers))
    }

    #[test]
    fn a_head_keeps_its_origin_across_retry_hops() {
        let first = record("order.events.v1", 77, OwnedHeaders::new());
        assert_eq!(Origin::of(&first), Origin { topic: "order.events.v1".into(), partition: 3, offset: 77 });
        assert_eq!(Origin::of(&first).to_string(), "order.events.v1/3/77");
        let hop = with_headers(
            &first,
            &[(header::ORIGINAL_TOPIC, "order.events.v1".into()), (header::ORIGINAL_PARTITION, "3".into()), (header::ORIGINAL_OFFSET, "77".into())],
        );
        let retried = record("order.events.v1.retry.g", 5, hop);
        assert_eq!(Origin::of(&retried), Origin::of(&first), "the same head on the retry topic");
    }

    #[test]
    fn held_headers_round_trip() {
        let message = record("t", 1, OwnedHeaders::new().insert(Header { key: "event_id", value: Some("e-1") }));
        let back = headers_from_json(&headers_json(&message));
        let restored = record("t", 1, back);
        assert_eq!(crate::kafka::record::header_text(&restored, "event_id").as_deref(), Some("e-1"));
    }

    #[test]
    fn park_states_round_trip_and_an_unknown_one_is_named() {
        for state in [ParkState::Retrying, ParkState::Dead, ParkState::Release] {
            assert_eq!(ParkState::try_from(state.as_str().to_string()).unwrap(), state);
        }
        let error = ParkState::try_from("paused".to_string()).unwrap_err().to_string();
        assert!(error.contains("`paused`") && error.contains("retrying, dead, release"), "{error}");
    }
}
