//! The console's history charts (`/history`) against the real stack: from
//! a real Prometheus scraping a real member (the points equal what
//! Prometheus's own `query_range` answers for the same query and range),
//! and from the console's own samples (the lag equals what the broker
//! says through `orderpipe lag`); screenshots at desktop and phone width.

use std::time::{Duration, Instant};

use orderpipe::console::Role;
use serde_json::Value;

use crate::console_browser::{Browser, TestConsole};
use crate::consumer::{count_rows, member_with_health, produce_lifecycles, sigterm};
use crate::group_pause::{lag, wait_until};
use crate::helpers::{TestEnv, http_get};
use crate::observability::Prometheus;

/// `GET /history?...&format=json` as a viewer.
async fn history_json(console: &TestConsole, query: &str) -> Value {
    let (status, body) = console
        .get_as(Role::Viewer, &format!("/history?{query}&format=json"))
        .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The points of `group` in the chart `metric` of a `/history` answer.
fn points(history: &Value, metric: &str, group: &str) -> Vec<(i64, f64)> {
    let chart = history["charts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metric"] == metric)
        .unwrap_or_else(|| panic!("no {metric} chart: {history}"));
    chart["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["group"] == group)
        .map(|s| serde_json::from_value(s["points"].clone()).unwrap())
        .unwrap_or_default()
}

/// Prometheus's own answer to `query_range` of `promql` over the range of
/// a `/history` answer: `group`'s points in ms, as the console gives them.
fn prometheus_range(
    prometheus: &Prometheus,
    promql: &str,
    range: &Value,
    group: &str,
) -> Vec<(i64, f64)> {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("query", promql)
        .append_pair("start", &range["start_secs"].to_string())
        .append_pair("end", &range["end_secs"].to_string())
        .append_pair("step", &range["step_secs"].to_string())
        .finish();
    let (status, body) = http_get(&prometheus.url, &format!("/api/v1/query_range?{query}"));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    answer["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["metric"]["group"] == group)
        .flat_map(|r| r["values"].as_array().unwrap().clone())
        .filter_map(|p| {
            let value: f64 = p[1].as_str()?.parse().ok()?;
            value
                .is_finite()
                .then_some(((p[0].as_f64()? * 1000.0) as i64, value))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn charts_from_prometheus_show_what_prometheus_answers_and_are_readable_at_both_widths() {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.group", env.prefix);
    env.cli(&["topics", "ensure", "--group", &group]).success();
    let db = env.db();
    let (mut member, addr) = member_with_health(&env, &group);
    let prometheus = Prometheus::start(std::slice::from_ref(&addr));
    // Two batches, so the applied counter rises while Prometheus scrapes it.
    produce_lifecycles(&env, 100, 20, 91);
    prometheus
        .expect(
            &format!("sum(orderpipe_applied_records_total{{group=\"{group}\"}})"),
            100.0,
        )
        .await;
    env.cli(&[
        "produce",
        "--count",
        "100",
        "--orders",
        "20",
        "--seed",
        "92",
        "--first-order-id",
        "1001",
    ])
    .success();
    prometheus
        .expect(
            &format!("sum(orderpipe_applied_records_total{{group=\"{group}\"}})"),
            200.0,
        )
        .await;
    assert_eq!(count_rows(&db, &group).await, 200);

    let prometheus_url = format!("http://{}", prometheus.url);
    let console =
        TestConsole::start(&env, |s| s.console.prometheus_url = Some(prometheus_url)).await;
    // The applied rate shows once a step's point falls after the second
    // batch, the lag once the member has exported it.
    let deadline = Instant::now() + Duration::from_secs(90);
    let history = loop {
        let history = history_json(&console, &format!("group={group}")).await;
        let applied = points(&history, "applied", &group);
        if applied.iter().any(|p| p.1 > 0.0) && !points(&history, "lag", &group).is_empty() {
            break history;
        }
        assert!(
            Instant::now() < deadline,
            "no applied rate above 0, or no lag: {history}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        history["source"]
            .as_str()
            .unwrap()
            .starts_with("Prometheus at"),
        "{history}"
    );
    // Every chart's points are Prometheus's own for its query and range (a
    // scrape landing between the two reads moves the last point: read again).
    for chart in history["charts"].as_array().unwrap() {
        let metric = chart["metric"].as_str().unwrap();
        let mut attempts = 0;
        loop {
            let again = history_json(&console, &format!("group={group}")).await;
            let ours = points(&again, metric, &group);
            let theirs = prometheus_range(
                &prometheus,
                chart["query"].as_str().unwrap(),
                &again["range"],
                &group,
            );
            // Equal to the last bits but one: Prometheus sums a group's
            // series in no fixed order, so two evaluations can round apart.
            let same = ours.len() == theirs.len()
                && ours.iter().zip(&theirs).all(|(a, b)| {
                    a.0 == b.0 && (a.1 - b.1).abs() <= 1e-9 * a.1.abs().max(b.1.abs()).max(1.0)
                });
            if same {
                if ["lag", "failure_rate", "dead_letter_inflow"].contains(&metric) {
                    assert!(!ours.is_empty(), "{metric} is charted: {again}");
                }
                break;
            }
            attempts += 1;
            assert!(
                attempts < 5,
                "{metric}: the console charts {ours:?}, Prometheus answers {theirs:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    // The page: five charts, each with its unit and the time zone, the group in the legend.
    let (status, html) = console
        .get_as(Role::Viewer, &format!("/history?group={group}"))
        .await;
    assert_eq!(status, 200, "{html}");
    assert_eq!(html.matches("<svg").count(), 5, "{html}");
    for unit in [
        "(records)",
        "(events/s)",
        "(%)",
        "(dead letters/min)",
        "(keys)",
    ] {
        assert!(html.contains(unit), "no chart in {unit}");
    }
    assert_eq!(html.matches(">UTC</text>").count(), 5);
    // A fresh Prometheus has a point or two per series: dots, or a line.
    assert!(
        html.contains("<polyline") || html.contains("<circle"),
        "nothing drawn"
    );
    assert!(
        html.contains(&format!(">{group}</a>")),
        "the legend names the group"
    );
    let (status, day) = console
        .get_as(Role::Viewer, &format!("/history?group={group}&window=24h"))
        .await;
    assert_eq!(status, 200, "{day}");
    let (status, bad) = console.get_as(Role::Viewer, "/history?window=2h").await;
    assert_eq!(status, 400);
    assert!(bad.contains("window") && bad.contains("1h, 24h"), "{bad}");

    let browser = Browser::start(&console).await;
    browser.login(Role::Viewer).await;
    browser.open(&format!("/history?group={group}")).await;
    browser.screenshots("history").await;
    browser.close().await;
    sigterm(&mut member);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_prometheus_the_console_samples_the_broker_lag_and_keeps_a_day() {
    let env = TestEnv::new().with_database().await;
    let group = format!("{}.group", env.prefix);
    env.cli(&["topics", "ensure", "--group", &group]).success();
    let db = env.db();
    // Applied, then the member stops and 30 more wait: the broker's lag is 30.
    let (mut member, _) = member_with_health(&env, &group);
    produce_lifecycles(&env, 50, 10, 93);
    wait_until(
        "the member applies 50",
        Duration::from_secs(60),
        async || count_rows(&db, &group).await >= 50,
    )
    .await;
    sigterm(&mut member);
    env.cli(&[
        "produce",
        "--count",
        "30",
        "--orders",
        "10",
        "--seed",
        "94",
        "--first-order-id",
        "1001",
    ])
    .success();
    wait_until(
        "the broker says 30 behind",
        Duration::from_secs(60),
        async || lag(&env, &group)["groups"][0]["total_lag"] == 30,
    )
    .await;
    // A sample older than a day, which the sampler deletes.
    let old = orderpipe::clock::now_ms() - 26 * 3_600_000;
    sqlx::query(
        "INSERT INTO console_samples (sampled_ms, consumer_group, lag_records, applied_per_sec, \
         failure_rate_pct, dead_letters_per_min, parked_keys) VALUES (?, ?, 1, 0, NULL, 0, 0)",
    )
    .bind(old)
    .bind(&group)
    .execute(&db.pool)
    .await
    .unwrap();

    let console = TestConsole::start(&env, |s| s.console.sample_interval_secs = 1).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let history = loop {
        let history = history_json(&console, &format!("group={group}")).await;
        let lag = points(&history, "lag", &group);
        if lag.len() >= 2 && lag.iter().all(|p| p.1 == 30.0) {
            break history;
        }
        assert!(
            Instant::now() < deadline,
            "no two samples of lag 30: {history}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        history["source"]
            .as_str()
            .unwrap()
            .starts_with("the console's own samples"),
        "{history}"
    );
    // The member applied 50 within the last minute: the window's rate.
    let applied = points(&history, "applied", &group);
    assert!(applied.iter().any(|p| p.1 > 0.0), "{history}");
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM console_samples WHERE sampled_ms <= ?")
        .bind(old)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "a sample older than a day is deleted");
    let (status, html) = console.get_as(Role::Viewer, "/history").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("console_samples") && html.contains(&group),
        "{html}"
    );
}
