//! A row change bigger than a Kafka record (issue 24): a 1.4 MB `LONGTEXT`
//! between two ordinary rows, for each `cdc.oversize`, on the real stack.
//! The oracles are outside cdc: MariaDB (the row's length and prefix, the
//! GTID it gave the transaction, its binlog positions around it), a
//! read_committed reader of the topics, and what librdkafka and the broker
//! accept at the sizes [`RecordLimit`] computes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use orderpipe::kafka::size_limit::{BATCH_HEADER, RecordLimit};
use rdkafka::Message;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use sqlx::{Connection, MySqlConnection, Row};

use crate::cdc::Source;
use crate::helpers::wait_for_topic;
use crate::helpers::{MYSQL_ADMIN_URL, TestEnv, header};

/// Characters of the big row's body: 1.4 MB.
const BIG: usize = 1_400_000;

const DDL: &str =
    "CREATE TABLE docs (id INT PRIMARY KEY, title VARCHAR(40) NOT NULL, body LONGTEXT)";

/// What MariaDB says about the big row's transaction.
struct BigRow {
    gtid: String,
    file: String,
    /// Binlog end before and after its commit (other tests write too, so
    /// its end position is in between, not equal to either).
    before: u64,
    after: u64,
}

async fn master_status(conn: &mut MySqlConnection) -> (String, u64) {
    let row = sqlx::query("SHOW MASTER STATUS")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    (row.get::<String, _>(0), row.get::<u64, _>(1))
}

/// Row 1, the big row 2, row 3: three transactions.
async fn write_rows(source: &Source) -> BigRow {
    source
        .exec(&["INSERT INTO docs VALUES (1, 'before', 'small')"])
        .await;
    let mut conn = MySqlConnection::connect(&format!("{MYSQL_ADMIN_URL}{}", source.database))
        .await
        .unwrap();
    let (file, before) = master_status(&mut conn).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO docs VALUES (2, 'big', REPEAT('0123456789abcdef', {}))",
        BIG / 16
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let gtid: String = sqlx::query_scalar("SELECT @@last_gtid")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let (after_file, after) = master_status(&mut conn).await;
    assert_eq!(file, after_file, "the binlog rotated during the test");
    source
        .exec(&["INSERT INTO docs VALUES (3, 'after', 'small')"])
        .await;
    BigRow {
        gtid,
        file,
        before,
        after,
    }
}

