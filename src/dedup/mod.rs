//! `event_dedup`: the exactly-once-in-effect guard.
//!
//! Inside the transaction that applies an event, [`claim_batch`] inserts the
//! rows `(group_id, event_id)` of a whole batch with one `INSERT IGNORE ...
//! RETURNING`. A returned row means this group has not applied the event:
//! run the effect. A missing one means it has: skip it. Because the row and
//! the effect commit together, a crash at any point either leaves both or
//! neither, and a redelivery is recognised.
//!
//! The key is compact (migration 0021): the group's small integer from
//! `dedup_groups` ([`group`]) and the event id's 16 bytes. Rows written
//! before it stay readable in `event_dedup_legacy` until [`upgrade`] has
//! moved them; every lookup here reads both while it exists.
//!
//! Rows only need to outlive the longest time a record can be redelivered;
//! [`cleanup`] deletes older ones in small batches so no long lock is held,
//! by the `apply_seq` range below [`seq_floor`].
//!
//! Each row keeps a [`content_digest`] of the event. A duplicate whose
//! digest differs from its row's is still skipped (the first event under the
//! id was applied), but [`check_duplicate`] records it in `event_conflicts`:
//! a producer reused an event id, and the second event was never applied.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::counter;
use serde::Serialize;
use sha2::{Digest, Sha256};

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{Any, QueryBuilder, Row};
use uuid::Uuid;

use crate::db::rows::{self, Bound};
use crate::db::{Db, DbError, Dialect, Legacy, Tx};
use crate::envelope::{Envelope, EventData};
use crate::metrics::name;

mod upgrade;

pub use upgrade::{UPGRADE_BATCH, UpgradeProgress, UpgradeReport, upgrade};

/// A statement of the Any driver being bound.
pub(crate) type AnyQuery<'q> = sqlx::query::Query<'q, Any, AnyArguments>;

/// Where a record came from, stored with its dedup row.
#[derive(Debug, Clone)]
pub struct RecordOrigin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record key (the order id).
    pub key: String,
}

/// Bytes of the content digest a dedup row keeps: the first 8 of the
/// sha256. A reused id is told apart from a true duplicate unless the two
/// contents' digests collide in 64 bits (a 2^-64 chance per reuse).
pub const DIGEST_BYTES: usize = 8;

/// The digest (first [`DIGEST_BYTES`] of a sha256) of what an event says:
/// `event_name`, `event_time`, `producer` and `data`, as canonical JSON
/// (fixed field order).
///
/// A true redelivery (the same record again, a retry or replay, or the relay
/// re-publishing the outbox row, even re-encoded under a newer compatible
/// writer schema) has the same digest; a reused id on another event does
/// not. Left out: `event_id` (the same by definition), `event_version` (a
/// minor bump of the same event is the same event), `trace_id` (tracing
/// context, not content) and the transport (headers, schema id, offsets).
/// Fields this build does not know (added in a newer minor) are not decoded,
/// so they are not covered.
pub fn content_digest(envelope: &Envelope) -> [u8; DIGEST_BYTES] {
    #[derive(Serialize)]
    struct Content<'a> {
        event_name: &'a str,
        event_time: String,
        producer: &'a str,
        data: &'a EventData,
    }
    let content = Content {
        event_name: envelope.event_name.as_str(),
        event_time: envelope.event_time_iso(),
        producer: &envelope.producer,
        data: &envelope.data,
    };
    let json = serde_json::to_vec(&content).expect("an envelope serializes to JSON");
    let mut digest = [0; DIGEST_BYTES];
    digest.copy_from_slice(&Sha256::digest(&json)[..DIGEST_BYTES]);
    digest
}

/// A consumer group as its dedup rows name it: a small integer from
/// `dedup_groups` instead of its name in every row.
#[derive(Debug, Clone)]
pub struct Group {
    /// Its row id in `dedup_groups`.
    pub id: i64,
    /// The group's name.
    pub name: String,
}

