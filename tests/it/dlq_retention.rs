//! Dead-letter retention and scheduled replay against Kafka + MariaDB:
//! `dlq purge` deletes only what it is asked (replayed and ignored by
//! default, pending only by name, never a parked key's head; age, status
//! and group respected); the chart's scheduled `dlq replay --class ...
//! --older-than ...` replays only its classes' old enough rows.

use std::collections::BTreeMap;
use std::time::Duration;

use orderpipe::kafka::record::header;
use orderpipe::retry::retry_topic;
use serde_json::{Value, json};

use crate::dlq_gauges::{dead_letter, insert};
use crate::helpers::{TestEnv, header as header_of};

const DAY_MS: i64 = 24 * 3600 * 1000;
const MINUTE_MS: i64 = 60 * 1000;

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("JSON ({e}): {text}"))
}

/// Runs `orderpipe ARGS` with info logs as JSON (the tests' default is warn): (stdout, stderr).
fn with_info_log(env: &TestEnv, args: &[&str]) -> (String, String) {
    let out = env
        .command(args)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(
        out.status.success(),
        "orderpipe {args:?} failed:\n{stdout}{stderr}"
    );
    (stdout, stderr)
}

/// Rows by (group, status).
async fn counts(env: &TestEnv) -> BTreeMap<(String, String), i64> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT consumer_group, status, COUNT(*) FROM dead_letters GROUP BY consumer_group, status",
    )
    .fetch_all(&env.db().pool)
    .await
    .unwrap();
    rows.into_iter().map(|(g, s, n)| ((g, s), n)).collect()
}

fn expected(rows: &[(&str, &str, i64)]) -> BTreeMap<(String, String), i64> {
    rows.iter()
        .map(|(g, s, n)| ((g.to_string(), s.to_string()), *n))
        .collect()
}

