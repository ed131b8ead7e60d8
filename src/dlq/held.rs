//! The operators' view of per-key ordering (see [`crate::ordering`]):
//! records held behind parked keys, the head each waits behind and the
//! head's dead-letter row. Held records are not dead letters: they have no
//! dead-letter status and cannot be replayed or ignored themselves; they are
//! applied when their head is (`dlq list --status held`, `dlq show --held`).
//!
//! A head is matched to its dead letter on columns: the parked key's
//! `head_topic`, `head_partition`, `head_offset` against the dead letter's
//! `original_*` (both say where the record was first consumed).
//!
//! A parked key is a key within a topic ([`OrderKey`]): a group reading
//! several topics may park order 7 and row 7 of a table apart.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::{Db, DbError};
use crate::ordering::store::{HELD_COLUMNS, PARKED_COLUMNS};
use crate::ordering::{HeldRecord, OrderKey, Origin, Parked};

/// A held record with the head it waits behind.
#[derive(Debug, Clone, Serialize)]
pub struct HeldView {
    /// The held record.
    #[serde(flatten)]
    pub held: HeldRecord,
    /// The parked key's head (None if the key was unparked meanwhile).
    pub head: Option<Parked>,
    /// The head's dead-letter row, when it was dead-lettered and persisted.
    pub head_dead_letter: Option<i64>,
}

/// Held records and their heads: `held_records` joined to its parked key
/// and the head's dead letter, `h.*`, `p.*` and `d.id` (prefixed names, as
/// the two tables share some).
fn select_views(condition: &str) -> sqlx::AssertSqlSafe<String> {
    let held = prefixed("h", HELD_COLUMNS);
    let parked = prefixed("p", PARKED_COLUMNS);
    sqlx::AssertSqlSafe(format!(
        "SELECT {held}, {parked}, d.id AS d_id FROM held_records h \
         LEFT JOIN parked_keys p ON p.consumer_group = h.consumer_group AND p.key_topic = h.key_topic \
         AND p.record_key = h.record_key \
         LEFT JOIN dead_letters d ON d.consumer_group = p.consumer_group AND d.original_topic = p.head_topic \
         AND d.original_partition = p.head_partition AND d.original_offset = p.head_offset \
         WHERE {condition} ORDER BY h.id LIMIT ?"
    ))
}

/// `t.column AS t_column, ...` for each column of `columns`.
fn prefixed(table: &str, columns: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{table}.{c} AS {table}_{c}", c = c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn view_of(r: &AnyRow) -> Result<HeldView, sqlx::Error> {
    let held = HeldRecord {
        id: r.try_get("h_id")?,
        consumer_group: r.try_get("h_consumer_group")?,
        key_topic: r.try_get("h_key_topic")?,
        key: r.try_get("h_record_key")?,
        source_topic: r.try_get("h_source_topic")?,
        source_partition: r.try_get("h_source_partition")?,
        source_offset: r.try_get("h_source_offset")?,
        source_timestamp: r.try_get("h_source_timestamp")?,
        event_id: r.try_get("h_event_id")?,
        event_name: r.try_get("h_event_name")?,
        payload: r.try_get("h_payload")?,
        headers: r.try_get("h_headers")?,
        held_ms: r.try_get("h_held_ms")?,
    };
    let head = parked_of(r)?;
    Ok(HeldView {
        held,
        head,
        head_dead_letter: r.try_get("d_id")?,
    })
}

/// The parked key of a row selected with `p.*` columns (None when the
/// LEFT JOIN found no parked row).
fn parked_of(r: &AnyRow) -> Result<Option<Parked>, sqlx::Error> {
    let Some(key) = r.try_get::<Option<String>, _>("p_record_key")? else {
        return Ok(None);
    };
    let state: String = r.try_get("p_state")?;
    Ok(Some(Parked {
        key_topic: r.try_get("p_key_topic")?,
        key,
        partition: r.try_get("p_kafka_partition")?,
        head_origin: r.try_get("p_head_origin")?,
        head_topic: r.try_get("p_head_topic")?,
        head_partition: r.try_get("p_head_partition")?,
        head_offset: r.try_get("p_head_offset")?,
        head_event_id: r.try_get("p_head_event_id")?,
        head_event_name: r.try_get("p_head_event_name")?,
        state: state.try_into().map_err(|e| sqlx::Error::ColumnDecode {
            index: "p_state".into(),
            source: Box::new(e),
        })?,
        parked_ms: r.try_get("p_parked_ms")?,
    }))
}

/// Held records (oldest first), optionally of one group, with the head
/// each waits behind.
pub async fn held_views(
    db: &Db,
    group: Option<&str>,
    limit: i64,
) -> Result<Vec<HeldView>, DbError> {
    let rows = sqlx::query(select_views("(? IS NULL OR h.consumer_group = ?)"))
        .bind(group)
        .bind(group)
        .bind(limit)
        .fetch_all(&db.pool)
        .await?;
    Ok(rows.iter().map(view_of).collect::<Result<_, _>>()?)
}

