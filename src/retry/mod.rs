//! The error-handler tier after a record fails in a consumer group.
//!
//! 1. Local retries: a retryable failure is retried in place a few times
//!    (`retry.local_retries`, default 3) before anything leaves the partition.
//! 2. Delayed retries: the record goes to the group's own retry topic
//!    `<topic>.retry.<group>` (no other group re-runs it) with a due time;
//!    the main partition moves on. The group's retry partition waits for the
//!    due time with the partition paused, then re-runs the same handlers
//!    under the same dedup rule.
//! 3. Dead letter: after the last delayed attempt, or at once for a fatal
//!    failure (poison, invalid event, handler says invalid), the record goes
//!    to `order.events.v1.dlq` with failure headers.
//!
//! Forwarded records keep the original key, value and headers byte for
//! byte; orderpipe's own `orderpipe.*` headers are replaced on every hop,
//! never appended, so a record failing many times does not grow. The
//! header names, reading them back ([`FailureHistory`]) and replacing them
//! are the Kafka floor's ([`crate::kafka::record`]); this module decides.
//!
//! [`tier_record`] is the one writer of these records: the [`Forwarder`]
//! and `dlq replay` (see [`crate::dlq::replay`]) both call it, so a replayed
//! record carries the headers a forwarded one does and goes to the retry
//! topic of the topic its group reads.
//!
//! * [`policy`] resolves the schedule: profiles named by their delays
//!   (`default`, `10s-1m-5m`, `10s-30s-1m-5m`, `5s-30s-5m`; the older
//!   `seed000`, `seed001`, `seed003` are aliases) or explicit delays, with jitter, per group.

pub mod policy;
pub mod redrive;

use std::time::Duration;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use crate::clock::now_ms;
use crate::kafka::record::{Failure, FailureHistory, header, replace_orderpipe_headers};

pub use policy::{RetryLayer, RetryPolicy, RetrySettings};

/// Where a failed record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// To the retry topic, delayed attempt `attempt`, due after `delay`.
    Retry {
        /// Delayed attempt number (1-based).
        attempt: u32,
        /// Wait before it.
        delay: Duration,
    },
    /// To the dead-letter topic.
    DeadLetter,
}

/// Suffix between a topic and a group in a retry topic's name.
const RETRY_INFIX: &str = ".retry.";

/// `<topic>.retry.<group>`, with characters Kafka does not allow in topic
/// names replaced by `_`.
pub fn retry_topic(topic: &str, group: &str) -> String {
    let safe: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{topic}{RETRY_INFIX}{safe}")
}

/// The topic `group` reads, given a failed record's original topic: the
/// original topic itself, or the topic whose retry topic it is when the
/// record was first consumed from `group`'s retry topic (it carried no
/// history: written there by hand or by another tool).
pub fn topic_read_by<'t>(original_topic: &'t str, group: &str) -> &'t str {
    let retry_suffix = retry_topic("", group);
    original_topic
        .strip_suffix(retry_suffix.as_str())
        .filter(|topic| !topic.is_empty())
        .unwrap_or(original_topic)
}

/// The error-tier topics of a group: its retry topic and the shared
/// dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierTopics {
    /// `<topic the group reads>.retry.<group>`.
    pub retry: String,
    /// The dead-letter topic.
    pub dead_letter: String,
}

impl TierTopics {
    /// The tier of `group` reading `topic`.
    pub fn of(topic: &str, group: &str, dead_letter: &str) -> Self {
        Self {
            retry: retry_topic(topic, group),
            dead_letter: dead_letter.to_string(),
        }
    }
}

/// A failed record's next stop in the error tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// The group's retry topic, for delayed attempt `attempt` due at `due_ms`.
    Retry {
        /// Delayed attempt number (1-based).
        attempt: u32,
        /// When it is due (ms since the epoch).
        due_ms: i64,
    },
    /// The dead-letter topic.
    DeadLetter,
    /// Back to the group's retry topic from dead-letter row `row_id`
    /// (`dlq replay`): a fresh retry budget (attempt 0), due at `due_ms`.
    Replay {
        /// The `dead_letters` row.
        row_id: i64,
        /// When it is due (ms since the epoch).
        due_ms: i64,
    },
    /// To the topic the group reads, from dead-letter row `row_id`
    /// (`dlq replay --to-original`): every group sees it as a new record,
    /// so it carries no failure history.
    ReplayToOriginal {
        /// The `dead_letters` row.
        row_id: i64,
    },
}

