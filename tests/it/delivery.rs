//! `orderpipe deliver`: config-driven HTTP delivery against a local
//! downstream that answers success, `code != 0`, 500, too slowly, or not at all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use serde_json::{Value, json};

use crate::consumer::write_ndjson;
use crate::helpers::TestEnv;

pub(crate) type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// A downstream whose behaviour is chosen by the path; records every request.
pub(crate) async fn downstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    async fn hook(
        State(seen): State<Seen>,
        Path(mode): Path<String>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> (StatusCode, Json<Value>) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        seen.lock().unwrap().push((mode.clone(), key, body));
        match mode.as_str() {
            "ok" | "other" => (StatusCode::OK, Json(json!({"code": 0, "message": "ok"}))),
            "refuse" => (
                StatusCode::OK,
                Json(json!({"code": 1, "message": "business says no"})),
            ),
            "broken" => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"message": "boom"})),
            ),
            _ => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                (StatusCode::OK, Json(json!({"code": 0})))
            }
        }
    }
    let app = Router::new()
        .route("/hook/{mode}", post(hook))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

fn config(env: &TestEnv, base: &str) -> tempfile::NamedTempFile {
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let subscription = |name: &str, url: String, timeout: u64| {
        format!(
            "[[http.subscriptions]]\nname = \"{name}\"\nevents = [\"order.created\"]\nurl = \"{url}\"\ntimeout_ms = {timeout}\n\n"
        )
    };
    let text = format!(
        "[retry]\nlocal_retries = 1\nprofile = \"default\"\nattempts = 2\ninitial_delay_ms = 200\nmax_error_len = 512\n\n{}{}{}{}{}",
        subscription("ok", format!("{base}/hook/ok"), 2000),
        subscription("refuse", format!("{base}/hook/refuse"), 2000),
        subscription("broken", format!("{base}/hook/broken"), 2000),
        subscription("slow", format!("{base}/hook/slow"), 300),
        subscription("refused", format!("http://{refused}/hook"), 2000),
    );
    let _ = env;
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_succeed_or_are_retried_per_profile_then_dead_lettered_with_one_idempotency_key()
{
    let mut env = TestEnv::new().with_database().await;
    // Every record's own route is under test; with per-key ordering the later
    // records of a failing order would be held behind it instead.
    env.set_env("ORDERPIPE_CONSUMER__ORDERING", "none");
    let (base, seen) = downstream().await;
    let file = config(&env, &base);
    // The subscriptions' retry topics (groups http.<name>) come from the config.
    env.cli(&[
        "--config",
        file.path().to_str().unwrap(),
        "topics",
        "ensure",
    ])
    .success();
    let events: Vec<Envelope> = LifecycleGenerator::new("checkout", 3, 1, 3)
        .take(12)
        .collect();
    let created: Vec<&Envelope> = events
        .iter()
        .filter(|e| e.event_name.as_str() == "order.created")
        .collect();
    let ndjson = write_ndjson(&events);
    env.cli(&["produce", "--file", ndjson.path().to_str().unwrap()])
        .success();

    let cfg = file.path().to_str().unwrap();
    let mut summaries = HashMap::new();
    for name in ["ok", "refuse", "broken", "slow", "refused"] {
        let out = env
            .cli(&[
                "--config",
                cfg,
                "deliver",
                "--subscription",
                name,
                "--until-idle",
                "3",
                "--output",
                "json",
            ])
            .success();
        summaries.insert(name, serde_json::from_str::<Value>(&out).unwrap());
    }
    let n = created.len();
    assert_eq!(
        summaries["ok"]["applied"],
        events.len(),
        "{}",
        summaries["ok"]
    );
    assert_eq!(summaries["ok"]["dead_lettered"], 0);
    assert_eq!(
        summaries["ok"]["handlers"]["http"]["applied"], n,
        "only order.created matches"
    );
    for name in ["refuse", "broken", "slow", "refused"] {
        let s = &summaries[name];
        assert_eq!(s["dead_lettered"], n, "{name}: {s}");
        assert_eq!(
            s["sent_to_retry"],
            2 * n,
            "{name}: two delayed attempts each: {s}"
        );
        assert_eq!(
            s["applied"],
            events.len() - n,
            "{name}: non-matching events pass; failed ones get no dedup row: {s}"
        );
    }

    let seen = seen.lock().unwrap();
    let ok: Vec<_> = seen.iter().filter(|(mode, ..)| mode == "ok").collect();
    assert_eq!(ok.len(), n, "one successful delivery per event");
    let body = &ok[0].2;
    for field in [
        "request_id",
        "channel_id",
        "event_type",
        "data",
        "old",
        "timestamp",
    ] {
        assert!(body.get(field).is_some(), "body lacks {field}: {body}");
    }
    for mode in ["refuse", "broken", "slow"] {
        let mut keys: HashMap<&str, usize> = HashMap::new();
        for (m, key, _) in seen.iter().filter(|(m, ..)| m == mode) {
            let _ = m;
            *keys.entry(key.as_str()).or_default() += 1;
        }
        assert_eq!(
            keys.len(),
            n,
            "{mode}: one idempotency key per event: {keys:?}"
        );
        // (1 try + 1 local retry) x (main + 2 delayed attempts) = 6 requests, same key.
        assert!(keys.values().all(|c| *c == 6), "{mode}: {keys:?}");
        for e in &created {
            assert!(
                keys.contains_key(e.event_id.to_string().as_str()),
                "{mode}: key is the event id"
            );
        }
    }
}

#[test]
fn unknown_subscription_names_the_declared_ones() {
    let env = TestEnv::new();
    let out = env.cli(&["deliver", "--subscription", "crm"]).failure();
    assert!(
        out.contains("--subscription") && out.contains("crm"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_subscription_is_reloaded_without_a_restart() {
    let mut env = TestEnv::new().with_database().await;
    // The reload's info line says when the change was picked up.
    env.set_env("RUST_LOG", "warn,orderpipe=info");
    env.cli(&["topics", "ensure", "--group", "http.crm"])
        .success();
    let (base, seen) = downstream().await;
    let write = |path: &std::path::Path, mode: &str| {
        let text = format!(
            "[[http.subscriptions]]\nname = \"crm\"\nevents = [\"order.created\"]\nurl = \"{base}/hook/{mode}\"\ntimeout_ms = 2000\n"
        );
        std::fs::write(path, text).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("orderpipe.toml");
    write(&config, "ok");
    let mut deliver = env.spawn(&[
        "--config",
        config.to_str().unwrap(),
        "deliver",
        "--subscription",
        "crm",
    ]);
    let log = crate::router::stderr_lines(&mut deliver);
    let produce = |seed: u64| {
        let events: Vec<Envelope> =
            LifecycleGenerator::new("checkout", 2, 1000 * seed as i64, seed)
                .take(6)
                .collect();
        let file = write_ndjson(&events);
        env.cli(&["produce", "--file", file.path().to_str().unwrap()])
            .success();
        events
            .iter()
            .filter(|e| e.event_name.as_str() == "order.created")
            .count()
    };
    let wait_for = |mode: &'static str, n: usize| {
        let seen = seen.clone();
        async move {
            for _ in 0..150 {
                if seen
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(m, ..)| m == mode)
                    .count()
                    >= n
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("{mode} never received {n} deliveries");
        }
    };
    let first = produce(1);
    wait_for("ok", first).await;

    // Point the subscription elsewhere: the running group picks it up (the
    // file is checked every 2 s; waited for, not assumed done after a sleep).
    write(&config, "other");
    crate::router::wait_for_line(
        &log,
        &["subscription reloaded", "/hook/other"],
        Duration::from_secs(30),
    )
    .await;
    let second = produce(2);
    wait_for("other", second).await;
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(m, ..)| m == "ok")
            .count(),
        first,
        "old URL used after reload"
    );
    crate::consumer::sigterm(&mut deliver);
}
