//! `orderpipe consume` against Kafka + MariaDB: exactly-once effects,
//! shared dedup across groups, bad input, and (serial, `--ignored`) crash,
//! rebalance and database-outage safety.

use std::io::Write;
use std::process::Child;
use std::time::{Duration, Instant};

use orderpipe::db::Db;
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use orderpipe::kafka::client::client_config;
use orderpipe::schema::SchemaCatalog;
use rand::Rng;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

use crate::exactly_once::{ALL_HANDLERS, assert_applied_in_order, assert_exactly_once};
use crate::helpers::{Spawned, TestEnv, http_get, kill_and_output, stack, wait_for_status};

/// A member of `group` (every handler) with its health endpoint on a free
/// port: the process and the endpoint's address.
pub fn member_with_health(env: &TestEnv, group: &str) -> (Spawned, String) {
    let mut child = env.spawn(&[
        "consume",
        "--group",
        group,
        "--handler",
        ALL_HANDLERS,
        "--health-addr",
        "127.0.0.1:0",
    ]);
    let addr = crate::helpers::health_addr(&mut child);
    (child, addr)
}

/// Runs the group to idleness and returns its JSON summary.
pub fn consume(env: &TestEnv, group: &str, handlers: &str) -> Value {
    let out = env
        .cli(&[
            "consume",
            "--group",
            group,
            "--handler",
            handlers,
            "--until-idle",
            "3",
            "--output",
            "json",
        ])
        .success();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("summary is JSON ({e}): {out}"))
}

pub fn write_ndjson(events: &[Envelope]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for e in events {
        writeln!(file, "{}", serde_json::to_string(e).unwrap()).unwrap();
    }
    file
}

/// Produces `count` synthetic events and returns them as sent.
pub fn produce_lifecycles(env: &TestEnv, count: usize, orders: usize, seed: u64) -> Vec<Envelope> {
    env.cli(&[
        "produce",
        "--count",
        &count.to_string(),
        "--orders",
        &orders.to_string(),
        "--seed",
        &seed.to_string(),
        "--first-order-id",
        "1",
    ])
    .success();
    LifecycleGenerator::new("x", orders, 1, seed)
        .take(count)
        .collect()
}

pub async fn count_rows(db: &Db, group: &str) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM applied_events WHERE consumer_group = ?")
            .bind(group)
            .fetch_one(&db.pool)
            .await
            .unwrap_or((-1,));
    n
}