/// The failure a record's headers report: the last one.
#[derive(Debug, Clone, Copy)]
pub struct LastFailure<'a> {
    /// Stable class (`handler_retryable`, `not_framed`, ...).
    pub class: &'a str,
    /// What went wrong, already bounded in length.
    pub message: &'a str,
    /// When (ms since the epoch).
    pub at_ms: i64,
}

/// A record of the error tier: where it goes and its headers. Its key and
/// value are the original's, byte for byte.
#[derive(Debug)]
pub struct TierRecord {
    /// Destination topic.
    pub topic: String,
    /// The original's headers minus `orderpipe.*`, plus the hop's.
    pub headers: OwnedHeaders,
}

impl TierRecord {
    /// The record to send, with the original `key` and `value`.
    pub fn to_send<'a>(
        &'a self,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    ) -> FutureRecord<'a, [u8], [u8]> {
        let mut record = FutureRecord::to(&self.topic).headers(self.headers.clone());
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(value) = value {
            record = record.payload(value);
        }
        record
    }
}

/// The one writer of retry-topic, dead-letter and replayed records: the
/// destination of `hop` and the headers that go with it. A forwarded and a
/// replayed record carry the same failure headers (a replay adds
/// [`header::REPLAYED_FROM`]), so a record failing again after a replay
/// keeps its origin and updates the same dead-letter row.
///
/// `history.executions` counts the handler executions up to this hop,
/// the failing attempt's included; a replay starts them over.
pub fn tier_record<'h>(
    original_headers: impl IntoIterator<Item = (&'h str, Option<&'h [u8]>)>,
    history: &FailureHistory,
    group: &str,
    hop: Hop,
    last: LastFailure<'_>,
    topics: &TierTopics,
) -> TierRecord {
    let (topic, attempt, executions, due, replayed_from) = match hop {
        Hop::Retry { attempt, due_ms } => (
            &topics.retry,
            attempt,
            history.executions,
            Some(due_ms),
            None,
        ),
        Hop::DeadLetter => (
            &topics.dead_letter,
            history.attempt,
            history.executions,
            None,
            None,
        ),
        Hop::Replay { row_id, due_ms } => (&topics.retry, 0, 0, Some(due_ms), Some(row_id)),
        Hop::ReplayToOriginal { row_id } => {
            let ours = [(header::REPLAYED_FROM, row_id.to_string())];
            return TierRecord {
                topic: topic_read_by(&history.original_topic, group).to_string(),
                headers: replace_orderpipe_headers(original_headers, &ours),
            };
        }
    };
    let ours: Vec<(&str, String)> = [
        (header::ORIGINAL_TOPIC, Some(history.original_topic.clone())),
        (
            header::ORIGINAL_PARTITION,
            Some(history.original_partition.to_string()),
        ),
        (
            header::ORIGINAL_OFFSET,
            Some(history.original_offset.to_string()),
        ),
        (
            header::ORIGINAL_TIMESTAMP,
            history.original_timestamp.map(|t| t.to_string()),
        ),
        (header::GROUP, Some(group.to_string())),
        (header::ATTEMPT, Some(attempt.to_string())),
        (header::ATTEMPTS, Some(executions.to_string())),
        (header::DUE, due.map(|d| d.to_string())),
        (header::ERROR_CLASS, Some(last.class.to_string())),
        (header::ERROR_MESSAGE, Some(last.message.to_string())),
        (
            header::FIRST_FAILURE,
            Some(history.first_failure_ms.unwrap_or(last.at_ms).to_string()),
        ),
        (header::LAST_FAILURE, Some(last.at_ms.to_string())),
        (
            header::REPLAYED_FROM,
            replayed_from.map(|id| id.to_string()),
        ),
        (header::RETRY_TOPIC, Some(topics.retry.clone())),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    TierRecord {
        topic: topic.clone(),
        headers: replace_orderpipe_headers(original_headers, &ours),
    }
}

/// Forwards failed records of one group to its retry topic or the DLQ.
pub struct Forwarder {
    producer: crate::kafka::client::MeasuredProducer,
    /// The group's retry topic and the dead-letter topic.
    pub topics: TierTopics,
    group: String,
    policy: RetryPolicy,
}

impl Forwarder {
    /// A forwarder using `producer` (idempotent; see [`crate::producer::config`]).
    pub fn new(
        producer: crate::kafka::client::MeasuredProducer,
        topics: TierTopics,
        group: &str,
        policy: RetryPolicy,
    ) -> Self {
        Self {
            producer,
            topics,
            group: group.to_string(),
            policy,
        }
    }

    /// The schedule in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Sends `message` on to its next stop and waits for the broker's
    /// acknowledgement; the caller moves its offset only after this returns Ok.
    pub async fn forward(
        &self,
        message: &ConsumedRecord,
        failure: &Failure,
    ) -> Result<Routed, KafkaError> {
        let mut history = FailureHistory::of(message);
        history.executions += failure.executions;
        let now = now_ms();
        let (routed, hop) = match (
            failure.retryable,
            match failure.retry_after {
                Some(hint) => self.policy.hinted_delay(history.attempt, hint),
                None => self.policy.draw_delay(history.attempt, &mut rand::rng()),
            },
        ) {
            (true, Some(delay)) => {
                let attempt = history.attempt + 1;
                let due_ms = now + delay.as_millis() as i64;
                (
                    Routed::Retry { attempt, delay },
                    Hop::Retry { attempt, due_ms },
                )
            }
            _ => (Routed::DeadLetter, Hop::DeadLetter),
        };
        let error: String = failure
            .message
            .chars()
            .take(self.policy.max_error_len)
            .collect();
        let last = LastFailure {
            class: &failure.class,
            message: &error,
            at_ms: now,
        };
        let original = message
            .headers()
            .into_iter()
            .flat_map(|h| h.iter().map(|h| (h.key, h.value)));
        let record = tier_record(original, &history, &self.group, hop, last, &self.topics);
        self.producer
            .send(
                record.to_send(message.key(), message.payload()),
                rdkafka::util::Timeout::Never,
            )
            .await
            .map_err(|(e, _)| e)?;
        Ok(routed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::record::tests::message;
    use rdkafka::message::Header;

    #[test]
    fn the_topic_a_group_reads_strips_only_its_own_retry_suffix() {
        assert_eq!(topic_read_by("orders.x", "g"), "orders.x");
        assert_eq!(
            topic_read_by(&retry_topic("orders.x", "a b"), "a b"),
            "orders.x"
        );
        assert_eq!(
            topic_read_by("orders.x.retry.other", "g"),
            "orders.x.retry.other"
        );
        assert_eq!(topic_read_by(".retry.g", "g"), ".retry.g");
    }

    #[test]
    fn a_replay_carries_the_headers_of_a_forward_plus_its_row() {
        let names = |r: &TierRecord| {
            r.headers
                .iter()
                .map(|h| h.key.to_string())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let first = message(OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some("e"),
        }));
        let topics = TierTopics::of("order.events.v1", "g", "order.events.v1.dlq");
        let last = LastFailure {
            class: "handler_retryable",
            message: "down",
            at_ms: 5,
        };
        let original = || {
            first
                .headers()
                .into_iter()
                .flat_map(|h| h.iter().map(|h| (h.key, h.value)))
        };
        let history = FailureHistory::of(&first);
        let forwarded = tier_record(
            original(),
            &history,
            "g",
            Hop::Retry {
                attempt: 1,
                due_ms: 9,
            },
            last,
            &topics,
        );
        let replayed = tier_record(
            original(),
            &history,
            "g",
            Hop::Replay {
                row_id: 7,
                due_ms: 9,
            },
            last,
            &topics,
        );
        assert_eq!(forwarded.topic, "order.events.v1.retry.g");
        assert_eq!(replayed.topic, forwarded.topic);
        let mut want = names(&forwarded);
        want.insert(header::REPLAYED_FROM.to_string());
        assert_eq!(names(&replayed), want);
        assert!(
            want.contains(header::ORIGINAL_TIMESTAMP) && want.contains(header::FIRST_FAILURE),
            "{want:?}"
        );

        let to_original = tier_record(
            original(),
            &history,
            "g",
            Hop::ReplayToOriginal { row_id: 7 },
            last,
            &topics,
        );
        assert_eq!(to_original.topic, "order.events.v1");
        assert_eq!(
            names(&to_original),
            ["event_id".to_string(), header::REPLAYED_FROM.to_string()].into()
        );
    }

    #[test]
    fn retry_topic_names_are_kafka_safe() {
        assert_eq!(
            retry_topic("order.events.v1", "inv-svc.order.consumer"),
            "order.events.v1.retry.inv-svc.order.consumer"
        );
        assert_eq!(retry_topic("t", "a b/c"), "t.retry.a_b_c");
    }
}
