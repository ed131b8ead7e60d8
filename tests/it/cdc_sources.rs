//! `orderpipe cdc --source NAME` on the real stack: the control plane's
//! `cdc_sources` row and event definitions choose what the binlog source
//! captures (src/cdc/catalogue.rs).

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::cdc::Source;

const TABLES: [&str; 2] = [
    "CREATE TABLE table_user (id BIGINT PRIMARY KEY, status INT NOT NULL)",
    "CREATE TABLE other (id BIGINT PRIMARY KEY, v INT)",
];

/// Whether `topic` exists on the broker (metadata of all topics, so the
/// look-up itself cannot create it).
fn topic_exists(source: &Source, topic: &str) -> bool {
    let consumer: BaseConsumer =
        orderpipe::kafka::client::client_config(&source.env.settings.kafka.client_options())
            .create()
            .unwrap();
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    metadata.topics().iter().any(|t| t.name() == topic)
}

/// `subs add source NAME` for the dev stack's MariaDB (as `orderpipe`), with `extra` flags.
pub(crate) fn add_local_source(source: &Source, name: &str, extra: &[&str]) {
    let mut args = vec![
        "subs",
        "add",
        "source",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        "3306",
        "--user",
        "orderpipe",
    ];
    args.extend_from_slice(extra);
    source.env.cli(&args).success();
}

