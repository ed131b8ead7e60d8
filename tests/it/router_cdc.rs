//! Seed 003 end to end over HTTP: `orderpipe cdc` reads a table's binlog,
//! the router (`orderpipe deliver` without `--subscription`) delivers the
//! row changes its subscription tables ask for to a local endpoint, with
//! `old` filled on updates, in commit order per primary key, filters first;
//! the error tier and reconciliation work for `cdc.*` groups as for order
//! groups. Each test has its own database and table (the cdc process tails
//! the server's whole binlog but publishes only its own table).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orderpipe::codec::Codec;
use orderpipe::envelope::EventData;
use orderpipe::kafka::record::header;
use orderpipe::retry::RetryLayer;
use orderpipe::subscriptions::model::{NewConsumer, NewEvent, NewSubscription};
use orderpipe::subscriptions::store::Origin;
use orderpipe::subscriptions::{FilterSpec, Store, Subscription};
use rdkafka::Message;
use serde_json::{Value, json};

use crate::cdc::Source;
use crate::consumer::sigterm;
use crate::delivery::{Seen, downstream};
use crate::helpers::Spawned;
use crate::helpers::wait_for_topic;
use crate::router::{
    actual_at_lag_zero, announced, assert_missing, delete_group, disable, stderr_lines,
    wait_for_subscriptions, wait_until_none_missing,
};

/// Seed 003's example table.
const USER_TABLE: &str =
    "CREATE TABLE table_user (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL, status INT NOT NULL)";

/// A test's platform: the source database with `table_user`, `orderpipe
/// cdc` streaming it, the subscription tables (in the same database), the
/// three routing keys defined on the test's cdc topic, and a downstream
/// (the broker-restart test runs on one too).
pub(crate) struct Platform {
    pub(crate) source: Source,
    pub(crate) store: Store,
    pub(crate) cdc: Spawned,
    pub(crate) base: String,
    pub(crate) seen: Seen,
    /// stderr of cdc and of every router started (drained, shown on failure).
    pub(crate) logs: Vec<Arc<Mutex<Vec<String>>>>,
}

impl Platform {
    pub(crate) async fn new() -> Self {
        Self::with_value_format("json").await
    }

    /// [`Platform::new`] with cdc writing `[cdc] value_format` (json or avro).
    async fn with_value_format(format: &str) -> Self {
        let mut source = Source::new(&[USER_TABLE]).await;
        source.env.set_env("ORDERPIPE_CDC__VALUE_FORMAT", format);
        // The order topic and the dead-letter topic (the routers' groups check them).
        source.env.cli(&["topics", "ensure"]).success();
        let mut cdc = source.spawn("table_user");
        let logs = vec![stderr_lines(&mut cdc)];
        let topic = source.topic("table_user");
        tokio::task::block_in_place(|| wait_for_topic(&source.env, &topic));
        let store = Store::new(source.env.db(), Origin::Cli);
        let order_topic = source.env.settings.topics.order_events.name.clone();
        for change in ["insert", "update", "delete"] {
            let event = NewEvent {
                routing_key: format!("{}.table_user.{change}", source.database),
                topic: Some(topic.clone()),
                ..Default::default()
            };
            store.add_event(&event, &order_topic).await.unwrap();
        }
        let (base, seen) = downstream().await;
        Self {
            source,
            store,
            cdc,
            base,
            seen,
            logs,
        }
    }

    /// A consumer named `<name><test prefix>` delivering to `/hook/<mode>`.
    pub(crate) async fn consumer(
        &self,
        name: &str,
        mode: &str,
        retry: Option<RetryLayer>,
    ) -> String {
        let name = format!("{name}{}", &self.source.env.prefix[1..]);
        let consumer = NewConsumer {
            name: name.clone(),
            url: format!("{}/hook/{mode}", self.base),
            retry,
            ..Default::default()
        };
        self.store.add_consumer(&consumer).await.unwrap();
        name
    }

