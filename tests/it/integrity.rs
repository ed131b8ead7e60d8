//! Event integrity at the consumer against Kafka + Apicurio + MariaDB:
//! `event_version` majors the handlers do not declare go to the DLQ as
//! `unsupported_version` with no effect, compatible minors are applied, and
//! a reused `event_id` with other content is skipped but counted, logged and
//! listed (a true duplicate is not).

use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apache_avro::types::Value as Avro;
use orderpipe::codec::Codec;
use orderpipe::codec::avro::to_avro;
use orderpipe::db::Db;
use orderpipe::envelope::{Envelope, EventData};
use orderpipe::kafka::client::client_config;
use orderpipe::producer::record_headers;
use orderpipe::schema::{SchemaCatalog, TopicSchema};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

use crate::consumer::consume;
use crate::helpers::{TestEnv, metric, scalar};

/// Sends one framed value keyed by its order, with the usual headers.
async fn send(env: &TestEnv, envelope: &Envelope, value: &[u8]) {
    send_to(env, envelope, value, None).await
}

/// [`send`], to the given partition instead of the key's.
async fn send_to(env: &TestEnv, envelope: &Envelope, value: &[u8], partition: Option<i32>) {
    let producer: FutureProducer = client_config(&env.settings.kafka.client_options())
        .create()
        .unwrap();
    let key = envelope.key();
    let mut record = FutureRecord::to(&env.settings.topics.order_events.name)
        .key(&key)
        .payload(value)
        .headers(record_headers(envelope));
    record.partition = partition;
    producer
        .send(record, Duration::from_secs(10))
        .await
        .unwrap();
}

fn created(order_id: i64, version: &str) -> Envelope {
    let mut e = Envelope::new("checkout", EventData::sample_created(order_id));
    e.event_version = version.to_string();
    e
}

/// Rows of `table` for `order_id`.
async fn rows_for(db: &Db, table: &str, order_id: i64) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE order_id = ?");
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(order_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    n
}

