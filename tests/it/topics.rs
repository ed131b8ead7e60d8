//! `orderpipe topics ensure` / `describe` against the real broker.

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use serde_json::Value;

use crate::helpers::TestEnv;
use orderpipe::producer::config::client_config;

fn ensure(env: &TestEnv) -> Vec<Value> {
    let out = env.cli(&["topics", "ensure", "--output", "json"]).success();
    serde_json::from_str(&out).expect("ensure prints JSON")
}

fn mutations(changes: &[Value]) -> Vec<&Value> {
    changes
        .iter()
        .filter(|c| matches!(c["action"].as_str(), Some("created" | "grew_partitions" | "config_set")))
        .collect()
}

#[test]
fn ensure_creates_then_changes_nothing_the_second_time() {
    let env = TestEnv::new();
    let first = ensure(&env);
    let created: Vec<_> = first.iter().filter(|c| c["action"] == "created").collect();
    assert_eq!(created.len(), 3, "{first:?}");
    let second = ensure(&env);
    assert!(mutations(&second).is_empty(), "second run changed something: {second:?}");

    let describe = env.cli(&["topics", "describe", "--output", "json"]).success();
    let states: Vec<Value> = serde_json::from_str(&describe).unwrap();
    let order = states
        .iter()
        .find(|s| s["topic"] == env.settings.topics.order_events.name)
        .unwrap();
    assert_eq!(order["partitions"], 12);
    assert_eq!(order["configs"]["retention.ms"], "2592000000");
    assert_eq!(order["drift"].as_array().unwrap().len(), 0, "{order}");
}

#[test]
fn ensure_grows_partitions_and_fixes_drifted_configs() {
    let mut env = TestEnv::new();
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "4");
    ensure(&env);

    // Someone shortened retention by hand and added a config of their own.
    let admin: AdminClient<DefaultClientContext> =
        client_config(&env.settings.kafka_client_options()).create().unwrap();
    let topic = env.settings.topics.order_events.name.clone();
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("retention.ms", "60000")
        .set("min.insync.replicas", "1")
        .set("cleanup.policy", "delete")
        .set("max.message.bytes", "2000000");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for r in runtime
        .block_on(admin.alter_configs([&alter], &AdminOptions::new()))
        .unwrap()
    {
        r.unwrap();
    }

    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "12");
    let changes = ensure(&env);
    assert!(
        changes.iter().any(|c| c["action"] == "grew_partitions"
            && c["topic"] == topic.as_str()
            && c["from"] == 4
            && c["to"] == 12),
        "{changes:?}"
    );
    assert!(
        changes.iter().any(|c| c["action"] == "config_set"
            && c["key"] == "retention.ms"
            && c["from"] == "60000"),
        "{changes:?}"
    );
    assert!(mutations(&ensure(&env)).is_empty());

    let describe = env.cli(&["topics", "describe", "--output", "json"]).success();
    let states: Vec<Value> = serde_json::from_str(&describe).unwrap();
    let order = states.iter().find(|s| s["topic"] == topic.as_str()).unwrap();
    assert_eq!(order["partitions"], 12);
    assert_eq!(order["configs"]["retention.ms"], "2592000000");
    // The config someone else set survives the fix.
    assert_eq!(order["configs"]["max.message.bytes"], "2000000", "{order}");
}

#[test]
fn shrinking_is_reported_not_done() {
    let mut env = TestEnv::new();
    ensure(&env);
    env.set_env("ORDERPIPE_TOPICS__ORDER_EVENTS__PARTITIONS", "3");
    let out = env.cli(&["topics", "ensure"]).success();
    assert!(out.contains("partitions are never removed"), "{out}");
}
