//! `orderpipe consume|deliver --group G --reset-to <RFC 3339>` against the
//! real stack: a stopped group is rewound to the first record at or after
//! the time on every partition and reads exactly the later records again;
//! a group with a live member is refused and keeps its offsets.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use rdkafka::Message;
use serde_json::Value;

use crate::consumer::{consume, count_rows, sigterm};
use crate::helpers::{TestEnv, health_addr};
use crate::router::produce;

/// `COMMAND --group G --reset-to TIME [extra] --output json`, parsed.
fn rewind(env: &TestEnv, command: &str, group: &str, to: &str, extra: &[&str]) -> Value {
    let mut args = vec![command, "--group", group, "--reset-to", to];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--output", "json"]);
    let out = env.cli(&args).success();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("rewind report is JSON ({e}): {out}"))
}

/// The group's committed offsets summed over its partitions (`lag`), and
/// the report.
fn committed(env: &TestEnv, group: &str) -> (i64, Value) {
    let out = env
        .cli(&["lag", "--group", group, "--output", "json"])
        .success();
    let lag: Value = serde_json::from_str(&out).unwrap();
    let offsets = lag["groups"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["committed_offset"].as_i64().unwrap_or(0))
        .sum();
    (offsets, lag)
}

/// Sum of one offset column of a rewind report (`none` counts as 0).
fn sum(report: &Value, column: &str) -> i64 {
    report["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[column].as_i64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewound_group_reads_again_exactly_the_records_at_or_after_the_time() {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.rewind.consumer", env.prefix);
    let topic = env.settings.topics.order_events.name.clone();
    env.cli(&["topics", "ensure", "--group", &group]).success();
    produce(&env, 30, 10, 1, 31);
    // Record timestamps are the producer's clock, the same as this one.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let middle = Utc::now();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    produce(&env, 20, 10, 1_001, 32);

    let first = consume(&env, &group, "inventory");
    assert_eq!(
        (first["consumed"].as_i64(), first["applied"].as_i64()),
        (Some(50), Some(50)),
        "{first}"
    );

    let report = rewind(
        &env,
        "consume",
        &group,
        &middle.to_rfc3339(),
        &["--dedup", "forget"],
    );
    let partitions = report["partitions"].as_array().unwrap();
    assert_eq!(
        partitions.len(),
        env.settings.topics.order_events.partitions as usize,
        "{report}"
    );
    assert!(
        partitions.iter().all(|p| p["topic"] == topic.as_str()),
        "only the main topic is rewound: {report}"
    );
    assert_eq!(sum(&report, "old_offset"), 50, "{report}");
    assert_eq!(
        sum(&report, "old_offset") - sum(&report, "new_offset"),
        20,
        "{report}"
    );
    assert_eq!(report["dedup_rows_forgotten"], 20, "{report}");
    // Each partition's new offset splits its records by the time, as the topic holds them.
    let records = env.read(&topic, 50, Duration::from_secs(30));
    let at_or_after: BTreeSet<(i32, i64)> = records
        .iter()
        .filter(|m| m.timestamp().to_millis().unwrap() >= middle.timestamp_millis())
        .map(|m| (m.partition(), m.offset()))
        .collect();
    let read_again: BTreeSet<(i32, i64)> = records
        .iter()
        .map(|m| (m.partition(), m.offset()))
        .filter(|(p, o)| {
            *o >= partitions.iter().find(|x| x["partition"] == *p).unwrap()["new_offset"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(read_again.len(), 20);
    assert_eq!(read_again, at_or_after);
    assert_eq!(
        count_rows(&env.db(), &group).await,
        30,
        "the 20 later events' dedup rows are gone"
    );

    // The next run reads the 20 later records and applies them again.
    let again = consume(&env, &group, "inventory");
    assert_eq!(
        (
            again["consumed"].as_i64(),
            again["applied"].as_i64(),
            again["duplicates"].as_i64()
        ),
        (Some(20), Some(20), Some(0)),
        "{again}"
    );
    assert_eq!(count_rows(&env.db(), &group).await, 50);

    // --dedup keep: the same 20 are read and skipped as duplicates.
    let kept = rewind(
        &env,
        "consume",
        &group,
        &middle.to_rfc3339(),
        &["--dedup", "keep"],
    );
    assert_eq!(kept["dedup_rows_forgotten"], Value::Null, "{kept}");
    assert_eq!(
        sum(&kept, "old_offset") - sum(&kept, "new_offset"),
        20,
        "{kept}"
    );
    let skipped = consume(&env, &group, "inventory");
    assert_eq!(
        (
            skipped["consumed"].as_i64(),
            skipped["applied"].as_i64(),
            skipped["duplicates"].as_i64()
        ),
        (Some(20), Some(0), Some(20)),
        "{skipped}"
    );

    // A time past the last record: every partition at its log end, nothing moves.
    let future = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let ahead = rewind(&env, "consume", &group, &future, &["--dedup", "keep"]);
    for p in ahead["partitions"].as_array().unwrap() {
        assert_eq!(p["new_offset"], p["old_offset"], "{ahead}");
    }

    // `deliver` rewinds the same way (here to before the first record).
    let start = rewind(
        &env,
        "deliver",
        &group,
        "2000-01-01T00:00:00Z",
        &["--dedup", "keep"],
    );
    assert_eq!(sum(&start, "new_offset"), 0, "{start}");
    let all = consume(&env, &group, "inventory");
    assert_eq!(
        (all["consumed"].as_i64(), all["duplicates"].as_i64()),
        (Some(50), Some(50)),
        "{all}"
    );

    // The table names each partition's old and new offset.
    let table = env
        .cli(&[
            "consume",
            "--group",
            &group,
            "--reset-to",
            &middle.to_rfc3339(),
            "--dedup",
            "keep",
        ])
        .success();
    assert!(
        table.contains(&format!("group {group} rewound to {}", middle.to_rfc3339())),
        "{table}"
    );
    assert!(
        table.contains("old offset")
            && table.contains("new offset")
            && table.contains("dedup rows kept"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_with_a_live_member_is_refused_and_keeps_its_offsets() {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.rewind.consumer", env.prefix);
    env.cli(&["topics", "ensure", "--group", &group]).success();
    produce(&env, 10, 5, 1, 41);
    let mut member = env.spawn(&[
        "consume",
        "--group",
        &group,
        "--handler",
        "inventory",
        "--health-addr",
        "127.0.0.1:0",
    ]);
    health_addr(&mut member);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_rows(&env.db(), &group).await < 10 {
        assert!(
            Instant::now() < deadline,
            "the member did not apply the 10 events"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The applied offsets are committed within a second or so: waited for
    // (a fixed 2 s on a loaded machine may not be), so the refusal below
    // has offsets to keep.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (offsets, lag) = committed(&env, &group);
        if offsets == 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the member's offsets not committed within 30 s: {lag}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let refused = env
        .cli(&[
            "consume",
            "--group",
            &group,
            "--reset-to",
            "2000-01-01T00:00:00Z",
            "--dedup",
            "forget",
        ])
        .failure();
    assert!(
        refused.contains(&format!("consumer group {group} has 1 live member(s)")),
        "{refused}"
    );
    assert!(refused.contains("stop them first"), "{refused}");
    assert_eq!(count_rows(&env.db(), &group).await, 10, "nothing forgotten");
    sigterm(&mut member);

    // The offsets are where the member left them: at the log end.
    let (offsets, lag) = committed(&env, &group);
    assert_eq!(offsets, 10, "{lag}");

    // Stopped, the same rewind goes through.
    // Without --dedup the rewind is refused by name: whether the handlers
    // run again for the records read again is the operator's choice.
    let unsaid = env
        .cli(&[
            "consume",
            "--group",
            &group,
            "--reset-to",
            "2000-01-01T00:00:00Z",
        ])
        .failure();
    assert!(unsaid.contains("--dedup"), "{unsaid}");
    let report = rewind(
        &env,
        "consume",
        &group,
        "2000-01-01T00:00:00Z",
        &["--dedup", "forget"],
    );
    assert_eq!(
        (sum(&report, "old_offset"), sum(&report, "new_offset")),
        (10, 0),
        "{report}"
    );
    assert_eq!(report["dedup_rows_forgotten"], 10, "{report}");

    // Bad input names the flag.
    let bad = env
        .cli(&[
            "consume",
            "--group",
            &group,
            "--reset-to",
            "yesterday",
            "--dedup",
            "keep",
        ])
        .failure();
    assert!(
        bad.contains("--reset-to") && bad.contains("`yesterday` is not an RFC 3339 time"),
        "{bad}"
    );
    let nameless = env
        .cli(&[
            "deliver",
            "--reset-to",
            "2000-01-01T00:00:00Z",
            "--dedup",
            "keep",
        ])
        .failure();
    assert!(
        nameless.contains("--reset-to: name the group to rewind with --group G"),
        "{nameless}"
    );
}