async fn dedup_rows(db: &Db, event_id: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM applied_events WHERE event_id = ?")
        .bind(event_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_major_is_dead_lettered_with_no_effect_and_a_newer_compatible_minor_is_applied()
{
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "integrity"])
        .success();
    let topic = env.settings.topics.order_events.name.clone();
    let catalog = SchemaCatalog::embedded();
    let v1 = Codec::new(&env.settings.registry, &topic, catalog.order_events(), true).unwrap();

    // A newer BACKWARD-compatible writer schema of the same subject:
    // order.created gains an optional field with a default.
    let anchor = r#"{"name": "created_at", "type": "string", "doc": "ISO 8601 UTC"}"#;
    let raw = catalog.order_events().raw.replacen(
        anchor,
        &format!(
            r#"{anchor}, {{"name": "coupon_code", "type": ["null", "string"], "default": null}}"#
        ),
        1,
    );
    assert_ne!(raw, catalog.order_events().raw, "schema anchor moved");
    let newer = TopicSchema {
        topic: topic.clone(),
        parsed: apache_avro::Schema::parse_str(&raw).unwrap(),
        raw,
    };
    let v1_7 = Codec::new(&env.settings.registry, &topic, &newer, true).unwrap();

    let major_99 = created(1, "99.0");
    let minor_7 = created(2, "1.7");
    let current = created(3, "1.0");
    let unreadable = created(4, "one");
    send(&env, &major_99, &v1.encode(&major_99).await.unwrap()).await;
    let mut value = to_avro(&minor_7, &catalog.order_events().parsed).unwrap();
    if let Avro::Record(fields) = &mut value
        && let Avro::Union(_, data) = &mut fields[6].1
        && let Avro::Record(data) = data.as_mut()
    {
        data.push((
            "coupon_code".into(),
            Avro::Union(1, Box::new(Avro::String("SPRING".into()))),
        ));
    }
    let framed = v1_7.encode_value(value).await.unwrap();
    let (v1_id, v1_7_id) = (v1.warm_up().await.unwrap(), v1_7.warm_up().await.unwrap());
    assert_ne!(
        v1_id, v1_7_id,
        "the 1.7 record is written with the newer schema"
    );
    send(&env, &minor_7, &framed).await;
    send(&env, &current, &v1.encode(&current).await.unwrap()).await;
    send(&env, &unreadable, &v1.encode(&unreadable).await.unwrap()).await;

    let summary = consume(&env, "integrity", "inventory,notification");
    assert_eq!(summary["applied"], 2, "{summary}");
    assert_eq!(summary["dead_lettered"], 2, "{summary}");
    assert_eq!(summary["unsupported_versions"], 2, "{summary}");
    assert_eq!(
        summary["sent_to_retry"], 0,
        "not transient, never retried: {summary}"
    );

    let db = env.db();
    for (order, applied) in [(1, false), (2, true), (3, true), (4, false)] {
        let want = i64::from(applied);
        assert_eq!(
            rows_for(&db, "inventory_reservations", order).await,
            want,
            "order {order}"
        );
        assert_eq!(
            rows_for(&db, "notifications", order).await,
            want,
            "order {order}"
        );
    }
    // Not claimed either, so a replay after the consumer learns the major applies it.
    assert_eq!(dedup_rows(&db, &major_99.event_id.to_string()).await, 0);
    assert_eq!(dedup_rows(&db, &unreadable.event_id.to_string()).await, 0);

    let persisted: Value = serde_json::from_str(
        &env.cli(&["dlq", "persist", "--until-idle", "3", "--output", "json"])
            .success(),
    )
    .unwrap();
    assert_eq!(persisted["read"], 2, "{persisted}");
    let listed: Value = serde_json::from_str(
        &env.cli(&[
            "dlq",
            "list",
            "--error",
            "unsupported_version",
            "--output",
            "json",
        ])
        .success(),
    )
    .unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed:#}");
    let by_id = |e: &Envelope| {
        rows.iter()
            .find(|r| r["event_id"] == e.event_id.to_string())
            .unwrap_or_else(|| panic!("{listed:#}"))
    };
    let r99 = by_id(&major_99);
    assert_eq!(r99["error_class"], "unsupported_version");
    assert_eq!(r99["attempts"], 0, "{r99}");
    let why = r99["error_message"].as_str().unwrap();
    assert!(
        why.contains("major 99") && why.contains("`inventory`"),
        "{why}"
    );
    let r_one = by_id(&unreadable);
    assert_eq!(r_one["error_class"], "unsupported_version");
    assert!(
        r_one["error_message"]
            .as_str()
            .unwrap()
            .contains("MAJOR.MINOR"),
        "{r_one}"
    );
}

