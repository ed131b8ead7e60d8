//! `orderpipe console`: the security gate of every action route (viewer,
//! CSRF token, read-only), sign-in, the proxy header, the audit trail, the
//! error page, the metrics, and the overview in a real browser (with the
//! screenshots of its pages).

use std::time::Duration;

use fantoccini::Locator;
use orderpipe::console::{self, Principal, Role, audit};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::console_browser::{Browser, TestConsole, meta_csrf};
use crate::helpers::TestEnv;

/// Every action route, plus a path no page registers: the gate runs before
/// routing, so even a route added without thought is guarded.
fn guarded_paths() -> Vec<&'static str> {
    let mut paths = console::action_paths();
    paths.push("/no-such-action");
    paths
}

#[tokio::test]
async fn every_action_route_refuses_a_viewer_a_missing_or_foreign_csrf_token_and_a_read_only_console()
 {
    let env = TestEnv::new().with_database().await;
    let console = TestConsole::start(&env, |_| {}).await;
    let viewer_csrf = console.csrf_of(Role::Viewer).await;
    let operator_csrf = console.csrf_of(Role::Operator).await;
    assert_ne!(viewer_csrf, operator_csrf);

    for path in guarded_paths() {
        let (status, body) = console
            .post_as(Role::Viewer, path, Some(&viewer_csrf), &[])
            .await;
        assert_eq!(status, 403, "viewer POST {path}: {body}");
        assert!(
            body.contains("only an operator may change state"),
            "{path}: {body}"
        );

        let (status, body) = console.post_as(Role::Operator, path, None, &[]).await;
        assert_eq!(
            status, 403,
            "operator POST {path} without a CSRF token: {body}"
        );
        assert!(body.contains("no CSRF token"), "{path}: {body}");

        let (status, body) = console
            .post_as(Role::Operator, path, Some(&viewer_csrf), &[])
            .await;
        assert_eq!(
            status, 403,
            "operator POST {path} with the viewer's CSRF token: {body}"
        );
        assert!(body.contains("CSRF token is not yours"), "{path}: {body}");
    }
    // With its own token the operator passes the gate: the route is there
    // (405 would mean no POST route, 404 on the probe means unrouted).
    for path in console::action_paths() {
        let (status, body) = console
            .post_as(Role::Operator, path, Some(&operator_csrf), &[])
            .await;
        assert!(
            ![401, 403, 405].contains(&status),
            "operator POST {path} with its token: {status} {body}"
        );
    }
    let (status, _) = console
        .post_as(Role::Operator, "/no-such-action", Some(&operator_csrf), &[])
        .await;
    assert_eq!(status, 404);

    // Signing out is a state change too: it needs the token, not the role.
    assert_eq!(
        console.post_as(Role::Viewer, "/logout", None, &[]).await.0,
        403
    );
    assert_eq!(
        console
            .post_as(Role::Viewer, "/logout", Some(&viewer_csrf), &[])
            .await
            .0,
        303
    );

    let read_only = TestConsole::start(&env, |s| s.console.read_only = true).await;
    let operator_csrf = read_only.csrf_of(Role::Operator).await;
    for path in guarded_paths() {
        let (status, body) = read_only
            .post_as(Role::Operator, path, Some(&operator_csrf), &[])
            .await;
        assert_eq!(
            status, 403,
            "read-only console, operator POST {path}: {body}"
        );
        assert!(body.contains("read-only"), "{path}: {body}");
    }
    let (_, page) = read_only.get_as(Role::Operator, "/").await;
    assert!(page.contains("read-only console"), "{page}");
}