/// `name`'s dedup group, registered on first use. Runs on the pool in its
/// own statements (committed at once), never in a caller's transaction, so
/// the id it remembers ([`crate::db::Memo`]) is always a committed row's.
#[tracing::instrument(skip(db))]
pub async fn group(db: &Db, name: &str) -> Result<Group, DbError> {
    let found = |id| Group {
        id,
        name: name.to_string(),
    };
    if let Some(id) = db.memo.group_id(name) {
        return Ok(found(id));
    }
    let select = "SELECT id FROM dedup_groups WHERE name = ?";
    let mut id: Option<(i64,)> = sqlx::query_as(select)
        .bind(name)
        .fetch_optional(&db.pool)
        .await?;
    if id.is_none() {
        let insert = db
            .sql()
            .insert_ignore("INTO dedup_groups (name) VALUES (?)");
        sqlx::query(insert).bind(name).execute(&db.pool).await?;
        id = sqlx::query_as(select)
            .bind(name)
            .fetch_optional(&db.pool)
            .await?;
    }
    let (id,) = id.ok_or_else(|| DbError::Other(format!("dedup group {name} not stored")))?;
    db.memo.remember_group(name, id);
    Ok(found(id))
}

/// Whether `event_dedup_legacy` (the rows of before the compact key, until
/// `orderpipe dedup upgrade` has moved them) is still there. Looked up once
/// per process; [`legacy_gone`] notes its drop.
async fn legacy_present(tx: &mut Tx) -> Result<bool, DbError> {
    match tx.memo().legacy() {
        Legacy::Present => return Ok(true),
        Legacy::Gone => return Ok(false),
        Legacy::Unknown => {}
    }
    let (n,): (i64,) = sqlx::query_as(tx.sql().table_exists())
        .bind(LEGACY)
        .fetch_one(&mut **tx)
        .await?;
    let legacy = if n > 0 { Legacy::Present } else { Legacy::Gone };
    tx.memo().set_legacy(legacy);
    Ok(n > 0)
}

/// The pre-upgrade table (see `sql/mysql/0021_compact_dedup.sql`).
const LEGACY: &str = "event_dedup_legacy";

/// For a failed read of the legacy table: `true` (and remembered) when it
/// failed because the table was dropped meanwhile, so the read found nothing.
fn legacy_gone(memo: &crate::db::Memo, error: &sqlx::Error) -> bool {
    let gone = matches!(error, sqlx::Error::Database(e)
        if e.code().as_deref() == Some("42S02") || e.message().contains("no such table"));
    if gone {
        memo.set_legacy(Legacy::Gone);
    }
    gone
}

