//! `[cdc.redact]`: dropped, hashed and masked columns never reach Kafka,
//! in the blocking snapshot and the stream, in `data` and `old`, with both
//! value formats. Checked with Kafka's own Java console consumer on the
//! raw records, and the hashes against Python's `hmac` module.

use std::process::Command;
use std::time::Duration;

use orderpipe::cdc::change::ChangeKind;
use serde_json::{Value, json};

use crate::cdc::{Source, by_key};
use crate::helpers::STACK_SCRIPT;
use crate::subscriptions::call;

const HASH_KEY: &str = "a test key of the hashes, 32+ bytes long";
const ADMIN_TOKEN: &str = "redact-admin-token-for-tests";

/// Values that must not appear on the topic in any form.
const SECRETS: [&str; 6] = [
    "13800000000",
    "13900000000",
    "ID-SECRET-1",
    "ID-SECRET-2",
    "ann@example.com",
    "bob@example.com",
];

/// HMAC-SHA-256 of `value` under [`HASH_KEY`], as Python computes it.
fn python_hmac(value: &str) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), sys.argv[2].encode(), hashlib.sha256).hexdigest())",
            HASH_KEY,
            value,
        ])
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Every record of `topic` as Kafka's Java console consumer prints it
/// (key and value bytes as text), read_committed.
fn java_console_consumer(bootstrap: &str, topic: &str, count: usize) -> String {
    let out = Command::new(STACK_SCRIPT)
        .args([
            "kafka-class",
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--isolation-level",
            "read_committed",
            "--max-messages",
            &count.to_string(),
            "--timeout-ms",
            "60000",
            "--property",
            "print.key=true",
        ])
        .output()
        .expect("dev/stack.sh kafka-class runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "console consumer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

async fn redacted_columns_never_reach_kafka(format: &str) {
    let mut source = Source::new(&[
        "CREATE TABLE people (id BIGINT PRIMARY KEY, name VARCHAR(20), mobile VARCHAR(20), \
         id_card VARCHAR(20), email VARCHAR(50))",
        "INSERT INTO people VALUES (1, 'ann', '13800000000', 'ID-SECRET-1', 'ann@example.com')",
    ])
    .await;
    let config = std::env::temp_dir().join(format!("{}-redact.toml", source.env.prefix));
    std::fs::write(
        &config,
        format!(
            "[cdc.redact.\"{}.people\"]\ndrop = [\"id_card\"]\nhash = [\"mobile\"]\nmask = [\"email\"]\n",
            source.database
        ),
    )
    .unwrap();
    source
        .env
        .set_env("ORDERPIPE_CONFIG", config.to_str().unwrap());
    source.env.set_env("ORDERPIPE_CDC__HASH_KEY", HASH_KEY);
    source.env.set_env("ORDERPIPE_CDC__VALUE_FORMAT", format);
    source.snapshot("people", &[]).success();
    let mut cdc = source.spawn("people");
    // Bob shares Ann's mobile: equal values, equal hashes.
    source
        .exec(&[
            "INSERT INTO people VALUES (2, 'bob', '13800000000', 'ID-SECRET-2', 'bob@example.com')",
        ])
        .await;
    source
        .exec(&["UPDATE people SET mobile = '13900000000', id_card = 'ID-SECRET-3', email = NULL WHERE id = 2"])
        .await;
    source.exec(&["DELETE FROM people WHERE id = 1"]).await;

    let changes = source.changes("people", 4, Duration::from_secs(60)).await;
    let (first, second) = (python_hmac("13800000000"), python_hmac("13900000000"));
    // Per key, in offset order (the keys are in different partitions).
    let seen: Vec<(ChangeKind, &Value, Option<&Value>)> = by_key(&changes)
        .into_values()
        .flatten()
        .map(|e| (e.change, &e.data, e.old.as_ref()))
        .collect();
    let ann = json!({"id": 1, "name": "ann", "mobile": first, "email": "***"});
    assert_eq!(
        seen,
        [
            (ChangeKind::Insert, &ann, None),
            (ChangeKind::Delete, &ann, None),
            (
                ChangeKind::Insert,
                &json!({"id": 2, "name": "bob", "mobile": first, "email": "***"}),
                None
            ),
            (
                ChangeKind::Update,
                &json!({"id": 2, "name": "bob", "mobile": second, "email": null}),
                Some(&json!({"mobile": first, "email": "***"}))
            ),
        ],
        "value_format {format}"
    );

    if format == "avro" {
        let (schema, fields) = source.data_fields(&changes[0].0).await;
        let fields: Vec<(&str, &Value)> = fields.iter().map(|(n, t)| (n.as_str(), t)).collect();
        assert_eq!(
            fields,
            [
                ("id", &json!("long")),
                ("name", &json!("string")),
                ("mobile", &json!("string")),
                ("email", &json!("string")),
            ],
            "{schema}"
        );
    }

    // The raw records, read by Kafka's own client: the names pass, no secret does.
    let raw = tokio::task::block_in_place(|| {
        java_console_consumer(
            &source.env.settings.kafka.bootstrap_servers,
            &source.topic("people"),
            4,
        )
    });
    assert!(raw.contains("ann") && raw.contains("bob"), "{raw}");
    assert!(raw.contains(&first), "the hash is on the topic: {raw}");
    for secret in SECRETS.iter().chain(&["ID-SECRET-3", "id_card"]) {
        assert!(
            !raw.contains(secret),
            "value_format {format}: {secret:?} reached Kafka: {raw}"
        );
    }
    assert!(matches!(cdc.try_wait(), Ok(None)), "cdc still runs");
    let _ = cdc.kill();
    let _ = std::fs::remove_file(config);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_value_format_json_dropped_hashed_and_masked_columns_never_reach_kafka() {
    redacted_columns_never_reach_kafka("json").await;
}

/// The typed schema has no dropped column, and the hashed and masked ones as strings.
#[tokio::test(flavor = "multi_thread")]
async fn with_value_format_avro_dropped_hashed_and_masked_columns_never_reach_kafka() {
    redacted_columns_never_reach_kafka("avro").await;
}

/// A `cdc_sources` row's `redact` applies as `[cdc.redact]` does, a bad
/// one is refused naming the flag, and a change of it applies while `cdc
/// --source` runs: from one change on, with the new rules, never the old
/// ones again. Then the rules move to an event definition (the admin API):
/// refused while the row names the table too, applied once it does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_rows_redact_applies_and_a_change_of_it_applies_while_cdc_runs() {
    let mut source = Source::new(&[
        "CREATE TABLE people (id BIGINT PRIMARY KEY, name VARCHAR(20), mobile VARCHAR(20))",
    ])
    .await;
    source.env.set_env("ORDERPIPE_CDC__HASH_KEY", HASH_KEY);
    source.env.set_env("ORDERPIPE_ADMIN__TOKEN", ADMIN_TOKEN);
    let (db, topic) = (source.database.clone(), source.topic("people"));
    let rules = |action: &str| format!(r#"{{"{db}.people": {{"{action}": ["mobile"]}}}}"#);
    let env = &source.env;
    crate::cdc_sources::add_local_source(&source, "shop", &["--redact", &rules("mask")]);
    let bad = env
        .cli(&[
            "subs",
            "update",
            "source",
            "shop",
            "--redact",
            r#"{"people": {"drop": ["mobile"]}}"#,
        ])
        .failure();
    assert!(
        bad.contains("--redact") && bad.contains("<database>.<table>"),
        "{bad}"
    );
    for change in ["insert", "update"] {
        let key = format!("{db}.people.{change}");
        env.cli(&[
            "subs", "add", "event", &key, "--topic", &topic, "--source", "shop",
        ])
        .success();
    }
    let mut cdc = crate::cdc_sources::spawn_cdc(&source, "shop");
    source
        .exec(&["INSERT INTO people VALUES (1, 'ann', '13800000000')"])
        .await;
    let first = source.changes("people", 1, Duration::from_secs(60)).await;
    assert_eq!(
        first[0].1.data,
        json!({"id": 1, "name": "ann", "mobile": "***"})
    );

    // Hash instead of mask: rows go in until one comes out hashed.
    env.cli(&[
        "subs",
        "update",
        "source",
        "shop",
        "--redact",
        &rules("hash"),
    ])
    .success();
    let hashed = python_hmac("13800000000");
    // Each row's mobile, in id order, once `rows` rows are out.
    let mobiles = |changes: &[(
        rdkafka::message::OwnedMessage,
        orderpipe::cdc::change::ChangeEvent,
    )]| {
        by_key(changes)
            .into_iter()
            .map(|(key, events)| {
                (
                    key.parse::<i64>().unwrap(),
                    events[0].data["mobile"].clone(),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_values()
            .collect::<Vec<Value>>()
    };
    let insert = |id: usize| format!("INSERT INTO people VALUES ({id}, 'bob', '13800000000')");
    let mut rows = 1;
    while rows < 200 {
        rows += 1;
        source.exec(&[&insert(rows)]).await;
        let out = source
            .changes("people", rows, Duration::from_secs(30))
            .await;
        if mobiles(&out).last() == Some(&json!(hashed)) {
            break;
        }
    }
    // Three more after the switch: none goes back to the old rules.
    for _ in 0..3 {
        rows += 1;
        source.exec(&[&insert(rows)]).await;
    }
    let seen = mobiles(
        &source
            .changes("people", rows, Duration::from_secs(30))
            .await,
    );
    let switched = seen
        .iter()
        .position(|m| *m == json!(hashed))
        .expect("a change with the new rules within 200 rows");
    assert!(
        seen[..switched].iter().all(|m| *m == json!("***"))
            && seen[switched..].iter().all(|m| *m == json!(hashed)),
        "masked, then hashed from one change on: {seen:?}"
    );
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "the same cdc process runs"
    );

    // The rules move to an event definition, through the admin API: while
    // the row still names the table they are refused (the hashing goes on);
    // once the row's are cleared, the definition's apply.
    let admin = crate::subscriptions::Admin::start(env);
    let insert_key = format!("{db}.people.insert");
    let (status, answer) = call(
        "PATCH",
        &format!("{}/events/{insert_key}", admin.base),
        Some(ADMIN_TOKEN),
        Some(json!({"redact": {"drop": ["mobile"], "hash": ["mobile"]}})),
    )
    .await;
    assert_eq!(
        (status, answer["field"].as_str()),
        (400, Some("redact")),
        "{answer}"
    );
    let (status, answer) = call(
        "PATCH",
        &format!("{}/events/{insert_key}", admin.base),
        Some(ADMIN_TOKEN),
        Some(json!({"redact": {"drop": ["mobile"]}})),
    )
    .await;
    assert_eq!(
        (status, &answer["redact"]["drop"]),
        (200, &json!(["mobile"])),
        "{answer}"
    );
    let listed = env.cli(&["subs", "list", "events"]).success();
    assert!(listed.contains("drop mobile"), "{listed}");
    env.cli(&["subs", "update", "source", "shop", "--redact", "{}"])
        .success();
    let before = rows;
    let mut dropped = false;
    while rows < before + 200 && !dropped {
        rows += 1;
        source.exec(&[&insert(rows)]).await;
        let out = source
            .changes("people", rows, Duration::from_secs(30))
            .await;
        dropped = mobiles(&out).last() == Some(&Value::Null);
    }
    let seen = mobiles(
        &source
            .changes("people", rows, Duration::from_secs(30))
            .await,
    );
    let gone = seen[before..]
        .iter()
        .position(Value::is_null)
        .expect("a change without mobile within 200 rows")
        + before;
    assert!(
        seen[switched..gone].iter().all(|m| *m == json!(hashed))
            && seen[gone..].iter().all(Value::is_null),
        "hashed until the definition's rules applied, then dropped, never in clear: {seen:?}"
    );
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "the same cdc process runs"
    );
    let _ = cdc.kill();
}
