//! How big one record may be, decided before it is produced.
//!
//! Two limits stop a record, and neither says which row it was:
//!
//! * librdkafka refuses it at produce time (`MessageSizeTooLarge`, no
//!   broker involved) when its worst-case wire size exceeds the producer's
//!   `message.max.bytes` (default 1 000 000). The wire size it counts is
//!   the value, the key and the serialized headers plus the v2 record's
//!   maximum varint overhead ([`record_size`] is the same sum:
//!   `rd_kafka_msg_new0` / `rd_kafka_msg_max_wire_size` in librdkafka).
//! * The broker refuses a record batch larger than the topic's
//!   `max.message.bytes` (the broker's `message.max.bytes`, 1 048 588 by
//!   default, unless the topic overrides it). A record alone in a batch
//!   still carries the 61-byte batch header, so a record fits the topic
//!   when its size plus [`BATCH_HEADER`] does.
//!
//! [`RecordLimit`] is the smaller of the two, as one number comparable to
//! [`record_size`], and says where it comes from, so an error or a
//! dead-letter record can name it. Kafka checks the batch after
//! compression; the limit here is on the uncompressed size, which is the
//! safe side except for incompressible values, whose compressed frame is a
//! few bytes per 64 KiB larger (callers still handle a refusal).
//!
//! Used by `cdc`, the outbox relay and the order API, which must decide a
//! record's fate before it can poison a Kafka transaction.

use std::collections::BTreeMap;

use rdkafka::message::{Headers, OwnedHeaders};

use super::client::KafkaSettings;

/// librdkafka's default `message.max.bytes`.
pub const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// The v2 record batch header (base offset to record count): what a batch of
/// one record adds to the record.
pub const BATCH_HEADER: usize = 8 + 4 + 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4;

/// librdkafka's worst-case v2 record overhead
/// (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`): length, attributes, timestamp
/// delta, offset delta, key length, value length and header count, each
/// varint at its widest.
pub const RECORD_OVERHEAD: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;

/// The size one record may have, and which setting made it so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLimit {
    /// The largest [`record_size`] that is produced and accepted.
    pub max_bytes: usize,
    /// Where the limit comes from, for errors and dead-letter records, e.g.
    /// `producer message.max.bytes = 1000000`.
    pub from: String,
}

impl RecordLimit {
    /// The smaller of the producer's `message.max.bytes` (from its librdkafka
    /// options; librdkafka's default when absent or not a number) and, when
    /// known, the topic's `max.message.bytes` less the batch header.
    pub fn new(
        producer_options: &BTreeMap<String, String>,
        topic_max: Option<(String, usize)>,
    ) -> Self {
        let producer = producer_options
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(LIBRDKAFKA_MESSAGE_MAX_BYTES);
        let by_producer = Self {
            max_bytes: producer,
            from: format!("producer message.max.bytes = {producer}"),
        };
        match topic_max {
            Some((topic, max)) if max.saturating_sub(BATCH_HEADER) < producer => Self {
                max_bytes: max.saturating_sub(BATCH_HEADER),
                from: format!(
                    "topic {topic} max.message.bytes = {max} (less the {BATCH_HEADER}-byte batch header)"
                ),
            },
            _ => by_producer,
        }
    }

    /// The size librdkafka counts for one record against
    /// `message.max.bytes`: key, value, each header's name and value with
    /// their length varints, and [`RECORD_OVERHEAD`].
    pub fn record_size(key: &[u8], value: &[u8], headers: &[(&str, &[u8])]) -> usize {
        let headers: usize = headers
            .iter()
            .map(|(name, value)| {
                name.len()
                    + value.len()
                    + zigzag_varint_len(name.len())
                    + zigzag_varint_len(value.len())
            })
            .sum();
        RECORD_OVERHEAD + key.len() + value.len() + headers
    }

    /// [`Self::record_size`] of a record with librdkafka's headers.
    pub fn record_size_with(key: &[u8], value: &[u8], headers: &OwnedHeaders) -> usize {
        let pairs: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|h| (h.key, h.value.unwrap_or_default()))
            .collect();
        Self::record_size(key, value, &pairs)
    }

    /// Whether a record of `size` ([`Self::record_size`]) may be produced.
    pub fn fits(&self, size: usize) -> bool {
        size <= self.max_bytes
    }
}

