//! Outbox rows over Kafka's record limit: the relay dead-letters them
//! without stalling their shard, holds the later events of their order
//! behind them (per-key order), and publishes them once an operator raised
//! the limit and re-queued them; the order API refuses an event that could
//! never be published before it writes anything.
//!
//! The limit is the broker's: the test lowers the order topic's
//! `max.message.bytes` as an operator would, and the broker is the judge of
//! what fits (a record it refuses is refused whatever the relay thought).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use orderpipe::envelope::{Envelope, EventData, OrderCreated, OrderPaymentSucceeded};
use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use serde_json::{Value, json};

use crate::helpers::{TestEnv, header};
use crate::topics::alter_by_hand;

/// The order topic's record limit in these tests (the broker's default is
/// 1 MB; an ordinary order event is about 500 bytes).
const TOPIC_LIMIT: usize = 4000;

/// An outbox row as another writer would insert it: plain SQL, the
/// envelope as JSON, shard = order id mod 16.
async fn insert_row(env: &TestEnv, envelope: &Envelope) -> i64 {
    let db = env.db();
    let order_id = envelope.data.order_id();
    sqlx::query(
        "INSERT INTO outbox_messages (event_id, tx_id, shard, topic, message_key, event_name, envelope, created_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(envelope.event_id.to_string())
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(order_id.rem_euclid(16))
    .bind(&env.settings.topics.order_events.name)
    .bind(order_id.to_string())
    .bind(envelope.event_name.as_str())
    .bind(serde_json::to_string(envelope).unwrap())
    .bind(orderpipe::clock::now_ms())
    .execute(&db.pool)
    .await
    .unwrap();
    let (id,): (i64,) = sqlx::query_as("SELECT id FROM outbox_messages WHERE event_id = ?")
        .bind(envelope.event_id.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    id
}

fn created(order_id: i64, sku: String) -> Envelope {
    let EventData::Created(mut data) = EventData::sample_created(order_id) else {
        unreachable!()
    };
    data.sku = sku;
    Envelope::new(
        "another-writer",
        EventData::Created(OrderCreated { ..data }),
    )
}

fn paid(order_id: i64) -> Envelope {
    Envelope::new(
        "another-writer",
        EventData::PaymentSucceeded(OrderPaymentSucceeded {
            order_id,
            payment_id: format!("pay-{order_id}"),
            amount: 1999,
            paid_at: orderpipe::envelope::format_utc(&chrono::Utc::now()),
        }),
    )
}

/// The event ids of `messages` per key, each key's in log order (one key,
/// one partition).
fn by_key(messages: &[OwnedMessage]) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for m in messages {
        let key = String::from_utf8_lossy(m.key().unwrap()).into_owned();
        keys.entry(key)
            .or_default()
            .push((m.offset(), header(m, "event_id").unwrap()));
    }
    keys.into_iter()
        .map(|(k, mut ids)| {
            ids.sort();
            (k, ids.into_iter().map(|(_, id)| id).collect())
        })
        .collect()
}

/// What `by_key` should say: `(order id, its events in order)`.
fn expected(orders: &[(i64, &[&Envelope])]) -> BTreeMap<String, Vec<String>> {
    orders
        .iter()
        .map(|(id, events)| {
            (
                id.to_string(),
                events.iter().map(|e| e.event_id.to_string()).collect(),
            )
        })
        .collect()
}

/// Sets `topic`'s `max.message.bytes` as an operator would, and waits
/// until the broker shows it (on a thread of its own: the admin helper
/// runs a runtime of its own).
fn set_topic_limit(env: &TestEnv, topic: &str, bytes: usize) {
    std::thread::scope(|s| {
        s.spawn(|| alter_by_hand(env, topic, &[("max.message.bytes", &bytes.to_string())]))
            .join()
            .unwrap();
    });
}

/// A SKU that does not compress (the broker judges compressed batches).
fn incompressible(len: usize) -> String {
    use rand::Rng;
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(len)
        .map(char::from)
        .collect()
}

/// Polls `query` (one integer) until it is `want`, failing after `limit`.
async fn wait_for_count(env: &TestEnv, query: &str, id: i64, want: i64, limit: Duration) {
    let db = env.db();
    let deadline = Instant::now() + limit;
    loop {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(query.to_string()))
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{query} [{id}] = {n}, not {want}, after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outbox_row_over_the_limit_is_dead_lettered_and_its_shard_flows_on() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure"]).success();
    let order_topic = env.settings.topics.order_events.name.clone();
    let dlq_topic = env.settings.topics.dead_letter.name.clone();
    set_topic_limit(&env, &order_topic, TOPIC_LIMIT);

    // Shard 0 (orders 16, 32, 48): the big order.created of order 32
    // between ordinary rows, and a later event of order 32 behind it.
    let a = created(16, "SKU-A".into());
    let big = created(32, incompressible(3 * TOPIC_LIMIT));
    let c = created(48, "SKU-C".into());
    let d = paid(32);
    let e = paid(16);
    let mut ids = Vec::new();
    for envelope in [&a, &big, &c, &d, &e] {
        ids.push(insert_row(&env, envelope).await);
    }
    let (big_id, d_id) = (ids[1], ids[3]);

    let mut relay = env.spawn(&["relay", "--instance", "r", "--output", "json"]);
    // The ordinary rows are published once, read committed, in order.
    let published = env.read(&order_topic, 3, Duration::from_secs(40));
    assert_eq!(
        by_key(&published),
        expected(&[(16, &[&a, &e]), (48, &[&c])]),
        "relay: {}",
        relay.stop_and_output()
    );

    // The big one is on the DLQ topic, with where it came from.
    let dead = env.read(&dlq_topic, 1, Duration::from_secs(20));
    let record = &dead[0];
    assert_eq!(record.key(), Some(&b"32"[..]));
    assert_eq!(header(record, "event_id"), Some(big.event_id.to_string()));
    assert_eq!(
        header(record, "event_name").as_deref(),
        Some("order.created")
    );
    assert_eq!(
        header(record, "orderpipe.error-class").as_deref(),
        Some("oversized")
    );
    assert_eq!(
        header(record, "orderpipe.original-topic").as_deref(),
        Some(order_topic.as_str())
    );
    assert_eq!(
        header(record, "orderpipe.outbox-id"),
        Some(big_id.to_string())
    );
    // The topic's limit less Kafka's 61-byte record batch header (a record
    // alone in a batch still carries it).
    assert_eq!(
        header(record, "orderpipe.limit-bytes"),
        Some((TOPIC_LIMIT - 61).to_string())
    );
    let size: usize = header(record, "orderpipe.record-bytes")
        .unwrap()
        .parse()
        .unwrap();
    assert!(size > TOPIC_LIMIT, "{size}");
    assert!(
        record.payload().unwrap().len() < TOPIC_LIMIT,
        "the dead letter's value is truncated to fit"
    );

    // In the outbox: the big row is dead with its reason, the later event
    // of its order waits unsent behind it.
    wait_for_count(
        &env,
        "SELECT COUNT(*) FROM outbox_messages WHERE id = ? AND dead_ms IS NOT NULL",
        big_id,
        1,
        Duration::from_secs(20),
    )
    .await;
    let (reason,): (String,) =
        sqlx::query_as("SELECT dead_reason FROM outbox_messages WHERE id = ?")
            .bind(big_id)
            .fetch_one(&env.db().pool)
            .await
            .unwrap();
    assert!(
        reason.contains(&format!("{size} bytes"))
            && reason.contains(&format!("max.message.bytes = {TOPIC_LIMIT}")),
        "{reason}"
    );
    wait_for_count(
        &env,
        "SELECT COUNT(*) FROM outbox_messages WHERE id = ? AND sent_ms IS NULL",
        d_id,
        1,
        Duration::from_secs(1),
    )
    .await;

    // `dlq list` shows it after the persister ran.
    env.cli(&["dlq", "persist", "--until-idle", "3"]).success();
    let listed: Vec<Value> =
        serde_json::from_str(&env.cli(&["dlq", "list", "--output", "json"]).success()).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let row = &listed[0];
    assert_eq!(row["consumer_group"], "outbox-relay");
    assert_eq!(row["error_class"], "oversized");
    assert_eq!(row["event_id"], big.event_id.to_string());
    assert_eq!(row["key"], "32");
    let message = row["error_message"].as_str().unwrap();
    for needle in [
        format!("outbox row {big_id}"),
        "order 32".into(),
        format!("{size} bytes"),
        format!("max.message.bytes = {TOPIC_LIMIT}"),
    ] {
        assert!(message.contains(&needle), "{needle} not in {message}");
    }

    // The shard keeps publishing new rows.
    let f = paid(48);
    insert_row(&env, &f).await;
    let published = env.read(&order_topic, 4, Duration::from_secs(20));
    assert_eq!(
        by_key(&published),
        expected(&[(16, &[&a, &e]), (48, &[&c, &f])])
    );

    // The operator raises the limit and re-queues the row: it is published,
    // then the event held behind it, in order.
    set_topic_limit(&env, &order_topic, 1_048_588);
    sqlx::query("UPDATE outbox_messages SET sent_ms = NULL, dead_ms = NULL WHERE id = ?")
        .bind(big_id)
        .execute(&env.db().pool)
        .await
        .unwrap();
    let published = env.read(&order_topic, 6, Duration::from_secs(40));
    assert_eq!(
        by_key(&published),
        expected(&[(16, &[&a, &e]), (32, &[&big, &d]), (48, &[&c, &f])]),
        "relay: {}",
        relay.stop_and_output()
    );
    let summary = crate::outbox::stop(&mut relay);
    assert_eq!(summary["dead_lettered"], 1, "{summary}");
    assert_eq!(summary["published"], 6, "{summary}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_refuses_an_order_whose_event_would_exceed_the_limit_and_writes_nothing() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure"]).success();
    let order_topic = env.settings.topics.order_events.name.clone();
    // Below what a 64-character SKU needs, above what a short one needs.
    set_topic_limit(&env, &order_topic, 520);
    let api = crate::outbox::start_api(&env).await;
    let client = reqwest::Client::new();
    let order = |sku: &str| json!({"user_id": 1, "sku": sku, "quantity": 1, "amount": 500});

    let refused = client
        .post(format!("{api}/orders"))
        .json(&order(&"L".repeat(64)))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 413);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["field"], "sku", "{body}");
    // The topic's limit less Kafka's 61-byte record batch header.
    assert_eq!(body["limit_bytes"], 520 - 61, "{body}");
    assert!(body["size_bytes"].as_u64().unwrap() > 520 - 61, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains(&order_topic),
        "{body}"
    );
    let db = env.db();
    for table in ["orders", "outbox_messages"] {
        let (n,): (i64,) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(n, 0, "{table}: the refused request wrote a row");
    }

    let accepted = client
        .post(format!("{api}/orders"))
        .json(&order("A"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        accepted.status().as_u16(),
        201,
        "{}",
        accepted.text().await.unwrap()
    );
    // What the API accepts, the broker takes: the relay publishes it.
    let relay = env
        .cli(&[
            "relay",
            "--instance",
            "r",
            "--until-idle",
            "3",
            "--output",
            "json",
        ])
        .success();
    let summary: Value = serde_json::from_str(&relay).unwrap();
    assert_eq!(
        (
            summary["published"].as_u64(),
            summary["dead_lettered"].as_u64()
        ),
        (Some(2), Some(0)),
        "{summary}"
    );
    env.read(&order_topic, 1, Duration::from_secs(20));
}
