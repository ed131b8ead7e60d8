//! Compact dedup rows (migration 0021) keep an install's dedup memory: an
//! event applied before the upgrade and redelivered after it is skipped,
//! before `orderpipe dedup upgrade` has moved its row (MariaDB reads the
//! legacy table), while it does, and after; on SQLite the migration
//! converts the rows itself.

use orderpipe::db::Db;
use orderpipe::dedup::{self, RecordOrigin, claim_batch, content_digest};
use orderpipe::envelope::{Envelope, EventData};
use orderpipe::hex;

use crate::helpers::{TestEnv, migrated_before};

/// Events of orders `orders`, as a producer would send them.
fn events(orders: std::ops::Range<i64>) -> Vec<Envelope> {
    orders
        .map(|order| Envelope::new("order-service", EventData::sample_created(order)))
        .collect()
}

fn origin(offset: i64) -> RecordOrigin {
    RecordOrigin {
        topic: "order.events.v1".into(),
        partition: 2,
        offset,
        key: "k".into(),
    }
}

/// Writes `events` as applied by `group` in the schema of before 0021 (the
/// columns an earlier release's claim wrote; its 64-digit digest started
/// with the 16 digits kept now, the rest stands in here), apply_seq from
/// `first_seq`.
async fn applied_the_old_way(db: &Db, group: &str, events: &[Envelope], first_seq: i64) {
    for (i, e) in events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO event_dedup (consumer_group, event_id, apply_seq, topic, kafka_partition, kafka_offset, \
             event_type, record_key, payload_digest) VALUES (?, ?, ?, 'order.events.v1', 2, ?, 'order.created', 'k', ?)",
        )
        .bind(group)
        .bind(e.event_id.to_string())
        .bind(first_seq + i as i64)
        .bind(i as i64)
        .bind(format!("{}{}", hex::lower(&content_digest(e)), "ab".repeat(24)))
        .execute(&db.pool)
        .await
        .unwrap();
    }
}

/// Claims every event for `group` as a consumer claims a wave: counted
/// first (`dedup::claim_all`), and when not every event was new, rolled
/// back and claimed again with the verdict per event; the verdicts.
async fn claim_all(db: &Db, group: &str, events: &[Envelope]) -> Vec<bool> {
    let group = dedup::group(db, group).await.unwrap();
    let origins: Vec<RecordOrigin> = (0..events.len() as i64).map(|o| origin(1000 + o)).collect();
    let set: Vec<(&Envelope, &RecordOrigin)> = events.iter().zip(&origins).collect();
    let mut tx = db.begin().await.unwrap();
    tx.savepoint().await.unwrap();
    let fresh = if dedup::claim_all(&mut tx, &group, &set).await.unwrap() {
        vec![true; set.len()]
    } else {
        tx.rollback_to_savepoint().await.unwrap();
        claim_batch(&mut tx, &group, &set).await.unwrap()
    };
    tx.commit().await.unwrap();
    fresh
}

/// The old rows, then every migration, then redeliveries and new events.
/// Returns the database (migrated) and the events applied the old way, for
/// the backend's own next steps.
async fn upgrade_keeps_the_memory(url: &str, migrations: &str) -> (Db, Vec<Envelope>) {
    let db = migrated_before(url, migrations, "0021").await;
    let old = events(1..26);
    applied_the_old_way(&db, "g", &old, 1).await;
    applied_the_old_way(&db, "h", &old[..10], 26).await;
    db.migrate().await.unwrap();

    // Redelivered to g: the 25 are skipped, 5 new events are applied.
    let new = events(100..105);
    let all: Vec<Envelope> = old.iter().chain(&new).cloned().collect();
    let fresh = claim_all(&db, "g", &all).await;
    assert_eq!(
        fresh[..25],
        [false; 25],
        "{migrations}: applied before the upgrade"
    );
    assert_eq!(fresh[25..], [true; 5], "{migrations}: new events");
    // h applied 10 of them before.
    let fresh = claim_all(&db, "h", &old).await;
    assert_eq!(fresh.iter().filter(|f| !**f).count(), 10, "{migrations}");

    // A reused id: the first event's content under the same id is told
    // apart by the old row's digest.
    let g = dedup::group(&db, "g").await.unwrap();
    let mut reused = old[0].clone();
    reused.producer = "another-service".into();
    let mut tx = db.begin().await.unwrap();
    let conflict = dedup::check_duplicate(&mut tx, &g, &reused, &origin(2000))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{migrations}: the reused id is a conflict"));
    assert!(
        dedup::check_duplicate(&mut tx, &g, &old[1], &origin(2001))
            .await
            .unwrap()
            .is_none(),
        "{migrations}: a true duplicate is none"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        (conflict.first_offset, conflict.first_digest.clone()),
        (0, hex::lower(&content_digest(&old[0]))),
        "{migrations}"
    );
    (db, old)
}