#[tokio::test]
async fn sign_in_bad_input_errors_and_the_audit_trail() {
    let env = TestEnv::new().with_database().await;
    let console = TestConsole::start(&env, |_| {}).await;
    let http = TestConsole::http();

    // Nobody signed in: to the login form, and back to the page after it.
    let response = http
        .get(format!("{}/audit?limit=5", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(
        response.headers()["location"],
        "/login?next=%2Faudit%3Flimit%3D5"
    );

    // A wrong token is refused on the form; the right one sets a session cookie.
    let login = |token: &str| {
        http.post(format!("{}/login", console.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}&next=%2Faudit"))
            .send()
    };
    let refused = login("not-a-console-token-at-all").await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("token: not a console token")
    );
    let signed_in = login(crate::console_browser::OPERATOR_TOKEN).await.unwrap();
    assert_eq!(signed_in.status(), 303);
    assert_eq!(signed_in.headers()["location"], "/audit");
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(crate::console_browser::OPERATOR_TOKEN),
        "the cookie never holds the token"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let page = http
        .get(format!("{}/audit", console.url))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("operator-token (operator)"), "{page}");
    assert!(
        !page.contains(crate::console_browser::OPERATOR_TOKEN)
            && !page.contains(crate::console_browser::VIEWER_TOKEN)
    );

    // A bad value is a 400 page naming the field and what it accepts; an unknown page a 404.
    let (status, body) = console.get_as(Role::Viewer, "/audit?limit=lots").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("<strong>limit</strong>: `lots` is not a whole number from 1 to 5000"),
        "{body}"
    );
    assert_eq!(console.get_as(Role::Viewer, "/no/such/page").await.0, 404);

    // An audit row is written and shown, filtered by action.
    let alice = Principal {
        who: "alice".into(),
        role: Role::Operator,
    };
    let filter = serde_json::json!({"group": "g1", "class": "handler_fatal"});
    audit::record(
        console.state.db(),
        &alice,
        "test.replay",
        &filter,
        1000,
        "ok",
    )
    .await
    .unwrap();
    audit::record(
        console.state.db(),
        &alice,
        "test.other",
        &serde_json::json!({}),
        1,
        "ok",
    )
    .await
    .unwrap();
    let rows = audit::recent(console.state.db(), Some("test.replay"), 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].who.as_str(),
            rows[0].role.as_str(),
            rows[0].item_count
        ),
        ("alice", "operator", 1000)
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&rows[0].target).unwrap(),
        filter
    );
    let (_, page) = console
        .get_as(Role::Viewer, "/audit?action=test.replay")
        .await;
    assert!(
        page.contains("test.replay") && page.contains("alice") && !page.contains("test.other"),
        "{page}"
    );

    // Console metrics: requests by page and status, answer time, actions.
    let metrics = http
        .get(format!("{}/metrics", console.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        r#"orderpipe_console_requests_total{page="audit",method="GET",status="400"}"#,
        r#"orderpipe_console_render_seconds_bucket{page="audit""#,
        r#"orderpipe_console_actions_total{action="test.replay"}"#,
    ] {
        assert!(metrics.contains(needle), "{needle} missing from /metrics");
    }
}

/// Pause and resume from a group's card: confirmed by the group's name,
/// a reason required, written to `group_pauses` (what every member follows)
/// and to the audit log, and shown on the card.
#[tokio::test]
async fn an_operator_pauses_and_resumes_a_group_from_its_card_confirmed_and_audited() {
    use orderpipe::consumer::group_pause;
    let env = TestEnv::new().with_database().await;
    let console = TestConsole::start(&env, |_| {}).await;
    let csrf = console.csrf_of(Role::Operator).await;
    let db = console.state.db();
    let group = "billing.order.consumer";
    let pause = |confirm: &'static str, reason: &'static str| {
        let csrf = csrf.clone();
        let console = &console;
        async move {
            console
                .post_as(
                    Role::Operator,
                    "/groups/pause",
                    Some(&csrf),
                    &[
                        ("group", group),
                        ("reason", reason),
                        ("for", "1h"),
                        ("confirm", confirm),
                    ],
                )
                .await
        }
    };
    let (status, body) = pause("billing", "ledger fix").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<strong>confirm</strong>"), "{body}");
    let (status, body) = pause("billing.order.consumer", "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<strong>reason</strong>"), "{body}");
    assert!(
        group_pause::active(db, group).await.unwrap().is_none(),
        "refused: nothing paused"
    );

    let (status, body) = pause("billing.order.consumer", "ledger fix").await;
    assert_eq!(status, 303, "{body}");
    let paused = group_pause::active(db, group)
        .await
        .unwrap()
        .expect("paused");
    assert_eq!(
        (paused.paused_by.as_str(), paused.reason.as_str()),
        ("operator-token", "ledger fix")
    );
    let in_an_hour = orderpipe::clock::now_ms() + 3_600_000;
    assert!(
        paused
            .until_ms
            .is_some_and(|u| (in_an_hour - 60_000..=in_an_hour).contains(&u))
    );
    let (_, page) = console.get_as(Role::Viewer, "/").await;
    assert!(
        page.contains("Paused by operator-token") && page.contains("ledger fix"),
        "{page}"
    );
    assert!(
        !page.contains("action=\"/groups/resume\""),
        "a viewer gets no form"
    );
    let (_, page) = console.get_as(Role::Operator, "/").await;
    assert!(page.contains("action=\"/groups/resume\""), "{page}");

    let (status, body) = console
        .post_as(
            Role::Operator,
            "/groups/resume",
            Some(&csrf),
            &[("group", group), ("confirm", group)],
        )
        .await;
    assert_eq!(status, 303, "{body}");
    assert!(group_pause::active(db, group).await.unwrap().is_none());
    let actions: Vec<(String, String)> = audit::recent(db, None, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.action.starts_with("group."))
        .map(|r| (r.action, r.outcome))
        .collect();
    assert_eq!(
        actions,
        [
            ("group.resume".to_string(), "resumed".to_string()),
            ("group.pause".to_string(), "paused".to_string())
        ],
        "newest first"
    );
}

