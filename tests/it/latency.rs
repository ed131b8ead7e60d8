//! The latency benchmark's commit stamps (`harness::latency`) against the
//! real stack: the consumer stamps exactly the events it applied (each once,
//! none it skipped as a duplicate), after their commit; the order API
//! stamps every event of its transactions, after their commit.

use std::collections::{BTreeMap, BTreeSet};

use orderpipe::clock::now_us;
use orderpipe::envelope::Envelope;

use crate::consumer::{consume, produce_lifecycles, write_ndjson};
use crate::helpers::TestEnv;

/// `<event_id>\t<µs>[\t<Kafka timestamp ms>]` lines of a stamp file.
fn stamps(path: &std::path::Path) -> Vec<(String, i64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let columns: Vec<&str> = line.split('\t').collect();
            (columns[0].to_string(), columns[1].parse().expect("µs"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_stamps_each_applied_event_once_after_its_commit() {
    let mut env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "stamped"])
        .success();
    let events = produce_lifecycles(&env, 200, 20, 5);
    // The first 10 again: duplicates are skipped, not stamped.
    let again: Vec<Envelope> = events[..10].to_vec();
    env.cli(&[
        "produce",
        "--file",
        write_ndjson(&again).path().to_str().unwrap(),
    ])
    .success();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("applied.tsv");
    env.set_env("ORDERPIPE_CHAOS__COMMIT_STAMPS", file.to_str().unwrap());
    let started = now_us();
    let summary = consume(&env, "stamped", "notification");
    assert_eq!(
        (summary["applied"].as_u64(), summary["duplicates"].as_u64()),
        (Some(200), Some(10)),
        "{summary}"
    );

    let stamped = stamps(&file);
    let ids: BTreeSet<&str> = stamped.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        stamped.len(),
        200,
        "one line per applied event, none for a duplicate"
    );
    let expected: BTreeSet<String> = events.iter().map(|e| e.event_id.to_string()).collect();
    assert_eq!(ids, expected.iter().map(String::as_str).collect());
    // After the commit: each stamp is no earlier than its dedup row's commit
    // made it visible (the row exists), and within the run.
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT event_id FROM applied_events WHERE consumer_group = 'stamped'")
            .fetch_all(&env.db().pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 200);
    assert!(
        stamped
            .iter()
            .all(|(_, us)| *us >= started && *us <= now_us())
    );
    // The consumer's lines carry the record's Kafka timestamp (ms), taken
    // when `produce` sent it: before the run, and not in the future.
    for line in std::fs::read_to_string(&file).unwrap().lines() {
        let produced: i64 = line
            .split('\t')
            .nth(2)
            .expect("a Kafka timestamp column")
            .parse()
            .unwrap();
        assert!(
            produced * 1000 <= started && produced > started / 1000 - 600_000,
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_order_api_stamps_every_event_of_its_committed_transactions() {
    let env = TestEnv::new().with_database().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.tsv");
    let started = now_us();
    env.cli(&[
        "bench-drive-orders",
        "--orders",
        "40",
        "--drivers",
        "4",
        "--stamps",
        file.to_str().unwrap(),
    ])
    .success();
    let stamped = stamps(&file);
    let by_id: BTreeMap<&str, i64> = stamped.iter().map(|(id, us)| (id.as_str(), *us)).collect();
    assert_eq!(by_id.len(), stamped.len(), "each event stamped once");
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, created_ms FROM outbox_messages")
            .fetch_all(&env.db().pool)
            .await
            .unwrap();
    assert_eq!(
        rows.len(),
        stamped.len(),
        "every outbox row stamped, nothing else"
    );
    for (id, created_ms) in &rows {
        let us = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("event {id} not stamped"));
        // Stamped after the row was written (created_ms is taken before the commit).
        assert!(
            *us >= created_ms * 1000 && *us >= started,
            "event {id}: stamp {us} µs before its row {created_ms} ms"
        );
    }
}
