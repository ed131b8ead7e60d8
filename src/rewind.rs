//! Rewind by time: `orderpipe consume|deliver --group G --reset-to <RFC 3339>`
//! (seed 003: replay a downstream from a point in time after a downstream bug).
//!
//! [`rewind`] moves a stopped group's committed offset, on every partition
//! of the topics it reads, to the first record at or after the time (Kafka's
//! `offsets_for_times`; a partition with no record that late goes to its
//! log end), and reports each partition's old and new offset. It refuses a
//! group with live members, naming them: their next commit would undo the
//! rewind, and the broker takes a commit from outside the group only while
//! the group is empty.
//!
//! The group's retry topic is not rewound: every record in it is a copy of
//! a main-topic record, so re-reading the main topic from the time already
//! covers them, and rewinding both would deliver those events twice.
//!
//! A consumer skips events its group has applied (their `event_dedup`
//! rows). To replay, [`forget_applied`] deletes the group's dedup rows of
//! the records that will be read again: those applied from a main-topic
//! position at or after the new offset, and those applied from the retry
//! topic since the time, with `--dedup forget`; `--dedup keep` keeps them (the re-read events are
//! then counted as duplicates and not applied again).

use std::time::Duration;

use chrono::{DateTime, Utc};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::db::{Db, DbError};
use crate::kafka::client::{KafkaSettings, assignment_reader, client_config};
use crate::kafka::offsets;
use crate::lag;

/// How long one broker request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One partition of a rewound group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RewoundPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The committed offset before (None: the group had committed nothing there).
    pub old_offset: Option<i64>,
    /// The committed offset now: the first record at or after the time, or the log end.
    pub new_offset: i64,
}

/// Why a group was not rewound.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    /// The group has live members.
    #[error(
        "consumer group {group} has {} live member(s): {}; stop them first \
         (a group is rewound only while nobody consumes it)",
        members.len(), members.join(", ")
    )]
    LiveMembers {
        /// Group id.
        group: String,
        /// `client_id@host (member id)` of each member.
        members: Vec<String>,
    },
    /// A Kafka request failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A topic of the group does not exist.
    #[error("topic {0} does not exist")]
    NoTopic(String),
    /// The committed offsets read back differ from the ones written.
    #[error("the broker holds {found:?} for {topic}[{partition}] after committing {wanted}")]
    NotCommitted {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset committed.
        wanted: i64,
        /// Offset read back.
        found: Option<i64>,
    },
    /// Forgetting the dedup rows failed (the offsets are rewound already).
    #[error("offsets rewound, but the group's dedup rows were not forgotten: {0}")]
    Db(#[from] DbError),
    /// The blocking task died.
    #[error("rewind task failed: {0}")]
    Task(String),
}

/// Rewinds `group` on every partition of `topics` to the first record at or
/// after `to` and commits that; returns each partition's old and new offset.
pub async fn rewind(
    kafka: &KafkaSettings,
    group: &str,
    topics: &[String],
    to: DateTime<Utc>,
) -> Result<Vec<RewoundPartition>, RewindError> {
    let (kafka, group, topics) = (kafka.clone(), group.to_string(), topics.to_vec());
    tokio::task::spawn_blocking(move || {
        rewind_blocking(&kafka, &group, &topics, to.timestamp_millis())
    })
    .await
    .map_err(|e| RewindError::Task(e.to_string()))?
}

fn rewind_blocking(
    kafka: &KafkaSettings,
    group: &str,
    topics: &[String],
    to_ms: i64,
) -> Result<Vec<RewoundPartition>, RewindError> {
    let probe = lag::probe(kafka)?;
    refuse_live_members(&probe, group)?;
    // Reads by assignment, read_committed: a partition's end is its last stable offset.
    let reader = assignment_reader(kafka, "orderpipe.rewind")?;
    let mut target = TopicPartitionList::new();
    for topic in topics {
        let ranges = offsets::partition_ranges(&reader, topic, REQUEST_TIMEOUT)?
            .ok_or_else(|| RewindError::NoTopic(topic.clone()))?;
        let starts = offsets::first_offsets_at(&reader, topic, &ranges, to_ms, REQUEST_TIMEOUT)?;
        for (range, start) in ranges.iter().zip(starts) {
            target.add_partition_offset(topic, range.partition, Offset::Offset(start))?;
        }
    }
    let old = lag::committed_offsets(kafka, group, &target)?;
    // A client with the group's id that never joins: the broker accepts its
    // commit as long as the group has no members.
    let committer: BaseConsumer = client_config(&kafka.client_options())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    if let Err(e) = lag::retry_coordinator(|| committer.commit(&target, CommitMode::Sync)) {
        // A member that joined since the check makes the broker refuse the commit.
        refuse_live_members(&probe, group)?;
        return Err(e.into());
    }
    let now = lag::committed_offsets(kafka, group, &target)?;
    target
        .elements()
        .iter()
        .map(|e| {
            let key = (e.topic().to_string(), e.partition());
            let wanted = match e.offset() {
                Offset::Offset(o) => o,
                _ => unreachable!("every target is an absolute offset"),
            };
            let found = now.get(&key).copied().flatten();
            if found != Some(wanted) {
                return Err(RewindError::NotCommitted {
                    topic: key.0,
                    partition: key.1,
                    wanted,
                    found,
                });
            }
            Ok(RewoundPartition {
                topic: key.0.clone(),
                partition: key.1,
                old_offset: old.get(&key).copied().flatten(),
                new_offset: wanted,
            })
        })
        .collect()
}

fn refuse_live_members(probe: &BaseConsumer, group: &str) -> Result<(), RewindError> {
    let (_, members) = lag::describe_group(probe, group)?;
    if members.is_empty() {
        Ok(())
    } else {
        Err(RewindError::LiveMembers {
            group: group.to_string(),
            members,
        })
    }
}