#[tokio::test]
async fn a_proxy_header_names_the_user_only_when_configured() {
    let env = TestEnv::new().with_database().await;
    let proxied = TestConsole::start(&env, |s| {
        s.console.proxy_user_header = Some("X-Forwarded-User".into());
        s.console.proxy_role_header = Some("X-Forwarded-Role".into());
    })
    .await;
    let get = |console: &TestConsole, role: Option<&'static str>| {
        let mut request = TestConsole::http()
            .get(format!("{}/audit", console.url))
            .header("X-Forwarded-User", "alice");
        if let Some(role) = role {
            request = request.header("X-Forwarded-Role", role);
        }
        request.send()
    };
    let viewer = get(&proxied, None).await.unwrap();
    assert_eq!(viewer.status(), 200);
    let page = viewer.text().await.unwrap();
    assert!(page.contains("alice (viewer)"), "{page}");
    let csrf = meta_csrf(&page).unwrap();
    let operator = get(&proxied, Some("operator"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(operator.contains("alice (operator)"), "{operator}");
    assert_eq!(get(&proxied, Some("root")).await.unwrap().status(), 403);
    // The viewer's token does not let alice act as operator.
    let forged = TestConsole::http()
        .post(format!("{}/no-such-action", proxied.url))
        .header("X-Forwarded-User", "alice")
        .header("X-Forwarded-Role", "operator")
        .header("x-csrf-token", csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);

    let plain = TestConsole::start(&env, |_| {}).await;
    let untrusted = get(&plain, Some("operator")).await.unwrap();
    assert_eq!(
        (
            untrusted.status().as_u16(),
            untrusted.headers()["location"].to_str().unwrap()
        ),
        (303, "/login?next=%2Faudit"),
        "an unconfigured header is not trusted"
    );
}

/// `count` records on each of `partitions` partitions of a new `topic`;
/// `group` commits `committed[p]` on partition p and has no member.
async fn topic_with_idle_group(
    env: &TestEnv,
    topic: &str,
    group: &str,
    count: i64,
    committed: &[i64],
) {
    let kafka = env.settings.kafka.client_options();
    let admin: AdminClient<_> = orderpipe::kafka::client::client_config(&kafka)
        .create()
        .unwrap();
    let partitions = committed.len() as i32;
    admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let producer: FutureProducer = orderpipe::kafka::client::client_config(&kafka)
        .create()
        .unwrap();
    for partition in 0..partitions {
        for i in 0..count {
            let payload = format!("record {i}");
            let record = FutureRecord::to(topic)
                .partition(partition)
                .key("k")
                .payload(&payload);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    let consumer: BaseConsumer = orderpipe::kafka::client::client_config(&kafka)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    for (partition, offset) in committed.iter().enumerate() {
        offsets
            .add_partition_offset(topic, partition as i32, Offset::Offset(*offset))
            .unwrap();
    }
    consumer.commit(&offsets, CommitMode::Sync).unwrap();
}

/// Dead letters, a parked key with a held record and recent applied
/// events of `group`, written as the consumer and persister would.
async fn group_rows(env: &TestEnv, group: &str, topic: &str) {
    let db = env.db();
    let now = orderpipe::clock::now_ms();
    for (offset, class) in [
        (0, "handler_fatal"),
        (1, "handler_fatal"),
        (2, "unavailable"),
    ] {
        sqlx::query(
            "INSERT INTO dead_letters (consumer_group, original_topic, original_partition, original_offset, headers, \
             event_name, error_class, error_message, attempts, first_failure_ms, last_failure_ms, dlq_partition, \
             dlq_offset, created_ms, updated_ms, record_key) VALUES (?, ?, 0, ?, '{}', 'order.created', ?, 'boom', 1, ?, ?, 0, ?, ?, ?, 'order-7')",
        )
        .bind(group)
        .bind(topic)
        .bind(offset)
        .bind(class)
        .bind(now)
        .bind(now)
        .bind(offset)
        .bind(now)
        .bind(now)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    // order-7 is parked behind its dead letter (offset 0), one record held behind it.
    sqlx::query(
        "INSERT INTO parked_keys (consumer_group, record_key, kafka_partition, head_origin, head_topic, head_partition, \
         head_offset, head_event_name, state, parked_ms, updated_ms) VALUES (?, 'order-7', 0, ?, ?, 0, 0, 'order.created', 'dead', ?, ?)",
    )
    .bind(group)
    .bind(format!("{topic}/0/0"))
    .bind(topic)
    .bind(now - 150_000)
    .bind(now)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO held_records (consumer_group, record_key, source_topic, source_partition, source_offset, payload, headers, held_ms) \
         VALUES (?, 'order-7', ?, 0, 9, x'00', '{}', ?)",
    )
    .bind(group)
    .bind(topic)
    .bind(now)
    .execute(&db.pool)
    .await
    .unwrap();
    for i in 0..12 {
        sqlx::query(
            "INSERT INTO event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, created_at) \
             VALUES (?, ?, ?, 1, ?, 'order.created', 'k', UTC_TIMESTAMP(3))",
        )
        .bind(crate::helpers::dedup_group(&db, group).await)
        .bind(uuid::Uuid::new_v4().as_bytes().to_vec())
        .bind(topic)
        .bind(i)
        .execute(&db.pool)
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn the_overview_shows_each_groups_figures_with_links_and_a_viewer_sees_no_action_in_the_browser()
 {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.group", env.prefix);
    let topic = env.settings.topics.order_events.name.clone();
    topic_with_idle_group(&env, &topic, &group, 5, &[2, 5]).await;
    group_rows(&env, &group, &topic).await;
    let console = TestConsole::start(&env, |_| {}).await;
    let browser = Browser::start(&console).await;

    browser.open("/").await;
    browser
        .client
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    browser.screenshots("login").await;
    browser.login(Role::Operator).await;
    browser.open("/").await;
    let card = browser.text("section.card").await;
    for figure in [
        group.as_str(),
        "no live member: nobody consumes it",
        "Lag\n3",
        "Applied/s\n0.2",
        "Failure rate\n20.0 %",
        "Dead letters pending\n3",
        "Parked keys\n1",
        "Held records\n1",
        "Oldest parked\n2m 3",
        "handler_fatal: 2",
        "unavailable: 1",
    ] {
        assert!(
            card.contains(figure),
            "`{figure}` missing from the overview card:\n{card}"
        );
    }
    let hrefs = browser
        .client
        .execute("return [...document.querySelectorAll('section.card a')].map(a => a.getAttribute('href'))", vec![])
        .await
        .unwrap()
        .to_string();
    let group_query = url::form_urlencoded::byte_serialize(group.as_bytes()).collect::<String>();
    for href in [
        format!("/dead-letters?group={group_query}&class=handler_fatal&status=pending"),
        format!("/dead-letters?group={group_query}&since=60s"),
        format!("/held?group={group_query}"),
        format!("/topics/{topic}?partition=0&offset=2"),
    ] {
        assert!(hrefs.contains(&href), "no link to {href}: {hrefs}");
        // Each figure leads to a working page, not an error page.
        browser.open(&href).await;
        let title = browser.text("h1").await;
        assert!(
            !title.starts_with(|c: char| c.is_ascii_digit()),
            "{href} answers {title}: {}",
            browser.text("main").await
        );
    }
    browser.open("/").await;
    let refresh = browser
        .client
        .find(Locator::Css("meta[http-equiv='refresh']"))
        .await
        .unwrap();
    assert_eq!(
        refresh.attr("content").await.unwrap().as_deref(),
        Some("10"),
        "the overview refreshes itself"
    );
    browser.screenshots("overview").await;
    console::audit::record(
        console.state.db(),
        &Principal {
            who: "operator-token".into(),
            role: Role::Operator,
        },
        "dlq.replay",
        &serde_json::json!({"group": group, "class": "handler_fatal"}),
        2,
        "ok",
    )
    .await
    .unwrap();
    browser.open("/audit").await;
    browser.screenshots("audit").await;

    // The pages with actions on this group's rows: the operator sees them...
    let (dead_letter_id,): (i64,) = sqlx::query_as("SELECT MIN(id) FROM dead_letters")
        .fetch_one(&env.db().pool)
        .await
        .unwrap();
    let action_pages = [
        format!("/dead-letters/{dead_letter_id}"),
        format!("/held/key?group={group_query}&key=order-7"),
    ];
    for page in &action_pages {
        browser.open(page).await;
        assert!(
            browser.action_forms().await > 0,
            "the operator sees no action on {page}"
        );
    }
    // ... a viewer sees no action form there, nor on any page of the navigation.
    browser.click("form[action='/logout'] button").await;
    browser.login(Role::Viewer).await;
    let nav = console::PAGES
        .iter()
        .filter_map(|p| p.nav)
        .map(|(_, path)| path.to_string());
    for page in nav.chain(action_pages) {
        browser.open(&page).await;
        assert_eq!(
            browser.action_forms().await,
            0,
            "a viewer sees an action form on {page}"
        );
        // Accessible forms: every visible field has a label (or an aria-label).
        let unlabelled = browser
            .client
            .execute(
                "return [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]\
                 .filter(e => !e.getAttribute('aria-label') && !(e.id && document.querySelector(`label[for=\"${e.id}\"]`)) && !e.closest('label'))\
                 .map(e => e.outerHTML)",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            unlabelled,
            serde_json::json!([]),
            "fields without a label on {page}"
        );
    }
    browser.close().await;
}

#[tokio::test]
async fn the_command_refuses_to_start_without_a_sign_in_and_serves_read_only_with_one() {
    let mut env = TestEnv::new().with_database().await;
    let refused = env.cli(&["console", "--listen", "127.0.0.1:0"]).failure();
    assert!(
        refused.contains("the console needs a way to sign in")
            && refused.contains("ORDERPIPE_CONSOLE__VIEWER_TOKEN"),
        "{refused}"
    );
    env.set_env("ORDERPIPE_CONSOLE__VIEWER_TOKEN", "short");
    let refused = env.cli(&["console"]).failure();
    assert!(
        refused.contains("console.viewer_token: shorter than 16 characters")
            && !refused.contains("short\n"),
        "{refused}"
    );

    env.set_env(
        "ORDERPIPE_CONSOLE__VIEWER_TOKEN",
        crate::console_browser::VIEWER_TOKEN,
    );
    env.set_env(
        "ORDERPIPE_CONSOLE__OPERATOR_TOKEN",
        crate::console_browser::OPERATOR_TOKEN,
    );
    let mut child = crate::helpers::Spawned(
        env.command(&["console", "--listen", "127.0.0.1:0", "--read-only"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let announced = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the console announces its address");
    let url = announced
        .strip_prefix("console listening on ")
        .unwrap_or_else(|| panic!("{announced}"));
    let (url, mode) = url.split_once(' ').unwrap_or((url, ""));
    assert_eq!(mode, "(read-only)");
    let http = TestConsole::http();
    assert_eq!(
        http.get(format!("{url}/health/live"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let page = http
        .get(format!("{url}/"))
        .bearer_auth(crate::console_browser::OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("read-only console"), "{page}");
    let csrf = meta_csrf(&page).unwrap();
    let forged = http
        .post(format!("{url}/no-such-action"))
        .bearer_auth(crate::console_browser::OPERATOR_TOKEN)
        .header("x-csrf-token", csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(
        forged.status(),
        403,
        "--read-only refuses an operator's change"
    );
    // SIGTERM stops it cleanly.
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the console did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}