/// `cdc --source NAME` with this test's server id and start position.
pub(crate) fn spawn_cdc(source: &Source, name: &str) -> crate::helpers::Spawned {
    source.env.spawn(&[
        "cdc",
        "--source",
        name,
        "--server-id",
        &source.server_id,
        "--start-position",
        &source.start,
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_row_and_its_event_definitions_choose_what_cdc_captures_and_a_change_applies_while_it_runs()
 {
    let mut source = Source::new(&TABLES).await;
    // The process's own source URL points nowhere: only the row's host and
    // port can reach the database; the password still comes from here.
    source.env.set_env(
        "ORDERPIPE_CDC__SOURCE",
        "mysql://nobody:orderpipe@192.0.2.1:1/",
    );
    let db = source.database.clone();
    let env = &source.env;
    add_local_source(&source, "shop", &[]);
    let user_topic = source.topic("table_user");
    let other_topic = source.topic("other");
    for change in ["insert", "update"] {
        env.cli(&[
            "subs",
            "add",
            "event",
            &format!("{db}.table_user.{change}"),
            "--topic",
            &user_topic,
            "--source",
            "shop",
        ])
        .success();
    }
    // An event definition of no source is not this source's to capture.
    env.cli(&[
        "subs",
        "add",
        "event",
        &format!("{db}.other.insert"),
        "--topic",
        &other_topic,
    ])
    .success();

    // Tables named twice are refused, naming both.
    let table = format!("{db}.table_user");
    let text = env
        .cli(&[
            "cdc",
            "--source",
            "shop",
            "--table",
            &table,
            "--server-id",
            &source.server_id,
        ])
        .failure();
    assert!(
        text.contains("--source shop and --table both say what to capture"),
        "{text}"
    );

    let mut cdc = spawn_cdc(&source, "shop");
    source
        .exec(&[
            "INSERT INTO table_user VALUES (1, 1)",
            "INSERT INTO other VALUES (1, 1)",
        ])
        .await;
    source
        .exec(&["UPDATE table_user SET status = 2 WHERE id = 1"])
        .await;
    let changes = source
        .changes("table_user", 2, Duration::from_secs(60))
        .await;
    let names: Vec<&str> = changes.iter().map(|(_, e)| e.event_name.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("{db}.table_user.insert"),
            format!("{db}.table_user.update")
        ]
    );
    assert!(matches!(cdc.try_wait(), Ok(None)), "cdc still runs");
    assert!(
        !topic_exists(&source, &other_topic),
        "{other_topic} is not captured by source shop"
    );

    // While it runs: table_user's definitions leave the source, other's
    // joins it. cdc restarts its stream from its checkpoint, same process.
    for change in ["insert", "update"] {
        let key = format!("{db}.table_user.{change}");
        env.cli(&["subs", "update", "event", &key, "--source", ""])
            .success();
    }
    let other_insert = format!("{db}.other.insert");
    env.cli(&["subs", "update", "event", &other_insert, "--source", "shop"])
        .success();
    let linked = std::time::Instant::now();
    tokio::task::block_in_place(|| crate::helpers::wait_for_topic(&source.env, &other_topic));
    eprintln!("other captured {:?} after the change", linked.elapsed());
    // One transaction over both tables: only other's row is published.
    source
        .exec(&[
            "INSERT INTO table_user VALUES (5, 1)",
            "INSERT INTO other VALUES (2, 2)",
        ])
        .await;
    let other = source.changes("other", 1, Duration::from_secs(30)).await;
    assert_eq!(other[0].1.event_name, other_insert);
    assert_eq!(other[0].1.key, "2");
    source
        .changes("table_user", 2, Duration::from_secs(10))
        .await;
    assert!(
        matches!(cdc.try_wait(), Ok(None)),
        "the same cdc process still runs"
    );
    crate::consumer::sigterm(&mut cdc);
    assert!(cdc.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disabled_unknown_or_empty_source_is_refused_by_name() {
    let source = Source::new(&TABLES).await;
    let db = source.database.clone();
    let env = &source.env;
    let run = |name: &str| {
        env.cli(&["cdc", "--source", name, "--server-id", &source.server_id])
            .failure()
    };
    for (name, disabled) in [("off", true), ("empty", false), ("default-topic", false)] {
        add_local_source(&source, name, if disabled { &["--disabled"] } else { &[] });
    }
    let user_topic = source.topic("table_user");
    let insert = format!("{db}.table_user.insert");
    env.cli(&[
        "subs",
        "add",
        "event",
        &insert,
        "--topic",
        &user_topic,
        "--source",
        "off",
    ])
    .success();
    let text = run("off");
    assert!(
        text.contains("source `off` is disabled (cdc_sources.enabled = 0)")
            && text.contains("orderpipe subs enable source off"),
        "{text}"
    );
    let text = run("nope");
    assert!(
        text.contains("--source nope: source `nope` not found"),
        "{text}"
    );
    let text = run("empty");
    assert!(
        text.contains(
            "no event definition <db>.<table>.<insert|update|delete> names source `empty`"
        ),
        "{text}"
    );
    // The default topic cdc.<db>.<table> is not where this cdc
    // (topic_prefix = the test's) writes: refused, naming both.
    let update = format!("{db}.table_user.update");
    env.cli(&["subs", "add", "event", &update, "--source", "default-topic"])
        .success();
    let text = run("default-topic");
    assert!(
        text.contains(&format!(
            "reads topic `cdc.{db}.table_user`, but cdc writes {db}.table_user to `{user_topic}`"
        )),
        "{text}"
    );
    // Through the configuration too, and refused next to cdc.tables.
    let mut source = source;
    source.env.set_env("ORDERPIPE_CDC__SOURCE_NAME", "off");
    let env = &source.env;
    let text = env
        .cli(&["cdc", "--server-id", &source.server_id])
        .failure();
    assert!(text.contains("source `off` is disabled"), "{text}");
    let text = env
        .cli(&[
            "cdc",
            "--table",
            &format!("{db}.table_user"),
            "--server-id",
            &source.server_id,
        ])
        .failure();
    assert!(
        text.contains("cdc.source_name off and --table both say what to capture"),
        "{text}"
    );
}

/// `cdc --source NAME snapshot` reads from the row's host and port, as the
/// stream does (the process's own URL points nowhere), and refuses a table
/// the source's definitions do not capture.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_with_a_source_row_reads_from_its_host_and_only_a_captured_table() {
    let mut source = Source::new(&TABLES).await;
    source
        .exec(&["INSERT INTO table_user VALUES (1, 1), (2, 2), (3, 3)"])
        .await;
    source.env.set_env(
        "ORDERPIPE_CDC__SOURCE",
        "mysql://nobody:orderpipe@192.0.2.1:1/",
    );
    let db = source.database.clone();
    let env = &source.env;
    add_local_source(&source, "shop", &[]);
    let user_topic = source.topic("table_user");
    let event = format!("{db}.table_user.insert");
    env.cli(&[
        "subs",
        "add",
        "event",
        &event,
        "--topic",
        &user_topic,
        "--source",
        "shop",
    ])
    .success();

    let snapshot = |table: &str| {
        let args = [
            "cdc",
            "--source",
            "shop",
            "snapshot",
            "--blocking",
            "--table",
            table,
            "--server-id",
            &source.server_id,
            "--output",
            "json",
        ];
        tokio::task::block_in_place(|| source.env.cli(&args))
    };
    let other = format!("{db}.other");
    let text = snapshot(&other).failure();
    assert!(
        text.contains(&format!(
            "--table {other}: source `shop` does not capture it"
        )) && text.contains(&format!("{db}.table_user")),
        "{text}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&snapshot(&format!("{db}.table_user")).success()).unwrap();
    assert_eq!(summary["rows"], 3, "{summary}");
    assert_eq!(
        source
            .changes("table_user", 3, Duration::from_secs(30))
            .await
            .len(),
        3
    );
}
