//! Record search against the real stack: `orderpipe search` and the
//! console's `/search` find the records of a topic by key, event id, time
//! range and a predicate in the subscriptions' filter language; the
//! matches are exactly the produced events that qualify (the generator
//! that `orderpipe produce` runs is the oracle); a running search is
//! cancelled; the matches export as JSON lines and go to a group's retry
//! topic (operator, audited).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use orderpipe::console::Role;
use orderpipe::envelope::Envelope;
use serde_json::Value;

use crate::console_browser::TestConsole;
use crate::helpers::TestEnv;
use crate::router::produce;

/// `orderpipe search ARGS`: the event ids of the matches, and stderr's last line.
fn cli_search(env: &TestEnv, args: &[&str]) -> (BTreeSet<String>, String) {
    let mut all = vec!["search"];
    all.extend_from_slice(args);
    let run = env.cli(&all);
    let out = run.success();
    let ids = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            v["decoded"]["json"]["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let stderr = run.text();
    let last = stderr.lines().last().unwrap_or_default().to_string();
    (ids, last)
}

/// Event ids of `events` passing `keep`.
fn ids(events: &[Envelope], keep: impl Fn(&Envelope) -> bool) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| keep(e))
        .map(|e| e.event_id.to_string())
        .collect()
}

/// Starts a search with `fields` as a viewer (who may: it reads).
async fn start_search(console: &TestConsole, fields: &[(&str, &str)]) {
    let csrf = console.csrf_of(Role::Viewer).await;
    let (status, body) = console
        .post_as(Role::Viewer, "/search", Some(&csrf), fields)
        .await;
    assert_eq!(status, 303, "a viewer may search: {body}");
}