/// Starts `consume` with a health address and keeps every stderr line.
fn spawn_consumer(
    env: &TestEnv,
    group: &str,
) -> (crate::helpers::Spawned, String, Arc<Mutex<Vec<String>>>) {
    let mut child = env.spawn(&[
        "consume",
        "--group",
        group,
        "--handler",
        "inventory,notification",
        "--until-idle",
        "4",
        "--health-addr",
        "127.0.0.1:0",
        "--output",
        "json",
        "--log-format",
        "json",
    ]);
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("health endpoints on http://") {
                let _ = tx.send(rest.trim_end_matches("/health/ready").to_string());
            }
            kept.lock().unwrap().push(line);
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("health endpoint announced");
    (child, addr, lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_event_id_with_other_content_is_skipped_counted_logged_and_listed() {
    let group = "integrity-dup";
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", group]).success();
    let first = created(10, "1.0");
    // A true redelivery: the same event again, even from a producer that
    // bumped the minor version and started a new trace.
    let mut redelivered = first.clone();
    redelivered.event_version = "1.3".into();
    redelivered.trace_id = orderpipe::envelope::new_trace_id();
    // A producer reusing the id for another event.
    let mut reused = first.clone();
    if let EventData::Created(d) = &mut reused.data {
        d.quantity += 5;
    }
    let after = created(10, "1.0");
    let codec = env.order_events_codec();
    for e in [&first, &redelivered, &reused, &after] {
        send(&env, e, &codec.encode(e).await.unwrap()).await;
    }

    let (mut child, addr, lines) = spawn_consumer(&env, group);
    // Exported from the start (at 0, so `increase()` sees the first
    // conflict), then counted; read until the member exits when idle.
    let series = format!(r#"orderpipe_conflicting_duplicates_total{{group="{group}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "consumer did not go idle:\n{}",
            lines.lock().unwrap().join("\n")
        );
        if let Some(value) = metric(&addr, &series) {
            seen.push(value);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success());
    // The true duplicate is not a conflict: exactly one.
    assert_eq!(seen.last(), Some(&1.0), "{series} over time: {seen:?}");
    assert!(seen.iter().all(|v| *v == 0.0 || *v == 1.0), "{seen:?}");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["applied"], 2, "{summary}");
    assert_eq!(summary["duplicates"], 2, "{summary}");
    assert_eq!(summary["conflicting_duplicates"], 1, "{summary}");

    // Only the first event took effect.
    let db = env.db();
    let (quantity,): (i32,) =
        sqlx::query_as("SELECT quantity FROM inventory_reservations WHERE order_id = 10")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let EventData::Created(d) = &first.data else {
        unreachable!()
    };
    assert_eq!(quantity, d.quantity);

    // Logged at error with both positions (the records share a partition: offsets 0 and 2).
    let topic = &env.settings.topics.order_events.name;
    let logged = lines.lock().unwrap().join("\n");
    let line: Value = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("event id reused"))
        })
        .unwrap_or_else(|| panic!("no conflict logged:\n{logged}"));
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["event_id"], first.event_id.to_string(), "{line}");
    let (partition,): (i32,) =
        sqlx::query_as("SELECT kafka_partition FROM applied_events WHERE event_id = ?")
            .bind(first.event_id.to_string())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(line["first"], format!("{topic}/{partition}@0"), "{line}");
    assert_eq!(line["this"], format!("{topic}/{partition}@2"), "{line}");

    // Listed, once, for this group only.
    let listed: Value = serde_json::from_str(
        &env.cli(&["dlq", "conflicts", "--group", group, "--output", "json"])
            .success(),
    )
    .unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed:#}");
    let c = &rows[0];
    assert_eq!(c["event_id"], first.event_id.to_string());
    assert_eq!(
        (c["first_offset"].as_i64(), c["offset"].as_i64()),
        (Some(0), Some(2)),
        "{c}"
    );
    assert_ne!(c["first_digest"], c["digest"]);
    let table = env.cli(&["dlq", "conflicts"]).success();
    assert!(
        table.contains(&first.event_id.to_string()) && table.contains("1 conflicting duplicates"),
        "{table}"
    );
    let other: Value = serde_json::from_str(
        &env.cli(&["dlq", "conflicts", "--group", "nobody", "--output", "json"])
            .success(),
    )
    .unwrap();
    assert_eq!(other, Value::Array(vec![]));

    // Dedup rows from before the digest existed are unknown, not conflicting.
    sqlx::query("UPDATE event_dedup SET payload_digest = NULL")
        .execute(&db.pool)
        .await
        .unwrap();
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        client_config(&env.settings.kafka.client_options())
            .create()
            .unwrap();
    for r in admin
        .delete_groups(&[group], &rdkafka::admin::AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let again = consume(&env, group, "inventory,notification");
    assert_eq!(again["duplicates"], 4, "{again}");
    assert_eq!(again["conflicting_duplicates"], 0, "{again}");
}

