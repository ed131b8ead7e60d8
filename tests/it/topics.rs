//! `orderpipe topics ensure` / `describe` against the real broker, and the
//! read-only topic check of the roles that do not own topics.

use std::collections::BTreeSet;

use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use serde_json::Value;

use crate::helpers::TestEnv;
use orderpipe::kafka::client::client_config;

fn ensure(env: &TestEnv, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["topics", "ensure", "--output", "json"];
    args.extend(extra);
    let out = env.cli(&args).success();
    serde_json::from_str(&out).expect("ensure prints JSON")
}

fn mutations(changes: &[Value]) -> Vec<&Value> {
    changes
        .iter()
        .filter(|c| {
            matches!(
                c["action"].as_str(),
                Some("created" | "grew_partitions" | "config_set")
            )
        })
        .collect()
}

/// `topics describe --output json`, by topic name.
fn describe(env: &TestEnv, extra: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let mut args = vec!["topics", "describe", "--output", "json"];
    args.extend(extra);
    let out = env.cli(&args).success();
    let states: Vec<Value> = serde_json::from_str(&out).unwrap();
    states
        .into_iter()
        .map(|s| (s["topic"].as_str().unwrap().to_string(), s))
        .collect()
}

/// Sets topic configs by hand, as an operator with kafka-configs would.
pub(crate) fn alter_by_hand(env: &TestEnv, topic: &str, configs: &[(&str, &str)]) {
    let admin = env.admin();
    let alter = configs.iter().fold(
        AlterConfig::new(ResourceSpecifier::Topic(topic)),
        |a, (k, v)| a.set(k, v),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for r in runtime
        .block_on(admin.alter_configs([&alter], &AdminOptions::new()))
        .unwrap()
    {
        r.unwrap();
    }
    // The broker answers DescribeConfigs from metadata that follows the
    // change a moment later (seconds on a loaded machine): wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let described = runtime
            .block_on(
                admin.describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new()),
            )
            .unwrap();
        let resource = described.into_iter().next().unwrap().unwrap();
        if configs
            .iter()
            .all(|(k, v)| resource.get(k).and_then(|e| e.value.as_deref()) == Some(*v))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic}: {configs:?} not visible after 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn ensure_creates_then_changes_nothing_the_second_time() {
    let env = TestEnv::new();
    let first = ensure(&env, &[]);
    let created: Vec<_> = first.iter().filter(|c| c["action"] == "created").collect();
    assert_eq!(created.len(), 3, "{first:?}");
    let second = ensure(&env, &[]);
    assert!(
        mutations(&second).is_empty(),
        "second run changed something: {second:?}"
    );

    let states = describe(&env, &[]);
    let order = &states[&env.settings.topics.order_events.name];
    assert_eq!(order["partitions"], 12);
    assert_eq!(order["configs"]["retention.ms"], "2592000000");
    assert_eq!(order["drift"].as_array().unwrap().len(), 0, "{order}");
}

#[test]
fn fewer_partitions_than_declared_change_nothing_until_allow_repartition() {
    let mut env = TestEnv::new();
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "4");
    ensure(&env, &[]);
    let topic = env.settings.topics.order_events.name.clone();
    // Someone shortened retention by hand and added a config of their own.
    alter_by_hand(
        &env,
        &topic,
        &[
            ("retention.ms", "60000"),
            ("min.insync.replicas", "1"),
            ("max.message.bytes", "2000000"),
        ],
    );

    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "12");
    let refused = env.cli(&["topics", "ensure", "--output", "json"]);
    let text = refused.failure();
    let changes: Vec<Value> =
        serde_json::from_slice(&refused.output.stdout).expect("JSON on stdout");
    assert!(
        changes.iter().any(|c| c["action"] == "repartition_refused"
            && c["topic"] == topic.as_str()
            && c["from"] == 4
            && c["to"] == 12),
        "{text}"
    );
    // Nothing at all changed: not the partitions, not the drifted retention.
    let order = &describe(&env, &[])[&topic];
    assert_eq!(order["partitions"], 4, "{order}");
    assert_eq!(order["configs"]["retention.ms"], "60000", "{order}");
    let table = env.cli(&["topics", "ensure"]).failure();
    assert!(
        table.contains("REFUSED")
            && table.contains("--allow-repartition")
            && table.contains("(not done) config"),
        "{table}"
    );

    let changes = ensure(&env, &["--allow-repartition"]);
    assert!(
        changes.iter().any(|c| c["action"] == "grew_partitions"
            && c["topic"] == topic.as_str()
            && c["from"] == 4
            && c["to"] == 12),
        "{changes:?}"
    );
    assert!(
        changes.iter().any(|c| c["action"] == "warning"
            && c["message"]
                .as_str()
                .unwrap()
                .contains("applied before its earlier events")
            && c["message"].as_str().unwrap().contains("Drain consumers")),
        "{changes:?}"
    );
    assert!(
        changes.iter().any(|c| c["action"] == "config_set"
            && c["key"] == "retention.ms"
            && c["from"] == "60000"),
        "{changes:?}"
    );
    assert!(mutations(&ensure(&env, &[])).is_empty());
    let order = &describe(&env, &[])[&topic];
    assert_eq!(order["partitions"], 12);
    assert_eq!(order["configs"]["retention.ms"], "2592000000");
    // The config someone else set survives the fix.
    assert_eq!(order["configs"]["max.message.bytes"], "2000000", "{order}");
}

