//! Operator safety nets (issue 11, item 6): bulk DLQ commands without a
//! terminal, `config --output` round trips, the database pool against the
//! partition workers, and names longer than their columns.

use orderpipe::dlq::store::{self, NewDeadLetter};

use crate::helpers::TestEnv;

/// Writes `count` pending dead letters of `group` straight into the table.
async fn seed_dead_letters(env: &TestEnv, group: &str, count: i64) {
    let db = env.db();
    let mut tx = db.begin().await.unwrap();
    for offset in 0..count {
        let row = NewDeadLetter {
            consumer_group: group.into(),
            original_topic: env.settings.topics.order_events.name.clone(),
            original_partition: 0,
            original_offset: offset,
            original_timestamp: None,
            key: Some(b"1".to_vec()),
            payload: Some(b"x".to_vec()),
            headers: "{}".into(),
            event_id: None,
            event_name: Some("order.created".into()),
            error_class: "fatal".into(),
            error_message: "test".into(),
            attempts: 1,
            first_failure_ms: 1,
            last_failure_ms: 1,
            dlq_partition: 0,
            dlq_offset: offset,
        };
        store::upsert(&mut tx, db.dialect, &row).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn statuses(env: &TestEnv) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT status, COUNT(*) FROM dead_letters GROUP BY status ORDER BY status")
        .fetch_all(&env.db().pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn bulk_dlq_commands_without_a_terminal_need_yes() {
    let env = TestEnv::new().with_database().await;
    let group = "operator.bulk";
    seed_dead_letters(&env, group, 5).await;
    let pending = vec![("pending".to_string(), 5)];

    // `cli` runs with stdin from /dev/null: no terminal.
    for args in [
        vec!["dlq", "replay", "--group", group],
        vec!["dlq", "ignore", "--group", group, "--reason", "load test"],
        vec!["dlq", "ignore", "--status", "pending", "--reason", "load test"],
    ] {
        let out = env.cli(&args).failure();
        assert!(out.contains("--yes") && out.contains("5 now") && out.contains("nothing changed"), "{args:?}: {out}");
        assert_eq!(statuses(&env).await, pending, "{args:?} changed rows");
    }

    // Named rows are explicit: they run without --yes.
    let first: (i64,) = sqlx::query_as("SELECT MIN(id) FROM dead_letters").fetch_one(&env.db().pool).await.unwrap();
    env.cli(&["dlq", "ignore", "--id", &first.0.to_string(), "--reason", "one"]).success();
    assert_eq!(statuses(&env).await, vec![("ignored".to_string(), 1), ("pending".to_string(), 4)]);

    // With --yes the filter runs.
    env.cli(&["dlq", "ignore", "--group", group, "--status", "pending", "--reason", "load test", "--yes"]).success();
    assert_eq!(statuses(&env).await, vec![("ignored".to_string(), 5)]);
}