/// The rows of `group` as people read them, in apply order: (event id, apply_seq).
async fn applied_rows(db: &Db, group: &str) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT event_id, apply_seq FROM applied_events WHERE consumer_group = ? ORDER BY apply_seq")
        .bind(group)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_dedup_memory_survives_the_compact_key_and_the_online_move() {
    let env = TestEnv::new();
    let url = crate::helpers::empty_mysql_database(&format!("op_{}_dedup_up", env.prefix)).await;
    let (db, old) = upgrade_keeps_the_memory(&url, "sql/mysql").await;
    // Before the move, g's old rows are still in the legacy table.
    assert_eq!(applied_rows(&db, "g").await.len(), 5);

    // The upgrade runs as its own process does, on a pool of its own: `db`
    // (a consumer) read the legacy table above and remembers it as there.
    let connect = || {
        Db::connect(
            &orderpipe::db::DatabaseSettings {
                url: url.clone().into(),
                max_connections: Some(2),
            },
            2,
        )
        .unwrap()
    };
    assert_eq!(db.memo.legacy(), orderpipe::db::Legacy::Present);
    let mut seen = Vec::new();
    let report = dedup::upgrade(&connect(), 7, |p| seen.push(p.moved))
        .await
        .unwrap();
    assert_eq!(
        (
            report.progress.total,
            report.progress.moved,
            report.left,
            report.dropped
        ),
        (35, 35, 0, true)
    );
    assert_eq!(
        seen,
        [7, 14, 21, 25, 32, 35],
        "progress after every batch of 7, group g (25 rows) then h (10)"
    );
    let (legacy,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'event_dedup_legacy'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(legacy, 0, "the empty legacy table is dropped");

    // The moved rows kept their ids and apply_seq; the new ones came after.
    let rows = applied_rows(&db, "g").await;
    let ids: Vec<String> = old.iter().map(|e| e.event_id.to_string()).collect();
    assert_eq!(rows.len(), 30);
    assert_eq!(
        rows[..25].iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        ids
    );
    assert_eq!(
        rows[..25].iter().map(|r| r.1).collect::<Vec<_>>(),
        (1..26).collect::<Vec<_>>()
    );
    assert!(rows[25..].iter().all(|r| r.1 > 35), "{rows:?}");

    // A process that knew the legacy table (its memo says present) finds it
    // gone and claims on; a fresh one never looks. Both skip the old events.
    assert_eq!(claim_all(&db, "g", &old).await, [false; 25]);
    assert_eq!(db.memo.legacy(), orderpipe::db::Legacy::Gone);
    assert_eq!(claim_all(&connect(), "h", &old).await, [false; 25]);
    // Nothing left to do.
    let again = dedup::upgrade(&db, 7, |_| {}).await.unwrap();
    assert_eq!((again.progress.moved, again.dropped), (0, false));
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_dedup_memory_survives_the_compact_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
    let (db, _) = upgrade_keeps_the_memory(&url, "sql/sqlite").await;
    let rows = applied_rows(&db, "g").await;
    assert_eq!(rows.len(), 30);
    assert_eq!(
        rows[..25].iter().map(|r| r.1).collect::<Vec<_>>(),
        (1..26).collect::<Vec<_>>()
    );
    let report = dedup::upgrade(&db, 7, |_| {}).await.unwrap();
    assert_eq!((report.progress.total, report.dropped), (0, false));
}
