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
//! * **Key**: K is a record key *within its main topic* ([`OrderKey`]): a
//!   group reading several topics (a router binding over the order topic
//!   and `cdc.*` topics) keeps order 7 and row 7 of a table apart. A
//!   retry-topic record belongs to the main topic it was first consumed
//!   from ([`key_topic`]).
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

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;
use rdkafka::Timestamp;
use rdkafka::message::OwnedMessage;
use serde::{Deserialize, Serialize};

use crate::kafka::record::{FailureHistory, headers_from_json};
use crate::retry::topic_read_by;

pub use gate::{Gate, Park, decide, gate, head_done, park, park_all};
pub use store::{
    HeldRecord, OrderingGauges, Parked, delete_held, delete_held_all, first_held, gauges, held_of,
    hold, keys_of_partition, lock, lock_keys, mark_release, releasable, unpark,
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

/// The unit of per-key order: a record key (the order id, a row's primary
/// key) within the main topic it belongs to (`parked_keys.key_topic`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct OrderKey {
    /// The main topic the group reads the key from.
    pub topic: String,
    /// The record key.
    pub key: String,
}

/// `key 7 of cdc.shop.account`, for log lines and messages.
impl fmt::Display for OrderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {} of {}", self.key, self.topic)
    }
}

/// The main topic a record of `group` belongs to for per-key order: the
/// topic it was read from, or, for a record read from the group's retry
/// topic `retry_topic`, the topic it was first consumed from (its
/// `orderpipe.original-topic` header; one written there by hand, without
/// it, belongs to the topic the retry topic is named after).
pub fn key_topic(message: &impl Message, retry_topic: &str, group: &str) -> String {
    if message.topic() != retry_topic {
        return message.topic().to_string();
    }
    Origin::of(message).key_topic(group).to_string()
}

/// The keys a consumer knows to be parked, by topic: the hot path asks it
/// for every record without allocating.
#[derive(Debug, Default)]
pub struct ParkedSet(HashMap<String, HashSet<String>>);

impl ParkedSet {
    /// Whether `key` of `topic` is in the set.
    pub fn contains(&self, topic: &str, key: &str) -> bool {
        self.0.get(topic).is_some_and(|keys| keys.contains(key))
    }

    /// Adds a key.
    pub fn insert(&mut self, key: OrderKey) {
        self.0.entry(key.topic).or_default().insert(key.key);
    }

    /// Forgets a key.
    pub fn remove(&mut self, key: &OrderKey) {
        if let Some(keys) = self.0.get_mut(&key.topic) {
            keys.remove(&key.key);
        }
    }
}

impl Extend<OrderKey> for ParkedSet {
    fn extend<T: IntoIterator<Item = OrderKey>>(&mut self, keys: T) {
        for key in keys {
            self.insert(key);
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
    pub fn of(message: &impl Message) -> Self {
        let h = FailureHistory::of(message);
        Self {
            topic: h.original_topic,
            partition: h.original_partition,
            offset: h.original_offset,
        }
    }

    /// The main topic of a record first consumed here, for `group`: this
    /// topic, or the one a retry topic of the group is named after (a
    /// record written to the retry topic by hand carries no origin).
    pub fn key_topic(&self, group: &str) -> &str {
        topic_read_by(&self.topic, group)
    }
}

/// `topic/partition/offset`, as also written to `parked_keys.head_origin`.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

impl HeldRecord {
    /// The key it is held behind.
    pub fn order_key(&self) -> OrderKey {
        OrderKey {
            topic: self.key_topic.clone(),
            key: self.key.clone(),
        }
    }

    /// The record as it was consumed, to apply or forward it again.
    pub fn to_message(&self) -> ConsumedRecord {
        let timestamp = self
            .source_timestamp
            .map_or(Timestamp::NotAvailable, Timestamp::CreateTime);
        let message = OwnedMessage::new(
            Some(self.payload.clone()),
            Some(self.key.clone().into_bytes()),
            self.source_topic.clone(),
            timestamp,
            self.source_partition,
            self.source_offset,
            Some(headers_from_json(&self.headers)),
        );
        ConsumedRecord::of(&message, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::record::{header, headers_json, with_headers};
    use rdkafka::message::{Header, OwnedHeaders};

    fn record(topic: &str, offset: i64, headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"42".to_vec()),
            topic.into(),
            Timestamp::CreateTime(1),
            3,
            offset,
            Some(headers),
        )
    }

    #[test]
    fn a_head_keeps_its_origin_across_retry_hops() {
        let first = record("order.events.v1", 77, OwnedHeaders::new());
        assert_eq!(
            Origin::of(&first),
            Origin {
                topic: "order.events.v1".into(),
                partition: 3,
                offset: 77
            }
        );
        assert_eq!(Origin::of(&first).to_string(), "order.events.v1/3/77");
        let hop = with_headers(
            &first,
            &[
                (header::ORIGINAL_TOPIC, "order.events.v1".into()),
                (header::ORIGINAL_PARTITION, "3".into()),
                (header::ORIGINAL_OFFSET, "77".into()),
            ],
        );
        let retried = record("order.events.v1.retry.g", 5, hop);
        assert_eq!(
            Origin::of(&retried),
            Origin::of(&first),
            "the same head on the retry topic"
        );
    }

    #[test]
    fn a_retry_topic_record_belongs_to_the_main_topic_it_came_from() {
        let retry = crate::retry::retry_topic("order.events.v1", "g");
        let main = record("cdc.shop.account", 77, OwnedHeaders::new());
        assert_eq!(key_topic(&main, &retry, "g"), "cdc.shop.account");
        let hop = with_headers(
            &main,
            &[
                (header::ORIGINAL_TOPIC, "cdc.shop.account".into()),
                (header::ORIGINAL_PARTITION, "3".into()),
                (header::ORIGINAL_OFFSET, "77".into()),
            ],
        );
        assert_eq!(
            key_topic(&record(&retry, 5, hop), &retry, "g"),
            "cdc.shop.account",
            "not the retry topic's name"
        );
        assert_eq!(
            key_topic(&record(&retry, 6, OwnedHeaders::new()), &retry, "g"),
            "order.events.v1",
            "by hand, without an origin"
        );
        let mut parked = ParkedSet::default();
        parked.extend([OrderKey {
            topic: "order.events.v1".into(),
            key: "7".into(),
        }]);
        assert!(parked.contains("order.events.v1", "7"));
        assert!(
            !parked.contains("cdc.shop.account", "7"),
            "row 7 of a table is another key"
        );
        parked.remove(&OrderKey {
            topic: "order.events.v1".into(),
            key: "7".into(),
        });
        assert!(!parked.contains("order.events.v1", "7"));
    }

    #[test]
    fn held_headers_round_trip() {
        let message = record(
            "t",
            1,
            OwnedHeaders::new().insert(Header {
                key: "event_id",
                value: Some("e-1"),
            }),
        );
        let back = headers_from_json(&headers_json(&message));
        let restored = record("t", 1, back);
        assert_eq!(
            crate::kafka::record::header_text(&restored, "event_id").as_deref(),
            Some("e-1")
        );
    }

    #[test]
    fn park_states_round_trip_and_an_unknown_one_is_named() {
        for state in [ParkState::Retrying, ParkState::Dead, ParkState::Release] {
            assert_eq!(
                ParkState::try_from(state.as_str().to_string()).unwrap(),
                state
            );
        }
        let error = ParkState::try_from("paused".to_string())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`paused`") && error.contains("retrying, dead, release"),
            "{error}"
        );
    }
}
