//! The transactional producers of the relay's shards and of `cdc`: their
//! options ([`options`]) and their start ([`fenced`]), one way for both.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use super::ProducerSettings;
use crate::kafka::client::{
    KafkaSettings, MeasuredProducer, OptionConflict, measured_producer, producer_options,
};

/// Default `transaction.timeout.ms` of the transactional producers. The
/// broker aborts a transaction left open this long, checking every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s by
/// default), so a relay (or cdc) that dies inside a transaction blocks
/// read-committed consumers for at most 5 + 10 s even when nothing takes over.
/// The price, in a broker outage longer than it: the open transactions time
/// out, are aborted and retried (or their producers rebuilt) and `cdc` exits
/// once for its orchestrator to restart, losing and repeating nothing;
/// measured against 30 s and 60 s in docs/operations.md, "Broker restarts".
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 5_000;

/// The transactional producers' options: the producer options with a
/// transaction timeout ([`DEFAULT_TRANSACTION_TIMEOUT_MS`] unless
/// `producer.options` sets `transaction.timeout.ms`) and a message timeout
/// no longer than it (librdkafka refuses a longer one).
pub fn options(
    kafka: &KafkaSettings,
    producer: &ProducerSettings,
) -> Result<BTreeMap<String, String>, OptionConflict> {
    let mut options = producer_options(&kafka.client_options(), &producer.options)?;
    let millis = |key: &str, value: &str| {
        value.trim().parse::<u64>().map_err(|_| {
            OptionConflict(format!(
                "`{key}` = {value:?} is not a whole number of milliseconds"
            ))
        })
    };
    let transaction_timeout = match options.get("transaction.timeout.ms") {
        Some(v) => millis("transaction.timeout.ms", v)?,
        None => DEFAULT_TRANSACTION_TIMEOUT_MS,
    };
    options.insert(
        "transaction.timeout.ms".into(),
        transaction_timeout.to_string(),
    );
    match producer.options.get("message.timeout.ms") {
        Some(v) if millis("message.timeout.ms", v)? > transaction_timeout => {
            return Err(OptionConflict(format!(
                "message.timeout.ms={v} is longer than the relay's transaction.timeout.ms={transaction_timeout}: \
                 it must be at most that (or set a longer transaction.timeout.ms, which lets a dead relay block \
                 read-committed consumers longer)"
            )));
        }
        Some(_) => {}
        None => {
            options.insert("message.timeout.ms".into(), transaction_timeout.to_string());
        }
    }
    Ok(options)
}

/// Builds the transactional producer `id` (its `transactional.id`, and its
/// `client.id` unless `options` sets one) and fences every earlier producer
/// of that id: `init_transactions` aborts the transaction a previous owner
/// left open and makes that owner's next send or commit fail.
pub async fn fenced(
    options: &BTreeMap<String, String>,
    id: &str,
) -> Result<MeasuredProducer, KafkaError> {
    let mut options = options.clone();
    options.insert("transactional.id".into(), id.to_string());
    // The statistics and the broker's logs then name the shard or source.
    options
        .entry("client.id".into())
        .or_insert_with(|| id.to_string());
    let producer = measured_producer(&options)?;
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30)))
        .await
        .expect("init task does not panic")?;
    Ok(producer)
}

/// How many times [`commit`] resumes a commit that timed out.
const COMMIT_RESUMES: u32 = 5;

/// How long [`commit`] waits for acknowledged records to leave
/// librdkafka's count before it commits.
const SETTLE_MAX: Duration = Duration::from_millis(100);

/// Commits `producer`'s transaction, resuming it while librdkafka says the
/// commit timed out but may still complete ("retry call to resume"): such a
/// commit can succeed at the broker, and aborting or dropping the producer
/// instead would publish the same records again in a new transaction, twice
/// for read_committed readers (seen while a broker restarted). Any other
/// error, or a timeout after [`COMMIT_RESUMES`] resumes, is returned.
pub async fn commit(producer: &MeasuredProducer, timeout: Duration) -> Result<(), KafkaError> {
    settle(producer).await;
    let mut resumes = 0;
    loop {
        let p = producer.clone();
        let committed = tokio::task::spawn_blocking(move || p.commit_transaction(timeout))
            .await
            .expect("commit task does not panic");
        match committed {
            Err(KafkaError::Transaction(e))
                if e.is_retriable()
                    && !e.txn_requires_abort()
                    && !e.is_fatal()
                    && resumes < COMMIT_RESUMES =>
            {
                resumes += 1;
                tracing::warn!(error = %e, resumes, "Kafka transaction commit not finished; resuming it");
            }
            other => return other,
        }
    }
}

/// Waits (at most [`SETTLE_MAX`]) until librdkafka counts no record of
/// `producer` in flight. A delivery report the caller awaited resolves
/// inside the event callback of rdkafka's polling thread, but its records
/// count as in flight until that event is freed, a moment later. A commit
/// called in that moment flushes, finds them, and rdkafka's flush then
/// polls an event queue that is already empty for its full 100 ms step:
/// about 1 % of the commits of `cdc`'s lag benchmark took 102 ms this way
/// (`orderpipe_cdc_stage_duration_seconds{stage="commit"}`).
async fn settle(producer: &MeasuredProducer) {
    let deadline = tokio::time::Instant::now() + SETTLE_MAX;
    while producer.in_flight_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn options_with(pairs: &[(&str, &str)]) -> Result<BTreeMap<String, String>, OptionConflict> {
        let mut settings = Settings::default();
        settings.producer.options = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        options(&settings.kafka, &settings.producer)
    }

    #[test]
    fn the_transaction_timeout_bounds_the_message_timeout() {
        let o = options_with(&[]).unwrap();
        assert_eq!(
            o["transaction.timeout.ms"],
            DEFAULT_TRANSACTION_TIMEOUT_MS.to_string()
        );
        assert_eq!(
            o["message.timeout.ms"],
            DEFAULT_TRANSACTION_TIMEOUT_MS.to_string()
        );
        let o = options_with(&[("transaction.timeout.ms", "20000")]).unwrap();
        assert_eq!(o["message.timeout.ms"], "20000");
        let o = options_with(&[("message.timeout.ms", "3000")]).unwrap();
        assert_eq!(
            (
                o["transaction.timeout.ms"].as_str(),
                o["message.timeout.ms"].as_str()
            ),
            ("5000", "3000")
        );
        let e = options_with(&[("message.timeout.ms", "120000")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("message.timeout.ms=120000") && e.contains("transaction.timeout.ms=5000"),
            "{e}"
        );
        let e = options_with(&[("transaction.timeout.ms", "10s")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transaction.timeout.ms") && e.contains("milliseconds"),
            "{e}"
        );
    }
}