/// The set-based claim on MariaDB: one `INSERT IGNORE ... RETURNING`
/// returns only the rows it inserted. An event this group applied before,
/// and an id given twice in the same set, are not claimed; `apply_seq`
/// follows the order of the set.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_claim_returns_only_the_rows_it_inserted() {
    use orderpipe::dedup::{RecordOrigin, claim_batch};
    let (_env, db, [g, other], events) = claim_fixture(4).await;
    let origins: Vec<RecordOrigin> = (0..5)
        .map(|offset| RecordOrigin {
            topic: "t".into(),
            partition: 0,
            offset,
            key: "k".into(),
        })
        .collect();
    let mut tx = db.begin().await.unwrap();
    assert_eq!(
        claim_batch(&mut tx, &g, &[(&events[1], &origins[0])])
            .await
            .unwrap(),
        [true]
    );
    // events[1] is claimed already; events[0] comes twice.
    let set = [
        (&events[0], &origins[1]),
        (&events[1], &origins[2]),
        (&events[0], &origins[3]),
        (&events[2], &origins[4]),
    ];
    assert_eq!(
        claim_batch(&mut tx, &g, &set).await.unwrap(),
        [true, false, false, true]
    );
    // Another group claims its own rows.
    assert_eq!(
        claim_batch(&mut tx, &other, &set).await.unwrap(),
        [true, true, false, true]
    );
    tx.commit().await.unwrap();
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT event_id, kafka_offset, apply_seq FROM applied_events WHERE consumer_group = 'g' ORDER BY apply_seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let ids: Vec<(String, i64)> = rows
        .iter()
        .map(|(id, offset, _)| (id.clone(), *offset))
        .collect();
    let id = |n: usize| events[n].event_id.to_string();
    assert_eq!(
        ids,
        [(id(1), 0), (id(0), 1), (id(2), 4)],
        "one row per event, the first occurrence, in the set's order"
    );
    assert!(rows.windows(2).all(|w| w[0].2 < w[1].2));
    // More rows than one statement takes: chunked, every one claimed once.
    let many: Vec<Envelope> = (100..1300).map(|order| created(order, "1.0")).collect();
    let set: Vec<(&Envelope, &RecordOrigin)> = many.iter().map(|e| (e, &origins[0])).collect();
    let mut tx = db.begin().await.unwrap();
    let claimed = claim_batch(&mut tx, &g, &set).await.unwrap();
    assert!(
        claimed.iter().all(|c| *c),
        "{} of 1200 claimed",
        claimed.iter().filter(|c| **c).count()
    );
    assert!(
        claim_batch(&mut tx, &g, &set)
            .await
            .unwrap()
            .iter()
            .all(|c| !c)
    );
    tx.commit().await.unwrap();
    assert_eq!(scalar(&db, APPLIED_BY_G).await, 1203);
}

/// Rows `event_dedup` holds for group `g`, and for group `other`.
const APPLIED_BY_G: &str = "SELECT COUNT(*) FROM applied_events WHERE consumer_group = 'g'";
const APPLIED_BY_OTHER: &str = "SELECT COUNT(*) FROM applied_events WHERE consumer_group = 'other'";

/// The claim tests' database, its dedup groups `g` and `other`, and
/// `events` created events (orders 1 to `events`).
async fn claim_fixture(events: i64) -> (TestEnv, Db, [orderpipe::dedup::Group; 2], Vec<Envelope>) {
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    let group = |name| orderpipe::dedup::group(&db, name);
    let groups = [group("g").await.unwrap(), group("other").await.unwrap()];
    let events = (1..=events).map(|order| created(order, "1.0")).collect();
    (env, db, groups, events)
}

