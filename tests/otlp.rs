//! OTLP export, against the dev stack: a consumer's spans reach a local
//! OTLP/HTTP endpoint, and each record span continues the trace of the
//! record's `traceparent` header. The consumer is a binary built with
//! `--features otlp`, named by `OTLP_CONSUMER_BINARY`; `make test` names the
//! release image's binary, so the production build is what exports traces:
//! `OTLP_CONSUMER_BINARY=target/release/orderpipe cargo test --features harness --test otlp -- --ignored`.
//! It is `#[ignore]`d because the suite's own binary (harness, no otlp)
//! cannot export; the test itself is built with the suite.

#[allow(dead_code)]
#[path = "it/helpers.rs"]
mod helpers;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

/// An OTLP/HTTP collector on a free port: its endpoint, the content types
/// of the requests it got, and the spans they carried.
async fn collector() -> (String, Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<Span>>>) {
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let (seen, collected) = (requests.clone(), spans.clone());
    let app = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let content_type = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            seen.lock().unwrap().push(content_type);
            let request =
                ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf trace export");
            let mut collected = collected.lock().unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    collected.extend(scope.spans);
                }
            }
            async { "" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (endpoint, requests, spans)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a consumer built with --features otlp: OTLP_CONSUMER_BINARY=target/release/orderpipe (make test runs it after the image)"]
async fn record_spans_are_exported_over_otlp_http_as_children_of_the_records_traceparent() {
    let env = helpers::TestEnv::new().with_database().await;
    let group = "otlp";
    env.cli(&["topics", "ensure", "--group", group]).success();
    env.cli(&[
        "produce",
        "--count",
        "40",
        "--orders",
        "10",
        "--seed",
        "4",
        "--first-order-id",
        "1",
    ])
    .success();
    // What the producer sent: event id -> traceparent header.
    let topic = env.settings.topics.order_events.name.clone();
    let sent: BTreeMap<String, String> = env
        .read(&topic, 40, Duration::from_secs(30))
        .iter()
        .map(|m| {
            (
                helpers::header(m, "event_id").unwrap(),
                helpers::header(m, "traceparent").unwrap(),
            )
        })
        .collect();
    assert_eq!(sent.len(), 40);

    let (endpoint, requests, spans) = collector().await;
    // The consumer: the release image's binary when make test names it
    // (OTLP_CONSUMER_BINARY=target/release/orderpipe, the file dev/image.sh
    // copies into the image), else this build's (which fails on
    // --otlp-endpoint unless built with --features otlp).
    let binary = std::env::var("OTLP_CONSUMER_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_orderpipe").to_string());
    eprintln!("consumer binary: {binary}");
    // The record spans are at info (the helpers' RUST_LOG=warn would drop them).
    let out = env
        .command_of(
            &binary,
            &[
                "--otlp-endpoint",
                &endpoint,
                "consume",
                "--group",
                group,
                "--handler",
                "notification",
                "--until-idle",
                "3",
            ],
        )
        .env("RUST_LOG", "warn,orderpipe=info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = requests.lock().unwrap();
    assert!(!requests.is_empty(), "no spans were exported");
    assert!(
        requests.iter().all(|ct| ct == "application/x-protobuf"),
        "{requests:?}"
    );

    // traceparent = 00-<trace id>-<parent span id>-<flags>
    let spans = spans.lock().unwrap();
    let mut children = BTreeMap::new();
    for span in spans.iter().filter(|s| s.name == "record") {
        let event_id = attribute(span, "event_id").expect("record span has an event_id");
        let traceparent = sent
            .get(&event_id)
            .unwrap_or_else(|| panic!("a span of an event never produced: {event_id}"));
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(
            hex(&span.trace_id),
            parts[1],
            "record span of {event_id} is not in its traceparent's trace"
        );
        assert_eq!(
            hex(&span.parent_span_id),
            parts[2],
            "record span of {event_id} is not a child of its traceparent"
        );
        children.insert(event_id, ());
    }
    assert_eq!(
        children.len(),
        sent.len(),
        "every consumed record has a record span"
    );
}
