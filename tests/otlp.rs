//! OTLP export (built with `--features otlp`): the spans of a demo run reach
//! a local OTLP/HTTP endpoint. `make test` runs it as
//! `cargo test --features otlp --test otlp`.
#![cfg(feature = "otlp")]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;

#[tokio::test(flavor = "multi_thread")]
async fn spans_are_exported_over_otlp_http() {
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
            record.lock().unwrap().push((content_type, body.len()));
            async { "" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_orderpipe"))
        .args(["--otlp-endpoint", &endpoint, "--log-level", "warn", "demo", "--orders", "30"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "no spans were exported");
    assert!(seen.iter().all(|(ct, len)| ct == "application/x-protobuf" && *len > 0), "{seen:?}");
}