/// One held record with its head, by id.
pub async fn held_view(db: &Db, id: i64) -> Result<Option<HeldView>, DbError> {
    let row = sqlx::query(select_views("h.id = ?"))
        .bind(id)
        .bind(1_i64)
        .fetch_optional(&db.pool)
        .await?;
    Ok(row.as_ref().map(view_of).transpose()?)
}

/// The held records of one parked key (group, topic and key), in the
/// order they will be applied, with their head.
pub async fn key_views(
    db: &Db,
    group: &str,
    key: &OrderKey,
    limit: i64,
) -> Result<Vec<HeldView>, DbError> {
    let rows = sqlx::query(select_views(
        "h.consumer_group = ? AND h.key_topic = ? AND h.record_key = ?",
    ))
    .bind(group)
    .bind(&key.topic)
    .bind(&key.key)
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows.iter().map(view_of).collect::<Result<_, _>>()?)
}

/// A parked key as operators see it: its group, the parked row, how many
/// records wait behind it, and the head's dead letter (id and status) when
/// the head was dead-lettered and persisted.
#[derive(Debug, Clone, Serialize)]
pub struct ParkedView {
    /// The consumer group the key is parked for.
    pub group: String,
    /// The parked row (key, head, state, since when).
    pub parked: Parked,
    /// Records held behind the head.
    pub held: i64,
    /// The head's dead-letter row.
    pub head_dead_letter: Option<i64>,
    /// That row's status (pending, replayed, ignored).
    pub head_status: Option<String>,
}

/// Which parked keys [`parked_views`] lists: each field narrows it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParkedFilter<'a> {
    /// The consumer group.
    pub group: Option<&'a str>,
    /// The key's topic ([`OrderKey::topic`]).
    pub topic: Option<&'a str>,
    /// The record key.
    pub key: Option<&'a str>,
}

/// Parked keys, oldest first, narrowed by `filter`, with their held counts
/// and heads' dead letters (one statement).
pub async fn parked_views(
    db: &Db,
    filter: ParkedFilter<'_>,
    limit: i64,
) -> Result<Vec<ParkedView>, DbError> {
    let parked = prefixed("p", PARKED_COLUMNS);
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT p.consumer_group AS p_group, {parked}, d.id AS d_id, d.status AS d_status, \
         (SELECT COUNT(*) FROM held_records h WHERE h.consumer_group = p.consumer_group AND h.key_topic = p.key_topic \
         AND h.record_key = p.record_key) AS held \
         FROM parked_keys p \
         LEFT JOIN dead_letters d ON d.consumer_group = p.consumer_group AND d.original_topic = p.head_topic \
         AND d.original_partition = p.head_partition AND d.original_offset = p.head_offset \
         WHERE (? IS NULL OR p.consumer_group = ?) AND (? IS NULL OR p.key_topic = ?) AND (? IS NULL OR p.record_key = ?) \
         ORDER BY p.parked_ms, p.consumer_group, p.key_topic, p.record_key LIMIT ?"
    ));
    let ParkedFilter { group, topic, key } = filter;
    let rows = sqlx::query(sql)
        .bind(group)
        .bind(group)
        .bind(topic)
        .bind(topic)
        .bind(key)
        .bind(key)
        .bind(limit)
        .fetch_all(&db.pool)
        .await?;
    let view = |r: &AnyRow| -> Result<ParkedView, sqlx::Error> {
        Ok(ParkedView {
            group: r.try_get("p_group")?,
            parked: parked_of(r)?
                .ok_or_else(|| sqlx::Error::ColumnNotFound("p_record_key".into()))?,
            held: r.try_get("held")?,
            head_dead_letter: r.try_get("d_id")?,
            head_status: r.try_get("d_status")?,
        })
    };
    Ok(rows.iter().map(view).collect::<Result<_, _>>()?)
}

/// The key a dead letter heads, if it does: the group's parked row of
/// `key` (in the topic of `origin`, [`Origin::key_topic`]) whose head was
/// first consumed at `origin`, or is `event_id`.
pub async fn headed_by(
    db: &Db,
    group: &str,
    key: &str,
    origin: &Origin,
    event_id: Option<&str>,
) -> Result<Option<Parked>, DbError> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {PARKED_COLUMNS} FROM parked_keys WHERE consumer_group = ? AND key_topic = ? AND record_key = ? \
         AND ((head_topic = ? AND head_partition = ? AND head_offset = ?) OR head_event_id = ?)"
    ));
    Ok(sqlx::query_as(sql)
        .bind(group)
        .bind(origin.key_topic(group))
        .bind(key)
        .bind(&origin.topic)
        .bind(origin.partition)
        .bind(origin.offset)
        .bind(event_id)
        .fetch_optional(&db.pool)
        .await?)
}

