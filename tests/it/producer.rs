//! `orderpipe produce` against Kafka and Apicurio: keys, order, headers,
//! the wire format, and bad input.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use orderpipe::codec::Codec;
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use orderpipe::schema::{SchemaCatalog, TopicSchema};
use rdkafka::Message;
use rdkafka::message::Headers;

use crate::helpers::{TestEnv, header};

#[test]
fn one_order_lands_in_one_partition_in_the_order_sent() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let (count, orders, seed, first) = (20_000usize, 2_000usize, 7u64, 1_000i64);
    let out = env
        .cli(&[
            "produce",
            "--count",
            &count.to_string(),
            "--orders",
            &orders.to_string(),
            "--seed",
            &seed.to_string(),
            "--first-order-id",
            &first.to_string(),
        ])
        .success();
    assert!(out.contains(&format!("acknowledged {count}")), "{out}");

    // The generator is deterministic: regenerate what was sent, per order.
    let mut expected: HashMap<i64, Vec<uuid::Uuid>> = HashMap::new();
    for e in LifecycleGenerator::new("x", orders, first, seed).take(count) {
        expected
            .entry(e.data.order_id())
            .or_default()
            .push(e.event_id);
    }
    assert!(
        expected.len() > 2_000,
        "thousands of orders: {}",
        expected.len()
    );

    let messages = env.read(
        &env.settings.topics.order_events.name,
        count,
        Duration::from_secs(120),
    );
    let codec = env.order_events_codec();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut seen: HashMap<i64, Vec<(i32, i64, uuid::Uuid)>> = HashMap::new();
    for m in &messages {
        let envelope = runtime.block_on(codec.decode(m.payload())).unwrap();
        assert_eq!(
            m.key(),
            Some(envelope.key().as_bytes()),
            "key is the order id"
        );
        seen.entry(envelope.data.order_id()).or_default().push((
            m.partition(),
            m.offset(),
            envelope.event_id,
        ));
    }
    let partitions_used: std::collections::BTreeSet<i32> =
        messages.iter().map(|m| m.partition()).collect();
    assert_eq!(partitions_used.len(), 12, "keys spread over all partitions");
    for (order, ids) in expected {
        let mut got = seen.remove(&order).unwrap_or_default();
        let partitions: std::collections::BTreeSet<i32> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            partitions.len(),
            1,
            "order {order} split over {partitions:?}"
        );
        got.sort_by_key(|g| g.1);
        let got_ids: Vec<_> = got.iter().map(|g| g.2).collect();
        assert_eq!(got_ids, ids, "order {order} out of order");
    }
}

#[test]
fn every_record_has_the_headers_and_decodes_to_the_same_envelope() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let sent: Vec<Envelope> = LifecycleGenerator::new("checkout", 10, 1, 3)
        .take(60)
        .collect();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for e in &sent {
        writeln!(file, "{}", serde_json::to_string(e).unwrap()).unwrap();
    }
    env.cli(&["produce", "--file", file.path().to_str().unwrap()])
        .success();

    let messages = env.read(
        &env.settings.topics.order_events.name,
        sent.len(),
        Duration::from_secs(60),
    );
    let codec = env.order_events_codec();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let by_id: HashMap<_, _> = sent.iter().map(|e| (e.event_id, e)).collect();
    for m in &messages {
        let decoded = runtime.block_on(codec.decode(m.payload())).unwrap();
        let original = by_id[&decoded.event_id];
        assert_eq!(
            &decoded, original,
            "decoded envelope differs from the one sent"
        );
        assert_eq!(
            header(m, "event_id").as_deref(),
            Some(original.event_id.to_string().as_str())
        );
        assert_eq!(
            header(m, "event_name").as_deref(),
            Some(original.event_name.as_str())
        );
        assert_eq!(
            header(m, "trace_id").as_deref(),
            Some(original.trace_id.as_str())
        );
        // The documented five and no more (event_version and producer are in the value).
        let names: Vec<&str> = m
            .headers()
            .map(|h| h.iter().map(|h| h.key).collect())
            .unwrap_or_default();
        assert_eq!(
            names,
            [
                "event_id",
                "event_name",
                "trace_id",
                "traceparent",
                "content-type"
            ]
        );
        let traceparent = header(m, "traceparent").expect("traceparent");
        assert!(
            traceparent.starts_with(&format!("00-{}-", original.trace_id)),
            "{traceparent}"
        );
        assert_eq!(
            header(m, "content-type").as_deref(),
            Some("application/vnd.confluent.avro")
        );
        // Confluent framing: magic byte 0 then a 4-byte schema id.
        assert_eq!(m.payload().unwrap()[0], 0);
    }
}

/// The subject's registered schema types `event_id` as an Avro `uuid`:
/// records written with it would be dead-lettered by every consumer. The
/// codec's sampled check catches the first record against Apicurio, and
/// the run writes nothing at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_registered_schema_consumers_cannot_read_stops_produce_before_any_record() {
    let mut env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let topic = env.settings.topics.order_events.name.clone();
    let ours = SchemaCatalog::embedded().order_events().clone();
    let anchor = r#"{"name": "event_id", "type": "string""#;
    let raw = ours.raw.replacen(
        anchor,
        r#"{"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}"#,
        1,
    );
    assert_ne!(raw, ours.raw, "schema anchor moved");
    let uuid_typed = TopicSchema {
        parsed: apache_avro::Schema::parse_str(&raw).unwrap(),
        raw,
        ..ours
    };
    Codec::new(&env.settings.registry, &topic, &uuid_typed, true)
        .unwrap()
        .warm_up()
        .await
        .unwrap();

    env.set_env("ORDERPIPE_REGISTRY__AUTO_REGISTER", "false");
    let out = env.cli(&["produce", "--count", "300"]).failure();
    assert!(out.contains("acknowledged 0, failed 300"), "{out}");
    assert!(
        out.contains("encode check failed") && out.contains("a consumer cannot decode it"),
        "{out}"
    );
    assert!(out.contains("an earlier record failed the check"), "{out}");
    env.read(&topic, 0, Duration::from_secs(5));
}