/// Bytes of a zigzag varint of a non-negative length (librdkafka writes
/// header lengths with `rd_uvarint_enc_i64`).
fn zigzag_varint_len(n: usize) -> usize {
    let mut v = (n as u64) << 1;
    let mut bytes = 1;
    while v >= 0x80 {
        v >>= 7;
        bytes += 1;
    }
    bytes
}

/// The topic's effective `max.message.bytes` (DescribeConfigs: the topic's
/// own value or the broker default it inherits); `None` when it cannot be
/// read (no Describe rights, no topic, no broker), then only the producer's
/// limit is known.
pub async fn topic_max_message_bytes(kafka: &KafkaSettings, topic: &str) -> Option<usize> {
    let admin = crate::topics::TopicAdmin::new(kafka).ok()?;
    match admin.configs(topic).await {
        Ok(configs) => configs.get("max.message.bytes")?.0.trim().parse().ok(),
        Err(e) => {
            tracing::warn!(%topic, error = %e, "cannot read the topic's max.message.bytes; using the producer's limit only");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_overheads_are_librdkafkas_and_kafkas() {
        // RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD with RD_UVARINT_ENC_SIZEOF(int32) = 5, (int64) = 10.
        assert_eq!(RECORD_OVERHEAD, 36);
        // Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD.
        assert_eq!(BATCH_HEADER, 61);
    }

    #[test]
    fn record_size_counts_key_value_headers_and_overhead() {
        assert_eq!(RecordLimit::record_size(b"", b"", &[]), 36);
        assert_eq!(
            RecordLimit::record_size(b"key", &[0; 100], &[]),
            36 + 3 + 100
        );
        // A header: name, value, and each length as a zigzag varint (2 * len).
        assert_eq!(
            RecordLimit::record_size(b"", b"", &[("id", b"abc")]),
            36 + 2 + 3 + 1 + 1
        );
        // 63 is the last length of one zigzag byte (126), 64 takes two (128).
        assert_eq!(
            RecordLimit::record_size(b"", b"", &[("h", &[0; 63])]),
            36 + 1 + 63 + 1 + 1
        );
        assert_eq!(
            RecordLimit::record_size(b"", b"", &[("h", &[0; 64])]),
            36 + 1 + 64 + 1 + 2
        );
        assert_eq!(zigzag_varint_len(8191), 2);
        assert_eq!(zigzag_varint_len(8192), 3);
        assert_eq!(zigzag_varint_len(1_400_000), 4);
    }

    #[test]
    fn the_limit_is_the_smaller_of_producer_and_topic_and_says_which() {
        let limit = RecordLimit::new(&options(&[]), None);
        assert_eq!(limit.max_bytes, 1_000_000);
        assert_eq!(limit.from, "producer message.max.bytes = 1000000");
        // The broker default (1048588) is above librdkafka's default: the producer decides.
        let limit = RecordLimit::new(&options(&[]), Some(("t".into(), 1_048_588)));
        assert_eq!(limit.max_bytes, 1_000_000);
        let limit = RecordLimit::new(
            &options(&[("message.max.bytes", "5000000")]),
            Some(("t".into(), 1_048_588)),
        );
        assert_eq!(limit.max_bytes, 1_048_588 - 61);
        assert_eq!(
            limit.from,
            "topic t max.message.bytes = 1048588 (less the 61-byte batch header)"
        );
        let limit = RecordLimit::new(
            &options(&[("message.max.bytes", " 20000 ")]),
            Some(("t".into(), 1_048_588)),
        );
        assert_eq!(
            (limit.max_bytes, limit.from.as_str()),
            (20_000, "producer message.max.bytes = 20000")
        );
        // Not a number: librdkafka would refuse the producer; the default stands here.
        assert_eq!(
            RecordLimit::new(&options(&[("message.max.bytes", "lots")]), None).max_bytes,
            1_000_000
        );
    }

    #[test]
    fn fits_is_inclusive() {
        let limit = RecordLimit {
            max_bytes: 100,
            from: String::new(),
        };
        assert!(limit.fits(100));
        assert!(!limit.fits(101));
    }
}
