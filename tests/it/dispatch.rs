//! The dispatcher never waits on one slow partition (Kafka + MariaDB):
//! a partition whose worker's queue is full is paused, its records kept
//! in order, while every other partition flows and the member stays in
//! its group.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orderpipe::clock::now_ms;
use orderpipe::db::Db;
use orderpipe::envelope::Envelope;
use orderpipe::harness::generator::LifecycleGenerator;
use orderpipe::kafka::client::client_config;
use orderpipe::kafka::record::header;
use orderpipe::producer::record_headers;
use orderpipe::retry::retry_topic;
use rdkafka::message::Header;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

use crate::consumer::{consume, produce_lifecycles, sigterm};
use crate::exactly_once::assert_applied_in_order;
use crate::helpers::{Spawned, TestEnv};

/// Rows `group` applied from `topic`, as (offset, key, applied at in ms
/// since the epoch), in apply order.
async fn applied_from(db: &Db, group: &str, topic: &str) -> Vec<(i64, String, i64)> {
    sqlx::query_as(
        "SELECT kafka_offset, record_key, CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED) FROM applied_events \
         WHERE consumer_group = ? AND topic = ? ORDER BY apply_seq",
    )
    .bind(group)
    .bind(topic)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Waits until `group` applied `count` records of `topic`; how long it took.
async fn wait_applied(
    db: &Db,
    group: &str,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let applied = applied_from(db, group, topic).await.len();
        if applied >= count {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "{group} applied {applied} of {count} records of {topic} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `events` to `topic`, each to the partition `partition_of` picks
/// (keyed by order id as always); `due_of` gives a retry record's due time.
async fn produce_to(
    env: &TestEnv,
    topic: &str,
    events: &[Envelope],
    partition_of: impl Fn(&Envelope) -> i32,
    due_of: impl Fn(usize) -> Option<i64>,
) {
    let codec = env.order_events_codec();
    let producer: FutureProducer = client_config(&env.settings.kafka.client_options())
        .create()
        .unwrap();
    for (i, event) in events.iter().enumerate() {
        let mut headers = record_headers(event);
        if let Some(due) = due_of(i) {
            headers = headers
                .insert(Header {
                    key: header::DUE,
                    value: Some(due.to_string().as_bytes()),
                })
                .insert(Header {
                    key: header::ATTEMPT,
                    value: Some("1".as_bytes()),
                });
        }
        let value = codec.encode(event).await.unwrap();
        let key = event.key();
        let record = FutureRecord::to(topic)
            .partition(partition_of(event))
            .key(&key)
            .payload(&value)
            .headers(headers);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
    }
}

/// A config file setting `max.poll.interval.ms` to 10 s (its minimum is
/// `session.timeout.ms`), so a dispatcher stalled longer leaves the group.
fn short_poll_interval_config() -> tempfile::NamedTempFile {
    let mut config = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(
        &mut config,
        b"[consumer.options]\n\"max.poll.interval.ms\" = \"10000\"\n",
    )
    .unwrap();
    config
}

/// A running `orderpipe consume` whose log lines (at `info`) are collected.
struct LoggedConsumer {
    child: Spawned,
    log: Arc<Mutex<Vec<String>>>,
}

impl LoggedConsumer {
    fn start(env: &TestEnv, config: &std::path::Path, group: &str) -> Self {
        let mut command = env.command(&[
            "--config",
            config.to_str().unwrap(),
            "consume",
            "--group",
            group,
            "--handler",
            "notification",
            "--output",
            "json",
        ]);
        command
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = Spawned(command.spawn().expect("orderpipe starts"));
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Self { child, log }
    }

    /// Log lines containing `needle`.
    fn count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Stops the consumer with SIGTERM and returns its JSON summary.
    fn stop(mut self) -> Value {
        sigterm(&mut self.child);
        let mut out = String::new();
        std::io::Read::read_to_string(
            &mut self.child.stdout.take().expect("stdout piped"),
            &mut out,
        )
        .unwrap();
        serde_json::from_str(&out).unwrap_or_else(|e| {
            panic!(
                "summary is JSON ({e}): {out}\n{}",
                self.log.lock().unwrap().join("\n")
            )
        })
    }
}

/// Records of the retry backlog due at once, ahead of the delayed ones (not
/// a multiple of the batch size: the batch holding the first delayed record
/// applies two due ones first, and meanwhile the dispatcher fills the queue;
/// a worker that pauses the moment it takes a batch makes librdkafka drop
/// what it had fetched, so the queue would not fill).
const DUE_NOW: usize = 102;

/// Issue 13: one partition waiting 30 s on a retry due time holds back no
/// other partition, and the member stays in the group.
///
/// The retry topic's partition 0 holds a backlog: 102 records due now, then
/// 55 due 33 s later. Its worker applies the first 102 (21 batches), then
/// waits; with `batch_size = 5` its queue (10 records) is full long before,
/// so the dispatcher pauses the partition and keeps the rest. Before the fix the
/// dispatcher waited for room in that queue: nothing else was polled,
/// applied or health-reported, and past `max.poll.interval.ms` (10 s here)
/// librdkafka took the member out of the group. That needs the queue full
/// when the wait begins, which is a race (see [`DUE_NOW`]; against the old
/// dispatcher one of two runs stalled); the database stall below reproduces
/// the stall every time.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_waiting_30s_on_a_retry_due_time_holds_back_no_other_and_the_member_stays() {
    let mut env = TestEnv::new().with_database().await;
    let group = "slowpart";
    env.cli(&["topics", "ensure", "--group", group]).success();
    env.set_env("ORDERPIPE_CONSUMER__BATCH_SIZE", "5");
    let config = short_poll_interval_config();
    let main = env.settings.topics.order_events.name.clone();
    let retry = retry_topic(&main, group);

    let retried: Vec<Envelope> = LifecycleGenerator::new("dispatch-test", 40, 1_000_000, 13)
        .take(DUE_NOW + 55)
        .collect();
    let due = now_ms() + 33_000;
    let now = now_ms();
    produce_to(
        &env,
        &retry,
        &retried,
        |_| 0,
        |i| Some(if i < DUE_NOW { now } else { due }),
    )
    .await;

    let consumer = LoggedConsumer::start(&env, config.path(), group);
    let db = env.db();
    wait_applied(&db, group, &retry, DUE_NOW, Duration::from_secs(30)).await;
    // The others below need 10 s before the due time; a loaded machine may
    // take 20 s of the 33 to start the consumer.
    let left = due - now_ms();
    assert!(
        left > 10_000,
        "the consumer took too long to start for the test to mean anything ({left} ms left)"
    );

    // The retry partition waits; records of other partitions flow meanwhile:
    // all of them applied before the due time (not a fixed 10 s).
    let others = produce_lifecycles(&env, 300, 50, 7);
    let before_due = Duration::from_millis((due - now_ms() - 1_000).max(0) as u64);
    let took = wait_applied(&db, group, &main, others.len(), before_due).await;
    eprintln!(
        "300 records of other partitions applied {took:?} after they were produced, during the wait"
    );
    assert_eq!(
        applied_from(&db, group, &retry).await.len(),
        DUE_NOW,
        "the delayed records wait for their due time"
    );

    // The delayed records come after their due time, all of them once,
    // each order's in offset order.
    wait_applied(&db, group, &retry, retried.len(), Duration::from_secs(60)).await;
    let rows = applied_from(&db, group, &retry).await;
    let mut offsets: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let mut per_order: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (offset, key, _) in &rows {
        per_order.entry(key.as_str()).or_default().push(*offset);
    }
    for (key, applied) in &per_order {
        assert!(
            applied.is_sorted(),
            "order {key}: records applied out of offset order: {applied:?}"
        );
    }
    offsets.sort_unstable();
    assert_eq!(
        offsets,
        (0..retried.len() as i64).collect::<Vec<_>>(),
        "every retry record once"
    );
    let first_delayed = rows
        .iter()
        .filter(|r| r.0 >= DUE_NOW as i64)
        .map(|r| r.2)
        .min()
        .unwrap();
    assert!(
        first_delayed >= due,
        "a delayed record was applied {} ms before its due time",
        due - first_delayed
    );

    // One assignment all along: the member never left the group.
    assert_eq!(
        consumer.count("partitions assigned"),
        1,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    assert_eq!(
        consumer.count("partitions revoked"),
        0,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    assert_eq!(
        consumer.count("max.poll.interval"),
        0,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    let summary = consumer.stop();
    assert!(
        summary["queue_full_pauses"].as_u64() >= Some(1),
        "the full queue paused its partition: {summary}"
    );
    assert_eq!(
        summary["consumed"],
        retried.len() + others.len(),
        "each record received once: {summary}"
    );
    assert_eq!(summary["duplicates"], 0, "{summary}");
}

/// With a queue of 2 records per partition, queues fill all the time: each
/// full one pauses its partition and resumes it once drained, and every
/// record is received once and applied once, in order per order.
#[tokio::test(flavor = "multi_thread")]
async fn full_queues_pause_and_resume_their_partitions_losing_and_reordering_nothing() {
    let mut env = TestEnv::new().with_database().await;
    let group = "fullqueue";
    env.cli(&["topics", "ensure", "--group", group]).success();
    env.set_env("ORDERPIPE_CONSUMER__BATCH_SIZE", "1");
    let events = produce_lifecycles(&env, 1_000, 100, 29);
    let summary = consume(&env, group, "notification");
    assert!(
        summary["queue_full_pauses"].as_u64() >= Some(1),
        "{summary}"
    );
    assert_eq!(
        summary["consumed"],
        events.len(),
        "each record received once: {summary}"
    );
    assert_eq!(summary["applied"], events.len(), "{summary}");
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_applied_in_order(&env.db(), group, &events).await;
}

/// A worker stuck on the database (here a row lock its batch waits for,
/// held 12 s; in production a lock, a slow statement or a backoff) stops
/// only its own partition: the dispatcher pauses it, the other partitions'
/// records are applied meanwhile, the member stays in the group, and once
/// the lock goes every record is applied once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_stalled_on_the_database_holds_back_no_other_and_the_member_stays() {
    let mut env = TestEnv::new().with_database().await;
    let group = "dbstall";
    env.cli(&["topics", "ensure", "--group", group]).success();
    env.set_env("ORDERPIPE_CONSUMER__BATCH_SIZE", "5");
    let config = short_poll_interval_config();
    let main = env.settings.topics.order_events.name.clone();
    let partitions = env.settings.topics.order_events.partitions as i64;
    let partition_of = |e: &Envelope| (e.data.order_id() % partitions) as i32;
    let events: Vec<Envelope> = LifecycleGenerator::new("dispatch-test", 60, 2_000_000, 17)
        .take(600)
        .collect();
    let (stalled, others): (Vec<Envelope>, Vec<Envelope>) =
        events.iter().cloned().partition(|e| partition_of(e) == 0);
    assert!(
        stalled.len() > 20,
        "partition 0 holds more than its queue: {}",
        stalled.len()
    );

    // Partition 0's first event: its dedup row is inserted by a transaction
    // left open, so the worker's claim waits for that row lock.
    let db = env.db();
    let group_id = crate::helpers::dedup_group(&db, group).await;
    let mut lock = db.pool.begin().await.unwrap();
    let first = &stalled[0];
    sqlx::query(
        "INSERT INTO event_dedup (group_id, event_id, topic, kafka_partition, kafka_offset, event_type, record_key) \
         VALUES (?, ?, ?, 0, 0, ?, ?)",
    )
    .bind(group_id)
    .bind(first.event_id.as_bytes().to_vec())
    .bind(&main)
    .bind(first.event_name.as_str())
    .bind(first.key())
    .execute(&mut *lock)
    .await
    .unwrap();
    let locked_at = Instant::now();
    produce_to(&env, &main, &stalled, partition_of, |_| None).await;
    let consumer = LoggedConsumer::start(&env, config.path(), group);
    let started = Instant::now();
    while consumer.count("partitions assigned") == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "no assignment");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Partition 0 is stuck; records produced now to the 11 others flow.
    // The lock is held until this check is done, however long it takes.
    produce_to(&env, &main, &others, partition_of, |_| None).await;
    let produced = Instant::now();
    let applied = |db: Db| async move {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM applied_events WHERE consumer_group = ? AND kafka_partition <> 0",
        )
        .bind(group)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        n as usize
    };
    // The lock is held throughout, so any bound proves they did not wait;
    // 30 s (not 10) leaves room for a loaded machine and stays below
    // InnoDB's 50 s lock wait timeout.
    loop {
        let n = applied(env.db()).await;
        if n >= others.len() {
            break;
        }
        assert!(
            produced.elapsed() < Duration::from_secs(30),
            "records of other partitions waited for the stalled one: {n} of {} applied in 30 s",
            others.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{} records of other partitions applied {:?} after they were produced, partition 0 stalled",
        others.len(),
        produced.elapsed()
    );
    let (stalled_applied,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM applied_events WHERE consumer_group = ? AND kafka_partition = 0",
    )
    .bind(group)
    .fetch_one(&env.db().pool)
    .await
    .unwrap();
    assert_eq!(
        stalled_applied, 0,
        "partition 0 is still stuck behind the lock"
    );

    // Held past max.poll.interval.ms, then released.
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(locked_at.elapsed())).await;
    lock.rollback().await.unwrap();
    wait_applied(&db, group, &main, events.len(), Duration::from_secs(30)).await;
    assert_eq!(
        consumer.count("partitions assigned"),
        1,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    assert_eq!(
        consumer.count("partitions revoked"),
        0,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    assert_eq!(
        consumer.count("max.poll.interval"),
        0,
        "{}",
        consumer.log.lock().unwrap().join("\n")
    );
    let summary = consumer.stop();
    assert!(
        summary["queue_full_pauses"].as_u64() >= Some(1),
        "{summary}"
    );
    assert_eq!(
        summary["consumed"],
        events.len(),
        "each record received once: {summary}"
    );
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_applied_in_order(&db, group, &events).await;
}