/// Waits until `group` has applied `target` events. A timeout stops
/// `members` and the panic shows what each printed: a stall on a loaded
/// machine then says where it stood.
async fn wait_for_rows(
    pool: &Db,
    group: &str,
    target: i64,
    timeout: Duration,
    members: &mut [&mut Spawned],
) {
    let deadline = Instant::now() + timeout;
    loop {
        let n = count_rows(pool, group).await;
        if n >= target {
            return;
        }
        if Instant::now() >= deadline {
            let outputs: Vec<String> = members.iter_mut().map(|m| m.stop_and_output()).collect();
            panic!(
                "{group} applied only {n} of {target} within {timeout:?}; members:\n{}",
                outputs.join("\n---\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Stops `child` with SIGTERM and returns its exit status. One still
/// running a minute later (its own stop timeout is 25 s) is killed, and the
/// test fails with what it printed rather than hanging.
pub fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return status;
        }
        if Instant::now() >= deadline {
            panic!(
                "pid {} still ran 60 s after SIGTERM: {}",
                child.id(),
                kill_and_output(child)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_event_delivered_twice_is_applied_once() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "dup-group"])
        .success();
    let events: Vec<Envelope> = LifecycleGenerator::new("checkout", 5, 1, 11)
        .take(20)
        .collect();
    // Different offsets: the first five events are produced a second time.
    let mut twice = events.clone();
    twice.extend_from_slice(&events[..5]);
    let file = write_ndjson(&twice);
    env.cli(&["produce", "--file", file.path().to_str().unwrap()])
        .success();

    let summary = consume(&env, "dup-group", ALL_HANDLERS);
    assert_eq!(summary["consumed"], 25, "{summary}");
    assert_eq!(summary["applied"], 20, "{summary}");
    assert_eq!(summary["duplicates"], 5, "{summary}");
    let pool = env.db();
    assert_exactly_once(&pool, "dup-group", &events).await;

    // Same offsets: drop the group's committed offsets so every record is
    // delivered again; nothing is applied twice.
    crate::router::delete_group(&env.admin(), "dup-group").await;
    let again = consume(&env, "dup-group", ALL_HANDLERS);
    assert_eq!(again["applied"], 0, "{again}");
    assert_eq!(again["duplicates"], 25, "{again}");
    assert_exactly_once(&pool, "dup-group", &events).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_groups_sharing_the_dedup_table_each_apply_every_event() {
    let env = TestEnv::new().with_database().await;
    env.cli(&[
        "topics",
        "ensure",
        "--group",
        "inventory-service.order.consumer,notification-service.order.consumer",
    ])
    .success();
    let events = produce_lifecycles(&env, 2_000, 200, 21);
    let a = consume(
        &env,
        "inventory-service.order.consumer",
        "inventory,payment",
    );
    let b = consume(
        &env,
        "notification-service.order.consumer",
        "logistics,notification,points",
    );
    assert_eq!(a["applied"], 2_000, "{a}");
    assert_eq!(b["applied"], 2_000, "{b}");
    let pool = env.db();
    // Both groups' rows are in the one table, each complete and in order.
    assert_applied_in_order(&pool, "inventory-service.order.consumer", &events).await;
    assert_applied_in_order(&pool, "notification-service.order.consumer", &events).await;
    assert_exactly_once(&pool, "notification-service.order.consumer", &events).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_records_are_reported_and_do_not_stop_the_consumer() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "g"]).success();
    let topic = env.settings.topics.order_events.name.clone();
    let codec = env.order_events_codec();
    let good: Vec<Envelope> = LifecycleGenerator::new("checkout", 3, 1, 5)
        .take(6)
        .collect();
    let mut invalid =
        orderpipe::codec::avro::to_avro(&good[0], &SchemaCatalog::embedded().order_events().parsed)
            .unwrap();
    if let apache_avro::types::Value::Record(fields) = &mut invalid {
        fields[1].1 = apache_avro::types::Value::String("kafka.send".into());
    }
    let invalid = codec.encode_value(invalid).await.unwrap();
    let mut truncated = codec.encode(&good[1]).await.unwrap();
    truncated.truncate(12);
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", vec![0xde, 0xad, 0xbe, 0xef, 0x42, 0x17]),
        ("wrong magic byte", vec![7, 0, 0, 0, 1, 2, 3]),
        (
            "unknown schema id",
            vec![0, 0x7f, 0xff, 0xff, 0x01, 2, 4, 6],
        ),
        ("invalid event name", invalid),
        ("truncated Avro", truncated),
    ];
    let producer: FutureProducer = client_config(&env.settings.kafka.client_options())
        .create()
        .unwrap();
    for (i, (_, value)) in poison.iter().enumerate() {
        let key = good[i % good.len()].key();
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(value),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let file = write_ndjson(&good);
    env.cli(&["produce", "--file", file.path().to_str().unwrap()])
        .success();

    // Per-record routing is under test: with `--ordering key` the good events
    // would wait behind the poison of their order (see tests/it/ordering.rs).
    let args = [
        "consume",
        "--group",
        "g",
        "--handler",
        ALL_HANDLERS,
        "--until-idle",
        "3",
        "--output",
        "json",
        "--ordering",
        "none",
    ];
    let run = env.cli(&args);
    let out = run.success();
    let summary: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["decode_failures"], poison.len(), "{summary}");
    assert_eq!(summary["applied"], good.len(), "{summary}");
    let logs = run.text();
    for class in [
        "not_framed",
        "unknown_schema",
        "invalid_envelope",
        "avro_decode",
    ] {
        assert!(logs.contains(class), "no `{class}` in the logs:\n{logs}");
    }
    assert!(!logs.contains("panicked"), "{logs}");
    assert_exactly_once(&env.db(), "g", &good).await;
}

#[test]
fn unknown_handler_names_the_flag_and_the_choices() {
    let env = TestEnv::new();
    let out = env
        .cli(&[
            "consume",
            "--group",
            "g",
            "--handler",
            "billing",
            "--until-idle",
            "1",
        ])
        .failure();
    assert!(
        out.contains("--handler") && out.contains("billing") && out.contains("inventory, payment"),
        "{out}"
    );
}

/// SIGKILL at random moments during 50k events, restart each time (the
/// 1M run with 20 kills is `make bench-crash`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's full size (make test runs crash::four_sigkills_of_two_members_during_a_20k_run); run by `make soak`"]
async fn crash_safety_sigkill_during_a_50k_run() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "crash.order.consumer"])
        .success();
    let total = 50_000;
    let events = produce_lifecycles(&env, total, 5_000, 31);
    let pool = env.db();
    let group = "crash.order.consumer";
    let mut kills = 0;
    let mut rng = rand::rng();
    while kills < 5 {
        let before = count_rows(&pool, group).await;
        let mut child = env.spawn(&["consume", "--group", group, "--handler", ALL_HANDLERS]);
        // Kill once this run has made progress, at a random moment. The
        // restart waits for the killed member's session to expire: 120 s
        // leaves room for that on a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(120);
        while count_rows(&pool, group).await <= before {
            if Instant::now() >= deadline {
                panic!(
                    "no progress in 120 s after restart {} ({before} applied): {}",
                    kills + 1,
                    child.stop_and_output()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..1500))).await;
        child.kill().unwrap();
        child.wait().unwrap();
        let after = count_rows(&pool, group).await;
        if after < total as i64 {
            kills += 1;
            eprintln!("kill {kills}: {after} of {total} applied");
        } else {
            panic!("the run finished before 5 kills ({kills}); make the run longer");
        }
    }
    let summary = consume(&env, group, ALL_HANDLERS);
    eprintln!("final run: {summary}");
    assert_exactly_once(&pool, group, &events).await;
}