/// Deletes `group`'s dedup rows of the records a rewind to `since` makes it
/// read again: applied from a rewound partition at or after its new offset,
/// or from `retry_topic` at or after `since` (by the database's clock,
/// taken as UTC, as `dedup cleanup` does). Batches of
/// [`crate::dedup::CLEANUP_BATCH`] rows, so no long lock is held. Returns
/// the rows deleted.
pub async fn forget_applied(
    db: &Db,
    group: &str,
    rewound: &[RewoundPartition],
    retry_topic: &str,
    since: DateTime<Utc>,
) -> Result<u64, DbError> {
    use crate::dedup::{CLEANUP_BATCH, delete_in_batches};
    let group = crate::dedup::group(db, group).await?.id;
    let by_offset = db.sql().delete_limited(
        "event_dedup",
        "rowid",
        "group_id = ? AND topic = ? AND kafka_partition = ? AND kafka_offset >= ?",
    );
    let by_time = db.sql().delete_limited(
        "event_dedup",
        "rowid",
        "group_id = ? AND topic = ? AND apply_seq >= ? AND created_at >= ?",
    );
    let mut removed = 0;
    for p in rewound {
        let bind = |q: crate::dedup::AnyQuery<'static>| {
            q.bind(group)
                .bind(p.topic.clone())
                .bind(p.partition)
                .bind(p.new_offset)
        };
        removed += delete_in_batches(db, by_offset.clone(), bind, CLEANUP_BATCH).await?;
    }
    let floor = crate::dedup::seq_floor(db, since).await?;
    let since = crate::dedup::db_time(since);
    let bind = |q: crate::dedup::AnyQuery<'static>| {
        q.bind(group)
            .bind(retry_topic.to_string())
            .bind(floor)
            .bind(since.clone())
    };
    removed += delete_in_batches(db, by_time, bind, CLEANUP_BATCH).await?;
    Ok(removed)
}

/// Parses `--reset-to`: an RFC 3339 time, e.g. `2026-12-01T06:30:00Z`.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("`{text}` is not an RFC 3339 time ({e}); e.g. 2026-12-01T06:30:00Z or 2026-12-01T07:30:00+01:00"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::{RecordOrigin, claim_batch, group};
    use crate::envelope::{Envelope, EventData};

    #[test]
    fn times_are_rfc_3339_with_an_offset() {
        assert_eq!(
            parse_time("2026-12-01T07:30:00+01:00")
                .unwrap()
                .to_rfc3339(),
            "2026-12-01T06:30:00+00:00"
        );
        assert_eq!(
            parse_time("2026-12-01T06:30:00.250Z")
                .unwrap()
                .timestamp_millis()
                % 1000,
            250
        );
        for bad in ["2026-12-01 06:30", "2026-12-01T06:30:00", "yesterday"] {
            let e = parse_time(bad).unwrap_err();
            assert!(
                e.contains(&format!("`{bad}` is not an RFC 3339 time"))
                    && e.contains("e.g. 2026-12-01T06:30:00Z"),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn forgets_the_rows_of_records_read_again_only() {
        let (_dir, db) = crate::db::sqlite_for_test().await;
        let events: Vec<Envelope> = (0..6)
            .map(|i| Envelope::new("t", EventData::sample_created(i)))
            .collect();
        // Offsets 0..3 of partitions 0 and 1 of the main topic for group g, one more group's row.
        let origin = |topic: &str, partition, offset| RecordOrigin {
            topic: topic.into(),
            partition,
            offset,
            key: "k".into(),
        };
        let origins = [
            origin("main", 0, 0),
            origin("main", 0, 1),
            origin("main", 0, 2),
            origin("main", 1, 0),
            origin("main", 1, 1),
            origin("main.retry.g", 0, 7),
        ];
        let pairs: Vec<_> = events.iter().zip(origins.iter()).collect();
        let (g, other) = (
            group(&db, "g").await.unwrap(),
            group(&db, "other").await.unwrap(),
        );
        let mut tx = db.begin().await.unwrap();
        claim_batch(&mut tx, &g, &pairs).await.unwrap();
        claim_batch(&mut tx, &other, &pairs[..1]).await.unwrap();
        tx.commit().await.unwrap();
        let rewound = |partition, new_offset| RewoundPartition {
            topic: "main".into(),
            partition,
            old_offset: Some(3),
            new_offset,
        };
        // A time after the rows were written: the retry topic's row stays.
        let later = Utc::now() + chrono::Duration::hours(1);
        let removed = forget_applied(
            &db,
            "g",
            &[rewound(0, 1), rewound(1, 5)],
            "main.retry.g",
            later,
        )
        .await
        .unwrap();
        assert_eq!(removed, 2, "offsets 1 and 2 of partition 0");
        let left: Vec<(String, String, i64, i64)> =
            sqlx::query_as("SELECT consumer_group, topic, kafka_partition, kafka_offset FROM applied_events ORDER BY consumer_group, topic, kafka_partition, kafka_offset")
                .fetch_all(&db.pool)
                .await
                .unwrap();
        let left: Vec<_> = left
            .iter()
            .map(|(g, t, p, o)| format!("{g} {t}[{p}]@{o}"))
            .collect();
        assert_eq!(
            left,
            [
                "g main[0]@0",
                "g main[1]@0",
                "g main[1]@1",
                "g main.retry.g[0]@7",
                "other main[0]@0"
            ]
        );
        // A time before: the retry topic's row goes too.
        let earlier = Utc::now() - chrono::Duration::hours(1);
        assert_eq!(
            forget_applied(&db, "g", &[], "main.retry.g", earlier)
                .await
                .unwrap(),
            1
        );
    }
}
