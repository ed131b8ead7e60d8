//! A consumed record, held after librdkafka lets go of it.
//!
//! A consumer keeps thousands of records between `recv` and the database
//! commit (the dispatcher's queues, the batch being applied). rdkafka's
//! `OwnedMessage` holds each in ten allocations: key, payload, topic and a
//! librdkafka header list with one allocation per header. A
//! [`ConsumedRecord`] holds the same record in two (its bytes back to back,
//! and where each header lies in them) and shares its topic's name, so a
//! member's peak memory and allocations per event go down
//! (docs/tuning.md, "Where memory and allocations go now").
//!
//! It implements rdkafka's [`Message`], so code reads it as it reads any
//! record.

use std::sync::Arc;

use rdkafka::Message;
use rdkafka::Timestamp;
use rdkafka::message::{Header, Headers};

/// A span of [`ConsumedRecord`]'s bytes; `None` where Kafka's value is null.
type Span = Option<(u32, u32)>;

/// Where one header's name and value lie in the record's bytes.
#[derive(Debug, Clone, Copy)]
struct HeaderSpan {
    name: (u32, u32),
    value: Span,
}

/// A record's key, payload and headers in one buffer (see the module doc).
#[derive(Debug, Clone)]
pub struct ConsumedRecord {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
    body: Body,
}

/// The record's bytes; it is also its headers, so [`Message::headers`] can
/// lend them.
#[derive(Debug, Clone)]
pub struct Body {
    bytes: Box<[u8]>,
    key: Span,
    payload: Span,
    /// `None`: the record has no header list (not an empty one).
    headers: Option<Box<[HeaderSpan]>>,
}

impl ConsumedRecord {
    /// A copy of `message`, naming its topic with `topic` when it is the
    /// same name (a consumer passes the last one it saw, so records of one
    /// partition share it).
    pub fn of(message: &impl Message, topic: Option<&Arc<str>>) -> Self {
        let topic = match topic {
            Some(t) if **t == *message.topic() => Arc::clone(t),
            _ => Arc::from(message.topic()),
        };
        let headers = message.headers();
        let header_bytes: usize = headers.map_or(0, |h| {
            h.iter()
                .map(|x| x.key.len() + x.value.map_or(0, <[u8]>::len))
                .sum()
        });
        let key = message.key();
        let payload = message.payload();
        let mut bytes = Vec::with_capacity(
            key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len) + header_bytes,
        );
        let key = key.map(|k| push(&mut bytes, k));
        let payload = payload.map(|p| push(&mut bytes, p));
        let headers = headers.map(|h| {
            let mut spans = Vec::with_capacity(h.count());
            spans.extend(h.iter().map(|x| HeaderSpan {
                name: push(&mut bytes, x.key.as_bytes()),
                value: x.value.map(|v| push(&mut bytes, v)),
            }));
            spans.into_boxed_slice()
        });
        Self {
            topic,
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp(),
            body: Body {
                bytes: bytes.into_boxed_slice(),
                key,
                payload,
                headers,
            },
        }
    }

    /// The topic's name, shared with the records before it.
    pub fn topic_name(&self) -> &Arc<str> {
        &self.topic
    }
}

/// Appends `data` and returns where it lies.
fn push(bytes: &mut Vec<u8>, data: &[u8]) -> (u32, u32) {
    let start = u32::try_from(bytes.len()).expect("a Kafka record is under 4 GB");
    bytes.extend_from_slice(data);
    (start, data.len() as u32)
}

impl Body {
    fn slice(&self, (start, len): (u32, u32)) -> &[u8] {
        &self.bytes[start as usize..(start + len) as usize]
    }

    fn span(&self, span: Span) -> Option<&[u8]> {
        span.map(|s| self.slice(s))
    }
}

