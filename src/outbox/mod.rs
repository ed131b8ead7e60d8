//! The transactional outbox: events recorded in the same database
//! transaction as the business change, published later by the relay.
//!
//! Seeds 000 and 001 forbid "commit the DB, then send": a crash between the
//! two loses the event. Instead [`record`] writes the envelope into
//! `outbox_messages` inside the business transaction; it commits or rolls
//! back with the change. The [`relay`] publishes unsent rows.
//!
//! Rows are spread over [`SHARDS`] shards by order id. A relay instance owns
//! whole shards through leases (`relay_leases`), so one order's events are
//! always published by one relay, in id order, even with several relays.
//!
//! A row that can never be published as it is (over Kafka's record limit,
//! [`limits`]) is dead-lettered by the relay ([`dead_letter`]) and marked
//! dead; the later rows of its order wait behind it until an operator
//! re-queues or gives it up (docs/operations.md).

pub mod dead_letter;
pub mod limits;
pub mod log_relay;
pub mod relay;
pub mod wake;

use metrics::gauge;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::db::{DbError, Tx};
use crate::envelope::Envelope;
use crate::metrics::name;

/// Where `orderpipe relay` reads the outbox rows it publishes
/// (`outbox.source`, `--source`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OutboxSource {
    /// The binlog when the database allows it at start, else polling (with
    /// a warning saying why).
    #[default]
    Auto,
    /// The inserts of `outbox_messages` in the binlog ([`log_relay`]).
    Binlog,
    /// Claim queries on the table ([`relay`]), for databases without
    /// binlog access.
    Poll,
}

/// The `[outbox]` section: where the relay reads, and its wake-up.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxSettings {
    /// `auto` | `binlog` | `poll`.
    pub source: OutboxSource,
    /// The log-based relay's name: the key of its checkpoint, its lease and
    /// its `transactional.id` (`<prefix>-cdc-<name>`).
    pub binlog_name: String,
    /// The log-based relay's replica `server_id`: unique among the
    /// database's replicas (and apart from `cdc.server_id`).
    pub binlog_server_id: u32,
    /// The compacted topic of the log-based relay's checkpoints.
    pub offsets_topic: String,
    /// Where the polling relay listens for wake-up datagrams (`host:port`;
    /// port 0 = any free port, printed at start). Empty: it does not listen
    /// and finds new rows at its next poll.
    pub wake_listen: String,
    /// Where the API sends a wake-up after each commit (`host:port` of each
    /// relay, or a name resolving to all of them, such as a headless
    /// Service). Empty: it sends none.
    pub wake_targets: Vec<String>,
}

impl Default for OutboxSettings {
    fn default() -> Self {
        Self {
            source: OutboxSource::Auto,
            binlog_name: "outbox".into(),
            binlog_server_id: 4202,
            offsets_topic: "orderpipe.outbox.offsets".into(),
            wake_listen: String::new(),
            wake_targets: Vec::new(),
        }
    }
}

impl OutboxSettings {
    /// Rejects values that would only fail later, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        let check = |field: &str, addr: &str| {
            let ok = addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{field}: `{addr}` is not host:port (e.g. 127.0.0.1:7070 or orderpipe-relay:7070)"
                ))
            }
        };
        if !self.wake_listen.is_empty() {
            check("outbox.wake_listen", &self.wake_listen)?;
        }
        self.wake_targets
            .iter()
            .try_for_each(|t| check("outbox.wake_targets", t))?;
        if self.binlog_name.is_empty() || self.binlog_name.contains(char::is_whitespace) {
            return Err(format!(
                "outbox.binlog_name = {:?}: must be non-empty, without spaces",
                self.binlog_name
            ));
        }
        if self.binlog_server_id == 0 {
            return Err("outbox.binlog_server_id = 0: a replica needs a server_id from 1 to 4294967295, unique among the database's replicas".into());
        }
        if self.offsets_topic.trim().is_empty() {
            return Err("outbox.offsets_topic is empty: name the compacted topic of the log-based relay's checkpoints".into());
        }
        Ok(())
    }
}

/// Shards of the outbox; a relay owns whole shards.
pub const SHARDS: i64 = 16;

