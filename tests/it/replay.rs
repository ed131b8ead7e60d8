//! `dlq replay` as a stream against Kafka + MariaDB: rows read a page at a
//! time (more rows than one page), every row sent once and marked once, in
//! order per key; the selection fixed when the replay starts; a refused
//! send leaving its row pending; a replay killed midway leaving the rows it
//! did not mark pending, applied once after a second replay. (Replays applied by a consumer group are
//! in tests/it/dlq.rs and tests/it/ordering.rs.)

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::time::{Duration, Instant};

use orderpipe::dlq::store::{self, NewDeadLetter};
use orderpipe::kafka::record::header;
use orderpipe::retry::retry_topic;
use rdkafka::Message;
use serde_json::Value;

use crate::consumer::{consume, count_rows};
use crate::dlq::{dead_letter_everything, persist};
use crate::helpers::{TestEnv, header as header_of};

/// Pending dead letters of `group` at offsets `offsets` of the test's order
/// topic, keyed `order-{offset % keys}`, written straight into the table.
pub(crate) async fn dead_letters(
    env: &TestEnv,
    group: &str,
    offsets: std::ops::Range<i64>,
    keys: i64,
) {
    let db = env.db();
    let mut tx = db.begin().await.unwrap();
    for offset in offsets {
        store::upsert(&mut tx, &dead_letter(env, group, offset, keys))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// A pending dead letter of `group` at `offset` of the test's order topic,
/// keyed `order-{offset % keys}`.
fn dead_letter(env: &TestEnv, group: &str, offset: i64, keys: i64) -> NewDeadLetter {
    let dead = crate::dlq_gauges::dead_letter(
        env,
        group,
        offset,
        Some("order.created"),
        "handler_fatal",
        1,
    );
    NewDeadLetter {
        key: Some(format!("order-{}", offset % keys).into_bytes()),
        headers: serde_json::json!({"event_id": dead.event_id, "event_name": "order.created"})
            .to_string(),
        error_message: "fails permanently".into(),
        ..dead
    }
}

/// (id, status, replay_count) of a group's rows, by id.
async fn rows(env: &TestEnv, group: &str) -> Vec<(i64, String, i32)> {
    sqlx::query_as(
        "SELECT id, status, replay_count FROM dead_letters WHERE consumer_group = ? ORDER BY id",
    )
    .bind(group)
    .fetch_all(&env.db().pool)
    .await
    .unwrap()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("JSON ({e}): {text}"))
}

/// Reads the `count` replayed records of `topic` and checks each names a
/// row of `ids` once, and each key's rows arrive in id order.
fn assert_sent_once_in_key_order(env: &TestEnv, topic: &str, ids: &[i64]) {
    let records = env.read(topic, ids.len(), Duration::from_secs(30));
    let mut seen = BTreeSet::new();
    let mut last_of_key: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    for record in &records {
        let id: i64 = header_of(record, header::REPLAYED_FROM)
            .expect("replayed-from header")
            .parse()
            .unwrap();
        assert!(seen.insert(id), "row {id} sent twice");
        let key = record.key().expect("the original key").to_vec();
        if let Some(before) = last_of_key.insert(key.clone(), id) {
            assert!(
                before < id,
                "key {} out of order: row {id} after row {before}",
                String::from_utf8_lossy(&key)
            );
        }
    }
    assert_eq!(
        seen,
        ids.iter().copied().collect::<BTreeSet<_>>(),
        "every selected row sent, no other"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_many_pages_sends_and_marks_every_row_once_in_key_order() {
    let env = TestEnv::new().with_database().await;
    let group = "pages.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    dead_letters(&env, group, 0..2_500, 25).await;
    // Not selected: another group's rows, and an ignored row of this group.
    dead_letters(&env, "other.order.consumer", 0..100, 5).await;
    dead_letters(&env, group, 2_500..2_501, 25).await;
    let ignored = rows(&env, group).await.last().unwrap().0;
    env.cli(&[
        "dlq",
        "ignore",
        "--id",
        &ignored.to_string(),
        "--reason",
        "test",
    ])
    .success();
    let pending: Vec<i64> = rows(&env, group)
        .await
        .iter()
        .filter(|r| r.1 == "pending")
        .map(|r| r.0)
        .collect();
    assert_eq!(pending.len(), 2_500);

    // The dry run pages the same way and changes nothing.
    let plan = json(
        &env.cli(&[
            "dlq",
            "replay",
            "--group",
            group,
            "--dry-run",
            "--page-size",
            "100",
            "--output",
            "json",
        ])
        .success(),
    );
    let planned: Vec<i64> = plan
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect();
    assert_eq!(planned, pending, "the dry run lists every page, by id");

    let args = [
        "dlq",
        "replay",
        "--group",
        group,
        "--page-size",
        "100",
        "--in-flight",
        "64",
        "--yes",
        "--output",
        "json",
    ];
    let summary = json(&env.cli(&args).success());
    let retry = retry_topic(&env.settings.topics.order_events.name, group);
    assert_eq!(summary["replayed"], 2_500, "{summary}");
    assert_eq!(
        summary["failed"].as_array().map(Vec::len),
        Some(0),
        "{summary}"
    );
    assert_eq!(summary["by_topic"][&retry], 2_500, "{summary}");
    assert_sent_once_in_key_order(&env, &retry, &pending);

    let after = rows(&env, group).await;
    let marked: Vec<i64> = after
        .iter()
        .filter(|r| r.1 == "replayed" && r.2 == 1)
        .map(|r| r.0)
        .collect();
    assert_eq!(marked, pending, "every row marked replayed, once");
    assert_eq!(
        after.last().unwrap(),
        &(ignored, "ignored".to_string(), 0),
        "the ignored row is not replayed"
    );
    assert!(
        rows(&env, "other.order.consumer")
            .await
            .iter()
            .all(|r| r.1 == "pending" && r.2 == 0),
        "another group's rows untouched"
    );
    // Nothing is left pending: a second replay sends nothing.
    assert_eq!(json(&env.cli(&args).success())["replayed"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_persisted_during_a_replay_waits_for_the_next_one() {
    let env = TestEnv::new().with_database().await;
    let group = "bound.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    dead_letters(&env, group, 0..600, 10).await;
    // Paced (about 6 s), so rows are marked while it runs and the look below,
    // a query of 600 rows, sees it midway even on a loaded machine (2.4 s
    // was a short window).
    let mut replay = env.spawn(&[
        "dlq",
        "replay",
        "--group",
        group,
        "--rate",
        "100",
        "--page-size",
        "50",
        "--yes",
        "--output",
        "json",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let marked = loop {
        let marked = rows(&env, group)
            .await
            .iter()
            .filter(|r| r.1 == "replayed")
            .count();
        if marked > 0 {
            break marked;
        }
        assert!(Instant::now() < deadline, "no row marked within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        marked < 600,
        "marked in batches as acknowledged, before the end: {marked}"
    );
    // A new dead letter of the same group, while the replay runs.
    dead_letters(&env, group, 600..601, 10).await;
    let mut out = String::new();
    replay
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(replay.wait().unwrap().success(), "{out}");
    assert_eq!(json(&out)["replayed"], 600, "{out}");
    let after = rows(&env, group).await;
    assert_eq!(
        after
            .iter()
            .filter(|r| r.1 == "replayed" && r.2 == 1)
            .count(),
        600
    );
    let newest = after.last().unwrap();
    assert_eq!(
        (newest.1.as_str(), newest.2),
        ("pending", 0),
        "persisted after the replay started: left for the next"
    );
    let next = json(
        &env.cli(&[
            "dlq", "replay", "--group", group, "--yes", "--output", "json",
        ])
        .success(),
    );
    assert_eq!(next["replayed"], 1, "{next}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_send_leaves_its_row_pending_and_reported() {
    let env = TestEnv::new().with_database().await;
    let (ok, missing) = ("sent.order.consumer", "no-retry-topic.order.consumer");
    // Only `ok` gets its retry topic; the broker does not auto-create topics,
    // so records for `missing`'s retry topic are never acknowledged.
    env.cli(&["topics", "ensure", "--group", ok]).success();
    dead_letters(&env, ok, 0..2, 2).await;
    dead_letters(&env, missing, 2..3, 2).await;
    dead_letters(&env, ok, 3..5, 2).await;
    let refused = rows(&env, missing).await[0].0;
    let run = env.cli(&[
        "-X",
        "message.timeout.ms=3000",
        "dlq",
        "replay",
        "--status",
        "pending",
        "--yes",
        "--output",
        "json",
    ]);
    run.failure();
    let summary = json(&String::from_utf8_lossy(&run.output.stdout));
    assert_eq!(summary["replayed"], 4, "{summary}");
    let failed = summary["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{summary}");
    assert!(
        failed[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("dead letter {refused}:")),
        "{summary}"
    );
    assert_eq!(
        rows(&env, missing).await,
        [(refused, "pending".to_string(), 0)],
        "never marked"
    );
    assert!(
        rows(&env, ok)
            .await
            .iter()
            .all(|r| r.1 == "replayed" && r.2 == 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_killed_midway_leaves_its_unmarked_rows_pending_and_nothing_is_applied_twice() {
    let mut env = TestEnv::new().with_database().await;
    let group = "crash.order.consumer";
    let events = dead_letter_everything(&mut env, group, 800).await;
    assert_eq!(persist(&env)["read"], 800);
    // Paced (about 8 s; killed at the first mark, so it costs nothing), so it
    // is killed with rows sent, some of them acknowledged but not yet marked.
    let mut replay = env.spawn(&[
        "dlq",
        "replay",
        "--group",
        group,
        "--rate",
        "100",
        "--page-size",
        "50",
        "--yes",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rows(&env, group).await.iter().any(|r| r.1 == "replayed") {
        assert!(Instant::now() < deadline, "no row marked within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replay.kill().unwrap();
    replay.wait().unwrap();
    let after_kill = rows(&env, group).await;
    let marked = after_kill
        .iter()
        .filter(|r| r.1 == "replayed" && r.2 == 1)
        .count();
    let pending = after_kill
        .iter()
        .filter(|r| r.1 == "pending" && r.2 == 0)
        .count();
    assert!(marked > 0 && marked < 800, "killed midway: {marked} marked");
    assert_eq!(
        marked + pending,
        800,
        "every row marked once or left pending"
    );

    // The next replay takes the rest; the group applies each event once,
    // skipping what the killed replay sent and did not mark.
    let next = json(
        &env.cli(&[
            "dlq", "replay", "--group", group, "--yes", "--output", "json",
        ])
        .success(),
    );
    assert_eq!(next["replayed"], pending as u64, "{next}");
    let applied = consume(&env, group, "notification");
    assert_eq!(applied["applied"], 800, "{applied}");
    eprintln!(
        "killed after {marked} marked; duplicates skipped: {}",
        applied["duplicates"]
    );
    assert!(
        rows(&env, group)
            .await
            .iter()
            .all(|r| r.1 == "replayed" && r.2 == 1)
    );
    let db = env.db();
    let (notifications,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM notifications")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (notifications, count_rows(&db, group).await),
        (events.len() as i64, 800),
        "one notification and one dedup row per event"
    );
}

#[test]
fn a_page_size_or_window_out_of_range_is_refused_naming_the_flag() {
    let env = TestEnv::new();
    for (flag, value) in [
        ("--page-size", "0"),
        ("--in-flight", "0"),
        ("--in-flight", "many"),
        ("--page-size", "100001"),
    ] {
        let out = env
            .cli(&["dlq", "replay", "--group", "g", flag, value, "--yes"])
            .failure();
        assert!(
            out.contains(flag) && out.contains(value),
            "{flag} {value}: {out}"
        );
    }
    let out = env
        .cli(&["dlq", "replay", "--group", "g", "--page-size", "0"])
        .failure();
    assert!(out.contains("1..=100000"), "the accepted range: {out}");
}

/// Migration 0028 (a mark rewrites its row in place) keeps every dead
/// letter as it was: rows written, replayed and ignored by the schema
/// before it read the same after it, and the columns are the fixed-length
/// ones MariaDB itself reports.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_written_before_0028_read_the_same_after_it() {
    let env = TestEnv::new();
    let url = crate::helpers::empty_mysql_database(&format!("op_{}_dl_up", env.prefix)).await;
    let db = crate::helpers::migrated_before(&url, "sql/mysql", "0028").await;
    let mut tx = db.begin().await.unwrap();
    for offset in 0..3 {
        store::upsert(&mut tx, &dead_letter(&env, "g", offset, 3))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let all = store::Filter::default();
    let ids = crate::dlq_gauges::listed_ids(&db, &all, 10).await;
    store::mark_replayed(&db, &ids[1..2]).await.unwrap();
    store::mark_ignored(&db, ids[2], "a test").await.unwrap();
    let before = serde_json::to_value(store::list(&db, &all, 10).await.unwrap()).unwrap();
    assert_eq!(before[0]["last_replayed_ms"], Value::Null, "never replayed");
    assert!(before[1]["last_replayed_ms"].as_i64().unwrap() > 0);

    db.migrate().await.unwrap();
    let after = serde_json::to_value(store::list(&db, &all, 10).await.unwrap()).unwrap();
    assert_eq!(after, before);
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT column_name, column_type, is_nullable FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'dead_letters' \
         AND column_name IN ('status', 'last_replayed_ms') ORDER BY column_name",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        columns,
        [
            ("last_replayed_ms".into(), "bigint(20)".into(), "NO".into()),
            ("status".into(), "char(8)".into(), "NO".into()),
        ]
    );

    // The never-replayed row is marked, and reads as replayed.
    store::mark_replayed(&db, &ids[..1]).await.unwrap();
    let marked = &store::list(&db, &all, 1).await.unwrap()[0];
    assert_eq!(marked.status, "replayed");
    assert_eq!(marked.replay_count, 1);
    assert!(marked.last_replayed_ms.unwrap() > 0);
}