#[test]
fn retention_drift_is_reported_on_every_declared_topic_and_never_lowered() {
    let env = TestEnv::new();
    let group = ["--group", "audit"];
    ensure(&env, &group);
    let retry = format!("{}.retry.audit", env.settings.topics.order_events.name);
    let dlq = env.settings.topics.dead_letter.name.clone();
    let inventory = env.settings.topics.inventory_events.name.clone();
    alter_by_hand(&env, &dlq, &[("retention.ms", "86400000")]);
    alter_by_hand(&env, &retry, &[("retention.ms", "3600000")]);
    alter_by_hand(&env, &inventory, &[("retention.ms", "-1")]);

    let states = describe(&env, &group);
    assert!(
        states[&dlq]["drift"]
            .to_string()
            .contains("retention.ms: 86400000 != 2592000000"),
        "{}",
        states[&dlq]
    );
    assert!(
        states[&retry]["drift"]
            .to_string()
            .contains("retention.ms: 3600000 != 2592000000"),
        "{}",
        states[&retry]
    );

    let changes = ensure(&env, &group);
    for (topic, from) in [(&dlq, "86400000"), (&retry, "3600000")] {
        assert!(
            changes.iter().any(|c| c["action"] == "config_set"
                && c["topic"] == topic.as_str()
                && c["key"] == "retention.ms"
                && c["from"] == from),
            "{topic}: {changes:?}"
        );
    }
    // Longer on the cluster than declared: reported, kept (lowering deletes records).
    assert!(
        changes.iter().any(|c| c["action"] == "warning"
            && c["topic"] == inventory.as_str()
            && c["message"].as_str().unwrap().contains("not lowered")),
        "{changes:?}"
    );
    let states = describe(&env, &group);
    assert_eq!(states[&dlq]["configs"]["retention.ms"], "2592000000");
    assert_eq!(states[&retry]["configs"]["retention.ms"], "2592000000");
    assert_eq!(states[&inventory]["configs"]["retention.ms"], "-1");
}

#[test]
fn shrinking_is_reported_not_done() {
    let mut env = TestEnv::new();
    ensure(&env, &[]);
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "3");
    let out = env.cli(&["topics", "ensure"]).success();
    assert!(out.contains("partitions are never removed"), "{out}");
    assert_eq!(
        describe(&env, &[])[&env.settings.topics.order_events.name]["partitions"],
        12
    );
}

/// Names of topics on the cluster with this test's prefix.
fn topics_of(env: &TestEnv) -> BTreeSet<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = client_config(&env.settings.kafka.client_options())
        .create()
        .unwrap();
    let metadata = client
        .fetch_metadata(None, std::time::Duration::from_secs(10))
        .unwrap();
    metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with(&env.prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_without_topic_rights_refuse_missing_or_different_topics_and_create_nothing() {
    let mut env = TestEnv::new().with_database().await;
    ensure(&env, &[]);
    // A new topic shows in the broker's metadata a moment after its creation.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while topics_of(&env).len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let before = topics_of(&env);
    assert_eq!(before.len(), 3, "{before:?}");
    let retry = format!("{}.retry.ro", env.settings.topics.order_events.name);

    // The group's retry topic was never ensured: the consumer names it and the fix.
    let out = env
        .cli(&[
            "consume",
            "--group",
            "ro",
            "--handler",
            "notification",
            "--until-idle",
            "1",
        ])
        .failure();
    assert!(
        out.contains(&format!("topic {retry} is missing"))
            && out.contains("orderpipe topics ensure --group ro"),
        "{out}"
    );
    // deliver is a consumer group too.
    let config = tempfile::NamedTempFile::with_suffix(".toml").unwrap();
    std::fs::write(config.path(), "[[http.subscriptions]]\nname = \"crm\"\nevents = [\"order.*\"]\nurl = \"http://127.0.0.1:9/\"\n").unwrap();
    let out = env
        .cli(&[
            "--config",
            config.path().to_str().unwrap(),
            "deliver",
            "--subscription",
            "crm",
            "--until-idle",
            "1",
        ])
        .failure();
    assert!(
        out.contains(".retry.http.crm is missing")
            && out.contains("orderpipe topics ensure --group http.crm"),
        "{out}"
    );

    // Declared with another partition count than the cluster has.
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "6");
    let out = env
        .cli(&[
            "consume",
            "--group",
            "ro",
            "--handler",
            "notification",
            "--until-idle",
            "1",
        ])
        .failure();
    let order = &env.settings.topics.order_events.name.clone();
    assert!(
        out.contains(&format!("topic {order} has 12 partitions, declared 6")),
        "{out}"
    );
    let out = env
        .cli(&["relay", "--instance", "ro", "--until-idle", "1"])
        .failure();
    assert!(
        out.contains(&format!("topic {order} has 12 partitions, declared 6"))
            && out.contains("run `orderpipe topics ensure`"),
        "{out}"
    );
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "12");

    // The persister without its topic.
    env.set_env(
        "ORDERPIPE_TOPICS__DEAD_LETTER__NAME",
        &format!("{}.absent.dlq", env.prefix),
    );
    let out = env.cli(&["dlq", "persist", "--until-idle", "1"]).failure();
    assert!(
        out.contains(&format!("topic {}.absent.dlq is missing", env.prefix)),
        "{out}"
    );

    // None of them created or altered anything.
    assert_eq!(topics_of(&env), before);
    assert_eq!(describe(&env, &[])[order]["partitions"], 12);
}

