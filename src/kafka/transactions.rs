//! Which producer holds a partition's last stable offset: the open
//! transactions the brokers coordinate, asked over the Kafka protocol
//! (KIP-664's `ListTransactions` and `DescribeTransactions`, Kafka 3.0+),
//! because librdkafka has no call for either.
//!
//! Each broker coordinates the transactions whose `transactional.id` hashes
//! to its `__transaction_state` partitions, so each is asked for its own
//! `Ongoing` ones and then to describe them: their partitions, producer and
//! start time. Two requests per broker, on a short-lived connection.
//!
//! Only `PLAINTEXT` listeners are spoken to: a cluster behind TLS or SASL
//! gets [`TransactionsError::Unsupported`], and the lag report shows the
//! age of the open transaction without its id.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `ListTransactions` and `DescribeTransactions` API keys.
const LIST_TRANSACTIONS: i16 = 66;
const DESCRIBE_TRANSACTIONS: i16 = 65;
/// Bounds a broker's answer (a describe of thousands of transactions is
/// far below it).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A transaction a broker says is open, with the partitions it wrote to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransaction {
    /// The producer's `transactional.id`.
    pub transactional_id: String,
    /// Its producer id and epoch.
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// When the coordinator saw the transaction begin (ms since the epoch).
    pub started_ms: i64,
    /// Its `transaction.timeout.ms`: the broker aborts it after that.
    pub timeout_ms: i32,
    /// `(topic, partition)` it has written to.
    pub partitions: Vec<(String, i32)>,
}

/// Why the brokers could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum TransactionsError {
    #[error("security.protocol {0}: the transaction lookup speaks PLAINTEXT only")]
    Unsupported(String),
    #[error("broker {broker}: {source}")]
    Io {
        broker: String,
        source: std::io::Error,
    },
    #[error("broker {broker}: {what} answered error code {code}")]
    Broker {
        broker: String,
        what: &'static str,
        code: i16,
    },
    #[error("broker {broker}: malformed {what} response")]
    Malformed { broker: String, what: &'static str },
}

/// The `Ongoing` transactions of every broker in `brokers` (`host:port`).
/// `security_protocol` is the clients' `security.protocol`. A broker that
/// does not answer is skipped (logged); its error is returned only when
/// no other broker reported an open transaction.
pub fn open_transactions(
    brokers: &[String],
    security_protocol: &str,
    timeout: Duration,
) -> Result<Vec<OpenTransaction>, TransactionsError> {
    if !security_protocol.eq_ignore_ascii_case("plaintext") {
        return Err(TransactionsError::Unsupported(
            security_protocol.to_string(),
        ));
    }
    let mut open = Vec::new();
    let mut failed = None;
    for broker in brokers {
        let asked = Connection::open(broker, timeout).and_then(|mut connection| {
            let ids = connection.list_ongoing()?;
            if ids.is_empty() {
                Ok(Vec::new())
            } else {
                connection.describe(&ids)
            }
        });
        match asked {
            Ok(described) => open.extend(described),
            // One broker away hides only the transactions it coordinates.
            Err(e) => {
                tracing::warn!(error = %e, "open transactions: a broker did not answer");
                failed = Some(e);
            }
        }
    }
    match failed {
        Some(e) if open.is_empty() => Err(e),
        _ => Ok(open),
    }
}

/// The open transaction holding each `(topic, partition)` of `open`, the
/// oldest when several wrote to it.
pub fn by_partition(open: &[OpenTransaction]) -> BTreeMap<(String, i32), &OpenTransaction> {
    let mut holders: BTreeMap<(String, i32), &OpenTransaction> = BTreeMap::new();
    for t in open {
        for p in &t.partitions {
            holders
                .entry(p.clone())
                .and_modify(|held| {
                    if t.started_ms < held.started_ms {
                        *held = t;
                    }
                })
                .or_insert(t);
        }
    }
    holders
}

/// One broker connection, one request at a time.
struct Connection {
    broker: String,
    stream: TcpStream,
    correlation_id: i32,
}

