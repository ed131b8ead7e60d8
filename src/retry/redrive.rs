//! Sending records an operator found (the console's record search) to a
//! group's retry topic: the group takes each at once, with a fresh retry
//! budget (attempt 0), through its ordinary path, so a record it applied
//! before is skipped by its dedup row and one it never applied is applied
//! once. Key, value and headers are the original's, plus the error tier's
//! (the original position, a last failure of class `operator_redrive`
//! naming who sent it).

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::producer::FutureProducer;

use super::{FailureHistory, Hop, LastFailure, TierTopics, tier_record, topic_read_by};
use crate::clock::now_ms;
use crate::kafka::client::{KafkaSettings, client_config, producer_options};
use crate::producer::ProducerSettings;

/// The class of the last failure a redriven record carries.
pub const CLASS: &str = "operator_redrive";

/// A record to send on: where it was read, and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    /// Partition read from.
    pub partition: i32,
    /// Offset there.
    pub offset: i64,
    /// Its timestamp (ms).
    pub timestamp_ms: Option<i64>,
    /// Key bytes.
    pub key: Option<&'a [u8]>,
    /// Headers in order.
    pub headers: &'a [(String, Option<Vec<u8>>)],
    /// Value bytes.
    pub value: Option<&'a [u8]>,
}

/// Sends each of `records`, read from `topic`, to `group`'s retry topic;
/// returns how many the broker acknowledged (all, or an error).
#[tracing::instrument(skip(kafka, producer, records), fields(records = records.len()))]
pub async fn to_retry_topic(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
    dead_letter_topic: &str,
    topic: &str,
    group: &str,
    records: &[Found<'_>],
    who: &str,
) -> anyhow::Result<usize> {
    let sender: FutureProducer = client_config(&producer_options(
        &kafka.client_options(),
        &producer.options,
    )?)
    .create()?;
    let topics = TierTopics::of(topic_read_by(topic, group), group, dead_letter_topic);
    let now = now_ms();
    let message = format!("sent to the retry topic by {who} from the console's record search");
    let last = LastFailure {
        class: CLASS,
        message: &message,
        at_ms: now,
    };
    let tiered: Vec<_> = records
        .iter()
        .map(|r| {
            let history = FailureHistory {
                original_topic: topic.to_string(),
                original_partition: r.partition,
                original_offset: r.offset,
                original_timestamp: r.timestamp_ms,
                attempt: 0,
                executions: 0,
                first_failure_ms: None,
            };
            let headers = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref()));
            let hop = Hop::Retry {
                attempt: 0,
                due_ms: now,
            };
            tier_record(headers, &history, group, hop, last, &topics)
        })
        .collect();
    // Queued in order, so a key's records keep it (one idempotent producer).
    let mut acks = FuturesUnordered::new();
    for (t, r) in tiered.iter().zip(records) {
        let ack = sender
            .send_result(t.to_send(r.key, r.value))
            .map_err(|(e, _)| anyhow::anyhow!("not queued: {e}"))?;
        acks.push(ack);
    }
    let mut sent = 0;
    while let Some(ack) = acks.next().await {
        ack.map_err(|_| anyhow::anyhow!("the producer went away"))?
            .map_err(|(e, _)| anyhow::anyhow!("not acknowledged by the broker: {e}"))?;
        sent += 1;
    }
    Ok(sent)
}