/// Waits until search `id` of `console` has ended; returns its page.
async fn ended(console: &TestConsole, id: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, page) = console.get_as(Role::Viewer, &format!("/search/{id}")).await;
        assert_eq!(status, 200, "{page}");
        if !page.contains("id=\"cancel\"") {
            return page;
        }
        assert!(Instant::now() < deadline, "search {id} still runs: {page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn records_are_found_by_key_event_id_time_and_predicate_and_a_search_cancels_exports_and_replays()
 {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.group", env.prefix);
    env.cli(&["topics", "ensure", "--group", &group]).success();
    let topic = env.settings.topics.order_events.name.clone();
    let events = produce(&env, 50_000, 5_000, 1, 101);

    // By key: the order's events, and only them.
    let (found, summary) = cli_search(&env, &["--key", "17"]);
    assert_eq!(
        found,
        ids(&events, |e| e.data.order_id() == 17),
        "{summary}"
    );
    assert!(summary.contains("scanned 50000 of 50000"), "{summary}");
    // By event id: that one.
    let one = events[12_345].event_id.to_string();
    let (found, _) = cli_search(&env, &["--event-id", &one]);
    assert_eq!(found, BTreeSet::from([one]));
    // By a predicate on the decoded body: every event of orders 5 and 4242
    // (each carries its order id), with a second condition narrowing it.
    let (found, _) = cli_search(&env, &["--where", "order_id:in:5,4242"]);
    assert_eq!(
        found,
        ids(&events, |e| [5, 4242].contains(&e.data.order_id()))
    );
    assert!(!found.is_empty());
    let (found, _) = cli_search(
        &env,
        &["--where", "order_id:in:5,4242", "--where", "order_id:ne:5"],
    );
    assert_eq!(found, ids(&events, |e| e.data.order_id() == 4242));
    // By time: only what was produced after `since`.
    let since = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let later = produce(&env, 30, 10, 900_001, 102);
    let from = since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (found, summary) = cli_search(&env, &["--from", &from]);
    assert_eq!(found, ids(&later, |_| true), "{summary}");
    let (found, _) = cli_search(&env, &["--to", &from, "--key", "900001"]);
    assert!(
        found.is_empty(),
        "nothing of the later orders before `since`"
    );
    // A bad condition names the flag's field and the accepted forms.
    let bad = env.cli(&["search", "--where", "status:gt:1"]).failure();
    assert!(
        bad.contains("where") && bad.contains("FIELD:eq:VALUE"),
        "{bad}"
    );

    // The console: a viewer searches with a predicate, sees the matches, exports them.
    let console = TestConsole::start(&env, |_| {}).await;
    let csrf = console.csrf_of(Role::Viewer).await;
    start_search(
        &console,
        &[("topic", &topic), ("where", "order_id:in:5,4242")],
    )
    .await;
    let page = ended(&console, 1).await;
    let want = ids(&events, |e| [5, 4242].contains(&e.data.order_id()));
    assert!(page.contains("complete in"), "{page}");
    assert!(page.contains(&format!("{} matches", want.len())), "{page}");
    let (status, lines) = console.get_as(Role::Viewer, "/search/1/export").await;
    assert_eq!(status, 200);
    let exported: BTreeSet<String> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["decoded"]["json"]["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(exported, want);

    // A search over every record, cancelled while it runs: it ends early,
    // says so, and keeps what it had.
    start_search(&console, &[("topic", &topic), ("where", "order_id:eq:-1")]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, page) = console.get_as(Role::Viewer, "/search/2").await;
        if page.contains("id=\"cancel\"") && !page.contains("scanned 0 of") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "search 2 never showed progress: {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = console
        .post_as(Role::Viewer, "/search/cancel", Some(&csrf), &[("id", "2")])
        .await;
    assert_eq!(status, 303);
    let page = ended(&console, 2).await;
    assert!(page.contains("cancelled after"), "{page}");
    assert!(
        !page.contains("scanned 50030 of 50030"),
        "cancelled before the end: {page}"
    );

    // An operator sends search 1's matches to the group's retry topic:
    // each lands there with its key and value, marked as the operator's.
    let operator_csrf = console.csrf_of(Role::Operator).await;
    let (status, body) = console
        .post_as(
            Role::Operator,
            "/search/replay",
            Some(&operator_csrf),
            &[("id", "1"), ("group", &group), ("confirm", &group)],
        )
        .await;
    assert_eq!(status, 303, "{body}");
    let retry = orderpipe::retry::retry_topic(&topic, &group);
    let (found, _) = cli_search(&env, &["--topic", &retry]);
    assert_eq!(found, want, "the retry topic holds the matches");
    let (found, _) = cli_search(&env, &["--topic", &retry, "--key", "4242"]);
    assert_eq!(found, ids(&events, |e| e.data.order_id() == 4242));
    let sent = env.cli(&["search", "--topic", &retry]).success();
    for line in sent.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let headers = record["headers"].as_array().unwrap();
        assert!(
            headers
                .iter()
                .any(|h| h[1] == orderpipe::retry::redrive::CLASS),
            "marked as the operator's: {line}"
        );
    }
    let (_, audit) = console.get_as(Role::Operator, "/audit").await;
    assert!(audit.contains("search.replay"), "{audit}");
}

#[tokio::test(flavor = "multi_thread")]
async fn masked_fields_show_as_dots_until_an_operator_reveals_them_and_each_reveal_is_audited() {
    let mut env = TestEnv::new().with_database().await;
    env.set_env(
        "ORDERPIPE_CONSOLE__MASKED_FIELDS",
        r#"["data.sku", "data.user_id"]"#,
    );
    env.cli(&["topics", "ensure"]).success();
    let topic = env.settings.topics.order_events.name.clone();
    let events = produce(&env, 200, 20, 1, 103);
    let created = events
        .iter()
        .find(|e| e.event_name.as_str() == "order.created")
        .unwrap();
    let data = serde_json::to_value(&created.data).unwrap();
    let sku = data["sku"].as_str().unwrap().to_string();
    let user = data["user_id"].to_string();
    let order = created.data.order_id().to_string();
    let sku_shown = |text: &str| text.contains(&format!("\"{sku}\""));
    // The pages show the envelope as pretty JSON, HTML-escaped.
    let page_masked = |html: &str| {
        html.contains("&#34;sku&#34;: &#34;•••&#34;") && !html.contains(&format!("&#34;{sku}&#34;"))
    };

    // The CLI masks without --reveal, and audits the reveal.
    let masked = env.cli(&["search", "--key", &order]).success();
    assert!(
        masked.contains("\"sku\":\"•••\"") && !sku_shown(&masked),
        "{masked}"
    );
    assert!(!masked.contains(&format!("\"user_id\":{user}")), "{masked}");
    let shown = env.cli(&["search", "--key", &order, "--reveal"]).success();
    assert!(sku_shown(&shown), "{shown}");
    let db = env.db();
    let (cli_reveals,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM console_audit WHERE action = 'reveal' AND role = 'cli'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(cli_reveals, 1);

    // The console: masked for everyone; a viewer may not reveal; an
    // operator's reveal shows the values and writes an audit row.
    let console = TestConsole::start(&env, |s| {
        s.console.masked_fields = vec!["data.sku".into(), "data.user_id".into()];
    })
    .await;
    let page = format!("/topics?order_id={order}&topic={topic}");
    for role in [Role::Viewer, Role::Operator] {
        let (status, html) = console.get_as(role, &page).await;
        assert_eq!(status, 200);
        assert!(page_masked(&html), "{html}");
        assert!(
            html.contains("id=\"masking\""),
            "the page says fields are masked"
        );
    }
    let (status, _) = console
        .get_as(Role::Viewer, &format!("{page}&reveal=1"))
        .await;
    assert_eq!(status, 403, "a viewer may not reveal");
    let (status, html) = console
        .get_as(Role::Operator, &format!("{page}&reveal=1"))
        .await;
    assert_eq!(status, 200);
    assert!(
        html.contains(&format!("&#34;sku&#34;: &#34;{sku}&#34;")),
        "revealed: {html}"
    );
    let (reveals, target): (i64, String) = sqlx::query_as(
        "SELECT COUNT(*), MAX(target) FROM console_audit WHERE action = 'reveal' AND role = 'operator'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(reveals, 1, "one reveal, the operator's");
    assert!(target.contains(&format!("order_id={order}")), "{target}");

    // A search's page and its export are masked the same way.
    start_search(&console, &[("topic", &topic), ("key", &order)]).await;
    let html = ended(&console, 1).await;
    assert!(page_masked(&html), "{html}");
    let (_, lines) = console.get_as(Role::Viewer, "/search/1/export").await;
    assert!(
        lines.contains("\"sku\":\"•••\"") && !sku_shown(&lines),
        "{lines}"
    );
}
