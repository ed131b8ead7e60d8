//! Crashes of the consumer against Kafka + MariaDB (issue 13): SIGKILLs of
//! two group members spread over a long run, and a crash between a batch's
//! database commit and the broker's acknowledgement of its forwards.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use orderpipe::db::Db;
use orderpipe::envelope::Envelope;
use orderpipe::kafka::client::client_config;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::consumer::{consume, count_rows, produce_lifecycles, sigterm};
use crate::exactly_once::{ALL_HANDLERS, assert_applied_in_order, assert_exactly_once};
use crate::helpers::{Spawned, TestEnv, header};

/// What [`wait_for_applied`] waits for: `target` events applied within
/// `timeout`, counted every `poll` (counting a million dedup rows is itself
/// work for the database).
struct Applied {
    target: i64,
    poll: Duration,
    timeout: Duration,
}

/// Waits until `group` has applied `until.target` events. A timeout stops
/// `members` and the panic shows what each printed.
async fn wait_for_applied(db: &Db, group: &str, until: Applied, members: &mut [Spawned]) -> i64 {
    let Applied {
        target,
        poll,
        timeout,
    } = until;
    let deadline = Instant::now() + timeout;
    loop {
        let n = count_rows(db, group).await;
        if n >= target {
            return n;
        }
        if Instant::now() >= deadline {
            let outputs: Vec<String> = members.iter_mut().map(Spawned::stop_and_output).collect();
            panic!(
                "{group} applied only {n} of {target} within {timeout:?}; members:\n{}",
                outputs.join("\n---\n")
            );
        }
        tokio::time::sleep(poll).await;
    }
}

/// Kills two members of one group alternately, `kills` times spread evenly
/// over `total` events, restarting each killed member at once; then checks
/// every event applied once, each order in production order.
async fn kill_two_members_during_a_run(total: usize, orders: usize, kills: usize) {
    let mut env = TestEnv::new().with_database().await;
    // After each kill the group rebalances once the dead member's session
    // expires: the broker's minimum, 6 s, instead of orderpipe's 10 s
    // (20 kills: 80 s less of the group standing still).
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        "[consumer.options]\n\"session.timeout.ms\" = \"6000\"\n",
    )
    .unwrap();
    env.set_env("ORDERPIPE_CONFIG", config.path().to_str().unwrap());
    let group = "kills.order.consumer";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let started = Instant::now();
    let events = produce_lifecycles(&env, total, orders, 113);
    eprintln!(
        "produced {total} events of {orders} open orders in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let db = env.db();
    let start = || env.spawn(&["consume", "--group", group, "--handler", ALL_HANDLERS]);
    let consuming = Instant::now();
    let mut members = [start(), start()];
    let mut rng = rand::rng();
    // Polls and the moment's jitter short enough that the members (a debug
    // build applies 20k events in about 10 s) never run past the next kill's
    // share between a poll and a kill: with one poll a second and up to
    // 700 ms more, a 20k run once finished before its third kill.
    let poll = Duration::from_millis((total as u64 / 400).clamp(50, 1000));
    let jitter = (4 * poll.as_millis() as u64).min(700);
    for kill in 0..kills {
        // Kill k at (k + 1) / (kills + 2) of the run, give or take a moment.
        let target = (total * (kill + 1) / (kills + 2)) as i64;
        let until = Applied {
            target,
            poll,
            timeout: Duration::from_secs(180),
        };
        wait_for_applied(&db, group, until, &mut members).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..jitter))).await;
        let victim = kill % 2;
        members[victim].kill().unwrap();
        members[victim].wait().unwrap();
        let applied = count_rows(&db, group).await;
        assert!(
            applied < total as i64,
            "the run finished before kill {} of {kills}",
            kill + 1
        );
        eprintln!(
            "kill {} (member {victim}) at {:.1} s: {applied} of {total} applied",
            kill + 1,
            consuming.elapsed().as_secs_f64()
        );
        members[victim] = start();
    }
    let until = Applied {
        target: total as i64,
        poll,
        timeout: Duration::from_secs(300),
    };
    wait_for_applied(&db, group, until, &mut members).await;
    eprintln!(
        "all {total} applied {:.1} s after the members started",
        consuming.elapsed().as_secs_f64()
    );
    for member in &mut members {
        sigterm(member);
    }
    assert_applied_in_order(&db, group, &events).await;
    assert_exactly_once(&db, group, &events).await;
}

/// 20 SIGKILLs of two members (alternately, each restarted at once) spread
/// over a 100,000-event backlog: every event applied once, each order's
/// events in production order.
///
/// 100k, not the 1M, to keep `make soak` short: the run
/// is bound by the 20 rebalances (each waits for the killed member's session
/// to expire) more than by the events, and 20 kills over 100k still land
/// every 4,800 events, inside full batches. The 1M run with the same 20 kills
/// is `dev/bench-crash.sh` (`make bench-crash`, part of `make bench`,
/// release build).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "soak: the issue's 20 kills (make test runs the 4-kill sibling); run by `make soak`"]
async fn twenty_sigkills_of_two_members_during_a_100k_run() {
    kill_two_members_during_a_run(100_000, 10_000, 20).await;
}

/// make test's sibling of the twenty kills: each member killed twice.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "serial: heavy; run by `make test` in the serial phase"]
async fn four_sigkills_of_two_members_during_a_20k_run() {
    kill_two_members_during_a_run(20_000, 2_000, 4).await;
}