/// The ids among `ids` that `group` applied before the upgrade (rows still
/// in the legacy table); empty when there is none.
async fn legacy_applied(tx: &mut Tx, group: &str, ids: &[Uuid]) -> Result<HashSet<Uuid>, DbError> {
    let mut found = HashSet::new();
    if ids.is_empty() || !legacy_present(tx).await? {
        return Ok(found);
    }
    let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    for piece in rows::pieces(&texts) {
        let mut builder = group_ids_query(
            "SELECT event_id FROM event_dedup_legacy WHERE consumer_group = ",
            group,
            "event_id",
            piece.iter().map(String::as_str),
        );
        match builder.build().fetch_all(&mut **tx).await {
            Ok(rows) => {
                for row in rows {
                    if let Ok(id) = Uuid::parse_str(&row.try_get::<String, _>(0)?) {
                        found.insert(id);
                    }
                }
            }
            Err(e) if legacy_gone(tx.memo(), &e) => return Ok(HashSet::new()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(found)
}

/// Inserts the dedup row; `true` when this group sees the event for the first time.
pub async fn claim(
    tx: &mut Tx,
    group: &Group,
    envelope: &Envelope,
    origin: &RecordOrigin,
) -> Result<bool, DbError> {
    Ok(claim_batch(tx, group, &[(envelope, origin)]).await?[0])
}

/// Claims a set of events for `group`: one multi-row `INSERT IGNORE ...
/// RETURNING event_id` per chunk ([`crate::db::rows`]). For each event, in
/// order, `true` when this group sees it for the first time: the database
/// returns only the rows it inserted, so an event applied before (its row
/// exists) is not listed. Rows go in in the order given and `apply_seq`
/// numbers them in that order; an id given twice is claimed by its first
/// occurrence, the second is a duplicate.
///
/// While the legacy table is there, the ids it holds for the group are
/// duplicates too, and get no new row (the upgrade moves theirs). A move
/// commits its insert here and its delete there together, so under READ
/// COMMITTED one of the two reads sees the row.
pub async fn claim_batch(
    tx: &mut Tx,
    group: &Group,
    events: &[(&Envelope, &RecordOrigin)],
) -> Result<Vec<bool>, DbError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let claims = Claims::new(tx, group, events).await?;
    let before = legacy_applied(tx, &group.name, &claims.ids).await?;
    let positions: Vec<usize> = (0..events.len())
        .filter(|&i| !before.contains(&claims.ids[i]))
        .collect();
    let verb = tx.sql().insert_ignore_verb();
    let returned = rows::insert_returning(tx, verb, claims.columns, "event_id", &positions, |&i| {
        claims.values(i)
    })
    .await?;
    let mut inserted: HashMap<Uuid, usize> = HashMap::with_capacity(returned.len());
    for row in returned {
        *inserted.entry(uuid_of(&row, 0)?).or_default() += 1;
    }
    Ok(claims
        .ids
        .iter()
        .map(|id| match inserted.get_mut(id) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        })
        .collect())
}

/// Claims every one of `events` for `group`, the happy path's claim: the
/// same rows as [`claim_batch`], without `RETURNING`. `true` when the
/// database inserted them all, so every event is new to the group. `false`
/// when it did not (a redelivery, an id given twice, or an id still in the
/// legacy table): the rows it wrote are then not the claim's answer, and
/// the caller rolls them back and asks [`claim_batch`] which events are new.
///
/// The count of inserted rows is exact for `INSERT IGNORE` and `INSERT OR
/// IGNORE`; only the rows returned say *which*, and reading them back costs
/// the member a result row per event to decode (`docs/tuning.md`, "The
/// member's own CPU per event").
pub async fn claim_all(
    tx: &mut Tx,
    group: &Group,
    events: &[(&Envelope, &RecordOrigin)],
) -> Result<bool, DbError> {
    if events.is_empty() {
        return Ok(true);
    }
    let claims = Claims::new(tx, group, events).await?;
    if !legacy_applied(tx, &group.name, &claims.ids)
        .await?
        .is_empty()
    {
        return Ok(false);
    }
    let positions: Vec<usize> = (0..events.len()).collect();
    let verb = tx.sql().insert_ignore_verb();
    let inserted = rows::insert_pieces(tx, verb, claims.columns, "", &positions, |&i| {
        claims.values(i)
    })
    .await?;
    Ok(inserted == events.len() as u64)
}

/// `{head}? AND {id_column} IN (?, ...)`, `head` ending in the group's
/// column and `=`: the statement every id list here is sent as, one per
/// piece of the list ([`rows::pieces`]).
fn group_ids_query<'t, G, I>(
    head: &str,
    group: G,
    id_column: &str,
    ids: impl IntoIterator<Item = I>,
) -> QueryBuilder<Any>
where
    G: sqlx::Encode<'t, Any> + sqlx::Type<Any>,
    I: sqlx::Encode<'t, Any> + sqlx::Type<Any>,
{
    let mut builder = QueryBuilder::new(head);
    builder
        .push_bind(group)
        .push(format_args!(" AND {id_column}"));
    rows::push_in(&mut builder, ids);
    builder
}

/// Takes back this transaction's claims of `ids` for `group`: events a
/// handler failed after the wave claimed them. The wave keeps its other
/// claims instead of claiming them all again; the failed events are
/// claimed anew when they are applied. One statement per piece of `ids`
/// ([`rows::pieces`]: the few statement shapes every id list here uses).
/// How many rows went.
pub async fn unclaim(tx: &mut Tx, group: &Group, ids: &[Uuid]) -> Result<u64, DbError> {
    let mut removed = 0;
    for piece in rows::pieces(ids) {
        let mut builder = group_ids_query(
            "DELETE FROM event_dedup WHERE group_id = ",
            group.id,
            "event_id",
            piece.iter().map(|id| id.as_bytes().as_slice()),
        );
        removed += builder.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(removed)
}

/// The `event_dedup` rows of a claim, before they are written.
struct Claims<'e> {
    group_id: i64,
    events: &'e [(&'e Envelope, &'e RecordOrigin)],
    ids: Vec<Uuid>,
    digests: Vec<[u8; DIGEST_BYTES]>,
    columns: &'static str,
    /// SQLite's `apply_seq` of the first row (MariaDB numbers them itself).
    first_seq: Option<i64>,
}