impl Connection {
    fn open(broker: &str, timeout: Duration) -> Result<Self, TransactionsError> {
        let io = |source| TransactionsError::Io {
            broker: broker.to_string(),
            source,
        };
        let address = broker
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| io(std::io::ErrorKind::NotFound.into()))?;
        let stream = TcpStream::connect_timeout(&address, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Self {
            broker: broker.to_string(),
            stream,
            correlation_id: 0,
        })
    }

    /// The ids of the transactions this broker coordinates that are open.
    fn list_ongoing(&mut self) -> Result<Vec<String>, TransactionsError> {
        let mut body = Encoder::default();
        body.compact_strings(&["Ongoing"]); // StateFilters
        body.unsigned_varint(1); // ProducerIdFilters: empty
        body.unsigned_varint(0); // tagged fields
        let response = self.call(LIST_TRANSACTIONS, body)?;
        let what = "ListTransactions";
        let mut r = Decoder::new(&response);
        let parsed = (|| {
            r.i32()?; // ThrottleTimeMs
            let code = r.i16()?;
            r.compact_array(|r| r.compact_string())?; // UnknownStateFilters
            let ids = r.compact_array(|r| {
                let id = r.compact_string()?;
                r.i64()?; // ProducerId
                r.compact_string()?; // TransactionState
                r.tagged_fields()?;
                Some(id)
            })?;
            Some((code, ids))
        })();
        let (code, ids) = parsed.ok_or_else(|| self.malformed(what))?;
        self.check(what, code)?;
        Ok(ids)
    }

    /// `ids` described by their coordinator (this broker); ids no longer
    /// open by then are left out.
    fn describe(&mut self, ids: &[String]) -> Result<Vec<OpenTransaction>, TransactionsError> {
        let mut body = Encoder::default();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        body.compact_strings(&ids);
        body.unsigned_varint(0);
        let response = self.call(DESCRIBE_TRANSACTIONS, body)?;
        let mut r = Decoder::new(&response);
        let described = (|| {
            r.i32()?; // ThrottleTimeMs
            r.compact_array(|r| {
                let code = r.i16()?;
                let transactional_id = r.compact_string()?;
                let state = r.compact_string()?;
                let timeout_ms = r.i32()?;
                let started_ms = r.i64()?;
                let producer_id = r.i64()?;
                let producer_epoch = r.i16()?;
                let topics = r.compact_array(|r| {
                    let topic = r.compact_string()?;
                    let partitions = r.compact_array(Decoder::i32)?;
                    r.tagged_fields()?;
                    Some((topic, partitions))
                })?;
                r.tagged_fields()?;
                let partitions = topics
                    .into_iter()
                    .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
                    .collect();
                Some((
                    code,
                    state,
                    OpenTransaction {
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        started_ms,
                        timeout_ms,
                        partitions,
                    },
                ))
            })
        })()
        .ok_or_else(|| self.malformed("DescribeTransactions"))?;
        // Ended between the two requests, or moved to another coordinator.
        Ok(described
            .into_iter()
            .filter(|(code, state, _)| *code == 0 && state == "Ongoing")
            .map(|(_, _, t)| t)
            .collect())
    }

    /// Sends one request (header v2: flexible) and returns the response
    /// body after its header (v1: correlation id and tagged fields).
    fn call(&mut self, api_key: i16, body: Encoder) -> Result<Vec<u8>, TransactionsError> {
        self.correlation_id += 1;
        let mut request = Encoder::default();
        request.bytes(&api_key.to_be_bytes());
        request.bytes(&0i16.to_be_bytes()); // version 0 (flexible) of both
        request.bytes(&self.correlation_id.to_be_bytes());
        let client_id = b"orderpipe-lag";
        request.bytes(&(client_id.len() as i16).to_be_bytes());
        request.bytes(client_id);
        request.unsigned_varint(0); // header tagged fields
        request.bytes(&body.0);
        let mut framed = (request.0.len() as i32).to_be_bytes().to_vec();
        framed.extend_from_slice(&request.0);
        let io = |source| TransactionsError::Io {
            broker: self.broker.clone(),
            source,
        };
        self.stream.write_all(&framed).map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(io)?;
        let size = i32::from_be_bytes(size);
        if size < 4 || size as usize > MAX_RESPONSE_BYTES {
            return Err(self.malformed("response size"));
        }
        let mut response = vec![0u8; size as usize];
        self.stream.read_exact(&mut response).map_err(io)?;
        let mut r = Decoder::new(&response);
        let header = (|| {
            let correlation_id = r.i32()?;
            r.tagged_fields()?;
            Some(correlation_id)
        })();
        match header {
            Some(id) if id == self.correlation_id => Ok(response[r.at..].to_vec()),
            _ => Err(self.malformed("response header")),
        }
    }

    fn check(&self, what: &'static str, code: i16) -> Result<(), TransactionsError> {
        match code {
            0 => Ok(()),
            code => Err(TransactionsError::Broker {
                broker: self.broker.clone(),
                what,
                code,
            }),
        }
    }

    fn malformed(&self, what: &'static str) -> TransactionsError {
        TransactionsError::Malformed {
            broker: self.broker.clone(),
            what,
        }
    }
}