/// Every record refused by the broker (a topic whose max.message.bytes is
/// below one record): the run counts each as failed, none as acknowledged,
/// and names the events (read back from the failed record's headers by the
/// producer's delivery callback).
#[tokio::test(flavor = "multi_thread")]
async fn records_the_broker_refuses_are_counted_failed_and_named() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let topic = format!("{}.too-small", env.prefix);
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    let new = NewTopic::new(&topic, 3, TopicReplication::Fixed(1)).set("max.message.bytes", "120");
    for r in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    tokio::task::block_in_place(|| crate::helpers::wait_for_topic(&env, &topic));
    let out = env
        .cli(&["produce", "--count", "40", "--topic", &topic])
        .failure();
    assert!(out.contains("acknowledged 0, failed 40"), "{out}");
    assert!(
        out.contains("failed: event ") && out.contains("too large"),
        "{out}"
    );
}

#[test]
fn bad_ndjson_lines_are_named_and_the_rest_still_go() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let good: Vec<Envelope> = LifecycleGenerator::new("checkout", 3, 1, 5)
        .take(3)
        .collect();
    let json = |e: &Envelope| serde_json::to_value(e).unwrap();
    let mut bad_name = json(&good[0]);
    bad_name["event_name"] = "kafka.send".into();
    let mut missing = json(&good[0]);
    missing.as_object_mut().unwrap().remove("producer");
    let mut negative = json(&good[0]);
    negative["data"]["amount"] = (-100).into();
    let lines = [
        json(&good[0]).to_string(),
        bad_name.to_string(),
        missing.to_string(),
        json(&good[1]).to_string(),
        negative.to_string(),
        "{not json".to_string(),
        json(&good[2]).to_string(),
    ];
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "{}", lines.join("\n")).unwrap();
    let out = env
        .cli(&["produce", "--file", file.path().to_str().unwrap()])
        .failure();
    assert!(
        out.contains("line 2:") && out.contains("kafka.send") && out.contains("technology"),
        "{out}"
    );
    assert!(
        out.contains("line 3:") && out.contains("`producer`"),
        "{out}"
    );
    assert!(
        out.contains("line 5:") && out.contains("data.amount") && out.contains("negative"),
        "{out}"
    );
    assert!(out.contains("line 6:"), "{out}");
    assert!(out.contains("acknowledged 3"), "{out}");
    assert!(!out.contains("panicked"), "{out}");
    env.read(
        &env.settings.topics.order_events.name,
        3,
        Duration::from_secs(30),
    );
}

#[test]
fn unreachable_broker_is_a_clear_error_within_bounded_time() {
    let env = TestEnv::new();
    let run = env.cli(&[
        "--bootstrap-servers",
        "127.0.0.1:1",
        "produce",
        "--count",
        "10",
    ]);
    let out = run.failure();
    assert!(out.contains("cannot reach Kafka at 127.0.0.1:1"), "{out}");
    assert!(
        run.elapsed < Duration::from_secs(30),
        "took {:?}",
        run.elapsed
    );
    assert!(!out.contains("panicked"), "{out}");
}

#[test]
fn unreachable_registry_is_a_clear_error() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let run = env.cli(&[
        "--registry-url",
        "http://127.0.0.1:1/apis/ccompat/v7",
        "produce",
        "--count",
        "10",
    ]);
    let out = run.failure();
    assert!(out.contains("schema registry unavailable"), "{out}");
    assert!(out.contains("127.0.0.1:1"), "{out}");
    assert!(
        run.elapsed < Duration::from_secs(30),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn conflicting_librdkafka_override_is_refused() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let out = env
        .cli(&["-X", "acks=1", "produce", "--count", "10"])
        .failure();
    assert!(
        out.contains("acks=1") && out.contains("enable.idempotence"),
        "{out}"
    );
    let out = env
        .cli(&["-X", "no.such.option=1", "produce", "--count", "10"])
        .failure();
    assert!(out.contains("no.such.option"), "{out}");
}

#[test]
fn bad_flags_name_the_field_and_accepted_values() {
    let env = TestEnv::new();
    let out = env
        .cli(&["topics", "describe", "--output", "yaml"])
        .failure();
    assert!(
        out.contains("--output") && out.contains("table") && out.contains("json"),
        "{out}"
    );
    let out = env
        .cli(&["-X", "linger.ms", "produce", "--count", "1"])
        .failure();
    assert!(out.contains("KEY=VALUE"), "{out}");
}

#[test]
fn otlp_export_without_the_feature_says_how_to_get_it() {
    let env = TestEnv::new();
    let run = env.cli(&[
        "--otlp-endpoint",
        "http://127.0.0.1:4318/v1/traces",
        "config",
    ]);
    if cfg!(feature = "otlp") {
        run.success();
    } else {
        let out = run.failure();
        assert!(out.contains("--features otlp"), "{out}");
    }
}
