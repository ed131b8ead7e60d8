//! `orderpipe deliver` against downstreams that answer the way webhooks do:
//! one subscription per answer, across every HTTP status class, judged by
//! the web's conventions (RFC 9110's classes; the receivers of GitHub, Stripe
//! or Slack webhooks acknowledge with any 2xx, often `204` or `200 {}`):
//! a 2xx is a delivery, a 4xx other than 408 and 429 is the downstream
//! refusing the record for good, a 408, 429 or 5xx is worth another try.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use serde_json::Value;

use crate::consumer::write_ndjson;
use crate::helpers::{TestEnv, header};

/// A downstream answering `/answer/{status}/{body}` with that status and
/// body (`empty`, `text`, or a JSON document, URL-encoded); counts requests.
async fn downstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let answer = move |Path((status, body)): Path<(u16, String)>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(format!("{status}/{body}"));
            let status = StatusCode::from_u16(status).unwrap();
            match body.as_str() {
                "empty" => status.into_response(),
                "text" => (status, "accepted").into_response(),
                json => (
                    status,
                    [("content-type", "application/json")],
                    json.to_string(),
                )
                    .into_response(),
            }
        }
    };
    let app = Router::new().route("/answer/{status}/{body}", post(answer));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// What the answer must lead to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// Applied: a dedup row, no retry, no dead letter.
    Delivered,
    /// Dead-lettered at once as `downstream_rejected`, never retried.
    Rejected,
    /// Retried through the retry topic, then dead-lettered.
    Retried,
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_answers_of_every_status_class_are_deliveries_rejections_or_retries_as_the_web_means_them()
 {
    use Outcome::*;
    // (subscription, status, body, success rule, outcome)
    let cases: &[(&str, u16, &str, Option<&str>, Outcome)] = &[
        ("ok-empty-json", 200, "{}", None, Delivered),
        ("ok-empty", 200, "empty", None, Delivered),
        ("no-content", 204, "empty", None, Delivered),
        ("created", 201, r#"{"id":"7"}"#, None, Delivered),
        ("accepted-text", 202, "text", None, Delivered),
        (
            "seed003-ok",
            200,
            r#"{"code":0,"message":"ok"}"#,
            None,
            Delivered,
        ),
        (
            "seed003-no",
            200,
            r#"{"code":1,"message":"no"}"#,
            None,
            Retried,
        ),
        (
            "bad-request",
            400,
            r#"{"error":"missing field order_id"}"#,
            None,
            Rejected,
        ),
        ("not-found", 404, "text", None, Rejected),
        ("gone", 410, "empty", None, Rejected),
        (
            "unprocessable",
            422,
            r#"{"error":"invalid state"}"#,
            None,
            Rejected,
        ),
        ("request-timeout", 408, "empty", None, Retried),
        ("too-many", 429, "empty", None, Retried),
        ("server-error", 500, "text", None, Retried),
        ("unavailable", 503, "empty", None, Retried),
        ("strict-204", 204, "empty", Some("2xx-and-code"), Retried),
        (
            "strict-ok",
            200,
            r#"{"code":0}"#,
            Some("2xx-and-code"),
            Delivered,
        ),
        ("code-on-500", 500, r#"{"code":0}"#, Some("code"), Delivered),
        ("code-on-200", 200, r#"{"code":2}"#, Some("code"), Retried),
    ];
    let env = TestEnv::new().with_database().await;
    let (base, seen) = downstream().await;
    let mut text = "[retry]\nlocal_retries = 0\nprofile = \"default\"\nattempts = 1\ninitial_delay_ms = 100\n\n".to_string();
    for (name, status, body, rule, _) in cases {
        let body = body
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace(':', "%3A")
            .replace(',', "%2C");
        text += &format!(
            "[[http.subscriptions]]\nname = \"{name}\"\nevents = [\"order.created\"]\nurl = \"{base}/answer/{status}/{body}\"\n{}\n",
            rule.map(|r| format!("success = \"{r}\"\n"))
                .unwrap_or_default()
        );
    }
    let config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(config.path(), text).unwrap();
    let cfg = config.path().to_str().unwrap();
    env.cli(&["--config", cfg, "topics", "ensure"]).success();
    let events: Vec<Envelope> = LifecycleGenerator::new("checkout", 1, 1, 5)
        .take(1)
        .collect();
    assert_eq!(events[0].event_name.as_str(), "order.created");
    let ndjson = write_ndjson(&events);
    env.cli(&["produce", "--file", ndjson.path().to_str().unwrap()])
        .success();

    // Every subscription's group at once (each reads the one event, then goes idle).
    let runs: Vec<_> = cases
        .iter()
        .map(|(name, ..)| {
            let child = env
                .command(&[
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
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (*name, child)
        })
        .collect();
    let mut wrong = Vec::new();
    for ((name, status, body, rule, outcome), (_, child)) in cases.iter().zip(runs) {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        let got = match (
            summary["handlers"]["http"]["applied"].as_u64(),
            summary["dead_lettered"].as_u64(),
            summary["sent_to_retry"].as_u64(),
        ) {
            (Some(1), Some(0), Some(0)) => Some(Delivered),
            (_, Some(1), Some(0)) => Some(Rejected),
            (_, Some(1), Some(1)) => Some(Retried),
            _ => None,
        };
        if got != Some(*outcome) {
            wrong.push(format!(
                "{name} ({status} {body}, rule {rule:?}): want {outcome:?}, got {got:?}: {summary}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "answers judged wrongly:\n{}",
        wrong.join("\n")
    );

    // A rejection says why: the status and the downstream's own words.
    let rejected = cases.iter().filter(|c| c.4 == Rejected).count();
    let retried = cases.iter().filter(|c| c.4 == Retried).count();
    let dead = env.read(
        &env.settings.topics.dead_letter.name,
        rejected + retried,
        std::time::Duration::from_secs(60),
    );
    let bad_request = dead
        .iter()
        .find(|m| header(m, "orderpipe.group").as_deref() == Some("http.bad-request"))
        .expect("the 400's dead letter");
    assert_eq!(
        header(bad_request, "orderpipe.error-class").as_deref(),
        Some("downstream_rejected")
    );
    let error = header(bad_request, "orderpipe.error-message").unwrap_or_default();
    assert!(
        error.contains("400") && error.contains("missing field order_id"),
        "{error}"
    );
    let classes: Vec<String> = dead
        .iter()
        .filter_map(|m| header(m, "orderpipe.error-class"))
        .collect();
    assert_eq!(
        classes
            .iter()
            .filter(|c| *c == "downstream_rejected")
            .count(),
        rejected,
        "{classes:?}"
    );
    // Each rejected subscription was asked once; each retried one twice (the main topic, then its one retry).
    let seen = seen.lock().unwrap();
    for (name, status, body, _, outcome) in cases {
        let asked = seen
            .iter()
            .filter(|s| **s == format!("{status}/{body}"))
            .count();
        let _ = name;
        assert!(asked >= 1, "{name} never asked");
        if *outcome == Rejected {
            assert_eq!(asked, 1, "{name} ({status}) was retried");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_downstream_consumers_success_rule_is_kept_in_its_table_and_a_bad_one_names_the_accepted_values()
 {
    let env = TestEnv::new().with_database().await;
    let show = |name: &str| -> Value {
        let out = env
            .cli(&["subs", "show", "consumer", name, "--output", "json"])
            .success();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    };
    env.cli(&[
        "subs",
        "add",
        "consumer",
        "crm",
        "--url",
        "http://crm.internal/hooks",
    ])
    .success();
    assert_eq!(show("crm")["success"], "2xx", "the default: any 2xx");
    env.cli(&[
        "subs",
        "add",
        "consumer",
        "legacy",
        "--url",
        "http://legacy/hooks",
        "--success",
        "2xx-and-code",
    ])
    .success();
    assert_eq!(show("legacy")["success"], "2xx-and-code");
    env.cli(&["subs", "update", "consumer", "crm", "--success", "code"])
        .success();
    assert_eq!(show("crm")["success"], "code");
    let refused = env
        .cli(&["subs", "update", "consumer", "crm", "--success", "200"])
        .failure();
    assert!(
        refused.contains("--success") && refused.contains("2xx, 2xx-and-code, code"),
        "{refused}"
    );
    assert_eq!(
        show("crm")["success"],
        "code",
        "a refused update changes nothing"
    );
}
