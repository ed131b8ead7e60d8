//! The router (`orderpipe deliver` without `--subscription`) against the
//! real stack: subscriptions from the tables, one group per (consumer,
//! bind_key), filters before the POST, live changes without a restart, and
//! orphaned groups reported by reconciliation.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use orderpipe::subscriptions::model::{
    ConsumerPatch, NewConsumer, NewSubscription, SubscriptionPatch,
};
use orderpipe::subscriptions::store::Origin;
use orderpipe::subscriptions::{FilterSpec, Store, Subscription};
use serde_json::{Value, json};

use crate::consumer::sigterm;
use crate::delivery::{Seen, downstream};
use crate::helpers::TestEnv;

/// Produces `count` events of `orders` open orders from order id `first`; returns them as sent.
pub(crate) fn produce(
    env: &TestEnv,
    count: usize,
    orders: usize,
    first: i64,
    seed: u64,
) -> Vec<Envelope> {
    env.cli(&[
        "produce",
        "--count",
        &count.to_string(),
        "--orders",
        &orders.to_string(),
        "--seed",
        &seed.to_string(),
        "--first-order-id",
        &first.to_string(),
    ])
    .success();
    LifecycleGenerator::new("x", orders, first, seed)
        .take(count)
        .collect()
}

/// Adds the downstream consumer `name`, delivering to `url`.
async fn add_consumer(store: &Store, name: &str, url: String) {
    let consumer = NewConsumer {
        name: name.into(),
        url,
        ..Default::default()
    };
    store.add_consumer(&consumer).await.unwrap();
}

/// Subscribes `consumer` to `event` (on the order topic) with `bind_key` and `filters`.
async fn subscribe(
    store: &Store,
    order_topic: &str,
    consumer: &str,
    event: &str,
    bind_key: &str,
    filters: Vec<FilterSpec>,
) -> Subscription {
    let new = NewSubscription {
        event: event.into(),
        consumer: consumer.into(),
        bind_key: bind_key.into(),
        filters,
        ..Default::default()
    };
    store.add_subscription(&new, order_topic).await.unwrap()
}

/// Event ids of `events` named `name` whose order is in `orders` (all when None).
fn ids(events: &[Envelope], name: &str, orders: Option<&BTreeSet<i64>>) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| {
            e.event_name.as_str() == name && orders.is_none_or(|o| o.contains(&e.data.order_id()))
        })
        .map(|e| e.event_id.to_string())
        .collect()
}

