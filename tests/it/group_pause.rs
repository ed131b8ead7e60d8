//! `orderpipe group pause|resume` against Kafka, Apicurio and MariaDB: a
//! paused group applies nothing while its lag grows, stays paused across a
//! member's restart, and applies everything once, in order, on resume.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::consumer::{count_rows, member_with_health as member, produce_lifecycles, sigterm};
use crate::exactly_once::{assert_applied_in_order, assert_exactly_once};
use crate::helpers::{TestEnv, metric, wait_for_status};

/// `orderpipe lag --group G --output json`.
pub(crate) fn lag(env: &TestEnv, group: &str) -> Value {
    let out = env
        .cli(&["lag", "--group", group, "--output", "json"])
        .success();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("lag is JSON ({e}): {out}"))
}

/// Polls `check` every 200 ms until it holds; fails after `timeout` with `what`.
pub(crate) async fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_group_applies_nothing_stays_paused_across_a_restart_and_resumes_in_order() {
    let group = "paused.order.consumer";
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", group]).success();
    let db = env.db();
    let partitions = env.settings.topics.order_events.partitions as f64;
    let mut events = produce_lifecycles(&env, 3_000, 300, 61);
    let (mut first, addr) = member(&env, group);
    wait_until(
        "the first member applies",
        Duration::from_secs(60),
        async || count_rows(&db, group).await > 0,
    )
    .await;

    let paused: Value = serde_json::from_str(
        &env.cli(&[
            "group",
            "pause",
            group,
            "--reason",
            "schema fix",
            "--by",
            "oncall",
            "--output",
            "json",
        ])
        .success(),
    )
    .unwrap();
    assert_eq!(paused["paused"][0]["group"], group, "{paused}");
    // Paused is healthy, not lagging, and exported.
    wait_for_status(
        &addr,
        "/health/mq",
        200,
        "\"paused\":true",
        Duration::from_secs(10),
    );
    let series = format!("orderpipe_group_paused{{group=\"{group}\"}}");
    assert_eq!(metric(&addr, &series), Some(1.0));

    // More records arrive: the broker's lag grows by them, the table does not.
    let more = 2_000;
    env.cli(&[
        "produce",
        "--count",
        &more.to_string(),
        "--orders",
        "300",
        "--seed",
        "62",
        "--first-order-id",
        "100001",
    ])
    .success();
    events.extend(
        orderpipe::harness::generator::LifecycleGenerator::new("x", 300, 100_001, 62).take(more),
    );
    wait_until(
        "the lag shows the new records",
        Duration::from_secs(60),
        async || {
            let lag = lag(&env, group);
            lag["groups"][0]["total_lag"].as_i64().unwrap_or(0) >= more as i64
                && lag["paused"][0]["group"] == group
        },
    )
    .await;
    let applied_when_paused = count_rows(&db, group).await;
    assert!(applied_when_paused < events.len() as i64);

    // A member restarted while paused stays paused: it holds what it
    // fetches on every partition it is given, and applies nothing.
    sigterm(&mut first);
    let (_second, addr) = member(&env, group);
    wait_for_status(
        &addr,
        "/health/mq",
        200,
        "\"paused\":true",
        Duration::from_secs(30),
    );
    let held = format!("orderpipe_consumer_paused_partitions{{group=\"{group}\"}}");
    wait_until(
        "the new member holds every partition",
        Duration::from_secs(60),
        async || metric(&addr, &held) == Some(partitions),
    )
    .await;
    assert_eq!(
        count_rows(&db, group).await,
        applied_when_paused,
        "records were applied while the group was paused"
    );
    let listed = env.cli(&["group", "list"]).success();
    assert!(
        listed.contains(group) && listed.contains("schema fix") && listed.contains("oncall"),
        "{listed}"
    );

    env.cli(&["group", "resume", group]).success();
    wait_until(
        "everything is applied after resume",
        Duration::from_secs(120),
        async || count_rows(&db, group).await >= events.len() as i64,
    )
    .await;
    wait_for_status(
        &addr,
        "/health/mq",
        200,
        "\"paused\":false",
        Duration::from_secs(10),
    );
    assert_eq!(metric(&addr, &series), Some(0.0));
    assert_exactly_once(&db, group, &events).await;
    assert_applied_in_order(&db, group, &events).await;
    assert!(
        env.cli(&["group", "list"])
            .success()
            .contains("no group is paused")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_for_a_while_ends_by_itself_and_bad_flags_are_named() {
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    env.cli(&["group", "pause", "g1", "--for", "2s"]).success();
    assert!(
        orderpipe::consumer::group_pause::active(&db, "g1")
            .await
            .unwrap()
            .is_some()
    );
    wait_until("the pause ends", Duration::from_secs(10), async || {
        orderpipe::consumer::group_pause::active(&db, "g1")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    let resumed = env.cli(&["group", "resume", "g1"]).success();
    assert!(resumed.contains("was not paused"), "{resumed}");
    let bad = env
        .cli(&["group", "pause", "g1", "--for", "soon"])
        .failure();
    assert!(bad.contains("--for"), "{bad}");
}

/// The persister exports every paused group, so a paused group whose
/// members are all gone still silences its lag alerts; the series goes on
/// resume.
#[tokio::test(flavor = "multi_thread")]
async fn the_persister_exports_every_paused_group() {
    let mut env = TestEnv::new().with_database().await;
    env.set_env("ORDERPIPE_DLQ__GAUGE_INTERVAL_SECS", "1");
    let mut persister = env.spawn(&["dlq", "persist", "--health-addr", "127.0.0.1:0"]);
    let addr = crate::helpers::health_addr(&mut persister);
    let series = "orderpipe_group_paused{group=\"nobody-left\"}";
    env.cli(&["group", "pause", "nobody-left", "--reason", "drained"])
        .success();
    wait_until(
        "the persister exports the pause",
        Duration::from_secs(30),
        async || metric(&addr, series) == Some(1.0),
    )
    .await;
    env.cli(&["group", "resume", "nobody-left"]).success();
    wait_until(
        "the series goes on resume",
        Duration::from_secs(30),
        async || metric(&addr, series).is_none(),
    )
    .await;
    sigterm(&mut persister);
}