    /// Subscribes `consumer` to `table_user`'s `change` with `bind_key` and `filters`.
    pub(crate) async fn subscribe(
        &self,
        consumer: &str,
        change: &str,
        bind_key: &str,
        filters: Vec<FilterSpec>,
    ) -> Subscription {
        let new = NewSubscription {
            event: format!("{}.table_user.{change}", self.source.database),
            consumer: consumer.into(),
            bind_key: bind_key.into(),
            filters,
            ..Default::default()
        };
        let order_topic = &self.source.env.settings.topics.order_events.name;
        self.store
            .add_subscription(&new, order_topic)
            .await
            .unwrap()
    }

    fn router(&mut self) -> Spawned {
        let mut router = self.source.env.spawn(ROUTER_ARGS);
        self.logs.push(stderr_lines(&mut router));
        router
    }

    /// What cdc and the routers logged.
    fn log(&self) -> String {
        self.logs
            .iter()
            .map(|l| l.lock().unwrap().join("\n"))
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// The bodies the downstream received on `/hook/<mode>`, in arrival order.
    fn bodies(&self, mode: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _, _)| m == mode)
            .map(|(_, _, body)| body.clone())
            .collect()
    }

    /// Waits until `/hook/<mode>` got at least `count` bodies; then 2 s more
    /// for any that should not come, and returns them all.
    async fn wait_for(&self, mode: &str, count: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        while self.bodies(mode).len() < count {
            assert!(
                Instant::now() < deadline,
                "{} of {count} bodies on /hook/{mode} within {timeout:?}: {:?}\n{}",
                self.bodies(mode).len(),
                self.bodies(mode),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.bodies(mode)
    }
}

/// The router as these tests run it: reconciling every 2 s, its admin API on a free port.
pub(crate) const ROUTER_ARGS: &[&str] = &[
    "deliver",
    "--reconcile-interval",
    "2s",
    "--admin-addr",
    "127.0.0.1:0",
];

/// `(event_type's change, data, old)` of each body about row `id`, in arrival order.
fn row_history(bodies: &[Value], id: i64) -> Vec<(String, Value, Value)> {
    bodies
        .iter()
        .filter(|b| b["data"]["id"] == id)
        .map(|b| {
            let change = b["event_type"]
                .as_str()
                .unwrap()
                .rsplit('.')
                .next()
                .unwrap()
                .to_string();
            (change, b["data"].clone(), b["old"].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn row_changes_reach_the_endpoint_with_old_in_commit_order_the_status_filter_and_a_disable_within_seconds()
 {
    let mut platform = Platform::new().await;
    let db = platform.source.database.clone();
    // Seed 003: the SMS service gets every change of table_user in one
    // ordered stream (one bind key); a VIP service only status 1 -> 2.
    let sms = platform.consumer("sms", "ok", None).await;
    let insert = platform.subscribe(&sms, "insert", "user", vec![]).await;
    let update = platform.subscribe(&sms, "update", "user", vec![]).await;
    let delete = platform.subscribe(&sms, "delete", "user", vec![]).await;
    assert!(
        insert.group == update.group && update.group == delete.group,
        "one bind key, one group"
    );
    let vip = platform.consumer("vip", "other", None).await;
    let status_filter = FilterSpec {
        field: "status".into(),
        op: "changed".into(),
        from: Some(json!(1)),
        to: Some(json!(2)),
        ..Default::default()
    };
    platform
        .subscribe(&vip, "update", "status", vec![status_filter])
        .await;
    let mut router = platform.router();

    // One transaction per statement but the first (three rows).
    platform
        .source
        .exec(&["INSERT INTO table_user VALUES (1, 'ann', 1), (2, 'bob', 1), (3, 'cy', 1)"])
        .await;
    for statement in [
        "UPDATE table_user SET status = 2 WHERE id = 1",
        "UPDATE table_user SET name = 'bobby' WHERE id = 2",
        "UPDATE table_user SET status = 3 WHERE id = 3",
        "UPDATE table_user SET name = 'anne', status = 1 WHERE id = 1",
        "UPDATE table_user SET status = 2 WHERE id = 1",
        "DELETE FROM table_user WHERE id = 2",
    ] {
        platform.source.exec(&[statement]).await;
    }

    let bodies = platform.wait_for("ok", 9, Duration::from_secs(60)).await;
    assert_eq!(bodies.len(), 9, "each change once: {bodies:#?}");
    for body in &bodies {
        let fields: BTreeSet<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            BTreeSet::from([
                "request_id",
                "channel_id",
                "event_type",
                "data",
                "old",
                "timestamp"
            ]),
            "{body}"
        );
        assert!(
            body["timestamp"]
                .as_i64()
                .is_some_and(|t| t > 1_700_000_000),
            "{body}"
        );
        assert!(
            body["event_type"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{db}.table_user.")),
            "{body}"
        );
    }
    let ids: BTreeSet<&str> = bodies
        .iter()
        .map(|b| b["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 9, "one request id per change");
    let row = |id: i64, name: &str, status: i64| json!({"id": id, "name": name, "status": status});
    let insert_of = |data: Value| ("insert".to_string(), data, Value::Null);
    let update_of = |data: Value, old: Value| ("update".to_string(), data, old);
    // Per primary key, in commit order; `old` holds the changed columns' previous values.
    assert_eq!(
        row_history(&bodies, 1),
        [
            insert_of(row(1, "ann", 1)),
            update_of(row(1, "ann", 2), json!({"status": 1})),
            update_of(row(1, "anne", 1), json!({"name": "ann", "status": 2})),
            update_of(row(1, "anne", 2), json!({"status": 1})),
        ]
    );
    assert_eq!(
        row_history(&bodies, 2),
        [
            insert_of(row(2, "bob", 1)),
            update_of(row(2, "bobby", 1), json!({"name": "bob"})),
            ("delete".into(), row(2, "bobby", 1), Value::Null)
        ]
    );
    assert_eq!(
        row_history(&bodies, 3),
        [
            insert_of(row(3, "cy", 1)),
            update_of(row(3, "cy", 3), json!({"status": 1}))
        ]
    );

    // The filter: only the two updates that moved status from 1 to 2.
    let vip_bodies = platform.wait_for("other", 2, Duration::from_secs(30)).await;
    assert_eq!(
        row_history(&vip_bodies, 1),
        [
            update_of(row(1, "ann", 2), json!({"status": 1})),
            update_of(row(1, "anne", 2), json!({"status": 1}))
        ],
        "{vip_bodies:#?}"
    );
    assert_eq!(vip_bodies.len(), 2, "{vip_bodies:#?}");
    // The same change reached both services under the same request id.
    let sms_ids: BTreeSet<&str> = ids.clone();
    assert!(
        vip_bodies
            .iter()
            .all(|b| sms_ids.contains(b["request_id"].as_str().unwrap()))
    );

    // Disable the delete subscription: within seconds, without a restart,
    // deletes stop while the group's other subscriptions keep delivering.
    // The next changes are made once the router serves the two others (15 s
    // at most: it reads the tables every second), not after a fixed sleep.
    disable(&platform.store, delete.id).await;
    let admin = announced(
        platform.logs.last().unwrap(),
        "admin API listening on http://",
    );
    wait_for_subscriptions(
        &admin,
        &insert.group,
        &[insert.id, update.id],
        Duration::from_secs(15),
    )
    .await;
    platform
        .source
        .exec(&["DELETE FROM table_user WHERE id = 3"])
        .await;
    platform
        .source
        .exec(&["INSERT INTO table_user VALUES (4, 'dee', 1)"])
        .await;
    let bodies = platform.wait_for("ok", 10, Duration::from_secs(30)).await;
    assert_eq!(row_history(&bodies, 4), [insert_of(row(4, "dee", 1))]);
    assert_eq!(
        row_history(&bodies, 3).len(),
        2,
        "no delete after the disable: {bodies:#?}"
    );
    assert_eq!(bodies.len(), 10, "{bodies:#?}");
    // GET /bindings of the router's admin API: the group reads the cdc
    // topic, runs the two enabled subscriptions, and its lag (measured on
    // that topic at each reconciliation) reaches 0: deliveries and filtered
    // changes alike were committed.
    let (a, view) = actual_at_lag_zero(&admin, &insert.group).await;
    assert_eq!(
        a["topics"],
        json!([platform.source.topic("table_user")]),
        "{view}"
    );
    assert_eq!(a["subscriptions"], json!([insert.id, update.id]), "{view}");

    // An order event under the same bind key: the group then reads the
    // order topic and the cdc topic (restarted for the new topic set) and
    // delivers both; an order event's `old` is null.
    let order_topic = platform
        .source
        .env
        .settings
        .topics
        .order_events
        .name
        .clone();
    let new = NewSubscription {
        event: "order.created".into(),
        consumer: sms.clone(),
        bind_key: "user".into(),
        ..Default::default()
    };
    let created = platform
        .store
        .add_subscription(&new, &order_topic)
        .await
        .unwrap();
    assert_eq!(created.group, insert.group, "one bind key, one group");
    let events = crate::router::produce(&platform.source.env, 10, 5, 1, 81);
    let want: BTreeSet<String> = events
        .iter()
        .filter(|e| e.event_name.as_str() == "order.created")
        .map(|e| e.event_id.to_string())
        .collect();
    platform
        .source
        .exec(&["INSERT INTO table_user VALUES (5, 'eli', 1)"])
        .await;
    let bodies = platform
        .wait_for("ok", 11 + want.len(), Duration::from_secs(60))
        .await;
    let orders: BTreeSet<String> = bodies
        .iter()
        .filter(|b| b["event_type"] == "order.created")
        .inspect(|b| assert!(b["old"].is_null() && b["data"]["order_id"].is_i64(), "{b}"))
        .map(|b| b["request_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(orders, want);
    assert_eq!(row_history(&bodies, 5), [insert_of(row(5, "eli", 1))]);
    assert_eq!(bodies.len(), 11 + want.len(), "{bodies:#?}");
    assert!(
        router.try_wait().unwrap().is_none(),
        "the router kept running"
    );
    sigterm(&mut router);
    sigterm(&mut platform.cdc);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_row_change_goes_through_the_retry_topic_to_the_dlq_and_a_deleted_cdc_group_is_recreated()
 {
    let mut platform = Platform::new().await;
    // No local retry, one delayed attempt through the retry topic, then the DLQ.
    let retry = RetryLayer {
        local_retries: Some(0),
        delays: Some(vec!["300ms".into()]),
        ..Default::default()
    };
    let flaky = platform.consumer("flaky", "broken", Some(retry)).await;
    let sub = platform.subscribe(&flaky, "insert", "user", vec![]).await;
    let mut router = platform.router();
    platform
        .source
        .exec(&["INSERT INTO table_user VALUES (7, 'eve', 1)"])
        .await;

    let env = &platform.source.env;
    let dlq = env.settings.topics.dead_letter.name.clone();
    let dead = tokio::task::block_in_place(|| env.read(&dlq, 1, Duration::from_secs(60)));
    let dead = &dead[0];
    assert_eq!(
        crate::helpers::header(dead, header::GROUP).as_deref(),
        Some(sub.group.as_str())
    );
    assert_eq!(
        crate::helpers::header(dead, header::ORIGINAL_TOPIC),
        Some(platform.source.topic("table_user"))
    );
    assert_eq!(dead.key(), Some(&b"7"[..]), "the primary key stays the key");
    // The dead letter is the change as published: it decodes as a row change.
    let codec = Codec::new(
        &env.settings.registry,
        &dlq,
        &orderpipe::cdc::change::topic_schema(&dlq),
        false,
    )
    .unwrap();
    let envelope = codec.decode(dead.payload()).await.unwrap();
    let EventData::RowChange(change) = &envelope.data else {
        panic!("not a row change: {envelope:?}")
    };
    assert_eq!(change.data, json!({"id": 7, "name": "eve", "status": 1}));
    let attempts = platform.bodies("broken");
    assert_eq!(
        attempts.len(),
        2,
        "the first attempt and the retry topic's: {attempts:#?}"
    );
    assert!(
        attempts
            .iter()
            .all(|b| b["request_id"] == envelope.event_id.to_string())
    );
    // `dlq replay` sends it back to the group's retry topic, the one named
    // after the order topic (not `<cdc topic>.retry.<group>`, which nothing
    // reads), and the router delivers it again.
    env.cli(&["dlq", "persist", "--until-idle", "3"]).success();
    let listed: Value = serde_json::from_str(
        &env.cli(&["dlq", "list", "--group", &sub.group, "--output", "json"])
            .success(),
    )
    .unwrap();
    let id = listed[0]["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("{listed:#}"))
        .to_string();
    let retry = format!(
        "{}.retry.{}",
        env.settings.topics.order_events.name, sub.group
    );
    let plan: Value = serde_json::from_str(
        &env.cli(&[
            "dlq",
            "replay",
            "--id",
            &id,
            "--dry-run",
            "--output",
            "json",
        ])
        .success(),
    )
    .unwrap();
    assert_eq!(plan[0]["to"], retry.as_str(), "{plan:#}");
    env.cli(&["dlq", "replay", "--id", &id, "--yes"]).success();
    let attempts = platform
        .wait_for("broken", 3, Duration::from_secs(30))
        .await;
    assert!(
        attempts
            .iter()
            .all(|b| b["request_id"] == envelope.event_id.to_string()),
        "{attempts:#?}"
    );
    sigterm(&mut router);

    // By hand: the cdc group is deleted; reconciliation reports it missing
    // and the router recreates it at start.
    delete_group(&env.admin(), &sub.group).await;
    assert_missing(env, &sub.group);
    let mut router = platform.router();
    wait_until_none_missing(&platform.source.env).await;
    sigterm(&mut router);
    sigterm(&mut platform.cdc);
}

/// `[cdc] value_format = "avro"`: per-table typed schemas. A router started
/// before an `ALTER TABLE ... ADD COLUMN` keeps delivering (with the new
/// column), the registry holds a second version of the topic's value
/// subject and calls it compatible with the first, and `old` tells a
/// column changed from NULL from an unchanged one.
#[tokio::test(flavor = "multi_thread")]
async fn typed_avro_changes_reach_the_endpoint_and_a_column_added_mid_stream_is_a_compatible_new_version()
 {
    let mut platform = Platform::with_value_format("avro").await;
    let db = platform.source.database.clone();
    let topic = platform.source.topic("table_user");
    let sms = platform.consumer("sms", "ok", None).await;
    for change in ["insert", "update", "delete"] {
        platform.subscribe(&sms, change, "user", vec![]).await;
    }
    let mut router = platform.router();
    // A decoder made before the ALTER, as a running consumer has.
    let registry = &platform.source.env.settings.registry;
    let schema = orderpipe::cdc::change::topic_schema(&topic);
    let codec = Codec::new(registry, &topic, &schema, false).unwrap();
    for statement in [
        "INSERT INTO table_user VALUES (1, 'ann', 1), (2, 'bob', 1)",
        "UPDATE table_user SET status = 2 WHERE id = 1",
        "DELETE FROM table_user WHERE id = 2",
    ] {
        platform.source.exec(&[statement]).await;
    }
    let before = platform.wait_for("ok", 4, Duration::from_secs(60)).await;
    let row = |id: i64, name: &str, status: i64| json!({"id": id, "name": name, "status": status});
    assert_eq!(
        row_history(&before, 1),
        [
            ("insert".to_string(), row(1, "ann", 1), Value::Null),
            ("update".to_string(), row(1, "ann", 2), json!({"status": 1})),
        ]
    );
    assert_eq!(
        row_history(&before, 2)[1],
        ("delete".to_string(), row(2, "bob", 1), Value::Null)
    );

    for statement in [
        "ALTER TABLE table_user ADD COLUMN note VARCHAR(20) NULL",
        "INSERT INTO table_user VALUES (3, 'cy', 1, 'n')",
        "UPDATE table_user SET note = 'x' WHERE id = 1",
        "UPDATE table_user SET note = NULL WHERE id = 3",
    ] {
        platform.source.exec(&[statement]).await;
    }
    let after = platform.wait_for("ok", 7, Duration::from_secs(60)).await;
    assert_eq!(
        after.len(),
        7,
        "each change once: {after:#?}\n{}",
        platform.log()
    );
    let with_note = |id: i64, name: &str, status: i64, note: Value| json!({"id": id, "name": name, "status": status, "note": note});
    assert_eq!(
        row_history(&after, 1)[2],
        (
            "update".to_string(),
            with_note(1, "ann", 2, json!("x")),
            json!({"note": null})
        ),
        "a column changed from NULL is in old, as null"
    );
    assert_eq!(
        row_history(&after, 3),
        [
            (
                "insert".to_string(),
                with_note(3, "cy", 1, json!("n")),
                Value::Null
            ),
            (
                "update".to_string(),
                with_note(3, "cy", 1, Value::Null),
                json!({"note": "n"})
            ),
        ]
    );
    assert!(
        matches!(router.try_wait(), Ok(None)),
        "the router still runs\n{}",
        platform.log()
    );

    // On the topic: typed records, written with two per-table schema versions.
    let env = &platform.source.env;
    let messages = tokio::task::block_in_place(|| env.read(&topic, 7, Duration::from_secs(30)));
    let mut ids = BTreeSet::new();
    for message in &messages {
        ids.insert(orderpipe::codec::schema_id(message.payload().unwrap()).unwrap());
        let value = codec.decode_value(message.payload()).await.unwrap();
        let apache_avro::types::Value::Record(fields) = value else {
            panic!("a record")
        };
        let data = &fields.iter().find(|(n, _)| n == "data").unwrap().1;
        assert!(
            matches!(data, apache_avro::types::Value::Union(1, inner) if matches!(**inner, apache_avro::types::Value::Record(_))),
            "data is a typed record: {data:?}"
        );
        let envelope = codec.decode(message.payload()).await.unwrap();
        assert!(
            matches!(envelope.data, EventData::RowChange(_)),
            "{envelope:?}"
        );
    }
    assert_eq!(ids.len(), 2, "one schema before the ALTER, one after");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let registry = &env.settings.registry.url;
    let get = |path: String| {
        let request = http.get(format!("{registry}{path}"));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let subject = format!("{topic}-value");
    let versions = get(format!("/subjects/{subject}/versions")).await;
    assert_eq!(versions, json!([1, 2]));
    let latest = get(format!("/subjects/{subject}/versions/2")).await;
    let schema = latest["schema"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(schema).unwrap();
    assert_eq!(
        (parsed["namespace"].as_str(), parsed["name"].as_str()),
        (
            Some(format!("orderpipe.cdc.v1.tables.{db}.table_user").as_str()),
            Some("Change")
        )
    );
    assert!(schema.contains("\"note\""), "{schema}");
    let verdict: Value = http
        .post(format!(
            "{registry}/compatibility/subjects/{subject}/versions/1"
        ))
        .header("content-type", "application/vnd.schemaregistry.v1+json")
        .json(&json!({"schema": schema}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(verdict["is_compatible"], json!(true), "{verdict}");
    let level = get("/config".to_string()).await;
    assert_eq!(level["compatibilityLevel"], json!("BACKWARD"), "{level}");
    sigterm(&mut router);
    sigterm(&mut platform.cdc);
}