/// The shard of an order.
pub fn shard_of(order_id: i64) -> i64 {
    order_id.rem_euclid(SHARDS)
}

/// Writes `envelope` into the outbox inside `tx`; `tx_id` groups the events
/// of one business transaction (published in one Kafka transaction).
pub async fn record(
    tx: &mut Tx,
    tx_id: Uuid,
    topic: &str,
    envelope: &Envelope,
) -> Result<(), DbError> {
    let json = serde_json::to_string(envelope)
        .map_err(|e| DbError::Other(format!("envelope does not serialize: {e}")))?;
    sqlx::query(
        "INSERT INTO outbox_messages (event_id, tx_id, shard, topic, message_key, event_name, envelope, created_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(envelope.event_id.to_string())
    .bind(tx_id.to_string())
    .bind(shard_of(envelope.data.order_id()))
    .bind(topic)
    .bind(envelope.key())
    .bind(envelope.event_name.as_str())
    .bind(json)
    .bind(crate::clock::now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The events recorded for `topic`, in the order they were recorded.
pub async fn recorded_events(db: &crate::db::Db, topic: &str) -> Result<Vec<Envelope>, DbError> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT envelope FROM outbox_messages WHERE topic = ? ORDER BY id")
            .bind(topic)
            .fetch_all(&db.pool)
            .await?;
    rows.iter()
        .map(|(json,)| {
            Envelope::from_json(json)
                .map_err(|e| DbError::Other(format!("outbox row does not parse: {e}")))
        })
        .collect()
}

/// Unsent rows and the age of the oldest, for metrics and health.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Backlog {
    /// Rows not yet published.
    pub unsent: i64,
    /// Age of the oldest unsent row in milliseconds (0 when none).
    pub oldest_age_ms: i64,
}

impl Backlog {
    /// Exports the backlog gauges.
    pub fn report(&self) {
        gauge!(name::OUTBOX_BACKLOG).set(self.unsent as f64);
        gauge!(name::OUTBOX_OLDEST_AGE).set(self.oldest_age_ms as f64 / 1000.0);
    }
}

/// `shard IN (0, 1, ..., 15)`: conditions on unsent or sent rows go
/// through the `(shard, sent_ms, id)` index with it, one range per shard.
fn every_shard() -> String {
    let list: Vec<String> = (0..SHARDS).map(|s| s.to_string()).collect();
    format!("shard IN ({})", list.join(", "))
}

/// The outbox backlog now: a count over the unsent entries of the shard
/// index and one row's creation time (the oldest unsent id's).
pub async fn backlog(db: &crate::db::Db) -> Result<Backlog, DbError> {
    let (unsent, oldest_id): (i64, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*), MIN(id) FROM outbox_messages WHERE {} AND sent_ms IS NULL",
        every_shard()
    )))
    .fetch_one(&db.pool)
    .await?;
    let oldest = match oldest_id {
        Some(id) => {
            sqlx::query_as::<_, (i64,)>("SELECT created_ms FROM outbox_messages WHERE id = ?")
                .bind(id)
                .fetch_optional(&db.pool)
                .await?
                .map(|(t,)| t)
        }
        None => None,
    };
    Ok(Backlog {
        unsent,
        oldest_age_ms: oldest.map_or(0, |t| (crate::clock::now_ms() - t).max(0)),
    })
}

/// Deletes sent rows older than `older_than_ms`, `batch` at a time; returns
/// how many. Dead rows stay: their envelope is what an operator re-queues.
pub async fn purge_sent(
    db: &crate::db::Db,
    older_than_ms: i64,
    batch: i64,
) -> Result<u64, DbError> {
    let cutoff = crate::clock::now_ms() - older_than_ms;
    let sql = db.sql().delete_limited(
        "outbox_messages",
        "id",
        &format!("{} AND sent_ms < ? AND dead_ms IS NULL", every_shard()),
    );
    let mut removed = 0;
    loop {
        let r = sqlx::query(sql.clone())
            .bind(cutoff)
            .bind(batch)
            .execute(&db.pool)
            .await?;
        removed += r.rows_affected();
        if r.rows_affected() < batch as u64 {
            return Ok(removed);
        }
    }
}