/// librdkafka's request names (`debug=protocol`) that need more than the
/// read/write rights the ACL table of docs/operations.md gives a consumer.
const ADMIN_REQUESTS: [&str; 7] = [
    "CreateTopics",
    "CreatePartitions",
    "AlterConfigs",
    "IncrementalAlterConfigs",
    "DescribeConfigs",
    "DeleteTopics",
    "DeleteRecords",
];

/// A consumer never sends an admin request: every request it makes is
/// logged by librdkafka (`debug=protocol`), and none of them creates,
/// alters or even describes the config of a topic, so the consumer runs
/// with the read-only rights of the ACL table in docs/operations.md.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_without_rights_to_alter_topics_still_consumes() {
    let mut env = TestEnv::new().with_database().await;
    ensure(&env, &["--group", "readonly"]);
    env.cli(&[
        "produce",
        "--count",
        "40",
        "--orders",
        "10",
        "--seed",
        "3",
        "--first-order-id",
        "1",
    ])
    .success();

    env.set_env("ORDERPIPE_KAFKA__OPTIONS__debug", "protocol");
    let run = env
        .command(&[
            "consume",
            "--group",
            "readonly",
            "--handler",
            "chaos,notification",
            "--until-idle",
            "3",
            "--output",
            "json",
        ])
        .env("RUST_LOG", "warn,librdkafka=debug")
        .env("ORDERPIPE_CHAOS__TRANSIENT_ORDERS", "[1]")
        .env("ORDERPIPE_CHAOS__TRANSIENT_FAILURES", "4")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{stdout}{}",
        &stderr[stderr.len().saturating_sub(3000)..]
    );
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["applied"], 40, "{summary}");
    // Order 1 failed past its local retries: its records went through the
    // retry topic (a write), and the consumer still created nothing.
    assert!(summary["sent_to_retry"].as_u64().unwrap() > 0, "{summary}");

    let sent: BTreeSet<&str> = stderr
        .lines()
        .filter_map(|l| l.split("Sent ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|name| name.strip_suffix("Request"))
        .collect();
    for expected in ["Metadata", "Fetch", "Produce", "OffsetCommit"] {
        assert!(
            sent.contains(expected),
            "no {expected} request logged; saw {sent:?}"
        );
    }
    let admin: Vec<&&str> = sent
        .iter()
        .filter(|name| ADMIN_REQUESTS.contains(name))
        .collect();
    assert!(
        admin.is_empty(),
        "the consumer sent admin requests {admin:?}"
    );
    eprintln!("requests a consumer sends: {sent:?}");
}

/// librdkafka hands an admin client's log lines to a queue the client never
/// polls, so the protocol log above would not show an admin request made
/// through an `AdminClient`. This guard covers that: the code of the
/// read-only roles (consume, deliver, the relay, the DLQ persister, the
/// error tier) builds no admin client and makes no admin call; only
/// `topics ensure` (src/topics.rs, src/cli/mod.rs) does.
#[test]
fn the_read_only_roles_have_no_admin_client() {
    fn sources(path: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                sources(&entry.unwrap().path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for part in [
        "consumer",
        "outbox",
        "retry",
        "delivery.rs",
        "dlq/persist.rs",
        "cli/consume.rs",
        "cli/relay.rs",
    ] {
        sources(&root.join(part), &mut files);
    }
    assert!(files.len() > 8, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for admin in [
            "TopicAdmin",
            "AdminClient",
            "create_topics",
            "create_partitions",
            "alter_configs",
            "describe_configs",
        ] {
            assert!(
                !text.contains(admin),
                "{} uses {admin}: these roles run with read-only Kafka rights",
                file.display()
            );
        }
    }
}
