//! How `orderpipe deliver` paces its POSTs, measured at the endpoint:
//! a 429 or 503 with `Retry-After` waits that long (bounded by the retry
//! schedule) and without it the schedule's delay applies; no database
//! transaction is open while a POST waits for its answer (MariaDB's own
//! `information_schema.innodb_trx` says so); and up to
//! `http.subscriptions[].in_flight` records of one partition are in flight
//! at once, never two of one key, each key's records in offset order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Json, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use serde_json::Value;
use tokio::sync::Notify;

use crate::consumer::write_ndjson;
use crate::helpers::TestEnv;

/// What the endpoint saw and how it answers.
#[derive(Default)]
struct Endpoint {
    /// Per path, each request: (request_id, when it arrived).
    arrivals: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// Requests being answered now, and the most ever at once.
    now: AtomicUsize,
    most: AtomicUsize,
    /// `/hold`: a request arrived; the test lets it answer.
    held: Notify,
    release: Notify,
}

impl Endpoint {
    fn arrivals(&self, path: &str) -> Vec<(String, Instant)> {
        self.arrivals
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    fn log(&self, path: &str, body: &Value) -> usize {
        let id = body["request_id"].as_str().unwrap_or_default().to_string();
        let mut arrivals = self.arrivals.lock().unwrap();
        let seen = arrivals.entry(path.to_string()).or_default();
        let before = seen.iter().filter(|(i, _)| *i == id).count();
        seen.push((id, Instant::now()));
        before
    }
}

/// `/throttle/{status}/{retry_after}`: the first request of each event is
/// answered `status` with that `Retry-After` (`none`: without one), later
/// ones 204. `/hold`: answered 204 once the test releases it. `/seq/{ms}`:
/// answered 204 after `ms` (the downstream's own time to answer).
async fn endpoint() -> (String, Arc<Endpoint>) {
    let state = Arc::new(Endpoint::default());
    async fn throttle(
        State(s): State<Arc<Endpoint>>,
        Path((status, after)): Path<(u16, String)>,
        Json(body): Json<Value>,
    ) -> Response {
        if s.log(&format!("throttle/{status}/{after}"), &body) > 0 {
            return StatusCode::NO_CONTENT.into_response();
        }
        let status = StatusCode::from_u16(status).unwrap();
        if after == "none" {
            status.into_response()
        } else {
            (status, [("retry-after", after)]).into_response()
        }
    }
    async fn hold(State(s): State<Arc<Endpoint>>, Json(body): Json<Value>) -> StatusCode {
        s.log("hold", &body);
        s.held.notify_one();
        s.release.notified().await;
        StatusCode::NO_CONTENT
    }
    async fn seq(
        State(s): State<Arc<Endpoint>>,
        Path(ms): Path<u64>,
        Json(body): Json<Value>,
    ) -> StatusCode {
        let now = s.now.fetch_add(1, Ordering::SeqCst) + 1;
        s.most.fetch_max(now, Ordering::SeqCst);
        s.log("seq", &body);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        s.now.fetch_sub(1, Ordering::SeqCst);
        StatusCode::NO_CONTENT
    }
    let app = Router::new()
        .route("/throttle/{status}/{after}", post(throttle))
        .route("/hold", post(hold))
        .route("/seq/{ms}", post(seq))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, state)
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), text).unwrap();
    config
}