impl Headers for Body {
    fn count(&self) -> usize {
        self.headers.as_ref().map_or(0, |h| h.len())
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let span = self.headers.as_ref()?.get(idx)?;
        Some(Header {
            // Copied from a `&str`, so always UTF-8.
            key: std::str::from_utf8(self.slice(span.name)).unwrap_or_default(),
            value: self.span(span.value),
        })
    }
}

impl Message for ConsumedRecord {
    type Headers = Body;

    fn key(&self) -> Option<&[u8]> {
        self.body.span(self.body.key)
    }

    fn payload(&self) -> Option<&[u8]> {
        self.body.span(self.body.payload)
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        let (start, len) = self.body.payload?;
        Some(&mut self.body.bytes[start as usize..(start + len) as usize])
    }

    fn topic(&self) -> &str {
        &self.topic
    }

    fn partition(&self) -> i32 {
        self.partition
    }

    fn offset(&self) -> i64 {
        self.offset
    }

    fn timestamp(&self) -> Timestamp {
        self.timestamp
    }

    fn headers(&self) -> Option<&Body> {
        self.body.headers.as_ref().map(|_| &self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{OwnedHeaders, OwnedMessage};

    fn owned(
        headers: Option<OwnedHeaders>,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
    ) -> OwnedMessage {
        OwnedMessage::new(
            payload.map(<[u8]>::to_vec),
            key.map(<[u8]>::to_vec),
            "order.events.v1".into(),
            Timestamp::CreateTime(1_700_000_000_123),
            7,
            42,
            headers,
        )
    }

    /// Every field reads back as rdkafka's own copy reads it.
    fn assert_same(a: &OwnedMessage, b: &ConsumedRecord) {
        assert_eq!(a.key(), b.key());
        assert_eq!(a.payload(), b.payload());
        assert_eq!(a.topic(), b.topic());
        assert_eq!(a.partition(), b.partition());
        assert_eq!(a.offset(), b.offset());
        assert_eq!(a.timestamp(), b.timestamp());
        let pairs = |h: Option<Vec<Header<'_, &[u8]>>>| {
            h.map(|h| {
                h.into_iter()
                    .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            pairs(a.headers().map(|h| h.iter().collect())),
            pairs(b.headers().map(|h| h.iter().collect()))
        );
    }

    #[test]
    fn reads_back_as_rdkafkas_owned_message_with_null_empty_and_repeated_headers() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "event_id",
                value: Some(b"e-1".as_slice()),
            })
            .insert(Header {
                key: "nothing",
                value: None::<&[u8]>,
            })
            .insert(Header {
                key: "empty",
                value: Some(b"".as_slice()),
            })
            .insert(Header {
                key: "event_id",
                value: Some("é\u{0}x".as_bytes()),
            });
        let cases = [
            owned(
                Some(headers),
                Some(b"order-1"),
                Some(b"\0\0\0\0\x01payload"),
            ),
            owned(Some(OwnedHeaders::new()), None, Some(b"")),
            owned(None, Some(b""), None),
        ];
        for case in &cases {
            let record = ConsumedRecord::of(case, None);
            assert_same(case, &record);
            assert_same(case, &record.clone());
        }
        // No header list is not an empty one.
        assert!(ConsumedRecord::of(&cases[2], None).headers().is_none());
        assert_eq!(
            ConsumedRecord::of(&cases[1], None)
                .headers()
                .map(|h| h.count()),
            Some(0)
        );
    }

    #[test]
    fn shares_the_topic_name_it_is_given_only_when_it_is_the_same() {
        let first = ConsumedRecord::of(&owned(None, None, None), None);
        let second = ConsumedRecord::of(&owned(None, None, None), Some(first.topic_name()));
        assert!(Arc::ptr_eq(first.topic_name(), second.topic_name()));
        let other: Arc<str> = Arc::from("order.events.v1.retry");
        let third = ConsumedRecord::of(&owned(None, None, None), Some(&other));
        assert_eq!(third.topic(), "order.events.v1");
    }
}
