//! The console's dead-letter and held-order pages against the real stack
//! (Kafka, MariaDB, headless Chromium): an operator replays a filtered set
//! of 1,000 dead letters from the browser (count confirmed first, the group
//! applies them, the list shows them `replayed`); an operator releases a
//! parked order's followers (applied in order); each action writes an audit
//! row; bad filters are refused naming the field; the list pages by keyset.

use std::time::{Duration, Instant};

use fantoccini::Locator;
use orderpipe::console::Role;
use orderpipe::envelope::Envelope;
use orderpipe::harness::verify;

use crate::console_browser::{Browser, TestConsole};
use crate::consumer::{consume, produce_lifecycles};
use crate::dlq::{dead_letter_everything, persist};
use crate::helpers::TestEnv;

/// (action, who, item_count, outcome) of the audit rows, oldest first.
async fn audit_rows(env: &TestEnv) -> Vec<(String, String, i64, String, String)> {
    sqlx::query_as("SELECT action, who, item_count, outcome, target FROM console_audit ORDER BY id")
        .fetch_all(&env.db().pool)
        .await
        .unwrap()
}

async fn scalar(env: &TestEnv, sql: &str, bind: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(bind)
        .fetch_one(&env.db().pool)
        .await
        .unwrap();
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_replays_a_filtered_set_of_1000_dead_letters_from_the_browser() {
    let mut env = TestEnv::new().with_database().await;
    let group = "console-replay.order.consumer";
    dead_letter_everything(&mut env, group, 1_000).await;
    assert_eq!(persist(&env)["read"], 1_000);
    // Outside the filter: another group's dead letters of the same class.
    crate::replay::dead_letters(&env, "other.order.consumer", 0..40, 4).await;
    let (class,): (String,) =
        sqlx::query_as("SELECT MIN(error_class) FROM dead_letters WHERE consumer_group = ?")
            .bind(group)
            .fetch_one(&env.db().pool)
            .await
            .unwrap();

    let console = TestConsole::start(&env, |_| {}).await;
    let browser = Browser::start(&console).await;
    browser.login(Role::Operator).await;
    browser.open("/dead-letters").await;
    browser
        .fill("form.filters input[name='group']", group)
        .await;
    browser
        .client
        .find(Locator::Css("form.filters select[name='class']"))
        .await
        .unwrap()
        .select_by_value(&class)
        .await
        .unwrap();
    browser.click("form.filters button[type='submit']").await;
    let matching = browser
        .wait_text("#matching", Duration::from_secs(30), |t| {
            t.starts_with("1000 dead letters match")
        })
        .await;
    assert!(
        matching.contains("Replay these"),
        "an operator sees the action: {matching}"
    );
    let shown = browser
        .client
        .find_all(Locator::Css("table tbody tr"))
        .await
        .unwrap()
        .len();
    assert_eq!(shown, 50, "one page of 50, newest first");
    browser.screenshots("dead-letters").await;

    // The dry run counts first; nothing changes until confirmed.
    browser.click("#replay-filter").await;
    let count = browser
        .wait_text("#dry-run-count", Duration::from_secs(30), |_| true)
        .await;
    assert_eq!(count, "Dry run: 1000 dead letters match now.");
    assert_eq!(
        browser.text("#confirm-replay").await,
        "Replay 1000 dead letters"
    );
    browser.screenshots("dead-letters-replay").await;
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM dead_letters WHERE consumer_group = ? AND status = 'pending'",
            group
        )
        .await,
        1_000
    );
    browser.click("#confirm-replay").await;
    let done = browser
        .wait_text("#replay-state", Duration::from_secs(60), |t| {
            !t.starts_with("Running")
        })
        .await;
    assert_eq!(done, "Done: 1000 replayed, 0 failed.");
    browser.screenshots("dead-letters-progress").await;

    // The group applies them.
    let applied = consume(&env, group, "notification");
    assert_eq!(applied["applied"], 1_000, "{applied}");

    // The list shows them replayed; nothing of the filter is pending; the other group is untouched.
    browser.click("#replayed-list").await;
    let listed = browser
        .wait_text("#matching", Duration::from_secs(30), |_| true)
        .await;
    assert!(listed.starts_with("1000 dead letters match"), "{listed}");
    let statuses: Vec<String> = {
        let mut out = Vec::new();
        for cell in browser
            .client
            .find_all(Locator::Css("table tbody td:nth-child(2)"))
            .await
            .unwrap()
        {
            out.push(cell.text().await.unwrap());
        }
        out
    };
    assert_eq!(statuses.len(), 50);
    assert!(statuses.iter().all(|s| s == "replayed"), "{statuses:?}");
    assert_eq!(scalar(&env, "SELECT COUNT(*) FROM dead_letters WHERE consumer_group = ? AND status = 'replayed' AND replay_count = 1", group).await, 1_000);
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM dead_letters WHERE consumer_group = ? AND status = 'pending'",
            "other.order.consumer"
        )
        .await,
        40
    );

    // The detail view of one of them.
    let first = browser
        .client
        .find(Locator::Css("table tbody td a"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    browser.open(&format!("/dead-letters/{first}")).await;
    assert_eq!(browser.text("#status").await, "replayed");
    let envelope = browser.text("pre code").await;
    assert!(
        envelope.contains("\"event_name\": \"order."),
        "the decoded envelope: {envelope}"
    );
    assert!(
        browser
            .client
            .source()
            .await
            .unwrap()
            .contains("<code>event_id</code>"),
        "every header"
    );
    browser.screenshots("dead-letter").await;
    browser.close().await;

    // The audit: who replayed which filter, how many; and the run's end.
    let audit = audit_rows(&env).await;
    let replays: Vec<_> = audit
        .iter()
        .filter(|r| r.0.starts_with("dead_letters.replay"))
        .collect();
    assert_eq!(replays.len(), 2, "{audit:?}");
    assert_eq!(
        (
            replays[0].0.as_str(),
            replays[0].1.as_str(),
            replays[0].2,
            replays[0].3.as_str()
        ),
        ("dead_letters.replay", "operator-token", 1_000, "started")
    );
    assert!(
        replays[0].4.contains(group) && replays[0].4.contains(&class),
        "the filter is audited: {}",
        replays[0].4
    );
    assert_eq!(
        (replays[1].0.as_str(), replays[1].2, replays[1].3.as_str()),
        ("dead_letters.replay.done", 1_000, "ok")
    );
}

/// The first order whose events, by name, are exactly `path`.
fn order_with_path(events: &[Envelope], path: &[&str]) -> i64 {
    let mut orders: Vec<i64> = events.iter().map(|e| e.data.order_id()).collect();
    orders.sort();
    orders.dedup();
    orders
        .into_iter()
        .find(|o| {
            events
                .iter()
                .filter(|e| e.data.order_id() == *o)
                .map(|e| e.event_name.as_str())
                .eq(path.iter().copied())
        })
        .unwrap_or_else(|| panic!("no order with path {path:?}"))
}

/// The events of the order [`park_an_order`] parks.
const PARKED_PATH: [&str; 3] = ["order.created", "order.payment.succeeded", "order.shipped"];

/// Runs `group` over 300 events (`seed`) with one order's created event
/// failing for good (its one delayed attempt fails too): it is
/// dead-lettered and persisted, the order's payment and shipment held
/// behind it. Returns the order and the head's dead-letter id.
async fn park_an_order(env: &mut TestEnv, group: &str, seed: u64) -> (i64, i64) {
    env.cli(&["topics", "ensure", "--group", group]).success();
    let events = produce_lifecycles(env, 300, 30, seed);
    let order = order_with_path(&events, &PARKED_PATH);
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", &format!("[{order}]"));
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_EVENTS", r#"["order.created"]"#);
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "1000");
    env.set_env("ORDERPIPE_RETRY__LOCAL_RETRIES", "0");
    env.set_env("ORDERPIPE_RETRY__ATTEMPTS", "1");
    env.set_env("ORDERPIPE_RETRY__INITIAL_DELAY_MS", "200");
    let summary = consume(env, group, "chaos,notification");
    assert_eq!(summary["held"], 2, "{summary}");
    persist(env);
    let (head,): (i64,) = sqlx::query_as("SELECT id FROM dead_letters WHERE consumer_group = ?")
        .bind(group)
        .fetch_one(&env.db().pool)
        .await
        .unwrap();
    (order, head)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_releases_a_parked_orders_followers_and_they_are_applied_in_order() {
    let mut env = TestEnv::new().with_database().await;
    let group = "console-held";
    // The order's created event fails for good: its payment and shipment are held behind it.
    let (order, head) = park_an_order(&mut env, group, 79).await;

    let console = TestConsole::start(&env, |_| {}).await;
    // Ignoring the head without a choice for its followers is refused, naming the field.
    let csrf = console.csrf_of(Role::Operator).await;
    let (status, body) = console
        .post_as(
            Role::Operator,
            &format!("/dead-letters/{head}/ignore"),
            Some(&csrf),
            &[("reason", "test")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("followers") && body.contains("release or keep"),
        "{body}"
    );
    let (status, body) = console
        .post_as(
            Role::Operator,
            &format!("/dead-letters/{head}/ignore"),
            Some(&csrf),
            &[("reason", " "), ("followers", "release")],
        )
        .await;
    assert_eq!(status, 400, "a blank reason: {body}");
    assert!(body.contains("reason"), "{body}");
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM dead_letters WHERE consumer_group = ? AND status = 'pending'",
            group
        )
        .await,
        1,
        "nothing ignored"
    );

    let browser = Browser::start(&console).await;
    browser.login(Role::Operator).await;
    browser.open(&format!("/held?group={group}")).await;
    assert!(
        browser
            .text("#parked-count")
            .await
            .starts_with("1 parked keys")
    );
    browser.screenshots("held").await;
    browser.click("table tbody td a").await;
    browser
        .wait_text("#key-state", Duration::from_secs(30), |t| t == "dead")
        .await;
    let mut names = Vec::new();
    for cell in browser
        .client
        .find_all(Locator::Css("#held-order tbody td:nth-child(3)"))
        .await
        .unwrap()
    {
        names.push(cell.text().await.unwrap());
    }
    assert_eq!(
        names, PARKED_PATH,
        "the head, then the held records in order"
    );
    browser.screenshots("held-key").await;
    browser
        .fill(
            "#head-reason",
            "created carried a bad address; fixed by hand",
        )
        .await;
    browser.click("#release").await;
    browser
        .wait_text("#parked-count", Duration::from_secs(30), |_| true)
        .await;
    browser.close().await;

    // The group's consumer applies the released records, in order; the head never.
    let out = env.cli(&[
        "consume",
        "--group",
        group,
        "--handler",
        "chaos,notification",
        "--until-idle",
        "6",
        "--output",
        "json",
    ]);
    let after: serde_json::Value = serde_json::from_str(&out.success()).unwrap();
    assert_eq!(after["released"], 2, "{after}");
    let applied: Vec<String> = verify::applied_sequence(&env.db(), group, order)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(applied, ["order.payment.succeeded", "order.shipped"]);
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM parked_keys WHERE consumer_group = ?",
            group
        )
        .await,
        0
    );

    let audit = audit_rows(&env).await;
    assert_eq!(
        audit.len(),
        1,
        "the refused ignores wrote nothing: {audit:?}"
    );
    let (action, who, count, outcome, target) = &audit[0];
    assert_eq!(
        (action.as_str(), who.as_str(), *count, outcome.as_str()),
        ("held.release", "operator-token", 1, "ok")
    );
    assert!(
        target.contains("bad address") && target.contains(&format!("\"id\":{head}")),
        "{target}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_list_pages_by_keyset_filters_by_order_id_and_names_a_bad_field() {
    let env = TestEnv::new().with_database().await;
    crate::replay::dead_letters(&env, "pages.order.consumer", 0..120, 10).await;
    let console = TestConsole::start(&env, |_| {}).await;
    let ids = |body: &str| -> Vec<i64> {
        body.split("<a href=\"/dead-letters/")
            .skip(1)
            .filter_map(|s| s.split('"').next()?.parse().ok())
            .collect()
    };
    let (status, first) = console
        .get_as(Role::Viewer, "/dead-letters?group=pages.order.consumer")
        .await;
    assert_eq!(status, 200, "{first}");
    let page1 = ids(&first);
    assert_eq!(page1, (71..=120).rev().collect::<Vec<_>>(), "the newest 50");
    assert!(first.contains("before=71"), "a link to the older page");
    assert!(!first.contains("Replay these"), "a viewer sees no action");
    let (_, second) = console
        .get_as(
            Role::Viewer,
            "/dead-letters?group=pages.order.consumer&before=71",
        )
        .await;
    assert_eq!(ids(&second), (21..=70).rev().collect::<Vec<_>>());
    let (_, order) = console
        .get_as(Role::Viewer, "/dead-letters?order_id=order-3")
        .await;
    assert!(
        order.contains("<strong>12</strong> dead letters match"),
        "{order}"
    );
    assert!(
        ids(&order).iter().all(|id| (id - 1) % 10 == 3),
        "only order-3's rows: {:?}",
        ids(&order)
    );

    for (query, field, accepted) in [
        (
            "class=handler_fatl",
            "class",
            "accepted values: unavailable",
        ),
        ("status=done", "status", "pending, replayed, ignored"),
        ("since=yesterday", "since", "RFC 3339"),
        ("before=x", "before", "row id"),
    ] {
        let (status, body) = console
            .get_as(Role::Operator, &format!("/dead-letters?{query}"))
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body.contains(&format!("<strong>{field}</strong>")) && body.contains(accepted),
            "{query}: {body}"
        );
    }
    // A confirmation without the dry run's count acts on nothing.
    let csrf = console.csrf_of(Role::Operator).await;
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/dead-letters/replay",
            Some(&csrf),
            &[("group", "pages.order.consumer")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<strong>count</strong>"), "{body}");
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/dead-letters/replay",
            Some(&csrf),
            &[("class", "nope"), ("count", "5"), ("upto", "5")],
        )
        .await;
    assert_eq!(status, 400, "a bad filter never replays everything: {body}");
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM dead_letters WHERE status = ?",
            "pending"
        )
        .await,
        120
    );
    assert!(audit_rows(&env).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_started_from_the_cli_shows_its_progress_in_the_console() {
    let env = TestEnv::new().with_database().await;
    let group = "cli-progress.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    crate::replay::dead_letters(&env, group, 0..600, 10).await;
    let console = TestConsole::start(&env, |_| {}).await;
    // Paced (about 6 s), so the console sees it run: two page loads per
    // look may take a second each on a loaded machine (3 s was a short window).
    let mut replay = env.spawn(&[
        "dlq", "replay", "--group", group, "--rate", "100", "--yes", "--output", "json",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Both pages seen while it runs: the replay's page midway, the list naming it.
    let settled_midway = loop {
        let (_, page) = console
            .get_as(Role::Viewer, "/dead-letters/replays/1")
            .await;
        let (_, list) = console.get_as(Role::Viewer, "/dead-letters").await;
        let settled = page
            .split("Running: ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok());
        let listed = list.contains("Replay 1 by") && list.contains("(cli) is running");
        if let Some(n) = settled.filter(|n| *n > 0 && *n < 600 && listed) {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "no progress seen in the console within 30 s (listed as running: {listed}): {page}\nthe list: {list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(replay.wait().unwrap().success());
    let (status, page) = console
        .get_as(Role::Viewer, "/dead-letters/replays/1")
        .await;
    assert_eq!(status, 200);
    assert!(page.contains("Done: 600 replayed, 0 failed."), "{page}");
    assert!(
        page.contains(&format!("group={group}")),
        "links to the selection in the list: {page}"
    );
    eprintln!("seen midway: {settled_midway} of 600");
    let (status, _) = console
        .get_as(Role::Viewer, "/dead-letters/replays/2")
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_then_replay_the_head_applies_it_and_its_followers_in_order_each_audited() {
    let mut env = TestEnv::new().with_database().await;
    let group = "console-keep";
    let (order, head) = park_an_order(&mut env, group, 83).await;
    let console = TestConsole::start(&env, |_| {}).await;
    let csrf = console.csrf_of(Role::Operator).await;
    let key = order.to_string();
    let form = [
        ("group", group),
        ("key", key.as_str()),
        ("reason", "wait for the fix"),
    ];
    // The head's page links to its key's page, naming the key's topic (a
    // key is parked per topic).
    let (_, page) = console
        .get_as(Role::Viewer, &format!("/dead-letters/{head}"))
        .await;
    let topic = &env.settings.topics.order_events.name;
    let link = format!("href=\"/held/key?group={group}&#38;key={key}&#38;topic={topic}\"");
    assert!(
        page.contains(&link) && page.contains("2 records held behind it"),
        "{link} in {page}"
    );

    // Keep: the head is closed, the followers stay held.
    let (status, body) = console
        .post_as(Role::Operator, "/held/keep", Some(&csrf), &form)
        .await;
    assert_eq!(status, 303, "{body}");
    let (_, page) = console
        .get_as(Role::Viewer, &format!("/held/key?group={group}&key={key}"))
        .await;
    assert!(
        page.contains("dead letter") && page.contains("(ignored)"),
        "the head's row is ignored, the key still parked: {page}"
    );
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM held_records WHERE consumer_group = ?",
            group
        )
        .await,
        2
    );

    // The fix ships: replaying the head applies it, then its followers, in order.
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", "[]");
    let (status, body) = console
        .post_as(Role::Operator, "/held/replay-head", Some(&csrf), &form[..2])
        .await;
    assert_eq!(status, 303, "{body}");
    let after = consume(&env, group, "chaos,notification");
    assert_eq!(
        (after["applied"].as_i64(), after["released"].as_i64()),
        (Some(3), Some(2)),
        "{after}"
    );
    let applied: Vec<String> = verify::applied_sequence(&env.db(), group, order)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(applied, PARKED_PATH);
    let (status, _) = console
        .get_as(Role::Viewer, &format!("/held/key?group={group}&key={key}"))
        .await;
    assert_eq!(status, 404, "unparked");
    // A key that is not parked: a clear 404, nothing audited.
    let (status, body) = console
        .post_as(Role::Operator, "/held/release", Some(&csrf), &form)
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/held/release",
            Some(&csrf),
            &[("key", "1")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<strong>group</strong>"), "{body}");

    let audit: Vec<(String, i64, String)> = audit_rows(&env)
        .await
        .into_iter()
        .map(|r| (r.0, r.2, r.3))
        .collect();
    assert_eq!(
        audit,
        [
            ("held.keep".to_string(), 1, "ok".to_string()),
            ("held.replay_head".to_string(), 1, "ok".to_string())
        ]
    );
    let (status, replayed): (String, i64) =
        sqlx::query_as("SELECT status, replay_count FROM dead_letters WHERE id = ?")
            .bind(head)
            .fetch_one(&env.db().pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), replayed), ("replayed", 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ignore_by_filter_takes_what_the_dry_run_counted_with_its_reason_and_is_audited() {
    let env = TestEnv::new().with_database().await;
    let group = "bulk-ignore.order.consumer";
    crate::replay::dead_letters(&env, group, 0..30, 3).await;
    crate::replay::dead_letters(&env, "other.order.consumer", 0..5, 5).await;
    let console = TestConsole::start(&env, |_| {}).await;
    let (status, body) = console.get_as(Role::Operator, "/dead-letters/ignore").await;
    assert_eq!(status, 400, "no filter is never every row: {body}");
    assert!(body.contains("<strong>filter</strong>"), "{body}");
    let (status, page) = console
        .get_as(
            Role::Operator,
            &format!("/dead-letters/ignore?group={group}"),
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Dry run: <strong>30</strong> dead letters match now."),
        "{page}"
    );
    let upto = page
        .split("name=\"upto\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the highest id counted")
        .to_string();
    // Persisted after the count: not taken.
    crate::replay::dead_letters(&env, group, 30..31, 3).await;
    let csrf = console.csrf_of(Role::Operator).await;
    let form = |reason: &'static str| {
        vec![
            ("group", group),
            ("count", "30"),
            ("upto", upto.as_str()),
            ("reason", reason),
        ]
    };
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/dead-letters/ignore",
            Some(&csrf),
            &form("  "),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<strong>reason</strong>"), "{body}");
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/dead-letters/ignore",
            Some(&csrf),
            &form("a duplicate import, cleaned up at the source"),
        )
        .await;
    assert_eq!(status, 303, "{body}");
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as("SELECT status, ignored_reason, COUNT(*) FROM dead_letters WHERE consumer_group = ? GROUP BY status, ignored_reason ORDER BY status")
        .bind(group)
        .fetch_all(&env.db().pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        [
            (
                "ignored".into(),
                Some("a duplicate import, cleaned up at the source".into()),
                30
            ),
            ("pending".into(), None, 1)
        ]
    );
    assert_eq!(
        scalar(
            &env,
            "SELECT COUNT(*) FROM dead_letters WHERE consumer_group = ? AND status = 'pending'",
            "other.order.consumer"
        )
        .await,
        5
    );
    let audit = audit_rows(&env).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        (audit[0].0.as_str(), audit[0].2, audit[0].3.as_str()),
        ("dead_letters.ignore", 30, "ok")
    );
    assert!(
        audit[0].4.contains(group) && audit[0].4.contains("duplicate import"),
        "{}",
        audit[0].4
    );
}
