//! Metrics, health and tracing against the real stack: a real Prometheus
//! scrapes the roles; `/health/mq` and `/health/ready` follow lag, polling
//! and the database; every log line of a record carries its trace id.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use rdkafka::Message;
use serde_json::Value;

use crate::consumer::{count_rows, produce_lifecycles, sigterm, write_ndjson};
use crate::group_pause::wait_until;
use crate::helpers::{STACK_SCRIPT, TestEnv, health_addr, http_get, stack, wait_for_status};
use crate::outbox::{drive_orders, start_api};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Prometheus scraping `targets` every second, on a free port.
pub(crate) struct Prometheus {
    child: Child,
    pub(crate) url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub(crate) fn start(targets: &[String]) -> Self {
        Self::start_with_rules(targets, None)
    }

    /// Also evaluates `rules` (a rule file's text) every second.
    fn start_with_rules(targets: &[String], rules: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: orderpipe\n    static_configs:\n      - targets: [{list}]\n"
        );
        if let Some(rules) = rules {
            std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
            config.push_str(&format!(
                "rule_files: ['{}']\n",
                dir.path().join("rules.yml").display()
            ));
        }
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian's prometheus package) starts");
        Self {
            child,
            url: format!("127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// The value of an instant query that returns one sample.
    fn query(&self, promql: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", urlencode(promql));
        let (status, body) = http_get(&self.url, &path);
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Waits until the alert `name` with label `group` is in state `firing`.
    async fn expect_firing(&self, name: &str, group: &str) {
        self.expect_firing_for(name, "group", group).await
    }

    /// Waits until alert `name` with label `label` = `value` fires.
    async fn expect_firing_for(&self, name: &str, label: &str, value: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            let (status, body) = http_get(&self.url, "/api/v1/alerts");
            if status == 200 {
                let v: Value = serde_json::from_str(&body).unwrap();
                let alerts = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
                let state = alerts
                    .iter()
                    .find(|a| a["labels"]["alertname"] == name && a["labels"][label] == value)
                    .map(|a| a["state"].as_str().unwrap_or_default().to_string());
                if state.as_deref() == Some("firing") {
                    return;
                }
                last = format!("{state:?} in {body}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("{name} for {label} {value} never fired; last: {last}");
    }

    /// Waits until `promql` returns `want`.
    pub(crate) async fn expect(&self, promql: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut last = None;
        while Instant::now() < deadline {
            last = self.query(promql);
            if last == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("{promql}: wanted {want}, Prometheus says {last:?}");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_roles_and_sees_lag_dead_letters_and_failures() {
    let mut env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "obs"]).success();
    // Producer side: orders through the API, published by a relay.
    let api = start_api(&env).await;
    drive_orders(&api, 60, 10).await;
    let db = env.db();
    let events = orderpipe::outbox::recorded_events(&db, &env.settings.topics.order_events.name)
        .await
        .unwrap();
    // Consumer side: order 7 fails for good, order 9 twice then heals.
    let permanent = events.iter().filter(|e| e.data.order_id() == 7).count();
    assert!(permanent > 0);
    env.set_env("ORDERPIPE_CHAOS__PERMANENT_ORDERS", "[7]");
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", "[9]");
    env.set_env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "2");
    let (consumer_port, relay_port, persister_port) = (free_port(), free_port(), free_port());
    let at = |p: u16| format!("127.0.0.1:{p}");
    let mut consumer = env.spawn(&[
        "consume",
        "--group",
        "obs",
        "--handler",
        "chaos,notification",
        "--health-addr",
        &at(consumer_port),
    ]);
    let mut relay = env.spawn(&[
        "relay",
        "--instance",
        "obs",
        "--health-addr",
        &at(relay_port),
    ]);
    let mut persister = env.spawn(&["dlq", "persist", "--health-addr", &at(persister_port)]);
    let prometheus = Prometheus::start(&[at(consumer_port), at(relay_port), at(persister_port)]);

    // Wait for everything but order 7's events.
    let want = events.len() as i64 - permanent as i64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while count_rows(&db, "obs").await < want {
        assert!(
            Instant::now() < deadline,
            "the group did not apply its events"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Order 7's first event is dead-lettered and parks the order; its later
    // events are held behind it (per-key ordering), not dead-lettered.
    prometheus
        .expect("max(orderpipe_dead_letters_pending)", 1.0)
        .await;
    prometheus
        .expect(
            r#"sum(orderpipe_dead_lettered_records_total{group="obs"})"#,
            1.0,
        )
        .await;
    prometheus
        .expect(
            r#"sum(orderpipe_processing_failures_total{group="obs",error_class="handler_fatal"})"#,
            1.0,
        )
        .await;
    prometheus
        .expect(r#"orderpipe_parked_keys{group="obs"}"#, 1.0)
        .await;
    prometheus
        .expect(
            r#"orderpipe_held_records{group="obs"}"#,
            permanent as f64 - 1.0,
        )
        .await;
    prometheus
        .expect(
            r#"sum(orderpipe_held_records_total{group="obs"})"#,
            permanent as f64 - 1.0,
        )
        .await;
    prometheus
        .expect(
            r#"orderpipe_parked_key_oldest_age_seconds{group="obs"} > bool 0"#,
            1.0,
        )
        .await;
    let transient = events.iter().filter(|e| e.data.order_id() == 9).count() as f64;
    prometheus.expect(r#"sum(orderpipe_processing_failures_total{group="obs",error_class="handler_retryable"})"#, transient).await;
    // Lag is measured per partition of the topic (and the retry topic) and is 0 once caught up.
    prometheus
        .expect(
            r#"count(orderpipe_consumer_lag_records{group="obs",topic!~".*retry.*"})"#,
            12.0,
        )
        .await;
    prometheus
        .expect(r#"sum(orderpipe_consumer_lag_records{group="obs"})"#, 0.0)
        .await;
    prometheus
        .expect(
            r#"sum(orderpipe_relay_transactions_total{outcome="committed"}) > bool 0"#,
            1.0,
        )
        .await;
    // Every committed relay transaction has its commit time observed.
    prometheus
        .expect(
            r#"sum(orderpipe_relay_commit_duration_seconds_count) == bool sum(orderpipe_relay_transactions_total{outcome="committed"})"#,
            1.0,
        )
        .await;
    prometheus
        .expect("max(orderpipe_outbox_backlog_rows)", 0.0)
        .await;
    // The relay counts every event it published to the order topic, once.
    let published = format!(
        r#"sum(orderpipe_produced_records_total{{topic="{}"}})"#,
        env.settings.topics.order_events.name
    );
    prometheus.expect(&published, events.len() as f64).await;
    for child in [&mut consumer, &mut relay, &mut persister] {
        sigterm(child);
    }
}

/// A caught-up member measures its lag in one round of requests, not one per
/// partition: behind the fetch the broker holds for new data (500 ms), 24
/// partitions measured one by one took 12 s, so the gauges of an idle group
/// were first exported 17 s after the start and a SIGTERM waited for the
/// measurement in flight.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: a measurement against a bound; run by `make test` in the serial phase"]
async fn a_caught_up_member_reports_lag_within_seconds_and_stops_at_once() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "lagq"]).success();
    produce_lifecycles(&env, 200, 20, 9);
    let mut consumer = env.spawn(&[
        "consume",
        "--group",
        "lagq",
        "--handler",
        "notification",
        "--health-addr",
        "127.0.0.1:0",
    ]);
    let health = health_addr(&mut consumer);
    let started = Instant::now();
    // Every assigned partition's series (the topic's and the retry topic's),
    // each 0 once the 200 events are applied.
    let series = |body: &str| -> Vec<f64> {
        body.lines()
            .filter(|l| l.starts_with(r#"orderpipe_consumer_lag_records{group="lagq""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let mut lags = Vec::new();
    wait_until(
        "a caught-up lag on /metrics within 11 s of the start (one measurement every 5 s)",
        Duration::from_secs(11).saturating_sub(started.elapsed()),
        async || {
            lags = series(&http_get(&health, "/metrics").1);
            !lags.is_empty() && lags.iter().all(|l| *l == 0.0)
        },
    )
    .await;
    let partitions = lags.len();
    assert!(
        partitions >= 2,
        "one series per assigned partition: {partitions}"
    );

    // Paused, the group applies nothing of 300 new events: its lag per
    // partition is what Kafka's own tool shows (log end minus committed;
    // `orderpipe produce` is not transactional, so the end is the same
    // whatever the isolation level).
    env.cli(&["group", "pause", "lagq"]).success();
    wait_for_status(
        &health,
        "/health/mq",
        200,
        "\"paused\":true",
        Duration::from_secs(30),
    );
    produce_lifecycles(&env, 300, 30, 10);
    let topic = env.settings.topics.order_events.name.clone();
    let ours = |body: &str| -> BTreeMap<i32, i64> {
        let prefix =
            format!(r#"orderpipe_consumer_lag_records{{group="lagq",topic="{topic}",partition=""#);
        body.lines()
            .filter_map(|l| {
                let (partition, value) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
                Some((partition.parse().ok()?, value.parse::<f64>().ok()? as i64))
            })
            .collect()
    };
    let mut lag = BTreeMap::new();
    wait_until(
        "the paused group's lag reaches 300",
        Duration::from_secs(60),
        async || {
            lag = ours(&http_get(&health, "/metrics").1);
            lag.values().sum::<i64>() == 300
        },
    )
    .await;
    let described = Command::new(STACK_SCRIPT)
        .args([
            "kafka-class",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            &env.settings.kafka.bootstrap_servers,
            "--describe",
            "--group",
            "lagq",
        ])
        .output()
        .expect("dev/stack.sh kafka-class runs");
    let text = String::from_utf8_lossy(&described.stdout);
    // GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
    let kafkas: BTreeMap<i32, i64> = text
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.get(1) == Some(&topic.as_str()))
                .then(|| Some((cols.get(2)?.parse().ok()?, cols.get(5)?.parse().ok()?)))
                .flatten()
        })
        .collect();
    assert_eq!(
        lag,
        kafkas,
        "orderpipe's lag per partition against kafka-consumer-groups --describe:\n{text}{}",
        String::from_utf8_lossy(&described.stderr)
    );

    let asked = Instant::now();
    let status = sigterm(&mut consumer);
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(5),
        "a caught-up member took {took:?} to stop after SIGTERM"
    );
}

/// `/health/mq` follows lag and polling, `/health/ready` the database.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: stops the shared MariaDB; run by `make test` in the serial phase"]
async fn health_mq_and_ready_follow_lag_polling_and_the_database() {
    let mut env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "mq"]).success();
    env.set_env("ORDERPIPE_CONSUMER__LAG_THRESHOLD", "2000");
    env.set_env("ORDERPIPE_CONSUMER__MAX_POLL_GAP_SECS", "5");
    let mut consumer = env.spawn(&[
        "consume",
        "--group",
        "mq",
        "--handler",
        "notification",
        "--health-addr",
        "127.0.0.1:0",
    ]);
    let health = crate::helpers::health_addr(&mut consumer);
    let status = |path: &'static str| http_get(&health, path);
    let wait = |path: &'static str, want: u16, why: &'static str| {
        let health = health.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let (s, body) = http_get(&health, path);
                if s == want {
                    return body;
                }
                assert!(
                    Instant::now() < deadline,
                    "{path} never answered {want} ({why}); last: {s} {body}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    produce_lifecycles(&env, 1_000, 100, 5);
    wait("/health/ready", 200, "consumer up").await;
    wait("/health/mq", 200, "caught up").await;

    stack(&["stop", "mariadb"]);
    let down = wait("/health/ready", 503, "database stopped").await;
    assert!(down.contains("database unavailable"), "{down}");
    env.cli(&[
        "produce",
        "--count",
        "30000",
        "--orders",
        "1000",
        "--seed",
        "6",
        "--first-order-id",
        "100000",
    ])
    .success();
    let unhealthy = wait("/health/mq", 503, "lag past 2000 or polling stopped").await;
    assert!(
        unhealthy.contains("lag") || unhealthy.contains("polled"),
        "{unhealthy}"
    );
    // The lag measurement (every 5 s) catches up with the 30,000 new records.
    let deadline = Instant::now() + Duration::from_secs(60);
    let over = loop {
        let (s, body) = status("/health/mq");
        if s == 503 && body.contains("over the threshold") {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "lag never reported over the threshold: {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("while the database is down: {over}");
    stack(&["start", "mariadb"]);
    wait("/health/ready", 200, "database back").await;
    let healthy = wait("/health/mq", 200, "caught up again").await;
    eprintln!("after: {healthy} / {:?}", status("/health/ready"));
    sigterm(&mut consumer);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_log_line_of_a_record_carries_its_trace_id() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "traced"])
        .success();
    let event: Envelope = LifecycleGenerator::new("checkout", 1, 4242, 8)
        .next()
        .unwrap();
    let file = write_ndjson(std::slice::from_ref(&event));
    env.cli(&["produce", "--file", file.path().to_str().unwrap()])
        .success();
    let mut child = env
        .command(&[
            "--log-format",
            "json",
            "consume",
            "--group",
            "traced",
            "--handler",
            "chaos,notification",
            "--until-idle",
            "3",
        ])
        .env("RUST_LOG", "orderpipe=debug")
        .env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", "[4242]")
        .env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "5")
        .env("ORDERPIPE_RETRY__INITIAL_DELAY_MS", "200")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines: Vec<Value> = std::io::BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    assert!(child.wait().unwrap().success());
    let id = event.event_id.to_string();
    let about: Vec<&Value> = lines
        .iter()
        .filter(|l| l.to_string().contains(&id))
        .collect();
    // The failure, the forward, the failure on the retry topic, the effects, the apply.
    assert!(
        about.len() >= 5,
        "too few log lines about the record: {about:#?}"
    );
    for line in &about {
        assert_eq!(
            line["span"]["trace_id"].as_str(),
            Some(event.trace_id.as_str()),
            "{line}"
        );
    }
    let messages: Vec<&str> = about.iter().filter_map(|l| l["message"].as_str()).collect();
    for needle in [
        "processing failed",
        "record sent to the retry topic",
        "effects written",
        "applied",
    ] {
        assert!(
            messages.contains(&needle),
            "no `{needle}` line: {messages:?}"
        );
    }
}

/// The chart's alert rules as Prometheus loads them: the Helm values filled
/// in (with `values` set, e.g. `alerts.lagThreshold=100`) and every `for:`
/// cut to 5 s.
fn chart_alert_rules(values: &[&str]) -> String {
    // The chart's own render (helm, installed by dev/chart-test.sh, which
    // `make test` runs first), so every template construct in alerts.yaml
    // is what a cluster gets.
    let root = env!("CARGO_MANIFEST_DIR");
    let helm = format!("{root}/.stack/bin/helm");
    let out = Command::new(&helm)
        .args([
            "template",
            "t",
            &format!("{root}/helm/orderpipe"),
            "--kube-version",
            "1.30.0",
            "--show-only",
            "templates/monitoring.yaml",
        ])
        .args(["--set", "alerts.enabled=true"])
        .args(values.iter().flat_map(|v| ["--set", v]))
        .output()
        .unwrap_or_else(|e| panic!("{helm}: {e} (dev/chart-test.sh installs it)"));
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    // The PrometheusRule's spec, dedented: a Prometheus rules file.
    let (_, spec) = rendered
        .split_once("\nspec:\n")
        .expect("a PrometheusRule with a spec");
    let rules: String = spec
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    rules
        .replace("for: 5m", "for: 5s")
        .replace("for: 1m", "for: 5s")
}

/// A DLQ persister exporting `group`'s broker-side lag every second, and a
/// Prometheus scraping it with the chart's alert rules (`values` set).
fn persister_watched_by_prometheus(
    env: &mut TestEnv,
    group: &str,
    values: &[&str],
) -> (crate::helpers::Spawned, Prometheus) {
    env.set_env("ORDERPIPE_LAG__GROUPS", &format!("[\"{group}\"]"));
    env.set_env("ORDERPIPE_LAG__EXPORT_INTERVAL_SECS", "1");
    let port = free_port();
    let persister = env.spawn(&[
        "dlq",
        "persist",
        "--health-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    let prometheus = Prometheus::start_with_rules(
        &[format!("127.0.0.1:{port}")],
        Some(&chart_alert_rules(values)),
    );
    (persister, prometheus)
}

/// `count` events of `orders` orders produced and applied by `group` (the
/// notification handler), which then stops: its offsets are committed.
fn caught_up_group(env: &TestEnv, group: &str, count: usize, orders: usize, seed: u64) {
    env.cli(&["topics", "ensure", "--group", group]).success();
    produce_lifecycles(env, count, orders, seed);
    env.cli(&[
        "consume",
        "--group",
        group,
        "--handler",
        "notification",
        "--until-idle",
        "2",
    ])
    .success();
}

/// With every member of a group stopped: `orderpipe lag` shows what is left
/// and how old it is, the DLQ persister exports it, and the chart's lag and
/// absent-consumer alerts fire in a real Prometheus.
#[tokio::test(flavor = "multi_thread")]
async fn lag_and_its_alerts_with_every_member_of_a_group_stopped() {
    let mut env = TestEnv::new().with_database().await;
    let group = "stopped";
    let topic = env.settings.topics.order_events.name.clone();
    caught_up_group(&env, group, 200, 40, 21);
    // Every member is gone; 150 more records arrive.
    env.cli(&[
        "produce",
        "--count",
        "150",
        "--orders",
        "30",
        "--seed",
        "22",
        "--first-order-id",
        "5000",
    ])
    .success();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let out = env
        .cli(&[
            "lag",
            "--group",
            group,
            "--group",
            "never-ran",
            "--output",
            "json",
        ])
        .success();
    let report: Value = serde_json::from_str(&out).unwrap();
    let stopped = &report["groups"][0];
    assert_eq!(stopped["group"], group, "{out}");
    assert_eq!(stopped["status"], "no_members", "{out}");
    assert_eq!(stopped["members"], 0, "{out}");
    assert_eq!(stopped["total_lag"], 150, "{out}");
    let never = &report["groups"][1];
    assert_eq!(
        (never["group"].as_str(), never["status"].as_str()),
        (Some("never-ran"), Some("unknown")),
        "{out}"
    );
    assert_eq!(
        never["partitions"].as_array().map(Vec::len),
        Some(0),
        "{out}"
    );
    // Each partition: lag = log end - committed, and the oldest unconsumed
    // record is the one at the committed offset, read back independently.
    let records = env.read(&topic, 350, Duration::from_secs(30));
    let main: Vec<&Value> = stopped["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["topic"] == topic.as_str())
        .collect();
    assert_eq!(main.len(), 12, "{out}");
    for p in main {
        let committed = p["committed_offset"].as_i64().unwrap_or(0);
        let lag = p["lag"].as_i64().unwrap();
        assert_eq!(
            lag,
            p["log_end_offset"].as_i64().unwrap() - committed,
            "{p}"
        );
        if lag == 0 {
            assert!(p["oldest_unconsumed_age_seconds"].is_null(), "{p}");
            continue;
        }
        let partition = p["partition"].as_i64().unwrap() as i32;
        let oldest = records
            .iter()
            .find(|r| r.partition() == partition && r.offset() == committed)
            .expect("the record at the committed offset");
        assert_eq!(
            p["oldest_unconsumed_timestamp_ms"].as_i64(),
            oldest.timestamp().to_millis(),
            "{p}"
        );
        assert!(
            p["oldest_unconsumed_age_seconds"].as_f64().unwrap() >= 1.0,
            "{p}"
        );
    }
    let table = env.cli(&["lag", "--group", group]).success();
    assert!(
        table.contains("NO MEMBERS") && table.contains("150"),
        "{table}"
    );

    // The persister exports the group's broker-side lag; Prometheus fires both alerts.
    let (mut persister, prometheus) =
        persister_watched_by_prometheus(&mut env, group, &["alerts.lagThreshold=100"]);
    prometheus
        .expect(
            &format!(r#"sum(orderpipe_group_lag_records{{group="{group}"}})"#),
            150.0,
        )
        .await;
    prometheus
        .expect(
            &format!(r#"orderpipe_group_members{{group="{group}"}}"#),
            0.0,
        )
        .await;
    prometheus
        .expect(
            &format!(
                r#"max(orderpipe_group_oldest_unconsumed_age_seconds{{group="{group}"}}) > bool 1"#
            ),
            1.0,
        )
        .await;
    prometheus
        .expect_firing("OrderpipeConsumerLagHigh", group)
        .await;
    prometheus
        .expect_firing("OrderpipeConsumerGroupAbsent", group)
        .await;
    sigterm(&mut persister);
}

/// The `orderpipe_consumer_lag_records` series a member's /metrics shows (their labels).
fn lag_series(addr: &str) -> BTreeSet<String> {
    let (_, body) = http_get(addr, "/metrics");
    body.lines()
        .filter_map(|l| l.strip_prefix("orderpipe_consumer_lag_records{"))
        .filter_map(|l| l.split_once('}').map(|(labels, _)| labels.to_string()))
        .collect()
}

/// Waits until `done` holds for the lag series of the two members.
async fn wait_for_series(what: &str, addrs: &[&str], done: impl Fn(&[BTreeSet<String>]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let series: Vec<BTreeSet<String>> = addrs.iter().map(|a| lag_series(a)).collect();
        if done(&series) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {series:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A member's per-partition lag series are the partitions it owns now:
/// after a rebalance, the revoked ones are gone from its /metrics.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_partition_loses_its_lag_series() {
    let env = TestEnv::new().with_database().await;
    let started = Instant::now();
    let group = "handover";
    env.cli(&["topics", "ensure", "--group", group]).success();
    produce_lifecycles(&env, 100, 20, 23);
    let consume = [
        "consume",
        "--group",
        group,
        "--handler",
        "notification",
        "--health-addr",
        "127.0.0.1:0",
    ];
    let mut first = env.spawn(&consume);
    let first_addr = health_addr(&mut first);
    // The topic's and the retry topic's 12 partitions each.
    wait_for_series(
        "the only member shows every partition",
        &[&first_addr],
        |s| s[0].len() == 24,
    )
    .await;
    eprintln!("one member, 24 series: {:?}", started.elapsed());

    let mut second = env.spawn(&consume);
    let second_addr = health_addr(&mut second);
    wait_for_series(
        "after the rebalance each member shows only its own partitions",
        &[&first_addr, &second_addr],
        |s| {
            !s[0].is_empty()
                && !s[1].is_empty()
                && s[0].len() + s[1].len() == 24
                && s[0].is_disjoint(&s[1])
        },
    )
    .await;
    eprintln!("two members, disjoint series: {:?}", started.elapsed());

    sigterm(&mut second);
    eprintln!("second member stopped: {:?}", started.elapsed());
    wait_for_series(
        "the remaining member owns every partition again",
        &[&first_addr],
        |s| s[0].len() == 24,
    )
    .await;
    eprintln!("one member again, 24 series: {:?}", started.elapsed());
    sigterm(&mut first);
}

/// On a transactional topic a caught-up group's committed offset stops at
/// the last commit marker, one short of the log end: `orderpipe lag` reads
/// past the marker, finds nothing to consume and reports 0.
#[tokio::test(flavor = "multi_thread")]
async fn lag_is_zero_for_a_caught_up_group_past_transaction_markers() {
    let env = TestEnv::new().with_database().await;
    let group = "caught-up";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let api = start_api(&env).await;
    drive_orders(&api, 20, 5).await;
    env.cli(&["relay", "--instance", "lag-txn", "--until-idle", "3"])
        .success();
    env.cli(&[
        "consume",
        "--group",
        group,
        "--handler",
        "notification",
        "--until-idle",
        "2",
    ])
    .success();
    let out = env
        .cli(&["lag", "--group", group, "--output", "json"])
        .success();
    let report: Value = serde_json::from_str(&out).unwrap();
    let caught_up = &report["groups"][0];
    assert_eq!(caught_up["total_lag"], 0, "{out}");
    let behind_a_marker = caught_up["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["committed_offset"]
                .as_i64()
                .is_some_and(|c| p["log_end_offset"].as_i64().unwrap() > c)
        })
        .count();
    assert!(
        behind_a_marker > 0,
        "no committed offset stops before a marker, nothing was tested: {out}"
    );
    // Without --group and lag.groups: the groups the broker lists with offsets on this topic.
    let out = env.cli(&["lag", "--output", "json"]).success();
    let listed: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["group"].as_str())
        .collect();
    assert_eq!(names, [group], "{out}");
}

/// `orderpipe lag --group G --output json`, the partition `partition` of `topic`.
fn lag_partition(env: &TestEnv, group: &str, topic: &str, partition: i64) -> Value {
    let out = env
        .cli(&["lag", "--group", group, "--output", "json"])
        .success();
    let report: Value = serde_json::from_str(&out).unwrap();
    report["groups"][0]["partitions"]
        .as_array()
        .and_then(|ps| {
            ps.iter()
                .find(|p| p["topic"] == topic && p["partition"] == partition)
                .cloned()
        })
        .unwrap_or_else(|| panic!("partition {partition} of {topic} in {out}"))
}

/// A producer that opened a transaction and stopped (neither commits nor
/// aborts) holds its partition's last stable offset: `orderpipe lag` shows
/// the high watermark above it, the stable offset at the open record's own
/// offset (as the broker acknowledged it to the producer), and how long it
/// has been open, with the producer's `transactional.id` (there and in the
/// console's overview); aborting it ends all three.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_left_open_shows_in_lag_with_its_age_until_it_is_aborted() {
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
    let env = TestEnv::new().with_database().await;
    let group = "txn-watch";
    let topic = env.settings.topics.order_events.name.clone();
    caught_up_group(&env, group, 60, 12, 31);

    let producer: FutureProducer =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .set("transactional.id", format!("{}-hanging", env.prefix))
            .set("transaction.timeout.ms", "300000")
            .create()
            .unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    let (partition, offset) = producer
        .send(
            FutureRecord::to(&topic)
                .partition(3)
                .key("7")
                .payload("open"),
            Duration::from_secs(10),
        )
        .await
        .map(|delivery| (delivery.partition as i64, delivery.offset))
        .unwrap_or_else(|(e, _)| panic!("{e}"));
    let opened = Instant::now();
    // The producer stops here: nothing commits or aborts its transaction.
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = loop {
        let p = lag_partition(&env, group, &topic, partition);
        if p["open_transaction_age_seconds"]
            .as_f64()
            .is_some_and(|age| age >= 2.0)
        {
            break p;
        }
        assert!(Instant::now() < deadline, "no open transaction shown: {p}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        held["log_end_offset"], offset,
        "the stable offset stops at the open record: {held}"
    );
    assert_eq!(held["high_watermark"], offset + 1, "{held}");
    let age = held["open_transaction_age_seconds"].as_f64().unwrap();
    assert!(age <= opened.elapsed().as_secs_f64() + 1.0, "{held}");
    // The brokers' transaction coordinator names the producer holding it.
    let transactional_id = format!("{}-hanging", env.prefix);
    assert_eq!(
        held["open_transactional_id"],
        transactional_id.as_str(),
        "{held}"
    );
    let console = crate::console_browser::TestConsole::start(&env, |s| {
        s.lag.groups = vec![group.to_string()];
    })
    .await;
    let shown = format!(
        "(high watermark {}, transactional.id {transactional_id})",
        offset + 1
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, page) = console.get_as(orderpipe::console::Role::Viewer, "/").await;
        if status == 200 && page.contains(&shown) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the overview does not show {shown}: {page}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(console);
    // The persister exports it; the chart's alert fires in a real Prometheus.
    let mut env = env;
    let (mut persister, prometheus) = persister_watched_by_prometheus(
        &mut env,
        group,
        &["alerts.openTransactionMaxAgeSeconds=3"],
    );
    prometheus
        .expect_firing_for(
            "OrderpipeTransactionHangs",
            "partition",
            &partition.to_string(),
        )
        .await;
    sigterm(&mut persister);
    let table = env.cli(&["lag", "--group", group]).success();
    assert!(
        table.contains("open transaction") && table.contains(&shown),
        "{table}"
    );

    producer.abort_transaction(Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = lag_partition(&env, group, &topic, partition);
        if p["open_transaction_age_seconds"].is_null() && p["high_watermark"] == p["log_end_offset"]
        {
            // The abort marker takes an offset: the stable offset moves past both.
            assert_eq!(p["log_end_offset"], offset + 2, "{p}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the aborted transaction still shows: {p}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
