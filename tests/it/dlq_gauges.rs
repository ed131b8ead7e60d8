//! The dead-letter gauges against MariaDB: `orderpipe_dead_letters_pending
//! {group, event_name, class}` scraped from a running persister (every
//! group) and a running `consume` (its own group), which keeps exporting
//! with the persister down; labels bounded; a series that drops to 0 goes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use orderpipe::dlq::store::{self, NewDeadLetter};

use crate::consumer::sigterm;
use crate::helpers::{TestEnv, health_addr, http_get};

/// A dead letter of `group` at `offset`, failed at `last_failure_ms`.
pub(crate) fn dead_letter(
    env: &TestEnv,
    group: &str,
    offset: i64,
    event: Option<&str>,
    class: &str,
    last_failure_ms: i64,
) -> NewDeadLetter {
    let event_id = uuid::Uuid::new_v4().to_string();
    NewDeadLetter {
        consumer_group: group.into(),
        original_topic: env.settings.topics.order_events.name.clone(),
        original_partition: 0,
        original_offset: offset,
        original_timestamp: Some(1),
        key: Some(format!("order-{offset}").into_bytes()),
        payload: Some(format!("payload {offset}").into_bytes()),
        headers: serde_json::json!({"event_id": event_id}).to_string(),
        event_id: Some(event_id),
        event_name: event.map(str::to_string),
        error_class: class.into(),
        error_message: format!("{class} at offset {offset}"),
        attempts: 1,
        first_failure_ms: last_failure_ms,
        last_failure_ms,
        dlq_partition: 0,
        dlq_offset: offset,
    }
}

