//! Benchmark peers that are not part of the product.
//!
//! [`naive_consume`] is seed 004's consumer algorithm taken literally — for
//! each record: begin, `INSERT IGNORE` the dedup row, run the effect,
//! commit, then commit the Kafka offset synchronously — so `make
//! bench-consume` can show what batching per partition buys.

use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use serde::Serialize;

use crate::codec::Codec;
use crate::config::Settings;
use crate::consumer::handler::Handler;
use crate::db::Db;
use crate::dedup::{self, RecordOrigin};
use crate::kafka::client::client_config;
use crate::schema::SchemaCatalog;

/// Result of a naive run.
#[derive(Debug, Serialize)]
pub struct NaiveReport {
    /// Records processed.
    pub records: u64,
    /// Seconds from the first record to the last commit.
    pub active_secs: f64,
    /// Records per second.
    pub events_per_sec: f64,
}

/// Consumes `limit` records of `topic` one at a time, one transaction and
/// one synchronous offset commit each.
pub async fn naive_consume(
    settings: &Settings,
    db: &Db,
    topic: &str,
    group: &str,
    handler: &dyn Handler,
    limit: u64,
) -> anyhow::Result<NaiveReport> {
    let consumer: BaseConsumer = client_config(&settings.kafka.client_options())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[topic])?;
    let codec = Codec::new(
        &settings.registry,
        topic,
        SchemaCatalog::embedded().order_events(),
        false,
    )?;
    let mut records = 0;
    let mut started = None;
    while records < limit {
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message?;
        started.get_or_insert_with(Instant::now);
        let envelope = codec.decode(message.payload()).await?;
        let mut tx = db.begin().await?;
        let origin = RecordOrigin {
            topic: topic.to_string(),
            partition: message.partition(),
            offset: message.offset(),
            key: envelope.key(),
        };
        if dedup::claim(&mut tx, group, &envelope, &origin).await? {
            handler.apply(&mut tx, &envelope).await?;
        }
        tx.commit().await?;
        consumer.commit_message(&message, CommitMode::Sync)?;
        records += 1;
    }
    let active_secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    Ok(NaiveReport {
        records,
        active_secs,
        events_per_sec: records as f64 / active_secs.max(1e-9),
    })
}