/// Produces `events` to the test's order topic.
fn produce(env: &TestEnv, events: &[Envelope]) {
    let ndjson = write_ndjson(events);
    env.cli(&["produce", "--file", ndjson.path().to_str().unwrap()])
        .success();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_or_503_with_retry_after_waits_that_long_and_without_it_the_schedule_applies() {
    let env = TestEnv::new().with_database().await;
    let (base, seen) = endpoint().await;
    // No immediate retries; the schedule's first delay is 500 ms, its longest 10 s.
    let mut text =
        "[retry]\nlocal_retries = 0\ndelays = [\"500ms\", \"10s\"]\njitter = 0.0\n\n".to_string();
    let cases = [
        ("too-many", "throttle/429/2"),
        ("unavailable", "throttle/503/2"),
        ("too-many-no-hint", "throttle/429/none"),
        ("too-many-too-long", "throttle/429/3600"),
    ];
    for (name, path) in cases {
        text += &format!(
            "[[http.subscriptions]]\nname = \"{name}\"\nevents = [\"order.created\"]\nurl = \"{base}/{path}\"\n\n"
        );
    }
    let config = write_config(&text);
    let cfg = config.path().to_str().unwrap();
    env.cli(&["--config", cfg, "topics", "ensure"]).success();
    let events: Vec<Envelope> = LifecycleGenerator::new("checkout", 1, 1, 5)
        .take(1)
        .collect();
    produce(&env, &events);
    // The capped case would wait 10 s: it is checked by its due time, not waited for.
    let runs: Vec<_> = cases[..3]
        .iter()
        .map(|(name, _)| {
            env.command(&[
                "--config",
                cfg,
                "deliver",
                "--subscription",
                name,
                "--until-idle",
                "5",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for child in runs {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let gap = |path: &str| {
        let arrivals = seen.arrivals(path);
        assert_eq!(
            arrivals.len(),
            2,
            "{path}: the first answer, then one retry"
        );
        arrivals[1].1 - arrivals[0].1
    };
    for path in ["throttle/429/2", "throttle/503/2"] {
        let gap = gap(path);
        eprintln!("{path}: retried {gap:?} after the first attempt");
        assert!(
            gap >= Duration::from_millis(1800) && gap <= Duration::from_secs(4),
            "{path}: the retry came {gap:?} after the first attempt, not about 2 s"
        );
    }
    let gap = gap("throttle/429/none");
    eprintln!("throttle/429/none: retried {gap:?} after the first attempt");
    assert!(
        gap >= Duration::from_millis(400) && gap < Duration::from_millis(1800),
        "without Retry-After the schedule's 500 ms applies: came after {gap:?}"
    );

    // `Retry-After: 3600` is capped at the schedule's longest delay (10 s):
    // the retry record's due time says so.
    let mut capped = env.spawn(&["--config", cfg, "deliver", "--subscription", cases[3].0]);
    let retry_topic = orderpipe::retry::retry_topic(
        &env.settings.topics.order_events.name,
        &format!("http.{}", cases[3].0),
    );
    let forwarded = env.read(&retry_topic, 1, Duration::from_secs(60));
    let first = seen.arrivals("throttle/429/3600")[0].1;
    let sent_ms = chrono::Utc::now().timestamp_millis() - first.elapsed().as_millis() as i64;
    let due: i64 = crate::helpers::header(&forwarded[0], "orderpipe.due-ms")
        .and_then(|d| d.parse().ok())
        .expect("the retry record's due time");
    let wait = due - sent_ms;
    eprintln!("throttle/429/3600: due {wait} ms after the first attempt");
    assert!(
        (9_000..=11_500).contains(&wait),
        "Retry-After: 3600 capped at the schedule's longest delay (10 s): due {wait} ms after the first attempt"
    );
    let _ = capped.stop_and_output();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_endpoint_holds_no_database_transaction_open_while_it_answers() {
    let env = TestEnv::new().with_database().await;
    let (base, seen) = endpoint().await;
    let config = write_config(&format!(
        "[[http.subscriptions]]\nname = \"slow\"\nevents = [\"order.created\"]\nurl = \"{base}/hold\"\n"
    ));
    let cfg = config.path().to_str().unwrap();
    env.cli(&["--config", cfg, "topics", "ensure"]).success();
    let events: Vec<Envelope> = LifecycleGenerator::new("checkout", 1, 1, 7)
        .take(1)
        .collect();
    produce(&env, &events);
    let mut deliver = env.spawn(&["--config", cfg, "deliver", "--subscription", "slow"]);
    // The POST is waiting for its answer now.
    tokio::time::timeout(Duration::from_secs(60), seen.held.notified())
        .await
        .expect("the delivery reached the endpoint");
    // MariaDB's own view: transactions of connections to this test's database.
    let db = env.db();
    let (database,): (String,) = sqlx::query_as("SELECT DATABASE()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let open: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(t.trx_mysql_thread_id AS SIGNED), CAST(t.trx_started AS CHAR), CAST(p.info AS CHAR) \
         FROM information_schema.innodb_trx t JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
         WHERE p.db = ?",
    )
    .bind(&database)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let (connections,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM information_schema.processlist WHERE db = ?")
            .bind(&database)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    seen.release.notify_one();
    eprintln!(
        "while the POST waited: {connections} connections to {database}, open transactions: {open:?}"
    );
    assert!(
        connections >= 2,
        "the check sees the deliverer's connections too ({connections} to {database})"
    );
    assert!(
        open.is_empty(),
        "transactions open on {database} while the POST waits: {open:?}"
    );
    // And the delivery then commits: its dedup row.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM applied_events")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if rows == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the delivery never committed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = deliver.stop_and_output();
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_of_one_partition_overlap_across_keys_and_keep_each_keys_order() {
    let mut env = TestEnv::new().with_database().await;
    // One partition: every overlap seen is within it.
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "1");
    let (base, seen) = endpoint().await;
    let config = write_config(&format!(
        "[[http.subscriptions]]\nname = \"seq\"\nevents = [\"order.*\"]\nurl = \"{base}/seq/5\"\nin_flight = 16\n"
    ));
    let cfg = config.path().to_str().unwrap();
    env.cli(&["--config", cfg, "topics", "ensure"]).success();
    // 3,000 events over 6 orders: each order's events are one sequence.
    let pool: Vec<Envelope> = LifecycleGenerator::new("checkout", 6, 1, 11)
        .take(200)
        .collect();
    let mut by_key: HashMap<String, Envelope> = HashMap::new();
    for e in pool {
        by_key.entry(e.key()).or_insert(e);
    }
    let mut keys: Vec<String> = by_key.keys().cloned().collect();
    keys.sort();
    keys.truncate(6);
    assert!(keys.len() >= 4, "{keys:?}");
    let mut events = Vec::new();
    let mut sequence: HashMap<String, (String, usize)> = HashMap::new();
    let mut next: HashMap<&str, usize> = HashMap::new();
    for i in 0..3000 {
        let key = &keys[i % keys.len()];
        let mut event = by_key[key].clone();
        event.event_id = uuid::Uuid::new_v4();
        let n = next.entry(key).or_default();
        sequence.insert(event.event_id.to_string(), (key.clone(), *n));
        *n += 1;
        events.push(event);
    }
    produce(&env, &events);
    let out = env
        .cli(&[
            "--config",
            cfg,
            "deliver",
            "--subscription",
            "seq",
            "--until-idle",
            "3",
            "--output",
            "json",
        ])
        .success();
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["handlers"]["http"]["applied"], 3000, "{summary}");
    let arrivals = seen.arrivals("seq");
    // Per key, by sequence: each event once, in the order produced.
    let mut got: HashMap<&str, Vec<usize>> = HashMap::new();
    for (id, _) in &arrivals {
        let (key, n) = &sequence[id];
        got.entry(key).or_default().push(*n);
    }
    for key in &keys {
        let want: Vec<usize> = (0..next[key.as_str()]).collect();
        assert!(
            got.get(key.as_str()) == Some(&want),
            "key {key}: arrivals out of order or repeated"
        );
    }
    let most = seen.most.load(Ordering::SeqCst);
    eprintln!(
        "{} deliveries over {} keys, at most {most} in flight at once",
        arrivals.len(),
        keys.len()
    );
    assert!(
        most > 1 && most <= keys.len(),
        "requests in flight at once: {most} (more than one, at most one per key)"
    );
}