/// The flexible-version encodings these two requests use.
#[derive(Default)]
struct Encoder(Vec<u8>);

impl Encoder {
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }

    fn unsigned_varint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A compact array of compact strings (lengths + 1, as varints).
    fn compact_strings(&mut self, items: &[&str]) {
        self.unsigned_varint(items.len() as u32 + 1);
        for s in items {
            self.unsigned_varint(s.len() as u32 + 1);
            self.bytes(s.as_bytes());
        }
    }
}

/// Reads what [`Encoder`] writes; `None` on a short or malformed buffer.
struct Decoder<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    fn unsigned_varint(&mut self) -> Option<u32> {
        let mut value = 0u32;
        for shift in (0..35).step_by(7) {
            let byte = *self.take(1)?.first()?;
            value |= u32::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// A compact string; a null one (length 0) reads as empty.
    fn compact_string(&mut self) -> Option<String> {
        let len = self.unsigned_varint()?.saturating_sub(1) as usize;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    /// A compact array; a null one (length 0) reads as empty.
    fn compact_array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let len = self.unsigned_varint()?.saturating_sub(1) as usize;
        let mut items = Vec::with_capacity(len.min(1024));
        for _ in 0..len {
            items.push(item(self)?);
        }
        Some(items)
    }

    /// Tagged fields are skipped: none of these responses' tags is needed.
    fn tagged_fields(&mut self) -> Option<()> {
        for _ in 0..self.unsigned_varint()? {
            self.unsigned_varint()?; // tag
            let size = self.unsigned_varint()? as usize;
            self.take(size)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_compact_strings_read_back_what_was_written() {
        for v in [0u32, 1, 127, 128, 300, 16_383, 16_384, u32::MAX] {
            let mut e = Encoder::default();
            e.unsigned_varint(v);
            assert_eq!(Decoder::new(&e.0).unsigned_varint(), Some(v), "{v}");
        }
        let mut e = Encoder::default();
        e.compact_strings(&["Ongoing", "", "é"]);
        let mut d = Decoder::new(&e.0);
        assert_eq!(
            d.compact_array(Decoder::compact_string),
            Some(vec!["Ongoing".to_string(), String::new(), "é".to_string()])
        );
        assert_eq!(d.at, e.0.len());
    }

    #[test]
    fn a_short_buffer_is_malformed_not_a_panic() {
        let mut e = Encoder::default();
        e.compact_strings(&["Ongoing"]);
        for cut in 0..e.0.len() {
            assert_eq!(
                Decoder::new(&e.0[..cut]).compact_array(Decoder::compact_string),
                None
            );
        }
        // A varint that never ends.
        assert_eq!(Decoder::new(&[0xff; 6]).unsigned_varint(), None);
    }

    #[test]
    fn each_partition_is_held_by_its_oldest_open_transaction() {
        let t = |id: &str, started_ms, partitions: &[i32]| OpenTransaction {
            transactional_id: id.into(),
            producer_id: 1,
            producer_epoch: 0,
            started_ms,
            timeout_ms: 60_000,
            partitions: partitions.iter().map(|p| ("t".to_string(), *p)).collect(),
        };
        let open = [t("late", 20, &[1, 2]), t("early", 10, &[2, 3])];
        let held: Vec<(i32, &str)> = by_partition(&open)
            .into_iter()
            .map(|((_, p), t)| (p, t.transactional_id.as_str()))
            .collect();
        assert_eq!(held, [(1, "late"), (2, "early"), (3, "early")]);
    }

    #[test]
    fn a_broker_that_does_not_answer_is_named() {
        let err = open_transactions(&["127.0.0.1:1".into()], "PLAINTEXT", Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("broker 127.0.0.1:1: "), "{err}");
    }

    #[test]
    fn other_security_protocols_are_refused_by_name() {
        let err = open_transactions(&["x:1".into()], "SASL_SSL", Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SASL_SSL") && err.contains("PLAINTEXT only"),
            "{err}"
        );
    }
}
