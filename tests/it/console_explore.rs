//! The console's topic explorer, schemas and subscriptions pages: what they
//! read (orderpipe::explore) against the real stack, and the pages in a browser.

use std::collections::BTreeMap;
use std::time::Duration;

use fantoccini::Locator;
use orderpipe::console::{Role, audit};
use orderpipe::explore::registry::{ChangeKind, RegistryReader};
use orderpipe::explore::{Decoded, Explorer, Partitioner, Start};
use orderpipe::subscriptions::Store;
use orderpipe::subscriptions::model::NewConsumer;
use orderpipe::subscriptions::store::{Origin, RequestKind};
use rdkafka::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use schema_registry_converter::async_impl::schema_registry::post_schema;
use schema_registry_converter::avro_common::get_supplied_schema;

use crate::console_browser::{Browser, TestConsole};
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

/// Registers `schema` (Avro JSON) under `subject`; returns its id.
pub async fn register(env: &TestEnv, subject: &str, schema: &str) -> u32 {
    let settings = orderpipe::codec::sr_settings(&env.settings.registry).unwrap();
    let supplied = get_supplied_schema(&apache_avro::Schema::parse_str(schema).unwrap());
    post_schema(&settings, subject.to_string(), supplied)
        .await
        .unwrap()
        .id
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
    let described = runtime.block_on(explorer.describe(&topic)).unwrap();
    assert_eq!(described.partitions.len(), 12);
    assert_eq!(
        (described.partitions[3].low, described.partitions[3].high),
        (0, 5)
    );
    let listed = runtime.block_on(explorer.topics()).unwrap();
    assert!(listed.iter().any(|t| t.name == topic && t.partitions == 12));
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
    let ping_schema = r#"{"type":"record","name":"Ping","fields":[{"name":"n","type":"int"}]}"#;
    let other = runtime.block_on(register(
        &env,
        &format!("{}.ping-value", env.prefix),
        ping_schema,
    ));
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

/// A row change of a `cdc.*` topic decodes through the change envelope
/// (the writer's schema says which), with its data and old values.
#[test]
fn a_cdc_row_change_is_decoded_as_a_change() {
    use orderpipe::cdc::change::{self, ChangeEvent, ChangeKind as RowKind};
    let env = TestEnv::new();
    let topic = format!("{}.cdc.shop.table_user", env.prefix);
    env.cli(&["topics", "ensure"]).success();
    std::process::Command::new(crate::helpers::STACK_SCRIPT)
        .args([
            "kafka-topics",
            "--bootstrap-server",
            &env.settings.kafka.bootstrap_servers,
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "1",
        ])
        .output()
        .unwrap();
    let event_id = change::change_id("src", "0-1-7", 0);
    let row = ChangeEvent {
        event_id,
        event_name: "shop.table_user.update".into(),
        event_version: change::CHANGE_EVENT_VERSION.into(),
        event_time: chrono::Utc::now(),
        producer: "cdc:src".into(),
        trace_id: change::trace_id_of(&event_id),
        database: "shop".into(),
        table: "table_user".into(),
        change: RowKind::Update,
        key: "42".into(),
        data: serde_json::json!({"id": 42, "status": 2}),
        old: Some(serde_json::json!({"status": 1})),
        gtid: Some("0-1-7".into()),
        binlog_file: "mysql-bin.000001".into(),
        binlog_pos: 1234,
        xid: Some(9),
        row_index: 0,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let codec = orderpipe::codec::Codec::new(
        &env.settings.registry,
        &topic,
        &change::topic_schema(&topic),
        true,
    )
    .unwrap();
    let value = runtime.block_on(codec.encode_value(row.to_avro())).unwrap();
    produce_raw(&env, &topic, 0, &[("42", &value)]);
    let page = runtime
        .block_on(explorer(&env).read(&topic, 0, Start::Beginning, 10))
        .unwrap();
    assert_eq!(page.records.len(), 1);
    match &page.records[0].decoded {
        Decoded::Envelope {
            event_name, json, ..
        } => {
            assert_eq!(event_name, "shop.table_user.update");
            let text = json.to_string();
            assert!(
                text.contains("\"status\":2") && text.contains("\"status\":1"),
                "data and old: {text}"
            );
        }
        other => panic!("not decoded as a change: {other:?}"),
    }
}

/// A producer configured with another partitioner (librdkafka's CRC32
/// `consistent_random`) puts orders elsewhere; the explorer follows the
/// configuration and still finds them.
#[test]
fn the_explorer_follows_a_configured_partitioner() {
    let mut env = TestEnv::new();
    env.set_env(
        "ORDERPIPE_PRODUCER__OPTIONS__PARTITIONER",
        "consistent_random",
    );
    env.settings
        .producer
        .options
        .insert("partitioner".into(), "consistent_random".into());
    produce_orders(&env, 200, 50);
    let topic = env.settings.topics.order_events.name.clone();
    let records = env.read(&topic, 200, Duration::from_secs(60));
    let crc = Partitioner::of_producer(&env.settings.kafka, &env.settings.producer).unwrap();
    let murmur2 = Partitioner::named("murmur2_random").unwrap();
    assert_eq!(crc.name, "consistent_random");
    let mut elsewhere = 0;
    for m in &records {
        let key = m.key().unwrap();
        assert_eq!(crc.partition(key, 12), Some(m.partition()));
        elsewhere += usize::from(murmur2.partition(key, 12) != Some(m.partition()));
    }
    assert!(
        elsewhere > 100,
        "CRC32 and murmur2 place most keys apart: {elsewhere} of 200"
    );
    let order = String::from_utf8(records[0].key().unwrap().to_vec()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let found = runtime
        .block_on(explorer(&env).find_order(&topic, &order, Start::Beginning, 50))
        .unwrap();
    assert_eq!(found.partitioner.name, "consistent_random");
    assert_eq!(found.page.partition, records[0].partition());
    assert!(
        found
            .page
            .records
            .iter()
            .any(|r| r.offset == records[0].offset())
    );
}

/// A registry that does not answer makes every framed record
/// `registry_unavailable` (a page, not an error), asked once per page, not
/// once per record; a record that is not framed still says so.
#[test]
fn a_registry_that_does_not_answer_is_asked_once_per_page() {
    let env = TestEnv::new();
    produce_orders(&env, 1, 1);
    let topic = env.settings.topics.order_events.name.clone();
    let good = env.read(&topic, 1, Duration::from_secs(60)).remove(0);
    let framed = good.payload().unwrap();
    let mut records: Vec<(&str, &[u8])> = vec![("1", framed); 6];
    records.push(("1", b"text"));
    // Partition 11 is the order's, or empty: the raw copies follow.
    let partition = 11;
    produce_raw(&env, &topic, partition, &records);
    // A port that accepts connections and never answers: each request waits for the timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut registry = env.settings.registry.clone();
    registry.url = format!("http://{}/apis/ccompat/v7", silent.local_addr().unwrap());
    registry.timeout_ms = 1_000;
    let explorer = Explorer::new(&env.settings.kafka, &env.settings.producer, &registry).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = std::time::Instant::now();
    let page = runtime
        .block_on(explorer.read(&topic, partition, Start::Tail, 7))
        .unwrap();
    assert_eq!(page.records.len(), 7);
    // One timeout of 1 s, not six.
    assert!(
        started.elapsed() < Duration::from_millis(3_500),
        "asked once, not per record: {:?}",
        started.elapsed()
    );
    let (last, framed) = page.records.split_last().unwrap();
    for r in framed {
        match &r.decoded {
            Decoded::Undecodable {
                class,
                schema_id: Some(_),
                ..
            } => assert_eq!(*class, "registry_unavailable"),
            other => panic!("offset {}: {other:?}", r.offset),
        }
    }
    assert!(
        matches!(
            &last.decoded,
            Decoded::Undecodable {
                class: "not_framed",
                ..
            }
        ),
        "{:?}",
        last.decoded
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
        for schema in [v1, v2] {
            register(&env, &subject, schema).await;
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
        // A level set on the subject is its own.
        let url = format!("{}/config/{subject}", env.settings.registry.url);
        let put = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .put(&url)
            .json(&serde_json::json!({"compatibility": "FULL"}));
        assert!(put.send().await.unwrap().status().is_success());
        let level = reader.compatibility(&subject).await.unwrap();
        assert_eq!(
            (
                level.level.as_str(),
                level.global.as_str(),
                level.own_level()
            ),
            ("FULL", "BACKWARD", true)
        );
        assert!(!mine.compatibility.own_level());
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

/// In a browser, a viewer finds an order's events by its id: every event
/// decoded (event name, envelope with the order id, schema id, headers),
/// and a poison record with the same key shown as undecodable, not as an
/// error page; the partition view and the schemas pages (diff of two
/// versions) render too. Screenshots of each page at both widths.
#[tokio::test(flavor = "multi_thread")]
async fn the_explorer_finds_an_orders_events_and_shows_a_poison_record_as_undecodable_in_the_browser()
 {
    let env = TestEnv::new().with_database().await;
    let topic = env.settings.topics.order_events.name.clone();
    let records = tokio::task::block_in_place(|| {
        produce_orders(&env, 120, 30);
        env.read(&topic, 120, Duration::from_secs(60))
    });
    let mut by_order: BTreeMap<String, usize> = BTreeMap::new();
    for m in &records {
        *by_order
            .entry(String::from_utf8(m.key().unwrap().to_vec()).unwrap())
            .or_default() += 1;
    }
    let (order, events) = by_order.into_iter().max_by_key(|(_, n)| *n).unwrap();
    assert!(events >= 2, "an order with a few events: {events}");
    // A poison record of the same order, where the producers put its events.
    let partitioner =
        Partitioner::of_producer(&env.settings.kafka, &env.settings.producer).unwrap();
    let partition = partitioner.partition(order.as_bytes(), 12).unwrap();
    tokio::task::block_in_place(|| {
        produce_raw(
            &env,
            &topic,
            partition,
            &[(&order, b"{\"order_id\": \"json, not avro\"}")],
        )
    });
    let subject = format!("{}.things-value", env.prefix);
    register(
        &env,
        &subject,
        r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"long"}]}"#,
    )
    .await;
    register(&env, &subject, r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"long"},{"name":"coupon","type":["null","string"],"default":null}]}"#).await;

    let console = TestConsole::start(&env, |_| {}).await;
    let browser = Browser::start(&console).await;
    browser.login(Role::Viewer).await;
    browser.open("/topics").await;
    browser.fill("#order_id", &order).await;
    browser
        .click("form[action='/topics'] button[type='submit']")
        .await;
    browser
        .client
        .wait()
        .for_element(Locator::Css("#results"))
        .await
        .unwrap();
    assert_eq!(
        browser.text("h1").await,
        "Topics",
        "the results page, not an error page"
    );
    let heading = browser.text("#results").await;
    assert!(
        heading.contains(&format!(
            "Order {order} in {topic}: {} record(s) in partition {partition}",
            events + 1
        )),
        "{heading}"
    );
    let decoded = browser.texts("article[data-kind='envelope']").await;
    assert_eq!(decoded.len(), events, "every event of the order decoded");
    for text in &decoded {
        assert!(
            text.contains(&format!("\"order_id\": {order}")) && text.contains("order."),
            "{text}"
        );
    }
    let poison = browser.texts("article[data-kind='undecodable']").await;
    assert_eq!(poison.len(), 1, "{poison:?}");
    assert!(
        poison[0].contains("undecodable: not_framed") && poison[0].contains("magic byte is 0x7b"),
        "{}",
        poison[0]
    );
    assert!(
        poison[0].contains(&format!("Key\n{order}")) || poison[0].contains(&order),
        "{}",
        poison[0]
    );
    // The poison record in view for the screenshots.
    browser
        .client
        .execute(
            "document.querySelector(\"article[data-kind='undecodable']\").scrollIntoView()",
            vec![],
        )
        .await
        .unwrap();
    browser.screenshots("topics-order-search").await;

    // The partition, newest records last; the poison record is the last one.
    browser
        .open(&format!(
            "/topics/{topic}?partition={partition}&from=tail&limit=5"
        ))
        .await;
    let kinds = browser
        .client
        .find_all(Locator::Css("article.record"))
        .await
        .unwrap();
    let last = kinds.last().unwrap().attr("data-kind").await.unwrap();
    assert_eq!(last.as_deref(), Some("undecodable"));
    browser.screenshots("topic-partition").await;
    // A bad input is a 400 page naming the field.
    browser
        .open(&format!("/topics/{topic}?partition=1&offset=-3"))
        .await;
    let error = browser.text("main").await;
    assert!(
        error.contains("offset") && error.contains("not an offset"),
        "{error}"
    );

    browser.open("/schemas").await;
    let subjects = browser.text("main table").await;
    assert!(
        subjects.contains(&subject) && subjects.contains(&format!("{}-value", topic)),
        "{subjects}"
    );
    browser.screenshots("schemas").await;
    browser.open(&format!("/schemas/{subject}?version=1")).await;
    let shown = browser.text("#shown").await;
    assert!(shown.starts_with("Version 1 (schema id"), "{shown}");
    assert!(
        !browser.text("main pre.json").await.contains("coupon"),
        "version 1 has no coupon"
    );
    browser.screenshots("schema").await;
    browser.open(&format!("/schemas/{subject}")).await;
    browser.click("#old option[value='1']").await;
    browser.click("#new option[value='2']").await;
    browser.click("form.filters button[type='submit']").await;
    browser
        .client
        .wait()
        .for_element(Locator::Css("#changes"))
        .await
        .unwrap();
    let changes = browser.text("#changes").await;
    assert!(
        changes.contains("coupon") && changes.contains("Added"),
        "{changes}"
    );
    assert!(browser.text("main").await.contains("Backward compatible"));
    browser.screenshots("schema-diff").await;
    // A viewer sees the subscriptions, with no action.
    browser.open("/subscriptions").await;
    assert_eq!(browser.action_forms().await, 0);
    assert!(
        browser
            .client
            .find(Locator::Css("a[href='/subscriptions/new']"))
            .await
            .is_err()
    );
    browser.open("/subscriptions/new").await;
    assert_eq!(browser.action_forms().await, 0);
    assert!(
        browser
            .text("main")
            .await
            .contains("Only an operator may change subscriptions")
    );
    browser.close().await;
}

/// In a browser, an operator creates, edits, disables, enables and
/// applies subscriptions; each writes an audit row (a refused create
/// too), through the store the CLI and the admin API use.
#[tokio::test(flavor = "multi_thread")]
async fn subscription_actions_in_the_browser_write_audit_rows() {
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    let cli_store = Store::new(db.clone(), Origin::Cli);
    let consumer = NewConsumer {
        name: "sms".into(),
        url: "http://127.0.0.1:9/sms".into(),
        ..NewConsumer::default()
    };
    cli_store.add_consumer(&consumer).await.unwrap();

    let console = TestConsole::start(&env, |_| {}).await;
    let browser = Browser::start(&console).await;
    browser.login(Role::Operator).await;
    browser.open("/subscriptions/new").await;
    browser.fill("#event", "shop.table_user.insert").await;
    browser.click("#consumer option[value='sms']").await;
    browser.fill("#bind_key", "user").await;
    browser.fill("#filters", "status:between:1").await;
    browser.click("form.stack button[type='submit']").await;
    // Refused, the form shown again naming the field, nothing created.
    let alert = browser
        .wait_text("[role='alert']", Duration::from_secs(20), |_| true)
        .await;
    assert!(
        alert.starts_with("filters:") && alert.contains("accepted forms"),
        "{alert}"
    );
    assert!(
        cli_store
            .list_subscriptions(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    browser.screenshots("subscription-form").await;
    browser.fill("#filters", "status:eq:1").await;
    browser.click("form.stack button[type='submit']").await;
    browser
        .wait_text("h1", Duration::from_secs(20), |t| t == "Subscriptions")
        .await;
    let subs = cli_store
        .list_subscriptions(&Default::default())
        .await
        .unwrap();
    assert_eq!(subs.len(), 1);
    let id = subs[0].id;
    let row = browser.text(&format!("#sub-{id}")).await;
    assert!(
        row.contains("shop.table_user.insert") && row.contains("sms.user.consumer"),
        "{row}"
    );
    assert_eq!(browser.text(&format!("#sub-{id} .state")).await, "enabled");

    browser
        .click(&format!("#sub-{id} a[href='/subscriptions/{id}/edit']"))
        .await;
    browser.fill("#bind_key", "user2").await;
    browser.fill("#filters", "status:changed:1->2").await;
    browser.click("form.stack button[type='submit']").await;
    browser
        .wait_text(&format!("#sub-{id}"), Duration::from_secs(20), |t| {
            t.contains("sms.user2.consumer")
        })
        .await;
    let edited = cli_store.subscription(id).await.unwrap();
    assert_eq!(
        (edited.bind_key.as_str(), edited.filters[0].to_cli()),
        ("user2", "status:changed:1->2".to_string())
    );

    browser.click(&format!("#sub-{id} form button")).await;
    browser
        .wait_text(&format!("#sub-{id} .state"), Duration::from_secs(20), |t| {
            t == "disabled"
        })
        .await;
    assert!(!cli_store.subscription(id).await.unwrap().enabled);
    browser.click(&format!("#sub-{id} form button")).await;
    browser
        .wait_text(&format!("#sub-{id} .state"), Duration::from_secs(20), |t| {
            t == "enabled"
        })
        .await;
    assert!(cli_store.subscription(id).await.unwrap().enabled);

    browser.click("#apply-now").await;
    let notice = browser
        .wait_text("[role='status']", Duration::from_secs(20), |_| true)
        .await;
    let request = cli_store.latest_request().await.unwrap().unwrap();
    assert_eq!(
        (request.kind, request.origin.as_str()),
        (RequestKind::Refresh, "console")
    );
    assert!(
        notice.contains(&format!("Apply request {} written", request.id)),
        "{notice}"
    );
    // Desired vs actual: the group is desired, and no router runs it.
    let groups = browser.text("#groups").await;
    assert!(
        groups.contains("sms.user2.consumer") && groups.contains("missing"),
        "{groups}"
    );
    browser.screenshots("subscriptions").await;
    browser.close().await;

    let rows = audit::recent(&db, None, 50).await.unwrap();
    let trail: Vec<(String, String, i64, bool)> = rows
        .iter()
        .rev()
        .map(|r| {
            (
                r.action.clone(),
                r.who.clone(),
                r.item_count,
                r.outcome == "ok",
            )
        })
        .collect();
    let op = |action: &str, count: i64, ok: bool| {
        (action.to_string(), "operator-token".to_string(), count, ok)
    };
    assert_eq!(
        trail,
        [
            op("subs.create", 0, false),
            op("subs.create", 1, true),
            op("subs.update", 1, true),
            op("subs.disable", 1, true),
            op("subs.enable", 1, true),
            op("subs.apply", 1, true),
        ]
    );
    assert!(
        rows.last().unwrap().outcome.contains("filters"),
        "the refusal says why"
    );
    assert!(
        rows[0]
            .target
            .contains(&format!("\"request\":{}", request.id)),
        "{}",
        rows[0].target
    );
}