impl<'e> Claims<'e> {
    async fn new(
        tx: &mut Tx,
        group: &Group,
        events: &'e [(&'e Envelope, &'e RecordOrigin)],
    ) -> Result<Self, DbError> {
        // apply_seq is AUTO_INCREMENT on MariaDB; SQLite numbers the rows here
        // (one writer at a time, so MAX + 1 is safe).
        let (columns, first_seq) = match tx.sql() {
            Dialect::MySql => (CLAIM_COLUMNS, None),
            Dialect::Sqlite => {
                let (max,): (i64,) =
                    sqlx::query_as("SELECT COALESCE(MAX(apply_seq), 0) FROM event_dedup")
                        .fetch_one(&mut **tx)
                        .await?;
                (CLAIM_COLUMNS_NUMBERED, Some(max + 1))
            }
        };
        Ok(Self {
            group_id: group.id,
            events,
            ids: events.iter().map(|(e, _)| e.event_id).collect(),
            digests: events.iter().map(|(e, _)| content_digest(e)).collect(),
            columns,
            first_seq,
        })
    }

    /// The row of event `i`, in the order of `columns`.
    fn values(&self, i: usize) -> Vec<Bound<'_>> {
        let (envelope, origin) = self.events[i];
        let mut values = vec![
            Bound::Int(self.group_id),
            Bound::Bytes(self.ids[i].as_bytes()),
            Bound::Text(&origin.topic),
            Bound::Int(i64::from(origin.partition)),
            Bound::Int(origin.offset),
            Bound::Text(envelope.event_name.as_str()),
            Bound::Text(&origin.key),
            Bound::Bytes(&self.digests[i]),
        ];
        values.extend(self.first_seq.map(|seq| Bound::Int(seq + i as i64)));
        values
    }
}

/// Column `i` of `row`, a `BINARY(16)` event id.
fn uuid_of(row: &AnyRow, i: usize) -> Result<Uuid, DbError> {
    let bytes: Vec<u8> = row.try_get(i)?;
    Uuid::from_slice(&bytes)
        .map_err(|e| DbError::Other(format!("event id of {} bytes: {e}", bytes.len())))
}

/// The `event_dedup` columns a claim writes (`apply_seq` is AUTO_INCREMENT).
const CLAIM_COLUMNS: &str = "event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest)";
/// The same with `apply_seq` given (SQLite has no auto-increment on a non-key column).
const CLAIM_COLUMNS_NUMBERED: &str = "event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, payload_digest, apply_seq)";

/// A duplicate whose content differs from the event first applied under
/// its id, as stored in `event_conflicts`.
#[derive(Debug, Clone, Serialize)]
pub struct Conflict {
    /// Row id (0 before it is stored).
    pub id: i64,
    /// Group that skipped it.
    pub consumer_group: String,
    /// The reused event id.
    pub event_id: String,
    /// Event name of the skipped record.
    pub event_name: String,
    /// Topic of the event applied under this id.
    pub first_topic: String,
    /// Its partition.
    pub first_partition: i32,
    /// Its offset.
    pub first_offset: i64,
    /// Its content digest.
    pub first_digest: String,
    /// Topic of the skipped record.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its content digest.
    pub digest: String,
    /// When it was detected (ms since the epoch).
    pub detected_ms: i64,
}