/// Members join and leave the group during the run.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: heavy; run by `make test` in the serial phase"]
async fn rebalance_safety_members_join_and_leave() {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "rebalance.order.consumer"])
        .success();
    let total = 60_000;
    let events = produce_lifecycles(&env, total, 3_000, 41);
    let pool = env.db();
    let group = "rebalance.order.consumer";
    let start = || env.spawn(&["consume", "--group", group, "--handler", ALL_HANDLERS]);
    let wait = Duration::from_secs(120);

    let mut first = start();
    wait_for_rows(&pool, group, 5_000, wait, &mut [&mut first]).await;
    let mut second = start();
    wait_for_rows(&pool, group, 15_000, wait, &mut [&mut first, &mut second]).await;
    let mut third = start();
    wait_for_rows(
        &pool,
        group,
        25_000,
        wait,
        &mut [&mut first, &mut second, &mut third],
    )
    .await;
    assert_stopped(&mut first); // leaves
    wait_for_rows(&pool, group, 35_000, wait, &mut [&mut second, &mut third]).await;
    second.kill().unwrap(); // dies
    second.wait().unwrap();
    let mut fourth = start();
    wait_for_rows(
        &pool,
        group,
        total as i64,
        wait,
        &mut [&mut third, &mut fourth],
    )
    .await;
    assert_stopped(&mut third);
    assert_stopped(&mut fourth);
    assert_exactly_once(&pool, group, &events).await;
}

/// Stops a member with SIGTERM: it exits 0, or 124 when its stop overran
/// the stop timeout (a close librdkafka never finishes, #4041), which loses
/// nothing either (the callers' exactly-once check); anything else, a crash
/// included, fails with what it printed.
fn assert_stopped(member: &mut Spawned) {
    let status = sigterm(member);
    match status.code() {
        Some(0) => {}
        Some(orderpipe::stopping::EXIT_STOP_TIMEOUT) => {
            eprintln!(
                "a member's stop overran its timeout: {}",
                member.stop_and_output()
            )
        }
        _ => panic!(
            "a member stopped with {status}: {}",
            member.stop_and_output()
        ),
    }
}

/// A stop that waits on something that never answers (here a table lock
/// another session holds) exits with status 124 at the stop timeout, names
/// what it waited on, and loses nothing: the next member applies every
/// event once.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_held_up_by_a_lock_exits_at_the_stop_timeout_naming_the_wait_and_loses_nothing() {
    let env = TestEnv::new().with_database().await;
    let group = "stuck-stop.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let events = produce_lifecycles(&env, 40, 10, 53);
    let db = env.db();
    // The consumer's first transaction writes event_dedup: it waits for this lock.
    let mut locker = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("LOCK TABLES event_dedup WRITE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let mut member = env.spawn(&[
        "consume",
        "--group",
        group,
        "--handler",
        ALL_HANDLERS,
        "--stop-timeout",
        "3",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE db = DATABASE() AND state = 'Waiting for table metadata lock' \
             AND info LIKE 'INSERT%event_dedup%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the consumer never waited for the lock: {}",
            member.stop_and_output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stopping = Instant::now();
    let status = sigterm(&mut member);
    let took = stopping.elapsed();
    let printed = member.stop_and_output();
    assert_eq!(
        status.code(),
        Some(orderpipe::stopping::EXIT_STOP_TIMEOUT),
        "{printed}"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "exited {took:?} after SIGTERM: {printed}"
    );
    assert!(
        printed.contains("did not finish within 3 s")
            && printed.contains("the partition workers finish their batches"),
        "the line does not say what the stop waited on: {printed}"
    );

    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut *locker)
        .await
        .unwrap();
    drop(locker);
    let summary = consume(&env, group, ALL_HANDLERS);
    assert_eq!(summary["applied"], 40, "{summary}");
    assert_exactly_once(&db, group, &events).await;
}

