//! A Kafka record's headers: their names, reading and replacing them,
//! storing them as JSON, and the failure history they carry.
//!
//! Two kinds of headers travel with orderpipe's records:
//!
//! * the envelope's headers every produced record carries ([`header::EVENT_ID`],
//!   [`header::EVENT_NAME`], [`header::TRACE_ID`], [`header::TRACEPARENT`],
//!   [`header::CONTENT_TYPE`]; docs/architecture.md, "Record headers");
//! * the failure headers the error tier adds when it forwards a record
//!   (`orderpipe.*`, [`header::PREFIX`]). They are replaced on every hop,
//!   never appended ([`replace_orderpipe_headers`]), so a record failing many
//!   times does not grow; [`FailureHistory`] reads them back. The relay
//!   and cdc write dead letters of their own with the same failure headers
//!   ([`direct_dead_letter_headers`]).

use std::collections::BTreeMap;

use rdkafka::Message;
use rdkafka::message::{Header, Headers, OwnedHeaders};

/// Names of the headers orderpipe's records carry.
pub mod header {
    /// The envelope's event id (idempotency key).
    pub const EVENT_ID: &str = "event_id";
    /// The event name.
    pub const EVENT_NAME: &str = "event_name";
    /// The envelope's trace id.
    pub const TRACE_ID: &str = "trace_id";
    /// W3C trace context.
    pub const TRACEPARENT: &str = "traceparent";
    /// How the value is encoded.
    pub const CONTENT_TYPE: &str = "content-type";
    /// Value of [`CONTENT_TYPE`]: Avro in the Confluent wire format.
    pub const AVRO_CONFLUENT: &str = "application/vnd.confluent.avro";

    // The failure headers the error tier adds when it forwards a record.

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
    /// The failing group's retry topic, where `dlq replay` sends the record
    /// back (a router group's is named after the order topic whatever topic
    /// the record came from, e.g. a `cdc.*` one).
    pub const RETRY_TOPIC: &str = "orderpipe.retry-topic";

    // The relay's dead letters add these (docs/operations.md, "Outbox rows
    // over the record limit").

    /// The outbox row id of a relay dead letter.
    pub const OUTBOX_ID: &str = "orderpipe.outbox-id";
    /// The size the record would have had.
    pub const RECORD_BYTES: &str = "orderpipe.record-bytes";
    /// The limit it exceeded.
    pub const LIMIT_BYTES: &str = "orderpipe.limit-bytes";
    /// Where that limit comes from.
    pub const LIMIT_FROM: &str = "orderpipe.limit-from";
    /// Bytes of the envelope's JSON the value holds (the rest is in the outbox row).
    pub const TRUNCATED_TO: &str = "orderpipe.truncated-to";
}

/// The failure headers of a dead letter its producer writes itself, the
/// relay's and cdc's: the record never reached `original_topic`, so its
/// partition there is -1 and no handler ran it (0 attempts); it failed
/// once, at `at_ms`. The persister reads these as it reads a forwarded
/// record's ([`FailureHistory`]).
pub fn direct_dead_letter_headers(
    group: &str,
    original_topic: &str,
    class: &str,
    message: String,
    at_ms: i64,
) -> [(&'static str, String); 8] {
    [
        (header::GROUP, group.to_string()),
        (header::ORIGINAL_TOPIC, original_topic.to_string()),
        (header::ORIGINAL_PARTITION, "-1".to_string()),
        (header::ATTEMPTS, "0".to_string()),
        (header::ERROR_CLASS, class.to_string()),
        (header::ERROR_MESSAGE, message),
        (header::FIRST_FAILURE, at_ms.to_string()),
        (header::LAST_FAILURE, at_ms.to_string()),
    ]
}

/// Headers of `pairs`, in order, with text values.
pub fn owned_headers<'a>(pairs: impl ExactSizeIterator<Item = (&'a str, &'a str)>) -> OwnedHeaders {
    let capacity = pairs.len();
    pairs.fold(
        OwnedHeaders::new_with_capacity(capacity),
        |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        },
    )
}

