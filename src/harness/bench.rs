//! Benchmark peers that are not part of the product.
//!
//! [`naive_consume`] is seed 004's consumer algorithm taken literally — for
//! each record: begin, `INSERT IGNORE` the dedup row, run the effect,
//! commit, then commit the Kafka offset synchronously — so `make
//! bench-consume` can show what batching per partition buys.
//!
//! [`Ceiling`] is the database's own ceiling for what the consumer
//! stores: it reads back the rows a measured `orderpipe consume --handler
//! notification` run stored (`event_dedup` and `notifications`) and writes
//! exactly those rows again into a fresh database on the same server, with
//! nothing else: no Kafka, no decoding, no ordering gate, one multi-row
//! `INSERT IGNORE` per table per transaction, as many events per
//! transaction and connections as the consumer used.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use serde::Serialize;
use sqlx::Row;

use crate::codec::Codec;
use crate::config::Settings;
use crate::consumer::handler::Handler;
use crate::db::rows::{self, Bound};
use crate::db::{DatabaseSettings, Db, Dialect};
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
    let group = dedup::group(db, group).await?;
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
        if dedup::claim(&mut tx, &group, &envelope, &origin).await? {
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

/// One event as the consumer stored it: the `event_dedup` columns a claim
/// writes ([`dedup::claim_batch`]) and its `notifications` row.
struct StoredEvent {
    group_id: i64,
    event_id: Vec<u8>,
    event_id_text: String,
    topic: String,
    kafka_partition: i32,
    kafka_offset: i64,
    event_type: String,
    record_key: String,
    payload_digest: Option<Vec<u8>>,
    order_id: i64,
    kind: String,
}

/// The `event_dedup` columns [`dedup::claim_batch`] writes.
const DEDUP_COLUMNS: &str = "event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest)";
/// The `notifications` columns the notification handler writes.
const NOTIFICATION_COLUMNS: &str = "notifications (event_id, order_id, kind)";

/// Result of a ceiling run.
#[derive(Debug, Serialize)]
pub struct CeilingReport {
    /// Events written (a dedup row and a notification each).
    pub events: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Events per transaction, at most (a partition's last one has the rest).
    pub events_per_tx: usize,
    /// Connections writing side by side.
    pub connections: usize,
    /// Partitions the rows came from (one transaction holds one partition's rows).
    pub partitions: usize,
    /// Seconds from the first transaction's begin to the last commit.
    pub secs: f64,
    /// Events per second.
    pub events_per_sec: f64,
}

/// The database ceiling, ready to write: the rows a consumer stored, read
/// back, and the connections to write them with, open.
pub struct Ceiling<'a> {
    db: &'a Db,
    groups: Vec<(i64, String)>,
    by_partition: BTreeMap<i32, Vec<StoredEvent>>,
    events_per_tx: usize,
    connections: usize,
}

impl<'a> Ceiling<'a> {
    /// Reads the rows a consumer stored in `from` (every `event_dedup` row
    /// with its `notifications` row) and opens `connections` connections to
    /// `db`, a freshly migrated database on MariaDB/MySQL.
    pub async fn prepare(
        db: &'a Db,
        from: &str,
        events_per_tx: usize,
        connections: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            db.sql() == Dialect::MySql,
            "the ceiling is measured on MariaDB/MySQL"
        );
        let (groups, by_partition) = read_stored(from).await?;
        let connections = connections.max(1);
        // Every connection open before the clock starts.
        drop(futures::future::try_join_all((0..connections).map(|_| db.pool.acquire())).await?);
        Ok(Self {
            db,
            groups,
            by_partition,
            events_per_tx: events_per_tx.max(1),
            connections,
        })
    }

    /// Writes the rows, timed: per transaction `events_per_tx` events of
    /// one partition, in the order the consumer applied them, as one
    /// multi-row `INSERT IGNORE` into each table; the partitions dealt to
    /// the connections, which write side by side (a connection per
    /// partition worker, like the consumer). Fails unless every row was
    /// inserted (`db` must hold none of them).
    pub async fn write(self) -> anyhow::Result<CeilingReport> {
        let events: usize = self.by_partition.values().map(Vec::len).sum();
        // Connection i writes the partitions i, i + connections, ...
        let mut work: Vec<Vec<&[StoredEvent]>> = vec![Vec::new(); self.connections];
        for (i, rows) in self.by_partition.values().enumerate() {
            work[i % self.connections].extend(rows.chunks(self.events_per_tx));
        }
        let transactions = work.iter().map(Vec::len).sum::<usize>() as u64;
        // The groups' rows, as the consumer registers them before its first
        // transaction: not timed.
        for (id, name) in &self.groups {
            sqlx::query("INSERT INTO dedup_groups (id, name) VALUES (?, ?)")
                .bind(*id)
                .bind(name)
                .execute(&self.db.pool)
                .await?;
        }
        let started = Instant::now();
        let written =
            futures::future::try_join_all(work.into_iter().map(|txs| write_all(self.db, txs)))
                .await?;
        let secs = started.elapsed().as_secs_f64();
        let written: u64 = written.into_iter().sum();
        anyhow::ensure!(
            written == 2 * events as u64,
            "inserted {written} rows for {events} events (expected 2 each): the target database already held some"
        );
        Ok(CeilingReport {
            events: events as u64,
            transactions,
            events_per_tx: self.events_per_tx,
            connections: self.connections,
            partitions: self.by_partition.len(),
            secs,
            events_per_sec: events as f64 / secs.max(1e-9),
        })
    }
}