/// Sets the status and last change of `group`'s rows at `offsets`.
async fn set(
    env: &TestEnv,
    group: &str,
    offsets: std::ops::Range<i64>,
    status: &str,
    updated_ms: i64,
) {
    sqlx::query("UPDATE dead_letters SET status = ?, updated_ms = ? WHERE consumer_group = ? AND original_offset >= ? AND original_offset < ?")
        .bind(status)
        .bind(updated_ms)
        .bind(group)
        .bind(offsets.start)
        .bind(offsets.end)
        .execute(&env.db().pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_deletes_only_the_statuses_ages_and_group_it_is_asked_and_never_a_parked_head() {
    let env = TestEnv::new().with_database().await;
    let (a, b) = ("purge-a.order.consumer", "purge-b.order.consumer");
    let now = orderpipe::clock::now_ms();
    let rows: Vec<_> = (0..12)
        .map(|o| {
            dead_letter(
                &env,
                a,
                o,
                Some("order.created"),
                "handler_fatal",
                now - 40 * DAY_MS,
            )
        })
        .chain((0..3).map(|o| {
            dead_letter(
                &env,
                b,
                o,
                Some("order.created"),
                "handler_fatal",
                now - 40 * DAY_MS,
            )
        }))
        .collect();
    insert(&env, &rows).await;
    // Group a: old replayed 0..3, old ignored 3..5, old pending 5..7 (the
    // upsert's own updated_ms is now: aged here), young replayed 7, young
    // ignored 8, an old ignored head of a parked key 9, young pending 10..12.
    set(&env, a, 0..3, "replayed", now - 10 * DAY_MS).await;
    set(&env, a, 3..5, "ignored", now - 8 * DAY_MS).await;
    set(&env, a, 5..7, "pending", now - 30 * DAY_MS).await;
    set(&env, a, 7..8, "replayed", now - DAY_MS).await;
    set(&env, a, 8..9, "ignored", now - 3600 * 1000).await;
    set(&env, a, 9..10, "ignored", now - 9 * DAY_MS).await;
    // Group b: old replayed 0..2, old pending 2.
    set(&env, b, 0..2, "replayed", now - 10 * DAY_MS).await;
    set(&env, b, 2..3, "pending", now - 10 * DAY_MS).await;
    let topic = &env.settings.topics.order_events.name;
    sqlx::query(
        "INSERT INTO parked_keys (consumer_group, record_key, kafka_partition, head_origin, head_event_id, head_event_name, \
         state, parked_ms, updated_ms, head_topic, head_partition, head_offset) VALUES (?, 'order-9', 0, ?, NULL, 'order.created', \
         'dead', ?, ?, ?, 0, 9)",
    )
    .bind(a)
    .bind(format!("{topic}/0/9"))
    .bind(now)
    .bind(now)
    .bind(topic)
    .execute(&env.db().pool)
    .await
    .unwrap();
    let before = expected(&[
        (a, "replayed", 4),
        (a, "ignored", 4),
        (a, "pending", 4),
        (b, "replayed", 2),
        (b, "pending", 1),
    ]);
    assert_eq!(counts(&env).await, before);

    // The dry run counts what the default purge would delete, and deletes nothing.
    let plan = json_of(
        &env.cli(&[
            "dlq",
            "purge",
            "--older-than",
            "7d",
            "--dry-run",
            "--output",
            "json",
        ])
        .success(),
    );
    assert_eq!(
        plan,
        json!({"deleted": {"replayed": 5, "ignored": 2}, "kept_heads": 1, "dry_run": true})
    );
    assert_eq!(counts(&env).await, before);

    // One group, default statuses, in batches of 2: only a's old replayed and ignored rows go.
    let purged = env.cli(&[
        "dlq",
        "purge",
        "--older-than",
        "7d",
        "--group",
        a,
        "--batch",
        "2",
        "--output",
        "json",
    ]);
    assert_eq!(
        json_of(&purged.success()),
        json!({"deleted": {"replayed": 3, "ignored": 2}, "kept_heads": 1, "dry_run": false})
    );
    assert_eq!(
        counts(&env).await,
        expected(&[
            (a, "replayed", 1),
            (a, "ignored", 2),
            (a, "pending", 4),
            (b, "replayed", 2),
            (b, "pending", 1)
        ]),
        "pending rows, young rows, the parked head and group b survive"
    );
    let left: Vec<(i64, String)> = sqlx::query_as("SELECT original_offset, status FROM dead_letters WHERE consumer_group = ? ORDER BY original_offset")
        .bind(a)
        .fetch_all(&env.db().pool)
        .await
        .unwrap();
    let offsets: Vec<i64> = left.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [5, 6, 7, 8, 9, 10, 11]);

    // Pending rows go only when named, and only the old ones; replayed rows are then not touched.
    let (purged, log) = with_info_log(
        &env,
        &["dlq", "purge", "--older-than", "7d", "--status", "pending"],
    );
    assert!(
        purged.contains("deleted 3 dead letters whose last change is older than 7days"),
        "{purged}"
    );
    assert!(
        log.contains("dlq purge done")
            && log.contains(r#""deleted":3"#)
            && log.contains("dlq purge: 3 pending dead letters deleted\n"),
        "{log}"
    );
    assert_eq!(
        counts(&env).await,
        expected(&[
            (a, "replayed", 1),
            (a, "ignored", 2),
            (a, "pending", 2),
            (b, "replayed", 2)
        ]),
    );

    // Held records are no dead letters: refused, naming what purge takes.
    let refused = env
        .cli(&["dlq", "purge", "--older-than", "7d", "--status", "held"])
        .failure();
    assert!(
        refused.contains("never purged") && refused.contains("--status pending, replayed, ignored"),
        "{refused}"
    );
    let refused = env
        .cli(&["dlq", "purge", "--older-than", "a week"])
        .failure();
    assert!(refused.contains("--older-than"), "{refused}");
    assert_eq!(
        counts(&env).await.values().sum::<i64>(),
        7,
        "refused runs delete nothing"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scheduled_replay_replays_only_its_classes_old_enough_rows() {
    let env = TestEnv::new().with_database().await;
    let (g, h) = ("sched-g.order.consumer", "sched-h.order.consumer");
    env.cli(&["topics", "ensure", "--group", &format!("{g},{h}")])
        .success();
    let now = orderpipe::clock::now_ms();
    let rows = vec![
        dead_letter(
            &env,
            g,
            0,
            Some("order.created"),
            "handler_retryable",
            now - 20 * MINUTE_MS,
        ),
        dead_letter(
            &env,
            g,
            1,
            Some("order.shipped"),
            "handler_retryable",
            now - 20 * MINUTE_MS,
        ),
        dead_letter(
            &env,
            g,
            2,
            Some("order.created"),
            "unavailable",
            now - 30 * MINUTE_MS,
        ),
        // Not its classes, or too young: they stay pending.
        dead_letter(
            &env,
            g,
            3,
            Some("order.created"),
            "handler_fatal",
            now - 20 * MINUTE_MS,
        ),
        dead_letter(
            &env,
            g,
            4,
            Some("order.created"),
            "handler_retryable",
            now - MINUTE_MS,
        ),
        dead_letter(&env, g, 5, None, "not_framed", now - 60 * MINUTE_MS),
        dead_letter(
            &env,
            h,
            0,
            Some("order.created"),
            "handler_retryable",
            now - 20 * MINUTE_MS,
        ),
    ];
    insert(&env, &rows).await;
    // The chart's command (dlqScheduledReplay with groups: [], helm/orderpipe/templates/jobs.yaml).
    let scheduled = [
        "dlq",
        "replay",
        "--class",
        "unavailable",
        "--class",
        "registry_unavailable",
        "--class",
        "handler_retryable",
        "--older-than",
        "10m",
        "--yes",
        "--output",
        "json",
    ];
    let summary = json_of(&env.cli(&scheduled).success());
    let (retry_g, retry_h) = (
        retry_topic(&env.settings.topics.order_events.name, g),
        retry_topic(&env.settings.topics.order_events.name, h),
    );
    assert_eq!(summary["replayed"], 4, "{summary}");
    assert_eq!(
        summary["by_class"],
        json!({"handler_retryable": 3, "unavailable": 1}),
        "{summary}"
    );
    assert_eq!(
        summary["by_topic"],
        json!({retry_g.clone(): 3, retry_h.clone(): 1}),
        "{summary}"
    );
    let statuses: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT consumer_group, original_offset, status FROM dead_letters ORDER BY consumer_group, original_offset")
            .fetch_all(&env.db().pool)
            .await
            .unwrap();
    let replayed: Vec<(&str, i64)> = statuses
        .iter()
        .filter(|(.., s)| s == "replayed")
        .map(|(g, o, _)| (g.as_str(), *o))
        .collect();
    assert_eq!(replayed, [(g, 0), (g, 1), (g, 2), (h, 0)]);
    // What reached the retry topics is exactly those rows' records.
    let sent: Vec<String> = env
        .read(&retry_g, 3, Duration::from_secs(30))
        .iter()
        .map(|m| header_of(m, header::ORIGINAL_OFFSET).unwrap())
        .collect();
    let mut sent = sent;
    sent.sort();
    assert_eq!(sent, ["0", "1", "2"]);
    assert_eq!(env.read(&retry_h, 1, Duration::from_secs(30)).len(), 1);

    // groups: [h]: the next run of h's CronJob takes h's rows only.
    insert(
        &env,
        &[
            dead_letter(
                &env,
                g,
                6,
                Some("order.created"),
                "unavailable",
                now - 20 * MINUTE_MS,
            ),
            dead_letter(
                &env,
                h,
                1,
                Some("order.created"),
                "unavailable",
                now - 20 * MINUTE_MS,
            ),
        ],
    )
    .await;
    let for_h: Vec<&str> = scheduled.iter().copied().chain(["--group", h]).collect();
    let (summary, log) = with_info_log(&env, &for_h);
    let summary = json_of(&summary);
    assert!(
        log.contains("dlq replay done")
            && log.contains(r#""replayed":1"#)
            && log.contains("unavailable"),
        "{log}"
    );
    assert_eq!(
        (summary["replayed"].clone(), summary["by_topic"].clone()),
        (json!(1), json!({retry_h: 1})),
        "{summary}"
    );
    // A class orderpipe does not write is refused, naming the accepted values.
    let refused = env
        .cli(&["dlq", "replay", "--class", "handler_retriable", "--yes"])
        .failure();
    assert!(
        refused.contains("accepted values: unavailable, handler_retryable"),
        "{refused}"
    );
}