/// A header's value as text.
pub fn header_text(message: &impl Message, name: &str) -> Option<String> {
    message.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == name)
            .and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    })
}

fn header_num(message: &impl Message, name: &str) -> Option<i64> {
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
    pub fn of(message: &impl Message) -> Self {
        let timestamp = message.timestamp().to_millis();
        match header_text(message, header::ORIGINAL_TOPIC) {
            Some(topic) => Self {
                original_topic: topic,
                original_partition: header_num(message, header::ORIGINAL_PARTITION).unwrap_or(-1)
                    as i32,
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

/// Why a record is being forwarded (see `crate::retry::Forwarder`).
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
    /// The downstream's hint of when to try again (`Retry-After`): the next
    /// delayed attempt's delay, bounded by the schedule.
    pub retry_after: Option<std::time::Duration>,
}

/// `original` headers minus every `orderpipe.*` one, plus `ours`.
pub fn replace_orderpipe_headers<'h>(
    original: impl IntoIterator<Item = (&'h str, Option<&'h [u8]>)>,
    ours: &[(&str, String)],
) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    for (key, value) in original
        .into_iter()
        .filter(|(k, _)| !k.starts_with(header::PREFIX))
    {
        headers = headers.insert(Header { key, value });
    }
    for (key, value) in ours {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// The message's headers minus every `orderpipe.*` one, plus `ours`.
pub fn with_headers(message: &impl Message, ours: &[(&str, String)]) -> OwnedHeaders {
    replace_orderpipe_headers(
        message
            .headers()
            .into_iter()
            .flat_map(|h| h.iter().map(|h| (h.key, h.value))),
        ours,
    )
}

/// A record's headers as a JSON object (values as text), as stored.
pub fn headers_json(message: &impl Message) -> String {
    let headers: BTreeMap<String, String> = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| {
                    (
                        x.key.to_string(),
                        x.value
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default(),
                    )
                })
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
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    headers
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    /// A record of `order.events.v1`, partition 3, offset 77, with `headers`.
    pub(crate) fn message(headers: OwnedHeaders) -> OwnedMessage {
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
        let first = message(OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some("e"),
        }));
        let h = FailureHistory::of(&first);
        assert_eq!(
            (
                h.original_topic.as_str(),
                h.original_partition,
                h.original_offset
            ),
            ("order.events.v1", 3, 77)
        );
        assert_eq!(h.attempt, 0);

        let forwarded = with_headers(
            &first,
            &[
                (header::ORIGINAL_TOPIC, "order.events.v1".into()),
                (header::ORIGINAL_PARTITION, "3".into()),
                (header::ORIGINAL_OFFSET, "77".into()),
                (header::ATTEMPT, "2".into()),
                (header::ATTEMPTS, "9".into()),
            ],
        );
        // Seen again on the retry topic at another place.
        let retried = message(forwarded).set_topic("order.events.v1.retry.g".into());
        let h = FailureHistory::of(&retried);
        assert_eq!(
            (
                h.original_partition,
                h.original_offset,
                h.attempt,
                h.executions
            ),
            (3, 77, 2, 9)
        );
    }

    #[test]
    fn failure_headers_are_replaced_not_appended() {
        let original = message(
            OwnedHeaders::new()
                .insert(Header {
                    key: "event_id",
                    value: Some("e"),
                })
                .insert(Header {
                    key: header::ERROR_MESSAGE,
                    value: Some("old"),
                }),
        );
        let once = with_headers(&original, &[(header::ERROR_MESSAGE, "new".into())]);
        let again = with_headers(&message(once), &[(header::ERROR_MESSAGE, "newer".into())]);
        let keys: Vec<&str> = again.iter().map(|h| h.key).collect();
        assert_eq!(keys, ["event_id", header::ERROR_MESSAGE]);
        assert_eq!(again.iter().last().unwrap().value, Some(&b"newer"[..]));
    }
}