/// Records held behind `key` for `group`.
pub async fn held_count(db: &Db, group: &str, key: &OrderKey) -> Result<i64, DbError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM held_records WHERE consumer_group = ? AND key_topic = ? AND record_key = ?")
            .bind(group)
            .bind(&key.topic)
            .bind(&key.key)
        .fetch_one(&db.pool)
        .await?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::{OwnedHeaders, OwnedMessage};

    use super::*;
    use crate::dlq::store::{self, NewDeadLetter};
    use crate::envelope::{Envelope, EventData};
    use crate::ordering::{self, ParkState};

    fn record(offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"42".to_vec()),
            "orders".into(),
            Timestamp::CreateTime(1),
            3,
            offset,
            Some(OwnedHeaders::new()),
        )
    }

    /// On SQLite (the MariaDB side is tests/it/ordering.rs): a dead-lettered
    /// head parks its key, a later record is held behind it, and the view
    /// finds the head's dead letter by the head columns, not by another
    /// dead letter of the same group and key.
    #[tokio::test]
    async fn a_held_record_names_its_heads_dead_letter_on_sqlite() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let head = Envelope::new("test", EventData::sample_created(42));
        let key = OrderKey {
            topic: "orders".into(),
            key: "42".into(),
        };
        let mut tx = db.begin().await.unwrap();
        ordering::park(
            &mut tx,
            "g",
            &key,
            &record(77),
            Some(&head),
            ParkState::Dead,
            false,
        )
        .await
        .unwrap();
        ordering::hold(&mut tx, "g", &key, &record(78), None)
            .await
            .unwrap();
        for offset in [76, 77] {
            let dead = NewDeadLetter {
                consumer_group: "g".into(),
                original_topic: "orders".into(),
                original_partition: 3,
                original_offset: offset,
                original_timestamp: None,
                key: Some(b"42".to_vec()),
                payload: None,
                headers: "{}".into(),
                event_id: None,
                event_name: None,
                error_class: "handler_fatal".into(),
                error_message: "test".into(),
                attempts: 1,
                first_failure_ms: 1,
                last_failure_ms: 1,
                dlq_partition: 0,
                dlq_offset: offset,
            };
            store::upsert(&mut tx, &dead).await.unwrap();
        }
        tx.commit().await.unwrap();
        let views = held_views(&db, Some("g"), 10).await.unwrap();
        assert_eq!(views.len(), 1);
        let view = &views[0];
        assert_eq!(view.held.source_offset, 78);
        let parked = view.head.as_ref().expect("the parked head");
        assert_eq!(
            (parked.head(), parked.state),
            (
                Origin {
                    topic: "orders".into(),
                    partition: 3,
                    offset: 77
                },
                ParkState::Dead
            )
        );
        assert_eq!(
            parked.head_origin, "orders/3/77",
            "still written for readers of the text form"
        );
        assert_eq!(
            view.head_dead_letter,
            Some(2),
            "the dead letter of offset 77, not 76"
        );
        assert_eq!(
            held_view(&db, view.held.id)
                .await
                .unwrap()
                .unwrap()
                .head_dead_letter,
            Some(2)
        );
        assert!(held_views(&db, Some("other"), 10).await.unwrap().is_empty());
        assert_eq!(key_views(&db, "g", &key, 10).await.unwrap().len(), 1);
        assert!(
            key_views(
                &db,
                "g",
                &OrderKey {
                    key: "43".into(),
                    ..key.clone()
                },
                10
            )
            .await
            .unwrap()
            .is_empty()
        );
        assert!(
            key_views(
                &db,
                "g",
                &OrderKey {
                    topic: "cdc.shop.t".into(),
                    ..key.clone()
                },
                10
            )
            .await
            .unwrap()
            .is_empty()
        );
        let parked = parked_views(&db, ParkedFilter::default(), 10)
            .await
            .unwrap();
        assert_eq!(parked.len(), 1);
        let p = &parked[0];
        assert_eq!(
            (p.group.as_str(), p.parked.key.as_str(), p.held),
            ("g", "42", 1)
        );
        assert_eq!(
            (p.head_dead_letter, p.head_status.as_deref()),
            (Some(2), Some("pending")),
            "the head's row, not offset 76's"
        );
        assert_eq!(p.parked.key_topic, "orders");
        assert!(
            parked_views(
                &db,
                ParkedFilter {
                    group: Some("g"),
                    key: Some("43"),
                    ..Default::default()
                },
                10
            )
            .await
            .unwrap()
            .is_empty()
        );
        let other_topic = ParkedFilter {
            group: Some("g"),
            topic: Some("cdc.shop.t"),
            key: Some("42"),
        };
        assert!(parked_views(&db, other_topic, 10).await.unwrap().is_empty());
        assert_eq!(held_count(&db, "g", &key).await.unwrap(), 1);
        assert_eq!(
            held_count(
                &db,
                "g",
                &OrderKey {
                    topic: "cdc.shop.t".into(),
                    ..key
                }
            )
            .await
            .unwrap(),
            0
        );
    }
}
