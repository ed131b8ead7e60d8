//! The console's topic explorer, schemas and subscriptions pages: what they
//! read (orderpipe::explore) against the real stack, and the pages in a browser.

use std::collections::BTreeMap;
use std::time::Duration;

use orderpipe::explore::registry::{ChangeKind, RegistryReader};
use orderpipe::explore::{Decoded, Explorer, Partitioner, Start};
use rdkafka::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use schema_registry_converter::async_impl::schema_registry::post_schema;
use schema_registry_converter::avro_common::get_supplied_schema;

use crate::helpers::TestEnv;

fn explorer(env: &TestEnv) -> Explorer {
    Explorer::new(
        &env.settings.kafka,
        &env.settings.producer,
        &env.settings.registry,
    )
    .unwrap()
}

/// `orderpipe produce` of `count` events over `orders` orders from order id 700000.
fn produce_orders(env: &TestEnv, count: usize, orders: usize) {
    env.cli(&["topics", "ensure"]).success();
    let out = env
        .cli(&[
            "produce",
            "--count",
            &count.to_string(),
            "--orders",
            &orders.to_string(),
            "--first-order-id",
            "700000",
        ])
        .success();
    assert!(out.contains(&format!("acknowledged {count}")), "{out}");
}

/// Writes raw records (key, value) to `partition` of `topic`.
pub fn produce_raw(env: &TestEnv, topic: &str, partition: i32, records: &[(&str, &[u8])]) {
    let producer: ThreadedProducer<DefaultProducerContext> =
        orderpipe::kafka::client::client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    for (key, value) in records {
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(*key)
                    .payload(*value),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Every order's key lands where the explorer looks for it (the producers'
/// partitioner, murmur2 by default), and the explorer finds all of an
/// order's events there, in offset order, decoded.
#[test]
fn an_orders_events_are_found_by_order_id_and_decoded() {
    let env = TestEnv::new();
    produce_orders(&env, 600, 150);
    let topic = env.settings.topics.order_events.name.clone();
    let records = env.read(&topic, 600, Duration::from_secs(60));
    let partitioner =
        Partitioner::of_producer(&env.settings.kafka, &env.settings.producer).unwrap();
    assert_eq!(partitioner.name, "murmur2_random");
    let mut by_order: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for m in &records {
        let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
        assert_eq!(
            partitioner.partition(key.as_bytes(), 12),
            Some(m.partition()),
            "order {key}"
        );
        by_order
            .entry(key)
            .or_default()
            .push((m.partition(), m.offset()));
    }
    let (order, mut positions) = by_order.into_iter().max_by_key(|(_, p)| p.len()).unwrap();
    positions.sort();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let explorer = explorer(&env);
    let found = runtime
        .block_on(explorer.find_order(&topic, &order, Start::Beginning, 50))
        .unwrap();
    let got: Vec<(i32, i64)> = found
        .page
        .records
        .iter()
        .map(|r| (r.partition, r.offset))
        .collect();
    assert_eq!(got, positions, "order {order}");
    for r in &found.page.records {
        match &r.decoded {
            Decoded::Envelope {
                json, event_name, ..
            } => {
                assert_eq!(json["data"]["order_id"].to_string(), order, "{json}");
                assert!(event_name.starts_with("order."), "{event_name}");
            }
            other => panic!("record at {} not decoded: {other:?}", r.offset),
        }
        assert_eq!(r.key.as_deref(), Some(order.as_str()));
        assert!(
            r.headers
                .iter()
                .any(|(k, v)| k == "event_name" && v.starts_with("order.")),
            "{:?}",
            r.headers
        );
    }
    assert!(found.page.reached_end && found.page.scanned > got.len() as u64);
    // A bad order id names the field, and a partition out of range too.
    let e = runtime
        .block_on(explorer.find_order(&topic, "12x", Start::Beginning, 50))
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("order_id: `12x` is not an order id"),
        "{e}"
    );
    let e = runtime
        .block_on(explorer.read(&topic, 12, Start::Beginning, 10))
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("partition: 12 is not a partition of"),
        "{e}"
    );
    let e = runtime
        .block_on(explorer.read("no.such.topic.x", 0, Start::Beginning, 10))
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// Reading from a time starts at the first record at or after it; from an
/// offset, at that offset; the tail shows the last records.
#[test]
fn a_partition_is_read_from_an_offset_a_time_or_its_tail() {
    let env = TestEnv::new();
    env.cli(&["topics", "ensure"]).success();
    let topic = env.settings.topics.order_events.name.clone();
    produce_raw(&env, &topic, 3, &[("1", b"a"), ("2", b"b")]);
    std::thread::sleep(Duration::from_millis(50));
    let between = chrono::Utc::now().timestamp_millis();
    std::thread::sleep(Duration::from_millis(50));
    produce_raw(&env, &topic, 3, &[("3", b"c"), ("4", b"d"), ("5", b"e")]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let explorer = explorer(&env);
    let read = |start, limit| {
        runtime
            .block_on(explorer.read(&topic, 3, start, limit))
            .unwrap()
    };
    let keys = |page: &orderpipe::explore::Page<orderpipe::explore::RecordView>| {
        page.records
            .iter()
            .map(|r| r.key.clone().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&read(Start::Time(between), 50)), ["3", "4", "5"]);
    let from_one = read(Start::Offset(1), 2);
    assert_eq!(keys(&from_one), ["2", "3"]);
    assert_eq!(
        (
            from_one.start_offset,
            from_one.next_offset,
            from_one.reached_end
        ),
        (1, 3, false)
    );
    assert_eq!(keys(&read(Start::Tail, 2)), ["4", "5"]);
    assert_eq!(keys(&read(Start::Beginning, 50)).len(), 5);
    let later = read(
        Start::Time(chrono::Utc::now().timestamp_millis() + 60_000),
        50,
    );
    assert!(later.records.is_empty() && later.reached_end && later.start_offset == 5);
}

/// Poison records are shown for what they are: no magic byte, a schema id
/// the registry does not know, an Avro body that does not match its
/// schema, Avro that is no envelope; next to a good record.
#[test]
fn poison_records_are_shown_as_undecodable_with_their_class() {
    let env = TestEnv::new();
    produce_orders(&env, 12, 12);
    let topic = env.settings.topics.order_events.name.clone();
    let good = env.read(&topic, 12, Duration::from_secs(60)).remove(0);
    let framed = good.payload().unwrap();
    let id = u32::from_be_bytes(framed[1..5].try_into().unwrap());
    let mut bad_avro = framed[..5].to_vec();
    bad_avro.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    let unknown_id = [0u8, 0x7f, 0xff, 0xff, 0xf0, 2, b'x'];
    // Avro written with a schema that is not an envelope: registered under its own subject.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let other = runtime.block_on(async {
        let settings = orderpipe::codec::sr_settings(&env.settings.registry).unwrap();
        let schema = r#"{"type":"record","name":"Ping","fields":[{"name":"n","type":"int"}]}"#;
        let supplied = get_supplied_schema(&apache_avro::Schema::parse_str(schema).unwrap());
        post_schema(&settings, format!("{}.ping-value", env.prefix), supplied)
            .await
            .unwrap()
            .id
    });
    let mut ping = vec![0u8];
    ping.extend(other.to_be_bytes());
    ping.push(14); // zigzag 7
    produce_raw(
        &env,
        &topic,
        0,
        &[
            ("1", b"plain text"),
            ("2", &unknown_id),
            ("3", &bad_avro),
            ("4", &ping),
            ("5", framed),
        ],
    );
    let explorer = explorer(&env);
    let page = runtime
        .block_on(explorer.read(&topic, 0, Start::Tail, 5))
        .unwrap();
    let kinds: Vec<String> = page
        .records
        .iter()
        .map(|r| match &r.decoded {
            Decoded::Undecodable {
                class, schema_id, ..
            } => format!("{class}/{schema_id:?}"),
            Decoded::Invalid {
                schema_id, json, ..
            } => format!("invalid/{}/{}", schema_id, json["n"]),
            Decoded::Envelope { schema_id, .. } => format!("envelope/{schema_id}"),
            Decoded::Empty => "empty".into(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "not_framed/None".to_string(),
            format!("unknown_schema/Some({})", 0x7fff_fff0u32),
            format!("avro_decode/Some({id})"),
            format!("invalid/{other}/7"),
            format!("envelope/{id}"),
        ]
    );
    let first = &page.records[0];
    assert!(
        first.value_hex.starts_with("0x706c61696e"),
        "{}",
        first.value_hex
    );
    match &first.decoded {
        Decoded::Undecodable { reason, .. } => {
            assert!(reason.contains("magic byte is 0x70"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        page.records[4].value_hex.is_empty(),
        "a good record needs no hex"
    );
}

/// The registry page's reads: a subject's versions, its compatibility
/// level, and the diff of two versions with both verdicts.
#[test]
fn subjects_versions_and_the_diff_of_two_versions() {
    let env = TestEnv::new();
    let subject = format!("{}.diff-value", env.prefix);
    let v1 = r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"long"},{"name":"old","type":["null","string"],"default":null}]}"#;
    let v2 = r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"long"},{"name":"old","type":["null","string"],"default":null},{"name":"coupon","type":["null","string"],"default":null}]}"#;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let settings = orderpipe::codec::sr_settings(&env.settings.registry).unwrap();
        for schema in [v1, v2] {
            let supplied = get_supplied_schema(&apache_avro::Schema::parse_str(schema).unwrap());
            post_schema(&settings, subject.clone(), supplied)
                .await
                .unwrap();
        }
        let reader = RegistryReader::new(&env.settings.registry).unwrap();
        let all = reader.subjects().await.unwrap();
        let mine = all
            .iter()
            .find(|s| s.subject == subject)
            .expect("subject listed");
        assert_eq!(mine.versions, [1, 2]);
        assert_eq!(
            mine.compatibility.level, "BACKWARD",
            "the registry's default"
        );
        let diff = reader.diff(&subject, 1, 2).await.unwrap();
        assert_eq!(diff.changes.len(), 1, "{:?}", diff.changes);
        assert_eq!(
            (diff.changes[0].path.as_str(), diff.changes[0].kind),
            ("coupon", ChangeKind::Added)
        );
        assert_eq!(
            (
                diff.backward_problem.as_deref(),
                diff.forward_problem.as_deref()
            ),
            (None, None)
        );
        assert!(diff.new.id != diff.old.id && diff.new.text.contains("coupon"));
        // Backwards: the field is removed, and the old schema still reads the newer data.
        let back = reader.diff(&subject, 2, 1).await.unwrap();
        assert_eq!(back.changes[0].kind, ChangeKind::Removed);
        let e = reader.version(&subject, 9).await.unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
    });
}
