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
//! never appended, so a record failing many times does not grow.
//!
//! * [`policy`] resolves the schedule (profiles `default` and `seed000`).

pub mod policy;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;
use rdkafka::Message;

pub use policy::{RetryPolicy, RetrySettings};

/// Names of the headers orderpipe adds when it forwards a failed record.
pub mod header {
    /// Every orderpipe failure header starts with this.
    pub const PREFIX: &str = "orderpipe.";
    /// Topic the record was first consumed from.
    pub const ORIGINAL_TOPIC: &str = "orderpipe.original-topic";
    /// Its partition there.
    pub const ORIGINAL_PARTITION: &str = "orderpipe.original-partition";
    /// Its offset there.
    pub const ORIGINAL_OFFSET: &str = "orderpipe.original-offset";
    /// Its timestamp there (ms since the epoch).
    pub const ORIGINAL_TIMESTAMP: &str = "orderpipe.original-timestamp";
    /// The consumer group that failed it.
    pub const GROUP: &str = "orderpipe.group";
    /// Delayed attempts made so far (0 on the main topic).
    pub const ATTEMPT: &str = "orderpipe.attempt";
    /// Handler executions so far, local retries included.
    pub const ATTEMPTS: &str = "orderpipe.attempts";
    /// When the next attempt is due (ms since the epoch).
    pub const DUE: &str = "orderpipe.due-ms";
    /// Class of the last error (`handler_fatal`, `not_framed`, ...).
    pub const ERROR_CLASS: &str = "orderpipe.error-class";
    /// The last error message, bounded in length.
    pub const ERROR_MESSAGE: &str = "orderpipe.error-message";
    /// First failure (ms since the epoch).
    pub const FIRST_FAILURE: &str = "orderpipe.first-failure-ms";
    /// Last failure (ms since the epoch).
    pub const LAST_FAILURE: &str = "orderpipe.last-failure-ms";
    /// Dead-letter row id a replayed record came from.
    pub const REPLAYED_FROM: &str = "orderpipe.replayed-from";
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A header's value as text.
pub fn header_text(message: &OwnedMessage, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn header_num(message: &OwnedMessage, name: &str) -> Option<i64> {
    header_text(message, name).and_then(|v| v.parse().ok())
}

/// A record's failure history, read from its headers (or its coordinates,
/// the first time it fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureHistory {
    /// Topic it was first consumed from.
    pub original_topic: String,
    /// Partition there.
    pub original_partition: i32,
    /// Offset there.
    pub original_offset: i64,
    /// Timestamp there (ms).
    pub original_timestamp: Option<i64>,
    /// Delayed attempts made so far.
    pub attempt: u32,
    /// Handler executions so far.
    pub executions: u32,
    /// First failure (ms).
    pub first_failure_ms: Option<i64>,
}

impl FailureHistory {
    /// Reads the history carried by `message`.
    pub fn of(message: &OwnedMessage) -> Self {
        let timestamp = message.timestamp().to_millis();
        match header_text(message, header::ORIGINAL_TOPIC) {
            Some(topic) => Self {
                original_topic: topic,
                original_partition: header_num(message, header::ORIGINAL_PARTITION).unwrap_or(-1) as i32,
                original_offset: header_num(message, header::ORIGINAL_OFFSET).unwrap_or(-1),
                original_timestamp: header_num(message, header::ORIGINAL_TIMESTAMP),
                attempt: header_num(message, header::ATTEMPT).unwrap_or(0) as u32,
                executions: header_num(message, header::ATTEMPTS).unwrap_or(0) as u32,
                first_failure_ms: header_num(message, header::FIRST_FAILURE),
            },
            None => Self {
                original_topic: message.topic().to_string(),
                original_partition: message.partition(),
                original_offset: message.offset(),
                original_timestamp: timestamp,
                attempt: 0,
                executions: 0,
                first_failure_ms: None,
            },
        }
    }
}

/// Why a record is being forwarded.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Stable class (`handler_retryable`, `handler_fatal`, `not_framed`, ...).
    pub class: String,
    /// What went wrong.
    pub message: String,
    /// Whether another attempt may succeed.
    pub retryable: bool,
    /// Handler executions in this attempt (1 + local retries; 0 if never run).
    pub executions: u32,
}

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

/// `<topic>.retry.<group>`, with characters Kafka does not allow in topic
/// names replaced by `_`.
pub fn retry_topic(topic: &str, group: &str) -> String {
    let safe: String = group
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    format!("{topic}.retry.{safe}")
}

/// Forwards failed records of one group to its retry topic or the DLQ.
pub struct Forwarder {
    producer: crate::metrics::MeasuredProducer,
    /// The group's retry topic.
    pub retry_topic: String,
    /// The shared dead-letter topic.
    pub dlq_topic: String,
    group: String,
    policy: RetryPolicy,
}