/// The dedup groups and the events stored in `from`, by partition, each in
/// the order the consumer applied them (`apply_seq`: offset order, wave by
/// wave within a batch). Both tables read whole, unordered, and joined
/// here by event id: the server's cheapest plan (an `ORDER BY` made it sort
/// or walk an index, tens of seconds for 1M rows, and the notification's
/// text id has no index to meet the dedup row's binary one).
async fn read_stored(
    from: &str,
) -> anyhow::Result<(Vec<(i64, String)>, BTreeMap<i32, Vec<StoredEvent>>)> {
    let source = Db::connect(
        &DatabaseSettings {
            url: from.to_string().into(),
            max_connections: Some(1),
        },
        1,
    )?;
    let groups: Vec<(i64, String)> = sqlx::query_as("SELECT id, name FROM dedup_groups")
        .fetch_all(&source.pool)
        .await?;
    let notifications: HashMap<String, (i64, String)> = sqlx::query_as::<_, (String, i64, String)>(
        "SELECT event_id, order_id, kind FROM notifications",
    )
    .fetch_all(&source.pool)
    .await?
    .into_iter()
    .map(|(id, order, kind)| (id, (order, kind)))
    .collect();
    let mut rows = sqlx::query(
        "SELECT group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest, apply_seq \
         FROM event_dedup",
    )
    .fetch(&source.pool);
    let mut by_partition: BTreeMap<i32, Vec<(i64, StoredEvent)>> = BTreeMap::new();
    while let Some(row) = rows.try_next().await? {
        let event_id: Vec<u8> = row.try_get(1)?;
        let event_id_text = uuid::Uuid::from_slice(&event_id)?.to_string();
        let Some((order_id, kind)) = notifications.get(&event_id_text).cloned() else {
            continue;
        };
        let event = StoredEvent {
            group_id: row.try_get(0)?,
            event_id,
            event_id_text,
            topic: row.try_get(2)?,
            kafka_partition: row.try_get(3)?,
            kafka_offset: row.try_get(4)?,
            event_type: row.try_get(5)?,
            record_key: row.try_get(6)?,
            payload_digest: row.try_get(7)?,
            order_id,
            kind,
        };
        by_partition
            .entry(event.kafka_partition)
            .or_default()
            .push((row.try_get(8)?, event));
    }
    drop(rows);
    source.pool.close().await;
    let by_partition: BTreeMap<i32, Vec<StoredEvent>> = by_partition
        .into_iter()
        .map(|(partition, mut events)| {
            events.sort_unstable_by_key(|(apply_seq, _)| *apply_seq);
            (partition, events.into_iter().map(|(_, e)| e).collect())
        })
        .collect();
    anyhow::ensure!(
        !by_partition.is_empty(),
        "{from}: no stored events to write"
    );
    Ok((groups, by_partition))
}

/// One connection's share: each set of events in a transaction of its own
/// (dedup rows, then notifications, as the consumer writes them); returns
/// the rows inserted.
async fn write_all(db: &Db, txs: Vec<&[StoredEvent]>) -> anyhow::Result<u64> {
    let mut written = 0;
    for events in txs {
        let mut tx = db.begin().await?;
        let verb = tx.sql().insert_ignore_verb();
        written += rows::insert_all(&mut tx, verb, DEDUP_COLUMNS, 8, events, |e| {
            vec![
                Bound::Int(e.group_id),
                Bound::Bytes(&e.event_id),
                Bound::Text(&e.topic),
                Bound::Int(i64::from(e.kafka_partition)),
                Bound::Int(e.kafka_offset),
                Bound::Text(&e.event_type),
                Bound::Text(&e.record_key),
                e.payload_digest
                    .as_deref()
                    .map_or(Bound::MaybeText(None), Bound::Bytes),
            ]
        })
        .await?;
        written += rows::insert_all(&mut tx, verb, NOTIFICATION_COLUMNS, 3, events, |e| {
            vec![
                Bound::Text(&e.event_id_text),
                Bound::Int(e.order_id),
                Bound::Text(&e.kind),
            ]
        })
        .await?;
        tx.commit().await?;
    }
    Ok(written)
}