/// MariaDB stopped for 20 s with records flowing (issue 3).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: stops the shared MariaDB; run by `make test` in the serial phase"]
async fn database_outage_stops_commits_reports_unhealthy_and_resumes() {
    database_outage(Duration::from_secs(20)).await;
}

/// MariaDB stopped for 60 s with traffic flowing (issue 4): nothing lost,
/// everything applied once after it returns.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's full size (make test runs consumer::database_outage_stops_commits_reports_unhealthy_and_resumes); run by `make soak`"]
async fn database_down_for_60s_loses_nothing() {
    database_outage(Duration::from_secs(60)).await;
}

async fn database_outage(outage: Duration) {
    let env = TestEnv::new().with_database().await;
    env.cli(&["topics", "ensure", "--group", "outage.order.consumer"])
        .success();
    let total = 20_000;
    let group = "outage.order.consumer";
    let pool = env.db();
    let (mut consumer, health) = member_with_health(&env, group);
    let mut producer = env.spawn(&[
        "produce",
        "--count",
        &total.to_string(),
        "--orders",
        "1000",
        "--seed",
        "51",
        "--first-order-id",
        "1",
        "--rate",
        "1000",
    ]);
    let events: Vec<Envelope> = LifecycleGenerator::new("x", 1000, 1, 51)
        .take(total)
        .collect();
    wait_for_rows(
        &pool,
        group,
        2_000,
        Duration::from_secs(60),
        &mut [&mut consumer, &mut producer],
    )
    .await;
    tokio::task::block_in_place(|| {
        wait_for_status(&health, "/health/ready", 200, "", Duration::from_secs(30))
    });

    stack(&["stop", "mariadb"]);
    let down_at = Instant::now();
    let mut saw_unhealthy = None;
    while down_at.elapsed() < outage {
        let (status, body) = http_get(&health, "/health/ready");
        if status == 503 && body.contains("database") {
            saw_unhealthy.get_or_insert(body);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stack(&["start", "mariadb"]);
    let body = saw_unhealthy.expect("/health/ready never reported the database down");
    eprintln!("while down: {body}");
    assert!(
        consumer.try_wait().unwrap().is_none(),
        "the consumer died during the outage"
    );

    let pool = env.db();
    wait_for_rows(
        &pool,
        group,
        total as i64,
        Duration::from_secs(180),
        &mut [&mut consumer, &mut producer],
    )
    .await;
    assert!(producer.wait().unwrap().success(), "producer failed");
    // Ready again: waited for, the last rows may be applied a moment before the state flips.
    tokio::task::block_in_place(|| {
        wait_for_status(&health, "/health/ready", 200, "", Duration::from_secs(60))
    });
    sigterm(&mut consumer);
    assert_exactly_once(&pool, group, &events).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_cleanup_deletes_old_rows_in_batches_and_keeps_recent_ones() {
    let env = TestEnv::new().with_database().await;
    let db = env.db();
    // One statement: 2,500 autocommits (an fsync each) took 115 s on a
    // loaded machine.
    let g = crate::helpers::dedup_group(&db, "g").await;
    let rows: Vec<String> = (0..2_500)
        .map(|i| {
            let age = if i < 2_300 { "10 DAY" } else { "1 HOUR" };
            format!("({g}, UNHEX(REPLACE(UUID(), '-', '')), 't', 0, {i}, 'order.created', '1', NOW(3) - INTERVAL {age})")
        })
        .collect();
    let sql = format!(
        "INSERT INTO event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key, created_at) \
         VALUES {}",
        rows.join(", ")
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&db.pool)
        .await
        .unwrap();
    let out = env
        .cli(&[
            "dedup",
            "cleanup",
            "--older-than",
            "7d",
            "--batch",
            "500",
            "--output",
            "json",
        ])
        .success();
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["removed"], 2_300, "{out}");
    let (left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM applied_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 200);
    let out = env
        .cli(&["dedup", "cleanup", "--older-than", "fortnight"])
        .failure();
    assert!(out.contains("--older-than"), "{out}");
}