/// Writes `rows` into the test's `dead_letters` table, pending.
pub(crate) async fn insert(env: &TestEnv, rows: &[NewDeadLetter]) {
    let db = env.db();
    let mut tx = db.begin().await.unwrap();
    for row in rows {
        store::upsert(&mut tx, row).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Sets the status of `group`'s rows matching `condition` (a constant of the test).
async fn set_status(env: &TestEnv, group: &str, status: &str, condition: &str) {
    let sql =
        format!("UPDATE dead_letters SET status = ? WHERE consumer_group = ? AND {condition}");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(status)
        .bind(group)
        .execute(&env.db().pool)
        .await
        .unwrap();
}

type Series = BTreeMap<String, f64>;

/// The `orderpipe_dead_letters_pending` series on `addr`'s /metrics, by label set.
fn pending_series(addr: &str) -> Series {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "/metrics of {addr}: {body}");
    body.lines()
        .filter_map(|l| l.strip_prefix("orderpipe_dead_letters_pending{"))
        .map(|l| {
            let (labels, value) = l.rsplit_once("} ").unwrap();
            (labels.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// Waits until `addr` exports exactly `want`.
async fn expect_series(addr: &str, want: &[(&str, f64)], what: &str) {
    let want: Series = want.iter().map(|(l, v)| (l.to_string(), *v)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Series::new();
    while Instant::now() < deadline {
        got = pending_series(addr);
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{what}: wanted {want:#?}, /metrics of {addr} has {got:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_dead_letters_are_exported_by_group_event_and_class_from_the_persister_and_each_consumer()
 {
    let mut env = TestEnv::new().with_database().await;
    let (a, b) = ("gauges-a.order.consumer", "gauges-b.order.consumer");
    env.cli(&["topics", "ensure", "--group", a]).success();
    env.set_env("ORDERPIPE_DLQ__GAUGE_INTERVAL_SECS", "1");
    let now = orderpipe::clock::now_ms();
    let mut rows = Vec::new();
    for offset in 0..3 {
        rows.push(dead_letter(
            &env,
            a,
            offset,
            Some("order.created"),
            "handler_fatal",
            now,
        ));
    }
    rows.push(dead_letter(
        &env,
        a,
        3,
        Some("order.shipped"),
        "unavailable",
        now,
    ));
    rows.push(dead_letter(
        &env,
        a,
        4,
        Some("order.shipped"),
        "unavailable",
        now,
    ));
    // Bounded: no event name, an unknown event name, a class no orderpipe writes.
    rows.push(dead_letter(&env, a, 5, None, "not_framed", now));
    rows.push(dead_letter(
        &env,
        a,
        6,
        Some("order.teleported"),
        "from-a-foreign-writer",
        now,
    ));
    rows.push(dead_letter(
        &env,
        a,
        7,
        Some("order.beamed"),
        "also-foreign",
        now,
    ));
    // Not pending: not counted.
    rows.push(dead_letter(
        &env,
        a,
        8,
        Some("order.created"),
        "handler_fatal",
        now,
    ));
    for offset in 0..4 {
        rows.push(dead_letter(
            &env,
            b,
            offset,
            Some("order.created"),
            "handler_fatal",
            now,
        ));
    }
    insert(&env, &rows).await;
    set_status(&env, a, "replayed", "original_offset = 8").await;

    let group_a = [
        (
            r#"group="gauges-a.order.consumer",event_name="order.created",class="handler_fatal""#,
            3.0,
        ),
        (
            r#"group="gauges-a.order.consumer",event_name="order.shipped",class="unavailable""#,
            2.0,
        ),
        (
            r#"group="gauges-a.order.consumer",event_name="undecodable",class="not_framed""#,
            1.0,
        ),
        (
            r#"group="gauges-a.order.consumer",event_name="other",class="other""#,
            2.0,
        ),
    ];
    let group_b = (
        r#"group="gauges-b.order.consumer",event_name="order.created",class="handler_fatal""#,
        4.0,
    );

    let mut persister = env.spawn(&["dlq", "persist", "--health-addr", "127.0.0.1:0"]);
    let persister_addr = health_addr(&mut persister);
    let mut consumer = env.spawn(&[
        "consume",
        "--group",
        a,
        "--handler",
        "notification",
        "--health-addr",
        "127.0.0.1:0",
    ]);
    let consumer_addr = health_addr(&mut consumer);
    let every_group: Vec<_> = group_a.iter().copied().chain([group_b]).collect();
    expect_series(
        &persister_addr,
        &every_group,
        "the persister exports every group",
    )
    .await;
    expect_series(
        &consumer_addr,
        &group_a,
        "a consumer exports its own group only",
    )
    .await;

    // The persister goes down: the consumer's copy goes on, and follows the table.
    // Down hard, as a crashed persister is.
    persister.kill().unwrap();
    persister.wait().unwrap();
    set_status(&env, a, "ignored", "error_class = 'unavailable'").await;
    rows = vec![dead_letter(
        &env,
        a,
        9,
        Some("order.created"),
        "handler_fatal",
        now,
    )];
    insert(&env, &rows).await;
    expect_series(
        &consumer_addr,
        &[
            (r#"group="gauges-a.order.consumer",event_name="order.created",class="handler_fatal""#, 4.0),
            group_a[2],
            group_a[3],
        ],
        "with the persister down, the consumer's gauges follow the table (and a series at 0 goes)",
    )
    .await;
    sigterm(&mut consumer);
}

/// The ids `dlq list` shows for `filter`, in id order, at most `limit`.
pub(crate) async fn listed_ids(
    db: &orderpipe::db::Db,
    filter: &store::Filter,
    limit: i64,
) -> Vec<i64> {
    store::list(db, filter, limit)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect()
}

/// Dead letters written before migration 0029 (one index for the gauges and
/// the console's group + class filter), then the migration: the gauges
/// count the same, the class filter lists the same rows, and `status` is
/// in three of the table's indexes, as the database itself lists them.
async fn one_index_fewer_reads_the_same(env: &TestEnv, url: &str, migrations: &str) {
    use orderpipe::dlq::gauges::{Scope, dead_letters_pending};
    use orderpipe::dlq::store::{Filter, Status};
    let db = crate::helpers::migrated_before(url, migrations, "0029").await;
    let mut tx = db.begin().await.unwrap();
    let events = [Some("order.created"), Some("order.paid"), None];
    for offset in 0..60 {
        let group = ["g", "h"][offset as usize % 2];
        let class = ["handler_fatal", "avro_decode", "timeout"][offset as usize % 3];
        let event = events[offset as usize / 6 % 3];
        store::upsert(
            &mut tx,
            &dead_letter(env, group, offset, event, class, offset),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let ids = listed_ids(&db, &Filter::default(), 100).await;
    store::mark_replayed(&db, &ids[..10]).await.unwrap();
    let class_filter = Filter {
        group: Some("g".into()),
        classes: vec!["avro_decode".into()],
        status: Some(Status::Pending.into()),
        ..Filter::default()
    };
    let read = |db: orderpipe::db::Db| {
        let filter = class_filter.clone();
        async move {
            // Both in the gauges' own order (largest first, ties by labels).
            let all = dead_letters_pending(&db, &Scope::AllGroups).await.unwrap();
            let one = dead_letters_pending(&db, &Scope::Group("h".into()))
                .await
                .unwrap();
            let listed = listed_ids(&db, &filter, 100).await;
            (format!("{all:?}"), format!("{one:?}"), listed)
        }
    };
    let before = read(db.clone()).await;
    assert!(
        !before.2.is_empty(),
        "{migrations}: the class filter matches rows"
    );
    db.migrate().await.unwrap();
    assert_eq!(read(db.clone()).await, before, "{migrations}");

    let indexes_sql = if migrations.ends_with("mysql") {
        "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() \
         AND table_name = 'dead_letters' AND column_name = 'status' ORDER BY index_name"
    } else {
        "SELECT DISTINCT il.name FROM pragma_index_list('dead_letters') il, pragma_index_info(il.name) ii \
         WHERE ii.name = 'status' ORDER BY il.name"
    };
    let with_status: Vec<(String,)> = sqlx::query_as(indexes_sql)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        with_status,
        [
            ("idx_dead_letters_group_class_event".into(),),
            ("idx_dead_letters_status".into(),),
            ("idx_dead_letters_status_updated".into(),),
        ],
        "{migrations}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_dead_letters_read_the_same_on_one_index_fewer() {
    let env = TestEnv::new();
    let url = crate::helpers::empty_mysql_database(&format!("op_{}_dl_0029", env.prefix)).await;
    one_index_fewer_reads_the_same(&env, &url, "sql/mysql").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_dead_letters_read_the_same_on_one_index_fewer() {
    let env = TestEnv::new();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
    one_index_fewer_reads_the_same(&env, &url, "sql/sqlite").await;
}