/// The database's body of row `id` and whether `prefix` is its start.
async fn body_of(source: &Source, id: i32, prefix: &str) -> (usize, bool) {
    let mut conn = MySqlConnection::connect(&format!("{MYSQL_ADMIN_URL}{}", source.database))
        .await
        .unwrap();
    let row = sqlx::query("SELECT LENGTH(body), LEFT(body, ?) = ? FROM docs WHERE id = ?")
        .bind(prefix.chars().count() as i64)
        .bind(prefix)
        .bind(id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (row.get::<i64, _>(0) as usize, row.get::<i64, _>(1) == 1)
}

/// What `orderpipe ARGS` prints as JSON.
fn json_of(env: &TestEnv, args: &[&str]) -> Value {
    serde_json::from_str(&env.cli(args).success()).unwrap()
}

fn dead_letter_topic(source: &Source) -> String {
    format!("{}.cdc.dlq", source.env.prefix)
}

fn cdc_args(source: &Source) -> Vec<String> {
    [
        "cdc",
        "--table",
        &format!("{}.docs", source.database),
        "--server-id",
        &source.server_id,
        "--start-position",
        &source.start,
    ]
    .map(String::from)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_row_over_the_limit_is_dead_lettered_with_its_place_and_the_stream_goes_on() {
    let source = Source::new(&[DDL]).await;
    let mut cdc = source.spawn("docs");
    let big = write_rows(&source).await;

    // Both ordinary rows, once each (`changes` fails on a third record).
    let changes = source.changes("docs", 2, Duration::from_secs(90)).await;
    let keys: Vec<&str> = changes.iter().map(|(_, e)| e.key.as_str()).collect();
    assert_eq!(
        keys.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        ["1", "3"].into(),
        "{keys:?}"
    );

    // The big row: exactly one dead letter, in a committed transaction.
    let topic = dead_letter_topic(&source);
    let records =
        tokio::task::block_in_place(|| source.env.read(&topic, 1, Duration::from_secs(30)));
    let record = &records[0];
    assert!(
        record.payload().unwrap().len() < 1_000_000,
        "the dead letter itself fits"
    );
    assert_eq!(
        record.key(),
        Some(&b"2"[..]),
        "keyed by the row's primary key"
    );
    let value: Value = serde_json::from_slice(record.payload().unwrap()).unwrap();
    let event = &value["event"];
    assert_eq!(event["table"], "docs");
    assert_eq!(event["database"], source.database.as_str());
    assert_eq!(event["key"], "2");
    assert_eq!(
        event["gtid"],
        big.gtid.as_str(),
        "MariaDB's @@last_gtid of the big row's transaction"
    );
    assert_eq!(event["binlog_file"], big.file.as_str());
    let pos = event["binlog_pos"].as_u64().unwrap();
    assert!(
        big.before < pos && pos <= big.after,
        "{} < {pos} <= {}",
        big.before,
        big.after
    );
    assert_eq!(event["row_index"], 0);
    let size = value["size"].as_u64().unwrap() as usize;
    assert!(
        size > BIG,
        "the change record's size {size} counts the 1.4 MB body"
    );
    assert_eq!(value["limit"], 1_000_000, "{value:#}");
    assert_eq!(value["limit_from"], "producer message.max.bytes = 1000000");
    assert_eq!(value["error_class"], "oversized");
    let cut = event["data"]["body"].as_str().unwrap();
    let (length, is_prefix) = body_of(&source, 2, cut).await;
    assert_eq!(
        value["truncated"]["body"], length,
        "the original length, as MariaDB has it"
    );
    assert!(
        is_prefix && cut.len() > 900_000,
        "the body is cut to fit, from its start ({} bytes)",
        cut.len()
    );
    assert_eq!(event["data"]["title"], "big");
    let error = value["error"].as_str().unwrap();
    let place = format!(
        "{}.docs key 2 at binlog {}:{pos}, GTID {}",
        source.database, big.file, big.gtid
    );
    assert!(error.starts_with(&place), "{error}");
    assert_eq!(
        header(record, "orderpipe.group").as_deref(),
        Some(&*format!("cdc:{}", source.env.prefix))
    );
    assert_eq!(
        header(record, "orderpipe.original-topic"),
        Some(source.topic("docs"))
    );
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "cdc goes on: {}",
        cdc.stop_and_output()
    );

    // The persister stores it; `dlq list` shows it; `dlq replay` refuses it, saying why.
    source.env.cli(&["topics", "ensure"]).success();
    source
        .env
        .cli(&["dlq", "persist", "--until-idle", "3"])
        .success();
    let group = format!("cdc:{}", source.env.prefix);
    let list = || {
        json_of(
            &source.env,
            &["dlq", "list", "--group", &group, "--output", "json"],
        )
    };
    let listed = list();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed:#}");
    assert_eq!(rows[0]["original_topic"], source.topic("docs").as_str());
    assert_eq!(rows[0]["original_partition"], -1);
    assert_eq!(rows[0]["original_offset"], record.offset());
    assert_eq!(rows[0]["error_class"], "oversized");
    assert!(
        rows[0]["error_message"]
            .as_str()
            .unwrap()
            .starts_with(&place),
        "{listed:#}"
    );
    // A second persister run over the same record adds nothing.
    source
        .env
        .cli(&["dlq", "persist", "--until-idle", "3"])
        .success();
    assert_eq!(list().as_array().unwrap().len(), 1);
    // `dlq show` gives the JSON value: the place, the size, the cut row.
    let id = rows[0]["id"].as_i64().unwrap().to_string();
    let shown = json_of(&source.env, &["dlq", "show", &id, "--output", "json"]);
    assert_eq!(shown["envelope"]["event"]["key"], "2", "{shown:#}");
    assert_eq!(shown["envelope"]["size"], size);
    let replay = source
        .env
        .cli(&["dlq", "replay", "--group", &group, "--yes"])
        .text();
    assert!(
        replay.contains("could not publish") && replay.contains("read the row from the database"),
        "{replay}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_oversize_fail_cdc_stops_naming_the_table_key_size_limit_and_position() {
    let mut source = Source::new(&[DDL]).await;
    source.env.set_env("ORDERPIPE_CDC__OVERSIZE", "fail");
    let big = write_rows(&source).await;
    let args = cdc_args(&source);
    let mut cdc = source
        .env
        .spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let deadline = Instant::now() + Duration::from_secs(90);
    while matches!(cdc.try_wait(), Ok(None)) {
        assert!(
            Instant::now() < deadline,
            "cdc did not stop: {}",
            cdc.stop_and_output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = cdc.stop_and_output();
    assert!(!text.starts_with("exit status: 0"), "{text}");
    let place = format!("{}.docs key 2 at binlog {}:", source.database, big.file);
    assert!(
        text.contains(&place) && text.contains(&format!("GTID {}", big.gtid)),
        "{text}"
    );
    assert!(
        text.contains("is over the limit of 1000000 bytes (producer message.max.bytes = 1000000)"),
        "{text}"
    );
    assert!(text.contains("cdc.oversize = \"fail\""), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_oversize_truncate_the_big_row_is_published_cut_to_fit_and_marked() {
    let mut source = Source::new(&[DDL]).await;
    source.env.set_env("ORDERPIPE_CDC__OVERSIZE", "truncate");
    let _cdc = source.spawn("docs");
    write_rows(&source).await;
    let changes = source.changes("docs", 3, Duration::from_secs(90)).await;
    let mut by_key: BTreeMap<String, _> = changes
        .into_iter()
        .map(|(m, e)| (e.key.clone(), (m, e)))
        .collect();
    let (record, event) = by_key
        .remove("2")
        .expect("the big row is on its change topic");
    assert!(record.payload().unwrap().len() < 1_000_000);
    let marked: Value =
        serde_json::from_str(&header(&record, "cdc-truncated").expect("marked")).unwrap();
    let cut = event.data["body"].as_str().unwrap();
    let (length, is_prefix) = body_of(&source, 2, cut).await;
    assert_eq!(marked, serde_json::json!({"body": length}));
    assert!(is_prefix && cut.len() > 900_000, "{} bytes", cut.len());
    assert_eq!(event.data["title"], "big", "a column that fits is not cut");
    for (_, (record, event)) in by_key {
        assert!(header(&record, "cdc-truncated").is_none());
        assert_eq!(event.data["body"], "small");
    }
    // Nothing dead-lettered (read fails on an extra record).
    let topic = dead_letter_topic(&source);
    tokio::task::block_in_place(|| source.env.read(&topic, 0, Duration::from_secs(5)));
}

/// What librdkafka and the broker really refuse, against [`RecordLimit`]'s
/// arithmetic: librdkafka refuses at produce time one byte over
/// `message.max.bytes` as [`RecordLimit::record_size`] counts it; the
/// broker refuses a record over the topic's `max.message.bytes` less the
/// batch header (once its varints, which `record_size` counts at their
/// widest, are over too).
#[tokio::test(flavor = "multi_thread")]
async fn the_limit_is_what_librdkafka_and_the_broker_refuse() {
    let env = TestEnv::new();
    let topic = format!("{}.sizes", env.prefix);
    let admin = env.admin();
    let spec = rdkafka::admin::NewTopic::new(&topic, 1, rdkafka::admin::TopicReplication::Fixed(1))
        .set("max.message.bytes", "300000");
    admin
        .create_topics([&spec], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    // The broker answers DescribeConfigs from its metadata, which learns of
    // the topic a moment after CreateTopics returns.
    tokio::task::block_in_place(|| wait_for_topic(&env, &topic));
    let topic_max =
        orderpipe::kafka::size_limit::topic_max_message_bytes(&env.settings.kafka, &topic).await;
    assert_eq!(
        topic_max,
        Some(300_000),
        "DescribeConfigs reads the topic's limit"
    );
    let headers = [("event_id", &b"0123456789"[..])];
    let send = |options: &BTreeMap<String, String>, value_len: usize| {
        let producer: FutureProducer = orderpipe::kafka::client::client_config(options)
            .create()
            .unwrap();
        let value: Vec<u8> = (0..value_len).map(|_| rand::random::<u8>()).collect();
        let topic = topic.clone();
        async move {
            let hs = headers
                .iter()
                .fold(rdkafka::message::OwnedHeaders::new(), |h, (k, v)| {
                    h.insert(rdkafka::message::Header {
                        key: k,
                        value: Some(*v),
                    })
                });
            match producer.send_result(
                FutureRecord::to(&topic)
                    .key(&b"k"[..])
                    .payload(&value)
                    .headers(hs),
            ) {
                Err((e, _)) => Err(("librdkafka", e)),
                Ok(delivery) => match delivery.await.unwrap() {
                    Ok(_) => Ok(()),
                    Err((e, _)) => Err(("broker", e)),
                },
            }
        }
    };
    let value_for = |record: usize| record - RecordLimit::record_size(b"k", b"", &headers);
    let mut options = orderpipe::kafka::client::producer_options(
        &env.settings.kafka.client_options(),
        &BTreeMap::new(),
    )
    .unwrap();
    options.insert("compression.type".into(), "none".into());

    // Producer limit 200000 below the topic's: librdkafka decides, to the byte.
    options.insert("message.max.bytes".into(), "200000".into());
    let limit = RecordLimit::new(&options, topic_max.map(|m| (topic.clone(), m)));
    assert_eq!(limit.max_bytes, 200_000);
    let at = value_for(limit.max_bytes);
    assert_eq!(
        RecordLimit::record_size(b"k", &vec![0; at], &headers),
        limit.max_bytes
    );
    send(&options, at).await.unwrap();
    let refused = send(&options, at + 1).await.unwrap_err();
    assert!(
        matches!(
            refused,
            (
                "librdkafka",
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
            )
        ),
        "{refused:?}"
    );

    // Producer limit above the topic's: the broker decides; the limit is the topic's less the batch header.
    options.insert("message.max.bytes".into(), "2000000".into());
    let limit = RecordLimit::new(&options, topic_max.map(|m| (topic.clone(), m)));
    assert_eq!(limit.max_bytes, 300_000 - BATCH_HEADER);
    send(&options, value_for(limit.max_bytes)).await.unwrap();
    // record_size counts the record's 7 varints at their widest (36 bytes); on the wire
    // they take 11 here, so the broker takes 25 bytes more and refuses the 26th.
    send(&options, value_for(limit.max_bytes) + 25)
        .await
        .unwrap();
    let refused = send(&options, value_for(limit.max_bytes) + 26)
        .await
        .unwrap_err();
    assert_eq!(refused.0, "broker", "{refused:?}");
    assert_eq!(
        refused.1.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge),
        "{refused:?}"
    );
}

/// A topic whose limit drops after cdc read it: the broker refuses the
/// record cdc thought fit; cdc aborts, lowers that topic's limit, builds
/// the batch again with the row as a dead letter, and goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_the_broker_refuses_anyway_becomes_a_dead_letter_and_the_stream_goes_on() {
    let source = Source::new(&[DDL]).await;
    let mut cdc = source.spawn("docs");
    source
        .exec(&["INSERT INTO docs VALUES (1, 'before', 'small')"])
        .await;
    // Row 1 is published: cdc has read the topic's limit (the broker's 1048588).
    source.changes("docs", 1, Duration::from_secs(90)).await;
    let topic = source.topic("docs");
    let alter = rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(&topic))
        .set("max.message.bytes", "200000");
    source
        .env
        .admin()
        .alter_configs([&alter], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap()[0]
        .as_ref()
        .unwrap();
    // 600 kB of random letters: lz4 leaves it over 200000 bytes.
    let body: String = (0..600_000)
        .map(|_| (b'a' + rand::random::<u8>() % 26) as char)
        .collect();
    let mut conn = MySqlConnection::connect(&format!("{MYSQL_ADMIN_URL}{}", source.database))
        .await
        .unwrap();
    sqlx::query("INSERT INTO docs VALUES (2, 'random', ?)")
        .bind(&body)
        .execute(&mut conn)
        .await
        .unwrap();
    source
        .exec(&["INSERT INTO docs VALUES (3, 'after', 'small')"])
        .await;

    let changes = source.changes("docs", 2, Duration::from_secs(90)).await;
    // Rows 1 and 3 once each; keys in different partitions arrive in either order.
    let mut keys: Vec<&str> = changes.iter().map(|(_, e)| e.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["1", "3"]);
    let dlq = dead_letter_topic(&source);
    let records = tokio::task::block_in_place(|| source.env.read(&dlq, 1, Duration::from_secs(30)));
    let value: Value = serde_json::from_slice(records[0].payload().unwrap()).unwrap();
    assert_eq!(value["event"]["key"], "2");
    // The limit read again after the refusal: the topic's new one.
    let from = value["limit_from"].as_str().unwrap();
    assert!(
        from.starts_with(&format!(
            "topic {topic} max.message.bytes = 200000 (less the 61-byte batch header), read again"
        )),
        "{value:#}"
    );
    assert_eq!(value["limit"], 200_000 - 61);
    assert!(value["size"].as_u64().unwrap() > 600_000);
    assert_eq!(
        value["event"]["data"]["body"],
        body.as_str(),
        "the whole row: it fits the DLQ topic"
    );
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "cdc goes on: {}",
        cdc.stop_and_output()
    );
}