/// For a record [`claim`] found to be a duplicate: compares its content
/// digest with its dedup row's (or, before the upgrade moved it, its legacy
/// row's, whose 64-digit digest starts with the same 8 bytes). A differing
/// digest is stored in `event_conflicts` (once per record) and returned; a
/// true duplicate, or a row written before digests existed (no digest:
/// unknown), gives None.
pub async fn check_duplicate(
    tx: &mut Tx,
    group: &Group,
    envelope: &Envelope,
    origin: &RecordOrigin,
) -> Result<Option<Conflict>, DbError> {
    let Some(first) = first_applied(tx, group, envelope.event_id).await? else {
        return Ok(None);
    };
    let (first_topic, first_partition, first_offset, Some(first_digest)) = first else {
        return Ok(None);
    };
    let digest = crate::hex::lower(&content_digest(envelope));
    if digest == first_digest {
        return Ok(None);
    }
    let conflict = Conflict {
        id: 0,
        consumer_group: group.name.clone(),
        event_id: envelope.event_id.to_string(),
        event_name: envelope.event_name.as_str().to_string(),
        first_topic,
        first_partition,
        first_offset,
        first_digest,
        topic: origin.topic.clone(),
        partition: origin.partition,
        offset: origin.offset,
        digest,
        detected_ms: crate::clock::now_ms(),
    };
    let sql = tx.sql().insert_ignore(
        "INTO event_conflicts (consumer_group, event_id, event_name, first_topic, first_partition, first_offset, \
         first_digest, topic, kafka_partition, kafka_offset, digest, detected_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    sqlx::query(sql)
        .bind(&conflict.consumer_group)
        .bind(&conflict.event_id)
        .bind(&conflict.event_name)
        .bind(&conflict.first_topic)
        .bind(conflict.first_partition)
        .bind(conflict.first_offset)
        .bind(&conflict.first_digest)
        .bind(&conflict.topic)
        .bind(conflict.partition)
        .bind(conflict.offset)
        .bind(&conflict.digest)
        .bind(conflict.detected_ms)
        .execute(&mut **tx)
        .await?;
    Ok(Some(conflict))
}

/// Where an event was first applied (topic, partition, offset) and its
/// digest (hex), when known.
type FirstApplied = (String, i32, i64, Option<String>);

/// Where `group` first applied `event_id` and its digest (hex, 16 digits):
/// from its dedup row, else from its legacy row.
async fn first_applied(
    tx: &mut Tx,
    group: &Group,
    event_id: Uuid,
) -> Result<Option<FirstApplied>, DbError> {
    let row: Option<(String, i32, i64, Option<Vec<u8>>)> = sqlx::query_as(
        "SELECT topic, kafka_partition, kafka_offset, payload_digest FROM event_dedup WHERE group_id = ? AND event_id = ?",
    )
    .bind(group.id)
    .bind(event_id.as_bytes().as_slice())
    .fetch_optional(&mut **tx)
    .await?;
    if let Some((topic, partition, offset, digest)) = row {
        return Ok(Some((
            topic,
            partition,
            offset,
            digest.map(|d| crate::hex::lower(&d)),
        )));
    }
    if !legacy_present(tx).await? {
        return Ok(None);
    }
    let legacy: Result<Option<FirstApplied>, _> = sqlx::query_as(
        "SELECT topic, kafka_partition, kafka_offset, payload_digest FROM event_dedup_legacy \
         WHERE consumer_group = ? AND event_id = ?",
    )
    .bind(&group.name)
    .bind(event_id.to_string())
    .fetch_optional(&mut **tx)
    .await;
    match legacy {
        Ok(row) => Ok(row.map(|(topic, partition, offset, digest)| {
            let short = digest.map(|d| d.chars().take(2 * DIGEST_BYTES).collect());
            (topic, partition, offset, short)
        })),
        Err(e) if legacy_gone(tx.memo(), &e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Stored conflicting duplicates (of `group`, or all), newest first, at most `limit`.
pub async fn conflicts(db: &Db, group: Option<&str>, limit: i64) -> Result<Vec<Conflict>, DbError> {
    type Row = (
        i64,
        String,
        String,
        String,
        String,
        i32,
        i64,
        String,
        String,
        i32,
        i64,
        String,
        i64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, consumer_group, event_id, event_name, first_topic, first_partition, first_offset, first_digest, \
         topic, kafka_partition, kafka_offset, digest, detected_ms FROM event_conflicts \
         WHERE (? IS NULL OR consumer_group = ?) ORDER BY id DESC LIMIT ?",
    )
    .bind(group)
    .bind(group)
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Conflict {
            id: r.0,
            consumer_group: r.1,
            event_id: r.2,
            event_name: r.3,
            first_topic: r.4,
            first_partition: r.5,
            first_offset: r.6,
            first_digest: r.7,
            topic: r.8,
            partition: r.9,
            offset: r.10,
            digest: r.11,
            detected_ms: r.12,
        })
        .collect())
}

/// Whether `group` applied the event already (its dedup row exists, here or
/// in the legacy table), for checks that must not insert the row. An id
/// that is no UUID was never applied.
pub async fn applied(tx: &mut Tx, group: &str, event_id: &str) -> Result<bool, DbError> {
    let Ok(id) = Uuid::parse_str(event_id) else {
        return Ok(false);
    };
    let row = sqlx::query(
        "SELECT 1 FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id WHERE g.name = ? AND d.event_id = ?",
    )
    .bind(group)
    .bind(id.as_bytes().as_slice())
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.is_some() || legacy_applied(tx, group, &[id]).await?.contains(&id))
}

/// The ids among `ids` that `group` applied, here or in the legacy table
/// (ids that are no UUIDs never are), in [`rows::pieces`].
pub async fn applied_ids(db: &Db, group: &str, ids: &[String]) -> Result<HashSet<String>, DbError> {
    let uuids: Vec<Uuid> = ids
        .iter()
        .filter_map(|id| Uuid::parse_str(id).ok())
        .collect();
    let mut found = HashSet::with_capacity(uuids.len());
    let mut tx = db.begin().await?;
    for piece in rows::pieces(&uuids) {
        let mut builder = group_ids_query(
            "SELECT d.event_id FROM event_dedup d JOIN dedup_groups g ON g.id = d.group_id WHERE g.name = ",
            group,
            "d.event_id",
            piece.iter().map(|id| id.as_bytes().as_slice()),
        );
        for row in builder.build().fetch_all(&mut *tx).await? {
            found.insert(uuid_of(&row, 0)?);
        }
    }
    found.extend(legacy_applied(&mut tx, group, &uuids).await?);
    tx.commit().await?;
    Ok(found.iter().map(Uuid::to_string).collect())
}

/// How far `created_at` may run behind `apply_seq` order: both are taken
/// when a row is inserted, so rows inserted at once by concurrent
/// transactions can swap by a statement's run time (lock waits included,
/// bounded by `innodb_lock_wait_timeout`).
const SEQ_TIME_SLACK: Duration = Duration::from_secs(300);

/// An `apply_seq` below which every dedup row was created before `time`:
/// a binary search over the `apply_seq` index (one indexed read per step,
/// about 24 for 10M rows) for `time` less a slack (5 minutes). Readers
/// scan from it (`apply_seq >= ?`) and filter `created_at` exactly: an
/// index range instead of an index on `created_at` in every row.
pub async fn seq_floor(db: &Db, time: DateTime<Utc>) -> Result<i64, DbError> {
    let bound = time - chrono::Duration::from_std(SEQ_TIME_SLACK).expect("minutes fit");
    let bound = db_time(bound);
    let (low, high): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT MIN(apply_seq), MAX(apply_seq) FROM event_dedup")
            .fetch_one(&db.pool)
            .await?;
    let (Some(mut low), Some(high)) = (low, high) else {
        return Ok(0);
    };
    // The first row at or after `mid` is older than the bound: so is every
    // row up to it. Otherwise the floor is at most `mid`.
    let mut high = high + 1;
    while low < high {
        let mid = low + (high - low) / 2;
        let first: Option<(i64, i64)> = sqlx::query_as(
            "SELECT apply_seq, CASE WHEN created_at < ? THEN 1 ELSE 0 END FROM event_dedup \
             WHERE apply_seq >= ? ORDER BY apply_seq LIMIT 1",
        )
        .bind(&bound)
        .bind(mid)
        .fetch_optional(&db.pool)
        .await?;
        match first {
            Some((seq, 1)) => low = seq + 1,
            _ => high = mid,
        }
    }
    Ok(low)
}

/// `time` as `created_at` columns hold it (UTC, milliseconds).
pub fn db_time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

/// Rows deleted per statement by [`cleanup`].
pub const CLEANUP_BATCH: u32 = 1000;

/// Deletes dedup rows older than `older_than`, `batch` rows per statement
/// (each its own short transaction), by the range of `apply_seq` below
/// [`seq_floor`] (the legacy table's by its `created_at` index); returns
/// how many were removed.
pub async fn cleanup(db: &Db, older_than: Duration, batch: u32) -> Result<u64, DbError> {
    let cutoff =
        Utc::now() - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
    // Every row older than the cutoff is below this seq (the floor of a
    // time a slack later); `created_at` then picks them exactly.
    let slack = chrono::Duration::from_std(2 * SEQ_TIME_SLACK).expect("minutes fit");
    let floor = seq_floor(db, cutoff + slack).await?;
    let cutoff = db_time(cutoff);
    let compact =
        db.sql()
            .delete_limited("event_dedup", "rowid", "apply_seq < ? AND created_at < ?");
    let mut removed =
        delete_in_batches(db, compact, |q| q.bind(floor).bind(cutoff.clone()), batch).await?;
    let mut tx = db.begin().await?;
    let legacy = legacy_present(&mut tx).await?;
    tx.commit().await?;
    if legacy {
        let old = db.sql().delete_limited(LEGACY, "rowid", "created_at < ?");
        // A table dropped meanwhile deletes nothing (`delete_in_batches`).
        removed += delete_in_batches(db, old, |q| q.bind(cutoff.clone()), batch).await?;
    }
    Ok(removed)
}

/// Runs `sql` (a [`Dialect::delete_limited`]) with `bind`'s values and
/// `batch` until it deletes fewer than `batch` rows, each statement its own
/// short transaction; returns the rows deleted.
pub(crate) async fn delete_in_batches(
    db: &Db,
    sql: sqlx::SqlStr,
    bind: impl Fn(AnyQuery<'static>) -> AnyQuery<'static>,
    batch: u32,
) -> Result<u64, DbError> {
    let mut removed = 0;
    loop {
        let query = bind(sqlx::query(sql.clone())).bind(i64::from(batch));
        let deleted = match query.execute(&db.pool).await {
            Ok(result) => result.rows_affected(),
            Err(e) if legacy_gone(&db.memo, &e) => return Ok(removed),
            Err(e) => return Err(e.into()),
        };
        removed += deleted;
        if deleted < u64::from(batch) {
            return Ok(removed);
        }
        // Let other writers in between batches.
        tokio::task::yield_now().await;
    }
}

/// Dedup rows removed by cleanup (counted).
pub fn cleanup_deleted(n: u64) {
    counter!(name::DEDUP_CLEANUP_DELETED).increment(n);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created() -> Envelope {
        Envelope::new("order-service", EventData::sample_created(42))
    }

    #[test]
    fn digest_covers_content_not_transport_or_tracing() {
        let first = created();
        let digest = content_digest(&first);
        // The first 8 bytes of the sha256 of the content as canonical JSON.
        let json = format!(
            r#"{{"event_name":"order.created","event_time":"{}","producer":"order-service","data":{}}}"#,
            first.event_time_iso(),
            serde_json::to_string(&first.data).unwrap()
        );
        assert_eq!(digest[..], Sha256::digest(json.as_bytes())[..DIGEST_BYTES]);
        // A redelivery by an upgraded producer (minor bump, new trace) is the same event.
        let mut again = first.clone();
        again.event_version = "1.7".into();
        again.trace_id = crate::envelope::new_trace_id();
        assert_eq!(content_digest(&again), digest);
        // Another event under the same id is not.
        let mut other = first.clone();
        if let EventData::Created(d) = &mut other.data {
            d.amount += 1;
        }
        assert_ne!(content_digest(&other), digest);
        let mut later = first.clone();
        later.event_time += chrono::Duration::seconds(1);
        assert_ne!(content_digest(&later), digest);
        let mut elsewhere = first;
        elsewhere.producer = "another-service".into();
        assert_ne!(content_digest(&elsewhere), digest);
    }

    /// The SQLite dialect end to end (MariaDB is covered by tests/it/integrity.rs).
    #[tokio::test]
    async fn sqlite_records_a_reused_id_once_and_not_a_true_or_pre_digest_duplicate() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let origin = |offset| RecordOrigin {
            topic: "t".into(),
            partition: 3,
            offset,
            key: "42".into(),
        };
        let first = created();
        let mut reused = first.clone();
        if let EventData::Created(d) = &mut reused.data {
            d.quantity += 1;
        }
        let g = group(&db, "g").await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert!(claim(&mut tx, &g, &first, &origin(10)).await.unwrap());
        assert!(!claim(&mut tx, &g, &first, &origin(11)).await.unwrap());
        assert!(
            check_duplicate(&mut tx, &g, &first, &origin(11))
                .await
                .unwrap()
                .is_none()
        );
        assert!(!claim(&mut tx, &g, &reused, &origin(12)).await.unwrap());
        let conflict = check_duplicate(&mut tx, &g, &reused, &origin(12))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((conflict.first_offset, conflict.offset), (10, 12));
        // The same conflicting record redelivered is listed once.
        check_duplicate(&mut tx, &g, &reused, &origin(12))
            .await
            .unwrap()
            .unwrap();
        // A row from before the migration has no digest: unknown, not a conflict.
        sqlx::query("UPDATE event_dedup SET payload_digest = NULL")
            .execute(&mut *tx)
            .await
            .unwrap();
        assert!(
            check_duplicate(&mut tx, &g, &reused, &origin(13))
                .await
                .unwrap()
                .is_none()
        );
        tx.commit().await.unwrap();
        let listed = conflicts(&db, Some("g"), 10).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (
                listed[0].first_partition,
                listed[0].first_offset,
                listed[0].offset
            ),
            (3, 10, 12)
        );
        assert_eq!(
            listed[0].first_digest,
            crate::hex::lower(&content_digest(&first))
        );
        assert_eq!(
            listed[0].digest,
            crate::hex::lower(&content_digest(&reused))
        );
        assert!(conflicts(&db, Some("other"), 10).await.unwrap().is_empty());
        assert_eq!(conflicts(&db, None, 10).await.unwrap().len(), 1);
    }

    /// SQLite's `INSERT OR IGNORE` counts as MariaDB's `INSERT IGNORE`:
    /// the counted claim is `true` only when every row went in.
    #[tokio::test]
    async fn sqlite_counted_claim_is_true_only_when_every_event_is_new() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let origin = RecordOrigin {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            key: "42".into(),
        };
        let (first, second) = (created(), created());
        let g = group(&db, "g").await.unwrap();
        let mut tx = db.begin().await.unwrap();
        assert!(claim_all(&mut tx, &g, &[(&first, &origin)]).await.unwrap());
        assert!(
            !claim_all(&mut tx, &g, &[(&second, &origin), (&first, &origin)])
                .await
                .unwrap()
        );
        assert!(
            !claim_all(&mut tx, &g, &[(&second, &origin), (&second, &origin)])
                .await
                .unwrap()
        );
        assert_eq!(
            claim_batch(&mut tx, &g, &[(&first, &origin), (&second, &origin)])
                .await
                .unwrap(),
            [false, false],
            "the counted claims wrote their new rows (a caller rolls them back)"
        );
    }

    /// Rows created a minute apart, one per minute, and a floor of each
    /// minute: the floor is at or below the first row of the minute, and
    /// above every row older than it by more than the slack.
    #[tokio::test]
    async fn the_seq_floor_of_a_time_is_found_by_binary_search_and_cleanup_deletes_below_it() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let g = group(&db, "g").await.unwrap();
        let start = Utc::now() - chrono::Duration::hours(2);
        for minute in 0..100i64 {
            let envelope = created();
            let mut tx = db.begin().await.unwrap();
            let origin = RecordOrigin {
                topic: "t".into(),
                partition: 0,
                offset: minute,
                key: "1".into(),
            };
            assert!(claim(&mut tx, &g, &envelope, &origin).await.unwrap());
            sqlx::query("UPDATE event_dedup SET created_at = ? WHERE kafka_offset = ?")
                .bind(db_time(start + chrono::Duration::minutes(minute)))
                .bind(minute)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        let pool = &db.pool;
        let seq_of = |minute: i64| async move {
            let (seq,): (i64,) =
                sqlx::query_as("SELECT apply_seq FROM event_dedup WHERE kafka_offset = ?")
                    .bind(minute)
                    .fetch_one(pool)
                    .await
                    .unwrap();
            seq
        };
        let slack = (SEQ_TIME_SLACK.as_secs() / 60) as i64;
        for minute in [0, 1, 5, 6, 50, 99] {
            let floor = seq_floor(&db, start + chrono::Duration::minutes(minute))
                .await
                .unwrap();
            assert_eq!(
                floor,
                seq_of((minute - slack).max(0)).await,
                "minute {minute}"
            );
        }
        assert_eq!(
            seq_floor(&db, Utc::now()).await.unwrap(),
            seq_of(99).await + 1
        );
        // Cleanup of rows older than an hour (a few ms after minute 60):
        // minutes 0 to 60 go, in batches of 7.
        let removed = cleanup(&db, Duration::from_secs(3600), 7).await.unwrap();
        let (left, oldest): (i64, i64) =
            sqlx::query_as("SELECT COUNT(*), MIN(kafka_offset) FROM event_dedup")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!((removed, left, oldest), (61, 39, 61));
    }
}
