//! Subscriptions as data (issue 16, item 2) on the real MariaDB: the CLI's
//! CRUD and its errors naming the flag, the admin API with its bearer token
//! (refused without it, never printed), and property filters stored and
//! read back to decide seed 003's "status 1 -> 2".

use std::io::BufRead;
use std::time::Duration;

use orderpipe::subscriptions::store::{Origin, Store};
use orderpipe::subscriptions::{Decision, FilterSpec};
use serde_json::{Value, json};

use crate::helpers::{Spawned, TestEnv};

/// `orderpipe ARGS --output json`, parsed.
fn cli_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = env.cli(&all).success();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// `subs add consumer NAME --url URL EXTRA...`.
fn add_consumer<'a>(name: &'a str, url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["subs", "add", "consumer", name, "--url", url];
    args.extend(extra);
    args
}

/// `subs add subscription --event EVENT --consumer CONSUMER --bind-key KEY EXTRA...`.
fn add_subscription<'a>(
    event: &'a str,
    consumer: &'a str,
    bind_key: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "subs",
        "add",
        "subscription",
        "--event",
        event,
        "--consumer",
        consumer,
        "--bind-key",
        bind_key,
    ];
    args.extend(extra);
    args
}

#[tokio::test]
async fn the_cli_adds_lists_updates_disables_and_removes_and_names_the_flag_on_bad_input() {
    let env = TestEnv::new().with_database().await;
    let sms = cli_json(
        &env,
        &add_consumer(
            "sms",
            "http://sms.internal/send",
            &["--retry-delays", "5s,30s,5m"],
        ),
    );
    assert_eq!(sms[0]["retry"], json!({"delays": ["5s", "30s", "5m"]}));
    assert_eq!(
        (sms[0]["method"].as_str(), sms[0]["timeout_ms"].as_i64()),
        (Some("POST"), Some(5000))
    );
    let insert = cli_json(
        &env,
        &add_subscription("order_db.table_user.insert", "sms", "user", &[]),
    );
    let update = cli_json(
        &env,
        &add_subscription(
            "order_db.table_user.update",
            "sms",
            "user",
            &["--filter", "status:changed:1->2"],
        ),
    );
    let (insert_id, update_id) = (
        insert[0]["id"].as_i64().unwrap(),
        update[0]["id"].as_i64().unwrap(),
    );
    assert_eq!(
        update[0]["filters"],
        json!([{"field": "status", "op": "changed", "from": 1, "to": 2}])
    );
    assert_eq!(update[0]["group"], "sms.user.consumer");
    assert_eq!(
        update[0]["topic"], "cdc.order_db.table_user",
        "the event was created with its default topic"
    );

    // Two subscriptions, one bind key: one group serving both routing keys.
    let bindings = cli_json(&env, &["subs", "bindings"]);
    assert_eq!(bindings.as_array().unwrap().len(), 1, "{bindings}");
    assert_eq!(bindings[0]["group"], "sms.user.consumer");
    assert_eq!(bindings[0]["topics"], json!(["cdc.order_db.table_user"]));
    assert_eq!(bindings[0]["routes"].as_array().unwrap().len(), 2);
    let table = env.cli(&["subs", "list"]).success();
    assert!(
        table.contains("status:changed:1->2") && table.contains("sms.user.consumer"),
        "{table}"
    );

    // Disable one: the group keeps the other; disable the consumer: no group.
    let id = update_id.to_string();
    assert_eq!(
        cli_json(&env, &["subs", "disable", "subscription", &id])[0]["enabled"],
        false
    );
    assert_eq!(
        cli_json(&env, &["subs", "bindings"])[0]["routes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    cli_json(&env, &["subs", "disable", "consumer", "sms"]);
    assert_eq!(cli_json(&env, &["subs", "bindings"]), json!([]));
    cli_json(&env, &["subs", "enable", "consumer", "sms"]);
    cli_json(&env, &["subs", "enable", "subscription", &id]);

    // Updates: URL, retry cleared, filters replaced; show reads it back.
    let changed = cli_json(
        &env,
        &[
            "subs",
            "update",
            "consumer",
            "sms",
            "--url",
            "https://sms2.internal/send",
            "--clear-retry",
        ],
    );
    assert_eq!(
        (changed[0]["url"].as_str(), &changed[0]["retry"]),
        (Some("https://sms2.internal/send"), &Value::Null)
    );
    cli_json(
        &env,
        &[
            "subs",
            "update",
            "subscription",
            &id,
            "--filter",
            "status:in:2,3",
            "--filter",
            "vip:eq:true",
        ],
    );
    let shown = cli_json(&env, &["subs", "show", "subscription", &id]);
    assert_eq!(
        shown["filters"],
        json!([{"field": "status", "op": "in", "values": [2, 3]}, {"field": "vip", "op": "eq", "value": true}])
    );
    let shown = env.cli(&["subs", "show", "subscription", &id]).success();
    assert!(shown.contains("status:in:2,3 AND vip:eq:true"), "{shown}");

    // A refresh request for routers.
    let refresh = cli_json(&env, &["subs", "refresh", "--consumer", "sms"]);
    assert_eq!(
        (
            refresh["kind"].as_str(),
            refresh["consumer"].as_str(),
            refresh["origin"].as_str()
        ),
        (Some("refresh"), Some("sms"), Some("cli"))
    );

    // Bad input names the flag and what is accepted; nothing is written.
    for (args, want) in [
        (
            add_consumer("crm", "http://crm/x", &["--method", "GET"]),
            "--method: `GET` is not one of POST, PUT",
        ),
        (
            add_consumer("CRM", "http://crm/x", &[]),
            "--name: `CRM` is not a name: 1 to 64 of a-z",
        ),
        (
            add_consumer("crm", "crm.internal", &[]),
            "--url: `crm.internal` is not an http(s) URL",
        ),
        (
            add_consumer("crm", "http://crm/x", &["--retry-delays", "1minute"]),
            "--retry-delays[0]: `1minute` is not a delay; accepted forms",
        ),
        (
            add_consumer("crm", "http://crm/x", &["--retry-profile", "fast"]),
            "--retry-profile: `fast` is not a profile; accepted: default, 10s-1m-5m, 10s-30s-1m-5m, 5s-30s-5m (older names: seed000, seed001, seed003)",
        ),
        (
            add_subscription("db.t.insert", "sms", "user", &["--filter", "status:gt:1"]),
            "--filter: `status:gt:1`: `gt` is not one of eq, ne, in, changed",
        ),
        (
            add_subscription("db.t.insert", "sms", "User", &[]),
            "--bind-key: `User` is not a name",
        ),
        (
            add_subscription("db", "sms", "user", &[]),
            "--event: `db` is not a routing key",
        ),
        (
            add_subscription("db.t.insert", "smss", "user", &[]),
            "consumer `smss` not found; known: sms",
        ),
        (
            add_subscription("order_db.table_user.insert", "sms", "user", &[]),
            &format!("(subscription {insert_id}; change it with update)"),
        ),
        (
            vec!["subs", "enable", "event", "order_db.table_user.insert"],
            "events have no enabled flag",
        ),
        (
            vec!["subs", "show", "subscription", "x1"],
            "`x1` is not a subscription id",
        ),
        (
            vec!["subs", "remove", "consumer", "sms"],
            &format!(
                "consumer `sms` is used by subscriptions {insert_id}, {update_id}: remove those first"
            ),
        ),
        (
            vec!["subs", "remove", "event", "order_db.table_user.insert"],
            &format!("event `order_db.table_user.insert` is used by subscriptions {insert_id}"),
        ),
    ] {
        let err = env.cli(&args).failure();
        assert!(err.contains(want), "{args:?}: want {want}\n{err}");
    }
    assert_eq!(
        cli_json(&env, &["subs", "list", "consumers"])
            .as_array()
            .unwrap()
            .len(),
        1,
        "nothing was added"
    );
    assert_eq!(
        cli_json(&env, &["subs", "list", "events"])
            .as_array()
            .unwrap()
            .len(),
        2,
        "db.t.insert was not created"
    );

    // Remove: subscriptions, then the event and the consumer.
    for args in [
        ["subs", "remove", "subscription", &insert_id.to_string()],
        ["subs", "remove", "subscription", &id],
    ] {
        env.cli(&args).success();
    }
    env.cli(&["subs", "remove", "event", "order_db.table_user.insert"])
        .success();
    assert!(
        env.cli(&["subs", "remove", "consumer", "sms"])
            .success()
            .contains("removed consumer sms")
    );
    assert_eq!(cli_json(&env, &["subs", "list"]), json!([]));
    assert_eq!(cli_json(&env, &["subs", "list", "consumers"]), json!([]));
}

#[tokio::test]
async fn sources_and_events_are_managed_and_refused_while_in_use() {
    let env = TestEnv::new().with_database().await;
    let source = cli_json(
        &env,
        &[
            "subs", "add", "source", "order_db", "--host", "10.0.0.5", "--user", "repl",
        ],
    );
    assert_eq!(
        (
            source[0]["db_port"].as_i64(),
            source[0]["enabled"].as_bool()
        ),
        (Some(3306), Some(true))
    );
    let event = cli_json(
        &env,
        &[
            "subs",
            "add",
            "event",
            "order_db.table_user.delete",
            "--source",
            "order_db",
            "--description",
            "user deleted",
        ],
    );
    assert_eq!(
        (event[0]["topic"].as_str(), event[0]["source"].as_str()),
        (Some("cdc.order_db.table_user"), Some("order_db"))
    );
    let named = cli_json(&env, &["subs", "add", "event", "order.created"]);
    assert_eq!(
        named[0]["topic"].as_str(),
        Some(env.settings.topics.order_events.name.as_str()),
        "an event name reads the order topic"
    );
    let moved = cli_json(
        &env,
        &[
            "subs",
            "update",
            "event",
            "order_db.table_user.delete",
            "--topic",
            "cdc.order_db.users",
        ],
    );
    assert_eq!(
        (moved[0]["topic"].as_str(), moved[0]["source"].as_str()),
        (Some("cdc.order_db.users"), Some("order_db")),
        "the source stays"
    );
    assert_eq!(
        cli_json(&env, &["subs", "disable", "source", "order_db"])[0]["enabled"],
        false
    );
    assert_eq!(
        cli_json(
            &env,
            &["subs", "update", "source", "order_db", "--port", "3307"]
        )[0]["db_port"],
        3307
    );
    for (args, want) in [
        (
            vec!["subs", "remove", "source", "order_db"],
            "source `order_db` is used by events order_db.table_user.delete: remove those first",
        ),
        (
            vec!["subs", "update", "source", "order_db", "--port", "70000"],
            "--port: 70000 is outside 1 to 65535",
        ),
        (
            vec!["subs", "add", "event", "a.b.insert", "--source", "nope"],
            "source `nope` not found; known: order_db",
        ),
        (
            vec!["subs", "add", "event", "a.b.insert", "--topic", "bad topic"],
            "--topic: `bad topic` is not a topic name",
        ),
        (
            vec!["subs", "add", "event", "order.created"],
            "event `order.created` exists already",
        ),
        (
            vec!["subs", "add", "source", "s2", "--host", "h"],
            "--host and --user: both required",
        ),
    ] {
        let err = env.cli(&args).failure();
        assert!(err.contains(want), "{args:?}: want {want}\n{err}");
    }
    cli_json(
        &env,
        &[
            "subs",
            "update",
            "event",
            "order_db.table_user.delete",
            "--source",
            "",
        ],
    );
    env.cli(&["subs", "remove", "source", "order_db"]).success();
    assert_eq!(cli_json(&env, &["subs", "list", "sources"]), json!([]));
    let events = cli_json(&env, &["subs", "list", "events"]);
    assert_eq!(events.as_array().unwrap().len(), 2);
}

/// A running `orderpipe subs serve` and its base URL.
pub(crate) struct Admin {
    process: Spawned,
    pub(crate) base: String,
    stderr: std::sync::mpsc::Receiver<String>,
    /// Lines up to the announcement.
    first: Vec<String>,
}

impl Admin {
    pub(crate) fn start(env: &TestEnv) -> Self {
        let mut process = env.spawn(&["subs", "serve", "--addr", "127.0.0.1:0"]);
        let stderr = process.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut first = Vec::new();
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .expect("admin API announced");
            if let Some(addr) = line.strip_prefix("admin API listening on ") {
                return Self {
                    process,
                    base: addr.to_string(),
                    stderr: rx,
                    first,
                };
            }
            first.push(line);
        }
    }

    /// Everything it wrote to stderr, after stopping it.
    fn stop(mut self) -> String {
        let _ = self.process.kill();
        let _ = self.process.wait();
        self.first.extend(self.stderr.try_iter());
        self.first.join("\n")
    }
}

pub(crate) async fn call(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.request(method.parse().unwrap(), url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn the_admin_api_needs_the_token_for_changes_and_never_prints_it() {
    const TOKEN: &str = "s3cr3t-admin-token-for-tests";
    let mut env = TestEnv::new().with_database().await;
    env.set_env("ORDERPIPE_ADMIN__TOKEN", TOKEN);
    let admin = Admin::start(&env);
    let url = |path: &str| format!("{}{path}", admin.base);
    let sms =
        json!({"name": "sms", "url": "http://sms.internal/send", "retry": {"profile": "seed003"}});

    // No token: 401 with a challenge; a wrong one: 403; nothing written.
    let (status, body) = call("POST", &url("/consumers"), None, Some(sms.clone())).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (401, Some("Authorization")),
        "{body}"
    );
    let (status, _) = call(
        "POST",
        &url("/consumers"),
        Some("not-the-token-at-all"),
        Some(sms.clone()),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(
        call("GET", &url("/consumers"), None, None).await,
        (200, json!([])),
        "reads need no token"
    );

    // With it: CRUD.
    let (status, consumer) = call("POST", &url("/consumers"), Some(TOKEN), Some(sms.clone())).await;
    assert_eq!(
        (status, &consumer["retry"]),
        (201, &json!({"profile": "seed003"})),
        "{consumer}"
    );
    let subscription = |event: &str, filters: Value| json!({"event": event, "consumer": "sms", "bind_key": "user", "filters": filters});
    let (status, insert) = call(
        "POST",
        &url("/subscriptions"),
        Some(TOKEN),
        Some(subscription("order_db.table_user.insert", json!([]))),
    )
    .await;
    assert_eq!(status, 201, "{insert}");
    let filter = json!([{"field": "status", "op": "changed", "from": 1, "to": 2}]);
    let (status, update) = call(
        "POST",
        &url("/subscriptions"),
        Some(TOKEN),
        Some(subscription("order_db.table_user.update", filter.clone())),
    )
    .await;
    assert_eq!((status, &update["filters"]), (201, &filter), "{update}");
    let (status, bindings) = call("GET", &url("/bindings"), None, None).await;
    assert_eq!(
        (status, bindings["desired"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{bindings}"
    );
    assert_eq!(bindings["desired"][0]["group"], "sms.user.consumer");
    assert_eq!(bindings["actual"], Value::Null, "no router serves this API");

    // Concurrent adds of one name: one is created, the others are told it exists (never a 500).
    let consumers = url("/consumers");
    let racers = (0..8).map(|_| {
        call(
            "POST",
            &consumers,
            Some(TOKEN),
            Some(json!({"name": "race", "url": "http://race/x"})),
        )
    });
    let mut statuses: Vec<u16> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409]);
    assert_eq!(
        call("DELETE", &url("/consumers/race"), Some(TOKEN), None)
            .await
            .0,
        200
    );

    // Concurrent patches of different fields both hold: none undoes the other.
    let sms_url = url("/consumers/sms");
    for round in 0..10 {
        let (timeout, method) = (1000 + round, if round % 2 == 0 { "PUT" } else { "POST" });
        let ((a, _), (b, _), (c, _)) = tokio::join!(
            call(
                "PATCH",
                &sms_url,
                Some(TOKEN),
                Some(json!({"url": format!("http://sms{round}.internal/send")}))
            ),
            call(
                "PATCH",
                &sms_url,
                Some(TOKEN),
                Some(json!({"timeout_ms": timeout}))
            ),
            call(
                "PATCH",
                &sms_url,
                Some(TOKEN),
                Some(json!({"method": method}))
            ),
        );
        assert_eq!((a, b, c), (200, 200, 200));
        let (_, now) = call("GET", &sms_url, None, None).await;
        let got = (
            now["url"].as_str().unwrap().to_string(),
            now["timeout_ms"].as_i64(),
            now["method"].as_str().unwrap().to_string(),
        );
        assert_eq!(
            got,
            (
                format!("http://sms{round}.internal/send"),
                Some(timeout),
                method.to_string()
            ),
            "round {round}"
        );
    }

    // Bad input: 400 naming the field.
    for (body, field, reason) in [
        (
            subscription(
                "order_db.table_user.delete",
                json!([{"field": "status", "op": "gt", "value": 1}]),
            ),
            "filters[0].op",
            "`gt` is not one of eq, ne, in, changed",
        ),
        (
            subscription(
                "order_db.table_user.delete",
                json!([{"field": "status", "op": "in", "values": []}]),
            ),
            "filters[0].values",
            "non-empty",
        ),
        (
            json!({"event": "x.y.insert", "consumer": "sms", "bind_key": "a b"}),
            "bind_key",
            "is not a name",
        ),
    ] {
        let (status, answer) = call("POST", &url("/subscriptions"), Some(TOKEN), Some(body)).await;
        assert_eq!(
            (status, answer["field"].as_str()),
            (400, Some(field)),
            "{answer}"
        );
        assert!(
            answer["error"].as_str().unwrap().contains(reason),
            "{answer}"
        );
    }
    let (status, answer) = call(
        "PATCH",
        &url("/consumers/sms"),
        Some(TOKEN),
        Some(json!({"method": "GET"})),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("method: `GET` is not one of POST, PUT"))
    );
    let (status, answer) = call(
        "POST",
        &url("/subscriptions"),
        Some(TOKEN),
        Some(json!({"event": "a.b.insert", "consumer": "sms"})),
    )
    .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (400, Some("<body>")),
        "{answer}"
    );
    assert!(
        answer["error"].as_str().unwrap().contains("bind_key"),
        "the missing field is named: {answer}"
    );

    // Disable, patch, refresh, reload; conflicts and not found.
    let update_id = update["id"].as_i64().unwrap();
    let (status, disabled) = call(
        "POST",
        &url(&format!("/subscriptions/{update_id}/disable")),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!((status, &disabled["enabled"]), (200, &json!(false)));
    let (_, bindings) = call("GET", &url("/bindings?consumer=sms"), None, None).await;
    assert_eq!(
        bindings["desired"][0]["routes"].as_array().unwrap().len(),
        1,
        "{bindings}"
    );
    let (status, patched) = call(
        "PATCH",
        &url("/consumers/sms"),
        Some(TOKEN),
        Some(json!({"url": "https://sms2.internal/send", "timeout_ms": 900})),
    )
    .await;
    assert_eq!(
        (
            status,
            patched["url"].as_str(),
            patched["timeout_ms"].as_i64()
        ),
        (200, Some("https://sms2.internal/send"), Some(900))
    );
    let (status, refreshed) = call("POST", &url("/refresh?consumer=sms"), Some(TOKEN), None).await;
    assert_eq!(
        (
            status,
            refreshed["request"]["kind"].as_str(),
            refreshed["request"]["origin"].as_str()
        ),
        (200, Some("refresh"), Some("api")),
        "{refreshed}"
    );
    assert_eq!(
        refreshed["desired"][0]["consumer"]["url"],
        "https://sms2.internal/send"
    );
    assert_eq!(
        call("POST", &url("/refresh"), None, None).await.0,
        401,
        "a refresh is a change"
    );
    let (status, reloaded) = call("POST", &url("/reload"), Some(TOKEN), None).await;
    assert_eq!(
        (status, reloaded["request"]["kind"].as_str()),
        (200, Some("reload"))
    );
    assert!(reloaded["request"]["id"].as_i64() > refreshed["request"]["id"].as_i64());
    assert_eq!(
        call("POST", &url("/refresh?consumer=nobody"), Some(TOKEN), None)
            .await
            .0,
        404
    );
    assert_eq!(
        call("POST", &url("/consumers"), Some(TOKEN), Some(sms))
            .await
            .0,
        409,
        "exists"
    );
    assert_eq!(
        call("DELETE", &url("/consumers/sms"), Some(TOKEN), None)
            .await
            .0,
        409,
        "in use"
    );
    assert_eq!(
        call("GET", &url("/subscriptions/999999"), None, None)
            .await
            .0,
        404
    );
    let insert_id = insert["id"].as_i64().unwrap();
    for id in [insert_id, update_id] {
        assert_eq!(
            call(
                "DELETE",
                &url(&format!("/subscriptions/{id}")),
                Some(TOKEN),
                None
            )
            .await
            .0,
            200
        );
    }
    assert_eq!(
        call("DELETE", &url("/consumers/sms"), Some(TOKEN), None)
            .await
            .0,
        200
    );
    assert_eq!(
        call("GET", &url("/subscriptions"), None, None).await,
        (200, json!([]))
    );

    // Refused and accepted requests are counted.
    let (_, metrics) =
        crate::helpers::http_get(admin.base.trim_start_matches("http://"), "/metrics");
    for series in [
        r#"orderpipe_admin_requests_total{resource="consumers",method="POST",status="401"} 1"#,
        r#"orderpipe_admin_requests_total{resource="consumers",method="POST",status="403"} 1"#,
        r#"orderpipe_admin_requests_total{resource="subscriptions",method="POST",status="201"} 2"#,
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }

    // The token is in no log line, nor in `orderpipe config`'s output.
    let logged = admin.stop();
    assert!(!logged.contains(TOKEN), "{logged}");
    let config = env.cli(&["config"]).success();
    assert!(
        !config.contains(TOKEN) && config.contains("token = \"__REDACTED__\""),
        "{config}"
    );

    // A token too short to be one is refused at load, its value unshown.
    let mut short_token_env = TestEnv::new().with_database().await;
    short_token_env.set_env("ORDERPIPE_ADMIN__TOKEN", "");
    let short = short_token_env.cli(&["subs", "list"]).failure();
    assert!(
        short.contains("admin.token: shorter than 16 characters (its value is not shown)"),
        "{short}"
    );
}

#[tokio::test]
async fn an_unset_token_makes_the_admin_api_read_only() {
    let env = TestEnv::new().with_database().await;
    let admin = Admin::start(&env);
    let (status, body) = call(
        "POST",
        &format!("{}/consumers", admin.base),
        Some("anything-at-all-here"),
        Some(json!({"name": "sms", "url": "http://sms/x"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("admin.token is not set: this API is read-only"))
    );
    assert_eq!(
        call("GET", &format!("{}/consumers", admin.base), None, None).await,
        (200, json!([]))
    );
    let logged = admin.stop();
    assert!(logged.contains("the admin API is read-only"), "{logged}");
}

/// Filters written to MariaDB come back as written and decide the seed's
/// example: only status 1 -> 2 updates are delivered.
#[tokio::test]
async fn filters_stored_in_mariadb_decide_status_1_to_2() {
    let env = TestEnv::new().with_database().await;
    let store = Store::new(env.db(), Origin::Cli);
    let consumer = orderpipe::subscriptions::model::NewConsumer {
        name: "sms".into(),
        url: "http://sms/x".into(),
        ..Default::default()
    };
    store.add_consumer(&consumer).await.unwrap();
    let filters: Vec<FilterSpec> = serde_json::from_value(json!([
        {"field": "status", "op": "changed", "from": 1, "to": 2},
        {"field": "city", "op": "in", "values": ["Hangzhou", "北京"]},
        {"field": "deleted_at", "op": "eq", "value": null}
    ]))
    .unwrap();
    let new = orderpipe::subscriptions::model::NewSubscription {
        event: "order_db.table_user.update".into(),
        consumer: "sms".into(),
        bind_key: "user".into(),
        filters: filters.clone(),
        ..Default::default()
    };
    let added = store
        .add_subscription(&new, "order.events.v1")
        .await
        .unwrap();
    let back: Vec<FilterSpec> = added.filters.iter().map(FilterSpec::from).collect();
    assert_eq!(
        back, filters,
        "stored and read back as written (null, unicode, lists)"
    );
    let binding = &store.desired(None).await.unwrap()[0];
    let row = |status: i64, city: &str| json!({"id": 1, "status": status, "city": city, "deleted_at": null});
    let key = "order_db.table_user.update";
    assert_eq!(
        binding.decide(key, &row(2, "北京"), &json!({"status": 1})),
        Decision::Deliver {
            subscriptions: vec![added.id]
        }
    );
    assert_eq!(
        binding.decide(key, &row(3, "北京"), &json!({"status": 1})),
        Decision::Filtered,
        "1 -> 3"
    );
    assert_eq!(
        binding.decide(key, &row(2, "北京"), &json!({"status": 0})),
        Decision::Filtered,
        "0 -> 2"
    );
    assert_eq!(
        binding.decide(key, &row(2, "Shanghai"), &json!({"status": 1})),
        Decision::Filtered,
        "city not in the list"
    );
    assert_eq!(
        binding.decide(key, &row(2, "北京"), &json!({"name": "x"})),
        Decision::Filtered,
        "status unchanged"
    );
    assert_eq!(
        binding.decide("order_db.table_user.insert", &row(2, "北京"), &Value::Null),
        Decision::NotSubscribed
    );
}