/// The happy path's claim on MariaDB counts the rows instead of reading
/// them back: `true` only when every event of the set went in. A set with
/// an event the group applied before, or with an id given twice, is
/// `false` (the consumer then rolls back and asks `claim_batch` which).
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_without_its_result_set_is_true_only_when_every_event_is_new() {
    use orderpipe::dedup::{RecordOrigin, claim_all};
    let (_env, db, [g, other], events) = claim_fixture(3).await;
    let origin = RecordOrigin {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: "k".into(),
    };
    let set = |picks: &[usize]| -> Vec<(&Envelope, &RecordOrigin)> {
        picks.iter().map(|&i| (&events[i], &origin)).collect()
    };
    let mut tx = db.begin().await.unwrap();
    assert!(claim_all(&mut tx, &g, &set(&[0, 1])).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(scalar(&db, APPLIED_BY_G).await, 2);
    let mut tx = db.begin().await.unwrap();
    assert!(
        !claim_all(&mut tx, &g, &set(&[2, 1])).await.unwrap(),
        "events[1] was applied before"
    );
    assert!(
        !claim_all(&mut tx, &other, &set(&[2, 2])).await.unwrap(),
        "an id given twice"
    );
    tx.rollback().await.unwrap();
    assert_eq!(scalar(&db, APPLIED_BY_G).await, 2);
    assert_eq!(scalar(&db, APPLIED_BY_OTHER).await, 0);
    // More rows than one statement takes: every piece counted.
    let many: Vec<Envelope> = (100..1300).map(|order| created(order, "1.0")).collect();
    let all: Vec<(&Envelope, &RecordOrigin)> = many.iter().map(|e| (e, &origin)).collect();
    let mut tx = db.begin().await.unwrap();
    assert!(claim_all(&mut tx, &other, &all).await.unwrap());
    assert!(!claim_all(&mut tx, &other, &all[1199..]).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(scalar(&db, APPLIED_BY_OTHER).await, 1200);
}

/// The built-in handlers' set-based entry points on MariaDB give each
/// event the verdict the per-event path gives: written, already done
/// (a redelivery caught by business state), ignored, or an illegal
/// transition that fails that event alone and writes nothing for it.
/// Records of one wave (one partition, distinct orders) that different
/// handlers refuse: each goes to the DLQ with its own handler's reason, the
/// others commit once, and a refused record leaves no effect of any handler
/// (neither of those before the one that refused it nor of those after).
#[tokio::test(flavor = "multi_thread")]
async fn records_refused_by_different_handlers_in_one_wave_each_go_to_the_dlq_alone() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "waves"]).success();
    let codec = env.order_events_codec();
    let life = |order: i64, step: usize| {
        Envelope::new("checkout", EventData::sample_lifecycle(order).remove(step))
    };
    // [created, paid, shipped, canceled, refunded][step]. Order 2's cancel
    // has no reservation to release (inventory, the first handler, refuses
    // it); order 3's refund has no payment (inventory ignores it, payment,
    // the second, refuses it).
    let (created_1, canceled_2, refunded_3, created_4) =
        (life(1, 0), life(2, 3), life(3, 4), life(4, 0));
    let events = [&created_1, &canceled_2, &refunded_3, &created_4];
    for e in events {
        send_to(&env, e, &codec.encode(e).await.unwrap(), Some(0)).await;
    }

    let summary = consume(&env, "waves", "inventory,payment,notification");
    assert_eq!(summary["applied"], 2, "{summary}");
    assert_eq!(summary["dead_lettered"], 2, "{summary}");
    assert_eq!(summary["apply_failures"], 2, "{summary}");
    let db = env.db();
    // Only the two applied creates left rows (no payment was applied).
    let applied: [i64; 2] = [1, 4];
    for (table, with_rows) in [
        ("inventory_reservations", &applied[..]),
        ("payments", &[][..]),
        ("notifications", &applied[..]),
    ] {
        for order in 1..=4 {
            assert_eq!(
                rows_for(&db, table, order).await,
                i64::from(with_rows.contains(&order)),
                "order {order}, {table}"
            );
        }
    }
    for e in events {
        let applied = e.event_id == created_1.event_id || e.event_id == created_4.event_id;
        assert_eq!(
            dedup_rows(&db, &e.event_id.to_string()).await,
            i64::from(applied)
        );
    }

    env.cli(&["dlq", "persist", "--until-idle", "3"]).success();
    let listed: Value =
        serde_json::from_str(&env.cli(&["dlq", "list", "--output", "json"]).success()).unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed:#}");
    // Each with its own handler's words, and where it came from.
    for (refused, offset, why) in [
        (&canceled_2, 1, "cannot release stock"),
        (&refunded_3, 2, "cannot refund"),
    ] {
        let row = rows
            .iter()
            .find(|r| r["event_id"] == refused.event_id.to_string())
            .unwrap_or_else(|| panic!("{listed:#}"));
        assert_eq!(row["error_class"], "handler_fatal", "{row}");
        let message = row["error_message"].as_str().unwrap();
        assert!(message.contains(why), "{row}");
        assert_eq!(row["original_partition"], 0, "{row}");
        assert_eq!(row["original_offset"], offset, "{row}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_handlers_batch_entry_points_judge_each_event_on_its_own() {
    use orderpipe::consumer::handler::{Effect, Handler, HandlerError};
    use orderpipe::consumer::handlers::{Inventory, Notification, Payment, Points};
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    let life = |order: i64| -> Vec<Envelope> {
        EventData::sample_lifecycle(order)
            .into_iter()
            .map(|d| Envelope::new("checkout", d))
            .collect()
    };
    // [created, paid, shipped, canceled, refunded] of orders 1..=4.
    let (o1, o2, o3, o4) = (life(1), life(2), life(3), life(4));
    let mut tx = db.begin().await.unwrap();
    let first: Vec<&Envelope> = vec![&o1[0], &o2[0], &o3[3], &o4[1]];
    let inventory = Inventory.apply_batch(&mut tx, &first).await.unwrap();
    assert!(
        matches!(
            inventory[..],
            [
                Ok(Effect::Applied),
                Ok(Effect::Applied),
                Err(HandlerError::Fatal(_)),
                Ok(Effect::Ignored)
            ]
        ),
        "{inventory:?}"
    );
    let payment = Payment.apply_batch(&mut tx, &first).await.unwrap();
    assert!(
        matches!(
            payment[..],
            [
                Ok(Effect::Ignored),
                Ok(Effect::Ignored),
                Ok(Effect::Ignored),
                Ok(Effect::Applied)
            ]
        ),
        "{payment:?}"
    );
    // Again (a redelivery): nothing is written twice.
    let again = Inventory.apply_batch(&mut tx, &first[..2]).await.unwrap();
    assert!(
        matches!(
            again[..],
            [Ok(Effect::AlreadyDone), Ok(Effect::AlreadyDone)]
        ),
        "{again:?}"
    );
    // Order 1 canceled (legal), order 2 refunded (never paid), order 4 refunded (paid).
    let second: Vec<&Envelope> = vec![&o1[3], &o2[4], &o4[4]];
    let inventory = Inventory.apply_batch(&mut tx, &second).await.unwrap();
    assert!(
        matches!(
            inventory[..],
            [
                Ok(Effect::Applied),
                Ok(Effect::Ignored),
                Ok(Effect::Ignored)
            ]
        ),
        "{inventory:?}"
    );
    let payment = Payment.apply_batch(&mut tx, &second).await.unwrap();
    assert!(
        matches!(
            payment[..],
            [
                Ok(Effect::Ignored),
                Err(HandlerError::Fatal(_)),
                Ok(Effect::Applied)
            ]
        ),
        "{payment:?}"
    );
    let points = Points
        .apply_batch(&mut tx, &[&o4[1], &o2[4]])
        .await
        .unwrap();
    assert!(
        matches!(
            points[..],
            [Ok(Effect::Applied), Err(HandlerError::Fatal(_))]
        ),
        "{points:?}"
    );
    let points = Points.apply_batch(&mut tx, &[&o4[4]]).await.unwrap();
    assert!(matches!(points[..], [Ok(Effect::Applied)]), "{points:?}");
    let notes = Notification
        .apply_batch(&mut tx, &[&o1[0], &o3[0]])
        .await
        .unwrap();
    assert!(
        matches!(notes[..], [Ok(Effect::Applied), Ok(Effect::Applied)]),
        "{notes:?}"
    );
    assert!(matches!(
        Notification.apply(&mut tx, &o1[0]).await,
        Ok(Effect::AlreadyDone)
    ));
    tx.commit().await.unwrap();
    let state = |table: &'static str, order: i64| {
        let db = db.clone();
        async move {
            let sql = sqlx::AssertSqlSafe(format!("SELECT status FROM {table} WHERE order_id = ?"));
            sqlx::query_as::<_, (String,)>(sql)
                .bind(order)
                .fetch_optional(&db.pool)
                .await
                .unwrap()
                .map(|r| r.0)
        }
    };
    assert_eq!(
        state("inventory_reservations", 1).await.as_deref(),
        Some("released")
    );
    assert_eq!(
        state("inventory_reservations", 2).await.as_deref(),
        Some("reserved")
    );
    assert_eq!(
        state("inventory_reservations", 3).await,
        None,
        "a failed event writes nothing"
    );
    assert_eq!(state("payments", 4).await.as_deref(), Some("refunded"));
    assert_eq!(state("payments", 2).await, None);
    let (points,): (i64,) =
        sqlx::query_as("SELECT CAST(SUM(points) AS SIGNED) FROM points_ledger WHERE order_id = 4")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(points, 0, "earned, then reversed");
}