impl Forwarder {
    /// A forwarder using `producer` (idempotent; see [`crate::producer::config`]).
    pub fn new(producer: crate::metrics::MeasuredProducer, retry_topic: String, dlq_topic: String, group: &str, policy: RetryPolicy) -> Self {
        Self {
            producer,
            retry_topic,
            dlq_topic,
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
    pub async fn forward(&self, message: &OwnedMessage, failure: &Failure) -> Result<Routed, KafkaError> {
        let history = FailureHistory::of(message);
        let now = now_ms();
        let routed = match (failure.retryable, self.policy.next_delay(history.attempt)) {
            (true, Some(delay)) => Routed::Retry {
                attempt: history.attempt + 1,
                delay,
            },
            _ => Routed::DeadLetter,
        };
        let (topic, attempt, due) = match routed {
            Routed::Retry { attempt, delay } => (&self.retry_topic, attempt, Some(now + delay.as_millis() as i64)),
            Routed::DeadLetter => (&self.dlq_topic, history.attempt, None),
        };
        let error: String = failure.message.chars().take(self.policy.max_error_len).collect();
        let ours: Vec<(&str, String)> = [
            (header::ORIGINAL_TOPIC, Some(history.original_topic.clone())),
            (header::ORIGINAL_PARTITION, Some(history.original_partition.to_string())),
            (header::ORIGINAL_OFFSET, Some(history.original_offset.to_string())),
            (header::ORIGINAL_TIMESTAMP, history.original_timestamp.map(|t| t.to_string())),
            (header::GROUP, Some(self.group.clone())),
            (header::ATTEMPT, Some(attempt.to_string())),
            (header::ATTEMPTS, Some((history.executions + failure.executions).to_string())),
            (header::DUE, due.map(|d| d.to_string())),
            (header::ERROR_CLASS, Some(failure.class.clone())),
            (header::ERROR_MESSAGE, Some(error)),
            (header::FIRST_FAILURE, Some(history.first_failure_ms.unwrap_or(now).to_string())),
            (header::LAST_FAILURE, Some(now.to_string())),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
        let headers = with_headers(message, &ours);
        let mut record = FutureRecord::to(topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(value) = message.payload() {
            record = record.payload(value);
        }
        self.producer
            .send(record, rdkafka::util::Timeout::Never)
            .await
            .map_err(|(e, _)| e)?;
        Ok(routed)
    }
}

/// The message's headers minus every `orderpipe.*` one, plus `ours`.
pub fn with_headers(message: &OwnedMessage, ours: &[(&str, String)]) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for h in original.iter().filter(|h| !h.key.starts_with(header::PREFIX)) {
            headers = headers.insert(Header { key: h.key, value: h.value });
        }
    }
    for (key, value) in ours {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// A record's headers as a JSON object (values as text), as stored.
pub fn headers_json(message: &OwnedMessage) -> String {
    let headers: BTreeMap<String, String> = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| (x.key.to_string(), x.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    serde_json::to_string(&headers).expect("headers serialize")
}

/// Headers stored by [`headers_json`], back as Kafka headers.
pub fn headers_from_json(json: &str) -> OwnedHeaders {
    let map: BTreeMap<String, String> = serde_json::from_str(json).unwrap_or_default();
    let mut headers = OwnedHeaders::new();
    for (k, v) in &map {
        headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    fn message(headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"value".to_vec()),
            Some(b"42".to_vec()),
            "order.events.v1".into(),
            Timestamp::CreateTime(1_000),
            3,
            77,
            Some(headers),
        )
    }

    #[test]
    fn history_starts_from_the_record_and_then_follows_headers() {
        let first = message(OwnedHeaders::new().insert(Header { key: "event_id", value: Some("e") }));
        let h = FailureHistory::of(&first);
        assert_eq!((h.original_topic.as_str(), h.original_partition, h.original_offset), ("order.events.v1", 3, 77));
        assert_eq!(h.attempt, 0);

        let forwarded = with_headers(
            &first,
            &[(header::ORIGINAL_TOPIC, "order.events.v1".into()), (header::ORIGINAL_PARTITION, "3".into()),
              (header::ORIGINAL_OFFSET, "77".into()), (header::ATTEMPT, "2".into()), (header::ATTEMPTS, "9".into())],
        );
        // Seen again on the retry topic at another place.
        let retried = message(forwarded).set_topic("order.events.v1.retry.g".into());
        let h = FailureHistory::of(&retried);
        assert_eq!((h.original_partition, h.original_offset, h.attempt, h.executions), (3, 77, 2, 9));
    }

    #[test]
    fn failure_headers_are_replaced_not_appended() {
        let original = message(
            OwnedHeaders::new()
                .insert(Header { key: "event_id", value: Some("e") })
                .insert(Header { key: header::ERROR_MESSAGE, value: Some("old") }),
        );
        let once = with_headers(&original, &[(header::ERROR_MESSAGE, "new".into())]);
        let again = with_headers(&message(once), &[(header::ERROR_MESSAGE, "newer".into())]);
        let keys: Vec<&str> = again.iter().map(|h| h.key).collect();
        assert_eq!(keys, ["event_id", header::ERROR_MESSAGE]);
        assert_eq!(again.iter().last().unwrap().value, Some(&b"newer"[..]));
    }

    #[test]
    fn retry_topic_names_are_kafka_safe() {
        assert_eq!(retry_topic("order.events.v1", "inv-svc.order.consumer"), "order.events.v1.retry.inv-svc.order.consumer");
        assert_eq!(retry_topic("t", "a b/c"), "t.retry.a_b_c");
    }
}