/// Every record of `topic`, all partitions, up to their ends.
fn read_topic(env: &TestEnv, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    let consumer: BaseConsumer = client_config(&env.settings.kafka.client_options())
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut count = 0;
    for partition in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
            .unwrap();
        count += (high - low) as usize;
    }
    env.read(topic, count, Duration::from_secs(30))
}

/// The consumer dies (abort, as good as SIGKILL) after a batch committed and
/// its failed record was handed to the producer for the dead-letter topic,
/// before the broker's acknowledgement (`chaos.crash_before_forward_ack`).
/// The restarted consumer forwards the record again: it is in the DLQ at
/// least once (the persister keeps one row), its order's later events are
/// held behind it, every other event is applied once, and after the fix
/// its replay applies the whole order once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_the_commit_and_a_forwards_acknowledgement_loses_nothing() {
    let mut env = TestEnv::new().with_database().await;
    let group = "ack-crash";
    env.cli(&["topics", "ensure", "--group", group]).success();
    let events = produce_lifecycles(&env, 3_000, 300, 127);
    // The first order with three events or more: its first event, early in
    // its partition, fails for good; the batch around it commits.
    let mut by_order: HashMap<i64, Vec<&Envelope>> = HashMap::new();
    for e in &events {
        by_order.entry(e.data.order_id()).or_default().push(e);
    }
    let order = events
        .iter()
        .map(|e| e.data.order_id())
        .find(|o| by_order[o].len() >= 3)
        .unwrap();
    let failing = by_order[&order].clone();
    let head = failing[0].event_id.to_string();
    let others: Vec<Envelope> = events
        .iter()
        .filter(|e| e.data.order_id() != order)
        .cloned()
        .collect();
    env.set_env("ORDERPIPE_CHAOS__PERMANENT_ORDERS", &format!("[{order}]"));
    let handlers = format!("chaos,{ALL_HANDLERS}");
    let db = env.db();

    env.set_env("ORDERPIPE_CHAOS__CRASH_BEFORE_FORWARD_ACK", "true");
    // The situation under test needs the failed record's batch to hold the
    // records behind it: every record is in the topic before the consumer
    // starts, and each partition's first batch waits 2 s for the fetch to
    // hand it everything (a loaded machine otherwise starts a batch with the
    // failed record alone, and nothing behind it is committed before the crash).
    env.set_env("ORDERPIPE_CONSUMER__BATCH_LINGER_MS", "2000");
    let crashed = env.cli(&[
        "consume",
        "--group",
        group,
        "--handler",
        &handlers,
        "--until-idle",
        "30",
    ]);
    assert_eq!(
        crashed.output.status.signal(),
        Some(6),
        "SIGABRT at the hook:\n{}",
        crashed.text()
    );
    assert!(
        crashed.elapsed < Duration::from_secs(30),
        "aborted before going idle: {:?}",
        crashed.elapsed
    );
    // Committed before the crash: per partition, the last offset applied.
    let committed: HashMap<i32, i64> =
        sqlx::query_as("SELECT kafka_partition, MAX(kafka_offset) FROM applied_events WHERE consumer_group = ? GROUP BY kafka_partition")
            .bind(group)
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let applied_before = count_rows(&db, group).await;
    let (parked,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM parked_keys")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(parked, 0, "the crash came before parking");
    let dlq_before = read_topic(&env, &env.settings.topics.dead_letter.name).len();
    eprintln!(
        "crashed: {applied_before} applied, {dlq_before} copies of the failed record reached the DLQ before the crash"
    );

    env.set_env("ORDERPIPE_CHAOS__CRASH_BEFORE_FORWARD_ACK", "false");
    env.set_env("ORDERPIPE_CONSUMER__BATCH_LINGER_MS", "0");
    let summary = consume(&env, group, &handlers);
    assert_eq!(summary["dead_lettered"], 1, "{summary}");
    assert_eq!(
        summary["held"],
        failing.len() - 1,
        "the order's later events wait behind it: {summary}"
    );
    assert_exactly_once(&db, group, &others).await;

    // In the DLQ at least once (twice if the first send reached the broker).
    let dead: Vec<_> = read_topic(&env, &env.settings.topics.dead_letter.name);
    assert!(
        !dead.is_empty() && dead.len() <= 2,
        "{} DLQ records",
        dead.len()
    );
    for record in &dead {
        assert_eq!(header(record, "event_id").as_deref(), Some(head.as_str()));
    }
    let partition: i32 = header(&dead[0], "orderpipe.original-partition")
        .unwrap()
        .parse()
        .unwrap();
    let offset: i64 = header(&dead[0], "orderpipe.original-offset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        committed.get(&partition).is_some_and(|last| *last > offset),
        "records behind the failed one (partition {partition}, offset {offset}) committed before the crash: {committed:?}"
    );
    env.cli(&["dlq", "persist", "--until-idle", "3"]).success();
    let (rows,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM dead_letters WHERE event_id = ? AND consumer_group = ?",
    )
    .bind(&head)
    .bind(group)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows, 1, "one dead letter for the failed record");
    let (held,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM held_records WHERE record_key = ?")
        .bind(order.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(held, failing.len() as i64 - 1);

    // The fix ships: the replayed head and its followers, once, in order.
    env.set_env("ORDERPIPE_CHAOS__PERMANENT_ORDERS", "[]");
    env.cli(&["dlq", "replay", "--group", group, "--yes"])
        .success();
    let after = consume(&env, group, &handlers);
    assert_eq!(after["applied"], failing.len(), "{after}");
    assert_eq!(after["released"], failing.len() - 1, "{after}");
    assert_applied_in_order(&db, group, &events).await;
    assert_exactly_once(&db, group, &events).await;
    let (parked,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM parked_keys")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(parked, 0);
}