/// Request ids the downstream received on path `mode`.
fn received(seen: &Seen, mode: &str) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(m, _, _)| m == mode)
        .map(|(_, _, body)| body["request_id"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the downstream received every id of `want` on `mode`.
async fn wait_for(seen: &Seen, mode: &str, want: &BTreeSet<String>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got: BTreeSet<String> = received(seen, mode).into_iter().collect();
        if want.is_subset(&got) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} deliveries on /hook/{mode} within {timeout:?}",
            want.intersection(&got).count(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until a line of `log` contains each of `parts` and returns it: a
/// change was picked up, instead of a fixed sleep assumed long enough on a
/// loaded machine. Fails showing the log. The process must log at info
/// (`RUST_LOG=warn,orderpipe=info`).
pub(crate) async fn wait_for_line(
    log: &Arc<Mutex<Vec<String>>>,
    parts: &[&str],
    timeout: Duration,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let found = log
            .lock()
            .unwrap()
            .iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
            .cloned();
        if let Some(line) = found {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no line with {parts:?} within {timeout:?}; the log:\n{}",
            log.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the router with the admin API `admin` serves exactly the
/// subscriptions `want` in `group` (GET /bindings, as of its last re-read
/// of the tables); fails showing the view after `timeout`.
pub(crate) async fn wait_for_subscriptions(
    admin: &str,
    group: &str,
    want: &[i64],
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let (_, body) = crate::helpers::http_get(admin, "/bindings");
        let view: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let actual = view["actual"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["group"] == group).cloned());
        if actual.is_some_and(|a| a["subscriptions"] == json!(want)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{group} does not serve subscriptions {want:?} after {timeout:?}: GET /bindings {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The rest of the first stderr line starting with `prefix` (an announced address).
pub(crate) fn announced(log: &Arc<Mutex<Vec<String>>>, prefix: &str) -> String {
    log.lock()
        .unwrap()
        .iter()
        .find_map(|l| l.strip_prefix(prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("`{prefix}` announced"))
}

/// Collects the router's stderr lines in the background.
pub(crate) fn stderr_lines(child: &mut std::process::Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().unwrap();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

#[tokio::test(flavor = "multi_thread")]
async fn one_group_per_bind_key_filters_first_and_changes_apply_without_a_restart() {
    let mut env = TestEnv::new().with_database().await;
    env.set_env("RUST_LOG", "warn,orderpipe=info");
    let order_topic = env.settings.topics.order_events.name.clone();
    env.cli(&["topics", "ensure"]).success();
    let (base, seen) = downstream().await;
    let store = Store::new(env.db(), Origin::Cli);
    let sms = format!("sms{}", &env.prefix[1..]);
    add_consumer(&store, &sms, format!("{base}/hook/ok")).await;

    let first = produce(&env, 60, 10, 1, 51);
    // order.created only of five orders; every order.payment.succeeded; one bind key.
    let chosen: BTreeSet<i64> = first
        .iter()
        .map(|e| e.data.order_id())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .take(5)
        .collect();
    let filter = FilterSpec {
        field: "order_id".into(),
        op: "in".into(),
        values: Some(chosen.iter().map(|o| json!(o)).collect()),
        ..Default::default()
    };
    let created = subscribe(
        &store,
        &order_topic,
        &sms,
        "order.created",
        "orders",
        vec![filter],
    )
    .await;
    let paid = subscribe(
        &store,
        &order_topic,
        &sms,
        "order.payment.succeeded",
        "orders",
        vec![],
    )
    .await;
    assert_eq!(created.group, paid.group, "one bind key, one group");
    let group = created.group.clone();

    let mut router = env.spawn(&[
        "deliver",
        "--reconcile-interval",
        "2s",
        "--health-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let log = stderr_lines(&mut router);
    let mut want = ids(&first, "order.created", Some(&chosen));
    want.extend(ids(&first, "order.payment.succeeded", None));
    wait_for(&seen, "ok", &want, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = received(&seen, "ok");
    assert_eq!(
        got.iter().cloned().collect::<BTreeSet<_>>(),
        want,
        "only the subscribed events that pass the filter"
    );
    assert_eq!(got.len(), want.len(), "each once");
    // One ordered stream: an order's created arrives before its payment.
    for order in &chosen {
        let position = |name: &str| {
            let id = first
                .iter()
                .find(|e| e.data.order_id() == *order && e.event_name.as_str() == name)
                .map(|e| e.event_id.to_string());
            id.and_then(|id| got.iter().position(|g| *g == id))
        };
        if let (Some(c), Some(p)) = (
            position("order.created"),
            position("order.payment.succeeded"),
        ) {
            assert!(c < p, "order {order}: created after its payment");
        }
    }
    // The filtered-out changes were committed: the group has no lag.
    let lag: Value = serde_json::from_str(
        &env.cli(&["lag", "--group", &group, "--output", "json"])
            .success(),
    )
    .unwrap();
    assert_eq!(
        lag["groups"][0]["members"], 1,
        "one group, one member: {lag}"
    );
    assert_eq!(lag["groups"][0]["total_lag"], 0, "{lag}");

    // The admin API in the router's process shows its actual state: the
    // group running both subscriptions, in sync, its lag measured (0).
    let admin = announced(&log, "admin API listening on http://");
    let (a, view) = actual_at_lag_zero(&admin, &group).await;
    assert_eq!(a["running"], true, "{view}");
    assert_eq!(a["subscriptions"], json!([created.id, paid.id]), "{view}");
    assert_eq!(
        view["diff"],
        json!([{"group": group, "status": "in_sync"}]),
        "{view}"
    );

    // Disable the payment subscription, change the filter and the URL: the
    // next records, produced once the router has read the last change (the
    // URL, written last), see all three changes.
    disable(&store, paid.id).await;
    let second: Vec<Envelope> = LifecycleGenerator::new("x", 10, 1_001, 52)
        .take(40)
        .collect();
    let created_second: BTreeSet<i64> = second
        .iter()
        .map(|e| e.data.order_id())
        .filter(|o| *o < 1_003)
        .collect();
    let filter = FilterSpec {
        field: "order_id".into(),
        op: "in".into(),
        values: Some(created_second.iter().map(|o| json!(o)).collect()),
        ..Default::default()
    };
    store
        .update_subscription(
            created.id,
            &SubscriptionPatch {
                filters: Some(vec![filter]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store
        .update_consumer(
            &sms,
            &ConsumerPatch {
                url: Some(format!("{base}/hook/other")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    wait_for_line(
        &log,
        &["binding reloaded", "/hook/other"],
        Duration::from_secs(30),
    )
    .await;
    let sent = produce(&env, 40, 10, 1_001, 52);
    assert_eq!(
        sent.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        second.iter().map(|e| e.event_id).collect::<Vec<_>>()
    );
    let want_second = ids(&second, "order.created", Some(&created_second));
    wait_for(&seen, "other", &want_second, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let other: BTreeSet<String> = received(&seen, "other").into_iter().collect();
    assert_eq!(
        other, want_second,
        "no payment after the disable, the new filter and URL"
    );
    assert_eq!(
        received(&seen, "ok").len(),
        want.len(),
        "nothing more to the old URL"
    );

    // A second bind key starts its own group, without a restart.
    let shipped = subscribe(&store, &order_topic, &sms, "order.shipped", "ship", vec![]).await;
    assert_ne!(shipped.group, group);
    let mut want_shipped = ids(&first, "order.shipped", None);
    want_shipped.extend(ids(&second, "order.shipped", None));
    want_shipped.extend(want_second.iter().cloned());
    wait_for(&seen, "other", &want_shipped, Duration::from_secs(60)).await;

    // Disabling its only subscription stops that group; the broker keeps
    // its offsets, so reconciliation reports it as orphaned.
    disable(&store, shipped.id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lines = log.lock().unwrap().join("\n");
        if lines.contains("orphaned consumer group") && lines.contains(&shipped.group) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no orphan reported for {}:\n{lines}",
            shipped.group
        );
        drop(lines);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lines = log.lock().unwrap().clone();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("orphaned consumer group") && l.contains(&group)),
        "the live group is not an orphan"
    );
    // ... and on /metrics: one orphan, one group running, filtered changes counted.
    let addr = announced(&log, "health endpoints on http://")
        .trim_end_matches("/health/ready")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, metrics) = crate::helpers::http_get(&addr, "/metrics");
        assert_eq!(status, 200);
        let value = |series: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(series).map(|v| v.trim().to_string()))
        };
        if value("orderpipe_router_groups ").as_deref() == Some("1") {
            assert_eq!(
                value("orderpipe_router_orphaned_groups ").as_deref(),
                Some("1"),
                "{metrics}"
            );
            let filtered = value(&format!(
                "orderpipe_router_filtered_total{{group=\"{group}\"}} "
            ))
            .unwrap_or_default();
            assert!(filtered.parse::<f64>().unwrap_or(0.0) > 0.0, "{metrics}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "orderpipe_router_groups is not 1: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The same difference from the command line, exit 1.
    let run = env.cli(&["subs", "reconcile", "--dry-run", "--output", "json"]);
    let text = run.failure();
    let report: Value = serde_json::from_str(&String::from_utf8_lossy(&run.output.stdout))
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        report["report"]["orphaned_groups"],
        json!([shipped.group]),
        "{report}"
    );
    assert_eq!(
        report["report"]["missing"],
        json!([]),
        "the live group runs: {report}"
    );
    assert_eq!(
        report["refresh_request"],
        Value::Null,
        "a dry run requests nothing"
    );
    sigterm(&mut router);
}

/// Disables subscription `id` (as `orderpipe subs disable subscription ID`).
pub(crate) async fn disable(store: &Store, id: i64) {
    let patch = SubscriptionPatch {
        enabled: Some(false),
        ..Default::default()
    };
    store.update_subscription(id, &patch).await.unwrap();
}

/// Polls `GET /bindings` of the admin API at `admin` (60 s at most: lag is
/// measured at each reconciliation, later on a loaded machine) until
/// `group`'s actual entry shows a measured lag of 0; returns it and the view.
pub(crate) async fn actual_at_lag_zero(admin: &str, group: &str) -> (Value, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = crate::helpers::http_get(admin, "/bindings");
        assert_eq!(status, 200, "{body}");
        let view: Value = serde_json::from_str(body.split("\r\n\r\n").last().unwrap_or(&body))
            .unwrap_or(Value::Null);
        let actual = view["actual"].as_array().cloned().unwrap_or_default();
        if let Some(a) = actual.iter().find(|a| a["group"] == group && a["lag"] == 0) {
            return (a.clone(), view);
        }
        assert!(
            Instant::now() < deadline,
            "no measured lag 0 for {group} in GET /bindings: {view}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes consumer group `group` on the broker, as an operator would by hand.
pub(crate) async fn delete_group(
    admin: &rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    group: &str,
) {
    let deleted = admin
        .delete_groups(&[group], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap();
    for r in deleted {
        r.unwrap();
    }
}

/// `subs reconcile --dry-run` names `group` as missing (exit 1).
pub(crate) fn assert_missing(env: &TestEnv, group: &str) {
    let missing = env.cli(&["subs", "reconcile", "--dry-run"]).failure();
    assert!(
        missing.contains(group) && missing.contains("MISSING: no router runs it"),
        "{missing}"
    );
}

/// Waits (60 s at most) until `subs reconcile --dry-run` finds no desired group missing.
pub(crate) async fn wait_until_none_missing(env: &TestEnv) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = env.cli(&["subs", "reconcile", "--dry-run", "--output", "json"]);
        let report: Value = serde_json::from_slice(&run.output.stdout).unwrap();
        if report["report"]["missing"] == json!([]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the group was not recreated: {report}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_and_retry_topic_deleted_by_hand_are_recreated_by_the_router() {
    use rdkafka::admin::AdminOptions;
    let env = TestEnv::new().with_database().await;
    let order_topic = env.settings.topics.order_events.name.clone();
    env.cli(&["topics", "ensure"]).success();
    let (base, seen) = downstream().await;
    let store = Store::new(env.db(), Origin::Cli);
    let crm = format!("crm{}", &env.prefix[1..]);
    add_consumer(&store, &crm, format!("{base}/hook/ok")).await;
    let sub = subscribe(&store, &order_topic, &crm, "order.created", "all", vec![]).await;
    let events = produce(&env, 20, 5, 1, 61);
    let want = ids(&events, "order.created", None);
    let mut router = env.spawn(&["deliver"]);
    wait_for(&seen, "ok", &want, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    sigterm(&mut router);

    // By hand: the group and its retry topic are deleted.
    let admin = env.admin();
    delete_group(&admin, &sub.group).await;
    let retry = format!("{order_topic}.retry.{}", sub.group);
    for r in admin
        .delete_topics(&[&retry], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    assert_missing(&env, &sub.group);

    // The router recreates both, and dedup keeps the downstream from a second delivery.
    let mut router = env.spawn(&["deliver"]);
    wait_until_none_missing(&env).await;
    let topics = env
        .cli(&[
            "topics", "describe", "--group", &sub.group, "--output", "json",
        ])
        .success();
    let described: Value = serde_json::from_str(&topics).unwrap();
    let recreated = described
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["topic"] == retry.as_str())
        .unwrap();
    assert_eq!(recreated["exists"], true, "{recreated}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        received(&seen, "ok").len(),
        want.len(),
        "nothing delivered twice"
    );
    sigterm(&mut router);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_router_started_before_its_database_waits_for_it_and_then_serves() {
    let mut env = TestEnv::new();
    let order_topic = env.settings.topics.order_events.name.clone();
    env.cli(&["topics", "ensure"]).success();
    // The database does not exist yet.
    let name = format!("op_{}", env.prefix);
    let url = format!("{}{name}", crate::helpers::MYSQL_ADMIN_URL);
    env.set_env("ORDERPIPE_DATABASE__URL", &url);
    env.set_env("RUST_LOG", "warn,orderpipe=info");
    let mut router = env.spawn(&["deliver"]);
    let log = stderr_lines(&mut router);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("control requests not read") || l.contains("subscriptions not read"))
    {
        assert!(
            Instant::now() < deadline,
            "no retry logged: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        router.try_wait().unwrap().is_none(),
        "the router exited: {:?}",
        log.lock().unwrap()
    );

    // The database comes: the router reads it and serves what it holds.
    assert_eq!(crate::helpers::empty_mysql_database(&name).await, url);
    env.settings.database.url = url.into();
    let db = env.db();
    db.migrate().await.unwrap();
    let (base, seen) = downstream().await;
    let store = Store::new(db, Origin::Cli);
    let late = format!("late{}", &env.prefix[1..]);
    add_consumer(&store, &late, format!("{base}/hook/ok")).await;
    subscribe(&store, &order_topic, &late, "order.created", "all", vec![]).await;
    let events = produce(&env, 10, 5, 1, 71);
    wait_for(
        &seen,
        "ok",
        &ids(&events, "order.created", None),
        Duration::from_secs(90),
    )
    .await;
    sigterm(&mut router);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_subscription_delivers_nothing_until_resumed_then_everything_in_order() {
    const TOKEN: &str = "router-pause-token";
    let mut env = TestEnv::new().with_database().await;
    env.set_env("RUST_LOG", "warn,orderpipe=info");
    env.set_env("ORDERPIPE_ADMIN__TOKEN", TOKEN);
    let order_topic = env.settings.topics.order_events.name.clone();
    env.cli(&["topics", "ensure"]).success();
    let (base, seen) = downstream().await;
    let store = Store::new(env.db(), Origin::Cli);
    let sms = format!("sms{}", &env.prefix[1..]);
    add_consumer(&store, &sms, format!("{base}/hook/ok")).await;
    let sub = async |event: &str, bind_key: &str| {
        subscribe(&store, &order_topic, &sms, event, bind_key, vec![]).await
    };
    // Two subscriptions share the group `orders`; `shipped` has its own.
    let created = sub("order.created", "orders").await;
    let paid = sub("order.payment.succeeded", "orders").await;
    let shipped = sub("order.shipped", "ship").await;
    let group = created.group.clone();
    assert_ne!(shipped.group, group);

    let first = produce(&env, 60, 10, 1, 81);
    let mut router = env.spawn(&["deliver", "--admin-addr", "127.0.0.1:0"]);
    let log = stderr_lines(&mut router);
    let mut want_first = ids(&first, "order.created", None);
    want_first.extend(ids(&first, "order.payment.succeeded", None));
    want_first.extend(ids(&first, "order.shipped", None));
    wait_for(&seen, "ok", &want_first, Duration::from_secs(90)).await;

    // Bad targets are named.
    let bad = env.cli(&["subs", "pause", "subscription", "abc"]).failure();
    assert!(bad.contains("`abc` is not a subscription id"), "{bad}");
    let bad = env.cli(&["subs", "pause", "consumer", "nobody"]).failure();
    assert!(bad.contains("consumer `nobody` not found"), "{bad}");
    assert!(
        env.cli(&["group", "list"])
            .success()
            .contains("no group is paused"),
        "a refused pause paused nothing"
    );

    // Pausing one subscription pauses its group, and says which
    // subscriptions that holds.
    let id = created.id.to_string();
    let answer: Value = serde_json::from_str(
        &env.cli(&[
            "subs",
            "pause",
            "subscription",
            &id,
            "--reason",
            "crm fix",
            "--output",
            "json",
        ])
        .success(),
    )
    .unwrap();
    assert_eq!(
        answer["paused"],
        json!([{
            "group": group,
            "subscriptions": [created.id, paid.id],
            "pause": answer["paused"][0]["pause"],
            "was_paused": false,
        }]),
        "{answer}"
    );
    assert_eq!(answer["paused"][0]["pause"]["reason"], "crm fix");
    wait_for_line(
        &log,
        &["group paused by an operator", &group],
        Duration::from_secs(30),
    )
    .await;

    // Changes keep coming: the other group delivers them, this one holds
    // its own, and its lag shows them.
    let second = produce(&env, 60, 10, 1_001, 82);
    wait_for(
        &seen,
        "ok",
        &ids(&second, "order.shipped", None),
        Duration::from_secs(60),
    )
    .await;
    crate::group_pause::wait_until(
        "the paused group's lag shows the new records",
        Duration::from_secs(60),
        async || {
            let lag = crate::group_pause::lag(&env, &group);
            lag["groups"][0]["total_lag"].as_i64().unwrap_or(0) >= second.len() as i64
                && lag["paused"][0]["group"] == group
        },
    )
    .await;
    let mut held = ids(&second, "order.created", None);
    held.extend(ids(&second, "order.payment.succeeded", None));
    let got: BTreeSet<String> = received(&seen, "ok").into_iter().collect();
    assert!(
        got.is_disjoint(&held),
        "a paused subscription delivered {} of its {} held changes; the router's log:\n{}",
        got.intersection(&held).count(),
        held.len(),
        log.lock().unwrap().join("\n")
    );

    // Resume through the router's admin API: all of it, once, in order.
    let admin = announced(&log, "admin API listening on http://");
    let url = format!("http://{admin}/subscriptions/{}/resume", paid.id);
    let (status, body) = crate::subscriptions::call("POST", &url, None, None).await;
    assert_eq!(status, 401, "a resume needs the token: {body}");
    let (status, body) = crate::subscriptions::call("POST", &url, Some(TOKEN), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["group"], group, "{body}");
    assert_eq!(body[0]["was_paused"], true, "{body}");
    wait_for(&seen, "ok", &held, Duration::from_secs(60)).await;
    let got = received(&seen, "ok");
    let all: Vec<&Envelope> = first.iter().chain(&second).collect();
    for e in &all {
        let n = got.iter().filter(|g| **g == e.event_id.to_string()).count();
        assert!(n <= 1, "{} delivered {n} times", e.event_id);
    }
    let position = |e: &Envelope| got.iter().position(|g| *g == e.event_id.to_string());
    for order in second.iter().map(|e| e.data.order_id()) {
        let of = |name: &str| {
            second
                .iter()
                .find(|e| e.data.order_id() == order && e.event_name.as_str() == name)
                .and_then(position)
        };
        if let (Some(c), Some(p)) = (of("order.created"), of("order.payment.succeeded")) {
            assert!(
                c < p,
                "order {order}: its payment was delivered before its creation"
            );
        }
    }
    assert!(
        env.cli(&["group", "list"])
            .success()
            .contains("no group is paused")
    );
    sigterm(&mut router);
}
